/* calibrate.h - the measurement behind KVS_DEV_COPY_AUTO: at open, the copy kernel and the copy
 * engines each move a scratch layer shaped like the engine's (same heads, head bytes, block tokens,
 * run size and address alignment; blocks in reverse order so runs cannot merge) in both directions,
 * timed with CUDA events. The engine's own pages are never touched: the scratch pages and payload
 * are allocated here and freed before returning. Called from open only, on the device's own idle
 * streams, with the device current. */
#ifndef KVS_CALIBRATE_H
#define KVS_CALIBRATE_H

#include <cuda_runtime_api.h>

#include "copy_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_cuda_calibration {
    double kernel_gbps[2]; /* [0] load (host -> pages), [1] save (pages -> host); 0: not measured */
    double dma_gbps[2];
    uint64_t bytes;  /* bytes one measured pass moves */
    uint32_t tokens; /* tokens of the scratch layer */
    uint32_t copies; /* copies it is split into */
    uint64_t runs;   /* contiguous runs per pass (copy engines) */
} kvs_cuda_calibration;

/* Measure both methods for a layer shaped like `engine` (which must have contiguous runs:
 * kvs_cuda_run_bytes > 0). At most max_tokens tokens (capped at 4096 and at 64 MiB of payload) in
 * at most max_copies copies. *use_batch is as for kvs_cuda_issue_runs. On failure (no memory for
 * the scratch buffers, a CUDA error) returns KVS_ENOMEM or KVS_EIO with a sentence; the caller then
 * keeps the kernel. */
kvs_status kvs_cuda_calibrate(const kvs_cuda_layer *engine, uint32_t max_tokens,
                              uint32_t max_copies, uint32_t max_grid, cudaStream_t load_stream,
                              cudaStream_t save_stream, int *use_batch, kvs_cuda_calibration *out,
                              char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
