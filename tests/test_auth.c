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

/* The node's master key (tweak 0) or another (one bit off). */
static void psk_of(kvs_remote_psk *psk, uint8_t tweak) {
    uint8_t bytes[32];
    memcpy(bytes, test_psk_bytes, 32);
    bytes[31] ^= tweak;
    ck_assert_int_eq(kvs_remote_psk_set(psk, bytes, sizeof bytes, NULL, 0), KVS_OK);
}

/* What a client of `tenant` holds: its key, derived from the master key. */
static kvs_remote_psk tenant_key(const char *tenant) {
    kvs_remote_psk master, key;
    psk_of(&master, 0);
    ck_assert_int_eq(kvs_remote_tenant_psk(&master, tenant, strlen(tenant), &key), KVS_OK);
    return key;
}

static const uint8_t test_addr[12] = {0x01, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

/* One connection: HELLO through the wire to the node (which holds the master key), its CHALLENGE,
 * and an AUTH whose fields a test may change after the client proved them. */
typedef struct conn {
    kvs_remote_auth_node node;
    char tenant[65];
    uint8_t nonce[32], challenge[32], node_proof[32], proof[32];
    kvs_wire_msg auth;
} conn;

static void conn_hello(conn *c, const char *tenant) {
    memset(c, 0, sizeof *c);
    snprintf(c->tenant, sizeof c->tenant, "%s", tenant);
    ck_assert_int_eq(kvs_remote_random(c->nonce, sizeof c->nonce), KVS_OK);
    kvs_wire_msg hello, back;
    kvs_wire_msg_init(&hello, KVS_WIRE_HELLO, 1);
    hello.tenant = tenant;
    hello.tenant_len = (uint32_t)strlen(tenant);
    hello.nonce = c->nonce;
    uint8_t *copy = kvs_test_wire_round_trip(&hello, &back);
    const uint8_t *challenge = NULL, *proof = NULL;
    char error[200];
    kvs_remote_psk master;
    psk_of(&master, 0);
    ck_assert_int_eq(kvs_remote_auth_node_hello(&c->node, &master, &back, &challenge, &proof, error,
                                                sizeof error),
                     KVS_OK);
    free(copy);
    memcpy(c->challenge, challenge, 32);
    memcpy(c->node_proof, proof, 32);
    kvs_wire_msg_init(&c->auth, KVS_WIRE_AUTH, 2);
    c->auth.worker_addr = test_addr;
    c->auth.worker_addr_len = sizeof test_addr;
    c->auth.proof = c->proof;
}

static kvs_remote_transcript conn_transcript(const conn *c) {
    return (kvs_remote_transcript){.tenant = c->tenant,
                                   .tenant_len = strlen(c->tenant),
                                   .nonce = c->nonce,
                                   .challenge = c->challenge,
                                   .node_proof = c->node_proof,
                                   .client_worker_addr = c->auth.worker_addr,
                                   .client_worker_addr_len = c->auth.worker_addr_len,
                                   .host_id = c->auth.host_id,
                                   .host_id_len = c->auth.host_id_len,
                                   .pid = c->auth.pid};
}

/* The client's proof of the AUTH as it stands, with key. */
static void conn_prove(conn *c, const kvs_remote_psk *key) {
    kvs_remote_transcript t = conn_transcript(c);
    ck_assert_int_eq(kvs_remote_proof(key, KVS_REMOTE_PROOF_CLIENT, &t, c->proof), KVS_OK);
}

START_TEST(tenant_keys_and_proofs_match_known_answers) {
    /* computed independently with Python's hmac and hashlib: HMAC-SHA256 over length-prefixed
     * parts (4-byte big-endian lengths), the label first */
    kvs_remote_psk key = tenant_key("tenant-a");
    static const uint8_t want_key[32] = {0x0e, 0x74, 0xe8, 0xa9, 0xc7, 0x74, 0x80, 0x9e,
                                         0xec, 0x20, 0x92, 0xb3, 0x2d, 0x66, 0x08, 0x32,
                                         0x16, 0x1b, 0xf7, 0xc7, 0x84, 0xc2, 0xe5, 0xe3,
                                         0x42, 0x8b, 0xb2, 0xba, 0x44, 0x25, 0x1b, 0xec};
    ck_assert_uint_eq(key.len, 32);
    ck_assert_int_eq(memcmp(key.bytes, want_key, 32), 0);
    uint8_t nonce[32], challenge[32], proof[32];
    for (int i = 0; i < 32; i++) {
        challenge[i] = (uint8_t)(0xa0 + i % 16);
        nonce[i] = (uint8_t)(7 * i);
    }
    kvs_remote_transcript t = {
        .tenant = "tenant-a", .tenant_len = 8, .nonce = nonce, .challenge = challenge};
    ck_assert_int_eq(kvs_remote_proof(&key, KVS_REMOTE_PROOF_NODE, &t, proof), KVS_OK);
    static const uint8_t want_node[32] = {0x38, 0x04, 0x10, 0x2b, 0x68, 0x2c, 0xa9, 0x4e,
                                          0x93, 0x50, 0x30, 0x3d, 0x0b, 0xda, 0x1b, 0x3d,
                                          0xe2, 0xb4, 0x71, 0x4b, 0x2f, 0x26, 0xf3, 0x4a,
                                          0xae, 0x49, 0xa3, 0xd1, 0x26, 0x22, 0x78, 0x72};
    ck_assert_int_eq(memcmp(proof, want_node, 32), 0);
}
END_TEST

START_TEST(the_tenant_s_own_key_is_accepted_and_the_node_proves_everything) {
    kvs_remote_psk key = tenant_key("tenant-a");
    conn c;
    conn_hello(&c, "tenant-a");
    kvs_remote_transcript t = conn_transcript(&c);
    ck_assert_int_eq(kvs_remote_proof_check(&key, KVS_REMOTE_PROOF_NODE, &t, c.node_proof, 32),
                     KVS_OK);
    conn_prove(&c, &key);
    char error[200] = "";
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, error, sizeof error), KVS_OK);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 1);
    /* AUTH_OK: the node's proof covers its fields; the client checks it before using any */
    uint8_t token[16] = {9}, naddr[10] = {0x01, 7};
    kvs_wire_msg ok;
    kvs_wire_msg_init(&ok, KVS_WIRE_AUTH_OK, 2);
    ok.transports = "tcp";
    ok.transports_len = 3;
    ok.worker_addr = naddr;
    ok.worker_addr_len = sizeof naddr;
    ok.session_token = token;
    uint8_t ok_proof[32];
    ck_assert_int_eq(kvs_remote_auth_node_ok_proof(&c.node, &c.auth, &ok, ok_proof), KVS_OK);
    kvs_remote_transcript_ok(&t, c.proof, &ok);
    ck_assert_int_eq(kvs_remote_proof_check(&key, KVS_REMOTE_PROOF_OK, &t, ok_proof, 32), KVS_OK);
    /* a man in the middle changes any of them: the check fails */
    token[3] ^= 1;
    ck_assert_int_eq(kvs_remote_proof_check(&key, KVS_REMOTE_PROOF_OK, &t, ok_proof, 32),
                     KVS_EINVAL);
    token[3] ^= 1;
    naddr[5] ^= 1;
    ck_assert_int_eq(kvs_remote_proof_check(&key, KVS_REMOTE_PROOF_OK, &t, ok_proof, 32),
                     KVS_EINVAL);
    naddr[5] ^= 1;
    t.transports = "rc_mlx5";
    t.transports_len = 7;
    ck_assert_int_eq(kvs_remote_proof_check(&key, KVS_REMOTE_PROOF_OK, &t, ok_proof, 32),
                     KVS_EINVAL);
    t.transports = "tcp";
    t.transports_len = 3;
    t.shared_tier = "kvs-other";
    t.shared_tier_len = 9;
    t.shared_tier_capacity = 1;
    t.shared_tier_max_object = 1;
    ck_assert_int_eq(kvs_remote_proof_check(&key, KVS_REMOTE_PROOF_OK, &t, ok_proof, 32),
                     KVS_EINVAL);
}
END_TEST

START_TEST(the_master_key_and_other_keys_are_refused) {
    kvs_remote_psk master, other;
    psk_of(&master, 0);
    psk_of(&other, 1); /* one bit off */
    const kvs_remote_psk *keys[] = {&master, &other};
    for (int k = 0; k < 2; k++) {
        conn c;
        conn_hello(&c, "tenant-a");
        kvs_remote_transcript t = conn_transcript(&c);
        /* the client sees the node does not know its key before it says anything itself */
        ck_assert_int_eq(
            kvs_remote_proof_check(keys[k], KVS_REMOTE_PROOF_NODE, &t, c.node_proof, 32),
            KVS_EINVAL);
        conn_prove(&c, keys[k]);
        char error[200] = "";
        ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, error, sizeof error),
                         KVS_EINVAL);
        ck_assert_ptr_nonnull(strstr(error, "tenant \"tenant-a\" failed the handshake"));
        ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    }
}
END_TEST

/* A client holding tenant-b's key says it is tenant-a (or proves tenant-a's transcript with its own
 * key): refused. A tenant's key is its identity. */
START_TEST(a_tenant_s_key_cannot_act_as_another_tenant) {
    kvs_remote_psk b = tenant_key("tenant-b");
    conn c;
    conn_hello(&c, "tenant-a");
    conn_prove(&c, &b);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, NULL, 0), KVS_EINVAL);
    /* nor by proving tenant-b's name over tenant-a's HELLO */
    conn_hello(&c, "tenant-a");
    snprintf(c.tenant, sizeof c.tenant, "tenant-b");
    conn_prove(&c, &b);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, NULL, 0), KVS_EINVAL);
}
END_TEST

/* Each field of AUTH changed after the client proved it (a man in the middle): refused. */
START_TEST(an_auth_changed_on_the_way_is_refused) {
    kvs_remote_psk key = tenant_key("tenant-a");
    static const uint8_t other_addr[12] = {0x01, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13};
    static const uint8_t host[32] = {5};
    for (int field = 0; field < 4; field++) {
        conn c;
        conn_hello(&c, "tenant-a");
        c.auth.host_id = host;
        c.auth.host_id_len = sizeof host;
        c.auth.pid = 1234;
        conn_prove(&c, &key);
        if (field == 0) c.auth.worker_addr = other_addr;
        if (field == 1) c.auth.worker_addr_len--;
        if (field == 2) c.auth.pid = 1235;
        if (field == 3) c.auth.host_id_len = 0;
        ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, NULL, 0), KVS_EINVAL);
    }
}
END_TEST

START_TEST(a_missing_or_zero_proof_is_refused) {
    conn c;
    conn_hello(&c, "t");
    c.auth.proof = NULL;
    char error[200] = "";
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, error, sizeof error), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(error, "sent no proof"));
    conn_hello(&c, "t");
    memset(c.proof, 0, sizeof c.proof);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, NULL, 0), KVS_EINVAL);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
}
END_TEST

START_TEST(a_replayed_proof_fails_on_a_new_connection) {
    kvs_remote_psk key = tenant_key("tenant-a");
    conn first;
    conn_hello(&first, "tenant-a");
    conn_prove(&first, &key);
    ck_assert_int_eq(kvs_remote_auth_node_check(&first.node, &first.auth, NULL, 0), KVS_OK);
    /* the attacker replays the same HELLO (same nonce) and the recorded AUTH on a new connection */
    conn second;
    memset(&second, 0, sizeof second);
    kvs_wire_msg hello;
    kvs_wire_msg_init(&hello, KVS_WIRE_HELLO, 1);
    hello.tenant = "tenant-a";
    hello.tenant_len = 8;
    hello.nonce = first.nonce;
    const uint8_t *challenge = NULL, *proof = NULL;
    kvs_remote_psk master;
    psk_of(&master, 0);
    ck_assert_int_eq(
        kvs_remote_auth_node_hello(&second.node, &master, &hello, &challenge, &proof, NULL, 0),
        KVS_OK);
    ck_assert_int_ne(memcmp(challenge, first.challenge, 32), 0); /* fresh */
    ck_assert_int_eq(kvs_remote_auth_node_check(&second.node, &first.auth, NULL, 0), KVS_EINVAL);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&second.node), 0);
}
END_TEST

START_TEST(a_challenge_answers_one_auth_only) {
    kvs_remote_psk key = tenant_key("tenant-a");
    conn c;
    conn_hello(&c, "tenant-a");
    c.proof[0] = 1;
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, NULL, 0), KVS_EINVAL);
    /* the right proof after a wrong guess is too late: no guessing loop on one challenge */
    conn_prove(&c, &key);
    ck_assert_int_eq(kvs_remote_auth_node_check(&c.node, &c.auth, NULL, 0), KVS_ESTATE);
    ck_assert_int_eq(kvs_remote_auth_node_ok(&c.node), 0);
    /* and an AUTH before any HELLO is refused */
    kvs_remote_auth_node fresh;
    memset(&fresh, 0, sizeof fresh);
    ck_assert_int_eq(kvs_remote_auth_node_check(&fresh, &c.auth, NULL, 0), KVS_ESTATE);
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
    tcase_add_test(auth, tenant_keys_and_proofs_match_known_answers);
    tcase_add_test(auth, the_tenant_s_own_key_is_accepted_and_the_node_proves_everything);
    tcase_add_test(auth, the_master_key_and_other_keys_are_refused);
    tcase_add_test(auth, a_tenant_s_key_cannot_act_as_another_tenant);
    tcase_add_test(auth, an_auth_changed_on_the_way_is_refused);
    tcase_add_test(auth, a_missing_or_zero_proof_is_refused);
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
