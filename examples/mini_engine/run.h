/* run.h - the phases of a run of the workload, which kvs-mini-engine's main goes through in order
 * (and kvs-mini-research's, with its modes in between): the trained weights and text, the workload
 * and the cache's size, the model, --verify's reference engine, the verdict. Each returns 0, or
 * non-zero after printing why on stderr; run_free releases whatever was made. */
#ifndef MINI_RUN_H
#define MINI_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "mode.h"
#include "models/mini/model.h"
#include "models/mini/weights.h"
#include "options.h"
#include "verify.h"
#include "workload.h"

typedef struct mini_run {
    weights_file wf; /* --weights */
    int have_weights;
    uint8_t *text; /* --text's bytes, or NULL */
    size_t text_len;
    workload w;
    int have_workload;
    sizing z;
    model *m;
    reference ref; /* --verify */
    int have_ref;
} mini_run;

/* Resolve "default", load the weights (their shape becomes o->model) and the text. */
int run_load_trained(options *o, mini_run *r);
/* Check the model's shape, make the workload and size the paged cache: the budget is a third of all
 * sessions' final histories, so that interleaved sessions push each other out, but never less than
 * in_flight of the largest request (at once) and one page. own_request: the program serves a
 * request of its own, not the workload's (no check that the largest one fits the budget). */
int run_workload(const options *o, mini_run *r, int in_flight, int own_request);
/* The model (seeded, or the trained weights, checked against the trainer's logits). */
int run_model(const options *o, mini_run *r);
/* With --verify: a reference engine with no connector and no prefix cache (a cache of cache_layers
 * layers, 0: the model's). */
int run_reference(const options *o, mini_run *r, uint32_t cache_layers);
/* The verdict after the summary: 0, or 1 after saying why --verify failed. */
int run_verdict(const mini_run *r);
void run_free(mini_run *r);

#endif
