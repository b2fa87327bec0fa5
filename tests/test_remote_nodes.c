/* test_remote_nodes.c - the remote tier's connections to its nodes (backends/ucx/ucx_remote_nodes.c)
 * against fake nodes: plain TCP servers at a node's address that send garbage, nothing, a huge
 * length, a truncated frame, or a challenge that does not prove the key, beside a real kvstrata-node
 * (a child process on 127.0.0.1) that keeps serving; and a silent node that is retried while requests
 * to the real one go on. */
#include <stdio.h>
#include <stdlib.h>

#ifndef KVS_HAVE_UCX
int main(void) {
    printf("test_remote_nodes: skipped, this build has no UCX\n");
    return 77;
}
#else

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/ucx/control.h"
#include "backends/ucx/remote.h"
#include "tests/support/node_proc.h"
#include "tests/support/objects.h"
#include "tests/support/remote_tier.h"
#include "tests/support/test_support.h"
#include "tests/support/wait.h"

#define MIB           (1024u * 1024u)
#define STAGING_BYTES (8u * MIB)

/* ---- daemons ------------------------------------------------------------------------------------ */

static char key_dir[512], key_path[600], wrong_key_path[600];
static kvs_test_node nodes[1];
static uint8_t *staging;

static void nodes_setup(void) {
    ck_assert_int_eq(setenv("UCX_TLS", "tcp,sm,self", 0), 0);
    ck_assert(signal(SIGPIPE, SIG_IGN) != SIG_ERR);
    kvs_test_remote_keys(key_dir, sizeof key_dir, key_path, sizeof key_path, wrong_key_path,
                         sizeof wrong_key_path);
    for (int i = 0; i < 1; i++) kvs_test_remote_node_start(&nodes[i], key_path);
    staging = aligned_alloc(4096, STAGING_BYTES);
    ck_assert_ptr_nonnull(staging);
}

/* The nodes' exit statuses do not matter here (a test may have killed one). */
static void nodes_teardown(void) {
    for (int i = 0; i < 1; i++) (void)kvs_test_node_stop(&nodes[i]);
    free(staging);
    staging = NULL;
    kvs_test_rmtree(key_dir);
}

/* ---- a fake node: a plain TCP server at a node's address ---------------------------------------- */

enum { FAKE_GARBAGE, FAKE_SILENT, FAKE_HUGE_LENGTH, FAKE_TRUNCATED, FAKE_CHALLENGE };

typedef struct fake_node {
    int fd;
    int mode;
    char id[64];
    volatile int stop;
    volatile int accepted;
    volatile int challenged; /* FAKE_CHALLENGE: well-formed challenges sent */
    volatile size_t
        after_challenge; /* FAKE_CHALLENGE: bytes the client sent after one (its AUTH) */
    pthread_t thread;
} fake_node;

/* FAKE_CHALLENGE: read the client's HELLO and answer with a well-formed CHALLENGE whose node proof is
 * made up (the peer does not hold the key); then count what the client still sends until it closes. */
static void fake_challenge(fake_node *f, int c) {
    static kvs_control_reader rd;
    static kvs_wire_entry entries[4];
    uint8_t frame[KVS_CONTROL_MAX_FRAME_BYTES + KVS_CONTROL_PREFIX_BYTES], challenge[32], proof[32];
    char err[160];
    size_t len = 0;
    memset(&rd, 0, sizeof rd);
    struct pollfd p = {.fd = c, .events = POLLIN};
    kvs_status st = KVS_EAGAIN;
    kvs_chan ch;
    kvs_chan_plain(&ch, c); /* not closed here: the caller closes c */
    if (fcntl(c, F_SETFL, O_NONBLOCK) != 0) return;
    for (int tries = 0; st == KVS_EAGAIN && tries < 40 && poll(&p, 1, 50) >= 0; tries++)
        st = kvs_control_read(&rd, &ch, &len, err, sizeof err);
    kvs_wire_msg hello, m;
    if (st != KVS_OK || kvs_wire_decode(rd.frame, len, entries, 4, &hello, NULL) != KVS_OK) return;
    kvs_test_fill(challenge, sizeof challenge, 5);
    kvs_test_fill(proof, sizeof proof, 6);
    kvs_wire_msg_init(&m, KVS_WIRE_CHALLENGE, hello.request_id);
    m.challenge = challenge;
    m.proof = proof;
    if (kvs_control_encode(&m, frame, sizeof frame, &len, err, sizeof err) != KVS_OK ||
        send(c, frame, len, MSG_NOSIGNAL) != (ssize_t)len)
        return;
    f->challenged++;
    for (int tries = 0; tries < 40; tries++) { /* up to 2 s: the client closes at once */
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t k = recv(c, frame, sizeof frame, 0);
        if (k <= 0) break;
        f->after_challenge += (size_t)k;
    }
}

/* Accept each connection and answer the client's HELLO with the mode's bytes (or nothing), keeping
 * the connection open until the client gives up on it. */
static void *fake_main(void *arg) {
    fake_node *f = arg;
    int open_fds[64], n_open = 0;
    uint8_t out[4 + 4096];
    while (!f->stop) {
        struct pollfd p = {.fd = f->fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(f->fd, NULL, NULL);
        if (c < 0) continue;
        f->accepted++;
        size_t len = 0;
        if (f->mode == FAKE_GARBAGE) {
            memset(out, 0, 64); /* the 64 zero bytes a peer sent, then noise */
            kvs_test_fill(out + 64, 1024, (uint32_t)f->accepted);
            len = 64 + 1024;
        } else if (f->mode == FAKE_HUGE_LENGTH) {
            memset(out, 0xff, sizeof out);
            len = sizeof out;
        } else if (f->mode == FAKE_TRUNCATED) {
            memset(out, 0x93, 40);
            out[0] = 0, out[1] = 0, out[2] = 0, out[3] = 200; /* announces 200 bytes, sends 36 */
            len = 40;
        }
        if (len) (void)send(c, out, len, MSG_NOSIGNAL);
        if (f->mode == FAKE_CHALLENGE) fake_challenge(f, c);
        if (n_open < 64)
            open_fds[n_open++] = c;
        else
            ck_assert_int_eq(close(c), 0);
    }
    for (int i = 0; i < n_open; i++) ck_assert_int_eq(close(open_fds[i]), 0);
    return NULL;
}

static void fake_start(fake_node *f, int mode) {
    memset(f, 0, sizeof *f);
    f->mode = mode;
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(f->fd, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sin;
    ck_assert_int_eq(bind(f->fd, (struct sockaddr *)&sin, sizeof sin), 0);
    ck_assert_int_eq(listen(f->fd, 16), 0);
    ck_assert_int_eq(getsockname(f->fd, (struct sockaddr *)&sin, &sl), 0);
    snprintf(f->id, sizeof f->id, "127.0.0.1:%u", ntohs(sin.sin_port));
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_stop(fake_node *f) {
    f->stop = 1;
    ck_assert_int_eq(pthread_join(f->thread, NULL), 0);
    ck_assert_int_eq(close(f->fd), 0);
}

static int retried(void *fake) {
    return ((fake_node *)fake)->accepted >= 2;
}

/* A fake node beside a real one, replicas 2: create succeeds with the fake marked down, every key
 * is served by the real node, and the tier keeps trying the fake with backoff. */
static void fake_node_beside_a_real_one(int mode) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    fake_node f;
    fake_start(&f, mode);
    kvs_backend_option opts[] = {{"node", f.id},
                                 {"node", nodes[0].id},
                                 {"psk_file", key_path},
                                 {"tenant", "test-tenant"},
                                 {"replicas", "2"},
                                 {"timeout_ms", "500"},
                                 {"connect_backoff_ms", "50"}};
    char err[512];
    void *s = NULL;
    kvs_status st = kvs_test_remote_create(opts, 7, err, sizeof err, &s, staging, STAGING_BYTES);
    ck_assert_msg(st == KVS_OK, "mode %d: create: %d %s", mode, st, err);
    ck_assert_msg(strstr(ops->last_error(s), f.id) != NULL, "mode %d: last error: %s", mode,
                  ops->last_error(s));
    printf("fake node (mode %d): %s\n", mode, ops->last_error(s));
    uint8_t buf[8192];
    for (uint32_t i = 0; i < 8; i++) {
        kvs_key k = kvs_test_remote_key(700 + i);
        kvs_test_fill(buf, sizeof buf, 700 + i);
        ck_assert_int_eq(ops->put(s, &k, buf, sizeof buf), KVS_OK);
    }
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    for (uint32_t i = 0; i < 8; i++) {
        kvs_key k = kvs_test_remote_key(700 + i);
        uint64_t got = 0;
        memset(staging, 0, sizeof buf);
        st = ops->get(s, &k, staging, sizeof buf, &got);
        ck_assert_msg(st == KVS_OK, "mode %d, key %u: %d (%s)", mode, i, st, ops->last_error(s));
        kvs_test_fill(buf, sizeof buf, 700 + i);
        ck_assert_int_eq(memcmp(staging, buf, sizeof buf), 0);
    }
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 1);
    ck_assert_uint_eq(stats.auth_refusals, 0); /* garbage is not a refusal: the fake is only down */
    ck_assert_msg(kvs_test_wait_for(retried, &f, 5000),
                  "mode %d: the tier did not try the fake node again", mode);
    ops->destroy(s);
    fake_stop(&f);
}

START_TEST(a_fake_node_sending_garbage_is_down_and_the_real_node_serves) {
    fake_node_beside_a_real_one(FAKE_GARBAGE);
}
END_TEST

START_TEST(a_fake_node_saying_nothing_is_down_and_the_real_node_serves) {
    fake_node_beside_a_real_one(FAKE_SILENT);
}
END_TEST

START_TEST(a_fake_node_announcing_a_huge_length_is_down_and_the_real_node_serves) {
    fake_node_beside_a_real_one(FAKE_HUGE_LENGTH);
}
END_TEST

START_TEST(a_fake_node_sending_a_truncated_frame_is_down_and_the_real_node_serves) {
    fake_node_beside_a_real_one(FAKE_TRUNCATED);
}
END_TEST

/* A peer at a node's address that speaks the protocol but does not hold the key: its challenge does
 * not prove the key, so the client refuses it before sending anything of its own - no proof to replay,
 * no worker address to reach its UCX with - and serves from the real node. */
START_TEST(a_fake_node_that_cannot_prove_the_key_gets_neither_our_proof_nor_our_address) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    fake_node f;
    fake_start(&f, FAKE_CHALLENGE);
    kvs_backend_option opts[] = {{"node", nodes[0].id},  {"node", f.id},
                                 {"psk_file", key_path}, {"tenant", "test-tenant"},
                                 {"replicas", "2"},      {"timeout_ms", "1000"}};
    char err[512];
    void *s = NULL;
    kvs_status st = kvs_test_remote_create(opts, 6, err, sizeof err, &s, staging, STAGING_BYTES);
    /* a peer that refuses to prove the key at create is a refused handshake, as a wrong key is */
    ck_assert_int_ne(st, KVS_OK);
    ck_assert_msg(strstr(err, "does not prove it holds the tenant's key") != NULL, "create: %s",
                  err);
    ck_assert_int_ge(f.challenged, 1);
    ck_assert_msg(f.after_challenge == 0,
                  "the client sent %zu bytes (its AUTH) to a peer that did not prove the key",
                  f.after_challenge);
    fake_stop(&f);
    (void)ops;
}
END_TEST

/* The tier keeps retrying a node that accepts connections and never answers; each handshake waits up to
 * timeout_ms for it. Those waits must not hold up requests to the real node: every get of 2.5 s of
 * them is answered (a get that queued behind a blocked handshake ran out of its own timeout_ms). */
START_TEST(a_silent_node_being_retried_does_not_hold_up_requests_to_the_others) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    fake_node f;
    fake_start(&f, FAKE_SILENT);
    kvs_backend_option opts[] = {{"node", f.id},
                                 {"node", nodes[0].id},
                                 {"psk_file", key_path},
                                 {"tenant", "test-tenant"},
                                 {"replicas", "2"},
                                 {"timeout_ms", "1000"},
                                 {"connect_backoff_ms", "20"}};
    char err[512];
    void *s = NULL;
    kvs_status st = kvs_test_remote_create(opts, 7, err, sizeof err, &s, staging, STAGING_BYTES);
    ck_assert_msg(st == KVS_OK, "create: %d %s", st, err);
    uint8_t buf[8192];
    for (uint32_t i = 0; i < 8; i++) {
        kvs_key k = kvs_test_remote_key(900 + i);
        kvs_test_fill(buf, sizeof buf, 900 + i);
        ck_assert_int_eq(ops->put(s, &k, buf, sizeof buf), KVS_OK);
    }
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    unsigned gets = 0;
    for (double until = kvs_test_now_ms() + 2500; kvs_test_now_ms() < until; gets++) {
        kvs_key k = kvs_test_remote_key(900 + gets % 8);
        uint64_t got = 0;
        st = ops->get(s, &k, staging, sizeof buf, &got);
        ck_assert_msg(st == KVS_OK, "get %u: %d (%s)", gets, st, ops->last_error(s));
        kvs_test_pause_ms(5); /* pacing: gets spread over the retries */
    }
    printf("silent node beside a real one: %u gets answered while it was retried %d times\n", gets,
           f.accepted);
    ck_assert_int_ge(f.accepted, 2); /* it was retried meanwhile */
    ops->destroy(s);
    fake_stop(&f);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("remote_nodes");
    TCase *fake = tcase_create("fake_nodes");
    tcase_add_checked_fixture(fake, nodes_setup, nodes_teardown);
    tcase_set_timeout(fake, 60);
    tcase_add_test(fake, a_fake_node_sending_garbage_is_down_and_the_real_node_serves);
    tcase_add_test(fake, a_fake_node_saying_nothing_is_down_and_the_real_node_serves);
    tcase_add_test(fake, a_fake_node_announcing_a_huge_length_is_down_and_the_real_node_serves);
    tcase_add_test(fake, a_fake_node_sending_a_truncated_frame_is_down_and_the_real_node_serves);
    tcase_add_test(fake,
                   a_fake_node_that_cannot_prove_the_key_gets_neither_our_proof_nor_our_address);
    suite_add_tcase(suite, fake);
    /* it measures request latency while a silent node is retried: run by test_remote_nodes_timing
     * (label timing) */
    TCase *timing = tcase_create("fake_nodes_timing");
    tcase_set_tags(timing, "timing");
    tcase_add_checked_fixture(timing, nodes_setup, nodes_teardown);
    tcase_set_timeout(timing, 60);
    tcase_add_test(timing, a_silent_node_being_retried_does_not_hold_up_requests_to_the_others);
    suite_add_tcase(suite, timing);
    SRunner *runner = srunner_create(suite);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
