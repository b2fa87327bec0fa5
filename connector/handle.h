/* handle.h - the connector handle behind the opaque kvs_handle, shared by the scheduler-side and
 * worker-side modules. Internal: nothing outside connector/ includes it. */
#ifndef KVS_HANDLE_H
#define KVS_HANDLE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_plans.h"
#include "common/abi_struct.h"
#include "common/clock.h"
#include "config.h"
#include "hashpool.h"
#include "kernels/cpu/kernels.h"
#include "kernels/device.h"
#include "meta.h"
#include "pool.h"
#include "tiers.h"

#define KVS_ERROR_MAX  512
#define KVS_EVENT_RING 4096

/* A tier pin held on behalf of a request between lookup and the load. */
typedef struct kvs_pin {
    kvs_key key;
    uint32_t tier;
} kvs_pin;

/* Scheduler-side state of one request. */
typedef struct kvs_request {
    char id[KVS_REQ_ID_MAX];
    int32_t *tokens;
    uint64_t n_tokens;
    uint64_t tokens_cap;    /* tokens the buffer holds */
    uint64_t prompt_tokens; /* tokens known at the first sighting: saved unless save_decode */
    kvs_key *keys;          /* full chunks' keys: key_ranks per chunk, chunk-major */
    uint64_t n_keys;
    uint64_t n_local;      /* n_computed at lookup: tokens the engine had itself */
    uint64_t hit_tokens;   /* chunk-aligned end of the stored prefix at lookup */
    uint64_t offered;      /* tokens offered by lookup (n_hit_tokens) */
    uint64_t lossy_from;   /* the first token of the first lossy chunk lookup offered (UINT64_MAX:
                            * none) */
    uint64_t lossy_loaded; /* the lowest token from which a load build_meta emitted for it may
                            * have been lossy, over its life (UINT64_MAX: none): what it computes
                            * from there on is derived (saved so) */
    uint64_t external;     /* tokens the engine allocated for (on_alloc) */
    int load_pending;      /* on_alloc armed a load; build_meta emits it once */
    uint64_t saved_upto;   /* tokens, chunk aligned, stored or already scheduled for saving */
    uint64_t step_end;     /* n_computed + n_scheduled of the last step: the engine rolled back if
                             * a later step starts below it (load error, preemption) */
    kvs_pin *pins;         /* the lease: key_ranks pins per chunk, chunk-major */
    uint64_t n_pins;
    int lease_counted; /* the pins count in stats.leases_active */
    uint64_t lease_deadline_ns;
    uint64_t lease_release_step; /* release at the first build_meta of a later step (0: none) */
    uint8_t load_async;          /* lookup answered load_async: its load runs between steps */
    uint8_t async_waiting; /* its async load was emitted; the lease stays until it computes again */
    uint8_t saves_emitted; /* a build_meta emitted saves for it: with async saves, request_finished
                            * keeps its pages until the workers report them landed */
    uint32_t *block_ids;   /* async: the block table on_alloc gave (build_meta emits the load
                                  * even when the engine does not schedule the request) */
    uint64_t n_block_ids;
    kvs_restore_plan plan; /* how its load in step plan_step is restored (the `plan` hook) */
    uint64_t plan_step;
    struct kvs_rlookup
        *rlookup; /* loads.remote_lookups async: the remote tiers' answer (or query) */
    /* key inputs (request_key_input, 1.10): in call order, their bytes concatenated, and what they
     * add to the keys (keys.h); refused once keys_fixed */
    struct kvs_key_input *inputs;
    uint32_t n_inputs;
    uint32_t n_extras;
    uint64_t input_bytes;
    uint8_t *input_data;
    struct kvs_key_extra *extras;
    uint8_t keys_fixed; /* a lookup or build_meta computed its keys */
    uint64_t keys_cap;  /* chunks `keys` has room for */
    uint32_t *table;    /* its block table as the engine last gave it (on_alloc, build_meta,
                               * build_meta_update): what blocks_from refers to */
    uint64_t n_table, table_cap;
    uint64_t step_mark;       /* h->reqs.step_marks when the step being built names it */
    struct kvs_request *next; /* hash chain */
} kvs_request;

#define KVS_REQ_BUCKETS  1024
#define KVS_FINISHED_IDS 1024 /* recently finished request ids remembered (hashed) for messages */

typedef enum worker_state {
    WORKER_IDLE = 0, /* nothing bound */
    WORKER_BOUND,    /* bind_meta done */
    WORKER_LOADING   /* start_load done: layers land through wait_layer_load */
} worker_state;

/* One chunk being loaded in the bound step. */
typedef struct kvs_load_work {
    const kvs_meta_req *req;
    const kvs_meta_load *load;
    const uint8_t *object; /* in a zero-copy tier, or in `slab` */
    void *slab;            /* staging copy, or NULL */
    uint64_t *layer_hash;  /* [n_layers] expected checksums, copied from the verified header, then
                            * [n_layers] computed ones (a CUDA device's hash pool writes them) */
    int tier;
    int pinned;
    int failed;
    int drop;         /* corrupt: remove from the tiers once unpinned */
    int async;        /* an async request's: failures are accounted when it lands */
    int ranged;       /* some layers only, read with get_range into slab */
    int keyed_layers; /* a keyed tier's whole object, header checked: its layers' tags to check */
    int keyed_inline; /* its layers' tags computed by the copies into the pages (worker_load.c) */
    int lossy;        /* decoded from a lossy object (counted in stats.lossy_chunks_loaded) */
    int fused; /* lossy, decoded by the device as it lands (dcodec): object is the encoded one */
    kvs_dev_codec dcodec;
    uint8_t
        *kept; /* a DROP object's: which of the chunk's tokens it kept (load_dropped), or NULL */
    int layers_read; /* ranged: every wanted layer is in the slab already (start_load on a CUDA
                      * device, or an async load's reader) */
} kvs_load_work;

/* One chunk being saved in the bound step. */
typedef struct kvs_save_work {
    const kvs_meta_req *req;
    const kvs_meta_save *save;
    uint8_t *object; /* where the object is built: a reservation in the top tier or `slab` */
    uint8_t *slab;   /* staging slab when the top tier cannot be written in place */
    uint64_t ticket; /* the reservation, when object is not slab */
    uint32_t layers_done;
    int sealed; /* sealed already (a keyed handle seals a step's objects together) */
    int tagged; /* its copies wrote its nonce and every layer tag so far (a keyed handle, host device) */
} kvs_save_work;

/* The scheduler side's request table: the requests between their first lookup and
 * request_finished, their leases, and the step being built (requests.c, step_meta.c). */
typedef struct kvs_request_table {
    kvs_request *buckets[KVS_REQ_BUCKETS];
    uint64_t n_requests;
    uint64_t lease_sweep_ns; /* no lease expires before this: the sweep is skipped until then */
    const kvs_clock
        *clock; /* leases run on it: NULL is CLOCK_MONOTONIC; tests set a manual clock */
    uint64_t finished_ids[KVS_FINISHED_IDS]; /* XXH3 of the last finished ids: "already finished" */
    char (*kept_finished)[KVS_REQ_ID_MAX]; /* finished with keep_blocks 1 since the last build_meta:
                                                * its metadata tells the workers */
    uint64_t n_kept_finished, cap_kept_finished;
    uint32_t finished_next;
    uint64_t step;
    uint64_t step_marks;     /* build_meta calls: a request named in the current one has it */
    uint64_t last_load_step; /* the last step whose metadata carried a load */
    uint64_t async_waiting;  /* requests whose emitted async load may still be running */
    /* Upper bounds, made exact by each sweep over the requests, that let a step skip the sweeps
         * (a walk over every request costs a cache miss each, in the scheduler's step): */
    uint64_t async_armed;       /* requests with an asynchronous load on_alloc armed */
    uint64_t leases_to_release; /* requests whose lease ends after the step of its load */
} kvs_request_table;

/* The worker side's step: the engine's pages, the bound metadata and its loads and saves, the
 * failed blocks, the background loader and saver (worker*.c). */
typedef struct kvs_worker_step {
    kvs_layer_view *views;
    uint32_t n_views;
    uint32_t fewest_blocks_layer; /* the view with the fewest pages (layers may differ) */
    worker_state wstate;
    kvs_meta *bound;
    kvs_load_work *loads;
    uint64_t n_loads;
    uint32_t layers_loaded; /* host device: layers landed this step, */
    uint8_t *layer_loaded;  /* and which (n_views flags) */
    kvs_save_work *saves;
    uint64_t n_saves;
    uint8_t *layer_saved; /* per layer: save_layer seen this step */
    /* Blocks of failed loads, for load_error_blocks. bind_meta reserves room for every block the
         * loads still to land may add (the step's, the async requests' not landed yet), so adding one
         * never allocates and can never be lost. */
    uint32_t *error_blocks;
    uint64_t n_error_blocks, cap_error_blocks;
    uint64_t error_blocks_taken; /* the first ones a load_error_blocks call returned */
    uint64_t error_blocks_async; /* blocks the async requests not landed yet may add */
    void *(*error_blocks_realloc)(void *ptr, size_t bytes); /* NULL: realloc (tests inject) */
    struct kvs_async_loader
        *async;              /* async loads between steps (worker_async.c); NULL until used */
    struct kvs_saver *saver; /* async saves and the sending report (worker_saver.c); NULL until
                                  * used */
} kvs_worker_step;

/* Where the worker's copies run: the host device or the CUDA module, and what a copy needs
 * (worker_device.c). */
typedef struct kvs_device_state {
    const kvs_device_ops *dev;
    void *dev_state;
    void *dev_module; /* dlopen handle of the CUDA module, or NULL */
    kvs_device_info dev_info;
    kvs_dev_copy *copies;    /* one layer's copies, max_chunks_per_step */
    void **copy_owner;       /* the load or save work behind each copy */
    int loads_pending;       /* CUDA device: loads enqueued, not yet completed */
    kvs_hashpool *hashpool;  /* CUDA device: checksums off the copy path */
    kvs_hash_job *hash_jobs; /* n_layers * max_chunks_per_step */
} kvs_device_state;

/* The cache events take_events drains, written from any thread that stores or drops an object. */
typedef struct kvs_event_ring {
    pthread_mutex_t event_lock;
    kvs_event events[KVS_EVENT_RING];
    uint64_t event_head, event_count, events_dropped;
} kvs_event_ring;

struct kvs_handle {
    kvs_role role;
    uint32_t transfer_role; /* kvs_transfer_role: a producer only saves, a consumer only loads */
    kvs_config *cfg;
    kvs_model_desc model;
    char *model_id;
    char *salt;
    kvs_key fingerprint; /* this rank's: objects carry and check it */
    /* tensor-parallel keys (1.5): the scheduler side answers for every rank's keys */
    uint32_t key_ranks; /* 1 for MLA or tp_size 1, else tp_size */
    uint32_t key_rank;  /* this handle's own among them (its worker binds that rank's keys) */
    kvs_key *rank_fingerprints; /* [key_ranks]: rank r's; [key_rank] is `fingerprint` */
    kvs_key group_fingerprint;  /* rank 0's: model, layout, chunk size and tp_size in one */
    uint32_t chunk_tokens;
    kvs_kv_shape shape;
    uint64_t layer_bytes;  /* one layer of one chunk */
    uint64_t object_bytes; /* one chunk object */
    kvs_tier_chain *tiers;
    struct kvs_encoder *encoder;     /* what compress tiers encode and place with (encoder.h) */
    struct kvs_object_mac *mac;      /* the keyed tiers' integrity key (integrity.h); NULL: none */
    struct kvs_nhpoly *tag_states;   /* one per copy of a layer, for tags computed by the copies */
    struct kvs_workers *mac_workers; /* checks of layer tags beside the caller (host_threads) */
    struct kvs_rlookups *rlookups;   /* scheduler, loads.remote_lookups async with a remote tier */
    int32_t
        *spare_tokens; /* the token buffer of a request gone, for the next one (no page faults) */
    uint64_t spare_cap;
    kvs_pool *pool;
    char last_error[KVS_ERROR_MAX];

    kvs_request_table reqs;       /* scheduler side */
    struct kvs_plan_state *plans; /* restore plans (connector/ext/plans/plan_state.h) */
    kvs_worker_step worker;       /* worker side */
    kvs_device_state device;
    struct kvs_lsc *lsc;           /* the layer stream cache (lsc.c); NULL until lsc_reserve */
    struct kvs_sparse_req *sparse; /* requests in sparse decode (sparse.c), a list */

    kvs_event_ring event_ring;
    kvs_stats stats;
    uint64_t tier_tokens_loaded[KVS_STATS_MAX_TIERS]; /* stats.tokens_loaded by serving tier */
    struct kvs_metrics_source *metrics;               /* `metrics:` (metrics_handle.c); NULL: off */
    uint64_t metrics_next_ns;                         /* the next publish is due then */
};

#endif
