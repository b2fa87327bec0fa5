/* metrics_handle.c - what a connector handle publishes (metrics_handle.h): kvs_stats as the stats
 * hook reports it, split by tier (staged from the engine's thread), and its tiers' usage (asked by
 * the instance's thread). */
#include "metrics_handle.h"

#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/metrics.h"
#include "worker_saver.h"

/* The tenant option of the handle's remote or redis tier, "" when none. */
static void tenant_of(const kvs_config *cfg, char *out, size_t cap) {
    out[0] = '\0';
    for (size_t t = 0; t < cfg->n_tiers; t++) {
        const kvs_tier_config *tc = &cfg->tiers[t];
        if (strcmp(tc->type, "remote") != 0 && strcmp(tc->type, "redis") != 0) continue;
        for (size_t o = 0; o < tc->n_options; o++)
            if (strcmp(tc->options[o].key, "tenant") == 0) {
                snprintf(out, cap, "%s", tc->options[o].value);
                return;
            }
    }
}

static void identity(kvs_handle *h, kvs_mseg_values *v) {
    memset(v, 0, sizeof *v);
    v->kind = KVS_MSEG_CONNECTOR;
    tenant_of(h->cfg, v->tenant, sizeof v->tenant);
    uint32_t n = kvs_tiers_count(h->tiers);
    v->n_tiers = n < KVS_MSEG_TIERS ? n : KVS_MSEG_TIERS;
    for (uint32_t t = 0; t < v->n_tiers; t++)
        snprintf(v->tiers[t].name, sizeof v->tiers[t].name, "%s", kvs_tiers_name(h->tiers, t));
}

/* A tier whose usage is a round trip to its servers (remote, redis, or any backend that says its
 * objects are on other machines): never asked from the instance's thread, which serves HTTP.
 * `kvstrata stats CONFIG` asks those servers itself. */
static int network_tier(const kvs_handle *h, uint32_t t) {
    if (kvs_tiers_is_remote(h->tiers, t)) return 1;
    if (t >= h->cfg->n_tiers) return 0;
    const char *type = h->cfg->tiers[t].type;
    return strcmp(type, "remote") == 0 || strcmp(type, "redis") == 0;
}

/* On the engine's thread: counters only (no tier call, no lock but the saver's own). */
static void fill(kvs_handle *h, kvs_mseg_values *v) {
    kvs_saver_collect(h);
    const kvs_stats *s = &h->stats;
    uint64_t dropped = kvs_tiers_dropped_saves(h->tiers);
    uint64_t saved = s->chunks_saved - (dropped < s->chunks_saved ? dropped : s->chunks_saved);
    v->c[KVS_MC_LOOKUPS] = s->lookups;
    v->c[KVS_MC_LOOKUP_TOKENS] = s->lookup_hit_tokens + s->lookup_miss_tokens;
    v->c[KVS_MC_HIT_TOKENS] = s->lookup_hit_tokens;
    v->c[KVS_MC_SAVES] = saved;
    v->c[KVS_MC_SAVED_BYTES] = s->bytes_saved;
    v->c[KVS_MC_SAVE_NS] = s->save_ns;
    v->c[KVS_MC_SAVES_SKIPPED] = s->saves_skipped + dropped;
    v->c[KVS_MC_EVICTIONS] = __atomic_load_n(&s->evictions, __ATOMIC_RELAXED);
    v->c[KVS_MC_ERR_LOAD] = s->load_errors;
    v->c[KVS_MC_ERR_INTEGRITY] = __atomic_load_n(&s->integrity_rejects, __ATOMIC_RELAXED);
    for (uint32_t t = 0; t < v->n_tiers; t++) {
        kvs_mseg_tier *x = &v->tiers[t];
        if (t < KVS_STATS_MAX_TIERS) {
            x->hits = s->tier_chunks_loaded[t];
            /* tensor-parallel ranks load the same tokens: rank 0 counts them */
            x->hit_tokens = h->key_rank == 0 ? h->tier_tokens_loaded[t] : 0;
            x->loaded_bytes = s->tier_bytes_loaded[t];
            x->load_ns = s->tier_load_ns[t];
        }
        x->capacity = t < h->cfg->n_tiers ? h->cfg->tiers[t].capacity_bytes : 0;
        x->shared = (uint64_t)kvs_tiers_shared(h->tiers, t);
    }
}

/* On the instance's thread (metrics.h): the tiers' usage. Only where every tier may be called from
 * any thread (the engine may be inside one now), never a network tier's, and never after the
 * handle's close detached the source (kvs_metrics_detach waits for a poll in progress), so the
 * tiers are open for the whole call. */
static void poll_usage(void *ctx, kvs_mseg_values *v, int final) {
    kvs_handle *h = ctx;
    for (uint32_t t = 0; t < v->n_tiers; t++) {
        v->tiers[t].objects = v->tiers[t].bytes = 0;
        v->tiers[t].usage_known = 0; /* not asked: published as unknown, not as empty */
    }
    if (final || !kvs_tiers_thread_safe(h->tiers)) return;
    for (uint32_t t = 0; t < v->n_tiers; t++) {
        const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, t);
        if (!ops || !ops->usage || network_tier(h, t)) continue;
        ops->usage(kvs_tiers_state(h->tiers, t), &v->tiers[t].objects, &v->tiers[t].bytes);
        v->tiers[t].usage_known = 1;
    }
}

void kvs_metrics_handle_open(kvs_handle *h) {
    if (!h->cfg->metrics.enabled || !h->tiers) return;
    kvs_mseg_values v;
    identity(h, &v);
    h->metrics = kvs_metrics_attach(h->cfg->metrics.listen, h->cfg->metrics.name, h->cfg->log_level,
                                    &v, poll_usage, h);
    h->metrics_next_ns = 0;
}

void kvs_metrics_handle_tick(kvs_handle *h) {
    if (!h->metrics) return;
    uint64_t now = kvs_now_ns();
    if (now < h->metrics_next_ns) return;
    h->metrics_next_ns = now + KVS_METRICS_PUBLISH_MS * 1000000ull;
    kvs_mseg_values v;
    identity(h, &v);
    fill(h, &v);
    kvs_metrics_stage(h->metrics, &v);
}

void kvs_metrics_handle_close(kvs_handle *h) {
    if (!h->metrics) return;
    h->metrics_next_ns = 0;
    kvs_metrics_handle_tick(h);
    kvs_metrics_detach(h->metrics);
    h->metrics = NULL;
}
