/* compare_plot.c - the picture of kvstrata compare (compare_plot.h). */
#include "compare_plot.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare_child.h"

#define PLOT_TIMEOUT_S 60.0

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* s as a gnuplot single-quoted string (no escapes there: a quote is doubled). */
static void gp_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('\'', f);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

/* The data files: per series, the steps of its CDF ("ttft fraction" lines). */
static int write_data(const char *dir, const cmp_series *series, int n_series, char *msg,
                      size_t msg_len) {
    for (int k = 0; k < n_series; k++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/s%d.dat", dir, k);
        FILE *f = fopen(path, "w");
        if (!f) {
            snprintf(msg, msg_len, "cannot write %s: %s", path, strerror(errno));
            return -1;
        }
        const cmp_series *s = &series[k];
        double *v = malloc((s->n ? s->n : 1) * sizeof *v);
        if (!v) {
            fclose(f);
            snprintf(msg, msg_len, "out of memory for the picture's data");
            return -1;
        }
        memcpy(v, s->ttft_ms, s->n * sizeof *v);
        qsort(v, s->n, sizeof *v, cmp_double);
        if (s->n) fprintf(f, "%.4f 0\n", v[0]);
        for (size_t i = 0; i < s->n; i++)
            fprintf(f, "%.4f %.6f\n", v[i], (double)(i + 1) / (double)s->n);
        free(v);
        if (fclose(f) != 0) {
            snprintf(msg, msg_len, "cannot write %s: %s", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* The script, into a memory buffer (gnuplot reads it on stdin). */
static char *make_script(const char *dir, const char *out_path, const char *subtitle,
                         const cmp_series *series, int n_series, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    double lo = 0, hi = 0;
    int have = 0;
    for (int k = 0; k < n_series; k++)
        for (size_t i = 0; i < series[k].n; i++) {
            double v = series[k].ttft_ms[i];
            if (!have || v < lo) lo = v;
            if (!have || v > hi) hi = v;
            have = 1;
        }
    /* TTFT of hits and of recomputes can lie orders of magnitude apart */
    int log_x = have && lo > 0 && hi / lo > 30.0;
    if (ends_with(out_path, ".png"))
        fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
                   "  set terminal pngcairo size 960,600 noenhanced font 'sans,11'\n"
                   "} else {\n"
                   "  set terminal png size 960,600 noenhanced\n"
                   "}\n");
    else
        fprintf(f, "set terminal svg size 960,600 dynamic noenhanced font 'sans,13' background "
                   "rgb 'white'\n");
    fprintf(f, "set output ");
    gp_quote(f, out_path);
    fprintf(f, "\nset title ");
    char title[512];
    snprintf(title, sizeof title, "Time to first token: empirical CDF (%s)", subtitle);
    gp_quote(f, title);
    fprintf(f, "\nset xlabel ");
    gp_quote(f, log_x ? "TTFT (ms, log scale)" : "TTFT (ms)");
    fprintf(f, "\nset ylabel 'fraction of turns with TTFT <= x'\n"
               "set yrange [0:1.02]\nset key bottom right box opaque\nset grid\n");
    if (log_x) fprintf(f, "set logscale x\n");
    fprintf(f, "plot ");
    for (int k = 0; k < n_series; k++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/s%d.dat", dir, k);
        fprintf(f, "%s", k ? ", \\\n     " : "");
        gp_quote(f, path);
        fprintf(f, " using 1:2 with steps linewidth 2 title ");
        gp_quote(f, series[k].title);
    }
    fprintf(f, "\nset output\n");
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The last line gnuplot wrote on stderr (its complaint), into msg after prefix. */
static void last_line(const char *path, const char *prefix, char *msg, size_t msg_len) {
    char text[4096] = "";
    FILE *f = fopen(path, "r");
    if (f) {
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            if (line[strspn(line, " \t^")]) snprintf(text, sizeof text, "%s", line);
        }
        fclose(f);
    }
    snprintf(msg, msg_len, "%s%s%s", prefix, text[0] ? ": " : "", text);
}

/* Run gnuplot with the script on stdin; 0, or -1 with a sentence in msg. */
static int run_gnuplot(const char *gnuplot, const char *dir, const char *script, size_t len,
                       char *msg, size_t msg_len) {
    char err_path[PATH_MAX];
    snprintf(err_path, sizeof err_path, "%s/gnuplot.err", dir);
    int err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int fds[2];
    if (err_fd < 0 || pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(msg, msg_len, "cannot start gnuplot: %s", strerror(errno));
        if (err_fd >= 0) close(err_fd);
        return -1;
    }
    char *argv[] = {(char *)"gnuplot", NULL};
    pid_t pid = cmp_spawn(gnuplot, argv, fds[0], -1, err_fd, msg, msg_len);
    close(fds[0]);
    close(err_fd);
    if (pid < 0) {
        close(fds[1]);
        return -1;
    }
    /* the script is a few KiB, within a pipe's buffer; a gnuplot that exits early makes the
     * write fail (EPIPE: SIGPIPE is ignored by the caller), seen in its exit status below */
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fds[1], script + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(fds[1]);
    cmp_exit ex;
    cmp_wait(pid, PLOT_TIMEOUT_S, NULL, NULL, &ex);
    if (ex.exited && ex.code == 0) return 0;
    char how[128], prefix[192];
    cmp_exit_describe(&ex, PLOT_TIMEOUT_S, how, sizeof how);
    snprintf(prefix, sizeof prefix, "no picture: gnuplot failed (%s)", how);
    last_line(err_path, prefix, msg, msg_len);
    return -1;
}

static void remove_dir(const char *dir, int n_series) {
    char path[PATH_MAX];
    for (int k = 0; k < n_series; k++) {
        snprintf(path, sizeof path, "%s/s%d.dat", dir, k);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/gnuplot.err", dir);
    unlink(path);
    rmdir(dir);
}

int cmp_plot(const char *out_path, const char *subtitle, const cmp_series *series, int n_series,
             char *msg, size_t msg_len) {
    char gnuplot[PATH_MAX];
    if (cmp_find_program("gnuplot", gnuplot, sizeof gnuplot) != 0) {
        snprintf(msg, msg_len,
                 "no picture: gnuplot is not on PATH (Debian: apt-get install gnuplot-nox, "
                 "scripts/install-deps.sh)");
        return CMP_PLOT_NO_GNUPLOT;
    }
    if (!ends_with(out_path, ".svg") && !ends_with(out_path, ".png")) {
        snprintf(msg, msg_len, "--plot %s: the picture is .svg or .png", out_path);
        return CMP_PLOT_FAILED;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/kvstrata-plot.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        snprintf(msg, msg_len, "cannot make a temporary directory %s: %s", dir, strerror(errno));
        return CMP_PLOT_FAILED;
    }
    int rc = CMP_PLOT_FAILED;
    size_t len = 0;
    char *script = NULL;
    if (write_data(dir, series, n_series, msg, msg_len) == 0) {
        script = make_script(dir, out_path, subtitle, series, n_series, &len);
        if (!script)
            snprintf(msg, msg_len, "out of memory for the gnuplot script");
        else if (run_gnuplot(gnuplot, dir, script, len, msg, msg_len) == 0)
            rc = CMP_PLOT_OK;
    }
    free(script);
    remove_dir(dir, n_series);
    if (rc == CMP_PLOT_OK) {
        struct stat st;
        if (stat(out_path, &st) != 0 || st.st_size == 0) {
            snprintf(msg, msg_len, "gnuplot wrote no picture to %s", out_path);
            rc = CMP_PLOT_FAILED;
        }
    }
    return rc;
}
