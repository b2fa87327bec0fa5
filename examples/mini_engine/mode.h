/* mode.h - one way of serving the workload (with the connector or without), with an engine of its
 * own: begun, fed turn by turn (or a group of turns with --batch), its counters collected, ended. Both
 * modes of a run go turn by turn side by side, so they see the same background load (with
 * --continuous each serves the whole workload in turn). */
#ifndef MINI_MODE_H
#define MINI_MODE_H

#include <stdint.h>

#include "batch.h"
#include "engine.h"
#include "kvcache.h"
#include "model.h"
#include "options.h"
#include "stages.h"
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
    engine *more; /* --batch, --continuous: slots 1..N-1, sharing e's model, cache and connector */
    int n_more;
    batch_req *reqs;  /* per slot: the request it serves */
    char (*ids)[256]; /* per slot: that request's id */
    batch flight;     /* the requests in flight (batch.c), with its step times */
    const workload *w;
    connector conn;
    reference *ref;
    int32_t **history; /* per session: every token so far */
    uint64_t *n_history;
} mode_run;

/* --stages: the layout every engine of the run shares (set once the model exists), with the stage
 * threads' activations. */
extern stage_layout run_stages;

/* A paged cache for the model and the run's stages; NULL after printing why. */
kvcache *make_cache(const options *o, const model *m, uint32_t blocks, uint32_t budget);
/* The same with `layers` layers (the layer stream cache's one-layer buffer). */
kvcache *make_cache_layers(const options *o, const model *m, uint32_t layers, uint32_t blocks,
                           uint32_t budget);
/* A fresh engine: pages, prefix cache, sessions and (with the connector) a new handle. 0, or -1 after
 * printing why (mode_end releases what was made). */
int mode_begin(mode_run *run, const options *o, const model *m, const workload *w, const sizing *z,
               reference *ref);
/* Serve turn i of the workload. 0, or -1 after printing why. */
int mode_turn(mode_run *run, const options *o, const workload *w, int i);
/* --batch: serve turns [i, i + n) (different sessions) together. 0, or -1 after printing why. */
int mode_group(mode_run *run, const options *o, const workload *w, int i, int n);
/* --continuous N: serve the whole workload with up to N turns in flight; the next turn arrives as
 * soon as one finishes (and its session has none in flight). 0, or -1 after printing why. */
int mode_continuous(mode_run *run, const options *o, const workload *w);
/* How many turns from i on form the next group: at most --batch, all of different sessions. */
int group_size(const options *o, const workload *w, int i);
/* Collect the counters (connector stats and events, cache stats). 0, or -1 after printing why. */
int mode_collect(mode_run *run);
/* Close the handle and free the engine; the turns' results go with it. */
void mode_end(mode_run *run, const workload *w);

#endif
