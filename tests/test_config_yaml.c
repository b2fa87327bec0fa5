/* test_config_yaml.c - the strict YAML reader under the configuration (connector/config_yaml.c): syntax
 * and encoding errors, typed values, duplicate keys, anchors, aliases, tags, documents, depth and size
 * limits, each refused with its status, file:line:column and key. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "connector/config.h"
#include "tests/support/config_check.h"
#include "tests/support/test_support.h"

START_TEST(yaml_syntax_error_names_file_line_and_problem) {
    cfg_expect_refused("version: 1\ntiers:\n  - name: a\n    type: dram\n   capacity: 1GiB\n",
                       KVS_ECONFIG, "cfg.yaml:5:4: YAML syntax error",
                       "did not find expected '-' indicator");
    cfg_expect_refused("chunk_tokens: [1, 2\n", KVS_ECONFIG, "cfg.yaml:2:1: YAML syntax error",
                       "did not find expected ',' or ']'");
}
END_TEST

START_TEST(invalid_utf8_is_a_syntax_error_at_its_byte) {
    cfg_expect_refused("version: 1\nlog_level: w\xff\n", KVS_ECONFIG,
                       "cfg.yaml:2:13: YAML syntax error", "UTF-8");
}
END_TEST

START_TEST(mapping_where_an_integer_belongs_is_a_type_error) {
    cfg_expect_refused("chunk_tokens: {a: 1}\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:15: key 'chunk_tokens'", "expected an integer, found a mapping");
    cfg_expect_refused("lease_timeout_ms:\n  - 1\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:2:3: key 'lease_timeout_ms'",
                       "expected an integer, found a sequence");
}
END_TEST

START_TEST(text_where_an_integer_belongs_is_a_type_error) {
    cfg_expect_refused("chunk_tokens: 12abc\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:15: key 'chunk_tokens'", "expected an integer, found '12abc'");
    cfg_expect_refused("chunk_tokens: 2.5\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:15: key 'chunk_tokens'", "expected an integer, found '2.5'");
    cfg_expect_refused("chunk_tokens: \"256\"\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:15: key 'chunk_tokens'",
                       "expected an integer, found the quoted string");
    cfg_expect_refused("chunk_tokens:\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:14: key 'chunk_tokens'",
                       "expected an integer, found an empty value");
}
END_TEST

START_TEST(bad_enum_values_list_the_choices) {
    cfg_expect_refused("log_level: verbose\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:12: key 'log_level'",
                       "bad value 'verbose' (expected one of error, warn, info, debug)");
    cfg_expect_refused("tiers:\n  - name: x\n    type: nvme\n", KVS_ECONFIG,
                       "cfg.yaml:3:11: key 'tiers[0].type'",
                       "expected one of compress, dram, peer_gpu, plugin, redis, remote, ssd");
    cfg_expect_refused(ONE_TIER "    write: sideways\n", KVS_ECONFIG,
                       "cfg.yaml:5:12: key 'tiers[0].write'", "expected one of back, through");
}
END_TEST

START_TEST(duplicate_key_in_one_mapping_is_refused) {
    cfg_expect_refused("chunk_tokens: 256\nchunk_tokens: 512\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:2:1: key 'chunk_tokens'", "duplicate key (first given at line 1");
    cfg_expect_refused(ONE_TIER "    capacity: 2GiB\n", KVS_ECONFIG,
                       "cfg.yaml:5:5: key 'tiers[0].capacity'", "duplicate key");
    cfg_expect_refused(ONE_TIER "    options: {a: 1, a: 2}\n", KVS_ECONFIG,
                       "cfg.yaml:5:21: key 'tiers[0].options.a'", "duplicate key");
}
END_TEST

START_TEST(second_document_is_refused) {
    cfg_expect_refused(ONE_TIER "---\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:5:1: ", "second YAML document");
}
END_TEST

START_TEST(aliases_are_refused_with_their_key) {
    cfg_expect_refused("chunk_tokens: &n 256\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:15: key 'chunk_tokens'", "aliases are not supported");
    cfg_expect_refused("tiers:\n  - &t\n    name: a\n    type: dram\n    capacity: 1GiB\n  - *t\n",
                       KVS_ECONFIG, "cfg.yaml:2:5: key 'tiers[0]'", "aliases are not supported");
    cfg_expect_refused(ONE_TIER "    options:\n      a: 1\n      b: *x\n", KVS_ECONFIG,
                       "cfg.yaml:7:10: key 'tiers[0].options.b'", "aliases are not supported");
}
END_TEST

START_TEST(tags_are_refused_with_their_key) {
    cfg_expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: !!str 1GiB\n",
                       KVS_ECONFIG, "cfg.yaml:4:15: key 'tiers[0].capacity'",
                       "tags are not supported");
}
END_TEST

START_TEST(deep_nesting_is_refused_without_recursion) {
    char text[4096];
    size_t n = 0;
    n += (size_t)snprintf(text, sizeof text, "tiers: ");
    for (int i = 0; i < 1000; i++) text[n++] = '[';
    text[n] = '\0';
    cfg_expect_refused(text, KVS_ECONFIG, "cfg.yaml:1:", "nesting is deeper than");
}
END_TEST

START_TEST(file_larger_than_the_limit_is_refused) {
    size_t len = KVS_CONFIG_MAX_BYTES + 100;
    char *text = malloc(len + 1);
    ck_assert_ptr_nonnull(text);
    memset(text, '#', len);
    text[len] = '\0';
    cfg_expect_refused(text, KVS_ECONFIG, "cfg.yaml:1:1: ", "more than the");
    free(text);
}
END_TEST

static Suite *config_yaml_suite(void) {
    Suite *s = suite_create("config_yaml");
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, yaml_syntax_error_names_file_line_and_problem);
    tcase_add_test(errors, invalid_utf8_is_a_syntax_error_at_its_byte);
    tcase_add_test(errors, mapping_where_an_integer_belongs_is_a_type_error);
    tcase_add_test(errors, text_where_an_integer_belongs_is_a_type_error);
    tcase_add_test(errors, bad_enum_values_list_the_choices);
    tcase_add_test(errors, duplicate_key_in_one_mapping_is_refused);
    tcase_add_test(errors, second_document_is_refused);
    tcase_add_test(errors, aliases_are_refused_with_their_key);
    tcase_add_test(errors, tags_are_refused_with_their_key);
    tcase_add_test(errors, deep_nesting_is_refused_without_recursion);
    tcase_add_test(errors, file_larger_than_the_limit_is_refused);
    suite_add_tcase(s, errors);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(config_yaml_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
