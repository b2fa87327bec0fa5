/* codec_drop.h - the DROP codec's encoding and decoding (codec.h describes its layout); codec.c
 * dispatches to these. */
#ifndef KVS_CODEC_DROP_H
#define KVS_CODEC_DROP_H

#include "kernels/cpu/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

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
