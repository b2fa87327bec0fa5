/* gpu_support.h - helpers of the gpu-labelled tests: skip cleanly where no GPU is usable, load the
 * CUDA module the way the connector does, wait for a stream with a deadline, and a copy kernel
 * (gpu_kernels.cu) for graph tests. Tests run with CK_FORK=no: CUDA cannot be used in a child
 * forked after the parent initialised it. */
#ifndef KVS_GPU_SUPPORT_H
#define KVS_GPU_SUPPORT_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "kernels/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit code that CTest reads as "skipped" (SKIP_RETURN_CODE). */
#define GPU_TEST_SKIP 77

/* Exit with GPU_TEST_SKIP, after printing why, unless cudaGetDeviceCount finds a device. */
void gpu_require_device(const char *test_name);

/* dlopen the CUDA module (KVS_TEST_CUDA_MODULE) and return its table for KVS_DEVICE_ABI_VERSION;
 * exits 1 with the reason on failure (call it from main, before the suite runs). */
const kvs_device_ops *gpu_load_module(void);

/* cudaStreamSynchronize with a deadline: cudaErrorTimeout if the stream is not done after
 * timeout_ms (a hang shows as a failure, not as a test killed by CTest). */
cudaError_t gpu_wait_stream(cudaStream_t stream, unsigned timeout_ms);

/* Enqueue a kernel (not a memcpy) copying bytes from src to dst, device memory, on stream. */
cudaError_t gpu_copy_kernel(void *dst, const void *src, size_t bytes, cudaStream_t stream);
/* Enqueue a one-thread kernel that spins for about `ns` nanoseconds of GPU time: keeps a stream busy
 * so that work ordered after it but wrongly not waiting for it runs first and shows. */
cudaError_t gpu_spin_kernel(unsigned long long ns, cudaStream_t stream);

#define GPU_CHECK(call)                                                                          \
    do {                                                                                         \
        cudaError_t gpu_rc_ = (call);                                                            \
        ck_assert_msg(gpu_rc_ == cudaSuccess, "%s: %s (%s)", #call, cudaGetErrorString(gpu_rc_), \
                      cudaGetErrorName(gpu_rc_));                                                \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
