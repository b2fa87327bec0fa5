/* test_auth.c - the remote tier's connect handshake and keys (backends/ucx/auth): HMAC proofs, a
 * node's checks (wrong key, other tenant, replay, one AUTH per challenge), key files, tenant keys. */
#include <check.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/ucx/auth.h"
#include "backends/ucx/wire.h"
#include "tests/support/test_support.h"
#include "tests/support/wire_messages.h"

/* ---- handshake ------------------------------------------------------------------------------- */

static const uint8_t test_psk_bytes[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                           11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                           22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

static void psk_of(kvs_remote_psk *psk, uint8_t tweak) {
    uint8_t bytes[32];
    memcpy(bytes, test_psk_bytes, 32);
    bytes[31] ^= tweak;
    ck_assert_int_eq(kvs_remote_psk_set(psk, bytes, sizeof bytes, NULL, 0), KVS_OK);
}

/* One connection: HELLO through the wire, the node's challenge, the client's proof with client_psk. */
typedef struct conn {
    kvs_remote_auth_node node;
    uint8_t nonce[32];
    uint8_t challenge[32];
    uint8_t proof[32];
} conn;

static void conn_hello(conn *c, const char *tenant) {
    memset(c, 0, sizeof *c);
    ck_assert_int_eq(kvs_remote_random(c->nonce, sizeof c->nonce), KVS_OK);
    kvs_wire_msg hello, back;
    kvs_wire_msg_init(&hello, KVS_WIRE_HELLO, 1);
    hello.tenant = tenant;
    hello.tenant_len = (uint32_t)strlen(tenant);
    hello.nonce = c->nonce;
    uint8_t *copy = kvs_test_wire_round_trip(&hello, &back);
    const uint8_t *challenge = NULL;
    char error[200];
    ck_assert_int_eq(kvs_remote_auth_node_hello(&c->node, &back, &challenge, error, sizeof error),
                     KVS_OK);
    free(copy);
    memcpy(c->challenge, challenge, 32);
}

START_TEST(the_proof_matches_a_known_answer) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    uint8_t challenge[32], nonce[32], proof[32];
    for (int i = 0; i < 32; i++) {
        challenge[i] = (uint8_t)(0xa0 + i % 16);
        nonce[i] = (uint8_t)(7 * i);
    }
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, challenge, nonce, "tenant-a", 8, proof), KVS_OK);
    /* HMAC-SHA256 computed independently (Python's hmac module) */
    static const uint8_t want[32] = {0x35, 0x3f, 0xb8, 0xb2, 0x4a, 0x09, 0x2e, 0x18,
                                     0xc1, 0xdb, 0xac, 0x78, 0xee, 0x5d, 0x06, 0x5f,
                                     0xf4, 0xb7, 0x45, 0x88, 0x78, 0xae, 0xb4, 0xe5,
                                     0xec, 0x97, 0xbf, 0x3b, 0x84, 0x5f, 0x1a, 0x5b};
    ck_assert_int_eq(memcmp(proof, want, 32), 0);
}
END_TEST

START_TEST(the_right_key_is_accepted) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    conn c;
    conn_hello(&c, "tenant-a");
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, c.challenge, c.nonce, "tenant-a", 8, c.proof),
                     KVS_OK);
    char error[200] = "";
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, c.proof, 32, error, sizeof error),
                     KVS_OK);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 1);
}
END_TEST

START_TEST(a_wrong_key_is_refused) {
    kvs_remote_psk node_psk, client_psk;
    psk_of(&node_psk, 0);
    psk_of(&client_psk, 1); /* one bit off */
    conn c;
    conn_hello(&c, "tenant-a");
    ck_assert_int_eq(
        kvs_remote_auth_proof(&client_psk, c.challenge, c.nonce, "tenant-a", 8, c.proof), KVS_OK);
    char error[200] = "";
    ck_assert_int_eq(
        kvs_remote_auth_node_check(&c.node, &node_psk, c.proof, 32, error, sizeof error),
        KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(error, "tenant \"tenant-a\" failed the handshake"));
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
}
END_TEST

START_TEST(a_proof_for_another_tenant_is_refused) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    conn c;
    conn_hello(&c, "tenant-a");
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, c.challenge, c.nonce, "tenant-b", 8, c.proof),
                     KVS_OK);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, c.proof, 32, NULL, 0), KVS_EINVAL);
}
END_TEST

START_TEST(an_empty_or_missing_proof_is_refused) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    size_t lens[] = {0, 0, 31, 33};
    for (int i = 0; i < 4; i++) {
        conn c;
        conn_hello(&c, "t");
        ck_assert_int_eq(kvs_remote_auth_proof(&psk, c.challenge, c.nonce, "t", 1, c.proof),
                         KVS_OK);
        uint8_t padded[33] = {0};
        memcpy(padded, c.proof, 32);
        char error[200] = "";
        const uint8_t *proof = i == 0 ? NULL : padded;
        ck_assert_int_eq(
            kvs_remote_auth_node_check(&c.node, &psk, proof, lens[i], error, sizeof error),
            KVS_EINVAL);
        ck_assert_ptr_nonnull(strstr(error, "32 expected"));
        ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    }
    /* an all-zero proof of the right length is refused too */
    conn c;
    conn_hello(&c, "t");
    uint8_t zero[32] = {0};
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, zero, 32, NULL, 0), KVS_EINVAL);
}
END_TEST

START_TEST(a_replayed_proof_fails_on_a_new_connection) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    conn first;
    conn_hello(&first, "tenant-a");
    ck_assert_int_eq(
        kvs_remote_auth_proof(&psk, first.challenge, first.nonce, "tenant-a", 8, first.proof),
        KVS_OK);
    kvs_wire_msg auth;
    kvs_wire_msg_init(&auth, KVS_WIRE_AUTH, 2);
    auth.proof = first.proof;
    size_t recorded_len = kvs_test_wire_encode_ok(&auth);
    uint8_t recorded[128];
    memcpy(recorded, kvs_test_wire_buf, recorded_len);
    ck_assert_int_eq(kvs_remote_auth_node_check(&first.node, &psk, first.proof, 32, NULL, 0),
                     KVS_OK);

    /* the attacker replays the same HELLO (same nonce) and the recorded AUTH */
    conn second;
    memset(&second, 0, sizeof second);
    kvs_wire_msg hello;
    kvs_wire_msg_init(&hello, KVS_WIRE_HELLO, 1);
    hello.tenant = "tenant-a";
    hello.tenant_len = 8;
    hello.nonce = first.nonce;
    const uint8_t *challenge = NULL;
    ck_assert_int_eq(kvs_remote_auth_node_hello(&second.node, &hello, &challenge, NULL, 0), KVS_OK);
    ck_assert_int_ne(memcmp(challenge, first.challenge, 32), 0); /* fresh */
    kvs_wire_msg replayed;
    ck_assert_int_eq(kvs_test_wire_decode_copy(recorded, recorded_len, &replayed, NULL, NULL),
                     KVS_OK);
    char error[200] = "";
    ck_assert_int_eq(
        kvs_remote_auth_node_check(&second.node, &psk, first.proof, 32, error, sizeof error),
        KVS_EINVAL);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&second.node), 0);
}
END_TEST

START_TEST(a_challenge_answers_one_auth_only) {
    kvs_remote_psk psk;
    psk_of(&psk, 0);
    conn c;
    conn_hello(&c, "tenant-a");
    uint8_t wrong[32] = {1};
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, wrong, 32, NULL, 0), KVS_EINVAL);
    /* the right proof after a wrong guess is too late: no guessing loop on one challenge */
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, c.challenge, c.nonce, "tenant-a", 8, c.proof),
                     KVS_OK);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &psk, c.proof, 32, NULL, 0), KVS_ESTATE);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    /* and an AUTH before any HELLO is refused */
    kvs_remote_auth_node fresh;
    memset(&fresh, 0, sizeof fresh);
    ck_assert_int_eq(kvs_remote_auth_node_check(&fresh, &psk, c.proof, 32, NULL, 0), KVS_ESTATE);
}
END_TEST

START_TEST(key_files_must_be_private_and_long_enough) {
    char dir[256], path[512], error[300];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    const char *key_text = "0123456789abcdef0123456789abcdef\n"; /* 33 bytes, newline included */
    ck_assert_int_eq(kvs_test_write_file(dir, "good.key", key_text, path, sizeof path), 0);
    ck_assert_int_eq(chmod(path, 0600), 0);
    kvs_remote_psk psk;
    ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_OK);
    ck_assert_uint_eq(psk.len, 33);
    ck_assert_int_eq(memcmp(psk.bytes, key_text, 33), 0);
    kvs_remote_psk_clear(&psk);
    ck_assert_uint_eq(psk.len, 0);
    ck_assert_uint_eq(psk.bytes[0], 0);

    mode_t bad_modes[] = {0640, 0604, 0620, 0660, 0644};
    for (size_t i = 0; i < sizeof bad_modes / sizeof bad_modes[0]; i++) {
        ck_assert_int_eq(chmod(path, bad_modes[i]), 0);
        error[0] = '\0';
        ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_EINVAL);
        ck_assert_msg(strstr(error, "must not be open to group or others"), "%s", error);
        ck_assert_uint_eq(psk.len, 0);
    }
    ck_assert_int_eq(chmod(path, 0400), 0);
    ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_OK);

    ck_assert_int_eq(
        kvs_test_write_file(dir, "short.key", "only-31-bytes-of-key-material!!", path, sizeof path),
        0);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_EINVAL);
    ck_assert_msg(strstr(error, "holds 31 bytes"), "%s", error);

    char link_path[600];
    snprintf(link_path, sizeof link_path, "%s/link.key", dir);
    char target[600];
    snprintf(target, sizeof target, "%s/good.key", dir);
    ck_assert_int_eq(symlink(target, link_path), 0);
    ck_assert_int_eq(kvs_remote_psk_load(link_path, &psk, error, sizeof error), KVS_EIO);

    snprintf(path, sizeof path, "%s/missing.key", dir);
    ck_assert_int_eq(kvs_remote_psk_load(path, &psk, error, sizeof error), KVS_EIO);
    ck_assert_msg(strstr(error, "missing.key cannot be opened"), "%s", error);
    ck_assert_int_eq(kvs_remote_psk_load(dir, &psk, error, sizeof error),
                     KVS_EINVAL); /* a directory */
    kvs_test_rmtree(dir);
}
END_TEST

/* ---- tenant keys ----------------------------------------------------------------------------- */

static int compare_keys(const void *a, const void *b) {
    return memcmp(a, b, sizeof(kvs_key));
}

START_TEST(tenant_keys_are_deterministic_and_differ_across_tenants) {
    kvs_key key, a1, a2, b, a_other;
    for (int i = 0; i < 16; i++) key.bytes[i] = (uint8_t)i;
    ck_assert_int_eq(kvs_remote_tenant_key("tenant-a", 8, &key, &a1), KVS_OK);
    ck_assert_int_eq(kvs_remote_tenant_key("tenant-a", 8, &key, &a2), KVS_OK);
    ck_assert_int_eq(memcmp(a1.bytes, a2.bytes, 16), 0);
    /* SHA-256 computed independently (Python's hashlib) */
    static const uint8_t want[16] = {0x63, 0xc0, 0xe0, 0x26, 0x2c, 0xf8, 0xbc, 0x27,
                                     0x77, 0xdd, 0x73, 0xe7, 0x86, 0x8e, 0xa6, 0x04};
    ck_assert_int_eq(memcmp(a1.bytes, want, 16), 0);
    /* the hasher a node keeps per connection gives the same keys, key after key */
    kvs_remote_tenant_hasher *h = kvs_remote_tenant_hasher_new("tenant-a", 8);
    ck_assert_ptr_nonnull(h);
    for (int round = 0; round < 3; round++) {
        kvs_key via;
        ck_assert_int_eq(kvs_remote_tenant_hasher_key(h, &key, &via), KVS_OK);
        ck_assert_int_eq(memcmp(via.bytes, want, 16), 0);
        kvs_key other = key, direct;
        other.bytes[round] ^= 0x5a;
        ck_assert_int_eq(kvs_remote_tenant_hasher_key(h, &other, &via), KVS_OK);
        ck_assert_int_eq(kvs_remote_tenant_key("tenant-a", 8, &other, &direct), KVS_OK);
        ck_assert_int_eq(memcmp(via.bytes, direct.bytes, 16), 0);
    }
    kvs_remote_tenant_hasher_free(h);
    ck_assert_ptr_null(kvs_remote_tenant_hasher_new("", 0));
    ck_assert_ptr_null(kvs_remote_tenant_hasher_new("x", KVS_WIRE_MAX_TENANT_BYTES + 1));
    ck_assert_int_eq(kvs_remote_tenant_key("tenant-b", 8, &key, &b), KVS_OK);
    ck_assert_int_ne(memcmp(a1.bytes, b.bytes, 16), 0);
    ck_assert_int_ne(memcmp(a1.bytes, key.bytes, 16), 0);
    key.bytes[15] ^= 1;
    ck_assert_int_eq(kvs_remote_tenant_key("tenant-a", 8, &key, &a_other), KVS_OK);
    ck_assert_int_ne(memcmp(a1.bytes, a_other.bytes, 16), 0);
    /* many tenants over many keys: no two stored keys collide */
    enum { TENANTS = 20, KEYS = 200 };
    static kvs_key seen[TENANTS * KEYS];
    for (int t = 0; t < TENANTS; t++) {
        char name[16];
        int n = snprintf(name, sizeof name, "t%d", t);
        for (uint32_t k = 0; k < KEYS; k++) {
            kvs_key in = kvs_test_wire_key(k);
            ck_assert_int_eq(kvs_remote_tenant_key(name, (size_t)n, &in, &seen[t * KEYS + (int)k]),
                             KVS_OK);
        }
    }
    qsort(seen, TENANTS * KEYS, sizeof seen[0], compare_keys);
    for (int i = 1; i < TENANTS * KEYS; i++)
        ck_assert_int_ne(memcmp(seen[i - 1].bytes, seen[i].bytes, 16), 0);
    ck_assert_int_eq(kvs_remote_tenant_key("", 0, &key, &b), KVS_EINVAL);
}
END_TEST

static Suite *auth_suite(void) {
    Suite *s = suite_create("auth");
    TCase *auth = tcase_create("auth");
    tcase_add_test(auth, the_proof_matches_a_known_answer);
    tcase_add_test(auth, the_right_key_is_accepted);
    tcase_add_test(auth, a_wrong_key_is_refused);
    tcase_add_test(auth, a_proof_for_another_tenant_is_refused);
    tcase_add_test(auth, an_empty_or_missing_proof_is_refused);
    tcase_add_test(auth, a_replayed_proof_fails_on_a_new_connection);
    tcase_add_test(auth, a_challenge_answers_one_auth_only);
    tcase_add_test(auth, key_files_must_be_private_and_long_enough);
    tcase_add_test(auth, tenant_keys_are_deterministic_and_differ_across_tenants);
    suite_add_tcase(s, auth);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(auth_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
