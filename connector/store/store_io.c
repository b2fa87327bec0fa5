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

/* Check a stored object's header and hand its payload over; the payload's checksum is checked as
 * it is copied. A damaged object is removed from every tier. */
static void deliver(kvs_store *s, const kvs_key *key, const void *obj, uint64_t len, int tier,
                    const kvs_store_iov *iov, uint64_t n_iov, kvs_store_result *r) {
    uint32_t off = kvs_object_payload_offset(1);
    uint64_t value = len > off ? len - off : 0;
    char err[256];
    kvs_status st = kvs_object_check_header(obj, len, &s->ns, key, 1, 0, value, err, sizeof err);
    if (st == KVS_OK && value > s->max_value) st = KVS_ECORRUPT;
    r->bytes = value;
    if (st == KVS_OK && value > iov_total(iov, n_iov)) {
        r->status = KVS_EOVERFLOW;
        return;
    }
    if (st == KVS_OK && scatter((const uint8_t *)obj + off, value, iov, n_iov) !=
                            kvs_object_layer_hashes((void *)obj)[0])
        st = KVS_ECORRUPT;
    if (st == KVS_OK) {
        r->status = KVS_OK;
        r->tier = (uint16_t)tier;
        KVS_STORE_ADD(s->c.get_hits, 1);
        KVS_STORE_ADD(s->c.get_bytes, value);
        KVS_STORE_ADD(s->c.tier_hits[tier], 1);
        KVS_STORE_ADD(s->c.tier_hit_bytes[tier], value);
        return;
    }
    r->status = KVS_ECORRUPT;
    KVS_STORE_ADD(s->c.corrupt, 1);
}

/* A tier that hands out references: the object is read in place under a pin. 0 when it was gone
 * by the time it was pinned. */
static int get_in_place(kvs_store *s, const kvs_key *key, int tier, const kvs_store_iov *iov,
                        uint64_t n_iov, kvs_store_result *r) {
    if (!kvs_tiers_pin(s->chain, (uint32_t)tier, key, GET_PIN_MS)) return 0;
    const void *obj = NULL;
    uint64_t len = 0;
    int got = kvs_tiers_get_ref(s->chain, (uint32_t)tier, key, &obj, &len) == KVS_OK;
    if (got) deliver(s, key, obj, len, tier, iov, n_iov, r);
    kvs_tiers_unpin(s->chain, (uint32_t)tier, key);
    return got;
}

static int get_copy(kvs_store *s, const kvs_key *key, int tier, const kvs_store_iov *iov,
                    uint64_t n_iov, void *scratch, kvs_store_result *r) {
    uint64_t len = 0;
    kvs_status st = kvs_tiers_get(s->chain, (uint32_t)tier, key, scratch, s->max_object, &len);
    if (st == KVS_ENOTFOUND) return 0;
    if (st == KVS_EOVERFLOW) st = KVS_ECORRUPT; /* larger than any value this store puts */
    if (st != KVS_OK) {
        r->status = st == KVS_ECORRUPT ? KVS_ECORRUPT : KVS_EIO;
        if (st == KVS_ECORRUPT) KVS_STORE_ADD(s->c.corrupt, 1);
        return 1;
    }
    deliver(s, key, scratch, len, tier, iov, n_iov, r);
    return 1;
}

/* What a get's key came to: counted, a damaged object removed from every tier (under the chain). */
static void get_done(kvs_store *s, const kvs_key *key, kvs_store_result *r) {
    if (r->status == KVS_ECORRUPT) kvs_tiers_remove(s->chain, key);
    if (r->status == KVS_ENOTFOUND) KVS_STORE_ADD(s->c.get_misses, 1);
    if (r->status == KVS_ECORRUPT)
        kvs_store_set_error(s, "a stored value failed its checksum and was removed");
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
                       ? get_in_place(s, key, tier, iov, n_iov, r)
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
        r[i].status = st[m] == KVS_OK ? KVS_OK : st[m] == KVS_EOVERFLOW ? KVS_ECORRUPT : st[m];
        if (r[i].status == KVS_OK)
            deliver(s, &keys[i], dst[m], lens[m], tier, v, n_iov, &r[i]);
        else if (r[i].status != KVS_ECORRUPT)
            r[i].status = KVS_EIO;
        else
            KVS_STORE_ADD(s->c.corrupt, 1);
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

static kvs_status put_object(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov,
                             uint64_t n_iov, uint64_t value, void *scratch) {
    uint64_t len = kvs_object_payload_offset(1) + value;
    char err[256];
    if (kvs_tiers_can_reserve(s->chain)) {
        void *dst = NULL;
        uint64_t ticket = 0;
        kvs_status st = kvs_tiers_reserve(s->chain, key, len, &dst, &ticket, err, sizeof err);
        if (st == KVS_OK) {
            seal_into(s, key, dst, iov, n_iov, value);
            return kvs_tiers_commit(s->chain, key, ticket, dst, len, err, sizeof err);
        }
        if (st != KVS_ENOTSUP) return st;
    }
    seal_into(s, key, scratch, iov, n_iov, value);
    return kvs_tiers_put(s->chain, key, scratch, len, err, sizeof err);
}

void kvs_store_put_one(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov, uint64_t n_iov,
                       uint32_t flags, void *scratch, kvs_store_result *r) {
    uint64_t t0 = kvs_now_ns();
    uint64_t value = iov_total(iov, n_iov);
    KVS_STORE_ADD(s->c.puts, 1);
    r->bytes = value;
    if (value == 0 || value > s->max_value) {
        r->status = KVS_EINVAL;
        KVS_STORE_ADD(s->c.puts_failed, 1);
        kvs_store_set_error(s, "put: a value of %llu bytes (1..%llu)", (unsigned long long)value,
                            (unsigned long long)s->max_value);
        return;
    }
    chain_enter(s);
    int present = -1;
    if (flags & KVS_STORE_OVERWRITE)
        kvs_tiers_remove(s->chain, key);
    else
        present = kvs_tiers_find(s->chain, key);
    kvs_status st = present >= 0 ? KVS_OK : put_object(s, key, iov, n_iov, value, scratch);
    chain_leave(s);
    r->status = st;
    if (present >= 0) {
        r->flags = KVS_STORE_SKIPPED;
        r->tier = (uint16_t)present;
        KVS_STORE_ADD(s->c.puts_skipped, 1);
    } else if (st == KVS_OK) {
        r->tier = 0;
        KVS_STORE_ADD(s->c.puts_stored, 1);
        KVS_STORE_ADD(s->c.put_bytes, value);
        KVS_STORE_ADD(s->c.tier_puts[0], 1);
        KVS_STORE_ADD(s->c.tier_put_bytes[0], value);
    } else {
        KVS_STORE_ADD(s->c.puts_failed, 1);
        kvs_store_set_error(s, "put: the top tier refused a value of %llu bytes (%s)",
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

/* Remember a pin for unpin; a full table forgets the oldest (its lease still ends it). */
static void remember_pin(kvs_store *s, const kvs_key *key, uint32_t tier, uint64_t until) {
    pthread_mutex_lock(&s->pins_lock);
    uint64_t now = kvs_now_ns(), oldest = UINT64_MAX;
    uint32_t slot = 0;
    for (uint32_t i = 0; i < KVS_STORE_PIN_SLOTS; i++) {
        kvs_store_pin *p = &s->pins[i];
        uint64_t when = p->used && p->until_ns > now ? p->until_ns : 0;
        if (when < oldest) oldest = when, slot = i;
        if (!when) break;
    }
    s->pins[slot] = (kvs_store_pin){.key = *key, .tier = tier, .used = 1, .until_ns = until};
    pthread_mutex_unlock(&s->pins_lock);
}

void kvs_store_unpin_keys(kvs_store *s, const kvs_key *keys, uint64_t n) {
    uint64_t now = kvs_now_ns();
    for (uint64_t k = 0; k < n; k++) {
        int tier = -1;
        pthread_mutex_lock(&s->pins_lock);
        for (uint32_t i = 0; i < KVS_STORE_PIN_SLOTS; i++) {
            kvs_store_pin *p = &s->pins[i];
            if (!p->used || memcmp(&p->key, &keys[k], sizeof p->key)) continue;
            if (p->until_ns > now) tier = (int)p->tier;
            p->used = 0;
            break;
        }
        pthread_mutex_unlock(&s->pins_lock);
        if (tier < 0) continue;
        chain_enter(s);
        kvs_tiers_unpin(s->chain, (uint32_t)tier, &keys[k]);
        chain_leave(s);
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
