/* worker_async.h - loads that run between steps (lookup answered load_async): bind_meta hands each such
 * request to a loader thread, which pins and reads its chunks while the engine keeps stepping; the
 * worker's thread lands them in the pages when the device is idle, and get_finished reports the
 * request in its receiving list. Calls on one handle are not thread-safe (the loader thread is the
 * module's own business). */
#ifndef KVS_WORKER_ASYNC_H
#define KVS_WORKER_ASYNC_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "meta.h"

typedef struct kvs_async_job kvs_async_job;

/* A job for r's loads (r is copied): everything it needs is allocated here, so bind_meta can fail
 * before it changes any state. */
kvs_status kvs_async_prepare(kvs_handle *h, const kvs_meta_req *r, kvs_async_job **out);
/* Free a prepared job that was not submitted. NULL is a no-op. */
void kvs_async_discard(kvs_async_job *j);
/* Queue a prepared job (cannot fail). Every tier thread-safe: the loader thread reads it (holding
 * at most half the staging pool's slabs for read jobs not landed yet); else it is read here, on the
 * caller's thread. */
void kvs_async_submit(kvs_handle *h, kvs_async_job *j);
/* Land every request whose chunks are read, if the device may copy now (idle, or synchronous). */
void kvs_async_land(kvs_handle *h);
/* The get_finished hook. */
kvs_status kvs_worker_get_finished(kvs_handle *h, char *sending, uint64_t sending_cap,
                                   uint64_t *n_sending, char *receiving, uint64_t receiving_cap,
                                   uint64_t *n_receiving);
/* Stop the loader thread and drop every request not reported yet (close). */
void kvs_async_close(kvs_handle *h);

#endif
