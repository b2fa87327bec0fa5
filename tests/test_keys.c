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

static Suite *keys_suite(void) {
    Suite *s = suite_create("keys");
    TCase *tc = tcase_create("keys");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, keys_are_deterministic_across_processes);
    tcase_add_test(tc, keys_chain_on_the_prefix_and_the_model);
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
