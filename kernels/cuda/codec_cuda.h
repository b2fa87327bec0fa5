/* codec_cuda.h - the lossy codecs' decoding on a GPU (kernels/cpu/codec.h is the reference): one
 * launch decodes an encoded layer straight into the engine's pages, each element converted to the
 * cache dtype once, with the same fp32 operations as the host (q * s rounded, plus m rounded, then
 * the dtype's round-to-nearest-even), so both write the same bits. Encoding stays on the host: a
 * compress tier encodes objects it already holds in host memory. */
#ifndef KVS_CODEC_CUDA_H
#define KVS_CODEC_CUDA_H

#include <cuda_runtime_api.h>

#include "kernels/cpu/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kvs_codec_scatter_layer on `stream`: view's bases, span->block_ids and encoded are device
 * addresses (encoded may be mapped pinned host memory); everything must stay valid until the stream
 * has run the launch. The caller has checked the codec (kvs_codec_check) and the span. Returns the
 * launch's error (cudaSuccess once enqueued). */
cudaError_t kvs_cuda_codec_scatter_layer(const kvs_codec *c, const kvs_layer_view *view,
                                         const kvs_kv_shape *shape, uint32_t dtype,
                                         const kvs_token_span *span, const void *encoded,
                                         cudaStream_t stream);

/* The same for part of a chunk, as kvs_codec_scatter_rows: rows [first_row, first_row +
 * span->n_tokens) of a layer encoded over encoded_tokens tokens. cudaErrorInvalidValue (nothing
 * launched) if they do not fit. */
cudaError_t kvs_cuda_codec_scatter_rows(const kvs_codec *c, const kvs_layer_view *view,
                                        const kvs_kv_shape *shape, uint32_t dtype,
                                        const kvs_token_span *span, const void *encoded,
                                        uint32_t encoded_tokens, uint32_t first_row,
                                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
