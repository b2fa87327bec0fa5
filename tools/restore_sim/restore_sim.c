/* restore_sim.c - kvs-restore-sim: restore policies on the CacheFlow cost model (docs/cacheflow.md).
 *
 * Draws closed batches (every request arrives at 0) of cached-prefix lengths (log-normal, median
 * --median tokens, clipped to [--min, --max]) restored from one tier of --gbps, and reports per
 * policy the mean, P50 and P99 of TTFT = restore finish + a forward over --new-tokens new tokens:
 *   recompute   every chunk recomputed (batched forwards)
 *   load        every chunk loaded, requests served first come first served
 *   cake        each request's own two-pointer split (planned alone), then run as a batch
 *   cf-lrf, cf-srf, cf-mean   the batch scheduler (cf_plan_batch) with each priority rule
 * Ratios are to the better (lower mean) of recompute and load in the same run.
 *
 * With --rate R requests arrive as a Poisson process instead: whenever the engine is free it takes
 * the requests that have arrived (at most --batch) as the next batch, and TTFT counts from each
 * request's arrival. --gbps takes a comma-separated list (up to 4 tiers); each request's prefix is on
 * one of them, drawn uniformly.
 *
 * The default model is an 8B-class model on one H100-like GPU (docs/cacheflow.md, "Simulator"):
 * assumptions, not measurements. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/cacheflow/cacheflow.h"

enum { P_RECOMPUTE, P_LOAD, P_CAKE, P_CF_LRF, P_CF_SRF, P_CF_MEAN, P_COUNT };
static const char *const NAMES[P_COUNT] = {"recompute", "load",   "cake",
                                           "cf-lrf",    "cf-srf", "cf-mean"};

#define MAX_TIERS 4

typedef struct opts {
    uint32_t batch, batches, median, min_tokens, max_tokens, new_tokens;
    double gbps[MAX_TIERS], sigma, rate;
    uint32_t n_tiers;
    uint64_t seed;
    int layer_mode; /* 1: cf policies may pick layer mode per request */
} opts;

typedef struct model_set {
    cf_params p;
    cf_compute m;
    cf_channel c[MAX_TIERS];
    uint32_t n_channels;
    void *scratch;
    cf_plan *plans;
    uint32_t *split, *order;
} model_set;

/* Restore finish of each request of one batch (all present at 0) under policy k. */
static void plan_policy(model_set *ms, int k, const cf_request *reqs, uint32_t n, double *done) {
    if (k <= P_CAKE) {
        double span, mean;
        for (uint32_t r = 0; r < n; r++) {
            uint32_t units = cf_chunks(&ms->p, reqs[r].n_cached);
            ms->split[r] = k == P_RECOMPUTE ? units
                           : k == P_LOAD    ? 0
                                         : cf_token_split(&ms->p, &ms->m, &ms->c[reqs[r].channel],
                                                          reqs[r].n_cached)
                                               .split;
            ms->order[r] = r;
        }
        cf_evaluate_splits(&ms->p, &ms->m, ms->c, reqs, n, ms->split, ms->order, &span, &mean,
                           done);
        return;
    }
    cf_params q = ms->p;
    q.priority = k == P_CF_LRF ? CF_PRIO_LRF : k == P_CF_SRF ? CF_PRIO_SRF : CF_PRIO_MEAN;
    cf_plan_batch(&q, &ms->m, ms->c, ms->n_channels, reqs, n, ms->scratch, ms->plans, NULL, 0,
                  NULL);
    for (uint32_t r = 0; r < n; r++) done[r] = ms->plans[r].done_s;
}

static double exponential(double rate);

static uint64_t rng;
static double uniform01(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(void) {
    return sqrt(-2 * log(uniform01())) * cos(6.283185307179586 * uniform01());
}
static double exponential(double rate) {
    return -log(uniform01()) / rate;
}

/* --help prints to stdout and exits 0; a bad flag prints to stderr and exits 2. */
static void usage(int status) {
    fprintf(
        status ? stderr : stdout,
        "usage: kvs-restore-sim [options]\n"
        "Compares restore policies (recompute, load, cake, cf-lrf, cf-srf, cf-mean) on the\n"
        "CacheFlow cost model of an 8B-class model on an H100-like GPU (docs/cacheflow.md):\n"
        "mean, P50 and P99 of time to first token per policy, as ratios to the better of\n"
        "recompute and load in the same run.\n"
        "  --batch B          requests per closed batch; with --rate, the most the engine\n"
        "                     takes at once (1..64, default 4)\n"
        "  --batches N        batches drawn: B x N requests in all (default 200)\n"
        "  --gbps G[,G...]    read bandwidth of each tier in Gbit/s, up to 4 tiers; each\n"
        "                     request's prefix is on one of them, drawn uniformly (default 10)\n"
        "  --median TOKENS    median cached-prefix length, log-normal (default 5000)\n"
        "  --sigma S          sigma of the log-normal prefix lengths (default 0.8)\n"
        "  --min TOKENS       shortest prefix; shorter draws are clipped (default 256)\n"
        "  --max TOKENS       longest prefix; longer draws are clipped (default 30000)\n"
        "  --new-tokens Q     new tokens of the forward after the restore (default 256)\n"
        "  --seed X           random seed (default 1)\n"
        "  --layer-mode 0|1   1: the cf policies may restore a request by layers instead of\n"
        "                     by tokens (default 0)\n"
        "  --rate R           requests arrive as a Poisson process of R per second instead\n"
        "                     of in closed batches; TTFT counts from each arrival\n"
        "  -h, --help         this text\n");
    exit(status);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double q) {
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)ceil(q * (double)n) - 1;
    return v[i < n ? i : n - 1];
}

int main(int argc, char **argv) {
    opts o = {.batch = 4,
              .batches = 200,
              .median = 5000,
              .min_tokens = 256,
              .max_tokens = 30000,
              .new_tokens = 256,
              .gbps = {10},
              .n_tiers = 1,
              .sigma = 0.8,
              .seed = 1,
              .layer_mode = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(0);
        if (!v) usage(2);
        char *end = NULL;
        if (!strcmp(a, "--gbps")) {
            o.n_tiers = 0;
            for (const char *q = v; *q && o.n_tiers < MAX_TIERS; q = *end == ',' ? end + 1 : end) {
                double g = strtod(q, &end);
                if (end == q || g <= 0 || (*end && *end != ',')) usage(2);
                o.gbps[o.n_tiers++] = g;
            }
            if (*end) usage(2);
            i++;
            continue;
        }
        double d = strtod(v, &end);
        if (*end || d < 0) usage(2);
        if (!strcmp(a, "--batch") && d >= 1 && d <= 64)
            o.batch = (uint32_t)d;
        else if (!strcmp(a, "--batches") && d >= 1)
            o.batches = (uint32_t)d;
        else if (!strcmp(a, "--rate") && d > 0)
            o.rate = d;
        else if (!strcmp(a, "--median") && d >= 1)
            o.median = (uint32_t)d;
        else if (!strcmp(a, "--sigma"))
            o.sigma = d;
        else if (!strcmp(a, "--min") && d >= 1)
            o.min_tokens = (uint32_t)d;
        else if (!strcmp(a, "--max") && d >= 1)
            o.max_tokens = (uint32_t)d;
        else if (!strcmp(a, "--new-tokens"))
            o.new_tokens = (uint32_t)d;
        else if (!strcmp(a, "--seed"))
            o.seed = (uint64_t)d;
        else if (!strcmp(a, "--layer-mode") && (d == 0 || d == 1))
            o.layer_mode = (int)d;
        else
            usage(2);
        i++;
    }
    if (o.min_tokens > o.max_tokens) usage(2);
    rng = 0x9E3779B97F4A7C15ull ^ (o.seed * 0xBF58476D1CE4E5B9ull);
    /* 8B-class model (36 layers, 8 KV heads of 128, bf16: 4 KiB per token per layer), H100-like
     * compute: 15 ms fixed, 2 x 8e9 FLOPs per token at 400 TFLOP/s, attention 4 L n_q d_head / 300e12 */
    model_set ms = {.p = {.chunk_tokens = 512,
                          .n_layers = 36,
                          .kv_bytes_per_token_layer = 4096,
                          .l_delta = o.layer_mode ? 0 : 1},
                    .m = {.fix_s = 0.015,
                          .lin_s_per_token = 2 * 8e9 / 400e12,
                          .att_s_per_token2 = 4.0 * 36 * 32 * 128 / 300e12},
                    .n_channels = o.n_tiers};
    for (uint32_t t = 0; t < o.n_tiers; t++)
        ms.c[t] = (cf_channel){.lat_s = 0.0002, .bytes_per_s = o.gbps[t] * 1e9 / 8};
    size_t total = (size_t)o.batch * o.batches;
    double *ttft[P_COUNT];
    for (int k = 0; k < P_COUNT; k++) ttft[k] = calloc(total, sizeof(double));
    cf_request *all = calloc(total, sizeof *all);
    double *arrival = calloc(total, sizeof *arrival);
    ms.plans = calloc(o.batch, sizeof *ms.plans);
    ms.split = calloc(o.batch, sizeof *ms.split);
    ms.order = calloc(o.batch, sizeof *ms.order);
    double *done = calloc(o.batch, sizeof *done);
    ms.scratch = malloc(cf_batch_scratch_bytes(o.batch));
    int rc = 1;
    if (!all || !arrival || !ms.plans || !ms.split || !ms.order || !done || !ms.scratch)
        goto out_of_memory;
    for (int k = 0; k < P_COUNT; k++)
        if (!ttft[k]) goto out_of_memory;
    double clock = 0;
    for (size_t i = 0; i < total; i++) {
        double n = o.median * exp(o.sigma * normal());
        n = n < o.min_tokens ? o.min_tokens : n > o.max_tokens ? o.max_tokens : n;
        uint32_t tier = o.n_tiers > 1 ? (uint32_t)(uniform01() * o.n_tiers) % o.n_tiers : 0;
        all[i] = (cf_request){.n_cached = (uint32_t)n, .channel = tier};
        if (o.rate > 0) clock += exponential(o.rate);
        arrival[i] = clock; /* closed batches: all 0 */
    }
    for (int k = 0; k < P_COUNT; k++) {
        double free_at = 0;
        for (size_t i = 0; i < total;) {
            size_t n = o.batch;
            double start = 0;
            if (o.rate > 0) { /* the arrived requests, at least the next one, at most --batch */
                start = free_at > arrival[i] ? free_at : arrival[i];
                n = 1;
                while (n < o.batch && i + n < total && arrival[i + n] <= start) n++;
            }
            plan_policy(&ms, k, all + i, (uint32_t)n, done);
            double busy = 0;
            for (size_t r = 0; r < n; r++) {
                double finish = done[r] + cf_forward_s(&ms.m, all[i + r].n_cached, o.new_tokens);
                ttft[k][i + r] = start + finish - arrival[i + r];
                if (finish > busy) busy = finish;
            }
            free_at = start + busy;
            i += n;
        }
    }
    double means[P_COUNT];
    for (int k = 0; k < P_COUNT; k++) {
        double s = 0;
        for (size_t i = 0; i < total; i++) s += ttft[k][i];
        means[k] = s / (double)total;
    }
    double base = means[P_RECOMPUTE] < means[P_LOAD] ? means[P_RECOMPUTE] : means[P_LOAD];
    const char *base_name = means[P_RECOMPUTE] < means[P_LOAD] ? "recompute" : "load";
    char tiers[96] = "";
    for (uint32_t t = 0; t < o.n_tiers; t++)
        snprintf(tiers + strlen(tiers), sizeof tiers - strlen(tiers), "%s%g", t ? "," : "",
                 o.gbps[t]);
    if (o.rate > 0)
        printf("kvs-restore-sim: %zu requests, Poisson %.3g/s, batches of at most %u", total,
               o.rate, o.batch);
    else
        printf("kvs-restore-sim: %u closed batches of %u", o.batches, o.batch);
    printf(", prefix median %u tokens (sigma %.2f, %u..%u), tiers %s Gbit/s, %u new tokens, modes: "
           "%s\n",
           o.median, o.sigma, o.min_tokens, o.max_tokens, tiers, o.new_tokens,
           o.layer_mode ? "token or layer per request" : "token");
    for (int k = 0; k < P_COUNT; k++) {
        double p50 = pct(ttft[k], total, 0.50), p99 = pct(ttft[k], total, 0.99);
        printf(
            "{\"policy\":\"%s\",\"mean_s\":%.4f,\"p50_s\":%.4f,\"p99_s\":%.4f,\"ratio_mean\":%.3f,"
            "\"reference\":\"%s\",\"gbps\":%g,\"batch\":%u}\n",
            NAMES[k], means[k], p50, p99, means[k] / base, base_name, o.gbps[0], o.batch);
        printf("%-10s mean %.3f s  p50 %.3f s  p99 %.3f s  mean/%s %.3f\n", NAMES[k], means[k], p50,
               p99, base_name, means[k] / base);
    }
    rc = 0;
    goto out;
out_of_memory:
    fprintf(stderr, "kvs-restore-sim: out of memory for %zu requests (--batch x --batches)\n",
            total);
out:
    free(ms.scratch);
    free(done);
    free(ms.order);
    free(ms.split);
    free(ms.plans);
    free(arrival);
    free(all);
    for (int k = 0; k < P_COUNT; k++) free(ttft[k]);
    return rc;
}
