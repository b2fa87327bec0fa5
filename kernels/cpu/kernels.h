/* kernels.h - data movement between an engine's paged KV layout (kvs_layer_view strides) and the
 * contiguous payload of an object. The cpu/ versions are the reference and the host device; the cuda/
 * versions have the same meaning.
 *
 * Payload layout of one layer of one chunk: K rows [n_tokens][n_heads][head_bytes], then (unless MLA,
 * v_base NULL) V rows with the same shape. kvs_kernel_layer_bytes() gives its size.
 * Token t (0-based within the request) lives in block block_ids[t / block_tokens] at offset
 * t % block_tokens. */
#ifndef KVS_KERNELS_H
#define KVS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"
#include "common/nhpoly.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_kv_shape {
    uint32_t n_heads;      /* KV heads of the view */
    uint32_t head_bytes;   /* head_dim * element size */
    uint32_t block_tokens; /* tokens per page */
    int has_v;             /* 0 for MLA */
} kvs_kv_shape;

/* The token range of one request to move, and its block table. */
typedef struct kvs_token_span {
    const uint32_t *block_ids;
    uint64_t n_block_ids;
    uint64_t first_token;
    uint32_t n_tokens;
} kvs_token_span;

/* Bytes of one layer's payload for n_tokens tokens. */
uint64_t kvs_kernel_layer_bytes(const kvs_kv_shape *shape, uint32_t n_tokens);

/* Check a view against a shape: non-null bases, V present iff has_v, strides that do not make two
 * (block, token, head) rows overlap, n_blocks > 0. Writes a sentence into err on failure. */
kvs_status kvs_kernel_check_view(const kvs_layer_view *view, const kvs_kv_shape *shape, char *err,
                                 size_t err_len);

/* Check a span against a view: every block id used is < view->n_blocks and the block table covers
 * the tokens. */
kvs_status kvs_kernel_check_span(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                 const kvs_token_span *span, char *err, size_t err_len);

/* Paged -> payload (host device). dst holds kvs_kernel_layer_bytes(shape, span->n_tokens). */
void kvs_kernel_gather_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                             const kvs_token_span *span, void *dst);
/* Payload -> paged (host device). */
void kvs_kernel_scatter_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                              const kvs_token_span *span, const void *src);
/* Payload -> paged, returning XXH3-64 (seed 0) of src's layer payload computed in the same pass
 * (the bytes are hashed while they are hot in cache). Equal to XXH3_64bits(src, layer_bytes). */
uint64_t kvs_kernel_scatter_layer_hash(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                       const kvs_token_span *span, const void *src);
/* Paged -> payload, hashing as above: returns XXH3-64 (seed 0) of the payload it wrote to dst. */
uint64_t kvs_kernel_gather_layer_hash(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                      const kvs_token_span *span, void *dst);
/* The same two feeding the payload to a keyed layer tag (common/nhpoly.h) instead: the pages get,
 * or the payload holds, exactly the bytes the tag was computed over. The gather also returns the
 * payload's XXH3-64, from the same pass. */
void kvs_kernel_scatter_layer_tag(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                  const kvs_token_span *span, const void *src, kvs_nhpoly *tag);
uint64_t kvs_kernel_gather_layer_tag(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                     const kvs_token_span *span, void *dst, kvs_nhpoly *tag);

/* Either direction with separate K and V payload rows: n_tokens rows of n_heads * head_bytes at
 * k_payload and at v_payload (ignored for MLA). to_pages: payload -> pages, else pages -> payload. */
void kvs_kernel_move_layer_kv(const kvs_layer_view *view, const kvs_kv_shape *shape,
                              const kvs_token_span *span, void *k_payload, void *v_payload,
                              int to_pages);

#ifdef __cplusplus
}
#endif

#endif
