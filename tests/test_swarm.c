/* test_swarm.c - the Swarm policies (schedulers/swarm): notes §6.2 items 1-9, 11 and 12, each against a
 * hand-computed value or an independent brute-force / dense reference. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/swarm/swarm.h"
#include "tests/support/placement_digest.h"
#include "tests/support/swarm_synth.h"

/* splitmix64, so every instance is the same on every run. */
static uint64_t rng_next(uint64_t *state) {
    uint64_t x = (*state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint32_t rng_below(uint64_t *state, uint32_t n) {
    return (uint32_t)(rng_next(state) % n);
}

/* ---- 1. profiling ------------------------------------------------------------------------------- */

START_TEST(profile_of_a_three_step_trace_has_exact_symmetric_counts) {
    kvs_swarm_profile *p = NULL;
    ck_assert_int_eq(kvs_swarm_profile_create(5, 0, &p), KVS_OK);
    const uint32_t s1[] = {0, 1, 2}, s2[] = {2, 1, 1}, s3[] = {3, 0, 2};
    ck_assert_int_eq(kvs_swarm_profile_add_step(p, s1, 3), KVS_OK);
    ck_assert_int_eq(kvs_swarm_profile_add_step(p, s2, 3),
                     KVS_OK); /* 1 listed twice: counts once */
    ck_assert_int_eq(kvs_swarm_profile_add_step(p, s3, 3), KVS_OK);
    /* f by hand: steps {0,1,2}, {1,2}, {0,2,3}. */
    const uint32_t expected[5][5] = {
        {2, 1, 2, 1, 0}, {1, 2, 2, 0, 0}, {2, 2, 3, 1, 0}, {1, 0, 1, 1, 0}, {0, 0, 0, 0, 0},
    };
    for (uint32_t i = 0; i < 5; i++)
        for (uint32_t j = 0; j < 5; j++) {
            ck_assert_uint_eq(kvs_swarm_profile_count(p, i, j), expected[i][j]);
            ck_assert_uint_eq(kvs_swarm_profile_count(p, i, j), kvs_swarm_profile_count(p, j, i));
        }
    ck_assert_uint_eq(p->n_steps, 3);
    /* Eq. 2's denominator: ordered pairs, 2 * (3 + 1 + 3) increments. */
    ck_assert_uint_eq(kvs_swarm_profile_total(p), 14);
    const uint32_t bad[] = {5};
    ck_assert_int_eq(kvs_swarm_profile_add_step(p, bad, 1), KVS_EINVAL);
    ck_assert_uint_eq(p->n_steps, 3);
    kvs_swarm_profile_destroy(p);
}
END_TEST

START_TEST(pruned_profile_keeps_frequent_pairs_and_undercounts_by_at_most_the_floor) {
    const uint32_t n = 200;
    kvs_swarm_profile *exact = NULL, *pruned = NULL;
    ck_assert_int_eq(kvs_swarm_profile_create(n, 0, &exact), KVS_OK);
    ck_assert_int_eq(kvs_swarm_profile_create(n, 600, &pruned), KVS_OK);
    uint64_t rng = 7;
    uint32_t ids[12];
    for (uint32_t t = 0; t < 400; t++) {
        /* Entries 0..3 always fire together; the rest is noise that makes many rare pairs. */
        uint32_t k = 0;
        for (; k < 4; k++) ids[k] = k;
        while (k < 12) ids[k++] = 4 + rng_below(&rng, n - 4);
        ck_assert_int_eq(kvs_swarm_profile_add_step(exact, ids, k), KVS_OK);
        ck_assert_int_eq(kvs_swarm_profile_add_step(pruned, ids, k), KVS_OK);
    }
    ck_assert_uint_le(pruned->n_pairs, 600);
    ck_assert_uint_gt(pruned->prune_floor, 0);
    ck_assert_uint_eq(kvs_swarm_profile_count(pruned, 0, 3), 400);
    ck_assert_uint_eq(kvs_swarm_profile_total(pruned), kvs_swarm_profile_total(exact));
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i + 1; j < n; j++) {
            uint32_t e = kvs_swarm_profile_count(exact, i, j),
                     q = kvs_swarm_profile_count(pruned, i, j);
            ck_assert_uint_le(q, e);
            ck_assert_uint_le(e - q, pruned->prune_floor);
        }
    kvs_swarm_profile_destroy(exact);
    kvs_swarm_profile_destroy(pruned);
}
END_TEST

/* ---- 2. metric ---------------------------------------------------------------------------------- */

/* A small profile with three planted groups and noise. */
static kvs_swarm_profile *small_profile(uint32_t n, uint32_t steps, uint64_t seed) {
    kvs_swarm_profile *p = NULL;
    ck_assert_int_eq(kvs_swarm_profile_create(n, 0, &p), KVS_OK);
    uint64_t rng = seed;
    uint32_t ids[64];
    for (uint32_t t = 0; t < steps; t++) {
        uint32_t k = 0;
        for (uint32_t g = 0; g < 3; g++) {
            if (rng_below(&rng, 3) == 0) continue;
            for (uint32_t e = g * (n / 4); e < g * (n / 4) + n / 5; e++)
                if (rng_below(&rng, 10) < 8) ids[k++] = e;
        }
        for (uint32_t x = 0; x < 2; x++) ids[k++] = rng_below(&rng, n);
        ck_assert_int_eq(kvs_swarm_profile_add_step(p, ids, k), KVS_OK);
    }
    return p;
}

START_TEST(jaccard_distance_is_in_unit_range_and_zero_for_identical_histories) {
    kvs_swarm_profile *p = small_profile(20, 80, 11);
    for (uint32_t i = 0; i < 20; i++)
        for (uint32_t j = 0; j < 20; j++) {
            double d = kvs_swarm_distance(p, KVS_SWARM_METRIC_JACCARD, i, j);
            ck_assert(d >= 0.0 && d <= 1.0);
            ck_assert(d == kvs_swarm_distance(p, KVS_SWARM_METRIC_JACCARD, j, i));
        }
    /* By hand: steps {0,1,2}, {0,1}, {2,3}. */
    kvs_swarm_profile *q = NULL;
    ck_assert_int_eq(kvs_swarm_profile_create(4, 0, &q), KVS_OK);
    const uint32_t a[] = {0, 1, 2}, b[] = {0, 1}, c[] = {2, 3};
    ck_assert_int_eq(kvs_swarm_profile_add_step(q, a, 3), KVS_OK);
    ck_assert_int_eq(kvs_swarm_profile_add_step(q, b, 2), KVS_OK);
    ck_assert_int_eq(kvs_swarm_profile_add_step(q, c, 2), KVS_OK);
    ck_assert(kvs_swarm_distance(q, KVS_SWARM_METRIC_JACCARD, 0, 1) ==
              0.0); /* identical histories */
    /* 0: steps {1,2}, 2: steps {1,3}: J = 1/3. */
    ck_assert(fabs(kvs_swarm_distance(q, KVS_SWARM_METRIC_JACCARD, 0, 2) - 2.0 / 3.0) < 1e-12);
    ck_assert(kvs_swarm_distance(q, KVS_SWARM_METRIC_JACCARD, 1, 3) == 1.0);
    /* RATE: f / steps; GLOBAL: f / total with total = 2 * (3 + 1 + 1) = 10. */
    ck_assert(fabs(kvs_swarm_distance(q, KVS_SWARM_METRIC_RATE, 0, 1) - (1.0 - 2.0 / 3.0)) < 1e-12);
    ck_assert(fabs(kvs_swarm_distance(q, KVS_SWARM_METRIC_GLOBAL, 0, 1) - (1.0 - 2.0 / 10.0)) <
              1e-12);
    kvs_swarm_profile_destroy(q);
    kvs_swarm_profile_destroy(p);
}
END_TEST

/* Algorithm 1 as notes §2.3 states it, written independently over raw counts: neighbours are pairs
 * with f >= theta, candidates in descending f, admitted when the mean f to the members is >= theta.
 * No replication budget. Returns clusters as a CSR in start/member (caller-sized). */
static uint32_t count_reference(uint32_t n, const uint32_t *f, double theta, uint32_t *start,
                                uint32_t *member) {
    uint32_t *rho = calloc(n, sizeof *rho), *order = malloc(n * sizeof *order),
             *covered = calloc(n, sizeof *covered);
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < n; j++)
            if (j != i && f[i * n + j] >= theta) rho[i]++;
        order[i] = i;
    }
    for (uint32_t i = 1; i < n; i++) /* insertion sort: rho descending, id ascending */
        for (uint32_t k = i; k > 0 && rho[order[k]] > rho[order[k - 1]]; k--) {
            uint32_t t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
    uint32_t n_clusters = 0, n_members = 0;
    for (uint32_t q = 0; q < n; q++) {
        uint32_t m = order[q];
        if (covered[m]) continue;
        start[n_clusters] = n_members;
        member[n_members++] = m;
        covered[m] = 1;
        uint32_t cand[64], n_cand = 0;
        for (uint32_t x = 0; x < n; x++)
            if (x != m && f[m * n + x] >= theta) cand[n_cand++] = x;
        for (uint32_t i = 1; i < n_cand; i++) /* f descending, id ascending */
            for (uint32_t k = i; k > 0 && f[m * n + cand[k]] > f[m * n + cand[k - 1]]; k--) {
                uint32_t t = cand[k];
                cand[k] = cand[k - 1];
                cand[k - 1] = t;
            }
        for (uint32_t k = 0; k < n_cand; k++) {
            uint32_t x = cand[k], size = n_members - start[n_clusters];
            double sum = 0;
            for (uint32_t y = start[n_clusters]; y < n_members; y++) sum += f[x * n + member[y]];
            if (sum >= theta * size) {
                member[n_members++] = x;
                covered[x] = 1;
            }
        }
        n_clusters++;
    }
    start[n_clusters] = n_members;
    free(rho);
    free(order);
    free(covered);
    return n_clusters;
}

static void assert_same_clusters(const kvs_swarm_clusters *c, uint32_t n_ref, const uint32_t *start,
                                 const uint32_t *member) {
    ck_assert_uint_eq(c->n_clusters, n_ref);
    for (uint32_t k = 0; k < n_ref; k++) {
        ck_assert_uint_eq(c->items[k].n_members, start[k + 1] - start[k]);
        for (uint32_t m = 0; m < c->items[k].n_members; m++)
            ck_assert_uint_eq(c->items[k].members[m], member[start[k] + m]);
    }
}

START_TEST(global_metric_clusters_equal_the_raw_count_threshold_clusters) {
    const uint32_t n = 20;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        kvs_swarm_profile *p = small_profile(n, 60, seed);
        uint32_t f[20 * 20];
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++)
                f[i * n + j] = i == j ? 0 : kvs_swarm_profile_count(p, i, j);
        /* theta off the integers so no mean lands exactly on it; tau = 1 - theta / total. */
        double theta = 9.37 + (double)seed;
        double tau = 1.0 - theta / (double)kvs_swarm_profile_total(p);
        kvs_swarm_graph *g = NULL;
        ck_assert_int_eq(kvs_swarm_graph_build(p, KVS_SWARM_METRIC_GLOBAL, 1.0, 1, &g), KVS_OK);
        kvs_swarm_cluster_params params;
        kvs_swarm_cluster_defaults(&params);
        params.tau = tau;
        params.max_copies = 0;
        params.max_extra_slots = -1.0;
        kvs_swarm_clusters *c = NULL;
        ck_assert_int_eq(kvs_swarm_clusters_create(n, &c), KVS_OK);
        ck_assert_int_eq(kvs_swarm_cluster_build(g, &params, c), KVS_OK);
        uint32_t start[21], member[20 * 20];
        uint32_t n_ref = count_reference(n, f, theta, start, member);
        ck_assert_uint_gt(c->n_slots,
                          c->n_clusters); /* not all singletons: the test means something */
        assert_same_clusters(c, n_ref, start, member);
        kvs_swarm_clusters_destroy(c);
        kvs_swarm_graph_destroy(g);
        kvs_swarm_profile_destroy(p);
    }
}
END_TEST

/* ---- 3. density and medoid order ---------------------------------------------------------------- */

START_TEST(density_and_medoid_queue_of_a_hand_graph_break_ties_by_index) {
    /* 6 entries; tau 0.5. Edges at <= 0.5 count, 0.5 included; 0.6 does not. */
    const uint32_t a[] = {0, 0, 1, 2, 3, 4, 4};
    const uint32_t b[] = {1, 2, 2, 5, 4, 5, 0};
    const double d[] = {0.1, 0.5, 0.3, 0.6, 0.2, 0.4, 0.9};
    kvs_swarm_graph *g = NULL;
    ck_assert_int_eq(kvs_swarm_graph_from_pairs(6, a, b, d, 7, &g), KVS_OK);
    uint32_t rho[6], order[6];
    ck_assert_int_eq(kvs_swarm_cluster_order(g, 0.5, rho, order), KVS_OK);
    const uint32_t rho_expected[6] = {2, 2, 2, 1, 2, 1};
    const uint32_t order_expected[6] = {0, 1, 2, 4, 3, 5};
    for (int i = 0; i < 6; i++) {
        ck_assert_uint_eq(rho[i], rho_expected[i]);
        ck_assert_uint_eq(order[i], order_expected[i]);
    }
    ck_assert(kvs_swarm_graph_distance(g, 2, 5) == 0.6);
    ck_assert(kvs_swarm_graph_distance(g, 5, 2) == 0.6);
    ck_assert(kvs_swarm_graph_distance(g, 1, 5) == 1.0);
    ck_assert(kvs_swarm_graph_distance(g, 3, 3) == 0.0);
    kvs_swarm_graph_destroy(g);
}
END_TEST

/* ---- 4. replication ----------------------------------------------------------------------------- */

static kvs_swarm_clusters *cluster_hand_graph(const kvs_swarm_cluster_params *params) {
    /* A = 0 co-fires with B = 1 and with C = 2; B and C rarely together. */
    const uint32_t a[] = {0, 0, 1}, b[] = {1, 2, 2};
    const double d[] = {0.1, 0.2, 0.9};
    kvs_swarm_graph *g = NULL;
    kvs_swarm_clusters *c = NULL;
    ck_assert_int_eq(kvs_swarm_graph_from_pairs(3, a, b, d, 3, &g), KVS_OK);
    ck_assert_int_eq(kvs_swarm_clusters_create(3, &c), KVS_OK);
    ck_assert_int_eq(kvs_swarm_cluster_build(g, params, c), KVS_OK);
    kvs_swarm_graph_destroy(g);
    return c;
}

static int together(const kvs_swarm_clusters *c, uint32_t x, uint32_t y) {
    for (uint32_t k = 0; k < c->n_clusters; k++) {
        int hx = 0, hy = 0;
        for (uint32_t m = 0; m < c->items[k].n_members; m++) {
            hx |= c->items[k].members[m] == x;
            hy |= c->items[k].members[m] == y;
        }
        if (hx && hy) return 1;
    }
    return 0;
}

START_TEST(shared_companion_is_replicated_and_no_replica_keeps_one_copy) {
    kvs_swarm_cluster_params params;
    kvs_swarm_cluster_defaults(&params);
    params.max_extra_slots = 1.0; /* 3 entries: the +25% cap would allow no replica at all */
    kvs_swarm_clusters *c = cluster_hand_graph(&params);
    /* A medoid (rho 2) admits B; C fails the mean test ((0.2 + 0.9) / 2 > 0.5); C's cluster takes A. */
    ck_assert_uint_eq(c->n_clusters, 2);
    ck_assert_uint_eq(c->items[0].n_members, 2);
    ck_assert_uint_eq(c->items[0].members[0], 0);
    ck_assert_uint_eq(c->items[0].members[1], 1);
    ck_assert_uint_eq(c->items[1].members[0], 2);
    ck_assert_uint_eq(c->items[1].members[1], 0);
    ck_assert_uint_eq(c->copies[0], 2);
    ck_assert(!together(c, 1, 2));
    kvs_swarm_clusters_destroy(c);

    params.no_replica = 1;
    c = cluster_hand_graph(&params);
    ck_assert_uint_eq(c->copies[0], 1);
    ck_assert_uint_eq(c->n_slots, 3);
    ck_assert(!together(c, 1, 2));
    kvs_swarm_clusters_destroy(c);

    /* The +25% cap on 3 entries rounds to no replica: same as no_replica. */
    kvs_swarm_cluster_defaults(&params);
    c = cluster_hand_graph(&params);
    ck_assert_uint_eq(c->copies[0], 1);
    kvs_swarm_clusters_destroy(c);

    /* Medoid only: everything within tau of A joins, so B and C are glued together. */
    kvs_swarm_cluster_defaults(&params);
    params.medoid_only = 1;
    c = cluster_hand_graph(&params);
    ck_assert_uint_eq(c->n_clusters, 1);
    ck_assert(together(c, 1, 2));
    kvs_swarm_clusters_destroy(c);
}
END_TEST

/* ---- 5. invariants and a dense reference of Algorithm 1 ----------------------------------------- */

/* Algorithm 1 over a dense distance matrix, with the budget rules of swarm_cluster.h. */
static uint32_t dense_reference(uint32_t n, const double *dist, const kvs_swarm_cluster_params *prm,
                                uint32_t *start, uint32_t *member) {
    double tau = prm->tau;
    uint32_t *rho = calloc(n, sizeof *rho), *order = malloc(n * sizeof *order),
             *copies = calloc(n, sizeof *copies);
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < n; j++)
            if (j != i && dist[i * n + j] <= tau) rho[i]++;
        order[i] = i;
    }
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t k = i; k > 0 && rho[order[k]] > rho[order[k - 1]]; k--) {
            uint32_t t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
    uint64_t cap = prm->max_extra_slots < 0 ? UINT64_MAX : (uint64_t)(prm->max_extra_slots * n),
             replicas = 0;
    uint32_t n_clusters = 0, n_members = 0;
    for (uint32_t q = 0; q < n; q++) {
        uint32_t m = order[q];
        if (copies[m]) continue;
        uint32_t first = n_members;
        start[n_clusters] = first;
        member[n_members++] = m;
        copies[m]++;
        uint32_t cand[64], n_cand = 0;
        uint8_t open[64];
        for (uint32_t x = 0; x < n; x++)
            if (x != m && dist[m * n + x] <= tau) cand[n_cand++] = x;
        for (uint32_t i = 1; i < n_cand; i++)
            for (uint32_t k = i; k > 0; k--) {
                double dk = dist[m * n + cand[k]], dp = dist[m * n + cand[k - 1]];
                if (!(dk < dp)) break;
                uint32_t t = cand[k];
                cand[k] = cand[k - 1];
                cand[k - 1] = t;
            }
        memset(open, 1, sizeof open);
        for (int again = 1; again;) {
            again = 0;
            for (uint32_t k = 0; k < n_cand; k++) {
                if (!open[k]) continue;
                uint32_t x = cand[k];
                if (copies[x] &&
                    (prm->no_replica || (prm->max_copies && copies[x] >= prm->max_copies) ||
                     replicas >= cap)) {
                    open[k] = 0;
                    continue;
                }
                if (!prm->medoid_only) {
                    double sum = 0;
                    for (uint32_t y = first; y < n_members; y++) sum += dist[x * n + member[y]];
                    if (sum > tau * (n_members - first)) continue;
                }
                if (copies[x]) replicas++;
                copies[x]++;
                member[n_members++] = x;
                open[k] = 0;
                again = prm->fixpoint;
            }
        }
        n_clusters++;
    }
    start[n_clusters] = n_members;
    free(rho);
    free(order);
    free(copies);
    return n_clusters;
}

START_TEST(algorithm_1_matches_a_dense_reference_for_every_metric_and_flag) {
    const uint32_t n = 24;
    const kvs_swarm_metric metrics[] = {KVS_SWARM_METRIC_JACCARD, KVS_SWARM_METRIC_RATE};
    const double taus[] = {0.3, 0.5, 0.7};
    uint32_t checked_replicas = 0;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        kvs_swarm_profile *p = small_profile(n, 50, 100 + seed);
        for (int mi = 0; mi < 2; mi++) {
            double dist[24 * 24];
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t j = 0; j < n; j++)
                    dist[i * n + j] = kvs_swarm_distance(p, metrics[mi], i, j);
            kvs_swarm_graph *g = NULL;
            ck_assert_int_eq(kvs_swarm_graph_build(p, metrics[mi], 1.0, 1, &g), KVS_OK);
            for (int ti = 0; ti < 3; ti++)
                for (int flags = 0; flags < 16; flags++) {
                    kvs_swarm_cluster_params prm;
                    kvs_swarm_cluster_defaults(&prm);
                    prm.tau = metrics[mi] == KVS_SWARM_METRIC_RATE ? 0.5 + taus[ti] / 2 : taus[ti];
                    prm.medoid_only = flags & 1;
                    prm.no_replica = (flags >> 1) & 1;
                    prm.fixpoint = (flags >> 2) & 1;
                    if (flags & 8) {
                        prm.max_copies = 0;
                        prm.max_extra_slots = -1.0;
                    }
                    kvs_swarm_clusters *c = NULL;
                    ck_assert_int_eq(kvs_swarm_clusters_create(n, &c), KVS_OK);
                    ck_assert_int_eq(kvs_swarm_cluster_build(g, &prm, c), KVS_OK);
                    uint32_t start[25], member[24 * 24];
                    uint32_t n_ref = dense_reference(n, dist, &prm, start, member);
                    assert_same_clusters(c, n_ref, start, member);
                    if (c->n_slots > n) checked_replicas++;
                    kvs_swarm_clusters_destroy(c);
                }
            kvs_swarm_graph_destroy(g);
        }
        kvs_swarm_profile_destroy(p);
    }
    ck_assert_uint_gt(checked_replicas, 0); /* some case exercised replication */
}
END_TEST

/* The planted workload of notes §6.1 (swarm_synth.h defaults: N 4096, G 192, Zipf 0.5, noise 0.5%). */
static kvs_swarm_synth planted_workload(int scattered, double overlap) {
    kvs_swarm_synth s;
    kvs_swarm_synth_params sp = kvs_swarm_synth_defaults();
    sp.scattered = scattered;
    sp.overlap_fraction = overlap;
    ck_assert_int_eq(kvs_swarm_synth_init(&s, &sp), 0);
    return s;
}

static kvs_swarm_synth planted(int scattered) {
    return planted_workload(scattered, 0.10);
}

/* Calibrated once on the fixed seed and frozen (docs/swarm.md): a pair needs 3 co-activations to be an
 * edge; tau 0.65 for the workload whose overlapping entries fire with two or three groups. */
#define PLANTED_MIN_COUNT 3
#define PLANTED_TAU       0.65

static kvs_swarm_profile *profile_synth(kvs_swarm_synth *s, uint32_t steps) {
    kvs_swarm_profile *p = NULL;
    uint32_t n = s->params.n_entries;
    uint32_t *active = malloc(n * sizeof *active);
    ck_assert_int_eq(kvs_swarm_profile_create(n, 0, &p), KVS_OK);
    for (uint32_t t = 0; t < steps; t++) {
        uint32_t k = kvs_swarm_synth_step(s, active, NULL);
        ck_assert_int_eq(kvs_swarm_profile_add_step(p, active, k), KVS_OK);
    }
    free(active);
    return p;
}

START_TEST(clusters_of_the_planted_workload_keep_every_invariant) {
    kvs_swarm_synth s = planted(0);
    kvs_swarm_profile *p = profile_synth(&s, 400);
    kvs_swarm_graph *g = NULL;
    ck_assert_int_eq(kvs_swarm_graph_build(p, KVS_SWARM_METRIC_JACCARD, 1.0, PLANTED_MIN_COUNT, &g),
                     KVS_OK);
    uint32_t n = s.params.n_entries;
    for (int fixpoint = 0; fixpoint < 2; fixpoint++) {
        kvs_swarm_cluster_params prm;
        kvs_swarm_cluster_defaults(&prm);
        prm.tau = PLANTED_TAU;
        prm.fixpoint = fixpoint;
        kvs_swarm_clusters *c = NULL;
        ck_assert_int_eq(kvs_swarm_clusters_create(n, &c), KVS_OK);
        ck_assert_int_eq(kvs_swarm_cluster_build(g, &prm, c), KVS_OK);
        uint32_t *copies = calloc(n, sizeof *copies);
        for (uint32_t k = 0; k < c->n_clusters; k++) {
            const kvs_swarm_cluster *cl = &c->items[k];
            double sum = 0;
            for (uint32_t m = 0; m < cl->n_members; m++) {
                uint32_t x = cl->members[m];
                copies[x]++;
                if (m == 0) continue;
                ck_assert(kvs_swarm_graph_distance(g, cl->members[0], x) <= prm.tau); /* radius */
                /* Mean distance to the members admitted before x. */
                sum = 0;
                for (uint32_t y = 0; y < m; y++)
                    sum += kvs_swarm_graph_distance(g, x, cl->members[y]);
                ck_assert(sum <= prm.tau * m);
            }
        }
        uint64_t slots = 0;
        for (uint32_t e = 0; e < n; e++) {
            ck_assert_uint_ge(copies[e], 1); /* covered */
            ck_assert_uint_le(copies[e], prm.max_copies);
            ck_assert_uint_eq(copies[e], c->copies[e]);
            slots += copies[e];
        }
        ck_assert_uint_eq(slots, c->n_slots);
        ck_assert_uint_le(slots, n + (uint64_t)(0.25 * n));
        ck_assert_uint_gt(slots, n); /* the overlapping groups did produce replicas */
        free(copies);
        kvs_swarm_clusters_destroy(c);
    }
    kvs_swarm_graph_destroy(g);
    kvs_swarm_profile_destroy(p);
    kvs_swarm_synth_free(&s);
}
END_TEST

/* ---- 6. planted recovery ------------------------------------------------------------------------ */

static double planted_f1(int scattered, double overlap, double tau) {
    kvs_swarm_synth s = planted_workload(scattered, overlap);
    kvs_swarm_profile *p = profile_synth(&s, 400);
    kvs_swarm_graph *g = NULL;
    ck_assert_int_eq(kvs_swarm_graph_build(p, KVS_SWARM_METRIC_JACCARD, 1.0, PLANTED_MIN_COUNT, &g),
                     KVS_OK);
    kvs_swarm_cluster_params prm;
    kvs_swarm_cluster_defaults(&prm);
    prm.tau = tau;
    kvs_swarm_clusters *c = NULL;
    ck_assert_int_eq(kvs_swarm_clusters_create(s.params.n_entries, &c), KVS_OK);
    ck_assert_int_eq(kvs_swarm_cluster_build(g, &prm, c), KVS_OK);
    double precision, recall, f1;
    ck_assert_int_eq(kvs_swarm_synth_pair_f1(&s, c, &precision, &recall, &f1), 0);
    kvs_swarm_clusters_destroy(c);
    kvs_swarm_graph_destroy(g);
    kvs_swarm_profile_destroy(p);
    kvs_swarm_synth_free(&s);
    return f1;
}

#define PLANTED_F1_MIN 0.8

START_TEST(planted_contiguous_groups_are_recovered_with_pairwise_f1_at_least_0_8) {
    double f1 = planted_f1(0, 0.0, 0.5);
    ck_assert_msg(f1 >= PLANTED_F1_MIN, "pairwise F1 %.3f", f1);
}
END_TEST

START_TEST(planted_scattered_groups_are_recovered_with_pairwise_f1_at_least_0_8) {
    double f1 = planted_f1(1, 0.0, 0.5);
    ck_assert_msg(f1 >= PLANTED_F1_MIN, "pairwise F1 %.3f", f1);
}
END_TEST

START_TEST(planted_groups_sharing_entries_are_recovered_with_pairwise_f1_at_least_0_8) {
    double f1 = planted_f1(0, 0.10, PLANTED_TAU);
    ck_assert_msg(f1 >= PLANTED_F1_MIN, "pairwise F1 %.3f", f1);
}
END_TEST

/* ---- 7. placement ------------------------------------------------------------------------------- */

START_TEST(place_with_one_replica_is_eq7_and_keeps_path_totals_within_one) {
    uint64_t rng = 3;
    for (uint32_t n_paths = 1; n_paths <= 8; n_paths++) {
        uint64_t pointer = 0, totals[8] = {0};
        uint32_t paths[64];
        for (int call = 0; call < 200; call++) {
            uint32_t n_units = 1 + rng_below(&rng, 40);
            uint64_t before = pointer;
            kvs_swarm_place(&pointer, n_paths, n_units, 1, paths);
            ck_assert_uint_eq(pointer, before + n_units);
            for (uint32_t k = 0; k < n_units; k++) {
                ck_assert_uint_eq(paths[k], (before + k) % n_paths);
                totals[paths[k]]++;
            }
            uint64_t lo = UINT64_MAX, hi = 0;
            for (uint32_t d = 0; d < n_paths; d++) {
                lo = totals[d] < lo ? totals[d] : lo;
                hi = totals[d] > hi ? totals[d] : hi;
            }
            ck_assert_uint_le(hi - lo, 1);
        }
    }
}
END_TEST

START_TEST(place_puts_the_copies_of_a_unit_on_distinct_paths) {
    uint32_t paths[4 * 8 * 40];
    uint32_t shifted = 0;
    for (uint32_t n_paths = 1; n_paths <= 8; n_paths++)
        for (uint32_t replicas = 1; replicas <= n_paths; replicas++)
            for (uint32_t n_units = 1; n_units <= 40; n_units++)
                for (uint64_t start = 0; start < n_paths; start++) {
                    uint64_t pointer = start + 5 * n_paths;
                    kvs_swarm_place(&pointer, n_paths, n_units, replicas, paths);
                    ck_assert_uint_eq(pointer, start + 5 * n_paths + (uint64_t)n_units * replicas);
                    for (uint32_t u = 0; u < n_units; u++) {
                        ck_assert_uint_eq(paths[u * replicas],
                                          (start + u) % n_paths); /* copy 0: Eq. 7 */
                        for (uint32_t r = 0; r < replicas; r++)
                            for (uint32_t q = 0; q < r; q++)
                                ck_assert_uint_ne(paths[u * replicas + r], paths[u * replicas + q]);
                    }
                    /* Copy 1 continues the stripe unless that would collide with copy 0. */
                    if (replicas >= 2 && paths[1] != (start + n_units) % n_paths) shifted++;
                }
    ck_assert_uint_gt(shifted,
                      0); /* some layouts (n_units a multiple of n_paths) needed the shift */
    /* More replicas than paths: copies repeat paths, no shift; nothing is written for zero units. */
    uint64_t pointer = 0;
    kvs_swarm_place(&pointer, 2, 1, 3, paths);
    ck_assert_uint_eq(paths[0], 0);
    ck_assert_uint_eq(paths[1], 1);
    ck_assert_uint_eq(paths[2], 0);
    ck_assert_uint_eq(pointer, 3);
    kvs_swarm_place(&pointer, 2, 0, 3, paths);
    ck_assert_uint_eq(pointer, 3);
}
END_TEST

static void swarm_place(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                        uint32_t replicas, uint32_t *paths_out) {
    (void)ctx;
    kvs_swarm_place(pointer, n_paths, n_units, replicas, paths_out);
}

/* The expected values were computed from kvs_swarm_place as it stood before the ssd tier's rule was
 * folded into it: a change here moves data the connector's policy already placed. */
START_TEST(place_puts_every_copy_where_earlier_builds_did) {
    static const struct {
        uint32_t n_paths, n_units, replicas;
        uint32_t paths[12];
        uint64_t pointer_after;
    } cases[] = {
        {4, 4, 3, {3, 0, 1, 0, 1, 2, 1, 2, 3, 2, 3, 0}, 19},
        {5, 3, 2, {2, 0, 3, 1, 4, 2}, 13},
        {2, 3, 3, {1, 0, 1, 0, 1, 0, 1, 0, 1}, 16},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t pointer = 7;
        uint32_t out[12];
        kvs_swarm_place(&pointer, cases[c].n_paths, cases[c].n_units, cases[c].replicas, out);
        ck_assert_uint_eq(pointer, cases[c].pointer_after);
        for (uint32_t i = 0; i < cases[c].n_units * cases[c].replicas; i++)
            ck_assert_uint_eq(out[i], cases[c].paths[i]);
    }
    /* every (paths 1..8, replicas 1..9, units 0..9) combination, from two starting pointers */
    ck_assert_uint_eq(kvs_test_placement_digest(swarm_place, NULL, 0), 0xa769e090665ecfb6ull);
    ck_assert_uint_eq(kvs_test_placement_digest(swarm_place, NULL, 0x0123456789abcdefull),
                      0xe72715a7477c3e7dull);
}
END_TEST

static void units_stride_place(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                               uint32_t replicas, uint32_t *paths_out) {
    (void)ctx;
    kvs_swarm_place_stride(pointer, n_paths, n_units, replicas, KVS_SWARM_STRIDE_UNITS, paths_out);
}

/* The units stride is the ssd tier's built-in rule: its expected values (tests/test_ssd_place.c) were
 * computed from that rule before it moved here. */
START_TEST(place_with_the_units_stride_puts_copies_on_the_next_paths_and_counts_units) {
    uint32_t paths[9 * 40];
    for (uint32_t n_paths = 1; n_paths <= 8; n_paths++)
        for (uint32_t replicas = 1; replicas <= n_paths + 1; replicas++)
            for (uint32_t n_units = 1; n_units <= 40; n_units += 3) {
                uint64_t pointer = 3 * n_paths + 1;
                kvs_swarm_place_stride(&pointer, n_paths, n_units, replicas, KVS_SWARM_STRIDE_UNITS,
                                       paths);
                ck_assert_uint_eq(pointer, 3 * n_paths + 1 + (uint64_t)n_units);
                for (uint32_t u = 0; u < n_units; u++)
                    for (uint32_t r = 0; r < replicas; r++)
                        ck_assert_uint_eq(paths[u * replicas + r], (1 + u + r) % n_paths);
            }
    ck_assert_uint_eq(kvs_test_placement_digest(units_stride_place, NULL, 0),
                      0xed48e0dda4128f1aull);
    ck_assert_uint_eq(kvs_test_placement_digest(units_stride_place, NULL, 0x0123456789abcdefull),
                      0xb05a920bd5211491ull);
}
END_TEST

static kvs_swarm_clusters *planted_clusters(kvs_swarm_synth *s,
                                            const kvs_swarm_cluster_params *prm) {
    kvs_swarm_profile *p = profile_synth(s, 300);
    kvs_swarm_graph *g = NULL;
    ck_assert_int_eq(kvs_swarm_graph_build(p, KVS_SWARM_METRIC_JACCARD, 1.0, PLANTED_MIN_COUNT, &g),
                     KVS_OK);
    kvs_swarm_clusters *c = NULL;
    ck_assert_int_eq(kvs_swarm_clusters_create(s->params.n_entries, &c), KVS_OK);
    ck_assert_int_eq(kvs_swarm_cluster_build(g, prm, c), KVS_OK);
    kvs_swarm_graph_destroy(g);
    kvs_swarm_profile_destroy(p);
    return c;
}

START_TEST(cluster_layout_is_balanced_per_path_and_per_cluster_with_contiguous_slots) {
    kvs_swarm_synth s = planted(0);
    kvs_swarm_cluster_params prm;
    kvs_swarm_cluster_defaults(&prm);
    prm.tau = PLANTED_TAU;
    kvs_swarm_clusters *c = planted_clusters(&s, &prm);
    for (uint32_t n_paths = 1; n_paths <= 8; n_paths *= 2) {
        kvs_swarm_layout layout;
        ck_assert_int_eq(kvs_swarm_layout_init(&layout, n_paths, KVS_SWARM_BALANCE_GLOBAL_POINTER),
                         KVS_OK);
        for (uint32_t k = 0; k < c->n_clusters; k++)
            c->items[k].placed = 0; /* re-place for this path count */
        kvs_swarm_layout_place(&layout, c, 0);
        uint64_t lo = UINT64_MAX, hi = 0, sum = 0;
        for (uint32_t d = 0; d < n_paths; d++) {
            lo = layout.next_slot[d] < lo ? layout.next_slot[d] : lo;
            hi = layout.next_slot[d] > hi ? layout.next_slot[d] : hi;
            sum += layout.next_slot[d];
        }
        ck_assert_uint_le(hi - lo, 1);
        ck_assert_uint_eq(sum, c->n_slots);
        for (uint32_t k = 0; k < c->n_clusters; k++) {
            const kvs_swarm_cluster *cl = &c->items[k];
            uint32_t per_path[8] = {0};
            uint64_t last_slot[8];
            for (uint32_t m = 0; m < cl->n_members; m++) {
                uint32_t d = cl->paths[m];
                ck_assert_uint_lt(d, n_paths);
                if (per_path[d]) ck_assert_uint_eq(cl->slots[m], last_slot[d] + 1); /* contiguous */
                last_slot[d] = cl->slots[m];
                per_path[d]++;
                if (n_paths == 1) ck_assert_uint_eq(cl->paths[m], 0);
            }
            uint32_t clo = UINT32_MAX, chi = 0;
            for (uint32_t d = 0; d < n_paths; d++) {
                clo = per_path[d] < clo ? per_path[d] : clo;
                chi = per_path[d] > chi ? per_path[d] : chi;
            }
            ck_assert_uint_le(chi - clo, 1);
        }
    }
    /* One path: slots are the stripe order itself, 0, 1, 2, ... across clusters. */
    uint64_t expect = 0;
    kvs_swarm_layout one;
    ck_assert_int_eq(kvs_swarm_layout_init(&one, 1, KVS_SWARM_BALANCE_GLOBAL_POINTER), KVS_OK);
    for (uint32_t k = 0; k < c->n_clusters; k++) c->items[k].placed = 0;
    kvs_swarm_layout_place(&one, c, 0);
    for (uint32_t k = 0; k < c->n_clusters; k++)
        for (uint32_t m = 0; m < c->items[k].n_members; m++)
            ck_assert_uint_eq(c->items[k].slots[m], expect++);
    /* No balance: every cluster starts on path 0, so path 0 is the fullest. */
    kvs_swarm_layout nb;
    ck_assert_int_eq(kvs_swarm_layout_init(&nb, 8, KVS_SWARM_BALANCE_NONE), KVS_OK);
    for (uint32_t k = 0; k < c->n_clusters; k++) c->items[k].placed = 0;
    kvs_swarm_layout_place(&nb, c, 0);
    for (uint32_t k = 0; k < c->n_clusters; k++) ck_assert_uint_eq(c->items[k].start_path, 0);
    ck_assert_uint_gt(nb.next_slot[0], nb.next_slot[7] + 1);
    kvs_swarm_clusters_destroy(c);
    kvs_swarm_synth_free(&s);
}
END_TEST

/* ---- 8. dedup ----------------------------------------------------------------------------------- */

START_TEST(dedup_keeps_first_occurrences_of_units_not_in_dram) {
    uint64_t rng = 21;
    for (int round = 0; round < 50; round++) {
        uint64_t n = 1 + rng_below(&rng, 300), n_res = rng_below(&rng, 40);
        kvs_swarm_unit *units = malloc(n * sizeof *units), *res = malloc((n_res + 1) * sizeof *res);
        uint64_t *keep = malloc(n * sizeof *keep), n_keep = 0;
        for (uint64_t i = 0; i < n; i++)
            units[i] = (kvs_swarm_unit){rng_below(&rng, 4), rng_below(&rng, 30)};
        for (uint64_t i = 0; i < n_res; i++)
            res[i] = (kvs_swarm_unit){rng_below(&rng, 4), rng_below(&rng, 30)};
        kvs_swarm_units_sort(res, n_res);
        for (uint64_t i = 1; i < n_res; i++)
            ck_assert(res[i - 1].object < res[i].object ||
                      (res[i - 1].object == res[i].object && res[i - 1].unit <= res[i].unit));
        ck_assert_int_eq(kvs_swarm_dedup(units, n, res, n_res, keep, &n_keep), KVS_OK);
        /* Oracle: walk the input; keep i when no earlier equal unit and not resident. */
        uint64_t expect = 0;
        for (uint64_t i = 0; i < n; i++) {
            int dup = 0, resident = 0;
            for (uint64_t j = 0; j < i && !dup; j++)
                dup = units[j].object == units[i].object && units[j].unit == units[i].unit;
            for (uint64_t j = 0; j < n_res && !resident; j++)
                resident = res[j].object == units[i].object && res[j].unit == units[i].unit;
            if (dup || resident) continue;
            ck_assert_uint_lt(expect, n_keep);
            ck_assert_uint_eq(keep[expect], i);
            expect++;
        }
        ck_assert_uint_eq(n_keep, expect);
        free(units);
        free(res);
        free(keep);
    }
    kvs_swarm_unit unsorted[2] = {{1, 5}, {1, 4}}, one = {1, 4};
    uint64_t keep[1], n_keep = 9;
    ck_assert_int_eq(kvs_swarm_dedup(&one, 1, unsorted, 2, keep, &n_keep), KVS_EINVAL);
    ck_assert_uint_eq(n_keep, 0);
}
END_TEST

START_TEST(merged_clusters_hold_no_duplicate_and_no_dram_resident_entry) {
    kvs_swarm_synth s = planted(0);
    kvs_swarm_cluster_params prm;
    kvs_swarm_cluster_defaults(&prm);
    prm.tau = PLANTED_TAU;
    kvs_swarm_clusters *c = planted_clusters(&s, &prm);
    uint32_t n = s.params.n_entries;
    uint32_t *stamp = malloc(n * sizeof *stamp), *out = malloc(4 * n * sizeof *out);
    uint8_t *dram = calloc(n, 1), *in_union = calloc(n, 1);
    kvs_swarm_seen seen;
    kvs_swarm_seen_init(&seen, stamp, n);
    uint64_t rng = 5;
    uint64_t shared_members = 0;
    for (int step = 0; step < 100; step++) {
        kvs_swarm_seen_begin(&seen);
        memset(dram, 0, n);
        memset(in_union, 0, n);
        /* DRAM: the medoids of every cluster and a window of the last 256 entries. */
        for (uint32_t k = 0; k < c->n_clusters; k++) {
            dram[c->items[k].members[0]] = 1;
            kvs_swarm_seen_mark(&seen, c->items[k].members[0]);
        }
        for (uint32_t e = n - 256; e < n; e++) {
            dram[e] = 1;
            kvs_swarm_seen_mark(&seen, e);
        }
        uint32_t n_out = 0, n_requested = 0;
        for (int pick = 0; pick < 30; pick++) {
            const kvs_swarm_cluster *cl = &c->items[rng_below(&rng, c->n_clusters)];
            for (uint32_t m = 0; m < cl->n_members; m++) {
                uint32_t e = cl->members[m];
                n_requested++;
                if (!dram[e]) in_union[e] = 1;
                if (kvs_swarm_seen_mark(&seen, e)) out[n_out++] = e;
            }
        }
        uint32_t n_union = 0;
        for (uint32_t e = 0; e < n; e++) n_union += in_union[e];
        ck_assert_uint_eq(n_out, n_union);
        for (uint32_t i = 0; i < n_out; i++) {
            ck_assert(!dram[out[i]]);
            ck_assert(in_union[out[i]]);
            in_union[out[i]] = 0; /* a second occurrence would fail the line above */
        }
        shared_members += n_requested - n_out;
    }
    ck_assert_uint_gt(shared_members, 0);
    /* The epoch wraps by clearing. */
    seen.epoch = UINT32_MAX;
    kvs_swarm_seen_begin(&seen);
    ck_assert_uint_eq(seen.epoch, 1);
    ck_assert_int_eq(kvs_swarm_seen_mark(&seen, 3), 1);
    ck_assert_int_eq(kvs_swarm_seen_mark(&seen, 3), 0);
    free(stamp);
    free(out);
    free(dram);
    free(in_union);
    kvs_swarm_clusters_destroy(c);
    kvs_swarm_synth_free(&s);
}
END_TEST

/* ---- 9. scheduler ------------------------------------------------------------------------------- */

#define MAXC 4

typedef struct instance {
    uint32_t n_paths;
    uint32_t n;
    uint32_t n_copies[16];
    uint32_t paths[16 * MAXC];
} instance;

static uint32_t holds(const instance *in, uint32_t r, uint32_t d) {
    for (uint32_t c = 0; c < in->n_copies[r]; c++)
        if (in->paths[r * MAXC + c] == d) return 1;
    return 0;
}

/* Branch and bound over every assignment: the optimal makespan in reads. */
static void optimum_dfs(const instance *in, uint32_t r, uint32_t *load, uint32_t current,
                        uint32_t *best) {
    if (current >= *best) return;
    if (r == in->n) {
        *best = current;
        return;
    }
    for (uint32_t d = 0; d < in->n_paths; d++) {
        if (!holds(in, r, d)) continue;
        load[d]++;
        optimum_dfs(in, r + 1, load, load[d] > current ? load[d] : current, best);
        load[d]--;
    }
}

static uint32_t optimum(const instance *in) {
    uint32_t load[8] = {0}, best = UINT32_MAX;
    optimum_dfs(in, 0, load, 0, &best);
    return best;
}

static void random_instance(uint64_t *rng, instance *in) {
    in->n_paths = 2 + rng_below(rng, 3);
    in->n = 3 + rng_below(rng, 10);
    for (uint32_t r = 0; r < in->n; r++) {
        in->n_copies[r] = 1 + rng_below(rng, 3);
        for (uint32_t c = 0; c < in->n_copies[r]; c++)
            in->paths[r * MAXC + c] = rng_below(rng, in->n_paths); /* repeats allowed: count once */
    }
}

/* chosen[] valid and order[] the round-robin interleave of the buckets, each in ascending index. */
static uint32_t check_schedule(const instance *in, const uint32_t *chosen, const uint64_t *order) {
    uint32_t size[8] = {0};
    for (uint32_t r = 0; r < in->n; r++) {
        ck_assert_uint_lt(chosen[r], in->n_paths);
        ck_assert(holds(in, r, chosen[r]));
        size[chosen[r]]++;
    }
    uint32_t pos = 0, next[8] = {0};
    for (uint32_t round = 0; pos < in->n; round++)
        for (uint32_t d = 0; d < in->n_paths; d++) {
            if (size[d] <= round) continue;
            uint32_t r = next[d];
            while (chosen[r] != d) r++;
            ck_assert_uint_eq(order[pos], r);
            pos++;
            next[d] = r + 1;
        }
    uint32_t makespan = 0;
    for (uint32_t d = 0; d < in->n_paths; d++) makespan = size[d] > makespan ? size[d] : makespan;
    return makespan;
}

START_TEST(greedy_is_within_one_of_the_brute_force_optimum_and_usually_equal) {
    uint64_t rng = 99;
    uint32_t equal = 0, total = 3000;
    for (uint32_t t = 0; t < total; t++) {
        instance in;
        random_instance(&rng, &in);
        uint32_t chosen[16];
        uint64_t order[16];
        kvs_swarm_schedule(in.n_paths, in.n, MAXC, in.n_copies, in.paths, chosen, order);
        uint32_t greedy = check_schedule(&in, chosen, order), opt = optimum(&in);
        ck_assert_uint_ge(greedy, opt);
        ck_assert_uint_le(greedy, opt + 1);
        equal += greedy == opt;
    }
    ck_assert_msg(equal * 100 >= 97 * total, "greedy equal to the optimum in %u of %u", equal,
                  total);
}
END_TEST

START_TEST(single_copy_reads_stay_on_their_path_and_full_replication_is_water_filling) {
    /* Each read is either on one path (listed twice: still one path) or on every path; the optimum is
     * then max(most forced reads on one path, ceil(n / n_paths)) and the greedy must reach it. */
    uint64_t rng = 5;
    uint32_t above_fill = 0;
    for (int t = 0; t < 500; t++) {
        instance in;
        in.n_paths = 2 + rng_below(&rng, MAXC - 1);
        in.n = 1 + rng_below(&rng, 16);
        uint32_t forced[MAXC] = {0};
        uint8_t fixed[16] = {0};
        for (uint32_t r = 0; r < in.n; r++) {
            fixed[r] = (uint8_t)rng_below(&rng, 2);
            if (fixed[r]) {
                uint32_t d = rng_below(&rng, in.n_paths);
                in.n_copies[r] = 2;
                in.paths[r * MAXC] = in.paths[r * MAXC + 1] = d;
                forced[d]++;
            } else {
                in.n_copies[r] = in.n_paths;
                for (uint32_t c = 0; c < in.n_paths; c++)
                    in.paths[r * MAXC + c] = in.n_paths - 1 - c;
            }
        }
        uint32_t chosen[16];
        uint64_t order[16];
        kvs_swarm_schedule(in.n_paths, in.n, MAXC, in.n_copies, in.paths, chosen, order);
        uint32_t makespan = check_schedule(&in, chosen, order), max_forced = 0;
        for (uint32_t r = 0; r < in.n; r++)
            if (fixed[r]) ck_assert_uint_eq(chosen[r], in.paths[r * MAXC]);
        for (uint32_t d = 0; d < in.n_paths; d++)
            max_forced = forced[d] > max_forced ? forced[d] : max_forced;
        uint32_t fill = (in.n + in.n_paths - 1) / in.n_paths;
        ck_assert_uint_eq(makespan, max_forced > fill ? max_forced : fill);
        above_fill += max_forced > fill;
    }
    ck_assert_uint_gt(above_fill, 0); /* both terms of the optimum were exercised */
}
END_TEST

START_TEST(unplaceable_reads_go_last_and_weighted_load_favours_the_fast_path) {
    /* Read 1 is held by no valid path (9 >= n_paths), read 3 by no path at all. */
    const uint32_t n_copies[4] = {1, 1, 2, 0};
    const uint32_t paths[4 * 2] = {0, 0, 9, 0, 0, 1, 0, 0};
    uint32_t chosen[4];
    uint64_t order[4];
    kvs_swarm_schedule(2, 4, 2, n_copies, paths, chosen, order);
    ck_assert_uint_eq(chosen[0], 0);
    ck_assert_uint_eq(chosen[1], KVS_SWARM_NO_PATH);
    ck_assert_uint_eq(chosen[2], 1);
    ck_assert_uint_eq(chosen[3], KVS_SWARM_NO_PATH);
    ck_assert_uint_eq(order[0], 0);
    ck_assert_uint_eq(order[1], 2);
    ck_assert_uint_eq(order[2], 1);
    ck_assert_uint_eq(order[3], 3);

    /* 40 equal reads on both of two paths, path 1 three times faster: it should take about 3/4. */
    uint32_t nc[40], p2[80], ch[40];
    uint64_t bytes[40], ord[40];
    const double bw[2] = {1e9, 3e9};
    for (uint32_t r = 0; r < 40; r++) {
        nc[r] = 2;
        p2[2 * r] = 0;
        p2[2 * r + 1] = 1;
        bytes[r] = 4096;
    }
    kvs_swarm_schedule_weighted(2, 40, 2, nc, p2, bytes, bw, ch, ord);
    uint32_t on_fast = 0;
    for (uint32_t r = 0; r < 40; r++) on_fast += ch[r] == 1;
    ck_assert_uint_eq(on_fast, 30);
    /* Equal rates and sizes: the same choice as the unweighted scheduler. */
    uint64_t rng = 8;
    for (int t = 0; t < 200; t++) {
        instance in;
        random_instance(&rng, &in);
        uint32_t a[16], b[16];
        uint64_t oa[16], ob[16], sz[16];
        double rate[8];
        for (uint32_t r = 0; r < 16; r++) sz[r] = 4096;
        for (uint32_t d = 0; d < 8; d++) rate[d] = 5e9;
        kvs_swarm_schedule(in.n_paths, in.n, MAXC, in.n_copies, in.paths, a, oa);
        kvs_swarm_schedule_weighted(in.n_paths, in.n, MAXC, in.n_copies, in.paths, sz, rate, b, ob);
        for (uint32_t r = 0; r < in.n; r++) {
            ck_assert_uint_eq(a[r], b[r]);
            ck_assert_uint_eq(oa[r], ob[r]);
        }
    }
}
END_TEST

/* ---- 11. maintenance ---------------------------------------------------------------------------- */

typedef struct maint_fixture {
    kvs_swarm_clusters *c;
    kvs_swarm_layout layout;
    kvs_swarm_maint *m;
} maint_fixture;

/* Clusters {0, 1, 2} and {3, 4} on 4 paths: starts 0 and 3; next slots 2, 1, 1, 1 after placement. */
static void maint_setup(maint_fixture *f, uint32_t paper_offset, double tau) {
    ck_assert_int_eq(kvs_swarm_clusters_create(32, &f->c), KVS_OK);
    uint32_t k;
    ck_assert_int_eq(kvs_swarm_clusters_add(f->c, &k), KVS_OK);
    for (uint32_t e = 0; e < 3; e++)
        ck_assert_int_eq(kvs_swarm_clusters_add_member(f->c, k, e), KVS_OK);
    ck_assert_int_eq(kvs_swarm_clusters_add(f->c, &k), KVS_OK);
    for (uint32_t e = 3; e < 5; e++)
        ck_assert_int_eq(kvs_swarm_clusters_add_member(f->c, k, e), KVS_OK);
    ck_assert_int_eq(kvs_swarm_layout_init(&f->layout, 4, KVS_SWARM_BALANCE_GLOBAL_POINTER),
                     KVS_OK);
    kvs_swarm_layout_place(&f->layout, f->c, 0);
    ck_assert_uint_eq(f->c->items[0].start_path, 0);
    ck_assert_uint_eq(f->c->items[1].start_path, 3);
    kvs_swarm_maint_params prm;
    kvs_swarm_maint_defaults(&prm);
    prm.window_steps = 10;
    prm.tau = tau;
    prm.paper_offset = paper_offset;
    prm.pending_windows = 0;
    ck_assert_int_eq(kvs_swarm_maint_create(&prm, f->c, &f->layout, &f->m), KVS_OK);
}

static void maint_teardown(maint_fixture *f) {
    kvs_swarm_maint_destroy(f->m);
    kvs_swarm_clusters_destroy(f->c);
}

/* Ten steps. Cluster 0's medoid fires in steps 0-7, cluster 1's in 3-9. Entry 10 fires in 0-4 (5 with
 * cluster 0: exactly (1 - tau) W at tau 0.5; 2 with cluster 1), entry 11 in every step (8 and 7), and
 * entries 12 and 13 together in 6-9 (4 with cluster 1, 2 with cluster 0). */
static void maint_run(maint_fixture *f) {
    for (uint32_t e = 10; e <= 13; e++) ck_assert_int_eq(kvs_swarm_maint_add(f->m, e), KVS_OK);
    for (uint32_t t = 0; t < 10; t++) {
        uint32_t active[8], n = 0, clusters[2], n_c = 0;
        if (t < 5) active[n++] = 10;
        active[n++] = 11;
        if (t >= 6) {
            active[n++] = 12;
            active[n++] = 13;
        }
        if (t < 8) clusters[n_c++] = 0;
        if (t >= 3) clusters[n_c++] = 1;
        ck_assert_int_eq(kvs_swarm_maint_step(f->m, active, n, clusters, n_c), KVS_OK);
        if (t < 9) ck_assert_uint_eq(f->m->n_placed, 0); /* nobody leaves before W steps */
    }
}

static int member_at(const kvs_swarm_clusters *c, uint32_t k, uint32_t entry, uint32_t *path) {
    for (uint32_t m = 0; m < c->items[k].n_members; m++)
        if (c->items[k].members[m] == entry) {
            *path = c->items[k].paths[m];
            return 1;
        }
    return 0;
}

START_TEST(new_entry_joins_matching_clusters_continuing_their_stripe) {
    maint_fixture f;
    maint_setup(&f, 0, 0.5);
    maint_run(&f);
    uint32_t path;
    /* 10: f = 5 = (1 - tau) W joins C0 (<=); it is C0's 4th member: (0 + 3) mod 4. */
    ck_assert(member_at(f.c, 0, 10, &path));
    ck_assert_uint_eq(path, 3);
    ck_assert(!member_at(f.c, 1, 10, &path));
    /* 11 joins both: two replicas. In C0 as 5th member (0 + 4) mod 4 = 0; in C1 as 3rd, (3 + 2) mod 4. */
    ck_assert(member_at(f.c, 0, 11, &path));
    ck_assert_uint_eq(path, 0);
    ck_assert(member_at(f.c, 1, 11, &path));
    ck_assert_uint_eq(path, 1);
    ck_assert_uint_eq(f.c->copies[11], 2);
    /* 12 and 13 matched nothing (4 of 10 < 5): pending. */
    ck_assert_uint_eq(f.c->copies[12], 0);
    ck_assert_uint_eq(f.m->n_pending, 2);
    ck_assert_uint_eq(f.m->n_joined, 2);
    ck_assert_uint_eq(f.m->n_replicas, 1);
    /* The log names each copy's path and slot: 10 took path 3's slot 1 (after C1's medoid). */
    ck_assert_uint_eq(f.m->n_placed, 3);
    ck_assert_uint_eq(f.m->placed[0].entry, 10);
    ck_assert_uint_eq(f.m->placed[0].path, 3);
    ck_assert_uint_eq(f.m->placed[0].slot, 1);
    /* Flushing the pool clusters 12 with 13 and places the new cluster on the global stripe at 5. */
    uint32_t before = f.c->n_clusters;
    ck_assert_int_eq(kvs_swarm_maint_flush(f.m), KVS_OK);
    ck_assert_uint_eq(f.c->n_clusters, before + 1);
    const kvs_swarm_cluster *nc = &f.c->items[before];
    ck_assert_uint_eq(nc->n_members, 2);
    ck_assert_uint_eq(nc->start_path, 5 % 4);
    ck_assert_uint_eq(f.m->n_pending, 0);
    ck_assert_uint_eq(f.m->n_placed, 5);
    maint_teardown(&f);
}
END_TEST

START_TEST(paper_offset_places_one_path_further_and_a_tighter_tau_rejects_the_boundary) {
    maint_fixture f;
    maint_setup(&f, 1, 0.5);
    maint_run(&f);
    uint32_t path;
    ck_assert(member_at(f.c, 0, 10, &path));
    ck_assert_uint_eq(path, 0); /* (0 + 3 + 1) mod 4 */
    ck_assert(member_at(f.c, 1, 11, &path));
    ck_assert_uint_eq(path, 2); /* (3 + 2 + 1) mod 4 */
    maint_teardown(&f);

    maint_setup(&f, 0, 0.45); /* needs f >= 5.5 of 10: entry 10 (5) now waits in the pool */
    maint_run(&f);
    ck_assert_uint_eq(f.c->copies[10], 0);
    ck_assert_uint_eq(f.c->copies[11], 2);
    ck_assert_uint_eq(f.m->n_pending, 3);
    maint_teardown(&f);
}
END_TEST

START_TEST(pool_is_clustered_every_k_windows_and_max_copies_keeps_the_closest_cluster) {
    maint_fixture f;
    maint_setup(&f, 0, 0.5);
    f.m->params.pending_windows = 2; /* every 20 steps */
    f.m->params.max_copies = 1;
    maint_run(&f);
    /* Entry 11 matched both clusters (8 and 7 of 10) but may join one: the closer, cluster 0. */
    uint32_t path;
    ck_assert_uint_eq(f.c->copies[11], 1);
    ck_assert(member_at(f.c, 0, 11, &path));
    ck_assert_uint_eq(f.m->n_pending, 2);
    uint32_t before = f.c->n_clusters;
    for (uint32_t t = 10; t < 20; t++) {
        ck_assert_uint_eq(f.c->n_clusters, before); /* not due before step 20 */
        ck_assert_int_eq(kvs_swarm_maint_step(f.m, NULL, 0, NULL, 0), KVS_OK);
    }
    ck_assert_uint_eq(f.c->n_clusters, before + 1);
    ck_assert_uint_eq(f.m->n_pending, 0);
    ck_assert_uint_eq(f.m->n_pool_clusters, 1);
    maint_teardown(&f);
}
END_TEST

START_TEST(a_stream_of_new_entries_each_leaves_the_window_after_exactly_w_steps) {
    maint_fixture f;
    ck_assert_int_eq(kvs_swarm_layout_init(&f.layout, 4, KVS_SWARM_BALANCE_GLOBAL_POINTER), KVS_OK);
    ck_assert_int_eq(kvs_swarm_clusters_create(4000, &f.c), KVS_OK);
    uint32_t k;
    ck_assert_int_eq(kvs_swarm_clusters_add(f.c, &k), KVS_OK);
    ck_assert_int_eq(kvs_swarm_clusters_add_member(f.c, k, 0), KVS_OK);
    kvs_swarm_layout_place(&f.layout, f.c, 0);
    kvs_swarm_maint_params prm;
    kvs_swarm_maint_defaults(&prm);
    prm.window_steps = 7;
    prm.pending_windows = 3;
    ck_assert_int_eq(kvs_swarm_maint_create(&prm, f.c, &f.layout, &f.m), KVS_OK);
    /* Two new entries a step; even ones fire with cluster 0's medoid every step, odd ones never. */
    uint32_t next = 1;
    for (uint32_t t = 0; t < 1500; t++) {
        uint32_t active[16], n = 0;
        for (int i = 0; i < 2; i++) ck_assert_int_eq(kvs_swarm_maint_add(f.m, next++), KVS_OK);
        for (uint32_t e = next > 16 ? next - 16 : 1; e < next; e++)
            if (e % 2 == 0) active[n++] = e;
        const uint32_t cluster0 = 0;
        ck_assert_int_eq(kvs_swarm_maint_step(f.m, active, n, &cluster0, 1), KVS_OK);
        uint64_t left = t + 1 >= prm.window_steps ? 2ull * (t + 2 - prm.window_steps) : 0;
        ck_assert_uint_eq(f.m->n_joined + f.m->n_pooled, left);
    }
    ck_assert_uint_eq(f.m->n_joined, f.m->n_pooled); /* the even half joined, the odd half pooled */
    ck_assert_uint_eq(f.c->items[0].n_members, 1 + f.m->n_joined);
    ck_assert_int_eq(kvs_swarm_maint_add(f.m, next - 1), KVS_EINVAL); /* already in the window */
    maint_teardown(&f);
}
END_TEST

/* ---- 12. cache ---------------------------------------------------------------------------------- */

static kvs_swarm_cache_params cache_params(kvs_swarm_cache_policy policy, uint64_t capacity) {
    kvs_swarm_cache_params p;
    memset(&p, 0, sizeof p);
    p.policy = policy;
    p.formula = KVS_SWARM_SCORE_PAPER;
    p.capacity_entries = capacity;
    p.t_base_s = 80e-6; /* QD1 4 KiB read */
    p.t_transfer_s = 4096 / 6.9e9;
    return p;
}

static void assert_heap(const kvs_swarm_cache *c) {
    uint64_t used = 0;
    uint32_t n_cached = 0;
    for (uint32_t k = 0; k < c->n_clusters; k++)
        if (c->cached[k]) {
            used += c->size[k];
            n_cached++;
            ck_assert_uint_lt(c->heap_pos[k], c->n_heap);
            ck_assert_uint_eq(c->heap[c->heap_pos[k]], k);
        }
    ck_assert_uint_eq(n_cached, c->n_heap);
    ck_assert_uint_eq(used, c->used_entries);
    ck_assert_uint_le(used, c->params.capacity_entries);
    for (uint32_t i = 1; i < c->n_heap; i++) {
        uint32_t parent = c->heap[(i - 1) / 2], child = c->heap[i];
        if (c->params.policy == KVS_SWARM_CACHE_LRU) {
            uint64_t up = c->last_use[parent], uc = c->last_use[child];
            ck_assert(up < uc || (up == uc && parent < child));
        } else {
            double sp = kvs_swarm_cache_score(c, parent), sc = kvs_swarm_cache_score(c, child);
            ck_assert(sp < sc || (sp == sc && parent < child));
        }
    }
}

START_TEST(frequencies_move_by_one_and_the_heap_holds_after_every_step) {
    const uint32_t sizes[4] = {2, 3, 4, 5}, freqs[4] = {0, 5, 1, 0};
    kvs_swarm_cache_params p = cache_params(KVS_SWARM_CACHE_SCORE, 100);
    kvs_swarm_cache *c = NULL;
    ck_assert_int_eq(kvs_swarm_cache_create(&p, 4, sizes, freqs, &c), KVS_OK);
    const uint32_t s1[] = {0, 1, 1};
    kvs_swarm_cache_result r;
    ck_assert_int_eq(kvs_swarm_cache_step(c, s1, 3, &r), KVS_OK);
    ck_assert_uint_eq(r.misses, 2); /* 1 listed twice counts once */
    ck_assert_uint_eq(r.hits, 0);
    ck_assert_uint_eq(c->freq[0], 1);
    ck_assert_uint_eq(c->freq[1], 6);
    ck_assert_uint_eq(c->freq[2], 1); /* not cached, not active: unchanged */
    ck_assert(c->cached[0] && c->cached[1]);
    const uint32_t s2[] = {2};
    ck_assert_int_eq(kvs_swarm_cache_step(c, s2, 1, &r), KVS_OK);
    ck_assert_uint_eq(c->freq[0], 0); /* cached and inactive: -1 */
    ck_assert_uint_eq(c->freq[1], 5);
    ck_assert_uint_eq(c->freq[2], 2);
    ck_assert_int_eq(kvs_swarm_cache_step(c, s2, 1, &r), KVS_OK);
    ck_assert_uint_eq(c->freq[0], 0); /* clamped */
    ck_assert_uint_eq(r.hits, 1);
    ck_assert_uint_eq(r.hit_entries, 4);
    const uint32_t bad[] = {4};
    ck_assert_int_eq(kvs_swarm_cache_step(c, bad, 1, &r), KVS_EINVAL);
    kvs_swarm_cache_destroy(c);

    /* A random trace over both policies: the heap and the budget hold after every step. */
    uint32_t sz[60], fq[60];
    uint64_t rng = 13;
    for (uint32_t k = 0; k < 60; k++) {
        sz[k] = 1 + rng_below(&rng, 12);
        fq[k] = rng_below(&rng, 5);
    }
    for (int policy = 0; policy < 2; policy++) {
        kvs_swarm_cache_params q = cache_params((kvs_swarm_cache_policy)policy, 80);
        ck_assert_int_eq(kvs_swarm_cache_create(&q, 60, sz, fq, &c), KVS_OK);
        for (int t = 0; t < 300; t++) {
            uint32_t act[8];
            uint32_t n = 1 + rng_below(&rng, 8);
            for (uint32_t i = 0; i < n; i++) act[i] = rng_below(&rng, 60);
            ck_assert_int_eq(kvs_swarm_cache_step(c, act, n, NULL), KVS_OK);
            assert_heap(c);
        }
        ck_assert_uint_gt(c->total.evicted, 0);
        kvs_swarm_cache_destroy(c);
    }
}
END_TEST

START_TEST(lowest_score_cluster_is_evicted_first) {
    /* Equal sizes, so S orders as f. Capacity holds three clusters. */
    const uint32_t sizes[4] = {4, 4, 4, 4}, freqs[4] = {9, 3, 6, 0};
    kvs_swarm_cache_params p = cache_params(KVS_SWARM_CACHE_SCORE, 12);
    kvs_swarm_cache *c = NULL;
    ck_assert_int_eq(kvs_swarm_cache_create(&p, 4, sizes, freqs, &c), KVS_OK);
    const uint32_t warm[] = {0, 1, 2};
    ck_assert_int_eq(kvs_swarm_cache_step(c, warm, 3, NULL), KVS_OK); /* f: 10, 4, 7 */
    ck_assert(c->cached[0] && c->cached[1] && c->cached[2]);
    ck_assert_uint_eq(c->heap[0], 1);
    /* Cluster 3 fires six times; each time it is below cluster 1 until its f passes cluster 1's. */
    const uint32_t three[] = {3};
    kvs_swarm_cache_result r;
    int admitted_at = -1;
    for (int t = 0; t < 6 && admitted_at < 0; t++) {
        ck_assert_int_eq(kvs_swarm_cache_step(c, three, 1, &r), KVS_OK);
        if (r.admitted) admitted_at = t;
    }
    /* f3 after t+1 steps is t+1; f1 drops to 4 - (t+1). They cross at t = 1 (2 > 2 fails), t = 2. */
    ck_assert_int_eq(admitted_at, 2);
    ck_assert(!c->cached[1]); /* the lowest S went */
    ck_assert(c->cached[0] && c->cached[2] && c->cached[3]);
    ck_assert_uint_eq(r.evicted, 1);
    kvs_swarm_cache_destroy(c);
}
END_TEST

START_TEST(score_cache_beats_lru_on_big_one_shot_and_small_recurrent_clusters) {
    /* 10 small clusters (4 entries) each fire in half the steps; every step brings a new big cluster
     * (40 entries) that never fires again; DRAM holds 60 entries. LRU lets each big one flush the small
     * ones; S keeps them because a big one-shot cluster scores f * t_base / 40 against f * t_base / 4.
     * (With reuse rarer than every other step the -1 rule drains cached clusters to f = 0 and LRU wins;
     * docs/swarm.md reports both regimes.) */
    enum { SMALL = 10, BIG = 300 };
    uint32_t sizes[SMALL + BIG];
    for (uint32_t k = 0; k < SMALL + BIG; k++) sizes[k] = k < SMALL ? 4 : 40;
    double hit_rate[2], entry_hit_rate[2];
    for (int policy = 0; policy < 2; policy++) {
        kvs_swarm_cache_params p = cache_params((kvs_swarm_cache_policy)policy, 60);
        kvs_swarm_cache *c = NULL;
        ck_assert_int_eq(kvs_swarm_cache_create(&p, SMALL + BIG, sizes, NULL, &c), KVS_OK);
        uint64_t rng = 77;
        for (uint32_t t = 0; t < BIG; t++) {
            uint32_t act[SMALL + 1], n = 0;
            for (uint32_t k = 0; k < SMALL; k++)
                if (rng_below(&rng, 2)) act[n++] = k;
            act[n++] = SMALL + t;
            ck_assert_int_eq(kvs_swarm_cache_step(c, act, n, NULL), KVS_OK);
        }
        hit_rate[policy] = (double)c->total.hits / (double)(c->total.hits + c->total.misses);
        entry_hit_rate[policy] =
            (double)c->total.hit_entries / (double)(c->total.hit_entries + c->total.miss_entries);
        kvs_swarm_cache_destroy(c);
    }
    ck_assert_msg(hit_rate[KVS_SWARM_CACHE_SCORE] > hit_rate[KVS_SWARM_CACHE_LRU],
                  "score %.3f, LRU %.3f", hit_rate[0], hit_rate[1]);
    ck_assert(entry_hit_rate[KVS_SWARM_CACHE_SCORE] > entry_hit_rate[KVS_SWARM_CACHE_LRU]);
}
END_TEST

/* ---- virtual-time disk model -------------------------------------------------------------------- */

START_TEST(disk_model_sums_or_maxes_per_path_and_the_step_waits_for_the_slowest) {
    kvs_swarm_disk pm = kvs_swarm_disk_pm9a3(), op = kvs_swarm_disk_optane_900p();
    ck_assert(fabs(kvs_swarm_disk_time(&pm, KVS_SWARM_TIME_SUM, 1100, 6900000) - (1e-3 + 1e-3)) <
              1e-12);
    ck_assert(fabs(kvs_swarm_disk_time(&pm, KVS_SWARM_TIME_MAX, 1100, 3450000) - 1e-3) < 1e-12);
    kvs_swarm_disk disks[2] = {pm, op};
    uint64_t ios[2] = {550, 550}, bytes[2] = {0, 0};
    double per[2];
    double t = kvs_swarm_step_time(disks, 2, KVS_SWARM_TIME_SUM, ios, bytes, per);
    ck_assert(fabs(per[0] - 0.5e-3) < 1e-12);
    ck_assert(fabs(per[1] - 1e-3) < 1e-12);
    ck_assert(t == per[1]);
    const uint32_t chosen[5] = {0, 1, 1, KVS_SWARM_NO_PATH, 0};
    const uint64_t sz[5] = {10, 20, 30, 40, 50};
    kvs_swarm_tally(2, 5, chosen, sz, 0, ios, bytes);
    ck_assert_uint_eq(ios[0], 2);
    ck_assert_uint_eq(ios[1], 2);
    ck_assert_uint_eq(bytes[0], 60);
    ck_assert_uint_eq(bytes[1], 50);
    const uint64_t slots[8] = {3, 4, 4, 5, 9, 10, 11, 12};
    ck_assert_uint_eq(kvs_swarm_coalesced_ios(slots, 8, 4096, 0), 7);          /* no merging */
    ck_assert_uint_eq(kvs_swarm_coalesced_ios(slots, 8, 4096, 128 * 1024), 2); /* 3-5, 9-12 */
    ck_assert_uint_eq(kvs_swarm_coalesced_ios(slots, 8, 4096, 2 * 4096),
                      4); /* 3-4, 5, 9-10, 11-12 */
}
END_TEST

static Suite *swarm_suite(void) {
    Suite *s = suite_create("swarm");
    TCase *profile = tcase_create("profile");
    tcase_add_test(profile, profile_of_a_three_step_trace_has_exact_symmetric_counts);
    tcase_add_test(profile,
                   pruned_profile_keeps_frequent_pairs_and_undercounts_by_at_most_the_floor);
    tcase_add_test(profile, jaccard_distance_is_in_unit_range_and_zero_for_identical_histories);
    tcase_add_test(profile, global_metric_clusters_equal_the_raw_count_threshold_clusters);
    suite_add_tcase(s, profile);

    TCase *cluster = tcase_create("cluster");
    tcase_set_timeout(cluster, 60);
    tcase_add_test(cluster, density_and_medoid_queue_of_a_hand_graph_break_ties_by_index);
    tcase_add_test(cluster, shared_companion_is_replicated_and_no_replica_keeps_one_copy);
    tcase_add_test(cluster, algorithm_1_matches_a_dense_reference_for_every_metric_and_flag);
    tcase_add_test(cluster, clusters_of_the_planted_workload_keep_every_invariant);
    tcase_add_test(cluster, planted_contiguous_groups_are_recovered_with_pairwise_f1_at_least_0_8);
    tcase_add_test(cluster, planted_scattered_groups_are_recovered_with_pairwise_f1_at_least_0_8);
    tcase_add_test(cluster,
                   planted_groups_sharing_entries_are_recovered_with_pairwise_f1_at_least_0_8);
    suite_add_tcase(s, cluster);

    TCase *place = tcase_create("placement");
    tcase_add_test(place, place_with_one_replica_is_eq7_and_keeps_path_totals_within_one);
    tcase_add_test(place, place_puts_the_copies_of_a_unit_on_distinct_paths);
    tcase_add_test(place, place_puts_every_copy_where_earlier_builds_did);
    tcase_add_test(place,
                   place_with_the_units_stride_puts_copies_on_the_next_paths_and_counts_units);
    tcase_add_test(place,
                   cluster_layout_is_balanced_per_path_and_per_cluster_with_contiguous_slots);
    suite_add_tcase(s, place);

    TCase *io = tcase_create("dedup_and_schedule");
    tcase_set_timeout(io, 60);
    tcase_add_test(io, dedup_keeps_first_occurrences_of_units_not_in_dram);
    tcase_add_test(io, merged_clusters_hold_no_duplicate_and_no_dram_resident_entry);
    tcase_add_test(io, greedy_is_within_one_of_the_brute_force_optimum_and_usually_equal);
    tcase_add_test(io, single_copy_reads_stay_on_their_path_and_full_replication_is_water_filling);
    tcase_add_test(io, unplaceable_reads_go_last_and_weighted_load_favours_the_fast_path);
    tcase_add_test(io, disk_model_sums_or_maxes_per_path_and_the_step_waits_for_the_slowest);
    suite_add_tcase(s, io);

    TCase *online = tcase_create("maintenance_and_cache");
    tcase_add_test(online, new_entry_joins_matching_clusters_continuing_their_stripe);
    tcase_add_test(online,
                   paper_offset_places_one_path_further_and_a_tighter_tau_rejects_the_boundary);
    tcase_add_test(online,
                   pool_is_clustered_every_k_windows_and_max_copies_keeps_the_closest_cluster);
    tcase_add_test(online, a_stream_of_new_entries_each_leaves_the_window_after_exactly_w_steps);
    tcase_add_test(online, frequencies_move_by_one_and_the_heap_holds_after_every_step);
    tcase_add_test(online, lowest_score_cluster_is_evicted_first);
    tcase_add_test(online, score_cache_beats_lru_on_big_one_shot_and_small_recurrent_clusters);
    suite_add_tcase(s, online);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(swarm_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
