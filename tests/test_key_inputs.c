/* test_key_inputs.c - per-request key inputs (request_key_input, ABI 1.10) through the ABI table: what
 * a request saved with some inputs is found only by requests with the same tokens and inputs, from
 * the chunk holding the first input on; inputs are refused once the keys exist and forgotten when the
 * request finishes. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/meta.h"
#include "tests/support/connector_rig.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* A rig of role both with 128 tokens of seed 7 in t and blocks 0..7 in b. */
static void open_rig(rig *r, int32_t *t, uint32_t *b) {
    ck_assert_int_eq(rig_open(r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    rig_make_tokens(t, 128, 7);
    rig_blocks_from(b, 8, 0);
}

static void add_input(rig *r, const char *id, uint64_t from, const char *text) {
    ck_assert_int_eq(api->request_key_input(r->h, id, from, text, strlen(text)), KVS_OK);
}

/* What a lookup of id over the 128 tokens offers (then the request is finished). */
static uint64_t hit_of(rig *r, const char *id, const int32_t *t) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, t, 128, 0, &res), KVS_OK);
    ck_assert_int_eq(api->request_finished(r->h, id, NULL), KVS_OK);
    return res.n_hit_tokens;
}

START_TEST(the_same_tokens_with_another_salt_find_nothing_the_first_saved) {
    rig r;
    int32_t t[128];
    uint32_t b[8];
    open_rig(&r, t, b);
    add_input(&r, "a", 0, "tenant-a");
    ck_assert_uint_eq(rig_prefill(&r, "a", t, 128, b), 0);
    add_input(&r, "b", 0, "tenant-b");
    ck_assert_uint_eq(hit_of(&r, "b", t), 0);
    ck_assert_uint_eq(hit_of(&r, "plain", t), 0); /* nor does a request without inputs */
    ck_assert(!rig_stored(&r, t, 0));             /* the chunks are not under today's keys */
    rig_close(&r);
}
END_TEST

START_TEST(the_same_tokens_with_the_same_inputs_find_everything_saved) {
    rig r;
    int32_t t[128];
    uint32_t b[8];
    open_rig(&r, t, b);
    add_input(&r, "a", 0, "tenant-a");
    add_input(&r, "a", 0, "lora:sql-adapter");
    ck_assert_uint_eq(rig_prefill(&r, "a", t, 128, b), 0);
    add_input(&r, "b", 0, "tenant-a");
    add_input(&r, "b", 0, "lora:sql-adapter");
    ck_assert_uint_eq(hit_of(&r, "b", t), 127);
    /* the same inputs in another order at one position are other inputs */
    add_input(&r, "c", 0, "lora:sql-adapter");
    add_input(&r, "c", 0, "tenant-a");
    ck_assert_uint_eq(hit_of(&r, "c", t), 0);
    rig_close(&r);
}
END_TEST

START_TEST(an_input_in_chunk_two_leaves_chunks_zero_and_one_shared) {
    rig r;
    int32_t t[128];
    uint32_t b[8];
    open_rig(&r, t, b);
    add_input(&r, "a", 70, "image-hash-1"); /* chunk 2 holds tokens 64..95 */
    ck_assert_uint_eq(rig_prefill(&r, "a", t, 128, b), 0);
    ck_assert(rig_stored(&r, t, 0));
    ck_assert(rig_stored(&r, t, 1));
    ck_assert(!rig_stored(&r, t, 2));
    ck_assert(!rig_stored(&r, t, 3));
    ck_assert_uint_eq(hit_of(&r, "plain", t), 64);
    add_input(&r, "same", 70, "image-hash-1");
    ck_assert_uint_eq(hit_of(&r, "same", t), 127);
    add_input(&r, "moved", 71, "image-hash-1"); /* the same image one position later */
    ck_assert_uint_eq(hit_of(&r, "moved", t), 64);
    rig_close(&r);
}
END_TEST

START_TEST(the_keys_build_meta_emits_carry_the_inputs_as_lookup_computes_them) {
    rig r;
    int32_t t[128];
    uint32_t b[8];
    open_rig(&r, t, b);
    /* never looked up: build_meta computes its keys itself */
    add_input(&r, "a", 40, "image-hash-2");
    kvs_step_request s = {"a", t, 128, b, 8, 0, 128};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    rig_worker_step(&r, meta, len, b, t, 0, 128);
    ck_assert(rig_stored(&r, t, 0));
    ck_assert(!rig_stored(&r, t, 1));
    add_input(&r, "b", 40, "image-hash-2");
    ck_assert_uint_eq(hit_of(&r, "b", t), 127);
    rig_close(&r);
}
END_TEST

START_TEST(an_input_after_the_lookup_is_refused_with_a_sentence) {
    rig r;
    int32_t t[128];
    uint32_t b[8];
    open_rig(&r, t, b);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "a", t, 128, 0, &res), KVS_OK);
    ck_assert_int_eq(api->request_key_input(r.h, "a", 0, "late", 4), KVS_ESTATE);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "already has its keys"));
    /* and after a build_meta of a request never looked up */
    kvs_step_request s = {"b", t, 64, b, 4, 0, 64};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->request_key_input(r.h, "b", 0, "late", 4), KVS_ESTATE);
    rig_close(&r);
}
END_TEST

START_TEST(a_finished_request_forgets_its_inputs) {
    rig r;
    int32_t t[128];
    uint32_t b[8];
    open_rig(&r, t, b);
    add_input(&r, "a", 0, "tenant-a");
    ck_assert_int_eq(api->request_finished(r.h, "a", NULL), KVS_OK);
    ck_assert_uint_eq(rig_prefill(&r, "a", t, 128, b), 0); /* the same id, no inputs now */
    ck_assert(rig_stored(&r, t, 0));
    ck_assert(rig_stored(&r, t, 3));
    rig_close(&r);
}
END_TEST

START_TEST(inputs_past_their_bounds_or_empty_are_refused) {
    rig r;
    int32_t t[128];
    uint32_t b[8];
    open_rig(&r, t, b);
    ck_assert_int_eq(api->request_key_input(r.h, "a", 0, NULL, 4), KVS_EINVAL);
    ck_assert_int_eq(api->request_key_input(r.h, "a", 0, "x", 0), KVS_EINVAL);
    ck_assert_int_eq(api->request_key_input(r.h, NULL, 0, "x", 1), KVS_EINVAL);
    for (uint32_t i = 0; i < KVS_KEY_INPUTS_MAX; i++)
        ck_assert_int_eq(api->request_key_input(r.h, "a", i, "x", 1), KVS_OK);
    ck_assert_int_eq(api->request_key_input(r.h, "a", 0, "x", 1), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "at most 64 inputs"));
    uint8_t *big = calloc(KVS_KEY_INPUT_BYTES_MAX + 1, 1);
    ck_assert_ptr_nonnull(big);
    ck_assert_int_eq(api->request_key_input(r.h, "b", 0, big, KVS_KEY_INPUT_BYTES_MAX + 1),
                     KVS_EINVAL);
    ck_assert_int_eq(api->request_key_input(r.h, "b", 0, big, KVS_KEY_INPUT_BYTES_MAX), KVS_OK);
    ck_assert_int_eq(api->request_key_input(r.h, "b", 0, big, 1), KVS_EINVAL);
    free(big);
    /* a refused first input leaves no request behind */
    ck_assert_int_eq(api->request_key_input(r.h, "c", 0, NULL, 1), KVS_EINVAL);
    ck_assert_int_eq(api->request_finished(r.h, "c", NULL), KVS_ENOTFOUND);
    rig_close(&r);
}
END_TEST

START_TEST(a_worker_handle_refuses_key_inputs) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_WORKER, rig_dram_config(64, 30000)), KVS_OK);
    ck_assert_int_eq(api->request_key_input(r.h, "a", 0, "x", 1), KVS_ESTATE);
    rig_close(&r);
}
END_TEST

/* Under tensor parallelism every rank's chain carries the inputs: rank 1's key of chunk 0 differs
 * from an input-less request's, and two requests with the same inputs agree on every rank. */
START_TEST(every_rank_s_keys_carry_the_inputs) {
    rig r;
    kvs_model_desc m = rig_model();
    m.tp_size = 2;
    ck_assert_int_eq(rig_open_model(&r, KVS_ROLE_SCHEDULER, rig_dram_config(64, 30000), &m),
                     KVS_OK);
    ck_assert_uint_eq(r.h->key_ranks, 2);
    int32_t t[64];
    uint32_t b[4];
    rig_make_tokens(t, 64, 9);
    rig_blocks_from(b, 4, 0);
    const char *ids[3] = {"with-1", "with-2", "plain"};
    kvs_meta *metas[3];
    for (int i = 0; i < 3; i++) {
        if (i < 2) add_input(&r, ids[i], 0, "tenant");
        kvs_step_request s = {ids[i], t, 64, b, 4, 0, 64};
        uint8_t meta[65536];
        uint64_t len = 0;
        char why[256];
        ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
        ck_assert_int_eq(kvs_meta_decode(meta, len, 1, &metas[i], why, sizeof why), KVS_OK);
        ck_assert_uint_eq(metas[i]->reqs[0].n_saves, 2);
    }
    for (int c = 0; c < 2; c++) {
        ck_assert_mem_eq(&metas[0]->reqs[0].saves[c].key, &metas[1]->reqs[0].saves[c].key, 16);
        ck_assert(memcmp(&metas[0]->reqs[0].saves[c].key, &metas[2]->reqs[0].saves[c].key, 16));
    }
    for (int i = 0; i < 3; i++) kvs_meta_free(metas[i]);
    rig_close(&r);
}
END_TEST

static Suite *key_inputs_suite(void) {
    Suite *s = suite_create("key_inputs");
    TCase *tc = tcase_create("key_inputs");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, the_same_tokens_with_another_salt_find_nothing_the_first_saved);
    tcase_add_test(tc, the_same_tokens_with_the_same_inputs_find_everything_saved);
    tcase_add_test(tc, an_input_in_chunk_two_leaves_chunks_zero_and_one_shared);
    tcase_add_test(tc, the_keys_build_meta_emits_carry_the_inputs_as_lookup_computes_them);
    tcase_add_test(tc, an_input_after_the_lookup_is_refused_with_a_sentence);
    tcase_add_test(tc, a_finished_request_forgets_its_inputs);
    tcase_add_test(tc, inputs_past_their_bounds_or_empty_are_refused);
    tcase_add_test(tc, a_worker_handle_refuses_key_inputs);
    tcase_add_test(tc, every_rank_s_keys_carry_the_inputs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(key_inputs_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
