/* test_config.c - the configuration's top level (connector/config.c): values, defaults, sizes, the
 * top-level keys and sections and their refusals (status, file:line:column and key), the entry points
 * and shipped examples, a connector refusing a value when it opens, and robustness of the whole loader. */
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
#include "tests/support/config_check.h"
#include "tests/support/test_support.h"

#ifndef KVS_SOURCE_DIR
#define KVS_SOURCE_DIR "."
#endif

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
    kvs_config *cfg = cfg_load_ok(FULL);
    ck_assert_str_eq(cfg->source, cfg_path);
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
        cfg_load_ok("node:\n  listen: 10.0.0.7:13337\n  psk_file: keys/node.key\n  max_clients: 9\n"
                    "  timeout_ms: 1234\n  max_object_bytes: 8MiB\n" ONE_TIER);
    ck_assert_str_eq(cfg->node.listen, "10.0.0.7:13337");
    const char *slash = strrchr(cfg_path, '/');
    ck_assert_ptr_nonnull(slash);
    char want[1200];
    snprintf(want, sizeof want, "%.*s/keys/node.key", (int)(slash - cfg_path), cfg_path);
    ck_assert_str_eq(cfg->node.psk_file, want);
    ck_assert_uint_eq(cfg->node.max_clients, 9);
    ck_assert_uint_eq(cfg->node.timeout_ms, 1234);
    ck_assert_uint_eq(cfg->node.max_object_bytes, 8ull << 20);
    kvs_config_free(cfg);
    cfg = cfg_load_ok(ONE_TIER);
    ck_assert_str_eq(cfg->node.listen, "");
    ck_assert_uint_eq(cfg->node.max_clients, 0);
    kvs_config_free(cfg);
    cfg_expect_refused("node:\n  listen: 10.0.0.7\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:2:11: key 'node.listen'", "expected HOST:PORT");
    cfg_expect_refused("node:\n  listen: 10.0.0.7:70000\n" ONE_TIER, KVS_ECONFIG,
                       "key 'node.listen'", "HOST:PORT");
    cfg_expect_refused("node:\n  timeout_ms: 0\n" ONE_TIER, KVS_ECONFIG, "key 'node.timeout_ms'",
                       "");
    cfg_expect_refused("node:\n  port: 1\n" ONE_TIER, KVS_ECONFIG, "key 'node.port': unknown key",
                       "valid keys: listen, psk_file, max_clients, timeout_ms, max_object_bytes");
    /* tenants' shares */
    cfg = cfg_load_ok("node:\n  tenant_capacity: 8MiB\n  tenants:\n    team-a: 1GiB\n"
                      "    b.2: 4KiB\n" ONE_TIER);
    ck_assert_uint_eq(cfg->node.tenant_capacity, 8ull << 20);
    ck_assert_uint_eq(cfg->node.n_tenants, 2);
    ck_assert_str_eq(cfg->node.tenants[0].name, "team-a");
    ck_assert_uint_eq(cfg->node.tenants[0].capacity, 1ull << 30);
    ck_assert_str_eq(cfg->node.tenants[1].name, "b.2");
    ck_assert_uint_eq(cfg->node.tenants[1].capacity, 4096);
    kvs_config_free(cfg);
    cfg_expect_refused("node:\n  tenants:\n    a: 1MiB\n    a: 2MiB\n" ONE_TIER, KVS_ECONFIG,
                       "key 'node.tenants.a'", "duplicate");
    cfg_expect_refused("node:\n  tenants:\n    \"a b\": 1MiB\n" ONE_TIER, KVS_ECONFIG,
                       "node.tenants", "a tenant name is 1 to 64");
    cfg_expect_refused("node:\n  tenants:\n    a: 0\n" ONE_TIER, KVS_ECONFIG, "node.tenants.a",
                       "greater than 0");
    cfg_expect_refused("node:\n  tenants: [a]\n" ONE_TIER, KVS_ECONFIG, "node.tenants",
                       "expected a mapping");
    cfg_expect_refused("node:\n  tenant_capacity: 0\n" ONE_TIER, KVS_ECONFIG,
                       "node.tenant_capacity", "greater than 0");
    /* encrypt: 2 true, 1 false, 0 not given (the node's --encrypt decides) */
    cfg = cfg_load_ok("node:\n  encrypt: true\n" ONE_TIER);
    ck_assert_int_eq(cfg->node.encrypt, 2);
    kvs_config_free(cfg);
    cfg = cfg_load_ok("node:\n  encrypt: off\n" ONE_TIER);
    ck_assert_int_eq(cfg->node.encrypt, 1);
    kvs_config_free(cfg);
    cfg = cfg_load_ok(ONE_TIER);
    ck_assert_int_eq(cfg->node.encrypt, 0);
    kvs_config_free(cfg);
    cfg_expect_refused("node:\n  encrypt: maybe\n" ONE_TIER, KVS_ECONFIG, "node.encrypt", "");
}
END_TEST

START_TEST(keys_left_out_take_their_defaults) {
    kvs_config *cfg = cfg_load_ok(ONE_TIER);
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
        kvs_config *cfg = cfg_load_ok(text);
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
        kvs_config *cfg = cfg_load_ok(text);
        ck_assert_int_eq(cfg->log_level, levels[i]);
        kvs_config_free(cfg);
    }
}
END_TEST

/* The grammar itself is tested in test_units.c; here, how the loader reports a refusal. */
START_TEST(bad_unit_names_the_unit_file_line_and_key) {
    cfg_expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: 4Gb\n", KVS_ECONFIG,
                       "cfg.yaml:4:15: key 'tiers[0].capacity'", "unknown unit 'Gb'");
    cfg_expect_refused("pool:\n  staging_bytes: 12 parsecs\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:2:18: key 'pool.staging_bytes'", "unknown unit 'parsecs'");
}
END_TEST

START_TEST(negative_and_fractional_byte_sizes_are_refused) {
    cfg_expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: -1GiB\n", KVS_ECONFIG,
                       "cfg.yaml:4:15: key 'tiers[0].capacity'", "cannot be negative");
    cfg_expect_refused("pool:\n  staging_bytes: 1.1KiB\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:2:18: key 'pool.staging_bytes'", "not a whole number of bytes");
}
END_TEST

START_TEST(unknown_key_names_file_line_and_valid_keys) {
    cfg_expect_refused(
        "version: 1\nchunk_size: 256\n" ONE_TIER, KVS_ECONFIG,
        "cfg.yaml:2:1: key 'chunk_size': unknown key",
        "valid keys: version, chunk_tokens, lease_timeout_ms, save_decode, log_level, "
        "pool, tiers");
}
END_TEST

START_TEST(non_boolean_save_decode_is_a_type_error) {
    cfg_expect_refused("save_decode: maybe\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:14: key 'save_decode'", "expected a boolean");
    cfg_expect_refused("save_decode: 1\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:14: key 'save_decode'",
                       "found '1'");
}
END_TEST

START_TEST(top_level_that_is_not_a_mapping_is_a_type_error) {
    cfg_expect_refused("- a\n- b\n", KVS_ECONFIG,
                       "cfg.yaml:1:1: ", "expected a mapping at the top level, found a sequence");
}
END_TEST

START_TEST(zero_and_oversized_chunk_tokens_are_out_of_range) {
    cfg_expect_refused("chunk_tokens: 0\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:15: key 'chunk_tokens'", "must be between 1 and 65536");
    cfg_expect_refused("chunk_tokens: 65537\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:15: key 'chunk_tokens'", "must be between 1 and 65536");
    cfg_expect_refused("chunk_tokens: -4\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:15: key 'chunk_tokens'", "out of range");
    cfg_expect_refused("lease_timeout_ms: 0\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:19: key 'lease_timeout_ms'", "must be at least 1");
    cfg_expect_refused("lease_timeout_ms: 18446744073709551616\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:1:19: key 'lease_timeout_ms'", "out of range");
    kvs_config *cfg = cfg_load_ok("chunk_tokens: 65536\n" ONE_TIER);
    ck_assert_uint_eq(cfg->chunk_tokens, 65536);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(version_other_than_1_is_refused) {
    cfg_expect_refused("version: 2\n" ONE_TIER, KVS_ECONFIG, "cfg.yaml:1:10: key 'version'",
                       "must be 1");
}
END_TEST

START_TEST(zero_sizes_are_refused) {
    cfg_expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: 0GiB\n", KVS_ECONFIG,
                       "cfg.yaml:4:15: key 'tiers[0].capacity'", "greater than 0");
    cfg_expect_refused("pool:\n  staging_bytes: 0\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:2:18: key 'pool.staging_bytes'", "greater than 0");
}
END_TEST

START_TEST(device_section_parses_and_refuses_bad_values) {
    kvs_config *cfg =
        cfg_load_ok("device:\n  copy_method: dma\n  hash_threads: 8\n  max_chunks_per_step: 64\n"
                    "  host_copies: deferred\n  host_threads: 3\n" ONE_TIER);
    ck_assert_int_eq(cfg->copy_method, 2);
    ck_assert_uint_eq(cfg->host_threads, 3);
    ck_assert_uint_eq(cfg->hash_threads, 8);
    ck_assert_uint_eq(cfg->max_chunks_per_step, 64);
    ck_assert_int_eq(cfg->host_deferred, 1);
    kvs_config_free(cfg);
    cfg_expect_refused("device:\n  copy_method: fast\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:2:16: key 'device.copy_method'", "auto, kernel, dma");
    cfg_expect_refused("device:\n  hash_threads: 0\n" ONE_TIER, KVS_ECONFIG,
                       "key 'device.hash_threads'", NULL);
    cfg_expect_refused("device:\n  host_threads: 65\n" ONE_TIER, KVS_ECONFIG,
                       "key 'device.host_threads'", NULL);
    cfg = cfg_load_ok(ONE_TIER);
    ck_assert_uint_eq(cfg->host_threads, 1);
    kvs_config_free(cfg);
    cfg_expect_refused("device:\n  streams: 2\n" ONE_TIER, KVS_ECONFIG,
                       "key 'device.streams': unknown key",
                       "copy_method, hash_threads, max_chunks_per_step, host_copies, host_threads");
}
END_TEST

START_TEST(tiers_given_as_a_mapping_is_a_type_error) {
    cfg_expect_refused("tiers:\n  dram: {type: dram}\n", KVS_ECONFIG, "cfg.yaml:2:3: key 'tiers'",
                       "expected a sequence of tiers, found a mapping");
}
END_TEST

START_TEST(missing_or_empty_tiers_are_refused) {
    cfg_expect_refused("version: 1\n", KVS_ECONFIG, "cfg.yaml:1:1: key 'tiers'",
                       "missing required key");
    cfg_expect_refused("version: 1\ntiers: []\n", KVS_ECONFIG, "cfg.yaml:2:8: key 'tiers'",
                       "at least one tier");
}
END_TEST

START_TEST(empty_document_is_refused) {
    cfg_expect_refused("", KVS_ECONFIG, "cfg.yaml:1:1: ", "the document is empty");
    cfg_expect_refused("# only a comment\n\n", KVS_ECONFIG,
                       "cfg.yaml:1:1: ", "the document is empty");
    cfg_expect_refused("---\n", KVS_ECONFIG, "cfg.yaml:", "the document is empty");
    cfg_expect_refused("~\n", KVS_ECONFIG, "cfg.yaml:1:1: ", "the document is empty");
}
END_TEST

START_TEST(parse_string_resolves_plugins_against_the_name_directory_or_keeps_them) {
    static const char text[] = "tiers:\n  - name: p\n    type: plugin\n    plugin: lib/p.so\n";
    kvs_config *cfg = &cfg_not_set;
    ck_assert_int_eq(kvs_config_parse_string(text, strlen(text), "/etc/kvs/node.yaml", &cfg,
                                             cfg_err, sizeof cfg_err),
                     KVS_OK);
    ck_assert_str_eq(cfg->source, "/etc/kvs/node.yaml");
    /* /etc/kvs need not exist: the directory is then used as written. */
    ck_assert_str_eq(cfg->tiers[0].plugin, "/etc/kvs/lib/p.so");
    kvs_config_free(cfg);
    ck_assert_int_eq(
        kvs_config_parse_string(text, strlen(text), NULL, &cfg, cfg_err, sizeof cfg_err), KVS_OK);
    ck_assert_str_eq(cfg->source, "<string>");
    ck_assert_str_eq(cfg->tiers[0].plugin, "lib/p.so");
    kvs_config_free(cfg);
    ck_assert_int_eq(
        kvs_config_parse_string("tiers: 3\n", 9, "inline", &cfg, cfg_err, sizeof cfg_err),
        KVS_ECONFIG);
    ck_assert_ptr_null(cfg);
    ck_assert_ptr_nonnull(strstr(cfg_err, "inline:1:8: key 'tiers'"));
}
END_TEST

START_TEST(unreadable_file_is_an_io_error_with_the_system_reason) {
    char dir[512], path[1024];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/absent.yaml", dir);
    kvs_config *cfg = &cfg_not_set;
    ck_assert_int_eq(kvs_config_load(path, &cfg, cfg_err, sizeof cfg_err), KVS_EIO);
    ck_assert_ptr_null(cfg);
    ck_assert_ptr_nonnull(strstr(cfg_err, path));
    ck_assert_ptr_nonnull(strstr(cfg_err, strerror(ENOENT)));
    cfg = &cfg_not_set;
    ck_assert_int_eq(kvs_config_load(dir, &cfg, cfg_err, sizeof cfg_err), KVS_EIO);
    ck_assert_ptr_null(cfg);
    ck_assert_ptr_nonnull(strstr(cfg_err, strerror(EISDIR)));
    kvs_test_rmtree(dir);
    ck_assert_int_eq(kvs_config_load(NULL, &cfg, cfg_err, sizeof cfg_err), KVS_EINVAL);
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
        kvs_status st = kvs_config_load(path, &cfg, cfg_err, sizeof cfg_err);
        ck_assert_msg(st == KVS_OK, "%s: %s", entry->d_name, cfg_err);
        ck_assert_uint_ge(cfg->n_tiers, 1);
        kvs_config_free(cfg);
        parsed++;
    }
    ck_assert_int_eq(closedir(dir), 0);
    ck_assert_int_ge(parsed, 4);
}
END_TEST

START_TEST(shipped_examples_state_what_the_demos_rely_on) {
    char path[PATH_MAX];
    kvs_config *cfg = NULL;
    snprintf(path, sizeof path, "%s/examples/configs/default.yaml", KVS_SOURCE_DIR);
    ck_assert_msg(kvs_config_load(path, &cfg, cfg_err, sizeof cfg_err) == KVS_OK, "%s", cfg_err);
    ck_assert_uint_eq(cfg->chunk_tokens, 256);
    ck_assert_uint_eq(cfg->n_tiers, 1);
    ck_assert_uint_eq(cfg->tiers[0].capacity_bytes, 1ull << 30);
    kvs_config_free(cfg);
    snprintf(path, sizeof path, "%s/examples/configs/shared-dram.yaml", KVS_SOURCE_DIR);
    ck_assert_msg(kvs_config_load(path, &cfg, cfg_err, sizeof cfg_err) == KVS_OK, "%s", cfg_err);
    ck_assert_uint_eq(cfg->tiers[0].n_options, 1);
    ck_assert_str_eq(cfg->tiers[0].options[0].key, "shm_name");
    ck_assert_str_eq(cfg->tiers[0].options[0].value, "kvs-shared");
    kvs_config_free(cfg);
    snprintf(path, sizeof path, "%s/examples/configs/dram-small.yaml", KVS_SOURCE_DIR);
    ck_assert_msg(kvs_config_load(path, &cfg, cfg_err, sizeof cfg_err) == KVS_OK, "%s", cfg_err);
    ck_assert_uint_eq(cfg->tiers[0].capacity_bytes, 64ull << 20);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(chunk_tokens_not_a_multiple_of_the_block_size_is_refused_at_its_line) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    cfg_expect_open_refused(
        dir,
        "version: 1\nchunk_tokens: 40\ntiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n",
        "2:15: key 'chunk_tokens'", "multiple of the engine block size 16");
    kvs_test_rmtree(dir);
}
END_TEST

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
        kvs_config *cfg = &cfg_not_set;
        kvs_status st =
            kvs_config_parse_string(FULL, cut, "fuzz.yaml", &cfg, cfg_err, sizeof cfg_err);
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
            kvs_config *cfg = &cfg_not_set;
            kvs_status st =
                kvs_config_parse_string(text, len, "fuzz.yaml", &cfg, cfg_err, sizeof cfg_err);
            ck_assert(st == KVS_OK || st == KVS_ECONFIG);
            ck_assert((st == KVS_OK) == (cfg != NULL));
            if (st != KVS_OK) ck_assert_ptr_nonnull(strstr(cfg_err, "fuzz.yaml:"));
            kvs_config_free(cfg);
        }
    }
    free(text);
}
END_TEST

START_TEST(small_error_buffers_are_cut_not_overrun) {
    char tiny[16];
    kvs_config *cfg = &cfg_not_set;
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

static Suite *config_suite(void) {
    Suite *s = suite_create("config");
    TCase *valid = tcase_create("valid");
    tcase_add_test(valid, full_file_parses_to_the_values_it_states);
    tcase_add_test(valid, the_node_section_parses_for_kvstrata_node);
    tcase_add_test(valid, keys_left_out_take_their_defaults);
    tcase_add_test(valid, defaults_are_one_dram_tier_of_one_gib_and_chunks_of_256);
    tcase_add_test(valid, booleans_accept_true_false_yes_no_on_off);
    tcase_add_test(valid, log_levels_map_to_their_constants);
    suite_add_tcase(s, valid);
    TCase *sizes = tcase_create("sizes");
    tcase_add_test(sizes, bad_unit_names_the_unit_file_line_and_key);
    tcase_add_test(sizes, negative_and_fractional_byte_sizes_are_refused);
    suite_add_tcase(s, sizes);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, unknown_key_names_file_line_and_valid_keys);
    tcase_add_test(errors, non_boolean_save_decode_is_a_type_error);
    tcase_add_test(errors, top_level_that_is_not_a_mapping_is_a_type_error);
    tcase_add_test(errors, zero_and_oversized_chunk_tokens_are_out_of_range);
    tcase_add_test(errors, version_other_than_1_is_refused);
    tcase_add_test(errors, zero_sizes_are_refused);
    tcase_add_test(errors, device_section_parses_and_refuses_bad_values);
    tcase_add_test(errors, tiers_given_as_a_mapping_is_a_type_error);
    tcase_add_test(errors, missing_or_empty_tiers_are_refused);
    tcase_add_test(errors, empty_document_is_refused);
    suite_add_tcase(s, errors);
    TCase *files = tcase_create("files");
    tcase_add_test(files, parse_string_resolves_plugins_against_the_name_directory_or_keeps_them);
    tcase_add_test(files, unreadable_file_is_an_io_error_with_the_system_reason);
    tcase_add_test(files, every_example_config_parses);
    tcase_add_test(files, shipped_examples_state_what_the_demos_rely_on);
    suite_add_tcase(s, files);
    TCase *open = tcase_create("open");
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
