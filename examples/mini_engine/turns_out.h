/* turns_out.h - --turns-out: one JSON line per turn served, written as the turn ends, so that a
 * program running the engine (kvstrata compare) can draw the distribution of TTFT and count the
 * turns done while the run goes on. */
#ifndef MINI_TURNS_OUT_H
#define MINI_TURNS_OUT_H

#include <stdio.h>

#include "mode.h"
#include "workload.h"

/* The file for --turns-out (created or truncated). NULL after printing why. */
FILE *turns_out_open(const char *path);
/* Turn i of the workload, just served by run: its line, flushed. With the connector, the chunks
 * and bytes each tier served for this turn (the handle's counters since the previous turn; *prev
 * holds them between calls, zeroed before the first). 0, or -1 after printing why. */
int turns_out_write(FILE *f, mode_run *run, const workload *w, int i, kvs_stats *prev);
/* Close; 0, or -1 after printing why (a write that failed late). */
int turns_out_close(FILE *f, const char *path);

#endif
