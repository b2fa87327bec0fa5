/* engine.c - serving one request at a time: the engine prefix cache, the block table, prefill and
 * decode steps, and around them every KV-connector hook of libkvstrata in the order vLLM calls it. */
#include "engine.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STEP_RETRIES    8     /* load-error recomputes per request before giving up */
#define LOOKUP_POLL_LIMIT   5000  /* "unknown yet" lookups (1 ms apart) before treating as a miss */
#define FINISHED_POLL_LIMIT 60000 /* get_finished polls (1 ms apart) for async saves */

const char *mini_prog = "kvs-mini-engine";

void mini_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", mini_prog);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

double engine_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct step_io {
    const char *req_id;
    uint64_t n_tokens;   /* tokens known so far */
    uint64_t n_blocks;   /* the request's whole block table */
    uint64_t n_computed; /* tokens whose KV is in the pages before this step */
    int n_scheduled;
    uint64_t first_bad; /* out: first token of the first block whose load failed */
} step_io;

/* The positions of request j's range that its loads of this step left out (chunks stored with
 * tokens dropped): marked in its engine's mask, which its scratch's attention then skips for the
 * rest of the request. Called once the loads are issued and no other thread calls the handle. */
int engine_note_dropped(engine **es, admitted *as, const int *idx, int m) {
    connector *c = es[0]->conn;
    for (int j = 0; j < m; j++) {
        engine *e = es[idx[j]];
        const admitted *a = &as[idx[j]];
        if (!e->dropped) continue; /* an engine without a mask never says it masks */
        uint64_t n = 0;
        HOOK(c, c->api->load_dropped(c->h, a->req_id, 0, e->dropped_cap, e->dropped, &n),
             "load_dropped");
        c->dropped_tokens += n;
        if (n) model_scratch_drop(e->s, e->dropped);
    }
    return 0;
}

void engine_undrop_from(engine *e, uint64_t first) {
    if (e->dropped && first < e->dropped_cap) memset(e->dropped + first, 0, e->dropped_cap - first);
}

/* Start the step's loads: the plain restore, every loaded layer waited for by the forward; or
 * kvs-mini-research's, which may compute part of the range itself meanwhile. */
static int restore_step(engine *e, const char *req_id) {
    admitted a = {.req_id = req_id};
    int zero = 0;
    if (e->ext) return e->ext->restore(&e, &a, &zero, 1);
    connector *c = e->conn;
    HOOK(c, c->api->start_load(c->h), "start_load");
    return engine_note_dropped(&e, &a, &zero, 1);
}

/* One engine step for one request: the connector's per-step hooks around a forward pass of
 * n_scheduled tokens. Returns 0; the number of blocks whose load failed (the step's results are
 * void and io->first_bad says where to recompute from); or -1 on error. */
static int engine_step(engine *e, step_io *io) {
    connector *c = e->conn;
    const int n_layers = model_config_of(e->m)->n_layers;
    if (c) {
        kvs_step_request r = {.req_id = io->req_id,
                              .tokens = e->tokens,
                              .n_tokens = io->n_tokens,
                              .block_ids = e->table,
                              .n_block_ids = io->n_blocks,
                              .n_computed = io->n_computed,
                              .n_scheduled = (uint64_t)io->n_scheduled};
        if (connector_step_meta(c, &r, 1) != 0 || restore_step(e, io->req_id) != 0) return -1;
    }
    model_embed(e->m, e->s, e->tokens + io->n_computed, io->n_scheduled);
    for (int l = 0; l < n_layers; l++) {
        if (c) HOOK(c, c->api->wait_layer_load(c->h, (uint32_t)l), "wait_layer_load");
        if (e->ext) e->ext->before_layer(e, e->s, l, io->n_computed, io->n_scheduled);
        model_layer(e->m, e->s, e->kv, (uint32_t)l, e->table, io->n_computed, io->n_scheduled);
        if (c) HOOK(c, c->api->save_layer(c->h, (uint32_t)l), "save_layer");
    }
    if (!c) return 0;
    /* cache layers past the model's (kvs-mini-research's stage boundaries, written before their
     * stage's first layer) are saved with the KV; the reference engine's cache has none */
    for (uint32_t l = (uint32_t)n_layers; l < kvcache_params_of(e->kv)->n_layers; l++)
        HOOK(c, c->api->save_layer(c->h, l), "save_layer");
    HOOK(c, c->api->wait_save(c->h), "wait_save");
    /* vLLM's order: get_finished, then load_error_blocks (which also lists the failed blocks of
     * asynchronous loads get_finished reported). One request at a time: nothing waits on either. */
    int sending, receiving;
    if (connector_poll_finished(c, io->req_id, &sending, &receiving) != 0) return -1;
    uint64_t n_bad = 0;
    HOOK(c, c->api->load_error_blocks(c->h, c->errors, c->errors_cap, &n_bad), "load_error_blocks");
    if (n_bad == 0) return 0;
    /* Recompute from the first failed block: everything computed after it read garbage. */
    uint64_t first = UINT64_MAX;
    for (uint64_t i = 0; i < n_bad; i++) {
        uint64_t b = 0;
        while (b < io->n_blocks && e->table[b] != c->errors[i]) b++;
        if (b == io->n_blocks) {
            mini_err("load_error_blocks reported block %u, which request '%s' does not hold\n",
                     c->errors[i], io->req_id);
            return -1;
        }
        if (b * KV_BLOCK_TOKENS < first) first = b * KV_BLOCK_TOKENS;
    }
    io->first_bad = first;
    return (int)n_bad;
}

/* Ask the connector how much of the prompt it can load beyond the n_local tokens the engine has. */
static int connector_lookup(connector *c, const char *req_id, const int32_t *tokens, uint64_t n,
                            uint64_t n_local, kvs_lookup_result *res) {
    for (int tries = 0;; tries++) {
        memset(res, 0, sizeof *res);
        res->struct_size = sizeof *res;
        HOOK(c, c->api->lookup(c->h, req_id, tokens, n, n_local, res), "lookup");
        if (!res->unknown_yet) break;
        if (tries == LOOKUP_POLL_LIMIT) { /* still unknown: schedule it as a miss */
            res->n_hit_tokens = 0;
            res->load_async = 0;
            break;
        }
        sleep_ms(1); /* stands for the next scheduler step */
    }
    if (n_local + res->n_hit_tokens >= n) {
        mini_err("lookup for '%s' offered %llu tokens beyond %llu of a %llu-token prompt: "
                 "the last token "
                 "must be left to compute\n",
                 req_id, (unsigned long long)res->n_hit_tokens, (unsigned long long)n_local,
                 (unsigned long long)n);
        return -1;
    }
    return 0;
}

/* Admit one turn: prefix-cache match, lookup, allocation. e->tokens holds the prompt. A load the
 * connector runs asynchronously is only armed here (a->async): batch.c serves such requests. */
int engine_admit(engine *e, const char *req_id, uint64_t n_prompt, int n_out, double t0,
                 admitted *a) {
    connector *c = e->conn;
    *a = (admitted){.req_id = req_id, .n_prompt = n_prompt, .n_out = n_out, .t0 = t0};

    /* A new request: no position is dropped yet. */
    if (e->dropped) memset(e->dropped, 0, e->dropped_cap);
    model_scratch_drop(e->s, NULL);

    /* 1. Local hits: full blocks from the engine's own prefix cache. */
    uint32_t n_local_blocks = kvcache_match_prefix(e->kv, e->tokens, n_prompt, e->table);
    a->n_local = (uint64_t)n_local_blocks * KV_BLOCK_TOKENS;

    /* 2. External hits from the connector. */
    kvs_lookup_result lr = {.struct_size = sizeof lr};
    if (c && connector_lookup(c, req_id, e->tokens, n_prompt, a->n_local, &lr) != 0) return -1;
    a->n_ext = lr.n_hit_tokens;
    a->n_lossy = lr.n_lossy_tokens;

    /* 3. Pages for the whole request: the prompt and every output but the last get KV. */
    a->kv_tokens = n_prompt + (uint64_t)n_out - 1;
    a->n_blocks = (uint32_t)((a->kv_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    if (kvcache_alloc(e->kv, a->n_blocks - n_local_blocks, e->table + n_local_blocks) != 0) {
        mini_err("'%s' needs %u pages but the block budget leaves %u: raise --block-budget\n",
                 req_id, a->n_blocks - n_local_blocks, kvcache_available(e->kv));
        kvcache_release(e->kv, e->table, n_local_blocks, e->tokens, 0);
        return -1;
    }
    if (c) HOOK(c, c->api->on_alloc(c->h, req_id, e->table, a->n_blocks, a->n_ext), "on_alloc");

    a->computed = a->n_local + a->n_ext;
    a->async = c && a->n_ext && lr.load_async;
    return 0;
}

/* Steps until n_out tokens exist (prefill chunks, then one token per step), then finish. TTFT counts
 * from a->t0. on_prefill (may be NULL) runs once the first token's logits exist, outside the TTFT. */
int engine_run(engine *e, admitted *a, turn_result *r, prefill_done_fn on_prefill, void *ctx) {
    connector *c = e->conn;
    const char *req_id = a->req_id;
    uint64_t computed = a->computed;

    /* 4./5. */
    r->prompt = a->n_prompt;
    r->local_hit = a->n_local;
    r->ext_hit = a->n_ext;
    r->lossy_hit = a->n_lossy;
    r->error_blocks = a->error_blocks;
    uint64_t n_known = a->n_prompt;
    int produced = 0, retries = 0;
    while (produced < a->n_out) {
        uint64_t left = n_known - computed;
        int n = left < (uint64_t)e->prefill_chunk ? (int)left : e->prefill_chunk;
        step_io io = {.req_id = req_id,
                      .n_tokens = n_known,
                      .n_blocks = a->n_blocks,
                      .n_computed = computed,
                      .n_scheduled = n};
        int rc = engine_step(e, &io);
        if (rc < 0) return -1;
        if (rc > 0) {
            r->error_blocks += (uint64_t)rc;
            if (++retries > MAX_STEP_RETRIES) {
                mini_err("'%s': loads kept failing after %d recomputes\n", req_id, retries - 1);
                return -1;
            }
            if (io.first_bad < computed) computed = io.first_bad;
            engine_undrop_from(e, computed);
            continue; /* discard this step: nothing it computed is used */
        }
        computed += (uint64_t)n;
        if (computed < n_known) continue;
        model_logits(e->m, e->s, n - 1, e->logits);
        int32_t next = model_argmax(e->logits, model_config_of(e->m)->vocab);
        if (produced == 0) {
            r->ttft_ms = engine_now_ms() - a->t0;
            r->first_token = next;
            if (on_prefill && on_prefill(ctx, e, a->n_prompt, r) != 0) return -1;
        }
        produced++;
        e->tokens[n_known++] = next;
    }

    /* 6. Finished: the connector may keep the pages for an async save; then they go back to the
     * engine's prefix cache. */
    if (c) {
        int keep = 0;
        HOOK(c, c->api->request_finished(c->h, req_id, &keep), "request_finished");
        for (int polls = 0; keep; polls++) {
            int sending, receiving;
            if (connector_poll_finished(c, req_id, &sending, &receiving) != 0) return -1;
            if (sending) break;
            if (polls == FINISHED_POLL_LIMIT) {
                mini_err("the asynchronous save of '%s' never finished\n", req_id);
                return -1;
            }
            sleep_ms(1);
        }
        if (connector_take_events(c) != 0) return -1;
    }
    /* pages over lossy hits hold approximate KV: they never serve a later prompt from the prefix
     * cache (the connector keeps what it stored, marked) */
    kvcache_release(e->kv, e->table, a->n_blocks, e->tokens,
                    a->n_lossy ? a->n_local : a->kv_tokens);
    return 0;
}

int engine_serve(engine *e, const char *req_id, uint64_t n_prompt, int n_out, turn_result *r,
                 prefill_done_fn on_prefill, void *ctx) {
    admitted a;
    if (engine_admit(e, req_id, n_prompt, n_out, engine_now_ms(), &a) != 0) return -1;
    if (a.async) {
        mini_err("'%s': the connector loads it asynchronously (loads.async): kvs-mini-research "
                 "serves such requests\n",
                 req_id);
        kvcache_release(e->kv, e->table, a.n_blocks, e->tokens, 0);
        return -1;
    }
    return engine_run(e, &a, r, on_prefill, ctx);
}
