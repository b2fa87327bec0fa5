/* workers.h - a few threads that run one batch of numbered items at a time through a function: a
 * checksum per payload (connector/hashpool), a copy per chunk (the host device's helpers). Workers
 * take items by index under one mutex; an item is hundreds of KiB of work, so the lock is taken
 * rarely. Submit, help and wait come from one thread, the batch's owner. */
#ifndef KVS_COMMON_WORKERS_H
#define KVS_COMMON_WORKERS_H

#include <stdint.h>

#include "abi/kvstrata.h"

typedef struct kvs_workers kvs_workers;
typedef void (*kvs_workers_fn)(void *ctx, uint64_t item);

/* n_threads >= 1 threads. KVS_ENOMEM / KVS_EIO (thread creation) with nothing left behind. */
kvs_status kvs_workers_create(uint32_t n_threads, kvs_workers **out);
/* Waits for a running batch, stops and joins the threads. NULL is a no-op. */
void kvs_workers_destroy(kvs_workers *w);
/* Start fn(ctx, i) for i in [0, n) on the threads; ctx must stay valid until kvs_workers_wait. A
 * batch still running is waited for first. */
void kvs_workers_submit(kvs_workers *w, kvs_workers_fn fn, void *ctx, uint64_t n);
/* The calling thread runs items of the submitted batch beside the threads until none is left to
 * take (some may still be running on them: kvs_workers_wait). */
void kvs_workers_help(kvs_workers *w);
/* Block until the submitted batch is done (returns at once when none is). */
void kvs_workers_wait(kvs_workers *w);

#endif
