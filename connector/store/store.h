/* store.h - the store API's handle (abi/kvstrata_store.h): a tier chain opened from a YAML file, the
 * namespace and tenant its keys are hashed with, the threads that run submitted batches, and what
 * it counts. store.c opens and answers the table; store_batch.c queues batches and hands out
 * tickets; store_io.c moves one key's value between the caller's buffers and the tiers. */
#ifndef KVS_STORE_H
#define KVS_STORE_H

#include <pthread.h>
#include <stdint.h>

#include "abi/kvstrata_store.h"
#include "connector/config.h"
#include "connector/tiers.h"

#define KVS_STORE_MAX_TIERS   64
#define KVS_STORE_MAX_THREADS 64
#define KVS_STORE_MAX_REGIONS 64
#define KVS_STORE_DEFAULT_MAX (4ull << 20)
#define KVS_STORE_PIN_SLOTS   4096u /* pins remembered for unpin (a lease outlives a lost entry) */
#define KVS_STORE_NAME_SLOTS  (1u << 16) /* engine keys remembered for events */

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
    void *scratch[KVS_STORE_MAX_THREADS]; /* one object each: tiers that copy out */

    pthread_mutex_t pins_lock;
    kvs_store_pin pins[KVS_STORE_PIN_SLOTS];
    pthread_mutex_t regions_lock;
    kvs_store_region regions[KVS_STORE_MAX_REGIONS];
    uint64_t next_region;

    kvs_store_events *events; /* NULL: events off */
    kvs_store_counters c;     /* updated with atomics */
};

/* Counters: relaxed atomics (read by stats while threads run). */
#define KVS_STORE_ADD(field, v) __atomic_fetch_add(&(field), (uint64_t)(v), __ATOMIC_RELAXED)
#define KVS_STORE_GET(field)    __atomic_load_n(&(field), __ATOMIC_RELAXED)

/* store.c: the calling thread's last error on s. */
void kvs_store_set_error(const kvs_store *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* store_io.c */
/* The kvstrata key of an engine key under s's namespace and tenant. */
void kvs_store_key_of(const kvs_store *s, const void *bytes, uint64_t len, kvs_key *out);
/* One key of a batch, on a store thread (scratch: that thread's object buffer). */
void kvs_store_get_one(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov, uint64_t n_iov,
                       void *scratch, kvs_store_result *r);
void kvs_store_put_one(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov, uint64_t n_iov,
                       uint32_t flags, void *scratch, kvs_store_result *r);
void kvs_store_exists_one(kvs_store *s, const kvs_key *key, kvs_store_result *r);
void kvs_store_remove_one(kvs_store *s, const kvs_key *key, kvs_store_result *r);
/* The table's exists and unpin over derived keys[n]. */
kvs_status kvs_store_exists_keys(kvs_store *s, const kvs_key *keys, uint64_t n, uint32_t flags,
                                 uint64_t pin_ms, uint8_t *states, uint64_t *n_leading);
void kvs_store_unpin_keys(kvs_store *s, const kvs_key *keys, uint64_t n);

/* store_batch.c */
kvs_status kvs_store_threads_start(kvs_store *s, uint32_t n_threads, char *err, size_t err_len);
/* Waits for every batch in flight, stops the threads, drops what was not collected. */
void kvs_store_threads_stop(kvs_store *s);
kvs_status kvs_store_submit(kvs_store *s, uint32_t op, const kvs_store_keys *keys,
                            const kvs_store_sg *sg, uint32_t flags, uint64_t *ticket);
kvs_status kvs_store_wait(kvs_store *s, uint64_t ticket, uint64_t timeout_ms,
                          kvs_store_result *results, uint64_t cap, uint64_t *n_failed);
kvs_status kvs_store_drain(kvs_store *s, uint64_t *tickets, uint64_t cap, uint64_t *n);
/* A batch of keys checked (sizes, offsets) and hashed into out[keys->n] (malloc'd). */
kvs_status kvs_store_derive_keys(kvs_store *s, const kvs_store_keys *keys, kvs_key **out);

/* store_events.c */
kvs_status kvs_store_events_create(uint32_t capacity, kvs_store_events **out);
void kvs_store_events_destroy(kvs_store_events *ev);
/* The engine's key behind a kvstrata key, for the events that name it. */
void kvs_store_events_name(kvs_store_events *ev, const kvs_key *key, const void *bytes,
                           uint32_t len);
/* The tier chain's callback (kvs_tier_event_fn): ctx is the store. */
void kvs_store_on_tier_event(void *ctx, uint8_t kind, const kvs_key *key, uint32_t tier);
kvs_status kvs_store_events_take(kvs_store_events *ev, void *buf, uint64_t cap, uint64_t *len,
                                 uint64_t *n);
uint64_t kvs_store_events_dropped(const kvs_store_events *ev);

/* The table (store.c). */
const kvs_store_api *kvs_store_api_table(uint32_t major);

#endif
