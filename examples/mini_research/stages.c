/* stages.c - pipeline stages and their boundary activations in the paged cache (stages.h). */
#include "stages.h"

#include <stdio.h>
#include <string.h>

#include "abi/kvstrata_plans.h"

/* Bytes one token holds in one cache layer: K and V (or the MLA latent) of every cached head. */
static uint64_t token_layer_bytes(const model *m, kvs_dtype dtype) {
    uint64_t parts = model_config_of(m)->is_mla ? 1 : 2;
    return parts * model_cache_heads(m) * model_cache_width(m) * kv_dtype_size(dtype);
}

int stage_layout_init(stage_layout *sl, const model *m, kvs_dtype dtype, int n_stages, char *err,
                      size_t err_len) {
    const model_config *mc = model_config_of(m);
    memset(sl, 0, sizeof *sl);
    if (n_stages < 1 || n_stages > (int)KVS_MAX_STAGES || n_stages > mc->n_layers) {
        snprintf(err, err_len, "--stages must be 1..%u and at most --layers (%d), got %d",
                 KVS_MAX_STAGES, mc->n_layers, n_stages);
        return -1;
    }
    sl->n_stages = n_stages;
    sl->model_layers = mc->n_layers;
    for (int s = 1; s < n_stages; s++)
        sl->first[s] =
            sl->first[s - 1] + mc->n_layers / n_stages + (s - 1 < mc->n_layers % n_stages);
    uint64_t row = (uint64_t)mc->dim * sizeof(float), per = token_layer_bytes(m, dtype);
    sl->boundary_layers = n_stages > 1 ? (int)((row + per - 1) / per) : 0;
    return 0;
}

uint32_t stage_cache_layers(const stage_layout *sl) {
    return (uint32_t)(sl->model_layers + (sl->n_stages - 1) * sl->boundary_layers);
}

kvs_stage_desc stage_desc(const stage_layout *sl) {
    kvs_stage_desc d = {.struct_size = sizeof d,
                        .n_stages = (uint32_t)sl->n_stages,
                        .n_kv_layers = (uint32_t)sl->model_layers,
                        .boundary_layers = (uint32_t)sl->boundary_layers};
    for (int s = 0; s < sl->n_stages; s++) d.first_layer[s] = (uint32_t)sl->first[s];
    return d;
}

int stage_starting_at(const stage_layout *sl, int layer) {
    for (int s = 1; s < sl->n_stages; s++)
        if (sl->first[s] == layer) return s;
    return 0;
}

/* The boundary of one token is dim * 4 bytes laid over the heads of its boundary layers in order
 * (layer, then K/V part, then head), whatever the cache dtype: the bytes are copied, never converted,
 * so a restored boundary is the same bits as the computed one. Stores `in` or loads into `out`. */
static void boundary_copy(const stage_layout *sl, const kvcache *kv, int stage, int dim,
                          const uint32_t *table, uint64_t pos, const uint8_t *in, uint8_t *out) {
    const kvcache_params *p = kvcache_params_of(kv);
    uint32_t heads = p->n_heads, parts = p->layout == KV_LAYOUT_MLA ? 1 : 2;
    uint64_t head_bytes = (uint64_t)p->head_dim * kv_dtype_size(p->dtype),
             left = (uint64_t)dim * sizeof(float);
    uint32_t layer0 = (uint32_t)(sl->model_layers + (stage - 1) * sl->boundary_layers);
    for (uint32_t piece = 0; left; piece++) {
        uint32_t layer = layer0 + piece / (parts * heads), part = piece % (parts * heads) / heads,
                 head = piece % heads;
        uint8_t *at = kvcache_head_ptr(kv, layer, part ? KV_V : KV_K, table[pos / KV_BLOCK_TOKENS],
                                       (uint32_t)(pos % KV_BLOCK_TOKENS), head);
        uint64_t n = left < head_bytes ? left : head_bytes;
        if (in)
            memcpy(at, in, n), in += n;
        else
            memcpy(out, at, n), out += n;
        left -= n;
    }
}

void stage_boundary_write(const stage_layout *sl, const kvcache *kv, int stage, int dim,
                          const uint32_t *table, uint64_t pos0, int n, const float *hidden) {
    for (int t = 0; t < n; t++)
        boundary_copy(sl, kv, stage, dim, table, pos0 + (uint64_t)t,
                      (const uint8_t *)(hidden + (size_t)t * (size_t)dim), NULL);
}

void stage_boundary_read(const stage_layout *sl, const kvcache *kv, int stage, int dim,
                         const uint32_t *table, uint64_t pos0, int n, float *hidden) {
    for (int t = 0; t < n; t++)
        boundary_copy(sl, kv, stage, dim, table, pos0 + (uint64_t)t, NULL,
                      (uint8_t *)(hidden + (size_t)t * (size_t)dim));
}
