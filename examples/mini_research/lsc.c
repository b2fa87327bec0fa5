/* lsc.c - the layer stream cache of the mini engine (lsc.h).
 *
 * Layout of the request's KV: each block of T tokens (the connector's chunk) is either a stream
 * block, every layer of it in lent memory, or pages of every layer of the engine's own (the regular
 * cache, RC). Before layer i runs, layer i of every stream block in use is fetched into buffer
 * i % buffers (a one-layer cache of pages, P = T / 16 a stream block), which the block table names
 * through the cache's overlay (kvcache_set_overlay); after it ran, the stream blocks the step wrote
 * into are stored back from that buffer. With two buffers a helper thread fetches layer i + 1 while
 * layer i computes (its buffer's last store, layer i - 1's, has ended); with one, the fetch waits
 * for layer i's store. Calls into the connector never overlap: the helper is waited for before the
 * store.
 *
 * Memory: the engine charges its KV to a budget of B pages of every layer (M bytes). Its allocator
 * takes a stream block for each new 256-token block while the lender grants one (lsc_reserve, one
 * more each time) and M still has room for its buffer slots (one layer of the block, in each
 * buffer), and pages of every layer (the regular cache, RC) after that, until M is spent: the
 * positions it then holds are the measured maximum context. Its arithmetic is its own; SwiftCache's
 * Eq. 4-5 (schedulers/elastic) predict the same from what the lender granted a first handle, in
 * whole blocks (the RC here takes single pages, so it may hold up to a block more). The emulation
 * allocates the RC pages and the buffer at their largest and charges M for what it uses. */
#include "lsc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "examples/mini_engine/connector.h"
#include "examples/mini_engine/engine.h"
#include "examples/mini_engine/mode.h"
#include "models/mini/kvcache.h"
#include "research.h"
#include "schedulers/elastic/elastic.h"

/* One run of the request: with the stream (conn set) or all local (the reference). */
typedef struct run {
    const model *m;
    kvcache *kv;  /* RC pages (the reference: every page) */
    kvcache *buf; /* the layer stream buffer; NULL for the reference */
    connector *conn;
    model_scratch *s;
    uint32_t *table;        /* per 16-token block of the request */
    int32_t *stream_of;     /* per T-token block: its stream block, or -1 */
    uint64_t table_cap;     /* 16-token blocks the table covers */
    uint32_t T, P, buffers; /* stream block tokens, pages per stream block, buffers */
    uint32_t max_stream;    /* stream blocks the buffer has pages for */
    uint32_t used;          /* stream blocks in use (and reserved) */
    uint64_t budget_bytes;  /* M: what the engine's KV may take */
    uint64_t charged;       /* of it, taken */
    uint64_t page_bytes;    /* one page of one layer */
    uint32_t L;
    uint32_t *pages[2];   /* buffer b's pages for stream blocks 0..max_stream, P each */
    uint32_t *ids;        /* 0..max_stream - 1 */
    uint32_t *step_ids;   /* the stream blocks a step writes */
    uint32_t *step_pages; /* and their pages in one buffer */
    uint64_t n;           /* positions held */
    uint32_t rc_pages_used;
    double prefill_ms, decode_ms;
    uint64_t decode_steps, fetches, stores;
    /* the prefetch helper (two buffers): one thread for the run, a job at a time */
    pthread_t helper;
    int helper_on, job, done, quit;
    uint32_t job_layer, job_n;
    kvs_status job_st;
    pthread_mutex_t lock;
    pthread_cond_t cond;
} run;

static kvs_status fetch_layer(run *r, uint32_t layer, uint32_t n) {
    r->fetches += n;
    return r->conn->api->lsc_fetch(r->conn->h, layer, r->ids, r->pages[layer % r->buffers], n);
}

static void *helper_main(void *arg) {
    run *r = arg;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (!r->job && !r->quit) pthread_cond_wait(&r->cond, &r->lock);
        if (r->quit) break;
        pthread_mutex_unlock(&r->lock);
        kvs_status st = fetch_layer(r, r->job_layer, r->job_n);
        pthread_mutex_lock(&r->lock);
        r->job_st = st;
        r->job = 0;
        r->done = 1;
        pthread_cond_broadcast(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static void helper_post(run *r, uint32_t layer, uint32_t n) {
    pthread_mutex_lock(&r->lock);
    r->job_layer = layer, r->job_n = n, r->done = 0, r->job = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

static kvs_status helper_wait(run *r) {
    pthread_mutex_lock(&r->lock);
    while (!r->done) pthread_cond_wait(&r->cond, &r->lock);
    kvs_status st = r->job_st;
    pthread_mutex_unlock(&r->lock);
    return st;
}

/* A stream block for T-block k, if the lender grants one more and the budget has room for its
 * buffer slots. */
static int take_stream_block(run *r, uint64_t k) {
    uint64_t cost = (uint64_t)r->buffers * r->P * r->page_bytes;
    if (!r->buf || r->used >= r->max_stream || r->charged + cost > r->budget_bytes) return 0;
    uint32_t got = 0;
    if (r->conn->api->lsc_reserve(r->conn->h, &kvcache_views(r->buf)[0], r->used + 1, &got, NULL) !=
            KVS_OK ||
        got <= r->used)
        return 0; /* the lender has no more for us */
    r->stream_of[k] = (int32_t)r->used++;
    r->charged += cost;
    return 1;
}

/* Room for positions up to `upto` (exclusive). 0, or -1 when the allocator is full. */
static int grow(run *r, uint64_t upto) {
    uint64_t blocks = (upto + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    if (blocks > r->table_cap) return -1;
    for (uint64_t b = (r->n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS; b < blocks; b++) {
        uint64_t k = b / r->P, p = b % r->P;
        if (p == 0 && r->stream_of[k] < 0) take_stream_block(r, k); /* a new T-block */
        if (r->stream_of[k] >= 0) {
            r->table[b] = KV_OVERLAY + (uint32_t)r->stream_of[k] * r->P + (uint32_t)p;
            continue;
        }
        uint64_t cost = (uint64_t)r->L * r->page_bytes; /* a page of every layer */
        if (r->charged + cost > r->budget_bytes || kvcache_alloc(r->kv, 1, &r->table[b]) != 0)
            return -1;
        r->charged += cost;
        r->rc_pages_used++;
    }
    return 0;
}

/* The stream blocks that positions [from, to) lie in, with their pages in buffer b, into
 * r->step_ids and r->step_pages; how many. */
static uint32_t touched(run *r, uint64_t from, uint64_t to, uint32_t b) {
    uint32_t n = 0;
    for (uint64_t k = from / r->T; k * r->T < to; k++) {
        if (r->stream_of[k] < 0) continue;
        uint32_t j = (uint32_t)r->stream_of[k];
        r->step_ids[n] = j;
        memcpy(r->step_pages + (uint64_t)n * r->P, r->pages[b] + (uint64_t)j * r->P,
               r->P * sizeof *r->step_pages);
        n++;
    }
    return n;
}

/* One step: tokens[pos0 .. pos0 + n) through every layer; the last one's logits. */
static int step(run *r, const int32_t *tokens, uint64_t pos0, int n, float *logits) {
    uint32_t L = r->L, used = r->used;
    model_embed(r->m, r->s, tokens + pos0, n);
    if (used && fetch_layer(r, 0, used) != KVS_OK)
        return connector_hook_failed(r->conn, "lsc_fetch", KVS_EIO);
    for (uint32_t i = 0; i < L; i++) {
        /* two buffers: layer i + 1 is fetched into the other one while layer i runs (its last
         * store, layer i - 1's, has ended); the helper is waited for before the store, so calls
         * into the connector never overlap */
        int ahead = used && r->helper_on && i + 1 < L;
        if (ahead) helper_post(r, i + 1, used);
        model_layer(r->m, r->s, r->kv, i, r->table, pos0, n);
        if (ahead) {
            kvs_status st = helper_wait(r);
            if (st != KVS_OK) return connector_hook_failed(r->conn, "lsc_fetch", st);
        }
        uint32_t w = used ? touched(r, pos0, pos0 + (uint64_t)n, i % r->buffers) : 0;
        if (w) {
            r->stores += w;
            HOOK(r->conn, r->conn->api->lsc_store(r->conn->h, i, r->step_ids, r->step_pages, w),
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
    double t0 = engine_now_ms();
    for (uint64_t pos = 0; pos < prompt;) {
        int n = (int)(prompt - pos < (uint64_t)chunk ? prompt - pos : (uint64_t)chunk);
        if (grow(r, pos + (uint64_t)n) != 0 || steps >= trace_steps) return -1;
        if (step(r, tokens, pos, n, trace + steps * (uint64_t)vocab) != 0) return -1;
        r->n = pos += (uint64_t)n;
        steps++;
    }
    r->prefill_ms = engine_now_ms() - t0;
    t0 = engine_now_ms();
    while (steps < trace_steps && (grow_until_full || r->n < upto)) {
        float *logits = trace + (steps - 1) * (uint64_t)vocab;
        tokens[r->n] = model_argmax(logits, vocab);
        if (grow(r, r->n + 1) != 0) break; /* full: r->n positions is the most it holds */
        if (step(r, tokens, r->n, 1, trace + steps * (uint64_t)vocab) != 0) return -1;
        r->n++;
        steps++;
        r->decode_steps++;
    }
    r->decode_ms = engine_now_ms() - t0;
    return (int64_t)steps;
}

static void run_free(run *r) {
    if (r->helper_on) {
        pthread_mutex_lock(&r->lock);
        r->quit = 1;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->lock);
        pthread_join(r->helper, NULL);
        pthread_mutex_destroy(&r->lock);
        pthread_cond_destroy(&r->cond);
    }
    model_scratch_free(r->s);
    kvcache_destroy(r->kv);
    kvcache_destroy(r->buf);
    free(r->table);
    free(r->stream_of);
    free(r->pages[0]);
    free(r->pages[1]);
    free(r->ids);
    free(r->step_ids);
    free(r->step_pages);
}

/* A one-layer cache of the model's geometry (the buffer), or every layer's (the pages). */
static kvcache *cache(const options *o, const model *m, uint32_t layers, uint32_t pages) {
    return make_cache(o, m, layers, pages ? pages : 1, pages ? pages : 1);
}

/* lsc_reserve until it grants `want`, or grants no more for 300 ms (the lender offers its units
 * after the tier connects, and they become usable as the tier accepts them), within 10 s. */
static kvs_status reserve(connector *c, const kvs_layer_view *view, uint32_t want,
                          uint32_t *granted) {
    uint32_t last = 0;
    double since = engine_now_ms(), until = since + 10000;
    for (;;) {
        kvs_status st = c->api->lsc_reserve(c->h, view, want, granted, NULL);
        if (st != KVS_OK || *granted >= want) return st;
        if (*granted != last) last = *granted, since = engine_now_ms();
        if ((last && engine_now_ms() - since > 300) || engine_now_ms() > until) return KVS_OK;
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
    if (kv &&
        connector_open(&c, o->lib_path, o->config_path, (kvs_dtype)o->dtype, m, kv, 0, NULL) == 0) {
        kvs_status st = c.api->lsc_reserve(c.h, NULL, 0, granted, T);
        if (st != KVS_OK) {
            connector_hook_failed(&c, "lsc_reserve", st);
        } else if (*T % KV_BLOCK_TOKENS) {
            mini_err("stream blocks of %u tokens are not whole pages\n", *T);
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

/* The arrays of a run over max_blocks 16-token blocks; 0, or -1 out of memory. */
static int run_arrays(run *r, uint64_t max_blocks) {
    uint64_t t_blocks = max_blocks / r->P + 1;
    r->table_cap = max_blocks;
    r->table = calloc(max_blocks, sizeof *r->table);
    r->stream_of = malloc(t_blocks * sizeof *r->stream_of);
    if (!r->table || !r->stream_of) return -1;
    for (uint64_t k = 0; k < t_blocks; k++) r->stream_of[k] = -1;
    return 0;
}

/* Phase 1's outcome: the request's geometry and the capacity Eq. 4-5 predict. */
typedef struct lsc_plan {
    uint32_t L, T, P, budget, buffers;
    uint64_t page_bytes;   /* one page of one layer */
    uint64_t master;       /* M: what the engine's KV may take */
    uint64_t local_tokens; /* every page local, no lending */
    uint64_t max_stream;   /* stream blocks the buffer has pages for */
    uint64_t most;         /* the block table's reach past the prediction */
    kvs_el_capacity cap;
} lsc_plan;

/* Phase 1: ask the lender, then Eq. 4-5 on the budget and what was granted, in blocks of T tokens.
 * 0, or 1 after saying why. */
static int plan_capacity(const options *o, const research *x, const model *m, lsc_plan *p) {
    const model_config *mc = model_config_of(m);
    uint32_t L = (uint32_t)mc->n_layers, H = model_cache_heads(m), D = model_cache_width(m);
    uint32_t d = (uint32_t)kv_dtype_size((kvs_dtype)o->dtype), planes = mc->is_mla ? 1 : 2;
    uint32_t budget = o->block_budget ? (uint32_t)o->block_budget : 64;
    uint32_t buffers = (uint32_t)x->lsc_buffers;
    uint64_t useful = (uint64_t)budget * L; /* the gain is at most L times the budget */
    uint32_t want = x->peer_blocks ? (uint32_t)x->peer_blocks
                                   : (uint32_t)(useful < UINT32_MAX ? useful : UINT32_MAX);
    uint32_t granted = 0, T = 0;
    if (ask_lender(o, m, want, &granted, &T) != 0) return 1;
    *p = (lsc_plan){.L = L, .T = T, .P = T / KV_BLOCK_TOKENS, .budget = budget, .buffers = buffers};
    kvs_el_model em = {.n_layers = L,
                       .block_tokens = T,
                       .kv_heads = H,
                       .head_dim = D,
                       .elem_bytes = d,
                       .kv_planes = planes};
    p->page_bytes = (uint64_t)planes * KV_BLOCK_TOKENS * H * D * d;
    p->master = (uint64_t)budget * L * p->page_bytes;
    uint64_t lent = (uint64_t)granted * kvs_el_block_bytes(&em);
    if (kvs_el_plan_capacity(&em, p->master, &lent, 1, buffers, NULL, &p->cap) != KVS_OK) {
        mini_err("--lsc: the plan does not fit 64 bits\n");
        return 1;
    }
    const kvs_el_capacity *cap = &p->cap;
    p->local_tokens = (uint64_t)budget * KV_BLOCK_TOKENS;
    printf("lsc: stream blocks of %u tokens, %u buffer%s; the lender granted %u of %u asked; "
           "budget %u pages (%llu single-layer blocks of %u tokens)\n",
           T, buffers, buffers == 1 ? "" : "s", granted, want, budget,
           (unsigned long long)cap->k_master, T);
    printf("lsc: predicted (Eq. 4-5): n_lsc %llu, n_rc %llu, max context %llu tokens; "
           "%llu without lending (%llu at page granularity)\n",
           (unsigned long long)cap->n_lsc, (unsigned long long)cap->n_rc,
           (unsigned long long)cap->max_tokens, (unsigned long long)cap->max_tokens_without_lsc,
           (unsigned long long)p->local_tokens);
    uint64_t decode = (uint64_t)o->decode_tokens;
    /* the buffer at its largest: every stream block the budget could hold slots for */
    p->max_stream = cap->k_master / buffers;
    if (p->max_stream > granted) p->max_stream = granted;
    uint64_t buffer_pages = (uint64_t)buffers * p->max_stream * p->P;
    p->most = cap->max_tokens + 2ull * T + decode;
    if (cap->max_tokens <= decode + 1 || buffer_pages >= KV_OVERLAY || budget >= KV_OVERLAY ||
        p->most > (1ull << 24)) {
        mini_err("--lsc: a context of %llu tokens leaves no prompt, or is more than "
                 "a mini engine holds\n",
                 (unsigned long long)cap->max_tokens);
        return 1;
    }
    return 0;
}

/* Phase 2's engine: its RC pages, the layer stream buffer (named through the cache's overlay) and
 * the arrays over max_blocks 16-token blocks and `positions` positions. 0, or -1 out of memory. */
static int run_alloc(run *r, const options *o, const model *m, const lsc_plan *p,
                     uint64_t max_blocks, uint64_t positions) {
    uint64_t max_stream = p->max_stream, P = p->P;
    *r = (run){.m = m,
               .T = p->T,
               .P = p->P,
               .buffers = p->buffers,
               .L = p->L,
               .page_bytes = p->page_bytes,
               .budget_bytes = p->master,
               .max_stream = (uint32_t)max_stream};
    r->kv = cache(o, m, p->L, p->budget);
    r->buf = max_stream ? cache(o, m, 1, (uint32_t)(p->buffers * max_stream * P)) : NULL;
    r->s = model_scratch_create(m, o->prefill_chunk, (int)positions);
    r->ids = calloc(max_stream + 1, sizeof *r->ids);
    r->step_ids = calloc(max_stream + 1, sizeof *r->step_ids);
    r->step_pages = calloc((max_stream + 1) * P, sizeof *r->step_pages);
    for (uint32_t b = 0; b < p->buffers; b++) r->pages[b] = calloc(max_stream * P + 1, 4);
    if (run_arrays(r, max_blocks) != 0 || !r->kv || (max_stream && !r->buf) || !r->s || !r->ids ||
        !r->step_ids || !r->step_pages || !r->pages[0] || (p->buffers == 2 && !r->pages[1]))
        return -1;
    for (uint32_t j = 0; j < max_stream; j++) {
        r->ids[j] = j;
        for (uint32_t b = 0; b < p->buffers; b++)
            for (uint32_t q = 0; q < P; q++)
                r->pages[b][j * P + q] = (uint32_t)((uint64_t)b * max_stream * P + j * P + q);
    }
    if (r->buf) kvcache_set_overlay(r->kv, r->buf, (uint32_t)(max_stream * P), p->buffers);
    return 0;
}

/* The engine's handle, the lender's offers waited for (the first handle's blocks came back), and
 * with two buffers the prefetch helper. 0, or -1 after saying why. */
static int run_connect(run *r, connector *c, const options *o, const model *m) {
    if (connector_open(c, o->lib_path, o->config_path, (kvs_dtype)o->dtype, m, r->kv, 0, NULL) != 0)
        return -1;
    r->conn = c;
    if (r->max_stream) {
        uint32_t got = 0;
        kvs_status st = reserve(c, &kvcache_views(r->buf)[0], r->max_stream, &got);
        if (st == KVS_OK) st = c->api->lsc_reserve(c->h, &kvcache_views(r->buf)[0], 0, &got, NULL);
        if (st != KVS_OK) return connector_hook_failed(c, "lsc_reserve", st);
    }
    if (r->buffers == 2 && r->max_stream) {
        pthread_mutex_init(&r->lock, NULL);
        pthread_cond_init(&r->cond, NULL);
        if (pthread_create(&r->helper, NULL, helper_main, r) == 0) {
            r->helper_on = 1;
        } else {
            pthread_mutex_destroy(&r->lock);
            pthread_cond_destroy(&r->cond);
        }
    }
    return 0;
}

/* The same request with all its KV local: every step's logits bit for bit, and the timing. r: the
 * run with the stream, which took `steps` steps (logits in trace) over `measured` positions. 1 when
 * it matched (or --verify is off), 0 otherwise. */
static int against_local(const options *o, const model *m, const lsc_plan *p, const run *r,
                         const int32_t *tokens, const float *trace, int64_t steps,
                         uint64_t max_blocks, uint64_t positions) {
    const uint64_t vocab = (uint64_t)model_config_of(m)->vocab, measured = r->n;
    const uint64_t prompt = p->cap.max_tokens - (uint64_t)o->decode_tokens;
    int ok = 1;
    run ref = {.m = m,
               .T = p->T,
               .P = p->P,
               .buffers = 1,
               .L = p->L,
               .page_bytes = p->page_bytes,
               .budget_bytes = UINT64_MAX};
    ref.kv = cache(o, m, p->L, (uint32_t)max_blocks);
    ref.s = model_scratch_create(m, o->prefill_chunk, (int)positions);
    float *ref_trace = malloc((uint64_t)steps * vocab * sizeof *ref_trace);
    int32_t *ref_tokens = malloc(positions * sizeof *ref_tokens);
    if (run_arrays(&ref, max_blocks) != 0 || !ref.kv || !ref.s || !ref_trace || !ref_tokens) {
        mini_err("--lsc: out of memory for the reference\n");
        ok = 0;
        goto out;
    }
    memcpy(ref_tokens, tokens, prompt * sizeof *tokens);
    int64_t ref_steps =
        serve(&ref, ref_tokens, prompt, measured, o->prefill_chunk, 0, ref_trace, (uint64_t)steps);
    uint64_t mismatches = 0;
    for (int64_t i = 0; i < ref_steps && i < steps; i++)
        mismatches += memcmp(trace + (uint64_t)i * vocab, ref_trace + (uint64_t)i * vocab,
                             vocab * sizeof *trace) != 0;
    mismatches += memcmp(tokens, ref_tokens, measured * sizeof *tokens) != 0;
    if (ref_steps != steps) mismatches++;
    double tpot = r->decode_steps ? r->decode_ms / (double)r->decode_steps : 0;
    double ref_tpot = ref.decode_steps ? ref.decode_ms / (double)ref.decode_steps : 0;
    printf("lsc: prefill of %llu tokens %.1f ms with the stream, %.1f ms all local (%.3fx); "
           "TPOT %.3f ms with the stream, %.3f ms all local (%.3fx) over %llu tokens\n",
           (unsigned long long)prompt, r->prefill_ms, ref.prefill_ms,
           ref.prefill_ms > 0 ? r->prefill_ms / ref.prefill_ms : 0.0, tpot, ref_tpot,
           ref_tpot > 0 ? tpot / ref_tpot : 0.0, (unsigned long long)r->decode_steps);
    printf("lsc: %llu stream-block layers fetched, %llu stored\n", (unsigned long long)r->fetches,
           (unsigned long long)r->stores);
    if (o->verify) {
        printf("verify: %lld steps' logits and %llu tokens against all-local KV, bit for bit, "
               "%llu mismatches\n",
               (long long)steps, (unsigned long long)measured, (unsigned long long)mismatches);
        if (mismatches) ok = 0;
    }
out:
    run_free(&ref);
    free(ref_trace);
    free(ref_tokens);
    return ok;
}

int lsc_run(const options *o, const research *x, const model *m) {
    const model_config *mc = model_config_of(m);
    lsc_plan p;
    if (plan_capacity(o, x, m, &p) != 0) return 1;
    /* Phase 2: the engine, growing its request on its own allocator */
    uint64_t max_blocks = (p.most + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    uint64_t positions = max_blocks * KV_BLOCK_TOKENS + 1;
    uint64_t prompt = p.cap.max_tokens - (uint64_t)o->decode_tokens;
    uint64_t max_steps = (prompt + (uint64_t)o->prefill_chunk - 1) / (uint64_t)o->prefill_chunk +
                         (positions - prompt) + 1;
    run r;
    int rc_alloc = run_alloc(&r, o, m, &p, max_blocks, positions);
    int32_t *tokens = malloc(positions * sizeof *tokens);
    float *trace = malloc(max_steps * (uint64_t)mc->vocab * sizeof *trace);
    connector c;
    memset(&c, 0, sizeof c);
    int rc = 1;
    if (rc_alloc != 0 || !tokens || !trace) {
        mini_err("--lsc: out of memory\n");
        goto out;
    }
    if (run_connect(&r, &c, o, m) != 0) goto out;
    uint64_t seed = mc->seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t i = 0; i < positions; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        tokens[i] = (int32_t)(seed % (uint64_t)mc->vocab);
    }
    int64_t steps = serve(&r, tokens, prompt, 0, o->prefill_chunk, 1, trace, max_steps);
    if (steps < 0) {
        mini_err("--lsc: the request failed at position %llu\n", (unsigned long long)r.n);
        goto out;
    }
    uint64_t measured = r.n, max_tokens = p.cap.max_tokens;
    printf("lsc: measured max context %llu tokens (%.4f of the prediction; %u RC pages, %u "
           "stream blocks, %llu of %llu budget bytes); %.2fx the budget's %llu tokens\n",
           (unsigned long long)measured, (double)measured / (double)max_tokens, r.rc_pages_used,
           r.used, (unsigned long long)r.charged, (unsigned long long)r.budget_bytes,
           (double)measured / (double)p.local_tokens, (unsigned long long)p.local_tokens);
    int ok = measured + p.T >= max_tokens && measured <= max_tokens + p.T;
    if (!ok)
        mini_err("--lsc: measured %llu tokens, predicted %llu: more than a block apart\n",
                 (unsigned long long)measured, (unsigned long long)max_tokens);
    if (!against_local(o, m, &p, &r, tokens, trace, steps, max_blocks, positions)) ok = 0;
    rc = ok ? 0 : 1;
out:
    if (r.conn) connector_close(&c);
    run_free(&r);
    free(tokens);
    free(trace);
    return rc;
}
