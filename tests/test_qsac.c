/* test_qsac.c - LiteCache's QSAC and the top-k selections (schedulers/qsac): the paper's threshold
 * and aggregation values, the hit/miss rule on a scripted sequence, and every selection, delta
 * fetch and residency choice against a brute-force oracle on random small inputs. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/qsac/qsac.h"
#include "schedulers/qsac/topk.h"

static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}
static double rnd_unit(void) {
    return rnd(1u << 30) / (double)(1u << 30);
}

START_TEST(thresholds_follow_eq_3_to_5) {
    ck_assert_double_eq_tol(kvs_qsac_threshold(1.0, 0.8, 3), 0.8, 1e-12);
    ck_assert_double_eq_tol(kvs_qsac_threshold(0.0, 0.8, 3), -1.0, 1e-12);
    ck_assert_double_eq_tol(kvs_qsac_threshold(0.9, 0.8, 3), 0.2477, 1e-4);
    ck_assert_double_eq_tol(kvs_qsac_threshold(0.95, 0.8, 3), 0.5405, 1e-4);
    ck_assert_double_eq_tol(kvs_qsac_threshold(0.5, 0.8, 2), -0.811, 1e-3);
    ck_assert_double_eq_tol(kvs_qsac_threshold(0.8, 0.8, 2), 0.028, 1e-3);
    /* p <= 0 is taken as 1: tau(0) stays -1 */
    ck_assert_double_eq_tol(kvs_qsac_threshold(0.0, 0.8, 0), -1.0, 1e-12);
    ck_assert_double_eq_tol(kvs_qsac_threshold(0.5, 0.8, -2), kvs_qsac_threshold(0.5, 0.8, 1),
                            1e-12);
    /* out of range importance is clamped */
    ck_assert_double_eq_tol(kvs_qsac_threshold(1.5, 0.8, 3), 0.8, 1e-12);
    ck_assert_double_eq_tol(kvs_qsac_threshold(-2, 0.8, 3), -1.0, 1e-12);
    /* never decreasing in importance */
    double prev = -2;
    for (int i = 0; i <= 1000; i++) {
        double t = kvs_qsac_threshold(i / 1000.0, 0.8, 3);
        ck_assert(t >= prev - 1e-15);
        prev = t;
    }
}
END_TEST

START_TEST(the_gqa_aggregate_is_the_weighted_harmonic_mean_and_defined_below_zero) {
    double eq[4] = {0.7, 0.7, 0.7, 0.7};
    ck_assert_double_eq_tol(kvs_qsac_aggregate(eq, NULL, 4), 0.7, 1e-12);
    double s[4] = {0.99, 0.99, 0.99, 0.5};
    ck_assert_double_eq_tol(kvs_qsac_aggregate(s, NULL, 4), 0.7952, 1e-4);
    double w[4] = {1, 1, 1, 3};
    ck_assert_double_eq_tol(kvs_qsac_aggregate(s, w, 4), 0.6644, 1e-4);
    double zero_w[4] = {0, 0, 0, 0}; /* all weights 0: equal weights */
    ck_assert_double_eq_tol(kvs_qsac_aggregate(s, zero_w, 4), 0.7952, 1e-4);
    /* a head with weight 0 does not count, even with a similarity below 0 */
    double w2[4] = {1, 1, 1, 0};
    double neg[4] = {0.9, 0.9, 0.9, -0.4};
    ck_assert_double_eq_tol(kvs_qsac_aggregate(neg, w2, 4), 0.9, 1e-12);
    /* below zero: the smallest weighted similarity, continuous with the mean as it falls to 0 */
    ck_assert_double_eq_tol(kvs_qsac_aggregate(neg, NULL, 4), -0.4, 1e-12);
    double at0[2] = {0.9, 0.0}, near0[2] = {0.9, 1e-9};
    ck_assert_double_eq_tol(kvs_qsac_aggregate(at0, NULL, 2), 0.0, 1e-12);
    ck_assert_double_eq_tol(kvs_qsac_aggregate(near0, NULL, 2), 0.0, 1e-8);
    ck_assert_double_eq(kvs_qsac_aggregate(s, NULL, 0), -1.0);
    /* never above the weighted arithmetic mean nor below the smallest weighted similarity */
    rng_state = 7;
    for (int it = 0; it < 20000; it++) {
        uint32_t m = 1 + rnd(8);
        double x[8], wt[8], wsum = 0, amean = 0, lo = 2;
        for (uint32_t j = 0; j < m; j++) {
            x[j] = 2 * rnd_unit() - 1;
            wt[j] = rnd(4) ? rnd_unit() : 0;
            wsum += wt[j];
        }
        int any = wsum > 0;
        double ws = 0;
        for (uint32_t j = 0; j < m; j++) {
            double wj = any ? wt[j] : 1;
            if (wj <= 0) continue;
            amean += wj * x[j];
            ws += wj;
            if (x[j] < lo) lo = x[j];
        }
        amean /= ws;
        double g = kvs_qsac_aggregate(x, wt, m);
        ck_assert(g <= amean + 1e-12);
        ck_assert(g >= lo - 1e-12);
    }
}
END_TEST

/* The oracle: repeatedly the hardest remaining candidate (lower index on ties) that fits. */
static uint32_t resident_oracle(const double *d, const uint64_t *bytes, uint32_t n, uint64_t budget,
                                uint32_t *out) {
    uint8_t used[64] = {0};
    uint32_t k = 0;
    for (;;) {
        int best = -1;
        for (uint32_t i = 0; i < n; i++)
            if (!used[i] && d[i] > 0 && (best < 0 || d[i] > d[best])) best = (int)i;
        if (best < 0) return k;
        used[best] = 1;
        if (bytes[best] <= budget) {
            budget -= bytes[best];
            out[k++] = (uint32_t)best;
        }
    }
}

START_TEST(resident_heads_are_the_hardest_that_fit) {
    ck_assert_double_eq_tol(kvs_qsac_difficulty(0.8, 0.75, 0.1), 0.15, 1e-12);
    rng_state = 11;
    for (int it = 0; it < 20000; it++) {
        uint32_t n = 1 + rnd(40);
        double d[64];
        uint64_t bytes[64];
        for (uint32_t i = 0; i < n; i++) {
            d[i] = (double)((int)rnd(9) - 4) / 4; /* ties and non-positive values */
            bytes[i] = 1 + rnd(10);
        }
        uint64_t budget = rnd(60);
        uint32_t got[64], want[64];
        uint32_t a = kvs_qsac_pick_resident(d, bytes, n, budget, got);
        uint32_t b = resident_oracle(d, bytes, n, budget, want);
        ck_assert_uint_eq(a, b);
        for (uint32_t i = 0; i < a; i++) ck_assert_uint_eq(got[i], want[i]);
    }
}
END_TEST

/* q = cos(a) e0 + sin(a) e1 in d = 4: its cosine with e0 is cos(a) */
static void at_angle(float *q, double cosine) {
    memset(q, 0, 4 * sizeof *q);
    q[0] = (float)cosine;
    q[1] = (float)sqrt(1 - cosine * cosine);
}

START_TEST(a_head_hits_while_close_to_its_label_which_moves_only_on_a_miss) {
    float label[4], q[4];
    kvs_qsac_head h = {.label = label, .m = 1, .d = 4, .tau = 0.8};
    double sim;
    at_angle(q, 1.0);
    ck_assert_int_eq(kvs_qsac_step(&h, q, NULL, &sim), 0); /* the first step misses */
    ck_assert_mem_eq(label, q, sizeof q);
    /* cosines with e0: 0.95 hit, 0.85 hit (the label stays e0), 0.7 miss (relabel there), 0.7
     * again hit, -0.5 (74 degrees from the new label) miss */
    const double script[] = {0.95, 0.85, 0.7, 0.7, -0.5};
    const char *want = "HHMHM";
    for (int i = 0; i < 5; i++) {
        at_angle(q, script[i]);
        float before[4];
        memcpy(before, label, sizeof before);
        int hit = kvs_qsac_step(&h, q, NULL, &sim);
        ck_assert_msg(hit == (want[i] == 'H'), "step %d: sim %f", i, sim);
        if (hit)
            ck_assert_mem_eq(label, before, sizeof before);
        else
            ck_assert_mem_eq(label, q, sizeof q);
    }
    ck_assert_uint_eq(h.hits, 3);
    ck_assert_uint_eq(h.misses, 3);
    /* a group of 2 query heads: one far head makes the group miss */
    float label2[8], q2[8];
    kvs_qsac_head g = {.label = label2, .m = 2, .d = 4, .tau = 0.8};
    at_angle(q2, 1), at_angle(q2 + 4, 1);
    ck_assert_int_eq(kvs_qsac_step(&g, q2, NULL, &sim), 0);
    at_angle(q2, 0.99), at_angle(q2 + 4, 0.5);
    ck_assert_int_eq(kvs_qsac_step(&g, q2, NULL, &sim), 0);
    ck_assert_double_eq_tol(sim, 2 / (1 / 0.99 + 1 / 0.5), 1e-6);
    double w[2] = {1, 0}; /* the far head weighs nothing */
    at_angle(q2, 1), at_angle(q2 + 4, 1);
    kvs_qsac_step(&g, q2, NULL, &sim); /* relabel at e0 */
    at_angle(q2, 0.99), at_angle(q2 + 4, 0.1);
    ck_assert_int_eq(kvs_qsac_step(&g, q2, w, &sim), 1);
}
END_TEST

START_TEST(a_delta_fetch_brings_only_the_missing_rows) {
    rng_state = 5;
    for (int it = 0; it < 50000; it++) {
        uint32_t cap = 1 + rnd(16), universe = 1 + rnd(40);
        uint32_t slots[16], old[16];
        uint8_t cached[64] = {0}; /* a cache holds a row once */
        for (uint32_t s = 0; s < cap; s++) {
            uint32_t t = rnd(universe);
            slots[s] = rnd(3) && !cached[t] ? t : KVS_QSAC_EMPTY;
            if (slots[s] != KVS_QSAC_EMPTY) cached[t] = 1;
        }
        memcpy(old, slots, sizeof slots);
        uint8_t picked[64] = {0};
        uint32_t want[16], n_want = rnd(cap + 1);
        for (uint32_t i = 0; i < n_want && i < universe; i++) {
            uint32_t t;
            do t = rnd(universe);
            while (picked[t]);
            picked[t] = 1;
            want[i] = t;
        }
        if (n_want > universe) n_want = universe;
        uint32_t ft[16], fs[16];
        uint32_t n = kvs_qsac_delta(slots, cap, want, n_want, ft, fs);
        ck_assert_uint_ne(n, UINT32_MAX);
        /* oracle: the wanted rows the old cache did not hold, in the order of want */
        uint32_t missing = 0;
        for (uint32_t i = 0; i < n_want; i++) {
            int held = 0;
            for (uint32_t s = 0; s < cap; s++) held |= old[s] == want[i];
            if (!held) {
                ck_assert_uint_lt(missing, n);
                ck_assert_uint_eq(ft[missing], want[i]);
                ck_assert_uint_eq(slots[fs[missing]], want[i]);
                /* the slot it went to held nothing wanted before */
                ck_assert(old[fs[missing]] == KVS_QSAC_EMPTY || !picked[old[fs[missing]]]);
                missing++;
            }
        }
        ck_assert_uint_eq(n, missing);
        /* the cache now holds exactly the wanted rows, each once; a kept row never moved */
        uint32_t held = 0;
        for (uint32_t s = 0; s < cap; s++) {
            if (slots[s] == KVS_QSAC_EMPTY) continue;
            ck_assert(picked[slots[s]]);
            held++;
            int fetched = 0;
            for (uint32_t i = 0; i < n; i++) fetched |= fs[i] == s;
            if (!fetched) ck_assert_uint_eq(slots[s], old[s]);
        }
        ck_assert_uint_eq(held, n_want);
        /* the fetched rows took the lowest slots not kept, in order */
        uint32_t next = 0;
        for (uint32_t i = 0; i < n; i++) {
            while (next < cap && old[next] != KVS_QSAC_EMPTY && picked[old[next]]) next++;
            ck_assert_uint_eq(fs[i], next);
            next++;
        }
    }
    uint32_t slots[2] = {1, 2}, ft[3], fs[3];
    const uint32_t twice[2] = {4, 4}, three[3] = {1, 2, 3};
    ck_assert_uint_eq(kvs_qsac_delta(slots, 2, twice, 2, ft, fs), UINT32_MAX);
    ck_assert_uint_eq(kvs_qsac_delta(slots, 2, three, 3, ft, fs), UINT32_MAX);
    ck_assert(slots[0] == 1 && slots[1] == 2); /* refused: untouched */
}
END_TEST

START_TEST(the_threshold_adapts_to_the_attention_error_a_window_at_a_time) {
    /* binary fractions, so the steps add exactly */
    kvs_qsac_adapt a = {
        .target_error = 0.02, .step = 0.125, .tau_min = 0.25, .tau_max = 0.875, .window = 4};
    double tau = 0.5;
    for (int i = 0; i < 3; i++) ck_assert_double_eq(kvs_qsac_adapt_observe(&a, tau, 0.0, 0.5), tau);
    tau = kvs_qsac_adapt_observe(&a, tau, 0.0, 0.5); /* the window closes: too much error */
    ck_assert_double_eq(tau, 0.625);                 /* a step up (the sims were lower) */
    /* the sims stay high: tau goes a step above their mean, so such steps miss */
    for (int i = 0; i < 4; i++) tau = kvs_qsac_adapt_observe(&a, tau, 0.6875, 0.9);
    ck_assert_double_eq(tau, 0.8125);
    for (int i = 0; i < 8; i++) tau = kvs_qsac_adapt_observe(&a, tau, 1.0, 0.9);
    ck_assert_double_eq(tau, 0.875); /* clamped at tau_max */
    ck_assert_uint_eq(a.raised, 3);
    for (int i = 0; i < 4; i++) tau = kvs_qsac_adapt_observe(&a, tau, 0.5, 0.015); /* in band */
    ck_assert_double_eq(tau, 0.875);
    for (int i = 0; i < 24; i++) tau = kvs_qsac_adapt_observe(&a, tau, 0.5, 0.0);
    ck_assert_double_eq(tau, 0.25); /* down to tau_min, no further */
    ck_assert_uint_eq(a.lowered, 5);
}
END_TEST

START_TEST(the_attention_error_is_the_mass_the_cached_rows_miss) {
    const float scores[5] = {1, 3, 2, 0, 3};
    const uint32_t exact[2] = {1, 4}, same[2] = {4, 1}, other[2] = {2, 3};
    ck_assert_double_eq_tol(kvs_qsac_attention_error(scores, 5, 1.0, same, 2, exact, 2), 0, 1e-12);
    double e = kvs_qsac_attention_error(scores, 5, 0.5, other, 2, exact, 2);
    double want = 1 - (exp(1.0) + exp(0.0)) / (exp(1.5) + exp(1.5));
    ck_assert_double_eq_tol(e, want, 1e-9);
    ck_assert_double_eq(kvs_qsac_attention_error(scores, 5, 1.0, exact, 2, other, 2), 0);
    /* a score far above every counted row (a sink row) does not flush both masses to 0 */
    const float sunk[5] = {1e4f, 3, 2, 0, 3};
    e = kvs_qsac_attention_error(sunk, 5, 0.125, other, 2, exact, 2);
    want = 1 - (exp(2 * 0.125) + exp(0.0)) / (2 * exp(3 * 0.125));
    ck_assert_double_eq_tol(e, want, 1e-9);
    /* no softmax to weigh by, or no number: the worst */
    ck_assert_double_eq(kvs_qsac_attention_error(scores, 5, 0.0, other, 2, exact, 2), 1.0);
    ck_assert_double_eq(kvs_qsac_attention_error(scores, 5, NAN, other, 2, exact, 2), 1.0);
    const float with_nan[5] = {1, NAN, 2, 0, 3};
    ck_assert_double_eq(kvs_qsac_attention_error(with_nan, 5, 1.0, other, 2, exact, 2), 1.0);
}
END_TEST

/* The oracle: a stable selection by repeated maximum (NaN lowest, ties to the lower row). */
static int ranks_above(float a, uint32_t ia, float b, uint32_t ib) {
    if (isnan(a) != isnan(b)) return isnan(b);
    if (!isnan(a) && a != b) return a > b;
    return ia < ib;
}

START_TEST(exact_top_k_matches_a_brute_force_selection) {
    rng_state = 3;
    float scores[200];
    uint32_t got[200], want[200];
    for (int it = 0; it < 5000; it++) {
        uint32_t n = rnd(200), sink = rnd(6), recent = rnd(20), k = rnd(60);
        for (uint32_t t = 0; t < n; t++) scores[t] = rnd(50) ? (float)rnd(7) - 3.0f : NAN;
        uint32_t a = kvs_topk_exact(scores, n, sink, recent, k, got);
        uint32_t end = kvs_topk_pool_end(n, recent);
        uint8_t used[200] = {0};
        uint32_t b = 0;
        for (; sink < end && b < k && b < end - sink; b++) {
            int best = -1;
            for (uint32_t t = sink; t < end; t++)
                if (!used[t] &&
                    (best < 0 || ranks_above(scores[t], t, scores[best], (uint32_t)best)))
                    best = (int)t;
            ck_assert_int_ge(best, 0); /* b < end - sink: a row is left */
            used[best] = 1;
        }
        ck_assert_uint_eq(a, b);
        uint32_t j = 0;
        for (uint32_t t = 0; t < n; t++)
            if (used[t]) want[j++] = t;
        for (uint32_t i = 0; i < a; i++) ck_assert_uint_eq(got[i], want[i]);
    }
}
END_TEST

START_TEST(medoid_selection_matches_a_brute_force_expansion) {
    rng_state = 9;
    uint32_t offsets[41], rows[400], got[120];
    float mscores[40];
    uint8_t seen[120] = {0};
    for (int it = 0; it < 5000; it++) {
        uint32_t n = 1 + rnd(120), nc = rnd(40), sink = rnd(4), recent = rnd(16), k = rnd(50);
        offsets[0] = 0;
        for (uint32_t c = 0; c < nc; c++) {
            uint32_t size = 1 + rnd(10);
            for (uint32_t i = 0; i < size; i++) rows[offsets[c] + i] = rnd(n + 3); /* some >= n */
            offsets[c + 1] = offsets[c] + size;
            mscores[c] = (float)rnd(5);
        }
        kvs_topk_index index = {.n_clusters = nc, .offsets = offsets, .rows = rows};
        uint32_t taken;
        uint32_t a = kvs_topk_medoids(&index, mscores, n, sink, recent, k, seen, got, &taken);
        for (uint32_t t = 0; t < 120; t++) ck_assert_uint_eq(seen[t], 0);
        /* oracle: clusters by (score desc, id asc), whole, until k distinct pool rows */
        uint32_t end = kvs_topk_pool_end(n, recent);
        uint8_t in[123] = {0}, done[40] = {0};
        uint32_t count = 0, clusters = 0;
        while (sink < end && k && count < k) {
            int best = -1;
            for (uint32_t c = 0; c < nc; c++)
                if (!done[c] && (best < 0 || mscores[c] > mscores[best])) best = (int)c;
            if (best < 0) break;
            done[best] = 1;
            clusters++;
            for (uint32_t i = offsets[best]; i < offsets[best + 1]; i++) {
                uint32_t r = rows[i];
                if (r >= sink && r < end && !in[r]) in[r] = 1, count++;
            }
        }
        ck_assert_uint_eq(a, count);
        ck_assert_uint_eq(taken, clusters);
        for (uint32_t i = 0; i < a; i++) {
            ck_assert(in[got[i]]);
            if (i) ck_assert_uint_lt(got[i - 1], got[i]);
        }
    }
}
END_TEST

/* Keys in tight clusters around random directions, a query near two of them: the clusters whose
 * medoids score highest hold the exact top-k (no oracle: only the medoids are scored). */
START_TEST(medoids_find_the_exact_top_k_of_clustered_keys) {
    enum { D = 32, C = 50, SIZE = 8, N = C * SIZE };
    static float keys[N][D], centers[C][D], q[D], scores[N], mscores[C];
    uint32_t offsets[C + 1], rows[N] = {0}, exact[2 * SIZE], got[N];
    uint8_t seen[N] = {0};
    rng_state = 21;
    double recall_sum = 0;
    for (int trial = 0; trial < 20; trial++) {
        for (int c = 0; c < C; c++)
            for (int i = 0; i < D; i++) centers[c][i] = (float)(2 * rnd_unit() - 1);
        /* rows of a cluster are spread over the context, as co-activated tokens are */
        for (int t = 0; t < N; t++) {
            int c = (t * 7) % C;
            for (int i = 0; i < D; i++)
                keys[t][i] = centers[c][i] + 0.05f * (float)(rnd_unit() - 0.5);
        }
        for (int c = 0; c < C; c++) {
            offsets[c] = (uint32_t)(c * SIZE);
            uint32_t k = 0;
            for (int t = 0; t < N; t++)
                if ((t * 7) % C == c) rows[c * SIZE + k++] = (uint32_t)t;
        }
        offsets[C] = N;
        int a = (int)rnd(C), b = (int)rnd(C);
        for (int i = 0; i < D; i++) q[i] = centers[a][i] + 0.8f * centers[b][i];
        kvs_topk_scores(q, 1, &keys[0][0], D, N, D, scores);
        for (int c = 0; c < C; c++) mscores[c] = scores[rows[offsets[c]]];
        uint32_t ne = kvs_topk_exact(scores, N, 0, 0, 2 * SIZE, exact);
        kvs_topk_index index = {.n_clusters = C, .offsets = offsets, .rows = rows};
        uint32_t taken,
            ng = kvs_topk_medoids(&index, mscores, N, 0, 0, 2 * SIZE, seen, got, &taken);
        ck_assert_uint_eq(taken, 2); /* two whole clusters cover the budget */
        uint32_t hit = 0;
        for (uint32_t i = 0; i < ne; i++)
            for (uint32_t j = 0; j < ng; j++) hit += exact[i] == got[j];
        recall_sum += (double)hit / ne;
    }
    ck_assert_msg(recall_sum / 20 >= 0.95, "mean recall %.3f", recall_sum / 20);
}
END_TEST

/* Swarm's clusters as a medoid index: members in order, medoid first, replicas kept. */
START_TEST(clusters_become_a_medoid_index) {
    kvs_swarm_clusters *c;
    ck_assert_int_eq(kvs_swarm_clusters_create(10, &c), KVS_OK);
    const uint32_t members[3][4] = {{4, 1, 7, 0}, {2, 9, 0, 0}, {5, 7, 3, 8}};
    const uint32_t sizes[3] = {3, 2, 4};
    for (uint32_t k = 0; k < 3; k++) {
        uint32_t at;
        ck_assert_int_eq(kvs_swarm_clusters_add(c, &at), KVS_OK);
        for (uint32_t i = 0; i < sizes[k]; i++)
            ck_assert_int_eq(kvs_swarm_clusters_add_member(c, at, members[k][i]), KVS_OK);
    }
    kvs_topk_index ix;
    ck_assert_int_eq(kvs_topk_index_from_clusters(c, &ix), KVS_OK);
    ck_assert_uint_eq(ix.n_clusters, 3);
    const uint32_t want_offsets[4] = {0, 3, 5, 9}, want_rows[9] = {4, 1, 7, 2, 9, 5, 7, 3, 8};
    for (uint32_t k = 0; k < 4; k++) ck_assert_uint_eq(ix.offsets[k], want_offsets[k]);
    for (uint32_t i = 0; i < 9; i++) ck_assert_uint_eq(ix.rows[i], want_rows[i]);
    /* cluster 2's medoid scores highest: it is taken whole, row 7 once */
    const float mscores[3] = {1, 0, 5};
    uint8_t seen[10] = {0};
    uint32_t out[10], taken;
    ck_assert_uint_eq(kvs_topk_medoids(&ix, mscores, 10, 0, 0, 5, seen, out, &taken), 6);
    ck_assert_uint_eq(taken, 2);
    const uint32_t want_sel[6] = {1, 3, 4, 5, 7, 8};
    for (uint32_t i = 0; i < 6; i++) ck_assert_uint_eq(out[i], want_sel[i]);
    kvs_topk_index_free(&ix);
    ck_assert_ptr_null(ix.rows);
    kvs_swarm_clusters_destroy(c);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("qsac");
    TCase *tc = tcase_create("qsac");
    tcase_add_test(tc, thresholds_follow_eq_3_to_5);
    tcase_add_test(tc, the_gqa_aggregate_is_the_weighted_harmonic_mean_and_defined_below_zero);
    tcase_add_test(tc, resident_heads_are_the_hardest_that_fit);
    tcase_add_test(tc, a_head_hits_while_close_to_its_label_which_moves_only_on_a_miss);
    tcase_add_test(tc, a_delta_fetch_brings_only_the_missing_rows);
    tcase_add_test(tc, the_threshold_adapts_to_the_attention_error_a_window_at_a_time);
    tcase_add_test(tc, the_attention_error_is_the_mass_the_cached_rows_miss);
    tcase_add_test(tc, exact_top_k_matches_a_brute_force_selection);
    tcase_add_test(tc, medoid_selection_matches_a_brute_force_expansion);
    tcase_add_test(tc, medoids_find_the_exact_top_k_of_clustered_keys);
    tcase_add_test(tc, clusters_become_a_medoid_index);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
