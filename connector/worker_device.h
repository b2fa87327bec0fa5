/* worker_device.h - the worker's device: register_kv opens it over the engine's pages, set_stream
 * hands it the engine's stream, close releases it. Calls on one handle are not thread-safe. */
#ifndef KVS_WORKER_DEVICE_H
#define KVS_WORKER_DEVICE_H

#include <stdint.h>

#include "abi/kvstrata.h"

kvs_status kvs_worker_register(kvs_handle *h, const kvs_layer_view *views, uint32_t n_layers);
kvs_status kvs_worker_set_stream(kvs_handle *h, void *stream);
/* Closes the device (waiting for its copies) and everything register_kv made. */
void kvs_worker_close(kvs_handle *h);

#endif
