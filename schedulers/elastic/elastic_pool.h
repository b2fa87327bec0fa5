/* elastic_pool.h - a KV pool that grows and shrinks in place, in one of two layouts, counting the
 * blocks a resize has to move (SwiftCache §3.4: why the lending pool is block-major). A host-memory
 * model of the layouts, for tests and the move counts in docs/peer_gpu.md; the peer-GPU tier's pool
 * is block-major.
 *
 * Layer-major, (n_layers, n_blocks, layer block) densely packed: layer l of block b lies at
 * (l * n + b) * layer_block_bytes, so a resize from n to n' blocks moves every later layer's region:
 * (L - 1) * n blocks to grow, (L - 1) * n' to shrink. Block-major, (n_blocks, n_layers, layer block):
 * layer l of block b lies at (b * L + l) * layer_block_bytes, and a resize moves nothing. */
#ifndef KVS_ELASTIC_POOL_H
#define KVS_ELASTIC_POOL_H

#include <stdint.h>

#include "abi/kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvs_el_layout { KVS_EL_LAYER_MAJOR = 0, KVS_EL_BLOCK_MAJOR = 1 } kvs_el_layout;

typedef struct kvs_el_pool {
    kvs_el_layout layout;
    uint32_t n_layers;
    uint64_t layer_block_bytes;
    uint64_t capacity; /* blocks the memory holds */
    uint64_t n_blocks; /* blocks in use: [0, n_blocks) */
    uint8_t *mem;
    uint64_t blocks_moved; /* (layer, block) units a resize copied, since init */
    uint64_t bytes_moved;
} kvs_el_pool;

/* capacity blocks of n_layers layers of layer_block_bytes each, n_blocks of them in use.
 * KVS_EINVAL for zero sizes or n_blocks > capacity, KVS_ENOMEM. */
kvs_status kvs_el_pool_init(kvs_el_pool *p, kvs_el_layout layout, uint32_t n_layers,
                            uint64_t layer_block_bytes, uint64_t capacity, uint64_t n_blocks);
void kvs_el_pool_free(kvs_el_pool *p);

/* Layer `layer` of block `block` (< n_blocks), or NULL. */
uint8_t *kvs_el_pool_at(const kvs_el_pool *p, uint32_t layer, uint64_t block);

/* Grow or shrink to n_blocks (<= capacity), keeping every block below min(old, new) byte for byte;
 * the blocks it copies are counted. KVS_EINVAL beyond the capacity. */
kvs_status kvs_el_pool_resize(kvs_el_pool *p, uint64_t n_blocks);

#ifdef __cplusplus
}
#endif

#endif
