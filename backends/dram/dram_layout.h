/*
 * dram_layout.h - what the dram tier's mapping holds and one process's view of it. The layout
 * (header, slab table, hash index, slab data) refers to itself by offsets and slab indices only, so
 * the same bytes are valid at any address in any process that maps them. The tables inside it are
 * dram_table.h's, the mapping itself dram_shm.h's. Internal to backends/dram/; dram_state is one
 * process's view of one tier.
 */
#ifndef KVS_DRAM_LAYOUT_H
#define KVS_DRAM_LAYOUT_H

#include <pthread.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "common/clock.h"
#include "common/pace.h"

#define DRAM_MAGIC            0x314d41524453564bULL /* "KVSDRAM1" as little-endian bytes */
#define DRAM_LAYOUT_VERSION   5u
#define DRAM_MAX_ATTACHERS    256u
#define DRAM_PAGE             4096u
#define DRAM_SLAB_ALIGN_SMALL 64u /* slabs of objects under a page */
#define DRAM_NIL              UINT32_MAX
#define DRAM_MAX_SLABS        (UINT32_MAX / 4u) /* keeps 2 * n_slabs buckets and NIL inside uint32 */
#define DRAM_SHM_NAME_MAX     200
#define DRAM_ATTACH_WAIT_NS   (5ull * 1000 * 1000 * 1000)

enum { SLAB_FREE = 0, SLAB_USED = 1, SLAB_RESERVED = 2 };

/* A reservation not committed within this long belongs to a process that died: its slab may be
 * reclaimed when the tier is otherwise full. */
#define DRAM_RESERVE_TIMEOUT_NS (120ull * 1000 * 1000 * 1000)

typedef struct slab_entry {
    kvs_key key;
    uint64_t len;
    uint64_t pin_deadline_ns; /* CLOCK_MONOTONIC; meaningful only while pins > 0 */
    uint32_t pins;
    uint32_t state;      /* SLAB_*; the authority when the tables are rebuilt after a crash */
    uint32_t prev, next; /* LRU neighbours while used; next links the free list while free */
} slab_entry;

/* Where everything sits in the mapping; identical in every process that shares it. */
typedef struct geometry {
    uint64_t slab_bytes, n_slabs, n_buckets;
    uint64_t slab_table_offset, bucket_offset, data_offset, mapping_bytes;
} geometry;

/* One attach of the shared tier: the process and its start time (/proc/PID/stat field 22), so a pid
 * reused by another process never passes for the attacher. pid 0: a free entry. */
typedef struct attacher {
    int32_t pid;
    uint32_t reserved;
    uint64_t
        start_time; /* clock ticks since boot; 0 when /proc could not be read (the pid alone counts) */
    uint64_t pid_ns; /* inode of its /proc/self/ns/pid; 0 when unknown */
} attacher;

typedef struct shared_header {
    uint64_t magic; /* stored last by the creator (release), read first by attachers (acquire) */
    uint32_t layout_version;
    uint32_t dead; /* set by the last destroy before it unlinks; an attacher that sees it retries */
    geometry geo;
    uint64_t n_objects, object_bytes;
    uint32_t lru_head, lru_tail; /* head = most recently used */
    uint32_t free_head;
    uint32_t attach_count;       /* live entries of attachers, after the last reap */
    uint32_t reserve_generation; /* bumped per reservation: tickets carry it */
    pthread_mutex_t mutex;       /* process-shared and robust */
    attacher attachers[DRAM_MAX_ATTACHERS];
} shared_header;

/* Process-local view of one tier. */
typedef struct dram_state {
    char tier_name[96];
    char shm_path[DRAM_SHM_NAME_MAX + 2]; /* "/<shm_name>", or "" when private */
    int shm_attach_only;      /* shm_open: attach (only an existing tier), not create|attach (0) */
    uint32_t lock_timeout_ms; /* lock_timeout_ms: 0 waits for the tier's lock without a bound */
    int evict_never;          /* evict: never (puts and reservations take free room only) */
    uint64_t max_object_bytes;
    uint64_t mapping_bytes;
    shared_header *header; /* start of the mapping */
    slab_entry *slabs;
    uint32_t *buckets; /* slab index, or DRAM_NIL for an empty bucket */
    uint8_t *data;
    void *host_ctx;
    void (*log)(void *ctx, int level, const char *message);
    void (*on_evict)(void *ctx, const kvs_key *key, const void *object, uint64_t len);
    /* read pacing (options read_bandwidth, read_latency_us): reads are served one after another at
     * this rate, so the tier stands for a slower device in benchmarks and tests */
    uint64_t pace_bytes_per_s, pace_latency_us, pace_latency_ns;
    kvs_pace pace;
    uint32_t attach_slot;   /* our entry in header->attachers (shared tiers) */
    const kvs_clock *clock; /* pin and reservation deadlines (NULL: CLOCK_MONOTONIC) */
    char error[512];
} dram_state;

#endif /* KVS_DRAM_LAYOUT_H */
