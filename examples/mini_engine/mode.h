/* mode.h - one way of serving the workload (with the connector or without), with an engine of its
 * own: begun, fed turn by turn, its counters collected, ended. Both modes of a run go turn by turn
 * side by side, so they see the same background load. */
#ifndef MINI_MODE_H
#define MINI_MODE_H

#include <stdint.h>

#include "abi/kvstrata_lossy.h"
#include "abi/kvstrata_plans.h"
#include "engine.h"
#include "models/mini/kvcache.h"
#include "models/mini/model.h"
#include "options.h"
#include "verify.h"
#include "workload.h"

/* How the run sized the paged cache from the workload. */
typedef struct sizing {
    uint64_t max_prompt, max_request, total_history;
    uint32_t blocks, budget;
} sizing;

/* One way of serving the workload (with or without the connector), with its own engine state. */
typedef struct mode_run {
    const char *name;
    int use_connector;
    turn_result *turns;
    kvs_stats stats;
    int have_stats;
    uint64_t events_stored, events_removed;
    kvcache_stats cache;
    /* state while running */
    engine e;
    char req_id[256]; /* the id of the request e serves */
    const workload *w;
    connector conn;
    reference *ref;
    int32_t **history; /* per session: every token so far */
    uint64_t *n_history;
    void *ext; /* kvs-mini-research's state of this mode (its slots, batch, plans); NULL here */
} mode_run;

/* What kvs-mini-research changes in the engine mode_begin makes; NULL for the reference engine. */
typedef struct mode_setup {
    uint32_t cache_layers;        /* layers of the paged cache (the model's and stage boundaries) */
    int plan_caps;                /* restore plans the engine executes (KVS_PLAN_CAP_*) */
    int no_mask;                  /* declare no KVS_PLAN_CAP_MASK whatever --no-mask says */
    const kvs_stage_desc *stages; /* pipeline stages for the connector; NULL: none */
    const engine_ext *ext;        /* the engine's extension; NULL: none */
} mode_setup;

/* A paged cache for the model with `layers` layers (0: the model's). NULL after printing why. */
kvcache *make_cache(const options *o, const model *m, uint32_t layers, uint32_t blocks,
                    uint32_t budget);
/* A fresh engine: pages, prefix cache, sessions and (with the connector) a new handle. 0, or -1 after
 * printing why (mode_end releases what was made). x: NULL, or kvs-mini-research's changes. */
int mode_begin(mode_run *run, const options *o, const model *m, const workload *w, const sizing *z,
               reference *ref, const mode_setup *x);
/* Turn i of the workload arrives at t0 on engine e: its prompt (the session's history plus the new
 * user tokens) into e->tokens, its id into id (256 bytes), admitted into *a (prefix-cache match,
 * lookup, allocation). 0, or -1 after printing why. */
int mode_admit(mode_run *run, const workload *w, int i, engine *e, char *id, double t0,
               admitted *a);
/* The turn served on e (admitted as *a, its result r) is done: the session's history is now its
 * prompt plus what was generated; its line is printed unless --quiet. */
void mode_turn_done(mode_run *run, const options *o, const workload *w, const engine *e,
                    const admitted *a, const turn_result *r);
/* Serve turn i of the workload. 0, or -1 after printing why. */
int mode_turn(mode_run *run, const options *o, const workload *w, int i);
/* Collect the counters (connector stats and events, cache stats). 0, or -1 after printing why. */
int mode_collect(mode_run *run);
/* Close the handle and free the engine; the turns' results go with it. */
void mode_end(mode_run *run, const workload *w);

#endif
