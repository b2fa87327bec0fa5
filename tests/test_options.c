/* test_options.c - the table-driven option parser the built-in backends share (common/options.h). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/options.h"

typedef struct sample {
    uint8_t small;
    uint16_t port;
    uint32_t count;
    uint64_t timeout_ms, latency_us, bytes, stripe, rate;
    int engine;
    uint32_t flag;
    const char *label;
    const char *items[4];
    uint32_t n_items;
} sample;

static int parse_item(const char *value, void *out, uint64_t nth, char *why, size_t why_len) {
    sample *s = out;
    if (strcmp(value, "bad") == 0 || nth >= 4) {
        snprintf(why, why_len, "item \"%s\" is refused (%llu before it)", value,
                 (unsigned long long)nth);
        return -1;
    }
    s->items[s->n_items++] = value;
    return 0;
}

enum {
    O_ITEM,
    O_SMALL,
    O_PORT,
    O_COUNT_,
    O_TIMEOUT,
    O_LATENCY,
    O_BYTES,
    O_STRIPE,
    O_RATE,
    O_ENGINE,
    O_FLAG,
    O_LABEL,
    O_N
};
static const kvs_option_desc TABLE[O_N] = {
    [O_ITEM] = {.name = "item", .kind = KVS_OPTION_CUSTOM, .repeated = 1, .parse = parse_item},
    [O_SMALL] = {.name = "small", .kind = KVS_OPTION_COUNT, KVS_OPTION_FIELD(sample, small)},
    [O_PORT] = {.name = "port", .kind = KVS_OPTION_COUNT, KVS_OPTION_FIELD(sample, port), .min = 1},
    [O_COUNT_] = {.name = "count",
                  .kind = KVS_OPTION_COUNT,
                  KVS_OPTION_FIELD(sample, count),
                  .min = 2,
                  .max = 8},
    [O_TIMEOUT] = {.name = "timeout_ms",
                   .kind = KVS_OPTION_MILLISECONDS,
                   KVS_OPTION_FIELD(sample, timeout_ms),
                   .min = 1,
                   .max = 60000},
    [O_LATENCY] = {.name = "latency_us",
                   .kind = KVS_OPTION_MICROSECONDS,
                   KVS_OPTION_FIELD(sample, latency_us),
                   .max = 1000},
    [O_BYTES] = {.name = "bytes",
                 .kind = KVS_OPTION_SIZE,
                 KVS_OPTION_FIELD(sample, bytes),
                 .min = 1,
                 .example = "64MiB"},
    [O_STRIPE] = {.name = "stripe",
                  .kind = KVS_OPTION_SIZE,
                  KVS_OPTION_FIELD(sample, stripe),
                  .min = 4096,
                  .max = 1ull << 30,
                  .multiple = 4096},
    [O_RATE] = {.name = "rate",
                .kind = KVS_OPTION_RATE,
                KVS_OPTION_FIELD(sample, rate),
                .min = 1,
                .example = "250MB/s"},
    [O_ENGINE] = {.name = "engine",
                  .kind = KVS_OPTION_CHOICE,
                  KVS_OPTION_FIELD(sample, engine),
                  .choices = "uring|pread|mmap"},
    [O_FLAG] = {.name = "flag", .kind = KVS_OPTION_BOOL, KVS_OPTION_FIELD(sample, flag)},
    [O_LABEL] = {.name = "label", .kind = KVS_OPTION_STRING, KVS_OPTION_FIELD(sample, label)},
};

static char why[512], refused[64];

static kvs_status parse(const kvs_backend_option *opts, uint64_t n, sample *s, uint32_t *given) {
    why[0] = refused[0] = '\0';
    return kvs_options_parse(TABLE, O_N, opts, n, s, given, why, sizeof why, refused,
                             sizeof refused);
}

/* One option alone must be refused with a sentence holding `phrase`, naming `name`. */
static void expect_refused(const char *key, const char *value, const char *phrase,
                           const char *name) {
    sample s;
    memset(&s, 0, sizeof s);
    kvs_backend_option opt = {key, value};
    ck_assert_int_eq(parse(&opt, 1, &s, NULL), KVS_ECONFIG);
    ck_assert_msg(strstr(why, phrase) != NULL, "%s=%s: \"%s\" lacks \"%s\"", key, value, why,
                  phrase);
    ck_assert_str_eq(refused, name);
}

START_TEST(every_kind_lands_in_its_field) {
    kvs_backend_option opts[] = {
        {"item", "a"},          {"small", "255"},    {"port", "65535"},    {"count", "8"},
        {"timeout_ms", "1500"}, {"latency_us", "0"}, {"bytes", "1.5 KiB"}, {"stripe", "64KiB"},
        {"rate", "2MB/s"},      {"engine", "mmap"},  {"flag", "on"},       {"label", "hello"},
        {"item", "b"},
    };
    sample s;
    memset(&s, 0xAB, sizeof s);
    s.n_items = 0;
    uint32_t given[O_N];
    ck_assert_msg(parse(opts, sizeof opts / sizeof opts[0], &s, given) == KVS_OK, "%s", why);
    ck_assert_uint_eq(s.small, 255);
    ck_assert_uint_eq(s.port, 65535);
    ck_assert_uint_eq(s.count, 8);
    ck_assert_uint_eq(s.timeout_ms, 1500);
    ck_assert_uint_eq(s.latency_us, 0);
    ck_assert_uint_eq(s.bytes, 1536);
    ck_assert_uint_eq(s.stripe, 65536);
    ck_assert_uint_eq(s.rate, 2000000);
    ck_assert_int_eq(s.engine, 2);
    ck_assert_uint_eq(s.flag, 1);
    ck_assert_str_eq(s.label, "hello");
    ck_assert_uint_eq(s.n_items, 2);
    ck_assert_str_eq(s.items[0], "a");
    ck_assert_str_eq(s.items[1], "b");
    ck_assert_uint_eq(given[O_ITEM], 2);
    ck_assert_uint_eq(given[O_FLAG], 1);
    ck_assert_uint_eq(given[O_LABEL], 1);
}
END_TEST

START_TEST(options_not_given_keep_their_defaults) {
    sample s;
    memset(&s, 0, sizeof s);
    s.count = 4;
    s.rate = 77;
    uint32_t given[O_N];
    memset(given, 0xFF, sizeof given);
    kvs_backend_option opt = {"flag", "false"};
    ck_assert_int_eq(parse(&opt, 1, &s, given), KVS_OK);
    ck_assert_uint_eq(s.count, 4);
    ck_assert_uint_eq(s.rate, 77);
    ck_assert_uint_eq(s.flag, 0);
    ck_assert_uint_eq(given[O_COUNT_], 0);
    ck_assert_uint_eq(given[O_FLAG], 1);
    ck_assert_int_eq(parse(NULL, 0, &s, NULL), KVS_OK);
}
END_TEST

START_TEST(unknown_and_repeated_names_are_refused_listing_the_valid_ones) {
    expect_refused(
        "colour", "red",
        "unknown option \"colour\" (valid options: item, small, port, count, timeout_ms, "
        "latency_us, bytes, stripe, rate, engine, flag, label)",
        "colour");
    sample s;
    memset(&s, 0, sizeof s);
    kvs_backend_option twice[] = {{"count", "2"}, {"count", "3"}};
    ck_assert_int_eq(parse(twice, 2, &s, NULL), KVS_ECONFIG);
    ck_assert_str_eq(why, "option count is given twice");
    ck_assert_str_eq(refused, "count");
    kvs_backend_option unnamed = {NULL, "x"};
    ck_assert_int_eq(parse(&unnamed, 1, &s, NULL), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(why, "unknown option \"\""));
}
END_TEST

START_TEST(a_refused_repeated_option_is_named_with_its_index) {
    sample s;
    memset(&s, 0, sizeof s);
    kvs_backend_option opts[] = {{"item", "a"}, {"item", "b"}, {"item", "bad"}};
    ck_assert_int_eq(parse(opts, 3, &s, NULL), KVS_ECONFIG);
    ck_assert_str_eq(refused, "item[2]");
    ck_assert_str_eq(why, "item \"bad\" is refused (2 before it)");
}
END_TEST

START_TEST(numbers_outside_their_range_or_field_are_refused_with_the_range) {
    expect_refused("count", "9", "count \"9\" is not a whole number from 2 to 8", "count");
    expect_refused("count", "1", "from 2 to 8", "count");
    expect_refused("count", "-3", "count \"-3\" is not a whole number", "count");
    expect_refused("count", "3 ", "is not a whole number", "count");
    expect_refused("count", "", "is not a whole number", "count");
    expect_refused("small", "256", "small \"256\" is not a whole number from 0 to 255", "small");
    expect_refused("port", "0", "from 1 to 65535", "port");
    expect_refused("port", "99999999999999999999999", "from 1 to 65535", "port");
    expect_refused("timeout_ms", "60001",
                   "timeout_ms \"60001\" is not a whole number of milliseconds from 1 to 60000",
                   "timeout_ms");
    expect_refused("latency_us", "1e3",
                   "latency_us \"1e3\" is not a whole number of microseconds from 0 to 1000",
                   "latency_us");
}
END_TEST

START_TEST(sizes_and_rates_are_refused_naming_the_option_an_example_and_why) {
    expect_refused("bytes", "64mb", "bytes \"64mb\" is not a size such as 64MiB: unknown unit 'mb'",
                   "bytes");
    expect_refused("bytes", "0", "bytes \"0\" is not a size such as 64MiB: it must be at least 1B",
                   "bytes");
    expect_refused("stripe", "5000",
                   "stripe \"5000\" is not a multiple of 4KiB between 4KiB and 1GiB", "stripe");
    expect_refused("stripe", "2GiB", "is not a multiple of 4KiB between 4KiB and 1GiB", "stripe");
    expect_refused("stripe", "x", "stripe \"x\" is not a size such as 64MiB", "stripe");
    expect_refused("rate", "fast",
                   "rate \"fast\" is not a rate such as 250MB/s: a size starts with a number",
                   "rate");
    expect_refused("rate", "0/s",
                   "rate \"0/s\" is not a rate such as 250MB/s: it must be at least 1B/s", "rate");
    expect_refused("rate", "250MB/min", "unknown unit 'MB/min'", "rate");
}
END_TEST

START_TEST(choices_booleans_and_strings_are_refused_with_what_they_take) {
    expect_refused("engine", "aio", "engine \"aio\" is not uring, pread or mmap", "engine");
    expect_refused("engine", "URING", "is not uring, pread or mmap", "engine");
    expect_refused("flag", "maybe", "flag \"maybe\" is not true or false", "flag");
    expect_refused("label", "", "label is empty", "label");
    sample s;
    memset(&s, 0, sizeof s);
    kvs_backend_option no_value = {"label", NULL};
    ck_assert_int_eq(parse(&no_value, 1, &s, NULL), KVS_ECONFIG);
    ck_assert_str_eq(why, "label is empty");
}
END_TEST

START_TEST(a_refusal_is_named_for_the_connector_only_when_it_can_hold_it) {
    char name[32] = "unchanged";
    kvs_backend_init init;
    memset(&init, 0, sizeof init);
    init.struct_size = sizeof init;
    init.error_option = name;
    init.error_option_len = sizeof name;
    kvs_option_refused(&init, "path", 3);
    ck_assert_str_eq(name, "path[3]");
    kvs_option_refused(&init, "capacity", -1);
    ck_assert_str_eq(name, "capacity");
    init.struct_size = (uint32_t)offsetof(kvs_backend_init, error_option); /* a 1.2 connector */
    kvs_option_refused(&init, "shm_name", -1);
    ck_assert_str_eq(name, "capacity");
    ck_assert_int_eq(kvs_options_refuse(NULL, 0, "x", -1), KVS_ECONFIG);
    char tiny[4];
    ck_assert_int_eq(kvs_options_refuse(tiny, sizeof tiny, "replicas", -1), KVS_ECONFIG);
    ck_assert_str_eq(tiny, "rep");
}
END_TEST

/* A number whose descriptor names no field (KVS_OPTION_FIELD forgotten) would be stored as 8 bytes at
 * offset 0 of the caller's struct: the table is refused instead, before any option is read. */
START_TEST(a_table_entry_without_a_field_is_refused_and_writes_nothing) {
    static const kvs_option_desc broken[] = {
        {.name = "label", .kind = KVS_OPTION_STRING, KVS_OPTION_FIELD(sample, label)},
        {.name = "count", .kind = KVS_OPTION_COUNT, .max = 9},
    };
    kvs_backend_option opt = {.key = "count", .value = "7"};
    sample s;
    memset(&s, 0xab, sizeof s);
    char why_text[200] = "", refused_name[64] = "";
    ck_assert_int_eq(kvs_options_parse(broken, 2, &opt, 1, &s, NULL, why_text, sizeof why_text,
                                       refused_name, sizeof refused_name),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(why_text, "option count has no field"), "%s", why_text);
    ck_assert_str_eq(refused_name, "count");
    ck_assert_uint_eq(s.small, 0xab);
    ck_assert_uint_eq(s.port, 0xabab);
}
END_TEST

/* Whole numbers up to 2^64-1 are read exactly: the overflow check is per digit. */
START_TEST(a_count_reads_up_to_the_largest_64_bit_number) {
    uint64_t v = 0;
    ck_assert_int_eq(kvs_option_count("18446744073709551615", 0, UINT64_MAX, &v), 0);
    ck_assert_uint_eq(v, UINT64_MAX);
    ck_assert_int_eq(kvs_option_count("18446744073709551610", 0, UINT64_MAX, &v), 0);
    ck_assert_uint_eq(v, UINT64_MAX - 5);
    ck_assert_int_eq(kvs_option_count("18446744073709551616", 0, UINT64_MAX, &v), -1);
    ck_assert_uint_eq(v, UINT64_MAX - 5);
}
END_TEST

static Suite *options_suite(void) {
    Suite *s = suite_create("options");
    TCase *c = tcase_create("table");
    tcase_add_test(c, every_kind_lands_in_its_field);
    tcase_add_test(c, options_not_given_keep_their_defaults);
    tcase_add_test(c, unknown_and_repeated_names_are_refused_listing_the_valid_ones);
    tcase_add_test(c, a_refused_repeated_option_is_named_with_its_index);
    tcase_add_test(c, numbers_outside_their_range_or_field_are_refused_with_the_range);
    tcase_add_test(c, sizes_and_rates_are_refused_naming_the_option_an_example_and_why);
    tcase_add_test(c, choices_booleans_and_strings_are_refused_with_what_they_take);
    tcase_add_test(c, a_refusal_is_named_for_the_connector_only_when_it_can_hold_it);
    tcase_add_test(c, a_table_entry_without_a_field_is_refused_and_writes_nothing);
    tcase_add_test(c, a_count_reads_up_to_the_largest_64_bit_number);
    suite_add_tcase(s, c);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(options_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
