/* compare_report.h - kvstrata compare's runs and what it prints of them: the figures of each run
 * (from the engine's summary), the table side by side, the verdict sentence and the --json
 * document. cmd_compare.c runs the engines; this reports them. */
#ifndef KVS_COMPARE_REPORT_H
#define KVS_COMPARE_REPORT_H

#include <stddef.h>

#include "compare_json.h"

#define MAX_WORKLOAD_ARGS 128
#define MAX_TIERS         16 /* KVS_STATS_MAX_TIERS */
#define N_RUNS_MAX        3

typedef struct compare_opts {
    const char *configs[2];
    const char *trace, *engine, *lib, *plot;
    double timeout_s;
    int json, quiet, no_plot, no_baseline;
    char *workload_buf;                /* --workload, split in place */
    const char *wl[MAX_WORKLOAD_ARGS]; /* the workload flags */
    int n_wl;
} compare_opts;

typedef struct run {
    const char *label;  /* "A", "B", "no connector" */
    const char *config; /* NULL: the run without the connector */
    int ok;
    char why[1024]; /* a failed run: the engine's sentence */
    double seconds;
    cj_value *summary;    /* the engine's --json line */
    const cj_value *mode; /* its "connector" or "no_connector" part */
    double *ttft;         /* per turn, in the order served */
    size_t n_ttft;
    double *later; /* of those, the turns after a session's first (where a cache can help) */
    size_t n_later;
    /* objects its tiers held before it started (SSD files, shared DRAM): a warm start; -1 unknown */
    double stored_before;
    char stored_note[512];
} run;

enum { G_LATER, G_ALL, N_GROUPS };
enum { S_MEAN, S_P50, S_P99, N_STATS };
typedef struct figures {
    double ttft[N_GROUPS][N_STATS];
    double n[N_GROUPS];
    double prompt, ext_hit, local_hit;
    int connector; /* the connector's counters below are there */
    double chunks_loaded, bytes_loaded, chunks_saved, bytes_saved, saves_skipped, load_errors;
    int n_tiers;
    const char *tier_names[MAX_TIERS];
    double tier_chunks[MAX_TIERS], tier_bytes[MAX_TIERS];
} figures;

typedef struct table {
    run *runs;
    figures *fig;
    int n_runs;
    const char **tiers; /* every tier name of A and B, A's first */
    int n_tiers;
} table;

/* path's last component. */
const char *cmp_base_name(const char *path);
/* f from r's engine summary (r ran to the end). */
void cmp_get_figures(const run *r, figures *f);
/* The table side by side, the verdict sentence under it, and the --json document instead. */
void cmp_print_table(const compare_opts *o, const table *t, const char *engine);
void cmp_print_verdict(const table *t);
void cmp_print_json(const compare_opts *o, const table *t, const char *engine, const char *plot,
                    const char *plot_note);

#endif
