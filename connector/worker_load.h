/* worker_load.h - the worker's loads of the bound step: start_load, wait_layer_load, the error blocks
 * of failed chunks, and what the saves need of them. Calls on one handle are not thread-safe. */
#ifndef KVS_WORKER_LOAD_H
#define KVS_WORKER_LOAD_H

#include <stdint.h>

#include "abi/kvstrata.h"

kvs_status kvs_worker_start_load(kvs_handle *h);
kvs_status kvs_worker_wait_layer(kvs_handle *h, uint32_t layer);
kvs_status kvs_worker_error_blocks(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n);
/* Host device: land layers [from, to] not landed yet (the loads finish once every layer has). */
void kvs_worker_load_layers(kvs_handle *h, uint32_t from, uint32_t to);
/* CUDA device: wait for the enqueued copies and checksums, turn mismatches into error blocks, unpin. */
void kvs_worker_complete_async_loads(kvs_handle *h);

#endif
