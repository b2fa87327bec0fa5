/*
 * kvstrata_plans.h - restore plans and stage plans, an extension of the engine-facing ABI.
 *
 * An engine that can compute part of a restored prefix itself declares what it can (set_plan_caps,
 * since 1.3); after each build_meta the connector tells it, per request whose load that step
 * emitted, what it computes while the rest loads (plan). An engine split into pipeline stages also
 * describes its stages (set_stages, since 1.4) so that every stage restores its own layers at once.
 * docs/cacheflow.md says how the connector chooses; docs/abi.md shows the calls in order.
 *
 * Hooks (kvs_api, all scheduler role):
 *
 * set_plan_caps(h, caps): declare the plans this engine executes (KVS_PLAN_CAP_* bits; 0, the
 *   default, for a stock engine), before the first lookup. With `restore.scheduler: cacheflow` an
 *   engine with no caps gets prefix plans through lookup (fewer tokens offered when recomputing the
 *   tail is faster than loading it); one with KVS_PLAN_CAP_TOKEN gets two-pointer plans through
 *   plan. KVS_PLAN_CAP_MASK (kvstrata_lossy.h) is not a plan and combines with any of these.
 *
 * plan(h, req_id, out): the plan the last build_meta made for req_id. Every request whose load that
 *   build_meta emitted has one (KVS_PLAN_LOAD when no planner is configured); KVS_ENOTFOUND for any
 *   other. The engine must follow it: loads of the recomputed tokens are not issued. out is filled
 *   up to out->struct_size (at least KVS_RESTORE_PLAN_SIZE_1_3, which gets KVS_ENOTSUP for a stage
 *   plan).
 *
 * set_stages(h, stages): describe the engine's pipeline stages and where their boundary activations
 *   are registered (kvs_stage_desc), before set_plan_caps(KVS_PLAN_CAP_STAGE) and the first lookup.
 *   Restore plans then price layers as the n_kv_layers KV layers only.
 */
#ifndef KVSTRATA_PLANS_H
#define KVSTRATA_PLANS_H

#include "kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_MAX_STAGES 8u

/* What an engine can execute besides loading the whole external range (set_plan_caps). */
/* recompute the front of the external range while the rest loads */
#define KVS_PLAN_CAP_TOKEN 1u
/* recompute the lower layers of the external range while the upper ones load */
#define KVS_PLAN_CAP_LAYER 2u
/* since 1.4: pipeline stages restore their own layers at once, each from its stored boundary
 * activations (set_stages first) */
#define KVS_PLAN_CAP_STAGE 4u

typedef enum kvs_plan_mode {
    KVS_PLAN_LOAD = 0, /* the connector loads the whole external range (stock behaviour) */
    /* the engine computes [first_token, first_token + recompute_tokens) while the connector loads
     * [first_token + recompute_tokens, end_token) */
    KVS_PLAN_TOKEN = 1,
    KVS_PLAN_RECOMPUTE = 2, /* the engine computes the whole external range; nothing is loaded */
    /* the engine computes layers [0, recompute_layers) of every token of the range while the
     * connector loads layers [recompute_layers, n_layers) */
    KVS_PLAN_LAYER = 3,
    /* since 1.4: stage s computes its layers [first_layer[s], first_layer[s] +
     * stage_recompute_layers[s]) of every token of the range (stage 0 from the embeddings, stage
     * s > 0 from its boundary activations, which the connector loads first) while the connector
     * loads every other KV layer; the stages may run at once */
    KVS_PLAN_STAGE = 4
} kvs_plan_mode;

/* How one request's external range is restored in the step build_meta just planned (plan). */
typedef struct kvs_restore_plan {
    uint32_t struct_size; /* sizeof(kvs_restore_plan), set by the caller */
    uint32_t mode;        /* kvs_plan_mode */
    uint64_t first_token; /* the external range [first_token, end_token): n_computed at lookup .. */
    uint64_t end_token;   /* .. plus the external tokens given to on_alloc */
    /* leading tokens of the range the engine computes itself (all of them, through the lower
     * layers only, in layer mode) */
    uint64_t recompute_tokens;
    double predicted_ms;       /* the planner's restore time for the request (0: no planner) */
    uint32_t recompute_layers; /* layer mode: layers the engine computes; 0 otherwise */
    uint32_t reserved;
    uint32_t n_stages; /* since 1.4: stage mode: the engine's stages; 0 otherwise */
    /* since 1.4: stage mode: the layers each stage computes */
    uint32_t stage_recompute_layers[KVS_MAX_STAGES];
} kvs_restore_plan;
/* sizeof(kvs_restore_plan) in ABI 1.3, which plan still accepts */
#define KVS_RESTORE_PLAN_SIZE_1_3 48u

/* An engine's pipeline stages (set_stages). The model's registered layers are the KV layers
 * [0, n_kv_layers) followed by one group of boundary_layers registered layers per stage boundary:
 * the activations entering stage s > 0 (its first layer's input) live in layers n_kv_layers +
 * (s - 1) * boundary_layers .. + boundary_layers - 1, written by the engine in its forward and
 * saved and loaded like KV (same view shape; the bytes are the engine's business). */
typedef struct kvs_stage_desc {
    uint32_t struct_size; /* sizeof(kvs_stage_desc) */
    uint32_t n_stages;    /* 2..KVS_MAX_STAGES */
    /* kvs_model_desc.n_layers = n_kv_layers + (n_stages - 1) * boundary_layers */
    uint32_t n_kv_layers;
    uint32_t boundary_layers; /* >= 1 */
    /* stage s owns KV layers [first_layer[s], first_layer[s + 1]) (n_kv_layers after the last);
     * first_layer[0] = 0 */
    uint32_t first_layer[KVS_MAX_STAGES];
} kvs_stage_desc;
#define KVS_STAGE_DESC_SIZE_1_4 48u /* its first size */

#ifdef __cplusplus
}
#endif
#endif /* KVSTRATA_PLANS_H */
