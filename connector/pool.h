/* pool.h - the process's staging pool: fixed-size slabs in one anonymous mapping (registered with
 * CUDA, io_uring and UCX once, where present). Saves are sealed in a slab before a tier takes them.
 * Thread-safe. */
#ifndef KVS_POOL_H
#define KVS_POOL_H

#include <stdint.h>

#include "abi/kvstrata.h"

typedef struct kvs_pool kvs_pool;

/* slab_bytes is rounded up to 4096. Fails (KVS_ENOMEM, sentence in err) if no slab fits. */
kvs_status kvs_pool_create(uint64_t total_bytes, uint64_t slab_bytes, kvs_pool **out, char *err,
                           uint64_t err_len);
void kvs_pool_destroy(kvs_pool *pool);
/* A slab or NULL when all are taken (callers skip the work and count it; they never wait). */
void *kvs_pool_alloc(kvs_pool *pool);
void kvs_pool_free(kvs_pool *pool, void *slab);
uint64_t kvs_pool_slab_bytes(const kvs_pool *pool);
/* The whole mapping the slabs live in (to register with a device). */
void kvs_pool_region(const kvs_pool *pool, void **base, uint64_t *len);
uint64_t kvs_pool_n_slabs(const kvs_pool *pool);
uint64_t kvs_pool_n_free(kvs_pool *pool);

#endif
