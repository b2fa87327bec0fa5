/* kernels_cuda.h - the two ways the CUDA device moves one layer of a step between the engine's
 * pages and pinned host payload, both enqueued on a caller's stream and returning at once:
 *   - the copy kernel: one launch for every copy of the layer, reading a descriptor block
 *     (copy_plan.h) from device memory; any stride permutation, any element size;
 *   - the copy engines: a list of contiguous runs (kvs_cuda_plan_runs) as one
 *     cudaMemcpyBatchAsync, or one cudaMemcpyAsync per run where the batch call is refused.
 * The caller has made the layer's device current and checked the copies. Thread-safe: no state. */
#ifndef KVS_KERNELS_CUDA_H
#define KVS_KERNELS_CUDA_H

#include <cuda_runtime_api.h>

#include "copy_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One launch. descs and ids point at the device copy of a packed descriptor block; they, the pages
 * and the payload must stay valid until the stream has run the launch. */
typedef struct kvs_cuda_move {
    kvs_cuda_layer layer;            /* device addresses */
    const kvs_cuda_copy_desc *descs; /* device memory, n_copies entries */
    const uint32_t *ids;             /* device memory */
    uint32_t n_copies;               /* > 0 */
    uint64_t n_tokens;               /* summed tokens of the copies, > 0 */
    uint32_t unit_bytes;             /* 16, 8, 4, 2 or 1: see kvs_cuda_unit_bytes */
    int to_pages;                    /* 1: payload -> pages (load), 0: pages -> payload (save) */
} kvs_cuda_move;

/* Enqueue the copy kernel on `stream` with at most max_grid thread blocks (it loops over rows).
 * Returns the launch's error (cudaSuccess once enqueued). */
cudaError_t kvs_cuda_launch_move(const kvs_cuda_move *move, uint32_t max_grid, cudaStream_t stream);

/* Enqueue runs->n runs on the copy engines of `stream` (not the legacy NULL stream), sources read in
 * stream order. *use_batch selects cudaMemcpyBatchAsync; if the driver refuses it the runs are
 * issued one by one instead and *use_batch is cleared, so later calls skip the attempt. The run
 * arrays are read during the call only. */
cudaError_t kvs_cuda_issue_runs(const kvs_cuda_runs *runs, cudaStream_t stream, int *use_batch);

#ifdef __cplusplus
}
#endif

#endif
