/* test_api.c - the exported entry point and the ABI table (connector/api.c): the table of another
 * major, open refusing bad configs and models, and hooks called out of order or on a NULL handle. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "tests/support/connector_rig.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

START_TEST(another_abi_major_gets_no_table) {
    ck_assert_ptr_null(kvs_get_api(KVS_ABI_MAJOR + 1));
    ck_assert_ptr_null(kvs_get_api(0));
    ck_assert_uint_eq(api->abi_major, KVS_ABI_MAJOR);
    ck_assert_uint_eq(api->struct_size, sizeof(kvs_api));
    ck_assert_str_eq(api->strerror(KVS_ECONFIG), "invalid configuration");
}
END_TEST

START_TEST(a_bad_config_refuses_to_open) {
    rig r;
    const char *cfg =
        rig_config("bad.yaml", "chunk_tokens: 32\ntiers:\n  - name: dram\n    type: dram\n"
                               "    capacity: 1GiB\n    colour: blue\n");
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_ECONFIG);
    ck_assert_ptr_null(r.h);
    ck_assert_ptr_nonnull(strstr(r.error, "bad.yaml:6:5"));
    ck_assert_ptr_nonnull(strstr(r.error, "colour"));
    cfg = rig_config("chunk.yaml",
                     "chunk_tokens: 40\ntiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n");
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, "multiple of the engine block size 16"));
    kvs_model_desc m = rig_model();
    m.is_mla = 1; /* with two heads */
    kvs_open_params p = {.struct_size = sizeof p, .role = KVS_ROLE_BOTH, .model = &m};
    kvs_handle *h = (kvs_handle *)&p;
    char err[256];
    ck_assert_int_eq(api->open(&p, &h, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_null(h);
    ck_assert_ptr_nonnull(strstr(err, "MLA"));
}
END_TEST

START_TEST(hooks_out_of_order_are_refused) {
    kvs_model_desc m = rig_model();
    kvs_open_params p = {.struct_size = sizeof p, .role = KVS_ROLE_WORKER, .model = &m};
    kvs_handle *w;
    ck_assert_int_eq(api->open(&p, &w, NULL, 0), KVS_OK);
    uint8_t blob[4] = {0x90};
    ck_assert_int_eq(api->bind_meta(w, blob, 1), KVS_ESTATE); /* before register_kv */
    ck_assert_int_eq(api->start_load(w), KVS_ESTATE);
    ck_assert_int_eq(api->save_layer(w, 0), KVS_ESTATE);
    ck_assert_int_eq(api->wait_save(w), KVS_ESTATE);
    kvs_lookup_result res = {.struct_size = sizeof res};
    int32_t t[4] = {1, 2, 3, 4};
    ck_assert_int_eq(api->lookup(w, "a", t, 4, 0, &res), KVS_ESTATE);
    ck_assert_ptr_nonnull(strstr(api->last_error(w), "role worker"));
    api->close(w);

    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, NULL), KVS_OK);
    uint8_t meta[4096];
    uint64_t len;
    ck_assert_int_eq(api->build_meta(r.h, NULL, 0, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->wait_layer_load(r.h, 0), KVS_ESTATE);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    /* ABI 1.5: binding again closes the step that ran no forward pass (vLLM's order) */
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.steps_closed, 1);
    ck_assert_int_eq(api->wait_layer_load(r.h, 0), KVS_ESTATE);
    ck_assert_int_eq(api->start_load(r.h), KVS_OK);
    ck_assert_int_eq(api->start_load(r.h), KVS_ESTATE);
    ck_assert_int_eq(api->wait_layer_load(r.h, LAYERS), KVS_EINVAL);
    ck_assert_int_eq(api->save_layer(r.h, 0), KVS_OK);
    ck_assert_int_eq(api->save_layer(r.h, 0), KVS_ESTATE);
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    ck_assert_int_eq(api->wait_save(r.h), KVS_ESTATE);
    rig_close(&r);
    ck_assert_int_eq(api->lookup(NULL, "a", t, 4, 0, &res), KVS_EINVAL);
    api->close(NULL);
}
END_TEST

START_TEST(handle_info_says_what_the_handle_was_opened_with) {
    rig r;
    const char *cfg = rig_config(
        "info.yaml", "chunk_tokens: 48\nsave_decode: true\nlease_timeout_ms: 1234\n"
                     "saves:\n  async: true\ntiers:\n  - name: a\n    type: dram\n"
                     "    capacity: 1MiB\n  - name: b\n    type: dram\n    capacity: 1MiB\n");
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_SCHEDULER, cfg), KVS_OK);
    kvs_handle_info info;
    memset(&info, 0xab, sizeof info);
    info.struct_size = sizeof info;
    ck_assert_int_eq(api->handle_info(r.h, &info), KVS_OK);
    ck_assert_uint_eq(info.struct_size, sizeof info);
    ck_assert_uint_eq(info.role, KVS_ROLE_SCHEDULER);
    ck_assert_uint_eq(info.transfer_role, KVS_TRANSFER_BOTH);
    ck_assert_uint_eq(info.chunk_tokens, 48);
    ck_assert_uint_eq(info.key_ranks, 1);
    ck_assert_uint_eq(info.n_tiers, 2);
    ck_assert_uint_eq(info.save_decode, 1);
    ck_assert_uint_eq(info.saves_async, 1);
    ck_assert_uint_eq(info.lease_timeout_ms, 1234);
    rig_close(&r);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, NULL), KVS_OK);
    ck_assert_int_eq(api->handle_info(r.h, &info), KVS_OK);
    ck_assert_uint_eq(info.save_decode, 0);
    ck_assert_uint_eq(info.saves_async, 0);
    /* a struct below its first size is refused; a larger one is written up to what the library
     * knows and no further */
    info.struct_size = KVS_HANDLE_INFO_SIZE_1_10 - 4;
    ck_assert_int_eq(api->handle_info(r.h, &info), KVS_EINVAL);
    uint8_t big[64];
    memset(big, 0xcd, sizeof big);
    uint32_t size = sizeof big;
    memcpy(big, &size, sizeof size);
    ck_assert_int_eq(api->handle_info(r.h, (kvs_handle_info *)(void *)big), KVS_OK);
    ck_assert_uint_eq(big[sizeof(kvs_handle_info)], 0xcd);
    ck_assert_int_eq(api->handle_info(NULL, &info), KVS_EINVAL);
    rig_close(&r);
}
END_TEST

static Suite *api_suite(void) {
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("api");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, another_abi_major_gets_no_table);
    tcase_add_test(tc, a_bad_config_refuses_to_open);
    tcase_add_test(tc, hooks_out_of_order_are_refused);
    tcase_add_test(tc, handle_info_says_what_the_handle_was_opened_with);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(api_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
