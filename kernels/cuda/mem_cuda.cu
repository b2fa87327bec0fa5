/* mem_cuda.cu - the CUDA module's device memory table (kvs_device_mem_ops, kernels/device.h): what
 * the peer_gpu tier's lender and borrower use to lend a region of GPU memory over CUDA IPC
 * (docs/peer_gpu.md). No shared state: every call makes its device current for the call only
 * (the tier calls from the engine's threads, whose current device is the engine's), and copies on
 * a non-blocking stream the calling thread owns, one per device, created at its first copy and
 * kept for the thread's life, so a copy never waits for the engine's work on the legacy stream
 * nor for another thread's copies. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cuda/mem_cuda.h"

namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == KVS_DEVICE_IPC_HANDLE_BYTES,
              "the wire carries a 64-byte IPC handle");
static_assert(sizeof(cudaUUID_t) == KVS_DEVICE_UUID_BYTES, "a device UUID is 16 bytes");

constexpr int kStreamDevices = 64; /* per-thread streams for devices below this ordinal */
thread_local cudaStream_t t_streams[kStreamDevices];

kvs_status fail(int ordinal, cudaError_t rc, char *err, size_t err_len, const char *what) {
    kvs_fmt(err, err_len, "cuda:%d: %s: %s (%s)", ordinal, what, cudaGetErrorString(rc),
            cudaGetErrorName(rc));
    (void)cudaGetLastError();
    return rc == cudaErrorMemoryAllocation ? KVS_ENOMEM : KVS_EIO;
}

/* The calling thread on `ordinal` for one call; the destructor gives it back its own device. */
struct on_device {
    int previous = -1;
    int ordinal;
    cudaError_t rc;
    explicit on_device(int dev) : ordinal(dev) {
        if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
        rc = previous == ordinal ? cudaSuccess : cudaSetDevice(ordinal);
    }
    ~on_device() {
        if (previous >= 0 && previous != ordinal) (void)cudaSetDevice(previous);
    }
    kvs_status check(const char *op, char *err, size_t err_len) const {
        if (rc == cudaSuccess) return KVS_OK;
        char what[128];
        snprintf(what, sizeof what, "%s: cudaSetDevice", op);
        return fail(ordinal, rc, err, err_len, what);
    }
};

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

kvs_status mem_uuid(int ordinal, uint8_t *uuid, char *err, size_t err_len) {
    cudaDeviceProp prop;
    cudaError_t rc = cudaGetDeviceProperties(&prop, ordinal);
    if (rc != cudaSuccess) return fail(ordinal, rc, err, err_len, "cudaGetDeviceProperties");
    memcpy(uuid, &prop.uuid, sizeof prop.uuid);
    return KVS_OK;
}

kvs_status mem_alloc(int ordinal, uint64_t len, void **ptr, char *err, size_t err_len) {
    *ptr = nullptr;
    on_device on(ordinal);
    kvs_status st = on.check("alloc", err, err_len);
    if (st != KVS_OK) return st;
    cudaError_t rc = cudaMalloc(ptr, len);
    if (rc != cudaSuccess) {
        *ptr = nullptr;
        return fail(ordinal, rc, err, err_len, "cudaMalloc");
    }
    return KVS_OK;
}

void mem_release(int ordinal, void *ptr) {
    if (!ptr) return;
    on_device on(ordinal);
    if (on.rc == cudaSuccess) (void)cudaFree(ptr);
    (void)cudaGetLastError();
}

kvs_status mem_host_alloc(uint64_t len, void **ptr, char *err, size_t err_len) {
    *ptr = nullptr;
    cudaError_t rc = cudaHostAlloc(ptr, len, cudaHostAllocPortable);
    if (rc != cudaSuccess) {
        *ptr = nullptr;
        return fail(-1, rc, err, err_len, "cudaHostAlloc");
    }
    return KVS_OK;
}

void mem_host_release(void *ptr) {
    if (ptr) (void)cudaFreeHost(ptr);
    (void)cudaGetLastError();
}

kvs_status mem_export(int ordinal, void *ptr, uint8_t *handle, char *err, size_t err_len) {
    on_device on(ordinal);
    kvs_status st = on.check("export_handle", err, err_len);
    if (st != KVS_OK) return st;
    cudaIpcMemHandle_t h;
    cudaError_t rc = cudaIpcGetMemHandle(&h, ptr);
    if (rc != cudaSuccess) return fail(ordinal, rc, err, err_len, "cudaIpcGetMemHandle");
    memcpy(handle, &h, sizeof h);
    return KVS_OK;
}

/* The bytes of the allocation that contains p from p on (the driver's cuMemGetAddressRange). */
kvs_status allocation_span(int ordinal, void *p, uint64_t *len, char *err, size_t err_len) {
    /* looked up once, thread-safely (a function-local static) */
    static const PFN_cuMemGetAddressRange_v3020 range = [] {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                             &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            fn = nullptr;
        (void)cudaGetLastError();
        return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn);
    }();
    if (!range) {
        kvs_fmt(err, err_len, "cuda:%d: the driver has no cuMemGetAddressRange", ordinal);
        return KVS_ENOTSUP;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult cr = range(&base, &size, reinterpret_cast<CUdeviceptr>(p));
    if (cr != CUDA_SUCCESS) {
        kvs_fmt(err, err_len, "cuda:%d: cuMemGetAddressRange: CUresult %d", ordinal, (int)cr);
        return KVS_EIO;
    }
    *len = base + size - reinterpret_cast<CUdeviceptr>(p);
    return KVS_OK;
}

kvs_status mem_open(int ordinal, const uint8_t *handle, void **ptr, uint64_t *len, char *err,
                    size_t err_len) {
    *ptr = nullptr;
    *len = 0;
    on_device on(ordinal);
    kvs_status st = on.check("open_handle", err, err_len);
    if (st != KVS_OK) return st;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    void *p = nullptr;
    cudaError_t rc = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (rc != cudaSuccess) return fail(ordinal, rc, err, err_len, "cudaIpcOpenMemHandle");
    if ((st = allocation_span(ordinal, p, len, err, err_len)) != KVS_OK) {
        (void)cudaIpcCloseMemHandle(p);
        return st;
    }
    *ptr = p;
    return KVS_OK;
}

void mem_close(int ordinal, void *ptr) {
    if (!ptr) return;
    on_device on(ordinal);
    if (on.rc == cudaSuccess) (void)cudaIpcCloseMemHandle(ptr);
    (void)cudaGetLastError();
}

/* This thread's stream on the current device (ordinal): non-blocking, made at first use. */
cudaError_t thread_stream(int ordinal, cudaStream_t *s) {
    if (ordinal < 0 || ordinal >= kStreamDevices) {
        *s = cudaStreamPerThread; /* beyond the table: the per-thread default stream */
        return cudaSuccess;
    }
    if (!t_streams[ordinal]) {
        cudaError_t rc = cudaStreamCreateWithFlags(&t_streams[ordinal], cudaStreamNonBlocking);
        if (rc != cudaSuccess) return rc;
    }
    *s = t_streams[ordinal];
    return cudaSuccess;
}

kvs_status mem_copy(int ordinal, void *dst, const void *src, uint64_t len, char *err,
                    size_t err_len) {
    on_device on(ordinal);
    kvs_status st = on.check("copy", err, err_len);
    if (st != KVS_OK) return st;
    cudaStream_t s;
    cudaError_t rc = thread_stream(ordinal, &s);
    if (rc != cudaSuccess) return fail(ordinal, rc, err, err_len, "copy: cudaStreamCreate");
    if ((rc = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, s)) != cudaSuccess)
        return fail(ordinal, rc, err, err_len, "cudaMemcpyAsync");
    if ((rc = cudaStreamSynchronize(s)) != cudaSuccess)
        return fail(ordinal, rc, err, err_len, "copy: cudaStreamSynchronize");
    return KVS_OK;
}

kvs_status mem_fill(int ordinal, void *ptr, int byte, uint64_t len, char *err, size_t err_len) {
    on_device on(ordinal);
    kvs_status st = on.check("fill", err, err_len);
    if (st != KVS_OK) return st;
    cudaStream_t s;
    cudaError_t rc = thread_stream(ordinal, &s);
    if (rc != cudaSuccess) return fail(ordinal, rc, err, err_len, "fill: cudaStreamCreate");
    if ((rc = cudaMemsetAsync(ptr, byte, len, s)) != cudaSuccess)
        return fail(ordinal, rc, err, err_len, "cudaMemsetAsync");
    if ((rc = cudaStreamSynchronize(s)) != cudaSuccess)
        return fail(ordinal, rc, err, err_len, "fill: cudaStreamSynchronize");
    return KVS_OK;
}

} // namespace

const kvs_device_mem_ops kvs_cuda_mem_table = {
    mem_count,        /* count */
    mem_uuid,         /* uuid */
    mem_alloc,        /* alloc */
    mem_release,      /* release */
    mem_host_alloc,   /* host_alloc */
    mem_host_release, /* host_release */
    mem_export,       /* export_handle */
    mem_open,         /* open_handle */
    mem_close,        /* close_handle */
    mem_copy,         /* copy */
    mem_fill,         /* fill */
};
