/* store_state.h - the store API's handle (abi/kvstrata_store.h): a tier chain opened from a YAML
 * file, the namespace and tenant its keys are hashed with, the threads that run submitted batches,
 * and what it counts; and the calling thread's last error (store_error.c). The files above it:
 * store_io.c moves one key's value between the caller's buffers and the tiers, store_batch.c
 * queues batches and hands out tickets, store.c opens a store and answers the table. */
#ifndef KVS_STORE_STATE_H
#define KVS_STORE_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "abi/kvstrata_store.h"
#include "connector/config.h"
#include "connector/tiers.h"

#define KVS_STORE_MAX_TIERS   64
#define KVS_STORE_MAX_THREADS 64
#define KVS_STORE_MAX_REGIONS 64
#define KVS_STORE_DEFAULT_MAX (4ull << 20)
#define KVS_STORE_READ_DEPTH  8u /* keys of a get batch one thread reads from a tier at once */
#define KVS_STORE_READ_BYTES  (64ull << 20) /* at most this much scratch per thread for them */
#define KVS_STORE_PIN_MAX_MS  3600000u      /* the longest lease exists takes (1 hour) */
#define KVS_STORE_PIN_SLOTS   4096u         /* keys whose pins unpin can drop (a power of two) */
#define KVS_STORE_NAME_SLOTS  (1u << 16)    /* engine keys remembered for events */

typedef struct kvs_store_job kvs_store_job;
typedef struct kvs_store_events kvs_store_events;

typedef struct kvs_store_counters {
    uint64_t gets, get_hits, get_misses, get_bytes, get_ns;
    uint64_t puts, puts_stored, puts_skipped, puts_failed, put_bytes, put_ns;
    uint64_t exists_keys, exists_present, removes, corrupt;
    uint64_t tier_hits[KVS_STORE_MAX_TIERS], tier_hit_bytes[KVS_STORE_MAX_TIERS];
    uint64_t tier_puts[KVS_STORE_MAX_TIERS], tier_put_bytes[KVS_STORE_MAX_TIERS];
} kvs_store_counters;

typedef struct kvs_store_region {
    uint64_t id; /* 0: a free slot */
    uintptr_t base;
    uint64_t len;
    uint32_t kind;
} kvs_store_region;

typedef struct kvs_store_pin {
    kvs_key key;
    uint32_t tier;
    uint32_t used;
    uint32_t count; /* pins taken on the key, each to be dropped once */
    uint64_t until_ns;
} kvs_store_pin;

struct kvs_store {
    kvs_config *cfg;
    kvs_tier_chain *chain;
    uint32_t n_tiers;
    int has_remote;
    /* a chain with a tier that is not thread-safe is reached under chain_lock */
    int serialize;
    pthread_mutex_t chain_lock;
    kvs_key ns; /* the namespace and tenant, hashed: every object's fingerprint */
    uint64_t max_value;
    uint64_t max_object; /* max_value and the header page */

    /* batches: the queue, the tickets not collected yet, the threads */
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    kvs_store_job *jobs; /* oldest first; running and completed until collected */
    kvs_store_job *jobs_tail;
    uint64_t next_ticket;
    uint64_t in_flight;
    int closing;
    int event_fd;
    uint32_t n_threads;
    pthread_t threads[KVS_STORE_MAX_THREADS];
    /* each thread's object buffers: read_depth slots of slot_bytes (tiers that copy out) */
    uint8_t *scratch[KVS_STORE_MAX_THREADS];
    uint64_t slot_bytes;
    uint32_t read_depth;

    pthread_mutex_t pins_lock;
    kvs_store_pin pins[KVS_STORE_PIN_SLOTS];
    pthread_mutex_t regions_lock;
    kvs_store_region regions[KVS_STORE_MAX_REGIONS];
    uint64_t next_region;

    kvs_store_events *events; /* NULL: events off */
    kvs_store_counters c;     /* updated with atomics */
    char tenant[KVS_STORE_TENANT_MAX + 1];
    struct kvs_metrics_source *metrics; /* `metrics:` (store_metrics.c); NULL: off */
};

/* The store's slot in its instance's metrics segment when its config has `metrics:` (the instance
 * thread polls the counters, which are atomics), and its retirement (store_metrics.c). */
void kvs_store_metrics_open(kvs_store *s);
void kvs_store_metrics_close(kvs_store *s);

/* Counters: relaxed atomics (read by stats while threads run). */
#define KVS_STORE_ADD(field, v) __atomic_fetch_add(&(field), (uint64_t)(v), __ATOMIC_RELAXED)
#define KVS_STORE_GET(field)    __atomic_load_n(&(field), __ATOMIC_RELAXED)

/* The calling thread's last error on s (store_error.c). */
void kvs_store_set_error(const kvs_store *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* That sentence, "" when the thread's last error was on another store (or none). */
const char *kvs_store_error_of(const kvs_store *s);
/* A closing store forgets the calling thread's error on it. */
void kvs_store_forget_error(const kvs_store *s);

#endif
