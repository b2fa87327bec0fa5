/* store_metrics.c - what a store publishes into its instance's metrics segment (common/metrics.h):
 * its counters, which are relaxed atomics, read by the instance thread every KVS_METRICS_POLL_MS,
 * so nothing is added to the store's own calls, and the usage of its tiers that answer locally. */
#include <stdio.h>
#include <string.h>

#include "common/metrics.h"
#include "store_state.h"

/* A tier whose usage is a round trip to its servers (Redis DBSIZE, a node's JOB_STATS): never asked
 * from the instance's thread, which serves HTTP. `kvstrata stats CONFIG` asks those servers. */
static int network_tier(const kvs_store *s, uint32_t t) {
    if (kvs_tiers_is_remote(s->chain, t)) return 1;
    if (t >= s->cfg->n_tiers) return 0;
    const char *type = s->cfg->tiers[t].type;
    return strcmp(type, "remote") == 0 || strcmp(type, "redis") == 0;
}

static void poll_store(void *ctx, kvs_mseg_values *v, int final) {
    kvs_store *s = ctx;
    const kvs_store_counters *c = &s->c;
    /* a get counts its key before its miss: misses read first are never more than the gets */
    v->c[KVS_MC_GET_MISSES] = KVS_STORE_GET(c->get_misses);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    v->c[KVS_MC_GETS] = KVS_STORE_GET(c->gets);
    v->c[KVS_MC_SAVES] = KVS_STORE_GET(c->puts_stored);
    v->c[KVS_MC_SAVED_BYTES] = KVS_STORE_GET(c->put_bytes);
    v->c[KVS_MC_SAVE_NS] = KVS_STORE_GET(c->put_ns);
    v->c[KVS_MC_SAVES_SKIPPED] = KVS_STORE_GET(c->puts_skipped);
    v->c[KVS_MC_ERR_CORRUPT] = KVS_STORE_GET(c->corrupt);
    v->c[KVS_MC_ERR_PUT_FAILED] = KVS_STORE_GET(c->puts_failed);
    v->c[KVS_MC_EVICTIONS] = kvs_tiers_evictions(s->chain);
    for (uint32_t t = 0; t < v->n_tiers; t++) {
        kvs_mseg_tier *x = &v->tiers[t];
        x->hits = KVS_STORE_GET(c->tier_hits[t]);
        x->loaded_bytes = KVS_STORE_GET(c->tier_hit_bytes[t]);
        x->capacity = t < s->cfg->n_tiers ? s->cfg->tiers[t].capacity_bytes : 0;
        x->shared = (uint64_t)kvs_tiers_shared(s->chain, t);
        const kvs_backend_ops *ops = kvs_tiers_ops(s->chain, t);
        if (!ops || !ops->usage || network_tier(s, t)) {
            x->objects = x->bytes = x->usage_known = 0; /* not asked: unknown, not empty */
            continue;
        }
        if (final) continue; /* the gauges leave with the slot */
        /* the store's own calls hold its lock for as long as they take: the last answer stays */
        if (s->serialize && pthread_mutex_trylock(&s->chain_lock) != 0) continue;
        ops->usage(kvs_tiers_state(s->chain, t), &x->objects, &x->bytes);
        x->usage_known = 1;
        if (s->serialize) pthread_mutex_unlock(&s->chain_lock);
    }
}

void kvs_store_metrics_open(kvs_store *s) {
    if (!s->cfg->metrics.enabled || !s->chain) return;
    kvs_mseg_values v;
    memset(&v, 0, sizeof v);
    v.kind = KVS_MSEG_STORE;
    snprintf(v.tenant, sizeof v.tenant, "%s", s->tenant);
    v.n_tiers = s->n_tiers < KVS_MSEG_TIERS ? s->n_tiers : KVS_MSEG_TIERS;
    for (uint32_t t = 0; t < v.n_tiers; t++)
        snprintf(v.tiers[t].name, sizeof v.tiers[t].name, "%s", kvs_tiers_name(s->chain, t));
    s->metrics = kvs_metrics_attach(s->cfg->metrics.listen, s->cfg->metrics.name, s->cfg->log_level,
                                    &v, poll_store, s);
}

void kvs_store_metrics_close(kvs_store *s) {
    kvs_metrics_detach(s->metrics);
    s->metrics = NULL;
}
