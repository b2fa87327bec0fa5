/* device.h - the device interface: how the connector moves one layer of a step's chunks between the
 * engine's paged KV cache and object payloads in host memory. Two devices implement it:
 *   host - kernels/device_host.c over kernels/cpu, synchronous; the "GPU" pages are ordinary RAM
 *          (tests, CI, CPU engines).
 *   cuda - kernels/cuda, built as the module libkvstrata-cuda.so.1 and loaded with dlopen when an
 *          engine registers CUDA layer views, so libkvstrata.so itself never links the CUDA runtime.
 *
 * The CUDA module exports one symbol, KVS_DEVICE_ENTRY_SYMBOL, returning its table for
 * KVS_DEVICE_ABI_VERSION or NULL. The table is internal to kvstrata (the module is built with the
 * library and installed beside it); the version check only catches a stale module on disk.
 *
 * Ordering model (CUDA; the host device does everything at once, in call order):
 *   load_layer(l)  enqueues the scatter of layer l on the device's load stream and records event l.
 *   wait_layer(l)  makes the engine's stream wait for event l; the host never blocks, so it is
 *                  legal inside CUDA graph capture (the wait becomes an external-event node).
 *   save_layer(l)  makes the save stream wait for the engine's stream (it has written layer l),
 *                  then enqueues the gather of layer l. Not allowed during graph capture.
 *   sync()         blocks the host until every enqueued load and save has finished; payload
 *                  memory may be reused and objects unpinned only after it.
 * Every call comes from the one thread that drives the worker handle. Errors are a status plus a
 * sentence in err naming the operation and layer; nothing aborts. */
#ifndef KVS_DEVICE_H
#define KVS_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_DEVICE_ABI_VERSION  4 /* 3: mem, the device memory table; 4: kvs_dev_copy.tag */
#define KVS_DEVICE_ENTRY_SYMBOL "kvs_device_entry"
#define KVS_DEVICE_CUDA_MODULE  "libkvstrata-cuda.so.1"

/* A copy that decodes as it lands (a lossy chunk, docs/compress.md): its payload is the layer as
 * the codec encoded it over encoded_tokens tokens, and the copy's tokens are its rows first_row
 * onwards. Loads only; the host device has it (kvs_codec_scatter_rows), the CUDA module refuses it
 * (KVS_ENOTSUP) until its decode-scatter is wired in. */
typedef struct kvs_dev_codec {
    kvs_codec codec;
    uint32_t dtype;          /* the pages' (KVS_DTYPE_*) */
    uint32_t encoded_tokens; /* the chunk's tokens */
    uint32_t first_row;      /* the encoded row of the copy's first token */
} kvs_dev_codec;

/* One request's token range of one layer: rows [first_token, first_token + n_tokens) of the
 * request's block table, and where their payload rows are. The payload holds, for K and for V,
 * n_tokens consecutive rows of shape.n_heads * shape.head_bytes bytes starting at k_payload and
 * v_payload (v_payload NULL for MLA). Payload memory is host memory registered with the device
 * (register_host) or, for the host device, any memory. */
typedef struct kvs_dev_copy {
    const uint32_t *block_ids; /* host copy of the request's block table */
    uint64_t n_block_ids;
    uint64_t first_token;
    uint32_t n_tokens;
    void *k_payload;
    void *v_payload;
    /* Optional: a device with info.hashes_inline writes here the XXH3-64 (seed 0) of the payload it
     * read (load) or wrote (save), computed in the same pass. Only set for copies whose V rows
     * directly follow the K rows (the whole layer payload is one range). Others ignore it. */
    uint64_t *hash;
    /* (version 2) Non-NULL: a lossy load, k_payload the encoded layer, v_payload and hash unused. */
    const kvs_dev_codec *codec;
    /* (version 4) Optional: a device with info.hashes_inline feeds the payload it reads (load) or
     * writes (save) to this keyed layer tag (common/nhpoly.h) in the same pass, so the pages get, or
     * the object holds, exactly the bytes the tag covers; a save also fills hash from that pass, a
     * load leaves it. The same whole-payload rule as hash. */
    struct kvs_nhpoly *tag;
} kvs_dev_copy;

/* Copy method for layouts with long contiguous runs (whole pages of one layer's K or V). */
typedef enum kvs_dev_copy_method {
    KVS_DEV_COPY_AUTO = 0,   /* measured at open: the faster of kernel and DMA per direction */
    KVS_DEV_COPY_KERNEL = 1, /* SM copy kernels, one launch per layer and direction */
    KVS_DEV_COPY_DMA = 2     /* copy engines (batched memcpy of contiguous runs) where runs allow */
} kvs_dev_copy_method;

typedef struct kvs_device_init {
    uint32_t struct_size;
    const kvs_layer_view *views; /* the engine's layers, checked by the connector */
    uint32_t n_layers;
    kvs_kv_shape shape;
    uint32_t max_tokens_per_layer; /* upper bound of the summed n_tokens of one layer's copies */
    uint32_t max_copies_per_layer; /* upper bound of n in one load_layer / save_layer call */
    kvs_dev_copy_method method;
    int log_level;         /* KVS_LOG_* threshold for the module's own messages */
    int host_deferred;     /* host device only: behave like an asynchronous device (copies
                                    * run at wait_layer / sync, no inline checksums) so the
                                    * connector's CUDA ordering logic runs without a GPU */
    uint32_t host_threads; /* host device only: threads that move a layer's copies (the caller
                            * and host_threads - 1 helpers); 0 or 1: the caller alone */
} kvs_device_init;

/* What open measured or chose, for stats and logs. */
typedef struct kvs_device_info {
    char name[128];    /* "host" or "cuda:0 NVIDIA H100 80GB HBM3" */
    int load_uses_dma; /* the chosen method per direction */
    int save_uses_dma;
    uint64_t run_bytes; /* contiguous bytes per page run of the layout (0: none) */
    int hashes_inline;  /* fills kvs_dev_copy.hash (the host device) */
    int synchronous;    /* copies are done when the call returns (the host device) */
    int decodes_codecs; /* load_layer takes copies with a codec (kvs_dev_copy.codec): the host
                         * device; a device that does not gets lossy chunks decoded into raw first */
} kvs_device_info;

/* (version 3) Device memory outside any opened device: what a lender needs to lend a region of its
 * GPU memory to another process over CUDA IPC, and what the borrowing tier needs to open and copy
 * it (backends/peer_gpu, docs/peer_gpu.md). No state; any thread. Each call works on `ordinal` and
 * gives the calling thread back the current device it had (an engine thread keeps its own).
 * Errors are a status and a sentence naming the call. */
#define KVS_DEVICE_IPC_HANDLE_BYTES 64
#define KVS_DEVICE_UUID_BYTES       16
typedef struct kvs_device_mem_ops {
    /* Devices this process can use (0 when the driver has none: KVS_ENOTFOUND with the reason). */
    kvs_status (*count)(int *n, char *err, size_t err_len);
    /* The device's UUID, the same in every process (ordinals are not: CUDA_VISIBLE_DEVICES). */
    kvs_status (*uuid)(int ordinal, uint8_t *uuid, char *err, size_t err_len);
    kvs_status (*alloc)(int ordinal, uint64_t len, void **ptr, char *err, size_t err_len);
    void (*release)(int ordinal, void *ptr);
    /* Pinned host memory (faster copies to and from the device); free with host_release. */
    kvs_status (*host_alloc)(uint64_t len, void **ptr, char *err, size_t err_len);
    void (*host_release)(void *ptr);
    /* The IPC handle of an allocation of this process (cudaIpcGetMemHandle). */
    kvs_status (*export_handle)(int ordinal, void *ptr, uint8_t *handle, char *err, size_t err_len);
    /* Map another process's allocation on `ordinal` (cudaIpcOpenMemHandle, peer access enabled
     * lazily when it lives on another device) and give the bytes it really spans from *ptr in
     * *len (what the exporter allocated); close_handle unmaps it. */
    kvs_status (*open_handle)(int ordinal, const uint8_t *handle, void **ptr, uint64_t *len,
                              char *err, size_t err_len);
    void (*close_handle)(int ordinal, void *ptr);
    /* Copy len bytes between any two of host memory, device memory and a mapped handle
     * (cudaMemcpyDefault) on a non-blocking stream of the calling thread's own, so it waits for
     * no other work (the legacy stream's included); returns when the copy is done. */
    kvs_status (*copy)(int ordinal, void *dst, const void *src, uint64_t len, char *err,
                       size_t err_len);
    /* Set len bytes of device memory to byte; returns when done. */
    kvs_status (*fill)(int ordinal, void *ptr, int byte, uint64_t len, char *err, size_t err_len);
} kvs_device_mem_ops;

typedef struct kvs_device_ops {
    uint32_t version; /* KVS_DEVICE_ABI_VERSION */
    const char *name;
    kvs_status (*open)(const kvs_device_init *init, void **state, kvs_device_info *info, char *err,
                       size_t err_len);
    /* Waits for outstanding work, then frees everything (and unregisters host memory). An engine
     * that captured wait_layer into a CUDA graph destroys that graph first: it names our events. */
    void (*close)(void *state);
    /* Make [base, base+len) usable as payload memory (cudaHostRegister). Idempotent per range. */
    kvs_status (*register_host)(void *state, void *base, uint64_t len, char *err, size_t err_len);
    /* The engine's stream for wait_layer and save_layer (cudaStream_t; NULL: the legacy stream). */
    kvs_status (*set_stream)(void *state, void *stream, char *err, size_t err_len);
    kvs_status (*load_layer)(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                             char *err, size_t err_len);
    kvs_status (*wait_layer)(void *state, uint32_t layer, char *err, size_t err_len);
    kvs_status (*save_layer)(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                             char *err, size_t err_len);
    kvs_status (*sync)(void *state, char *err, size_t err_len);
    const kvs_device_mem_ops *mem; /* (version 3) NULL: the device has no memory of its own */
} kvs_device_ops;

typedef const kvs_device_ops *(*kvs_device_entry_fn)(uint32_t version);

/* Load the CUDA module and return its table: from $KVS_CUDA_MODULE when set, else beside
 * libkvstrata.so (or, linked statically, beside the program's ../lib), else the loader's path.
 * NULL with the reason in why: *dl NULL when it cannot be loaded, else it offers another version.
 * A non-NULL *dl is the caller's to dlclose once nothing uses the table. */
const kvs_device_ops *kvs_device_cuda_load(void **dl, char *why, size_t why_len);

/* The host device (kernels/cpu). */
const kvs_device_ops *kvs_host_device(void);

#ifdef __cplusplus
}
#endif

#endif
