/* restore.c - the CacheFlow restore planner inside the connector (docs/cacheflow.md, "In the
 * connector"): coefficients from the profile at open, prefix plans for engines that can only load a
 * prefix (lookup), and two-pointer plans over a step's whole batch for engines that can recompute the
 * front of a range while its back loads (build_meta, the `plan` hook). */
#include "restore.h"
#include "plan_state.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_plans.h"
#include "common/log.h"
#include "connector/handle.h"
#include "connector/last_error.h"
#include "connector/role.h"

/* The caps that are restore plans (KVS_PLAN_CAP_MASK is none: it changes what a hit may hold). */
#define KVS_PLAN_CAPS_PLANS (KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER | KVS_PLAN_CAP_STAGE)

kvs_status kvs_restore_setup(kvs_handle *h, char *err, size_t err_len) {
    const kvs_config *cfg = h->cfg;
    if (cfg->restore.scheduler != KVS_RESTORE_CACHEFLOW) return KVS_OK;
    uint32_t n = kvs_tiers_count(h->tiers);
    if (n > CF_MAX_CHANNELS)
        return kvs_fmt(err, err_len,
                       "%s: key 'restore.scheduler': cacheflow plans over at most %u tiers, the "
                       "chain has %u",
                       cfg->source, CF_MAX_CHANNELS, n),
               KVS_ECONFIG;
    for (uint32_t t = 0; t < n; t++) {
        const char *name = kvs_tiers_name(h->tiers, t);
        uint32_t i = 0;
        while (i < cfg->restore.n_tiers && strcmp(cfg->restore.tiers[i].name, name) != 0) i++;
        if (i == cfg->restore.n_tiers)
            return kvs_fmt(
                       err, err_len,
                       "%s: the restore profile has no coefficients for tier '%s' (profile it, or "
                       "add it to the profile's `tiers:`)",
                       cfg->restore.profile, name),
                   KVS_ECONFIG;
        h->plans->restore_channels[t] =
            (cf_channel){cfg->restore.tiers[i].latency_s, cfg->restore.tiers[i].bytes_per_s};
    }
    h->plans->restore_compute = (cf_compute){cfg->restore.fixed_s, cfg->restore.per_token_s,
                                             cfg->restore.attention_s_per_token2};
    /* l_delta follows the engine's caps (set_plan_caps): token mode until it says otherwise */
    h->plans->restore_params =
        (cf_params){.chunk_tokens = h->chunk_tokens,
                    .n_layers = h->model.n_layers,
                    .kv_bytes_per_token_layer = h->layer_bytes / h->chunk_tokens,
                    .l_delta = 1,
                    .priority = (cf_priority)cfg->restore.priority};
    h->plans->restore_on = 1;
    return KVS_OK;
}

int kvs_restore_load_async(const kvs_handle *h, uint32_t tier) {
    const kvs_config *cfg = h->cfg;
    if (cfg->loads.async != KVS_LOADS_ASYNC_SLOW) return cfg->loads.async == KVS_LOADS_ASYNC_ALWAYS;
    const char *name = kvs_tiers_name(h->tiers, tier);
    for (uint32_t i = 0; name && i < cfg->restore.n_tiers; i++)
        if (strcmp(cfg->restore.tiers[i].name, name) == 0)
            return cfg->restore.tiers[i].bytes_per_s < (double)cfg->loads.async_below;
    return 0; /* a tier the profile does not know is taken to be fast */
}

uint64_t kvs_restore_prefix_chunks(kvs_handle *h, uint32_t tier, uint64_t first_chunk,
                                   uint64_t n_chunks) {
    uint64_t offset = first_chunk * h->chunk_tokens;
    if (!h->plans->restore_on || (h->plans->plan_caps & KVS_PLAN_CAPS_PLANS) || n_chunks == 0 ||
        n_chunks > UINT32_MAX / h->chunk_tokens || offset > UINT32_MAX)
        return n_chunks;
    cf_request req = {(uint32_t)(n_chunks * h->chunk_tokens), tier, (uint32_t)offset};
    uint32_t load = 0;
    if (cf_plan_prefix(&h->plans->restore_params, &h->plans->restore_compute,
                       h->plans->restore_channels, kvs_tiers_count(h->tiers), &req, 1, &load,
                       NULL) < 0)
        return n_chunks;
    return load < n_chunks ? load : n_chunks;
}

/* Leave layers [from, to) of the request's loads to the engine (the loads read the others). */
static kvs_status set_layer_mask(kvs_meta_req *mr, uint32_t n_layers, uint32_t from, uint32_t to) {
    if (!mr->layers) {
        mr->n_layer_bytes = (n_layers + 7) / 8;
        if (!(mr->layers = malloc(mr->n_layer_bytes))) return mr->n_layer_bytes = 0, KVS_ENOMEM;
        memset(mr->layers, 0, mr->n_layer_bytes);
        for (uint32_t l = 0; l < n_layers; l++) mr->layers[l / 8] |= (uint8_t)(1u << (l % 8));
    }
    for (uint32_t l = from; l < to && l < n_layers; l++)
        mr->layers[l / 8] &= (uint8_t) ~(1u << (l % 8));
    return KVS_OK;
}

/* A stage plan for one request (an engine with KVS_PLAN_CAP_STAGE), taken when the planner predicts
 * it sooner than beat_s: the loads leave each stage's lowest stage_recompute_layers[s] KV layers to
 * the engine. Boundary layers are always loaded (and priced so: read_all_boundaries): pages of loaded
 * tokens may be shared with a later request that saves a new chunk over them, which must not store
 * stale activations. 1 if taken, 0 if not, -1 out of memory. */
static int stage_plan(kvs_handle *h, kvs_meta_req *mr, kvs_restore_step *in, const cf_request *cr,
                      double beat_s) {
    uint32_t rec[CF_MAX_STAGES] = {0};
    double t = cf_stage_split(&h->plans->restore_params, &h->plans->restore_compute,
                              &h->plans->restore_channels[cr->channel], &h->plans->stages,
                              cr->offset, cr->n_cached, rec);
    if (t < 0 || !(t < beat_s)) return 0;
    in->plan.predicted_ms = t * 1e3;
    uint32_t any = 0;
    for (uint32_t s = 0; s < h->plans->stages.n_stages; s++) any += rec[s];
    if (!any) return 1; /* load everything */
    for (uint32_t s = 0; s < h->plans->stages.n_stages; s++)
        if (set_layer_mask(mr, h->model.n_layers, h->plans->stages.first_layer[s],
                           h->plans->stages.first_layer[s] + rec[s]) != KVS_OK)
            return -1;
    in->plan.mode = KVS_PLAN_STAGE;
    in->plan.recompute_tokens = in->end_token - in->first_token;
    in->plan.n_stages = h->plans->stages.n_stages;
    memcpy(in->plan.stage_recompute_layers, rec, sizeof rec);
    return 1;
}

/* Every loading request's plan: load it all, until the planner says otherwise; returns how many
 * load. */
static uint32_t load_plans(kvs_restore_step *info, uint64_t n) {
    uint32_t m = 0;
    for (uint64_t i = 0; i < n; i++) {
        info[i].io_rank = UINT32_MAX;
        if (!info[i].loading) continue;
        info[i].plan = (kvs_restore_plan){.struct_size = sizeof info[i].plan,
                                          .mode = KVS_PLAN_LOAD,
                                          .first_token = info[i].first_token,
                                          .end_token = info[i].end_token};
        m++;
    }
    return m;
}

/* The planner's view of each loading request (cr[k]) and which of reqs it is (which[k]). */
static void planner_requests(const kvs_handle *h, const kvs_meta_req *reqs,
                             const kvs_restore_step *info, uint64_t n, cf_request *cr,
                             uint64_t *which) {
    uint32_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!info[i].loading) continue;
        uint64_t tokens = reqs[i].n_loads * h->chunk_tokens; /* one planner unit per chunk loaded */
        uint64_t offset = reqs[i].loads[0].chunk_first; /* what the engine holds costs nothing */
        cr[k] = (cf_request){tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)tokens, info[i].tier,
                             offset > UINT32_MAX ? UINT32_MAX : (uint32_t)offset};
        which[k++] = i;
    }
}

/* A layer plan: its first `split` layers recomputed (masked from the loads), or all of them and
 * nothing loaded. */
static kvs_status take_layer_plan(kvs_handle *h, kvs_meta_req *mr, kvs_restore_step *in,
                                  const cf_plan *p) {
    uint32_t l = p->split, nl = h->plans->restore_params.n_layers; /* KV layers */
    if (l == 0) return KVS_OK;
    if (l >= nl) { /* every layer recomputed: nothing to load */
        in->plan.mode = KVS_PLAN_RECOMPUTE;
        in->plan.recompute_tokens = in->end_token - in->first_token;
        mr->n_loads = 0;
        return KVS_OK;
    }
    if (set_layer_mask(mr, h->model.n_layers, 0, l) != KVS_OK)
        return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory for a layer mask");
    in->plan.mode = KVS_PLAN_LAYER;
    in->plan.recompute_layers = l;
    in->plan.recompute_tokens = in->end_token - in->first_token;
    return KVS_OK;
}

/* A token plan: its first `split` loads dropped from the metadata, recomputed by the engine. */
static void take_token_plan(kvs_meta_req *mr, kvs_restore_step *in, const cf_plan *p) {
    uint64_t split = p->split < mr->n_loads ? p->split : mr->n_loads;
    if (split == 0) return;
    in->plan.mode = split == mr->n_loads ? KVS_PLAN_RECOMPUTE : KVS_PLAN_TOKEN;
    in->plan.recompute_tokens = split == mr->n_loads
                                    ? in->end_token - in->first_token
                                    : mr->loads[split].first_token - in->first_token;
    memmove(mr->loads, mr->loads + split, (mr->n_loads - split) * sizeof *mr->loads);
    mr->n_loads -= split;
}

/* One request's plan: a stage plan where the engine runs them (planned against its batch plan's
 * finish), else its batch plan's (p: zeros without a batch). */
static kvs_status take_plan(kvs_handle *h, kvs_meta_req *mr, kvs_restore_step *in,
                            const cf_request *cr, const cf_plan *p, int batch) {
    if (h->plans->plan_caps & KVS_PLAN_CAP_STAGE) {
        int taken = stage_plan(h, mr, in, cr, batch ? p->done_s : 1e300);
        if (taken < 0)
            return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory for a layer mask");
        if (taken || !batch) return KVS_OK;
    }
    in->plan.predicted_ms = p->done_s * 1e3;
    in->io_rank = p->io_rank;
    if (p->mode == CF_MODE_LAYER) return take_layer_plan(h, mr, in, p);
    take_token_plan(mr, in, p);
    return KVS_OK;
}

/* The planner over the m loading requests, and each one's plan taken. */
static kvs_status plan_loads(kvs_handle *h, kvs_meta_req *reqs, kvs_restore_step *info, uint64_t n,
                             uint32_t m, cf_request *cr, uint64_t *which, cf_plan *plans,
                             void *scratch) {
    planner_requests(h, reqs, info, n, cr, which);
    int batch = (h->plans->plan_caps & (KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER)) != 0;
    if (batch && cf_plan_batch(&h->plans->restore_params, &h->plans->restore_compute,
                               h->plans->restore_channels, kvs_tiers_count(h->tiers), cr, m,
                               scratch, plans, NULL, 0, NULL) < 0)
        return kvs_set_error(h, KVS_EINVAL, "build_meta: the restore planner refused the batch");
    kvs_status st = KVS_OK;
    for (uint32_t j = 0; j < m && st == KVS_OK; j++)
        st = take_plan(h, &reqs[which[j]], &info[which[j]], &cr[j], &plans[j], batch);
    return st;
}

/* Every request of the step with loads gets a plan; with a planner and an engine that executes
 * token plans, its first `split` loads are dropped from the metadata and recomputed by the engine. */
kvs_status kvs_restore_plan_step(kvs_handle *h, kvs_meta_req *reqs, kvs_restore_step *info,
                                 uint64_t n) {
    uint32_t m = load_plans(info, n);
    if (m == 0 || !h->plans->restore_on || !(h->plans->plan_caps & KVS_PLAN_CAPS_PLANS))
        return KVS_OK;
    cf_request *cr = calloc(m, sizeof *cr);
    uint64_t *which = calloc(m, sizeof *which);
    cf_plan *plans = calloc(m, sizeof *plans);
    void *scratch = malloc(cf_batch_scratch_bytes(m));
    kvs_status st;
    if (!cr || !which || !plans || !scratch)
        st = kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory for the restore plan");
    else
        st = plan_loads(h, reqs, info, n, m, cr, which, plans, scratch);
    free(cr);
    free(which);
    free(plans);
    free(scratch);
    return st;
}

kvs_status kvs_restore_read_order(const kvs_meta_req *reqs, const kvs_restore_step *info,
                                  uint64_t n, kvs_meta_req **out) {
    *out = NULL;
    uint64_t n_async = 0;
    int sorted = 1;
    uint32_t last = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!reqs[i].load_async || !info[i].loading) continue;
        if (n_async++ && info[i].io_rank < last) sorted = 0;
        last = info[i].io_rank;
    }
    if (sorted) return KVS_OK;
    kvs_meta_req *o = malloc(n * sizeof *o);
    uint64_t *at = malloc(n_async * sizeof *at), *which = malloc(n_async * sizeof *which);
    if (!o || !at || !which) {
        free(o);
        free(at);
        free(which);
        return KVS_ENOMEM;
    }
    memcpy(o, reqs, n * sizeof *o);
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        if (reqs[i].load_async && info[i].loading) at[k] = which[k] = i, k++;
    for (uint64_t i = 1; i < k; i++) /* stable: equal ranks keep the step's order */
        for (uint64_t j = i; j > 0 && info[which[j]].io_rank < info[which[j - 1]].io_rank; j--) {
            uint64_t t = which[j];
            which[j] = which[j - 1];
            which[j - 1] = t;
        }
    for (uint64_t i = 0; i < k; i++) o[at[i]] = reqs[which[i]];
    free(at);
    free(which);
    *out = o;
    return KVS_OK;
}

kvs_status kvs_restore_plan_of(kvs_handle *h, const char *req_id, const kvs_restore_plan *plan,
                               kvs_restore_plan *out) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "plan");
    if (st != KVS_OK) return st;
    _Static_assert(offsetof(kvs_restore_plan, n_stages) == KVS_RESTORE_PLAN_SIZE_1_3,
                   "1.3 plan size");
    if (!req_id || !out || out->struct_size < KVS_RESTORE_PLAN_SIZE_1_3)
        return kvs_set_error(h, KVS_EINVAL,
                             "plan: req_id or out is NULL, or out->struct_size is not set");
    if (!plan)
        return kvs_set_error(h, KVS_ENOTFOUND, "plan: request '%s' loads nothing in the last step",
                             req_id);
    if (out->struct_size < sizeof *out &&
        plan->mode == KVS_PLAN_STAGE) /* an engine built before 1.4 */
        return kvs_set_error(
            h, KVS_ENOTSUP, "plan: request '%s' has a stage plan, which a %u-byte plan cannot hold",
            req_id, out->struct_size);
    uint32_t size = out->struct_size < sizeof *out ? out->struct_size : (uint32_t)sizeof *out;
    memcpy(out, plan, size);
    out->struct_size = size;
    return KVS_OK;
}
