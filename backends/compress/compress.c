/* compress.c - the compress tier (compress.h): objects in host memory, each in the encoding and on
 * the device the host's placement chose, re-placed at every put and every reevaluate_ms. */
#include "compress.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/dram/dram_index.h"
#include "common/key.h"
#include "common/options.h"

#define NIL UINT32_MAX

typedef struct centry {
    kvs_key key;
    uint8_t *bytes; /* the stored object when it is here; NULL for a record of one passed down */
    uint64_t len;   /* its length as stored (here or below) */
    uint32_t n_enc;
    uint32_t current; /* index into enc of how it is stored */
    kvs_backend_encoding enc[KVS_BACKEND_MAX_ENCODINGS];
    double hits;       /* reads since `since_ns` */
    uint64_t since_ns; /* when the rate's window starts */
    uint32_t pins;
    uint64_t pin_deadline_ns;
    uint32_t next;   /* bucket chain, or the free list */
    uint32_t failed; /* bit k: encoding k failed (values in a layer it cannot take): never again */
    uint8_t used;
} centry;

typedef struct options {
    uint8_t allow_lossy;
    uint64_t bandwidth, next_bandwidth, next_capacity;
    uint64_t latency_us, next_latency_us, recompute_ms;
    const char *index_shm; /* borrowed from create's options */
    uint64_t index_entries;
} options;

typedef struct compress_state {
    char tier_name[64];
    char error[512];
    pthread_mutex_t lock;
    const kvs_clock *clock;
    const kvs_backend_host *host;
    uint64_t capacity;
    uint64_t max_object_bytes;
    options opt;
    centry *slots;
    uint32_t n_slots, free_head;
    uint32_t *buckets;
    uint32_t n_buckets; /* a power of two */
    uint64_t bytes_here, bytes_down;
    uint64_t last_plan_ns;
    kvs_compress_counts counts;
    /* the last plan's inputs and outputs, reused */
    kvs_backend_place_entry *plan_in;
    kvs_backend_place_choice *plan_out;
    uint32_t *plan_slot;
    uint64_t plan_cap;
    /* index_shm: what this process holds, published for the instance's other processes */
    kvs_dram_index *index;
    int lookup_only; /* a handle without staging (a scheduler): it opens the index alone */
} compress_state;

static const kvs_option_desc OPTIONS[] = {
    {.name = "allow_lossy", .kind = KVS_OPTION_BOOL, KVS_OPTION_FIELD(options, allow_lossy)},
    {.name = "bandwidth",
     .kind = KVS_OPTION_RATE,
     KVS_OPTION_FIELD(options, bandwidth),
     .min = 1,
     .example = "20GB/s"},
    {.name = "latency_us",
     .kind = KVS_OPTION_MICROSECONDS,
     KVS_OPTION_FIELD(options, latency_us),
     .max = 10000000},
    {.name = "next_capacity",
     .kind = KVS_OPTION_SIZE,
     KVS_OPTION_FIELD(options, next_capacity),
     .example = "64GiB"},
    {.name = "next_bandwidth",
     .kind = KVS_OPTION_RATE,
     KVS_OPTION_FIELD(options, next_bandwidth),
     .min = 1,
     .example = "1GB/s"},
    {.name = "next_latency_us",
     .kind = KVS_OPTION_MICROSECONDS,
     KVS_OPTION_FIELD(options, next_latency_us),
     .max = 10000000},
    {.name = "recompute_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(options, recompute_ms),
     .min = 1,
     .max = 3600000},
    {.name = "index_shm", .kind = KVS_OPTION_STRING, KVS_OPTION_FIELD(options, index_shm)},
    {.name = "index_entries",
     .kind = KVS_OPTION_COUNT,
     KVS_OPTION_FIELD(options, index_entries),
     .min = KVS_DRAM_INDEX_MIN_ENTRIES,
     .max = 1ull << 26},
};

static void set_error(compress_state *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(st->error, sizeof st->error, "compress tier \"%s\": ", st->tier_name);
    if (n > 0 && (size_t)n < sizeof st->error)
        vsnprintf(st->error + n, sizeof st->error - (size_t)n, fmt, ap);
    va_end(ap);
}

static uint64_t now_ns(const compress_state *st) {
    return kvs_clock_now_ns(st->clock);
}

/* ---- the index: chained buckets over slots that never move --------------------------------- */

static uint32_t slot_of_key(const compress_state *st, const kvs_key *key) {
    uint32_t s = st->buckets[kvs_key_hash(key) & (st->n_buckets - 1)];
    while (s != NIL && memcmp(&st->slots[s].key, key, sizeof *key) != 0) s = st->slots[s].next;
    return s;
}

static void link_slot(compress_state *st, uint32_t s) {
    uint32_t *head = &st->buckets[kvs_key_hash(&st->slots[s].key) & (st->n_buckets - 1)];
    st->slots[s].next = *head;
    *head = s;
}

static kvs_status grow_slots(compress_state *st) {
    uint32_t n = st->n_slots ? st->n_slots * 2 : 64;
    if (n <= st->n_slots) return KVS_ENOMEM;
    centry *slots = realloc(st->slots, (size_t)n * sizeof *slots);
    if (!slots) return KVS_ENOMEM;
    st->slots = slots;
    uint32_t *buckets = malloc((size_t)n * sizeof *buckets); /* as many buckets as slots */
    if (!buckets) return KVS_ENOMEM;
    memset(&slots[st->n_slots], 0, (size_t)(n - st->n_slots) * sizeof *slots);
    for (uint32_t s = n; s-- > st->n_slots;) { /* the new slots onto the free list */
        slots[s].next = st->free_head;
        st->free_head = s;
    }
    free(st->buckets);
    st->buckets = buckets;
    st->n_buckets = n;
    st->n_slots = n;
    for (uint32_t b = 0; b < n; b++) buckets[b] = NIL;
    for (uint32_t s = 0; s < n; s++)
        if (slots[s].used) link_slot(st, s);
    return KVS_OK;
}

static uint32_t take_slot(compress_state *st) {
    if (st->free_head == NIL && grow_slots(st) != KVS_OK) return NIL;
    uint32_t s = st->free_head;
    st->free_head = st->slots[s].next;
    memset(&st->slots[s], 0, sizeof st->slots[s]);
    st->slots[s].used = 1;
    return s;
}

/* Unlink slot s and free what it holds (no event: the caller reports it). */
static void release(compress_state *st, uint32_t s) {
    centry *e = &st->slots[s];
    if (st->index) kvs_dram_index_forget(st->index, &e->key);
    uint32_t *p = &st->buckets[kvs_key_hash(&e->key) & (st->n_buckets - 1)];
    while (*p != s) p = &st->slots[*p].next;
    *p = e->next;
    if (e->bytes)
        st->bytes_here -= e->len;
    else
        st->bytes_down -= e->len;
    free(e->bytes);
    memset(e, 0, sizeof *e);
    e->next = st->free_head;
    st->free_head = s;
}

static int pinned_here(const centry *e, uint64_t now) {
    return e->pins > 0 && now < e->pin_deadline_ns;
}

/* Pinned here, or by another process's lookup in the published index. */
static int pinned_anywhere(compress_state *st, const centry *e, uint64_t now) {
    return pinned_here(e, now) || (st->index && kvs_dram_index_pinned(st->index, &e->key));
}

/* Tell the instance's other processes how entry s is kept now. */
static void publish(compress_state *st, uint32_t s) {
    const centry *e = &st->slots[s];
    if (!st->index) return;
    if (e->bytes)
        kvs_dram_index_held(st->index, &e->key, e->enc[e->current].codec);
    else
        kvs_dram_index_passed(st->index, &e->key, e->enc[e->current].codec);
}

/* ---- placement ------------------------------------------------------------------------------ */

/* Reads per second over the entry's window; -1 while it is too young to tell (the prior). */
static double rate_of(const compress_state *st, centry *e, uint64_t now) {
    double window_s =
        10.0 * (double)(st->host->reevaluate_ms ? st->host->reevaluate_ms : 1000) / 1e3;
    double age_s = (double)(now - e->since_ns) / 1e9;
    if (age_s > 2 * window_s) { /* keep the rate, halve what backs it: older reads count less */
        e->hits = e->hits / age_s * window_s;
        e->since_ns = now - (uint64_t)(window_s * 1e9);
        age_s = window_s;
    }
    if (e->hits == 0 && age_s < window_s) return -1;
    return e->hits / (age_s > window_s ? age_s : window_s);
}

static kvs_status plan_room(compress_state *st, uint64_t n) {
    if (n <= st->plan_cap) return KVS_OK;
    kvs_backend_place_entry *in = realloc(st->plan_in, n * sizeof *in);
    if (in) st->plan_in = in;
    kvs_backend_place_choice *out = realloc(st->plan_out, n * sizeof *out);
    if (out) st->plan_out = out;
    uint32_t *slot = realloc(st->plan_slot, n * sizeof *slot);
    if (slot) st->plan_slot = slot;
    if (!in || !out || !slot) return KVS_ENOMEM;
    st->plan_cap = n;
    return KVS_OK;
}

/* Pass entry s down as encoding `to` (encoding it first from raw): the host writes it to the next
 * tier. On a failed encode it stays as it is. */
static void pass_down(compress_state *st, uint32_t s, uint32_t to) {
    centry *e = &st->slots[s];
    uint8_t *obj = e->bytes;
    uint64_t len = e->len;
    uint8_t *enc = NULL;
    if (to != e->current) {
        uint64_t cap = e->enc[to].bytes, got = 0;
        if (!(enc = malloc(cap ? cap : 1)) ||
            st->host->encode(st->host->ctx, obj, len, e->enc[to].id, enc, cap, &got) != KVS_OK) {
            free(enc);
            e->failed |= 1u << to;
            st->counts.encode_failures++;
            return;
        }
        st->counts.encoded++;
        obj = enc;
        len = got;
    }
    st->host->on_evict(st->host->ctx, &e->key, obj, len);
    free(enc);
    st->bytes_here -= e->len;
    free(e->bytes);
    e->bytes = NULL;
    e->len = len;
    e->current = to;
    st->bytes_down += len;
    publish(st, s);
}

/* Re-encode entry s here as encoding `to` (from raw, or from a lossy one downward); on failure it
 * stays as it is. */
static void encode_here(compress_state *st, uint32_t s, uint32_t to) {
    centry *e = &st->slots[s];
    uint64_t cap = e->enc[to].bytes, got = 0;
    uint8_t *enc = malloc(cap ? cap : 1);
    if (!enc || st->host->encode(st->host->ctx, e->bytes, e->len, e->enc[to].id, enc, cap, &got) !=
                    KVS_OK) {
        free(enc);
        e->failed |= 1u << to;
        st->counts.encode_failures++;
        return;
    }
    st->counts.encoded++;
    st->bytes_here = st->bytes_here - e->len + got;
    free(e->bytes);
    e->bytes = enc;
    e->len = got;
    e->current = to;
    publish(st, s);
}

/* The encodings entry e may take: itself, and with allow_lossy only ones downward from it (fewer
 * bytes and no better quality: re-encoding never gets precision back). */
static uint32_t allowed_from(const compress_state *st, const centry *e) {
    uint32_t allowed = 1u << e->current;
    const kvs_backend_encoding *now = &e->enc[e->current];
    if (now->flags & KVS_BACKEND_ENC_FROM_PUT_ONLY) return allowed; /* never re-encoded */
    for (uint32_t k = 0; st->opt.allow_lossy && k < e->n_enc; k++)
        if (e->enc[k].codec != 0 && e->enc[k].bytes < now->bytes &&
            e->enc[k].quality <= now->quality && !(e->failed >> k & 1) &&
            !(e->current != 0 && (e->enc[k].flags & KVS_BACKEND_ENC_FROM_PUT_ONLY)))
            allowed |= 1u << k;
    return allowed;
}

/* Entry s as the placement sees it. Pinned entries may only stay as they are; `fresh` (a put's own
 * object, or NIL) may stay here or be stored nowhere, never go down within its own put (the
 * connector reports it STORED here once put returns). */
static void fill_entry(compress_state *st, uint32_t s, uint32_t fresh, uint64_t now,
                       kvs_backend_place_entry *in) {
    centry *e = &st->slots[s];
    memset(in, 0, sizeof *in);
    in->raw_bytes = e->enc[0].bytes; /* as put: raw layout */
    in->hits_per_s = rate_of(st, e, now);
    in->n_encodings = e->n_enc;
    memcpy(in->encodings, e->enc, e->n_enc * sizeof e->enc[0]);
    in->allowed = allowed_from(st, e);
    in->devices = e->bytes ? 3u : 2u; /* what was passed down cannot come back up */
    if (e->bytes && pinned_anywhere(st, e, now)) {
        in->allowed = 1u << e->current;
        in->devices = 1u;
    }
    if (s == fresh) in->devices = 1u;
}

/* The two devices as this tier's options describe them, with these capacities. */
static kvs_backend_devices devices_of(const compress_state *st, uint64_t here, uint64_t next) {
    return (kvs_backend_devices){
        .latency_s = {(double)st->opt.latency_us * 1e-6, (double)st->opt.next_latency_us * 1e-6},
        .bytes_per_s = {(double)st->opt.bandwidth, (double)st->opt.next_bandwidth},
        .capacity = {here, next},
        .recompute_s = (double)st->opt.recompute_ms * 1e-3};
}

/* A put that fits: 1 when the placement would keep its object (slot s) here as it came, asked about
 * it alone in the room left (nothing else has to move for it), so the full placement can wait. */
static int fits_as_is(compress_state *st, uint32_t s) {
    if (st->bytes_here > st->capacity || plan_room(st, 1) != KVS_OK) return 0;
    fill_entry(st, s, s, now_ns(st), &st->plan_in[0]);
    uint64_t room = st->capacity - (st->bytes_here - st->slots[s].len);
    uint64_t next =
        st->opt.next_capacity > st->bytes_down ? st->opt.next_capacity - st->bytes_down : 0;
    kvs_backend_devices dev = devices_of(st, room, next);
    return st->host->plan(st->host->ctx, st->plan_in, 1, &dev, st->plan_out) == KVS_OK &&
           st->plan_out[0].device == 0 && st->plan_out[0].encoding == st->slots[s].current;
}

/* Place every entry and carry the choices out (fill_entry: pinned ones and `fresh`). */
static kvs_status replace_all(compress_state *st, uint32_t fresh) {
    uint64_t now = now_ns(st), n = 0;
    for (uint32_t s = 0; s < st->n_slots; s++) n += st->slots[s].used;
    if (n == 0) return KVS_OK;
    if (plan_room(st, n) != KVS_OK) {
        set_error(st, "out of memory placing %llu objects", (unsigned long long)n);
        return KVS_ENOMEM;
    }
    uint64_t i = 0;
    for (uint32_t s = 0; s < st->n_slots; s++) {
        if (!st->slots[s].used) continue;
        fill_entry(st, s, fresh, now, &st->plan_in[i]);
        st->plan_slot[i++] = s;
    }
    kvs_backend_devices dev = devices_of(st, st->capacity, st->opt.next_capacity);
    kvs_status rc = st->host->plan(st->host->ctx, st->plan_in, n, &dev, st->plan_out);
    st->last_plan_ns = now;
    st->counts.plans++;
    if (rc != KVS_OK) {
        set_error(st, "the placement refused %llu objects (%d)", (unsigned long long)n, (int)rc);
        return rc;
    }
    /* Passing down and dropping first frees room here before anything is re-encoded. */
    for (i = 0; i < n; i++) {
        uint32_t s = st->plan_slot[i];
        centry *e = &st->slots[s];
        kvs_backend_place_choice c = st->plan_out[i];
        if (c.device < 0) { /* its encoding means nothing then */
            if (e->bytes && pinned_anywhere(st, e, now)) continue;
            if (e->bytes && s != fresh) { /* the fresh one was never visible: no event */
                st->counts.dropped++;
                st->host->on_evict(st->host->ctx, &e->key, NULL, 0); /* stored nowhere */
            }
            release(st, s); /* a record is forgotten: the next tier evicts it in its own time */
        } else if (c.encoding >= e->n_enc || !(st->plan_in[i].allowed >> c.encoding & 1)) {
            continue;
        } else if (c.device == 1 && e->bytes && s != fresh) {
            pass_down(st, s, c.encoding);
        }
    }
    for (i = 0; i < n; i++) {
        uint32_t s = st->plan_slot[i];
        centry *e = &st->slots[s];
        kvs_backend_place_choice c = st->plan_out[i];
        if (e->used && e->bytes && c.device == 0 && c.encoding != e->current &&
            c.encoding < e->n_enc && (st->plan_in[i].allowed >> c.encoding & 1))
            encode_here(st, s, c.encoding);
    }
    return KVS_OK;
}

/* Re-place everything when reevaluate_ms has passed since the last placement. */
static void maybe_reevaluate(compress_state *st) {
    uint64_t every = (st->host->reevaluate_ms ? st->host->reevaluate_ms : 1000) * 1000000ull;
    if (now_ns(st) - st->last_plan_ns >= every) (void)replace_all(st, NIL);
}

/* ---- operations ----------------------------------------------------------------------------- */

/* index_shm: publish what this process holds, or (a handle without staging: it never stores) answer
 * lookups from what the instance's other processes publish. Without index_entries the index has room
 * for an entry per 256 KiB of both capacities (the placement's view of this tier and the next). */
static kvs_status open_index(compress_state *st, const kvs_backend_init *init) {
    uint64_t entries = st->opt.index_entries;
    if (!entries) entries = (st->capacity + st->opt.next_capacity) / (256u << 10);
    if (!st->opt.index_entries && entries > (1ull << 18)) entries = 1ull << 18;
    char why[600];
    kvs_status rc = kvs_dram_index_open(st->opt.index_shm, entries, st->tier_name, st->host,
                                        &st->index, why, sizeof why);
    if (rc != KVS_OK) {
        set_error(st, "%s", why);
        kvs_option_refused(init, "index_shm", -1);
        return rc;
    }
    st->lookup_only =
        init->struct_size > offsetof(kvs_backend_init, staging_base) && init->staging_base == NULL;
    return KVS_OK;
}

static kvs_status compress_create(const kvs_backend_init *init, void **out) {
    if (!init || !out) return KVS_EINVAL;
    *out = NULL;
    const kvs_backend_host *host = init->host;
    if (!host || !KVS_HAS_FIELD(host, kvs_backend_host, reevaluate_ms) || !host->encodings ||
        !host->encode || !host->plan || !host->on_evict) {
        kvs_create_error(init, "a compress tier needs a connector that encodes and places objects "
                               "(backend ABI 1.5, on a handle with a model)");
        return KVS_ENOTSUP;
    }
    compress_state *st = calloc(1, sizeof *st);
    if (!st) {
        kvs_create_error(init, "compress tier: out of memory for its state");
        return KVS_ENOMEM;
    }
    snprintf(st->tier_name, sizeof st->tier_name, "%s",
             init->tier_name ? init->tier_name : "compress");
    st->host = host;
    st->capacity = init->capacity_bytes;
    st->max_object_bytes = init->max_object_bytes;
    st->free_head = NIL;
    st->opt = (options){.bandwidth = 20000000000ull,
                        .latency_us = 5,
                        .next_capacity = init->capacity_bytes * 4,
                        .next_bandwidth = 1000000000ull,
                        .next_latency_us = 100,
                        .recompute_ms = 20};
    char why[400], refused[256];
    kvs_status rc = KVS_ECONFIG;
    if (init->capacity_bytes == 0) {
        set_error(st, "needs a capacity");
        kvs_option_refused(init, "capacity", -1);
        goto fail;
    }
    rc = kvs_options_parse(OPTIONS, sizeof OPTIONS / sizeof OPTIONS[0], init->options,
                           init->n_options, &st->opt, NULL, why, sizeof why, refused,
                           sizeof refused);
    if (rc != KVS_OK) {
        set_error(st, "%s", why);
        kvs_option_refused(init, refused, -1);
        goto fail;
    }
    if (st->opt.index_shm && (rc = open_index(st, init)) != KVS_OK) goto fail;
    if (!st->lookup_only && (rc = grow_slots(st)) != KVS_OK) {
        set_error(st, "out of memory for its index");
        goto fail;
    }
    if (pthread_mutex_init(&st->lock, NULL) != 0) {
        set_error(st, "cannot create its lock");
        rc = KVS_ENOMEM;
        goto fail;
    }
    st->last_plan_ns = now_ns(st);
    *out = st;
    return KVS_OK;

fail:
    kvs_create_error(init, st->error);
    kvs_dram_index_close(st->index);
    free(st->slots);
    free(st->buckets);
    free(st);
    return rc;
}

static void compress_destroy(void *state) {
    compress_state *st = state;
    if (!st) return;
    /* a worker closing: the instance's other processes no longer find what it held */
    for (uint32_t s = 0; st->index && !st->lookup_only && s < st->n_slots; s++)
        if (st->slots[s].used) kvs_dram_index_forget(st->index, &st->slots[s].key);
    for (uint32_t s = 0; s < st->n_slots; s++) free(st->slots[s].bytes);
    free(st->slots);
    free(st->buckets);
    free(st->plan_in);
    free(st->plan_out);
    free(st->plan_slot);
    kvs_dram_index_close(st->index);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

kvs_status kvs_compress_set_clock(void *tier, const kvs_clock *clock) {
    compress_state *st = tier;
    if (!st) return KVS_EINVAL;
    pthread_mutex_lock(&st->lock);
    st->clock = clock;
    st->last_plan_ns = now_ns(st);
    for (uint32_t s = 0; s < st->n_slots; s++) st->slots[s].since_ns = st->last_plan_ns;
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

kvs_status kvs_compress_counts_of(void *tier, kvs_compress_counts *out) {
    compress_state *st = tier;
    if (!st || !out) return KVS_EINVAL;
    pthread_mutex_lock(&st->lock);
    *out = st->counts;
    out->here_raw = out->here_lossy = out->passed_down = 0;
    for (uint32_t s = 0; s < st->n_slots; s++) {
        const centry *e = &st->slots[s];
        if (!e->used) continue;
        if (!e->bytes)
            out->passed_down++;
        else if (e->enc[e->current].codec == 0)
            out->here_raw++;
        else
            out->here_lossy++;
    }
    out->bytes_here = st->bytes_here;
    out->bytes_down = st->bytes_down;
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

static kvs_status lookup_only_refusal(compress_state *st, const char *what) {
    set_error(st,
              "cannot %s: this handle has no staging (a scheduler), so it opened only the "
              "index the instance's workers publish (index_shm)",
              what);
    return KVS_ENOTSUP;
}

static uint32_t compress_instance_caps(void *state) {
    const compress_state *st = state;
    return st ? kvs_dram_index_caps(st->index) : 0;
}

static const char *compress_last_error(void *state) {
    compress_state *st = state;
    return st ? st->error : "";
}

static kvs_status compress_contains(void *state, const kvs_key *keys, uint64_t n,
                                    uint64_t *n_present) {
    compress_state *st = state;
    if (!st || (!keys && n) || !n_present) return KVS_EINVAL;
    if (st->lookup_only) return kvs_dram_index_contains(st->index, keys, n, n_present);
    pthread_mutex_lock(&st->lock);
    uint64_t i = 0;
    for (uint32_t s; i < n && (s = slot_of_key(st, &keys[i])) != NIL && st->slots[s].bytes;) i++;
    pthread_mutex_unlock(&st->lock);
    *n_present = i;
    return KVS_OK;
}

static kvs_status compress_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                               uint64_t *n_pinned) {
    compress_state *st = state;
    if (!st || (!keys && n) || !n_pinned) return KVS_EINVAL;
    if (st->lookup_only) return kvs_dram_index_pin(st->index, keys, n, timeout_ms, n_pinned);
    pthread_mutex_lock(&st->lock);
    uint64_t now = now_ns(st), i = 0;
    for (; i < n; i++) {
        uint32_t s = slot_of_key(st, &keys[i]);
        if (s == NIL || !st->slots[s].bytes) break;
        centry *e = &st->slots[s];
        if (!pinned_here(e, now)) e->pins = 0; /* expired pins are gone */
        e->pins++;
        uint64_t until = now + timeout_ms * 1000000ull;
        if (until > e->pin_deadline_ns) e->pin_deadline_ns = until;
    }
    pthread_mutex_unlock(&st->lock);
    *n_pinned = i;
    return KVS_OK;
}

static kvs_status compress_unpin(void *state, const kvs_key *keys, uint64_t n) {
    compress_state *st = state;
    if (!st || (!keys && n)) return KVS_EINVAL;
    if (st->lookup_only) return kvs_dram_index_unpin(st->index, keys, n);
    pthread_mutex_lock(&st->lock);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t s = slot_of_key(st, &keys[i]);
        if (s != NIL && st->slots[s].pins) st->slots[s].pins--;
    }
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

static kvs_status compress_get(void *state, const kvs_key *key, void *dst, uint64_t cap,
                               uint64_t *len) {
    compress_state *st = state;
    if (!st || !key || (!dst && cap) || !len) return KVS_EINVAL;
    if (st->lookup_only) return lookup_only_refusal(st, "read");
    pthread_mutex_lock(&st->lock);
    kvs_status rc = KVS_ENOTFOUND;
    uint32_t s = slot_of_key(st, key);
    /* Published by this rank's process before it was restarted: the instance forgets it now. */
    if (s == NIL && st->index) kvs_dram_index_forget(st->index, key);
    if (s != NIL && st->slots[s].bytes) {
        centry *e = &st->slots[s];
        *len = e->len;
        e->hits += 1;
        rc = e->len > cap ? KVS_EOVERFLOW : KVS_OK;
        if (rc == KVS_OK) memcpy(dst, e->bytes, e->len);
    }
    maybe_reevaluate(st);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* With the lock held: a copy of the object in a slot of its own (*out), linked and counted, not
 * visible yet. An entry s of the same key is replaced: the new bytes take its place and its reads.
 * On KVS_ENOMEM the error is set and nothing changed but the replaced entry released. */
static kvs_status insert_entry(compress_state *st, uint32_t s, const kvs_key *key,
                               const void *object, uint64_t len, const kvs_backend_encoding *enc,
                               uint32_t n_enc, uint64_t now, uint32_t *out) {
    uint8_t *copy = malloc(len);
    if (!copy) {
        set_error(st, "out of memory for a %llu-byte object", (unsigned long long)len);
        return KVS_ENOMEM;
    }
    double hits = 0;
    if (s != NIL) { /* replaced: the new bytes take its place and its reads */
        hits = st->slots[s].hits;
        release(st, s);
    }
    s = take_slot(st);
    if (s == NIL) {
        free(copy);
        set_error(st, "out of memory for its index");
        return KVS_ENOMEM;
    }
    centry *e = &st->slots[s];
    e->key = *key;
    e->bytes = memcpy(copy, object, len);
    e->len = len;
    e->n_enc = n_enc;
    memcpy(e->enc, enc, n_enc * sizeof enc[0]);
    e->hits = hits;
    e->since_ns = now;
    link_slot(st, s);
    st->bytes_here += len;
    *out = s;
    return KVS_OK;
}

/* With the lock held: place the new entry s of key and publish it, or release it (never visible)
 * when the placement finds no room for it or stores it nowhere. */
static kvs_status place_new(compress_state *st, const kvs_key *key, uint32_t s) {
    /* With room for it, and the placement keeping it as it came when asked about it alone, nothing
     * else has to move: the whole placement runs when the tier is full (and every reevaluate_ms),
     * not on every put. */
    kvs_status rc = fits_as_is(st, s) ? KVS_OK : replace_all(st, s);
    /* an encode that failed (values it cannot take in a layer the estimate did not see) leaves room
     * short: the next placements know that encoding is out */
    for (int again = 0; again < 3 && rc == KVS_OK && st->bytes_here > st->capacity; again++)
        rc = replace_all(st, slot_of_key(st, key));
    s = slot_of_key(st, key);
    if (rc != KVS_OK) {
        if (s != NIL) release(st, s); /* never visible */
    } else if (st->bytes_here > st->capacity) {
        /* pinned objects left no room: the new one goes (it was never visible) */
        if (s != NIL && st->slots[s].bytes) release(st, s);
        set_error(st, "no room: %llu bytes here are pinned", (unsigned long long)st->bytes_here);
        rc = KVS_ENOMEM;
    } else if (rc == KVS_OK && s == NIL) {
        set_error(st, "the placement stores this object nowhere (worth less than a recompute)");
        rc = KVS_ENOMEM;
    } else {
        publish(st, s);
    }
    return rc;
}

static kvs_status compress_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    compress_state *st = state;
    if (!st || !key || !object || len == 0) return KVS_EINVAL;
    if (st->lookup_only) return lookup_only_refusal(st, "store");
    kvs_backend_encoding enc[KVS_BACKEND_MAX_ENCODINGS];
    uint32_t n_enc = 0;
    /* Outside the lock: the host reads the object (and estimates each codec on it) */
    kvs_status rc =
        st->host->encodings(st->host->ctx, object, len, enc, KVS_BACKEND_MAX_ENCODINGS, &n_enc);
    pthread_mutex_lock(&st->lock);
    if (rc != KVS_OK || n_enc == 0 || n_enc > KVS_BACKEND_MAX_ENCODINGS || enc[0].bytes != len) {
        set_error(st, "the connector cannot read a %llu-byte object (%d)", (unsigned long long)len,
                  (int)rc);
        pthread_mutex_unlock(&st->lock);
        return rc != KVS_OK ? rc : KVS_ECORRUPT;
    }
    if (len > st->capacity) {
        set_error(st, "a %llu-byte object exceeds the capacity", (unsigned long long)len);
        pthread_mutex_unlock(&st->lock);
        return KVS_ENOMEM;
    }
    uint64_t now = now_ns(st);
    uint32_t s = slot_of_key(st, key);
    if (s != NIL && st->slots[s].bytes && pinned_anywhere(st, &st->slots[s], now)) {
        pthread_mutex_unlock(&st->lock); /* equal keys hold equal bytes: the pinned one stays */
        return KVS_OK;
    }
    rc = insert_entry(st, s, key, object, len, enc, n_enc, now, &s);
    if (rc == KVS_OK) rc = place_new(st, key, s);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

static kvs_status compress_remove(void *state, const kvs_key *key) {
    compress_state *st = state;
    if (!st || !key) return KVS_EINVAL;
    if (st->lookup_only) {
        kvs_dram_index_forget(st->index, key); /* its owner's load will miss and forget it too */
        return KVS_OK;
    }
    pthread_mutex_lock(&st->lock);
    uint32_t s = slot_of_key(st, key);
    if (s != NIL)
        release(st, s);
    else if (st->index) /* published by this rank's process before it was restarted */
        kvs_dram_index_forget(st->index, key);
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

static kvs_status compress_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    compress_state *st = state;
    if (!st || !n_objects || !bytes) return KVS_EINVAL;
    if (st->lookup_only) { /* the owners' bytes are theirs to count */
        *bytes = 0;
        return kvs_dram_index_usage(st->index, n_objects);
    }
    pthread_mutex_lock(&st->lock);
    uint64_t n = 0;
    for (uint32_t s = 0; s < st->n_slots; s++) n += st->slots[s].used && st->slots[s].bytes;
    *n_objects = n;
    *bytes = st->bytes_here;
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

static kvs_status compress_codecs(void *state, const kvs_key *keys, uint64_t n, uint16_t *codecs) {
    compress_state *st = state;
    if (!st || ((!keys || !codecs) && n)) return KVS_EINVAL;
    if (st->lookup_only) return kvs_dram_index_codecs(st->index, keys, n, codecs);
    pthread_mutex_lock(&st->lock);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t s = slot_of_key(st, &keys[i]);
        codecs[i] = s == NIL ? 0 : st->slots[s].enc[st->slots[s].current].codec;
    }
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

static const kvs_backend_ops OPS = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_CODECS,
    .type_name = "compress",
    .create = compress_create,
    .destroy = compress_destroy,
    .last_error = compress_last_error,
    .contains = compress_contains,
    .pin = compress_pin,
    .unpin = compress_unpin,
    .get = compress_get,
    .put = compress_put,
    .remove = compress_remove,
    .usage = compress_usage,
    .codecs = compress_codecs,
    .instance_caps = compress_instance_caps,
};

const kvs_backend_ops *kvs_compress_backend(void) {
    return &OPS;
}
