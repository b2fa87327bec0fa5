/* test_restore.c - the restore planner inside the connector (connector/ext/plans/restore.c, docs/cacheflow.md)
 * through the ABI table: prefix plans at lookup, token, layer and stage plans over a step's loads, the
 * `plan` hook, and the caps, stages and profiles it refuses. An engine that follows each plan must end
 * with the KV a full restore gives. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_plans.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "tests/support/connector_rig.h"
#include "tests/support/test_support.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* A dram config with `restore: cacheflow` and a profile: per_token_us of recompute per token, mb_s of
 * tier bandwidth (an object is 8 KiB of KV: 32 tokens x 2 layers x 2 x 64 bytes). */
static char keyed_lines[1200]; /* `integrity: keyed` for the dram tier, or "" */

static const char *restore_config(double per_token_us, double mb_s, const char *tier_name) {
    char profile[512];
    snprintf(profile, sizeof profile,
             "compute:\n  fixed_us: 0\n  per_token_us: %g\n  attention_ns_per_token2: 0\n"
             "tiers:\n  - name: %s\n    latency_us: 0\n    bandwidth_mb_s: %g\n",
             per_token_us, tier_name, mb_s);
    ck_assert_ptr_nonnull(rig_config("profile.yaml", profile));
    static char text[2048];
    snprintf(
        text, sizeof text,
        "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\nrestore:\n  scheduler: cacheflow\n"
        "  profile: profile.yaml\ntiers:\n  - name: dram\n    type: dram\n    capacity: 1MiB\n%s",
        rig_device_section(), CHUNK, keyed_lines);
    return rig_config("restore.yaml", text);
}

static int stage_first[KVS_MAX_STAGES]; /* the first KV layer of each stage, for stage plans */

/* The scheduler half of a planned restore: 256 tokens (8 chunks) stored under request "a", then
 * request "b" with the same prompt looked up, allocated other pages and its step's metadata built. */
typedef struct plan_step {
    int32_t tokens[257];
    uint32_t a[17], b[17];
    kvs_lookup_result res;
    kvs_step_request st;
    uint8_t meta[65536];
    uint64_t len;
} plan_step;

static void store_and_plan(rig *r, plan_step *ps) {
    rig_make_tokens(ps->tokens, 257, 9);
    rig_blocks_from(ps->a, 17, 0);
    rig_blocks_from(ps->b, 17, 20);
    ck_assert_uint_eq(rig_prefill(r, "a", ps->tokens, 257, ps->a), 0);
    ps->res = (kvs_lookup_result){.struct_size = sizeof ps->res};
    ck_assert_int_eq(api->lookup(r->h, "b", ps->tokens, 257, 0, &ps->res), KVS_OK);
    ck_assert_int_eq(api->on_alloc(r->h, "b", ps->b, 17, ps->res.n_hit_tokens), KVS_OK);
    ps->st = (kvs_step_request){
        "b", ps->tokens, 257, ps->b, 17, ps->res.n_hit_tokens, 257 - ps->res.n_hit_tokens};
    ck_assert_int_eq(api->build_meta(r->h, &ps->st, 1, ps->meta, sizeof ps->meta, &ps->len),
                     KVS_OK);
}

/* Store 256 tokens (8 chunks) under request "a", then restore them for "b" into other pages as an
 * engine that follows the plan: it computes the front the plan leaves to it, the connector loads the
 * rest. Returns the plan; *loaded gets the chunks the connector loaded. */
static kvs_restore_plan restore_with_plan(rig *r, uint32_t caps, uint64_t *loaded,
                                          uint64_t *bytes) {
    ck_assert_int_eq(api->set_plan_caps(r->h, caps), KVS_OK);
    static plan_step ps;
    store_and_plan(r, &ps);
    kvs_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    ck_assert_int_eq(api->stats(r->h, &s0), KVS_OK); /* nothing loads before the worker step */
    kvs_restore_plan plan = {.struct_size = sizeof plan};
    kvs_status st = api->plan(r->h, "b", &plan);
    if (ps.res.n_hit_tokens == 0) {
        ck_assert_int_eq(st, KVS_ENOTFOUND);
        plan.mode = KVS_PLAN_RECOMPUTE;
        plan.end_token = 0;
    } else {
        ck_assert_int_eq(st, KVS_OK);
        ck_assert_uint_eq(plan.first_token, 0);
        ck_assert_uint_eq(plan.end_token, ps.res.n_hit_tokens);
        ck_assert_uint_le(plan.recompute_tokens, plan.end_token - plan.first_token);
        uint64_t from = plan.first_token, to = plan.first_token + plan.recompute_tokens;
        if (plan.mode ==
            KVS_PLAN_STAGE) /* each stage its lowest layers (the rig's stages: stage_first) */
            for (uint32_t s = 0; s < plan.n_stages; s++)
                rig_write_kv_layers(r, ps.b, ps.tokens, from, to, stage_first[s],
                                    stage_first[s] + (int)plan.stage_recompute_layers[s]);
        else
            rig_write_kv_layers(r, ps.b, ps.tokens, from, to, 0,
                                plan.mode == KVS_PLAN_LAYER ? (int)plan.recompute_layers
                                                            : rig_layers);
    }
    rig_worker_step(r, ps.meta, ps.len, ps.b, ps.tokens, ps.res.n_hit_tokens, 257);
    ck_assert_msg(rig_kv_matches(r, ps.b, ps.tokens, 0, 257),
                  "restored KV differs (mode %u, recompute %llu)", plan.mode,
                  (unsigned long long)plan.recompute_tokens);
    ck_assert_int_eq(api->stats(r->h, &s1), KVS_OK);
    *loaded = s1.chunks_loaded - s0.chunks_loaded;
    *bytes = s1.bytes_loaded - s0.bytes_loaded;
    /* The plan belongs to the step that loads: the next one has none. */
    ck_assert_int_eq(api->build_meta(r->h, &ps.st, 1, ps.meta, sizeof ps.meta, &ps.len), KVS_OK);
    ck_assert_int_eq(api->plan(r->h, "b", &plan), KVS_ENOTFOUND);
    rig_worker_step(r, ps.meta, ps.len, ps.b, ps.tokens, 257, 257);
    int keep;
    ck_assert_int_eq(api->request_finished(r->h, "b", &keep), KVS_OK);
    return plan;
}

/* Stage plans (ABI 1.4): 4 KV layers in two stages ({0, 1} and {2, 3}) and one registered layer of
 * boundary activations (layer 4, the input of stage 1). */
static void stage_rig(rig *r, const char *cfg) {
    rig_layers = 5;
    ck_assert_int_eq(rig_open(r, KVS_ROLE_BOTH, cfg), KVS_OK);
    kvs_stage_desc d = {.struct_size = sizeof d,
                        .n_stages = 2,
                        .n_kv_layers = 4,
                        .boundary_layers = 1,
                        .first_layer = {0, 2}};
    stage_first[0] = 0;
    stage_first[1] = 2;
    ck_assert_int_eq(api->set_stages(r->h, &d), KVS_OK);
}

START_TEST(without_a_planner_every_plan_loads_everything) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    uint64_t loaded = 0, bytes = 0;
    kvs_restore_plan p = restore_with_plan(&r, KVS_PLAN_CAP_TOKEN, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LOAD);
    ck_assert_uint_eq(p.recompute_tokens, 0);
    ck_assert_uint_eq(p.end_token, 256);
    ck_assert_uint_eq(loaded, 8);
    rig_close(&r);
}
END_TEST

START_TEST(token_plans_split_the_range_between_compute_and_the_tier) {
    rig r;
    /* one chunk: 320 us of recompute, 8192 B / 25.6 MB/s = 320 us of load: they meet in the middle */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 25.6, "dram")), KVS_OK);
    uint64_t loaded = 0, bytes = 0;
    kvs_restore_plan p = restore_with_plan(&r, KVS_PLAN_CAP_TOKEN, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_TOKEN);
    ck_assert_uint_eq(p.recompute_tokens % CHUNK, 0);
    ck_assert_uint_ge(p.recompute_tokens, 3 * CHUNK);
    ck_assert_uint_le(p.recompute_tokens, 5 * CHUNK);
    ck_assert_uint_eq(loaded, 8 - p.recompute_tokens / CHUNK);
    ck_assert(p.predicted_ms > 0.9 && p.predicted_ms < 1.7);
    rig_close(&r);
}
END_TEST

START_TEST(plans_follow_the_cost_model_to_either_end) {
    rig r;
    uint64_t loaded = 0, bytes = 0;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(0.001, 0.01, "dram")), KVS_OK);
    kvs_restore_plan p =
        restore_with_plan(&r, KVS_PLAN_CAP_TOKEN, &loaded, &bytes); /* a slow tier, cheap compute */
    ck_assert_uint_eq(p.mode, KVS_PLAN_RECOMPUTE);
    ck_assert_uint_eq(p.recompute_tokens, 256);
    ck_assert_uint_eq(loaded, 0);
    rig_close(&r);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(1000, 100000, "dram")), KVS_OK);
    p = restore_with_plan(&r, KVS_PLAN_CAP_TOKEN, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LOAD);
    ck_assert_uint_eq(loaded, 8);
    rig_close(&r);
}
END_TEST

/* An engine with no plan caps gets prefix plans: lookup offers only the prefix worth loading (for one
 * request with uniform chunk costs that is all or nothing; batches are planned in test_cacheflow). */
START_TEST(stock_engines_get_prefix_plans_through_lookup) {
    rig r;
    uint64_t loaded = 0, bytes = 0;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(0.001, 0.01, "dram")), KVS_OK);
    restore_with_plan(&r, 0, &loaded, &bytes);
    ck_assert_uint_eq(loaded, 0); /* lookup offered nothing: recomputing is faster */
    rig_close(&r);
    /* loading a chunk (160 us) beats recomputing it (320 us): the whole prefix is offered */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 51.2, "dram")), KVS_OK);
    kvs_restore_plan p = restore_with_plan(&r, 0, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LOAD);
    ck_assert_uint_eq(p.end_token, 256);
    ck_assert_uint_eq(loaded, 8);
    rig_close(&r);
}
END_TEST

/* Layer plans: the engine computes the lower layers of the whole range, the connector reads and
 * copies only the upper layers of each chunk (get_range on the dram tier). */
START_TEST(layer_plans_load_only_the_upper_layers) {
    rig r;
    /* one layer of the 256-token range: 2560 us / 2 of recompute, 32 KiB / 25.6 MB/s = 1280 us of load */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 25.6, "dram")), KVS_OK);
    uint64_t loaded = 0, bytes = 0;
    kvs_restore_plan p = restore_with_plan(&r, KVS_PLAN_CAP_LAYER, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LAYER);
    ck_assert_uint_eq(p.recompute_layers, 1);
    ck_assert_uint_eq(p.recompute_tokens, 256);
    ck_assert_uint_eq(loaded, 8);
    ck_assert_uint_eq(bytes, 256ull * 1 * 2 * TOKEN_BYTES); /* one layer of K and V */
    rig_close(&r);
    /* both caps: each request gets the faster mode; a slow tier still means recompute */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(0.001, 0.01, "dram")), KVS_OK);
    p = restore_with_plan(&r, KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_RECOMPUTE);
    ck_assert_uint_eq(loaded, 0);
    rig_close(&r);
}
END_TEST

/* A layer plan reads single layers (get_range): on a keyed tier each one is checked against its own
 * tag as it lands, so a changed layer is a counted miss even where the header is intact. */
START_TEST(layer_plans_check_each_layer_read_from_a_keyed_tier) {
    char key[1024];
    ck_assert_int_eq(kvs_test_write_file(rig_tmpdir, "t.key", "0123456789abcdef0123456789abcdef",
                                         key, sizeof key),
                     0);
    ck_assert_int_eq(chmod(key, 0600), 0);
    snprintf(keyed_lines, sizeof keyed_lines, "    integrity: keyed\n    integrity_key_file: %s\n",
             key);
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 25.6, "dram")), KVS_OK);
    keyed_lines[0] = '\0';
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_LAYER), KVS_OK);
    static plan_step ps;
    store_and_plan(&r, &ps);
    kvs_restore_plan plan = {.struct_size = sizeof plan};
    ck_assert_int_eq(api->plan(r.h, "b", &plan), KVS_OK);
    ck_assert_uint_eq(plan.mode, KVS_PLAN_LAYER);
    ck_assert_uint_eq(plan.recompute_layers, 1);
    kvs_key keys[8];
    kvs_keys_chain(&r.h->fingerprint, ps.tokens, 8, CHUNK, keys);
    const void *obj = NULL;
    uint64_t len = 0;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[0], &obj, &len), KVS_OK);
    ((uint8_t *)(uintptr_t)obj)[len - 1] ^= 1; /* the last byte of layer 1, the one loaded */
    rig_write_kv_layers(&r, ps.b, ps.tokens, 0, 256, 0, 1);
    rig_worker_step(&r, ps.meta, ps.len, ps.b, ps.tokens, ps.res.n_hit_tokens, 257);
    uint32_t errs[16];
    uint64_t n = 0;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 2); /* chunk 0: blocks b[0], b[1] */
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.integrity_rejects, 1);
    ck_assert_uint_eq(s.chunks_loaded, 7);
    ck_assert(rig_kv_matches(&r, ps.b, ps.tokens, 32, 256));
    rig_close(&r);
}
END_TEST

START_TEST(plan_caps_and_profiles_are_checked) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 25.6, "dram")), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, 0x80), KVS_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "unknown capability"));
    int32_t tokens[64];
    rig_make_tokens(tokens, 64, 4);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "x", tokens, 64, 0, &res), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_TOKEN), KVS_ESTATE);
    kvs_restore_plan p = {.struct_size = sizeof p};
    ck_assert_int_eq(api->plan(r.h, "nobody", &p), KVS_ENOTFOUND);
    p.struct_size = 8;
    ck_assert_int_eq(api->plan(r.h, "x", &p), KVS_EINVAL);
    rig_close(&r);
    /* A profile without the chain's tier refuses to open, naming the tier and the profile. */
    kvs_model_desc m = rig_model();
    kvs_open_params op = {.struct_size = sizeof op,
                          .role = KVS_ROLE_BOTH,
                          .config_path = restore_config(10, 25.6, "ssd"),
                          .model = &m};
    kvs_handle *h = NULL;
    char err[512];
    ck_assert_int_eq(api->open(&op, &h, err, sizeof err), KVS_ECONFIG);
    ck_assert_ptr_null(h);
    ck_assert_msg(strstr(err, "profile.yaml") && strstr(err, "tier 'dram'"), "error: %s", err);
}
END_TEST

START_TEST(stage_plans_restore_each_stage_from_its_boundary) {
    rig r;
    /* A layer of the 256-token range: 640 us / 2 = 320 us of recompute, 32 KiB / 25.6 MB/s = 1280 us of
     * load (the boundary costs the same). Loading all 4 layers: 5120 us; stage 0 recomputing its two
     * layers while 2 load: 2560 us; reading the boundary (1280 us) and then recomputing both stages'
     * layers at once: 1280 + 640 = 1920 us, the optimum, which loads nothing but the boundary. */
    stage_rig(&r, restore_config(5, 25.6, "dram"));
    uint64_t loaded = 0, bytes = 0;
    kvs_restore_plan p = restore_with_plan(&r, KVS_PLAN_CAP_STAGE, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_STAGE);
    ck_assert_uint_eq(p.n_stages, 2);
    ck_assert_uint_eq(p.stage_recompute_layers[0], 2);
    ck_assert_uint_eq(p.stage_recompute_layers[1], 2);
    ck_assert_uint_eq(p.recompute_tokens, 256);
    ck_assert(p.predicted_ms > 1.9 && p.predicted_ms < 1.95);
    ck_assert_uint_eq(loaded, 8);
    ck_assert_uint_eq(bytes, 256ull * 2 * TOKEN_BYTES); /* the boundary layer only */
    rig_close(&r);
    /* Layer plans of a staged engine: the mask spans every registered layer, boundaries loaded. */
    stage_rig(&r, restore_config(10, 25.6, "dram"));
    p = restore_with_plan(&r, KVS_PLAN_CAP_LAYER, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LAYER);
    ck_assert_uint_ge(p.recompute_layers, 1);
    ck_assert_uint_le(p.recompute_layers, 3);
    ck_assert_uint_eq(bytes, 256ull * (5 - p.recompute_layers) * 2 * TOKEN_BYTES);
    rig_close(&r);
    /* A fast tier: stage plans still load everything when that is soonest, boundaries included. */
    stage_rig(&r, restore_config(1000, 100000, "dram"));
    p = restore_with_plan(&r, KVS_PLAN_CAP_STAGE | KVS_PLAN_CAP_TOKEN, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LOAD);
    ck_assert_uint_eq(bytes, 256ull * 5 * 2 * TOKEN_BYTES);
    rig_close(&r);
}
END_TEST

START_TEST(stage_descriptions_and_old_plan_structs_are_checked) {
    rig r;
    rig_layers = 5;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(5, 25.6, "dram")), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_STAGE),
                     KVS_ESTATE); /* stages not described */
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "set_stages"));
    kvs_stage_desc d = {.struct_size = sizeof d,
                        .n_stages = 2,
                        .n_kv_layers = 4,
                        .boundary_layers = 2,
                        .first_layer = {0, 2}};
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_EINVAL); /* 4 + 2 layers, the model has 5 */
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "the model has 5"));
    d.boundary_layers = 1;
    d.first_layer[1] = 0;
    ck_assert_int_eq(api->set_stages(r.h, &d),
                     KVS_EINVAL); /* stages must start at increasing layers */
    d.first_layer[1] = 4;
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_EINVAL); /* stage 1 would own no layer */
    d.first_layer[1] = 3;
    d.struct_size = 8;
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_EINVAL);
    d.struct_size = sizeof d;
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_OK);
    stage_first[0] = 0;
    stage_first[1] = 3;
    /* An engine built against 1.3 passes the smaller plan struct: a stage plan does not fit in it. */
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_STAGE), KVS_OK);
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_ESTATE); /* after set_plan_caps */
    static plan_step ps;
    store_and_plan(&r, &ps);
    kvs_restore_plan p = {.struct_size = KVS_RESTORE_PLAN_SIZE_1_3};
    ck_assert_int_eq(api->plan(r.h, "b", &p), KVS_ENOTSUP);
    p.struct_size = sizeof p;
    ck_assert_int_eq(api->plan(r.h, "b", &p), KVS_OK);
    ck_assert_uint_eq(p.mode, KVS_PLAN_STAGE);
    rig_close(&r);
}
END_TEST

static Suite *restore_suite(void) {
    Suite *s = suite_create("restore");
    TCase *tc = tcase_create("restore");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, without_a_planner_every_plan_loads_everything);
    tcase_add_test(tc, token_plans_split_the_range_between_compute_and_the_tier);
    tcase_add_test(tc, plans_follow_the_cost_model_to_either_end);
    tcase_add_test(tc, stock_engines_get_prefix_plans_through_lookup);
    tcase_add_test(tc, layer_plans_load_only_the_upper_layers);
    tcase_add_test(tc, layer_plans_check_each_layer_read_from_a_keyed_tier);
    tcase_add_test(tc, plan_caps_and_profiles_are_checked);
    tcase_add_test(tc, stage_plans_restore_each_stage_from_its_boundary);
    tcase_add_test(tc, stage_descriptions_and_old_plan_structs_are_checked);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(restore_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
