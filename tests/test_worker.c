/* test_worker.c - the worker-role hooks (connector/worker*.c) through the ABI table: register_kv,
 * loads into other pages byte for byte, saves and what they skip, checksums that turn a corrupt chunk
 * into error blocks, and the pages and strides they refuse. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "tests/support/connector_rig.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

START_TEST(restore_into_other_pages_is_byte_identical) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8], b[8];
    rig_make_tokens(tokens, 128, 1);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);
    ck_assert_uint_eq(rig_prefill(&r, "a", tokens, 128, a), 0);
    /* Whole prompt stored: the connector offers all but the last token. */
    ck_assert_uint_eq(rig_prefill(&r, "b", tokens, 128, b), 127);
    ck_assert(rig_kv_matches(&r, b, tokens, 0, 128));
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.chunks_saved, 4);
    ck_assert_uint_eq(s.chunks_loaded, 4);
    ck_assert_uint_eq(s.bytes_loaded, 127ull * LAYERS * 2 * TOKEN_BYTES);
    ck_assert_uint_eq(s.load_errors, 0);
    rig_close(&r);
}
END_TEST

START_TEST(partial_local_hit_loads_only_the_rest) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8], b[8];
    rig_make_tokens(tokens, 128, 3);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 30);
    ck_assert_uint_eq(rig_prefill(&r, "a", tokens, 128, a), 0);
    /* The engine holds the first 48 tokens itself (blocks b[0..2]); the connector fills 48..127. */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "b", tokens, 128, 48, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 79);
    ck_assert_int_eq(api->on_alloc(r.h, "b", b, 8, 79), KVS_OK);
    kvs_step_request s = {"b", tokens, 128, b, 8, 127, 1};
    uint8_t meta[65536];
    uint64_t len;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    rig_worker_step(&r, meta, len, b, tokens, 127, 128);
    ck_assert(rig_kv_matches(&r, b, tokens, 48, 128));
    /* Tokens 0..47 were not touched by the load. */
    uint8_t zero[TOKEN_BYTES] = {0};
    ck_assert_mem_eq(rig_kv_at(&r, 0, 0, b, 0), zero, TOKEN_BYTES);
    rig_close(&r);
}
END_TEST

/* A tier that cannot be written in place (a backend ABI 1.0 plugin) saves through staging slabs. */
START_TEST(saves_without_staging_memory_are_skipped_and_counted) {
    char text[1024];
    snprintf(
        text, sizeof text,
        "chunk_tokens: 32\npool:\n  staging_bytes: 16KiB\ntiers:\n  - name: mem\n    type: plugin\n"
        "    plugin: %s/plugin_memory.so\n    options:\n      slots: \"16\"\n",
        KVS_TEST_LIB_DIR);
    const char *cfg = rig_config("tiny.yaml", text);
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 41);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.chunks_saved, 1);
    ck_assert_uint_eq(s.saves_skipped, 3);
    rig_close(&r);
}
END_TEST

START_TEST(a_corrupt_object_becomes_error_blocks_and_is_dropped) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 51);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    const void *obj;
    uint64_t len;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[1], &obj, &len), KVS_OK);
    ((uint8_t *)obj)[len - 100] ^= 0x40; /* flip a bit in the last layer of chunk 1 */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 127), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, 127, 1};
    uint8_t meta[65536];
    uint64_t mlen;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(&r, meta, mlen, b, t, 127, 128);
    uint32_t errs[16];
    uint64_t n = 0;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 2); /* chunk 1 = tokens 32..63 = blocks b[2], b[3] */
    ck_assert(errs[0] + errs[1] == b[2] + b[3]);
    ck_assert(!rig_stored(&r, t, 1));
    ck_assert(rig_stored(&r, t, 2));
    ck_assert(rig_kv_matches(&r, b, t, 0, 32));
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.load_errors, 1);
    rig_close(&r);
}
END_TEST

/* Chunks computed in the step of a failed load attended to garbage, so they are not stored; when the
 * engine recomputes the request, saving resumes from where it rolled back. */
START_TEST(chunks_computed_after_a_failed_load_are_not_stored) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8], c[8];
    rig_make_tokens(t, 128, 57);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);
    rig_blocks_from(c, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 64, a), 0); /* stores chunks 0 and 1 */
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    const void *obj;
    uint64_t len;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[0], &obj, &len), KVS_OK);
    ((uint8_t *)obj)[len - 10] ^= 0x01; /* corrupt chunk 0 */

    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 64);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 64), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, 64, 64};
    uint8_t meta[65536];
    uint64_t mlen;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(&r, meta, mlen, b, t, 64, 128);
    uint64_t n = 0;
    uint32_t errs[16];
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);          /* chunk 0 = blocks b[0], b[1] */
    ck_assert(!rig_stored(&r, t, 0)); /* corrupt: dropped */
    ck_assert(rig_stored(&r, t, 1));  /* loaded fine, untouched */
    ck_assert(!rig_stored(&r, t, 2)); /* computed on top of the failed chunk */
    ck_assert(!rig_stored(&r, t, 3));

    /* The engine recomputes the whole request in the next step. */
    kvs_step_request again = {"two", t, 128, b, 8, 0, 128};
    ck_assert_int_eq(api->build_meta(r.h, &again, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(&r, meta, mlen, b, t, 0, 128);
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    for (uint64_t k = 0; k < 4; k++) ck_assert(rig_stored(&r, t, k));
    int keep = 1;
    ck_assert_int_eq(api->request_finished(r.h, "two", &keep), KVS_OK);

    ck_assert_uint_eq(rig_prefill(&r, "three", t, 128, c), 127);
    ck_assert(rig_kv_matches(&r, c, t, 0, 128));
    rig_close(&r);
}
END_TEST

/* The error list's allocator, for tests: no memory at all. */
static void *no_memory(void *ptr, size_t bytes) {
    (void)ptr;
    (void)bytes;
    return NULL;
}

/* Request "two" over tokens t in pages b restores what "one" stored in pages a, with the first
 * n_corrupt chunks corrupted: its step's metadata in meta. */
static uint64_t corrupt_restore_meta(rig *r, int32_t *t, uint32_t *b, uint64_t n_corrupt,
                                     uint8_t *meta, uint64_t cap) {
    uint32_t a[8];
    rig_make_tokens(t, 128, 61);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(r, "one", t, 128, a), 0);
    kvs_key keys[4];
    kvs_keys_chain(&r->h->fingerprint, t, 4, CHUNK, keys);
    const kvs_backend_ops *ops = kvs_tiers_ops(r->h->tiers, 0);
    for (uint64_t c = 0; c < n_corrupt; c++) {
        const void *obj;
        uint64_t len;
        ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r->h->tiers, 0), &keys[c], &obj, &len),
                         KVS_OK);
        ((uint8_t *)obj)[len - 100] ^= 0x40;
    }
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->on_alloc(r->h, "two", b, 8, 127), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, 127, 1};
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, cap, &len), KVS_OK);
    return len;
}

/* The rest of a bound step: loads, the last token computed, saves. */
static void finish_step(rig *r, const uint32_t *b, const int32_t *t) {
    ck_assert_int_eq(api->start_load(r->h), KVS_OK);
    for (uint32_t l = 0; l < (uint32_t)rig_layers; l++)
        ck_assert_int_eq(api->wait_layer_load(r->h, l), KVS_OK);
    rig_write_kv(r, b, t, 127, 128);
    for (uint32_t l = 0; l < (uint32_t)rig_layers; l++)
        ck_assert_int_eq(api->save_layer(r->h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(r->h), KVS_OK);
}

/* Memory runs out after bind_meta: every chunk's load fails, and every one of their blocks is still
 * in load_error_blocks (the room for them was taken at bind; a block left off would be garbage KV
 * the engine uses). */
START_TEST(an_error_block_is_never_dropped_when_memory_runs_out_during_the_step) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t b[8];
    uint8_t meta[65536];
    uint64_t len = corrupt_restore_meta(&r, t, b, 4, meta, sizeof meta);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    r.h->worker.error_blocks_realloc = no_memory;
    finish_step(&r, b, t);
    uint32_t errs[16];
    uint64_t n = 0;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 8); /* chunks 0..3: every block of the request */
    uint64_t sum = 0, want = 0;
    for (int i = 0; i < 8; i++) {
        sum += errs[i];
        want += b[i];
    }
    ck_assert_uint_eq(sum, want);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.load_errors, 4);
    rig_close(&r);
}
END_TEST

/* No memory for the error list at bind_meta: the bind fails with KVS_ENOMEM and a sentence, the
 * handle is as it was (no step bound, nothing loaded), and the same metadata binds once memory is
 * back, its failed chunk listed. */
START_TEST(bind_meta_fails_cleanly_when_the_error_list_cannot_be_reserved) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t b[8];
    uint8_t meta[65536];
    uint64_t len = corrupt_restore_meta(&r, t, b, 1, meta, sizeof meta);
    r.h->worker.error_blocks_realloc = no_memory;
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_ENOMEM);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "error blocks"));
    ck_assert_int_eq(api->start_load(r.h), KVS_ESTATE); /* nothing bound */
    r.h->worker.error_blocks_realloc = NULL;
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    finish_step(&r, b, t);
    uint32_t errs[16];
    uint64_t n = 0;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 2); /* chunk 0: blocks b[0], b[1] */
    ck_assert_uint_eq(errs[0] + errs[1], b[0] + b[1]);
    rig_close(&r);
}
END_TEST

START_TEST(impossible_strides_are_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_WORKER, NULL), KVS_OK);
    rig_close(&r);
    kvs_model_desc m = rig_model();
    kvs_open_params p = {.struct_size = sizeof p, .role = KVS_ROLE_WORKER, .model = &m};
    kvs_handle *h;
    ck_assert_int_eq(api->open(&p, &h, NULL, 0), KVS_OK);
    uint8_t *mem = calloc(1, rig_layer_span() * LAYERS);
    kvs_layer_view v[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        v[l] = (kvs_layer_view){.struct_size = sizeof v[l],
                                .n_blocks = BLOCKS,
                                .k_base = mem + l * rig_layer_span(),
                                .v_base = mem + l * rig_layer_span() + rig_layer_span() / 2,
                                .block_stride = BT * TOKEN_BYTES,
                                .token_stride = HEAD_BYTES, /* overlaps heads */
                                .head_stride = HEAD_BYTES};
    ck_assert_int_eq(api->register_kv(h, v, LAYERS), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(h), "layer 0"));
    v[0].token_stride = v[1].token_stride = TOKEN_BYTES;
    v[1].v_base = NULL; /* a non-MLA model needs V */
    ck_assert_int_eq(api->register_kv(h, v, LAYERS), KVS_EINVAL);
    ck_assert_int_eq(api->register_kv(h, v, 1), KVS_EINVAL);
    v[1].v_base = mem + rig_layer_span() + rig_layer_span() / 2;
    ck_assert_int_eq(api->register_kv(h, v, LAYERS), KVS_OK);
    ck_assert_int_eq(api->register_kv(h, v, LAYERS), KVS_ESTATE);
    api->close(h);
    free(mem);
}
END_TEST

START_TEST(block_ids_are_checked_against_the_layer_with_the_fewest_pages) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    api->close(r.h);
    kvs_model_desc m = rig_model();
    kvs_open_params p = {.struct_size = sizeof p,
                         .role = KVS_ROLE_BOTH,
                         .config_path = rig_dram_config(64, 30000),
                         .model = &m};
    ck_assert_int_eq(api->open(&p, &r.h, r.error, sizeof r.error), KVS_OK);
    r.views[1].n_blocks = 8; /* layer 1 holds pages 0..7 only */
    ck_assert_int_eq(api->register_kv(r.h, r.views, LAYERS), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 85);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);                               /* past layer 1's pages */
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0); /* fits every layer */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, res.n_hit_tokens), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, res.n_hit_tokens, 128 - res.n_hit_tokens};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "layer 1"));
    /* A save into those pages is refused the same way, before any gather reads past layer 1. */
    kvs_step_request fresh = {"three", t, 128, b, 8, 0, 128};
    int32_t u[128];
    rig_make_tokens(u, 128, 86);
    fresh.tokens = u;
    ck_assert_int_eq(api->build_meta(r.h, &fresh, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "save: layer 1"));
    rig_close(&r);
}
END_TEST

static Suite *worker_suite(void) {
    Suite *s = suite_create("worker");
    TCase *tc = tcase_create("worker");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, restore_into_other_pages_is_byte_identical);
    tcase_add_test(tc, partial_local_hit_loads_only_the_rest);
    tcase_add_test(tc, saves_without_staging_memory_are_skipped_and_counted);
    tcase_add_test(tc, a_corrupt_object_becomes_error_blocks_and_is_dropped);
    tcase_add_test(tc, chunks_computed_after_a_failed_load_are_not_stored);
    tcase_add_test(tc, an_error_block_is_never_dropped_when_memory_runs_out_during_the_step);
    tcase_add_test(tc, bind_meta_fails_cleanly_when_the_error_list_cannot_be_reserved);
    tcase_add_test(tc, impossible_strides_are_refused);
    suite_add_tcase(s, tc);
    TCase *contract = tcase_create("contract");
    tcase_add_checked_fixture(contract, setup, teardown);
    tcase_set_timeout(contract, 60);
    tcase_add_test(contract, block_ids_are_checked_against_the_layer_with_the_fewest_pages);
    suite_add_tcase(s, contract);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(worker_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
