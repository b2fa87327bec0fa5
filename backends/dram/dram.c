/*
 * dram.c - the DRAM tier (contract in dram.h): its options and its operations. They stand on two
 * files below: the tables inside the mapping - hash index, LRU, slab lifecycle, the lock - are
 * dram_table.c's; the mapping itself - creating or attaching it, attacher tracking - dram_shm.c's.
 */
#include "dram.h"
#include "common/clock.h"
#include "common/key.h"
#include "common/log.h"
#include "common/options.h"
#include "common/pace.h"
#include "common/units.h"
#include "dram_shm.h"
#include "dram_table.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- create / destroy ---------------------------------------------------------------------- */

static int parse_shm_name(const char *value, void *out, uint64_t nth, char *why, size_t why_len) {
    dram_state *st = out;
    (void)nth;
    if (!dram_shm_valid_name(value)) {
        snprintf(why, why_len,
                 "shm_name \"%.100s\" is not a valid name (1 to %d characters of "
                 "A-Z a-z 0-9 _ . -)",
                 value, DRAM_SHM_NAME_MAX);
        return -1;
    }
    snprintf(st->shm_path, sizeof st->shm_path, "/%s", value);
    return 0;
}

/* The options, by name, and where each goes in the tier's state. */
static const kvs_option_desc OPTIONS[] = {
    {.name = "shm_name", .kind = KVS_OPTION_CUSTOM, .parse = parse_shm_name},
    {.name = "shm_open", /* its index is the flag: create (or attach) 0, attach only 1 */
     .kind = KVS_OPTION_CHOICE,
     KVS_OPTION_FIELD(dram_state, shm_attach_only),
     .choices = "create|attach"},
    {.name = "evict", /* its index is the flag: lru 0, never 1 */
     .kind = KVS_OPTION_CHOICE,
     KVS_OPTION_FIELD(dram_state, evict_never),
     .choices = "lru|never"},
    {.name = "lock_timeout_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(dram_state, lock_timeout_ms),
     .max = 3600000},
    {.name = "read_bandwidth",
     .kind = KVS_OPTION_RATE,
     KVS_OPTION_FIELD(dram_state, pace_bytes_per_s),
     .min = 1,
     .example = "200MiB/s"},
    {.name = "read_latency_us",
     .kind = KVS_OPTION_MICROSECONDS,
     KVS_OPTION_FIELD(dram_state, pace_latency_us),
     .max = 10000000ull},
};

static kvs_status parse_options(dram_state *st, const kvs_backend_init *init) {
    char why[400], refused[256];
    kvs_status rc =
        kvs_options_parse(OPTIONS, sizeof OPTIONS / sizeof OPTIONS[0], init->options,
                          init->n_options, st, NULL, why, sizeof why, refused, sizeof refused);
    if (rc != KVS_OK) {
        dram_set_error(st, "%s", why);
        kvs_option_refused(init, refused, -1);
        return rc;
    }
    st->pace_latency_ns = st->pace_latency_us * 1000ull;
    if (st->shm_attach_only && !st->shm_path[0]) {
        dram_set_error(st, "shm_open: attach needs shm_name (the tier to attach)");
        kvs_option_refused(init, "shm_open", -1);
        return KVS_ECONFIG;
    }
    return KVS_OK;
}

/* A paced tier: a read of len bytes waits its turn on the modelled device, then for its own time. */
static void pace_read(dram_state *st, uint64_t len) {
    if (st->pace_bytes_per_s || st->pace_latency_ns)
        kvs_pace_wait(&st->pace, kvs_now_ns(),
                      kvs_pace_cost_ns(len, st->pace_bytes_per_s, st->pace_latency_ns));
}

static kvs_status dram_create(const kvs_backend_init *init, void **out) {
    if (!init || !out) return KVS_EINVAL;
    *out = NULL;
    if (init->struct_size < offsetof(kvs_backend_init, staging_base)) return KVS_EVERSION;
    dram_state *st = calloc(1, sizeof *st);
    if (!st) {
        kvs_create_error(init, "dram tier: out of memory for its state");
        return KVS_ENOMEM;
    }
    snprintf(st->tier_name, sizeof st->tier_name, "%s", init->tier_name ? init->tier_name : "dram");
    kvs_pace_init(&st->pace);
    st->max_object_bytes = init->max_object_bytes;
    const kvs_backend_host *host = init->host;
    if (host) {
        st->host_ctx = host->ctx;
        if (host->struct_size >= offsetof(kvs_backend_host, log) + sizeof host->log)
            st->log = host->log;
        if (host->struct_size >= offsetof(kvs_backend_host, on_evict) + sizeof host->on_evict)
            st->on_evict = host->on_evict;
    }
    geometry g;
    kvs_status rc = KVS_EINVAL;
    if (init->n_options && !init->options) {
        dram_set_error(st, "n_options is %llu but options is NULL",
                       (unsigned long long)init->n_options);
        goto fail;
    }
    rc = parse_options(st, init);
    if (rc != KVS_OK) goto fail;
    rc = dram_shm_plan(st, init->capacity_bytes, &g);
    if (rc == KVS_ECONFIG) kvs_option_refused(init, "capacity", -1);
    if (rc != KVS_OK) goto fail;
    rc = dram_shm_map(st, &g);
    if (rc == KVS_ECONFIG)
        kvs_option_refused(init, "capacity", -1); /* the shared geometry differs */
    if (rc != KVS_OK) goto fail;
    /* Large pages for the slab data where the kernel allows it; a refusal costs only speed. */
    madvise(st->data, g.n_slabs * g.slab_bytes, MADV_HUGEPAGE);
    *out = st;
    return KVS_OK;

fail:
    kvs_create_error(init, st->error);
    kvs_pace_destroy(&st->pace);
    free(st);
    return rc;
}

static void dram_destroy(void *state) {
    dram_state *st = state;
    if (!st) return;
    dram_shm_unmap(st);
    kvs_pace_destroy(&st->pace);
    free(st);
}

kvs_status kvs_dram_set_clock(void *tier, const kvs_clock *clock) {
    dram_state *st = tier;
    if (!st) return KVS_EINVAL;
    st->clock = clock;
    return KVS_OK;
}

static const char *dram_last_error(void *state) {
    dram_state *st = state;
    return st ? st->error : "";
}

/* ---- operations ----------------------------------------------------------------------------- */

static kvs_status dram_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    dram_state *st = state;
    if (!st || (!keys && n) || !n_present) return KVS_EINVAL;
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    uint64_t i = 0;
    while (i < n && index_find(st, &keys[i], NULL) != DRAM_NIL)
        if (i++ == 0) index_prefetch(st, keys + 1, n - 1);
    dram_unlock(st);
    *n_present = i;
    return KVS_OK;
}

static kvs_status dram_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                           uint64_t *n_pinned) {
    dram_state *st = state;
    if (!st || (!keys && n) || !n_pinned) return KVS_EINVAL;
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    uint64_t now = kvs_clock_now_ns(st->clock);
    uint64_t room_ms = (UINT64_MAX - now) / 1000000ull;
    uint64_t deadline = now + (timeout_ms < room_ms ? timeout_ms : room_ms) * 1000000ull;
    uint64_t i = 0;
    for (; i < n; i++) {
        uint32_t s = index_find(st, &keys[i], NULL);
        if (s == DRAM_NIL) break;
        if (i == 0) index_prefetch(st, keys + 1, n - 1);
        slab_entry *e = &st->slabs[s];
        slab_pinned(e, now); /* clears an expired pin before this one nests on it */
        if (e->pins < UINT32_MAX) e->pins++;
        if (deadline > e->pin_deadline_ns) e->pin_deadline_ns = deadline;
    }
    dram_unlock(st);
    *n_pinned = i;
    return KVS_OK;
}

static kvs_status dram_unpin(void *state, const kvs_key *keys, uint64_t n) {
    dram_state *st = state;
    if (!st || (!keys && n)) return KVS_EINVAL;
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    uint64_t now = kvs_clock_now_ns(st->clock);
    index_prefetch(st, keys, n);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t s = index_find(st, &keys[i], NULL);
        if (s == DRAM_NIL) continue;
        slab_entry *e = &st->slabs[s];
        if (!slab_pinned(e, now)) continue; /* none held, or expired: unpinning is a no-op */
        if (--e->pins == 0) e->pin_deadline_ns = 0;
    }
    dram_unlock(st);
    return KVS_OK;
}

/* Takes the lock and finds key for a read; on KVS_OK the lock is held and *slab is set. */
static kvs_status lock_and_find(dram_state *st, const kvs_key *key, uint32_t *slab) {
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    *slab = index_find(st, key, NULL);
    if (*slab != DRAM_NIL) return KVS_OK;
    dram_set_error(st, "object not stored");
    dram_unlock(st);
    return KVS_ENOTFOUND;
}

kvs_status kvs_dram_pinned(void *tier, const kvs_key *key, int *pinned) {
    dram_state *st = tier;
    uint32_t s = DRAM_NIL;
    if (!st || !key || !pinned) return KVS_EINVAL;
    *pinned = 0;
    kvs_status rc = lock_and_find(st, key, &s);
    if (rc == KVS_ENOTFOUND) return KVS_OK;
    if (rc != KVS_OK) return rc;
    *pinned = slab_pinned(&st->slabs[s], kvs_clock_now_ns(st->clock));
    dram_unlock(st);
    return KVS_OK;
}

static kvs_status dram_get(void *state, const kvs_key *key, void *dst, uint64_t cap,
                           uint64_t *len) {
    dram_state *st = state;
    uint32_t s = DRAM_NIL;
    if (!st || !key || !len || (!dst && cap)) return KVS_EINVAL;
    kvs_status rc = lock_and_find(st, key, &s);
    if (rc != KVS_OK) return rc;
    *len = st->slabs[s].len;
    if (cap < *len) {
        dram_set_error(st, "object of %llu bytes does not fit a buffer of %llu bytes",
                       (unsigned long long)*len, (unsigned long long)cap);
        rc = KVS_EOVERFLOW;
    } else {
        if (*len) memcpy(dst, slab_data(st, s), *len);
        lru_touch(st, s);
    }
    dram_unlock(st);
    if (rc == KVS_OK) pace_read(st, *len);
    return rc;
}

static kvs_status dram_get_range(void *state, const kvs_key *key, uint64_t offset, uint64_t len,
                                 void *dst, uint64_t *got, uint64_t *object_len) {
    dram_state *st = state;
    uint32_t s = DRAM_NIL;
    if (!st || !key || !got || !object_len || (!dst && len)) return KVS_EINVAL;
    kvs_status rc = lock_and_find(st, key, &s);
    if (rc != KVS_OK) return rc;
    *object_len = st->slabs[s].len;
    *got = offset >= *object_len ? 0 : (len < *object_len - offset ? len : *object_len - offset);
    if (*got) memcpy(dst, slab_data(st, s) + offset, *got);
    lru_touch(st, s);
    dram_unlock(st);
    pace_read(st, *got);
    return KVS_OK;
}

static kvs_status dram_get_ref(void *state, const kvs_key *key, const void **object,
                               uint64_t *len) {
    dram_state *st = state;
    uint32_t s = DRAM_NIL;
    if (!st || !key || !object || !len) return KVS_EINVAL;
    kvs_status rc = lock_and_find(st, key, &s);
    if (rc != KVS_OK) return rc;
    *object = slab_data(st, s);
    *len = st->slabs[s].len;
    lru_touch(st, s);
    dram_unlock(st);
    pace_read(st, *len);
    return KVS_OK;
}

static kvs_status dram_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    dram_state *st = state;
    if (!st || !key || (!object && len)) return KVS_EINVAL;
    if (len > st->max_object_bytes) {
        char got[32], max[32];
        kvs_fmt_bytes(got, sizeof got, len);
        kvs_fmt_bytes(max, sizeof max, st->max_object_bytes);
        dram_set_error(st, "object of %s is larger than the tier's max object size %s", got, max);
        return KVS_EINVAL;
    }
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    shared_header *h = st->header;
    uint64_t now = kvs_clock_now_ns(st->clock);
    uint64_t bucket = 0;
    uint32_t s = index_find(st, key, &bucket);
    if (s != DRAM_NIL) {
        if (slab_pinned(&st->slabs[s], now)) {
            /* A reader may hold a reference to these bytes, and equal keys carry equal content. */
            lru_touch(st, s);
            dram_unlock(st);
            return KVS_OK;
        }
        drop_object(st, s, bucket); /* its slab is now the free-list head and is reused below */
    }
    s = dram_take_slab(st, now);
    if (s == DRAM_NIL) {
        dram_set_error(st, "all %llu objects are pinned; no room for another",
                       (unsigned long long)h->geo.n_slabs);
        dram_unlock(st);
        return KVS_ENOMEM;
    }
    slab_entry *e = &st->slabs[s];
    if (len) memcpy(slab_data(st, s), object, len);
    e->key = *key;
    e->len = len;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    __atomic_store_n(&e->state, (uint32_t)SLAB_USED, __ATOMIC_RELEASE); /* only after the bytes */
    index_insert(st, s);
    lru_push_head(st, s);
    h->n_objects++;
    h->object_bytes += len;
    dram_unlock(st);
    return KVS_OK;
}

/* A reserved slab is out of the index, the LRU and the free list: nothing evicts or reuses it. Its
 * prev field holds the reservation's generation, so a stale or forged ticket is refused. */
static kvs_status dram_reserve(void *state, const kvs_key *key, uint64_t len, void **dst,
                               uint64_t *ticket) {
    dram_state *st = state;
    if (!st || !key || !dst || !ticket) return KVS_EINVAL;
    if (len > st->max_object_bytes) {
        dram_set_error(st,
                       "reservation of %llu bytes is larger than the tier's max object size %llu",
                       (unsigned long long)len, (unsigned long long)st->max_object_bytes);
        return KVS_EINVAL;
    }
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    uint64_t now = kvs_clock_now_ns(st->clock);
    uint32_t s = dram_take_slab(st, now);
    if (s == DRAM_NIL) {
        dram_set_error(st, "all %llu objects are pinned or reserved; no room for another",
                       (unsigned long long)st->header->geo.n_slabs);
        dram_unlock(st);
        return KVS_ENOMEM;
    }
    slab_entry *e = &st->slabs[s];
    uint32_t gen = ++st->header->reserve_generation;
    e->key = *key;
    e->len = len;
    e->pins = 0;
    e->pin_deadline_ns = now + DRAM_RESERVE_TIMEOUT_NS;
    e->prev = gen;
    e->next = DRAM_NIL;
    __atomic_store_n(&e->state, (uint32_t)SLAB_RESERVED, __ATOMIC_RELEASE);
    dram_unlock(st);
    *dst = slab_data(st, s);
    *ticket = (uint64_t)gen << 32 | s;
    return KVS_OK;
}

/* With the lock held: the reserved slab a ticket names, or DRAM_NIL. */
static uint32_t ticket_slab(dram_state *st, uint64_t ticket) {
    uint32_t s = (uint32_t)ticket;
    if (s >= st->header->geo.n_slabs) return DRAM_NIL;
    slab_entry *e = &st->slabs[s];
    if (e->state != SLAB_RESERVED || e->prev != (uint32_t)(ticket >> 32)) return DRAM_NIL;
    return s;
}

static kvs_status dram_commit(void *state, uint64_t ticket) {
    dram_state *st = state;
    if (!st) return KVS_EINVAL;
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    uint32_t s = ticket_slab(st, ticket);
    if (s == DRAM_NIL) {
        dram_set_error(
            st, "commit: ticket %llx names no reservation (reclaimed after %llu s, or never made)",
            (unsigned long long)ticket,
            (unsigned long long)(DRAM_RESERVE_TIMEOUT_NS / 1000000000ull));
        dram_unlock(st);
        return KVS_ENOTFOUND;
    }
    shared_header *h = st->header;
    slab_entry *e = &st->slabs[s];
    uint64_t bucket = 0;
    uint32_t old = index_find(st, &e->key, &bucket);
    if (old != DRAM_NIL) {
        if (slab_pinned(&st->slabs[old], kvs_clock_now_ns(st->clock))) {
            lru_touch(st, old); /* a reader holds the stored copy; equal keys carry equal bytes */
            free_list_push(st, s);
            dram_unlock(st);
            return KVS_OK;
        }
        drop_object(st, old, bucket);
    }
    e->pins = 0;
    e->pin_deadline_ns = 0;
    __atomic_store_n(&e->state, (uint32_t)SLAB_USED, __ATOMIC_RELEASE);
    index_insert(st, s);
    lru_push_head(st, s);
    h->n_objects++;
    h->object_bytes += e->len;
    dram_unlock(st);
    return KVS_OK;
}

static kvs_status dram_abort(void *state, uint64_t ticket) {
    dram_state *st = state;
    if (!st) return KVS_EINVAL;
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    uint32_t s = ticket_slab(st, ticket);
    if (s != DRAM_NIL) free_list_push(st, s);
    dram_unlock(st);
    return KVS_OK;
}

static kvs_status dram_memory(void *state, void **base, uint64_t *len) {
    dram_state *st = state;
    if (!st || !base || !len) return KVS_EINVAL;
    *base = st->data;
    *len = st->header->geo.n_slabs * st->header->geo.slab_bytes;
    return KVS_OK;
}

static kvs_status dram_remove(void *state, const kvs_key *key) {
    dram_state *st = state;
    if (!st || !key) return KVS_EINVAL;
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    uint64_t bucket = 0;
    uint32_t s = index_find(st, key, &bucket);
    /* A removal is forced even under pins: the connector removes objects that failed
     * verification, and no reader may keep using those. Zero-copy readers verify against checksums
     * they copied, so a slab reused later fails their check instead of passing as the old
     * object. */
    if (s != DRAM_NIL) drop_object(st, s, bucket);
    dram_unlock(st);
    return KVS_OK;
}

static kvs_status dram_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    dram_state *st = state;
    if (!st || !n_objects || !bytes) return KVS_EINVAL;
    kvs_status rc = dram_lock(st);
    if (rc != KVS_OK) return rc;
    *n_objects = st->header->n_objects;
    *bytes = st->header->object_bytes;
    dram_unlock(st);
    return KVS_OK;
}

/* Shared memory makes the tier every process's that names it (dram.h). */
static uint32_t dram_instance_caps(void *state) {
    const dram_state *st = state;
    return st->shm_path[0] ? KVS_BACKEND_CAP_SHARED : 0u;
}

static const kvs_backend_ops dram_ops = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = KVS_BACKEND_CAP_ZERO_COPY | KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_RESERVE |
            KVS_BACKEND_CAP_MEMORY | KVS_BACKEND_CAP_GET_RANGE,
    .type_name = "dram",
    .create = dram_create,
    .destroy = dram_destroy,
    .last_error = dram_last_error,
    .contains = dram_contains,
    .pin = dram_pin,
    .unpin = dram_unpin,
    .get = dram_get,
    .get_ref = dram_get_ref,
    .put = dram_put,
    .remove = dram_remove,
    .usage = dram_usage,
    .reserve = dram_reserve,
    .commit = dram_commit,
    .abort = dram_abort,
    .memory = dram_memory,
    .get_range = dram_get_range,
    .instance_caps = dram_instance_caps,
};

const kvs_backend_ops *kvs_dram_backend(void) {
    return &dram_ops;
}
