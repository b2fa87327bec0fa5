/* test_swarm.c - Swarm's I/O planning (schedulers/swarm/swarm.c): Eq. 7 placement with both
 * strides, the Eq. 8 merge and the entry-bucket scheduler against a brute-force optimum (notes §6.2
 * items 7-9). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/swarm/swarm.h"
#include "tests/support/placement_digest.h"
#include "tests/support/rng.h"
#include "tests/support/swarm_planted.h"

/* ---- 7. placement ------------------------------------------------------------------------------- */

START_TEST(place_with_one_replica_is_eq7_and_keeps_path_totals_within_one) {
    uint64_t rng = 3;
    for (uint32_t n_paths = 1; n_paths <= 8; n_paths++) {
        uint64_t pointer = 0, totals[8] = {0};
        uint32_t paths[64];
        for (int call = 0; call < 200; call++) {
            uint32_t n_units = 1 + kvs_test_rng_below(&rng, 40);
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

/* ---- 8. dedup ----------------------------------------------------------------------------------- */

START_TEST(dedup_keeps_first_occurrences_of_units_not_in_dram) {
    uint64_t rng = 21;
    for (int round = 0; round < 50; round++) {
        uint64_t n = 1 + kvs_test_rng_below(&rng, 300), n_res = kvs_test_rng_below(&rng, 40);
        kvs_swarm_unit *units = malloc(n * sizeof *units), *res = malloc((n_res + 1) * sizeof *res);
        uint64_t *keep = malloc(n * sizeof *keep), n_keep = 0;
        ck_assert(units && res && keep);
        for (uint64_t i = 0; i < n; i++)
            units[i] = (kvs_swarm_unit){kvs_test_rng_below(&rng, 4), kvs_test_rng_below(&rng, 30)};
        for (uint64_t i = 0; i < n_res; i++)
            res[i] = (kvs_swarm_unit){kvs_test_rng_below(&rng, 4), kvs_test_rng_below(&rng, 30)};
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
    kvs_swarm_synth s = kvs_test_planted(0);
    kvs_swarm_cluster_params prm;
    kvs_swarm_cluster_defaults(&prm);
    prm.tau = KVS_TEST_PLANTED_TAU;
    kvs_swarm_clusters *c = kvs_test_planted_clusters(&s, &prm);
    uint32_t n = s.params.n_entries;
    uint32_t *stamp = malloc(n * sizeof *stamp), *out = malloc(4 * n * sizeof *out);
    uint8_t *dram = calloc(n, 1), *in_union = calloc(n, 1);
    ck_assert(stamp && out && dram && in_union);
    kvs_swarm_seen seen;
    kvs_swarm_seen_init(&seen, stamp, n);
    uint64_t rng = 5;
    uint64_t shared_members = 0;
    for (int step = 0; step < 100; step++) {
        kvs_swarm_seen_begin(&seen);
        memset(dram, 0, n);
        memset(in_union, 0, n);
        /* DRAM: the medoids of every cluster and a window of the last 256 entries. */
        uint32_t n_marked = 0, n_dram = 0;
        for (uint32_t k = 0; k < c->n_clusters; k++) {
            dram[c->items[k].members[0]] = 1;
            n_marked += (uint32_t)kvs_swarm_seen_mark(&seen, c->items[k].members[0]);
        }
        for (uint32_t e = n - 256; e < n; e++) {
            dram[e] = 1;
            n_marked += (uint32_t)kvs_swarm_seen_mark(&seen, e);
        }
        for (uint32_t e = 0; e < n; e++) n_dram += dram[e];
        ck_assert_uint_eq(n_marked, n_dram); /* each DRAM entry marked new exactly once */
        uint32_t n_out = 0, n_requested = 0;
        for (int pick = 0; pick < 30; pick++) {
            const kvs_swarm_cluster *cl = &c->items[kvs_test_rng_below(&rng, c->n_clusters)];
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
    in->n_paths = 2 + kvs_test_rng_below(rng, 3);
    in->n = 3 + kvs_test_rng_below(rng, 10);
    for (uint32_t r = 0; r < in->n; r++) {
        in->n_copies[r] = 1 + kvs_test_rng_below(rng, 3);
        for (uint32_t c = 0; c < in->n_copies[r]; c++)
            in->paths[r * MAXC + c] =
                kvs_test_rng_below(rng, in->n_paths); /* repeats allowed: count once */
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
        in.n_paths = 2 + kvs_test_rng_below(&rng, MAXC - 1);
        in.n = 1 + kvs_test_rng_below(&rng, 16);
        uint32_t forced[MAXC] = {0};
        uint8_t fixed[16] = {0};
        for (uint32_t r = 0; r < in.n; r++) {
            fixed[r] = (uint8_t)kvs_test_rng_below(&rng, 2);
            if (fixed[r]) {
                uint32_t d = kvs_test_rng_below(&rng, in.n_paths);
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

static Suite *swarm_suite(void) {
    Suite *s = suite_create("swarm");
    TCase *place = tcase_create("placement");
    tcase_add_test(place, place_with_one_replica_is_eq7_and_keeps_path_totals_within_one);
    tcase_add_test(place, place_puts_the_copies_of_a_unit_on_distinct_paths);
    tcase_add_test(place, place_puts_every_copy_where_earlier_builds_did);
    tcase_add_test(place,
                   place_with_the_units_stride_puts_copies_on_the_next_paths_and_counts_units);
    suite_add_tcase(s, place);

    TCase *io = tcase_create("dedup_and_schedule");
    tcase_set_timeout(io, 60);
    tcase_add_test(io, dedup_keeps_first_occurrences_of_units_not_in_dram);
    tcase_add_test(io, merged_clusters_hold_no_duplicate_and_no_dram_resident_entry);
    tcase_add_test(io, greedy_is_within_one_of_the_brute_force_optimum_and_usually_equal);
    tcase_add_test(io, single_copy_reads_stay_on_their_path_and_full_replication_is_water_filling);
    tcase_add_test(io, unplaceable_reads_go_last_and_weighted_load_favours_the_fast_path);
    suite_add_tcase(s, io);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(swarm_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
