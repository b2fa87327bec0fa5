/*
 * peer_gpu_region.c - the lent region, whatever it is: a host region (a sealed memfd, mapped) or a
 * CUDA one (device memory of the lender's process, opened from its IPC handle through the CUDA
 * module, kernels/device.h). The tier's copies go through pg_region_read and pg_region_write: a
 * memcpy into or out of the mapping, or a device copy (cudaMemcpyDefault) that returns when done,
 * so a copy counted in flight (pg_begin_copy) has ended, on the GPU too, when its count drops.
 * The tier's lowest unit: its error and log helpers live here too.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/copy.h"
#include "common/log.h"
#include "kernels/device.h"
#include "peer_gpu_region.h"

void pg_set_error(pg_state *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_vfmt_tier(st->error, sizeof st->error, "peer_gpu", st->tier_name, fmt, ap);
    va_end(ap);
}

void pg_log(pg_state *st, int level, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (st->host && st->host->log) st->host->log(st->host->ctx, level, msg);
}

/* A sealed memfd of at least region_bytes, mapped shared. */
static kvs_status open_memfd(const kvs_lend_msg *m, int fd, uint8_t **base, char *why,
                             size_t why_len) {
    int seals = fcntl(fd, F_GET_SEALS);
    struct stat sb;
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        /* a file the lender could shrink under the mapping would fault the first copy past its end */
        snprintf(why, why_len, "the lender's region is not sealed against shrinking");
        return KVS_EIO;
    }
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < m->region_bytes) {
        /* again, now that it is sealed: it may have shrunk between the wire's look and the seal */
        snprintf(why, why_len, "the lender's region is smaller than it says");
        return KVS_EIO;
    }
    void *region = mmap(NULL, m->region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (region == MAP_FAILED) {
        snprintf(why, why_len, "mapping its region of %llu bytes: %s",
                 (unsigned long long)m->region_bytes, strerror(errno));
        return KVS_EIO;
    }
    madvise(region, m->region_bytes, MADV_DONTFORK); /* a child never holds lent memory */
    *base = region;
    return KVS_OK;
}

/* The CUDA module's memory table, loaded at the first CUDA region and kept till destroy. */
static kvs_status cuda_mem(pg_state *st, char *why, size_t why_len) {
    if (st->mem) return KVS_OK;
    char reason[512];
    void *dl = NULL;
    const kvs_device_ops *ops = kvs_device_cuda_load(&dl, reason, sizeof reason);
    if (!ops || !ops->mem) {
        snprintf(why, why_len, "its region is GPU memory and the CUDA module is not usable (%s)",
                 ops ? "it has no memory table" : reason);
        if (dl) dlclose(dl);
        return KVS_ENOTSUP;
    }
    st->module = dl;
    st->mem = ops->mem;
    return KVS_OK;
}

/* The local ordinal of the lender's GPU: the tier's device option when set, else the device whose
 * UUID the HELLO names (ordinals differ between processes: CUDA_VISIBLE_DEVICES, ordering). */
static kvs_status pick_device(pg_state *st, const kvs_lend_msg *m, int n, int *dev, char *why,
                              size_t why_len) {
    if (st->opt.device != UINT64_MAX) {
        *dev = (int)st->opt.device;
        if (*dev < n) return KVS_OK;
        snprintf(why, why_len, "device %d to open its region on, of %d here", *dev, n);
        return KVS_ECONFIG;
    }
    char err[512];
    for (int d = 0; d < n; d++) {
        uint8_t uuid[KVS_DEVICE_UUID_BYTES];
        if (st->mem->uuid(d, uuid, err, sizeof err) == KVS_OK &&
            !memcmp(uuid, m->uuid, sizeof uuid)) {
            *dev = d;
            return KVS_OK;
        }
    }
    snprintf(why, why_len,
             "its region is on a GPU this process does not see (the lender's cuda:%u); set the "
             "tier's device option to open it over peer access",
             m->device);
    return KVS_ECONFIG;
}

/* Host buffers objects passed down the chain leave the GPU through, one per thread that may pass
 * one (pg_take_slot under the lock, pg_empty_unit on the link thread): pinned where it can be. */
static kvs_status stage_buffers(pg_state *st) {
    char err[512];
    for (int k = 0; k < 2; k++) {
        void *p = NULL;
        st->evict_pinned[k] = st->mem->host_alloc(st->slot_bytes, &p, err, sizeof err) == KVS_OK;
        if (!st->evict_pinned[k]) p = malloc(st->slot_bytes);
        if (!p) return KVS_ENOMEM;
        st->evict_buf[k] = p;
    }
    return KVS_OK;
}

static void free_stage_buffers(pg_state *st) {
    for (int k = 0; k < 2; k++) {
        if (st->evict_pinned[k])
            st->mem->host_release(st->evict_buf[k]);
        else
            free(st->evict_buf[k]);
        st->evict_buf[k] = NULL;
        st->evict_pinned[k] = 0;
    }
}

static kvs_status open_cuda(pg_state *st, const kvs_lend_msg *m, uint8_t **base, int *device,
                            char *why, size_t why_len) {
    kvs_status rc = cuda_mem(st, why, why_len);
    if (rc != KVS_OK) return rc;
    int n = 0, dev = -1;
    char err[512];
    if (st->mem->count(&n, err, sizeof err) != KVS_OK) {
        snprintf(why, why_len, "its region is GPU memory and this process has no GPU (%s)", err);
        return KVS_ENOTSUP;
    }
    if ((rc = pick_device(st, m, n, &dev, why, why_len)) != KVS_OK) return rc;
    void *p = NULL;
    uint64_t span = 0;
    if ((rc = st->mem->open_handle(dev, m->ipc, &p, &span, err, sizeof err)) != KVS_OK) {
        snprintf(why, why_len, "opening its region (device %u of the lender) on device %d: %s",
                 m->device, dev, err);
        return rc;
    }
    if (span < m->region_bytes) {
        /* a copy past the allocation would fault the whole context, the engine's included */
        st->mem->close_handle(dev, p);
        snprintf(why, why_len, "its region is %llu bytes, not the %llu it says",
                 (unsigned long long)span, (unsigned long long)m->region_bytes);
        return KVS_EIO;
    }
    if (stage_buffers(st) != KVS_OK) {
        free_stage_buffers(st);
        st->mem->close_handle(dev, p);
        snprintf(why, why_len, "out of memory for its staging buffers");
        return KVS_ENOMEM;
    }
    *base = p;
    *device = dev;
    return KVS_OK;
}

kvs_status pg_region_open(pg_state *st, const kvs_lend_msg *m, int fd, uint8_t **base, int *device,
                          char *why, size_t why_len) {
    *base = NULL;
    *device = -1;
    if (m->region_kind == KVS_LEND_REGION_CUDA) return open_cuda(st, m, base, device, why, why_len);
    return open_memfd(m, fd, base, why, why_len);
}

void pg_region_close(pg_state *st, uint8_t *base, uint64_t bytes, uint32_t kind, int device) {
    if (!base) return;
    if (kind == KVS_LEND_REGION_CUDA) {
        st->mem->close_handle(device, base);
        free_stage_buffers(st);
    } else {
        munmap(base, bytes);
    }
}

void pg_region_unload(pg_state *st) {
    if (st->module) dlclose(st->module);
    st->module = NULL;
    st->mem = NULL;
}

/* Objects are chunks of KV, far larger than the cache: non-temporal stores, fenced before the
 * copy counts as ended. */
static void copy_bytes(void *dst, const void *src, uint64_t n) {
    if (n < KVS_COPY_STREAM_MIN) {
        memcpy(dst, src, n);
        return;
    }
    kvs_copy_streaming(dst, src, n);
    kvs_copy_fence();
}

/* One copy: a memcpy for a host region, a device copy for a CUDA one; the test hook first. */
static kvs_status region_copy(pg_state *st, uint32_t unit, void *dst, const void *src, uint64_t n,
                              const char *what) {
    if (st->copy_hook && st->copy_hook(st->copy_hook_ctx, unit)) {
        pg_set_error(st, "%s lent memory: the copy failed (the test's copy hook)", what);
        return KVS_EIO;
    }
    if (!n) return KVS_OK;
    if (st->region_kind != KVS_LEND_REGION_CUDA) {
        copy_bytes(dst, src, n);
        return KVS_OK;
    }
    char err[400];
    if (st->mem->copy(st->region_device, dst, src, n, err, sizeof err) == KVS_OK) return KVS_OK;
    pg_set_error(st, "%s lent GPU memory: %s", what, err);
    return KVS_EIO;
}

kvs_status pg_region_read(pg_state *st, uint32_t unit, void *dst, const uint8_t *src, uint64_t n) {
    return region_copy(st, unit, dst, src, n, "reading");
}

kvs_status pg_region_write(pg_state *st, uint32_t unit, uint8_t *dst, const void *src, uint64_t n) {
    return region_copy(st, unit, dst, src, n, "writing");
}

const void *pg_region_host_view(pg_state *st, const uint8_t *src, uint64_t len, int buf) {
    if (st->region_kind != KVS_LEND_REGION_CUDA) return src;
    char err[400];
    if (st->mem->copy(st->region_device, st->evict_buf[buf], src, len, err, sizeof err) == KVS_OK)
        return st->evict_buf[buf];
    pg_set_error(st, "reading lent GPU memory to pass an object down: %s", err);
    return NULL;
}
