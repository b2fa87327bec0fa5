/* mem_cuda.cu - the CUDA module's device memory table (kvs_device_mem_ops, kernels/device.h): what
 * the peer_gpu tier's lender and borrower use to lend a region of GPU memory over CUDA IPC
 * (docs/peer_gpu.md). Stateless: every call sets its device on the calling thread and copies on
 * that thread's own stream (cudaStreamPerThread), so callers on several threads never serialise
 * behind one another or behind the legacy stream. */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cuda/mem_cuda.h"

namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == KVS_DEVICE_IPC_HANDLE_BYTES,
              "the wire carries a 64-byte IPC handle");

kvs_status fail(int ordinal, cudaError_t rc, char *err, size_t err_len, const char *what) {
    kvs_fmt(err, err_len, "cuda:%d: %s: %s (%s)", ordinal, what, cudaGetErrorString(rc),
            cudaGetErrorName(rc));
    (void)cudaGetLastError();
    return rc == cudaErrorMemoryAllocation ? KVS_ENOMEM : KVS_EIO;
}

kvs_status on(int ordinal, const char *op, char *err, size_t err_len) {
    cudaError_t rc = cudaSetDevice(ordinal);
    if (rc == cudaSuccess) return KVS_OK;
    char what[128];
    snprintf(what, sizeof what, "%s: cudaSetDevice", op);
    return fail(ordinal, rc, err, err_len, what);
}

kvs_status mem_count(int *n, char *err, size_t err_len) {
    *n = 0;
    cudaError_t rc = cudaGetDeviceCount(n);
    if (rc != cudaSuccess || *n == 0) {
        *n = 0;
        if (rc == cudaSuccess) {
            kvs_fmt(err, err_len, "cuda: no device");
        } else {
            kvs_fmt(err, err_len, "cuda: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(rc),
                    cudaGetErrorName(rc));
            (void)cudaGetLastError();
        }
        return KVS_ENOTFOUND;
    }
    return KVS_OK;
}

kvs_status mem_alloc(int ordinal, uint64_t len, void **ptr, char *err, size_t err_len) {
    *ptr = nullptr;
    kvs_status st = on(ordinal, "alloc", err, err_len);
    if (st != KVS_OK) return st;
    cudaError_t rc = cudaMalloc(ptr, len);
    if (rc != cudaSuccess) {
        *ptr = nullptr;
        return fail(ordinal, rc, err, err_len, "cudaMalloc");
    }
    return KVS_OK;
}

void mem_release(int ordinal, void *ptr) {
    if (!ptr || cudaSetDevice(ordinal) != cudaSuccess) return;
    (void)cudaFree(ptr);
    (void)cudaGetLastError();
}

kvs_status mem_export(int ordinal, void *ptr, uint8_t *handle, char *err, size_t err_len) {
    kvs_status st = on(ordinal, "export_handle", err, err_len);
    if (st != KVS_OK) return st;
    cudaIpcMemHandle_t h;
    cudaError_t rc = cudaIpcGetMemHandle(&h, ptr);
    if (rc != cudaSuccess) return fail(ordinal, rc, err, err_len, "cudaIpcGetMemHandle");
    memcpy(handle, &h, sizeof h);
    return KVS_OK;
}

kvs_status mem_open(int ordinal, const uint8_t *handle, void **ptr, char *err, size_t err_len) {
    *ptr = nullptr;
    kvs_status st = on(ordinal, "open_handle", err, err_len);
    if (st != KVS_OK) return st;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    cudaError_t rc = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (rc != cudaSuccess) {
        *ptr = nullptr;
        return fail(ordinal, rc, err, err_len, "cudaIpcOpenMemHandle");
    }
    return KVS_OK;
}

void mem_close(int ordinal, void *ptr) {
    if (!ptr || cudaSetDevice(ordinal) != cudaSuccess) return;
    (void)cudaIpcCloseMemHandle(ptr);
    (void)cudaGetLastError();
}

kvs_status mem_copy(int ordinal, void *dst, const void *src, uint64_t len, char *err,
                    size_t err_len) {
    kvs_status st = on(ordinal, "copy", err, err_len);
    if (st != KVS_OK) return st;
    cudaError_t rc = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, cudaStreamPerThread);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(cudaStreamPerThread);
    return rc == cudaSuccess ? KVS_OK : fail(ordinal, rc, err, err_len, "cudaMemcpyAsync");
}

kvs_status mem_fill(int ordinal, void *ptr, int byte, uint64_t len, char *err, size_t err_len) {
    kvs_status st = on(ordinal, "fill", err, err_len);
    if (st != KVS_OK) return st;
    cudaError_t rc = cudaMemsetAsync(ptr, byte, len, cudaStreamPerThread);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(cudaStreamPerThread);
    return rc == cudaSuccess ? KVS_OK : fail(ordinal, rc, err, err_len, "cudaMemsetAsync");
}

} // namespace

const kvs_device_mem_ops kvs_cuda_mem_table = {
    mem_count,   /* count */
    mem_alloc,   /* alloc */
    mem_release, /* release */
    mem_export,  /* export_handle */
    mem_open,    /* open_handle */
    mem_close,   /* close_handle */
    mem_copy,    /* copy */
    mem_fill,    /* fill */
};
