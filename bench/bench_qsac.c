/* bench_qsac.c - kvs-bench-qsac: LiteCache's query-similarity head cache (schedulers/qsac) over a
 * synthetic decode trace, against head caches without query reuse, in one run.
 *
 * The trace (no model weights needed): G KV heads of m query heads each, head_dim d. Keys are
 * RoPE(nu_g + z_s, s) and the decode queries RoPE(mu_gj + sigma_g x_t, position), with Gaussian
 * z and x, per-head means nu and mu whose energy grows toward the low RoPE frequencies (as in
 * trained models, so adjacent queries stay similar), and sigma_g spreading the heads from easy to
 * hard to reuse. The context is --context rows, growing by one row a step for --steps steps; each
 * step a KV head attends to its sink and recent rows plus k = --topk-ratio of the rest.
 *
 * Variants, each per KV head and step:
 *   exact-refetch  no reuse: the exact top-k every step, all k rows moved (the reference)
 *   exact-delta    no reuse: the exact top-k every step, only the rows the cache lacks moved
 *   qsac           the paper: reuse while the group's similarity is above tau (Eq. 2-5), all k
 *                  rows moved on a miss
 *   qsac-delta     the same, a miss moving only the rows the cache lacks (kvs_qsac_delta)
 *   qsac-adaptive  qsac-delta whose tau follows the measured attention error (kvs_qsac_adapt)
 * Reported: hit ratio, bytes moved per decoded token (K and V rows of 2-byte elements) and its
 * ratio to exact-refetch, and the attention error (1 - attention mass of the rows used over the
 * mass of the exact top-k). Then the CPU time of managing the cache per step: QSAC's lookup and
 * delta against an LRU block cache (RetroInfer-style, 8-token blocks holding 30% of the context,
 * fed the exact top-k's blocks), both timed over the same steps; the exact top-k selection QSAC
 * skips on a hit is timed beside.
 *
 * Last, the approximate selection with no oracle: Swarm's medoid index. Each head's exact top-k
 * of the first --profile-steps steps is its co-activation profile; its rows are clustered
 * (kvs_swarm_cluster_build, Jaccard distance, radius 0.5) and each later step takes whole clusters
 * in descending medoid score (kvs_topk_medoids) instead of scoring every key. Reported against
 * the exact top-k of the same steps: recall, attention error, rows read per row selected, and the
 * keys scored (the medoids) per key an exact selection scores. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "schedulers/qsac/qsac.h"
#include "schedulers/qsac/topk.h"
#include "schedulers/swarm/swarm_cluster.h"
#include "schedulers/swarm/swarm_graph.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: kvs-bench-qsac [--context N] [--steps N] [--kv-heads N] [--group N]\n"
        "                      [--head-dim N] [--topk-ratio PERMILLE] [--noise PERCENT]\n"
        "                      [--profile-steps N] [--seed N]\n"
        "  QSAC on a synthetic RoPE decode trace against caches without query reuse\n"
        "  (docs/sparse.md). Defaults: 8192 rows, 256 steps, 8 KV heads of 4 query heads,\n"
        "  head_dim 64, top-k 100 per mille, sink 4, recent 64, eta 0.8, p 3; --noise scales\n"
        "  every head's query noise (100: sigma from 0.25 to 1.5 of the mean's scale);\n"
        "  --profile-steps: the steps whose selections the medoid index is clustered on (32).\n");
}

static uint64_t rng;
static double gauss(void) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        u[i] = ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(2 * M_PI * u[1]);
}

static void rope(float *x, uint32_t d, double position) {
    for (uint32_t i = 0; i < d / 2; i++) {
        double a = position * pow(500000.0, -2.0 * i / d), c = cos(a), s = sin(a);
        double x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = (float)(x0 * c - x1 * s);
        x[2 * i + 1] = (float)(x0 * s + x1 * c);
    }
}

/* a mean vector whose pair i carries energy growing with i (the low frequencies) */
static void ramp_mean(float *v, uint32_t d, double scale) {
    for (uint32_t i = 0; i < d; i++)
        v[i] = (float)(scale * gauss() * (1.0 + 3.0 * (i / 2) / (d / 2)));
}

enum { EXACT_REFETCH, EXACT_DELTA, QSAC, QSAC_DELTA, QSAC_ADAPTIVE, VARIANTS };
static const char *const NAMES[VARIANTS] = {"exact-refetch", "exact-delta", "qsac", "qsac-delta",
                                            "qsac-adaptive"};

typedef struct variant {
    uint64_t rows_moved, hits, lookups;
    double error_sum;
} variant;

/* The LRU block cache: a direct index block -> slot, slots in a doubly linked LRU list. */
typedef struct lru {
    uint32_t cap, used, head, tail;
    uint32_t *slot_of, *block, *prev, *next;
    uint64_t misses;
} lru;

static void lru_touch(lru *c, uint32_t b) {
    uint32_t s = c->slot_of[b];
    if (s != UINT32_MAX) { /* hit: to the front */
        if (c->head == s) return;
        c->next[c->prev[s]] = c->next[s];
        if (c->next[s] != UINT32_MAX) c->prev[c->next[s]] = c->prev[s];
        if (c->tail == s) c->tail = c->prev[s];
    } else { /* miss: a free slot, or the least recent */
        c->misses++;
        if (c->used < c->cap) {
            s = c->used++;
        } else {
            s = c->tail;
            c->slot_of[c->block[s]] = UINT32_MAX;
            c->tail = c->prev[s];
            if (c->tail != UINT32_MAX) c->next[c->tail] = UINT32_MAX;
            if (c->head == s) c->head = UINT32_MAX;
        }
        c->block[s] = b;
        c->slot_of[b] = s;
    }
    c->prev[s] = UINT32_MAX;
    c->next[s] = c->head;
    if (c->head != UINT32_MAX) c->prev[c->head] = s;
    c->head = s;
    if (c->tail == UINT32_MAX) c->tail = s;
}

int main(int argc, char **argv) {
    uint64_t n0 = 8192, steps = 256, G = 8, m = 4, d = 64, permille = 100, seed = 1, noise = 100,
             profile_steps = 32;
    const uint32_t sink = 4, recent = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!v) {
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--context")) {
            n0 = bench_parse_u64(a, v, 256, 1u << 20);
        } else if (!strcmp(a, "--steps")) {
            steps = bench_parse_u64(a, v, 1, 1u << 16);
        } else if (!strcmp(a, "--kv-heads")) {
            G = bench_parse_u64(a, v, 1, 64);
        } else if (!strcmp(a, "--group")) {
            m = bench_parse_u64(a, v, 1, 16);
        } else if (!strcmp(a, "--head-dim")) {
            d = bench_parse_u64(a, v, 2, 256);
            d &= ~1ull;
        } else if (!strcmp(a, "--topk-ratio")) {
            permille = bench_parse_u64(a, v, 1, 1000);
        } else if (!strcmp(a, "--profile-steps")) {
            profile_steps = bench_parse_u64(a, v, 1, 1u << 16);
        } else if (!strcmp(a, "--noise")) {
            noise = bench_parse_u64(a, v, 0, 100000);
        } else if (!strcmp(a, "--seed")) {
            seed = bench_parse_u64(a, v, 1, UINT64_MAX);
        } else {
            usage(stderr);
            return 2;
        }
        i++;
    }
    rng = seed * 0x9e3779b97f4a7c15ull | 1;
    uint64_t n_max = n0 + steps;
    float *keys = malloc(G * n_max * d * sizeof *keys), *mu = malloc(G * m * d * sizeof *mu);
    float *q = malloc(m * d * sizeof *q), *scores = malloc(n_max * sizeof *scores);
    float *labels = calloc(VARIANTS * G * m * d, sizeof *labels);
    uint32_t *exact = malloc(n_max * sizeof *exact), *prev = malloc(G * n_max * sizeof *prev);
    uint32_t *n_prev = calloc(G, sizeof *n_prev), *ft = malloc(n_max * sizeof *ft),
             *fs = malloc(n_max * sizeof *fs);
    uint32_t *slots = malloc(VARIANTS * G * n_max * sizeof *slots);
    if (!keys || !mu || !q || !scores || !labels || !exact || !prev || !n_prev || !ft || !fs ||
        !slots) {
        fprintf(stderr, "kvs-bench-qsac: out of memory\n");
        return 1;
    }
    double *sigma = malloc(G * sizeof *sigma), *importance = malloc(G * sizeof *importance);
    for (uint64_t g = 0; g < G; g++) {
        /* heads from easy (little query noise, less important) to hard */
        double spread = G > 1 ? (double)g / (double)(G - 1) : 0.5;
        sigma[g] = (double)noise / 100.0 * (0.25 + 1.25 * spread);
        importance[g] = 0.85 + 0.15 * spread;
        float nu[256];
        ramp_mean(nu, (uint32_t)d, 1.0);
        for (uint64_t s = 0; s < n_max; s++) {
            float *k = keys + (g * n_max + s) * d;
            for (uint64_t i = 0; i < d; i++) k[i] = nu[i] + (float)gauss();
            rope(k, (uint32_t)d, (double)s);
        }
        for (uint64_t j = 0; j < m; j++) ramp_mean(mu + (g * m + j) * d, (uint32_t)d, 1.0);
    }

    kvs_qsac_params params;
    kvs_qsac_defaults(&params);
    kvs_qsac_head heads[VARIANTS][64];
    kvs_qsac_adapt adapt[64];
    variant var[VARIANTS] = {0};
    for (int v = 0; v < VARIANTS; v++)
        for (uint64_t g = 0; g < G; g++) {
            double tau = kvs_qsac_threshold(importance[g], params.eta, params.p);
            heads[v][g] = (kvs_qsac_head){.label = labels + (v * G + g) * m * d,
                                          .m = (uint32_t)m,
                                          .d = (uint32_t)d,
                                          .tau = tau};
            for (uint64_t s = 0; s < n_max; s++) slots[(v * G + g) * n_max + s] = KVS_QSAC_EMPTY;
        }
    for (uint64_t g = 0; g < G; g++)
        adapt[g] = (kvs_qsac_adapt){
            .target_error = 0.02, .step = 0.02, .tau_min = -1.0, .tau_max = 0.99, .window = 8};
    /* the LRU block cache per head: 8-token blocks, 30% of the final context's blocks */
    uint32_t n_blocks = (uint32_t)((n_max + 7) / 8);
    lru lrus[64];
    for (uint64_t g = 0; g < G; g++) {
        lru *c = &lrus[g];
        *c = (lru){.cap = n_blocks * 3 / 10 + 1, .head = UINT32_MAX, .tail = UINT32_MAX};
        c->slot_of = malloc(n_blocks * sizeof *c->slot_of);
        c->block = malloc(c->cap * sizeof *c->block);
        c->prev = malloc(c->cap * sizeof *c->prev);
        c->next = malloc(c->cap * sizeof *c->next);
        if (!c->slot_of || !c->block || !c->prev || !c->next) return 1;
        memset(c->slot_of, 0xff, n_blocks * sizeof *c->slot_of);
    }
    uint64_t ns_qsac = 0, ns_lru = 0, ns_topk = 0, lru_lookups = 0;
    /* the medoid index: a profile per head, then its clusters */
    kvs_swarm_profile *profiles[64] = {0};
    kvs_topk_index indexes[64] = {{0}};
    for (uint64_t g = 0; g < G; g++)
        if (kvs_swarm_profile_create((uint32_t)n_max, 0, &profiles[g]) != KVS_OK) return 1;
    float *mscores = malloc(n_max * sizeof *mscores);
    uint32_t *msel = malloc(n_max * sizeof *msel);
    uint8_t *mseen = calloc(n_max, 1);
    if (!mscores || !msel || !mseen) return 1;
    double med_recall = 0, med_error = 0, med_read = 0, med_keys = 0;
    uint64_t med_steps = 0, n_clusters_sum = 0;
    uint8_t *blocks_seen = calloc(n_blocks, 1);
    for (uint64_t t = 0; t < steps; t++) {
        uint32_t n = (uint32_t)(n0 + t); /* the context this step attends over */
        uint32_t pool = kvs_topk_pool_end(n, recent) - sink;
        uint32_t k = (uint32_t)((pool * permille + 999) / 1000);
        for (uint64_t g = 0; g < G; g++) {
            for (uint64_t j = 0; j < m; j++) {
                float *qj = q + j * d;
                for (uint64_t i = 0; i < d; i++)
                    qj[i] = mu[(g * m + j) * d + i] + (float)(sigma[g] * gauss());
                rope(qj, (uint32_t)d, (double)n);
            }
            kvs_topk_scores(q, (uint32_t)m, keys + g * n_max * d, d, n, (uint32_t)d, scores);
            uint64_t t0 = bench_now_ns();
            uint32_t ne = kvs_topk_exact(scores, n, sink, recent, k, exact);
            if (ne == UINT32_MAX) {
                fprintf(stderr, "kvs-bench-qsac: out of memory\n");
                return 1;
            }
            ns_topk += bench_now_ns() - t0;
            double scale = 1.0 / sqrt((double)d);
            /* no reuse */
            var[EXACT_REFETCH].rows_moved += ne;
            uint32_t *sl = slots + (EXACT_DELTA * G + g) * n_max;
            var[EXACT_DELTA].rows_moved += kvs_qsac_delta(sl, (uint32_t)n_max, exact, ne, ft, fs);
            /* QSAC variants: a hit attends to what the cache holds, a miss takes the exact top-k
             * of this step's query (its new label) */
            for (int v = QSAC; v <= QSAC_ADAPTIVE; v++) {
                kvs_qsac_head *h = &heads[v][g];
                uint32_t *cache = slots + (v * G + g) * n_max;
                uint32_t *held = prev + g * n_max;
                uint64_t q0 = bench_now_ns();
                double sim = 1.0;
                int labelled = h->valid; /* a step without a label counts as similarity 1 */
                int hit = kvs_qsac_step(h, q, NULL, &sim);
                uint32_t fetched = 0;
                if (!hit) {
                    fetched = kvs_qsac_delta(cache, (uint32_t)n_max, exact, ne, ft, fs);
                    if (v == QSAC) fetched = ne; /* the paper moves the whole set */
                }
                if (v == QSAC_DELTA) ns_qsac += bench_now_ns() - q0;
                var[v].lookups++;
                var[v].hits += (uint64_t)hit;
                var[v].rows_moved += fetched;
                /* the rows attended: what the cache holds */
                uint32_t nh = 0;
                for (uint32_t s = 0; s < (uint32_t)n_max && nh < n_max; s++)
                    if (cache[s] != KVS_QSAC_EMPTY) held[nh++] = cache[s];
                double err = kvs_qsac_attention_error(scores, n, scale, held, nh, exact, ne);
                var[v].error_sum += err;
                if (v == QSAC_ADAPTIVE)
                    h->tau = kvs_qsac_adapt_observe(&adapt[g], h->tau, labelled ? sim : 1.0, err);
            }
            /* the medoid index: profiled on the first steps' exact selections, then used */
            if (t < profile_steps) {
                if (kvs_swarm_profile_add_step(profiles[g], exact, ne) != KVS_OK) return 1;
                if (t + 1 == profile_steps || t + 1 == steps) {
                    kvs_swarm_cluster_params cp;
                    kvs_swarm_cluster_defaults(&cp);
                    kvs_swarm_graph *graph = NULL;
                    kvs_swarm_clusters *clusters = NULL;
                    if (kvs_swarm_graph_build(profiles[g], KVS_SWARM_METRIC_JACCARD, 1.0, 1,
                                              &graph) != KVS_OK ||
                        kvs_swarm_clusters_create((uint32_t)n_max, &clusters) != KVS_OK ||
                        kvs_swarm_cluster_build(graph, &cp, clusters) != KVS_OK ||
                        kvs_topk_index_from_clusters(clusters, &indexes[g]) != KVS_OK)
                        return 1;
                    n_clusters_sum += clusters->n_clusters;
                    kvs_swarm_clusters_destroy(clusters);
                    kvs_swarm_graph_destroy(graph);
                }
            } else {
                kvs_topk_index *ix = &indexes[g];
                for (uint32_t c = 0; c < ix->n_clusters; c++)
                    mscores[c] = scores[ix->rows[ix->offsets[c]]];
                uint32_t taken = 0;
                uint32_t ns =
                    kvs_topk_medoids(ix, mscores, n, sink, recent, ne, mseen, msel, &taken);
                if (ns == UINT32_MAX) return 1;
                uint32_t both = 0;
                for (uint32_t i = 0, j = 0; i < ns && j < ne;) { /* both ascending */
                    if (msel[i] == exact[j])
                        both++, i++, j++;
                    else if (msel[i] < exact[j])
                        i++;
                    else
                        j++;
                }
                med_recall += ne ? (double)both / ne : 1.0;
                med_error += kvs_qsac_attention_error(scores, n, scale, msel, ns, exact, ne);
                med_read += ne ? (double)ns / ne : 0.0;
                med_keys += (double)ix->n_clusters / (double)(n - recent - sink);
                med_steps++;
            }
            /* the LRU block cache fed the exact top-k's blocks (each block once a step) */
            uint64_t l0 = bench_now_ns();
            for (uint32_t i = 0; i < ne; i++) {
                uint32_t b = exact[i] / 8;
                if (blocks_seen[b]) continue;
                blocks_seen[b] = 1;
                lru_touch(&lrus[g], b);
                lru_lookups++;
            }
            ns_lru += bench_now_ns() - l0;
            for (uint32_t i = 0; i < ne; i++) blocks_seen[exact[i] / 8] = 0;
        }
    }
    double row_bytes = 2.0 * (double)d * 2.0; /* K and V of 2-byte elements */
    double ref = (double)var[EXACT_REFETCH].rows_moved * row_bytes / (double)steps;
    printf("kvs-bench-qsac: synthetic RoPE trace, %llu rows + %llu decode steps, %llu KV heads x "
           "%llu query heads, head_dim %llu, top-k %.1f%%, sink %u, recent %u\n",
           (unsigned long long)n0, (unsigned long long)steps, (unsigned long long)G,
           (unsigned long long)m, (unsigned long long)d, (double)permille / 10.0, sink, recent);
    for (int v = 0; v < VARIANTS; v++) {
        double bytes = (double)var[v].rows_moved * row_bytes / (double)steps;
        double hit = var[v].lookups ? (double)var[v].hits / (double)var[v].lookups : 0.0;
        double err = var[v].lookups ? var[v].error_sum / (double)var[v].lookups : 0.0;
        printf("{\"bench\":\"qsac_bytes\",\"variant\":\"%s\",\"ratio\":%.4f,\"reference\":"
               "\"exact-refetch\",\"bytes_per_token\":%.0f,\"reference_bytes_per_token\":%.0f,"
               "\"hit_ratio\":%.4f,\"attention_error\":%.4f}\n",
               NAMES[v], bytes / ref, bytes, ref, hit, err);
        printf("%-14s hits %5.1f%%  %9.0f B/token moved  (%.3f of exact-refetch)  attention "
               "error %.4f\n",
               NAMES[v], 100 * hit, bytes, bytes / ref, err);
    }
    double lookups = (double)(steps * G);
    uint64_t lru_misses = 0;
    for (uint64_t g = 0; g < G; g++) lru_misses += lrus[g].misses;
    double per_qsac = (double)ns_qsac / (double)steps, per_lru = (double)ns_lru / (double)steps;
    printf("{\"bench\":\"qsac_cpu\",\"ratio\":%.4f,\"reference\":\"LRU block cache\","
           "\"qsac_ns_per_step\":%.0f,\"lru_ns_per_step\":%.0f,\"lru_block_lookups_per_step\":%.0f,"
           "\"lru_hit_ratio\":%.4f,\"exact_topk_ns_per_step\":%.0f}\n",
           per_qsac / per_lru, per_qsac, per_lru, (double)lru_lookups / (double)steps,
           1.0 - (double)lru_misses / (double)lru_lookups, (double)ns_topk / (double)steps);
    printf(
        "cache management per step (%.0f head lookups): qsac-delta %.0f ns, LRU block cache %.0f "
        "ns (%.0f block lookups), ratio %.3f; exact top-k selection %.0f ns, skipped on a hit\n",
        lookups / (double)steps, per_qsac, per_lru, (double)lru_lookups / (double)steps,
        per_qsac / per_lru, (double)ns_topk / (double)steps);
    if (med_steps) {
        double recall = med_recall / (double)med_steps, err = med_error / (double)med_steps;
        double read = med_read / (double)med_steps, scored = med_keys / (double)med_steps;
        double clusters = (double)n_clusters_sum / (double)G;
        printf("{\"bench\":\"qsac_medoids\",\"ratio\":%.4f,\"reference\":\"exact top-k\","
               "\"recall\":%.4f,\"attention_error\":%.4f,\"rows_read_per_row_selected\":%.3f,"
               "\"keys_scored_per_key\":%.4f,\"profile_steps\":%llu,\"clusters_per_head\":%.0f}\n",
               recall, recall, err, read, scored, (unsigned long long)profile_steps, clusters);
        printf(
            "medoid index (profiled on %llu steps, %.0f clusters a head): recall %.3f of the exact "
            "top-k, attention error %.4f, %.2f rows read per row selected, %.3f of the keys "
            "scored\n",
            (unsigned long long)profile_steps, clusters, recall, err, read, scored);
    }
    for (uint64_t g = 0; g < G; g++) {
        kvs_swarm_profile_destroy(profiles[g]);
        kvs_topk_index_free(&indexes[g]);
    }
    return 0;
}
