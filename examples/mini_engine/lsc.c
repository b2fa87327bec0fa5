/* lsc.c - the layer stream cache of the mini engine (lsc.h).
 *
 * Layout of the request's KV: its first rc_pages pages are the regular cache (RC: pages of every
 * layer, the engine's own); the positions after them live in stream blocks of T tokens (the
 * connector's chunk) in lent memory, every layer of a block together. Before layer i runs, layer i
 * of every stream block in use is fetched into buffer i % buffers (a one-layer cache of
 * buffers * n_lsc * P pages, P = T / 16), which the block table names through the cache's overlay
 * (kvcache_set_overlay); after it ran, the stream blocks the step wrote into are stored back from
 * that buffer. With two buffers the fetch of layer i + 1 runs on a helper thread while layer i
 * computes (its buffer's last store, layer i - 1's, has ended); with one it waits for layer i's
 * store. Calls into the connector never overlap: the helper is joined before the store.
 *
 * Memory, as SwiftCache plans it (Eq. 4-5, schedulers/elastic): the engine's budget of B pages of
 * every layer is K = B * L / P single-layer blocks of T tokens; the buffer takes buffers * n_lsc of
 * them and the RC what is left, in whole blocks of every layer. The engine allocates exactly that:
 * n_rc * P pages of every layer and the buffer's pages of one layer. */
#include "lsc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "connector.h"
#include "kvcache.h"
#include "mode.h"
#include "schedulers/elastic/elastic.h"

#define PROG "kvs-mini-engine"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One run of the request: with the stream (conn set) or all local (the reference). */
typedef struct run {
    const model *m;
    kvcache *kv;  /* RC pages (the reference: every page) */
    kvcache *buf; /* the layer stream buffer; NULL for the reference */
    connector *conn;
    model_scratch *s;
    uint32_t *table;
    uint64_t table_cap;     /* 16-token blocks the table covers */
    uint32_t rc_pages;      /* pages of the RC (the reference: all it may take) */
    uint32_t T, P, buffers; /* stream block tokens, pages per stream block, buffers */
    uint32_t n_lsc, used;   /* stream blocks reserved, in use */
    uint32_t *pages[2];     /* buffer b's pages for stream blocks 0..n_lsc, P each */
    uint32_t *ids;          /* 0..n_lsc - 1 */
    uint64_t n;             /* positions held */
    double prefill_ms, decode_ms;
    uint64_t decode_steps, fetches, stores;
    int failed;
} run;

/* The helper thread's one fetch. */
typedef struct prefetch {
    run *r;
    uint32_t layer, n;
    kvs_status st;
} prefetch;

static kvs_status fetch_layer(run *r, uint32_t layer, uint32_t n) {
    r->fetches += n;
    return r->conn->api->lsc_fetch(r->conn->h, layer, r->ids, r->pages[layer % r->buffers], n);
}

static void *prefetch_main(void *arg) {
    prefetch *p = arg;
    p->st = fetch_layer(p->r, p->layer, p->n);
    return NULL;
}

/* Room for positions up to `upto` (exclusive): RC pages first, then stream blocks. 0, or -1 when
 * the allocator is full (nothing taken). */
static int grow(run *r, uint64_t upto) {
    uint64_t blocks = (upto + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    if (blocks > r->table_cap) return -1;
    for (uint64_t b = (r->n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS; b < blocks; b++) {
        if (b < r->rc_pages) {
            if (kvcache_alloc(r->kv, 1, &r->table[b]) != 0) return -1;
            continue;
        }
        uint64_t in_stream = b - r->rc_pages, j = in_stream / r->P;
        if (!r->buf || j >= r->n_lsc) return -1;
        r->table[b] = KV_OVERLAY + (uint32_t)(j * r->P + in_stream % r->P);
        if (j + 1 > r->used) r->used = (uint32_t)(j + 1);
    }
    return 0;
}

/* The stream blocks positions [from, to) lie in: [*j0, *j1). */
static void touched(const run *r, uint64_t from, uint64_t to, uint32_t *j0, uint32_t *j1) {
    uint64_t rc = (uint64_t)r->rc_pages * KV_BLOCK_TOKENS;
    *j0 = *j1 = 0;
    if (to <= rc) return;
    uint64_t a = from > rc ? from - rc : 0, b = to - rc;
    *j0 = (uint32_t)(a / r->T);
    *j1 = (uint32_t)((b + r->T - 1) / r->T);
}

/* One step: tokens[pos0 .. pos0 + n) through every layer; the last one's logits. */
static int step(run *r, const int32_t *tokens, uint64_t pos0, int n, float *logits) {
    const model_config *mc = model_config_of(r->m);
    uint32_t L = (uint32_t)mc->n_layers, j0, j1;
    touched(r, pos0, pos0 + (uint64_t)n, &j0, &j1);
    uint32_t used = r->used;
    model_embed(r->m, r->s, tokens + pos0, n);
    if (used && fetch_layer(r, 0, used) != KVS_OK)
        return connector_hook_failed(r->conn, "lsc_fetch", KVS_EIO);
    for (uint32_t i = 0; i < L; i++) {
        pthread_t helper;
        prefetch pf = {.r = r, .layer = i + 1, .n = used, .st = KVS_OK};
        int ahead = used && r->buffers == 2 && i + 1 < L;
        if (ahead && pthread_create(&helper, NULL, prefetch_main, &pf) != 0)
            ahead = 0, pf.layer = 0;
        model_layer(r->m, r->s, r->kv, i, r->table, pos0, n);
        if (ahead) pthread_join(helper, NULL);
        if (pf.st != KVS_OK) return connector_hook_failed(r->conn, "lsc_fetch", pf.st);
        if (j1 > j0) {
            r->stores += j1 - j0;
            HOOK(r->conn,
                 r->conn->api->lsc_store(r->conn->h, i, r->ids + j0,
                                         r->pages[i % r->buffers] + (uint64_t)j0 * r->P, j1 - j0),
                 "lsc_store");
        }
        if (used && i + 1 < L && !ahead && fetch_layer(r, i + 1, used) != KVS_OK)
            return connector_hook_failed(r->conn, "lsc_fetch", KVS_EIO);
    }
    model_logits(r->m, r->s, n - 1, logits);
    return 0;
}

/* The request: prompt tokens[0 .. prompt) in chunks, then decoding until `upto` positions, or
 * until the allocator is full when grow_until_full. Every step's logits into (or, checking,
 * against) trace: steps * vocab floats. Returns the steps taken, or -1. */
static int64_t serve(run *r, int32_t *tokens, uint64_t prompt, uint64_t upto, int chunk,
                     int grow_until_full, float *trace, uint64_t trace_steps) {
    int vocab = model_config_of(r->m)->vocab;
    uint64_t steps = 0;
    double t0 = now_ms();
    for (uint64_t pos = 0; pos < prompt;) {
        int n = (int)(prompt - pos < (uint64_t)chunk ? prompt - pos : (uint64_t)chunk);
        if (grow(r, pos + (uint64_t)n) != 0 || steps >= trace_steps) return -1;
        if (step(r, tokens, pos, n, trace + steps * (uint64_t)vocab) != 0) return -1;
        r->n = pos += (uint64_t)n;
        steps++;
    }
    r->prefill_ms = now_ms() - t0;
    t0 = now_ms();
    while (steps < trace_steps && (grow_until_full || r->n < upto)) {
        float *logits = trace + (steps - 1) * (uint64_t)vocab;
        tokens[r->n] = model_argmax(logits, vocab);
        if (grow(r, r->n + 1) != 0) break; /* full: r->n positions is the most it holds */
        if (step(r, tokens, r->n, 1, trace + steps * (uint64_t)vocab) != 0) return -1;
        r->n++;
        steps++;
        r->decode_steps++;
    }
    r->decode_ms = now_ms() - t0;
    return (int64_t)steps;
}

static void run_free(run *r) {
    model_scratch_free(r->s);
    kvcache_destroy(r->kv);
    kvcache_destroy(r->buf);
    free(r->table);
    free(r->pages[0]);
    free(r->pages[1]);
    free(r->ids);
}

/* A one-layer cache of the model's geometry (the buffer), or every layer's (the pages). */
static kvcache *cache(const options *o, const model *m, uint32_t layers, uint32_t pages) {
    kvcache_params p = {.layout = o->layout,
                        .dtype = o->dtype,
                        .n_layers = layers,
                        .n_heads = model_cache_heads(m),
                        .head_dim = model_cache_width(m),
                        .n_blocks = pages ? pages : 1,
                        .block_budget = pages ? pages : 1};
    char err[256];
    kvcache *kv = kvcache_create(&p, err, sizeof err);
    if (!kv) fprintf(stderr, PROG ": %s\n", err);
    return kv;
}

/* lsc_reserve until it grants `want`, or grants no more for 300 ms (the lender offers its units
 * after the tier connects, and they become usable as the tier accepts them), within 10 s. */
static kvs_status reserve(connector *c, const kvs_layer_view *view, uint32_t want,
                          uint32_t *granted) {
    uint32_t last = 0;
    double since = now_ms(), until = since + 10000;
    for (;;) {
        kvs_status st = c->api->lsc_reserve(c->h, view, want, granted, NULL);
        if (st != KVS_OK || *granted >= want) return st;
        if (*granted != last) last = *granted, since = now_ms();
        if ((last && now_ms() - since > 300) || now_ms() > until) return KVS_OK;
        struct timespec pause = {.tv_nsec = 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* Phase 1: how many stream blocks the lender grants, and their tokens (a handle of its own, on a
 * cache of one stream block, closed again: its tier says BYE and the lender takes them back). */
static int ask_lender(const options *o, const model *m, uint32_t want, uint32_t *granted,
                      uint32_t *T) {
    connector c;
    kvcache *kv = cache(o, m, (uint32_t)model_config_of(m)->n_layers, 1);
    kvcache *probe = NULL;
    int rc = -1;
    if (kv && connector_open(&c, o->lib_path, o->config_path, o->dtype, m, kv, 0, NULL) == 0) {
        kvs_status st = c.api->lsc_reserve(c.h, NULL, 0, granted, T);
        if (st != KVS_OK) {
            connector_hook_failed(&c, "lsc_reserve", st);
        } else if (*T % KV_BLOCK_TOKENS) {
            fprintf(stderr, PROG ": stream blocks of %u tokens are not whole pages\n", *T);
        } else if ((probe = cache(o, m, 1, *T / KV_BLOCK_TOKENS)) != NULL) {
            st = reserve(&c, &kvcache_views(probe)[0], want, granted);
            rc = st == KVS_OK ? 0 : connector_hook_failed(&c, "lsc_reserve", st);
        }
        connector_close(&c);
    }
    kvcache_destroy(probe);
    kvcache_destroy(kv);
    return rc;
}

int lsc_run(const options *o, const model *m) {
    const model_config *mc = model_config_of(m);
    uint32_t L = (uint32_t)mc->n_layers, H = model_cache_heads(m), D = model_cache_width(m);
    uint32_t d = (uint32_t)kv_dtype_size(o->dtype), planes = mc->is_mla ? 1 : 2;
    uint32_t budget = o->block_budget ? (uint32_t)o->block_budget : 64;
    uint32_t buffers = (uint32_t)o->lsc_buffers;
    uint32_t want = o->peer_blocks ? (uint32_t)o->peer_blocks : budget * L; /* more never helps */
    uint32_t granted = 0, T = 0;
    if (ask_lender(o, m, want, &granted, &T) != 0) return 1;
    uint32_t P = T / KV_BLOCK_TOKENS;

    /* Eq. 4-5 on the budget and what was granted, in blocks of T tokens */
    kvs_el_model em = {.n_layers = L,
                       .block_tokens = T,
                       .kv_heads = H,
                       .head_dim = D,
                       .elem_bytes = d,
                       .kv_planes = planes};
    uint64_t page_bytes = (uint64_t)planes * KV_BLOCK_TOKENS * H * D * d; /* one layer */
    uint64_t master = (uint64_t)budget * L * page_bytes;
    uint64_t lent = (uint64_t)granted * kvs_el_block_bytes(&em);
    kvs_el_capacity cap;
    if (kvs_el_plan_capacity(&em, master, &lent, 1, buffers, NULL, &cap) != KVS_OK) {
        fprintf(stderr, PROG ": --lsc: the plan does not fit 64 bits\n");
        return 1;
    }
    uint64_t local_tokens = (uint64_t)budget * KV_BLOCK_TOKENS; /* every page local, no lending */
    printf("lsc: stream blocks of %u tokens, %u buffer%s; the lender granted %u of %u asked; "
           "budget %u pages (%llu single-layer blocks of %u tokens)\n",
           T, buffers, buffers == 1 ? "" : "s", granted, want, budget,
           (unsigned long long)cap.k_master, T);
    printf("lsc: predicted (Eq. 4-5): n_lsc %llu, n_rc %llu, max context %llu tokens; "
           "%llu without lending (%llu at page granularity)\n",
           (unsigned long long)cap.n_lsc, (unsigned long long)cap.n_rc,
           (unsigned long long)cap.max_tokens, (unsigned long long)cap.max_tokens_without_lsc,
           (unsigned long long)local_tokens);
    uint64_t decode = (uint64_t)o->decode_tokens;
    if (cap.max_tokens <= decode + 1 || cap.n_lsc > UINT32_MAX / P) {
        fprintf(stderr, PROG ": --lsc: a context of %llu tokens leaves no prompt\n",
                (unsigned long long)cap.max_tokens);
        return 1;
    }

    /* Phase 2: the engine as planned */
    run r = {.m = m, .T = T, .P = P, .buffers = buffers, .n_lsc = (uint32_t)cap.n_lsc};
    r.rc_pages = (uint32_t)(cap.n_rc * P);
    uint64_t slack = 2ull * T + decode;     /* grow a little past the prediction */
    uint64_t most = cap.max_tokens + slack; /* positions the table may name */
    r.table_cap = (most + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    r.kv = cache(o, m, L, r.rc_pages);
    r.buf = r.n_lsc ? cache(o, m, 1, buffers * r.n_lsc * P) : NULL;
    r.s = model_scratch_create(m, o->prefill_chunk, (int)(r.table_cap * KV_BLOCK_TOKENS) + 1);
    r.table = calloc(r.table_cap, sizeof *r.table);
    r.ids = calloc(r.n_lsc + 1, sizeof *r.ids);
    for (uint32_t b = 0; b < buffers; b++) r.pages[b] = calloc((uint64_t)r.n_lsc * P + 1, 4);
    uint64_t positions = r.table_cap * KV_BLOCK_TOKENS + 1; /* the most a run can name, +1 */
    int32_t *tokens = malloc(positions * sizeof *tokens);
    uint64_t max_steps = most / (uint64_t)o->prefill_chunk + most + 2;
    float *trace = malloc(max_steps * (uint64_t)mc->vocab * sizeof *trace);
    connector c;
    memset(&c, 0, sizeof c);
    int rc = 1;
    if (!r.kv || (r.n_lsc && !r.buf) || !r.s || !r.table || !r.ids || !r.pages[0] ||
        (buffers == 2 && !r.pages[1]) || !tokens || !trace) {
        fprintf(stderr, PROG ": --lsc: out of memory\n");
        goto out;
    }
    for (uint32_t j = 0; j < r.n_lsc; j++) {
        r.ids[j] = j;
        for (uint32_t b = 0; b < buffers; b++)
            for (uint32_t p = 0; p < P; p++) r.pages[b][j * P + p] = b * r.n_lsc * P + j * P + p;
    }
    if (r.buf) kvcache_set_overlay(r.kv, r.buf, r.n_lsc * P, buffers);
    if (connector_open(&c, o->lib_path, o->config_path, o->dtype, m, r.kv, 0, NULL) != 0) goto out;
    r.conn = &c;
    if (r.n_lsc) {
        uint32_t got = 0;
        kvs_status st = reserve(&c, &kvcache_views(r.buf)[0], r.n_lsc, &got);
        if (st != KVS_OK) {
            connector_hook_failed(&c, "lsc_reserve", st);
            goto out;
        }
        if (got < r.n_lsc) {
            fprintf(stderr, PROG ": --lsc: the lender granted %u stream blocks, then only %u\n",
                    granted, got);
            goto out;
        }
    }
    uint64_t seed = mc->seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t i = 0; i < positions; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        tokens[i] = (int32_t)(seed % (uint64_t)mc->vocab);
    }
    uint64_t prompt = cap.max_tokens - decode;
    int64_t steps = serve(&r, tokens, prompt, 0, o->prefill_chunk, 1, trace, max_steps);
    if (steps < 0) {
        fprintf(stderr, PROG ": --lsc: the request failed at position %llu\n",
                (unsigned long long)r.n);
        goto out;
    }
    uint64_t measured = r.n;
    printf("lsc: measured max context %llu tokens (%.4f of the prediction; %llu RC pages, %u "
           "stream blocks); %.2fx the budget's %llu tokens\n",
           (unsigned long long)measured, (double)measured / (double)cap.max_tokens,
           (unsigned long long)r.rc_pages, r.used, (double)measured / (double)local_tokens,
           (unsigned long long)local_tokens);
    int ok = measured + T >= cap.max_tokens && measured <= cap.max_tokens + T;
    if (!ok)
        fprintf(stderr,
                PROG ": --lsc: measured %llu tokens, predicted %llu: more than a block "
                     "apart\n",
                (unsigned long long)measured, (unsigned long long)cap.max_tokens);

    /* the same request with all its KV local: every step's logits bit for bit, and the timing */
    run ref = {.m = m, .T = T, .P = P, .buffers = 1};
    ref.rc_pages = (uint32_t)r.table_cap;
    ref.table_cap = r.table_cap;
    ref.kv = cache(o, m, L, ref.rc_pages);
    ref.s = model_scratch_create(m, o->prefill_chunk, (int)(r.table_cap * KV_BLOCK_TOKENS) + 1);
    ref.table = calloc(ref.table_cap, sizeof *ref.table);
    float *ref_trace = malloc((uint64_t)steps * (uint64_t)mc->vocab * sizeof *ref_trace);
    int32_t *ref_tokens = malloc(positions * sizeof *ref_tokens);
    if (!ref.kv || !ref.s || !ref.table || !ref_trace || !ref_tokens) {
        fprintf(stderr, PROG ": --lsc: out of memory for the reference\n");
        ok = 0;
    } else {
        memcpy(ref_tokens, tokens, prompt * sizeof *tokens);
        int64_t ref_steps = serve(&ref, ref_tokens, prompt, measured, o->prefill_chunk, 0,
                                  ref_trace, (uint64_t)steps);
        uint64_t mismatches = 0;
        for (int64_t i = 0; i < ref_steps && i < steps; i++)
            mismatches += memcmp(trace + (uint64_t)i * (uint64_t)mc->vocab,
                                 ref_trace + (uint64_t)i * (uint64_t)mc->vocab,
                                 (uint64_t)mc->vocab * sizeof *trace) != 0;
        mismatches += memcmp(tokens, ref_tokens, measured * sizeof *tokens) != 0;
        if (ref_steps != steps) mismatches++;
        double tpot = r.decode_steps ? r.decode_ms / (double)r.decode_steps : 0;
        double ref_tpot = ref.decode_steps ? ref.decode_ms / (double)ref.decode_steps : 0;
        printf("lsc: prefill of %llu tokens %.1f ms with the stream, %.1f ms all local (%.3fx); "
               "TPOT %.3f ms with the stream, %.3f ms all local (%.3fx) over %llu tokens\n",
               (unsigned long long)prompt, r.prefill_ms, ref.prefill_ms,
               ref.prefill_ms > 0 ? r.prefill_ms / ref.prefill_ms : 0.0, tpot, ref_tpot,
               ref_tpot > 0 ? tpot / ref_tpot : 0.0, (unsigned long long)r.decode_steps);
        printf("lsc: %llu stream-block layers fetched, %llu stored\n",
               (unsigned long long)r.fetches, (unsigned long long)r.stores);
        if (o->verify) {
            printf("verify: %lld steps' logits and %llu tokens against all-local KV, bit for bit, "
                   "%llu mismatches\n",
                   (long long)steps, (unsigned long long)measured, (unsigned long long)mismatches);
            if (mismatches) ok = 0;
        }
    }
    run_free(&ref);
    free(ref_trace);
    free(ref_tokens);
    rc = ok ? 0 : 1;
out:
    if (r.conn) connector_close(&c);
    run_free(&r);
    free(tokens);
    free(trace);
    return rc;
}
