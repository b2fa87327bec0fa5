/* test_swarm_cluster.c - Swarm's offline phase (schedulers/swarm/swarm_graph, swarm_cluster): the
 * co-activation profile, the metrics, density and medoid order, replication, Algorithm 1 against a
 * dense reference, recovery of the planted workload, and the cluster layout (notes §6.2 items 1-7). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/swarm/swarm.h"
#include "tests/support/rng.h"
#include "tests/support/swarm_planted.h"

/* ---- 1. profiling ---------------------------------------------------------------------------- */

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
        while (k < 12) ids[k++] = 4 + kvs_test_rng_below(&rng, n - 4);
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

/* ---- 2. metric ------------------------------------------------------------------------------- */

/* A small profile with three planted groups and noise. */
static kvs_swarm_profile *small_profile(uint32_t n, uint32_t steps, uint64_t seed) {
    kvs_swarm_profile *p = NULL;
    ck_assert_int_eq(kvs_swarm_profile_create(n, 0, &p), KVS_OK);
    uint64_t rng = seed;
    uint32_t ids[64];
    for (uint32_t t = 0; t < steps; t++) {
        uint32_t k = 0;
        for (uint32_t g = 0; g < 3; g++) {
            if (kvs_test_rng_below(&rng, 3) == 0) continue;
            for (uint32_t e = g * (n / 4); e < g * (n / 4) + n / 5; e++)
                if (kvs_test_rng_below(&rng, 10) < 8) ids[k++] = e;
        }
        for (uint32_t x = 0; x < 2; x++) ids[k++] = kvs_test_rng_below(&rng, n);
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
    ck_assert(rho && order && covered);
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

/* ---- 3. density and medoid order ------------------------------------------------------------- */

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

/* ---- 4. replication -------------------------------------------------------------------------- */

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

/* ---- 5. invariants and a dense reference of Algorithm 1 -------------------------------------- */

/* Algorithm 1 over a dense distance matrix, with the budget rules of swarm_cluster.h. */
static uint32_t dense_reference(uint32_t n, const double *dist, const kvs_swarm_cluster_params *prm,
                                uint32_t *start, uint32_t *member) {
    double tau = prm->tau;
    uint32_t *rho = calloc(n, sizeof *rho), *order = malloc(n * sizeof *order),
             *copies = calloc(n, sizeof *copies);
    ck_assert(rho && order && copies);
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

START_TEST(clusters_of_the_planted_workload_keep_every_invariant) {
    kvs_swarm_synth s = kvs_test_planted(0);
    kvs_swarm_profile *p = kvs_test_planted_profile(&s, 400);
    kvs_swarm_graph *g = NULL;
    ck_assert_int_eq(
        kvs_swarm_graph_build(p, KVS_SWARM_METRIC_JACCARD, 1.0, KVS_TEST_PLANTED_MIN_COUNT, &g),
        KVS_OK);
    uint32_t n = s.params.n_entries;
    for (int fixpoint = 0; fixpoint < 2; fixpoint++) {
        kvs_swarm_cluster_params prm;
        kvs_swarm_cluster_defaults(&prm);
        prm.tau = KVS_TEST_PLANTED_TAU;
        prm.fixpoint = fixpoint;
        kvs_swarm_clusters *c = NULL;
        ck_assert_int_eq(kvs_swarm_clusters_create(n, &c), KVS_OK);
        ck_assert_int_eq(kvs_swarm_cluster_build(g, &prm, c), KVS_OK);
        uint32_t *copies = calloc(n, sizeof *copies);
        ck_assert_ptr_nonnull(copies);
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

/* ---- 6. planted recovery --------------------------------------------------------------------- */

static double planted_f1(int scattered, double overlap, double tau) {
    kvs_swarm_synth s = kvs_test_planted_workload(scattered, overlap);
    kvs_swarm_profile *p = kvs_test_planted_profile(&s, 400);
    kvs_swarm_graph *g = NULL;
    ck_assert_int_eq(
        kvs_swarm_graph_build(p, KVS_SWARM_METRIC_JACCARD, 1.0, KVS_TEST_PLANTED_MIN_COUNT, &g),
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
    double f1 = planted_f1(0, 0.10, KVS_TEST_PLANTED_TAU);
    ck_assert_msg(f1 >= PLANTED_F1_MIN, "pairwise F1 %.3f", f1);
}
END_TEST

/* ---- 7. cluster layout ----------------------------------------------------------------------- */

START_TEST(cluster_layout_is_balanced_per_path_and_per_cluster_with_contiguous_slots) {
    kvs_swarm_synth s = kvs_test_planted(0);
    kvs_swarm_cluster_params prm;
    kvs_swarm_cluster_defaults(&prm);
    prm.tau = KVS_TEST_PLANTED_TAU;
    kvs_swarm_clusters *c = kvs_test_planted_clusters(&s, &prm);
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

static Suite *swarm_cluster_suite(void) {
    Suite *s = suite_create("swarm_cluster");
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

    TCase *layout = tcase_create("layout");
    tcase_add_test(layout,
                   cluster_layout_is_balanced_per_path_and_per_cluster_with_contiguous_slots);
    suite_add_tcase(s, layout);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(swarm_cluster_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
