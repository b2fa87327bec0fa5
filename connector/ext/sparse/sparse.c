/* sparse.c - the sparse decode hooks (sparse.h, docs/sparse.md).
 *
 * A request begun holds: its chunk keys and the tier each chunk was found in (pinned there until
 * the end), the rows of the chunks taken (sparse_store.h: keys as floats, a hash per row), and per
 * layer and KV head a QSAC state whose label lives here and whose slot table is the engine's
 * (cache.slot_rows). A step (a job) runs kvs_sparse_store_select for its layer, then reads each row
 * the head cache lacks from the chunk's tier (a reference into a zero-copy tier, get_range, or the
 * whole object), checks it against its row hash and writes it into the slot.
 *
 * Jobs run on the request's own thread when every tier may be read from another thread, in the
 * order they were submitted; sparse_wait waits for the layer's. Otherwise they run in the caller's
 * thread and sparse_wait has nothing to wait for. The lock guards the queue and the counters; a
 * job's work touches only its own layer's state, and the engine leaves that alone until it waits. */
#include "sparse.h"
#include "connector/integrity.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_sparse.h"
#include "common/abi_struct.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status.h"
#include "common/xxh3.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/last_error.h"
#include "connector/role.h"
#include "connector/tiers.h"
#include "kernels/cpu/dtype.h"
#include "schedulers/qsac/topk.h"
#include "sparse_store.h"
#include "sparse_swarm.h"

#define SP_PIN_MS (365ull * 24 * 3600 * 1000) /* until sparse_end */

typedef struct sp_job {
    uint32_t layer, flags;
    uint64_t n_rows;
    float *q; /* the request's q_floats, its own copy */
} sp_job;

typedef struct kvs_sparse_req {
    char id[KVS_REQ_ID_MAX];
    struct kvs_sparse_req *next;
    kvs_sparse_cache cache;
    kvs_sparse_params params;
    uint32_t n_layers, n_heads, m, d, slots, topk;
    uint64_t head_bytes, q_floats;
    uint32_t max_chunks, n_chunks; /* chunks looked at so far (taken or refused) */
    kvs_key *keys;                 /* [max_chunks] */
    int32_t *tier_of;              /* [max_chunks]: the tier holding the chunk; -1 not taken */
    uint8_t *pinned;               /* [max_chunks] */
    kvs_sparse_store *store;
    kvs_sparse_head *heads; /* [n_layers][n_heads] */
    float *labels;          /* [n_layers][n_heads][m * d] */
    uint8_t *spec_pending;  /* [n_layers]: the last job of the layer was SPECULATIVE */
    uint32_t *fetch_rows, *fetch_slots, *n_fetch; /* a job's scratch */
    uint8_t *object;                              /* one chunk object: begin's, and reads */
    uint32_t object_chunk;                        /* the chunk `object` holds (UINT32_MAX: none) */
    kvs_handle *h;
    /* the thread and its queue */
    int threaded, stop;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    sp_job *ring;
    uint32_t ring_cap, ring_head, ring_count;
    uint64_t *submitted, *done; /* [n_layers] */
    kvs_sparse_stats stats;
    /* LAYOUT_SWARM: the SSD tier, the clusters (NULL until the first chunks are taken), and which
     * of a step's rows came out of them */
    int32_t swarm_tier;
    kvs_sparse_swarm *swarm;
    uint8_t *from_cluster; /* [n_heads * slots] */
    uint32_t job_layer;    /* the layer run_job is on (the place callback's) */
    kvs_qsac_adapt *adapt; /* [n_layers][n_heads], or NULL: static thresholds */
    float *medoid_scores;  /* [medoid_cap]: the medoid selector's scratch */
    uint32_t medoid_cap;
    uint8_t *seen; /* [max rows]: the medoid selector's scratch */
} kvs_sparse_req;

static kvs_sparse_req *find(kvs_handle *h, const char *id) {
    for (kvs_sparse_req *r = h->sparse; r; r = r->next)
        if (strcmp(r->id, id) == 0) return r;
    return NULL;
}

/* ---- reading rows --------------------------------------------------------------------------- */

/* Row `row`'s K and V of (layer, head) out of its whole chunk object, read into r->object unless
 * it holds that chunk already (consecutive rows of one chunk: one read): checked whole against its
 * tags when its tier is keyed; the caller checks the row against its hash. */
static kvs_status row_from_object(kvs_sparse_req *r, uint32_t layer, uint32_t head, uint32_t row,
                                  uint8_t *k, uint8_t *v) {
    uint32_t chunk = row / r->h->chunk_tokens;
    if (chunk >= r->n_chunks || r->tier_of[chunk] < 0) return KVS_ENOTFOUND;
    if (r->object_chunk != chunk) {
        uint64_t len = 0;
        r->object_chunk = UINT32_MAX;
        kvs_status st = kvs_tiers_get(r->h->tiers, (uint32_t)r->tier_of[chunk], &r->keys[chunk],
                                      r->object, r->h->object_bytes, &len);
        if (st == KVS_OK && len != r->h->object_bytes) st = KVS_ECORRUPT;
        char why[256];
        if (st == KVS_OK)
            st = kvs_integrity_check(r->h, r->tier_of[chunk], r->object, len, 1, why, sizeof why);
        if (st != KVS_OK) return st;
        r->object_chunk = chunk;
    }
    uint64_t ko, vo;
    kvs_sparse_row_offsets(r->store, layer, head, row, &ko, &vo);
    memcpy(k, r->object + ko, r->head_bytes);
    memcpy(v, r->object + vo, r->head_bytes);
    return KVS_OK;
}

/* Row `row`'s K and V of (layer, head) into k and v: KVS_OK only with bytes that match the row's
 * hash. */
static kvs_status read_row(kvs_sparse_req *r, uint32_t layer, uint32_t head, uint32_t row,
                           uint8_t *k, uint8_t *v) {
    kvs_tier_chain *chain = r->h->tiers;
    uint32_t chunk = row / r->h->chunk_tokens;
    if (chunk >= r->n_chunks || r->tier_of[chunk] < 0) return KVS_ENOTFOUND;
    uint32_t tier = (uint32_t)r->tier_of[chunk];
    const kvs_key *key = &r->keys[chunk];
    uint64_t ko, vo, hb = r->head_bytes;
    kvs_sparse_row_offsets(r->store, layer, head, row, &ko, &vo);
    kvs_status st;
    if (kvs_integrity_keyed(r->h, (int)tier)) { /* tags cover whole layers: read the object */
        st = row_from_object(r, layer, head, row, k, v);
    } else if (r->pinned[chunk] && kvs_tiers_zero_copy(chain, tier)) {
        const void *obj = NULL;
        uint64_t len = 0;
        st = kvs_tiers_get_ref(chain, tier, key, &obj, &len);
        if (st == KVS_OK && (len < ko + hb || len < vo + hb)) st = KVS_ECORRUPT;
        if (st == KVS_OK) {
            memcpy(k, (const uint8_t *)obj + ko, hb);
            memcpy(v, (const uint8_t *)obj + vo, hb);
        }
    } else if (kvs_tiers_can_get_range(chain, tier)) {
        uint64_t got = 0, total = 0;
        st = kvs_tiers_get_range(chain, tier, key, ko, hb, k, &got, &total);
        if (st == KVS_OK && got != hb) st = KVS_ECORRUPT;
        if (st == KVS_OK) st = kvs_tiers_get_range(chain, tier, key, vo, hb, v, &got, &total);
        if (st == KVS_OK && got != hb) st = KVS_ECORRUPT;
    } else {
        st = row_from_object(r, layer, head, row, k, v);
    }
    if (st != KVS_OK) return st;
    return kvs_sparse_row_check(r->store, layer, head, row, k, v);
}

/* A row out of a cluster into its slot: taken only when it matches the row's hash. */
static int place_row(void *ctx, uint32_t head, uint32_t slot, uint32_t row, const uint8_t *k,
                     const uint8_t *v) {
    kvs_sparse_req *r = ctx;
    if (kvs_sparse_row_check(r->store, r->job_layer, head, row, k, v) != KVS_OK) return -1;
    uint64_t at = (((uint64_t)r->job_layer * r->n_heads + head) * r->slots + slot) * r->head_bytes;
    memcpy((uint8_t *)r->cache.k + at, k, r->head_bytes);
    memcpy((uint8_t *)r->cache.v + at, v, r->head_bytes);
    return 0;
}

/* Selection through the medoid index of a layer's clusters (params.index MEDOIDS): each medoid's
 * score, then whole clusters best first while fewer than k rows are taken; a take past k is made
 * again with a smaller k, so the head cache's slots always hold it. */
static uint32_t medoid_select(void *ctx, uint32_t layer, uint32_t head, const float *q, uint32_t m,
                              uint32_t sink, uint32_t end, uint32_t k, uint32_t *out,
                              uint64_t *scored) {
    kvs_sparse_req *r = ctx;
    uint32_t n_clusters;
    const uint32_t *offsets, *rows;
    if (!kvs_sparse_swarm_index(r->swarm, layer, head, &n_clusters, &offsets, &rows))
        return UINT32_MAX; /* no clusters yet: the exact top-k */
    if (n_clusters > r->medoid_cap) {
        float *grown = realloc(r->medoid_scores, (uint64_t)n_clusters * sizeof *grown);
        if (!grown) return UINT32_MAX;
        r->medoid_scores = grown;
        r->medoid_cap = n_clusters;
    }
    uint32_t n_keys;
    const float *keys = kvs_sparse_store_keys(r->store, layer, head, &n_keys);
    for (uint32_t c = 0; c < n_clusters; c++)
        kvs_topk_scores(q, m, keys + (uint64_t)rows[offsets[c]] * r->d, r->d, 1, r->d,
                        &r->medoid_scores[c]);
    *scored = n_clusters;
    kvs_topk_index ix = {.n_clusters = n_clusters, .offsets = offsets, .rows = rows};
    for (uint32_t want = k; want > 0;) {
        uint32_t taken = 0;
        uint32_t n =
            kvs_topk_medoids(&ix, r->medoid_scores, end, sink, 0, want, r->seen, out, &taken);
        if (n == UINT32_MAX || n <= k) return n;
        want = want > n - k ? want - (n - k) : 0; /* the last cluster overshot: fewer */
    }
    return 0;
}

/* Clustering's source: rows out of whole chunk objects (one read per chunk, rows come in order),
 * each checked against its row hash. */
static kvs_status cluster_row(void *ctx, uint32_t layer, uint32_t head, uint32_t row, uint8_t *k,
                              uint8_t *v) {
    kvs_sparse_req *r = ctx;
    kvs_status st = row_from_object(r, layer, head, row, k, v);
    return st == KVS_OK ? kvs_sparse_row_check(r->store, layer, head, row, k, v) : st;
}

/* What one step (a job) did, for the request's counters. */
typedef struct sp_tally {
    uint64_t fetched, failed, hits, clustered;
    uint64_t t0, t1, t2; /* begun, selected, fetched */
} sp_tally;

/* Select for every KV head of the layer: each head's rows to fetch and the slots for them. */
static void select_heads(kvs_sparse_req *r, const sp_job *j, kvs_sparse_head *heads, uint8_t *hit) {
    uint32_t layer = j->layer, G = r->n_heads;
    memset(r->n_fetch, 0, (uint64_t)G * sizeof *r->n_fetch);
    /* EINVAL cannot happen (begin checked the shapes); ENOMEM left the heads that ran short with
     * nothing fetched and their labels invalid: they select again next step */
    kvs_sparse_store_select(r->store, layer, j->q, heads, (uint32_t)j->n_rows, r->params.sink,
                            r->params.recent, r->topk, hit, r->fetch_rows, r->fetch_slots,
                            r->n_fetch);
    for (uint32_t g = 0; g < G; g++)
        r->cache.attend_from[(uint64_t)layer * G + g] = heads[g].sel_end;
}

/* The selected rows into their slots: what the layer's clusters hold first, the rest from their
 * chunks; a row that cannot be read leaves its slot empty and its head selecting again. */
static void fetch_selected(kvs_sparse_req *r, uint32_t layer, kvs_sparse_head *heads,
                           const uint8_t *hit, sp_tally *t) {
    uint32_t G = r->n_heads;
    int from_clusters = kvs_sparse_swarm_ready(r->swarm, layer);
    if (from_clusters) {
        memset(r->from_cluster, 0, (uint64_t)G * r->slots);
        r->job_layer = layer;
        kvs_sparse_swarm_read(r->swarm, layer, r->fetch_rows, r->fetch_slots, r->n_fetch, r->slots,
                              r->from_cluster, place_row, r);
    }
    for (uint32_t g = 0; g < G; g++) {
        t->hits += hit[g];
        uint64_t plane = ((uint64_t)layer * G + g) * r->slots;
        for (uint32_t i = 0; i < r->n_fetch[g]; i++) {
            uint32_t row = r->fetch_rows[(uint64_t)g * r->slots + i];
            uint32_t slot = r->fetch_slots[(uint64_t)g * r->slots + i];
            if (from_clusters && r->from_cluster[(uint64_t)g * r->slots + i]) {
                t->fetched++;
                t->clustered++;
                continue;
            }
            uint8_t *k = (uint8_t *)r->cache.k + (plane + slot) * r->head_bytes;
            uint8_t *v = (uint8_t *)r->cache.v + (plane + slot) * r->head_bytes;
            if (read_row(r, layer, g, row, k, v) == KVS_OK) {
                t->fetched++;
                continue;
            }
            /* never attended: the slot is empty, and the head selects again next step */
            r->cache.slot_rows[plane + slot] = UINT32_MAX;
            heads[g].qsac.valid = 0;
            t->failed++;
        }
    }
}

/* The clusters' profiling and maintenance see the rows each head's cache holds after a final
 * step. */
static void observe_step(kvs_sparse_req *r, uint32_t layer) {
    uint32_t G = r->n_heads;
    for (uint32_t g = 0; g < G; g++) {
        uint32_t n = 0, *sel = r->fetch_rows + (uint64_t)g * r->slots; /* scratch now */
        for (uint32_t i = 0; i < r->slots; i++) {
            uint32_t row = r->cache.slot_rows[((uint64_t)layer * G + g) * r->slots + i];
            if (row != UINT32_MAX) sel[n++] = row;
        }
        kvs_sparse_swarm_observe(r->swarm, layer, g, sel, n);
    }
    kvs_sparse_swarm_step_done(r->swarm, layer);
}

/* The step into the request's counters (the clusters' and the store's as they stand now), and
 * the layer's jobs done one more; called with the lock held. */
static void count_job(kvs_sparse_req *r, const sp_job *j, const sp_tally *t,
                      const kvs_sparse_swarm_stats *sws) {
    uint32_t layer = j->layer, G = r->n_heads;
    kvs_sparse_stats *s = &r->stats;
    s->layouts_found = sws->layers_found;
    s->layouts_written = sws->layers_written;
    s->reclustered = sws->reclustered;
    s->clusters_read = sws->clusters_read;
    s->cluster_bytes_read = sws->cluster_bytes;
    s->cluster_cache_hits = sws->cache_hits;
    s->rows_from_clusters += t->clustered;
    double audit_error = 0;
    kvs_sparse_store_counts(r->store, &s->keys_scored, &s->medoid_selections, &s->audits,
                            &audit_error);
    s->audit_error_micro = (uint64_t)(audit_error * 1e6);
    s->tau_raised = s->tau_lowered = 0;
    for (uint64_t i = 0; r->adapt && i < (uint64_t)r->n_layers * G; i++) {
        s->tau_raised += r->adapt[i].raised;
        s->tau_lowered += r->adapt[i].lowered;
    }
    s->steps++;
    s->head_hits += t->hits;
    s->head_misses += G - t->hits;
    if (j->flags == KVS_SPARSE_SPECULATIVE) s->spec_steps++;
    if (j->flags == KVS_SPARSE_FINAL && r->spec_pending[layer]) {
        s->spec_kept += t->hits;
        s->spec_corrected += G - t->hits;
    }
    r->spec_pending[layer] = j->flags == KVS_SPARSE_SPECULATIVE;
    s->rows_fetched += t->fetched;
    s->bytes_fetched += t->fetched * 2 * r->head_bytes;
    s->rows_failed += t->failed;
    s->select_ns += t->t1 - t->t0;
    s->fetch_ns += t->t2 - t->t1;
    r->done[layer]++;
}

/* One step: select for every KV head of the layer, then read what the head cache lacks. */
static void run_job(kvs_sparse_req *r, const sp_job *j) {
    sp_tally t = {.t0 = kvs_now_ns()};
    uint32_t layer = j->layer, G = r->n_heads;
    kvs_sparse_head *heads = r->heads + (uint64_t)layer * G;
    uint8_t *hit = r->cache.hit + (uint64_t)layer * G;
    select_heads(r, j, heads, hit);
    t.t1 = kvs_now_ns();
    fetch_selected(r, layer, heads, hit, &t);
    if (r->swarm && j->flags == KVS_SPARSE_FINAL) observe_step(r, layer);
    t.t2 = kvs_now_ns();
    kvs_sparse_swarm_stats sws = {0};
    if (r->swarm) kvs_sparse_swarm_get_stats(r->swarm, &sws);
    pthread_mutex_lock(&r->lock);
    count_job(r, j, &t, &sws);
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
}

static void *req_thread(void *arg) {
    kvs_sparse_req *r = arg;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (!r->ring_count && !r->stop) pthread_cond_wait(&r->changed, &r->lock);
        if (!r->ring_count) break; /* stopping, and nothing is left */
        sp_job j = r->ring[r->ring_head];
        pthread_mutex_unlock(&r->lock);
        run_job(r, &j);
        pthread_mutex_lock(&r->lock);
        r->ring_head = (r->ring_head + 1) % r->ring_cap; /* its q buffer is free from here */
        r->ring_count--;
        pthread_cond_broadcast(&r->changed);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/* ---- a request's life ----------------------------------------------------------------------- */

/* End a request: its queued steps run first (sparse_end) or are dropped (drop: close). */
static void req_free(kvs_sparse_req *r, int drop) {
    if (!r) return;
    if (r->threaded) {
        pthread_mutex_lock(&r->lock);
        if (drop && r->ring_count > 1) r->ring_count = 1; /* the one running finishes */
        r->stop = 1;
        pthread_cond_broadcast(&r->changed);
        pthread_mutex_unlock(&r->lock);
        pthread_join(r->thread, NULL);
    }
    for (uint32_t c = 0; r->tier_of && c < r->n_chunks; c++)
        if (r->pinned[c]) kvs_tiers_unpin(r->h->tiers, (uint32_t)r->tier_of[c], &r->keys[c]);
    kvs_sparse_swarm_close(r->swarm);
    free(r->from_cluster);
    free(r->medoid_scores);
    free(r->adapt);
    free(r->seen);
    kvs_sparse_store_destroy(r->store);
    for (uint32_t i = 0; r->ring && i < r->ring_cap; i++) free(r->ring[i].q);
    free(r->ring);
    free(r->keys);
    free(r->tier_of);
    free(r->pinned);
    free(r->heads);
    free(r->labels);
    free(r->spec_pending);
    free(r->fetch_rows);
    free(r->fetch_slots);
    free(r->n_fetch);
    free(r->object);
    free(r->submitted);
    free(r->done);
    free((void *)r->params.importance);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->changed);
    free(r);
}

/* Take chunks [r->n_chunks, n_tokens / chunk_tokens) in order: each is found in a tier, pinned
 * there and read whole and checked. The first that no tier holds, that its tier will not pin or
 * whose object fails its check ends the stored prefix for now (a later begin looks again from
 * there); a refusal is counted and logged. KVS_EINVAL, nothing taken, when tokens do not begin
 * with the chunks taken already. */
static kvs_status take_chunks(kvs_handle *h, kvs_sparse_req *r, const int32_t *tokens,
                              uint64_t n_tokens) {
    uint64_t want = n_tokens / h->chunk_tokens;
    if (want > r->max_chunks) want = r->max_chunks;
    if (want == 0) return KVS_OK;
    /* the keys chain from the fingerprint over every chunk: the ones taken must not change */
    kvs_key *keys = malloc(want * sizeof *keys);
    if (!keys) return kvs_set_error(h, KVS_ENOMEM, "sparse_begin: out of memory");
    kvs_keys_chain(&h->fingerprint, tokens, want, h->chunk_tokens, keys);
    uint64_t taken = r->n_chunks < want ? r->n_chunks : want;
    if (memcmp(keys, r->keys, taken * sizeof *keys) != 0) {
        free(keys);
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: '%s' again with tokens that do not begin with the %u "
                             "chunks it took",
                             r->id, r->n_chunks);
    }
    if (want > r->n_chunks)
        memcpy(r->keys + r->n_chunks, keys + r->n_chunks, (want - r->n_chunks) * sizeof *keys);
    free(keys);
    char err[256];
    for (uint32_t c = r->n_chunks; c < want; c++) {
        int tier = kvs_tiers_find(h->tiers, &r->keys[c]);
        if (tier < 0) break;
        if (!kvs_tiers_pin(h->tiers, (uint32_t)tier, &r->keys[c], SP_PIN_MS)) break;
        uint64_t len = 0;
        kvs_status st =
            kvs_tiers_get(h->tiers, (uint32_t)tier, &r->keys[c], r->object, h->object_bytes, &len);
        if (st == KVS_OK) st = kvs_integrity_check(h, tier, r->object, len, 1, err, sizeof err);
        if (st == KVS_OK)
            st = kvs_sparse_store_add(r->store, c, r->object, len, &h->fingerprint, &r->keys[c],
                                      err, sizeof err);
        if (st != KVS_OK) {
            kvs_tiers_unpin(h->tiers, (uint32_t)tier, &r->keys[c]);
            r->stats.chunks_refused++;
            kvs_log(h->cfg->log_level, KVS_LOG_WARN,
                    "sparse_begin: '%s' chunk %u not taken (%s): the stored prefix ends there",
                    r->id, c, st == KVS_ECORRUPT ? err : kvs_status_sentence(st));
            break;
        }
        r->tier_of[c] = tier;
        r->pinned[c] = 1;
        r->n_chunks = c + 1;
    }
    r->object_chunk = UINT32_MAX;
    r->stats.stored_tokens = (uint64_t)r->n_chunks * h->chunk_tokens;
    return KVS_OK;
}

/* The first tier that can hold clusters (striped, batched reads), or -1; none looked for with
 * layout ROWS. */
static int32_t find_swarm_tier(kvs_handle *h, const kvs_sparse_params *params) {
    for (uint32_t t = 0; params->layout != KVS_SPARSE_LAYOUT_ROWS && t < kvs_tiers_count(h->tiers);
         t++) {
        const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, t);
        if ((ops->caps & KVS_BACKEND_CAP_STRIPED) && kvs_tiers_can_get_many(h->tiers, t))
            return (int32_t)t;
    }
    return -1;
}

/* The caller's cache and params copied in, the params' defaults filled in. */
static kvs_status begin_args(kvs_handle *h, uint64_t n_tokens, const kvs_sparse_cache *cache_in,
                             const kvs_sparse_params *params_in, kvs_sparse_cache *cache,
                             kvs_sparse_params *params) {
    if (!cache_in || kvs_struct_in(cache, sizeof *cache, cache_in, KVS_SPARSE_CACHE_SIZE_1_9) != 0)
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: cache is NULL or its struct_size is below %u",
                             KVS_SPARSE_CACHE_SIZE_1_9);
    if (!params_in ||
        kvs_struct_in(params, sizeof *params, params_in, KVS_SPARSE_PARAMS_SIZE_1_9) != 0)
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: params is NULL or its struct_size is below %u",
                             KVS_SPARSE_PARAMS_SIZE_1_9);
    if (!cache->slots || !cache->k || !cache->v || !cache->slot_rows || !cache->hit ||
        !cache->attend_from)
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: the cache needs slots, k, v, slot_rows, "
                             "hit and attend_from");
    if (!params->topk) params->topk = cache->slots;
    if (!params->q_per_kv) params->q_per_kv = 1;
    if (params->eta == 0.0f) params->eta = 0.8f;
    if (params->p == 0.0f) params->p = 3.0f;
    if (!params->max_tokens) params->max_tokens = n_tokens;
    return KVS_OK;
}

/* The params against the cache and the chain: a layout that needs a tier has one. */
static kvs_status check_params(kvs_handle *h, const kvs_sparse_cache *cache,
                               const kvs_sparse_params *params, int32_t swarm_tier) {
    if (params->layout > KVS_SPARSE_LAYOUT_POSITIONS ||
        params->cluster_cache > KVS_SPARSE_CACHE_LRU || !(params->min_useful >= 0.0f) ||
        !(params->min_useful <= 1.0f))
        return kvs_set_error(
            h, KVS_EINVAL,
            "sparse_begin: layout %u, cluster_cache %u, min_useful %g: layout ROWS, "
            "SWARM or POSITIONS, cluster_cache SCORE or LRU, min_useful in [0, 1]",
            params->layout, params->cluster_cache, (double)params->min_useful);
    if (!(params->target_error >= 0.0f) || !(params->target_error <= 1.0f) ||
        !(params->score_scale >= 0.0f))
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: target_error %g (in [0, 1]), score_scale %g (>= 0)",
                             (double)params->target_error, (double)params->score_scale);
    if (params->index > KVS_SPARSE_INDEX_MEDOIDS ||
        (params->index == KVS_SPARSE_INDEX_MEDOIDS && params->layout == KVS_SPARSE_LAYOUT_ROWS))
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: index %u: EXACT, or MEDOIDS with a cluster layout",
                             params->index);
    if (params->layout != KVS_SPARSE_LAYOUT_ROWS && swarm_tier < 0)
        return kvs_set_error(h, KVS_ENOTSUP,
                             "sparse_begin: layouts SWARM and POSITIONS need a tier of type ssd "
                             "in the chain");
    if (params->topk > cache->slots || params->q_per_kv > 1024 || !(params->eta >= -1.0f) ||
        !(params->eta <= 1.0f) || !(params->p > 0.0f))
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: topk %u (slots %u), q_per_kv %u, eta %g, p %g: topk "
                             "may not exceed slots, q_per_kv at most 1024, eta in [-1, 1], p > 0",
                             params->topk, cache->slots, params->q_per_kv, (double)params->eta,
                             (double)params->p);
    return KVS_OK;
}

/* A new request's fields from the handle's shapes and the checked cache and params. */
static void req_init(kvs_handle *h, kvs_sparse_req *r, const char *req_id,
                     const kvs_sparse_cache *cache, const kvs_sparse_params *params,
                     uint64_t max_chunks, int32_t swarm_tier) {
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->changed, NULL);
    snprintf(r->id, sizeof r->id, "%s", req_id);
    r->h = h;
    r->cache = *cache;
    r->params = *params;
    r->params.importance = NULL;
    r->n_layers = h->model.n_layers;
    r->n_heads = h->shape.n_heads;
    r->m = params->q_per_kv;
    r->d = h->model.head_dim;
    r->slots = cache->slots;
    r->topk = params->topk;
    r->head_bytes = h->shape.head_bytes;
    r->q_floats = (uint64_t)r->n_heads * r->m * r->d;
    r->max_chunks = (uint32_t)max_chunks;
    r->object_chunk = UINT32_MAX;
    r->stats.struct_size = sizeof r->stats;
    r->ring_cap = 2 * r->n_layers + 2;
    r->swarm_tier = swarm_tier;
}

/* A request's arrays, its ring's q buffers and its copy of the importance: 0 when one is short
 * (req_free lets go of what was had). */
static int req_alloc(kvs_handle *h, kvs_sparse_req *r, const kvs_sparse_params *params_in,
                     uint64_t max_chunks, uint64_t planes) {
    int ok = (r->keys = calloc(max_chunks, sizeof *r->keys)) &&
             (r->tier_of = malloc(max_chunks * sizeof *r->tier_of)) &&
             (r->pinned = calloc(max_chunks, 1)) && (r->heads = calloc(planes, sizeof *r->heads)) &&
             (r->labels = calloc(planes * r->m * r->d, sizeof *r->labels)) &&
             (r->spec_pending = calloc(r->n_layers, 1)) &&
             (r->fetch_rows = malloc((uint64_t)r->n_heads * r->slots * sizeof(uint32_t))) &&
             (r->fetch_slots = malloc((uint64_t)r->n_heads * r->slots * sizeof(uint32_t))) &&
             (r->n_fetch = calloc(r->n_heads, sizeof(uint32_t))) &&
             (r->object = malloc(h->object_bytes)) &&
             (r->submitted = calloc(r->n_layers, sizeof(uint64_t))) &&
             (r->done = calloc(r->n_layers, sizeof(uint64_t))) &&
             (r->ring = calloc(r->ring_cap, sizeof *r->ring)) &&
             (r->from_cluster = calloc((uint64_t)r->n_heads * r->slots, 1)) &&
             (r->seen = calloc(max_chunks * h->chunk_tokens, 1)) &&
             (r->params.target_error == 0.0f || (r->adapt = calloc(planes, sizeof *r->adapt)));
    for (uint32_t i = 0; ok && i < r->ring_cap; i++)
        ok = (r->ring[i].q = malloc(r->q_floats * sizeof(float))) != NULL;
    if (ok && params_in->importance) {
        float *imp = malloc(planes * sizeof *imp);
        ok = imp != NULL;
        if (ok) memcpy(imp, params_in->importance, planes * sizeof *imp);
        r->params.importance = imp;
    }
    return ok;
}

/* Nothing taken yet: no chunk has a tier, the engine's head cache is empty, and every head's
 * QSAC state starts from its static threshold (adapting around it with a target_error). */
static void heads_init(kvs_sparse_req *r, const kvs_sparse_cache *cache, uint64_t planes) {
    const kvs_sparse_params *params = &r->params;
    for (uint32_t c = 0; c < r->max_chunks; c++) r->tier_of[c] = -1;
    for (uint64_t i = 0; i < planes * r->slots; i++) cache->slot_rows[i] = UINT32_MAX;
    memset(cache->hit, 0, planes);
    for (uint64_t i = 0; i < planes; i++) cache->attend_from[i] = params->sink;
    for (uint64_t i = 0; i < planes; i++) {
        double importance = params->importance ? params->importance[i] : 1.0;
        r->heads[i] = (kvs_sparse_head){
            .qsac = {.label = r->labels + i * r->m * r->d,
                     .m = r->m,
                     .d = r->d,
                     .tau = kvs_qsac_threshold(importance, params->eta, params->p)},
            .slot_rows = cache->slot_rows + i * r->slots,
            .slots = r->slots};
        if (r->adapt) { /* the bench's steps (kvs-bench-qsac), around the head's static tau */
            r->adapt[i] = (kvs_qsac_adapt){.target_error = params->target_error,
                                           .step = 0.02,
                                           .tau_min = -1.0,
                                           .tau_max = 0.99,
                                           .window = 4};
            r->heads[i].adapt = &r->adapt[i];
            r->heads[i].audit_every = params->audit_every ? params->audit_every : 8;
            r->heads[i].scale =
                params->score_scale > 0.0f ? params->score_scale : 1.0 / sqrt((double)r->d);
        }
    }
}

static kvs_status begin_new(kvs_handle *h, const char *req_id, uint64_t n_tokens,
                            const kvs_sparse_cache *cache_in, const kvs_sparse_params *params_in,
                            kvs_sparse_req **out) {
    kvs_sparse_cache cache;
    kvs_sparse_params params;
    kvs_status st = begin_args(h, n_tokens, cache_in, params_in, &cache, &params);
    if (st != KVS_OK) return st;
    int32_t swarm_tier = find_swarm_tier(h, &params);
    if ((st = check_params(h, &cache, &params, swarm_tier)) != KVS_OK) return st;
    uint64_t max_chunks = params.max_tokens / h->chunk_tokens;
    if (max_chunks == 0 || max_chunks > UINT32_MAX / 2 / h->chunk_tokens)
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: max_tokens %llu is less than a chunk (%u tokens) or "
                             "more than a request holds",
                             (unsigned long long)params.max_tokens, h->chunk_tokens);
    kvs_sparse_req *r = calloc(1, sizeof *r);
    if (!r) return kvs_set_error(h, KVS_ENOMEM, "sparse_begin: out of memory");
    req_init(h, r, req_id, &cache, &params, max_chunks, swarm_tier);
    uint64_t planes = (uint64_t)r->n_layers * r->n_heads;
    kvs_status made = kvs_sparse_store_create(&h->shape, h->model.dtype, r->n_layers,
                                              h->chunk_tokens, r->max_chunks, &r->store);
    if (made == KVS_EINVAL || (uint64_t)r->d * kvs_dtype_bytes(h->model.dtype) != r->head_bytes) {
        req_free(r, 1);
        return kvs_set_error(h, KVS_ENOTSUP,
                             "sparse_begin: the model's KV (dtype %u, head_dim %u, %llu bytes a "
                             "head) is not one sparse decode reads",
                             h->model.dtype, h->model.head_dim,
                             (unsigned long long)h->shape.head_bytes);
    }
    if (made != KVS_OK || !req_alloc(h, r, params_in, max_chunks, planes)) {
        req_free(r, 1);
        return kvs_set_error(h, KVS_ENOMEM, "sparse_begin: out of memory for '%s'", req_id);
    }
    heads_init(r, &cache, planes);
    /* a thread of its own only where the tiers may be read beside the engine's other calls */
    if (kvs_tiers_thread_safe(h->tiers) && pthread_create(&r->thread, NULL, req_thread, r) == 0)
        r->threaded = 1;
    *out = r;
    return KVS_OK;
}

/* The request's Swarm clusters over the rows stored now (the first begin's; rows a later begin
 * adds are read from their chunks). */
static kvs_status swarm_open(kvs_handle *h, kvs_sparse_req *r) {
    kvs_sparse_swarm_params sp = {.tier = (uint32_t)r->swarm_tier,
                                  .n_layers = r->n_layers,
                                  .n_heads = r->n_heads,
                                  .sink = r->params.sink,
                                  .rows_end = (uint32_t)r->stats.stored_tokens,
                                  .head_bytes = r->head_bytes,
                                  .max_object_bytes = h->object_bytes,
                                  .profile_steps = r->params.profile_steps,
                                  .cache_policy = r->params.cluster_cache,
                                  .cache_rows = r->params.cluster_cache_rows,
                                  .min_useful = r->params.min_useful,
                                  .positional = r->params.layout == KVS_SPARSE_LAYOUT_POSITIONS,
                                  .nonce = (uint32_t)kvs_xxh3_64(r->id, strlen(r->id)),
                                  .prefix = r->keys[r->n_chunks - 1]};
    kvs_status st = kvs_sparse_swarm_open(h->tiers, &sp, &r->swarm);
    if (st != KVS_OK)
        return kvs_set_error(h, st, "sparse_begin: '%s': cannot set up its clusters (%s)", r->id,
                             kvs_status_sentence(st));
    kvs_sparse_swarm_set_source(r->swarm, cluster_row, r);
    if (r->params.index == KVS_SPARSE_INDEX_MEDOIDS)
        kvs_sparse_store_set_selector(r->store, medoid_select, r);
    kvs_sparse_swarm_stats sws;
    kvs_sparse_swarm_get_stats(r->swarm, &sws);
    pthread_mutex_lock(&r->lock);
    r->stats.layouts_found = sws.layers_found;
    pthread_mutex_unlock(&r->lock);
    return KVS_OK;
}

kvs_status kvs_sparse_begin(kvs_handle *h, const char *req_id, const int32_t *tokens,
                            uint64_t n_tokens, const kvs_sparse_cache *cache,
                            const kvs_sparse_params *params, uint64_t *stored_tokens) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "sparse_begin");
    if (st != KVS_OK) return st;
    if (!req_id || !req_id[0] || strlen(req_id) >= KVS_REQ_ID_MAX || (!tokens && n_tokens))
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: req_id must be 1..%d bytes and tokens not NULL",
                             KVS_REQ_ID_MAX - 1);
    if (!h->worker.views)
        return kvs_set_error(h, KVS_ESTATE, "sparse_begin: call register_kv first");
    if (h->worker.views[0].device_kind != KVS_DEVICE_HOST)
        return kvs_set_error(h, KVS_ENOTSUP,
                             "sparse_begin: sparse decode runs on the host device only");
    if (h->model.is_mla)
        return kvs_set_error(h, KVS_ENOTSUP, "sparse_begin: an MLA model has no per-head K and V");
    if (tokens && kvs_tokens_check(tokens, n_tokens, h->model.vocab_size))
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_begin: a token is negative or not below vocab_size %u",
                             h->model.vocab_size);
    kvs_sparse_req *r = find(h, req_id);
    int created = !r;
    if (!r) {
        if ((st = begin_new(h, req_id, n_tokens, cache, params, &r)) != KVS_OK) return st;
        r->next = h->sparse;
        h->sparse = r;
    } else {
        /* more chunks: the request's thread reads none of what this changes until it waits */
        kvs_sparse_wait(h, req_id, UINT32_MAX);
    }
    st = take_chunks(h, r, tokens, n_tokens);
    if (st == KVS_OK && r->swarm_tier >= 0 && !r->swarm && r->stats.stored_tokens > r->params.sink)
        st = swarm_open(h, r);
    if (stored_tokens) *stored_tokens = st == KVS_OK || !created ? r->stats.stored_tokens : 0;
    if (st != KVS_OK && created) { /* a request that did not begin is not kept */
        h->sparse = r->next;
        req_free(r, 1);
    }
    return st;
}

kvs_status kvs_sparse_select(kvs_handle *h, const char *req_id, uint32_t layer, const float *q,
                             uint64_t n_rows, uint32_t flags) {
    kvs_sparse_req *r = req_id ? find(h, req_id) : NULL;
    if (!r)
        return kvs_set_error(h, KVS_ENOTFOUND, "sparse_select: '%s' is not in sparse decode",
                             req_id ? req_id : "(null)");
    if (layer >= r->n_layers || !q || n_rows == 0 || n_rows > UINT32_MAX / 2 ||
        (flags != KVS_SPARSE_FINAL && flags != KVS_SPARSE_SPECULATIVE))
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_select: layer %u (of %u), q %s, n_rows %llu, flags %u: "
                             "q is required, n_rows at least 1, flags FINAL or SPECULATIVE",
                             layer, r->n_layers, q ? "given" : "NULL", (unsigned long long)n_rows,
                             flags);
    pthread_mutex_lock(&r->lock);
    while (r->ring_count == r->ring_cap) pthread_cond_wait(&r->changed, &r->lock);
    sp_job *j = &r->ring[(r->ring_head + r->ring_count) % r->ring_cap];
    j->layer = layer;
    j->flags = flags;
    j->n_rows = n_rows;
    memcpy(j->q, q, r->q_floats * sizeof(float));
    r->submitted[layer]++;
    if (!r->threaded) {
        pthread_mutex_unlock(&r->lock);
        run_job(r, j);
        return KVS_OK;
    }
    r->ring_count++;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    return KVS_OK;
}

kvs_status kvs_sparse_wait(kvs_handle *h, const char *req_id, uint32_t layer) {
    kvs_sparse_req *r = req_id ? find(h, req_id) : NULL;
    if (!r)
        return kvs_set_error(h, KVS_ENOTFOUND, "sparse_wait: '%s' is not in sparse decode",
                             req_id ? req_id : "(null)");
    if (layer >= r->n_layers && layer != UINT32_MAX)
        return kvs_set_error(h, KVS_EINVAL, "sparse_wait: layer %u of %u", layer, r->n_layers);
    pthread_mutex_lock(&r->lock);
    if (layer == UINT32_MAX) /* every layer (internal) */
        while (r->ring_count) pthread_cond_wait(&r->changed, &r->lock);
    else
        while (r->done[layer] != r->submitted[layer]) pthread_cond_wait(&r->changed, &r->lock);
    pthread_mutex_unlock(&r->lock);
    return KVS_OK;
}

kvs_status kvs_sparse_get_stats(kvs_handle *h, const char *req_id, kvs_sparse_stats *out) {
    kvs_sparse_req *r = req_id ? find(h, req_id) : NULL;
    if (!r)
        return kvs_set_error(h, KVS_ENOTFOUND, "sparse_stats: '%s' is not in sparse decode",
                             req_id ? req_id : "(null)");
    uint32_t size = out ? kvs_struct_out_size(out, sizeof *out, KVS_SPARSE_STATS_SIZE_1_9) : 0;
    if (!size)
        return kvs_set_error(h, KVS_EINVAL,
                             "sparse_stats: out is NULL or its struct_size is below %u",
                             KVS_SPARSE_STATS_SIZE_1_9);
    pthread_mutex_lock(&r->lock);
    kvs_sparse_stats s = r->stats;
    pthread_mutex_unlock(&r->lock);
    s.struct_size = size;
    memcpy(out, &s, size);
    return KVS_OK;
}

kvs_status kvs_sparse_end(kvs_handle *h, const char *req_id) {
    for (kvs_sparse_req **p = &h->sparse; *p; p = &(*p)->next)
        if (req_id && strcmp((*p)->id, req_id) == 0) {
            kvs_sparse_req *r = *p;
            *p = r->next;
            req_free(r, 0); /* its thread finishes the jobs queued first */
            return KVS_OK;
        }
    return kvs_set_error(h, KVS_ENOTFOUND, "sparse_end: '%s' is not in sparse decode",
                         req_id ? req_id : "(null)");
}

void kvs_sparse_close(kvs_handle *h) {
    while (h->sparse) {
        kvs_sparse_req *r = h->sparse;
        h->sparse = r->next;
        req_free(r, 1);
    }
}
