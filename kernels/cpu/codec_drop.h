/* codec_drop.h - the DROP codec (codec.h describes its layout): choosing the kept tokens, checking a
 * layer's mask, encoding and decoding; codec.c dispatches to these. */
#ifndef KVS_CODEC_DROP_H
#define KVS_CODEC_DROP_H

#include "abi/kvstrata.h"
#include "kernels/cpu/codec_types.h"
#include "kernels/cpu/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* DROP: which `keep` of n tokens a DROP object keeps, chosen from one layer's K rows (k_rows, the raw
 * payload's layout) and used for every layer: those whose keys have the largest L2 norm summed over
 * heads, the earlier on a tie (a non-finite key ranks last). On the trained mini model this keeps
 * more of the predictions than the smallest-norm rule of Devoto et al. 2024 (docs/compress.md has
 * the figures). mask gets kvs_codec_mask_bytes(n) bytes, bit t set for a kept token. */
void kvs_codec_drop_select(const kvs_kv_shape *shape, uint32_t dtype, uint32_t n,
                           const void *k_rows, uint32_t keep, uint8_t *mask);

/* What a reader checks of an encoded layer beyond its checksum: a DROP layer's mask keeps exactly
 * k_group tokens, none past n_tokens (KVS_ECORRUPT otherwise). Every other codec: KVS_OK. */
kvs_status kvs_codec_check_layer(const kvs_codec *c, uint32_t n_tokens, const void *encoded);

/* A DROP layer's kept mask (the first bytes of the layer); NULL for every other codec. */
static inline const uint8_t *kvs_codec_kept_mask(const kvs_codec *c, const void *encoded) {
    return c->kind == KVS_CODEC_DROP ? (const uint8_t *)encoded : NULL;
}

/* The DROP layer of the tokens in kept_mask (NULL: kvs_codec_drop_select over k_rows; it may be
 * `out` itself, chosen there already). KVS_EINVAL if an element is not finite or the mask does not
 * keep exactly min(k_group, n_tokens) tokens. */
kvs_status kvs_codec_drop_encode(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                 uint32_t n_tokens, const void *k_rows, const void *v_rows,
                                 const uint8_t *kept_mask, void *out);

/* Rows [first_row, first_row + span->n_tokens) of a DROP layer over encoded_tokens tokens into the
 * pages at span's tokens: kept rows copied as stored, dropped rows zeroed. The caller has checked the
 * range. Always KVS_OK (no scratch). */
kvs_status kvs_codec_drop_scatter_rows(const kvs_codec *c, const kvs_layer_view *view,
                                       const kvs_kv_shape *shape, uint32_t dtype,
                                       const kvs_token_span *span, const void *encoded,
                                       uint32_t encoded_tokens, uint32_t first_row);

#ifdef __cplusplus
}
#endif

#endif
