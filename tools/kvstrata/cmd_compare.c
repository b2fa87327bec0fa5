/* cmd_compare.c - kvstrata compare A.yaml B.yaml: one workload of the mini engine through each
 * configuration in turn (and once without the connector), each run a child process with a
 * timeout; one table side by side and a picture of the TTFT distributions (docs/operations.md). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli_stored.h"
#include "common/progress.h"
#include "compare_child.h"
#include "compare_json.h"
#include "compare_plot.h"
#include "kvstrata_cmd.h"

#define MAX_WORKLOAD_ARGS 128
#define MAX_TIERS         16 /* KVS_STATS_MAX_TIERS */
#define N_RUNS_MAX        3

static const char *const prog = "kvstrata compare";

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: kvstrata compare A.yaml B.yaml [options] [-- ENGINE FLAGS...]\n"
        "\n"
        "Runs one workload of the mini engine (kvs-mini-engine) through configuration A, then B,\n"
        "then once without the connector, and prints TTFT, hit rates per tier, bytes read, saves\n"
        "and load errors side by side, with a picture of the TTFT distributions.\n"
        "\n"
        "  --workload \"FLAGS\"  the engine's workload flags, split at spaces, for example\n"
        "                      \"--sessions 4 --turns 3 --doc-tokens 1024 --seed 7\"\n"
        "                      (flags after -- are added to them; default: the engine's\n"
        "                      own workload, 8 sessions of 5 turns)\n"
        "  --trace FILE        the turns of a JSONL trace instead of the generator\n"
        "  --engine PATH       kvs-mini-engine (default: the one beside kvstrata)\n"
        "  --lib PATH          libkvstrata for the engine to load (default: the engine's)\n"
        "  --timeout S         seconds each run may take before it is stopped (600)\n"
        "  --no-baseline       no run without the connector (no third column)\n"
        "  --plot FILE         the picture, .svg or .png (default compare.svg)\n"
        "  --no-plot           no picture\n"
        "  --json              one JSON document on stdout instead of the table\n"
        "  --quiet             no progress lines on stderr\n"
        "\n"
        "Exit status: 0 every run gave figures, 1 a run failed (its column says why),\n"
        "2 usage or no engine to run.\n");
}

/* ---- the options ---- */

typedef struct compare_opts {
    const char *configs[2];
    const char *trace, *engine, *lib, *plot;
    double timeout_s;
    int json, quiet, no_plot, no_baseline;
    char *workload_buf;                /* --workload, split in place */
    const char *wl[MAX_WORKLOAD_ARGS]; /* the workload flags */
    int n_wl;
} compare_opts;

/* Flags compare sets itself on every run. */
static const char *const reserved[] = {
    "--config",       "--json",           "--quiet",  "--turns-out",
    "--no-connector", "--connector-only", "--verify", "--lib",
    "--trace",        "--help",           "-h"};

static int add_workload_arg(compare_opts *o, const char *a) {
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (strcmp(a, reserved[i]) == 0) {
            fprintf(stderr,
                    "%s: the workload may not hold %s: compare sets it on every run (--lib "
                    "and --trace are compare's own options; --verify is the engine's alone)\n",
                    prog, a);
            return -1;
        }
    if (o->n_wl >= MAX_WORKLOAD_ARGS) {
        fprintf(stderr, "%s: more than %d workload flags\n", prog, MAX_WORKLOAD_ARGS);
        return -1;
    }
    o->wl[o->n_wl++] = a;
    return 0;
}

/* The value of --name: "--name=V" or the next argument. NULL (after saying why) when missing. */
static const char *flag_value(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) == 0 && argv[*i][n] == '=') return argv[*i] + n + 1;
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value\n", prog, name);
        return NULL;
    }
    return argv[++*i];
}

static int is_flag(const char *arg, const char *name) {
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* 0, 1 for --help (printed), -1 for a usage error (said). */
static int parse_args(int argc, char **argv, compare_opts *o) {
    memset(o, 0, sizeof *o);
    o->timeout_s = 600;
    o->plot = "compare.svg";
    int n_configs = 0;
    const char *workload = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--") == 0) {
            for (i++; i < argc; i++)
                if (add_workload_arg(o, argv[i]) != 0) return -1;
        } else if (is_flag(a, "--workload")) {
            if (!(workload = flag_value(argc, argv, &i, "--workload"))) return -1;
        } else if (is_flag(a, "--trace")) {
            if (!(o->trace = flag_value(argc, argv, &i, "--trace"))) return -1;
        } else if (is_flag(a, "--engine")) {
            if (!(o->engine = flag_value(argc, argv, &i, "--engine"))) return -1;
        } else if (is_flag(a, "--lib")) {
            if (!(o->lib = flag_value(argc, argv, &i, "--lib"))) return -1;
        } else if (is_flag(a, "--plot")) {
            if (!(o->plot = flag_value(argc, argv, &i, "--plot"))) return -1;
        } else if (is_flag(a, "--timeout")) {
            if (!(v = flag_value(argc, argv, &i, "--timeout"))) return -1;
            char *end;
            errno = 0;
            o->timeout_s = strtod(v, &end);
            if (errno || *end || end == v || !(o->timeout_s > 0) || o->timeout_s > 86400) {
                fprintf(stderr, "%s: --timeout %s: seconds, more than 0 and at most 86400\n", prog,
                        v);
                return -1;
            }
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = 1;
        } else if (strcmp(a, "--no-plot") == 0) {
            o->no_plot = 1;
        } else if (strcmp(a, "--no-baseline") == 0) {
            o->no_baseline = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr,
                    "%s: unknown option %s (the engine's flags go in --workload or after --)\n",
                    prog, a);
            return -1;
        } else if (n_configs < 2) {
            o->configs[n_configs++] = a;
        } else {
            fprintf(stderr, "%s: two configurations, A and B: '%s' is a third\n", prog, a);
            return -1;
        }
    }
    if (n_configs != 2) {
        fprintf(stderr, "%s: two configurations to compare, A.yaml and B.yaml\n", prog);
        usage(stderr);
        return -1;
    }
    if (workload) {
        /* the --workload flags come first, those after -- after them */
        const char *after[MAX_WORKLOAD_ARGS];
        int n_after = o->n_wl;
        memcpy(after, o->wl, (size_t)n_after * sizeof *after);
        o->n_wl = 0;
        if (!(o->workload_buf = strdup(workload))) return -1;
        for (char *save = NULL, *t = strtok_r(o->workload_buf, " \t\n", &save); t;
             t = strtok_r(NULL, " \t\n", &save))
            if (add_workload_arg(o, t) != 0) return -1;
        for (int k = 0; k < n_after; k++)
            if (add_workload_arg(o, after[k]) != 0) return -1;
    }
    size_t pl = strlen(o->plot);
    if (!o->no_plot && (pl < 5 || (strcasecmp(o->plot + pl - 4, ".svg") != 0 &&
                                   strcasecmp(o->plot + pl - 4, ".png") != 0))) {
        fprintf(stderr, "%s: --plot %s: the picture is a .svg or a .png file\n", prog, o->plot);
        return -1;
    }
    if (o->trace && access(o->trace, R_OK) != 0) {
        fprintf(stderr, "%s: --trace %s: %s\n", prog, o->trace, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- one run ---- */

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

/* A file's whole content (NUL-terminated); NULL when it cannot be read. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t cap = 0, n = 0;
    char *buf = NULL;
    for (;;) {
        if (n + 1 >= cap) {
            size_t ncap = cap ? cap * 2 : 4096;
            char *g = realloc(buf, ncap);
            if (!g) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = g;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* The last line of text that holds anything but white space, trimmed, into out. */
static void last_line(const char *text, char *out, size_t cap) {
    out[0] = '\0';
    const char *line = text;
    while (line && *line) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        size_t lead = 0;
        while (lead < n && (line[lead] == ' ' || line[lead] == '\t')) lead++;
        size_t m = n;
        while (m > lead && (line[m - 1] == ' ' || line[m - 1] == '\t' || line[m - 1] == '\r')) m--;
        if (m > lead) snprintf(out, cap, "%.*s", (int)(m - lead), line + lead);
        line = nl ? nl + 1 : NULL;
    }
}

/* The engine's summary: its last line that starts with '{'. */
static cj_value *parse_summary(char *out_text, char *err, size_t err_len) {
    char *best = NULL;
    for (char *line = out_text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (line[0] == '{') best = line;
        line = nl ? nl + 1 : NULL;
    }
    if (!best) {
        snprintf(err, err_len, "the engine printed no JSON summary");
        return NULL;
    }
    size_t n = strcspn(best, "\n");
    return cj_parse(best, n, err, err_len);
}

/* Append x to *v (n items, room for *cap). 0, or -1 out of memory. */
static int push(double **v, size_t *n, size_t *cap, double x) {
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 64;
        double *g = realloc(*v, ncap * sizeof *g);
        if (!g) return -1;
        *v = g;
        *cap = ncap;
    }
    (*v)[(*n)++] = x;
    return 0;
}

/* The per-turn TTFT of the run's mode from its --turns-out file. */
static void read_turns(run *r, const char *path, const char *mode) {
    char *text = read_file(path, NULL);
    size_t cap = 0, cap_later = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        char err[128];
        cj_value *v = n ? cj_parse(line, n, err, sizeof err) : NULL;
        const char *m = cj_str(cj_get(v, "mode"));
        const cj_value *t = cj_get(v, "ttft_ms");
        int failed = 0;
        if (m && t && strcmp(m, mode) == 0) {
            failed = push(&r->ttft, &r->n_ttft, &cap, cj_num(t, 0)) != 0;
            if (!failed && cj_num(cj_get(v, "turn"), 0) > 0)
                failed = push(&r->later, &r->n_later, &cap_later, cj_num(t, 0)) != 0;
        }
        cj_free(v);
        if (failed) break;
        line = nl ? nl + 1 : NULL;
    }
    free(text);
}

/* Progress while a run goes on: the turns file's lines so far. */
typedef struct tick_ctx {
    kvs_progress *p;
    const char *turns_path;
    off_t offset;
    uint64_t lines;
} tick_ctx;

static void tick(void *arg) {
    tick_ctx *t = arg;
    int fd = open(t->turns_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[4096];
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof buf, t->offset);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; i++) t->lines += buf[i] == '\n';
        t->offset += n;
    }
    close(fd);
    kvs_progress_update(t->p, t->lines);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The file name of a path, for the legend and the progress line. */
static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

/* Run the engine once (config NULL: without the connector) and read what it reports. */
static void run_engine(const compare_opts *o, const char *engine, const char *dir, int k, run *r,
                       uint64_t expected_turns) {
    char out_path[PATH_MAX], err_path[PATH_MAX], turns_path[PATH_MAX];
    snprintf(out_path, sizeof out_path, "%s/run%d.out", dir, k);
    snprintf(err_path, sizeof err_path, "%s/run%d.err", dir, k);
    snprintf(turns_path, sizeof turns_path, "%s/run%d.turns.jsonl", dir, k);
    const char *argv[MAX_WORKLOAD_ARGS + 16];
    int n = 0;
    argv[n++] = "kvs-mini-engine";
    if (r->config) {
        argv[n++] = "--config";
        argv[n++] = r->config;
        argv[n++] = "--connector-only";
    } else {
        argv[n++] = "--no-connector";
    }
    argv[n++] = "--json";
    argv[n++] = "--quiet";
    argv[n++] = "--turns-out";
    argv[n++] = turns_path;
    if (o->lib) {
        argv[n++] = "--lib";
        argv[n++] = o->lib;
    }
    if (o->trace) {
        argv[n++] = "--trace";
        argv[n++] = o->trace;
    }
    for (int i = 0; i < o->n_wl; i++) argv[n++] = o->wl[i];
    argv[n] = NULL;

    int out_fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    char what[96];
    snprintf(what, sizeof what, "%s%s%s", r->label, r->config ? " " : "",
             r->config ? base_name(r->config) : "");
    kvs_progress p;
    kvs_progress_begin(&p, stderr, o->quiet ? KVS_PROGRESS_QUIET : 0, what, "turns", expected_turns,
                       0, 0);
    double t0 = now_s();
    pid_t pid = -1;
    if (out_fd < 0 || err_fd < 0)
        snprintf(r->why, sizeof r->why, "cannot write in %s: %s", dir, strerror(errno));
    else
        pid = cmp_spawn(engine, (char *const *)argv, -1, out_fd, err_fd, r->why, sizeof r->why);
    if (out_fd >= 0) close(out_fd);
    if (err_fd >= 0) close(err_fd);
    if (pid < 0) {
        kvs_progress_end(&p, "failed");
        return;
    }
    tick_ctx tc = {.p = &p, .turns_path = turns_path};
    cmp_exit ex;
    cmp_wait(pid, o->timeout_s, tick, &tc, &ex);
    tick(&tc);
    r->seconds = now_s() - t0;

    char *out_text = read_file(out_path, NULL), *err_text = read_file(err_path, NULL);
    char how[160], said[768] = "", perr[256] = "";
    cmp_exit_describe(&ex, o->timeout_s, how, sizeof how);
    if (err_text) last_line(err_text, said, sizeof said);
    const char *sentence = said;
    static const char engine_prefix[] = "kvs-mini-engine: ";
    if (strncmp(sentence, engine_prefix, sizeof engine_prefix - 1) == 0)
        sentence += sizeof engine_prefix - 1;
    if (ex.exited && ex.code == 0 && out_text) {
        r->summary = parse_summary(out_text, perr, sizeof perr);
        r->mode = cj_get(r->summary, r->config ? "connector" : "no_connector");
        if (r->summary && !r->mode) snprintf(perr, sizeof perr, "the summary has no figures");
        if (r->mode) r->ok = 1;
    }
    if (r->ok) {
        read_turns(r, turns_path, r->config ? "connector" : "no_connector");
    } else if (ex.exited && ex.code == 0) {
        snprintf(r->why, sizeof r->why, "%s", perr[0] ? perr : "the engine printed nothing");
    } else if (sentence[0]) {
        snprintf(r->why, sizeof r->why, "%s (%s)", sentence, how);
    } else {
        snprintf(r->why, sizeof r->why, "the engine ended with %s and said nothing", how);
    }
    free(out_text);
    free(err_text);
    unlink(out_path);
    unlink(err_path);
    unlink(turns_path);
    kvs_progress_end(&p, r->ok ? NULL : "failed");
}

/* ---- the figures ---- */

enum { G_LATER, G_ALL, N_GROUPS };
enum { S_MEAN, S_P50, S_P99, N_STATS };
static const char *const group_keys[N_GROUPS] = {"later_turns", "all_turns"};
static const char *const group_names[N_GROUPS] = {"later turns", "all turns"};
static const char *const stat_keys[N_STATS] = {"mean_ms", "p50_ms", "p99_ms"};
static const char *const stat_names[N_STATS] = {"mean", "p50", "p99"};

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

static void get_figures(const run *r, figures *f) {
    memset(f, 0, sizeof *f);
    const cj_value *m = r->mode;
    for (int g = 0; g < N_GROUPS; g++) {
        const cj_value *grp = cj_get(m, group_keys[g]);
        for (int s = 0; s < N_STATS; s++) f->ttft[g][s] = cj_num(cj_get(grp, stat_keys[s]), 0);
        f->n[g] = cj_num(cj_get(grp, "n"), 0);
    }
    const cj_value *all = cj_get(m, "all_turns");
    f->prompt = cj_num(cj_get(all, "prompt_tokens"), 0);
    f->ext_hit = cj_num(cj_get(all, "connector_hit_tokens"), 0);
    f->local_hit = cj_num(cj_get(all, "local_hit_tokens"), 0);
    if (!cj_get(m, "chunks_loaded")) return;
    f->connector = 1;
    f->chunks_loaded = cj_num(cj_get(m, "chunks_loaded"), 0);
    f->bytes_loaded = cj_num(cj_get(m, "bytes_loaded"), 0);
    f->chunks_saved = cj_num(cj_get(m, "chunks_saved"), 0);
    f->bytes_saved = cj_num(cj_get(m, "bytes_saved"), 0);
    f->saves_skipped = cj_num(cj_get(m, "saves_skipped"), 0);
    f->load_errors = cj_num(cj_get(m, "load_errors"), 0);
    const cj_value *names = cj_get(m, "tier_names");
    const cj_value *chunks = cj_get(m, "tier_chunks_loaded");
    const cj_value *bytes = cj_get(m, "tier_bytes_loaded");
    for (size_t t = 0; names && names->type == CJ_ARRAY && t < names->n && t < MAX_TIERS; t++) {
        f->tier_names[f->n_tiers] = cj_str(&names->items[t]) ? names->items[t].str : "?";
        f->tier_chunks[f->n_tiers] = cj_item_num(chunks, t, 0);
        f->tier_bytes[f->n_tiers] = cj_item_num(bytes, t, 0);
        f->n_tiers++;
    }
}

/* Tier `name`'s index in f, or -1. */
static int tier_index(const figures *f, const char *name) {
    for (int t = 0; t < f->n_tiers; t++)
        if (strcmp(f->tier_names[t], name) == 0) return t;
    return -1;
}

/* Of the prompt tokens, the share the connector loaded from tier t: its hit tokens split by the
 * chunks each tier served (chunks hold chunk_tokens each, so the split is by tokens too). */
static double tier_hit_rate(const figures *f, int t) {
    if (f->prompt <= 0 || f->chunks_loaded <= 0) return 0;
    return f->ext_hit * (f->tier_chunks[t] / f->chunks_loaded) / f->prompt;
}

/* The group a verdict is made on: later turns when there are any (where a cache can help). */
static int verdict_group(const figures *a, const figures *b) {
    return a->n[G_LATER] > 0 && b->n[G_LATER] > 0 ? G_LATER : G_ALL;
}

/* ---- the table ---- */

#define LABEL_W 36
#define COL_W   14
#define RATIO_W 9

typedef struct table {
    run *runs;
    figures *fig;
    int n_runs;
    const char **tiers; /* every tier name of A and B, A's first */
    int n_tiers;
} table;

static void fmt_bytes(char *buf, size_t len, double b) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && b >= 1024.0) {
        b /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%.0f B", b);
    else
        snprintf(buf, len, "%.1f %s", b, units[u]);
}

/* A row: label, one cell per run (from cell(k, buf)), and the B/A ratio when ratio is set. */
typedef void (*cell_fn)(const table *t, int k, int arg, char *buf, size_t len);

static void print_row(const table *t, const char *label, cell_fn cell, int arg, int ratio) {
    printf("%-*s", LABEL_W, label);
    for (int k = 0; k < t->n_runs; k++) {
        char buf[64] = "-";
        if (!t->runs[k].ok)
            snprintf(buf, sizeof buf, "failed");
        else
            cell(t, k, arg, buf, sizeof buf);
        printf(" %*s", COL_W, buf);
        if (k == 1) {
            char r[32] = "";
            if (ratio && t->runs[0].ok && t->runs[1].ok) {
                double a = t->fig[0].ttft[arg / N_STATS][arg % N_STATS];
                double b = t->fig[1].ttft[arg / N_STATS][arg % N_STATS];
                if (a > 0) snprintf(r, sizeof r, "%.2fx", b / a);
            }
            printf(" %*s", RATIO_W, r);
        }
    }
    printf("\n");
}

static void cell_ttft(const table *t, int k, int arg, char *buf, size_t len) {
    const figures *f = &t->fig[k];
    if (f->n[arg / N_STATS] > 0) snprintf(buf, len, "%.1f", f->ttft[arg / N_STATS][arg % N_STATS]);
}

static void cell_hit(const table *t, int k, int arg, char *buf, size_t len) {
    const figures *f = &t->fig[k];
    double hit = arg ? f->local_hit : f->ext_hit;
    if (f->prompt > 0) snprintf(buf, len, "%.1f%%", 100.0 * hit / f->prompt);
}

static void cell_tier_rate(const table *t, int k, int arg, char *buf, size_t len) {
    const figures *f = &t->fig[k];
    int i = f->connector ? tier_index(f, t->tiers[arg]) : -1;
    if (i >= 0) snprintf(buf, len, "%.1f%%", 100.0 * tier_hit_rate(f, i));
}

static void cell_tier_chunks(const table *t, int k, int arg, char *buf, size_t len) {
    const figures *f = &t->fig[k];
    int i = f->connector ? tier_index(f, t->tiers[arg]) : -1;
    if (i >= 0) snprintf(buf, len, "%.0f", f->tier_chunks[i]);
}

static void cell_tier_bytes(const table *t, int k, int arg, char *buf, size_t len) {
    const figures *f = &t->fig[k];
    int i = f->connector ? tier_index(f, t->tiers[arg]) : -1;
    if (i >= 0) fmt_bytes(buf, len, f->tier_bytes[i]);
}

enum { C_SAVED, C_BYTES_SAVED, C_SKIPPED, C_ERRORS };
static void cell_counter(const table *t, int k, int arg, char *buf, size_t len) {
    const figures *f = &t->fig[k];
    if (!f->connector) return;
    switch (arg) {
        case C_SAVED: snprintf(buf, len, "%.0f", f->chunks_saved); break;
        case C_BYTES_SAVED: fmt_bytes(buf, len, f->bytes_saved); break;
        case C_SKIPPED: snprintf(buf, len, "%.0f", f->saves_skipped); break;
        default: snprintf(buf, len, "%.0f", f->load_errors); break;
    }
}

static void cell_stored(const table *t, int k, int arg, char *buf, size_t len) {
    (void)arg;
    double n = t->runs[k].stored_before;
    if (n < 0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.0f", n);
}

static void print_table(const compare_opts *o, const table *t, const char *engine) {
    int turns = 0;
    for (int k = 0; k < t->n_runs && !turns; k++)
        if (t->runs[k].ok) turns = (int)cj_num(cj_get(t->runs[k].summary, "turns"), 0);
    printf("kvstrata compare: %s", base_name(engine));
    if (o->trace) printf(" --trace %s", o->trace);
    for (int i = 0; i < o->n_wl; i++) printf(" %s", o->wl[i]);
    if (turns) printf(" (%d turns a run)", turns);
    printf("\n");
    for (int k = 0; k < t->n_runs; k++)
        printf("  %-13s %s\n", t->runs[k].label,
               t->runs[k].config ? t->runs[k].config : "the same engine without the library");
    printf("\n%-*s", LABEL_W, "");
    for (int k = 0; k < t->n_runs; k++) {
        printf(" %*s", COL_W, t->runs[k].label);
        if (k == 1) printf(" %*s", RATIO_W, "B/A");
    }
    printf("\n");
    for (int g = 0; g < N_GROUPS; g++)
        for (int s = 0; s < N_STATS; s++) {
            char label[64];
            snprintf(label, sizeof label, "TTFT %s, %s (ms)", group_names[g], stat_names[s]);
            print_row(t, label, cell_ttft, g * N_STATS + s, 1);
        }
    print_row(t, "connector hits / prompt tokens", cell_hit, 0, 0);
    print_row(t, "engine prefix cache / prompt tokens", cell_hit, 1, 0);
    for (int i = 0; i < t->n_tiers; i++) {
        char label[96];
        snprintf(label, sizeof label, "  from tier %.20s", t->tiers[i]);
        print_row(t, label, cell_tier_rate, i, 0);
    }
    for (int i = 0; i < t->n_tiers; i++) {
        char label[96];
        snprintf(label, sizeof label, "chunks loaded from %.17s", t->tiers[i]);
        print_row(t, label, cell_tier_chunks, i, 0);
    }
    for (int i = 0; i < t->n_tiers; i++) {
        char label[96];
        snprintf(label, sizeof label, "bytes read from %.20s", t->tiers[i]);
        print_row(t, label, cell_tier_bytes, i, 0);
    }
    print_row(t, "chunks saved", cell_counter, C_SAVED, 0);
    print_row(t, "bytes saved", cell_counter, C_BYTES_SAVED, 0);
    print_row(t, "saves skipped", cell_counter, C_SKIPPED, 0);
    print_row(t, "load errors", cell_counter, C_ERRORS, 0);
    print_row(t, "objects stored before the run", cell_stored, 0, 0);
    printf("\n");
}

/* The one sentence under the table: which configuration is faster. */
static void print_verdict(const table *t) {
    const run *a = &t->runs[0], *b = &t->runs[1];
    if (!a->ok || !b->ok) {
        printf("No verdict: %s did not run to the end.\n", !a->ok && !b->ok ? "neither A nor B"
                                                           : !a->ok         ? "A"
                                                                            : "B");
        return;
    }
    const figures *fa = &t->fig[0], *fb = &t->fig[1];
    int g = verdict_group(fa, fb);
    double ma = fa->ttft[g][S_MEAN], mb = fb->ttft[g][S_MEAN];
    if (!(ma > 0) || !(mb > 0)) {
        printf("No verdict: a mean TTFT of zero.\n");
        return;
    }
    int a_faster = ma <= mb;
    const run *fast = a_faster ? a : b, *slow = a_faster ? b : a;
    double mf = a_faster ? ma : mb, ms = a_faster ? mb : ma;
    printf("%s (%s) is faster: mean TTFT of %s %.1f ms against %.1f ms for %s (%s), %.2fx%s.\n",
           fast->label, base_name(fast->config),
           g == G_LATER ? "turns after the first" : "all turns", mf, ms, slow->label,
           base_name(slow->config), ms / mf,
           ms / mf < 1.05 ? ", within 5%: run again before trusting it" : "");
    for (int k = 0; k < 2; k++)
        if (t->runs[k].stored_before > 0)
            printf("Warm start: %s began with %.0f objects already stored (%s), a previous run's "
                   "saves among them: its hits are not a cold start's. Give it empty SSD "
                   "directories (and another shm_name) to compare from cold.\n",
                   t->runs[k].label, t->runs[k].stored_before, t->runs[k].stored_note);
}

/* ---- --json ---- */

static void json_string(const char *s) {
    if (!s) {
        printf("null");
        return;
    }
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static void json_run(const run *r, const figures *f) {
    printf("{\"label\":");
    json_string(r->label);
    printf(",\"config\":");
    json_string(r->config);
    printf(",\"ok\":%s,\"error\":", r->ok ? "true" : "false");
    json_string(r->ok ? NULL : r->why);
    printf(",\"seconds\":%.3f", r->seconds);
    if (r->stored_before >= 0) printf(",\"stored_before\":%.0f", r->stored_before);
    if (!r->ok) {
        printf("}");
        return;
    }
    for (int g = 0; g < N_GROUPS; g++) {
        printf(",\"%s\":{\"n\":%.0f", group_keys[g], f->n[g]);
        for (int s = 0; s < N_STATS; s++) printf(",\"%s\":%.3f", stat_keys[s], f->ttft[g][s]);
        printf("}");
    }
    printf(",\"prompt_tokens\":%.0f,\"connector_hit_tokens\":%.0f,\"local_hit_tokens\":%.0f,"
           "\"hit_rate\":%.6f,\"local_hit_rate\":%.6f",
           f->prompt, f->ext_hit, f->local_hit, f->prompt > 0 ? f->ext_hit / f->prompt : 0.0,
           f->prompt > 0 ? f->local_hit / f->prompt : 0.0);
    if (f->connector) {
        printf(
            ",\"chunks_loaded\":%.0f,\"bytes_loaded\":%.0f,\"chunks_saved\":%.0f,\"bytes_saved\":"
            "%.0f,\"saves_skipped\":%.0f,\"load_errors\":%.0f,\"tiers\":[",
            f->chunks_loaded, f->bytes_loaded, f->chunks_saved, f->bytes_saved, f->saves_skipped,
            f->load_errors);
        for (int t = 0; t < f->n_tiers; t++) {
            printf("%s{\"name\":", t ? "," : "");
            json_string(f->tier_names[t]);
            printf(",\"chunks_loaded\":%.0f,\"bytes_loaded\":%.0f,\"hit_rate\":%.6f}",
                   f->tier_chunks[t], f->tier_bytes[t], tier_hit_rate(f, t));
        }
        printf("]");
    } else {
        printf(",\"chunks_loaded\":null,\"bytes_loaded\":null,\"chunks_saved\":null,\"bytes_"
               "saved\":null,\"saves_skipped\":null,\"load_errors\":null,\"tiers\":[]");
    }
    printf(",\"ttft_ms\":[");
    for (size_t i = 0; i < r->n_ttft; i++) printf("%s%.3f", i ? "," : "", r->ttft[i]);
    printf("],\"later_ttft_ms\":[");
    for (size_t i = 0; i < r->n_later; i++) printf("%s%.3f", i ? "," : "", r->later[i]);
    printf("]}");
}

static void print_json(const compare_opts *o, const table *t, const char *engine, const char *plot,
                       const char *plot_note) {
    printf("{\"engine\":");
    json_string(engine);
    printf(",\"trace\":");
    json_string(o->trace);
    printf(",\"workload\":[");
    for (int i = 0; i < o->n_wl; i++) {
        if (i) putchar(',');
        json_string(o->wl[i]);
    }
    printf("],\"runs\":[");
    for (int k = 0; k < t->n_runs; k++) {
        if (k) putchar(',');
        json_run(&t->runs[k], &t->fig[k]);
    }
    printf("],\"b_over_a\":");
    if (t->runs[0].ok && t->runs[1].ok) {
        printf("{");
        for (int g = 0, first = 1; g < N_GROUPS; g++)
            for (int s = 0; s < N_STATS; s++) {
                double a = t->fig[0].ttft[g][s], b = t->fig[1].ttft[g][s];
                printf("%s\"%s_%s\":", first ? "" : ",", group_keys[g], stat_names[s]);
                if (a > 0)
                    printf("%.4f", b / a);
                else
                    printf("null");
                first = 0;
            }
        int g = verdict_group(&t->fig[0], &t->fig[1]);
        double ma = t->fig[0].ttft[g][S_MEAN], mb = t->fig[1].ttft[g][S_MEAN];
        printf("},\"faster\":\"%s\",\"verdict_group\":\"%s\"", ma <= mb ? "A" : "B", group_keys[g]);
    } else {
        printf("null,\"faster\":null,\"verdict_group\":null");
    }
    printf(",\"plot\":");
    json_string(plot);
    printf(",\"plot_note\":");
    json_string(plot_note);
    printf("}\n");
}

/* ---- the command ---- */

/* The turns a run will serve, for the progress line: the trace's lines, or sessions x turns. */
static uint64_t expected_turns(const compare_opts *o) {
    if (o->trace) {
        char *text = read_file(o->trace, NULL);
        uint64_t n = 0;
        for (char *line = text; line && *line;) {
            char *nl = strchr(line, '\n');
            size_t len = nl ? (size_t)(nl - line) : strlen(line);
            if (strspn(line, " \t\r") < len) n++;
            line = nl ? nl + 1 : NULL;
        }
        free(text);
        return n;
    }
    long sessions = 8, turns = 5;
    for (int i = 0; i + 1 < o->n_wl; i++) {
        if (strcmp(o->wl[i], "--sessions") == 0) sessions = strtol(o->wl[i + 1], NULL, 10);
        if (strcmp(o->wl[i], "--turns") == 0) turns = strtol(o->wl[i + 1], NULL, 10);
    }
    return sessions > 0 && turns > 0 ? (uint64_t)sessions * (uint64_t)turns : 0;
}

static int find_engine(const compare_opts *o, char *buf, size_t len) {
    if (o->engine) {
        snprintf(buf, len, "%s", o->engine);
        if (access(buf, X_OK) == 0) return 0;
        fprintf(stderr, "%s: --engine %s: %s\n", prog, o->engine, strerror(errno));
        return -1;
    }
    const char *dir = kvs_cmd_exe_dir();
    snprintf(buf, len, "%s/kvs-mini-engine", dir && *dir ? dir : ".");
    if (access(buf, X_OK) == 0) return 0;
    fprintf(stderr,
            "%s: no kvs-mini-engine beside kvstrata (%s): build it (target kvs-mini-engine) or "
            "pass --engine PATH\n",
            prog, buf);
    return -1;
}

int kvs_cmd_compare(int argc, char **argv) {
    compare_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc != 0) {
        free(o.workload_buf);
        return prc > 0 ? 0 : 2;
    }
    char engine[PATH_MAX];
    if (find_engine(&o, engine, sizeof engine) != 0) {
        free(o.workload_buf);
        return 2;
    }
    /* a gnuplot that exits before reading its script must not end this program */
    signal(SIGPIPE, SIG_IGN);
    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/kvstrata-compare.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "%s: cannot make a temporary directory %s: %s\n", prog, dir,
                strerror(errno));
        free(o.workload_buf);
        return 1;
    }
    run runs[N_RUNS_MAX] = {{.label = "A", .config = o.configs[0]},
                            {.label = "B", .config = o.configs[1]},
                            {.label = "no connector", .config = NULL}};
    int n_runs = o.no_baseline ? 2 : 3;
    uint64_t expect = expected_turns(&o);
    for (int k = 0; k < n_runs; k++) {
        uint64_t stored = 0;
        runs[k].stored_before = -1;
        if (runs[k].config && cli_stored_objects(runs[k].config, &stored, runs[k].stored_note,
                                                 sizeof runs[k].stored_note) == 0)
            runs[k].stored_before = (double)stored;
        run_engine(&o, engine, dir, k, &runs[k], expect);
        if (runs[k].ok) expect = (uint64_t)cj_num(cj_get(runs[k].summary, "turns"), (double)expect);
    }
    rmdir(dir);

    figures fig[N_RUNS_MAX];
    const char *tiers[2 * MAX_TIERS];
    table t = {.runs = runs, .fig = fig, .n_runs = n_runs, .tiers = tiers};
    for (int k = 0; k < n_runs; k++) {
        if (runs[k].ok)
            get_figures(&runs[k], &fig[k]);
        else
            memset(&fig[k], 0, sizeof fig[k]);
        for (int i = 0; k < 2 && i < fig[k].n_tiers; i++) {
            int seen = 0;
            for (int j = 0; j < t.n_tiers; j++) seen |= strcmp(tiers[j], fig[k].tier_names[i]) == 0;
            if (!seen) tiers[t.n_tiers++] = fig[k].tier_names[i];
        }
    }

    int n_ok = 0, rc = 0;
    for (int k = 0; k < n_runs; k++) {
        n_ok += runs[k].ok;
        if (!runs[k].ok) rc = 1;
    }
    /* the picture first (its sentence goes under the table) */
    char plot_note[1024] = "";
    const char *plot = NULL;
    if (!o.no_plot && n_ok > 0) {
        cmp_series series[N_RUNS_MAX];
        char titles[N_RUNS_MAX][PATH_MAX + 16];
        int n_series = 0, turns = 0, later = 1;
        for (int k = 0; k < n_runs; k++) later &= !runs[k].ok || runs[k].n_later > 0;
        for (int k = 0; k < n_runs; k++) {
            if (!runs[k].ok) continue;
            if (!turns) turns = (int)(later ? runs[k].n_later : runs[k].n_ttft);
            if (runs[k].config)
                snprintf(titles[n_series], sizeof titles[n_series], "%s: %s", runs[k].label,
                         base_name(runs[k].config));
            else
                snprintf(titles[n_series], sizeof titles[n_series], "%s", runs[k].label);
            series[n_series] = later
                                   ? (cmp_series){titles[n_series], runs[k].later, runs[k].n_later}
                                   : (cmp_series){titles[n_series], runs[k].ttft, runs[k].n_ttft};
            n_series++;
        }
        char subtitle[64];
        snprintf(subtitle, sizeof subtitle, "%d %s per run", turns,
                 later ? "turns after each session's first" : "turns");
        int prc2 = cmp_plot(o.plot, subtitle, series, n_series, plot_note, sizeof plot_note);
        if (prc2 == CMP_PLOT_OK)
            plot = o.plot;
        else if (prc2 == CMP_PLOT_FAILED)
            rc = 1;
    } else if (!o.no_plot) {
        snprintf(plot_note, sizeof plot_note, "no picture: no run gave figures");
    }

    if (o.json) {
        print_json(&o, &t, engine, plot, plot_note[0] ? plot_note : NULL);
        if (plot_note[0]) fprintf(stderr, "%s: %s\n", prog, plot_note);
    } else {
        print_table(&o, &t, engine);
        print_verdict(&t);
        for (int k = 0; k < n_runs; k++)
            if (!runs[k].ok)
                printf("%s (%s) failed: %s\n", runs[k].label,
                       runs[k].config ? runs[k].config : "no connector", runs[k].why);
        if (plot)
            printf("picture: %s (empirical CDF of TTFT per turn)\n", plot);
        else if (plot_note[0])
            printf("%s\n", plot_note);
    }
    for (int k = 0; k < n_runs; k++) {
        cj_free(runs[k].summary);
        free(runs[k].ttft);
        free(runs[k].later);
    }
    free(o.workload_buf);
    return rc;
}
