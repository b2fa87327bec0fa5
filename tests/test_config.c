/* test_config.c - the strict YAML configuration: values, defaults, sizes, and one test per error
 * class checking the status and that the message names file, line:column and key. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_backend.h"
#include "connector/config.h"
#include "tests/support/test_support.h"

#ifndef KVS_SOURCE_DIR
#define KVS_SOURCE_DIR "."
#endif

static char err[2048];
static char last_path[1024];
static kvs_config not_set; /* stands in *out before a call, so a left-over pointer is noticed */

/* Writes text as cfg.yaml in a fresh directory and loads it; the directory is removed after. */
static kvs_status load_yaml(const char *text, kvs_config **cfg) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(kvs_test_write_file(dir, "cfg.yaml", text, last_path, sizeof last_path), 0);
    err[0] = '\0';
    *cfg = &not_set;
    kvs_status st = kvs_config_load(last_path, cfg, err, sizeof err);
    kvs_test_rmtree(dir);
    return st;
}

/* Expects `text` to be refused with `want`, *out NULL, and a message holding `where`
 * (file:line:col: key) and `what` (the explanation); either may be NULL. */
static void expect_refused(const char *text, kvs_status want, const char *where, const char *what) {
    kvs_config *cfg;
    kvs_status st = load_yaml(text, &cfg);
    ck_assert_msg(st == want, "status %d, want %d (message: %s)", st, want, err);
    ck_assert_ptr_null(cfg);
    if (where) ck_assert_msg(strstr(err, where) != NULL, "message \"%s\" lacks \"%s\"", err, where);
    if (what) ck_assert_msg(strstr(err, what) != NULL, "message \"%s\" lacks \"%s\"", err, what);
}

static kvs_config *load_ok(const char *text) {
    kvs_config *cfg;
    kvs_status st = load_yaml(text, &cfg);
    ck_assert_msg(st == KVS_OK, "status %d: %s", st, err);
    ck_assert_ptr_nonnull(cfg);
    return cfg;
}

#define ONE_TIER "tiers:\n  - name: dram\n    type: dram\n    capacity: 1GiB\n"

/* ---- valid files ----------------------------------------------------------------------------- */

static const char FULL[] = "# every key\n"
                           "version: 1\n"
                           "chunk_tokens: 512\n"
                           "lease_timeout_ms: 45000\n"
                           "save_decode: yes\n"
                           "log_level: debug\n"
                           "pool:\n"
                           "  staging_bytes: 64MiB\n"
                           "tiers:\n"
                           "  - name: hot\n"
                           "    type: dram\n"
                           "    capacity: 1.5 GiB\n"
                           "    write: through\n"
                           "    options:\n"
                           "      shm_name: kvs-demo\n"
                           "      pin_timeout_ms: 250\n"
                           "  - name: remote.0\n"
                           "    type: plugin\n"
                           "    plugin: /opt/kvs/remote.so\n"
                           "    capacity: 10 GB\n"
                           "    options: {endpoint: \"tcp://10.0.0.1:7000\"}\n";

START_TEST(full_file_parses_to_the_values_it_states) {
    kvs_config *cfg = load_ok(FULL);
    ck_assert_str_eq(cfg->source, last_path);
    ck_assert_uint_eq(cfg->version, 1);
    ck_assert_uint_eq(cfg->chunk_tokens, 512);
    ck_assert_uint_eq(cfg->lease_timeout_ms, 45000);
    ck_assert_int_eq(cfg->save_decode, 1);
    ck_assert_int_eq(cfg->log_level, KVS_LOG_DEBUG);
    ck_assert_uint_eq(cfg->staging_bytes, 64ull << 20);
    ck_assert_uint_eq(cfg->n_tiers, 2);
    const kvs_tier_config *hot = &cfg->tiers[0], *remote = &cfg->tiers[1];
    ck_assert_str_eq(hot->name, "hot");
    ck_assert_str_eq(hot->type, "dram");
    ck_assert_uint_eq(hot->capacity_bytes, 3ull << 29);
    ck_assert_int_eq(hot->write, KVS_WRITE_THROUGH);
    ck_assert_str_eq(hot->plugin, "");
    ck_assert_int_eq(hot->line, 10);
    ck_assert_int_eq(hot->column, 5);
    ck_assert_uint_eq(hot->n_options, 2);
    ck_assert_str_eq(hot->options[0].key, "shm_name");
    ck_assert_str_eq(hot->options[0].value, "kvs-demo");
    ck_assert_str_eq(hot->options[1].key, "pin_timeout_ms");
    ck_assert_str_eq(hot->options[1].value, "250");
    ck_assert_str_eq(remote->name, "remote.0");
    ck_assert_str_eq(remote->type, "plugin");
    ck_assert_str_eq(remote->plugin, "/opt/kvs/remote.so");
    ck_assert_uint_eq(remote->capacity_bytes, 10000000000ull);
    ck_assert_int_eq(remote->write, KVS_WRITE_BACK);
    ck_assert_uint_eq(remote->n_options, 1);
    ck_assert_str_eq(remote->options[0].value, "tcp://10.0.0.1:7000");
    kvs_config_free(cfg);
}
END_TEST

/* kvstrata-node's section: values as stated, the key file resolved against the file's directory. */
START_TEST(the_node_section_parses_for_kvstrata_node) {
    kvs_config *cfg =
        load_ok("node:\n  listen: 10.0.0.7:13337\n  psk_file: keys/node.key\n  max_clients: 9\n"
                "  timeout_ms: 1234\n  max_object_bytes: 8MiB\n" ONE_TIER);
    ck_assert_str_eq(cfg->node.listen, "10.0.0.7:13337");
    const char *slash = strrchr(last_path, '/');
    ck_assert_ptr_nonnull(slash);
    char want[1200];
    snprintf(want, sizeof want, "%.*s/keys/node.key", (int)(slash - last_path), last_path);
    ck_assert_str_eq(cfg->node.psk_file, want);
    ck_assert_uint_eq(cfg->node.max_clients, 9);
    ck_assert_uint_eq(cfg->node.timeout_ms, 1234);
    ck_assert_uint_eq(cfg->node.max_object_bytes, 8ull << 20);
    kvs_config_free(cfg);
    cfg = load_ok(ONE_TIER);
    ck_assert_str_eq(cfg->node.listen, "");
    ck_assert_uint_eq(cfg->node.max_clients, 0);
    kvs_config_free(cfg);
    expect_refused("node:\n  listen: 10.0.0.7\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:11: key 'node.listen'", "expected HOST:PORT");
    expect_refused("node:\n  listen: 10.0.0.7:70000\n" ONE_TIER, KVS_ECONFIG, "key 'node.listen'",
                   "HOST:PORT");
    expect_refused("node:\n  timeout_ms: 0\n" ONE_TIER, KVS_ECONFIG, "key 'node.timeout_ms'", "");
    expect_refused("node:\n  port: 1\n" ONE_TIER, KVS_ECONFIG, "key 'node.port': unknown key",
                   "valid keys: listen, psk_file, max_clients, timeout_ms, max_object_bytes");
}
END_TEST

/* cfg.yaml with `restore:` beside a profile.yaml holding profile_text (NULL: no profile file). */
static kvs_status load_with_profile(const char *profile_text, const char *restore,
                                    kvs_config **cfg) {
    char dir[512], path[1024], text[2048];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    if (profile_text)
        ck_assert_int_eq(kvs_test_write_file(dir, "profile.yaml", profile_text, path, sizeof path),
                         0);
    snprintf(text, sizeof text, "restore:\n%s" ONE_TIER, restore);
    ck_assert_int_eq(kvs_test_write_file(dir, "cfg.yaml", text, last_path, sizeof last_path), 0);
    err[0] = '\0';
    *cfg = &not_set;
    kvs_status st = kvs_config_load(last_path, cfg, err, sizeof err);
    kvs_test_rmtree(dir);
    return st;
}

#define PROFILE_OK                                                                      \
    "compute:\n  fixed_us: 50\n  per_token_us: 2.5\n  attention_ns_per_token2: 0.125\n" \
    "tiers:\n  - name: dram\n    latency_us: 20\n    bandwidth_mb_s: 1500\n"
#define CACHEFLOW "  scheduler: cacheflow\n  profile: profile.yaml\n"

START_TEST(the_restore_section_reads_its_profile) {
    kvs_config *cfg;
    ck_assert_msg(load_with_profile(PROFILE_OK, CACHEFLOW "  priority: mean\n", &cfg) == KVS_OK,
                  "%s", err);
    ck_assert_int_eq(cfg->restore.scheduler, KVS_RESTORE_CACHEFLOW);
    ck_assert_int_eq(cfg->restore.priority, 2);
    ck_assert_ptr_nonnull(strstr(cfg->restore.profile, "/profile.yaml"));
    ck_assert_double_eq_tol(cfg->restore.fixed_s, 50e-6, 1e-15);
    ck_assert_double_eq_tol(cfg->restore.per_token_s, 2.5e-6, 1e-15);
    ck_assert_double_eq_tol(cfg->restore.attention_s_per_token2, 0.125e-9, 1e-20);
    ck_assert_uint_eq(cfg->restore.n_tiers, 1);
    ck_assert_str_eq(cfg->restore.tiers[0].name, "dram");
    ck_assert_double_eq_tol(cfg->restore.tiers[0].latency_s, 20e-6, 1e-15);
    ck_assert_double_eq_tol(cfg->restore.tiers[0].bytes_per_s, 1500e6, 1e-3);
    kvs_config_free(cfg);
    cfg = load_ok(ONE_TIER); /* no section: no planner, srf if one is configured later */
    ck_assert_int_eq(cfg->restore.scheduler, KVS_RESTORE_NONE);
    ck_assert_int_eq(cfg->restore.priority, 1);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(restore_errors_name_the_file_and_key) {
    kvs_config *cfg;
    ck_assert_int_eq(load_with_profile(NULL, "  scheduler: cacheflow\n", &cfg), KVS_ECONFIG);
    ck_assert_msg(strstr(err, "key 'restore'") && strstr(err, "needs `profile:`"), "%s", err);
    ck_assert_int_eq(load_with_profile(NULL, CACHEFLOW, &cfg), KVS_ECONFIG);
    ck_assert_msg(strstr(err, "key 'restore.profile'") && strstr(err, "cannot open"), "%s", err);
    ck_assert_int_eq(load_with_profile(PROFILE_OK, "  scheduler: magic\n", &cfg), KVS_ECONFIG);
    ck_assert_msg(strstr(err, "none, cacheflow"), "%s", err);
    ck_assert_int_eq(
        load_with_profile(
            "compute:\n  fixed_us: 1\n  per_token_us: x\n  attention_ns_per_token2: 0\n"
            "tiers:\n  - {name: dram, latency_us: 0, bandwidth_mb_s: 1}\n",
            CACHEFLOW, &cfg),
        KVS_ECONFIG);
    ck_assert_msg(strstr(err, "profile.yaml:3:17: key 'compute.per_token_us'") &&
                      strstr(err, "expected a number"),
                  "%s", err);
    ck_assert_int_eq(
        load_with_profile(
            "compute:\n  fixed_us: 1\n  per_token_us: 1\n  attention_ns_per_token2: 0\n"
            "tiers:\n  - {name: dram, latency_us: 0}\n",
            CACHEFLOW, &cfg),
        KVS_ECONFIG);
    ck_assert_msg(strstr(err, "tiers[0].bandwidth'") && strstr(err, "missing required key"), "%s",
                  err);
    ck_assert_int_eq(
        load_with_profile(
            "compute:\n  fixed_us: 0\n  per_token_us: 0\n  attention_ns_per_token2: 0\n"
            "tiers:\n  - {name: dram, latency_us: 0, bandwidth_mb_s: 1}\n",
            CACHEFLOW, &cfg),
        KVS_ECONFIG);
    ck_assert_msg(strstr(err, "recomputing would look free"), "%s", err);
    ck_assert_int_eq(
        load_with_profile(
            "compute:\n  fixed_us: 1\n  per_token_us: 1\n  attention_ns_per_token2: 0\n"
            "tiers:\n  - {name: dram, latency_us: 0, bandwidth_mb_s: 0}\n",
            CACHEFLOW, &cfg),
        KVS_ECONFIG);
    ck_assert_msg(strstr(err, "out of range"), "%s", err);
}
END_TEST

/* bandwidth is a rate in the one grammar of sizes and rates; bandwidth_mb_s its older spelling. */
START_TEST(a_profile_tier_gives_its_bandwidth_as_a_rate) {
#define PROFILE_COMPUTE "compute:\n  fixed_us: 1\n  per_token_us: 1\n  attention_ns_per_token2: 0\n"
    kvs_config *cfg;
    ck_assert_msg(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                    "bandwidth: 1.5GB/s}\n",
                                    CACHEFLOW, &cfg) == KVS_OK,
                  "%s", err);
    ck_assert_double_eq_tol(cfg->restore.tiers[0].bytes_per_s, 1.5e9, 1e-3);
    kvs_config_free(cfg);
    ck_assert_msg(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                    "bandwidth: 4MiB}\n",
                                    CACHEFLOW, &cfg) == KVS_OK,
                  "%s", err);
    ck_assert_double_eq_tol(cfg->restore.tiers[0].bytes_per_s, 4194304.0, 1e-3);
    kvs_config_free(cfg);
    ck_assert_int_eq(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                       "bandwidth: 4Mb/s}\n",
                                       CACHEFLOW, &cfg),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(err, "key 'tiers[0].bandwidth'") && strstr(err, "unknown unit 'Mb'"), "%s",
                  err);
    ck_assert_int_eq(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                       "bandwidth: 0/s}\n",
                                       CACHEFLOW, &cfg),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(err, "greater than 0"), "%s", err);
    ck_assert_int_eq(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                       "bandwidth: 1MB/s, bandwidth_mb_s: 1}\n",
                                       CACHEFLOW, &cfg),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(err, "not both"), "%s", err);
#undef PROFILE_COMPUTE
}
END_TEST

START_TEST(keys_left_out_take_their_defaults) {
    kvs_config *cfg = load_ok(ONE_TIER);
    ck_assert_uint_eq(cfg->version, 1);
    ck_assert_uint_eq(cfg->chunk_tokens, 256);
    ck_assert_uint_eq(cfg->lease_timeout_ms, 30000);
    ck_assert_int_eq(cfg->save_decode, 0);
    ck_assert_int_eq(cfg->log_level, KVS_LOG_WARN);
    ck_assert_uint_eq(cfg->staging_bytes, 256ull << 20);
    ck_assert_int_eq(cfg->tiers[0].write, KVS_WRITE_BACK);
    ck_assert_uint_eq(cfg->tiers[0].n_options, 0);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(defaults_are_one_dram_tier_of_one_gib_and_chunks_of_256) {
    kvs_config *cfg = NULL;
    ck_assert_int_eq(kvs_config_defaults(&cfg), KVS_OK);
    ck_assert_str_eq(cfg->source, "<defaults>");
    ck_assert_uint_eq(cfg->version, 1);
    ck_assert_uint_eq(cfg->chunk_tokens, 256);
    ck_assert_uint_eq(cfg->lease_timeout_ms, 30000);
    ck_assert_int_eq(cfg->save_decode, 0);
    ck_assert_int_eq(cfg->log_level, KVS_LOG_WARN);
    ck_assert_uint_eq(cfg->staging_bytes, 256ull << 20);
    ck_assert_uint_eq(cfg->n_tiers, 1);
    ck_assert_str_eq(cfg->tiers[0].name, "dram");
    ck_assert_str_eq(cfg->tiers[0].type, "dram");
    ck_assert_uint_eq(cfg->tiers[0].capacity_bytes, 1ull << 30);
    ck_assert_int_eq(cfg->tiers[0].write, KVS_WRITE_BACK);
    ck_assert_uint_eq(cfg->tiers[0].n_options, 0);
    kvs_config_free(cfg);
    ck_assert_int_eq(kvs_config_defaults(NULL), KVS_EINVAL);
    kvs_config_free(NULL);
}
END_TEST

START_TEST(booleans_accept_true_false_yes_no_on_off) {
    static const struct {
        const char *text;
        int value;
    } cases[] = {{"true", 1}, {"false", 0}, {"yes", 1},  {"no", 0},
                 {"on", 1},   {"off", 0},   {"True", 1}, {"OFF", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "save_decode: %s\n" ONE_TIER, cases[i].text);
        kvs_config *cfg = load_ok(text);
        ck_assert_msg(cfg->save_decode == cases[i].value, "%s", cases[i].text);
        kvs_config_free(cfg);
    }
}
END_TEST

START_TEST(log_levels_map_to_their_constants) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    static const int levels[] = {KVS_LOG_ERROR, KVS_LOG_WARN, KVS_LOG_INFO, KVS_LOG_DEBUG};
    for (size_t i = 0; i < 4; i++) {
        char text[256];
        snprintf(text, sizeof text, "log_level: %s\n" ONE_TIER, names[i]);
        kvs_config *cfg = load_ok(text);
        ck_assert_int_eq(cfg->log_level, levels[i]);
        kvs_config_free(cfg);
    }
}
END_TEST

/* ---- sizes ----------------------------------------------------------------------------------- */

/* The grammar itself is tested in test_units.c; here, how the loader reports a refusal. */
START_TEST(bad_unit_names_the_unit_file_line_and_key) {
    expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: 4Gb\n", KVS_ECONFIG,
                   "cfg.yaml:4:15: key 'tiers[0].capacity'", "unknown unit 'Gb'");
    expect_refused("pool:\n  staging_bytes: 12 parsecs\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:18: key 'pool.staging_bytes'", "unknown unit 'parsecs'");
}
END_TEST

START_TEST(negative_and_fractional_byte_sizes_are_refused) {
    expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: -1GiB\n", KVS_ECONFIG,
                   "cfg.yaml:4:15: key 'tiers[0].capacity'", "cannot be negative");
    expect_refused("pool:\n  staging_bytes: 1.1KiB\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:18: key 'pool.staging_bytes'", "not a whole number of bytes");
}
END_TEST

/* ---- error classes --------------------------------------------------------------------------- */

START_TEST(yaml_syntax_error_names_file_line_and_problem) {
    expect_refused("version: 1\ntiers:\n  - name: a\n    type: dram\n   capacity: 1GiB\n",
                   KVS_ECONFIG, "cfg.yaml:5:4: YAML syntax error",
                   "did not find expected '-' indicator");
    expect_refused("chunk_tokens: [1, 2\n", KVS_ECONFIG, "cfg.yaml:2:1: YAML syntax error",
                   "did not find expected ',' or ']'");
}
END_TEST

START_TEST(invalid_utf8_is_a_syntax_error_at_its_byte) {
    expect_refused("version: 1\nlog_level: w\xff\n", KVS_ECONFIG,
                   "cfg.yaml:2:13: YAML syntax error", "UTF-8");
}
END_TEST

START_TEST(unknown_key_names_file_line_and_valid_keys) {
    expect_refused("version: 1\nchunk_size: 256\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:1: key 'chunk_size': unknown key",
                   "valid keys: version, chunk_tokens, lease_timeout_ms, save_decode, log_level, "
                   "pool, tiers");
}
END_TEST

START_TEST(unknown_key_inside_a_tier_names_its_full_path) {
    expect_refused("tiers:\n  - name: dram\n    type: dram\n    capcity: 1GiB\n", KVS_ECONFIG,
                   "cfg.yaml:4:5: key 'tiers[0].capcity': unknown key",
                   "valid keys: name, type, capacity, write, plugin, options");
    expect_refused("pool:\n  staging: 1GiB\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:3: key 'pool.staging': unknown key", "valid keys: staging_bytes");
}
END_TEST

START_TEST(mapping_where_an_integer_belongs_is_a_type_error) {
    expect_refused("chunk_tokens: {a: 1}\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:1:15: key 'chunk_tokens'", "expected an integer, found a mapping");
    expect_refused("lease_timeout_ms:\n  - 1\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:3: key 'lease_timeout_ms'", "expected an integer, found a sequence");
}
END_TEST

START_TEST(text_where_an_integer_belongs_is_a_type_error) {
    expect_refused("chunk_tokens: 12abc\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:1:15: key 'chunk_tokens'", "expected an integer, found '12abc'");
    expect_refused("chunk_tokens: 2.5\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:15: key 'chunk_tokens'",
                   "expected an integer, found '2.5'");
    expect_refused("chunk_tokens: \"256\"\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:1:15: key 'chunk_tokens'",
                   "expected an integer, found the quoted string");
    expect_refused("chunk_tokens:\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:14: key 'chunk_tokens'",
                   "expected an integer, found an empty value");
}
END_TEST

START_TEST(non_boolean_save_decode_is_a_type_error) {
    expect_refused("save_decode: maybe\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:14: key 'save_decode'",
                   "expected a boolean");
    expect_refused("save_decode: 1\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:14: key 'save_decode'",
                   "found '1'");
}
END_TEST

START_TEST(tiers_given_as_a_mapping_is_a_type_error) {
    expect_refused("tiers:\n  dram: {type: dram}\n", KVS_ECONFIG, "cfg.yaml:2:3: key 'tiers'",
                   "expected a sequence of tiers, found a mapping");
}
END_TEST

START_TEST(tier_entry_that_is_not_a_mapping_is_a_type_error) {
    expect_refused(ONE_TIER "  - dram\n", KVS_ECONFIG, "cfg.yaml:5:5: key 'tiers[1]'",
                   "expected a mapping (one tier), found a scalar");
}
END_TEST

START_TEST(nested_option_value_is_a_type_error) {
    expect_refused(ONE_TIER "    options:\n      shm_name: [a, b]\n", KVS_ECONFIG,
                   "cfg.yaml:6:17: key 'tiers[0].options.shm_name'",
                   "an option value must be a scalar, found a sequence");
    expect_refused(ONE_TIER "    options: kvs-shared\n", KVS_ECONFIG,
                   "cfg.yaml:5:14: key 'tiers[0].options'", "expected a mapping");
}
END_TEST

START_TEST(top_level_that_is_not_a_mapping_is_a_type_error) {
    expect_refused("- a\n- b\n", KVS_ECONFIG,
                   "cfg.yaml:1:1: ", "expected a mapping at the top level, found a sequence");
}
END_TEST

START_TEST(zero_and_oversized_chunk_tokens_are_out_of_range) {
    expect_refused("chunk_tokens: 0\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:15: key 'chunk_tokens'",
                   "must be between 1 and 65536");
    expect_refused("chunk_tokens: 65537\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:1:15: key 'chunk_tokens'", "must be between 1 and 65536");
    expect_refused("chunk_tokens: -4\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:15: key 'chunk_tokens'",
                   "out of range");
    expect_refused("lease_timeout_ms: 0\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:1:19: key 'lease_timeout_ms'", "must be at least 1");
    expect_refused("lease_timeout_ms: 18446744073709551616\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:1:19: key 'lease_timeout_ms'", "out of range");
    kvs_config *cfg = load_ok("chunk_tokens: 65536\n" ONE_TIER);
    ck_assert_uint_eq(cfg->chunk_tokens, 65536);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(version_other_than_1_is_refused) {
    expect_refused("version: 2\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:10: key 'version'",
                   "must be 1");
}
END_TEST

START_TEST(zero_sizes_are_refused) {
    expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: 0GiB\n", KVS_ECONFIG,
                   "cfg.yaml:4:15: key 'tiers[0].capacity'", "greater than 0");
    expect_refused("pool:\n  staging_bytes: 0\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:18: key 'pool.staging_bytes'", "greater than 0");
}
END_TEST

START_TEST(device_section_parses_and_refuses_bad_values) {
    kvs_config *cfg =
        load_ok("device:\n  copy_method: dma\n  hash_threads: 8\n  max_chunks_per_step: 64\n"
                "  host_copies: deferred\n" ONE_TIER);
    ck_assert_int_eq(cfg->copy_method, 2);
    ck_assert_uint_eq(cfg->hash_threads, 8);
    ck_assert_uint_eq(cfg->max_chunks_per_step, 64);
    ck_assert_int_eq(cfg->host_deferred, 1);
    kvs_config_free(cfg);
    expect_refused("device:\n  copy_method: fast\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:16: key 'device.copy_method'", "auto, kernel, dma");
    expect_refused("device:\n  hash_threads: 0\n" ONE_TIER, KVS_ECONFIG,
                   "key 'device.hash_threads'", NULL);
    expect_refused("device:\n  streams: 2\n" ONE_TIER, KVS_ECONFIG,
                   "key 'device.streams': unknown key",
                   "copy_method, hash_threads, max_chunks_per_step, host_copies");
}
END_TEST

START_TEST(ssd_tier_paths_become_path_options_before_the_others) {
    kvs_config *cfg =
        load_ok("tiers:\n  - name: dram\n    type: dram\n    capacity: 1GiB\n"
                "  - name: ssd\n    type: ssd\n    capacity: 64GiB\n"
                "    paths: [/mnt/a, rel/b]\n    options:\n      stripe_bytes: 1MiB\n");
    const kvs_tier_config *t = &cfg->tiers[1];
    ck_assert_str_eq(t->type, "ssd");
    ck_assert_uint_eq(t->n_options, 3);
    ck_assert_str_eq(t->options[0].key, "path");
    ck_assert_str_eq(t->options[0].value, "/mnt/a");
    ck_assert_str_eq(t->options[1].key, "path");
    ck_assert_ptr_nonnull(strstr(t->options[1].value, "rel/b"));
    ck_assert_str_eq(t->options[2].key, "stripe_bytes");
    kvs_config_free(cfg);
    expect_refused("tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n", KVS_ECONFIG,
                   "key 'tiers[0].paths'", "one directory per SSD");
    expect_refused("tiers:\n  - name: s\n    type: ssd\n    paths: [/a]\n", KVS_ECONFIG,
                   "key 'tiers[0].capacity'", NULL);
    expect_refused("tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n    paths: []\n",
                   KVS_ECONFIG, "key 'tiers[0].paths'", "non-empty sequence");
    expect_refused("tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n    paths: [/a, /a]\n",
                   KVS_ECONFIG, "key 'tiers[0].paths[1]'", "listed twice");
    expect_refused(ONE_TIER "    paths: [/a]\n", KVS_ECONFIG, "key 'tiers[0].paths'",
                   "only a tier of type ssd");
    expect_refused("tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n    paths: [/a]\n"
                   "    options:\n      path: /b\n",
                   KVS_ECONFIG, "key 'tiers[0].options.path'", "paths:");
}
END_TEST

START_TEST(remote_tier_nodes_become_node_options_before_the_others) {
    kvs_config *cfg =
        load_ok("tiers:\n  - name: dram\n    type: dram\n    capacity: 1GiB\n"
                "  - name: far\n    type: remote\n"
                "    nodes: [10.0.0.7:13337, \"node-b:13337\"]\n    options:\n      tenant: a\n");
    const kvs_tier_config *t = &cfg->tiers[1];
    ck_assert_str_eq(t->type, "remote");
    ck_assert_uint_eq(t->n_options, 3);
    ck_assert_str_eq(t->options[0].key, "node");
    ck_assert_str_eq(t->options[0].value, "10.0.0.7:13337");
    ck_assert_str_eq(t->options[1].key, "node");
    ck_assert_str_eq(t->options[1].value, "node-b:13337");
    ck_assert_str_eq(t->options[2].key, "tenant");
    kvs_config_free(cfg);
    expect_refused("tiers:\n  - name: r\n    type: remote\n", KVS_ECONFIG, "key 'tiers[0].nodes'",
                   "host:port of each kvstrata-node");
    expect_refused("tiers:\n  - name: r\n    type: remote\n    nodes: []\n", KVS_ECONFIG,
                   "key 'tiers[0].nodes'", "non-empty sequence");
    expect_refused("tiers:\n  - name: r\n    type: remote\n    nodes: [a:1, a:1]\n", KVS_ECONFIG,
                   "key 'tiers[0].nodes[1]'", "listed twice");
    expect_refused(ONE_TIER "    nodes: [a:1]\n", KVS_ECONFIG, "key 'tiers[0].nodes'",
                   "only a tier of type remote");
    expect_refused("tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n    paths: [/a]\n    "
                   "nodes: [a:1]\n",
                   KVS_ECONFIG, "key 'tiers[0].nodes'", "only a tier of type remote");
    expect_refused("tiers:\n  - name: r\n    type: remote\n    nodes: [a:1]\n    paths: [/a]\n",
                   KVS_ECONFIG, "key 'tiers[0].paths'", "only a tier of type ssd");
    expect_refused(
        "tiers:\n  - name: r\n    type: remote\n    nodes: [a:1]\n    options:\n      node: b:2\n",
        KVS_ECONFIG, "key 'tiers[0].options.node'", "nodes:");
}
END_TEST

START_TEST(duplicate_tier_name_is_refused) {
    expect_refused(ONE_TIER "  - name: dram\n    type: dram\n    capacity: 2GiB\n", KVS_ECONFIG,
                   "cfg.yaml:5:11: key 'tiers[1].name'", "duplicate tier name 'dram'");
}
END_TEST

START_TEST(bad_tier_name_is_refused) {
    expect_refused("tiers:\n  - name: my tier\n    type: dram\n    capacity: 1GiB\n", KVS_ECONFIG,
                   "cfg.yaml:2:11: key 'tiers[0].name'", "bad tier name 'my tier'");
    char text[512];
    snprintf(text, sizeof text, "tiers:\n  - name: %064d\n    type: dram\n    capacity: 1GiB\n", 7);
    expect_refused(text, KVS_ECONFIG, "cfg.yaml:2:11: key 'tiers[0].name'", "bad tier name");
    snprintf(text, sizeof text, "tiers:\n  - name: %063d\n    type: dram\n    capacity: 1GiB\n", 7);
    kvs_config *cfg = load_ok(text);
    ck_assert_uint_eq(strlen(cfg->tiers[0].name), 63);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(capacity_over_physical_memory_is_refused) {
    /* 2^54 bytes: no machine this runs on has that much RAM. */
    expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: 16384TiB\n", KVS_ECONFIG,
                   "cfg.yaml:4:15: key 'tiers[0].capacity'", "physical memory");
}
END_TEST

START_TEST(missing_tier_name_points_at_the_tier_entry) {
    expect_refused("tiers:\n  - type: dram\n    capacity: 1GiB\n", KVS_ECONFIG,
                   "cfg.yaml:2:5: key 'tiers[0].name'", "missing required key");
    expect_refused("tiers:\n  - name: x\n    capacity: 1GiB\n", KVS_ECONFIG,
                   "cfg.yaml:2:5: key 'tiers[0].type'", "missing required key");
}
END_TEST

START_TEST(dram_tier_without_capacity_is_refused) {
    expect_refused(ONE_TIER "  - name: more\n    type: dram\n", KVS_ECONFIG,
                   "cfg.yaml:5:5: key 'tiers[1].capacity'", "missing required key");
}
END_TEST

START_TEST(plugin_tier_without_plugin_path_is_refused) {
    expect_refused("tiers:\n  - name: p\n    type: plugin\n", KVS_ECONFIG,
                   "cfg.yaml:2:5: key 'tiers[0].plugin'", "missing required key");
}
END_TEST

START_TEST(plugin_key_on_a_dram_tier_is_refused) {
    expect_refused(ONE_TIER "    plugin: ./x.so\n", KVS_ECONFIG,
                   "cfg.yaml:5:5: key 'tiers[0].plugin'", "only a tier of type plugin");
}
END_TEST

START_TEST(missing_or_empty_tiers_are_refused) {
    expect_refused("version: 1\n", KVS_ECONFIG, "cfg.yaml:1:1: key 'tiers'",
                   "missing required key");
    expect_refused("version: 1\ntiers: []\n", KVS_ECONFIG, "cfg.yaml:2:8: key 'tiers'",
                   "at least one tier");
}
END_TEST

START_TEST(bad_enum_values_list_the_choices) {
    expect_refused("log_level: verbose\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:12: key 'log_level'",
                   "bad value 'verbose' (expected one of error, warn, info, debug)");
    expect_refused("tiers:\n  - name: x\n    type: nvme\n", KVS_ECONFIG,
                   "cfg.yaml:3:11: key 'tiers[0].type'",
                   "expected one of dram, plugin, remote, ssd");
    expect_refused(ONE_TIER "    write: sideways\n", KVS_ECONFIG,
                   "cfg.yaml:5:12: key 'tiers[0].write'", "expected one of back, through");
}
END_TEST

START_TEST(duplicate_key_in_one_mapping_is_refused) {
    expect_refused("chunk_tokens: 256\nchunk_tokens: 512\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:2:1: key 'chunk_tokens'", "duplicate key (first given at line 1");
    expect_refused(ONE_TIER "    capacity: 2GiB\n", KVS_ECONFIG,
                   "cfg.yaml:5:5: key 'tiers[0].capacity'", "duplicate key");
    expect_refused(ONE_TIER "    options: {a: 1, a: 2}\n", KVS_ECONFIG,
                   "cfg.yaml:5:21: key 'tiers[0].options.a'", "duplicate key");
}
END_TEST

START_TEST(empty_document_is_refused) {
    expect_refused("", KVS_ECONFIG, "cfg.yaml:1:1: ", "the document is empty");
    expect_refused("# only a comment\n\n", KVS_ECONFIG, "cfg.yaml:1:1: ", "the document is empty");
    expect_refused("---\n", KVS_ECONFIG, "cfg.yaml:", "the document is empty");
    expect_refused("~\n", KVS_ECONFIG, "cfg.yaml:1:1: ", "the document is empty");
}
END_TEST

START_TEST(second_document_is_refused) {
    expect_refused(ONE_TIER "---\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:5:1: ", "second YAML document");
}
END_TEST

START_TEST(aliases_are_refused_with_their_key) {
    expect_refused("chunk_tokens: &n 256\n" ONE_TIER, KVS_ECONFIG,
                   "cfg.yaml:1:15: key 'chunk_tokens'", "aliases are not supported");
    expect_refused("tiers:\n  - &t\n    name: a\n    type: dram\n    capacity: 1GiB\n  - *t\n",
                   KVS_ECONFIG, "cfg.yaml:2:5: key 'tiers[0]'", "aliases are not supported");
    expect_refused(ONE_TIER "    options:\n      a: 1\n      b: *x\n", KVS_ECONFIG,
                   "cfg.yaml:7:10: key 'tiers[0].options.b'", "aliases are not supported");
}
END_TEST

START_TEST(tags_are_refused_with_their_key) {
    expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: !!str 1GiB\n",
                   KVS_ECONFIG, "cfg.yaml:4:15: key 'tiers[0].capacity'", "tags are not supported");
}
END_TEST

START_TEST(deep_nesting_is_refused_without_recursion) {
    char text[4096];
    size_t n = 0;
    n += (size_t)snprintf(text, sizeof text, "tiers: ");
    for (int i = 0; i < 1000; i++) text[n++] = '[';
    text[n] = '\0';
    expect_refused(text, KVS_ECONFIG, "cfg.yaml:1:", "nesting is deeper than");
}
END_TEST

START_TEST(file_larger_than_the_limit_is_refused) {
    size_t len = KVS_CONFIG_MAX_BYTES + 100;
    char *text = malloc(len + 1);
    ck_assert_ptr_nonnull(text);
    memset(text, '#', len);
    text[len] = '\0';
    expect_refused(text, KVS_ECONFIG, "cfg.yaml:1:1: ", "more than the");
    free(text);
}
END_TEST

/* ---- paths and files ------------------------------------------------------------------------- */

START_TEST(relative_plugin_path_resolves_against_the_file_directory) {
    char dir[512], path[1024], want[2048];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(kvs_test_write_file(dir, "cfg.yaml",
                                         "tiers:\n  - name: p\n    type: plugin\n"
                                         "    plugin: plugins/fake.so\n"
                                         "  - name: q\n    type: plugin\n"
                                         "    plugin: /abs/other.so\n",
                                         path, sizeof path),
                     0);
    char *real_dir = realpath(dir, NULL);
    ck_assert_ptr_nonnull(real_dir);
    snprintf(want, sizeof want, "%s/plugins/fake.so", real_dir);
    free(real_dir);
    kvs_config *cfg = NULL;
    kvs_status st = kvs_config_load(path, &cfg, err, sizeof err);
    ck_assert_msg(st == KVS_OK, "%s", err);
    ck_assert_str_eq(cfg->tiers[0].plugin, want);
    ck_assert_str_eq(cfg->tiers[1].plugin, "/abs/other.so");
    ck_assert_uint_eq(cfg->tiers[0].capacity_bytes, 0);
    kvs_config_free(cfg);
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(relative_psk_file_of_a_remote_tier_resolves_against_the_file_directory) {
    char dir[512], path[1024], want[2048];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(
        kvs_test_write_file(dir, "cfg.yaml",
                            "tiers:\n  - name: r\n    type: remote\n    nodes: [a:1]\n"
                            "    options:\n      tenant: t\n      psk_file: keys/node.key\n"
                            "  - name: s\n    type: remote\n    nodes: [b:1]\n"
                            "    options:\n      psk_file: /etc/node.key\n",
                            path, sizeof path),
        0);
    char *real_dir = realpath(dir, NULL);
    ck_assert_ptr_nonnull(real_dir);
    snprintf(want, sizeof want, "%s/keys/node.key", real_dir);
    free(real_dir);
    kvs_config *cfg = NULL;
    kvs_status st = kvs_config_load(path, &cfg, err, sizeof err);
    ck_assert_msg(st == KVS_OK, "%s", err);
    ck_assert_uint_eq(cfg->tiers[0].n_options, 3);
    ck_assert_str_eq(cfg->tiers[0].options[1].key, "tenant");
    ck_assert_str_eq(cfg->tiers[0].options[2].key, "psk_file");
    ck_assert_str_eq(cfg->tiers[0].options[2].value, want);
    ck_assert_str_eq(cfg->tiers[1].options[1].value, "/etc/node.key");
    kvs_config_free(cfg);
    kvs_test_rmtree(dir);
    expect_refused("tiers:\n  - name: r\n    type: remote\n    nodes: [a:1]\n    options:\n"
                   "      psk_file: a\n      psk_file: b\n",
                   KVS_ECONFIG, "psk_file", "duplicate");
}
END_TEST

START_TEST(parse_string_resolves_plugins_against_the_name_directory_or_keeps_them) {
    static const char text[] = "tiers:\n  - name: p\n    type: plugin\n    plugin: lib/p.so\n";
    kvs_config *cfg = &not_set;
    ck_assert_int_eq(
        kvs_config_parse_string(text, strlen(text), "/etc/kvs/node.yaml", &cfg, err, sizeof err),
        KVS_OK);
    ck_assert_str_eq(cfg->source, "/etc/kvs/node.yaml");
    /* /etc/kvs need not exist: the directory is then used as written. */
    ck_assert_str_eq(cfg->tiers[0].plugin, "/etc/kvs/lib/p.so");
    kvs_config_free(cfg);
    ck_assert_int_eq(kvs_config_parse_string(text, strlen(text), NULL, &cfg, err, sizeof err),
                     KVS_OK);
    ck_assert_str_eq(cfg->source, "<string>");
    ck_assert_str_eq(cfg->tiers[0].plugin, "lib/p.so");
    kvs_config_free(cfg);
    ck_assert_int_eq(kvs_config_parse_string("tiers: 3\n", 9, "inline", &cfg, err, sizeof err),
                     KVS_ECONFIG);
    ck_assert_ptr_null(cfg);
    ck_assert_ptr_nonnull(strstr(err, "inline:1:8: key 'tiers'"));
}
END_TEST

START_TEST(unreadable_file_is_an_io_error_with_the_system_reason) {
    char dir[512], path[1024];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/absent.yaml", dir);
    kvs_config *cfg = &not_set;
    ck_assert_int_eq(kvs_config_load(path, &cfg, err, sizeof err), KVS_EIO);
    ck_assert_ptr_null(cfg);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_ptr_nonnull(strstr(err, strerror(ENOENT)));
    cfg = &not_set;
    ck_assert_int_eq(kvs_config_load(dir, &cfg, err, sizeof err), KVS_EIO);
    ck_assert_ptr_null(cfg);
    ck_assert_ptr_nonnull(strstr(err, strerror(EISDIR)));
    kvs_test_rmtree(dir);
    ck_assert_int_eq(kvs_config_load(NULL, &cfg, err, sizeof err), KVS_EINVAL);
}
END_TEST

START_TEST(every_example_config_parses) {
    char dir_path[PATH_MAX], path[PATH_MAX + 256];
    snprintf(dir_path, sizeof dir_path, "%s/examples/configs", KVS_SOURCE_DIR);
    DIR *dir = opendir(dir_path);
    ck_assert_msg(dir != NULL, "cannot open %s", dir_path);
    int parsed = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        size_t len = strlen(entry->d_name);
        if (len < 6 || strcmp(entry->d_name + len - 5, ".yaml") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir_path, entry->d_name);
        kvs_config *cfg = NULL;
        kvs_status st = kvs_config_load(path, &cfg, err, sizeof err);
        ck_assert_msg(st == KVS_OK, "%s: %s", entry->d_name, err);
        ck_assert_uint_ge(cfg->n_tiers, 1);
        kvs_config_free(cfg);
        parsed++;
    }
    closedir(dir);
    ck_assert_int_ge(parsed, 4);
}
END_TEST

START_TEST(shipped_examples_state_what_the_demos_rely_on) {
    char path[PATH_MAX];
    kvs_config *cfg = NULL;
    snprintf(path, sizeof path, "%s/examples/configs/default.yaml", KVS_SOURCE_DIR);
    ck_assert_msg(kvs_config_load(path, &cfg, err, sizeof err) == KVS_OK, "%s", err);
    ck_assert_uint_eq(cfg->chunk_tokens, 256);
    ck_assert_uint_eq(cfg->n_tiers, 1);
    ck_assert_uint_eq(cfg->tiers[0].capacity_bytes, 1ull << 30);
    kvs_config_free(cfg);
    snprintf(path, sizeof path, "%s/examples/configs/shared-dram.yaml", KVS_SOURCE_DIR);
    ck_assert_msg(kvs_config_load(path, &cfg, err, sizeof err) == KVS_OK, "%s", err);
    ck_assert_uint_eq(cfg->tiers[0].n_options, 1);
    ck_assert_str_eq(cfg->tiers[0].options[0].key, "shm_name");
    ck_assert_str_eq(cfg->tiers[0].options[0].value, "kvs-shared");
    kvs_config_free(cfg);
    snprintf(path, sizeof path, "%s/examples/configs/dram-small.yaml", KVS_SOURCE_DIR);
    ck_assert_msg(kvs_config_load(path, &cfg, err, sizeof err) == KVS_OK, "%s", err);
    ck_assert_uint_eq(cfg->tiers[0].capacity_bytes, 64ull << 20);
    kvs_config_free(cfg);
}
END_TEST

/* ---- robustness ------------------------------------------------------------------------------ */

/* Every prefix and many one-byte changes of a valid file: each is accepted or refused cleanly (ASan
 * and LeakSanitizer watch for the rest), and *out is NULL exactly when the status is not OK. */
START_TEST(truncated_and_mutated_files_never_crash_or_leak) {
    static const char swaps[] = {':',  '-', '[', ']',  '{', '&',  '*', '!',    '\0',
                                 '\n', ' ', '"', '\'', '#', '\t', '|', '\xff', '%'};
    size_t len = strlen(FULL);
    char *text = malloc(len + 1);
    ck_assert_ptr_nonnull(text);
    int accepted = 0;
    for (size_t cut = 0; cut <= len; cut++) {
        kvs_config *cfg = &not_set;
        kvs_status st = kvs_config_parse_string(FULL, cut, "fuzz.yaml", &cfg, err, sizeof err);
        ck_assert(st == KVS_OK || st == KVS_ECONFIG);
        ck_assert((st == KVS_OK) == (cfg != NULL));
        accepted += st == KVS_OK;
        kvs_config_free(cfg);
    }
    ck_assert_int_ge(accepted, 1); /* at least the whole file */
    for (size_t at = 0; at < len; at++) {
        for (size_t s = 0; s < sizeof swaps; s++) {
            memcpy(text, FULL, len + 1);
            text[at] = swaps[s];
            kvs_config *cfg = &not_set;
            kvs_status st = kvs_config_parse_string(text, len, "fuzz.yaml", &cfg, err, sizeof err);
            ck_assert(st == KVS_OK || st == KVS_ECONFIG);
            ck_assert((st == KVS_OK) == (cfg != NULL));
            if (st != KVS_OK) ck_assert_ptr_nonnull(strstr(err, "fuzz.yaml:"));
            kvs_config_free(cfg);
        }
    }
    free(text);
}
END_TEST

START_TEST(small_error_buffers_are_cut_not_overrun) {
    char tiny[16];
    kvs_config *cfg = &not_set;
    static const char text[] = "chunk_size: 1\n";
    ck_assert_int_eq(
        kvs_config_parse_string(text, strlen(text), "cfg.yaml", &cfg, tiny, sizeof tiny),
        KVS_ECONFIG);
    ck_assert_uint_eq(strlen(tiny), sizeof tiny - 1);
    ck_assert_int_eq(kvs_config_parse_string(text, strlen(text), "cfg.yaml", &cfg, NULL, 0),
                     KVS_ECONFIG);
    ck_assert_ptr_null(cfg);
}
END_TEST

/* ---- refusals while the connector opens ------------------------------------------------------ */

/* Opening a connector (scheduler role: the tiers, no staging pool) on `text`, written as open.yaml
 * in dir, must fail with KVS_ECONFIG and a message naming the file at `where` ("L:C: key '...'")
 * and holding `what`. */
static void expect_open_refused(const char *dir, const char *text, const char *where,
                                const char *what) {
    char path[1024], want[1200];
    ck_assert_int_eq(kvs_test_write_file(dir, "open.yaml", text, path, sizeof path), 0);
    const kvs_api *api = kvs_get_api(KVS_ABI_MAJOR);
    kvs_model_desc m = {.struct_size = sizeof m,
                        .model_id = "m",
                        .dtype = KVS_DTYPE_FP16,
                        .n_layers = 2,
                        .n_kv_heads = 2,
                        .head_dim = 16,
                        .block_tokens = 16,
                        .tp_size = 1,
                        .vocab_size = 100};
    kvs_open_params p = {
        .struct_size = sizeof p, .role = KVS_ROLE_SCHEDULER, .config_path = path, .model = &m};
    kvs_handle *h = NULL;
    err[0] = '\0';
    kvs_status st = api->open(&p, &h, err, sizeof err);
    ck_assert_msg(st == KVS_ECONFIG, "status %d, want KVS_ECONFIG (message: %s)", st, err);
    ck_assert_ptr_null(h);
    snprintf(want, sizeof want, "%s:%s", path, where);
    ck_assert_msg(strstr(err, want) != NULL, "message \"%s\" lacks \"%s\"", err, want);
    ck_assert_msg(strstr(err, what) != NULL, "message \"%s\" lacks \"%s\"", err, what);
}

START_TEST(an_unknown_tier_option_is_refused_at_its_line) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    expect_open_refused(dir,
                        "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n    options:\n"
                        "      read_latency_us: 5\n      colour: blue\n",
                        "7:7: key 'tiers[0].options.colour'", "unknown option \"colour\"");
    expect_open_refused(dir,
                        "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n    options:\n"
                        "      read_latency_us: soon\n",
                        "6:7: key 'tiers[0].options.read_latency_us'", "not a whole number");
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(a_remote_tier_without_psk_file_points_at_its_options) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    expect_open_refused(
        dir,
        "tiers:\n  - name: r\n    type: remote\n    nodes: [127.0.0.1:9]\n    options:\n"
        "      tenant: t\n",
        "6:7: key 'tiers[0].options.psk_file'", "needs option psk_file");
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(a_psk_file_missing_or_readable_by_others_is_refused_at_its_line) {
    char dir[512], key[1024];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(
        kvs_test_write_file(dir, "psk", "0123456789abcdef0123456789abcdef", key, sizeof key), 0);
    ck_assert_int_eq(chmod(key, 0644), 0);
    static const char text[] =
        "tiers:\n  - name: r\n    type: remote\n    nodes: [127.0.0.1:9]\n    options:\n"
        "      tenant: t\n      psk_file: %s\n";
    char yaml[1024];
    snprintf(yaml, sizeof yaml, text, "psk");
    expect_open_refused(dir, yaml, "7:7: key 'tiers[0].options.psk_file'", "group or others");
    snprintf(yaml, sizeof yaml, text, "no-such-psk");
    expect_open_refused(dir, yaml, "7:7: key 'tiers[0].options.psk_file'", "cannot be opened");
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(a_plugin_path_that_does_not_exist_is_refused_at_its_line) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    expect_open_refused(dir, "tiers:\n  - name: p\n    type: plugin\n    plugin: plugins/none.so\n",
                        "4:13: key 'tiers[0].plugin'", "does not exist");
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(an_ssd_path_that_is_missing_not_a_directory_or_not_writable_names_its_entry) {
    char dir[512], file[1024], yaml[2048];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(kvs_test_write_file(dir, "plain", "x", file, sizeof file), 0);
    char a[600], ro[600];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(ro, sizeof ro, "%s/ro", dir);
    ck_assert_int_eq(mkdir(a, 0700), 0);
    ck_assert_int_eq(mkdir(ro, 0500), 0);
    static const char text[] =
        "tiers:\n  - name: s\n    type: ssd\n    capacity: 64MiB\n    paths:\n"
        "      - a\n      - %s\n";
    snprintf(yaml, sizeof yaml, text, "missing");
    expect_open_refused(dir, yaml, "7:9: key 'tiers[0].paths[1]'", "ENOENT");
    snprintf(yaml, sizeof yaml, text, "plain");
    expect_open_refused(dir, yaml, "7:9: key 'tiers[0].paths[1]'", "is not a directory");
    if (geteuid() != 0) { /* root may write anywhere */
        snprintf(yaml, sizeof yaml, text, "ro");
        expect_open_refused(dir, yaml, "7:9: key 'tiers[0].paths[1]'", "is not writable");
    }
    chmod(ro, 0700);
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(chunk_tokens_not_a_multiple_of_the_block_size_is_refused_at_its_line) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    expect_open_refused(
        dir,
        "version: 1\nchunk_tokens: 40\ntiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n",
        "2:15: key 'chunk_tokens'", "multiple of the engine block size 16");
    kvs_test_rmtree(dir);
}
END_TEST

/* One test per error class, each checking status, file:line:column and key. */
static TCase *error_tests(void) {
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, yaml_syntax_error_names_file_line_and_problem);
    tcase_add_test(errors, invalid_utf8_is_a_syntax_error_at_its_byte);
    tcase_add_test(errors, unknown_key_names_file_line_and_valid_keys);
    tcase_add_test(errors, the_node_section_parses_for_kvstrata_node);
    tcase_add_test(errors, the_restore_section_reads_its_profile);
    tcase_add_test(errors, restore_errors_name_the_file_and_key);
    tcase_add_test(errors, a_profile_tier_gives_its_bandwidth_as_a_rate);
    tcase_add_test(errors, unknown_key_inside_a_tier_names_its_full_path);
    tcase_add_test(errors, mapping_where_an_integer_belongs_is_a_type_error);
    tcase_add_test(errors, text_where_an_integer_belongs_is_a_type_error);
    tcase_add_test(errors, non_boolean_save_decode_is_a_type_error);
    tcase_add_test(errors, tiers_given_as_a_mapping_is_a_type_error);
    tcase_add_test(errors, tier_entry_that_is_not_a_mapping_is_a_type_error);
    tcase_add_test(errors, nested_option_value_is_a_type_error);
    tcase_add_test(errors, top_level_that_is_not_a_mapping_is_a_type_error);
    tcase_add_test(errors, zero_and_oversized_chunk_tokens_are_out_of_range);
    tcase_add_test(errors, version_other_than_1_is_refused);
    tcase_add_test(errors, zero_sizes_are_refused);
    tcase_add_test(errors, device_section_parses_and_refuses_bad_values);
    tcase_add_test(errors, ssd_tier_paths_become_path_options_before_the_others);
    tcase_add_test(errors, remote_tier_nodes_become_node_options_before_the_others);
    tcase_add_test(errors, duplicate_tier_name_is_refused);
    tcase_add_test(errors, bad_tier_name_is_refused);
    tcase_add_test(errors, capacity_over_physical_memory_is_refused);
    tcase_add_test(errors, missing_tier_name_points_at_the_tier_entry);
    tcase_add_test(errors, dram_tier_without_capacity_is_refused);
    tcase_add_test(errors, plugin_tier_without_plugin_path_is_refused);
    tcase_add_test(errors, plugin_key_on_a_dram_tier_is_refused);
    tcase_add_test(errors, missing_or_empty_tiers_are_refused);
    tcase_add_test(errors, bad_enum_values_list_the_choices);
    tcase_add_test(errors, duplicate_key_in_one_mapping_is_refused);
    tcase_add_test(errors, empty_document_is_refused);
    tcase_add_test(errors, second_document_is_refused);
    tcase_add_test(errors, aliases_are_refused_with_their_key);
    tcase_add_test(errors, tags_are_refused_with_their_key);
    tcase_add_test(errors, deep_nesting_is_refused_without_recursion);
    tcase_add_test(errors, file_larger_than_the_limit_is_refused);
    return errors;
}

static Suite *config_suite(void) {
    Suite *s = suite_create("config");
    TCase *valid = tcase_create("valid");
    tcase_add_test(valid, full_file_parses_to_the_values_it_states);
    tcase_add_test(valid, keys_left_out_take_their_defaults);
    tcase_add_test(valid, defaults_are_one_dram_tier_of_one_gib_and_chunks_of_256);
    tcase_add_test(valid, booleans_accept_true_false_yes_no_on_off);
    tcase_add_test(valid, log_levels_map_to_their_constants);
    suite_add_tcase(s, valid);

    TCase *sizes = tcase_create("sizes");
    tcase_add_test(sizes, bad_unit_names_the_unit_file_line_and_key);
    tcase_add_test(sizes, negative_and_fractional_byte_sizes_are_refused);
    suite_add_tcase(s, sizes);

    suite_add_tcase(s, error_tests());

    TCase *files = tcase_create("files");
    tcase_add_test(files, relative_plugin_path_resolves_against_the_file_directory);
    tcase_add_test(files, relative_psk_file_of_a_remote_tier_resolves_against_the_file_directory);
    tcase_add_test(files, parse_string_resolves_plugins_against_the_name_directory_or_keeps_them);
    tcase_add_test(files, unreadable_file_is_an_io_error_with_the_system_reason);
    tcase_add_test(files, every_example_config_parses);
    tcase_add_test(files, shipped_examples_state_what_the_demos_rely_on);
    suite_add_tcase(s, files);

    TCase *open = tcase_create("open");
    tcase_add_test(open, an_unknown_tier_option_is_refused_at_its_line);
    tcase_add_test(open, a_remote_tier_without_psk_file_points_at_its_options);
    tcase_add_test(open, a_psk_file_missing_or_readable_by_others_is_refused_at_its_line);
    tcase_add_test(open, a_plugin_path_that_does_not_exist_is_refused_at_its_line);
    tcase_add_test(open,
                   an_ssd_path_that_is_missing_not_a_directory_or_not_writable_names_its_entry);
    tcase_add_test(open, chunk_tokens_not_a_multiple_of_the_block_size_is_refused_at_its_line);
    suite_add_tcase(s, open);

    TCase *robust = tcase_create("robustness");
    tcase_set_timeout(robust, 120);
    tcase_add_test(robust, truncated_and_mutated_files_never_crash_or_leak);
    tcase_add_test(robust, small_error_buffers_are_cut_not_overrun);
    suite_add_tcase(s, robust);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(config_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
