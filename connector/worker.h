/* worker.h - the worker's step: bind_meta turns a step's metadata into the handle's load and save work,
 * reset drops it when the step ends (worker_load.h and worker_save.h do the work). Calls on one handle
 * are not thread-safe. */
#ifndef KVS_WORKER_H
#define KVS_WORKER_H

#include <stdint.h>

#include "abi/kvstrata.h"

kvs_status kvs_worker_bind(kvs_handle *h, const void *meta, uint64_t len);
/* Unpin, free and abort whatever the bound step still holds; the worker is idle afterwards. */
void kvs_worker_reset(kvs_handle *h);

#endif
