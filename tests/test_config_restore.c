/* test_config_restore.c - the configuration's `restore:` section and the restore profile it names
 * (connector/config_restore.c): the coefficients read, and refusals that name the profile or the
 * config file, line, column and key. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "connector/config.h"
#include "tests/support/config_check.h"
#include "tests/support/test_support.h"

/* cfg.yaml with `restore:` beside a profile.yaml holding profile_text (NULL: no profile file). */
static kvs_status load_with_profile(const char *profile_text, const char *restore,
                                    kvs_config **cfg) {
    char dir[512], path[1024], text[2048];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    if (profile_text)
        ck_assert_int_eq(kvs_test_write_file(dir, "profile.yaml", profile_text, path, sizeof path),
                         0);
    snprintf(text, sizeof text, "restore:\n%s" ONE_TIER, restore);
    ck_assert_int_eq(kvs_test_write_file(dir, "cfg.yaml", text, cfg_path, sizeof cfg_path), 0);
    cfg_err[0] = '\0';
    *cfg = &cfg_not_set;
    kvs_status st = kvs_config_load(cfg_path, cfg, cfg_err, sizeof cfg_err);
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
                  "%s", cfg_err);
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
    cfg = cfg_load_ok(ONE_TIER); /* no section: no planner, srf if one is configured later */
    ck_assert_int_eq(cfg->restore.scheduler, KVS_RESTORE_NONE);
    ck_assert_int_eq(cfg->restore.priority, 1);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(restore_errors_name_the_file_and_key) {
    kvs_config *cfg;
    ck_assert_int_eq(load_with_profile(NULL, "  scheduler: cacheflow\n", &cfg), KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "key 'restore'") && strstr(cfg_err, "needs `profile:`"), "%s",
                  cfg_err);
    ck_assert_int_eq(load_with_profile(NULL, CACHEFLOW, &cfg), KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "key 'restore.profile'") && strstr(cfg_err, "cannot open"), "%s",
                  cfg_err);
    ck_assert_int_eq(load_with_profile(PROFILE_OK, "  scheduler: magic\n", &cfg), KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "none, cacheflow"), "%s", cfg_err);
    ck_assert_int_eq(
        load_with_profile(
            "compute:\n  fixed_us: 1\n  per_token_us: x\n  attention_ns_per_token2: 0\n"
            "tiers:\n  - {name: dram, latency_us: 0, bandwidth_mb_s: 1}\n",
            CACHEFLOW, &cfg),
        KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "profile.yaml:3:17: key 'compute.per_token_us'") &&
                      strstr(cfg_err, "expected a number"),
                  "%s", cfg_err);
    ck_assert_int_eq(
        load_with_profile(
            "compute:\n  fixed_us: 1\n  per_token_us: 1\n  attention_ns_per_token2: 0\n"
            "tiers:\n  - {name: dram, latency_us: 0}\n",
            CACHEFLOW, &cfg),
        KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "tiers[0].bandwidth'") && strstr(cfg_err, "missing required key"),
                  "%s", cfg_err);
    ck_assert_int_eq(
        load_with_profile(
            "compute:\n  fixed_us: 0\n  per_token_us: 0\n  attention_ns_per_token2: 0\n"
            "tiers:\n  - {name: dram, latency_us: 0, bandwidth_mb_s: 1}\n",
            CACHEFLOW, &cfg),
        KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "recomputing would look free"), "%s", cfg_err);
    ck_assert_int_eq(
        load_with_profile(
            "compute:\n  fixed_us: 1\n  per_token_us: 1\n  attention_ns_per_token2: 0\n"
            "tiers:\n  - {name: dram, latency_us: 0, bandwidth_mb_s: 0}\n",
            CACHEFLOW, &cfg),
        KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "out of range"), "%s", cfg_err);
}
END_TEST

/* bandwidth is a rate in the one grammar of sizes and rates; bandwidth_mb_s its older spelling. */
START_TEST(a_profile_tier_gives_its_bandwidth_as_a_rate) {
#define PROFILE_COMPUTE "compute:\n  fixed_us: 1\n  per_token_us: 1\n  attention_ns_per_token2: 0\n"
    kvs_config *cfg;
    ck_assert_msg(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                    "bandwidth: 1.5GB/s}\n",
                                    CACHEFLOW, &cfg) == KVS_OK,
                  "%s", cfg_err);
    ck_assert_double_eq_tol(cfg->restore.tiers[0].bytes_per_s, 1.5e9, 1e-3);
    kvs_config_free(cfg);
    ck_assert_msg(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                    "bandwidth: 4MiB}\n",
                                    CACHEFLOW, &cfg) == KVS_OK,
                  "%s", cfg_err);
    ck_assert_double_eq_tol(cfg->restore.tiers[0].bytes_per_s, 4194304.0, 1e-3);
    kvs_config_free(cfg);
    ck_assert_int_eq(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                       "bandwidth: 4Mb/s}\n",
                                       CACHEFLOW, &cfg),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "key 'tiers[0].bandwidth'") &&
                      strstr(cfg_err, "unknown unit 'Mb'"),
                  "%s", cfg_err);
    ck_assert_int_eq(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                       "bandwidth: 0/s}\n",
                                       CACHEFLOW, &cfg),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "greater than 0"), "%s", cfg_err);
    ck_assert_int_eq(load_with_profile(PROFILE_COMPUTE "tiers:\n  - {name: dram, latency_us: 0, "
                                                       "bandwidth: 1MB/s, bandwidth_mb_s: 1}\n",
                                       CACHEFLOW, &cfg),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(cfg_err, "not both"), "%s", cfg_err);
#undef PROFILE_COMPUTE
}
END_TEST

/* loads.remote_lookups: wait (the default) or async; anything else is refused where it stands. */
START_TEST(remote_lookups_wait_or_async) {
    kvs_config *cfg = cfg_load_ok(ONE_TIER);
    ck_assert_int_eq(cfg->loads.remote_lookups, KVS_REMOTE_LOOKUPS_WAIT);
    kvs_config_free(cfg);
    cfg = cfg_load_ok("loads:\n  remote_lookups: async\n" ONE_TIER);
    ck_assert_int_eq(cfg->loads.remote_lookups, KVS_REMOTE_LOOKUPS_ASYNC);
    kvs_config_free(cfg);
    cfg_expect_refused("loads:\n  remote_lookups: later\n" ONE_TIER, KVS_ECONFIG,
                       "key 'loads.remote_lookups'", "later");
}
END_TEST

/* loads.accept_lossy: false by default; a boolean. */
START_TEST(accept_lossy_is_a_boolean_off_by_default) {
    kvs_config *cfg = cfg_load_ok(ONE_TIER);
    ck_assert_int_eq(cfg->loads.accept_lossy, 0);
    kvs_config_free(cfg);
    cfg = cfg_load_ok("loads:\n  accept_lossy: true\n" ONE_TIER);
    ck_assert_int_eq(cfg->loads.accept_lossy, 1);
    kvs_config_free(cfg);
    cfg_expect_refused("loads:\n  accept_lossy: sometimes\n" ONE_TIER, KVS_ECONFIG,
                       "key 'loads.accept_lossy'", "sometimes");
}
END_TEST

/* placement: defaults, every key, and refusals that name the key. */
START_TEST(the_placement_section_has_defaults_and_refuses_by_key) {
    kvs_config *cfg = cfg_load_ok(ONE_TIER);
    ck_assert_int_eq(cfg->placement.policy, KVS_PLACEMENT_ADAPTCACHE);
    ck_assert(cfg->placement.alpha == 0.1);
    ck_assert(cfg->placement.freq_prior == 0.1);
    ck_assert(cfg->placement.min_quality == 0);
    ck_assert_uint_eq(cfg->placement.reevaluate_ms, 1000);
    ck_assert_uint_eq(cfg->placement.decode_bytes_per_s, 1000000000ull);
    ck_assert_uint_eq(cfg->placement.codecs, KVS_PLACEMENT_CODECS_ALL);
    kvs_config_free(cfg);
    cfg = cfg_load_ok("placement:\n  policy: adaptcache\n  alpha: 0.5\n  min_quality: 0.9\n"
                      "  freq_prior: 2\n  codecs: [kivi2, int8]\n  reevaluate_ms: 250\n"
                      "  decode_rate: 4GB/s\n" ONE_TIER);
    ck_assert(cfg->placement.alpha == 0.5);
    ck_assert(cfg->placement.min_quality == 0.9);
    ck_assert(cfg->placement.freq_prior == 2);
    ck_assert_uint_eq(cfg->placement.codecs, KVS_PLACEMENT_CODEC_KIVI2 | KVS_PLACEMENT_CODEC_INT8);
    ck_assert_uint_eq(cfg->placement.reevaluate_ms, 250);
    ck_assert_uint_eq(cfg->placement.decode_bytes_per_s, 4000000000ull);
    kvs_config_free(cfg);
    cfg = cfg_load_ok("placement:\n  codecs: [drop25, kivi4, drop50]\n" ONE_TIER);
    ck_assert_uint_eq(cfg->placement.codecs, KVS_PLACEMENT_CODEC_DROP25 |
                                                 KVS_PLACEMENT_CODEC_KIVI4 |
                                                 KVS_PLACEMENT_CODEC_DROP50);
    kvs_config_free(cfg);
    cfg_expect_refused("placement:\n  policy: lru\n" ONE_TIER, KVS_ECONFIG,
                       "key 'placement.policy'", "lru");
    cfg_expect_refused("placement:\n  alpha: -1\n" ONE_TIER, KVS_ECONFIG, "key 'placement.alpha'",
                       "-1");
    cfg_expect_refused("placement:\n  min_quality: 1.5\n" ONE_TIER, KVS_ECONFIG,
                       "key 'placement.min_quality'", "1.5");
    cfg_expect_refused("placement:\n  codecs: [int8, int8]\n" ONE_TIER, KVS_ECONFIG,
                       "key 'placement.codecs'", "given twice");
    cfg_expect_refused("placement:\n  codecs: [zstd]\n" ONE_TIER, KVS_ECONFIG,
                       "key 'placement.codecs'", "zstd");
    cfg_expect_refused("placement:\n  codecs: int8\n" ONE_TIER, KVS_ECONFIG,
                       "key 'placement.codecs'", "sequence");
    cfg_expect_refused("placement:\n  reevaluate_ms: 0\n" ONE_TIER, KVS_ECONFIG,
                       "key 'placement.reevaluate_ms'", "0");
    cfg_expect_refused("placement:\n  speed: 1\n" ONE_TIER, KVS_ECONFIG, "speed", "placement");
}
END_TEST

static Suite *config_restore_suite(void) {
    Suite *s = suite_create("config_restore");
    TCase *restore = tcase_create("restore");
    tcase_add_test(restore, the_restore_section_reads_its_profile);
    tcase_add_test(restore, restore_errors_name_the_file_and_key);
    tcase_add_test(restore, a_profile_tier_gives_its_bandwidth_as_a_rate);
    tcase_add_test(restore, remote_lookups_wait_or_async);
    tcase_add_test(restore, accept_lossy_is_a_boolean_off_by_default);
    tcase_add_test(restore, the_placement_section_has_defaults_and_refuses_by_key);
    suite_add_tcase(s, restore);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(config_restore_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
