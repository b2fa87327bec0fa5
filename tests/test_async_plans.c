/* test_async_plans.c - restore plans of loads that run between steps (`loads.async` with `restore:
 * cacheflow`): the planner plans them with the step's other loads, an engine that follows the plan
 * computes the front while the rest loads and gets the request reported by get_finished (also when
 * the plan leaves nothing to load), and the workers get the asynchronous requests in the planned read
 * order (kvs_restore_read_order). Runs with the host device immediate and deferred. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_plans.h"
#include "connector/ext/plans/restore.h"
#include "support/connector_rig.h"
#include "support/wait.h"

static const kvs_api *api;

static void setup(void) {
    rig_setup();
    api = kvs_get_api(KVS_ABI_MAJOR);
}

static void teardown(void) {
    rig_teardown();
}

/* `restore: cacheflow` over a dram tier with every load asynchronous: per_token_us of recompute per
 * token, mb_s of tier bandwidth (an object is 8 KiB of KV: 32 tokens x 2 layers x 2 x 64 bytes). */
static const char *async_restore_config(double per_token_us, double mb_s) {
    char profile[512];
    snprintf(profile, sizeof profile,
             "compute:\n  fixed_us: 0\n  per_token_us: %g\n  attention_ns_per_token2: 0\n"
             "tiers:\n  - name: dram\n    latency_us: 0\n    bandwidth_mb_s: %g\n",
             per_token_us, mb_s);
    ck_assert_ptr_nonnull(rig_config("profile.yaml", profile));
    static char text[768];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\nloads:\n  async: always\n"
             "restore:\n  scheduler: cacheflow\n  profile: profile.yaml\n"
             "tiers:\n  - name: dram\n    type: dram\n    capacity: 1MiB\n",
             rig_device_section(), CHUNK);
    return rig_config("async-restore.yaml", text);
}

typedef struct finished_probe {
    rig *r;
    const char *id;
    int seen;
} finished_probe;

static int poll_finished(void *arg) {
    finished_probe *p = arg;
    char sending[256], receiving[1024];
    uint64_t ns = 0, nr = 0;
    ck_assert_int_eq(
        api->get_finished(p->r->h, sending, sizeof sending, &ns, receiving, sizeof receiving, &nr),
        KVS_OK);
    const char *at = receiving;
    for (uint64_t i = 0; i < nr; i++, at += strlen(at) + 1) p->seen += strcmp(at, p->id) == 0;
    return p->seen > 0;
}

/* 256 tokens (8 chunks) stored under "a"; "b" with the same prompt looked up (asynchronous) and given
 * other pages; one step with nothing scheduled emits its load; then its plan, the front the plan
 * leaves to the engine computed into b's pages, the step's worker half, and get_finished polled until
 * it reports "b". Returns the plan; *loaded gets the chunks loaded. */
static kvs_restore_plan restore_async(rig *r, int32_t *t, uint32_t *b, uint64_t *loaded) {
    uint32_t a[17];
    rig_make_tokens(t, 257, 11);
    rig_blocks_from(a, 17, 0);
    rig_blocks_from(b, 17, 20);
    ck_assert_int_eq(api->set_plan_caps(r->h, KVS_PLAN_CAP_TOKEN), KVS_OK);
    ck_assert_uint_eq(rig_prefill(r, "a", t, 257, a), 0);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, "b", t, 257, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 256);
    ck_assert_uint_eq(res.load_async, 1);
    ck_assert_int_eq(api->on_alloc(r->h, "b", b, 17, res.n_hit_tokens), KVS_OK);
    kvs_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    ck_assert_int_eq(api->stats(r->h, &s0), KVS_OK);
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r->h, NULL, 0, meta, sizeof meta, &len), KVS_OK);
    kvs_restore_plan plan = {.struct_size = sizeof plan};
    ck_assert_int_eq(api->plan(r->h, "b", &plan), KVS_OK);
    ck_assert_uint_eq(plan.first_token, 0);
    ck_assert_uint_eq(plan.end_token, 256);
    rig_write_kv(r, b, t, plan.first_token, plan.first_token + plan.recompute_tokens);
    ck_assert_int_eq(api->bind_meta(r->h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(r->h), KVS_OK);
    ck_assert_int_eq(api->wait_save(r->h), KVS_OK);
    finished_probe p = {r, "b", 0};
    ck_assert(kvs_test_wait_for(poll_finished, &p, 10000));
    uint32_t errs[17];
    uint64_t n = 9;
    ck_assert_int_eq(api->load_error_blocks(r->h, errs, 17, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_msg(rig_kv_matches(r, b, t, 0, 256), "restored KV differs (mode %u, recompute %llu)",
                  plan.mode, (unsigned long long)plan.recompute_tokens);
    ck_assert_int_eq(api->stats(r->h, &s1), KVS_OK);
    *loaded = s1.chunks_loaded - s0.chunks_loaded;
    ck_assert_uint_eq(s1.async_loads_done - s0.async_loads_done, 1);
    return plan;
}

START_TEST(an_async_load_is_planned_and_loads_what_the_plan_leaves) {
    rig r;
    /* one chunk: 320 us of recompute, 8192 B / 25.6 MB/s = 320 us of load: they meet in the middle */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_restore_config(10, 25.6)), KVS_OK);
    int32_t t[257];
    uint32_t b[17];
    uint64_t loaded = 0;
    kvs_restore_plan p = restore_async(&r, t, b, &loaded);
    ck_assert_uint_eq(p.mode, KVS_PLAN_TOKEN);
    ck_assert_uint_ge(p.recompute_tokens, 3 * CHUNK);
    ck_assert_uint_le(p.recompute_tokens, 5 * CHUNK);
    ck_assert_uint_eq(loaded, 8 - p.recompute_tokens / CHUNK);
    ck_assert(p.predicted_ms > 0.9 && p.predicted_ms < 1.7);
    rig_close(&r);
}
END_TEST

START_TEST(an_async_load_the_plan_recomputes_whole_is_still_reported) {
    rig r;
    /* a slow tier and cheap compute: nothing is worth loading */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_restore_config(0.001, 0.01)), KVS_OK);
    int32_t t[257];
    uint32_t b[17];
    uint64_t loaded = 9;
    kvs_restore_plan p = restore_async(&r, t, b, &loaded);
    ck_assert_uint_eq(p.mode, KVS_PLAN_RECOMPUTE);
    ck_assert_uint_eq(p.recompute_tokens, 256);
    ck_assert_uint_eq(loaded, 0);
    rig_close(&r);
}
END_TEST

START_TEST(async_requests_go_to_the_workers_in_the_planned_read_order) {
    /* six requests: async ones at 0, 2, 3 and 5 with read ranks 3, 0, 2, 1; 1 is a step load, 4 loads
     * nothing */
    kvs_meta_req reqs[6];
    kvs_restore_step info[6];
    memset(reqs, 0, sizeof reqs);
    memset(info, 0, sizeof info);
    const uint8_t async[6] = {1, 0, 1, 1, 0, 1}, loading[6] = {1, 1, 1, 1, 0, 1};
    const uint32_t rank[6] = {3, 9, 0, 2, UINT32_MAX, 1};
    for (int i = 0; i < 6; i++) {
        snprintf(reqs[i].id, sizeof reqs[i].id, "r%d", i);
        reqs[i].load_async = async[i];
        info[i].loading = loading[i];
        info[i].io_rank = rank[i];
    }
    kvs_meta_req *out = NULL;
    ck_assert_int_eq(kvs_restore_read_order(reqs, info, 6, &out), KVS_OK);
    ck_assert_ptr_nonnull(out);
    const char *want[6] = {"r2", "r1", "r5", "r3", "r4", "r0"};
    for (int i = 0; i < 6; i++) ck_assert_str_eq(out[i].id, want[i]);
    free(out);
    /* already in order (ties keep the step's order): nothing to copy */
    info[0].io_rank = 0;
    info[2].io_rank = 0;
    info[3].io_rank = 1;
    info[5].io_rank = 7;
    ck_assert_int_eq(kvs_restore_read_order(reqs, info, 6, &out), KVS_OK);
    ck_assert_ptr_null(out);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("async_plans");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, an_async_load_is_planned_and_loads_what_the_plan_leaves);
    tcase_add_test(tc, an_async_load_the_plan_recomputes_whole_is_still_reported);
    tcase_add_test(tc, async_requests_go_to_the_workers_in_the_planned_read_order);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
