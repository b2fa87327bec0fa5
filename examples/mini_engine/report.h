/* report.h - the summary of a run on stdout: time to first token (mean, P50, P99) per group of turns
 * and mode with the speedup, the connector's counters, --verify's count and, with --json, the same
 * as one JSON object on the last line. */
#ifndef MINI_REPORT_H
#define MINI_REPORT_H

#include "mode.h"
#include "options.h"
#include "verify.h"
#include "workload.h"

/* Where kvs-mini-research adds to a mode's part of the summary (report_ext.mode_extra). */
typedef enum report_at {
    REPORT_BEFORE_DROPPED, /* in the connector's counters, before the dropped positions */
    REPORT_AFTER_DROPPED,  /* in the connector's counters, after them */
    REPORT_MODE_END        /* the end of the mode's part (JSON only) */
} report_at;

/* What kvs-mini-research adds to the summary (restore plans, step times); NULL for the reference
 * engine. */
typedef struct report_ext {
    void (*mode_extra)(const mode_run *run, int json, report_at at);
    void (*after_modes)(const mode_run *runs, int n_runs); /* lines after the modes' */
} report_ext;

/* runs[0..n_runs): the modes in the order they are printed (with the connector first); ref NULL
 * without --verify; x NULL or kvs-mini-research's additions. */
void print_summary(const options *o, const workload *w, const sizing *z, mode_run *runs, int n_runs,
                   const reference *ref, const report_ext *x);

#endif
