/* test_units.c - the one grammar of sizes and rates (common/units.h). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"

typedef struct accepted {
    const char *text;
    uint64_t value;
} accepted;

/* ---- sizes ----------------------------------------------------------------------------------- */

START_TEST(sizes_accept_every_binary_and_decimal_unit) {
    static const accepted cases[] = {
        {"4096", 4096},
        {"0", 0},
        {"7B", 7},
        {"2KiB", 2048},
        {"2K", 2048},
        {"3MiB", 3ull << 20},
        {"3M", 3ull << 20},
        {"4GiB", 4ull << 30},
        {"4G", 4ull << 30},
        {"5TiB", 5ull << 40},
        {"5T", 5ull << 40},
        {"2KB", 2000},
        {"3MB", 3000000},
        {"4GB", 4000000000ull},
        {"5TB", 5000000000000ull},
        {"1 GiB", 1ull << 30},
        {"1   MB", 1000000},
        {"1.5 GiB", 3ull << 29},
        {"0.5KiB", 512},
        {"0.5K", 512},
        {"1.5GB", 1500000000ull},
        {"2.25MiB", 2359296},
        {"1.0000000000000000000000GiB", 1ull << 30},
        {"0000000000000000000000000000000000000001", 1},
        {"18446744073709551615", UINT64_MAX},
        {"18446744073709551615B", UINT64_MAX},
        {"16777215TiB", 16777215ull << 40},
        {"18446744073709551.615KB", UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t bytes = 12345;
        char why[160] = "";
        kvs_status st = kvs_units_parse_size(cases[i].text, &bytes, why, sizeof why);
        ck_assert_msg(st == KVS_OK, "'%s' refused: %s", cases[i].text, why);
        ck_assert_msg(bytes == cases[i].value, "'%s' -> %llu, want %llu", cases[i].text,
                      (unsigned long long)bytes, (unsigned long long)cases[i].value);
    }
}
END_TEST

START_TEST(sizes_refuse_signs_garbage_trailing_junk_overflow_and_empty) {
    static const char *const bad[] = {
        "",
        "-1GiB",
        "-0",
        "+1GiB",
        "1gib",
        "1Gb",
        "1kB",
        "1k",
        "1 GiBs",
        "1GiB ",
        "1 ",
        "1.5 ",
        " 1GiB",
        "GiB",
        "1.",
        "1.KiB",
        ".5GiB",
        "1.5",
        "1.1GiB",
        "1e9",
        "0x10",
        "1,000",
        "1_000",
        "1.5.2MB",
        "1\tGiB",
        "1\n",
        "1GiB/s",
        "1 K B",
        "1KiBKiB",
        "1PiB",
        "18446744073709551616",
        "18446744073709551615K",
        "16777216TiB",
        "99999999999999999999999999 B",
        "0.0000000000000000001B",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t bytes = 12345;
        char why[160] = "";
        ck_assert_msg(kvs_units_parse_size(bad[i], &bytes, why, sizeof why) == KVS_EINVAL,
                      "'%s' accepted", bad[i]);
        ck_assert_msg(bytes == 12345, "'%s' changed the output", bad[i]);
        ck_assert_msg(why[0] != '\0', "'%s' refused without a reason", bad[i]);
    }
    uint64_t bytes = 12345;
    ck_assert_int_eq(kvs_units_parse_size(NULL, &bytes, NULL, 0), KVS_EINVAL);
    ck_assert_int_eq(kvs_units_parse_size("1GiB", NULL, NULL, 0), KVS_EINVAL);
    ck_assert_int_eq(kvs_units_parse_size("1Gb", &bytes, NULL, 0), KVS_EINVAL); /* no why: fine */
    ck_assert_uint_eq(bytes, 12345);
}
END_TEST

START_TEST(a_refused_size_says_why) {
    static const struct {
        const char *text, *reason;
    } cases[] = {
        {"", "the size is empty"},
        {"-1GiB", "a size cannot be negative"},
        {"+1GiB", "a size starts with a number"},
        {"1.GiB", "a digit must follow the decimal point"},
        {"1 ", "spaces must be followed by a unit"},
        {"4Gb", "unknown unit 'Gb' (units: B, K, KiB, M, MiB, G, GiB, T, TiB (powers of 1024), KB, "
                "MB, GB, TB (powers of 1000))"},
        {"1GiB ", "unknown unit 'GiB '"},
        {"1.1GiB", "the size is not a whole number of bytes"},
        {"0.0000019073486328125GiB", "at most 18 digits after the decimal point are read"},
        {"18446744073709551616", "the size is larger than 2^64-1 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t bytes = 0;
        char why[200] = "";
        ck_assert_int_eq(kvs_units_parse_size(cases[i].text, &bytes, why, sizeof why), KVS_EINVAL);
        ck_assert_msg(strstr(why, cases[i].reason) == why,
                      "'%s': \"%s\" does not start with \"%s\"", cases[i].text, why,
                      cases[i].reason);
    }
    /* a long unknown unit is cut, and a short buffer is cut, never overrun */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    uint64_t bytes = 0;
    ck_assert_int_eq(kvs_units_parse_size("1 parsecs-and-more-parsecs", &bytes, tiny, sizeof tiny),
                     KVS_EINVAL);
    ck_assert_uint_eq(strlen(tiny), sizeof tiny - 1);
    char why[200];
    ck_assert_int_eq(kvs_units_parse_size("1 parsecs-and-more-parsecs", &bytes, why, sizeof why),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "unknown unit 'parsecs-and-more'"));
}
END_TEST

/* ---- rates ----------------------------------------------------------------------------------- */

START_TEST(rates_are_sizes_per_second_and_a_bare_size_is_per_second_too) {
    static const accepted cases[] = {
        {"250MB/s", 250000000ull},
        {"1.5GiB/s", 3ull << 29},
        {"4096/s", 4096},
        {"1 MiB/s", 1ull << 20},
        {"200MiB", 200ull << 20},
        {"4MB", 4000000},
        {"0/s", 0},
        {"2K/s", 2048},
        {"18446744073709551615/s", UINT64_MAX},
        {"25000000", 25000000ull},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t rate = 12345;
        char why[160] = "";
        kvs_status st = kvs_units_parse_rate(cases[i].text, &rate, why, sizeof why);
        ck_assert_msg(st == KVS_OK, "'%s' refused: %s", cases[i].text, why);
        ck_assert_msg(rate == cases[i].value, "'%s' -> %llu, want %llu", cases[i].text,
                      (unsigned long long)rate, (unsigned long long)cases[i].value);
    }
}
END_TEST

START_TEST(rates_refuse_other_periods_junk_and_overflow) {
    static const char *const bad[] = {
        "",        "/s",        "fast",     "250MB /s",    "250MB/sec", "250MB/m",
        "250MB/S", "250MB/s/s", "250MB/s ", "-1MB/s",      "1.1GiB/s",  "18446744073709551616/s",
        "MB/s",    "250 /s",    "250mb/s",  "250MB per s",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t rate = 12345;
        char why[160] = "";
        ck_assert_msg(kvs_units_parse_rate(bad[i], &rate, why, sizeof why) == KVS_EINVAL,
                      "'%s' accepted", bad[i]);
        ck_assert_msg(rate == 12345, "'%s' changed the output", bad[i]);
        ck_assert_msg(why[0] != '\0', "'%s' refused without a reason", bad[i]);
    }
    uint64_t rate = 0;
    char why[160];
    ck_assert_int_eq(kvs_units_parse_rate("250MB/m", &rate, why, sizeof why), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "unknown unit 'MB/m'"));
    ck_assert_int_eq(kvs_units_parse_rate(NULL, &rate, NULL, 0), KVS_EINVAL);
    ck_assert_int_eq(kvs_units_parse_rate("1MB/s", NULL, NULL, 0), KVS_EINVAL);
}
END_TEST

static Suite *units_suite(void) {
    Suite *s = suite_create("units");
    TCase *sizes = tcase_create("sizes");
    tcase_add_test(sizes, sizes_accept_every_binary_and_decimal_unit);
    tcase_add_test(sizes, sizes_refuse_signs_garbage_trailing_junk_overflow_and_empty);
    tcase_add_test(sizes, a_refused_size_says_why);
    suite_add_tcase(s, sizes);
    TCase *rates = tcase_create("rates");
    tcase_add_test(rates, rates_are_sizes_per_second_and_a_bare_size_is_per_second_too);
    tcase_add_test(rates, rates_refuse_other_periods_junk_and_overflow);
    suite_add_tcase(s, rates);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(units_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
