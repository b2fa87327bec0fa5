/* test_bench_common.c - the benchmarks' shared helpers (bench/bench_common.h): a median must leave
 * its rounds in round order, since the benchmarks pair each round's figure with its reference's and
 * print the rounds after the medians. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "bench/bench_common.h"

START_TEST(a_median_leaves_the_rounds_in_their_order) {
    double rounds[5] = {3.0, 1.0, 5.0, 2.0, 4.0};
    const double order[5] = {3.0, 1.0, 5.0, 2.0, 4.0};
    ck_assert(bench_median(rounds, 5) == 3.0);
    for (int i = 0; i < 5; i++) ck_assert(rounds[i] == order[i]);
    double even[4] = {4.0, 1.0, 3.0, 2.0};
    ck_assert(bench_median(even, 4) == 2.5);
    ck_assert(even[0] == 4.0 && even[3] == 2.0);
    ck_assert(bench_median(even, 0) == 0.0);
}
END_TEST

/* Per-round ratios pair the tier's round r with the reference's round r (bench_ssd.c): with the
 * medians taken first, the pairs must still be those of the same rounds. */
START_TEST(rounds_stay_paired_after_their_medians) {
    double tier[3] = {2.0, 9.0, 4.0}, ref[3] = {4.0, 10.0, 5.0};
    (void)bench_median(tier, 3);
    (void)bench_median(ref, 3);
    double ratios[3];
    for (int r = 0; r < 3; r++) ratios[r] = tier[r] / ref[r];
    ck_assert(ratios[0] == 0.5 && ratios[1] == 0.9 && ratios[2] == 0.8);
    ck_assert(bench_min(ratios, 3) == 0.5);
    ck_assert(bench_max(ratios, 3) == 0.9);
    ck_assert(bench_median(ratios, 3) == 0.8);
}
END_TEST

static Suite *bench_common_suite(void) {
    Suite *s = suite_create("bench_common");
    TCase *tc = tcase_create("median");
    tcase_add_test(tc, a_median_leaves_the_rounds_in_their_order);
    tcase_add_test(tc, rounds_stay_paired_after_their_medians);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(bench_common_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
