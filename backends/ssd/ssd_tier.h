/*
 * ssd_tier.h - the ssd tier's internal state, shared by its modules (not a public header):
 * ssd_objects.c (index, LRU, object lifecycle, pins, tombstones), ssd_write.c (put),
 * ssd_read.c (get, get_many) and ssd.c (options, create, recovery, destroy, stats).
 *
 * One lock (ssd_tier.mutex) guards the index, the LRU, the slot stacks and the write-buffer budget;
 * functions below that take a tier say "with the lock held" unless they take it themselves. I/O runs
 * on the per-path engines (ssd_io.c) and no op waits for I/O with the lock held. An object moves
 * WRITING -> LIVE (in the index) -> DROPPED (out of the index, its slots still held by reads or
 * tombstone writes in flight) -> FREE. Slots go back to their path only when nothing can still
 * touch them, so a slot is never rewritten under a read.
 */
#ifndef KVS_SSD_TIER_H
#define KVS_SSD_TIER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "abi/kvstrata_backend.h"
#include "common/clock.h"
#include "common/errno_name.h"
#include "common/log.h"
#include "ssd_format.h"
#include "ssd_io.h"
#include "ssd_options.h"

#define SSD_NIL     UINT32_MAX
#define SSD_NO_PATH UINT32_MAX

#define SSD_CHUNK_RECORDS 1024u

enum { OBJ_FREE = 0, OBJ_WRITING, OBJ_LIVE, OBJ_DROPPED };

typedef struct ssd_copy {
    uint32_t path, slot; /* path SSD_NO_PATH: this copy is missing */
} ssd_copy;

typedef struct ssd_object {
    kvs_key key;
    uint64_t len, seq;
    uint64_t pin_deadline_ns; /* CLOCK_MONOTONIC; meaningful while pins > 0 */
    uint32_t pins;
    uint32_t refs; /* reads and tombstone writes in flight: the slots stay taken until 0 */
    uint32_t n_units, replicas;
    uint32_t prev, next; /* LRU while live, free list while free */
    uint8_t state;
    uint8_t verified;    /* 0 for a recovered object until one read matched its data checksums */
    ssd_copy *copies;    /* [n_units * replicas] */
    uint64_t *checksums; /* [n_units] XXH3-64 of each unit's data */
} ssd_object;

typedef struct ssd_path {
    char dir[4096];
    int fd;
    ssd_io_path *io;
    uint64_t n_slots;
    uint32_t *free_slots; /* stack */
    uint64_t n_free;
    uint64_t units; /* unit copies of live objects */
    /* The device under the file may hold less than the file's size (a sparse file on a small device).
     * backed[s]: slot s is known to hold blocks (preallocated, found as data, or written). Once a
     * write fails with ENOSPC the path is full: its unbacked slots are retired (taken out of service)
     * and room is made by eviction among the backed ones. */
    uint8_t *backed;
    int full;
    uint64_t retired; /* slots out of service: capacity is n_slots - retired */
    /* Why create took the path out of service ("" while it serves): its data file or superblock
     * could not be written. Such a path has no engine (io NULL), so it is never usable. */
    char isolated_why[256];
} ssd_path;

typedef struct ssd_read_call ssd_read_call; /* ssd_read.c */

typedef struct ssd_tier {
    char tier_name[SSD_TIER_NAME_KEPT];
    uint64_t stripe_bytes, slot_bytes, max_object_bytes, io_timeout_ms;
    uint32_t replicas, n_paths, queue_depth;
    ssd_path paths[SSD_MAX_PATHS];

    pthread_mutex_t mutex;
    pthread_cond_t drained; /* writes_pending dropped (CLOCK_MONOTONIC) */
    ssd_object **chunks;    /* records, SSD_CHUNK_RECORDS per chunk, allocated as they are needed */
    uint32_t n_chunks, max_chunks;
    uint32_t n_object_slots, free_head; /* at most one record per slot: each record holds a slot */
    uint32_t *buckets;
    uint64_t n_buckets;
    uint32_t lru_head, lru_tail; /* head = most recently used */
    uint64_t live_objects, live_bytes;
    uint64_t next_seq, place_pointer;
    ssd_read_call *calls; /* get_many_start calls not finished yet, under mutex */
    uint64_t next_ticket;
    uint64_t write_buffer_bytes, buffered_bytes, writes_pending;
    /* The write arena: max_spare buffers of spare_bytes (the buffer of an object of
     * max_object_bytes), mapped and faulted in at create, so a put never maps, faults in or unmaps
     * fresh memory. spare[0..n_spare) are the free ones, under mutex. */
    uint8_t *arena;
    uint64_t arena_bytes;
    uint8_t **spare;
    uint32_t n_spare, max_spare;
    uint64_t spare_bytes;

    ssd_io_counters io;
    atomic_uint_fast64_t evictions, enospc_skips, queue_full_skips, corrupt_drops, bounce_reads,
        dropped_puts, fresh_write_buffers;
    uint64_t recovered, fallbacks, headers_scanned;

    void *host_ctx;
    const kvs_clock *clock; /* pin deadlines are on this clock (NULL: CLOCK_MONOTONIC) */
    void (*log)(void *ctx, int level, const char *message);
    void (*on_evict)(void *ctx, const kvs_key *key, const void *object,
                     uint64_t len); /* object NULL */
    void (*on_put_dropped)(void *ctx, const kvs_key *key, kvs_status why);
    void (*place)(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                  uint32_t replicas, uint32_t *paths_out);
    void (*schedule)(void *ctx, uint32_t n_paths, uint64_t n, uint32_t max_copies,
                     const uint32_t *n_copies, const uint32_t *paths, uint32_t *chosen,
                     uint64_t *order);
    void *staging_base;
    uint64_t staging_len;
    uint8_t *zero_block; /* a tombstone: an all-zero unit header */

    pthread_mutex_t error_mutex;
    char error[512];
} ssd_tier;

/* Record o; records never move, so a pointer stays valid while the record is held. */
static inline ssd_object *ssd_obj(const ssd_tier *t, uint32_t o) {
    return &t->chunks[o / SSD_CHUNK_RECORDS][o % SSD_CHUNK_RECORDS];
}

static inline uint64_t ssd_slot_offset(const ssd_tier *t, uint32_t slot) {
    return SSD_BLOCK + (uint64_t)slot * t->slot_bytes;
}

static inline int ssd_path_usable(const ssd_tier *t, uint32_t p) {
    return p < t->n_paths && t->paths[p].io && !ssd_io_failed(t->paths[p].io);
}

/* ---- ssd_objects.c ----------------------------------------------------------------------------- */

void ssd_set_error(ssd_tier *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ssd_log(ssd_tier *t, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* With the lock held. */
uint32_t ssd_index_find(const ssd_tier *t, const kvs_key *key,
                        uint64_t *bucket_out); /* SSD_NIL if absent */
void ssd_lru_touch(ssd_tier *t, uint32_t o);
int ssd_object_pinned(ssd_object *e, uint64_t now); /* clears an expired pin */
uint32_t ssd_object_alloc(ssd_tier *t, uint32_t n_units,
                          uint32_t replicas); /* a WRITING record or SSD_NIL */
void ssd_slot_release(
    ssd_tier *t, ssd_copy *c); /* back to its path's free slots (retired if full and unbacked) */
/* With the lock held: a write to slot of path p failed with ENOSPC. Retires the slot; the first time,
 * marks the path full, retires its unbacked free slots and logs the lowered capacity. */
void ssd_path_full(ssd_tier *t, uint32_t p, uint32_t slot);
void ssd_object_release(ssd_tier *t, uint32_t o); /* slots back, record free */
void ssd_drop_live(ssd_tier *t, uint32_t o); /* out of index and LRU; released once refs is 0 */
void ssd_object_unref(ssd_tier *t, uint32_t o);
void ssd_install_live(ssd_tier *t, uint32_t o);
int ssd_object_readable(const ssd_tier *t, const ssd_object *e); /* every unit has a usable copy */
uint32_t ssd_find_readable(ssd_tier *t,
                           const kvs_key *key); /* drops an unreadable object; SSD_NIL */
void ssd_remove_with_tombstone(ssd_tier *t, uint32_t o);
/* The engines' on_failed: drops every object left without a readable copy. Takes the lock. */
void ssd_on_path_failed(void *ctx, uint32_t index, int err);

/* Backend ops (state is an ssd_tier). */
kvs_status ssd_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present);
kvs_status ssd_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                   uint64_t *n_pinned);
kvs_status ssd_unpin(void *state, const kvs_key *keys, uint64_t n);
kvs_status ssd_remove(void *state, const kvs_key *key);
kvs_status ssd_usage(void *state, uint64_t *n_objects, uint64_t *bytes);
/* ssd_write.c */
kvs_status ssd_put(void *state, const kvs_key *key, const void *object, uint64_t len);
/* ssd_read.c */
kvs_status ssd_get(void *state, const kvs_key *key, void *dst, uint64_t cap, uint64_t *len);
kvs_status ssd_get_range(void *state, const kvs_key *key, uint64_t offset, uint64_t len, void *dst,
                         uint64_t *got, uint64_t *object_len);
kvs_status ssd_get_many(void *state, const kvs_key *keys, void *const *dsts, const uint64_t *caps,
                        uint64_t n, uint64_t *lens, kvs_status *statuses);
kvs_status ssd_get_many_start(void *state, const kvs_key *keys, void *const *dsts,
                              const uint64_t *caps, uint64_t n, uint64_t *lens,
                              kvs_status *statuses, uint64_t *ticket);
kvs_status ssd_get_many_finish(void *state, uint64_t ticket);
/* destroy: finishes every call still in flight (the engines must still run). */
void ssd_finish_calls(ssd_tier *t);

#endif /* KVS_SSD_TIER_H */
