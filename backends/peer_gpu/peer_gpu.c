/*
 * peer_gpu.c - the peer_gpu tier's options, lifecycle and operations (contract in peer_gpu.h), over
 * its slots (peer_gpu_slots.c) and its link to the lender (peer_gpu_link.c).
 */
#include "peer_gpu.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/key.h"
#include "common/log.h"
#include "common/options.h"
#include "lend_wire.h"
#include "peer_gpu_link.h"
#include "peer_gpu_region.h"
#include "peer_gpu_slots.h"
#include "peer_gpu_state.h"

/* ---- options and lifecycle ------------------------------------------------------------------ */

static const kvs_option_desc OPTIONS[] = {
    {.name = "socket", .kind = KVS_OPTION_STRING, KVS_OPTION_FIELD(pg_options, socket)},
    {.name = "connect_timeout_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(pg_options, connect_timeout_ms),
     .min = 1,
     .max = 600000},
    {.name = "retry_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(pg_options, retry_ms),
     .min = 10,
     .max = 3600000},
    {.name = "send_timeout_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(pg_options, send_timeout_ms),
     .min = 1,
     .max = 600000},
    {.name = "device", .kind = KVS_OPTION_COUNT, KVS_OPTION_FIELD(pg_options, device), .max = 1023},
    {.name = "index_shm", .kind = KVS_OPTION_STRING, KVS_OPTION_FIELD(pg_options, index_shm)},
    {.name = "index_entries",
     .kind = KVS_OPTION_COUNT,
     KVS_OPTION_FIELD(pg_options, index_entries),
     .min = KVS_DRAM_INDEX_MIN_ENTRIES,
     .max = 1ull << 26},
};

static void pg_destroy(void *state) {
    pg_state *st = state;
    if (!st) return;
    if (!st->lookup_only) pg_link_stop(st);
    /* a worker closing: the instance's other processes no longer find what it held */
    for (uint32_t s = 0; st->index && !st->lookup_only && s < st->n_slots; s++)
        if (st->slots[s].state == PG_STORED) kvs_dram_index_forget(st->index, &st->slots[s].key);
    pg_region_unload(st);
    kvs_dram_index_close(st->index);
    pthread_cond_destroy(&st->changed);
    pthread_mutex_destroy(&st->lock);
    free(st->slots);
    free(st->buckets);
    free(st->free_stack);
    free(st);
}

/* The tier's options, with what it cannot run without (a lender's socket that fits a Unix socket
 * address, a usable object size). On a failure why says it and refused names the option, if any. */
static kvs_status parse_options(pg_state *st, const kvs_backend_init *init, char *why,
                                size_t why_len, char *refused, size_t refused_len) {
    kvs_status rc =
        kvs_options_parse(OPTIONS, sizeof OPTIONS / sizeof OPTIONS[0], init->options,
                          init->n_options, &st->opt, NULL, why, why_len, refused, refused_len);
    if (rc == KVS_OK && !st->opt.socket) {
        snprintf(why, why_len, "option socket (the lender's Unix socket) is required");
        snprintf(refused, refused_len, "socket");
        rc = KVS_ECONFIG;
    } else if (rc == KVS_OK && strlen(st->opt.socket) >= sizeof st->socket_path) {
        snprintf(why, why_len, "socket path \"%s\" is longer than a Unix socket takes (%zu)",
                 st->opt.socket, sizeof st->socket_path - 1);
        snprintf(refused, refused_len, "socket");
        rc = KVS_ECONFIG;
    } else if (rc == KVS_OK &&
               (init->max_object_bytes == 0 || init->max_object_bytes > (1ull << 40))) {
        snprintf(why, why_len, "objects of %llu bytes: not a size the tier takes",
                 (unsigned long long)init->max_object_bytes);
        rc = KVS_EINVAL;
    }
    return rc;
}

/* The index in shared memory (index_shm). Without index_entries: room for what a lender of
 * 64 GiB holds in objects of this size, up to 2^18 entries (about 34 MiB of shared memory). */
static kvs_status open_shared_index(pg_state *st, const kvs_backend_init *init, char *why,
                                    size_t why_len) {
    uint64_t entries =
        st->opt.index_entries ? st->opt.index_entries : (64ull << 30) / init->max_object_bytes;
    if (!st->opt.index_entries && entries > (1ull << 18)) entries = 1ull << 18;
    return kvs_dram_index_open(st->opt.index_shm, entries, st->tier_name, st->host, &st->index, why,
                               why_len);
}

static kvs_status pg_create(const kvs_backend_init *init, void **out) {
    if (!init || !out) return KVS_EINVAL;
    *out = NULL;
    pg_state *st = calloc(1, sizeof *st);
    if (!st) {
        kvs_create_error(init, "peer_gpu tier: out of memory");
        return KVS_ENOMEM;
    }
    snprintf(st->tier_name, sizeof st->tier_name, "%s", init->tier_name ? init->tier_name : "?");
    st->host = init->host;
    st->max_object_bytes = init->max_object_bytes;
    st->sock = -1;
    st->wake[0] = st->wake[1] = -1;
    st->lru_head = st->lru_tail = PG_NIL;
    st->opt = (pg_options){.connect_timeout_ms = 2000,
                           .retry_ms = 1000,
                           .send_timeout_ms = 1000,
                           .device = UINT64_MAX};
    char why[256], refused[64] = "", msg[512];
    kvs_status rc = parse_options(st, init, why, sizeof why, refused, sizeof refused);
    if (rc != KVS_OK) {
        kvs_fmt(msg, sizeof msg, "peer_gpu tier \"%s\": %s", st->tier_name, why);
        kvs_create_error(init, msg);
        if (refused[0]) kvs_option_refused(init, refused, -1);
        free(st);
        return rc;
    }
    snprintf(st->socket_path, sizeof st->socket_path, "%s", st->opt.socket);
    /* slots a cache line apart: two objects never share one */
    st->slot_bytes = (init->max_object_bytes + 63) & ~(uint64_t)63;
    pthread_mutex_init(&st->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&st->changed, &ca);
    pthread_condattr_destroy(&ca);
    if (st->opt.index_shm) {
        rc = open_shared_index(st, init, why, sizeof why);
        if (rc != KVS_OK) {
            kvs_fmt(msg, sizeof msg, "peer_gpu tier \"%s\": %s", st->tier_name, why);
            kvs_create_error(init, msg);
            if (rc == KVS_ECONFIG) kvs_option_refused(init, "index_shm", -1);
            pthread_cond_destroy(&st->changed);
            pthread_mutex_destroy(&st->lock);
            free(st);
            return rc;
        }
        st->lookup_only = init->struct_size > offsetof(kvs_backend_init, staging_base) &&
                          init->staging_base == NULL;
        if (st->lookup_only) {
            *out = st;
            return KVS_OK;
        }
    }
    rc = pg_link_start(st);
    if (rc != KVS_OK) {
        kvs_fmt(msg, sizeof msg, "%s", st->error);
        kvs_create_error(init, msg);
        pg_region_unload(st);
        kvs_dram_index_close(st->index);
        free(st->slots);
        free(st->buckets);
        free(st->free_stack);
        pthread_cond_destroy(&st->changed);
        pthread_mutex_destroy(&st->lock);
        free(st);
        return rc;
    }
    *out = st;
    return KVS_OK;
}

kvs_status kvs_peer_gpu_stats_get(void *tier, kvs_peer_gpu_stats *out) {
    pg_state *st = tier;
    if (!st || !out) return KVS_EINVAL;
    pthread_mutex_lock(&st->lock);
    *out = st->stats;
    out->connected = st->region != NULL;
    out->on_gpu = st->region != NULL && st->region_kind == KVS_LEND_REGION_CUDA;
    out->slots_per_unit = st->slots_per_unit;
    out->usable_units = 0;
    for (uint32_t u = 0; st->region && u < st->borrower.n_units; u++)
        out->usable_units += (uint32_t)pg_unit_usable(st, u);
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

kvs_status kvs_peer_gpu_set_copy_hook(void *tier, int (*hook)(void *ctx, uint32_t unit),
                                      void *ctx) {
    pg_state *st = tier;
    if (!st) return KVS_EINVAL;
    st->copy_hook = hook;
    st->copy_hook_ctx = ctx;
    return KVS_OK;
}

static const char *pg_last_error(void *state) {
    pg_state *st = state;
    return st ? st->error : "";
}

/* ---- operations ----------------------------------------------------------------------------- */

static kvs_status lookup_only_refusal(pg_state *st, const char *what) {
    pg_set_error(st,
                 "cannot %s: this handle has no staging (a scheduler), so it borrowed nothing "
                 "and opened only the index the instance's workers publish (index_shm)",
                 what);
    return KVS_ENOTSUP;
}

static uint32_t pg_instance_caps(void *state) {
    const pg_state *st = state;
    return st ? kvs_dram_index_caps(st->index) : 0;
}

/* The stored slot of key in a usable unit, or PG_NIL (lock held). */
static uint32_t find_usable(pg_state *st, const kvs_key *key) {
    uint32_t s = pg_find(st, key);
    return s != PG_NIL && pg_unit_usable(st, pg_unit_of(st, s)) ? s : PG_NIL;
}

static kvs_status pg_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    pg_state *st = state;
    if (!st || (!keys && n) || !n_present) return KVS_EINVAL;
    if (st->lookup_only) return kvs_dram_index_contains(st->index, keys, n, n_present);
    pthread_mutex_lock(&st->lock);
    uint64_t i = 0;
    while (i < n && find_usable(st, &keys[i]) != PG_NIL) i++;
    pthread_mutex_unlock(&st->lock);
    *n_present = i;
    return KVS_OK;
}

static kvs_status pg_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                         uint64_t *n_pinned) {
    pg_state *st = state;
    if (!st || (!keys && n) || !n_pinned) return KVS_EINVAL;
    if (st->lookup_only) return kvs_dram_index_pin(st->index, keys, n, timeout_ms, n_pinned);
    uint64_t now = kvs_now_ns();
    uint64_t room_ms = (UINT64_MAX - now) / 1000000ull;
    uint64_t deadline = now + (timeout_ms < room_ms ? timeout_ms : room_ms) * 1000000ull;
    pthread_mutex_lock(&st->lock);
    uint64_t i = 0;
    for (; i < n; i++) {
        uint32_t s = find_usable(st, &keys[i]);
        if (s == PG_NIL) break;
        pg_slot *e = &st->slots[s];
        pg_pinned(e, now);
        if (e->pins < UINT32_MAX) e->pins++;
        if (deadline > e->pin_deadline_ns) e->pin_deadline_ns = deadline;
    }
    pthread_mutex_unlock(&st->lock);
    *n_pinned = i;
    return KVS_OK;
}

static kvs_status pg_unpin(void *state, const kvs_key *keys, uint64_t n) {
    pg_state *st = state;
    if (!st || (!keys && n)) return KVS_EINVAL;
    if (st->lookup_only) return kvs_dram_index_unpin(st->index, keys, n);
    uint64_t now = kvs_now_ns();
    pthread_mutex_lock(&st->lock);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t s = pg_find(st, &keys[i]);
        if (s == PG_NIL || !pg_pinned(&st->slots[s], now)) continue;
        if (--st->slots[s].pins == 0) st->slots[s].pin_deadline_ns = 0;
    }
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

/* Bytes [offset, offset + len) of key's object into dst; *got and *object_len as get_range. */
static kvs_status read_object(pg_state *st, const kvs_key *key, uint64_t offset, uint64_t len,
                              void *dst, uint64_t *got, uint64_t *object_len, int whole,
                              uint64_t cap) {
    if (st->lookup_only) return lookup_only_refusal(st, "read");
    pthread_mutex_lock(&st->lock);
    uint32_t s = pg_find(st, key);
    if (s == PG_NIL) {
        /* published by this rank's process before it was restarted: the instance forgets it */
        kvs_dram_index_forget(st->index, key);
        pthread_mutex_unlock(&st->lock);
        return KVS_ENOTFOUND;
    }
    pg_slot *e = &st->slots[s];
    uint64_t olen = e->len;
    if (whole && cap < olen) {
        pthread_mutex_unlock(&st->lock);
        *object_len = olen;
        return KVS_EOVERFLOW;
    }
    if (!pg_begin_copy(st, s, 1)) {
        st->stats.refused_reads++;
        pthread_mutex_unlock(&st->lock);
        return KVS_ENOTFOUND;
    }
    if (st->lru_head != s) {
        pg_lru_unlink(st, s);
        pg_lru_push_head(st, s);
    }
    const uint8_t *src = pg_slot_data(st, s);
    pthread_mutex_unlock(&st->lock);
    uint64_t n = offset >= olen ? 0 : (olen - offset < len ? olen - offset : len);
    kvs_status rc = pg_region_read(st, pg_unit_of(st, s), dst, src + offset, n);
    pthread_mutex_lock(&st->lock);
    if (rc != KVS_OK) st->stats.failed_copies++;
    pg_end_copy(st, s, 1);
    pthread_mutex_unlock(&st->lock);
    *got = rc == KVS_OK ? n : 0;
    *object_len = olen;
    return rc;
}

static kvs_status pg_get(void *state, const kvs_key *key, void *dst, uint64_t cap, uint64_t *len) {
    pg_state *st = state;
    if (!st || !key || (!dst && cap) || !len) return KVS_EINVAL;
    uint64_t got = 0, olen = 0;
    kvs_status rc = read_object(st, key, 0, cap, dst, &got, &olen, 1, cap);
    *len = olen;
    return rc;
}

static kvs_status pg_get_range(void *state, const kvs_key *key, uint64_t offset, uint64_t len,
                               void *dst, uint64_t *got, uint64_t *object_len) {
    pg_state *st = state;
    if (!st || !key || (!dst && len) || !got || !object_len) return KVS_EINVAL;
    return read_object(st, key, offset, len, dst, got, object_len, 0, 0);
}

static kvs_status pg_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    pg_state *st = state;
    if (!st || !key || (!object && len)) return KVS_EINVAL;
    if (st->lookup_only) return lookup_only_refusal(st, "store");
    if (len > st->slot_bytes) {
        pg_set_error(st, "an object of %llu bytes is larger than a slot (%llu)",
                     (unsigned long long)len, (unsigned long long)st->slot_bytes);
        return KVS_ENOMEM;
    }
    pthread_mutex_lock(&st->lock);
    uint32_t s = st->region ? pg_take_slot(st) : PG_NIL;
    if (s == PG_NIL || !pg_begin_copy(st, s, 0)) {
        /* nothing lent, or every lent slot pinned or busy: the chain puts it into the next tier
         * (KVS_BACKEND_CAP_SPILLS), so a chain whose lender is away keeps caching below */
        st->stats.refused_puts++;
        pg_set_error(st, "no room: %s",
                     st->region ? "every lent slot is pinned or busy" : "no lender, nothing lent");
        pthread_mutex_unlock(&st->lock);
        return KVS_ENOMEM;
    }
    pg_slot *e = &st->slots[s];
    e->state = PG_WRITING;
    e->key = *key;
    e->len = len;
    uint8_t *dst = pg_slot_data(st, s);
    pthread_mutex_unlock(&st->lock);
    kvs_status copied = pg_region_write(st, pg_unit_of(st, s), dst, object, len);
    pthread_mutex_lock(&st->lock);
    int taken_back = !pg_unit_usable(st, pg_unit_of(st, s));
    if (copied != KVS_OK) {
        /* the copy failed (st->error says why): never visible here, and the chain keeps the
         * object in the next tier (KVS_BACKEND_CAP_SPILLS) rather than lose it */
        pg_free_slot(st, s);
        pg_end_copy(st, s, 0);
        st->stats.failed_copies++;
        pthread_mutex_unlock(&st->lock);
        return KVS_ENOMEM;
    }
    uint32_t old = taken_back ? PG_NIL : pg_find(st, key);
    if (!taken_back && old != PG_NIL && kvs_dram_index_pinned(st->index, key)) {
        /* another process's lookup pinned the stored one: equal keys hold equal bytes, it stays */
        pg_free_slot(st, s);
    } else if (!taken_back) {
        if (old != PG_NIL) pg_unpublish(st, old); /* the replaced object (or a racing put's) */
        pg_publish(st, s);
    } else {
        /* reclaimed (or the lender lost) while it was copied: never visible here */
        pg_free_slot(st, s);
        pg_set_error(st, "the unit was taken back while the object was copied into it");
    }
    pg_end_copy(st, s, 0);
    if (taken_back) st->stats.refused_puts++;
    pthread_mutex_unlock(&st->lock);
    return taken_back ? KVS_ENOMEM : KVS_OK; /* the chain spills it to the next tier */
}

static kvs_status pg_put_range(void *state, const kvs_key *key, uint64_t offset, const void *src,
                               uint64_t len) {
    pg_state *st = state;
    if (!st || !key || (!src && len)) return KVS_EINVAL;
    if (st->lookup_only) return lookup_only_refusal(st, "write");
    pthread_mutex_lock(&st->lock);
    uint32_t s = pg_find(st, key);
    if (s == PG_NIL) {
        pthread_mutex_unlock(&st->lock);
        return KVS_ENOTFOUND;
    }
    if (offset > st->slots[s].len || len > st->slots[s].len - offset) {
        pg_set_error(st, "put_range of %llu bytes at %llu is past the object's %llu",
                     (unsigned long long)len, (unsigned long long)offset,
                     (unsigned long long)st->slots[s].len);
        pthread_mutex_unlock(&st->lock);
        return KVS_EINVAL;
    }
    /* as a reader: the slot stays while the copy runs, and its unit waits for it */
    if (!pg_begin_copy(st, s, 1)) {
        pthread_mutex_unlock(&st->lock);
        return KVS_ENOTFOUND;
    }
    uint8_t *dst = pg_slot_data(st, s) + offset;
    pthread_mutex_unlock(&st->lock);
    kvs_status rc = pg_region_write(st, pg_unit_of(st, s), dst, src, len);
    pthread_mutex_lock(&st->lock);
    if (rc != KVS_OK) {
        /* part of the range may be written: the object is no longer what was stored, so it goes
         * (doomed now, freed when the copy's end below lets it go) */
        st->stats.failed_copies++;
        if (st->slots[s].state == PG_STORED) pg_unpublish(st, s);
    }
    pg_end_copy(st, s, 1);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

static kvs_status pg_remove(void *state, const kvs_key *key) {
    pg_state *st = state;
    if (!st || !key) return KVS_EINVAL;
    if (st->lookup_only) {
        kvs_dram_index_forget(st->index, key); /* its owner's load will miss and forget it too */
        return KVS_OK;
    }
    pthread_mutex_lock(&st->lock);
    uint32_t s = pg_find(st, key);
    if (s != PG_NIL) {
        uint32_t u = pg_unit_of(st, s);
        pg_unpublish(st, s);
        /* a draining unit may have waited for this one */
        int release = 0;
        if (st->borrower.state[u] == KVS_BORROW_DRAINING && pg_unit_empty(st, u)) {
            kvs_borrower_drained(&st->borrower, u, &release);
            if (release) pg_send_released(st, u);
        }
    } else { /* published by this rank's process before it was restarted */
        kvs_dram_index_forget(st->index, key);
    }
    pthread_mutex_unlock(&st->lock);
    return KVS_OK;
}

static kvs_status pg_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    pg_state *st = state;
    if (!st || !n_objects || !bytes) return KVS_EINVAL;
    if (st->lookup_only) { /* the owners' bytes are theirs to count */
        *bytes = 0;
        return kvs_dram_index_usage(st->index, n_objects);
    }
    pthread_mutex_lock(&st->lock);
    uint64_t n = 0, b = 0;
    for (uint32_t s = st->lru_head; s != PG_NIL; s = st->slots[s].next) {
        n++;
        b += st->slots[s].len;
    }
    pthread_mutex_unlock(&st->lock);
    *n_objects = n;
    *bytes = b;
    return KVS_OK;
}

static const kvs_backend_ops pg_ops = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_GET_RANGE | KVS_BACKEND_CAP_PUT_RANGE |
            KVS_BACKEND_CAP_SPILLS | KVS_BACKEND_CAP_EVICTS_ON_ITS_THREAD |
            KVS_BACKEND_CAP_LENT_MEMORY,
    .type_name = "peer_gpu",
    .create = pg_create,
    .destroy = pg_destroy,
    .last_error = pg_last_error,
    .contains = pg_contains,
    .pin = pg_pin,
    .unpin = pg_unpin,
    .get = pg_get,
    .put = pg_put,
    .remove = pg_remove,
    .usage = pg_usage,
    .get_range = pg_get_range,
    .put_range = pg_put_range,
    .instance_caps = pg_instance_caps,
};

const kvs_backend_ops *kvs_peer_gpu_backend(void) {
    return &pg_ops;
}
