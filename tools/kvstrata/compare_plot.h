/* compare_plot.h - kvstrata compare's picture: the empirical CDF of per-turn TTFT of each run,
 * drawn by gnuplot (a child without a shell, its script on stdin, its data in a temporary
 * directory removed afterwards). */
#ifndef KVS_COMPARE_PLOT_H
#define KVS_COMPARE_PLOT_H

#include <stddef.h>

typedef struct cmp_series {
    const char *title;     /* the legend: "A: fast.yaml" */
    const double *ttft_ms; /* [n], in any order */
    size_t n;
} cmp_series;

enum { CMP_PLOT_OK = 0, CMP_PLOT_NO_GNUPLOT = 1, CMP_PLOT_FAILED = -1 };

/* Draw series[0..n_series) into out_path: SVG when it ends in .svg, PNG when in .png (pngcairo
 * where gnuplot has it, else png). subtitle: a line under the title (the workload). Returns
 * CMP_PLOT_OK, CMP_PLOT_NO_GNUPLOT (gnuplot is not on PATH) or CMP_PLOT_FAILED, with a sentence in
 * msg for the last two. */
int cmp_plot(const char *out_path, const char *subtitle, const cmp_series *series, int n_series,
             char *msg, size_t msg_len);

#endif
