/* device_cuda.cu - the CUDA device of kernels/device.h, built as the module libkvstrata-cuda.so.1
 * whose only exported symbol is kvs_device_entry.
 *
 * Streams and events (ordering model of device.h):
 *   load stream   non-blocking; load_layer(l) enqueues the scatter of layer l and records loaded[l].
 *                 The first load_layer of a step first waits for the engine stream (engine_ready),
 *                 so a load never overwrites pages the engine's previous work still reads.
 *   save stream   non-blocking; save_layer(l) records engine_wrote[l] on the engine stream, waits
 *                 for it, then enqueues the gather of layer l.
 *   engine stream borrowed (set_stream); wait_layer(l) makes it wait for loaded[l], as an external
 *                 event node when it is being captured into a CUDA graph. The host never blocks.
 * Kernel copies read a per-launch descriptor block from device memory. The host packs it into
 * pinned staging and enqueues the staging -> device copy ahead of the kernel on the same stream, so
 * the staging must live until that copy has run: each (direction, layer) owns two staging slots,
 * used alternately, and a slot's event says when its last copy ran. Because start_load enqueues
 * every layer before any has run, one slot per layer is the minimum; the second lets the next step
 * pack while the previous step's copy of the same layer is still queued. The device-side block is
 * rewritten only by a later copy on the same stream, hence after the kernel that reads it.
 * All calls come from the thread that drives the worker handle (device.h); nothing here is shared
 * between devices, and the module has no threads of its own. */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_backend.h" /* KVS_LOG_* */
#include "calibrate.h"
#include "common/log.h"
#include "copy_plan.h"
#include "kernels/device.h"
#include "kernels_cuda.h"
#include "mem_cuda.h"

namespace {

enum { LOAD = 0, SAVE = 1 };
constexpr uint32_t kSlotsPerLayer = 2;
/* Copy-kernel thread blocks per SM: enough loads in flight to saturate PCIe from zero-copy reads,
 * while leaving most of each SM to the engine's kernels running beside the copy. */
constexpr uint32_t kGridPerSm = 4;
/* AUTO takes the copy engines unless the kernel is more than this much faster: copy engines leave
 * every SM to the engine, which a bandwidth figure alone does not show. */
constexpr double kDmaPreference = 0.90;

struct desc_slot {
    unsigned char *host;   /* pinned staging, packed by the host */
    unsigned char *device; /* device copy read by the kernel */
    cudaEvent_t copied;    /* recorded after the staging -> device copy */
    bool recorded;         /* copied has been recorded at least once */
};

struct direction {
    const char *op; /* "load_layer" or "save_layer", for sentences */
    cudaStream_t stream;
    int use_dma;
    desc_slot *slots;     /* n_layers * kSlotsPerLayer */
    uint8_t *next_slot;   /* per layer: the slot its next kernel copy packs into */
    long long last_layer; /* last layer enqueued, -1 before any: names the culprit in sync errors */
};

/* Host memory the device can reach: [base, base + len) maps to device addresses from device. */
struct host_range {
    uintptr_t base;
    uint64_t len;
    uint64_t device;
    bool owned; /* registered by register_host, so unregistered at close */
};

struct cuda_device {
    int ordinal;
    int log_level;
    uint32_t n_layers;
    kvs_kv_shape shape;
    kvs_cuda_layer *layers; /* per layer, device addresses */
    uint32_t max_copies;
    uint32_t max_tokens;
    uint64_t slot_bytes;
    uint32_t max_grid;
    int use_batch; /* cudaMemcpyBatchAsync accepted so far */
    cudaStream_t engine;
    cudaEvent_t engine_ready;  /* engine stream position a step's loads wait for */
    cudaEvent_t *loaded;       /* per layer: its loads of the step are done */
    cudaEvent_t *engine_wrote; /* per layer: the engine stream position save_layer waits for */
    bool load_fenced;          /* this step's loads already wait for the engine stream */
    long long last_load_layer;
    direction dir[2];
    unsigned char *staging;     /* pinned: every slot's host side */
    unsigned char *slot_memory; /* device: every slot's device side */
    kvs_cuda_runs runs;         /* host scratch for the copy engines */
    host_range *ranges;
    size_t n_ranges;
    size_t cap_ranges;
    char name[128];
};

void log_line(int threshold, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Same line format as the connector's kvs_log, which this module cannot call. */
void log_line(int threshold, int level, const char *fmt, ...) {
    if (level > threshold) return;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvstrata[%s]: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], line);
}

/* A failed CUDA call as a status and a sentence: "cuda:0: load_layer(3): launching the copy
 * kernel: an illegal memory access was encountered (cudaErrorIllegalAddress)". Clears the
 * thread's last error so it is not reported twice. */
kvs_status cuda_fail(int ordinal, cudaError_t rc, char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

kvs_status cuda_fail(int ordinal, cudaError_t rc, char *err, size_t err_len, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    kvs_fmt(err, err_len, "cuda:%d: %s: %s (%s)", ordinal, what, cudaGetErrorString(rc),
            cudaGetErrorName(rc));
    (void)cudaGetLastError();
    return rc == cudaErrorMemoryAllocation ? KVS_ENOMEM : KVS_EIO;
}

/* Every entry point starts here: the engine may call from any of its threads, and the calling
 * thread's current device may be another one. The device is left current (the engine thread
 * driving this handle works on it anyway). */
kvs_status enter(const cuda_device *d, const char *op, char *err, size_t err_len) {
    cudaError_t rc = cudaSetDevice(d->ordinal);
    if (rc != cudaSuccess) return cuda_fail(d->ordinal, rc, err, err_len, "%s: cudaSetDevice", op);
    return KVS_OK;
}

/* --- host memory ----------------------------------------------------------------------------- */

kvs_status add_range(cuda_device *d, uintptr_t base, uint64_t len, uint64_t device, bool owned,
                     char *err, size_t err_len) {
    if (d->n_ranges == d->cap_ranges) {
        size_t cap = d->cap_ranges ? 2 * d->cap_ranges : 8;
        host_range *grown = static_cast<host_range *>(realloc(d->ranges, cap * sizeof *grown));
        if (!grown) {
            kvs_fmt(err, err_len, "cuda:%d: register_host: out of memory", d->ordinal);
            return KVS_ENOMEM;
        }
        d->ranges = grown;
        d->cap_ranges = cap;
    }
    d->ranges[d->n_ranges++] = host_range{base, len, device, owned};
    return KVS_OK;
}

const host_range *find_range(const cuda_device *d, uintptr_t at, uint64_t bytes) {
    for (size_t i = 0; i < d->n_ranges; i++) {
        const host_range *r = &d->ranges[i];
        if (at >= r->base && bytes <= r->len && at - r->base <= r->len - bytes) return r;
    }
    return nullptr;
}

/* The address the kernel uses for payload [host, host + bytes): from a range registered here, or
 * else whatever CUDA knows of the pointer (memory pinned or registered by someone else, device
 * memory of this device). Pageable memory is refused: a kernel touching it faults the context. */
kvs_status translate(void *ctx, const void *host, uint64_t bytes, uint64_t *device, char *err,
                     size_t err_len) {
    cuda_device *d = static_cast<cuda_device *>(ctx);
    const uintptr_t at = reinterpret_cast<uintptr_t>(host);
    if (const host_range *r = find_range(d, at, bytes)) {
        *device = r->device + (at - r->base);
        return KVS_OK;
    }
    cudaPointerAttributes first, last;
    cudaError_t rc = cudaPointerGetAttributes(&first, host);
    if (rc == cudaSuccess)
        rc = cudaPointerGetAttributes(&last,
                                      static_cast<const char *>(host) + (bytes ? bytes - 1 : 0));
    if (rc != cudaSuccess)
        return cuda_fail(d->ordinal, rc, err, err_len, "payload %p: cudaPointerGetAttributes",
                         host);
    const bool reachable =
        first.type != cudaMemoryTypeUnregistered && first.devicePointer &&
        last.type == first.type && last.devicePointer &&
        static_cast<const char *>(last.devicePointer) ==
            static_cast<const char *>(first.devicePointer) + (bytes ? bytes - 1 : 0) &&
        (first.type != cudaMemoryTypeDevice || first.device == d->ordinal);
    if (!reachable) {
        kvs_fmt(
            err, err_len,
            "cuda:%d: payload %p (%llu bytes) is neither host memory registered with register_host "
            "nor memory of this device",
            d->ordinal, host, (unsigned long long)bytes);
        return KVS_EINVAL;
    }
    *device = (uint64_t) reinterpret_cast<uintptr_t>(first.devicePointer);
    return KVS_OK;
}

/* --- open / close ---------------------------------------------------------------------------- */

void destroy(cuda_device *d) {
    if (!d) return;
    /* Nothing may still read the buffers below; errors here were reported by sync already. */
    if (d->dir[LOAD].stream) (void)cudaStreamSynchronize(d->dir[LOAD].stream);
    if (d->dir[SAVE].stream) (void)cudaStreamSynchronize(d->dir[SAVE].stream);
    free(d->runs.bytes);
    free(d->runs.src);
    free(d->runs.dst);
    for (int k = SAVE; k >= LOAD; k--) {
        direction *dir = &d->dir[k];
        if (dir->slots)
            for (uint32_t i = 0; i < d->n_layers * kSlotsPerLayer; i++)
                if (dir->slots[i].copied) cudaEventDestroy(dir->slots[i].copied);
        free(dir->next_slot);
        free(dir->slots);
    }
    if (d->slot_memory) cudaFree(d->slot_memory);
    if (d->staging) cudaFreeHost(d->staging);
    for (uint32_t l = 0; l < d->n_layers; l++) {
        if (d->engine_wrote && d->engine_wrote[l]) cudaEventDestroy(d->engine_wrote[l]);
        if (d->loaded && d->loaded[l]) cudaEventDestroy(d->loaded[l]);
    }
    free(d->engine_wrote);
    free(d->loaded);
    if (d->engine_ready) cudaEventDestroy(d->engine_ready);
    if (d->dir[SAVE].stream) cudaStreamDestroy(d->dir[SAVE].stream);
    if (d->dir[LOAD].stream) cudaStreamDestroy(d->dir[LOAD].stream);
    for (size_t i = d->n_ranges; i-- > 0;)
        if (d->ranges[i].owned)
            (void)cudaHostUnregister(reinterpret_cast<void *>(d->ranges[i].base));
    free(d->ranges);
    free(d->layers);
    (void)cudaGetLastError();
    free(d);
}

kvs_status check_init(const kvs_device_init *init, char *err, size_t err_len) {
    if (!init || init->struct_size < sizeof(kvs_device_init)) {
        kvs_fmt(err, err_len, "cuda device: open: init is %s",
                init ? "older than this module (struct_size too small)" : "NULL");
        return KVS_EINVAL;
    }
    const kvs_kv_shape *s = &init->shape;
    if (!init->views || init->n_layers == 0 || s->n_heads == 0 || s->head_bytes == 0 ||
        s->block_tokens == 0 || init->max_copies_per_layer == 0 ||
        init->max_tokens_per_layer == 0) {
        kvs_fmt(err, err_len,
                "cuda device: open: needs layers (%u), n_heads (%u), head_bytes (%u), block_tokens "
                "(%u), "
                "max_copies_per_layer (%u) and max_tokens_per_layer (%u) all above 0",
                init->views ? init->n_layers : 0, s->n_heads, s->head_bytes, s->block_tokens,
                init->max_copies_per_layer, init->max_tokens_per_layer);
        return KVS_EINVAL;
    }
    for (uint32_t l = 0; l < init->n_layers; l++) {
        const kvs_layer_view *v = &init->views[l];
        const char *bad = v->device_kind != KVS_DEVICE_CUDA ? "is not a CUDA view"
                          : v->device_index != init->views[0].device_index
                              ? "is on another device than layer 0"
                          : !v->k_base             ? "has no k_base"
                          : s->has_v && !v->v_base ? "has no v_base but the shape has V"
                          : !s->has_v && v->v_base ? "has a v_base but the shape has no V (MLA)"
                          : v->n_blocks == 0       ? "has no blocks"
                          : (v->block_stride < 0 || v->token_stride < 0 || v->head_stride < 0)
                              ? "has a negative stride"
                              : nullptr;
        if (bad) {
            kvs_fmt(err, err_len, "cuda device: open: layer %u %s", l, bad);
            return KVS_EINVAL;
        }
    }
    return KVS_OK;
}

/* The engine's bases must be memory this device can address. */
kvs_status check_bases(const cuda_device *d, const kvs_device_init *init, char *err,
                       size_t err_len) {
    for (uint32_t l = 0; l < init->n_layers; l++) {
        void *bases[2] = {init->views[l].k_base, init->views[l].v_base};
        for (int p = 0; p < (init->shape.has_v ? 2 : 1); p++) {
            cudaPointerAttributes a;
            cudaError_t rc = cudaPointerGetAttributes(&a, bases[p]);
            if (rc != cudaSuccess)
                return cuda_fail(d->ordinal, rc, err, err_len, "open: layer %u %s_base %p", l,
                                 p ? "v" : "k", bases[p]);
            if (a.type == cudaMemoryTypeUnregistered ||
                (a.type == cudaMemoryTypeDevice && a.device != d->ordinal)) {
                kvs_fmt(err, err_len,
                        "cuda:%d: open: layer %u %s_base %p is not memory of this device",
                        d->ordinal, l, p ? "v" : "k", bases[p]);
                return KVS_EINVAL;
            }
        }
    }
    return KVS_OK;
}

kvs_status create_resources(cuda_device *d, char *err, size_t err_len) {
    const int o = d->ordinal;
    cudaError_t rc;
    for (int k = LOAD; k <= SAVE; k++) {
        if ((rc = cudaStreamCreateWithFlags(&d->dir[k].stream, cudaStreamNonBlocking)) !=
            cudaSuccess)
            return cuda_fail(o, rc, err, err_len, "open: creating the %s stream",
                             k ? "save" : "load");
    }
    if ((rc = cudaEventCreateWithFlags(&d->engine_ready, cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail(o, rc, err, err_len, "open: creating an event");
    d->loaded = static_cast<cudaEvent_t *>(calloc(d->n_layers, sizeof(cudaEvent_t)));
    d->engine_wrote = static_cast<cudaEvent_t *>(calloc(d->n_layers, sizeof(cudaEvent_t)));
    if (!d->loaded || !d->engine_wrote) {
        kvs_fmt(err, err_len, "cuda:%d: open: out of memory", o);
        return KVS_ENOMEM;
    }
    for (uint32_t l = 0; l < d->n_layers; l++) {
        if ((rc = cudaEventCreateWithFlags(&d->loaded[l], cudaEventDisableTiming)) != cudaSuccess ||
            (rc = cudaEventCreateWithFlags(&d->engine_wrote[l], cudaEventDisableTiming)) !=
                cudaSuccess)
            return cuda_fail(o, rc, err, err_len, "open: creating the events of layer %u", l);
    }

    const uint64_t max_ids =
        kvs_cuda_max_blocks_touched(d->max_copies, d->max_tokens, d->shape.block_tokens);
    d->slot_bytes = (kvs_cuda_desc_block_bytes(d->max_copies, max_ids) + 255) & ~(uint64_t)255;
    const uint64_t n_slots = (uint64_t)d->n_layers * kSlotsPerLayer;
    const uint64_t all_slots = 2 * n_slots * d->slot_bytes;
    if ((rc = cudaMallocHost(reinterpret_cast<void **>(&d->staging), all_slots)) != cudaSuccess)
        return cuda_fail(o, rc, err, err_len, "open: %llu bytes of pinned descriptor staging",
                         (unsigned long long)all_slots);
    if ((rc = cudaMalloc(reinterpret_cast<void **>(&d->slot_memory), all_slots)) != cudaSuccess)
        return cuda_fail(o, rc, err, err_len, "open: %llu bytes of device descriptor memory",
                         (unsigned long long)all_slots);
    for (int k = LOAD; k <= SAVE; k++) {
        direction *dir = &d->dir[k];
        dir->op = k == LOAD ? "load_layer" : "save_layer";
        dir->last_layer = -1;
        dir->slots = static_cast<desc_slot *>(calloc(n_slots, sizeof(desc_slot)));
        dir->next_slot = static_cast<uint8_t *>(calloc(d->n_layers, 1));
        if (!dir->slots || !dir->next_slot) {
            kvs_fmt(err, err_len, "cuda:%d: open: out of memory", o);
            return KVS_ENOMEM;
        }
        for (uint64_t i = 0; i < n_slots; i++) {
            const uint64_t at = ((uint64_t)k * n_slots + i) * d->slot_bytes;
            dir->slots[i].host = d->staging + at;
            dir->slots[i].device = d->slot_memory + at;
            if ((rc = cudaEventCreateWithFlags(&dir->slots[i].copied, cudaEventDisableTiming)) !=
                cudaSuccess)
                return cuda_fail(o, rc, err, err_len, "open: creating a descriptor event");
        }
    }
    const uint64_t max_runs = (uint64_t)(d->shape.has_v ? 2 : 1) * max_ids;
    d->runs.cap = max_runs;
    d->runs.dst = static_cast<void **>(malloc(max_runs * sizeof(void *)));
    d->runs.src = static_cast<const void **>(malloc(max_runs * sizeof(void *)));
    d->runs.bytes = static_cast<size_t *>(malloc(max_runs * sizeof(size_t)));
    if (!d->runs.dst || !d->runs.src || !d->runs.bytes) {
        kvs_fmt(err, err_len, "cuda:%d: open: out of memory", o);
        return KVS_ENOMEM;
    }
    return KVS_OK;
}

/* Decide kernel or copy engines per direction (see kvs_dev_copy_method). */
void choose_methods(cuda_device *d, kvs_dev_copy_method method, uint64_t run_bytes) {
    const int o = d->ordinal;
    if (method == KVS_DEV_COPY_KERNEL || run_bytes == 0) {
        if (method == KVS_DEV_COPY_DMA)
            log_line(d->log_level, KVS_LOG_WARN,
                     "cuda:%d: copy method dma asked for, but a block's tokens are not one "
                     "contiguous run in this layout: using the copy kernel",
                     o);
        return;
    }
    if (method == KVS_DEV_COPY_DMA) {
        d->dir[LOAD].use_dma = d->dir[SAVE].use_dma = 1;
        return;
    }
    kvs_cuda_calibration c;
    char why[256] = "";
    kvs_status st = kvs_cuda_calibrate(&d->layers[0], d->max_tokens, d->max_copies, d->max_grid,
                                       d->dir[LOAD].stream, d->dir[SAVE].stream, &d->use_batch, &c,
                                       why, sizeof why);
    if (st != KVS_OK) {
        log_line(d->log_level, KVS_LOG_WARN, "%s; using the copy kernel", why);
        return;
    }
    for (int k = LOAD; k <= SAVE; k++)
        d->dir[k].use_dma = c.dma_gbps[k] >= kDmaPreference * c.kernel_gbps[k];
    if (!d->use_batch)
        log_line(d->log_level, KVS_LOG_INFO,
                 "cuda:%d: the driver refused cudaMemcpyBatchAsync; runs are copied one by one", o);
    log_line(d->log_level, KVS_LOG_INFO,
             "cuda:%d: copy calibration (%u tokens in %u copies, %llu runs of up to %llu bytes): "
             "load kernel %.1f GB/s, copy engines %.1f GB/s; save kernel %.1f GB/s, copy engines "
             "%.1f GB/s",
             o, c.tokens, c.copies, (unsigned long long)c.runs, (unsigned long long)run_bytes,
             c.kernel_gbps[LOAD], c.dma_gbps[LOAD], c.kernel_gbps[SAVE], c.dma_gbps[SAVE]);
}

kvs_status cuda_open(const kvs_device_init *init, void **state, kvs_device_info *info, char *err,
                     size_t err_len) {
    if (!state) {
        kvs_fmt(err, err_len, "cuda device: open: state is NULL");
        return KVS_EINVAL;
    }
    *state = nullptr;
    kvs_status st = check_init(init, err, err_len);
    if (st != KVS_OK) return st;
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        if (rc == cudaSuccess) rc = cudaErrorNoDevice;
        kvs_fmt(err, err_len, "cuda device: open: no usable CUDA device: %s (%s)",
                cudaGetErrorString(rc), cudaGetErrorName(rc));
        (void)cudaGetLastError();
        return KVS_EIO;
    }
    const int ordinal = init->views[0].device_index;
    if (ordinal < 0 || ordinal >= count) {
        kvs_fmt(err, err_len,
                "cuda device: open: the views are on cuda:%d but this process sees %d "
                "device%s",
                ordinal, count, count == 1 ? "" : "s");
        return KVS_EINVAL;
    }

    cuda_device *d = static_cast<cuda_device *>(calloc(1, sizeof *d));
    if (!d) {
        kvs_fmt(err, err_len, "cuda device: open: out of memory");
        return KVS_ENOMEM;
    }
    d->ordinal = ordinal;
    d->log_level = init->log_level;
    d->n_layers = init->n_layers;
    d->shape = init->shape;
    d->max_copies = init->max_copies_per_layer;
    d->max_tokens = init->max_tokens_per_layer;
    d->use_batch = 1;
    d->engine = nullptr; /* the legacy default stream until set_stream */
    d->last_load_layer = -1;
    if ((st = enter(d, "open", err, err_len)) != KVS_OK) goto fail;

    cudaDeviceProp prop;
    if ((rc = cudaGetDeviceProperties(&prop, ordinal)) != cudaSuccess) {
        st = cuda_fail(ordinal, rc, err, err_len, "open: cudaGetDeviceProperties");
        goto fail;
    }
    if (!prop.unifiedAddressing || !prop.canMapHostMemory) {
        kvs_fmt(err, err_len, "cuda:%d: open: %s has no %s, which the copy kernels need", ordinal,
                prop.name, !prop.unifiedAddressing ? "unified addressing" : "mapped host memory");
        st = KVS_ENOTSUP;
        goto fail;
    }
    snprintf(d->name, sizeof d->name, "cuda:%d %s", ordinal, prop.name);
    d->max_grid =
        (uint32_t)(prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1) * kGridPerSm;
    if ((st = check_bases(d, init, err, err_len)) != KVS_OK) goto fail;

    d->layers = static_cast<kvs_cuda_layer *>(calloc(d->n_layers, sizeof *d->layers));
    if (!d->layers) {
        kvs_fmt(err, err_len, "cuda:%d: open: out of memory", ordinal);
        st = KVS_ENOMEM;
        goto fail;
    }
    uint64_t run_bytes;
    run_bytes = 0;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        kvs_cuda_layer_from_view(&init->views[l], &init->shape, &d->layers[l]);
        const uint64_t r = kvs_cuda_run_bytes(&d->layers[l]);
        run_bytes =
            l == 0 || r == run_bytes ? r : 0; /* copy engines only if every layer has runs */
    }
    if ((st = create_resources(d, err, err_len)) != KVS_OK) goto fail;
    choose_methods(d, init->method, run_bytes);

    log_line(d->log_level, KVS_LOG_INFO,
             "%s: %u layers, load by %s, save by %s, contiguous run %llu bytes, %llu bytes of "
             "descriptors per layer and slot",
             d->name, d->n_layers, d->dir[LOAD].use_dma ? "copy engines" : "copy kernel",
             d->dir[SAVE].use_dma ? "copy engines" : "copy kernel", (unsigned long long)run_bytes,
             (unsigned long long)d->slot_bytes);
    if (info) {
        memset(info, 0, sizeof *info);
        snprintf(info->name, sizeof info->name, "%s", d->name);
        info->load_uses_dma = d->dir[LOAD].use_dma;
        info->save_uses_dma = d->dir[SAVE].use_dma;
        info->run_bytes = run_bytes;
        info->hashes_inline = 0;
        info->synchronous = 0;
        info->decodes_codecs = 0; /* kvs_cuda_codec_scatter_rows is not wired into load_layer */
    }
    *state = d;
    return KVS_OK;
fail:
    destroy(d);
    return st;
}

void cuda_close(void *state) {
    cuda_device *d = static_cast<cuda_device *>(state);
    if (!d) return;
    (void)cudaSetDevice(d->ordinal);
    destroy(d);
}

/* --- entry points ---------------------------------------------------------------------------- */

kvs_status cuda_register_host(void *state, void *base, uint64_t len, char *err, size_t err_len) {
    cuda_device *d = static_cast<cuda_device *>(state);
    kvs_status st = enter(d, "register_host", err, err_len);
    if (st != KVS_OK) return st;
    if (!base || len == 0) {
        kvs_fmt(err, err_len, "cuda:%d: register_host: empty range %p + %llu", d->ordinal, base,
                (unsigned long long)len);
        return KVS_EINVAL;
    }
    const uintptr_t at = reinterpret_cast<uintptr_t>(base);
    if (find_range(d, at, len)) return KVS_OK;
    bool owned = true;
    /* Memory CUDA already knows as pinned is asked first: cudaHostRegister refuses memory from
     * cudaMallocHost with cudaErrorInvalidValue (seen on an H200, driver 580), not with
     * cudaErrorHostMemoryAlreadyRegistered as it does for a range registered before. */
    cudaPointerAttributes pinned;
    cudaError_t rc = cudaPointerGetAttributes(&pinned, base);
    if (rc == cudaSuccess && pinned.type == cudaMemoryTypeHost) {
        owned = false; /* the engine's or another handle's: usable, not ours to unregister */
    } else {
        if (rc != cudaSuccess) (void)cudaGetLastError();
        rc = cudaHostRegister(base, len, cudaHostRegisterPortable | cudaHostRegisterMapped);
    }
    if (!owned || rc == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        owned = false;
    } else if (rc != cudaSuccess) {
        return cuda_fail(d->ordinal, rc, err, err_len, "register_host(%p, %llu bytes)", base,
                         (unsigned long long)len);
    }
    void *device = nullptr;
    rc = cudaHostGetDevicePointer(&device, base, 0);
    if (rc != cudaSuccess) {
        if (owned) {
            st = cuda_fail(d->ordinal, rc, err, err_len, "register_host(%p): no device address",
                           base);
            (void)cudaHostUnregister(base);
            return st;
        }
        /* Someone else's registration may not cover base: translate() asks per pointer. */
        (void)cudaGetLastError();
        return KVS_OK;
    }
    if (!owned) {
        /* Only what CUDA confirms is covered is recorded; the rest is asked per pointer. */
        cudaPointerAttributes a;
        rc = cudaPointerGetAttributes(&a, static_cast<char *>(base) + len - 1);
        if (rc != cudaSuccess || a.type != cudaMemoryTypeHost ||
            static_cast<char *>(a.devicePointer) != static_cast<char *>(device) + len - 1) {
            (void)cudaGetLastError();
            return KVS_OK;
        }
    }
    st = add_range(d, at, len, (uint64_t) reinterpret_cast<uintptr_t>(device), owned, err, err_len);
    if (st != KVS_OK && owned) (void)cudaHostUnregister(base);
    return st;
}

kvs_status cuda_set_stream(void *state, void *stream, char *err, size_t err_len) {
    cuda_device *d = static_cast<cuda_device *>(state);
    kvs_status st = enter(d, "set_stream", err, err_len);
    if (st != KVS_OK) return st;
    d->engine = static_cast<cudaStream_t>(stream);
    return KVS_OK;
}

/* Is the engine stream being captured? Loads and saves are refused then (device.h): their events
 * on the engine stream and copies on our own streams cannot be part of the engine's graph. */
kvs_status engine_capturing(const cuda_device *d, const char *op, uint32_t layer, bool *capturing,
                            char *err, size_t err_len) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaError_t rc = cudaStreamIsCapturing(d->engine, &status);
    if (rc != cudaSuccess)
        return cuda_fail(d->ordinal, rc, err, err_len,
                         "%s(%u): cudaStreamIsCapturing on the engine "
                         "stream",
                         op, layer);
    *capturing = status != cudaStreamCaptureStatusNone;
    return KVS_OK;
}

/* Enqueue the copies of one layer in one direction on that direction's stream. Everything that can
 * be refused is checked before anything is enqueued. */
kvs_status enqueue(cuda_device *d, int k, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                   char *err, size_t err_len) {
    direction *dir = &d->dir[k];
    const int o = d->ordinal;
    kvs_status st = enter(d, dir->op, err, err_len);
    if (st != KVS_OK) return st;
    if (layer >= d->n_layers) {
        kvs_fmt(err, err_len, "cuda:%d: %s(%u): layer out of range (%u layers)", o, dir->op, layer,
                d->n_layers);
        return KVS_EINVAL;
    }
    if (n > d->max_copies) {
        kvs_fmt(err, err_len, "cuda:%d: %s(%u): %llu copies, over the %u sized at open", o, dir->op,
                layer, (unsigned long long)n, d->max_copies);
        return KVS_EINVAL;
    }
    bool capturing = false;
    if ((st = engine_capturing(d, dir->op, layer, &capturing, err, err_len)) != KVS_OK) return st;
    if (capturing) {
        kvs_fmt(err, err_len,
                "cuda:%d: %s(%u) was called while the engine stream is being captured into a CUDA "
                "graph; "
                "only wait_layer may be captured, loads and saves are enqueued outside the graph",
                o, dir->op, layer);
        return KVS_ESTATE;
    }
    const kvs_cuda_layer *geometry = &d->layers[layer];
    uint64_t n_tokens = 0;
    st = kvs_cuda_check_copies(geometry, layer, dir->op, copies, n, &n_tokens, err, err_len);
    if (st != KVS_OK) return st;
    if (n_tokens > d->max_tokens) {
        kvs_fmt(err, err_len, "cuda:%d: %s(%u): %llu tokens, over the %u sized at open", o, dir->op,
                layer, (unsigned long long)n_tokens, d->max_tokens);
        return KVS_EINVAL;
    }

    /* Prepare: runs for the copy engines, or the packed descriptor block for the kernel. */
    desc_slot *slot = nullptr;
    kvs_cuda_packed packed;
    memset(&packed, 0, sizeof packed);
    cudaError_t rc;
    if (n_tokens > 0 && dir->use_dma) {
        /* The copy engines take host addresses; translating checks the payload is pinned. */
        const uint64_t part_bytes_per_token = kvs_cuda_token_bytes(geometry);
        for (uint64_t i = 0; i < n; i++) {
            if (copies[i].n_tokens == 0) continue;
            void *payload[2] = {copies[i].k_payload, copies[i].v_payload};
            for (uint32_t p = 0; p < geometry->n_parts; p++) {
                uint64_t unused = 0;
                st = translate(d, payload[p], copies[i].n_tokens * part_bytes_per_token, &unused,
                               err, err_len);
                if (st != KVS_OK) return st;
            }
        }
        st = kvs_cuda_plan_runs(geometry, copies, n, k == LOAD, &d->runs, err, err_len);
        if (st != KVS_OK) return st;
    } else if (n_tokens > 0) {
        uint8_t *next = &dir->next_slot[layer];
        slot = &dir->slots[layer * kSlotsPerLayer + *next];
        /* The staging of this slot is read by a copy enqueued kSlotsPerLayer calls ago for this
         * layer; it has almost always run (sync() ends every step), else wait for it. */
        if (slot->recorded && (rc = cudaEventSynchronize(slot->copied)) != cudaSuccess)
            return cuda_fail(o, rc, err, err_len, "%s(%u): waiting for a descriptor slot", dir->op,
                             layer);
        st = kvs_cuda_pack(geometry, copies, n, translate, d, slot->host, d->slot_bytes, &packed,
                           err, err_len);
        if (st != KVS_OK) return st;
        *next = (uint8_t)((*next + 1) % kSlotsPerLayer);
    }

    /* Order against the engine stream. */
    if (k == LOAD) {
        /* The first load of a step (after sync, or a layer not above the last one loaded: a new
         * step that did not sync) waits for everything the engine enqueued before it. */
        if (!d->load_fenced || (long long)layer <= d->last_load_layer) {
            if ((rc = cudaEventRecord(d->engine_ready, d->engine)) != cudaSuccess ||
                (rc = cudaStreamWaitEvent(dir->stream, d->engine_ready, 0)) != cudaSuccess)
                return cuda_fail(o, rc, err, err_len, "%s(%u): ordering after the engine stream",
                                 dir->op, layer);
            d->load_fenced = true;
        }
    } else {
        if ((rc = cudaEventRecord(d->engine_wrote[layer], d->engine)) != cudaSuccess ||
            (rc = cudaStreamWaitEvent(dir->stream, d->engine_wrote[layer], 0)) != cudaSuccess)
            return cuda_fail(o, rc, err, err_len, "%s(%u): ordering after the engine stream",
                             dir->op, layer);
    }

    if (n_tokens > 0 && dir->use_dma) {
        const int had_batch = d->use_batch;
        if ((rc = kvs_cuda_issue_runs(&d->runs, dir->stream, &d->use_batch)) != cudaSuccess)
            return cuda_fail(o, rc, err, err_len, "%s(%u): enqueueing %llu copy-engine runs",
                             dir->op, layer, (unsigned long long)d->runs.n);
        if (had_batch && !d->use_batch)
            log_line(d->log_level, KVS_LOG_WARN,
                     "cuda:%d: the driver refused cudaMemcpyBatchAsync; copying run by run", o);
    } else if (n_tokens > 0) {
        if ((rc = cudaMemcpyAsync(slot->device, slot->host, packed.bytes, cudaMemcpyHostToDevice,
                                  dir->stream)) != cudaSuccess ||
            (rc = cudaEventRecord(slot->copied, dir->stream)) != cudaSuccess)
            return cuda_fail(o, rc, err, err_len, "%s(%u): copying %llu descriptor bytes", dir->op,
                             layer, (unsigned long long)packed.bytes);
        slot->recorded = true;
        kvs_cuda_move move;
        memset(&move, 0, sizeof move);
        move.layer = *geometry;
        move.descs = reinterpret_cast<const kvs_cuda_copy_desc *>(slot->device);
        move.ids = reinterpret_cast<const uint32_t *>(slot->device + packed.ids_offset);
        move.n_copies = packed.n_copies;
        move.n_tokens = packed.n_tokens;
        move.unit_bytes =
            kvs_cuda_unit_bytes(kvs_cuda_layer_align_bits(geometry) | packed.align_bits);
        move.to_pages = k == LOAD;
        if ((rc = kvs_cuda_launch_move(&move, d->max_grid, dir->stream)) != cudaSuccess)
            return cuda_fail(o, rc, err, err_len, "%s(%u): launching the copy kernel", dir->op,
                             layer);
    }
    if (k == LOAD) {
        if ((rc = cudaEventRecord(d->loaded[layer], dir->stream)) != cudaSuccess)
            return cuda_fail(o, rc, err, err_len, "%s(%u): recording the layer's event", dir->op,
                             layer);
        d->last_load_layer = layer;
    }
    dir->last_layer = layer;
    return KVS_OK;
}

kvs_status cuda_load_layer(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                           char *err, size_t err_len) {
    for (uint64_t i = 0; i < n; i++)
        if (copies[i].codec) { /* the connector decodes lossy chunks on the host for this device */
            snprintf(err, err_len, "load_layer(%u): lossy copies are not wired in", layer);
            return KVS_ENOTSUP;
        }
    return enqueue(static_cast<cuda_device *>(state), LOAD, layer, copies, n, err, err_len);
}

kvs_status cuda_save_layer(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                           char *err, size_t err_len) {
    return enqueue(static_cast<cuda_device *>(state), SAVE, layer, copies, n, err, err_len);
}

kvs_status cuda_wait_layer(void *state, uint32_t layer, char *err, size_t err_len) {
    cuda_device *d = static_cast<cuda_device *>(state);
    kvs_status st = enter(d, "wait_layer", err, err_len);
    if (st != KVS_OK) return st;
    if (layer >= d->n_layers) {
        kvs_fmt(err, err_len, "cuda:%d: wait_layer(%u): layer out of range (%u layers)", d->ordinal,
                layer, d->n_layers);
        return KVS_EINVAL;
    }
    bool capturing = false;
    if ((st = engine_capturing(d, "wait_layer", layer, &capturing, err, err_len)) != KVS_OK)
        return st;
    /* In a capture the wait becomes an external event node: each replay waits for the record of
     * loaded[layer] current at launch time, i.e. the loads enqueued before that replay. */
    cudaError_t rc =
        cudaStreamWaitEvent(d->engine, d->loaded[layer], capturing ? cudaEventWaitExternal : 0);
    if (rc != cudaSuccess)
        return cuda_fail(d->ordinal, rc, err, err_len, "wait_layer(%u): cudaStreamWaitEvent%s",
                         layer, capturing ? " in graph capture" : "");
    return KVS_OK;
}

kvs_status cuda_sync(void *state, char *err, size_t err_len) {
    cuda_device *d = static_cast<cuda_device *>(state);
    kvs_status st = enter(d, "sync", err, err_len);
    if (st != KVS_OK) return st;
    /* Both streams are drained even if the first failed, so no copy outlives the call. */
    cudaError_t rc[2];
    for (int k = LOAD; k <= SAVE; k++) rc[k] = cudaStreamSynchronize(d->dir[k].stream);
    d->load_fenced = false;
    d->last_load_layer = -1;
    for (int k = LOAD; k <= SAVE; k++) {
        if (rc[k] == cudaSuccess) continue;
        const direction *dir = &d->dir[k];
        if (dir->last_layer >= 0)
            return cuda_fail(d->ordinal, rc[k], err, err_len,
                             "sync: the %s stream failed (last enqueued: %s(%lld))",
                             k == LOAD ? "load" : "save", dir->op, dir->last_layer);
        return cuda_fail(d->ordinal, rc[k], err, err_len, "sync: the %s stream failed",
                         k == LOAD ? "load" : "save");
    }
    return KVS_OK;
}

/* Positional: the fields of kvs_device_ops in order. */
const kvs_device_ops cuda_ops = {
    KVS_DEVICE_ABI_VERSION, /* version */
    "cuda",                 /* name */
    cuda_open,              /* open */
    cuda_close,             /* close */
    cuda_register_host,     /* register_host */
    cuda_set_stream,        /* set_stream */
    cuda_load_layer,        /* load_layer */
    cuda_wait_layer,        /* wait_layer */
    cuda_save_layer,        /* save_layer */
    cuda_sync,              /* sync */
    &kvs_cuda_mem_table,    /* mem */
};

} // namespace

/* The module's one exported symbol (see device.h). */
extern "C" __attribute__((visibility("default"))) const kvs_device_ops *kvs_device_entry(
    uint32_t version) {
    return version == KVS_DEVICE_ABI_VERSION ? &cuda_ops : nullptr;
}
