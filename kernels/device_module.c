/* device_module.c - finding and loading the CUDA module (kernels/device.h): the connector's device
 * and the peer_gpu tier's CUDA regions both come from it, so libkvstrata.so never links CUDA. */
/* dladdr needs _GNU_SOURCE, which the build defines */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "kernels/device.h"

/* dir/name, when it fits */
static void *open_in(const char *dir, size_t dir_len, const char *name) {
    char path[4096];
    if (dir_len + strlen(name) + 2 > sizeof path) return NULL;
    snprintf(path, sizeof path, "%.*s/%s", (int)dir_len, dir, name);
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void *open_module(char *why, size_t why_len) {
    const char *forced = getenv("KVS_CUDA_MODULE");
    if (forced && forced[0]) {
        void *dl = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        if (!dl) {
            const char *e = dlerror();
            kvs_fmt(why, why_len, "KVS_CUDA_MODULE=%s: %s", forced, e ? e : "not loadable");
        }
        return dl;
    }
    void *dl = NULL;
    Dl_info self;
    /* beside the object this code is in: libkvstrata.so, or the program that links it statically */
    if (dladdr((void *)&kvs_device_cuda_load, &self) && self.dli_fname) {
        const char *slash = strrchr(self.dli_fname, '/');
        if (slash) {
            size_t dir = (size_t)(slash - self.dli_fname);
            dl = open_in(self.dli_fname, dir, KVS_DEVICE_CUDA_MODULE);
            /* a program in bin/ finds the module in ../lib (the build tree, an install) */
            char up[4096];
            if (!dl && dir + sizeof "/../lib" < sizeof up) {
                snprintf(up, sizeof up, "%.*s/../lib", (int)dir, self.dli_fname);
                dl = open_in(up, strlen(up), KVS_DEVICE_CUDA_MODULE);
            }
        }
    }
    if (!dl) dl = dlopen(KVS_DEVICE_CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        kvs_fmt(why, why_len, "%s", e ? e : "not found");
    }
    return dl;
}

const kvs_device_ops *kvs_device_cuda_load(void **dl, char *why, size_t why_len) {
    *dl = open_module(why, why_len);
    if (!*dl) return NULL;
    kvs_device_entry_fn entry;
    *(void **)&entry = dlsym(*dl, KVS_DEVICE_ENTRY_SYMBOL);
    const kvs_device_ops *ops = entry ? entry(KVS_DEVICE_ABI_VERSION) : NULL;
    if (!ops) {
        kvs_fmt(why, why_len,
                "%s does not offer device interface version %d (a module from "
                "another build?)",
                KVS_DEVICE_CUDA_MODULE, KVS_DEVICE_ABI_VERSION);
    }
    return ops;
}
