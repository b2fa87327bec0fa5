/* test_lookup_remote.c - `loads: {remote_lookups: async}`: a scheduler's lookup never waits for a
 * node. The first lookup of a prompt whose chunks the local tiers lack answers unknown_yet while a
 * thread asks the remote tier; a later one answers from that thread's answer. A writer handle saves
 * prompts into a kvstrata-node; the scheduler under test has its own (empty) DRAM tier over the same
 * node. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "abi/kvstrata.h"
#include "tests/support/connector_rig.h"
#include "tests/support/node_proc.h"

static const kvs_api *api;
static kvs_test_node node;

static char tenant_key_path[700]; /* tenant "lookups"'s key, derived from the node's */

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
    kvs_test_node_start_suite(&node, KVS_TEST_NODE_DRAM_YAML, 1, 0);
    uint8_t key[32];
    kvs_test_node_tenant_key(&node, "lookups", key, tenant_key_path, sizeof tenant_key_path);
}

static void teardown(void) {
    if (node.pid) kvs_test_node_stop(&node);
    rig_teardown();
}

/* A config whose last tier is the node ("far"), under a DRAM tier when with_dram. */
static const char *config(const char *name, int with_dram, const char *loads) {
    char text[2048];
    snprintf(text, sizeof text,
             "chunk_tokens: %d\nlease_timeout_ms: 60000\npool:\n  staging_bytes: 1MiB\n%s"
             "tiers:\n%s  - name: far\n    type: remote\n    nodes: [%s]\n    options:\n"
             "      psk_file: %s\n      tenant: lookups\n      timeout_ms: 1000\n",
             CHUNK, loads, with_dram ? "  - name: dram\n    type: dram\n    capacity: 4MiB\n" : "",
             node.id, tenant_key_path);
    return rig_config(name, text);
}

#define ASYNC "loads:\n  remote_lookups: async\n"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Lookups of (id, tokens) until one is known, at most 10 s; returns it and how many were unknown. */
static kvs_lookup_result lookup_until_known(rig *r, const char *id, const int32_t *tokens,
                                            uint64_t n, uint64_t *unknown) {
    kvs_lookup_result res;
    *unknown = 0;
    for (double end = now_s() + 10;;) {
        res = (kvs_lookup_result){.struct_size = sizeof res};
        ck_assert_int_eq(api->lookup(r->h, id, tokens, n, 0, &res), KVS_OK);
        if (!res.unknown_yet) return res;
        (*unknown)++;
        ck_assert_msg(now_s() < end, "the remote lookup of '%s' never answered", id);
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
    }
}

/* Save tokens (whole chunks and a tail) through a handle whose only tier is the node, and wait until
 * the node holds every chunk (puts are queued). */
static void save_on_node(const int32_t *tokens, uint64_t n) {
    rig w;
    ck_assert_int_eq(rig_open(&w, KVS_ROLE_BOTH, config("writer.yaml", 0, "")), KVS_OK);
    uint32_t blocks[BLOCKS];
    rig_blocks_from(blocks, BLOCKS, 0);
    rig_prefill(&w, "w", tokens, n, blocks);
    uint64_t unknown = 0;
    for (double end = now_s() + 10;;) {
        kvs_lookup_result res = lookup_until_known(&w, "probe", tokens, n, &unknown);
        ck_assert_uint_eq(unknown, 0); /* a waiting handle never answers unknown */
        if (res.n_hit_tokens == n / CHUNK * CHUNK) break;
        ck_assert_msg(now_s() < end, "the node never held the %llu chunks (%llu tokens)",
                      (unsigned long long)(n / CHUNK), (unsigned long long)res.n_hit_tokens);
    }
    ck_assert_int_eq(api->request_finished(w.h, "probe", NULL), KVS_OK);
    rig_close(&w);
}

START_TEST(a_remote_hit_is_unknown_then_known) {
    int32_t tokens[4 * CHUNK + 7];
    rig_make_tokens(tokens, 4 * CHUNK + 7, 11);
    save_on_node(tokens, 4 * CHUNK + 7);
    rig s;
    ck_assert_int_eq(rig_open(&s, KVS_ROLE_SCHEDULER, config("sched.yaml", 1, ASYNC)), KVS_OK);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "b", tokens, 4 * CHUNK + 7, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.unknown_yet, 1);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    uint64_t unknown = 0;
    res = lookup_until_known(&s, "b", tokens, 4 * CHUNK + 7, &unknown);
    ck_assert_uint_eq(res.n_hit_tokens, 4 * CHUNK);
    /* asked again within a lease: the answer stands, nothing is asked anew */
    res = (kvs_lookup_result){.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "b", tokens, 4 * CHUNK + 7, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.unknown_yet, 0);
    ck_assert_uint_eq(res.n_hit_tokens, 4 * CHUNK);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(s.h, &st), KVS_OK);
    ck_assert_uint_eq(st.lookups_unknown, unknown + 1);
    ck_assert_uint_eq(st.lookups, 2);
    /* a partial hit from a computed prefix on: only the chunks after it are asked (a new query) */
    res = (kvs_lookup_result){.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "b", tokens, 4 * CHUNK + 7, 2 * CHUNK, &res), KVS_OK);
    ck_assert_uint_eq(res.unknown_yet, 1);
    res = lookup_until_known(&s, "b", tokens, 4 * CHUNK + 7, &unknown);
    ck_assert_uint_eq(res.n_hit_tokens, 4 * CHUNK);
    ck_assert_int_eq(api->request_finished(s.h, "b", NULL), KVS_OK);
    rig_close(&s);
}
END_TEST

START_TEST(a_miss_everywhere_is_unknown_then_a_miss) {
    int32_t tokens[3 * CHUNK];
    rig_make_tokens(tokens, 3 * CHUNK, 12);
    rig s;
    ck_assert_int_eq(rig_open(&s, KVS_ROLE_SCHEDULER, config("sched.yaml", 1, ASYNC)), KVS_OK);
    uint64_t unknown = 0;
    kvs_lookup_result res = lookup_until_known(&s, "m", tokens, 3 * CHUNK, &unknown);
    ck_assert_uint_ge(unknown, 1);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    rig_close(&s); /* with the request still open: its answer is freed with the handle */
}
END_TEST

START_TEST(chunks_the_local_tiers_hold_are_answered_at_once) {
    int32_t tokens[2 * CHUNK + 3];
    rig_make_tokens(tokens, 2 * CHUNK + 3, 13);
    rig s; /* role both: its prefill saves into its own DRAM tier (and the node below it) */
    ck_assert_int_eq(rig_open(&s, KVS_ROLE_BOTH, config("both.yaml", 1, ASYNC)), KVS_OK);
    uint32_t blocks[BLOCKS];
    rig_blocks_from(blocks, BLOCKS, 0);
    rig_prefill(&s, "a", tokens, 2 * CHUNK + 3, blocks);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "b", tokens, 2 * CHUNK + 3, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.unknown_yet, 0);
    ck_assert_uint_eq(res.n_hit_tokens, 2 * CHUNK);
    rig_close(&s);
}
END_TEST

START_TEST(a_request_finished_while_its_query_runs_leaves_nothing_behind) {
    int32_t tokens[4 * CHUNK + 7];
    rig_make_tokens(tokens, 4 * CHUNK + 7, 14);
    save_on_node(tokens, 4 * CHUNK + 7);
    rig s;
    ck_assert_int_eq(rig_open(&s, KVS_ROLE_SCHEDULER, config("sched.yaml", 1, ASYNC)), KVS_OK);
    uint64_t unknown_at_once = 0;
    for (int i = 0; i < 50; i++) { /* queued, asking or answered when it finishes */
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        kvs_lookup_result res = {.struct_size = sizeof res};
        ck_assert_int_eq(api->lookup(s.h, id, tokens, 4 * CHUNK + 7, 0, &res), KVS_OK);
        unknown_at_once += res.unknown_yet; /* a new query is never answered at once */
        if (i % 2) {
            struct timespec pause = {0, 1000000};
            nanosleep(&pause, NULL);
        }
        ck_assert_int_eq(api->request_finished(s.h, id, NULL), KVS_OK);
    }
    ck_assert_uint_eq(unknown_at_once, 50);
    uint64_t unknown = 0;
    kvs_lookup_result res = lookup_until_known(&s, "last", tokens, 4 * CHUNK + 7, &unknown);
    ck_assert_uint_eq(res.n_hit_tokens, 4 * CHUNK);
    rig_close(&s); /* LeakSanitizer: every dropped query was freed */
}
END_TEST

START_TEST(a_dead_node_turns_the_query_into_a_miss) {
    int32_t tokens[2 * CHUNK + 1];
    rig_make_tokens(tokens, 2 * CHUNK + 1, 15);
    save_on_node(tokens, 2 * CHUNK + 1);
    rig s;
    ck_assert_int_eq(rig_open(&s, KVS_ROLE_SCHEDULER, config("sched.yaml", 1, ASYNC)), KVS_OK);
    kvs_test_node_kill(&node);
    uint64_t unknown = 0;
    kvs_lookup_result res = lookup_until_known(&s, "d", tokens, 2 * CHUNK + 1, &unknown);
    ck_assert_uint_ge(unknown, 1);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    rig_close(&s);
}
END_TEST

START_TEST(waiting_lookups_stay_the_default) {
    int32_t tokens[4 * CHUNK + 7];
    rig_make_tokens(tokens, 4 * CHUNK + 7, 16);
    save_on_node(tokens, 4 * CHUNK + 7);
    rig s;
    ck_assert_int_eq(rig_open(&s, KVS_ROLE_SCHEDULER, config("sched.yaml", 1, "")), KVS_OK);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "b", tokens, 4 * CHUNK + 7, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.unknown_yet, 0);
    ck_assert_uint_eq(res.n_hit_tokens, 4 * CHUNK);
    rig_close(&s);
}
END_TEST

static Suite *lookup_remote_suite(void) {
    Suite *s = suite_create("lookup_remote");
    TCase *tc = tcase_create("lookup_remote");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_remote_hit_is_unknown_then_known);
    tcase_add_test(tc, a_miss_everywhere_is_unknown_then_a_miss);
    tcase_add_test(tc, chunks_the_local_tiers_hold_are_answered_at_once);
    tcase_add_test(tc, a_request_finished_while_its_query_runs_leaves_nothing_behind);
    tcase_add_test(tc, a_dead_node_turns_the_query_into_a_miss);
    tcase_add_test(tc, waiting_lookups_stay_the_default);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(lookup_remote_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
