/* peer_gpu_internal.h - the peer_gpu tier's state, shared by its operations (peer_gpu.c) and its
 * link to the lender (peer_gpu_link.c). Everything below `lock` is guarded by it. */
#ifndef KVS_PEER_GPU_INTERNAL_H
#define KVS_PEER_GPU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "backends/dram/dram_index.h"
#include "kernels/device.h"
#include "lend_wire.h"
#include "lending.h"
#include "peer_gpu.h"

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

/* peer_gpu_region.c, the tier's lowest unit: its last error (st->error, written without the lock
 * as in the other tiers) and a line to the host's log. */
void pg_set_error(pg_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pg_log(pg_state *st, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* peer_gpu_slots.c, with the lock held unless said */
uint32_t pg_unit_of(const pg_state *st, uint32_t slot);
uint8_t *pg_slot_data(const pg_state *st, uint32_t slot);
/* 1 when I/O may start on the unit (the lender lives and it is ours). */
int pg_unit_usable(const pg_state *st, uint32_t unit);
uint32_t *pg_bucket_of(pg_state *st, const kvs_key *key);
/* The stored slot of key, or PG_NIL. */
uint32_t pg_find(pg_state *st, const kvs_key *key);
void pg_lru_unlink(pg_state *st, uint32_t slot);
void pg_lru_push_head(pg_state *st, uint32_t slot);
/* Make a slot (its key and length set) visible; take it out of the index and the LRU (freed now,
 * or doomed while copies out of it run); free it. */
void pg_publish(pg_state *st, uint32_t slot);
void pg_unpublish(pg_state *st, uint32_t slot);
void pg_free_slot(pg_state *st, uint32_t slot);
/* A unit became usable (an offer accepted): its free slots go on the free stack, lowest on top. */
void pg_unit_lent(pg_state *st, uint32_t unit);
/* 1 while a pin holds (an expired one is cleared). */
int pg_pinned(pg_slot *e, uint64_t now_ns);
/* Start a copy on a slot: counted in flight on its unit; 0 when the unit is no longer usable. */
int pg_begin_copy(pg_state *st, uint32_t slot, int reading);
/* The copy ended: the unit's count, a doomed slot freed, a RELEASED the end makes possible. */
void pg_end_copy(pg_state *st, uint32_t slot, int reading);
/* A free slot in a usable unit, or the least recently used unpinned object's after passing it
 * down; PG_NIL when everything is pinned, busy or not ours. */
uint32_t pg_take_slot(pg_state *st);
int pg_unit_empty(const pg_state *st, uint32_t unit);
/* Move every object of the unit down the chain (down != 0: host->on_evict with its bytes, the lock
 * let go meanwhile; only the link thread, which alone unmaps the region) or report it gone (down ==
 * 0, lock held); slots with copies out of them in flight are doomed, freed when they end. Returns
 * with the lock held. */
void pg_empty_unit(pg_state *st, uint32_t unit, int down);
/* Send RELEASED for the unit and let it go; a failed send shuts the channel (the link thread then
 * finds it lost). */
void pg_send_released(pg_state *st, uint32_t unit);

/* peer_gpu_region.c, no lock held unless said */
/* Map (host) or open (CUDA) the HELLO's region. KVS_OK with *base (and *device for CUDA); else a
 * sentence in why and nothing held. */
kvs_status pg_region_open(pg_state *st, const kvs_lend_msg *m, int fd, uint8_t **base, int *device,
                          char *why, size_t why_len);
void pg_region_close(pg_state *st, uint8_t *base, uint64_t bytes, uint32_t kind, int device);
/* The CUDA module, at destroy. */
void pg_region_unload(pg_state *st);
/* Copies out of and into bytes of the region in `unit`, no lock held (the test hook first; a host
 * region's copy uses non-temporal stores past KVS_COPY_STREAM_MIN, fenced), done when they
 * return: KVS_OK, or KVS_EIO for a failed copy (st->error says why). */
kvs_status pg_region_read(pg_state *st, uint32_t unit, void *dst, const uint8_t *src, uint64_t n);
kvs_status pg_region_write(pg_state *st, uint32_t unit, uint8_t *dst, const void *src, uint64_t n);
/* len bytes of the region at src as host bytes to pass down the chain: src itself (a host
 * region), or (CUDA) a copy in evict_buf[buf]; NULL when that copy failed (st->error says why). */
const void *pg_region_host_view(pg_state *st, const uint8_t *src, uint64_t len, int buf);

/* peer_gpu_link.c */
/* First connection attempt (create), then the link thread. */
kvs_status pg_link_start(pg_state *st);
void pg_link_stop(pg_state *st);

#endif
