/* test_common.c - the small helpers of common/ every layer shares: errno names, key hashing and
 * spelling, the tier error sentence, sleeping until a monotonic time. */
#include <check.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/errno_name.h"
#include "common/key.h"
#include "common/log.h"
#include "common/options.h"

START_TEST(errno_values_are_named_by_their_symbol) {
    ck_assert_str_eq(kvs_errno_name(EACCES), "EACCES");
    ck_assert_str_eq(kvs_errno_name(ENOSPC), "ENOSPC");
    ck_assert_str_eq(kvs_errno_name(EOWNERDEAD), "EOWNERDEAD");
    ck_assert_str_eq(kvs_errno_name(-12345), "unknown error");
    ck_assert_str_eq(kvs_errno_name(0), "0");
}
END_TEST

static kvs_key key_with(uint64_t low, uint64_t high) {
    kvs_key k;
    memcpy(k.bytes, &low, 8);
    memcpy(k.bytes + 8, &high, 8);
    return k;
}

/* The dram tier's shared index stores positions from this hash: it must never change. */
START_TEST(key_hash_is_stable_and_spreads_keys_that_share_a_half) {
    kvs_key zero = key_with(0, 0);
    ck_assert_uint_eq(kvs_key_hash(&zero), 0);
    kvs_key one = key_with(1, 0);
    ck_assert_uint_eq(kvs_key_hash(&one), 0xbf584768e626ded1ull); /* by hand from its steps */
    /* keys equal in the low half land in different buckets of a 1024-bucket index */
    int seen[1024] = {0}, distinct = 0;
    for (uint64_t i = 0; i < 256; i++) {
        kvs_key k = key_with(42, i);
        uint64_t b = kvs_key_hash(&k) & 1023;
        if (!seen[b]++) distinct++;
    }
    ck_assert_int_ge(distinct, 200);
}
END_TEST

START_TEST(a_key_is_spelled_as_32_lower_case_hex_digits) {
    kvs_key k;
    for (int i = 0; i < 16; i++) k.bytes[i] = (uint8_t)(i * 17);
    char hex[33];
    memset(hex, 'z', sizeof hex);
    kvs_key_hex(&k, hex);
    ck_assert_str_eq(hex, "00112233445566778899aabbccddeeff");
}
END_TEST

static void tier_sentence(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tier_sentence(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_vfmt_tier(buf, len, "ssd", "nvme0", fmt, ap);
    va_end(ap);
}

START_TEST(the_tier_error_sentence_names_the_tier_and_truncates_safely) {
    char buf[128];
    tier_sentence(buf, sizeof buf, "path \"%s\" is not writable (%s)", "/mnt/a",
                  kvs_errno_name(EACCES));
    ck_assert_str_eq(buf, "ssd tier \"nvme0\": path \"/mnt/a\" is not writable (EACCES)");
    char small[12];
    memset(small, 'x', sizeof small);
    tier_sentence(small, sizeof small, "%s", "more than fits");
    ck_assert_str_eq(small, "ssd tier \"n");
    char mid[24];
    tier_sentence(mid, sizeof mid, "%s", "more than fits");
    ck_assert_str_eq(mid, "ssd tier \"nvme0\": more ");
}
END_TEST

START_TEST(create_errors_are_copied_only_where_the_connector_gave_room) {
    char err[16] = "untouched";
    kvs_backend_init init;
    memset(&init, 0, sizeof init);
    init.struct_size = sizeof init;
    kvs_create_error(&init, "no buffer: nothing happens");
    init.error = err;
    init.error_len = sizeof err;
    kvs_create_error(&init, "dram tier: out of memory for its state");
    ck_assert_str_eq(err, "dram tier: out ");
    kvs_create_error(NULL, "ignored");
}
END_TEST

START_TEST(sleeping_until_a_time_returns_no_earlier) {
    uint64_t until = kvs_now_ns() + 2000000ull;
    kvs_sleep_until_ns(until);
    ck_assert_uint_ge(kvs_now_ns(), until);
    kvs_sleep_until_ns(0); /* a time passed long ago returns at once */
}
END_TEST

/* A deadline for pthread_cond_timedwait: carries nanoseconds into seconds, and a timeout of any
 * uint64_t milliseconds lands in the future (no overflow of a nanosecond count wraps it short). */
START_TEST(a_deadline_lands_that_far_ahead_on_its_clock) {
    struct timespec now;
    ck_assert_int_eq(clock_gettime(CLOCK_MONOTONIC, &now), 0);
    struct timespec at = kvs_timespec_after_ms(CLOCK_MONOTONIC, 1500);
    ck_assert_int_ge(at.tv_nsec, 0);
    ck_assert_int_lt(at.tv_nsec, 1000000000L);
    double ahead = (double)(at.tv_sec - now.tv_sec) + (double)(at.tv_nsec - now.tv_nsec) / 1e9;
    ck_assert_msg(ahead >= 1.5, "a 1500 ms deadline is %.3f s ahead", ahead);
    struct timespec far = kvs_timespec_after_ms(CLOCK_MONOTONIC, UINT64_MAX);
    ck_assert_msg(far.tv_sec - now.tv_sec >= (time_t)(UINT64_MAX / 1000 - 1),
                  "UINT64_MAX ms is %lld s ahead", (long long)(far.tv_sec - now.tv_sec));
    struct timespec ns = kvs_timespec_after(CLOCK_REALTIME, 2999999999ull);
    ck_assert_int_lt(ns.tv_nsec, 1000000000L);
}
END_TEST

static Suite *common_suite(void) {
    Suite *s = suite_create("common");
    TCase *c = tcase_create("helpers");
    tcase_add_test(c, errno_values_are_named_by_their_symbol);
    tcase_add_test(c, key_hash_is_stable_and_spreads_keys_that_share_a_half);
    tcase_add_test(c, a_key_is_spelled_as_32_lower_case_hex_digits);
    tcase_add_test(c, the_tier_error_sentence_names_the_tier_and_truncates_safely);
    tcase_add_test(c, create_errors_are_copied_only_where_the_connector_gave_room);
    tcase_add_test(c, sleeping_until_a_time_returns_no_earlier);
    tcase_add_test(c, a_deadline_lands_that_far_ahead_on_its_clock);
    suite_add_tcase(s, c);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(common_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
