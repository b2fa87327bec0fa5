/*
 * peer_gpu_slots.c - the peer_gpu tier's slots (peer_gpu_slots.h): objects in lent units, their
 * index and LRU, pins, and every copy into or out of lent memory counted as I/O in flight on its
 * unit (lending.h), so a reclaim waits for it. The operations are peer_gpu.c's, the link to the
 * lender peer_gpu_link.c's; both use these, with the tier's lock held unless a function says.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/key.h"
#include "common/log.h"
#include "lend_wire.h"
#include "peer_gpu_region.h"
#include "peer_gpu_slots.h"

/* ---- small helpers ------------------------------------------------------------------------- */

uint32_t pg_unit_of(const pg_state *st, uint32_t slot) {
    return slot / st->slots_per_unit;
}

uint8_t *pg_slot_data(const pg_state *st, uint32_t s) {
    uint64_t u = pg_unit_of(st, s), k = s % st->slots_per_unit;
    return st->region + u * st->unit_bytes + k * st->slot_bytes;
}

int pg_unit_usable(const pg_state *st, uint32_t u) {
    return st->borrower.lender && st->borrower.state[u] == KVS_BORROW_USABLE;
}

/* ---- index (chained buckets) and LRU -------------------------------------------------------- */

uint32_t *pg_bucket_of(pg_state *st, const kvs_key *key) {
    return &st->buckets[kvs_key_hash(key) & (st->n_buckets - 1)];
}

/* The stored slot of key, or PG_NIL. */
uint32_t pg_find(pg_state *st, const kvs_key *key) {
    if (!st->slots) return PG_NIL;
    for (uint32_t s = *pg_bucket_of(st, key); s != PG_NIL; s = st->slots[s].hnext)
        if (st->slots[s].state == PG_STORED && memcmp(&st->slots[s].key, key, sizeof *key) == 0)
            return s;
    return PG_NIL;
}

void pg_lru_unlink(pg_state *st, uint32_t s) {
    pg_slot *e = &st->slots[s];
    if (e->prev != PG_NIL)
        st->slots[e->prev].next = e->next;
    else
        st->lru_head = e->next;
    if (e->next != PG_NIL)
        st->slots[e->next].prev = e->prev;
    else
        st->lru_tail = e->prev;
    e->prev = e->next = PG_NIL;
}

void pg_lru_push_head(pg_state *st, uint32_t s) {
    pg_slot *e = &st->slots[s];
    e->prev = PG_NIL;
    e->next = st->lru_head;
    if (st->lru_head != PG_NIL)
        st->slots[st->lru_head].prev = s;
    else
        st->lru_tail = s;
    st->lru_head = s;
}

/* Make slot s (stored) visible under its key. */
void pg_publish(pg_state *st, uint32_t s) {
    uint32_t *b = pg_bucket_of(st, &st->slots[s].key);
    st->slots[s].hnext = *b;
    *b = s;
    st->slots[s].state = PG_STORED;
    pg_lru_push_head(st, s);
    st->stats.objects++;
    kvs_dram_index_held(st->index, &st->slots[s].key, 0);
}

static void push_free(pg_state *st, uint32_t s) {
    if (st->slots[s].in_free) return;
    st->slots[s].in_free = 1;
    st->free_stack[st->n_free++] = s; /* each slot at most once: n_free <= n_slots */
}

void pg_free_slot(pg_state *st, uint32_t s) {
    pg_slot *e = &st->slots[s];
    e->state = PG_FREE;
    e->len = 0;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    if (pg_unit_usable(st, pg_unit_of(st, s))) push_free(st, s);
}

void pg_unit_lent(pg_state *st, uint32_t u) {
    for (uint32_t k = st->slots_per_unit; k-- > 0;) {
        uint32_t s = u * st->slots_per_unit + k;
        if (st->slots[s].state == PG_FREE) push_free(st, s);
    }
}

/* Take a stored slot out of the index and the LRU; freed now, or doomed while copies run. */
void pg_unpublish(pg_state *st, uint32_t s) {
    for (uint32_t *p = pg_bucket_of(st, &st->slots[s].key); *p != PG_NIL; p = &st->slots[*p].hnext)
        if (*p == s) {
            *p = st->slots[s].hnext;
            break;
        }
    pg_lru_unlink(st, s);
    st->stats.objects--;
    kvs_dram_index_forget(st->index, &st->slots[s].key);
    if (st->slots[s].readers)
        st->slots[s].state = PG_DOOMED;
    else
        pg_free_slot(st, s);
}

int pg_pinned(pg_slot *e, uint64_t now) {
    if (e->pins == 0) return 0;
    if (now < e->pin_deadline_ns) return 1;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    return 0;
}

int pg_unit_empty(const pg_state *st, uint32_t u) {
    for (uint32_t k = 0; k < st->slots_per_unit; k++)
        if (st->slots[u * st->slots_per_unit + k].state != PG_FREE) return 0;
    return 1;
}

void pg_empty_unit(pg_state *st, uint32_t u, int down) {
    uint64_t first = (uint64_t)u * st->slots_per_unit;
    int hand = down && st->host && st->host->on_evict;
    for (uint64_t s = first; s < first + st->slots_per_unit; s++) {
        pg_slot *e = &st->slots[s];
        if (e->state != PG_STORED) continue;
        if (hand) { /* held as read while its bytes go down: doomed, not freed, till then */
            e->readers++;
            e->moving = 1;
            st->stats.moved_down++;
        } else {
            if (st->host && st->host->on_evict) st->host->on_evict(st->host->ctx, &e->key, NULL, 0);
            st->stats.lost_objects++;
        }
        pg_unpublish(st, (uint32_t)s);
    }
    if (!hand) return;
    /* the copies down the chain without the lock: the tier's other users go on meanwhile */
    pthread_mutex_unlock(&st->lock);
    for (uint64_t s = first; s < first + st->slots_per_unit; s++) {
        if (!st->slots[s].moving) continue;
        const void *bytes =
            pg_region_host_view(st, pg_slot_data(st, (uint32_t)s), st->slots[s].len, 1);
        st->host->on_evict(st->host->ctx, &st->slots[s].key, bytes,
                           bytes ? st->slots[s].len : 0); /* a failed GPU read: gone */
    }
    pthread_mutex_lock(&st->lock);
    for (uint64_t s = first; s < first + st->slots_per_unit; s++) {
        pg_slot *e = &st->slots[s];
        if (!e->moving) continue;
        e->moving = 0;
        if (--e->readers == 0 && e->state == PG_DOOMED) pg_free_slot(st, (uint32_t)s);
    }
}

void pg_send_released(pg_state *st, uint32_t u) {
    uint32_t epoch = 0;
    if (kvs_borrower_release(&st->borrower, u, &epoch) != KVS_OK) return;
    kvs_lend_msg m = {.type = KVS_LEND_RELEASED, .unit = u, .epoch = epoch};
    char why[256];
    if (st->sock < 0 ||
        kvs_lend_send(st->sock, &m, -1, (int)st->opt.send_timeout_ms, why, sizeof why) != KVS_OK) {
        /* the lender keeps the unit as the borrower's (quarantined once the link drops): safe */
        if (st->sock >= 0) shutdown(st->sock, SHUT_RDWR);
        return;
    }
    st->stats.released++;
}

/* A copy into or out of slot s ended (lock held): the unit's I/O count, a doomed slot, and a
 * RELEASED the end makes possible. */
void pg_end_copy(pg_state *st, uint32_t s, int reading) {
    uint32_t u = pg_unit_of(st, s);
    pg_slot *e = &st->slots[s];
    if (reading && --e->readers == 0 && e->state == PG_DOOMED) pg_free_slot(st, s);
    int release = 0; /* only a draining unit can be released: the scan of its slots only then */
    int emptied = st->borrower.state[u] == KVS_BORROW_DRAINING && pg_unit_empty(st, u);
    kvs_borrower_end_io(&st->borrower, u, emptied, &release);
    if (release) pg_send_released(st, u);
    st->in_flight--;
    pthread_cond_broadcast(&st->changed);
}

/* Start a copy on slot s (lock held): counted in flight on its unit; 0 when the unit is no longer
 * usable. */
int pg_begin_copy(pg_state *st, uint32_t s, int reading) {
    if (kvs_borrower_begin_io(&st->borrower, pg_unit_of(st, s)) != KVS_OK) return 0;
    if (reading) st->slots[s].readers++;
    st->in_flight++;
    return 1;
}

/* A free slot in a usable unit, or the least recently used unpinned object's after passing it
 * down; PG_NIL when everything is pinned, busy or not ours (lock held). */
uint32_t pg_take_slot(pg_state *st) {
    while (st->n_free) {
        uint32_t s = st->free_stack[--st->n_free];
        st->slots[s].in_free = 0;
        if (st->slots[s].state == PG_FREE && pg_unit_usable(st, pg_unit_of(st, s))) return s;
        /* taken since, or its unit went back: dropped (a unit lent again pushes it anew) */
    }
    uint64_t now = kvs_now_ns();
    for (uint32_t s = st->lru_tail; s != PG_NIL; s = st->slots[s].prev) {
        pg_slot *e = &st->slots[s];
        if (pg_pinned(e, now) || e->readers || !pg_unit_usable(st, pg_unit_of(st, s)) ||
            kvs_dram_index_pinned(st->index, &e->key))
            continue;
        if (st->host && st->host->on_evict) {
            const void *bytes = pg_region_host_view(st, pg_slot_data(st, s), e->len, 0);
            st->host->on_evict(st->host->ctx, &e->key, bytes, bytes ? e->len : 0);
        }
        pg_unpublish(st, s);
        return s;
    }
    return PG_NIL;
}
