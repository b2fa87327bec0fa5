/* store_io.c - one key of a store batch: its kvstrata key, and its value moved between the caller's
 * buffers and a tier as a sealed object (one layer: the value; its checksum computed by the copy
 * that moves it), plus the leading-run exists and the pins it takes. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/copy.h"
#include "common/status.h"
#include "common/xxh3.h"
#include "connector/object.h"
#include "store_io.h"
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* How long a get holds the object it reads in place (the copy takes far less). */
#define GET_PIN_MS 10000u

void kvs_store_key_of(const kvs_store *s, const void *bytes, uint64_t len, kvs_key *out) {
    /* one call over the namespace and the key side by side: the streaming API costs twice as much
     * for keys this short (the same digest either way) */
    uint8_t buf[sizeof s->ns.bytes + KVS_STORE_KEY_MAX];
    memcpy(buf, s->ns.bytes, sizeof s->ns.bytes);
    memcpy(buf + sizeof s->ns.bytes, bytes, (size_t)len);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(buf, sizeof s->ns.bytes + (size_t)len));
    memcpy(out->bytes, c.digest, sizeof out->bytes);
}

static void chain_enter(kvs_store *s) {
    if (s->serialize) pthread_mutex_lock(&s->chain_lock);
}
static void chain_leave(kvs_store *s) {
    if (s->serialize) pthread_mutex_unlock(&s->chain_lock);
}

static uint64_t iov_total(const kvs_store_iov *iov, uint64_t n) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) total += iov[i].len;
    return total;
}

/* Copy the payload into the caller's pieces while hashing it: its XXH3-64. */
static uint64_t scatter(const uint8_t *src, uint64_t len, const kvs_store_iov *iov, uint64_t n) {
    kvs_xxh3 st;
    kvs_xxh3_reset(&st);
    for (uint64_t i = 0; i < n && len; i++) {
        uint64_t take = iov[i].len < len ? iov[i].len : len;
        kvs_xxh3_copy_update(&st, iov[i].base, src, (size_t)take, take >= KVS_COPY_STREAM_MIN);
        src += take;
        len -= take;
    }
    kvs_copy_fence();
    return kvs_xxh3_digest(&st);
}

static uint64_t gather(uint8_t *dst, const kvs_store_iov *iov, uint64_t n) {
    kvs_xxh3 st;
    kvs_xxh3_reset(&st);
    for (uint64_t i = 0; i < n; i++) {
        kvs_xxh3_copy_update(&st, dst, iov[i].base, (size_t)iov[i].len,
                             iov[i].len >= KVS_COPY_STREAM_MIN);
        dst += iov[i].len;
    }
    kvs_copy_fence(); /* before the object is published */
    return kvs_xxh3_digest(&st);
}

/* A stored object's header and checksum table, copied before they are checked: a tier another
 * thread or process writes (a removal forced under a pin, a slab reused) cannot change what was
 * checked while the payload is copied. */
typedef struct head_copy {
    kvs_object_header h;
    uint64_t hash; /* the one layer's: the value's XXH3-64 */
} head_copy;
_Static_assert(sizeof(kvs_object_header) % 8 == 0, "the table follows the header");

/* Check a stored object's header and hand its value over, its checksum checked as it is copied:
 * KVS_OK, KVS_ECORRUPT, or KVS_EOVERFLOW when the caller's buffers are shorter (r->bytes: its
 * length). */
static kvs_status hand_over(kvs_store *s, const kvs_key *key, const void *obj, uint64_t len,
                            const kvs_store_iov *iov, uint64_t n_iov, kvs_store_result *r) {
    uint32_t off = kvs_object_payload_offset(1);
    if (len < off) return KVS_ECORRUPT;
    head_copy hc;
    memcpy(&hc, obj, sizeof hc);
    uint64_t value = len - off;
    char err[256];
    if (kvs_object_check_header(&hc, len, &s->ns, key, 1, 0, value, err, sizeof err) != KVS_OK)
        return KVS_ECORRUPT;
    r->bytes = value;
    if (value > iov_total(iov, n_iov)) return KVS_EOVERFLOW;
    return scatter((const uint8_t *)obj + off, value, iov, n_iov) == hc.hash ? KVS_OK
                                                                             : KVS_ECORRUPT;
}

/* Read the object as the tier copies it out (under the tier's own lock) into scratch and hand it
 * over. 0 when the tier no longer holds it. */
static int get_copy(kvs_store *s, const kvs_key *key, int tier, const kvs_store_iov *iov,
                    uint64_t n_iov, void *scratch, kvs_store_result *r) {
    uint64_t len = 0;
    kvs_status st = kvs_tiers_get(s->chain, (uint32_t)tier, key, scratch, s->max_object, &len);
    if (st == KVS_ENOTFOUND) return 0;
    r->tier = (uint16_t)tier;
    if (st == KVS_EOVERFLOW) {
        /* put by a store with a larger limit: not this store's to read, nor damaged */
        r->status = KVS_EOVERFLOW;
        r->bytes = len > kvs_object_payload_offset(1) ? len - kvs_object_payload_offset(1) : 0;
        return 1;
    }
    r->status = st == KVS_OK         ? hand_over(s, key, scratch, len, iov, n_iov, r)
                : st == KVS_ECORRUPT ? KVS_ECORRUPT
                                     : KVS_EIO;
    return 1;
}

/* A tier that hands out references: the object is read in place under a pin. A checksum that
 * fails there is checked again on a copy the tier makes under its lock (a removal may have reused
 * the memory under the pin): only a copy that fails too is damaged. 0 when the object was gone. */
static int get_in_place(kvs_store *s, const kvs_key *key, int tier, const kvs_store_iov *iov,
                        uint64_t n_iov, void *scratch, kvs_store_result *r) {
    if (!kvs_tiers_pin(s->chain, (uint32_t)tier, key, GET_PIN_MS)) return 0;
    const void *obj = NULL;
    uint64_t len = 0;
    int got = kvs_tiers_get_ref(s->chain, (uint32_t)tier, key, &obj, &len) == KVS_OK;
    if (got) {
        r->tier = (uint16_t)tier;
        r->status = hand_over(s, key, obj, len, iov, n_iov, r);
    }
    kvs_tiers_unpin(s->chain, (uint32_t)tier, key);
    if (got && r->status == KVS_ECORRUPT && !get_copy(s, key, tier, iov, n_iov, scratch, r))
        r->status = KVS_ENOTFOUND;
    return got;
}

/* What a get's key came to: counted; a damaged object removed from every tier (under the chain). */
static void get_done(kvs_store *s, const kvs_key *key, kvs_store_result *r) {
    if (r->status == KVS_OK) {
        KVS_STORE_ADD(s->c.get_hits, 1);
        KVS_STORE_ADD(s->c.get_bytes, r->bytes);
        KVS_STORE_ADD(s->c.tier_hits[r->tier], 1);
        KVS_STORE_ADD(s->c.tier_hit_bytes[r->tier], r->bytes);
        return;
    }
    if (r->status != KVS_ENOTFOUND) r->tier = KVS_STORE_NO_TIER;
    if (r->status == KVS_ENOTFOUND) KVS_STORE_ADD(s->c.get_misses, 1);
    if (r->status == KVS_ECORRUPT) {
        kvs_tiers_remove(s->chain, key);
        KVS_STORE_ADD(s->c.corrupt, 1);
        kvs_store_set_error(s, "a stored value failed its checksum and was removed");
    }
}

void kvs_store_get_one(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov, uint64_t n_iov,
                       void *scratch, kvs_store_result *r) {
    uint64_t t0 = kvs_now_ns();
    KVS_STORE_ADD(s->c.gets, 1);
    r->status = KVS_ENOTFOUND;
    chain_enter(s);
    /* an object evicted between find and read is looked for again, once */
    for (int attempt = 0; attempt < 2; attempt++) {
        int tier = kvs_tiers_find(s->chain, key);
        if (tier < 0) break;
        int done = kvs_tiers_zero_copy(s->chain, (uint32_t)tier)
                       ? get_in_place(s, key, tier, iov, n_iov, scratch, r)
                       : get_copy(s, key, tier, iov, n_iov, scratch, r);
        if (done) break;
    }
    get_done(s, key, r);
    chain_leave(s);
    KVS_STORE_ADD(s->c.get_ns, kvs_now_ns() - t0);
}

/* 1 when the tier serves a batch of reads in one call into the store's buffers (an SSD tier: its
 * reads in flight together; a remote tier: one request per node). */
static int batchable(const kvs_store *s, int tier) {
    return tier >= 0 && !kvs_tiers_zero_copy(s->chain, (uint32_t)tier) &&
           kvs_tiers_can_get_many(s->chain, (uint32_t)tier);
}

/* Keys at[0..n) of a batch, all held by `tier`, read in one call into scratch slots, then each
 * checked and handed over; a key gone meanwhile is read again alone. */
static void get_group(kvs_store *s, int tier, const kvs_key *keys, const uint32_t *at, uint32_t n,
                      const kvs_store_iov *iov, const uint64_t *seg, uint8_t *scratch,
                      uint64_t slot, kvs_store_result *r) {
    kvs_key k[KVS_STORE_READ_DEPTH];
    void *dst[KVS_STORE_READ_DEPTH];
    uint64_t caps[KVS_STORE_READ_DEPTH], lens[KVS_STORE_READ_DEPTH];
    kvs_status st[KVS_STORE_READ_DEPTH];
    for (uint32_t m = 0; m < n; m++) {
        k[m] = keys[at[m]];
        dst[m] = scratch + (uint64_t)m * slot;
        caps[m] = s->max_object;
        lens[m] = 0;
        st[m] = KVS_EIO;
    }
    chain_enter(s);
    kvs_status call = kvs_tiers_get_many(s->chain, (uint32_t)tier, k, dst, caps, n, lens, st);
    chain_leave(s);
    for (uint32_t m = 0; m < n; m++) {
        uint32_t i = at[m];
        const kvs_store_iov *v = iov + seg[i];
        uint64_t n_iov = seg[i + 1] - seg[i];
        if (call != KVS_OK || st[m] == KVS_ENOTFOUND) {
            kvs_store_get_one(s, &keys[i], v, n_iov, dst[m], &r[i]);
            continue;
        }
        uint64_t t0 = kvs_now_ns();
        KVS_STORE_ADD(s->c.gets, 1);
        r[i].tier = (uint16_t)tier;
        if (st[m] == KVS_OK)
            r[i].status = hand_over(s, &keys[i], dst[m], lens[m], v, n_iov, &r[i]);
        else /* larger than this store's limit: not damaged (get_copy says why) */
            r[i].status = st[m] == KVS_EOVERFLOW || st[m] == KVS_ECORRUPT ? st[m] : KVS_EIO;
        chain_enter(s);
        get_done(s, &keys[i], &r[i]);
        chain_leave(s);
        KVS_STORE_ADD(s->c.get_ns, kvs_now_ns() - t0);
    }
}

void kvs_store_get_batch(kvs_store *s, const kvs_key *keys, const kvs_store_iov *iov,
                         const uint64_t *seg, uint32_t n, uint8_t *scratch, uint64_t slot,
                         kvs_store_result *r) {
    int tiers[KVS_STORE_READ_DEPTH];
    uint8_t done[KVS_STORE_READ_DEPTH] = {0};
    chain_enter(s);
    for (uint32_t i = 0; i < n; i++) tiers[i] = kvs_tiers_find(s->chain, &keys[i]);
    chain_leave(s);
    for (uint32_t i = 0; i < n; i++) {
        if (done[i]) continue;
        if (!batchable(s, tiers[i])) {
            kvs_store_get_one(s, &keys[i], iov + seg[i], seg[i + 1] - seg[i], scratch, &r[i]);
            continue;
        }
        uint32_t at[KVS_STORE_READ_DEPTH], m = 0;
        for (uint32_t j = i; j < n; j++)
            if (!done[j] && tiers[j] == tiers[i]) at[m++] = j, done[j] = 1;
        get_group(s, tiers[i], keys, at, m, iov, seg, scratch, slot, r);
    }
}

/* Build the object at dst (room for the header page and the value). */
static void seal_into(kvs_store *s, const kvs_key *key, void *dst, const kvs_store_iov *iov,
                      uint64_t n_iov, uint64_t value) {
    kvs_object_init(dst, &s->ns, key, 1, 0, value);
    kvs_object_layer_hashes(dst)[0] =
        gather((uint8_t *)dst + kvs_object_payload_offset(1), iov, n_iov);
    kvs_object_seal(dst);
}

/* Store the value as an object: built in place in the top tier where it reserves room, else in
 * scratch and stored through the chain (which passes it down when the top tier has no room, and
 * replaces a present one). *tier gets where it went (KVS_STORE_NO_TIER when no tier on this host
 * can say). */
static kvs_status put_object(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov,
                             uint64_t n_iov, uint64_t value, int replace, void *scratch,
                             uint16_t *tier) {
    uint64_t len = kvs_object_payload_offset(1) + value;
    char err[256];
    *tier = 0;
    /* a reservation of a key whose object is pinned is dropped at commit: a replacement goes
     * through put, which replaces */
    if (!replace && kvs_tiers_can_reserve(s->chain)) {
        void *dst = NULL;
        uint64_t ticket = 0;
        kvs_status st = kvs_tiers_reserve(s->chain, key, len, &dst, &ticket, err, sizeof err);
        if (st == KVS_OK) {
            seal_into(s, key, dst, iov, n_iov, value);
            return kvs_tiers_commit(s->chain, key, ticket, dst, len, err, sizeof err);
        }
        if (st != KVS_ENOTSUP && st != KVS_ENOMEM) return st;
    }
    seal_into(s, key, scratch, iov, n_iov, value);
    /* a tier with no room it can make (everything in it pinned) passes the value down */
    kvs_status st = KVS_ENOMEM;
    uint32_t from = 0;
    for (; from < s->n_tiers && st == KVS_ENOMEM; from++)
        st = kvs_tiers_put_from(s->chain, from, key, scratch, len, err, sizeof err);
    *tier = st == KVS_OK ? (uint16_t)(from - 1) : KVS_STORE_NO_TIER;
    return st;
}

void kvs_store_put_one(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov, uint64_t n_iov,
                       uint32_t flags, void *scratch, kvs_store_result *r) {
    uint64_t t0 = kvs_now_ns();
    uint64_t value = iov_total(iov, n_iov); /* bounded at submit: no overflow */
    KVS_STORE_ADD(s->c.puts, 1);
    r->bytes = value;
    if (value == 0 || value > s->max_value) {
        r->status = KVS_EINVAL;
        KVS_STORE_ADD(s->c.puts_failed, 1);
        kvs_store_set_error(s, "put: a value of %llu bytes (1..%llu)", (unsigned long long)value,
                            (unsigned long long)s->max_value);
        return;
    }
    int replace = (flags & KVS_STORE_OVERWRITE) != 0;
    chain_enter(s);
    int present = replace ? -1 : kvs_tiers_find(s->chain, key);
    uint16_t tier = KVS_STORE_NO_TIER;
    kvs_status st =
        present >= 0 ? KVS_OK : put_object(s, key, iov, n_iov, value, replace, scratch, &tier);
    chain_leave(s);
    r->status = st;
    if (present >= 0) {
        r->flags = KVS_STORE_SKIPPED;
        r->tier = (uint16_t)present;
        KVS_STORE_ADD(s->c.puts_skipped, 1);
    } else if (st == KVS_OK) {
        r->tier = tier;
        KVS_STORE_ADD(s->c.puts_stored, 1);
        KVS_STORE_ADD(s->c.put_bytes, value);
        if (tier != KVS_STORE_NO_TIER) {
            KVS_STORE_ADD(s->c.tier_puts[tier], 1);
            KVS_STORE_ADD(s->c.tier_put_bytes[tier], value);
        }
    } else {
        KVS_STORE_ADD(s->c.puts_failed, 1);
        kvs_store_set_error(s, "put: no tier took a value of %llu bytes (%s)",
                            (unsigned long long)value, kvs_status_sentence(st));
    }
    KVS_STORE_ADD(s->c.put_ns, kvs_now_ns() - t0);
}

void kvs_store_exists_one(kvs_store *s, const kvs_key *key, kvs_store_result *r) {
    chain_enter(s);
    int tier = kvs_tiers_find(s->chain, key);
    chain_leave(s);
    KVS_STORE_ADD(s->c.exists_keys, 1);
    r->status = tier >= 0 ? KVS_OK : KVS_ENOTFOUND;
    if (tier >= 0) {
        r->tier = (uint16_t)tier;
        KVS_STORE_ADD(s->c.exists_present, 1);
    }
}

void kvs_store_remove_one(kvs_store *s, const kvs_key *key, kvs_store_result *r) {
    chain_enter(s);
    kvs_tiers_remove(s->chain, key);
    chain_leave(s);
    KVS_STORE_ADD(s->c.removes, 1);
    r->status = KVS_OK;
}

/* The pin table: open addressing from the key's first bytes, a short probe. An entry holds the
 * pins this store took on a key (pins nest in the tiers) until their lease ends; a full probe
 * forgets the entry whose lease ends first (the tier still ends it then). */
#define PIN_PROBE 16u

static uint32_t pin_home(const kvs_key *key) {
    uint32_t h;
    memcpy(&h, key->bytes, sizeof h);
    return h & (KVS_STORE_PIN_SLOTS - 1u);
}

static void remember_pin(kvs_store *s, const kvs_key *key, uint32_t tier, uint64_t until) {
    uint64_t now = kvs_now_ns();
    pthread_mutex_lock(&s->pins_lock);
    kvs_store_pin *pick = NULL;
    int pick_live = 0, same = 0;
    for (uint32_t p = 0; p < PIN_PROBE && !same; p++) {
        kvs_store_pin *e = &s->pins[(pin_home(key) + p) & (KVS_STORE_PIN_SLOTS - 1u)];
        int live = e->used && e->until_ns > now;
        if (live && !memcmp(&e->key, key, sizeof *key))
            pick = e, pick_live = 1, same = 1; /* one more pin of the same key */
        else if (!live && (!pick || pick_live))
            pick = e, pick_live = 0; /* the first free slot */
        else if (live && pick_live && e->until_ns < pick->until_ns)
            pick = e; /* else the lease that ends first */
        else if (live && !pick)
            pick = e, pick_live = 1;
    }
    if (same) {
        pick->count++;
        pick->tier = tier;
        if (until > pick->until_ns) pick->until_ns = until;
    } else {
        *pick =
            (kvs_store_pin){.key = *key, .tier = tier, .used = 1, .count = 1, .until_ns = until};
    }
    pthread_mutex_unlock(&s->pins_lock);
}

/* Take key's entry out of the table: its tier and how many pins are still live (0: none). */
static uint32_t forget_pin(kvs_store *s, const kvs_key *key, uint32_t *tier) {
    uint64_t now = kvs_now_ns();
    uint32_t count = 0;
    pthread_mutex_lock(&s->pins_lock);
    for (uint32_t p = 0; p < PIN_PROBE; p++) {
        kvs_store_pin *e = &s->pins[(pin_home(key) + p) & (KVS_STORE_PIN_SLOTS - 1u)];
        if (!e->used || memcmp(&e->key, key, sizeof *key)) continue;
        if (e->until_ns > now) count = e->count, *tier = e->tier;
        e->used = 0;
    }
    pthread_mutex_unlock(&s->pins_lock);
    return count;
}

void kvs_store_unpin_keys(kvs_store *s, const kvs_key *keys, uint64_t n) {
    for (uint64_t k = 0; k < n; k++) {
        uint32_t tier = 0;
        uint32_t count = forget_pin(s, &keys[k], &tier);
        chain_enter(s);
        for (uint32_t c = 0; c < count; c++) kvs_tiers_unpin(s->chain, tier, &keys[k]);
        chain_leave(s);
    }
}

void kvs_store_unpin_all(kvs_store *s) {
    uint64_t now = kvs_now_ns();
    for (uint32_t i = 0; i < KVS_STORE_PIN_SLOTS; i++) {
        kvs_store_pin *e = &s->pins[i];
        if (!e->used || e->until_ns <= now) continue;
        for (uint32_t c = 0; c < e->count; c++) kvs_tiers_unpin(s->chain, e->tier, &e->key);
        e->used = 0;
    }
}

/* How many of keys[0..n) from the first are held by some tier (each run may sit in another tier);
 * tiers[i] gets key i's. With `local` the tiers across the network are not asked. */
static uint64_t leading_run(kvs_store *s, const kvs_key *keys, uint64_t n, int local,
                            uint16_t *tiers) {
    uint64_t pos = 0;
    while (pos < n) {
        uint64_t best = 0;
        uint32_t best_tier = 0;
        for (uint32_t t = 0; t < s->n_tiers; t++) {
            if (local && kvs_tiers_is_remote(s->chain, t)) continue;
            uint64_t got = 0;
            if (kvs_tiers_contains(s->chain, t, keys + pos, n - pos, &got) != KVS_OK) continue;
            if (got > best) best = got, best_tier = t;
            if (pos + best == n) break;
        }
        if (!best) break;
        for (uint64_t i = pos; i < pos + best; i++) tiers[i] = (uint16_t)best_tier;
        pos += best;
    }
    return pos;
}

kvs_status kvs_store_exists_keys(kvs_store *s, const kvs_key *keys, uint64_t n, uint32_t flags,
                                 uint64_t pin_ms, uint8_t *states, uint64_t *n_leading) {
    uint16_t *tiers = malloc((n ? n : 1) * sizeof *tiers);
    if (!tiers) return kvs_store_set_error(s, "exists: out of memory"), KVS_ENOMEM;
    int local = (flags & KVS_STORE_LOCAL) != 0;
    chain_enter(s);
    uint64_t lead = leading_run(s, keys, n, local, tiers);
    uint64_t pinned = lead;
    if (pin_ms > KVS_STORE_PIN_MAX_MS) pin_ms = KVS_STORE_PIN_MAX_MS;
    for (uint64_t i = 0; pin_ms && i < lead; i++) {
        if (!kvs_tiers_pin(s->chain, tiers[i], &keys[i], pin_ms)) {
            pinned = i; /* evicted meanwhile: the run ends here */
            break;
        }
        remember_pin(s, &keys[i], tiers[i], kvs_now_ns() + pin_ms * 1000000ull);
    }
    lead = pinned;
    uint8_t unknown = local && s->has_remote ? KVS_STORE_UNKNOWN : KVS_STORE_ABSENT;
    uint64_t answered = lead, present = lead;
    if (states) {
        for (uint64_t i = 0; i < lead; i++) states[i] = KVS_STORE_PRESENT;
        if (lead < n) states[lead] = unknown, answered = lead + 1;
        for (uint64_t i = lead + 1; (flags & KVS_STORE_ALL) && i < n; i++, answered++) {
            int t = local ? kvs_tiers_find_local(s->chain, &keys[i])
                          : kvs_tiers_find(s->chain, &keys[i]);
            states[i] = t >= 0 ? KVS_STORE_PRESENT : unknown;
            present += t >= 0;
        }
    }
    chain_leave(s);
    free(tiers);
    KVS_STORE_ADD(s->c.exists_keys, answered);
    KVS_STORE_ADD(s->c.exists_present, present);
    *n_leading = lead;
    return KVS_OK;
}

kvs_status kvs_store_derive_keys(kvs_store *s, const kvs_store_keys *keys, kvs_key **out) {
    *out = NULL;
    if (!keys || (keys->n && (!keys->data || !keys->offsets)))
        return kvs_store_set_error(s, "keys: data or offsets is NULL"), KVS_EINVAL;
    if (keys->n > KVS_STORE_BATCH_MAX)
        return kvs_store_set_error(s, "keys: %llu in one call (at most %u)",
                                   (unsigned long long)keys->n, KVS_STORE_BATCH_MAX),
               KVS_EINVAL;
    for (uint64_t i = 0; i < keys->n; i++) {
        uint64_t a = keys->offsets[i], b = keys->offsets[i + 1];
        if (b <= a || b - a > KVS_STORE_KEY_MAX)
            return kvs_store_set_error(s, "keys: key %llu has %lld bytes (1..%u)",
                                       (unsigned long long)i, (long long)(b - a),
                                       KVS_STORE_KEY_MAX),
                   KVS_EINVAL;
    }
    kvs_key *k = malloc((keys->n ? keys->n : 1) * sizeof *k);
    if (!k) return kvs_store_set_error(s, "keys: out of memory"), KVS_ENOMEM;
    for (uint64_t i = 0; i < keys->n; i++) {
        const uint8_t *b = (const uint8_t *)keys->data + keys->offsets[i];
        kvs_store_key_of(s, b, keys->offsets[i + 1] - keys->offsets[i], &k[i]);
    }
    *out = k;
    return KVS_OK;
}
