/* kvcache.h - the mini engine's paged KV cache: page memory in one of five layouts, the dtype
 * conversions, and a block manager with an engine-side prefix cache (full blocks, hash-chained,
 * LRU-evicted). Single-threaded. */
#ifndef MINI_KVCACHE_H
#define MINI_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

#define KV_BLOCK_TOKENS 16

typedef enum kv_layout {
    KV_LAYOUT_NHD = 0,        /* vLLM FlashAttention: per layer [2, blocks, bs, heads, dim] */
    KV_LAYOUT_HND = 1,        /* per layer [2, blocks, heads, bs, dim] */
    KV_LAYOUT_FLASHINFER = 2, /* per layer [blocks, 2, bs, heads, dim] */
    KV_LAYOUT_MLA = 3,        /* per layer [blocks, bs, latent]; no V */
    KV_LAYOUT_CROSSLAYER = 4  /* one tensor [blocks, layers, 2, bs, heads, dim] */
} kv_layout;

typedef enum kv_part { KV_K = 0, KV_V = 1 } kv_part;

typedef struct kvcache_params {
    kv_layout layout;
    kvs_dtype dtype;
    uint32_t n_layers;
    uint32_t n_heads;  /* KV heads stored per token (1 for MLA) */
    uint32_t head_dim; /* elements per head (MLA: the latent width) */
    uint32_t n_blocks; /* pages in the cache */
    uint32_t
        block_budget; /* pages the block manager may hold at once (in use + cached), <= n_blocks */
} kvcache_params;

typedef struct kvcache_stats {
    uint64_t evictions;  /* cached blocks dropped to make room */
    uint64_t hit_blocks; /* blocks reused by match_prefix */
    uint64_t cached_now; /* blocks currently in the prefix cache (in use or free) */
} kvcache_stats;

typedef struct kvcache kvcache;

/* Parse "nhd" ... / "fp16" ...; return 0 on success. */
int kv_layout_parse(const char *name, kv_layout *out);
const char *kv_layout_name(kv_layout layout);
int kv_dtype_parse(const char *name, kvs_dtype *out);
const char *kv_dtype_name(kvs_dtype dtype);
size_t kv_dtype_size(kvs_dtype dtype);

/* Round-to-nearest-even conversions between fp32 and the cache dtype, n elements. fp8 is e4m3 with
 * saturation to +-448 (it has no infinity). */
void kv_from_float(kvs_dtype dtype, void *dst, const float *src, size_t n);
void kv_to_float(kvs_dtype dtype, float *dst, const void *src, size_t n);

/* Allocate the pages (zeroed) and the block manager. Returns NULL and a sentence in err on failure. */
kvcache *kvcache_create(const kvcache_params *params, char *err, size_t err_len);
void kvcache_destroy(kvcache *kv);
const kvcache_params *kvcache_params_of(const kvcache *kv);

/* The byte-stride description of each layer, exactly what the engine itself uses to address the
 * pages; n_layers entries, valid until destroy. */
const kvs_layer_view *kvcache_views(const kvcache *kv);

/* Block ids from KV_OVERLAY on name pages of the overlay (the layer stream cache's buffer, a
 * one-layer cache of buffers * pages_per_buffer pages): id KV_OVERLAY + j of layer `layer` is page
 * (layer % buffers) * pages_per_buffer + j of it, so layer i reads and writes the buffer its
 * stream blocks were fetched into. NULL removes it. */
#define KV_OVERLAY 0x80000000u
void kvcache_set_overlay(kvcache *kv, const kvcache *overlay, uint32_t pages_per_buffer,
                         uint32_t buffers);

/* Address of head `head` of the token in slot `slot` of block `block`, layer `layer`. */
uint8_t *kvcache_head_ptr(const kvcache *kv, uint32_t layer, kv_part part, uint32_t block,
                          uint32_t slot, uint32_t head);
/* Store / load head_dim floats of one head of the token at position pos of a request. */
void kvcache_write(const kvcache *kv, uint32_t layer, kv_part part, const uint32_t *block_table,
                   uint64_t pos, uint32_t head, const float *src);
void kvcache_read(const kvcache *kv, uint32_t layer, kv_part part, const uint32_t *block_table,
                  uint64_t pos, uint32_t head, float *dst);

/* Block manager. */

/* Longest run of cached full blocks that match tokens[0..), stopping so that at least one token of
 * the n_tokens is left to compute. Takes a reference on each matched block and writes its id into
 * blocks_out. Returns the number of blocks matched. */
uint32_t kvcache_match_prefix(kvcache *kv, const int32_t *tokens, uint64_t n_tokens,
                              uint32_t *blocks_out);
/* Take n fresh pages (free ones first, then evicting least recently used cached blocks).
 * Returns 0, or -1 with nothing taken when the budget cannot supply n. */
int kvcache_alloc(kvcache *kv, uint32_t n, uint32_t *blocks_out);
/* Drop the request's references. The first n_valid_tokens / block size blocks hold valid KV for
 * tokens[0..n_valid_tokens) and enter the prefix cache (most recently used); the rest become free. */
void kvcache_release(kvcache *kv, const uint32_t *blocks, uint32_t n_blocks, const int32_t *tokens,
                     uint64_t n_valid_tokens);
/* Pages the manager could hand out right now. */
uint32_t kvcache_available(const kvcache *kv);
kvcache_stats kvcache_get_stats(const kvcache *kv);

#endif
