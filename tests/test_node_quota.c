/* test_node_quota.c - tenants' shares on a node (tools/node/node_quota.c) as a module: what counts,
 * what is removed past a share and in which order, re-puts, deletes, and a table of many records. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_server.h"
#include "tools/node/node_quota.h"

static kvs_key removed[64];
static uint32_t n_removed;

static void note_removed(void *ctx, const kvs_key *key) {
    (void)ctx;
    if (n_removed < 64) removed[n_removed] = *key;
    n_removed++;
}

static kvs_key key_of(uint32_t i) {
    kvs_key k;
    memset(&k, 0, sizeof k);
    memcpy(k.bytes, &i, sizeof i);
    k.bytes[15] = 0x5a;
    return k;
}

static node_quota *quota_with(uint64_t every, const char *named, uint64_t named_share) {
    static kvs_server_settings cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.node.tenant_capacity = every;
    if (named) {
        strcpy(cfg.node.tenants[0].name, named);
        cfg.node.tenants[0].capacity = named_share;
        cfg.node.n_tenants = 1;
    }
    int oom = 1;
    node_quota *q = node_quota_create(&cfg, &oom);
    ck_assert_int_eq(oom, 0);
    n_removed = 0;
    return q;
}

START_TEST(no_share_set_means_no_table) {
    kvs_server_settings cfg;
    memset(&cfg, 0, sizeof cfg);
    int oom = 1;
    ck_assert_ptr_null(node_quota_create(&cfg, &oom));
    ck_assert_int_eq(oom, 0);
    ck_assert_int_eq(node_quota_admit(NULL, "t", 1u << 30), KVS_OK);
}
END_TEST

START_TEST(past_its_share_a_tenant_loses_its_oldest_first) {
    node_quota *q = quota_with(16384, "big", 1u << 20);
    uint64_t evicted = 0;
    for (uint32_t i = 0; i < 4; i++) {
        kvs_key k = key_of(i);
        node_quota_stored(q, "a", &k, 4096, note_removed, NULL, &evicted);
    }
    ck_assert_uint_eq(node_quota_used(q, "a"), 16384);
    ck_assert_uint_eq(evicted, 0);
    kvs_key k1 = key_of(1); /* a re-put: counted once, now the newest */
    node_quota_stored(q, "a", &k1, 4096, note_removed, NULL, &evicted);
    ck_assert_uint_eq(node_quota_used(q, "a"), 16384);
    ck_assert_uint_eq(evicted, 0);
    kvs_key k4 = key_of(4);
    node_quota_stored(q, "a", &k4, 8192, note_removed, NULL, &evicted);
    ck_assert_uint_eq(evicted, 2); /* 0 and 2 go, 1 was put again after them */
    kvs_key k0 = key_of(0), k2 = key_of(2);
    ck_assert_mem_eq(&removed[0], &k0, sizeof k0);
    ck_assert_mem_eq(&removed[1], &k2, sizeof k2);
    ck_assert_uint_eq(node_quota_used(q, "a"), 16384);
    /* another tenant is untouched by a's puts, and a named one has its own share */
    kvs_key kb = key_of(100);
    node_quota_stored(q, "big", &kb, 1u << 19, note_removed, NULL, &evicted);
    ck_assert_uint_eq(evicted, 2);
    ck_assert_uint_eq(node_quota_used(q, "big"), 1u << 19);
    ck_assert_int_eq(node_quota_admit(q, "a", 16385), KVS_ENOMEM);
    ck_assert_int_eq(node_quota_admit(q, "big", 16385), KVS_OK);
    /* a tiny object counts as a page, a delete as nothing */
    node_quota_forget(q, &k4);
    ck_assert_uint_eq(node_quota_used(q, "a"), 8192);
    kvs_key k9 = key_of(9);
    node_quota_stored(q, "a", &k9, 1, note_removed, NULL, &evicted);
    ck_assert_uint_eq(node_quota_used(q, "a"), 12288);
    node_quota_destroy(q);
}
END_TEST

START_TEST(many_records_grow_the_table_and_all_go_again) {
    node_quota *q = quota_with(1ull << 40, NULL, 0);
    uint64_t evicted = 0;
    for (uint32_t i = 0; i < 50000; i++) {
        kvs_key k = key_of(i);
        node_quota_stored(q, "t", &k, 4096, note_removed, NULL, &evicted);
    }
    ck_assert_uint_eq(evicted, 0);
    ck_assert_uint_eq(node_quota_used(q, "t"), 50000ull * 4096);
    for (uint32_t i = 0; i < 50000; i += 2) {
        kvs_key k = key_of(i);
        node_quota_forget(q, &k);
    }
    ck_assert_uint_eq(node_quota_used(q, "t"), 25000ull * 4096);
    node_quota_destroy(q);
}
END_TEST

int main(void) {
    Suite *s = suite_create("node_quota");
    TCase *tc = tcase_create("shares");
    tcase_add_test(tc, no_share_set_means_no_table);
    tcase_add_test(tc, past_its_share_a_tenant_loses_its_oldest_first);
    tcase_add_test(tc, many_records_grow_the_table_and_all_go_again);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
