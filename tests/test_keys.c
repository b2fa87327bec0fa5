/* test_keys.c - chunk keys (connector/keys.c): the model fingerprint and the chain of chunk keys over
 * a prefix, the same in every process. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "abi/kvstrata.h"
#include "connector/keys.h"
#include "tests/support/connector_rig.h"

static void setup(void) {
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

static void print_keys(void) {
    kvs_model_desc m = rig_model();
    kvs_key fp, keys[4];
    int32_t tokens[128];
    rig_make_tokens(tokens, 128, 9);
    kvs_keys_fingerprint(&m, CHUNK, &fp);
    kvs_keys_chain(&fp, tokens, 4, CHUNK, keys);
    for (int i = 0; i < 4; i++) {
        char hex[33];
        kvs_key_hex(&keys[i], hex);
        printf("%s\n", hex);
    }
}

START_TEST(keys_are_deterministic_across_processes) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (dup2(fds[1], 1) < 0 || close(fds[0]) != 0) _exit(126);
        execl("/proc/self/exe", "test_keys", "--print-keys", (char *)NULL);
        _exit(127);
    }
    ck_assert_int_eq(close(fds[1]), 0);
    char child[512] = {0};
    size_t got = 0;
    ssize_t n;
    while ((n = read(fds[0], child + got, sizeof child - 1 - got)) > 0) got += (size_t)n;
    ck_assert_int_eq(close(fds[0]), 0);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char mine[512] = {0};
    FILE *f = fmemopen(mine, sizeof mine, "w");
    ck_assert_ptr_nonnull(f);
    FILE *saved = stdout;
    stdout = f;
    print_keys();
    stdout = saved;
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_uint_eq(strlen(child), 4 * 33);
    ck_assert_str_eq(child, mine);
}
END_TEST

START_TEST(keys_chain_on_the_prefix_and_the_model) {
    kvs_model_desc m = rig_model();
    kvs_key fp, fp2, k1[2], k2[2];
    int32_t tokens[64];
    rig_make_tokens(tokens, 64, 4);
    kvs_keys_fingerprint(&m, CHUNK, &fp);
    kvs_keys_chain(&fp, tokens, 2, CHUNK, k1);
    tokens[0]++; /* a change in chunk 0 changes chunk 1's key too */
    kvs_keys_chain(&fp, tokens, 2, CHUNK, k2);
    ck_assert(memcmp(&k1[0], &k2[0], 16) != 0);
    ck_assert(memcmp(&k1[1], &k2[1], 16) != 0);
    tokens[0]--;
    m.tp_rank = 1;
    m.tp_size = 2;
    kvs_keys_fingerprint(&m, CHUNK, &fp2);
    ck_assert(memcmp(&fp, &fp2, 16) != 0);
    m.is_mla = 1; /* MLA keys ignore the rank */
    kvs_key a, b;
    kvs_keys_fingerprint(&m, CHUNK, &a);
    m.tp_rank = 0;
    kvs_keys_fingerprint(&m, CHUNK, &b);
    ck_assert_mem_eq(&a, &b, 16);
    /* A known value: changes here break every stored object in every deployment. */
    m = rig_model();
    kvs_keys_fingerprint(&m, CHUNK, &fp);
    char hex[33];
    kvs_key_hex(&fp, hex);
    ck_assert_uint_eq(strlen(hex), 32);
    kvs_key again;
    kvs_keys_fingerprint(&m, CHUNK, &again);
    ck_assert_mem_eq(&fp, &again, 16);
}
END_TEST

/* The keys of a known prompt, as every release before per-rank chains stored them (tp_size 1, and
 * rank 1 of 2): a change here strands every stored object. */
START_TEST(keys_of_a_known_prompt_are_unchanged) {
    kvs_model_desc m = rig_model();
    int32_t tokens[128];
    rig_make_tokens(tokens, 128, 9);
    kvs_key fp, keys[4];
    char hex[33];
    kvs_keys_fingerprint(&m, CHUNK, &fp);
    kvs_keys_chain(&fp, tokens, 4, CHUNK, keys);
    kvs_key_hex(&keys[0], hex);
    ck_assert_str_eq(hex, "5c5bb57e3e27ea4689c04d99b205eafb");
    kvs_key_hex(&keys[3], hex);
    ck_assert_str_eq(hex, "641ca986f310ca0ebf5c5cbd2101770e");
    m.tp_size = 2;
    m.tp_rank = 1;
    kvs_keys_fingerprint(&m, CHUNK, &fp);
    kvs_keys_chain(&fp, tokens, 4, CHUNK, keys);
    kvs_key_hex(&keys[3], hex);
    ck_assert_str_eq(hex, "330d9d44c2426f76efe0fc4cb3ff33d7");
}
END_TEST

START_TEST(every_rank_has_a_chain_of_its_own) {
    kvs_model_desc m = rig_model();
    ck_assert_uint_eq(kvs_keys_n_ranks(&m), 1);
    ck_assert_uint_eq(kvs_keys_own_rank(&m), 0);
    m.tp_size = 4;
    m.tp_rank = 3;
    ck_assert_uint_eq(kvs_keys_n_ranks(&m), 4);
    ck_assert_uint_eq(kvs_keys_own_rank(&m), 3);
    kvs_key fps[4], own;
    kvs_keys_rank_fingerprints(&m, CHUNK, fps);
    kvs_keys_fingerprint(&m, CHUNK, &own);
    ck_assert_mem_eq(&fps[3], &own, sizeof own);
    for (uint32_t r = 0; r < 4; r++) { /* rank r's is the model's with tp_rank r; all differ */
        kvs_model_desc mr = m;
        mr.tp_rank = r;
        kvs_key want;
        kvs_keys_fingerprint(&mr, CHUNK, &want);
        ck_assert_mem_eq(&fps[r], &want, sizeof want);
        for (uint32_t q = 0; q < r; q++) ck_assert(memcmp(&fps[q], &fps[r], sizeof want) != 0);
    }
    kvs_model_desc two = m; /* the group (rank 0's) names tp_size */
    two.tp_size = 2;
    two.tp_rank = 0;
    kvs_key fps2[2];
    kvs_keys_rank_fingerprints(&two, CHUNK, fps2);
    ck_assert(memcmp(&fps[0], &fps2[0], sizeof fps[0]) != 0);
    /* four chains at once, chunk-major, each the chain of its rank's fingerprint */
    int32_t tokens[128];
    rig_make_tokens(tokens, 128, 5);
    kvs_key all[4 * 4], one[4];
    kvs_keys_chains(fps, 4, tokens, 4, CHUNK, all);
    for (uint32_t r = 0; r < 4; r++) {
        kvs_keys_chain(&fps[r], tokens, 4, CHUNK, one);
        for (uint32_t c = 0; c < 4; c++) ck_assert_mem_eq(&all[c * 4 + r], &one[c], sizeof one[c]);
    }
    /* going on from the row before gives the same keys */
    kvs_key more[4 * 4];
    memcpy(more, all, 2 * 4 * sizeof *more);
    kvs_keys_chains(&more[4], 4, tokens + 2 * CHUNK, 2, CHUNK, &more[8]);
    ck_assert_mem_eq(more, all, sizeof all);
    /* MLA: one rank-agnostic chain whatever the rank */
    m.is_mla = 1;
    m.n_kv_heads = 1;
    ck_assert_uint_eq(kvs_keys_n_ranks(&m), 1);
    ck_assert_uint_eq(kvs_keys_own_rank(&m), 0);
    kvs_key mla;
    kvs_keys_rank_fingerprints(&m, CHUNK, &mla);
    kvs_keys_fingerprint(&m, CHUNK, &own);
    ck_assert_mem_eq(&mla, &own, sizeof own);
}
END_TEST

/* Hashing while copying and checking gives kvs_keys_chains' keys and an exact copy, and finds a bad
 * token wherever it is: in any chunk, in any lane of four, or negative. */
START_TEST(keys_made_while_copying_are_the_same_keys) {
    kvs_model_desc m = rig_model();
    m.tp_size = 2;
    kvs_key fps[2];
    kvs_keys_rank_fingerprints(&m, CHUNK, fps);
    enum { N = 4 * CHUNK + 3 }; /* a partial chunk after four whole ones */
    int32_t tokens[N], copy[N];
    rig_make_tokens(tokens, N, 11);
    kvs_key want[4 * 2], got[4 * 2];
    kvs_keys_chains(fps, 2, tokens, 4, CHUNK, want);
    memset(copy, 0xee, sizeof copy);
    ck_assert_uint_eq(kvs_keys_chains_copy(fps, 2, tokens, 4, CHUNK, 1u << 20, copy, got), 0);
    ck_assert_mem_eq(got, want, sizeof want);
    ck_assert_mem_eq(copy, tokens, 4 * CHUNK * sizeof *tokens);
    ck_assert_int_eq(copy[4 * CHUNK], (int32_t)0xeeeeeeee); /* nothing past the chunks */
    ck_assert_uint_eq(kvs_tokens_copy_check(copy + 4 * CHUNK, tokens + 4 * CHUNK, 3, 1u << 20), 0);
    ck_assert_mem_eq(copy, tokens, sizeof tokens);
    ck_assert_uint_eq(kvs_tokens_check(tokens, N, 1u << 20), 0);
    /* every lane of the first two vectors of either width, chunk edges, the last whole token */
    const uint64_t spots[] = {
        0, 1, 2, 3, 7, 8, 15, 16, CHUNK - 1, CHUNK, 3 * CHUNK + 2, 4 * CHUNK - 1};
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        for (int neg = 0; neg < 2; neg++) {
            int32_t bad[N];
            memcpy(bad, tokens, sizeof bad);
            bad[spots[i]] = neg ? -1 : 1 << 20; /* the limit itself is out */
            ck_assert_uint_ne(kvs_keys_chains_copy(fps, 2, bad, 4, CHUNK, 1u << 20, copy, got), 0);
            ck_assert_uint_ne(kvs_tokens_check(bad, N, 1u << 20), 0);
            ck_assert_uint_eq(kvs_tokens_check(bad, spots[i], 1u << 20), 0); /* before it: fine */
            /* the portable loop and the one this CPU runs agree, with and without a copy */
            ck_assert_uint_ne(kvs_tokens_copy_check_portable(NULL, bad, N, 1u << 20), 0);
            ck_assert_uint_eq(kvs_tokens_copy_check_portable(NULL, bad, spots[i], 1u << 20), 0);
            memset(copy, 0, sizeof copy);
            ck_assert_uint_ne(kvs_tokens_copy_check_portable(copy, bad, N, 1u << 20), 0);
            ck_assert_mem_eq(copy, bad, sizeof bad);
            memset(copy, 0, sizeof copy);
            ck_assert_uint_ne(kvs_tokens_copy_check(copy, bad, N, 1u << 20), 0);
            ck_assert_mem_eq(copy, bad, sizeof bad);
            /* no vocabulary: only a negative token is out */
            ck_assert_uint_eq(kvs_tokens_check(bad, N, 1u << 31) != 0, (uint32_t)neg);
        }
    }
    /* a bad token after the last whole vector step (the loops' scalar tails), for every length
     * up to two steps; and no tokens are never bad, whatever the limit */
    for (uint64_t n = 1; n <= 32; n++) {
        int32_t few[32];
        memcpy(few, tokens, sizeof few);
        few[n - 1] = -7;
        ck_assert_msg(kvs_tokens_check(few, n, 1u << 20) != 0, "n %llu", (unsigned long long)n);
        ck_assert_uint_eq(kvs_tokens_check(few, n - 1, 1u << 20), 0);
        ck_assert_uint_ne(kvs_tokens_copy_check_portable(NULL, few, n, 1u << 20), 0);
    }
    ck_assert_uint_eq(kvs_tokens_check(tokens, 0, 0), 0);
    ck_assert_uint_eq(kvs_tokens_copy_check(copy, tokens, 0, 0), 0);
    ck_assert_uint_ne(kvs_tokens_check(tokens, 20, 0), 0); /* limit 0: every token is out */
    int32_t tail[N];
    memcpy(tail, tokens, sizeof tail);
    tail[N - 1] =
        -5; /* in the partial chunk: the keys' pass does not see it, the tail check does */
    ck_assert_uint_eq(kvs_keys_chains_copy(fps, 2, tail, 4, CHUNK, 1u << 20, copy, got), 0);
    ck_assert_uint_ne(kvs_tokens_copy_check(copy + 4 * CHUNK, tail + 4 * CHUNK, 3, 1u << 20), 0);
}
END_TEST

static Suite *keys_suite(void) {
    Suite *s = suite_create("keys");
    TCase *tc = tcase_create("keys");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, keys_are_deterministic_across_processes);
    tcase_add_test(tc, keys_chain_on_the_prefix_and_the_model);
    tcase_add_test(tc, keys_of_a_known_prompt_are_unchanged);
    tcase_add_test(tc, keys_made_while_copying_are_the_same_keys);
    tcase_add_test(tc, every_rank_has_a_chain_of_its_own);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--print-keys") == 0) {
        print_keys();
        return 0;
    }
    SRunner *sr = srunner_create(keys_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
