/* gpu_cases.c - fixtures of the CUDA device tests (see gpu_cases.h). */
#include "gpu_cases.h"

#include <stdlib.h>
#include <string.h>

/* An id no layer has: a copy that reads an unused table entry fails its bounds check. */
#define BOGUS_ID  1000000u
/* Payload bytes left unused between the copies' segments: a copy that writes past its rows shows. */
#define GAP_BYTES 64u

const char *gpu_layout_name(int layout) {
    switch (layout) {
        case GPU_LAYOUT_PADDED_HEADS: return "padded_heads";
        case GPU_LAYOUT_PADDED_TOKENS: return "padded_tokens";
        default: return kvs_test_layout_name((kvs_test_layout)layout);
    }
}

gpu_geometry gpu_standard_geometry(int layout, uint32_t elem_bytes) {
    gpu_geometry g = {layout, 3, GPU_CASE_BLOCKS, 16, 3, 24, elem_bytes};
    if (layout == KVS_TEST_LAYOUT_MLA) {
        g.n_heads = 1;
        g.head_dim = 36;
    }
    return g;
}

/* Per-layer [K blocks][V blocks] with padding after each head (if pad_heads), token and block. */
static uint8_t *alloc_padded(const gpu_geometry *g, int pad_heads, kvs_layer_view *views,
                             size_t *bytes) {
    const int64_t head_bytes = (int64_t)g->head_dim * g->elem_bytes;
    const int64_t head_stride = head_bytes + (pad_heads ? 8 : 0);
    const int64_t token_stride = g->n_heads * head_stride + 16;
    const int64_t block_stride = g->block_tokens * token_stride + 24;
    const size_t part = (size_t)block_stride * g->n_blocks;
    *bytes = 2 * part * g->n_layers;
    uint8_t *buf = aligned_alloc(64, (*bytes + 63) & ~(size_t)63);
    if (!buf) return NULL;
    memset(buf, 0, *bytes);
    for (uint32_t l = 0; l < g->n_layers; l++) {
        kvs_layer_view *v = &views[l];
        memset(v, 0, sizeof *v);
        v->struct_size = sizeof *v;
        v->device_kind = KVS_DEVICE_HOST;
        v->n_blocks = g->n_blocks;
        v->k_base = buf + 2 * part * l;
        v->v_base = buf + 2 * part * l + part;
        v->block_stride = block_stride;
        v->token_stride = token_stride;
        v->head_stride = head_stride;
    }
    return buf;
}

int gpu_cache_alloc(gpu_cache *c, const gpu_geometry *g) {
    memset(c, 0, sizeof *c);
    if (g->n_layers == 0 || g->n_layers > GPU_MAX_LAYERS || g->n_blocks < GPU_CASE_BLOCKS)
        return -1;
    c->g = *g;
    c->shape.n_heads = g->n_heads;
    c->shape.head_bytes = g->head_dim * g->elem_bytes;
    c->shape.block_tokens = g->block_tokens;
    c->shape.has_v = g->layout != KVS_TEST_LAYOUT_MLA;
    if (g->layout < KVS_TEST_LAYOUT_COUNT)
        c->buf = kvs_test_alloc_kv_layout((kvs_test_layout)g->layout, g->n_layers, g->n_blocks,
                                          g->block_tokens, g->n_heads, g->head_dim, g->elem_bytes,
                                          c->views, &c->bytes);
    else
        c->buf = alloc_padded(g, g->layout == GPU_LAYOUT_PADDED_HEADS, c->views, &c->bytes);
    return c->buf ? 0 : -1;
}

void gpu_cache_free(gpu_cache *c) {
    free(c->buf); /* both allocators use aligned_alloc */
    c->buf = NULL;
}

void gpu_cache_rebase(const gpu_cache *c, void *base, kvs_device_kind kind, int device_index,
                      kvs_layer_view *out) {
    for (uint32_t l = 0; l < c->g.n_layers; l++) {
        out[l] = c->views[l];
        out[l].device_kind = kind;
        out[l].device_index = device_index;
        out[l].k_base = (uint8_t *)base + ((uint8_t *)c->views[l].k_base - c->buf);
        out[l].v_base =
            c->views[l].v_base ? (uint8_t *)base + ((uint8_t *)c->views[l].v_base - c->buf) : NULL;
    }
}

void gpu_fill(uint8_t *buf, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        uint32_t x = (uint32_t)i * 0x9E3779B1u + seed * 0x85EBCA77u;
        x ^= x >> 15;
        x ^= (uint32_t)(i >> 20);
        buf[i] = (uint8_t)((x >> 7) | 1);
    }
}

/* The copies' tokens, from the block size. Copy 3 and 4 split the chunk [2 bt, 4 bt) at `a`. */
typedef struct copy_plan {
    uint64_t first[GPU_CASE_COPIES];
    uint32_t n[GPU_CASE_COPIES];
} copy_plan;

static copy_plan plan_for(uint32_t bt) {
    const uint32_t a = bt / 2 + 1;
    copy_plan p = {
        {bt + 1 + bt / 3, 7, 0, 2ull * bt, 2ull * bt + a, 3},
        {3 * bt + 2, 1, 2 * bt + 3, a, 2 * bt - a, 0},
    };
    return p;
}

uint64_t gpu_copies_payload_bytes(const gpu_cache *c) {
    const copy_plan p = plan_for(c->g.block_tokens);
    const uint64_t token_bytes = (uint64_t)c->shape.n_heads * c->shape.head_bytes;
    const uint64_t parts = c->shape.has_v ? 2 : 1;
    /* copies 0..2 each have their own segment; 3 and 4 share the chunk's. */
    uint64_t per_layer = 0;
    for (int i = 0; i < 3; i++) per_layer += parts * p.n[i] * token_bytes + GAP_BYTES;
    per_layer += parts * 2ull * c->g.block_tokens * token_bytes + GAP_BYTES;
    return per_layer * c->g.n_layers;
}

void gpu_copies_build(gpu_copies *cp, const gpu_cache *c, uint8_t *payload) {
    memset(cp, 0, sizeof *cp);
    const uint32_t bt = c->g.block_tokens;
    const copy_plan p = plan_for(bt);
    /* Scattered ids for copy 0, one for copy 1, descending ones for copy 2, and adjacent ascending
     * ones for the chunk of copies 3 and 4; no id is shared between copies. */
    static const uint32_t scattered[GPU_CASE_TABLE] = {9, 4, 17, 0, 30, 2, 13, 6};
    static const uint32_t descending[GPU_CASE_TABLE] = {26, 25, 24, 19, 18, 16, 15, 14};
    for (int i = 0; i < GPU_CASE_COPIES; i++)
        for (int j = 0; j < GPU_CASE_TABLE; j++) cp->tables[i][j] = BOGUS_ID;
    for (uint64_t j = p.first[0] / bt; j <= (p.first[0] + p.n[0] - 1) / bt; j++)
        cp->tables[0][j] = scattered[j];
    cp->tables[1][p.first[1] / bt] = 28;
    for (uint64_t j = 0; j <= (p.first[2] + p.n[2] - 1) / bt; j++) cp->tables[2][j] = descending[j];
    for (uint64_t j = 2; j < 4; j++) cp->tables[3][j] = cp->tables[4][j] = (uint32_t)(20 + j);

    const uint64_t token_bytes = (uint64_t)c->shape.n_heads * c->shape.head_bytes;
    const int has_v = c->shape.has_v;
    cp->n = GPU_CASE_COPIES;
    cp->layer_payload_bytes = gpu_copies_payload_bytes(c) / c->g.n_layers;
    cp->payload_bytes = gpu_copies_payload_bytes(c);
    for (int i = 0; i < GPU_CASE_COPIES; i++) cp->tokens += p.n[i];
    for (uint32_t l = 0; l < c->g.n_layers; l++) {
        uint8_t *at = payload + l * cp->layer_payload_bytes;
        for (int i = 0; i < GPU_CASE_COPIES; i++) {
            kvs_dev_copy *d = &cp->copies[l][i];
            d->block_ids = cp->tables[i];
            d->n_block_ids = GPU_CASE_TABLE;
            d->first_token = p.first[i];
            d->n_tokens = p.n[i];
            const uint64_t part = (uint64_t)p.n[i] * token_bytes;
            if (i < 3) {
                d->k_payload = at;
                d->v_payload = has_v ? at + part : NULL;
                at += (has_v ? 2 : 1) * part + GAP_BYTES;
            } else if (i == 3) {
                /* The chunk: K rows of its 2 bt tokens, then V rows. */
                const uint64_t chunk_part = 2ull * bt * token_bytes;
                d->k_payload = at;
                d->v_payload = has_v ? at + chunk_part : NULL;
                kvs_dev_copy *rest = &cp->copies[l][4];
                rest->k_payload = at + part;
                rest->v_payload = has_v ? at + chunk_part + part : NULL;
                at += (has_v ? 2 : 1) * chunk_part + GAP_BYTES;
            }
            /* i == 4 was placed with 3; i == 5 is empty: no payload at all. */
        }
    }
}
