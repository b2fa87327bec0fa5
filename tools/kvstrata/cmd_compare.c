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
#include "compare_report.h"
#include "kvstrata_cmd.h"

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
             r->config ? cmp_base_name(r->config) : "");
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
            cmp_get_figures(&runs[k], &fig[k]);
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
                         cmp_base_name(runs[k].config));
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
        cmp_print_json(&o, &t, engine, plot, plot_note[0] ? plot_note : NULL);
        if (plot_note[0]) fprintf(stderr, "%s: %s\n", prog, plot_note);
    } else {
        cmp_print_table(&o, &t, engine);
        cmp_print_verdict(&t);
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
