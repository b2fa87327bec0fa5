/* hashpool.h - a few threads that compute XXH3-64 checksums of payload ranges in parallel, for a
 * device whose copies run without the CPU (CUDA): loads are verified while the copies run and
 * saves are hashed once their bytes have landed in host memory.
 * One batch at a time: submit, then wait. Both calls come from the worker's one thread. */
#ifndef KVS_HASHPOOL_H
#define KVS_HASHPOOL_H

#include <stdint.h>

#include "abi/kvstrata.h"

typedef struct kvs_hash_job {
    const void *data;
    uint64_t len;
    uint64_t *out; /* XXH3_64bits(data, len) is stored here */
} kvs_hash_job;

typedef struct kvs_hashpool kvs_hashpool;

/* n_threads >= 1 workers. KVS_ENOMEM / KVS_EIO (thread creation) with nothing left behind. */
kvs_status kvs_hashpool_create(uint32_t n_threads, kvs_hashpool **out);
/* Waits for a running batch, stops and joins the threads. NULL is a no-op. */
void kvs_hashpool_destroy(kvs_hashpool *pool);
/* Start hashing jobs[0..n); the array and the bytes must stay valid until kvs_hashpool_wait.
 * A batch still running is waited for first. */
void kvs_hashpool_submit(kvs_hashpool *pool, kvs_hash_job *jobs, uint64_t n);
/* Block until the submitted batch is done (returns at once when none is). */
void kvs_hashpool_wait(kvs_hashpool *pool);

#endif
