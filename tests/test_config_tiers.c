/* test_config_tiers.c - the configuration's tier entries (connector/config_tiers.c and each tier's
 * capacity in config.c): names, types, capacities, plugin paths, `paths:`/`nodes:` and options, paths
 * resolved against the file, and refusals that point at a tier's key when the connector opens it. */
#include <check.h>
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

START_TEST(unknown_key_inside_a_tier_names_its_full_path) {
    cfg_expect_refused("tiers:\n  - name: dram\n    type: dram\n    capcity: 1GiB\n", KVS_ECONFIG,
                       "cfg.yaml:4:5: key 'tiers[0].capcity': unknown key",
                       "valid keys: name, type, capacity, write, plugin, options");
    cfg_expect_refused("pool:\n  staging: 1GiB\n" ONE_TIER, KVS_ECONFIG,
                       "cfg.yaml:2:3: key 'pool.staging': unknown key",
                       "valid keys: staging_bytes");
}
END_TEST

START_TEST(required_is_a_boolean_that_defaults_to_false) {
    kvs_config *cfg = cfg_load_ok(ONE_TIER "  - name: nvme\n    type: ssd\n    capacity: 1GiB\n"
                                           "    paths: [/a]\n    required: yes\n");
    ck_assert_int_eq(cfg->tiers[0].required, 0);
    ck_assert_int_eq(cfg->tiers[1].required, 1);
    kvs_config_free(cfg);
    cfg_expect_refused(ONE_TIER "    required: maybe\n", KVS_ECONFIG,
                       "cfg.yaml:5:15: key 'tiers[0].required'", NULL);
    cfg_expect_refused(ONE_TIER "    required: [true]\n", KVS_ECONFIG, "key 'tiers[0].required'",
                       NULL);
}
END_TEST

START_TEST(tier_entry_that_is_not_a_mapping_is_a_type_error) {
    cfg_expect_refused(ONE_TIER "  - dram\n", KVS_ECONFIG, "cfg.yaml:5:5: key 'tiers[1]'",
                       "expected a mapping (one tier), found a scalar");
}
END_TEST

START_TEST(nested_option_value_is_a_type_error) {
    cfg_expect_refused(ONE_TIER "    options:\n      shm_name: [a, b]\n", KVS_ECONFIG,
                       "cfg.yaml:6:17: key 'tiers[0].options.shm_name'",
                       "an option value must be a scalar, found a sequence");
    cfg_expect_refused(ONE_TIER "    options: kvs-shared\n", KVS_ECONFIG,
                       "cfg.yaml:5:14: key 'tiers[0].options'", "expected a mapping");
}
END_TEST

START_TEST(redis_tier_nodes_and_an_option_group_become_options) {
    kvs_config *cfg = cfg_load_ok(
        "tiers:\n  - name: r\n    type: redis\n    nodes: [/run/r.sock, 10.0.0.1:6379]\n"
        "    options:\n      mode: cluster\n      password_file: rel.pass\n"
        "      tls:\n        ca_file: ca.crt\n        server_name: cache.local\n");
    const kvs_tier_config *t = &cfg->tiers[0];
    ck_assert_str_eq(t->type, "redis");
    ck_assert_uint_eq(t->n_options, 6);
    ck_assert_str_eq(t->options[0].key, "node");
    ck_assert_str_eq(t->options[0].value, "/run/r.sock");
    ck_assert_str_eq(t->options[1].value, "10.0.0.1:6379");
    ck_assert_str_eq(t->options[2].key, "mode");
    ck_assert_str_eq(t->options[3].key, "password_file");
    ck_assert_str_ne(t->options[3].value, "rel.pass"); /* resolved against the file */
    ck_assert_ptr_nonnull(strstr(t->options[3].value, "/rel.pass"));
    ck_assert_str_eq(t->options[4].key, "tls.ca_file");
    ck_assert_ptr_nonnull(strstr(t->options[4].value, "/ca.crt"));
    ck_assert_str_eq(t->options[5].key, "tls.server_name");
    ck_assert_str_eq(t->options[5].value, "cache.local");
    kvs_config_free(cfg);
    cfg_expect_refused("tiers:\n  - name: r\n    type: redis\n", KVS_ECONFIG,
                       "key 'tiers[0].nodes'", NULL);
    cfg_expect_refused(ONE_TIER "    nodes: [a:1]\n", KVS_ECONFIG, "key 'tiers[0].nodes'",
                       "only a tier of type remote or redis takes nodes");
    cfg_expect_refused("tiers:\n  - name: r\n    type: redis\n    nodes: [a:1]\n"
                       "    options:\n      tls:\n        ca_file: [x]\n",
                       KVS_ECONFIG, "key 'tiers[0].options.tls.ca_file'",
                       "an option value must be a scalar");
}
END_TEST

START_TEST(ssd_tier_paths_become_path_options_before_the_others) {
    kvs_config *cfg =
        cfg_load_ok("tiers:\n  - name: dram\n    type: dram\n    capacity: 1GiB\n"
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
    cfg_expect_refused("tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n", KVS_ECONFIG,
                       "key 'tiers[0].paths'", "one directory per SSD");
    cfg_expect_refused("tiers:\n  - name: s\n    type: ssd\n    paths: [/a]\n", KVS_ECONFIG,
                       "key 'tiers[0].capacity'", NULL);
    cfg_expect_refused("tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n    paths: []\n",
                       KVS_ECONFIG, "key 'tiers[0].paths'", "non-empty sequence");
    cfg_expect_refused(
        "tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n    paths: [/a, /a]\n",
        KVS_ECONFIG, "key 'tiers[0].paths[1]'", "listed twice");
    cfg_expect_refused(ONE_TIER "    paths: [/a]\n", KVS_ECONFIG, "key 'tiers[0].paths'",
                       "only a tier of type ssd");
    cfg_expect_refused("tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n    paths: [/a]\n"
                       "    options:\n      path: /b\n",
                       KVS_ECONFIG, "key 'tiers[0].options.path'", "paths:");
}
END_TEST

START_TEST(remote_tier_nodes_become_node_options_before_the_others) {
    kvs_config *cfg = cfg_load_ok(
        "tiers:\n  - name: dram\n    type: dram\n    capacity: 1GiB\n"
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
    cfg_expect_refused("tiers:\n  - name: r\n    type: remote\n", KVS_ECONFIG,
                       "key 'tiers[0].nodes'", "host:port of each kvstrata-node");
    cfg_expect_refused("tiers:\n  - name: r\n    type: remote\n    nodes: []\n", KVS_ECONFIG,
                       "key 'tiers[0].nodes'", "non-empty sequence");
    cfg_expect_refused("tiers:\n  - name: r\n    type: remote\n    nodes: [a:1, a:1]\n",
                       KVS_ECONFIG, "key 'tiers[0].nodes[1]'", "listed twice");
    cfg_expect_refused(ONE_TIER "    nodes: [a:1]\n", KVS_ECONFIG, "key 'tiers[0].nodes'",
                       "only a tier of type remote");
    cfg_expect_refused(
        "tiers:\n  - name: s\n    type: ssd\n    capacity: 1GiB\n    paths: [/a]\n    "
        "nodes: [a:1]\n",
        KVS_ECONFIG, "key 'tiers[0].nodes'", "only a tier of type remote");
    cfg_expect_refused("tiers:\n  - name: r\n    type: remote\n    nodes: [a:1]\n    paths: [/a]\n",
                       KVS_ECONFIG, "key 'tiers[0].paths'", "only a tier of type ssd");
    cfg_expect_refused(
        "tiers:\n  - name: r\n    type: remote\n    nodes: [a:1]\n    options:\n      node: b:2\n",
        KVS_ECONFIG, "key 'tiers[0].options.node'", "nodes:");
}
END_TEST

START_TEST(duplicate_tier_name_is_refused) {
    cfg_expect_refused(ONE_TIER "  - name: dram\n    type: dram\n    capacity: 2GiB\n", KVS_ECONFIG,
                       "cfg.yaml:5:11: key 'tiers[1].name'", "duplicate tier name 'dram'");
}
END_TEST

START_TEST(bad_tier_name_is_refused) {
    cfg_expect_refused("tiers:\n  - name: my tier\n    type: dram\n    capacity: 1GiB\n",
                       KVS_ECONFIG, "cfg.yaml:2:11: key 'tiers[0].name'",
                       "bad tier name 'my tier'");
    char text[512];
    snprintf(text, sizeof text, "tiers:\n  - name: %064d\n    type: dram\n    capacity: 1GiB\n", 7);
    cfg_expect_refused(text, KVS_ECONFIG, "cfg.yaml:2:11: key 'tiers[0].name'", "bad tier name");
    snprintf(text, sizeof text, "tiers:\n  - name: %063d\n    type: dram\n    capacity: 1GiB\n", 7);
    kvs_config *cfg = cfg_load_ok(text);
    ck_assert_uint_eq(strlen(cfg->tiers[0].name), 63);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(capacity_over_physical_memory_is_refused) {
    /* 2^54 bytes: no machine this runs on has that much RAM. */
    cfg_expect_refused("tiers:\n  - name: dram\n    type: dram\n    capacity: 16384TiB\n",
                       KVS_ECONFIG, "cfg.yaml:4:15: key 'tiers[0].capacity'", "physical memory");
}
END_TEST

START_TEST(missing_tier_name_points_at_the_tier_entry) {
    cfg_expect_refused("tiers:\n  - type: dram\n    capacity: 1GiB\n", KVS_ECONFIG,
                       "cfg.yaml:2:5: key 'tiers[0].name'", "missing required key");
    cfg_expect_refused("tiers:\n  - name: x\n    capacity: 1GiB\n", KVS_ECONFIG,
                       "cfg.yaml:2:5: key 'tiers[0].type'", "missing required key");
}
END_TEST

START_TEST(dram_tier_without_capacity_is_refused) {
    cfg_expect_refused(ONE_TIER "  - name: more\n    type: dram\n", KVS_ECONFIG,
                       "cfg.yaml:5:5: key 'tiers[1].capacity'", "missing required key");
}
END_TEST

START_TEST(plugin_tier_without_plugin_path_is_refused) {
    cfg_expect_refused("tiers:\n  - name: p\n    type: plugin\n", KVS_ECONFIG,
                       "cfg.yaml:2:5: key 'tiers[0].plugin'", "missing required key");
}
END_TEST

START_TEST(plugin_key_on_a_dram_tier_is_refused) {
    cfg_expect_refused(ONE_TIER "    plugin: ./x.so\n", KVS_ECONFIG,
                       "cfg.yaml:5:5: key 'tiers[0].plugin'", "only a tier of type plugin");
}
END_TEST

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
    kvs_status st = kvs_config_load(path, &cfg, cfg_err, sizeof cfg_err);
    ck_assert_msg(st == KVS_OK, "%s", cfg_err);
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
    kvs_status st = kvs_config_load(path, &cfg, cfg_err, sizeof cfg_err);
    ck_assert_msg(st == KVS_OK, "%s", cfg_err);
    ck_assert_uint_eq(cfg->tiers[0].n_options, 3);
    ck_assert_str_eq(cfg->tiers[0].options[1].key, "tenant");
    ck_assert_str_eq(cfg->tiers[0].options[2].key, "psk_file");
    ck_assert_str_eq(cfg->tiers[0].options[2].value, want);
    ck_assert_str_eq(cfg->tiers[1].options[1].value, "/etc/node.key");
    kvs_config_free(cfg);
    kvs_test_rmtree(dir);
    cfg_expect_refused("tiers:\n  - name: r\n    type: remote\n    nodes: [a:1]\n    options:\n"
                       "      psk_file: a\n      psk_file: b\n",
                       KVS_ECONFIG, "psk_file", "duplicate");
}
END_TEST

START_TEST(a_peer_gpu_tier_s_socket_resolves_against_the_file_directory) {
    char dir[512], path[1024], want[2048];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(kvs_test_write_file(dir, "cfg.yaml",
                                         "tiers:\n  - name: p\n    type: peer_gpu\n"
                                         "    options:\n      socket: run/lend.sock\n"
                                         "      retry_ms: 50\n",
                                         path, sizeof path),
                     0);
    char *real_dir = realpath(dir, NULL);
    ck_assert_ptr_nonnull(real_dir);
    snprintf(want, sizeof want, "%s/run/lend.sock", real_dir);
    free(real_dir);
    kvs_config *cfg = NULL;
    kvs_status st = kvs_config_load(path, &cfg, cfg_err, sizeof cfg_err);
    ck_assert_msg(st == KVS_OK, "%s", cfg_err);
    ck_assert_str_eq(cfg->tiers[0].type, "peer_gpu");
    ck_assert_str_eq(cfg->tiers[0].options[0].key, "socket");
    ck_assert_str_eq(cfg->tiers[0].options[0].value, want);
    kvs_config_free(cfg);
    /* the backend refuses what it does not take, at the option's line */
    cfg_expect_open_refused(dir,
                            "tiers:\n  - name: p\n    type: peer_gpu\n    options:\n"
                            "      socket: x.sock\n      retry_ms: 1\n",
                            "6:7: key 'tiers[0].options.retry_ms'", "retry_ms");
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(an_unknown_tier_option_is_refused_at_its_line) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    cfg_expect_open_refused(
        dir,
        "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n    options:\n"
        "      read_latency_us: 5\n      colour: blue\n",
        "7:7: key 'tiers[0].options.colour'", "unknown option \"colour\"");
    cfg_expect_open_refused(
        dir,
        "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n    options:\n"
        "      read_latency_us: soon\n",
        "6:7: key 'tiers[0].options.read_latency_us'", "not a whole number");
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(a_remote_tier_without_psk_file_points_at_its_options) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    cfg_expect_open_refused(
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
    cfg_expect_open_refused(dir, yaml, "7:7: key 'tiers[0].options.psk_file'", "group or others");
    snprintf(yaml, sizeof yaml, text, "no-such-psk");
    cfg_expect_open_refused(dir, yaml, "7:7: key 'tiers[0].options.psk_file'", "cannot be opened");
    kvs_test_rmtree(dir);
}
END_TEST

START_TEST(a_plugin_path_that_does_not_exist_is_refused_at_its_line) {
    char dir[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    cfg_expect_open_refused(dir,
                            "tiers:\n  - name: p\n    type: plugin\n    plugin: plugins/none.so\n",
                            "4:13: key 'tiers[0].plugin'", "does not exist");
    kvs_test_rmtree(dir);
}
END_TEST

/* A path that is written wrong (missing, not a directory) is a configuration error; one that exists
 * but cannot be written (EACCES, EROFS) is the device's failure: the tier opens without it
 * (test_ssd_recovery, a_read_only_path_at_start_is_isolated_and_the_other_serves). */
START_TEST(an_ssd_path_that_is_missing_or_not_a_directory_names_its_entry) {
    char dir[512], file[1024], yaml[2048];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(kvs_test_write_file(dir, "plain", "x", file, sizeof file), 0);
    char a[600];
    snprintf(a, sizeof a, "%s/a", dir);
    ck_assert_int_eq(mkdir(a, 0700), 0);
    static const char text[] =
        "tiers:\n  - name: s\n    type: ssd\n    capacity: 64MiB\n    paths:\n"
        "      - a\n      - %s\n";
    snprintf(yaml, sizeof yaml, text, "missing");
    cfg_expect_open_refused(dir, yaml, "7:9: key 'tiers[0].paths[1]'", "ENOENT");
    snprintf(yaml, sizeof yaml, text, "plain");
    cfg_expect_open_refused(dir, yaml, "7:9: key 'tiers[0].paths[1]'", "is not a directory");
    kvs_test_rmtree(dir);
}
END_TEST

static Suite *config_tiers_suite(void) {
    Suite *s = suite_create("config_tiers");
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, unknown_key_inside_a_tier_names_its_full_path);
    tcase_add_test(errors, tier_entry_that_is_not_a_mapping_is_a_type_error);
    tcase_add_test(errors, required_is_a_boolean_that_defaults_to_false);
    tcase_add_test(errors, nested_option_value_is_a_type_error);
    tcase_add_test(errors, ssd_tier_paths_become_path_options_before_the_others);
    tcase_add_test(errors, redis_tier_nodes_and_an_option_group_become_options);
    tcase_add_test(errors, remote_tier_nodes_become_node_options_before_the_others);
    tcase_add_test(errors, duplicate_tier_name_is_refused);
    tcase_add_test(errors, bad_tier_name_is_refused);
    tcase_add_test(errors, capacity_over_physical_memory_is_refused);
    tcase_add_test(errors, missing_tier_name_points_at_the_tier_entry);
    tcase_add_test(errors, dram_tier_without_capacity_is_refused);
    tcase_add_test(errors, plugin_tier_without_plugin_path_is_refused);
    tcase_add_test(errors, plugin_key_on_a_dram_tier_is_refused);
    suite_add_tcase(s, errors);
    TCase *files = tcase_create("files");
    tcase_add_test(files, relative_plugin_path_resolves_against_the_file_directory);
    tcase_add_test(files, relative_psk_file_of_a_remote_tier_resolves_against_the_file_directory);
    tcase_add_test(files, a_peer_gpu_tier_s_socket_resolves_against_the_file_directory);
    suite_add_tcase(s, files);
    TCase *open = tcase_create("open");
    tcase_add_test(open, an_unknown_tier_option_is_refused_at_its_line);
    tcase_add_test(open, a_remote_tier_without_psk_file_points_at_its_options);
    tcase_add_test(open, a_psk_file_missing_or_readable_by_others_is_refused_at_its_line);
    tcase_add_test(open, a_plugin_path_that_does_not_exist_is_refused_at_its_line);
    tcase_add_test(open, an_ssd_path_that_is_missing_or_not_a_directory_names_its_entry);
    suite_add_tcase(s, open);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(config_tiers_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
