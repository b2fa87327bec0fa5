/*
 * dram_table.c - the dram tier's tables (dram_table.h): taking a slab, the lock, and rebuilding the
 * tables after a process died holding it; the error and log lines of the tier.
 */
#include "dram_table.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "common/clock.h"
#include "common/errno_name.h"
#include "common/log.h"

/* ---- small helpers ------------------------------------------------------------------------- */

void dram_set_error(dram_state *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_vfmt_tier(st->error, sizeof st->error, "dram", st->tier_name, fmt, ap);
    va_end(ap);
}

void dram_log(dram_state *st, int level, const char *message) {
    if (st->log) st->log(st->host_ctx, level, message);
}

/* ---- slab lifecycle ------------------------------------------------------------------------ */

/* A free slab, or the least recently used unpinned one after handing its object to on_evict (not
 * with evict: never, whose process leaves evictions to the tier's owner). */
uint32_t dram_take_slab(dram_state *st, uint64_t now) {
    shared_header *h = st->header;
    for (uint32_t s = st->evict_never ? DRAM_NIL : h->lru_tail;
         h->free_head == DRAM_NIL && s != DRAM_NIL; s = st->slabs[s].prev) {
        slab_entry *e = &st->slabs[s];
        if (slab_pinned(e, now)) continue;
        if (st->on_evict) st->on_evict(st->host_ctx, &e->key, slab_data(st, s), e->len);
        uint64_t bucket = 0;
        if (index_find(st, &e->key, &bucket) == s) drop_object(st, s, bucket);
        break;
    }
    if (h->free_head == DRAM_NIL) {
        /* Last resort: a reservation its process never committed. */
        for (uint64_t i = 0; i < h->geo.n_slabs; i++) {
            slab_entry *e = &st->slabs[i];
            if (e->state == SLAB_RESERVED && now > e->pin_deadline_ns) {
                free_list_push(st, (uint32_t)i);
                break;
            }
        }
    }
    uint32_t s = h->free_head;
    if (s != DRAM_NIL) h->free_head = st->slabs[s].next;
    return s;
}

/* ---- the lock and its repair --------------------------------------------------------------- */

/* Rebuild index, LRU, free list and counts from the slab states after a process died holding the
 * lock mid-update. LRU order is lost; the objects are kept. A slab whose bytes were being written
 * is still free (state is set after the copy); a torn replace fails the connector's checksum. */
void dram_repair_tables(dram_state *st) {
    shared_header *h = st->header;
    for (uint64_t b = 0; b < h->geo.n_buckets; b++) st->buckets[b] = DRAM_NIL;
    h->lru_head = h->lru_tail = h->free_head = DRAM_NIL;
    h->n_objects = h->object_bytes = 0;
    for (uint64_t i = h->geo.n_slabs; i-- > 0;) {
        uint32_t s = (uint32_t)i;
        slab_entry *e = &st->slabs[s];
        if (e->state == SLAB_USED && e->len <= h->geo.slab_bytes &&
            index_find(st, &e->key, NULL) == DRAM_NIL) {
            index_insert(st, s);
            lru_push_head(st, s);
            h->n_objects++;
            h->object_bytes += e->len;
        } else {
            free_list_push(st, s);
        }
    }
}

kvs_status dram_lock(dram_state *st) {
    int rc;
    if (st->lock_timeout_ms) {
        struct timespec deadline = kvs_timespec_after_ms(CLOCK_MONOTONIC, st->lock_timeout_ms);
        rc = pthread_mutex_clocklock(&st->header->mutex, CLOCK_MONOTONIC, &deadline);
    } else {
        rc = pthread_mutex_lock(&st->header->mutex);
    }
    if (rc == 0) return KVS_OK;
    if (rc == ETIMEDOUT) {
        dram_set_error(st,
                       "its lock was not free within lock_timeout_ms (%u ms): a process sharing "
                       "the tier holds it (stopped, or in a debugger)",
                       st->lock_timeout_ms);
        return KVS_ETIMEDOUT;
    }
    if (rc == EOWNERDEAD) {
        dram_repair_tables(st);
        pthread_mutex_consistent(&st->header->mutex);
        char message[256];
        snprintf(message, sizeof message,
                 "dram tier \"%s\": a process died holding the tier's lock; tables rebuilt",
                 st->tier_name);
        dram_log(st, KVS_LOG_WARN, message);
        return KVS_OK;
    }
    dram_set_error(st, "its lock cannot be taken (%s)", kvs_errno_name(rc));
    return KVS_EIO;
}

void dram_unlock(dram_state *st) {
    pthread_mutex_unlock(&st->header->mutex);
}
