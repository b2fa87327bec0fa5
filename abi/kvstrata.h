/*
 * kvstrata.h - the engine-facing ABI of libkvstrata: the core contract.
 *
 * An engine loads libkvstrata.so (dlopen, ctypes.CDLL), calls kvs_get_api(KVS_ABI_MAJOR) and then
 * talks to the library only through the returned table. The hooks mirror vLLM's KV-connector v1: a
 * scheduler-role handle answers lookups and builds one metadata blob per step; a worker-role handle
 * binds that blob and moves KV between the engine's paged cache and the tiers (KVS_ROLE_BOTH: all).
 *
 * Extensions have their hooks in the table, and their structs, constants and contracts in headers
 * that include this one: kvstrata_plans.h (restore and stage plans), kvstrata_lossy.h (token
 * dropping, lossy loads), kvstrata_lsc.h (layer stream cache), kvstrata_sparse.h (sparse decode).
 * Engines not shaped like vLLM use the store API (kvstrata_store.h: batched exists, get, put).
 *
 * Versioning: a minor version only appends fields to structs and hooks to the table ("since 1.N"
 * here; CHANGELOG.md says what each added): check struct_size before reading one. kvs_get_api
 * refuses another major. A struct passed in is read up to its struct_size (at least its first size,
 * KVS_*_SIZE_1_N; fields past it read as zero); a struct the library fills is written up to
 * min(struct_size, sizeof) (below its first size: KVS_EINVAL); an array steps by [0].struct_size.
 * kvs_step_request and kvs_event have no struct_size: frozen for major 1. Fields are fixed-width
 * integers (the enums only name values); tests/test_abi.c pins every offset and size.
 *
 * Threading: kvs_get_api and kvs_strerror are thread-safe. Calls on one handle must be serialised
 * by the caller; different handles are independent. Every call returns a kvs_status; on failure
 * kvs_api.last_error(h) names the problem. Ownership: every pointer passed in is borrowed for the
 * call only, unless a comment says otherwise; the library never hands out memory to free.
 */
#ifndef KVSTRATA_H
#define KVSTRATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_ABI_MAJOR 1
#define KVS_ABI_MINOR 12

typedef enum kvs_status {
    KVS_OK = 0,
    KVS_EINVAL = -1,    /* an argument is wrong (null, out of range, impossible stride) */
    KVS_ENOMEM = -2,    /* memory or pool slabs exhausted */
    KVS_ENOTFOUND = -3, /* key, request or tier not known */
    KVS_EIO = -4,       /* a device, file or peer failed */
    KVS_ECONFIG = -5,   /* the YAML configuration is invalid */
    KVS_EVERSION = -6,  /* ABI major version mismatch */
    KVS_ESTATE = -7,    /* hook called out of order or on a handle of the wrong role */
    KVS_ETIMEDOUT = -8, /* a bounded wait ran out */
    KVS_ENOTSUP = -9,   /* the operation is not available in this build or tier */
    KVS_ECORRUPT = -10, /* stored data failed its checksum or header check */
    KVS_EAGAIN = -11,   /* not ready yet; call again later */
    KVS_EOVERFLOW = -12 /* the caller's output buffer is too small; the needed size is reported */
} kvs_status;

typedef struct kvs_handle kvs_handle; /* opaque */

typedef enum kvs_role {
    KVS_ROLE_SCHEDULER = 1, /* lookup, on_alloc, build_meta, request_finished */
    KVS_ROLE_WORKER = 2,    /* register_kv, bind_meta, start_load, ..., load_error_blocks */
    KVS_ROLE_BOTH = 3
} kvs_role;

typedef enum kvs_dtype {
    KVS_DTYPE_FP16 = 1,
    KVS_DTYPE_BF16 = 2,
    KVS_DTYPE_FP32 = 3,
    KVS_DTYPE_FP8_E4M3 = 4,
    KVS_DTYPE_FP8_E5M2 = 5
} kvs_dtype;

/* How the model's KV is shaped on this rank. Given once at open; part of the fingerprint. */
typedef struct kvs_model_desc {
    uint32_t struct_size;  /* sizeof(kvs_model_desc) */
    const char *model_id;  /* e.g. "meta-llama/Llama-3.1-8B"; copied at open */
    uint32_t dtype;        /* element type of the KV cache (kvs_dtype) */
    uint32_t n_layers;     /* attention layers held by this rank */
    uint32_t n_kv_heads;   /* KV heads held by this rank (1 for MLA) */
    uint32_t head_dim;     /* elements per head (MLA: latent width, e.g. 576) */
    uint32_t block_tokens; /* engine page size in tokens (vLLM default 16) */
    uint32_t is_mla;       /* 1: one latent tensor per layer, no V; keys are rank-agnostic */
    /* Tensor-parallel rank and size; ignored for MLA. Keys carry the rank; a scheduler handle
     * answers for every rank (a hit needs every rank's shard), its metadata binds on any rank. */
    uint32_t tp_rank, tp_size;
    const char *salt; /* optional extra fingerprint input (LoRA id, ...); NULL for none */
    /* token ids must lie in [0, vocab_size); 0 checks only for negatives (past SIZE_1_0) */
    uint32_t vocab_size;
} kvs_model_desc;
#define KVS_MODEL_DESC_SIZE_1_0 56u /* up to and including salt: the smallest accepted */

typedef struct kvs_open_params {
    uint32_t struct_size;        /* sizeof(kvs_open_params) */
    uint32_t role;               /* kvs_role */
    const char *config_path;     /* YAML file; NULL means built-in defaults (one DRAM tier) */
    const kvs_model_desc *model; /* required */
    uint32_t transfer_role;      /* since 1.10: kvs_transfer_role (absent: KVS_TRANSFER_BOTH) */
} kvs_open_params;
#define KVS_OPEN_PARAMS_SIZE_1_0 24u

/* What a handle moves (vLLM's kv_role). A producer (prefill) only saves: its lookups find nothing.
 * A consumer (decode) only loads: build_meta emits no saves, its lookups never wait for a node. */
typedef enum kvs_transfer_role {
    KVS_TRANSFER_BOTH = 0,
    KVS_TRANSFER_PRODUCER = 1,
    KVS_TRANSFER_CONSUMER = 2
} kvs_transfer_role;

typedef enum kvs_device_kind {
    KVS_DEVICE_HOST = 0, /* host device emulation: the "GPU" pages are ordinary RAM */
    KVS_DEVICE_CUDA = 1  /* device memory of CUDA ordinal `device_index` */
} kvs_device_kind;

/* One layer of the engine's paged KV cache by byte strides (NHD, HND, FlashInfer, MLA with v_base
 * NULL, cross-layer: docs/abi.md): head h of token t of block b is the head_dim elements at
 * k_base + b*block_stride + t*token_stride + h*head_stride. Engine memory, valid until close. */
typedef struct kvs_layer_view {
    uint32_t struct_size; /* sizeof(kvs_layer_view) */
    uint32_t device_kind; /* kvs_device_kind */
    int32_t device_index; /* CUDA ordinal; 0 for the host device */
    uint32_t n_blocks;    /* pages in this layer's cache */
    void *k_base;         /* K (MLA: the latent) of block 0, token 0, head 0 */
    void *v_base;         /* V of block 0, token 0, head 0; NULL for MLA */
    int64_t block_stride; /* bytes between consecutive blocks */
    int64_t token_stride; /* bytes between consecutive tokens of a block */
    int64_t head_stride;  /* bytes between consecutive heads of a token */
} kvs_layer_view;
#define KVS_LAYER_VIEW_SIZE_1_0 56u

/* scheduler side ---------------------------------------------------------------------------- */

typedef struct kvs_lookup_result {
    uint32_t struct_size;
    uint64_t n_hit_tokens; /* loadable beyond n_computed; a full-prompt hit reports one less */
    uint8_t unknown_yet;   /* 1: cannot tell without blocking; ask again next step (vLLM's None) */
    /* 1: load between steps (`loads.async`): schedule the request once get_finished lists it in
     * `receiving` (its KV in the pages, or its blocks in load_error_blocks); 0: in the forward */
    uint8_t load_async;
    uint64_t n_lossy_tokens; /* since 1.6: of n_hit_tokens, those lossy (kvstrata_lossy.h) */
    /* since 1.10: the handle's chunk size: a hit ends on a chunk boundary (but for full prompts) */
    uint32_t chunk_tokens;
} kvs_lookup_result;
#define KVS_LOOKUP_RESULT_SIZE_1_0 24u

/* A block id in a scheduler-side block table for a block the engine holds no page for (a sliding
 * window's blocks out of it): a chunk touching one is not saved, and no load lands in it. */
#define KVS_BLOCK_NONE UINT32_MAX

/* One request scheduled in this step, as the engine's scheduler sees it. Frozen for major 1 (no
 * struct_size: build_meta reads an array of them). */
typedef struct kvs_step_request {
    const char *req_id;    /* NUL-terminated, <= 255 bytes */
    const int32_t *tokens; /* every token of the request known so far (prompt, then outputs) */
    uint64_t n_tokens;
    const uint32_t *block_ids; /* the request's whole block table, in token order */
    uint64_t n_block_ids;
    uint64_t n_computed;  /* tokens in the pages before this step, external hits included */
    uint64_t n_scheduled; /* tokens the engine computes in this step */
} kvs_step_request;

/* Since 1.10. A request of a step as what changed since the library last saw it (build_meta_update;
 * the library keeps each request's tokens and block table). Every element: the same struct_size. */
typedef struct kvs_step_update {
    uint32_t struct_size; /* sizeof(kvs_step_update) */
    uint32_t reserved;
    const char *req_id; /* NUL-terminated, <= 255 bytes */
    /* the request's tokens become its first tokens_from tokens (of those the library holds)
     * followed by tokens[0..n_tokens); 0 for a new or resumed request: the whole list */
    uint64_t tokens_from;
    const int32_t *tokens;
    uint64_t n_tokens;
    uint64_t blocks_from; /* the same for its block table */
    const uint32_t *block_ids;
    uint64_t n_block_ids;
    uint64_t n_computed, n_scheduled; /* as kvs_step_request's */
} kvs_step_update;
#define KVS_STEP_UPDATE_SIZE_1_10 80u

/* Since 1.10. What a handle was opened with (handle_info): for an engine's plans, a tool's view. */
typedef struct kvs_handle_info {
    uint32_t struct_size;   /* sizeof(kvs_handle_info), set by the caller */
    uint32_t role;          /* kvs_role */
    uint32_t transfer_role; /* kvs_transfer_role */
    uint32_t chunk_tokens;  /* tokens per chunk: saves and loads move whole chunks */
    uint32_t key_ranks;     /* chunk keys per chunk (one per TP rank with keys of its own) */
    uint32_t n_tiers;       /* tiers in the chain (tier_name names them) */
    uint32_t save_decode;   /* 1: tokens produced while decoding are saved too; 0: the prompt's */
    uint32_t saves_async;   /* 1: saves land after wait_save; get_finished's sending lists them */
    uint64_t lease_timeout_ms; /* how long a lookup's pins hold without a load */
} kvs_handle_info;
#define KVS_HANDLE_INFO_SIZE_1_10 40u

/* A cache event (take_events). Frozen for major 1 (no struct_size: take_events fills an array). */
typedef struct kvs_event {
    uint8_t kind; /* KVS_EVENT_* */
    uint8_t key[16];
    uint32_t tier; /* index in the configured chain */
} kvs_event;
#define KVS_EVENT_STORED  1
#define KVS_EVENT_REMOVED 2

/* worker side ------------------------------------------------------------------------------- */

#define KVS_STATS_MAX_TIERS 8

typedef struct kvs_stats {
    uint32_t struct_size;
    uint64_t lookups, lookup_hit_tokens, lookup_miss_tokens;
    uint64_t chunks_loaded, bytes_loaded, load_ns;
    uint64_t chunks_saved, bytes_saved, save_ns;
    uint64_t saves_skipped; /* saves dropped for lack of pool memory or because already stored */
    uint64_t load_errors;   /* chunks whose load failed (checksum, I/O): reported as error blocks */
    uint64_t evictions;     /* objects dropped from the last tier */
    uint64_t leases_active, leases_expired;
    double load_gbps, save_gbps; /* bytes / time over the handle's life */
    uint32_t n_tiers; /* since 1.2: tiers in the chain (the first KVS_STATS_MAX_TIERS reported) */
    uint64_t tier_chunks_loaded[KVS_STATS_MAX_TIERS]; /* chunks_loaded, split by serving tier */
    uint64_t tokens_loaded; /* since 1.5: tokens whose KV landed in the pages */
    uint64_t tier_bytes_loaded[KVS_STATS_MAX_TIERS]; /* bytes_loaded, split by serving tier */
    uint64_t tier_load_ns[KVS_STATS_MAX_TIERS];      /* reading (zero-copy: and copying) per tier */
    /* requests whose load ran between steps (load_async); of those, the ones get_finished reported
     * in receiving, and the ones with at least one chunk in load_error_blocks */
    uint64_t async_loads_started, async_loads_done, async_loads_failed;
    uint64_t steps_closed;        /* bound steps the next bind_meta closed (no forward pass) */
    uint64_t lookups_unknown;     /* lookups answered unknown_yet (loads.remote_lookups: async) */
    uint64_t lossy_chunks_loaded; /* since 1.6: of chunks_loaded, decoded from a lossy object */
    /* since 1.10: saves handed to the saver thread (counted again once they land or fail), those
     * not landed yet (a gauge), requests get_finished reported in its sending list */
    uint64_t saves_async, saves_in_flight, sends_reported;
    /* since 1.11: objects a keyed tier served whose tags were wrong or missing (each a miss) */
    uint64_t integrity_rejects;
} kvs_stats;
#define KVS_STATS_SIZE_1_0 136u /* up to and including save_gbps */
#define KVS_STATS_SIZE_1_2 208u /* up to and including tier_chunks_loaded */

/* The extensions' structs, complete in their own headers (the table only passes pointers). */
typedef struct kvs_restore_plan kvs_restore_plan;   /* kvstrata_plans.h */
typedef struct kvs_stage_desc kvs_stage_desc;       /* kvstrata_plans.h */
typedef struct kvs_sparse_cache kvs_sparse_cache;   /* kvstrata_sparse.h */
typedef struct kvs_sparse_params kvs_sparse_params; /* kvstrata_sparse.h */
typedef struct kvs_sparse_stats kvs_sparse_stats;   /* kvstrata_sparse.h */
typedef struct kvs_store_api kvs_store_api;         /* kvstrata_store.h */

/* The table. Hooks are appended in minor versions only: check struct_size before calling one. */
typedef struct kvs_api {
    uint32_t abi_major, abi_minor, struct_size, reserved;

    /* A static English sentence for a status. Never NULL. */
    const char *(*strerror)(kvs_status status);

    /* Open a handle. On failure *out is NULL and, if `error` is non-NULL, the reason is copied into
     * error[0..error_len) (NUL-terminated). Nothing is left half-initialised. */
    kvs_status (*open)(const kvs_open_params *params, kvs_handle **out, char *error,
                       size_t error_len);
    /* Close a handle: waits for in-flight saves (bounded), releases every lease. NULL: a no-op. */
    void (*close)(kvs_handle *h);
    /* The last error of this handle as a sentence, "" if none. Valid until the next call on h. */
    const char *(*last_error)(const kvs_handle *h);

    /* --- scheduler role --- */
    /* How many tokens beyond n_computed can be loaded now. Pins what it counts (a lease) until the
     * load, the request's end or lease_timeout_ms; calling again replaces the earlier lease. */
    kvs_status (*lookup)(kvs_handle *h, const char *req_id, const int32_t *tokens,
                         uint64_t n_tokens, uint64_t n_computed, kvs_lookup_result *out);
    /* The engine allocated pages for n_external_tokens tokens reported by lookup; block_ids is the
     * request's block table so far. n_external_tokens 0 cancels the load. */
    kvs_status (*on_alloc)(kvs_handle *h, const char *req_id, const uint32_t *block_ids,
                           uint64_t n_block_ids, uint64_t n_external_tokens);
    /* Build the step's metadata for the workers into buf[0..cap). *len gets the size; if cap is
     * too small, returns KVS_EOVERFLOW with *len set to the size needed and changes no state. */
    kvs_status (*build_meta)(kvs_handle *h, const kvs_step_request *reqs, uint64_t n_reqs,
                             void *buf, uint64_t cap, uint64_t *len);
    /* The request is done; its leases are released. *keep_blocks is set to 1 if the engine must
     * keep its pages until get_finished reports it in `sending` (async saves on their way). */
    kvs_status (*request_finished)(kvs_handle *h, const char *req_id, int *keep_blocks);
    /* Copy up to cap pending cache events (stored/removed) into out; *n gets the count taken. */
    kvs_status (*take_events)(kvs_handle *h, kvs_event *out, uint64_t cap, uint64_t *n);

    /* --- worker role --- */
    /* Describe the engine's paged cache, one view per layer, once, before any load or save. Views
     * are copied; the memory they point to is borrowed until close. */
    kvs_status (*register_kv)(kvs_handle *h, const kvs_layer_view *views, uint32_t n_layers);
    /* Bind the step's metadata (from build_meta, possibly in another process). Copied. A step still
     * bound (no forward pass ran) is closed first: its loads land or fail (into load_error_blocks),
     * its saves are dropped. Async loads (load_async) go to the loader here or at start_load. */
    kvs_status (*bind_meta)(kvs_handle *h, const void *meta, uint64_t len);
    /* Issue every load of the bound step. Loads that fail become error blocks, not failures. */
    kvs_status (*start_load)(kvs_handle *h);
    /* Return when layer `layer`'s loads are in the pages (CUDA: the engine's stream waits). */
    kvs_status (*wait_layer_load)(kvs_handle *h, uint32_t layer);
    /* The engine has written layer `layer`'s KV for this step: gather the chunks to save. */
    kvs_status (*save_layer)(kvs_handle *h, uint32_t layer);
    /* Seal and store this step's saves; the bound metadata is cleared afterwards. With async saves
     * it returns once the pages are read (never again) and a saver thread seals and stores them. */
    kvs_status (*wait_save)(kvs_handle *h);
    /* Requests whose async saves (sending: pages kept by request_finished, every save landed or
     * failed) or async loads (receiving: every chunk in the pages or in load_error_blocks) ended
     * since the last call, once each, as NUL-separated ids; *n_* get counts. A list that does not
     * fit is KVS_EOVERFLOW with the count, and nothing is reported (call again with more room). */
    kvs_status (*get_finished)(kvs_handle *h, char *sending, uint64_t sending_cap,
                               uint64_t *n_sending, char *receiving, uint64_t receiving_cap,
                               uint64_t *n_receiving);
    /* Block ids whose load failed in the last bound step (and async loads get_finished reported);
     * the engine recomputes them and discards what the step computed for their requests. Complete
     * after wait_save (or at once in a step without forward); kept until the next bind_meta. */
    kvs_status (*load_error_blocks)(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n);
    /* Counters since open. */
    kvs_status (*stats)(kvs_handle *h, kvs_stats *out);

    /* Since 1.1. The cudaStream_t later wait_layer_load and save_layer calls order against (NULL,
     * the default: the legacy stream); set it again when it changes. Worker role; a no-op on the
     * host device. wait_layer_load is legal in graph capture; save_layer is KVS_ESTATE there. */
    kvs_status (*set_stream)(kvs_handle *h, void *cuda_stream);

    /* since 1.3 and 1.4: restore and stage plans, kvstrata_plans.h */
    kvs_status (*set_plan_caps)(kvs_handle *h, uint32_t caps);
    kvs_status (*plan)(kvs_handle *h, const char *req_id, kvs_restore_plan *out);
    kvs_status (*set_stages)(kvs_handle *h, const kvs_stage_desc *stages);

    /* Since 1.5. The name of tier `tier` (kvs_stats' and kvs_event's index); NULL past the last. */
    const char *(*tier_name)(const kvs_handle *h, uint32_t tier);

    /* since 1.7: token dropping, kvstrata_lossy.h */
    kvs_status (*load_dropped)(kvs_handle *h, const char *req_id, uint64_t first_token,
                               uint64_t n_tokens, uint8_t *mask, uint64_t *n_dropped);
    /* since 1.8: the layer stream cache, kvstrata_lsc.h */
    kvs_status (*lsc_reserve)(kvs_handle *h, const kvs_layer_view *buffer, uint32_t n_blocks,
                              uint32_t *granted, uint32_t *stream_tokens);
    kvs_status (*lsc_fetch)(kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                            const uint32_t *pages, uint32_t n);
    kvs_status (*lsc_store)(kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                            const uint32_t *pages, uint32_t n);
    /* since 1.9: sparse decode, kvstrata_sparse.h */
    kvs_status (*sparse_begin)(kvs_handle *h, const char *req_id, const int32_t *tokens,
                               uint64_t n_tokens, const kvs_sparse_cache *cache,
                               const kvs_sparse_params *params, uint64_t *stored_tokens);
    kvs_status (*sparse_select)(kvs_handle *h, const char *req_id, uint32_t layer, const float *q,
                                uint64_t n_rows, uint32_t flags);
    kvs_status (*sparse_wait)(kvs_handle *h, const char *req_id, uint32_t layer);
    kvs_status (*sparse_stats)(kvs_handle *h, const char *req_id, kvs_sparse_stats *out);
    kvs_status (*sparse_end)(kvs_handle *h, const char *req_id);

    /* Since 1.10. Add bytes[0..len) (copied) to what besides its tokens sets req_id's KV (a salt,
     * a LoRA name, an image hash): they key the chunk holding from_token and every later one.
     * Scheduler role, before the request's first lookup or build_meta; at most 64 inputs, 64 KiB */
    kvs_status (*request_key_input)(kvs_handle *h, const char *req_id, uint64_t from_token,
                                    const void *bytes, uint64_t len);
    /* Since 1.10. build_meta from what changed, with build_meta's contract and a cost that grows
     * with the update, not the context. A request not in reqs keeps its state; one named twice or a
     * *_from past what the library holds is KVS_EINVAL. Scheduler role. */
    kvs_status (*build_meta_update)(kvs_handle *h, const kvs_step_update *reqs, uint64_t n_reqs,
                                    void *buf, uint64_t cap, uint64_t *len);
    /* Since 1.10. What the handle was opened with. Any role; thread-safe with the other calls. */
    kvs_status (*handle_info)(const kvs_handle *h, kvs_handle_info *out);
    /* Since 1.12. The store API (kvstrata_store.h) of major store_major, NULL for another. */
    const kvs_store_api *(*store_api)(uint32_t store_major);
} kvs_api;

/* The single exported entry point. NULL for an ABI major this library does not implement. */
const kvs_api *kvs_get_api(uint32_t abi_major);

/* Same sentences as kvs_api.strerror, for callers that link directly. */
const char *kvs_strerror(kvs_status status);

#ifdef __cplusplus
}
#endif
#endif /* KVSTRATA_H */
