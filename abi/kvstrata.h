/*
 * kvstrata.h - the engine-facing ABI of libkvstrata.
 *
 * An engine loads libkvstrata.so (dlopen, ctypes.CDLL), calls kvs_get_api(KVS_ABI_MAJOR) and from then on
 * talks to the library only through the returned table. The hooks mirror vLLM's KV-connector v1
 * contract: a scheduler-role handle answers lookups and builds one metadata blob per step; a worker-role
 * handle binds that blob and moves KV between the engine's paged cache and the tiers. One process may
 * hold a handle of role KVS_ROLE_BOTH (the mini engine does).
 *
 * Versioning: a new minor version only appends fields to the structs and tables below. A caller that
 * reads a field checks struct_size first. A different major version is refused by kvs_get_api.
 *  - Structs the caller passes in (kvs_open_params, kvs_model_desc, kvs_layer_view, kvs_stage_desc):
 *    any struct_size from the struct's first size (KVS_*_SIZE_1_0 below) up is accepted; fields past
 *    the caller's struct_size read as zero, fields this library does not know are ignored.
 *  - Structs the library fills (kvs_lookup_result, kvs_stats, kvs_restore_plan): the caller sets
 *    struct_size; the library writes min(struct_size, its own sizeof) bytes and refuses a size below
 *    the struct's first size (KVS_EINVAL).
 *  - Arrays: the views array of register_kv and (1.10) the updates of build_meta_update step by
 *    their [0].struct_size (every element carries the same size). kvs_step_request and kvs_event have no struct_size and are frozen for major 1: a
 *    later need is met by a new hook, never by changing them.
 *  - Struct fields are fixed-width integers; the enums name their values only.
 *  Field offsets and sizes are pinned by tests/test_abi.c.
 *
 * Threading: kvs_get_api and kvs_strerror are thread-safe. Calls on one handle must be serialised by
 * the caller (vLLM and the mini engine call each handle from one thread); different handles are
 * independent. Every call returns a kvs_status; on failure kvs_api.last_error(h) names the problem.
 *
 * Ownership: every pointer passed in is borrowed for the duration of the call only, unless a comment
 * says otherwise. The library never hands out memory the caller must free.
 */
#ifndef KVSTRATA_H
#define KVSTRATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_ABI_MAJOR 1
#define KVS_ABI_MINOR 11

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

/* How the model's KV is shaped, per layer, on this rank. Given once at open; part of the fingerprint. */
typedef struct kvs_model_desc {
    uint32_t struct_size;  /* sizeof(kvs_model_desc) */
    const char *model_id;  /* e.g. "meta-llama/Llama-3.1-8B"; copied at open */
    uint32_t dtype;        /* element type of the KV cache (kvs_dtype) */
    uint32_t n_layers;     /* attention layers held by this rank */
    uint32_t n_kv_heads;   /* KV heads held by this rank (1 for MLA) */
    uint32_t head_dim;     /* elements per head (MLA: latent width, e.g. 576) */
    uint32_t block_tokens; /* engine page size in tokens (vLLM default 16) */
    uint32_t is_mla;       /* 1: one latent tensor per layer, no V; keys are rank-agnostic */
    uint32_t tp_rank; /* tensor-parallel rank and size; ignored for MLA. Keys carry the rank. */
    uint32_t tp_size; /* (1.5) the scheduler-side hooks (lookup, build_meta) work for every rank:
                            * a chunk is a hit only when every rank's shard of it is stored, and the
                            * metadata carries each rank's keys, so any rank's worker binds it */
    const char *salt; /* optional extra fingerprint input (LoRA id, ...); NULL for none */
    /* appended during 1.0: a struct of KVS_MODEL_DESC_SIZE_1_0 bytes, from before it, reads it as 0 */
    uint32_t vocab_size; /* token ids must lie in [0, vocab_size); 0 checks only for negatives */
} kvs_model_desc;

#define KVS_MODEL_DESC_SIZE_1_0 56u /* up to and including salt: the smallest accepted */

typedef struct kvs_open_params {
    uint32_t struct_size;        /* sizeof(kvs_open_params) */
    uint32_t role;               /* kvs_role */
    const char *config_path;     /* YAML file; NULL means built-in defaults (one DRAM tier) */
    const kvs_model_desc *model; /* required */
    /* (1.10) disaggregated prefill and decode (kvs_transfer_role); a struct from before it reads as
     * KVS_TRANSFER_BOTH */
    uint32_t transfer_role;
} kvs_open_params;

#define KVS_OPEN_PARAMS_SIZE_1_0 24u

/* What a handle moves between the engine and the tiers (kvs_open_params.transfer_role, 1.10): vLLM's
 * kv_role. A producer (a prefill instance) only saves: its lookups answer 0 hit tokens and pin
 * nothing. A consumer (a decode instance) only loads: its build_meta emits no saves, and its lookups
 * never wait for a remote node (loads.remote_lookups is async whatever the YAML says). */
typedef enum kvs_transfer_role {
    KVS_TRANSFER_BOTH = 0,
    KVS_TRANSFER_PRODUCER = 1,
    KVS_TRANSFER_CONSUMER = 2
} kvs_transfer_role;

typedef enum kvs_device_kind {
    KVS_DEVICE_HOST = 0, /* host device emulation: the "GPU" pages are ordinary RAM */
    KVS_DEVICE_CUDA = 1  /* device memory of CUDA ordinal `device_index` */
} kvs_device_kind;

/*
 * One layer of the engine's paged KV cache, described by byte strides so a single descriptor covers
 * vLLM FlashAttention NHD [2,blocks,bs,heads,dim], HND permutations, FlashInfer [blocks,2,bs,heads,dim],
 * MLA [blocks,bs,latent] (v_base NULL) and block-major cross-layer [blocks,layers,2,bs,heads,dim].
 * The bytes of head h of token t of block b are at k_base + b*block_stride + t*token_stride +
 * h*head_stride, and are head_dim * element-size bytes long and contiguous. The memory stays owned
 * by the engine and must stay valid until the handle is closed.
 */
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

/* scheduler side -------------------------------------------------------------------------------- */

typedef struct kvs_lookup_result {
    uint32_t struct_size;
    uint64_t
        n_hit_tokens;    /* tokens loadable beyond n_computed; a full-prompt hit reports one less */
    uint8_t unknown_yet; /* 1: cannot tell without blocking; ask again next step (vLLM's None) */
    uint8_t load_async;  /* 1: load between steps (request waits for remote KV); 0: in the forward.
                         * (1.5) set per the config's `loads.async` (never, always, or for hits on a
                         * tier slower than `loads.async_below`). The engine then does not schedule
                         * the request until a worker's get_finished lists it in `receiving`: its KV
                         * is in the pages then, or its failed blocks are in load_error_blocks */
    /* (1.6) of n_hit_tokens, those that load lossy: their chunks were stored compressed by a
     * compress tier (docs/compress.md) and land as their codec decodes them. Always 0 unless the
     * config's `loads.accept_lossy` is true: without it a lookup's hit ends before the first lossy
     * chunk, and the engine recomputes from there */
    uint64_t n_lossy_tokens;
    /* (1.10) the handle's chunk size: what it stores and finds is whole chunks of this many tokens
     * (a hit ends on a chunk boundary, but for the full-prompt rule above) */
    uint32_t chunk_tokens;
} kvs_lookup_result;

#define KVS_LOOKUP_RESULT_SIZE_1_0 24u

/* A block id in a scheduler-side block table (on_alloc, build_meta, build_meta_update) for a block
 * the engine holds no page for (a sliding-window layer group's blocks out of its window): no save
 * reads it (a chunk touching one is not saved) and no load may land in it (KVS_EINVAL). */
#define KVS_BLOCK_NONE UINT32_MAX

/* One request scheduled in this step, as the engine's scheduler sees it. Frozen for major 1 (no
 * struct_size: build_meta reads an array of them). */
typedef struct kvs_step_request {
    const char *req_id;    /* NUL-terminated, <= 255 bytes */
    const int32_t *tokens; /* every token of the request known so far (prompt, then outputs) */
    uint64_t n_tokens;
    const uint32_t *block_ids; /* the request's whole block table, in token order */
    uint64_t n_block_ids;
    uint64_t
        n_computed; /* tokens whose KV is in the pages before this step, external hits included */
    uint64_t n_scheduled; /* tokens the engine computes in this step */
} kvs_step_request;

/* (1.10) One request of a step as what changed since the library last saw it (build_meta_update).
 * The library keeps each request's tokens and block table (from lookup, on_alloc, build_meta and
 * build_meta_update), so a step passes only what is new. An array element; every element carries
 * the same struct_size (>= KVS_STEP_UPDATE_SIZE_1_10). */
typedef struct kvs_step_update {
    uint32_t struct_size; /* sizeof(kvs_step_update) */
    uint32_t reserved;
    const char *req_id;   /* NUL-terminated, <= 255 bytes */
    uint64_t tokens_from; /* the request's tokens become its first tokens_from tokens (of those the
                           * library holds) followed by tokens[0..n_tokens); 0 for a new or resumed
                           * request: the whole list */
    const int32_t *tokens;
    uint64_t n_tokens;
    uint64_t blocks_from; /* the same for its block table */
    const uint32_t *block_ids;
    uint64_t n_block_ids;
    uint64_t n_computed; /* as kvs_step_request's */
    uint64_t n_scheduled;
} kvs_step_update;

#define KVS_STEP_UPDATE_SIZE_1_10 80u

/* (1.10) What a handle was opened with (handle_info): what an engine needs to plan its calls (which
 * requests can save in a step) and what an operator's tool shows. */
typedef struct kvs_handle_info {
    uint32_t struct_size;   /* sizeof(kvs_handle_info), set by the caller */
    uint32_t role;          /* kvs_role */
    uint32_t transfer_role; /* kvs_transfer_role */
    uint32_t chunk_tokens;  /* tokens per chunk: saves and loads move whole chunks */
    uint32_t key_ranks;     /* chunk keys per chunk (one per TP rank with keys of its own) */
    uint32_t n_tiers;       /* tiers in the chain (tier_name names them) */
    uint32_t save_decode;   /* 1: tokens produced while decoding are saved too; 0: the prompt's */
    uint32_t saves_async;   /* 1: saves land after wait_save (`saves.async`), get_finished's
                                * sending list reports them */
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

/* restore plans (ABI 1.3) ------------------------------------------------------------------------ */

#define KVS_MAX_STAGES 8u

/* What an engine can execute besides loading the whole external range (set_plan_caps). */
#define KVS_PLAN_CAP_TOKEN 1u /* recompute the front of the external range while the rest loads */
#define KVS_PLAN_CAP_LAYER \
    2u /* recompute the lower layers of the external range while the upper load */
#define KVS_PLAN_CAP_STAGE \
    4u /* (1.4) pipeline stages restore their own layers at once, each from its
                               * stored boundary activations (set_stages first) */
#define KVS_PLAN_CAP_MASK \
    8u /* (1.7) attention leaves out the positions load_dropped reports: hits may
                               * include chunks a compress tier stored with tokens dropped (with
                               * loads.accept_lossy); a stock engine, which would attend to
                               * whatever the dropped slots hold, never gets them */

typedef enum kvs_plan_mode {
    KVS_PLAN_LOAD = 0,  /* the connector loads the whole external range (stock behaviour) */
    KVS_PLAN_TOKEN = 1, /* the engine computes [first_token, first_token + recompute_tokens) while
                             * the connector loads [first_token + recompute_tokens, end_token) */
    KVS_PLAN_RECOMPUTE = 2, /* the engine computes the whole external range; nothing is loaded */
    KVS_PLAN_LAYER = 3, /* the engine computes layers [0, recompute_layers) of every token of the
                             * range while the connector loads layers [recompute_layers, n_layers) */
    KVS_PLAN_STAGE = 4  /* (1.4) stage s computes its layers [first_layer[s], first_layer[s] +
                             * stage_recompute_layers[s]) of every token of the range (stage 0 from the
                             * embeddings, stage s > 0 from its boundary activations, which the
                             * connector loads first) while the connector loads every other KV layer;
                             * the stages may run at once */
} kvs_plan_mode;

/* How one request's external range is restored in the step build_meta just planned. */
typedef struct kvs_restore_plan {
    uint32_t struct_size; /* sizeof(kvs_restore_plan), set by the caller */
    uint32_t mode;        /* kvs_plan_mode */
    uint64_t first_token; /* the external range [first_token, end_token): n_computed at lookup .. */
    uint64_t end_token;   /* .. plus the external tokens given to on_alloc */
    uint64_t
        recompute_tokens; /* leading tokens of the range the engine computes itself (all of them,
                                * through the lower layers only, in layer mode) */
    double predicted_ms;  /* the planner's restore time for the request (0: no planner) */
    uint32_t recompute_layers; /* layer mode: layers the engine computes; 0 otherwise */
    uint32_t reserved;
    /* --- 1.4 (filled when struct_size covers them) --- */
    uint32_t n_stages; /* stage mode: the engine's stages; 0 otherwise */
    uint32_t stage_recompute_layers[KVS_MAX_STAGES]; /* stage mode: layers each stage computes */
} kvs_restore_plan;

/* sizeof(kvs_restore_plan) in ABI 1.3, which `plan` still accepts */
#define KVS_RESTORE_PLAN_SIZE_1_3 48u

/* An engine's pipeline stages (set_stages, ABI 1.4). The model's registered layers are the KV layers
 * [0, n_kv_layers) followed by one group of boundary_layers registered layers per stage boundary:
 * the activations entering stage s > 0 (its first layer's input) live in layers n_kv_layers + (s - 1)
 * * boundary_layers .. + boundary_layers - 1, written by the engine in its forward and saved and
 * loaded like KV (same view shape; the bytes are the engine's business). */
typedef struct kvs_stage_desc {
    uint32_t struct_size; /* sizeof(kvs_stage_desc) */
    uint32_t n_stages;    /* 2..KVS_MAX_STAGES */
    uint32_t
        n_kv_layers; /* kvs_model_desc.n_layers = n_kv_layers + (n_stages - 1) * boundary_layers */
    uint32_t boundary_layers; /* >= 1 */
    uint32_t
        first_layer[KVS_MAX_STAGES]; /* stage s owns KV layers [first_layer[s], first_layer[s + 1])
                                           * (n_kv_layers after the last); first_layer[0] = 0 */
} kvs_stage_desc;

#define KVS_STAGE_DESC_SIZE_1_4 48u /* its first size */

/* worker side ----------------------------------------------------------------------------------- */

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
    /* ABI 1.2: where loads came from. Read only when struct_size covers them. */
    uint32_t n_tiers; /* tiers in the chain (the first 8 are reported) */
    uint64_t tier_chunks_loaded
        [KVS_STATS_MAX_TIERS]; /* chunks_loaded, split by the tier that served them */
    /* ABI 1.5. Read only when struct_size covers them. */
    uint64_t tokens_loaded;                          /* tokens whose KV landed in the pages */
    uint64_t tier_bytes_loaded[KVS_STATS_MAX_TIERS]; /* bytes_loaded, split by serving tier */
    uint64_t tier_load_ns[KVS_STATS_MAX_TIERS];      /* time reading from the tier (and, for a
                                                      * zero-copy tier, copying its bytes out) */
    uint64_t async_loads_started; /* requests whose load runs between steps (load_async) */
    uint64_t async_loads_done;    /* of those, reported in get_finished's receiving list */
    uint64_t async_loads_failed;  /* of those, with at least one chunk in load_error_blocks */
    uint64_t steps_closed; /* bound steps closed by the next bind_meta (no forward pass: the engine
                            * skipped the layer hooks and wait_save) */
    uint64_t lookups_unknown; /* lookups answered unknown_yet (loads.remote_lookups: async) */
    /* ABI 1.6. Read only when struct_size covers it. */
    uint64_t lossy_chunks_loaded; /* of chunks_loaded, those decoded from a lossy object */
    /* ABI 1.10 (`saves: {async: true}`). Read only when struct_size covers them. */
    uint64_t saves_async;     /* saves wait_save handed to the saver thread (counted again in
                               * chunks_saved or saves_skipped once they land or fail) */
    uint64_t saves_in_flight; /* of those, not landed yet (a gauge) */
    uint64_t sends_reported;  /* requests get_finished reported in its sending list */
    /* ABI 1.11. Read only when struct_size covers it. */
    uint64_t integrity_rejects; /* objects a keyed tier served whose tags were wrong or missing
                                 * (`integrity: keyed`): each a miss, never loaded */
} kvs_stats;

#define KVS_STATS_SIZE_1_0 136u /* up to and including save_gbps */
#define KVS_STATS_SIZE_1_2 208u /* up to and including tier_chunks_loaded */

/* sparse decode (ABI 1.9, docs/sparse.md) -------------------------------------------------------- */

/* The engine's head cache: for every layer and KV head, `slots` rows of K and of V the connector
 * fills with the rows each decode step selects (LiteCache's query-similarity head cache). Row r of
 * the context is position r of the request. Host memory only in 1.9. */
typedef struct kvs_sparse_cache {
    uint32_t struct_size; /* sizeof(kvs_sparse_cache) */
    uint32_t slots;       /* rows per (layer, KV head) */
    void *k; /* [n_layers][n_kv_heads][slots][head bytes]: K of the rows in the slots, as stored */
    void *v; /* the same for V */
    uint32_t *slot_rows; /* [n_layers][n_kv_heads][slots]: the context row each slot holds, or
                          * UINT32_MAX for none. Written by the connector only; begin sets every
                          * entry to UINT32_MAX */
    uint8_t *hit; /* [n_layers][n_kv_heads]: 1 when the head's last step reused its rows (moved
                   * nothing), 0 when it selected again */
    uint32_t *attend_from; /* [n_layers][n_kv_heads]: the row from which the engine attends its
                            * own rows at the head's last step: the pool's end when the slots'
                            * rows were selected (a reusing head keeps it, so the rows that
                            * entered the pool since are attended by the engine, not dropped) */
} kvs_sparse_cache;

#define KVS_SPARSE_CACHE_SIZE_1_9 48u

/* How a request's sparse decode selects. Zero fields take the defaults. */
typedef struct kvs_sparse_params {
    uint32_t struct_size; /* sizeof(kvs_sparse_params) */
    uint32_t topk;        /* rows selected per KV head and step (<= slots; 0: slots) */
    uint32_t sink;        /* leading rows the engine attends itself (never selected) */
    uint32_t recent;      /* trailing rows the engine attends itself (never selected) */
    uint32_t q_per_kv;    /* query heads a KV head serves (GQA group); 0: 1 */
    float eta;            /* QSAC: a head of importance 1 reuses while its similarity > eta (0.8) */
    float p;              /* QSAC: lambda = importance^p (3) */
    uint32_t reserved;
    const float *importance;     /* [n_layers][n_kv_heads] in [0, 1], copied; NULL: all 1 */
    uint64_t max_tokens;         /* the longest the request's context gets (sizes the connector's
                              * copy of its keys); 0: n_tokens of the first sparse_begin */
    uint32_t layout;             /* where missed rows are read from: KVS_SPARSE_LAYOUT_ROWS (0) */
    uint32_t profile_steps;      /* LAYOUT_SWARM: steps of each layer profiled first (0: 16) */
    uint64_t cluster_cache_rows; /* LAYOUT_SWARM: rows of hot clusters kept in DRAM (0: none) */
    uint32_t cluster_cache;      /* KVS_SPARSE_CACHE_SCORE (Swarm's Eq. 6) or _LRU */
    float min_useful;     /* LAYOUT_SWARM: a layer is profiled and clustered again once less than
                       * this share of the rows its clusters bring is needed (0: never) */
    uint32_t index;       /* how a miss selects: KVS_SPARSE_INDEX_EXACT (0) or _MEDOIDS */
    uint32_t audit_every; /* adaptive thresholds: every audit_every-th step of a head is measured
                           * (0: 8) */
    float target_error;   /* adaptive thresholds (0: none, tau stays as eta and p make it): each
                           * head's tau rises while the attention its reused rows lose, measured
                           * against the exact top-k on audited steps, is above this, and falls
                           * while it is below half of it (kvs_qsac_adapt, docs/sparse.md) */
    float score_scale;    /* softmax logits are q.k * score_scale (0: 1/sqrt(head_dim), for
                           * unscaled queries) */
} kvs_sparse_params;

#define KVS_SPARSE_PARAMS_SIZE_1_9 88u

/* kvs_sparse_params.index. EXACT: the top-k of every stored key's score. MEDOIDS (with a cluster
 * layout, once a layer's clusters exist): only each cluster's medoid is scored, and whole clusters
 * are taken, best medoid first, while fewer than topk rows are taken (Swarm's retrieval: no
 * oracle, an approximate top-k); the exact top-k before that. */
#define KVS_SPARSE_INDEX_EXACT   0u
#define KVS_SPARSE_INDEX_MEDOIDS 1u

/* kvs_sparse_params.layout. ROWS: each row is read from its chunk object, in the tier holding
 * it. SWARM: Swarm's clusters in the chain's SSD tier: each layer's selections are profiled, its
 * rows clustered by co-activation and written as cluster objects, and a miss reads whole clusters
 * (docs/sparse.md). */
#define KVS_SPARSE_LAYOUT_ROWS      0u
#define KVS_SPARSE_LAYOUT_SWARM     1u
/* the same cluster objects, but of consecutive rows (no profiling): Swarm's comparator */
#define KVS_SPARSE_LAYOUT_POSITIONS 2u
/* kvs_sparse_params.cluster_cache */
#define KVS_SPARSE_CACHE_SCORE      0u /* keep the clusters of highest Eq. 6 score */
#define KVS_SPARSE_CACHE_LRU        1u /* keep the most recently used clusters */

/* sparse_select flags */
#define KVS_SPARSE_FINAL 0u /* the layer's real query */
#define KVS_SPARSE_SPECULATIVE \
    1u /* an approximate query issued early (e.g. for layer i + 1 while
                                   * layer i computes); a later FINAL call corrects it */

/* Counters of a request's sparse decode (sparse_stats). Head steps count one per KV head. */
typedef struct kvs_sparse_stats {
    uint32_t struct_size;
    uint32_t reserved;
    uint64_t stored_tokens;  /* the context rows the connector selects from */
    uint64_t chunks_refused; /* chunks whose object failed its check at begin: never selected */
    uint64_t steps;          /* sparse_select calls run */
    uint64_t head_hits;      /* head steps that reused the cached rows */
    uint64_t head_misses;    /* head steps that selected again */
    uint64_t rows_fetched;   /* rows read from the tiers into the head cache */
    uint64_t bytes_fetched;  /* their K and V bytes */
    uint64_t rows_failed;    /* rows a tier could not read or that failed their row hash (their
                               * slots hold UINT32_MAX) */
    uint64_t spec_steps;     /* SPECULATIVE calls run */
    uint64_t spec_corrected; /* head steps of a FINAL call that selected again after a
                               * SPECULATIVE one of the same layer (the speculation was wrong) */
    uint64_t spec_kept;      /* head steps of such FINAL calls that kept the speculative rows */
    uint64_t select_ns;      /* time scoring and selecting */
    uint64_t fetch_ns;       /* time reading rows (clustering included) */
    /* LAYOUT_SWARM */
    uint64_t layouts_found;      /* layers whose clusters a manifest in the tier named at begin */
    uint64_t layouts_written;    /* layers clustered and written (re-clustering included) */
    uint64_t reclustered;        /* of those, re-clusterings by maintenance */
    uint64_t clusters_read;      /* cluster objects read from the tier */
    uint64_t cluster_bytes_read; /* their bytes */
    uint64_t cluster_cache_hits; /* clusters the hot-cluster cache held */
    uint64_t rows_from_clusters; /* of rows_fetched, those that came out of clusters */
    uint64_t keys_scored;        /* keys (rows, or medoids) the selections scored */
    uint64_t medoid_selections;  /* head steps that selected through the medoid index */
    /* adaptive thresholds */
    uint64_t audits;                  /* head steps measured */
    uint64_t audit_error_micro;       /* the sum of their attention errors, in millionths */
    uint64_t tau_raised, tau_lowered; /* threshold changes */
} kvs_sparse_stats;

#define KVS_SPARSE_STATS_SIZE_1_9 216u

/* The table. Fields are appended in minor versions only; check struct_size before reading new ones. */
typedef struct kvs_api {
    uint32_t abi_major;
    uint32_t abi_minor;
    uint32_t struct_size;
    uint32_t reserved;

    /* A static English sentence for a status. Never NULL. */
    const char *(*strerror)(kvs_status status);

    /* Open a handle. On failure *out is NULL and, if `error` is non-NULL, the reason is copied into
     * error[0..error_len) (NUL-terminated). Nothing is left half-initialised. */
    kvs_status (*open)(const kvs_open_params *params, kvs_handle **out, char *error,
                       size_t error_len);
    /* Close a handle: waits for in-flight saves (bounded), releases every lease. NULL is a no-op. */
    void (*close)(kvs_handle *h);
    /* The last error of this handle as a sentence, "" if none. Valid until the next call on h. */
    const char *(*last_error)(const kvs_handle *h);

    /* --- scheduler role --- */

    /* How many tokens beyond n_computed can be loaded now. Pins what it counts (a lease) until the
     * load completes, the request finishes or lease_timeout_ms passes. Calling again for the same
     * request replaces the earlier lease. tokens are borrowed for the call. */
    kvs_status (*lookup)(kvs_handle *h, const char *req_id, const int32_t *tokens,
                         uint64_t n_tokens, uint64_t n_computed, kvs_lookup_result *out);
    /* The engine allocated pages for n_external_tokens tokens reported by lookup; block_ids is the
     * request's block table so far. n_external_tokens 0 cancels the load. */
    kvs_status (*on_alloc)(kvs_handle *h, const char *req_id, const uint32_t *block_ids,
                           uint64_t n_block_ids, uint64_t n_external_tokens);
    /* Build the step's metadata for the workers into buf[0..cap). *len gets the size; if cap is too
     * small, returns KVS_EOVERFLOW with *len set to the size needed and changes no state. */
    kvs_status (*build_meta)(kvs_handle *h, const kvs_step_request *reqs, uint64_t n_reqs,
                             void *buf, uint64_t cap, uint64_t *len);
    /* The request is done; its leases are released. *keep_blocks is set to 1 if the engine must keep
     * the request's pages until get_finished reports it in `sending` (1.10: with `saves: {async:
     * true}`, for a request whose saves were emitted: they may still be on their way to the tiers;
     * the next build_meta tells the workers, which report it once every save of it has landed or
     * failed). */
    kvs_status (*request_finished)(kvs_handle *h, const char *req_id, int *keep_blocks);
    /* Copy up to cap pending cache events (stored/removed) into out; *n gets the count taken. */
    kvs_status (*take_events)(kvs_handle *h, kvs_event *out, uint64_t cap, uint64_t *n);

    /* --- worker role --- */

    /* Describe the engine's paged cache, one view per layer, once, before any load or save. The
     * views are copied; the memory they point to is borrowed until close. The array's element size
     * is views[0].struct_size (>= KVS_LAYER_VIEW_SIZE_1_0; every element carries the same). */
    kvs_status (*register_kv)(kvs_handle *h, const kvs_layer_view *views, uint32_t n_layers);
    /* Bind the step's metadata (from build_meta, possibly in another process). Copied. (1.5) A step
     * still bound (the engine ran no forward pass: it skipped the layer hooks and wait_save) is closed
     * first: its loads land or fail, its saves are dropped, its pins and slabs are released, and the
     * blocks of its failed loads stay in load_error_blocks for this step. Requests whose load is
     * asynchronous (load_async) are handed to the background loader here or at start_load. */
    kvs_status (*bind_meta)(kvs_handle *h, const void *meta, uint64_t len);
    /* Issue every load of the bound step. Loads that fail become error blocks, not failures. */
    kvs_status (*start_load)(kvs_handle *h);
    /* Return when layer `layer`'s loads have landed in the pages (host device: at once; CUDA: the
     * engine's current stream is made to wait on the layer's event). */
    kvs_status (*wait_layer_load)(kvs_handle *h, uint32_t layer);
    /* The engine has written layer `layer`'s KV for this step: gather the chunks to save. */
    kvs_status (*save_layer)(kvs_handle *h, uint32_t layer);
    /* Seal and store this step's saves; the bound metadata is cleared afterwards. (1.10) With `saves:
     * {async: true}` it returns once the gathers out of the pages are complete (the pages are not
     * read again) and a saver thread hashes, seals and stores them. */
    kvs_status (*wait_save)(kvs_handle *h);
    /* Requests whose async saves (sending) or async loads (receiving) ended since the last call.
     * Each list is a buffer of NUL-separated request ids; *n_* get counts. (1.5) An async load is
     * reported once, when every chunk of it is in the pages or has failed (its blocks are then in
     * load_error_blocks until the next bind_meta). A list that does not fit returns KVS_EOVERFLOW
     * with the count and reports nothing (call again with more room). (1.10) sending lists, once
     * each, the requests request_finished kept the pages of (keep_blocks 1: async saves) after every
     * save this worker issued for them has landed in the tiers or failed (a failed save is a later
     * miss); without async saves it stays empty. */
    kvs_status (*get_finished)(kvs_handle *h, char *sending, uint64_t sending_cap,
                               uint64_t *n_sending, char *receiving, uint64_t receiving_cap,
                               uint64_t *n_receiving);
    /* Block ids whose load failed in the last bound step; the engine recomputes them. Complete
     * after wait_save (a CUDA device verifies checksums on the host while the copies run, so a
     * mismatch can surface only then: the engine discards what the step computed for the requests
     * owning these blocks, as vLLM does for failed loads); kept until the next bind_meta. (1.5) In a
     * step with no forward pass (no layer hooks, no wait_save) it lands the step's loads first, so
     * the list is complete there too; it also holds the failed blocks of async loads get_finished
     * reported in this step. */
    kvs_status (*load_error_blocks)(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n);
    /* Counters since open. */
    kvs_status (*stats)(kvs_handle *h, kvs_stats *out);

    /* --- 1.1 --- */

    /* The engine's CUDA stream (a cudaStream_t) that later wait_layer_load and save_layer calls
     * order against; NULL (the default) is the legacy default stream. Call it before each step if
     * the engine's current stream changes (e.g. around CUDA graph capture). Worker role; a no-op on
     * the host device. wait_layer_load is legal inside stream capture; save_layer is not (it
     * returns KVS_ESTATE there). */
    kvs_status (*set_stream)(kvs_handle *h, void *cuda_stream);

    /* --- 1.3: restore plans --- */

    /* Declare the plans this engine executes (KVS_PLAN_CAP_* bits; 0, the default, for a stock
     * engine). Scheduler role, before the first lookup. With `restore.scheduler: cacheflow` an engine
     * with no caps gets prefix plans through lookup (fewer tokens offered when recomputing the tail is
     * faster than loading it); one with KVS_PLAN_CAP_TOKEN gets two-pointer plans through `plan`. */
    kvs_status (*set_plan_caps)(kvs_handle *h, uint32_t caps);
    /* The plan the last build_meta made for req_id. Every request whose load that build_meta
     * emitted has one (KVS_PLAN_LOAD when no planner is configured); KVS_ENOTFOUND for any other.
     * The engine must follow it: loads of the recomputed tokens are not issued. */
    kvs_status (*plan)(kvs_handle *h, const char *req_id, kvs_restore_plan *out);

    /* --- 1.4: stage plans --- */

    /* Describe the engine's pipeline stages and where their boundary activations are registered
     * (kvs_stage_desc). Scheduler role, before set_plan_caps(KVS_PLAN_CAP_STAGE) and the first lookup.
     * Restore plans then price layers as the n_kv_layers KV layers only. */
    kvs_status (*set_stages)(kvs_handle *h, const kvs_stage_desc *stages);

    /* --- 1.5: vLLM's call order --- */

    /* The name of tier `tier` of the configured chain (the index kvs_stats and kvs_event use), or NULL
     * past the last tier. Valid until close. Any role. */
    const char *(*tier_name)(const kvs_handle *h, uint32_t tier);

    /* --- 1.7: token dropping --- */

    /* The positions of req_id in [first_token, first_token + n_tokens) whose KV the bound step's
     * loads left out (chunks stored with tokens dropped, docs/compress.md): mask[i] is set to 1 for
     * position first_token + i if it was dropped, and left as it is otherwise; *n_dropped gets how
     * many were. The engine leaves them out of attention for the rest of the request (their slots
     * hold zeros). Worker role, between start_load and wait_save; only a step whose scheduler
     * declared KVS_PLAN_CAP_MASK loads such chunks (any other step's loads refuse them), and only
     * synchronous loads do (load_async ones refuse them: the engine recomputes). A request with no
     * such load gets KVS_OK and 0. The mask holds for every layer, and per worker: under tensor
     * parallelism each rank's chunks keep tokens chosen from its own heads, and each rank masks its
     * own. Pages with dropped slots must never serve a later request's prefix (an engine's own
     * prefix cache), and a position whose block is recomputed (load_error_blocks) is no longer
     * dropped. */
    kvs_status (*load_dropped)(kvs_handle *h, const char *req_id, uint64_t first_token,
                               uint64_t n_tokens, uint8_t *mask, uint64_t *n_dropped);

    /* --- 1.8: the layer stream cache (docs/peer_gpu.md) --- */

    /* The engine keeps KV of its own in memory another process lends (the handle's first tier of
     * type peer_gpu), a stream block at a time: chunk_tokens tokens of every layer together
     * (block-major), fetched into and stored from a small buffer of its own one layer at a time, so
     * its context can outgrow its own memory (SwiftCache's layer stream cache). `buffer` describes
     * that buffer as one layer of pages in the registered caches' geometry (heads, head size, block
     * tokens; its own n_blocks); every stream block takes chunk_tokens / block_tokens of its pages
     * while it is in the buffer. Reserve n_blocks stream blocks (zeroed), keeping those reserved
     * already; *granted gets how many the handle holds (fewer than asked when the lent memory has
     * no room for more), *stream_tokens (may be NULL) the tokens of a stream block (the config's
     * chunk_tokens): call with n_blocks 0 first to learn it, which gives every block back (buffer
     * may then be NULL). Worker role, after register_kv; host
     * device only (KVS_ENOTSUP elsewhere, and without a peer_gpu tier). A stream block whose memory
     * the lender takes back is gone: fetch and store fail with KVS_EIO and the engine recomputes
     * what it held. */
    kvs_status (*lsc_reserve)(kvs_handle *h, const kvs_layer_view *buffer, uint32_t n_blocks,
                              uint32_t *granted, uint32_t *stream_tokens);
    /* Copy layer `layer` of stream blocks blocks[0..n) into the buffer: block i's tokens go to the
     * buffer pages pages[i * P .. (i + 1) * P), P = chunk_tokens / block_tokens, in token order. */
    kvs_status (*lsc_fetch)(kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                            const uint32_t *pages, uint32_t n);
    /* The reverse: layer `layer` of the buffer pages into stream blocks blocks[0..n). */
    kvs_status (*lsc_store)(kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                            const uint32_t *pages, uint32_t n);

    /* --- 1.9: sparse decode (docs/sparse.md) --- */

    /* Decode req_id attending, per KV head, to a selected set of its context rows instead of all
     * of them. The rows come from the chunks of `tokens` the tiers hold: the stored prefix, read
     * once here and checked whole, pinned until sparse_end; *stored_tokens (may be NULL) gets its
     * length: the stored prefix ends at the first chunk no tier holds, that a tier would not pin,
     * or whose object failed its check (chunks_refused; the engine recomputes from there). The connector keeps each row's key (for selection) and a hash of its K and V bytes
     * (each row read later is checked against it). `cache` and `params` are copied; the memory
     * cache points to is borrowed until sparse_end. Calling it again for a request already begun
     * takes the chunks of tokens it has not taken yet (decode completed and saved more): cache
     * and params are then ignored and may be NULL, and tokens must begin with the tokens taken
     * (KVS_EINVAL otherwise). Worker role after register_kv; host device
     * only (KVS_ENOTSUP elsewhere), not MLA. */
    kvs_status (*sparse_begin)(kvs_handle *h, const char *req_id, const int32_t *tokens,
                               uint64_t n_tokens, const kvs_sparse_cache *cache,
                               const kvs_sparse_params *params, uint64_t *stored_tokens);
    /* The step of layer `layer` for a query at context row n_rows - 1: q holds n_kv_heads *
     * q_per_kv query heads of head_dim floats (post-RoPE, any scale), grouped by KV head. For each
     * KV head, QSAC decides: a hit reuses the head's rows (hit = 1, nothing moves); a miss selects
     * the exact top-k of the group's scores q.k over the pool, rows [sink, min(n_rows - recent,
     * stored_tokens)), and reads only the rows the head's slots lack. The engine attends to the
     * selected rows (slot_rows), to [0, sink) and to [attend_from, n_rows) itself; attend_from is
     * the pool's end when the slots were selected (a head whose pool shrank since, the context
     * having gone back, selects again). The call only enqueues when every tier may be read from
     * another thread (the work runs on the request's own thread); the layer's slots, slot_rows,
     * hit flags and attend_from are the connector's until sparse_wait for the layer returns.
     * flags: KVS_SPARSE_FINAL or KVS_SPARSE_SPECULATIVE. A FINAL call after a SPECULATIVE one for
     * the same layer is decided against the label the speculative step left (its query where it
     * selected, the older one where it reused): a head whose real query is close keeps the rows
     * (spec_kept), any other selects again and reads the difference (spec_corrected). */
    kvs_status (*sparse_select)(kvs_handle *h, const char *req_id, uint32_t layer, const float *q,
                                uint64_t n_rows, uint32_t flags);
    /* Return when every sparse_select of layer `layer` so far has landed. A row that could not be
     * read, or failed its hash, is not in the slots (rows_failed); the call still returns KVS_OK. */
    kvs_status (*sparse_wait)(kvs_handle *h, const char *req_id, uint32_t layer);
    /* The request's counters (out->struct_size set by the caller). */
    kvs_status (*sparse_stats)(kvs_handle *h, const char *req_id, kvs_sparse_stats *out);
    /* Wait for the request's selections, unpin its chunks and forget it. close ends every
     * request still begun: a step in progress finishes (it may still write into the head cache
     * while close runs), steps only queued are dropped. */
    kvs_status (*sparse_end)(kvs_handle *h, const char *req_id);

    /* --- 1.10: per-request key inputs, metadata from deltas --- */

    /* Add bytes[0..len) (copied) to req_id's key inputs: what besides its tokens sets its KV (a
     * tenant's salt, a LoRA adapter's name, an image's hash). They enter the key of the chunk holding
     * position from_token and so, the keys being a chain, of every later chunk: requests with the
     * same tokens and different inputs never share a chunk from there on; the same tokens and
     * inputs give the same keys in any process. Several calls accumulate (within a chunk they hash
     * by position, then in call order); a request with none keys as before 1.10. Scheduler role,
     * before the request's first lookup or build_meta (KVS_ESTATE after); at most 64 inputs and 64
     * KiB in all per request (KVS_EINVAL beyond). request_finished forgets them. */
    kvs_status (*request_key_input)(kvs_handle *h, const char *req_id, uint64_t from_token,
                                    const void *bytes, uint64_t len);
    /* build_meta from what changed: the same metadata, loads, saves, leases and KVS_EOVERFLOW
     * contract as build_meta given the same whole token lists and block tables, at a cost that grows
     * with the update, not with context length. A request not in reqs keeps its state (send each
     * request every step or only when it changes); one seen first by lookup already has its tokens
     * here (on_alloc: its block table). tokens_from or blocks_from past what the library holds, or a
     * request named twice, is KVS_EINVAL. The metadata carries only requests with a load or a save
     * in the step, each with the block ids of what it loads and saves. Scheduler role; reqs and
     * what they point to are borrowed for the call. */
    kvs_status (*build_meta_update)(kvs_handle *h, const kvs_step_update *reqs, uint64_t n_reqs,
                                    void *buf, uint64_t cap, uint64_t *len);
    /* What the handle was opened with (kvs_handle_info), filled up to out->struct_size (at least
     * KVS_HANDLE_INFO_SIZE_1_10). Any role; thread-safe with the handle's other calls. */
    kvs_status (*handle_info)(const kvs_handle *h, kvs_handle_info *out);
} kvs_api;

/* The single exported entry point. Returns NULL for an ABI major this library does not implement. */
const kvs_api *kvs_get_api(uint32_t abi_major);

/* Same sentences as kvs_api.strerror, for callers that link directly. */
const char *kvs_strerror(kvs_status status);

#ifdef __cplusplus
}
#endif
#endif /* KVSTRATA_H */
