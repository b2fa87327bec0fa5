/* test_ssd_place.c - the ssd tier's built-in placement (backends/ssd/ssd_place): new builds put the
 * copies of an object exactly where earlier builds did. The expected values were computed from the
 * rule as it stood before it moved onto schedulers/swarm. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "backends/ssd/ssd_place.h"
#include "tests/support/placement_digest.h"

static void ssd_stripe(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                       uint32_t replicas, uint32_t *paths_out) {
    (void)ctx;
    ssd_place_stripe(pointer, n_paths, n_units, replicas, paths_out);
}

START_TEST(built_in_stripe_puts_every_copy_where_earlier_builds_did) {
    static const struct {
        uint32_t n_paths, n_units, replicas;
        uint32_t paths[12];
        uint64_t pointer_after;
    } cases[] = {
        {4, 4, 3, {3, 0, 1, 0, 1, 2, 1, 2, 3, 2, 3, 0}, 11},
        {5, 3, 2, {2, 3, 3, 4, 4, 0}, 10},
        {2, 3, 3, {1, 0, 1, 0, 1, 0, 1, 0, 1}, 10},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t pointer = 7;
        uint32_t out[12];
        ssd_place_stripe(&pointer, cases[c].n_paths, cases[c].n_units, cases[c].replicas, out);
        ck_assert_uint_eq(pointer, cases[c].pointer_after);
        for (uint32_t i = 0; i < cases[c].n_units * cases[c].replicas; i++)
            ck_assert_uint_eq(out[i], cases[c].paths[i]);
    }
    /* every (paths 1..8, replicas 1..9, units 0..9) combination, from two starting pointers */
    ck_assert_uint_eq(kvs_test_placement_digest(ssd_stripe, NULL, 0), 0xed48e0dda4128f1aull);
    ck_assert_uint_eq(kvs_test_placement_digest(ssd_stripe, NULL, 0x0123456789abcdefull),
                      0xb05a920bd5211491ull);
}
END_TEST

static Suite *ssd_place_suite(void) {
    Suite *s = suite_create("ssd_place");
    TCase *tc = tcase_create("stripe");
    tcase_add_test(tc, built_in_stripe_puts_every_copy_where_earlier_builds_did);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(ssd_place_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
