/* peer_gpu_state.h - the peer_gpu tier's state, the lowest of its headers: its region
 * (peer_gpu_region.h), its slots (peer_gpu_slots.h), its link to the lender (peer_gpu_link.h) and
 * its operations (peer_gpu.c) all work on it. Everything below `lock` is guarded by it. */
#ifndef KVS_PEER_GPU_STATE_H
#define KVS_PEER_GPU_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "backends/dram/dram_index.h"
#include "kernels/device.h"
#include "lending.h"
#include "peer_gpu_stats.h"

#define PG_NIL       UINT32_MAX
#define PG_MAX_SLOTS (1u << 24) /* objects one tier indexes */

typedef enum pg_slot_state {
    PG_FREE = 0,
    PG_WRITING, /* a put is copying into it: invisible */
    PG_STORED,
    PG_DOOMED, /* removed while copies out of it run: freed when the last ends */
} pg_slot_state;

typedef struct pg_slot {
    kvs_key key;
    uint64_t len;
    uint64_t pin_deadline_ns;
    uint32_t pins;
    uint32_t readers;    /* copies out of it in flight */
    uint32_t hnext;      /* bucket chain */
    uint32_t prev, next; /* LRU of stored slots, most recent first */
    uint8_t state;       /* pg_slot_state */
    uint8_t moving;      /* a reclaim is passing its bytes down the chain (pg_empty_unit) */
    uint8_t in_free;     /* on the free stack */
} pg_slot;

typedef struct pg_options {
    const char *socket;
    uint64_t connect_timeout_ms, retry_ms, send_timeout_ms;
    uint64_t device; /* the GPU a CUDA region is opened on; UINT64_MAX: the lender's */
    const char *index_shm;
    uint64_t index_entries;
} pg_options;

typedef struct pg_state {
    char tier_name[64];
    char error[512];
    char logged[512]; /* the last connection failure logged */
    const kvs_backend_host *host;
    uint64_t max_object_bytes;
    pg_options opt;
    char socket_path[108];
    int (*copy_hook)(void *ctx, uint32_t unit);
    void *copy_hook_ctx;

    pthread_mutex_t lock;
    pthread_cond_t changed; /* a copy ended, the link connected or was lost */
    int sock;               /* the control channel; -1 when there is none */
    uint8_t *region;        /* the lender's region, mapped; NULL when there is none */
    uint32_t region_kind;   /* kvs_lend_region_kind */
    int region_device;      /* CUDA: the device it is opened on */
    uint64_t region_bytes, unit_bytes, slot_bytes;
    uint32_t slots_per_unit, n_slots;
    kvs_borrower borrower;
    pg_slot *slots;
    uint32_t *buckets;
    uint32_t n_buckets; /* a power of two */
    uint32_t lru_head, lru_tail;
    /* free slots of usable units, the next one on top; an entry whose slot was taken or whose unit
     * went away meanwhile is dropped when it comes up (pg_take_slot) */
    uint32_t *free_stack;
    uint32_t n_free;
    uint64_t in_flight;
    kvs_peer_gpu_stats stats;
    /* index_shm: what this process holds, published for the instance's other processes; a handle
     * without staging (a scheduler) borrows nothing and answers lookups from it (lookup_only) */
    kvs_dram_index *index;
    int lookup_only;

    /* CUDA regions (peer_gpu_region.c): the module, loaded at the first, and the host buffers
     * objects passed down the chain are staged in (0: pg_take_slot; 1: the link thread) */
    void *module;
    const kvs_device_mem_ops *mem;
    uint8_t *evict_buf[2];
    int evict_pinned[2]; /* from the module's host_alloc (else malloc) */

    int stop;    /* destroy asked the link thread to end */
    int wake[2]; /* a pipe that wakes the link thread */
    pthread_t link;
} pg_state;

#endif /* KVS_PEER_GPU_STATE_H */
