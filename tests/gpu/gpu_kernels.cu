/* gpu_kernels.cu - the tests' own kernel: a plain byte copy that stands for an attention kernel
 * reading a layer's pages (see gpu_support.h). */
#include <cuda_runtime.h>
#include <stdint.h>

#include "gpu_support.h"

namespace {

__global__ void copy_bytes(unsigned char *dst, const unsigned char *src, size_t bytes) {
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += step)
        dst[i] = src[i];
}

__global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

} // namespace

extern "C" cudaError_t gpu_copy_kernel(void *dst, const void *src, size_t bytes,
                                       cudaStream_t stream) {
    size_t blocks = (bytes + 255) / 256;
    if (blocks > 1024) blocks = 1024;
    if (blocks == 0) blocks = 1;
    void *args[] = {&dst, &src, &bytes};
    return cudaLaunchKernel(reinterpret_cast<const void *>(&copy_bytes), dim3((unsigned)blocks),
                            dim3(256), args, 0, stream);
}

extern "C" cudaError_t gpu_spin_kernel(unsigned long long ns, cudaStream_t stream) {
    void *args[] = {&ns};
    return cudaLaunchKernel(reinterpret_cast<const void *>(&spin), dim3(1), dim3(1), args, 0,
                            stream);
}
