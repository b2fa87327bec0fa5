/* report.h - the summary of a run on stdout: time to first token (mean, P50, P99) per group of turns
 * and mode with the speedup, the connector's counters, --verify's count and, with --json, the same
 * as one JSON object on the last line. */
#ifndef MINI_REPORT_H
#define MINI_REPORT_H

#include "mode.h"
#include "options.h"
#include "verify.h"
#include "workload.h"

/* runs[0..n_runs): the modes in the order they are printed (with the connector first); ref NULL
 * without --verify. */
void print_summary(const options *o, const workload *w, const sizing *z, mode_run *runs, int n_runs,
                   const reference *ref);

#endif
