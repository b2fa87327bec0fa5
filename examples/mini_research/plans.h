/* plans.h - what kvs-mini-research adds to the reference engine's steps (an engine_ext): restore
 * plans (--restore-plans: the connector leaves the front of a restored range, its lower layers, or
 * each pipeline stage's lowest layers to the engine, which computes them while the rest loads) and
 * pipeline stages (--stages: every forward stores the activations entering each stage, saved and
 * loaded with the KV). One plan_state per mode: its engines' ext, and the plans it followed. */
#ifndef MINI_PLANS_H
#define MINI_PLANS_H

#include <stdint.h>

#include "examples/mini_engine/engine.h"
#include "stages.h"

typedef struct plan_state {
    engine_ext ext;   /* first: an engine reaches its mode's plan_state through e->ext */
    stage_layout *sl; /* the run's stages (one: none) */
    int plans;        /* the engine executes restore plans (set_plan_caps) */
    uint64_t plans_token, plans_layer, plans_recompute, plans_stage,
        plan_recomputed_tokens; /* plans followed */
    uint64_t
        stage_boundary_restores; /* stages s > 0 of stage plans recomputed from their boundary */
} plan_state;

void plan_state_init(plan_state *ps, stage_layout *sl, int plans);
/* The plan_state of an engine whose ext one made. */
plan_state *plan_state_of(const engine *e);

/* Start the step's loads (start_load), and where the connector's restore plans leave part of a
 * range to the engine (token, layer, stage plans), recompute it while a loader thread lands the
 * loads; es[idx[j]] and as[idx[j]] are the engine and admission of the j-th of the m requests whose
 * loads the bound step carries (m >= 1). 0, or -1 after printing why. */
int plans_restore(engine **es, admitted *as, const int *idx, int m);
/* Tokens [first, first + n) through layers [from, to) in prefill-sized pieces in scr (from the
 * embeddings, or from the boundary of the stage starting at `from`), storing the boundaries they
 * cross if capture. */
void plans_compute_layers(engine *e, model_scratch *scr, uint64_t first, uint64_t n, int from,
                          int to, int capture);
/* Before layer l of a forward of n tokens at pos0: keep their hidden states if a stage starts
 * there. */
void plans_capture_boundary(engine *e, model_scratch *s, int l, uint64_t pos0, int n);

#endif
