/* report.c - the summary of a run (report.h). */
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct ttft_summary {
    int n;
    double mean, p50, p99;
    uint64_t local_hit, ext_hit;
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
                       int n_runs, const reference *ref, ttft_summary s[2][N_GROUPS]);

/* The decoding requests' step times (batch.c): decode-only steps with an asynchronous load in flight
 * and with no restore in flight, and the two matched in time and batch (contexts grow as requests
 * decode and steps cost more with more requests decoding, so unlike steps are not compared): the
 * steps with a load in flight of every window of MATCH_WINDOW_MS and number of requests decoding that
 * also has steps with none, against the mean of those in the same window and batch, weighed as the
 * former; steps that restored synchronously. */
#define MATCH_WINDOW_MS 1000.0

typedef struct step_summary {
    uint64_t loading, idle, restore;
    double loading_ms, idle_ms, restore_ms;     /* means */
    double matched_loading_ms, matched_idle_ms; /* means over the matched windows */
    double matched;                             /* their ratio; 0: no window had both kinds */
    uint64_t matched_steps;                     /* steps with a load in flight in those windows */
} step_summary;

static step_summary summarize_steps(const batch_stats *b) {
    step_summary s = {0};
    double lsum = 0, isum = 0, matched_l = 0, matched_i = 0;
    for (uint64_t i = 0; i < b->n_decode; i++) {
        if (b->decode[i].loading)
            s.loading++, lsum += b->decode[i].step_ms;
        else
            s.idle++, isum += b->decode[i].step_ms;
    }
    s.loading_ms = s.loading ? lsum / (double)s.loading : 0;
    s.idle_ms = s.idle ? isum / (double)s.idle : 0;
    s.restore = b->restore_steps;
    s.restore_ms = b->restore_steps ? b->restore_ms / (double)b->restore_steps : 0;
    for (uint64_t i = 0, j; i < b->n_decode; i = j) { /* recorded in time order */
        double end = b->decode[i].at_ms + MATCH_WINDOW_MS;
        for (j = i; j < b->n_decode && b->decode[j].at_ms < end;) j++;
        for (uint32_t k = 1; k <= BATCH_MAX; k++) {
            double l = 0, d = 0;
            uint64_t nl = 0, nd = 0;
            for (uint64_t x = i; x < j; x++) {
                if (b->decode[x].n_decode != k) continue;
                if (b->decode[x].loading)
                    nl++, l += b->decode[x].step_ms;
                else
                    nd++, d += b->decode[x].step_ms;
            }
            if (!nl || !nd || d <= 0) continue;
            matched_l += l;
            matched_i += d / (double)nd * (double)nl;
            s.matched_steps += nl;
        }
    }
    if (s.matched_steps) {
        s.matched_loading_ms = matched_l / (double)s.matched_steps;
        s.matched_idle_ms = matched_i / (double)s.matched_steps;
        s.matched = matched_l / matched_i;
    }
    return s;
}

void print_summary(const options *o, const workload *w, const sizing *z, mode_run *runs, int n_runs,
                   const reference *ref) {
    const model_config *mc = &o->model;
    printf("\nsummary: layout %s, dtype %s, model d%d l%d h%d kv%d%s, %d turns in %d sessions, "
           "%u pages (budget %u)\n",
           kv_layout_name(o->layout), kv_dtype_name(o->dtype), mc->dim, mc->n_layers, mc->n_heads,
           mc->is_mla ? 1 : mc->n_kv_heads, mc->is_mla ? " (MLA)" : "", w->n_turns, w->n_sessions,
           z->blocks, z->budget);
    printf("TTFT ms                      n   %-28s", n_runs > 1 ? "with connector" : runs[0].name);
    if (n_runs > 1) printf("%-28s speedup", "without connector");
    printf("\n                                 %-28s", "mean / p50 / p99");
    if (n_runs > 1) printf("%-28s mean / p50", "mean / p50 / p99");
    printf("\n");
    ttft_summary s[2][N_GROUPS];
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
    for (int k = 0; k < n_runs; k++) {
        printf("%s: hit tokens local %llu, connector %llu; engine evictions %llu", runs[k].name,
               (unsigned long long)s[k][GROUP_ALL].local_hit,
               (unsigned long long)s[k][GROUP_ALL].ext_hit,
               (unsigned long long)runs[k].cache.evictions);
        if (runs[k].have_stats) {
            const kvs_stats *st = &runs[k].stats;
            printf("; connector chunks loaded %llu (%.1f MiB, %.2f GB/s), saved %llu (%.1f MiB), "
                   "skipped %llu, "
                   "load errors %llu, events stored %llu removed %llu",
                   (unsigned long long)st->chunks_loaded, (double)st->bytes_loaded / 1048576.0,
                   st->load_gbps, (unsigned long long)st->chunks_saved,
                   (double)st->bytes_saved / 1048576.0, (unsigned long long)st->saves_skipped,
                   (unsigned long long)st->load_errors, (unsigned long long)runs[k].events_stored,
                   (unsigned long long)runs[k].events_removed);
            if (st->async_loads_started)
                printf("; async loads %llu, reported %llu, failed %llu",
                       (unsigned long long)st->async_loads_started,
                       (unsigned long long)st->async_loads_done,
                       (unsigned long long)st->async_loads_failed);
            printf("; loaded per tier [");
            for (uint32_t t = 0; t < st->n_tiers && t < KVS_STATS_MAX_TIERS; t++)
                printf("%s%llu", t ? ", " : "", (unsigned long long)st->tier_chunks_loaded[t]);
            printf("]");
            if (runs[k].conn.plans)
                printf("; restore plans followed: token %llu, layer %llu, stage %llu, recompute "
                       "%llu (%llu tokens "
                       "recomputed)",
                       (unsigned long long)runs[k].conn.plans_token,
                       (unsigned long long)runs[k].conn.plans_layer,
                       (unsigned long long)runs[k].conn.plans_stage,
                       (unsigned long long)runs[k].conn.plans_recompute,
                       (unsigned long long)runs[k].conn.plan_recomputed_tokens);
            if (runs[k].conn.dropped_tokens)
                printf("; %llu loaded positions dropped (masked)",
                       (unsigned long long)runs[k].conn.dropped_tokens);
            if (runs[k].conn.plans && o->stages > 1)
                printf("; stages restored from their boundary %llu",
                       (unsigned long long)runs[k].conn.stage_boundary_restores);
        }
        printf("\n");
    }
    for (int k = 0; k < n_runs && o->continuous; k++) {
        step_summary d = summarize_steps(&runs[k].flight.stats);
        printf("%s: decode-only steps: %llu with an async load in flight (mean %.3f ms), %llu with "
               "no restore in flight (mean %.3f ms); matched in time and batch: %.3f ms against "
               "%.3f ms, %.3fx (over %llu); %llu steps restored synchronously while others "
               "decoded (mean %.3f ms)\n",
               runs[k].name, (unsigned long long)d.loading, d.loading_ms,
               (unsigned long long)d.idle, d.idle_ms, d.matched_loading_ms, d.matched_idle_ms,
               d.matched, (unsigned long long)d.matched_steps, (unsigned long long)d.restore,
               d.restore_ms);
    }
    if (ref)
        printf("verify: %d turns with connector hits checked bit for bit, %d mismatches\n",
               ref->turns_checked - ref->lossy_turns, ref->mismatches);
    if (ref && ref->lossy_turns)
        printf("verify: %d turns with lossy hits: mean KL %.6f nats, top-1 agreement %.3f\n",
               ref->lossy_turns, ref->lossy_kl_sum / ref->lossy_turns,
               (double)ref->lossy_top1 / ref->lossy_turns);
    if (o->json) print_json(o, w, z, runs, n_runs, ref, s);
    fflush(stdout);
}

static void print_json(const options *o, const workload *w, const sizing *z, const mode_run *runs,
                       int n_runs, const reference *ref, ttft_summary s[2][N_GROUPS]) {
    printf("{\"layout\":\"%s\",\"dtype\":\"%s\",\"turns\":%d,\"sessions\":%d,\"blocks\":%u,\"block_"
           "budget\":%u",
           kv_layout_name(o->layout), kv_dtype_name(o->dtype), w->n_turns, w->n_sessions, z->blocks,
           z->budget);
    for (int k = 0; k < n_runs; k++) {
        printf(",\"%s\":{", runs[k].use_connector ? "connector" : "no_connector");
        for (int g = 0; g < N_GROUPS; g++)
            printf("%s\"%s\":{\"n\":%d,\"mean_ms\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
                   "\"local_hit_tokens\":%llu,\"connector_hit_tokens\":%llu}",
                   g ? "," : "", group_keys[g], s[k][g].n, s[k][g].mean, s[k][g].p50, s[k][g].p99,
                   (unsigned long long)s[k][g].local_hit, (unsigned long long)s[k][g].ext_hit);
        if (runs[k].have_stats)
            printf(",\"chunks_loaded\":%llu,\"chunks_saved\":%llu,\"load_errors\":%llu,\"async_"
                   "loads\":%llu,\"async_loads_failed\":%llu",
                   (unsigned long long)runs[k].stats.chunks_loaded,
                   (unsigned long long)runs[k].stats.chunks_saved,
                   (unsigned long long)runs[k].stats.load_errors,
                   (unsigned long long)runs[k].stats.async_loads_started,
                   (unsigned long long)runs[k].stats.async_loads_failed);
        if (runs[k].have_stats) {
            printf(",\"tier_chunks_loaded\":[");
            for (uint32_t t = 0; t < runs[k].stats.n_tiers && t < KVS_STATS_MAX_TIERS; t++)
                printf("%s%llu", t ? "," : "",
                       (unsigned long long)runs[k].stats.tier_chunks_loaded[t]);
            printf("]");
            if (runs[k].conn.plans)
                printf(",\"plans_token\":%llu,\"plans_layer\":%llu,\"plans_stage\":%llu,\"plans_"
                       "recompute\":%llu,"
                       "\"plan_recomputed_tokens\":%llu,\"stage_boundary_restores\":%llu",
                       (unsigned long long)runs[k].conn.plans_token,
                       (unsigned long long)runs[k].conn.plans_layer,
                       (unsigned long long)runs[k].conn.plans_stage,
                       (unsigned long long)runs[k].conn.plans_recompute,
                       (unsigned long long)runs[k].conn.plan_recomputed_tokens,
                       (unsigned long long)runs[k].conn.stage_boundary_restores);
            printf(",\"dropped_tokens\":%llu", (unsigned long long)runs[k].conn.dropped_tokens);
        }
        if (o->continuous) {
            step_summary d = summarize_steps(&runs[k].flight.stats);
            printf(
                ",\"decode_steps\":{\"loading\":{\"n\":%llu,\"mean_ms\":%.4f},\"idle\":{\"n\":%llu,"
                "\"mean_ms\":%.4f},\"matched\":{\"loading_mean_ms\":%.4f,\"idle_mean_ms\":%.4f,"
                "\"ratio\":%.4f,\"steps\":%llu},\"restore\":{\"n\":%llu,\"mean_ms\":%.4f}}",
                (unsigned long long)d.loading, d.loading_ms, (unsigned long long)d.idle, d.idle_ms,
                d.matched_loading_ms, d.matched_idle_ms, d.matched,
                (unsigned long long)d.matched_steps, (unsigned long long)d.restore, d.restore_ms);
        }
        printf("}");
    }
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
