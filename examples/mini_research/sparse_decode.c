/* sparse_decode.c - sparse decode over KV the tiers hold (sparse_decode.h, docs/sparse.md).
 *
 * 1. Prefill: one prompt of --sparse-context tokens through the regular serving loop, its chunks
 *    saved through the connector; a snapshot of its K and V (as the pages hold them, as floats) is
 *    taken for the references below.
 * 2. Sparse decode: --decode-tokens steps. The engine's own KV is the sink rows, the prompt's rows
 *    from where its recent window starts, and what decode computes; every other row of the pool
 *    stays NaN, so a read of one would show in the logits. Per layer: the query goes to
 *    sparse_select, the next layer's query is speculated from this layer's input and sent ahead,
 *    and attention runs over the sink, the head cache's selected rows and the recent rows, in
 *    ascending row order.
 * 3. Replay (--verify): the same tokens with every row from the snapshot, attending to exactly the
 *    rows the connector selected at each step, layer and head: the logits must match bit for bit.
 * 4. Full attention over every row from the snapshot, the same tokens: top-1 agreement and the
 *    attention outputs' error against sparse decode; and the decode rate of both. */
#include "sparse_decode.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/kvstrata_sparse.h"
#include "examples/mini_engine/connector.h"
#include "examples/mini_engine/engine.h"
#include "examples/mini_engine/mode.h"

#define REQ "sparse-decode"

enum { RUN_SPARSE, RUN_REPLAY, RUN_FULL };

/* 0, or -1 after printing the failed hook */
static int hook(connector *c, const char *name, kvs_status st) {
    return st == KVS_OK ? 0 : connector_hook_failed(c, name, st);
}

typedef struct sd {
    const options *o;
    const model *m;
    model_scratch *s;
    connector *conn;
    uint32_t L, G, H, group, hd, vocab;
    kvs_dtype dtype;
    uint64_t head_bytes;
    uint64_t N, D, P; /* prompt, decode steps, positions held */
    uint32_t sink, recent, slots;
    uint64_t stored;        /* the prompt's rows the connector selects from */
    float *full_k, *full_v; /* [L][G][P][hd]: the snapshot, then what a run computes */
    float *own_k, *own_v;   /* the sparse engine's own rows, same shape; the rest NaN */
    int32_t *tokens;        /* [P] */
    /* the head cache the connector fills */
    uint8_t *cache_k, *cache_v;
    uint32_t *slot_rows;
    uint8_t *hit;
    float *cache_f; /* [slots][hd]: one head's cached K, then V, as floats */
    /* what sparse decode selected: [D][L][G][slots] rows ascending, counts [D][L][G] */
    uint32_t *sel, *n_sel;
    uint32_t *from;    /* [D][L][G]: attend_from at each step (the engine's rows from there on) */
    uint64_t bad_rows; /* selected rows outside [sink, attend_from), or twice */
    double recall_sum; /* over head steps: of the exact top-k of the step's query, the share held */
    uint64_t recall_n;
    float *rscore;         /* [P]: recall's scores by row */
    float *rsorted;        /* [P]: the same, sorted */
    uint32_t *attend_from; /* [L][G]: the connector's */
    /* per run */
    float *logits; /* [D][vocab] */
    float *att;    /* [D][L][H * hd] */
    const float **krow, **vrow;
    float *scores;
    float *x, *q, *qs, *k, *v, *kr; /* a token's hidden state, query, speculated query, K, V */
} sd;

static float *kv_at(const sd *d, float *base, uint32_t l, uint32_t g, uint64_t row) {
    return base + ((((uint64_t)l * d->G + g) * d->P) + row) * d->hd;
}

/* Causal attention of one query head over n rows: out[hd]. Fixed order: rows as listed. */
static void attend(const sd *d, const float *q, uint32_t n, float *out) {
    float max = -INFINITY;
    for (uint32_t i = 0; i < n; i++) {
        float sc = 0.0f;
        for (uint32_t j = 0; j < d->hd; j++) sc += q[j] * d->krow[i][j];
        d->scores[i] = sc;
        if (sc > max) max = sc;
    }
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        d->scores[i] = expf(d->scores[i] - max);
        sum += d->scores[i];
    }
    for (uint32_t j = 0; j < d->hd; j++) out[j] = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < d->hd; j++) out[j] += d->scores[i] * d->vrow[i][j];
    for (uint32_t j = 0; j < d->hd; j++) out[j] /= sum;
}

/* The KV a run writes for the token at pos: rounded to the cache's dtype, as the pages would. */
static void keep_token(sd *d, float *kbase, float *vbase, uint32_t l, uint64_t pos) {
    for (uint32_t g = 0; g < d->G; g++) {
        kv_from_float(d->dtype, d->kr, d->k + (uint64_t)g * d->hd, d->hd);
        kv_to_float(d->dtype, kv_at(d, kbase, l, g, pos), d->kr, d->hd);
        kv_from_float(d->dtype, d->kr, d->v + (uint64_t)g * d->hd, d->hd);
        kv_to_float(d->dtype, kv_at(d, vbase, l, g, pos), d->kr, d->hd);
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Of the exact top-k of the step's query group over [sink, end), the share the selection holds:
 * the rows scoring at least the k-th best score (scored as the connector scores, in double). */
static void recall(sd *d, uint32_t l, uint32_t g, const uint32_t *sel, uint32_t n, uint64_t end) {
    if (end <= d->sink) return;
    uint64_t pool = end - d->sink;
    uint32_t k = pool < d->slots ? (uint32_t)pool : d->slots;
    for (uint64_t r = d->sink; r < end; r++) {
        const float *key = kv_at(d, d->full_k, l, g, r);
        double s = 0;
        for (uint32_t j = 0; j < d->group; j++)
            for (uint32_t i = 0; i < d->hd; i++)
                s += (double)d->q[((uint64_t)g * d->group + j) * d->hd + i] * key[i];
        d->rscore[r] = (float)s;
    }
    memcpy(d->rsorted, d->rscore + d->sink, pool * sizeof *d->rsorted);
    qsort(d->rsorted, pool, sizeof *d->rsorted, cmp_desc);
    float kth = d->rsorted[k - 1];
    uint32_t held = 0; /* (a row outside the pool is a bad row, counted apart) */
    for (uint32_t i = 0; i < n; i++)
        held += sel[i] >= d->sink && sel[i] < end && d->rscore[sel[i]] >= kth;
    d->recall_sum += (double)(held > k ? k : held) / (double)k;
    d->recall_n++;
}

/* The rows head g of layer l attends to at step t (pos), with their K and V, into krow/vrow. */
static uint32_t gather(sd *d, int run, uint64_t t, uint32_t l, uint32_t g, uint64_t pos) {
    uint64_t n_rows = pos + 1;
    uint32_t n = 0;
    float *kb = run == RUN_SPARSE ? d->own_k : d->full_k;
    float *vb = run == RUN_SPARSE ? d->own_v : d->full_v;
    if (run == RUN_FULL) {
        for (uint64_t r = 0; r < n_rows; r++, n++) {
            d->krow[n] = kv_at(d, kb, l, g, r);
            d->vrow[n] = kv_at(d, vb, l, g, r);
        }
        return n;
    }
    for (uint64_t r = 0; r < d->sink && r < n_rows; r++, n++) {
        d->krow[n] = kv_at(d, kb, l, g, r);
        d->vrow[n] = kv_at(d, vb, l, g, r);
    }
    uint64_t plane = ((uint64_t)l * d->G + g) * d->slots;
    uint32_t *sel = d->sel + ((t * d->L + l) * d->G + g) * d->slots;
    uint32_t *n_sel = d->n_sel + (t * d->L + l) * d->G + g;
    uint32_t *from = d->from + (t * d->L + l) * d->G + g;
    if (run == RUN_SPARSE) { /* the slots' rows, ascending, recorded for the replay */
        uint32_t k = 0;
        for (uint32_t i = 0; i < d->slots; i++)
            if (d->slot_rows[plane + i] != UINT32_MAX) sel[k++] = d->slot_rows[plane + i];
        qsort(sel, k, sizeof *sel, cmp_u32);
        *n_sel = k;
        *from = d->attend_from[(uint64_t)l * d->G + g];
        /* the rows the connector hands over lie in [sink, attend_from), each once: the replay
         * attends to the same rows, so only this check catches a selection that overlaps the
         * engine's own rows */
        for (uint32_t i = 0; i < k; i++)
            d->bad_rows += sel[i] < d->sink || sel[i] >= *from || (i && sel[i] == sel[i - 1]);
        recall(d, l, g, sel, k, *from);
    }
    uint64_t pool_end = *from > n_rows ? n_rows : *from;
    for (uint32_t i = 0; i < *n_sel; i++, n++) {
        uint32_t row = sel[i];
        if (run == RUN_REPLAY) {
            d->krow[n] = kv_at(d, kb, l, g, row);
            d->vrow[n] = kv_at(d, vb, l, g, row);
            continue;
        }
        uint32_t slot = 0;
        while (d->slot_rows[plane + slot] != row) slot++;
        float *kf = d->cache_f + (uint64_t)n * d->hd * 2, *vf = kf + d->hd;
        kv_to_float(d->dtype, kf, d->cache_k + (plane + slot) * d->head_bytes, d->hd);
        kv_to_float(d->dtype, vf, d->cache_v + (plane + slot) * d->head_bytes, d->hd);
        d->krow[n] = kf;
        d->vrow[n] = vf;
    }
    for (uint64_t r = pool_end; r < n_rows; r++, n++) {
        d->krow[n] = kv_at(d, kb, l, g, r);
        d->vrow[n] = kv_at(d, vb, l, g, r);
    }
    return n;
}

/* One decode run over steps [0, D). SPARSE picks the tokens; the others follow them. */
static int decode(sd *d, int run, double *ms) {
    const kvs_api *api = d->conn->api;
    kvs_handle *h = d->conn->h;
    uint32_t qw = d->H * d->hd;
    float *kb = run == RUN_SPARSE ? d->own_k : d->full_k;
    float *vb = run == RUN_SPARSE ? d->own_v : d->full_v;
    double t0 = engine_now_ms();
    for (uint64_t t = 0; t < d->D; t++) {
        uint64_t pos = d->N + t;
        memcpy(d->x, model_embedding(d->m, d->tokens[pos]), (size_t)model_config_of(d->m)->dim * 4);
        for (uint32_t l = 0; l < d->L; l++) {
            model_token_qkv(d->m, d->s, l, d->x, pos, d->q, d->k, d->v);
            keep_token(d, kb, vb, l, pos);
            if (run == RUN_SPARSE) {
                HOOK(d->conn, api->sparse_select(h, REQ, l, d->q, pos + 1, KVS_SPARSE_FINAL),
                     "sparse_select");
                /* the next layer's query from this layer's input, sent ahead (LiteCache 5.1) */
                if (l + 1 < d->L) {
                    model_token_qkv(d->m, d->s, l + 1, d->x, pos, d->qs, NULL, NULL);
                    HOOK(d->conn,
                         api->sparse_select(h, REQ, l + 1, d->qs, pos + 1, KVS_SPARSE_SPECULATIVE),
                         "sparse_select");
                }
                HOOK(d->conn, api->sparse_wait(h, REQ, l), "sparse_wait");
            }
            float *att = d->att + (t * d->L + l) * qw;
            for (uint32_t g = 0; g < d->G; g++) {
                uint32_t n = gather(d, run, t, l, g, pos);
                for (uint32_t j = 0; j < d->group; j++) {
                    uint32_t qh = g * d->group + j;
                    attend(d, d->q + (uint64_t)qh * d->hd, n, att + (uint64_t)qh * d->hd);
                }
            }
            model_token_finish(d->m, d->s, l, d->x, att);
        }
        float *logits = d->logits + t * d->vocab;
        model_logits_of(d->m, d->s, d->x, logits);
        if (run == RUN_SPARSE && pos + 1 < d->P)
            d->tokens[pos + 1] = model_argmax(logits, (int)d->vocab);
    }
    *ms = engine_now_ms() - t0;
    return 0;
}

/* The prefill's KV, as the pages hold it, into the snapshot (called before the request ends). */
static int snapshot(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r) {
    sd *d = ctx;
    for (uint32_t l = 0; l < d->L; l++)
        for (uint32_t g = 0; g < d->G; g++)
            for (uint64_t p = 0; p < n_prompt; p++) {
                kvcache_read(e->kv, l, KV_K, e->table, p, g, kv_at(d, d->full_k, l, g, p));
                kvcache_read(e->kv, l, KV_V, e->table, p, g, kv_at(d, d->full_v, l, g, p));
            }
    d->tokens[n_prompt] = r->first_token;
    return 0;
}

static void sd_free(sd *d) {
    free(d->full_k);
    free(d->full_v);
    free(d->own_k);
    free(d->own_v);
    free(d->tokens);
    free(d->cache_k);
    free(d->cache_v);
    free(d->slot_rows);
    free(d->hit);
    free(d->cache_f);
    free(d->sel);
    free(d->n_sel);
    free(d->rscore);
    free(d->rsorted);
    free(d->from);
    free(d->attend_from);
    free(d->logits);
    free(d->att);
    free(d->krow);
    free(d->vrow);
    free(d->scores);
    free(d->x);
    free(d->q);
    free(d->qs);
    free(d->k);
    free(d->v);
    free(d->kr);
    model_scratch_free(d->s);
}

static int sd_alloc(sd *d) {
    const model_config *c = model_config_of(d->m);
    uint64_t plane = (uint64_t)d->L * d->G * d->P * d->hd;
    uint64_t cache_rows = (uint64_t)d->L * d->G * d->slots;
    uint64_t most = d->P + d->slots; /* rows a head attends to at most */
    d->full_k = malloc(plane * 4);
    d->full_v = malloc(plane * 4);
    d->own_k = malloc(plane * 4);
    d->own_v = malloc(plane * 4);
    d->tokens = calloc(d->P, sizeof *d->tokens);
    d->cache_k = calloc(cache_rows, d->head_bytes);
    d->cache_v = calloc(cache_rows, d->head_bytes);
    d->slot_rows = calloc(cache_rows, sizeof *d->slot_rows);
    d->hit = calloc((uint64_t)d->L * d->G, 1);
    d->cache_f = malloc(most * 2 * d->hd * 4);
    d->sel = malloc(d->D * cache_rows * sizeof *d->sel);
    d->n_sel = calloc(d->D * d->L * d->G, sizeof *d->n_sel);
    d->rscore = malloc(d->P * sizeof *d->rscore);
    d->rsorted = malloc(d->P * sizeof *d->rsorted);
    d->from = calloc(d->D * d->L * d->G, sizeof *d->from);
    d->attend_from = calloc((uint64_t)d->L * d->G, sizeof *d->attend_from);
    d->logits = malloc(d->D * d->vocab * 4);
    d->att = malloc(d->D * d->L * d->H * d->hd * 4);
    d->krow = malloc(most * sizeof *d->krow);
    d->vrow = malloc(most * sizeof *d->vrow);
    d->scores = malloc(most * 4);
    d->x = malloc((size_t)c->dim * 4);
    d->q = malloc((size_t)d->H * d->hd * 4);
    d->qs = malloc((size_t)d->H * d->hd * 4);
    d->k = malloc((size_t)d->G * d->hd * 4);
    d->v = malloc((size_t)d->G * d->hd * 4);
    d->kr = malloc(d->head_bytes);
    d->s = model_scratch_create(d->m, 1, 1);
    return d->full_k && d->full_v && d->own_k && d->own_v && d->tokens && d->cache_k &&
                   d->cache_v && d->slot_rows && d->hit && d->cache_f && d->sel && d->n_sel &&
                   d->rscore && d->rsorted && d->from && d->attend_from && d->logits && d->att &&
                   d->krow && d->vrow && d->scores && d->x && d->q && d->qs && d->k && d->v &&
                   d->kr && d->s
               ? 0
               : -1;
}

/* The prompt: a slice of the text (a trained byte model), or tokens drawn from the seed. */
static void prompt_tokens(sd *d, const uint8_t *text, size_t text_len) {
    uint64_t seed = model_config_of(d->m)->seed * 0x9e3779b97f4a7c15ull + 7;
    size_t start = text_len > d->N ? (size_t)(seed % (text_len - d->N)) : 0;
    for (uint64_t i = 0; i < d->N; i++) {
        if (text && text_len) {
            d->tokens[i] = text[(start + i) % text_len];
            continue;
        }
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        d->tokens[i] = (int32_t)(seed % d->vocab);
    }
}

/* Full-KV offload, the reference sparse decode avoids: each of `steps` decode steps is a request
 * of the prompt and the tokens decoded so far, its prefix cache emptied first, so the stored
 * prefix is restored from the tiers through the load hooks and the rest computed, then one token
 * with full attention. The tokens are sparse decode's. 0, or -1 after printing why. */
static int offload_steps(sd *d, engine *e, uint64_t steps, double *ms, uint64_t *loaded,
                         uint64_t *first) {
    uint32_t *pages = malloc(((d->P + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS + 2) * 4);
    if (!pages) return -1;
    double t0 = engine_now_ms();
    *loaded = 0;
    for (uint64_t t = 0; t < steps; t++) {
        uint32_t n = kvcache_available(e->kv); /* every page, the cached ones evicted */
        if (kvcache_alloc(e->kv, n, pages) != 0) break;
        kvcache_release(e->kv, pages, n, NULL, 0);
        char id[64];
        snprintf(id, sizeof id, REQ "-offload-%llu", (unsigned long long)t);
        memcpy(e->tokens, d->tokens, (d->N + t) * sizeof *d->tokens);
        turn_result tr;
        if (engine_serve(e, id, d->N + t, 1, &tr, NULL, NULL) != 0) {
            free(pages);
            return -1;
        }
        *loaded += tr.ext_hit;
        if (t == 0) *first = tr.ext_hit;
    }
    *ms = engine_now_ms() - t0;
    free(pages);
    return 0;
}

static double rel_l2(const float *a, const float *b, uint64_t n) {
    double diff = 0, norm = 0;
    for (uint64_t i = 0; i < n; i++) {
        diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        norm += (double)b[i] * b[i];
    }
    return norm > 0 ? sqrt(diff / norm) : 0.0;
}

/* What a run measured, for its report. */
typedef struct sd_result {
    kvs_sparse_stats st;
    double prefill_ms, sparse_ms, replay_ms, full_ms, offload_ms;
    uint64_t offload_n, offload_loaded, lookup_hit, mismatches, agree, own_from;
    double err; /* attention output error against full attention */
} sd_result;

/* The run's sizes from the model and the flags. */
static sd sd_make(const options *o, const research *x, const model *m) {
    const model_config *c = model_config_of(m);
    sd d = {.o = o,
            .m = m,
            .L = (uint32_t)c->n_layers,
            .G = (uint32_t)c->n_kv_heads,
            .H = (uint32_t)c->n_heads,
            .group = (uint32_t)(c->n_heads / c->n_kv_heads),
            .hd = (uint32_t)model_head_dim(m),
            .vocab = (uint32_t)c->vocab,
            .dtype = (kvs_dtype)o->dtype,
            .N = (uint64_t)x->sparse_context,
            .D = (uint64_t)o->decode_tokens,
            .sink = (uint32_t)x->sparse_sink,
            .recent = (uint32_t)x->sparse_recent,
            .slots = (uint32_t)x->topk};
    d.head_bytes = (uint64_t)d.hd * kv_dtype_size(d.dtype);
    d.P = d.N + d.D + 1;
    return d;
}

/* sparse_begin: the head cache the connector selects into, and how it selects. */
static int sparse_begin(sd *d, const research *x) {
    kvs_sparse_cache cache = {.struct_size = sizeof cache,
                              .slots = d->slots,
                              .k = d->cache_k,
                              .v = d->cache_v,
                              .slot_rows = d->slot_rows,
                              .hit = d->hit,
                              .attend_from = d->attend_from};
    kvs_sparse_params params = {
        .struct_size = sizeof params,
        .topk = d->slots,
        .sink = d->sink,
        .recent = d->recent,
        .q_per_kv = d->group,
        .max_tokens = d->P,
        .layout = x->sparse_swarm == 2   ? KVS_SPARSE_LAYOUT_POSITIONS
                  : x->sparse_swarm == 1 ? KVS_SPARSE_LAYOUT_SWARM
                                         : KVS_SPARSE_LAYOUT_ROWS,
        .profile_steps = (uint32_t)x->profile_steps,
        .cluster_cache_rows = (uint64_t)x->cluster_cache,
        .index = x->sparse_medoids ? KVS_SPARSE_INDEX_MEDOIDS : KVS_SPARSE_INDEX_EXACT,
        .target_error = (float)x->sparse_adapt,
        .score_scale = 1.0f, /* the queries come scaled by 1/sqrt(head_dim) */
        .cluster_cache = x->cluster_lru ? KVS_SPARSE_CACHE_LRU : KVS_SPARSE_CACHE_SCORE};
    connector *conn = d->conn;
    return hook(
        conn, "sparse_begin",
        conn->api->sparse_begin(conn->h, REQ, d->tokens, d->N, &cache, &params, &d->stored));
}

/* The engine's own rows: the sink, the prompt's from its recent window on; the pool is NaN.
 * Returns the first row the engine holds past the sink. */
static uint64_t own_rows(sd *d) {
    uint64_t plane = (uint64_t)d->L * d->G * d->P * d->hd;
    memset(d->own_k, 0xff, plane * 4);
    memset(d->own_v, 0xff, plane * 4);
    uint64_t window = d->N + 1 > d->recent ? d->N + 1 - d->recent : 0;
    uint64_t own_from = window < d->stored ? window : d->stored;
    for (uint64_t r = 0; r < d->N; r++) {
        if (r >= d->sink && r < own_from) continue;
        for (uint32_t l = 0; l < d->L; l++)
            for (uint32_t g = 0; g < d->G; g++) {
                memcpy(kv_at(d, d->own_k, l, g, r), kv_at(d, d->full_k, l, g, r), d->hd * 4);
                memcpy(kv_at(d, d->own_v, l, g, r), kv_at(d, d->full_v, l, g, r), d->hd * 4);
            }
    }
    return own_from;
}

/* 3. the same rows from the snapshot (bit for bit, with --verify); 4. full attention over every
 * row, and full-KV offload; their agreement with the sparse run's logits and attention. */
static int compare(sd *d, engine *e, const float *sparse_logits, const float *sparse_att,
                   sd_result *res) {
    if (d->o->verify) {
        decode(d, RUN_REPLAY, &res->replay_ms);
        for (uint64_t t = 0; t < d->D; t++)
            res->mismatches +=
                memcmp(d->logits + t * d->vocab, sparse_logits + t * d->vocab, d->vocab * 4) != 0;
    }
    decode(d, RUN_FULL, &res->full_ms);
    res->offload_n = d->D < 8 ? d->D : 8;
    if (offload_steps(d, e, res->offload_n, &res->offload_ms, &res->offload_loaded,
                      &res->lookup_hit) != 0)
        return -1;
    for (uint64_t t = 0; t < d->D; t++) {
        res->agree +=
            model_argmax(d->logits + t * d->vocab, (int)d->vocab) == d->tokens[d->N + t + 1];
        for (uint32_t l = 0; l < d->L; l++) {
            uint64_t at = (t * d->L + l) * d->H * d->hd;
            res->err += rel_l2(sparse_att + at, d->att + at, (uint64_t)d->H * d->hd);
        }
    }
    res->err /= (double)(d->D * d->L);
    return 0;
}

/* The prefill's saves may land after wait_save returns (an SSD tier writes in the background):
 * wait (10 s at most) until a lookup finds the whole prompt, so that sparse decode begins from the
 * stored prefix the later lookups see, however loaded the machine is. */
static void wait_until_stored(sd *d) {
    connector *conn = d->conn;
    for (int tries = 0; tries < 5000; tries++) {
        kvs_lookup_result res = {.struct_size = sizeof res};
        int keep = 0;
        kvs_status st = conn->api->lookup(conn->h, "sparse-stored", d->tokens, d->N, 0, &res);
        conn->api->request_finished(conn->h, "sparse-stored", &keep);
        if (st != KVS_OK || res.unknown_yet) return;
        uint64_t chunk = res.chunk_tokens ? res.chunk_tokens : 1;
        uint64_t whole = d->N / chunk * chunk; /* a full-prompt hit reports one less */
        if (res.n_hit_tokens >= (whole == d->N ? whole - 1 : whole)) return;
        usleep(2000);
    }
}

/* The sparse steps from the tiers, then compare() against the other ways of decoding. */
static int sparse_then_compare(sd *d, engine *e, const research *x, sd_result *res) {
    wait_until_stored(d);
    if (sparse_begin(d, x) != 0) return -1;
    res->own_from = own_rows(d);
    if (decode(d, RUN_SPARSE, &res->sparse_ms) != 0) return -1;
    res->st = (kvs_sparse_stats){.struct_size = sizeof res->st};
    connector *conn = d->conn;
    if (hook(conn, "sparse_stats", conn->api->sparse_stats(conn->h, REQ, &res->st))) return -1;
    hook(conn, "sparse_end", conn->api->sparse_end(conn->h, REQ));
    float *sparse_logits = d->logits, *sparse_att = d->att;
    d->logits = malloc(d->D * d->vocab * 4);
    d->att = malloc(d->D * d->L * d->H * d->hd * 4);
    int rc = -1;
    if (!d->logits || !d->att)
        mini_err("--sparse-decode: out of memory\n");
    else
        rc = compare(d, e, sparse_logits, sparse_att, res);
    free(sparse_logits);
    free(sparse_att);
    return rc;
}

/* The report's first lines: the context, the hits and reads, the clusters. */
static void print_reads(const sd *d, const research *x, const sd_result *res) {
    const kvs_sparse_stats *st = &res->st;
    uint64_t head_steps = st->head_hits + st->head_misses;
    uint64_t full_bytes = d->stored * d->L * d->G * d->head_bytes * 2; /* the whole KV, each step */
    uint64_t own_from = res->own_from;
    uint64_t held = (own_from > d->sink ? d->sink : own_from) + (d->N - own_from) + d->D + d->slots;
    printf("sparse: context %llu tokens, %llu of them in the tiers; %llu decode steps, top-%u of "
           "each KV head, sink %u, recent %u; the engine held %llu rows a head (%.3f of the "
           "context), prefill %.1f ms\n",
           (unsigned long long)d->N, (unsigned long long)d->stored, (unsigned long long)d->D,
           d->slots, d->sink, d->recent, (unsigned long long)held,
           (double)held / (double)(d->N + d->D), res->prefill_ms);
    printf("sparse: head hits %.1f%% of %llu head steps; %llu rows read (%llu failed), %.0f B a "
           "token (%.4f of loading the whole KV, %llu B); speculation kept %llu, corrected %llu "
           "head steps; selection %.2f ms, reads %.2f ms a token\n",
           head_steps ? 100.0 * (double)st->head_hits / (double)head_steps : 0.0,
           (unsigned long long)head_steps, (unsigned long long)st->rows_fetched,
           (unsigned long long)st->rows_failed, (double)st->bytes_fetched / (double)d->D,
           (double)st->bytes_fetched / (double)d->D / (double)full_bytes,
           (unsigned long long)full_bytes, (unsigned long long)st->spec_kept,
           (unsigned long long)st->spec_corrected, (double)st->select_ns / 1e6 / (double)d->D,
           (double)st->fetch_ns / 1e6 / (double)d->D);
    if (x->sparse_swarm) {
        uint64_t useful = st->rows_from_clusters * 2 * d->head_bytes;
        printf("sparse: %s: %llu layers' clusters found, %llu written; %llu of %llu rows read "
               "came out of %llu clusters read (%llu B, %.2f B read a useful B) and %llu cache "
               "hits\n",
               x->sparse_swarm == 2 ? "positions" : "swarm", (unsigned long long)st->layouts_found,
               (unsigned long long)st->layouts_written, (unsigned long long)st->rows_from_clusters,
               (unsigned long long)st->rows_fetched, (unsigned long long)st->clusters_read,
               (unsigned long long)st->cluster_bytes_read,
               useful ? (double)st->cluster_bytes_read / (double)useful : 0.0,
               (unsigned long long)st->cluster_cache_hits);
    }
}

/* The report's rates, selection and accuracy lines. */
static void print_rates(const sd *d, const research *x, const sd_result *res) {
    const kvs_sparse_stats *st = &res->st;
    double sparse_ms = res->sparse_ms, full_ms = res->full_ms, offload_ms = res->offload_ms;
    uint64_t offload_n = res->offload_n;
    printf("sparse: decode %.1f tok/s sparse from the tiers, %.1f tok/s full attention with "
           "every row in memory (%.3fx), %.1f tok/s full-KV offload (%llu steps restoring %.0f "
           "tokens each from the tiers; %.3fx)\n",
           (double)d->D * 1000.0 / sparse_ms, (double)d->D * 1000.0 / full_ms, full_ms / sparse_ms,
           (double)offload_n * 1000.0 / offload_ms, (unsigned long long)offload_n,
           offload_n ? (double)res->offload_loaded / (double)offload_n : 0.0,
           offload_n ? offload_ms / (double)offload_n / (sparse_ms / (double)d->D) : 0.0);
    printf("sparse: selection by %s: %llu of %llu head misses through the medoid index, %.1f keys "
           "scored a miss; recall of the step's exact top-%u %.3f (mean over head steps, hits "
           "included)\n",
           x->sparse_medoids ? "medoids" : "the exact top-k",
           (unsigned long long)st->medoid_selections, (unsigned long long)st->head_misses,
           st->head_misses ? (double)st->keys_scored / (double)st->head_misses : 0.0, d->slots,
           d->recall_n ? d->recall_sum / (double)d->recall_n : 0.0);
    if (x->sparse_adapt > 0)
        printf("sparse: adaptive thresholds (target error %.3f): %llu head steps audited, mean "
               "attention error %.4f; tau raised %llu times, lowered %llu\n",
               x->sparse_adapt, (unsigned long long)st->audits,
               st->audits ? (double)st->audit_error_micro / 1e6 / (double)st->audits : 0.0,
               (unsigned long long)st->tau_raised, (unsigned long long)st->tau_lowered);
    printf("sparse: against full attention: top-1 agreement %llu/%llu (%.3f), attention output "
           "error %.4f (mean relative L2 over steps and layers)\n",
           (unsigned long long)res->agree, (unsigned long long)d->D,
           (double)res->agree / (double)d->D, res->err);
}

/* --verify's lines and verdict: 0, or 1 when a check failed. */
static int print_verify(const sd *d, const sd_result *res) {
    const kvs_sparse_stats *st = &res->st;
    int rc = 0;
    printf("verify: %llu steps' logits against exact attention over the rows the connector "
           "selected, from the prefill's own KV, bit for bit: %llu mismatches\n",
           (unsigned long long)d->D, (unsigned long long)res->mismatches);
    printf("verify: %llu selected rows outside [sink, attend_from) or twice; %llu chunks "
           "refused; %llu of the prompt's tokens stored, %llu found by lookup\n",
           (unsigned long long)d->bad_rows, (unsigned long long)st->chunks_refused,
           (unsigned long long)st->stored_tokens, (unsigned long long)res->lookup_hit);
    if (res->mismatches || st->rows_failed || d->bad_rows || st->chunks_refused ||
        st->stored_tokens < res->lookup_hit)
        rc = 1;
    if (st->stored_tokens == 0 || st->rows_fetched == 0) {
        mini_err("verify FAILED: the connector selected nothing from the tiers\n");
        rc = 1;
    }
    return rc;
}

int sparse_decode_run(const options *o, const research *x, const model *m, const uint8_t *text,
                      size_t text_len) {
    if (model_config_of(m)->is_mla) {
        mini_err("--sparse-decode needs a GQA model (per-head K and V)\n");
        return 2;
    }
    sd d = sd_make(o, x, m);
    sd_result res = {0};
    uint32_t blocks = (uint32_t)((d.P + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS) + 1;
    engine e = {.m = m, .prefill_chunk = o->prefill_chunk};
    connector conn;
    memset(&conn, 0, sizeof conn);
    int rc = 1;
    e.kv = make_cache(o, m, 0, blocks, blocks);
    e.s = model_scratch_create(m, o->prefill_chunk, (int)d.P);
    e.logits = malloc((size_t)d.vocab * sizeof *e.logits);
    e.table = calloc(blocks, sizeof *e.table);
    e.tokens = malloc(d.P * sizeof *e.tokens);
    if (sd_alloc(&d) != 0 || !e.kv || !e.s || !e.logits || !e.table || !e.tokens) {
        mini_err("--sparse-decode: out of memory\n");
        goto out;
    }
    if (connector_open(&conn, o->lib_path, o->config_path, d.dtype, m, e.kv, 0, NULL) != 0)
        goto out;
    d.conn = &conn;
    e.conn = &conn;
    if (conn.api->struct_size < offsetof(kvs_api, sparse_end) + sizeof conn.api->sparse_end) {
        mini_err("--sparse-decode: the library is older than ABI 1.9\n");
        goto out;
    }
    /* 1. prefill, saved through the connector */
    prompt_tokens(&d, text, text_len);
    memcpy(e.tokens, d.tokens, d.N * sizeof *d.tokens);
    turn_result tr;
    double t0 = engine_now_ms();
    if (engine_serve(&e, REQ "-prefill", d.N, 1, &tr, snapshot, &d) != 0) goto out;
    res.prefill_ms = engine_now_ms() - t0;
    /* 2. sparse decode from the tiers; 3., 4. the others */
    if (sparse_then_compare(&d, &e, x, &res) != 0) goto out;
    print_reads(&d, x, &res);
    print_rates(&d, x, &res);
    rc = o->verify ? print_verify(&d, &res) : 0;
out:
    if (d.conn) connector_close(&conn);
    kvcache_destroy(e.kv);
    model_scratch_free(e.s);
    free(e.logits);
    free(e.table);
    free(e.tokens);
    sd_free(&d);
    return rc;
}
