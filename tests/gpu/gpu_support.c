/* gpu_support.c - see gpu_support.h. */
#include "gpu_support.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef KVS_TEST_CUDA_MODULE
#define KVS_TEST_CUDA_MODULE "build/lib/" KVS_DEVICE_CUDA_MODULE
#endif

void gpu_require_device(const char *test_name) {
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        printf("%s: skipped: no usable CUDA device (cudaGetDeviceCount: %s, %s)\n", test_name,
               cudaGetErrorName(rc), cudaGetErrorString(rc));
        exit(GPU_TEST_SKIP);
    }
    if (count == 0) {
        printf("%s: skipped: cudaGetDeviceCount found no CUDA device\n", test_name);
        exit(GPU_TEST_SKIP);
    }
}

const kvs_device_ops *gpu_load_module(void) {
    void *so = dlopen(KVS_TEST_CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "dlopen %s: %s\n", KVS_TEST_CUDA_MODULE, dlerror());
        exit(1);
    }
    kvs_device_entry_fn entry = NULL;
    /* dlsym returns an object pointer; POSIX guarantees it holds the function address. */
    *(void **)(&entry) = dlsym(so, KVS_DEVICE_ENTRY_SYMBOL);
    const kvs_device_ops *ops = entry ? entry(KVS_DEVICE_ABI_VERSION) : NULL;
    if (!ops || entry(KVS_DEVICE_ABI_VERSION + 1) != NULL) {
        fprintf(stderr, "%s: %s\n", KVS_TEST_CUDA_MODULE,
                !entry ? "no " KVS_DEVICE_ENTRY_SYMBOL
                : !ops ? "refuses the device ABI version"
                       : "accepts an unknown ABI version");
        exit(1);
    }
    return ops; /* the module stays loaded for the process (it is built -z nodelete anyway) */
}

cudaError_t gpu_wait_stream(cudaStream_t stream, unsigned timeout_ms) {
    struct timespec start, now, pause = {0, 200000};
    if (clock_gettime(CLOCK_MONOTONIC, &start) != 0) return cudaErrorUnknown;
    for (;;) {
        cudaError_t rc = cudaStreamQuery(stream);
        if (rc != cudaErrorNotReady) return rc;
        (void)cudaGetLastError(); /* NotReady is not an error to keep */
        if (clock_gettime(CLOCK_MONOTONIC, &now) != 0) return cudaErrorUnknown;
        long long ms =
            (long long)(now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (ms > (long long)timeout_ms) return cudaErrorTimeout;
        (void)nanosleep(&pause, NULL); /* a pause between polls: waking early is harmless */
    }
}
