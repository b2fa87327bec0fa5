/* kernels_cuda.h - CUDA versions of the paged <-> payload moves of kernels.h, with the same
 * meaning: the same view strides, shape, token span and payload layout (K rows [n_tokens][n_heads]
 * [head_bytes], then V rows unless MLA).
 *
 * Both calls enqueue one kernel launch on `stream` for the whole span of one layer and return at
 * once; the copy is done when the stream reaches it. The caller has made view->device_index the
 * current device and has checked view and span with kvs_kernel_check_view / kvs_kernel_check_span
 * (on the host copy of the block table). block_ids_dev is a device-readable copy of
 * span->block_ids (span->block_ids itself is not read and may be NULL); it, the pages and the
 * payload must stay valid until the stream has run the copy. The payload may be device memory or
 * pinned host memory the device can address. Thread-safe: no state besides the stream. */
#ifndef KVS_KERNELS_CUDA_H
#define KVS_KERNELS_CUDA_H

#include <cuda_runtime_api.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Paged -> payload. dst holds kvs_kernel_layer_bytes(shape, span->n_tokens). Returns KVS_OK
 * (nothing is launched for 0 tokens), KVS_EINVAL for a null pointer, a zero shape field or a view
 * that is not on a CUDA device, KVS_EIO if the launch failed. */
kvs_status kvs_cuda_gather_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                 const kvs_token_span *span, const uint32_t *block_ids_dev,
                                 void *dst, cudaStream_t stream);
/* Payload -> paged; returns as kvs_cuda_gather_layer. */
kvs_status kvs_cuda_scatter_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                  const kvs_token_span *span, const uint32_t *block_ids_dev,
                                  const void *src, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
