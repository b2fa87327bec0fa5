/* report.c - the summary of a run (report.h). */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct ttft_summary {
    int n;
    double mean, p50, p99;
    uint64_t local_hit, ext_hit;
    uint64_t prompt; /* prompt tokens of the group's turns */
} ttft_summary;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double percentile(const double *v, int n, double p) {
    int rank = (int)ceil(p / 100.0 * n);
    if (rank < 1) rank = 1;
    return v[rank - 1];
}

enum { GROUP_LATER, GROUP_LATER_2K, GROUP_ALL, N_GROUPS };
static const char *const group_names[N_GROUPS] = {"turns after the first",
                                                  "  of them prompt >= 2048", "all turns"};
static const char *const group_keys[N_GROUPS] = {"later_turns", "later_turns_2k", "all_turns"};

static int in_group(const turn_result *r, int group) {
    switch (group) {
        case GROUP_LATER: return r->turn > 0;
        case GROUP_LATER_2K: return r->turn > 0 && r->prompt >= 2048;
        default: return 1;
    }
}

static ttft_summary summarize(const turn_result *turns, int n_turns, int group) {
    ttft_summary s = {0};
    double *v = malloc((size_t)(n_turns > 0 ? n_turns : 1) * sizeof *v);
    if (!v) return s;
    double sum = 0;
    for (int i = 0; i < n_turns; i++) {
        if (!in_group(&turns[i], group)) continue;
        v[s.n++] = turns[i].ttft_ms;
        sum += turns[i].ttft_ms;
        s.local_hit += turns[i].local_hit;
        s.ext_hit += turns[i].ext_hit;
        s.prompt += turns[i].prompt;
    }
    if (s.n) {
        qsort(v, (size_t)s.n, sizeof *v, cmp_double);
        s.mean = sum / s.n;
        s.p50 = percentile(v, s.n, 50);
        s.p99 = percentile(v, s.n, 99);
    }
    free(v);
    return s;
}

static void print_json(const options *o, const workload *w, const sizing *z, const mode_run *runs,
                       int n_runs, const reference *ref, ttft_summary s[2][N_GROUPS],
                       const report_ext *x);

/* The header and the TTFT table; the groups' summaries into s. */
static void print_ttft(const options *o, const workload *w, const sizing *z, mode_run *runs,
                       int n_runs, ttft_summary s[2][N_GROUPS]) {
    const model_config *mc = &o->model;
    printf("\nsummary: layout %s, dtype %s, model d%d l%d h%d kv%d%s, %d turns in %d sessions, "
           "%u pages (budget %u)\n",
           kv_layout_name((kv_layout)o->layout), kv_dtype_name((kvs_dtype)o->dtype), mc->dim,
           mc->n_layers, mc->n_heads, mc->is_mla ? 1 : mc->n_kv_heads, mc->is_mla ? " (MLA)" : "",
           w->n_turns, w->n_sessions, z->blocks, z->budget);
    printf("TTFT ms                      n   %-28s", n_runs > 1 ? "with connector" : runs[0].name);
    if (n_runs > 1) printf("%-28s speedup", "without connector");
    printf("\n                                 %-28s", "mean / p50 / p99");
    if (n_runs > 1) printf("%-28s mean / p50", "mean / p50 / p99");
    printf("\n");
    for (int g = 0; g < N_GROUPS; g++) {
        for (int k = 0; k < n_runs; k++) s[k][g] = summarize(runs[k].turns, w->n_turns, g);
        printf("%-25s %5d   ", group_names[g], s[0][g].n);
        for (int k = 0; k < n_runs; k++) {
            char cell[64];
            snprintf(cell, sizeof cell, "%.1f / %.1f / %.1f", s[k][g].mean, s[k][g].p50,
                     s[k][g].p99);
            printf("%-28s", cell);
        }
        if (n_runs > 1 && s[0][g].n && s[0][g].mean > 0 && s[0][g].p50 > 0)
            printf(" %.2fx / %.2fx", s[1][g].mean / s[0][g].mean, s[1][g].p50 / s[0][g].p50);
        printf("\n");
    }
}

/* A mode's hits, evictions and (with the connector) the connector's counters, on one line. */
static void print_mode(const mode_run *run, const ttft_summary *all, const report_ext *x) {
    printf("%s: hit tokens local %llu, connector %llu; engine evictions %llu", run->name,
           (unsigned long long)all->local_hit, (unsigned long long)all->ext_hit,
           (unsigned long long)run->cache.evictions);
    if (run->have_stats) {
        const kvs_stats *st = &run->stats;
        printf("; connector chunks loaded %llu (%.1f MiB, %.2f GB/s), saved %llu (%.1f MiB), "
               "skipped %llu, "
               "load errors %llu, events stored %llu removed %llu",
               (unsigned long long)st->chunks_loaded, (double)st->bytes_loaded / 1048576.0,
               st->load_gbps, (unsigned long long)st->chunks_saved,
               (double)st->bytes_saved / 1048576.0, (unsigned long long)st->saves_skipped,
               (unsigned long long)st->load_errors, (unsigned long long)run->events_stored,
               (unsigned long long)run->events_removed);
        if (st->async_loads_started)
            printf("; async loads %llu, reported %llu, failed %llu",
                   (unsigned long long)st->async_loads_started,
                   (unsigned long long)st->async_loads_done,
                   (unsigned long long)st->async_loads_failed);
        printf("; loaded per tier [");
        for (uint32_t t = 0; t < st->n_tiers && t < KVS_STATS_MAX_TIERS; t++)
            printf("%s%llu", t ? ", " : "", (unsigned long long)st->tier_chunks_loaded[t]);
        printf("]");
        if (x) x->mode_extra(run, 0, REPORT_BEFORE_DROPPED);
        if (run->conn.dropped_tokens)
            printf("; %llu loaded positions dropped (masked)",
                   (unsigned long long)run->conn.dropped_tokens);
        if (x) x->mode_extra(run, 0, REPORT_AFTER_DROPPED);
    }
    printf("\n");
}

void print_summary(const options *o, const workload *w, const sizing *z, mode_run *runs, int n_runs,
                   const reference *ref, const report_ext *x) {
    ttft_summary s[2][N_GROUPS];
    print_ttft(o, w, z, runs, n_runs, s);
    for (int k = 0; k < n_runs; k++) print_mode(&runs[k], &s[k][GROUP_ALL], x);
    if (x) x->after_modes(runs, n_runs);
    if (ref)
        printf("verify: %d turns with connector hits checked bit for bit, %d mismatches\n",
               ref->turns_checked - ref->lossy_turns, ref->mismatches);
    if (ref && ref->lossy_turns)
        printf("verify: %d turns with lossy hits: mean KL %.6f nats, top-1 agreement %.3f\n",
               ref->lossy_turns, ref->lossy_kl_sum / ref->lossy_turns,
               (double)ref->lossy_top1 / ref->lossy_turns);
    if (o->json) print_json(o, w, z, runs, n_runs, ref, s, x);
    fflush(stdout);
}

/* The counters a program comparing configurations wants besides those above (kvstrata compare): bytes
 * per tier, skipped saves, and the tiers' names (the index of the per-tier arrays). */
static void json_mode_more(const mode_run *run) {
    const kvs_stats *st = &run->stats;
    uint32_t n = st->n_tiers < KVS_STATS_MAX_TIERS ? st->n_tiers : KVS_STATS_MAX_TIERS;
    printf(
        ",\"tokens_loaded\":%llu,\"bytes_loaded\":%llu,\"bytes_saved\":%llu,\"saves_skipped\":%llu,"
        "\"lookup_hit_tokens\":%llu,\"lookup_miss_tokens\":%llu,\"integrity_rejects\":%llu",
        (unsigned long long)st->tokens_loaded, (unsigned long long)st->bytes_loaded,
        (unsigned long long)st->bytes_saved, (unsigned long long)st->saves_skipped,
        (unsigned long long)st->lookup_hit_tokens, (unsigned long long)st->lookup_miss_tokens,
        (unsigned long long)st->integrity_rejects);
    printf(",\"tier_bytes_loaded\":[");
    for (uint32_t t = 0; t < n; t++)
        printf("%s%llu", t ? "," : "", (unsigned long long)st->tier_bytes_loaded[t]);
    printf("],\"tier_names\":[");
    for (uint32_t t = 0; t < n; t++) {
        const char *name = run->conn.api ? run->conn.api->tier_name(run->conn.h, t) : NULL;
        printf("%s\"", t ? "," : "");
        /* names are the config's: printable, but quote what JSON needs quoted */
        for (const char *p = name ? name : "?"; *p; p++)
            if (*p == '"' || *p == '\\')
                printf("\\%c", *p);
            else if ((unsigned char)*p >= 0x20)
                putchar(*p);
        printf("\"");
    }
    printf("]");
}

/* A mode's part of the JSON summary: "connector":{...} or "no_connector":{...}. */
static void json_mode(const mode_run *run, const ttft_summary *s, const report_ext *x) {
    printf(",\"%s\":{", run->use_connector ? "connector" : "no_connector");
    for (int g = 0; g < N_GROUPS; g++)
        printf("%s\"%s\":{\"n\":%d,\"mean_ms\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
               "\"local_hit_tokens\":%llu,\"connector_hit_tokens\":%llu,\"prompt_tokens\":%llu}",
               g ? "," : "", group_keys[g], s[g].n, s[g].mean, s[g].p50, s[g].p99,
               (unsigned long long)s[g].local_hit, (unsigned long long)s[g].ext_hit,
               (unsigned long long)s[g].prompt);
    if (run->have_stats) {
        const kvs_stats *st = &run->stats;
        printf(",\"chunks_loaded\":%llu,\"chunks_saved\":%llu,\"load_errors\":%llu,\"async_"
               "loads\":%llu,\"async_loads_failed\":%llu",
               (unsigned long long)st->chunks_loaded, (unsigned long long)st->chunks_saved,
               (unsigned long long)st->load_errors, (unsigned long long)st->async_loads_started,
               (unsigned long long)st->async_loads_failed);
        printf(",\"tier_chunks_loaded\":[");
        for (uint32_t t = 0; t < st->n_tiers && t < KVS_STATS_MAX_TIERS; t++)
            printf("%s%llu", t ? "," : "", (unsigned long long)st->tier_chunks_loaded[t]);
        printf("]");
        json_mode_more(run);
        if (x) x->mode_extra(run, 1, REPORT_BEFORE_DROPPED);
        printf(",\"dropped_tokens\":%llu", (unsigned long long)run->conn.dropped_tokens);
        if (x) x->mode_extra(run, 1, REPORT_AFTER_DROPPED);
    }
    if (x) x->mode_extra(run, 1, REPORT_MODE_END);
    printf("}");
}

static void print_json(const options *o, const workload *w, const sizing *z, const mode_run *runs,
                       int n_runs, const reference *ref, ttft_summary s[2][N_GROUPS],
                       const report_ext *x) {
    printf("{\"layout\":\"%s\",\"dtype\":\"%s\",\"turns\":%d,\"sessions\":%d,\"blocks\":%u,\"block_"
           "budget\":%u",
           kv_layout_name((kv_layout)o->layout), kv_dtype_name((kvs_dtype)o->dtype), w->n_turns,
           w->n_sessions, z->blocks, z->budget);
    for (int k = 0; k < n_runs; k++) json_mode(&runs[k], s[k], x);
    if (n_runs > 1) {
        for (int g = 0; g < N_GROUPS; g++)
            printf(",\"speedup_%s_mean\":%.3f", group_keys[g],
                   s[0][g].mean > 0 ? s[1][g].mean / s[0][g].mean : 0.0);
    }
    if (ref)
        printf(",\"verify\":{\"turns_checked\":%d,\"mismatches\":%d,\"lossy_turns\":%d,"
               "\"lossy_kl\":%.6f,\"lossy_top1\":%.4f}",
               ref->turns_checked - ref->lossy_turns, ref->mismatches, ref->lossy_turns,
               ref->lossy_turns ? ref->lossy_kl_sum / ref->lossy_turns : 0.0,
               ref->lossy_turns ? (double)ref->lossy_top1 / ref->lossy_turns : 1.0);
    printf("}\n");
}
