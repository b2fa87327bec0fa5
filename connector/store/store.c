/* store.c - the store API's table (abi/kvstrata_store.h): open a store on a configuration's tier
 * chain, the calls that answer at once (exists, unpin, memory, usage, stats, events), and the
 * calling thread's last error. Batches are store_batch.c's, one key's work store_io.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/abi_struct.h"
#include "common/log.h"
#include "common/status.h"
#include "connector/object.h"
#include "store.h"
#include "store_batch.h"
#include "store_events.h"
#include "store_io.h"
#include "store_state.h"
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define STORE_DEFAULT_THREADS 2u

/* The namespace and tenant, hashed: every object's fingerprint and every key's prefix. */
static void namespace_key(const kvs_store_open_params *p, kvs_key *out) {
    static const char domain[] = "kvstrata-store-v1";
    uint64_t ns_len = p->namespace_len;
    uint32_t tenant_len = p->tenant ? (uint32_t)strlen(p->tenant) : 0;
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, domain, sizeof domain);
    XXH3_128bits_update(&st, &ns_len, sizeof ns_len);
    XXH3_128bits_update(&st, p->namespace_bytes, (size_t)ns_len);
    XXH3_128bits_update(&st, &tenant_len, sizeof tenant_len);
    if (tenant_len) XXH3_128bits_update(&st, p->tenant, tenant_len);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(out->bytes, c.digest, sizeof out->bytes);
}

static kvs_status check_params(const kvs_store_open_params *in, kvs_store_open_params *p, char *err,
                               size_t err_len) {
    if (!in || kvs_struct_in(p, sizeof *p, in, KVS_STORE_OPEN_PARAMS_SIZE_1_0) != 0)
        return kvs_fmt(err, err_len, "store open: params NULL or struct_size below %u",
                       KVS_STORE_OPEN_PARAMS_SIZE_1_0),
               KVS_EINVAL;
    if (!p->namespace_bytes || !p->namespace_len || p->namespace_len > KVS_STORE_NAMESPACE_MAX)
        return kvs_fmt(err, err_len, "store open: a namespace of 1..%u bytes is required",
                       KVS_STORE_NAMESPACE_MAX),
               KVS_EINVAL;
    if (p->tenant && strnlen(p->tenant, KVS_STORE_TENANT_MAX + 1) > KVS_STORE_TENANT_MAX)
        return kvs_fmt(err, err_len, "store open: a tenant name has at most %u bytes",
                       KVS_STORE_TENANT_MAX),
               KVS_EINVAL;
    if (p->threads > KVS_STORE_MAX_THREADS)
        return kvs_fmt(err, err_len, "store open: %u threads (at most %u)", p->threads,
                       KVS_STORE_MAX_THREADS),
               KVS_EINVAL;
    if (!p->max_value_bytes) p->max_value_bytes = KVS_STORE_DEFAULT_MAX;
    if (p->max_value_bytes > (1ull << 40))
        return kvs_fmt(err, err_len, "store open: max_value_bytes above 1 TiB"), KVS_EINVAL;
    if (!p->threads) p->threads = STORE_DEFAULT_THREADS;
    return KVS_OK;
}

/* Tiers whose objects the store cannot seal or read: refused with a sentence. */
static kvs_status refuse_tiers(const kvs_config *cfg, char *err, size_t err_len) {
    for (uint32_t t = 0; t < cfg->n_tiers; t++) {
        const kvs_tier_config *tc = &cfg->tiers[t];
        if (tc->keyed)
            return kvs_fmt(err, err_len,
                           "%s:%d:%d: tier '%s' is `integrity: keyed`: the store API seals "
                           "values with checksums only; leave integrity out for a store",
                           cfg->source, tc->line, tc->column, tc->name),
                   KVS_ECONFIG;
        if (!strcmp(tc->type, "compress"))
            return kvs_fmt(err, err_len,
                           "%s:%d:%d: tier '%s' is a compress tier: it encodes KV by its layout, "
                           "and the store API's values are the engine's opaque bytes",
                           cfg->source, tc->line, tc->column, tc->name),
                   KVS_ECONFIG;
    }
    return KVS_OK;
}

static kvs_status open_tiers(kvs_store *s, const kvs_store_open_params *p, char *err,
                             size_t err_len) {
    kvs_status st = p->config_path ? kvs_config_load(p->config_path, &s->cfg, err, err_len)
                                   : kvs_config_defaults(&s->cfg);
    if (st == KVS_ENOMEM) kvs_fmt(err, err_len, "store open: out of memory");
    if (st == KVS_OK) st = refuse_tiers(s->cfg, err, err_len);
    if (st == KVS_OK)
        st = kvs_tiers_open(s->cfg, s->max_object, NULL, NULL, 0, kvs_store_on_tier_event, s,
                            &s->chain, err, err_len);
    if (st != KVS_OK) return st;
    s->n_tiers = kvs_tiers_count(s->chain);
    if (s->n_tiers > KVS_STORE_MAX_TIERS) s->n_tiers = KVS_STORE_MAX_TIERS;
    for (uint32_t t = 0; t < s->n_tiers; t++) s->has_remote |= kvs_tiers_is_remote(s->chain, t);
    s->serialize = !kvs_tiers_thread_safe(s->chain);
    return KVS_OK;
}

static void store_close(kvs_store *s);

static kvs_status store_open(const kvs_store_open_params *in, kvs_store **out, char *error,
                             size_t error_len) {
    char scratch[512];
    char *err = error && error_len ? error : scratch;
    size_t err_len = error && error_len ? error_len : sizeof scratch;
    err[0] = '\0';
    if (!out) return kvs_fmt(err, err_len, "store open: out is NULL"), KVS_EINVAL;
    *out = NULL;
    kvs_store_open_params p;
    kvs_status st = check_params(in, &p, err, err_len);
    if (st != KVS_OK) return st;
    kvs_store *s = calloc(1, sizeof *s);
    if (!s) return kvs_fmt(err, err_len, "store open: out of memory"), KVS_ENOMEM;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->chain_lock, NULL);
    pthread_mutex_init(&s->pins_lock, NULL);
    pthread_mutex_init(&s->regions_lock, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->done, &ca);
    pthread_condattr_destroy(&ca);
    s->event_fd = -1;
    s->max_value = p.max_value_bytes;
    s->max_object = kvs_object_payload_offset(1) + p.max_value_bytes;
    namespace_key(&p, &s->ns);
    if (p.event_capacity && kvs_store_events_create(p.event_capacity, &s->events) != KVS_OK)
        st = KVS_ENOMEM, kvs_fmt(err, err_len, "store open: out of memory for events");
    if (st == KVS_OK) st = open_tiers(s, &p, err, err_len);
    if (st == KVS_OK) st = kvs_store_threads_start(s, p.threads, err, err_len);
    if (st != KVS_OK) {
        store_close(s);
        return st;
    }
    if (p.tenant) snprintf(s->tenant, sizeof s->tenant, "%s", p.tenant);
    kvs_store_metrics_open(s);
    *out = s;
    return KVS_OK;
}

static void store_close(kvs_store *s) {
    if (!s) return;
    kvs_store_threads_stop(s);
    kvs_store_metrics_close(s); /* after the last batch, while the tiers answer usage */
    /* pins still held end here rather than at their lease */
    if (s->chain) kvs_store_unpin_all(s);
    kvs_tiers_close(s->chain);
    kvs_config_free(s->cfg);
    kvs_store_events_destroy(s->events);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->chain_lock);
    pthread_mutex_destroy(&s->pins_lock);
    pthread_mutex_destroy(&s->regions_lock);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    kvs_store_forget_error(s);
    free(s);
}

static kvs_status store_register(kvs_store *s, void *base, uint64_t len, uint32_t kind,
                                 int32_t device_index, uint64_t *region) {
    if (!s || !base || !len || !region || (uintptr_t)base + len < (uintptr_t)base)
        return kvs_store_set_error(s, "register_memory: NULL or empty range"), KVS_EINVAL;
    if (kind != KVS_STORE_MEM_HOST)
        return kvs_store_set_error(s,
                                   "register_memory: device memory (kind %u, device %d) is "
                                   "not supported by this build's store; pass host memory",
                                   kind, device_index),
               KVS_ENOTSUP;
    pthread_mutex_lock(&s->regions_lock);
    kvs_store_region *free_slot = NULL;
    for (uint32_t i = 0; i < KVS_STORE_MAX_REGIONS; i++) {
        kvs_store_region *r = &s->regions[i];
        if (!r->id) {
            if (!free_slot) free_slot = r;
            continue;
        }
        if ((uintptr_t)base < r->base + r->len && r->base < (uintptr_t)base + len) {
            pthread_mutex_unlock(&s->regions_lock);
            return kvs_store_set_error(s, "register_memory: the range overlaps region %llu",
                                       (unsigned long long)r->id),
                   KVS_EINVAL;
        }
    }
    if (free_slot)
        *free_slot = (kvs_store_region){
            .id = ++s->next_region, .base = (uintptr_t)base, .len = len, .kind = kind};
    pthread_mutex_unlock(&s->regions_lock);
    if (!free_slot)
        return kvs_store_set_error(s, "register_memory: %u regions registered already",
                                   KVS_STORE_MAX_REGIONS),
               KVS_ENOMEM;
    *region = free_slot->id;
    return KVS_OK;
}

static kvs_status store_unregister(kvs_store *s, uint64_t region) {
    if (!s) return KVS_EINVAL;
    kvs_status st = KVS_ENOTFOUND;
    pthread_mutex_lock(&s->regions_lock);
    for (uint32_t i = 0; region && i < KVS_STORE_MAX_REGIONS; i++)
        if (s->regions[i].id == region) s->regions[i].id = 0, st = KVS_OK;
    pthread_mutex_unlock(&s->regions_lock);
    if (st != KVS_OK)
        kvs_store_set_error(s, "unregister_memory: no region %llu", (unsigned long long)region);
    return st;
}

static kvs_status store_exists(kvs_store *s, const kvs_store_keys *keys, uint32_t flags,
                               uint64_t pin_ms, uint8_t *states, uint64_t *n_leading) {
    if (!s || !n_leading) return kvs_store_set_error(s, "exists: NULL argument"), KVS_EINVAL;
    kvs_key *k = NULL;
    kvs_status st = kvs_store_derive_keys(s, keys, &k);
    if (st == KVS_OK) st = kvs_store_exists_keys(s, k, keys->n, flags, pin_ms, states, n_leading);
    free(k);
    return st;
}

static kvs_status store_unpin(kvs_store *s, const kvs_store_keys *keys) {
    if (!s) return KVS_EINVAL;
    kvs_key *k = NULL;
    kvs_status st = kvs_store_derive_keys(s, keys, &k);
    if (st == KVS_OK) kvs_store_unpin_keys(s, k, keys->n);
    free(k);
    return st;
}

static kvs_status store_submit(kvs_store *s, uint32_t op, const kvs_store_keys *keys,
                               const kvs_store_sg *sg, uint32_t flags, uint64_t *ticket) {
    return s ? kvs_store_submit(s, op, keys, sg, flags, ticket) : KVS_EINVAL;
}

static kvs_status store_wait(kvs_store *s, uint64_t ticket, uint64_t timeout_ms,
                             kvs_store_result *results, uint64_t cap, uint64_t *n_failed) {
    return s ? kvs_store_wait(s, ticket, timeout_ms, results, cap, n_failed) : KVS_EINVAL;
}

static int store_event_fd(kvs_store *s) {
    return s ? s->event_fd : -1;
}

static kvs_status store_drain(kvs_store *s, uint64_t *tickets, uint64_t cap, uint64_t *n) {
    return s ? kvs_store_drain(s, tickets, cap, n) : KVS_EINVAL;
}

static void usage_of(kvs_store *s, uint32_t t, kvs_store_tier_usage *u) {
    memset(u, 0, sizeof *u);
    u->struct_size = sizeof *u;
    u->tier = t;
    snprintf(u->name, sizeof u->name, "%s", kvs_tiers_name(s->chain, t));
    const kvs_backend_ops *ops = kvs_tiers_ops(s->chain, t);
    if (s->serialize) pthread_mutex_lock(&s->chain_lock);
    if (ops->usage) ops->usage(kvs_tiers_state(s->chain, t), &u->objects, &u->bytes);
    if (s->serialize) pthread_mutex_unlock(&s->chain_lock);
    u->capacity = t < s->cfg->n_tiers ? s->cfg->tiers[t].capacity_bytes : 0;
    u->hits = KVS_STORE_GET(s->c.tier_hits[t]);
    u->hit_bytes = KVS_STORE_GET(s->c.tier_hit_bytes[t]);
    u->puts = KVS_STORE_GET(s->c.tier_puts[t]);
    u->put_bytes = KVS_STORE_GET(s->c.tier_put_bytes[t]);
}

static kvs_status store_usage(kvs_store *s, kvs_store_tier_usage *out, uint32_t cap, uint32_t *n) {
    if (!s || !n || (cap && !out)) return kvs_store_set_error(s, "usage: NULL"), KVS_EINVAL;
    uint32_t step = cap ? out[0].struct_size : 0;
    if (cap && step < KVS_STORE_TIER_USAGE_SIZE_1_0)
        return kvs_store_set_error(s, "usage: struct_size below %u", KVS_STORE_TIER_USAGE_SIZE_1_0),
               KVS_EINVAL;
    uint32_t k = 0;
    for (; k < cap && k < s->n_tiers; k++) {
        kvs_store_tier_usage u;
        usage_of(s, k, &u);
        kvs_store_tier_usage *dst = (kvs_store_tier_usage *)((uint8_t *)out + (size_t)k * step);
        memcpy(dst, &u, step < sizeof u ? step : sizeof u);
        dst->struct_size = step;
    }
    *n = s->n_tiers;
    return KVS_OK;
}

static uint64_t batches_in_flight(kvs_store *s) {
    pthread_mutex_lock(&s->lock);
    uint64_t n = s->in_flight;
    pthread_mutex_unlock(&s->lock);
    return n;
}

static kvs_status store_stats(kvs_store *s, kvs_store_stats *out) {
    uint32_t size = s && out ? kvs_struct_out_size(out, sizeof *out, KVS_STORE_STATS_SIZE_1_0) : 0;
    if (!size) return kvs_store_set_error(s, "stats: NULL or struct_size too small"), KVS_EINVAL;
    const kvs_store_counters *c = &s->c;
    kvs_store_stats v = {
        .struct_size = size,
        .n_tiers = s->n_tiers,
        .gets = KVS_STORE_GET(c->gets),
        .get_hits = KVS_STORE_GET(c->get_hits),
        .get_misses = KVS_STORE_GET(c->get_misses),
        .get_bytes = KVS_STORE_GET(c->get_bytes),
        .get_ns = KVS_STORE_GET(c->get_ns),
        .puts = KVS_STORE_GET(c->puts),
        .puts_stored = KVS_STORE_GET(c->puts_stored),
        .puts_skipped = KVS_STORE_GET(c->puts_skipped),
        .puts_failed = KVS_STORE_GET(c->puts_failed),
        .put_bytes = KVS_STORE_GET(c->put_bytes),
        .put_ns = KVS_STORE_GET(c->put_ns),
        .exists_keys = KVS_STORE_GET(c->exists_keys),
        .exists_present = KVS_STORE_GET(c->exists_present),
        .removes = KVS_STORE_GET(c->removes),
        .corrupt = KVS_STORE_GET(c->corrupt),
        .batches_in_flight = batches_in_flight(s),
        .events_dropped = kvs_store_events_dropped(s->events),
    };
    memcpy(out, &v, size);
    return KVS_OK;
}

static kvs_status store_take_events(kvs_store *s, void *buf, uint64_t cap, uint64_t *len,
                                    uint64_t *n) {
    if (!s || !len || !n || (cap && !buf))
        return kvs_store_set_error(s, "take_events: NULL argument"), KVS_EINVAL;
    *len = *n = 0;
    if (!s->events) return KVS_OK;
    kvs_status st = kvs_store_events_take(s->events, buf, cap, len, n);
    if (st == KVS_EOVERFLOW)
        kvs_store_set_error(s, "take_events: %llu bytes cannot hold the next event",
                            (unsigned long long)cap);
    return st;
}

static const kvs_store_api store_api_v1 = {
    .abi_major = KVS_STORE_ABI_MAJOR,
    .abi_minor = KVS_STORE_ABI_MINOR,
    .struct_size = sizeof(kvs_store_api),
    .open = store_open,
    .close = store_close,
    .last_error = kvs_store_error_of,
    .register_memory = store_register,
    .unregister_memory = store_unregister,
    .exists = store_exists,
    .unpin = store_unpin,
    .submit = store_submit,
    .wait = store_wait,
    .event_fd = store_event_fd,
    .drain = store_drain,
    .usage = store_usage,
    .stats = store_stats,
    .take_events = store_take_events,
};

const kvs_store_api *kvs_store_api_table(uint32_t major) {
    return major == KVS_STORE_ABI_MAJOR ? &store_api_v1 : NULL;
}
