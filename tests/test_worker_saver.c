/* test_worker_saver.c - asynchronous saves (connector/worker_saver.c) and transfer roles through the
 * ABI table: a save lands after wait_save returns and from the pages as they were then, a finished
 * request is reported in get_finished's sending list once it finished and its saves landed (or
 * failed), close drains or drops the queue, a producer's lookups find nothing, a consumer saves
 * nothing. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/kvstrata.h"
#include "connector/handle.h"
#include "connector/worker_saver.h"
#include "tests/support/connector_rig.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* A DRAM tier of capacity_bytes (shared through shm_name when `shared`), saves asynchronous with a
 * close drain of timeout_ms. */
static const char *async_config(uint64_t capacity_bytes, uint64_t timeout_ms, int shared) {
    char text[1024], shm[128];
    snprintf(shm, sizeof shm, "    options:\n      shm_name: kvs-test-saver-%d\n", (int)getpid());
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\nsaves:\n  async: true\n"
             "  timeout_ms: %llu\ntiers:\n  - name: dram\n    type: dram\n    capacity: %llu\n%s",
             rig_device_section(), CHUNK, (unsigned long long)timeout_ms,
             (unsigned long long)capacity_bytes, shared ? shm : "");
    char name[64];
    snprintf(name, sizeof name, "async-%d.yaml", shared);
    return rig_config(name, text);
}

static kvs_stats stats_of(rig *r) {
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r->h, &s), KVS_OK);
    return s;
}

/* One step of request id over tokens[0..n) in blocks: lookup, alloc, build_meta, the worker's half
 * (the engine computes what was not loaded). Returns the hit tokens. */
static uint64_t step(rig *r, const char *id, const int32_t *tokens, uint64_t n,
                     const uint32_t *blocks) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, tokens, n, 0, &res), KVS_OK);
    uint64_t nb = (n + BT - 1) / BT;
    ck_assert_int_eq(api->on_alloc(r->h, id, blocks, nb, res.n_hit_tokens), KVS_OK);
    kvs_step_request s = {id, tokens, n, blocks, nb, res.n_hit_tokens, n - res.n_hit_tokens};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    rig_worker_step(r, meta, len, blocks, tokens, res.n_hit_tokens, n);
    return res.n_hit_tokens;
}

/* A step that schedules nothing: its metadata still tells the workers what finished. */
static void empty_step(rig *r) {
    uint8_t meta[4096];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r->h, NULL, 0, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r->h, meta, len), KVS_OK);
}

static int finish(rig *r, const char *id) {
    int keep = -1;
    ck_assert_int_eq(api->request_finished(r->h, id, &keep), KVS_OK);
    return keep;
}

/* get_finished's sending list: its count, the first id into first (or ""). */
static uint64_t sending(rig *r, char *first, size_t first_len) {
    char send[1024], recv[1024];
    uint64_t n_send = 99, n_recv = 99;
    ck_assert_int_eq(
        api->get_finished(r->h, send, sizeof send, &n_send, recv, sizeof recv, &n_recv), KVS_OK);
    ck_assert_uint_eq(n_recv, 0);
    snprintf(first, first_len, "%s", n_send ? send : "");
    return n_send;
}

/* Block (no spinning: the saver signals) until no save is in flight. */
static void wait_landed(rig *r) {
    for (int i = 0; i < 100 && stats_of(r).saves_in_flight; i++) kvs_saver_wait_landed(r->h);
    ck_assert_uint_eq(stats_of(r).saves_in_flight, 0);
}

START_TEST(a_save_lands_after_wait_save_returns) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config(64 * 12288, 5000, 0)), KVS_OK);
    kvs_saver_hold(r.h, 1);
    int32_t tokens[128], other[128];
    uint32_t a[8], b[8];
    rig_make_tokens(tokens, 128, 11);
    rig_make_tokens(other, 128, 12);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);
    ck_assert_uint_eq(step(&r, "a", tokens, 128, a), 0);
    /* wait_save returned with every save queued, none stored */
    kvs_stats s = stats_of(&r);
    ck_assert_uint_eq(s.saves_async, 4);
    ck_assert_uint_eq(s.saves_in_flight, 4);
    ck_assert_uint_eq(s.chunks_saved, 0);
    for (uint64_t c = 0; c < 4; c++) ck_assert(!rig_stored(&r, tokens, c));
    /* the engine reuses the pages at once: the saves hold what the pages held at wait_save */
    rig_write_kv(&r, a, other, 0, 128);
    kvs_saver_hold(r.h, 0);
    wait_landed(&r);
    s = stats_of(&r);
    ck_assert_uint_eq(s.chunks_saved, 4);
    ck_assert_uint_eq(s.saves_skipped, 0);
    for (uint64_t c = 0; c < 4; c++) ck_assert(rig_stored(&r, tokens, c));
    ck_assert_uint_eq(step(&r, "b", tokens, 128, b), 127);
    ck_assert(rig_kv_matches(&r, b, tokens, 0, 128));
    ck_assert_uint_eq(stats_of(&r).load_errors, 0);
    rig_close(&r);
}
END_TEST

START_TEST(sending_reports_a_request_once_it_finished_and_its_saves_landed) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config(64 * 12288, 5000, 0)), KVS_OK);
    kvs_saver_hold(r.h, 1);
    int32_t tokens[128], shorter[16];
    uint32_t a[8], c[1];
    char id[256];
    rig_make_tokens(tokens, 128, 21);
    rig_make_tokens(shorter, 16, 22);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(c, 1, 40);
    step(&r, "a", tokens, 128, a);
    ck_assert_uint_eq(sending(&r, id, sizeof id), 0); /* not finished */
    ck_assert_int_eq(finish(&r, "a"), 1);             /* its saves may be in flight: kept */
    ck_assert_uint_eq(sending(&r, id, sizeof id), 0); /* the workers do not know yet */
    empty_step(&r);
    ck_assert_uint_eq(sending(&r, id, sizeof id), 0); /* known finished, saves held */
    kvs_saver_hold(r.h, 0);
    wait_landed(&r);
    /* too small a list reports nothing and says how many */
    char small[1], recv[8];
    uint64_t n_send = 0, n_recv = 0;
    ck_assert_int_eq(
        api->get_finished(r.h, small, sizeof small, &n_send, recv, sizeof recv, &n_recv),
        KVS_EOVERFLOW);
    ck_assert_uint_eq(n_send, 1);
    ck_assert_uint_eq(sending(&r, id, sizeof id), 1);
    ck_assert_str_eq(id, "a");
    ck_assert_uint_eq(sending(&r, id, sizeof id), 0); /* once */
    ck_assert_uint_eq(stats_of(&r).sends_reported, 1);
    /* a request no save was emitted for (shorter than a chunk) is not kept */
    step(&r, "c", shorter, 16, c);
    ck_assert_int_eq(finish(&r, "c"), 0);
    empty_step(&r);
    ck_assert_uint_eq(sending(&r, id, sizeof id), 0);
    /* saves that landed before the request finished: reported at the first step after it */
    step(&r, "d", tokens, 128, a); /* all stored already: a hit, nothing to save */
    int32_t fresh[128];
    rig_make_tokens(fresh, 128, 23);
    step(&r, "e", fresh, 128, a);
    wait_landed(&r);
    ck_assert_int_eq(finish(&r, "e"), 1);
    ck_assert_uint_eq(sending(&r, id, sizeof id), 0);
    empty_step(&r);
    ck_assert_uint_eq(sending(&r, id, sizeof id), 1);
    ck_assert_str_eq(id, "e");
    rig_close(&r);
}
END_TEST

START_TEST(a_failing_tier_write_still_reports_the_request) {
    rig r;
    /* a tier of one object, which a lease pins: every later store fails for want of room */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config(12288, 5000, 0)), KVS_OK);
    int32_t tokens[128], pinned[64];
    uint32_t a[8], p[4];
    char id[256];
    rig_make_tokens(tokens, 128, 31);
    rig_make_tokens(pinned, 64, 32);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(p, 4, 40);
    step(&r, "p", pinned, 32, p);
    wait_landed(&r);
    ck_assert(rig_stored(&r, pinned, 0));
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "q", pinned, 64, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 32);
    step(&r, "a", tokens, 128, a);
    ck_assert_int_eq(finish(&r, "a"), 1);
    empty_step(&r);
    wait_landed(&r);
    ck_assert_uint_eq(sending(&r, id, sizeof id), 1);
    ck_assert_str_eq(id, "a");
    kvs_stats s = stats_of(&r);
    ck_assert_uint_eq(s.chunks_saved, 1);  /* the pinned one */
    ck_assert_uint_eq(s.saves_skipped, 4); /* a later miss, counted */
    ck_assert(!rig_stored(&r, tokens, 0));
    rig_close(&r);
}
END_TEST

START_TEST(close_with_saves_queued_drops_them_after_its_bounded_wait) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config(64 * 12288, 10, 0)), KVS_OK);
    kvs_saver_hold(r.h, 1);
    int32_t tokens[128];
    uint32_t a[8];
    rig_make_tokens(tokens, 128, 41);
    rig_blocks_from(a, 8, 0);
    step(&r, "a", tokens, 128, a);
    ck_assert_int_eq(finish(&r, "a"), 1);
    ck_assert_uint_eq(stats_of(&r).saves_in_flight, 4);
    rig_close(&r); /* slabs and reservations go back; the sanitizer run checks nothing leaks */
}
END_TEST

START_TEST(close_drains_queued_saves_into_the_tier) {
    rig r, other;
    const char *cfg = async_config(4 << 20, 5000, 1);
    ck_assert_int_eq(rig_open(&other, KVS_ROLE_SCHEDULER, cfg), KVS_OK);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8];
    rig_make_tokens(tokens, 128, 51);
    rig_blocks_from(a, 8, 0);
    step(&r, "a", tokens, 128, a);
    rig_close(&r);
    for (uint64_t c = 0; c < 4; c++) ck_assert(rig_stored(&other, tokens, c));
    rig_close(&other);
}
END_TEST

START_TEST(a_producer_lookup_finds_nothing_and_pins_nothing) {
    rig r, producer;
    const char *cfg = rig_shared_config();
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8];
    rig_make_tokens(tokens, 128, 61);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "a", tokens, 128, a), 0);
    rig_transfer_role = KVS_TRANSFER_PRODUCER;
    ck_assert_int_eq(rig_open(&producer, KVS_ROLE_SCHEDULER, cfg), KVS_OK);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(producer.h, "b", tokens, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    ck_assert_uint_eq(res.unknown_yet, 0);
    ck_assert_uint_eq(res.chunk_tokens, CHUNK);
    kvs_stats s = stats_of(&producer);
    ck_assert_uint_eq(s.leases_active, 0);
    ck_assert_uint_eq(s.lookup_miss_tokens, 128);
    /* the handle that stored them still finds them */
    ck_assert_int_eq(api->lookup(r.h, "b", tokens, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->on_alloc(r.h, "b", a, 8, 0), KVS_OK);
    rig_close(&producer);
    rig_close(&r);
}
END_TEST

START_TEST(a_consumer_loads_and_saves_nothing) {
    rig r, consumer;
    const char *cfg = rig_shared_config();
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_OK);
    int32_t tokens[128], fresh[128];
    uint32_t a[8], b[8];
    rig_make_tokens(tokens, 128, 71);
    rig_make_tokens(fresh, 128, 72);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);
    ck_assert_uint_eq(rig_prefill(&r, "a", tokens, 128, a), 0);
    rig_transfer_role = KVS_TRANSFER_CONSUMER;
    ck_assert_int_eq(rig_open(&consumer, KVS_ROLE_BOTH, cfg), KVS_OK);
    ck_assert_uint_eq(rig_prefill(&consumer, "b", tokens, 128, b), 127);
    ck_assert(rig_kv_matches(&consumer, b, tokens, 0, 128));
    ck_assert_uint_eq(rig_prefill(&consumer, "c", fresh, 128, b), 0);
    kvs_stats s = stats_of(&consumer);
    ck_assert_uint_eq(s.chunks_loaded, 4);
    ck_assert_uint_eq(s.chunks_saved, 0);
    ck_assert_uint_eq(s.saves_skipped, 0); /* none was emitted */
    ck_assert(!rig_stored(&consumer, fresh, 0));
    rig_close(&consumer);
    rig_close(&r);
}
END_TEST

START_TEST(open_params_from_before_1_10_read_as_both_and_unknown_roles_are_refused) {
    rig r;
    const char *cfg = rig_shared_config();
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8];
    rig_make_tokens(tokens, 128, 81);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "a", tokens, 128, a), 0);
    kvs_model_desc m = rig_model();
    kvs_open_params p = {.struct_size = KVS_OPEN_PARAMS_SIZE_1_0,
                         .role = KVS_ROLE_SCHEDULER,
                         .config_path = cfg,
                         .model = &m,
                         .transfer_role = KVS_TRANSFER_PRODUCER}; /* past its struct_size */
    kvs_handle *h = NULL;
    char err[256];
    ck_assert_int_eq(api->open(&p, &h, err, sizeof err), KVS_OK);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(h, "b", tokens, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127); /* both: it finds them */
    api->close(h);
    p.struct_size = sizeof p;
    p.transfer_role = 3;
    ck_assert_int_eq(api->open(&p, &h, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_null(h);
    ck_assert_ptr_nonnull(strstr(err, "transfer_role 3"));
    rig_close(&r);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("worker_saver");
    TCase *tc = tcase_create("async_saves");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, a_save_lands_after_wait_save_returns);
    tcase_add_test(tc, sending_reports_a_request_once_it_finished_and_its_saves_landed);
    tcase_add_test(tc, a_failing_tier_write_still_reports_the_request);
    tcase_add_test(tc, close_with_saves_queued_drops_them_after_its_bounded_wait);
    tcase_add_test(tc, close_drains_queued_saves_into_the_tier);
    suite_add_tcase(s, tc);
    TCase *roles = tcase_create("transfer_roles");
    tcase_add_checked_fixture(roles, setup, teardown);
    tcase_add_test(roles, a_producer_lookup_finds_nothing_and_pins_nothing);
    tcase_add_test(roles, a_consumer_loads_and_saves_nothing);
    tcase_add_test(roles, open_params_from_before_1_10_read_as_both_and_unknown_roles_are_refused);
    suite_add_tcase(s, roles);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
