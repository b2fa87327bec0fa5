/* compare_report.c - what kvstrata compare prints of its runs (compare_report.h). */
#include "compare_report.h"

#include <stdio.h>
#include <string.h>

const char *cmp_base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

/* ---- the figures ---- */

static const char *const group_keys[N_GROUPS] = {"later_turns", "all_turns"};
static const char *const group_names[N_GROUPS] = {"later turns", "all turns"};
static const char *const stat_keys[N_STATS] = {"mean_ms", "p50_ms", "p99_ms"};
static const char *const stat_names[N_STATS] = {"mean", "p50", "p99"};

void cmp_get_figures(const run *r, figures *f) {
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

void cmp_print_table(const compare_opts *o, const table *t, const char *engine) {
    int turns = 0;
    for (int k = 0; k < t->n_runs && !turns; k++)
        if (t->runs[k].ok) turns = (int)cj_num(cj_get(t->runs[k].summary, "turns"), 0);
    printf("kvstrata compare: %s", cmp_base_name(engine));
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
void cmp_print_verdict(const table *t) {
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
           fast->label, cmp_base_name(fast->config),
           g == G_LATER ? "turns after the first" : "all turns", mf, ms, slow->label,
           cmp_base_name(slow->config), ms / mf,
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

void cmp_print_json(const compare_opts *o, const table *t, const char *engine, const char *plot,
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
