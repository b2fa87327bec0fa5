/* api.c - the exported entry point, the ABI table, handle open/close and the thin hook wrappers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_lossy.h"
#include "abi/kvstrata_lsc.h"
#include "abi/kvstrata_plans.h"
#include "abi/kvstrata_sparse.h"
#include "common/abi_struct.h"
#include "common/log.h"
#include "common/status.h"
#include "connector/ext/lossy/encoder.h"
#include "connector/ext/lsc/lsc.h"
#include "connector/ext/plans/plan_state.h"
#include "connector/ext/plans/restore.h"
#include "connector/ext/sparse/sparse.h"
#include "connector/store/store.h"
#include "handle.h"
#include "integrity.h"
#include "keys.h"
#include "last_error.h"
#include "lookup_remote.h"
#include "metrics_handle.h"
#include "object.h"
#include "requests.h"
#include "worker.h"
#include "worker_async.h"
#include "worker_device.h"
#include "worker_load.h"
#include "worker_save.h"
#include "worker_saver.h"

#define KVS_EXPORT __attribute__((visibility("default")))

KVS_EXPORT const char *kvs_strerror(kvs_status status) {
    return kvs_status_sentence(status);
}

static void on_tier_event(void *ctx, uint8_t kind, const kvs_key *key, uint32_t tier) {
    kvs_handle *h = ctx;
    pthread_mutex_lock(&h->event_ring.event_lock);
    /* gone from the chain: from its last tier, or from one whose tiers below could not open */
    if (kind == KVS_EVENT_REMOVED && tier >= kvs_tiers_bottom(h->tiers)) h->stats.evictions++;
    kind &= (uint8_t)~KVS_TIER_EVENT_DROPPED;
    uint64_t slot = (h->event_ring.event_head + h->event_ring.event_count) % KVS_EVENT_RING;
    if (h->event_ring.event_count == KVS_EVENT_RING) {
        h->event_ring.event_head =
            (h->event_ring.event_head + 1) % KVS_EVENT_RING; /* drop the oldest */
        h->event_ring.events_dropped++;
    } else {
        h->event_ring.event_count++;
    }
    h->event_ring.events[slot].kind = kind;
    memcpy(h->event_ring.events[slot].key, key->bytes, sizeof h->event_ring.events[slot].key);
    h->event_ring.events[slot].tier = tier;
    pthread_mutex_unlock(&h->event_ring.event_lock);
}

/* --- open / close ---------------------------------------------------------------------------------- */

static uint32_t dtype_bytes(uint32_t d) {
    switch ((kvs_dtype)d) {
        case KVS_DTYPE_FP16:
        case KVS_DTYPE_BF16: return 2;
        case KVS_DTYPE_FP32: return 4;
        case KVS_DTYPE_FP8_E4M3:
        case KVS_DTYPE_FP8_E5M2: return 1;
    }
    return 0;
}

/* The caller's params and model, copied up to their struct_size (the rest zero), into *p and *m. */
static kvs_status check_params(const kvs_open_params *in, kvs_open_params *p, kvs_model_desc *m,
                               char *err, size_t err_len) {
    if (!in) return kvs_fmt(err, err_len, "open: params is NULL"), KVS_EINVAL;
    if (kvs_struct_in(p, sizeof *p, in, KVS_OPEN_PARAMS_SIZE_1_0) != 0)
        return kvs_fmt(err, err_len, "open: params struct_size %u is below the 1.0 size %u",
                       in->struct_size, KVS_OPEN_PARAMS_SIZE_1_0),
               KVS_EINVAL;
    if (p->role != KVS_ROLE_SCHEDULER && p->role != KVS_ROLE_WORKER && p->role != KVS_ROLE_BOTH)
        return kvs_fmt(err, err_len, "open: role %u is not scheduler, worker or both", p->role),
               KVS_EINVAL;
    if (p->transfer_role > KVS_TRANSFER_CONSUMER)
        return kvs_fmt(err, err_len,
                       "open: transfer_role %u is not both (0), producer (1) or consumer (2)",
                       p->transfer_role),
               KVS_EINVAL;
    if (!p->model) return kvs_fmt(err, err_len, "open: model description is NULL"), KVS_EINVAL;
    if (kvs_struct_in(m, sizeof *m, p->model, KVS_MODEL_DESC_SIZE_1_0) != 0)
        return kvs_fmt(err, err_len, "open: model struct_size %u is below the 1.0 size %u",
                       p->model->struct_size, KVS_MODEL_DESC_SIZE_1_0),
               KVS_EINVAL;
    p->model = m;
    const char *bad =
        !m->model_id || !m->model_id[0]                   ? "model_id is empty"
        : dtype_bytes(m->dtype) == 0                      ? "dtype is not a kvs_dtype"
        : m->n_layers == 0 || m->n_layers > 4096          ? "n_layers must be 1..4096"
        : m->n_kv_heads == 0 || m->n_kv_heads > 1024      ? "n_kv_heads must be 1..1024"
        : m->head_dim == 0 || m->head_dim > 65536         ? "head_dim must be 1..65536"
        : m->block_tokens == 0 || m->block_tokens > 65536 ? "block_tokens must be 1..65536"
        : m->is_mla && m->n_kv_heads != 1 ? "an MLA model has one latent head (n_kv_heads 1)"
        : m->tp_size == 0 || m->tp_rank >= m->tp_size ? "tp_rank must be below tp_size >= 1"
                                                      : NULL;
    if (bad) return kvs_fmt(err, err_len, "open: model: %s", bad), KVS_EINVAL;
    if (!m->is_mla && m->tp_size > KVS_KEYS_MAX_RANKS)
        return kvs_fmt(err, err_len,
                       "open: model: tp_size %u is over the %u ranks with keys of their own",
                       m->tp_size, KVS_KEYS_MAX_RANKS),
               KVS_EINVAL;
    return KVS_OK;
}

static kvs_status copy_model(kvs_handle *h, const kvs_model_desc *m) {
    h->model = *m;
    h->model_id = strdup(m->model_id);
    h->salt = m->salt ? strdup(m->salt) : NULL;
    if (!h->model_id || (m->salt && !h->salt)) return KVS_ENOMEM;
    h->model.model_id = h->model_id;
    h->model.salt = h->salt;
    return KVS_OK;
}

/* Every key rank's fingerprint: the scheduler side answers for all of them. */
static kvs_status setup_keys(kvs_handle *h) {
    h->key_ranks = kvs_keys_n_ranks(&h->model);
    h->key_rank = kvs_keys_own_rank(&h->model);
    if (!(h->rank_fingerprints = calloc(h->key_ranks, sizeof *h->rank_fingerprints)))
        return KVS_ENOMEM;
    kvs_keys_rank_fingerprints(&h->model, h->chunk_tokens, h->rank_fingerprints);
    h->fingerprint = h->rank_fingerprints[h->key_rank];
    h->group_fingerprint = h->rank_fingerprints[0];
    return KVS_OK;
}

/* A handle of role scheduler alone only looks up: the engine's workers store, in processes of their
 * own (vLLM). A tier private to the process (no shared memory, not on a node) is then never filled
 * where it is looked up: say so once per tier at open. (An empty stand-in has said why already.) */
static void warn_private_tiers(kvs_handle *h) {
    for (uint32_t i = 0; i < kvs_tiers_count(h->tiers); i++) {
        if (kvs_tiers_shared(h->tiers, i) || kvs_tiers_degraded(h->tiers, i)) continue;
        kvs_log(h->cfg->log_level, KVS_LOG_WARN,
                "tier \"%s\" (%s) is private to this process, and a scheduler handle only looks "
                "up: what the engine's workers store in their processes is never found there. Give "
                "every process one tier: a dram tier with options.shm_name, or tiers a "
                "kvstrata-node on this host owns (docs/vllm.md, \"Tiers in vLLM's processes\")",
                kvs_tiers_name(h->tiers, i),
                kvs_tiers_ops(h->tiers, i)->type_name ? kvs_tiers_ops(h->tiers, i)->type_name
                                                      : "plugin");
    }
}

/* A tier that publishes what its process holds (compress, peer_gpu with index_shm) serves the
 * process that stored each key; ranks that share keys (MLA under tensor parallelism: every worker
 * saves the same chunk into its own tier) would withdraw each other's entries. */
static kvs_status refuse_shared_keys_on_published_tiers(kvs_handle *h, char *err, size_t err_len) {
    if (h->key_ranks != 1 || h->model.tp_size <= 1) return KVS_OK;
    for (uint32_t i = 0; i < kvs_tiers_count(h->tiers); i++)
        if (kvs_tiers_published(h->tiers, i))
            return kvs_fmt(err, err_len,
                           "open: tier \"%s\" (index_shm) keeps each chunk in the worker that "
                           "saved it, and this model's %u tensor-parallel ranks share their keys "
                           "(MLA): every rank would store and withdraw the same entries. Leave "
                           "index_shm out for this model (docs/vllm.md)",
                           kvs_tiers_name(h->tiers, i), h->model.tp_size),
                   KVS_ECONFIG;
    return KVS_OK;
}

static kvs_status setup(kvs_handle *h, const kvs_open_params *p, char *err, size_t err_len) {
    kvs_status st = p->config_path ? kvs_config_load(p->config_path, &h->cfg, err, err_len)
                                   : kvs_config_defaults(&h->cfg);
    if (st != KVS_OK) return st;
    if (copy_model(h, p->model) != KVS_OK)
        return kvs_fmt(err, err_len, "open: out of memory"), KVS_ENOMEM;
    h->chunk_tokens = h->cfg->chunk_tokens;
    if (h->chunk_tokens % h->model.block_tokens)
        return kvs_config_refuse(h->cfg, h->cfg->chunk_tokens_at, "chunk_tokens", err, err_len,
                                 "%u is not a multiple of the engine block size %u",
                                 h->chunk_tokens, h->model.block_tokens);
    h->shape = (kvs_kv_shape){.n_heads = h->model.n_kv_heads,
                              .head_bytes = h->model.head_dim * dtype_bytes(h->model.dtype),
                              .block_tokens = h->model.block_tokens,
                              .has_v = !h->model.is_mla};
    h->layer_bytes = kvs_kernel_layer_bytes(&h->shape, h->chunk_tokens);
    h->object_bytes = kvs_object_bytes(h->model.n_layers, h->layer_bytes);
    if ((st = setup_keys(h)) != KVS_OK) return kvs_fmt(err, err_len, "open: out of memory"), st;
    if (h->role & KVS_ROLE_WORKER) {
        if ((st = kvs_pool_create(h->cfg->staging_bytes, h->object_bytes, &h->pool, err,
                                  err_len)) != KVS_OK)
            return st;
    }
    void *staging = NULL;
    uint64_t staging_len = 0;
    if (h->pool) kvs_pool_region(h->pool, &staging, &staging_len);
    kvs_encoder_model em = {.fingerprint = h->fingerprint,
                            .n_layers = h->model.n_layers,
                            .chunk_tokens = h->chunk_tokens,
                            .dtype = h->model.dtype,
                            .shape = h->shape,
                            .layer_bytes = h->layer_bytes};
    if (kvs_encoder_create(&em, h->cfg, &h->encoder) != KVS_OK)
        return kvs_fmt(err, err_len, "open: out of memory"), KVS_ENOMEM;
    kvs_tier_encoder tier_encoder;
    if (h->encoder) kvs_encoder_for_tiers(h->encoder, &tier_encoder);
    st = kvs_tiers_open_ranked(h->cfg, h->object_bytes, h->encoder ? &tier_encoder : NULL, staging,
                               staging_len, (int32_t)h->model.tp_rank, on_tier_event, h, &h->tiers,
                               err, err_len);
    if (st == KVS_OK) st = refuse_shared_keys_on_published_tiers(h, err, err_len);
    if (st == KVS_OK) st = kvs_integrity_setup(h, err, err_len);
    if (st == KVS_OK && h->role == KVS_ROLE_SCHEDULER) warn_private_tiers(h);
    if (st == KVS_OK && (h->role & KVS_ROLE_SCHEDULER)) st = kvs_restore_setup(h, err, err_len);
    /* NULL without a remote tier; out of memory, lookups ask the remote tiers themselves */
    /* A consumer (decode instance) never blocks its engine's scheduler on a node. */
    if (st == KVS_OK && (h->role & KVS_ROLE_SCHEDULER) &&
        (h->cfg->loads.remote_lookups == KVS_REMOTE_LOOKUPS_ASYNC ||
         h->transfer_role == KVS_TRANSFER_CONSUMER))
        h->rlookups = kvs_rlookups_create(h->tiers);
    return st;
}

static void api_close(kvs_handle *h);

static kvs_status api_open(const kvs_open_params *in, kvs_handle **out, char *error,
                           size_t error_len) {
    char scratch[KVS_ERROR_MAX];
    char *err = error && error_len ? error : scratch;
    size_t err_len = error && error_len ? error_len : sizeof scratch;
    err[0] = '\0';
    if (!out) return kvs_fmt(err, err_len, "open: out is NULL"), KVS_EINVAL;
    *out = NULL;
    kvs_open_params params;
    kvs_model_desc model;
    kvs_status st = check_params(in, &params, &model, err, err_len);
    if (st != KVS_OK) return st;
    kvs_handle *h = calloc(1, sizeof *h);
    if (h && !(h->plans = calloc(1, sizeof *h->plans))) free(h), h = NULL;
    if (!h) return kvs_fmt(err, err_len, "open: out of memory"), KVS_ENOMEM;
    h->role = (kvs_role)params.role;
    h->transfer_role = params.transfer_role;
    pthread_mutex_init(&h->event_ring.event_lock, NULL);
    if ((st = setup(h, &params, err, err_len)) != KVS_OK) {
        api_close(h);
        return st;
    }
    h->stats.struct_size = sizeof h->stats;
    kvs_metrics_handle_open(h);
    *out = h;
    return KVS_OK;
}

static void api_close(kvs_handle *h) {
    if (!h) return;
    if (h->tiers) {
        kvs_worker_close(h); /* waits for the device before pins and slabs go */
        kvs_reqs_release_all(h);
    }
    kvs_metrics_handle_close(h); /* after the last saves landed, while the tiers answer usage */
    kvs_rlookups_destroy(h->rlookups); /* after the requests dropped their queries */
    kvs_tiers_close(h->tiers);
    kvs_encoder_destroy(h->encoder);
    kvs_integrity_close(h);
    kvs_pool_destroy(h->pool);
    free(h->worker.error_blocks);
    free(h->rank_fingerprints);
    free(h->model_id);
    free(h->salt);
    kvs_config_free(h->cfg);
    pthread_mutex_destroy(&h->event_ring.event_lock);
    free(h->plans);
    free(h);
}

static const char *api_last_error(const kvs_handle *h) {
    return h ? h->last_error : "handle is NULL";
}

/* --- hook wrappers: NULL handle check, clear the last error, forward -------------------------------- */

#define ENTER(h)                     \
    do {                             \
        if (!(h)) return KVS_EINVAL; \
        (h)->last_error[0] = '\0';   \
    } while (0)

static kvs_status api_lookup(kvs_handle *h, const char *id, const int32_t *tokens, uint64_t n,
                             uint64_t n_computed, kvs_lookup_result *out) {
    ENTER(h);
    kvs_status st = kvs_reqs_lookup(h, id, tokens, n, n_computed, out);
    kvs_metrics_handle_tick(h);
    return st;
}
static kvs_status api_on_alloc(kvs_handle *h, const char *id, const uint32_t *blocks, uint64_t n,
                               uint64_t n_ext) {
    ENTER(h);
    return kvs_reqs_on_alloc(h, id, blocks, n, n_ext);
}
static kvs_status api_build_meta(kvs_handle *h, const kvs_step_request *reqs, uint64_t n, void *buf,
                                 uint64_t cap, uint64_t *len) {
    ENTER(h);
    kvs_status st = kvs_reqs_build_meta(h, reqs, n, buf, cap, len);
    kvs_metrics_handle_tick(h);
    return st;
}
static kvs_status api_request_finished(kvs_handle *h, const char *id, int *keep) {
    ENTER(h);
    return kvs_reqs_request_finished(h, id, keep);
}
static kvs_status api_take_events(kvs_handle *h, kvs_event *out, uint64_t cap, uint64_t *n) {
    ENTER(h);
    if (!n || (cap && !out)) return kvs_set_error(h, KVS_EINVAL, "take_events: out or n is NULL");
    pthread_mutex_lock(&h->event_ring.event_lock);
    uint64_t take = h->event_ring.event_count < cap ? h->event_ring.event_count : cap;
    for (uint64_t i = 0; i < take; i++)
        out[i] = h->event_ring.events[(h->event_ring.event_head + i) % KVS_EVENT_RING];
    h->event_ring.event_head = (h->event_ring.event_head + take) % KVS_EVENT_RING;
    h->event_ring.event_count -= take;
    pthread_mutex_unlock(&h->event_ring.event_lock);
    *n = take;
    return KVS_OK;
}
static kvs_status api_register_kv(kvs_handle *h, const kvs_layer_view *views, uint32_t n) {
    ENTER(h);
    return kvs_worker_register(h, views, n);
}
static kvs_status api_bind_meta(kvs_handle *h, const void *meta, uint64_t len) {
    ENTER(h);
    return kvs_worker_bind(h, meta, len);
}
static kvs_status api_start_load(kvs_handle *h) {
    ENTER(h);
    return kvs_worker_start_load(h);
}
static kvs_status api_wait_layer_load(kvs_handle *h, uint32_t layer) {
    ENTER(h);
    return kvs_worker_wait_layer(h, layer);
}
static kvs_status api_save_layer(kvs_handle *h, uint32_t layer) {
    ENTER(h);
    return kvs_worker_save_layer(h, layer);
}
static kvs_status api_wait_save(kvs_handle *h) {
    ENTER(h);
    kvs_status st = kvs_worker_wait_save(h);
    kvs_metrics_handle_tick(h);
    return st;
}
static kvs_status api_get_finished(kvs_handle *h, char *sending, uint64_t sending_cap,
                                   uint64_t *n_sending, char *receiving, uint64_t receiving_cap,
                                   uint64_t *n_receiving) {
    ENTER(h);
    kvs_status st = kvs_worker_get_finished(h, sending, sending_cap, n_sending, receiving,
                                            receiving_cap, n_receiving);
    kvs_metrics_handle_tick(h);
    return st;
}
static kvs_status api_load_error_blocks(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n) {
    ENTER(h);
    return kvs_worker_error_blocks(h, out, cap, n);
}
static kvs_status api_set_plan_caps(kvs_handle *h, uint32_t caps) {
    ENTER(h);
    return kvs_reqs_set_plan_caps(h, caps);
}
static kvs_status api_plan(kvs_handle *h, const char *req_id, kvs_restore_plan *out) {
    ENTER(h);
    /* the scheduler holds the request; the planner copies its plan out */
    return kvs_restore_plan_of(h, req_id, req_id ? kvs_reqs_last_plan(h, req_id) : NULL, out);
}
static kvs_status api_set_stages(kvs_handle *h, const kvs_stage_desc *stages) {
    ENTER(h);
    return kvs_reqs_set_stages(h, stages);
}
static kvs_status api_set_stream(kvs_handle *h, void *stream) {
    ENTER(h);
    return kvs_worker_set_stream(h, stream);
}
static kvs_status api_stats(kvs_handle *h, kvs_stats *out) {
    ENTER(h);
    uint32_t size = out ? kvs_struct_out_size(out, sizeof *out, KVS_STATS_SIZE_1_0) : 0;
    if (!size)
        return kvs_set_error(h, KVS_EINVAL,
                             "stats: out is NULL or its struct_size %u is below the 1.0 size %u",
                             out ? out->struct_size : 0, KVS_STATS_SIZE_1_0);
    kvs_saver_collect(h);
    kvs_stats s = h->stats;
    s.struct_size = size;
    if (h->tiers) { /* saves a background-writing top tier dropped after accepting them were not saved */
        uint64_t dropped = kvs_tiers_dropped_saves(h->tiers);
        s.saves_skipped += dropped;
        s.chunks_saved -= dropped < s.chunks_saved ? dropped : s.chunks_saved;
    }
    s.n_tiers = h->tiers ? kvs_tiers_count(h->tiers) : 0;
    s.load_gbps = s.load_ns ? (double)s.bytes_loaded / (double)s.load_ns : 0.0;
    s.save_gbps = s.save_ns ? (double)s.bytes_saved / (double)s.save_ns : 0.0;
    memcpy(out, &s, size);
    kvs_metrics_handle_tick(h);
    return KVS_OK;
}

static kvs_status api_load_dropped(kvs_handle *h, const char *req_id, uint64_t first_token,
                                   uint64_t n_tokens, uint8_t *mask, uint64_t *n_dropped) {
    ENTER(h);
    return kvs_worker_load_dropped(h, req_id, first_token, n_tokens, mask, n_dropped);
}

static kvs_status api_lsc_reserve(kvs_handle *h, const kvs_layer_view *buffer, uint32_t n_blocks,
                                  uint32_t *granted, uint32_t *stream_tokens) {
    ENTER(h);
    return kvs_lsc_reserve(h, buffer, n_blocks, granted, stream_tokens);
}

static kvs_status api_lsc_fetch(kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                                const uint32_t *pages, uint32_t n) {
    ENTER(h);
    return kvs_lsc_fetch(h, layer, blocks, pages, n);
}

static kvs_status api_lsc_store(kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                                const uint32_t *pages, uint32_t n) {
    ENTER(h);
    return kvs_lsc_store(h, layer, blocks, pages, n);
}

static kvs_status api_sparse_begin(kvs_handle *h, const char *req_id, const int32_t *tokens,
                                   uint64_t n_tokens, const kvs_sparse_cache *cache,
                                   const kvs_sparse_params *params, uint64_t *stored_tokens) {
    ENTER(h);
    return kvs_sparse_begin(h, req_id, tokens, n_tokens, cache, params, stored_tokens);
}

static kvs_status api_sparse_select(kvs_handle *h, const char *req_id, uint32_t layer,
                                    const float *q, uint64_t n_rows, uint32_t flags) {
    ENTER(h);
    return kvs_sparse_select(h, req_id, layer, q, n_rows, flags);
}

static kvs_status api_sparse_wait(kvs_handle *h, const char *req_id, uint32_t layer) {
    ENTER(h);
    if (layer == UINT32_MAX) return kvs_set_error(h, KVS_EINVAL, "sparse_wait: layer UINT32_MAX");
    return kvs_sparse_wait(h, req_id, layer);
}

static kvs_status api_sparse_stats(kvs_handle *h, const char *req_id, kvs_sparse_stats *out) {
    ENTER(h);
    return kvs_sparse_get_stats(h, req_id, out);
}

static kvs_status api_sparse_end(kvs_handle *h, const char *req_id) {
    ENTER(h);
    return kvs_sparse_end(h, req_id);
}

static kvs_status api_request_key_input(kvs_handle *h, const char *req_id, uint64_t from_token,
                                        const void *bytes, uint64_t len) {
    ENTER(h);
    return kvs_reqs_request_key_input(h, req_id, from_token, bytes, len);
}

static kvs_status api_build_meta_update(kvs_handle *h, const kvs_step_update *reqs, uint64_t n,
                                        void *buf, uint64_t cap, uint64_t *len) {
    ENTER(h);
    return kvs_reqs_build_meta_update(h, reqs, n, buf, cap, len);
}

static kvs_status api_handle_info(const kvs_handle *h, kvs_handle_info *out) {
    if (!h || !out || out->struct_size < KVS_HANDLE_INFO_SIZE_1_10) return KVS_EINVAL;
    kvs_handle_info info = {.struct_size = out->struct_size < sizeof info ? out->struct_size
                                                                          : (uint32_t)sizeof info,
                            .role = (uint32_t)h->role,
                            .transfer_role = h->transfer_role,
                            .chunk_tokens = (uint32_t)h->chunk_tokens,
                            .key_ranks = h->key_ranks,
                            .n_tiers = kvs_tiers_count(h->tiers),
                            .save_decode = h->cfg->save_decode ? 1u : 0u,
                            .saves_async = h->cfg->saves.async ? 1u : 0u,
                            .lease_timeout_ms = h->cfg->lease_timeout_ms};
    memcpy(out, &info, info.struct_size);
    return KVS_OK;
}

static const char *api_tier_name(const kvs_handle *h, uint32_t tier) {
    if (!h || !h->tiers || tier >= kvs_tiers_count(h->tiers)) return NULL;
    return kvs_tiers_name(h->tiers, tier);
}

static const kvs_api api_v1 = {
    .abi_major = KVS_ABI_MAJOR,
    .abi_minor = KVS_ABI_MINOR,
    .struct_size = sizeof(kvs_api),
    .strerror = kvs_status_sentence,
    .open = api_open,
    .close = api_close,
    .last_error = api_last_error,
    .lookup = api_lookup,
    .on_alloc = api_on_alloc,
    .build_meta = api_build_meta,
    .request_finished = api_request_finished,
    .take_events = api_take_events,
    .register_kv = api_register_kv,
    .bind_meta = api_bind_meta,
    .start_load = api_start_load,
    .wait_layer_load = api_wait_layer_load,
    .save_layer = api_save_layer,
    .wait_save = api_wait_save,
    .get_finished = api_get_finished,
    .load_error_blocks = api_load_error_blocks,
    .stats = api_stats,
    .set_stream = api_set_stream,
    .set_plan_caps = api_set_plan_caps,
    .plan = api_plan,
    .set_stages = api_set_stages,
    .tier_name = api_tier_name,
    .load_dropped = api_load_dropped,
    .lsc_reserve = api_lsc_reserve,
    .lsc_fetch = api_lsc_fetch,
    .lsc_store = api_lsc_store,
    .sparse_begin = api_sparse_begin,
    .sparse_select = api_sparse_select,
    .sparse_wait = api_sparse_wait,
    .sparse_stats = api_sparse_stats,
    .sparse_end = api_sparse_end,
    .request_key_input = api_request_key_input,
    .build_meta_update = api_build_meta_update,
    .handle_info = api_handle_info,
    .store_api = kvs_store_api_table,
};

KVS_EXPORT const kvs_api *kvs_get_api(uint32_t abi_major) {
    return abi_major == KVS_ABI_MAJOR ? &api_v1 : NULL;
}
