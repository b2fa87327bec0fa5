/* elastic_pool.c - the two pool layouts and what a resize moves (elastic_pool.h). */
#include "schedulers/elastic/elastic_pool.h"

#include <stdlib.h>
#include <string.h>

kvs_status kvs_el_pool_init(kvs_el_pool *p, kvs_el_layout layout, uint32_t n_layers,
                            uint64_t layer_block_bytes, uint64_t capacity, uint64_t n_blocks) {
    memset(p, 0, sizeof *p);
    uint64_t bytes;
    if (!n_layers || !layer_block_bytes || !capacity || n_blocks > capacity ||
        capacity > UINT64_MAX / n_layers ||
        __builtin_mul_overflow(capacity * n_layers, layer_block_bytes, &bytes))
        return KVS_EINVAL;
    if (!(p->mem = calloc(1, bytes))) return KVS_ENOMEM;
    p->layout = layout;
    p->n_layers = n_layers;
    p->layer_block_bytes = layer_block_bytes;
    p->capacity = capacity;
    p->n_blocks = n_blocks;
    return KVS_OK;
}

void kvs_el_pool_free(kvs_el_pool *p) {
    free(p->mem);
    memset(p, 0, sizeof *p);
}

static uint64_t offset(const kvs_el_pool *p, uint64_t n_blocks, uint32_t layer, uint64_t block) {
    uint64_t unit = p->layout == KVS_EL_BLOCK_MAJOR ? block * p->n_layers + layer
                                                    : (uint64_t)layer * n_blocks + block;
    return unit * p->layer_block_bytes;
}

uint8_t *kvs_el_pool_at(const kvs_el_pool *p, uint32_t layer, uint64_t block) {
    if (layer >= p->n_layers || block >= p->n_blocks) return NULL;
    return p->mem + offset(p, p->n_blocks, layer, block);
}

/* Layer l's first `keep` blocks from where n_old put them to where n_new does, counted. */
static void move_layer(kvs_el_pool *p, uint32_t l, uint64_t n_old, uint64_t n_new, uint64_t keep) {
    uint64_t from = offset(p, n_old, l, 0), to = offset(p, n_new, l, 0);
    if (from == to || keep == 0) return;
    memmove(p->mem + to, p->mem + from, keep * p->layer_block_bytes);
    p->blocks_moved += keep;
    p->bytes_moved += keep * p->layer_block_bytes;
}

kvs_status kvs_el_pool_resize(kvs_el_pool *p, uint64_t n_blocks) {
    if (n_blocks > p->capacity) return KVS_EINVAL;
    uint64_t old = p->n_blocks, keep = old < n_blocks ? old : n_blocks;
    if (p->layout == KVS_EL_LAYER_MAJOR && old != n_blocks) {
        /* growing moves layers up, the last first; shrinking moves them down, the first first, so
         * no region is overwritten before it has moved */
        if (n_blocks > old)
            for (uint32_t l = p->n_layers; l-- > 1;) move_layer(p, l, old, n_blocks, keep);
        else
            for (uint32_t l = 1; l < p->n_layers; l++) move_layer(p, l, old, n_blocks, keep);
    }
    p->n_blocks = n_blocks; /* block-major: the boundary moves, no byte does */
    return KVS_OK;
}
