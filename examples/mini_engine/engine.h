/* engine.h - the serving loop of the mini engine: one request at a time through the paged cache
 * and, when a connector is open, through libkvstrata's KV-connector hooks in vLLM's order. */
#ifndef MINI_ENGINE_H
#define MINI_ENGINE_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "connector.h"
#include "kvcache.h"
#include "model.h"
#include "stages.h"

/* CLOCK_MONOTONIC in milliseconds. */
double engine_now_ms(void);

typedef struct engine {
    const model *m;
    model_scratch *s;
    kvcache *kv;
    connector *conn;      /* NULL: serve without the connector */
    int prefill_chunk;    /* most tokens computed per prefill step */
    float *logits;        /* vocab floats: the logits of the last step */
    uint32_t *table;      /* the current request's block table */
    int32_t *tokens;      /* the current request's tokens: prompt, then outputs */
    stage_layout *stages; /* NULL or one stage: none; else every forward stores the boundaries */
    uint8_t *dropped; /* [max_request]: positions of the current request whose KV a load left out
                           * (load_dropped); attention skips them (model_scratch_drop) */
    uint64_t dropped_cap; /* its length */
} engine;

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
typedef struct admitted {
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
} admitted;

/* The phases of engine_serve, for serving several requests at once: admit each (prefix-cache match,
 * lookup, allocation; e->tokens holds the prompt), restore their external ranges in one step that
 * the connector plans as a batch (es[i] and as[i] belong together; the engines share the model,
 * scratch, cache and connector but each has its own tokens and block table), then run each. */
int engine_admit(engine *e, const char *req_id, uint64_t n_prompt, int n_out, double t0,
                 admitted *a);
int engine_restore_batch(engine **es, admitted *as, int n);
int engine_run(engine *e, admitted *a, turn_result *r, prefill_done_fn on_prefill, void *ctx);

/* The pieces of a step batch.c puts together for several requests. engine_restore_plans: start the
 * step's loads (start_load), and where the connector's restore plans leave part of a range to the
 * engine (token, layer, stage plans), recompute it while a loader thread lands the loads; es[idx[j]]
 * and as[idx[j]] are the engine and admission of the j-th of the m requests whose loads the bound
 * step carries (m >= 1). engine_compute_layers: tokens [first, first + n) through
 * layers [from, to) in prefill-sized pieces in scr (from the embeddings, or from the boundary of the
 * stage starting at `from`), storing the boundaries they cross if capture. engine_capture_boundary:
 * before layer l of a forward of n tokens at pos0, keep their hidden states if a stage starts there. */
int engine_restore_plans(engine **es, admitted *as, const int *idx, int m);
void engine_compute_layers(engine *e, model_scratch *scr, uint64_t first, uint64_t n, int from,
                           int to, int capture);
void engine_capture_boundary(engine *e, model_scratch *s, int l, uint64_t pos0, int n);

/* Serve one turn: prefix-cache match, lookup, allocation, prefill steps, greedy decode steps, finish.
 * e->tokens holds the n_prompt prompt tokens and must have room for n_out more, which are appended.
 * req_id must be unique per request. Returns 0, or -1 after printing why (also when the connector
 * answers load_async: such a turn is served by batch.c). */
int engine_serve(engine *e, const char *req_id, uint64_t n_prompt, int n_out, turn_result *r,
                 prefill_done_fn on_prefill, void *ctx);

#endif
