/*
 * dram_table.h - the tables inside the dram tier's mapping (dram_layout.h): the hash index, the LRU
 * list, the free list and the slabs' lifecycle, the process-shared lock that guards them and their
 * repair when a process died holding it. The small table steps are inline: every op of the tier
 * runs them under the lock, often once a key. Internal to backends/dram/; every call but
 * dram_set_error, dram_log and dram_lock expects the lock held.
 */
#ifndef KVS_DRAM_TABLE_H
#define KVS_DRAM_TABLE_H

#include <stdint.h>
#include <string.h>

#include "abi/kvstrata_backend.h"
#include "common/key.h"
#include "dram_layout.h"

void dram_set_error(dram_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dram_log(dram_state *st, int level, const char *message);
/* Take the tier's process-shared robust lock, repairing the tables when its holder died. */
kvs_status dram_lock(dram_state *st);
void dram_unlock(dram_state *st);
/* Rebuild index, LRU, free list and counts from the slab states (the lock is held). */
void dram_repair_tables(dram_state *st);
/* A free slab, or the least recently used unpinned one after handing its object to on_evict (not
 * with evict: never); DRAM_NIL when every slab is pinned. Taken off the free list. */
uint32_t dram_take_slab(dram_state *st, uint64_t now);

/* ---- slab data ------------------------------------------------------------------------------ */

static inline uint8_t *slab_data(const dram_state *st, uint32_t s) {
    return st->data + (uint64_t)s * st->header->geo.slab_bytes;
}

/* ---- hash index: linear probing, backward-shift deletion (no tombstones) ------------------- */

static inline uint32_t index_find(const dram_state *st, const kvs_key *key, uint64_t *bucket_out) {
    uint64_t mask = st->header->geo.n_buckets - 1;
    for (uint64_t b = kvs_key_hash(key) & mask;; b = (b + 1) & mask) {
        uint32_t s = st->buckets[b];
        if (s == DRAM_NIL) return DRAM_NIL;
        if (memcmp(&st->slabs[s].key, key, sizeof *key) == 0) {
            if (bucket_out) *bucket_out = b;
            return s;
        }
    }
}

/* Ask for the index lines that finding keys [0, n) will read: the home buckets of all of them, then
 * the slab entries those buckets name. A lookup's keys land in random buckets of an index far
 * larger than the cache, so finding them one after the other waits for two misses per key in turn;
 * after this the misses overlap. Runs that may stop at their first key (contains, pin) find that
 * one first and ask for the rest only when it is there, so a miss costs nothing more. A hint only,
 * with the lock held: index_find does the finding. */
static inline void index_prefetch(const dram_state *st, const kvs_key *keys, uint64_t n) {
    enum { BATCH = 64 };
    uint64_t mask = st->header->geo.n_buckets - 1, home[BATCH];
    for (uint64_t first = 0; first < n; first += BATCH) {
        uint64_t m = n - first < BATCH ? n - first : BATCH;
        for (uint64_t i = 0; i < m; i++) {
            home[i] = kvs_key_hash(&keys[first + i]) & mask;
            __builtin_prefetch(&st->buckets[home[i]], 0, 3);
        }
        for (uint64_t i = 0; i < m; i++) {
            uint32_t s = st->buckets[home[i]];
            if (s != DRAM_NIL) __builtin_prefetch(&st->slabs[s], 0, 3);
        }
    }
}

static inline void index_insert(dram_state *st, uint32_t s) {
    uint64_t mask = st->header->geo.n_buckets - 1;
    uint64_t b = kvs_key_hash(&st->slabs[s].key) & mask;
    while (st->buckets[b] != DRAM_NIL) b = (b + 1) & mask;
    st->buckets[b] = s;
}

static inline void index_erase(dram_state *st, uint64_t hole) {
    uint64_t mask = st->header->geo.n_buckets - 1;
    for (uint64_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
        uint32_t s = st->buckets[j];
        if (s == DRAM_NIL) break;
        uint64_t home = kvs_key_hash(&st->slabs[s].key) & mask;
        /* Move the entry back unless its home lies cyclically in (hole, j]. */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            st->buckets[hole] = s;
            hole = j;
        }
    }
    st->buckets[hole] = DRAM_NIL;
}

/* ---- LRU list and slab lifecycle ------------------------------------------------------------ */

static inline void lru_unlink(dram_state *st, uint32_t s) {
    shared_header *h = st->header;
    slab_entry *e = &st->slabs[s];
    if (e->prev != DRAM_NIL)
        st->slabs[e->prev].next = e->next;
    else
        h->lru_head = e->next;
    if (e->next != DRAM_NIL)
        st->slabs[e->next].prev = e->prev;
    else
        h->lru_tail = e->prev;
    e->prev = e->next = DRAM_NIL;
}

static inline void lru_push_head(dram_state *st, uint32_t s) {
    shared_header *h = st->header;
    slab_entry *e = &st->slabs[s];
    e->prev = DRAM_NIL;
    e->next = h->lru_head;
    if (h->lru_head != DRAM_NIL)
        st->slabs[h->lru_head].prev = s;
    else
        h->lru_tail = s;
    h->lru_head = s;
}

static inline void lru_touch(dram_state *st, uint32_t s) {
    if (st->header->lru_head == s) return;
    lru_unlink(st, s);
    lru_push_head(st, s);
}

/* A slab counts as pinned iff pins > 0 and the deadline has not passed. An expired pin is cleared
 * when seen, so a process that crashed holding a pin cannot keep the object forever. */
static inline int slab_pinned(slab_entry *e, uint64_t now) {
    if (e->pins == 0) return 0;
    if (now < e->pin_deadline_ns) return 1;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    return 0;
}

static inline void free_list_push(dram_state *st, uint32_t s) {
    slab_entry *e = &st->slabs[s];
    __atomic_store_n(&e->state, (uint32_t)SLAB_FREE, __ATOMIC_RELEASE);
    e->len = 0;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    e->prev = DRAM_NIL;
    e->next = st->header->free_head;
    st->header->free_head = s;
}

static inline void drop_object(dram_state *st, uint32_t s, uint64_t bucket) {
    shared_header *h = st->header;
    index_erase(st, bucket);
    lru_unlink(st, s);
    h->n_objects--;
    h->object_bytes -= st->slabs[s].len;
    free_list_push(st, s);
}

#endif /* KVS_DRAM_TABLE_H */
