/* gpu_cases.h - fixtures shared by the CUDA device tests: a paged cache of any layout in host
 * memory (views that can be rebased onto a device copy of the same bytes), and one layer's set of
 * awkward copies: a copy starting mid-block over scattered block ids, a single token, whole blocks
 * in reverse order with a partial last block, a chunk split mid-block into two copies whose payload
 * pointers are offsets into the chunk's payload (on adjacent ascending blocks, so copy-engine runs
 * merge across the copies), and an empty copy. Block table entries the copies do not use hold
 * out-of-range ids, so reading one shows as a failure. Plain C, no CUDA. */
#ifndef KVS_GPU_CASES_H
#define KVS_GPU_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/device.h"
#include "tests/support/test_support.h"

#define GPU_MAX_LAYERS  4
#define GPU_CASE_COPIES 6
#define GPU_CASE_TABLE  8  /* entries of each copy's block table */
#define GPU_CASE_BLOCKS 32 /* blocks per layer the copies need (ids up to 30) */

/* kvs_test_layout values, plus two padded layouts built here. */
enum {
    GPU_LAYOUT_PADDED_HEADS = KVS_TEST_LAYOUT_COUNT, /* padding between heads, tokens, blocks */
    GPU_LAYOUT_PADDED_TOKENS,                        /* heads packed, padding between tokens */
    GPU_LAYOUT_COUNT
};

typedef struct gpu_geometry {
    int layout; /* kvs_test_layout or GPU_LAYOUT_* */
    uint32_t n_layers;
    uint32_t n_blocks; /* >= GPU_CASE_BLOCKS */
    uint32_t block_tokens;
    uint32_t n_heads;
    uint32_t head_dim;
    uint32_t elem_bytes;
} gpu_geometry;

typedef struct gpu_cache {
    gpu_geometry g;
    kvs_kv_shape shape;
    uint8_t *buf; /* host, zeroed */
    size_t bytes;
    kvs_layer_view views[GPU_MAX_LAYERS]; /* KVS_DEVICE_HOST views over buf */
} gpu_cache;

/* Name for messages: "nhd", "padded_heads". */
const char *gpu_layout_name(int layout);
/* The standard geometry of a layout and element size: 3 layers, 32 blocks of 16 tokens, 3 heads of
 * 24 elements (MLA: 1 latent of 36). */
gpu_geometry gpu_standard_geometry(int layout, uint32_t elem_bytes);
/* Allocate and zero; returns 0 on success. */
int gpu_cache_alloc(gpu_cache *c, const gpu_geometry *g);
void gpu_cache_free(gpu_cache *c);
/* The views of c over another buffer holding the same bytes (a device copy), as device `kind`. */
void gpu_cache_rebase(const gpu_cache *c, void *base, kvs_device_kind kind, int device_index,
                      kvs_layer_view *out);
/* Fill n bytes with a pattern that depends on the offset and on seed, never 0. */
void gpu_fill(uint8_t *buf, size_t n, uint32_t seed);

typedef struct gpu_copies {
    uint32_t tables[GPU_CASE_COPIES][GPU_CASE_TABLE];
    kvs_dev_copy copies[GPU_MAX_LAYERS][GPU_CASE_COPIES]; /* same tokens, per-layer payload */
    uint32_t n;                                           /* copies per layer */
    uint64_t layer_payload_bytes;
    uint64_t payload_bytes; /* all layers */
    uint64_t tokens;        /* summed tokens of one layer's copies */
} gpu_copies;

/* Bytes of payload gpu_copies_build needs for c. */
uint64_t gpu_copies_payload_bytes(const gpu_cache *c);
/* Build the copies of every layer of c over payload (gpu_copies_payload_bytes bytes). */
void gpu_copies_build(gpu_copies *cp, const gpu_cache *c, uint8_t *payload);

#endif
