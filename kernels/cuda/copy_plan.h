/* copy_plan.h - the host-side arithmetic of the CUDA device, in plain C so it is unit-tested on
 * machines without a GPU (tests/gpu/test_cuda_plan.c):
 *   - check a layer's copies (kvs_dev_copy) against its view before anything is enqueued, because
 *     a bad block id on a GPU is an illegal address that kills the engine's whole CUDA context;
 *   - pack the copies into the descriptor block that one kernel launch reads;
 *   - locate the page and payload address of one token row from that block (an inline function
 *     compiled for both host and device: the kernel and the tests run the same code);
 *   - cut copies into contiguous runs for the copy engines (DMA).
 * Payload layout and token -> block mapping are those of kernels/cpu/kernels.h. Every function is
 * pure over caller memory and thread-safe. Addresses are carried as uint64_t so the structs have the
 * same layout in C and CUDA and can be copied to the device as bytes. */
#ifndef KVS_COPY_PLAN_H
#define KVS_COPY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/device.h"

#ifdef __CUDACC__
#define KVS_CUDA_HD __host__ __device__
#else
#define KVS_CUDA_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's pages as the copy code sees them. Addresses are device addresses (for the CUDA
 * device) or host addresses (in the tests); strides are bytes and never negative. */
typedef struct kvs_cuda_layer {
    uint64_t part_base[2]; /* k_base, v_base (v_base 0 for MLA) */
    int64_t block_stride;
    int64_t token_stride;
    int64_t head_stride;
    uint32_t n_blocks;
    uint32_t n_heads;
    uint32_t head_bytes;
    uint32_t block_tokens;
    uint32_t n_parts;           /* 2 (K and V), or 1 for MLA */
    uint32_t heads_contiguous;  /* 1: a token's heads are one run of n_heads * head_bytes bytes */
    uint32_t tokens_contiguous; /* 1: ... and a block's tokens of one part are one run as well */
} kvs_cuda_layer;

/* Fill *out from a view and shape (already checked by the connector). */
void kvs_cuda_layer_from_view(const kvs_layer_view *view, const kvs_kv_shape *shape,
                              kvs_cuda_layer *out);
/* Bytes of one token row of one part: n_heads * head_bytes. */
uint64_t kvs_cuda_token_bytes(const kvs_cuda_layer *layer);
/* Contiguous bytes of one block of one part (block_tokens token rows), or 0 when a block's tokens
 * are not one run (HND with several heads, padded strides): then only the kernel can move it. */
uint64_t kvs_cuda_run_bytes(const kvs_cuda_layer *layer);
/* OR of the layer's bases, strides and head_bytes: the address bits every page access has. */
uint64_t kvs_cuda_layer_align_bits(const kvs_cuda_layer *layer);
/* Widest copy unit (16, 8, 4, 2 or 1 bytes) that divides every address with these bits. */
uint32_t kvs_cuda_unit_bytes(uint64_t align_bits);

/* Upper bound of the block ids (and, per part, of the contiguous runs) that copies of at most
 * max_copies copies and max_tokens tokens in all can touch: each copy of n tokens spans at most
 * n / block_tokens + 2 blocks. */
uint64_t kvs_cuda_max_blocks_touched(uint32_t max_copies, uint64_t max_tokens,
                                     uint32_t block_tokens);

/* Check copies[0..n) of layer `layer_index` against the layer: no token range overflows, each
 * block table covers its tokens, every block id used is < n_blocks, the payload pointers it needs
 * are non-NULL. Copies of 0 tokens are allowed (and skipped by everything below). `op` names the
 * caller in the sentence ("load_layer"). *n_tokens (may be NULL) gets the summed tokens. */
kvs_status kvs_cuda_check_copies(const kvs_cuda_layer *layer, uint32_t layer_index, const char *op,
                                 const kvs_dev_copy *copies, uint64_t n, uint64_t *n_tokens,
                                 char *err, size_t err_len);

/* --- the descriptor block of one kernel launch --------------------------------------------------- */

/* One copy of a launch. 40 bytes, 8-byte aligned; the block holds descs[n_copies] then ids. */
typedef struct kvs_cuda_copy_desc {
    uint64_t row_begin;  /* tokens in the launch's earlier copies: the copy's first token index */
    uint64_t ids_offset; /* index in the launch's id array of the block of the copy's first token */
    uint64_t k_payload;  /* device address of the copy's K rows */
    uint64_t v_payload;  /* device address of its V rows; 0 for MLA */
    uint32_t first_in_block; /* first_token % block_tokens */
    uint32_t n_tokens;       /* > 0 */
} kvs_cuda_copy_desc;

typedef struct kvs_cuda_packed {
    uint32_t n_copies;   /* copies with tokens; descs[0..n_copies) */
    uint64_t n_tokens;   /* their summed tokens; the launch moves n_parts * n_tokens token rows */
    uint64_t ids_offset; /* byte offset of the id array in the block */
    uint64_t n_ids;
    uint64_t bytes;      /* bytes of the block in use: copy this many to the device */
    uint64_t align_bits; /* OR of every payload row address the launch touches */
} kvs_cuda_packed;

/* Map a payload pointer (host memory registered with the device) to the address the kernel uses,
 * checking that [host, host + bytes) lies in memory the device can reach. */
typedef kvs_status (*kvs_cuda_translate_fn)(void *ctx, const void *host, uint64_t bytes,
                                            uint64_t *device, char *err, size_t err_len);

/* Bytes a descriptor block needs for max_copies copies and max_ids block ids. */
uint64_t kvs_cuda_desc_block_bytes(uint32_t max_copies, uint64_t max_ids);

/* Pack checked copies (kvs_cuda_check_copies) into block[0..block_bytes), translating payload
 * addresses with translate(ctx, ...) (NULL: use the host address as is). KVS_EOVERFLOW if the block
 * is too small. */
kvs_status kvs_cuda_pack(const kvs_cuda_layer *layer, const kvs_dev_copy *copies, uint64_t n,
                         kvs_cuda_translate_fn translate, void *ctx, void *block,
                         uint64_t block_bytes, kvs_cuda_packed *out, char *err, size_t err_len);

/* The copy of a launch that holds token `token` (0 <= token < the launch's n_tokens): the last
 * copy whose row_begin <= token. */
KVS_CUDA_HD static inline uint32_t kvs_cuda_find_copy(const kvs_cuda_copy_desc *descs,
                                                      uint32_t n_copies, uint64_t token) {
    uint32_t lo = 0, hi = n_copies - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (descs[mid].row_begin <= token)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Token row `row` of a launch: rows [0, n_tokens) are the K rows of the copies in order, rows
 * [n_tokens, 2 n_tokens) their V rows. *page gets the address of the row's head 0 in the pages
 * (head h is at *page + h * head_stride), *payload the address of its n_heads * head_bytes payload
 * bytes. All arithmetic is 64-bit. */
KVS_CUDA_HD static inline void kvs_cuda_locate_row(const kvs_cuda_layer *layer,
                                                   const kvs_cuda_copy_desc *descs,
                                                   uint32_t n_copies, const uint32_t *ids,
                                                   uint64_t n_tokens, uint64_t row, uint64_t *page,
                                                   uint64_t *payload) {
    const uint32_t part = row >= n_tokens ? 1u : 0u;
    const uint64_t token = part ? row - n_tokens : row;
    const kvs_cuda_copy_desc *d = &descs[kvs_cuda_find_copy(descs, n_copies, token)];
    const uint64_t t = token - d->row_begin; /* token within the copy */
    const uint64_t position = (uint64_t)d->first_in_block + t;
    const uint64_t index = position / layer->block_tokens; /* block within the copy's ids */
    const uint64_t in_block = position - index * layer->block_tokens;
    const uint64_t block = ids[d->ids_offset + index];
    /* A select, not part_base[part]: a dynamic index would put the layer on the GPU's stack. */
    *page = (part ? layer->part_base[1] : layer->part_base[0]) +
            block * (uint64_t)layer->block_stride + in_block * (uint64_t)layer->token_stride;
    *payload =
        (part ? d->v_payload : d->k_payload) + t * ((uint64_t)layer->n_heads * layer->head_bytes);
}

/* --- contiguous runs for the copy engines --------------------------------------------------------- */

/* Parallel arrays in the shape cudaMemcpyBatchAsync takes. Caller-owned, cap entries each. */
typedef struct kvs_cuda_runs {
    void **dst;
    const void **src;
    size_t *bytes;
    uint64_t n;
    uint64_t cap;
} kvs_cuda_runs;

/* Cut checked copies of a layer whose tokens are contiguous (kvs_cuda_run_bytes > 0) into runs:
 * one per (copy, part, block touched), partial at the copy's first and last block, with runs that
 * continue each other on both sides merged. to_pages: payload (host address) -> pages, else pages
 * -> payload. Sets runs->n. KVS_EINVAL if the layout has no runs, KVS_EOVERFLOW past cap. */
kvs_status kvs_cuda_plan_runs(const kvs_cuda_layer *layer, const kvs_dev_copy *copies, uint64_t n,
                              int to_pages, kvs_cuda_runs *runs, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
