/* kernels_cuda.cu - CUDA paged <-> payload moves (see kernels_cuda.h). */
#include "kernels_cuda.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

/* Threads per thread block. A block copies several token rows at once when a token row is
 * narrower than the block, so small rows (MLA, fp8) still keep every lane busy. */
constexpr unsigned kThreads = 256;
/* Enough blocks to fill any current GPU several times over; larger spans loop (grid stride). */
constexpr unsigned kMaxBlocks = 1u << 16;

struct move_params {
    char *parts[2]; /* k_base, v_base */
    char *payload;
    const uint32_t *block_ids;
    long long block_stride;
    long long token_stride;
    long long head_stride;
    unsigned long long first_token;
    unsigned long long n_rows; /* n_parts * n_tokens token rows */
    unsigned n_tokens;
    unsigned block_tokens;
    unsigned head_units;  /* head_bytes / sizeof(Unit) */
    unsigned token_units; /* n_heads * head_units */
};

/* One token row (one part, one token, every head) per threadIdx.y; threadIdx.x walks its units.
 * Unit is uint4 when every address and stride is 16-byte aligned, so each lane moves 16 bytes per
 * load and store. */
template <typename Unit, bool kToPages>
__global__ void __launch_bounds__(kThreads) move_rows(const move_params p) {
    const unsigned long long row_step = (unsigned long long)gridDim.x * blockDim.y;
    for (unsigned long long row = (unsigned long long)blockIdx.x * blockDim.y + threadIdx.y;
         row < p.n_rows; row += row_step) {
        const unsigned part = (unsigned)(row / p.n_tokens);
        const unsigned t = (unsigned)(row - (unsigned long long)part * p.n_tokens);
        const unsigned long long token = p.first_token + t;
        const unsigned long long table_index = token / p.block_tokens;
        const unsigned in_block = (unsigned)(token - table_index * p.block_tokens);
        const long long block = (long long)p.block_ids[table_index];
        char *page = p.parts[part] + block * p.block_stride + (long long)in_block * p.token_stride;
        Unit *payload = reinterpret_cast<Unit *>(p.payload) + row * p.token_units;
        for (unsigned i = threadIdx.x; i < p.token_units; i += blockDim.x) {
            const unsigned head = i / p.head_units;
            const unsigned unit = i - head * p.head_units;
            Unit *cell = reinterpret_cast<Unit *>(page + (long long)head * p.head_stride) + unit;
            if (kToPages)
                *cell = payload[i];
            else
                payload[i] = *cell;
        }
    }
}

template <typename Unit>
cudaError_t launch_rows(move_params p, unsigned head_bytes, unsigned n_heads, bool to_pages,
                        cudaStream_t stream) {
    p.head_units = head_bytes / (unsigned)sizeof(Unit);
    p.token_units = n_heads * p.head_units;
    /* x: lanes for one token row, a multiple of the warp size; y: token rows per block. */
    unsigned lanes = (p.token_units + 31u) / 32u * 32u;
    if (lanes > kThreads) lanes = kThreads;
    const unsigned rows_per_block = kThreads / lanes;
    unsigned long long blocks = (p.n_rows + rows_per_block - 1) / rows_per_block;
    if (blocks > kMaxBlocks) blocks = kMaxBlocks;
    const dim3 grid((unsigned)blocks), block(lanes, rows_per_block);
    if (to_pages)
        move_rows<Unit, true><<<grid, block, 0, stream>>>(p);
    else
        move_rows<Unit, false><<<grid, block, 0, stream>>>(p);
    return cudaGetLastError();
}

kvs_status move_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                      const kvs_token_span *span, const uint32_t *block_ids_dev, void *payload,
                      bool to_pages, cudaStream_t stream) {
    if (!view || !shape || !span) return KVS_EINVAL;
    if (span->n_tokens == 0) return KVS_OK;
    if (!block_ids_dev || !payload || !view->k_base || (shape->has_v && !view->v_base) ||
        shape->n_heads == 0 || shape->head_bytes == 0 || shape->block_tokens == 0 ||
        view->device_kind != KVS_DEVICE_CUDA)
        return KVS_EINVAL;

    move_params p = {};
    p.parts[0] = static_cast<char *>(view->k_base);
    p.parts[1] = static_cast<char *>(shape->has_v ? view->v_base : view->k_base);
    p.payload = static_cast<char *>(payload);
    p.block_ids = block_ids_dev;
    p.block_stride = view->block_stride;
    p.token_stride = view->token_stride;
    p.head_stride = view->head_stride;
    p.first_token = span->first_token;
    p.n_tokens = span->n_tokens;
    p.block_tokens = shape->block_tokens;
    p.n_rows = (unsigned long long)(shape->has_v ? 2 : 1) * span->n_tokens;

    /* The widest unit every address, stride and row length is a multiple of. */
    const uintptr_t bits = reinterpret_cast<uintptr_t>(view->k_base) |
                           reinterpret_cast<uintptr_t>(p.parts[1]) |
                           reinterpret_cast<uintptr_t>(payload) | (uintptr_t)view->block_stride |
                           (uintptr_t)view->token_stride | (uintptr_t)view->head_stride |
                           (uintptr_t)shape->head_bytes;
    cudaError_t rc;
    if ((bits & 15u) == 0)
        rc = launch_rows<uint4>(p, shape->head_bytes, shape->n_heads, to_pages, stream);
    else if ((bits & 7u) == 0)
        rc = launch_rows<uint2>(p, shape->head_bytes, shape->n_heads, to_pages, stream);
    else if ((bits & 3u) == 0)
        rc = launch_rows<uint32_t>(p, shape->head_bytes, shape->n_heads, to_pages, stream);
    else
        rc = launch_rows<uint8_t>(p, shape->head_bytes, shape->n_heads, to_pages, stream);
    return rc == cudaSuccess ? KVS_OK : KVS_EIO;
}

} // namespace

extern "C" kvs_status kvs_cuda_gather_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                            const kvs_token_span *span,
                                            const uint32_t *block_ids_dev, void *dst,
                                            cudaStream_t stream) {
    return move_layer(view, shape, span, block_ids_dev, dst, false, stream);
}

extern "C" kvs_status kvs_cuda_scatter_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                             const kvs_token_span *span,
                                             const uint32_t *block_ids_dev, const void *src,
                                             cudaStream_t stream) {
    /* Scatter only reads the payload; the shared mover takes one pointer type. */
    return move_layer(view, shape, span, block_ids_dev, const_cast<void *>(src), true, stream);
}
