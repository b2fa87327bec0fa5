/* engine.h - the serving loop of the mini engine: one request at a time through the paged cache
 * and, when a connector is open, through libkvstrata's KV-connector hooks in vLLM's order. */
#ifndef MINI_ENGINE_H
#define MINI_ENGINE_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "connector.h"
#include "models/mini/kvcache.h"
#include "models/mini/model.h"

/* The program's name, for messages ("kvs-mini-engine" unless its main sets another). */
extern const char *mini_prog;
/* A message on stderr, prefixed with the program's name. */
void mini_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* CLOCK_MONOTONIC in milliseconds. */
double engine_now_ms(void);

typedef struct engine engine;
typedef struct admitted admitted;

/* What kvs-mini-research adds to an engine's steps (examples/mini_research/plans.h: restore plans,
 * pipeline stages); the reference engine has none (engine.ext NULL). */
typedef struct engine_ext {
    /* Start the loads of a step that restores the external ranges of m requests (es[idx[j]] and
     * as[idx[j]]), computing meanwhile what the connector's restore plans leave to the engine. */
    int (*restore)(engine **es, admitted *as, const int *idx, int m);
    /* Before model layer l of a forward of n tokens at pos0 in scratch s. */
    void (*before_layer)(engine *e, model_scratch *s, int l, uint64_t pos0, int n);
} engine_ext;

struct engine {
    const model *m;
    model_scratch *s;
    kvcache *kv;
    connector *conn;       /* NULL: serve without the connector */
    int prefill_chunk;     /* most tokens computed per prefill step */
    float *logits;         /* vocab floats: the logits of the last step */
    uint32_t *table;       /* the current request's block table */
    int32_t *tokens;       /* the current request's tokens: prompt, then outputs */
    const engine_ext *ext; /* NULL: the plain restore (start_load, then wait for each layer) */
    uint8_t *dropped; /* [max_request]: positions of the current request whose KV a load left out
                           * (load_dropped); attention skips them (model_scratch_drop) */
    uint64_t dropped_cap; /* its length */
};

typedef struct turn_result {
    int session, turn;
    uint64_t prompt;
    uint64_t local_hit,
        ext_hit;           /* tokens from the engine's prefix cache / loaded by the connector */
    uint64_t lossy_hit;    /* of ext_hit, tokens of chunks stored lossy (lookup's n_lossy_tokens) */
    uint64_t error_blocks; /* blocks reported by load_error_blocks */
    double ttft_ms;
    int32_t first_token;
} turn_result;

/* Called once the first token's logits are in e->logits, outside the TTFT. Non-zero stops the run. */
typedef int (*prefill_done_fn)(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r);

/* Positions from `first` on are recomputed (a load failed): whatever a load dropped there is real KV
 * again, no longer masked. */
void engine_undrop_from(engine *e, uint64_t first);

/* A request between admission and its steps. */
struct admitted {
    const char *req_id;
    uint64_t n_prompt;
    int n_out;
    uint64_t n_local, n_ext; /* engine prefix-cache hit, connector hit */
    uint64_t n_lossy;        /* of n_ext, tokens that load lossy */
    uint64_t computed;       /* tokens whose KV is in the pages (or will be once restored) */
    uint32_t n_blocks;
    uint64_t kv_tokens;
    uint64_t error_blocks; /* failed loads of a batch restore */
    int restored;          /* its external range was restored before its steps */
    int async; /* the connector loads its external range between steps: batch.c serves it */
    double t0; /* arrival: TTFT counts from here */
};

/* The phases of engine_serve: admit (prefix-cache match, lookup, allocation; e->tokens holds the
 * prompt), then run its steps. A request the connector loads asynchronously (a->async) is only
 * admitted: kvs-mini-research's batch serves such requests. */
int engine_admit(engine *e, const char *req_id, uint64_t n_prompt, int n_out, double t0,
                 admitted *a);
int engine_run(engine *e, admitted *a, turn_result *r, prefill_done_fn on_prefill, void *ctx);

/* The positions of the ranges the step's loads left out (chunks a compress tier stored with tokens
 * dropped), from load_dropped into each engine's mask: es[idx[j]] and as[idx[j]] for j < m. Called
 * once the loads are issued. 0, or -1 after printing why. */
int engine_note_dropped(engine **es, admitted *as, const int *idx, int m);

/* Serve one turn: prefix-cache match, lookup, allocation, prefill steps, greedy decode steps, finish.
 * e->tokens holds the n_prompt prompt tokens and must have room for n_out more, which are appended.
 * req_id must be unique per request. Returns 0, or -1 after printing why (also when the connector
 * answers load_async: kvs-mini-research serves such turns). */
int engine_serve(engine *e, const char *req_id, uint64_t n_prompt, int n_out, turn_result *r,
                 prefill_done_fn on_prefill, void *ctx);

#endif
