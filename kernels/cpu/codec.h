/* codec.h - lossy encodings of one layer's KV payload (kernels.h) and their decoding, fused into the
 * scatter into the engine's pages. The cpu/ versions are the reference; kernels/cuda/codec_cuda.h
 * has the same operations on a GPU. docs/compress.md describes the codecs and their error bounds.
 *
 * KIVI (2 or 4 bits, after KIVI: K per channel, V per token): asymmetric uniform quantisation in
 * groups. A K group is one channel of one head over k_group consecutive tokens; a V group is
 * v_group consecutive channels of one head of one token. Each group stores its minimum m and its
 * step s as fp16 (m rounded down, s rounded up, so the grid m + q*s, q = 0 .. 2^bits - 1, covers
 * the group); element x becomes q = round((x - m) / s).
 * INT8 (per token): symmetric, one fp16 step s = max|x| / 127 (rounded up) per head of a token;
 * q = round(x / s) in -127 .. 127.
 *
 * Error bound, every element: |x - x'| <= s/2 + ulp(dtype, max(|x|, |x'|)), where s is its group's
 * step (kvs_codec_step_bound bounds s from the group's range) and ulp the engine dtype's spacing at
 * that magnitude (the rounding of x' into the pages). A KIVI group whose values are all equal and
 * representable in fp16 decodes exactly, and so do values on a group's grid.
 *
 * Encoded layer (all little-endian, no padding):
 *   KIVI: K codes [n][heads][dim] packed LSB-first, bits each; K groups [ceil(n/k_group)][heads][dim]
 *         of (m, s) fp16; then, unless MLA, V codes the same shape and V groups
 *         [n][heads][ceil(dim/v_group)] of (m, s).
 *   INT8: K codes int8 [n][heads][dim]; K steps fp16 [n][heads]; then V the same.
 * Codes of one (token, head) row start on a byte (kvs_codec_check asks dim * bits % 8 == 0).
 *
 * DROP (token dropping, codec_drop.c): keeps k_group of a layer's n tokens exactly and leaves the
 * others out; only for engines that mask the positions left out (KVS_PLAN_CAP_MASK). Which tokens
 * stay is decided once per object (kvs_codec_drop_select) and recorded in every layer:
 *   DROP: kept mask, bit t (LSB-first) set for each kept token, kvs_codec_mask_bytes(n) bytes; K rows
 *         of the kept tokens in token order [kept][heads][head_bytes] as stored; then V the same.
 * Kept rows decode bit for bit; a dropped row decodes to zeros (it has no bound: the engine must
 * leave it out of attention). */
#ifndef KVS_CODEC_H
#define KVS_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "kernels/cpu/codec_drop.h"
#include "kernels/cpu/codec_types.h"
#include "kernels/cpu/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* KVS_OK if the codec can encode layers of this shape and dtype, else KVS_EINVAL and a sentence. */
kvs_status kvs_codec_check(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype, char *err,
                           size_t err_len);

/* Bytes of one encoded layer of n_tokens tokens. */
uint64_t kvs_codec_layer_bytes(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                               uint32_t n_tokens);

/* Encode one layer as kvs_codec_encode_layer does; a DROP codec keeps the tokens of kept_mask (NULL:
 * chosen from this layer's own K rows by kvs_codec_drop_select; it may point at `out`, chosen there
 * in place) and refuses values that are not finite, as the quantisers do. Other codecs ignore
 * kept_mask. */
kvs_status kvs_codec_encode_layer_kept(const kvs_codec *c, const kvs_kv_shape *shape,
                                       uint32_t dtype, uint32_t n_tokens, const void *k_rows,
                                       const void *v_rows, const uint8_t *kept_mask, void *out);

/* Encode one layer from its raw payload rows (k_rows, v_rows: [n_tokens][n_heads][head_bytes] of
 * dtype; v_rows ignored for MLA) into out (kvs_codec_layer_bytes of room). KVS_EINVAL if an element
 * is not finite or a group's range does not fit fp16 steps (the object is then kept raw), KVS_ENOMEM
 * without scratch (floats of the layer); out is undefined then. */
kvs_status kvs_codec_encode_layer(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                  uint32_t n_tokens, const void *k_rows, const void *v_rows,
                                  void *out);

/* Decode an encoded layer straight into the engine's pages (host device): the tokens of span, as
 * kvs_kernel_scatter_layer places raw rows, each element converted to dtype once. KVS_ENOMEM (no
 * page written) if its scratch (a few rows of floats) cannot be allocated. */
kvs_status kvs_codec_scatter_layer(const kvs_codec *c, const kvs_layer_view *view,
                                   const kvs_kv_shape *shape, uint32_t dtype,
                                   const kvs_token_span *span, const void *encoded);

/* The same for part of a chunk: rows [first_row, first_row + span->n_tokens) of a layer encoded over
 * encoded_tokens tokens land at span's tokens. KVS_EINVAL (no page written) if they do not fit. */
kvs_status kvs_codec_scatter_rows(const kvs_codec *c, const kvs_layer_view *view,
                                  const kvs_kv_shape *shape, uint32_t dtype,
                                  const kvs_token_span *span, const void *encoded,
                                  uint32_t encoded_tokens, uint32_t first_row);

/* Decode into contiguous rows (the raw payload's layout): tests and quality estimates. */
kvs_status kvs_codec_decode_layer(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                  uint32_t n_tokens, const void *encoded, void *k_rows,
                                  void *v_rows);

/* An upper bound of the step s of a group whose values span [lo, hi] (INT8: max|x| = max(|lo|,
 * |hi|)): s <= kvs_codec_step_bound. */
float kvs_codec_step_bound(const kvs_codec *c, float lo, float hi);

/* The dtype's spacing (ulp) at magnitude |x|: the rounding error of storing x' is at most half. */
float kvs_dtype_ulp(uint32_t dtype, float x);

/* What the codec does to one layer: encode it, decode it, and give the relative reconstruction
 * error ||x - x'|| / ||x|| of its K and of its V rows (0 for V under MLA, and for an all-zero
 * part). A compress tier samples a chunk's layers with this and maps the error to quality through a
 * curve measured once per model (kvs_ac_quality_from_error). KVS_EINVAL if the codec refuses the
 * data, KVS_ENOMEM without scratch. */
kvs_status kvs_codec_layer_error(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                 uint32_t n_tokens, const void *k_rows, const void *v_rows,
                                 double *rel_k, double *rel_v);

/* Bytes of an encoded layer over bytes of the raw one: the codec's rate for this shape. */
double kvs_codec_rate(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                      uint32_t n_tokens);

#ifdef __cplusplus
}
#endif

#endif
