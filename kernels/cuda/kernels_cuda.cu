/* kernels_cuda.cu - the copy kernel and the copy-engine issue of the CUDA device (see
 * kernels_cuda.h). */
#include "kernels_cuda.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

namespace {

/* Threads per thread block. A block moves several token rows at once when a row is narrower than
 * the block, so small rows (MLA latents, fp8) still keep every lane busy. */
constexpr unsigned kThreads = 256;

/* One token row (one part of one token: n_heads heads) per threadIdx.y; threadIdx.x walks the
 * row's units. Rows are visited in launch order (the copies' K rows, then their V rows), so
 * neighbouring thread blocks touch neighbouring tokens of one block and the payload is read or
 * written front to back. Unit is the widest type every address of the launch is aligned to. */
template <typename Unit, bool kToPages>
__global__ void __launch_bounds__(kThreads) move_rows(const kvs_cuda_move m) {
    const kvs_cuda_layer layer = m.layer;
    const uint64_t n_rows = m.n_tokens * layer.n_parts;
    const uint32_t head_units = layer.head_bytes / (uint32_t)sizeof(Unit);
    const uint32_t row_units = head_units * layer.n_heads;
    const uint64_t row_step = (uint64_t)gridDim.x * blockDim.y;
    for (uint64_t row = (uint64_t)blockIdx.x * blockDim.y + threadIdx.y; row < n_rows;
         row += row_step) {
        uint64_t page = 0, payload = 0;
        kvs_cuda_locate_row(&layer, m.descs, m.n_copies, m.ids, m.n_tokens, row, &page, &payload);
        Unit *row_payload = reinterpret_cast<Unit *>(static_cast<uintptr_t>(payload));
        if (layer.heads_contiguous) {
            /* The row is one run in the pages too. */
            Unit *row_page = reinterpret_cast<Unit *>(static_cast<uintptr_t>(page));
            for (uint32_t i = threadIdx.x; i < row_units; i += blockDim.x) {
                if (kToPages)
                    row_page[i] = row_payload[i];
                else
                    row_payload[i] = row_page[i];
            }
        } else {
            for (uint32_t i = threadIdx.x; i < row_units; i += blockDim.x) {
                const uint32_t head = i / head_units;
                const uint32_t unit = i - head * head_units;
                Unit *cell = reinterpret_cast<Unit *>(static_cast<uintptr_t>(
                                 page + (uint64_t)head * (uint64_t)layer.head_stride)) +
                             unit;
                if (kToPages)
                    *cell = row_payload[i];
                else
                    row_payload[i] = *cell;
            }
        }
    }
}

template <typename Unit>
cudaError_t launch(const kvs_cuda_move *move, uint32_t max_grid, cudaStream_t stream) {
    const uint32_t row_units =
        move->layer.head_bytes / (uint32_t)sizeof(Unit) * move->layer.n_heads;
    /* x: lanes for one row, whole warps so a warp never straddles two rows; y: rows per block. */
    uint32_t lanes = (row_units + 31u) / 32u * 32u;
    if (lanes > kThreads) lanes = kThreads;
    const uint32_t rows_per_block = kThreads / lanes;
    const uint64_t n_rows = move->n_tokens * move->layer.n_parts;
    uint64_t blocks = (n_rows + rows_per_block - 1) / rows_per_block;
    if (blocks > max_grid) blocks = max_grid;
    if (blocks == 0) blocks = 1;
    const dim3 grid((unsigned)blocks), block(lanes, rows_per_block);
    kvs_cuda_move args = *move;
    void *params[] = {&args};
    const void *kernel = move->to_pages ? reinterpret_cast<const void *>(&move_rows<Unit, true>)
                                        : reinterpret_cast<const void *>(&move_rows<Unit, false>);
    /* cudaLaunchKernel returns this launch's own error, so a stale error the engine left in the
     * thread's last-error slot is neither taken nor blamed on us. */
    return cudaLaunchKernel(kernel, grid, block, params, 0, stream);
}

/* Errors that mean "this driver does not do batched copies", as opposed to a failed device. */
bool batch_refused(cudaError_t rc) {
    return rc == cudaErrorNotSupported || rc == cudaErrorInvalidValue ||
           rc == cudaErrorCallRequiresNewerDriver || rc == cudaErrorNotYetImplemented;
}

} // namespace

extern "C" cudaError_t kvs_cuda_launch_move(const kvs_cuda_move *move, uint32_t max_grid,
                                            cudaStream_t stream) {
    if (!move || move->n_copies == 0 || move->n_tokens == 0) return cudaSuccess;
    if (max_grid == 0) max_grid = 1;
    switch (move->unit_bytes) {
        case 16: return launch<uint4>(move, max_grid, stream);
        case 8: return launch<uint2>(move, max_grid, stream);
        case 4: return launch<uint32_t>(move, max_grid, stream);
        case 2: return launch<uint16_t>(move, max_grid, stream);
        case 1: return launch<uint8_t>(move, max_grid, stream);
        default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t kvs_cuda_issue_runs(const kvs_cuda_runs *runs, cudaStream_t stream,
                                           int *use_batch) {
    if (runs->n == 0) return cudaSuccess;
    if (*use_batch) {
        cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof attr);
        /* The sources are pages the engine's stream wrote (save) or payload the host filled before
         * the call (load): both must be read in stream order, after the waits before them. */
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t first_index = 0;
        cudaError_t rc = cudaMemcpyBatchAsync(runs->dst, runs->src, runs->bytes, (size_t)runs->n,
                                              &attr, &first_index, 1, stream);
        if (rc == cudaSuccess || !batch_refused(rc)) return rc;
        (void)cudaGetLastError(); /* the refusal is handled: do not leave it for the next caller */
        *use_batch = 0;
    }
    for (uint64_t i = 0; i < runs->n; i++) {
        cudaError_t rc =
            cudaMemcpyAsync(runs->dst[i], runs->src[i], runs->bytes[i], cudaMemcpyDefault, stream);
        if (rc != cudaSuccess) return rc;
    }
    return cudaSuccess;
}
