/* worker.h - the worker-role hooks: register the engine's pages, bind a step's metadata, load chunks
 * layer by layer, gather and seal saves. Calls on one handle are not thread-safe. */
#ifndef KVS_WORKER_H
#define KVS_WORKER_H

#include <stdint.h>

#include "abi/kvstrata.h"

kvs_status kvs_worker_register(kvs_handle *h, const kvs_layer_view *views, uint32_t n_layers);
kvs_status kvs_worker_bind(kvs_handle *h, const void *meta, uint64_t len);
kvs_status kvs_worker_start_load(kvs_handle *h);
kvs_status kvs_worker_wait_layer(kvs_handle *h, uint32_t layer);
kvs_status kvs_worker_save_layer(kvs_handle *h, uint32_t layer);
kvs_status kvs_worker_wait_save(kvs_handle *h);
kvs_status kvs_worker_error_blocks(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n);
kvs_status kvs_worker_set_stream(kvs_handle *h, void *stream);
/* Closes the device (waiting for its copies) and everything register_kv made. */
void kvs_worker_close(kvs_handle *h);
void kvs_worker_reset(kvs_handle *h);

#endif
