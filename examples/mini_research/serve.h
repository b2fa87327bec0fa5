/* serve.h - kvs-mini-research serving the workload: the reference engine's modes (mode.h) with the
 * research state of each (its restore plans and stages, plans.h; slots for requests in flight
 * together, batch.h): a turn at a time (an asynchronous load served by a batch of one), a group of
 * turns admitted and restored together (--batch), or turns arriving continuously (--continuous);
 * and what the summary adds for them (report_ext). */
#ifndef MINI_SERVE_H
#define MINI_SERVE_H

#include "batch.h"
#include "examples/mini_engine/mode.h"
#include "examples/mini_engine/report.h"
#include "plans.h"
#include "research.h"

/* One mode's research state (mode_run.ext). */
typedef struct research_mode {
    plan_state ps;
    engine *more; /* --batch, --continuous: slots 1..N-1, sharing e's model, cache and connector */
    int n_more;
    batch_req *reqs;  /* per slot: the request it serves */
    char (*ids)[256]; /* per slot: that request's id */
    batch flight;     /* the requests in flight (batch.c), with its step times */
    int continuous;   /* --continuous: the summary reports the step times */
    int stages;       /* --stages: the summary reports the stages restored from their boundary */
} research_mode;

/* mode_begin with the research state rm (sl: the run's stages), then the slots. 0, or -1 after
 * printing why (serve_end releases what was made). */
int serve_begin(mode_run *run, research_mode *rm, const options *o, const research *x,
                stage_layout *sl, const model *m, const workload *w, const sizing *z,
                reference *ref);
/* Serve turn i of the workload. 0, or -1 after printing why. */
int serve_turn(mode_run *run, const options *o, const workload *w, int i);
/* --batch: serve turns [i, i + n) (different sessions) together. 0, or -1 after printing why. */
int serve_group(mode_run *run, const options *o, const workload *w, int i, int n);
/* --continuous N: serve the whole workload with up to N turns in flight; the next turn arrives as
 * soon as one finishes (and its session has none in flight). 0, or -1 after printing why. */
int serve_continuous(mode_run *run, const options *o, const research *x, const workload *w);
/* How many turns from i on form the next group: at most --batch, all of different sessions. */
int group_size(const research *x, const workload *w, int i);
/* The slots, then mode_end. */
void serve_end(mode_run *run, const workload *w);

/* The summary's additions: the restore plans followed, the step times of --continuous. */
extern const report_ext serve_report;

#endif
