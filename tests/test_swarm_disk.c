/* test_swarm_disk.c - the virtual-time disk model (schedulers/swarm/swarm_disk): per-path sums and
 * maxima, and a step that waits for its slowest path. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/swarm/swarm.h"

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

static Suite *swarm_disk_suite(void) {
    Suite *s = suite_create("swarm_disk");
    TCase *disk = tcase_create("disk_model");
    tcase_add_test(disk, disk_model_sums_or_maxes_per_path_and_the_step_waits_for_the_slowest);
    suite_add_tcase(s, disk);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(swarm_disk_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
