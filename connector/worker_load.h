/* worker_load.h - the worker's loads of the bound step: start_load, wait_layer_load, the error blocks
 * of failed chunks, and what the saves need of them. Calls on one handle are not thread-safe. */
#ifndef KVS_WORKER_LOAD_H
#define KVS_WORKER_LOAD_H

#include <stdint.h>

#include "abi/kvstrata.h"

#include "error_blocks.h"
#include "handle.h"

/* A set of chunk loads: the bound step's, or one async request's. */
typedef struct kvs_load_set {
    kvs_load_work *w;
    uint64_t n;
    uint64_t tier_ns[KVS_STATS_MAX_TIERS]; /* time reading from each tier, not yet in the stats */
} kvs_load_set;

kvs_status kvs_worker_start_load(kvs_handle *h);
kvs_status kvs_worker_wait_layer(kvs_handle *h, uint32_t layer);
kvs_status kvs_worker_error_blocks(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n);
/* load_dropped (ABI 1.7): the positions the bound step's DROP loads of req_id left out. */
kvs_status kvs_worker_load_dropped(kvs_handle *h, const char *req_id, uint64_t first_token,
                                   uint64_t n_tokens, uint8_t *mask, uint64_t *n_dropped);
/* Host device: land layers [from, to] not landed yet (the loads finish once every layer has). */
void kvs_worker_load_layers(kvs_handle *h, uint32_t from, uint32_t to);
/* CUDA device: wait for the enqueued copies and checksums, turn mismatches into error blocks, unpin. */
void kvs_worker_complete_async_loads(kvs_handle *h);
/* The bound step's loads land now (a step with no forward pass), or fail if start_load never ran. */
void kvs_worker_land_step_loads(kvs_handle *h);

/* Async loads (worker_async.c). open: pin and read every chunk of the set into memory (may run on
 * the loader thread when every tier is thread-safe: it touches no handle state, failures wait in the
 * works, whose `async` is set). land: on the worker's thread with the device idle, copy every wanted
 * layer into the pages, verify, account failures as error blocks, unpin. release: drop a set that is
 * not landed (close). */
void kvs_loads_open(kvs_handle *h, kvs_load_set *set);
void kvs_loads_land(kvs_handle *h, kvs_load_set *set);
void kvs_loads_release(kvs_handle *h, kvs_load_set *set);

#endif
