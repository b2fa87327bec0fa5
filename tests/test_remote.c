/* test_remote.c - the remote tier client (backends/ucx/remote.h) through its backend ops: option
 * errors, then two kvstrata-node daemons as child processes on 127.0.0.1: round trips, get_many
 * across nodes, queued puts, replication with a killed node, hung nodes, a wrong key, an idle progress
 * thread, payloads over shared memory when turned on (tcp otherwise), and clients killed in the middle
 * of gets. Fake nodes at a node's address are in test_remote_nodes.c. */
#include <stdio.h>
#include <stdlib.h>

#ifndef KVS_HAVE_UCX
int main(void) {
    printf("test_remote: skipped, this build has no UCX\n");
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
#include <sys/mman.h>
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

/* ---- options ------------------------------------------------------------------------------------ */

static void expect_refused(const kvs_backend_option *opts, uint64_t n, const char *want) {
    char err[512];
    void *state = (void *)1;
    ck_assert_int_eq(kvs_test_remote_create(opts, n, err, sizeof err, &state, NULL, 0),
                     KVS_ECONFIG);
    ck_assert_ptr_null(state);
    ck_assert_msg(strstr(err, want) != NULL, "error \"%s\" lacks \"%s\"", err, want);
    ck_assert_msg(strstr(err, "remote tier \"far\"") != NULL, "error \"%s\" names no tier", err);
}

START_TEST(bad_options_are_refused_with_a_sentence) {
    kvs_backend_option unknown[] = {
        {"node", "127.0.0.1:1"}, {"psk_file", "/x"}, {"tenant", "t"}, {"colour", "red"}};
    expect_refused(
        unknown, 4,
        "valid options: node, psk_file, tenant, replicas, timeout_ms, connect_backoff_ms");
    kvs_backend_option no_node[] = {{"psk_file", "/x"}, {"tenant", "t"}};
    expect_refused(no_node, 2, "at least one node");
    kvs_backend_option bad_port[] = {
        {"node", "127.0.0.1:99999"}, {"psk_file", "/x"}, {"tenant", "t"}};
    expect_refused(bad_port, 3, "not HOST:PORT");
    kvs_backend_option no_psk[] = {{"node", "a:1"}, {"tenant", "t"}};
    expect_refused(no_psk, 2, "psk_file");
    kvs_backend_option no_tenant[] = {{"node", "a:1"}, {"psk_file", "/x"}};
    expect_refused(no_tenant, 2, "needs option tenant");
    kvs_backend_option bad_tenant[] = {{"node", "a:1"}, {"psk_file", "/x"}, {"tenant", "a b"}};
    expect_refused(bad_tenant, 3, "tenant \"a b\"");
    kvs_backend_option too_many[] = {
        {"node", "a:1"}, {"psk_file", "/x"}, {"tenant", "t"}, {"replicas", "2"}};
    expect_refused(too_many, 4, "replicas 2 needs at least 2 nodes; 1 given");
    kvs_backend_option twice[] = {
        {"node", "a:1"}, {"node", "a:1"}, {"psk_file", "/x"}, {"tenant", "t"}};
    expect_refused(twice, 4, "listed twice");
    kvs_backend_option bad_timeout[] = {
        {"node", "a:1"}, {"psk_file", "/x"}, {"tenant", "t"}, {"timeout_ms", "0"}};
    expect_refused(bad_timeout, 4, "timeout_ms \"0\"");
}
END_TEST

START_TEST(a_missing_key_file_fails_create_naming_it) {
    char err[512];
    void *state = NULL;
    kvs_backend_option opts[] = {
        {"node", "127.0.0.1:1"}, {"psk_file", "/nonexistent/kvs.key"}, {"tenant", "t"}};
    kvs_status st = kvs_test_remote_create(opts, 3, err, sizeof err, &state, NULL, 0);
    ck_assert_int_ne(st, KVS_OK);
    ck_assert_ptr_null(state);
    ck_assert_msg(strstr(err, "/nonexistent/kvs.key") != NULL, "error: %s", err);
}
END_TEST

/* ---- daemons ------------------------------------------------------------------------------------ */

static char key_dir[512], key_path[600], wrong_key_path[600];
static kvs_test_node nodes[2];
static uint8_t *staging;

static void nodes_setup(void) {
    ck_assert_int_eq(setenv("UCX_TLS", "tcp,sm,self", 0), 0);
    ck_assert(signal(SIGPIPE, SIG_IGN) != SIG_ERR);
    kvs_test_remote_keys(key_dir, sizeof key_dir, key_path, sizeof key_path, wrong_key_path,
                         sizeof wrong_key_path);
    for (int i = 0; i < 2; i++) kvs_test_remote_node_start(&nodes[i], key_path);
    staging = aligned_alloc(4096, STAGING_BYTES);
    ck_assert_ptr_nonnull(staging);
}

/* The same two nodes with --shared-memory-payloads on: payloads to this process over UCX shared
 * memory (experimental). */
static void shm_nodes_setup(void) {
    ck_assert_int_eq(setenv("UCX_TLS", "tcp,sm,self", 0), 0);
    ck_assert(signal(SIGPIPE, SIG_IGN) != SIG_ERR);
    kvs_test_remote_keys(key_dir, sizeof key_dir, key_path, sizeof key_path, wrong_key_path,
                         sizeof wrong_key_path);
    for (int i = 0; i < 2; i++)
        kvs_test_remote_node_start_flag(&nodes[i], key_path, KVS_TEST_REMOTE_NODE_YAML,
                                        "--shared-memory-payloads", "on");
    staging = aligned_alloc(4096, STAGING_BYTES);
    ck_assert_ptr_nonnull(staging);
}

/* The nodes' exit statuses do not matter here (a test may have killed one). */
static void nodes_teardown(void) {
    for (int i = 0; i < 2; i++) (void)kvs_test_node_stop(&nodes[i]);
    free(staging);
    staging = NULL;
    kvs_test_rmtree(key_dir);
}

static const char *payloads = "auto"; /* the payloads option of open_tier */

static void *open_tier(const char *replicas, const char *psk, const char *timeout_ms, char *err,
                       size_t err_len, kvs_status *st_out) {
    kvs_backend_option opts[] = {
        {"node", nodes[0].id},        {"node", nodes[1].id},  {"psk_file", psk},
        {"tenant", "test-tenant"},    {"replicas", replicas}, {"timeout_ms", timeout_ms},
        {"connect_backoff_ms", "50"}, {"payloads", payloads}};
    void *state = NULL;
    *st_out = kvs_test_remote_create(opts, 8, err, err_len, &state, staging, STAGING_BYTES);
    payloads = "auto";
    return state;
}

static void *open_ok(const char *replicas, const char *timeout_ms) {
    char err[512];
    kvs_status st;
    void *state = open_tier(replicas, key_path, timeout_ms, err, sizeof err, &st);
    ck_assert_msg(st == KVS_OK, "create: %d %s", st, err);
    return state;
}

/* The object of key i: sizes alternate between inline (small) and RMA (large) puts. */
static size_t object_len(uint32_t i) {
    return i % 2 ? 1000 + i : 200000 + 4096 * i;
}

/* Loop 0: payloads auto, which over tcp (these nodes) moves objects on the session's TCP stream;
 * loop 1: payloads rma, the node reading and writing the tier's registered memory; loop 2: payloads
 * messages, UCX messages the receiver places. */
START_TEST(put_then_get_returns_the_same_bytes) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    static const char *const modes[3] = {"auto", "rma", "messages"};
    int by_rma = _i == 1, by_messages = _i == 2, by_stream = _i == 0;
    payloads = modes[_i];
    void *s = open_ok("1", "2000");
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 2);
    ck_assert_uint_eq(stats.nodes_messages, by_messages ? 2 : 0);
    ck_assert_uint_eq(stats.nodes_stream, by_stream ? 2 : 0);
    for (uint32_t i = 0; i < 4; i++) {
        kvs_key k = kvs_test_remote_key(i);
        size_t len = object_len(i);
        uint8_t *src =
            i < 2 ? staging + i * 1024 * 1024 : malloc(len); /* from the pool and from outside */
        kvs_test_fill(src, len, i);
        ck_assert_int_eq(ops->put(s, &k, src, len), KVS_OK);
        if (i >= 2) free(src);
    }
    for (uint32_t i = 0; i < 4; i++) {
        kvs_key k = kvs_test_remote_key(i);
        size_t len = object_len(i);
        uint8_t *want = malloc(len);
        kvs_test_fill(want, len, i);
        uint8_t *dst =
            i % 2 ? staging + 4 * MIB : malloc(2 * MIB); /* RMA into the pool, or bounce */
        memset(dst, 0, len);
        uint64_t got = 0;
        ck_assert_int_eq(ops->get(s, &k, dst, 2 * MIB, &got), KVS_OK);
        ck_assert_uint_eq(got, len);
        size_t first = 0;
        while (first < len && dst[first] == want[first]) first++;
        ck_assert_msg(first == len, "object %u of %zu bytes differs from byte %zu", i, len, first);
        if (i % 2 == 0) free(dst);
        free(want);
    }
    uint64_t n = 0;
    kvs_key probe[3] = {kvs_test_remote_key(0), kvs_test_remote_key(1), kvs_test_remote_key(77)};
    ck_assert_int_eq(ops->contains(s, probe, 3, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);
    uint64_t objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(s, &objects, &bytes), KVS_OK);
    ck_assert_uint_eq(objects, 4);
    kvs_key k0 = kvs_test_remote_key(0);
    ck_assert_int_eq(ops->remove(s, &k0), KVS_OK);
    ck_assert_int_eq(ops->contains(s, &k0, 1, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    uint64_t got = 0;
    uint8_t small[64];
    ck_assert_int_eq(ops->get(s, &k0, small, sizeof small, &got), KVS_ENOTFOUND);
    kvs_key k1 = kvs_test_remote_key(1);
    ck_assert_int_eq(ops->get(s, &k1, small, sizeof small, &got), KVS_EOVERFLOW);
    ck_assert_uint_eq(got, object_len(1));
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    if (by_rma) {
        ck_assert_uint_gt(stats.rma_gets, 0);
        ck_assert_uint_gt(stats.bounce_gets, 0);
        ck_assert_uint_eq(stats.message_gets + stats.stream_gets, 0);
    } else { /* straight into the caller's buffer, in the pool or not */
        ck_assert_uint_eq(by_messages ? stats.message_gets : stats.stream_gets, 4);
        ck_assert_uint_eq(by_messages ? stats.stream_gets : stats.message_gets, 0);
        ck_assert_uint_eq(stats.rma_gets + stats.bounce_gets, 0);
    }
    ck_assert_uint_eq(stats.puts_stored, 4);
    ck_assert_uint_eq(stats.late_payloads, 0);
    ops->destroy(s);
}
END_TEST

/* PUTs on the nodes' streams are answered later (payloads: stream), yet a lookup right after them,
 * which goes over UCX, sees every one, and a flush leaves every copy counted as stored. */
START_TEST(a_lookup_right_after_puts_on_the_stream_sees_them_all) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    void *s = open_ok("1", "2000");
    enum { N = 48 };
    static kvs_key keys[N];
    uint8_t *src = malloc(256 * 1024);
    ck_assert_ptr_nonnull(src);
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = kvs_test_remote_key(500 + i);
        kvs_test_fill(src, 256 * 1024, 500 + i);
        ck_assert_int_eq(ops->put(s, &keys[i], src, 256 * 1024), KVS_OK);
    }
    uint64_t n = 0;
    ck_assert_int_eq(ops->contains(s, keys, N, &n), KVS_OK);
    ck_assert_uint_eq(n, N);
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_stream, 2);
    ck_assert_uint_eq(stats.puts_stored, N);
    ck_assert_uint_eq(stats.puts_dropped + stats.puts_refused, 0);
    free(src);
    ops->destroy(s);
}
END_TEST

START_TEST(get_many_reads_keys_from_both_nodes) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    void *s = open_ok("1", "2000");
    enum { N = 40 };
    kvs_key keys[N];
    void *dsts[N];
    uint64_t caps[N], lens[N];
    kvs_status sts[N];
    uint8_t src[3000];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = kvs_test_remote_key(100 + i);
        kvs_test_fill(src, sizeof src, 100 + i);
        ck_assert_int_eq(ops->put(s, &keys[i], src, 1500 + i), KVS_OK);
        dsts[i] = i % 3 ? (void *)(staging + i * 4096) : malloc(4096);
        caps[i] = 4096;
    }
    kvs_key missing = kvs_test_remote_key(999);
    ck_assert_int_eq(ops->get_many(s, keys, dsts, caps, N, lens, sts), KVS_OK);
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_msg(sts[i] == KVS_OK, "object %u: status %d (%s)", i, sts[i], ops->last_error(s));
        ck_assert_uint_eq(lens[i], 1500 + i);
        kvs_test_fill(src, sizeof src, 100 + i);
        ck_assert_msg(memcmp(dsts[i], src, 1500 + i) == 0, "object %u differs", i);
    }
    /* the keys really are spread over both nodes */
    uint32_t on_first = 0;
    kvs_remote_ring ring;
    kvs_remote_ring_init(&ring);
    ck_assert_int_eq(kvs_remote_ring_add(&ring, nodes[0].id), KVS_OK);
    ck_assert_int_eq(kvs_remote_ring_add(&ring, nodes[1].id), KVS_OK);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t h = 0, nh = 0;
        ck_assert_int_eq(kvs_remote_ring_homes(&ring, &keys[i], 1, &h, &nh), KVS_OK);
        on_first += h == 0;
    }
    ck_assert_uint_gt(on_first, 0);
    ck_assert_uint_lt(on_first, N);
    void *d1[1] = {staging};
    uint64_t c1[1] = {4096};
    ck_assert_int_eq(ops->get_many(s, &missing, d1, c1, 1, lens, sts), KVS_OK);
    ck_assert_int_eq(sts[0], KVS_ENOTFOUND);
    for (uint32_t i = 0; i < N; i++)
        if (i % 3 == 0) free(dsts[i]);
    ops->destroy(s);
}
END_TEST

START_TEST(with_two_replicas_a_killed_node_leaves_the_other_serving) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    void *s = open_ok("2", "1000");
    enum { N = 16 };
    uint8_t buf[8192];
    for (uint32_t i = 0; i < N; i++) {
        kvs_key k = kvs_test_remote_key(200 + i);
        kvs_test_fill(buf, sizeof buf, 200 + i);
        ck_assert_int_eq(ops->put(s, &k, buf, sizeof buf), KVS_OK);
    }
    kvs_test_node_kill(&nodes[0]);
    for (uint32_t i = 0; i < N; i++) {
        kvs_key k = kvs_test_remote_key(200 + i);
        uint8_t want[8192];
        kvs_test_fill(want, sizeof want, 200 + i);
        memset(staging, 0, sizeof buf);
        uint64_t got = 0;
        kvs_status st = ops->get(s, &k, staging, sizeof buf, &got);
        ck_assert_msg(st == KVS_OK, "key %u: %d (%s)", i, st, ops->last_error(s));
        ck_assert_int_eq(memcmp(staging, want, sizeof want), 0);
    }
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 1);
    ck_assert_uint_ge(stats.node_failures, 1);
    ck_assert_msg(strstr(ops->last_error(s), nodes[0].id) != NULL, "last error: %s",
                  ops->last_error(s));
    /* puts still succeed, the dead home's copy dropped and counted */
    kvs_key k = kvs_test_remote_key(300);
    ck_assert_int_eq(ops->put(s, &k, buf, 100), KVS_OK);
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_ge(stats.puts_dropped, 1);
    kvs_test_node_kill(&nodes[1]);
    /* with both gone, every key is a miss, answered within timeout_ms */
    for (uint32_t i = 0; i < 4; i++) {
        kvs_key kk = kvs_test_remote_key(200 + i);
        uint64_t got = 0, n = 9;
        kvs_status st = ops->get(s, &kk, staging, sizeof buf, &got);
        ck_assert_msg(st == KVS_ENOTFOUND || st == KVS_ETIMEDOUT, "status %d", st);
        ck_assert_int_eq(ops->contains(s, &kk, 1, &n), KVS_OK);
        ck_assert_uint_eq(n, 0);
    }
    ops->destroy(s);
}
END_TEST

/* Puts return once their object is copied into the put queue: the caller's buffer is reused at
 * once, the queued puts go out in fewer requests than puts, and every object reads back exactly. */
START_TEST(queued_puts_go_out_in_batches_and_read_back_exactly) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    void *s = open_ok("1", "5000");
    enum { N = 64, LEN = 64 * 1024 };
    uint8_t *buf = malloc(LEN), *want = malloc(LEN), *dst = malloc(LEN);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(want);
    ck_assert_ptr_nonnull(dst);
    for (uint32_t i = 0; i < N; i++) {
        kvs_key k = kvs_test_remote_key(500 + i);
        kvs_test_fill(buf, LEN, 500 + i);
        ck_assert_int_eq(ops->put(s, &k, buf, LEN - i), KVS_OK);
        memset(buf, 0xEE, LEN); /* the put kept its own copy */
    }
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.puts_queued, N);
    ck_assert_uint_eq(stats.puts_stored, N);
    ck_assert_uint_eq(stats.puts_dropped, 0);
    ck_assert_msg(stats.put_requests < N, "%llu PUT requests for %d puts",
                  (unsigned long long)stats.put_requests, N);
    for (uint32_t i = 0; i < N; i++) {
        kvs_key k = kvs_test_remote_key(500 + i);
        kvs_test_fill(want, LEN, 500 + i);
        uint64_t got = 0;
        ck_assert_int_eq(ops->get(s, &k, dst, LEN, &got), KVS_OK);
        ck_assert_uint_eq(got, LEN - i);
        ck_assert_msg(memcmp(dst, want, LEN - i) == 0, "object %u differs", i);
    }
    ops->destroy(s);
    free(buf);
    free(want);
    free(dst);
}
END_TEST

/* Closing the tier sends what is still queued: a new client finds every object. */
START_TEST(a_closed_tier_sends_its_queued_puts_first) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    void *s = open_ok("2", "5000");
    enum { N = 24, LEN = 256 * 1024 };
    uint8_t *buf = malloc(LEN);
    ck_assert_ptr_nonnull(buf);
    for (uint32_t i = 0; i < N; i++) {
        kvs_key k = kvs_test_remote_key(700 + i);
        kvs_test_fill(buf, LEN, 700 + i);
        ck_assert_int_eq(ops->put(s, &k, buf, LEN), KVS_OK);
    }
    ops->destroy(s);
    s = open_ok("1", "5000");
    uint8_t *want = malloc(LEN);
    ck_assert_ptr_nonnull(want);
    for (uint32_t i = 0; i < N; i++) {
        kvs_key k = kvs_test_remote_key(700 + i);
        kvs_test_fill(want, LEN, 700 + i);
        uint64_t got = 0;
        ck_assert_int_eq(ops->get(s, &k, buf, LEN, &got), KVS_OK);
        ck_assert_uint_eq(got, LEN);
        ck_assert_msg(memcmp(buf, want, LEN) == 0, "object %u differs", i);
    }
    ops->destroy(s);
    free(buf);
    free(want);
}
END_TEST

static int both_nodes_up(void *tier) {
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(tier, &stats), KVS_OK);
    return stats.nodes_up == 2;
}

/* Hung nodes: puts still return within timeout_ms (waiting for queue room at most), their copies are
 * dropped and counted, and once the nodes run again puts are stored again. The resumed nodes first
 * serve their stale PUTs, whose reads must find the client's aborted connection gone (a closing one
 * made UCX 1.13 abort the client, docs/remote.md). */
START_TEST(puts_to_hung_nodes_are_dropped_within_the_timeout) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    kvs_backend_option opts[] = {{"node", nodes[0].id},  {"node", nodes[1].id},
                                 {"psk_file", key_path}, {"tenant", "test-tenant"},
                                 {"timeout_ms", "400"},  {"connect_backoff_ms", "50"},
                                 {"put_queue_mb", "2"}};
    char err[512];
    void *s = NULL;
    ck_assert_int_eq(kvs_test_remote_create(opts, 7, err, sizeof err, &s, staging, STAGING_BYTES),
                     KVS_OK);
    ck_assert_int_eq(kill(nodes[0].pid, SIGSTOP), 0);
    ck_assert_int_eq(kill(nodes[1].pid, SIGSTOP), 0);
    uint8_t *buf = malloc(MIB);
    ck_assert_ptr_nonnull(buf);
    kvs_test_fill(buf, MIB, 9);
    for (uint32_t i = 0; i < 4; i++) {
        kvs_key k = kvs_test_remote_key(900 + i);
        double t0 = kvs_test_now_ms();
        kvs_status st = ops->put(s, &k, buf, MIB);
        ck_assert_msg(kvs_test_now_ms() - t0 < 1000, "put %u took %.0f ms", i,
                      kvs_test_now_ms() - t0);
        ck_assert_msg(st == KVS_OK || st == KVS_ETIMEDOUT, "put %u: %d", i, st);
    }
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.puts_stored, 0);
    ck_assert_uint_eq(stats.puts_dropped, 4);
    ck_assert_int_eq(kill(nodes[0].pid, SIGCONT), 0);
    ck_assert_int_eq(kill(nodes[1].pid, SIGCONT), 0);
    ck_assert_msg(kvs_test_wait_for(both_nodes_up, s, 5000), "the nodes did not come back: %s",
                  ops->last_error(s));
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 2);
    kvs_key k = kvs_test_remote_key(950);
    ck_assert_int_eq(ops->put(s, &k, buf, MIB), KVS_OK);
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.puts_stored, 1);
    uint64_t got = 0;
    uint8_t *dst = malloc(MIB);
    ck_assert_ptr_nonnull(dst);
    ck_assert_int_eq(ops->get(s, &k, dst, MIB, &got), KVS_OK);
    ck_assert_int_eq(memcmp(dst, buf, MIB), 0);
    ops->destroy(s);
    free(buf);
    free(dst);
}
END_TEST

/* Puts queued while a batch waits on a hung node reach the live node late in their own deadline; the
 * live node still gets timeout_ms to answer them and stays up (it used to be cut off after the few
 * ms left, and a node whose connection is cut while it reads our queue can make UCX 1.13 abort). */
START_TEST(puts_queued_behind_a_hung_node_do_not_take_the_live_node_down) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    kvs_backend_option opts[] = {
        {"node", nodes[0].id},          {"node", nodes[1].id}, {"psk_file", key_path},
        {"tenant", "test-tenant"},      {"replicas", "2"},     {"timeout_ms", "600"},
        {"connect_backoff_ms", "20000"}};
    char err[512];
    void *s = NULL;
    ck_assert_int_eq(kvs_test_remote_create(opts, 7, err, sizeof err, &s, staging, STAGING_BYTES),
                     KVS_OK);
    ck_assert_int_eq(kill(nodes[0].pid, SIGSTOP), 0);
    uint8_t buf[8192];
    for (uint32_t i = 0; i < 6;
         i++) { /* the first batch waits 600 ms on node 0; the rest queue behind it */
        kvs_key k = kvs_test_remote_key(960 + i);
        kvs_test_fill(buf, sizeof buf, 960 + i);
        ck_assert_int_eq(ops->put(s, &k, buf, sizeof buf), KVS_OK);
        kvs_test_pause_ms(100); /* pacing: the puts reach the tier while node 0 holds a batch */
    }
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_int_eq(kill(nodes[0].pid, SIGCONT), 0);
    ck_assert_msg(stats.nodes_up == 1, "nodes up: %u (%s)", stats.nodes_up, ops->last_error(s));
    for (uint32_t i = 0; i < 6; i++) { /* every put reached the live node */
        kvs_key k = kvs_test_remote_key(960 + i);
        uint64_t got = 0;
        ck_assert_int_eq(ops->get(s, &k, staging, sizeof buf, &got), KVS_OK);
        kvs_test_fill(buf, sizeof buf, 960 + i);
        ck_assert_int_eq(memcmp(staging, buf, sizeof buf), 0);
    }
    ops->destroy(s);
}
END_TEST

START_TEST(a_wrong_key_fails_create_with_a_sentence) {
    char err[512];
    kvs_status st;
    void *s = open_tier("1", wrong_key_path, "2000", err, sizeof err, &st);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(st, KVS_EIO);
    ck_assert_msg(strstr(err, "refused authentication") && strstr(err, "test-tenant"), "error: %s",
                  err);
}
END_TEST

static void *open_sm(const char *shared_memory) {
    kvs_backend_option opts[] = {{"node", nodes[0].id},  {"node", nodes[1].id},
                                 {"psk_file", key_path}, {"tenant", "test-tenant"},
                                 {"timeout_ms", "2000"}, {"shared_memory", shared_memory}};
    char err[512];
    void *state = NULL;
    kvs_status st =
        kvs_test_remote_create(opts, 6, err, sizeof err, &state, staging, STAGING_BYTES);
    ck_assert_msg(st == KVS_OK, "create: %d %s", st, err);
    return state;
}

/* Put objects from the pool and read them back into the pool, comparing every byte. */
static void round_trip_in_pool(void *s, uint32_t first, uint32_t n) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    for (uint32_t i = 0; i < n; i++) {
        kvs_key k = kvs_test_remote_key(first + i);
        kvs_test_fill(staging, MIB, first + i);
        ck_assert_int_eq(ops->put(s, &k, staging, MIB), KVS_OK);
    }
    for (uint32_t i = 0; i < n; i++) {
        kvs_key k = kvs_test_remote_key(first + i);
        memset(staging, 0, MIB);
        uint64_t got = 0;
        ck_assert_int_eq(ops->get(s, &k, staging, MIB, &got), KVS_OK);
        ck_assert_uint_eq(got, MIB);
        uint8_t *want = malloc(MIB);
        kvs_test_fill(want, MIB, first + i);
        ck_assert_msg(memcmp(staging, want, MIB) == 0, "object %u differs", first + i);
        free(want);
    }
}

/* By default (shared_memory: auto) a node on this host that was not started with
 * --shared-memory-payloads on moves payloads over tcp: UCX's shared memory is experimental. */
typedef struct log_capture {
    pthread_mutex_t mutex; /* the tier logs from its progress thread */
    char lines[32][512];
    int n;
} log_capture;

static void capture_log(void *ctx, int level, const char *message) {
    (void)level;
    log_capture *c = ctx;
    pthread_mutex_lock(&c->mutex);
    if (c->n < 32) snprintf(c->lines[c->n++], sizeof c->lines[0], "%s", message);
    pthread_mutex_unlock(&c->mutex);
}

static int logged_line(log_capture *c, const char *needle, char *out, size_t out_len) {
    pthread_mutex_lock(&c->mutex);
    int found = 0;
    for (int i = 0; i < c->n && !found; i++)
        if (strstr(c->lines[i], needle)) {
            snprintf(out, out_len, "%s", c->lines[i]);
            found = 1;
        }
    pthread_mutex_unlock(&c->mutex);
    return found;
}

/* A node that hangs and comes back: the log says it went down, then that it is back and after how
 * long - the reconnect's progress in a plain log. */
START_TEST(a_node_back_after_an_outage_is_logged_with_how_long_it_was_down) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    kvs_backend_option opts[] = {{"node", nodes[0].id},
                                 {"psk_file", key_path},
                                 {"tenant", "test-tenant"},
                                 {"timeout_ms", "300"},
                                 {"connect_backoff_ms", "50"}};
    log_capture logs = {.mutex = PTHREAD_MUTEX_INITIALIZER, .n = 0};
    kvs_backend_host host = {.struct_size = sizeof host, .ctx = &logs, .log = capture_log};
    char err[512] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "far",
                             .max_object_bytes = 2u * MIB,
                             .options = opts,
                             .n_options = 5,
                             .host = &host,
                             .error = err,
                             .error_len = sizeof err,
                             .staging_base = staging,
                             .staging_len = STAGING_BYTES};
    void *s = NULL;
    ck_assert_msg(ops->create(&init, &s) == KVS_OK, "create: %s", err);
    kvs_key k = kvs_test_remote_key(4242);
    uint64_t got = 0;
    ck_assert_int_eq(kill(nodes[0].pid, SIGSTOP), 0);
    (void)ops->get(s, &k, staging, 4096, &got); /* no answer: the node is marked down */
    char line[512];
    int down = 0;
    for (int i = 0; i < 40 && !(down = logged_line(&logs, "is down", line, sizeof line)); i++)
        kvs_test_pause_ms(50);
    ck_assert_int_eq(kill(nodes[0].pid, SIGCONT), 0);
    ck_assert_msg(down, "no line saying the node is down");
    int back = 0;
    for (int i = 0; i < 100 && !(back = logged_line(&logs, "is back after", line, sizeof line));
         i++) {
        (void)ops->get(s, &k, staging, 4096, &got);
        kvs_test_pause_ms(50);
    }
    ck_assert_msg(back, "no line saying the node is back (%s)", ops->last_error(s));
    ck_assert_ptr_nonnull(strstr(line, nodes[0].id));
    ck_assert_ptr_nonnull(strstr(line, " s down ("));
    ops->destroy(s);
}
END_TEST

START_TEST(payloads_stay_on_tcp_unless_the_node_turns_shared_memory_on) {
    kvs_backend_option opts[] = {{"node", nodes[0].id},
                                 {"node", nodes[1].id},
                                 {"psk_file", key_path},
                                 {"tenant", "test-tenant"},
                                 {"timeout_ms", "2000"}};
    char err[512];
    void *s = NULL;
    ck_assert_int_eq(kvs_test_remote_create(opts, 5, err, sizeof err, &s, staging, STAGING_BYTES),
                     KVS_OK);
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 2);
    ck_assert_uint_eq(stats.nodes_shared_memory, 0);
    ck_assert_uint_eq(stats.nodes_stream, 2);
    round_trip_in_pool(s, 400, 4);
    kvs_remote_backend()->destroy(s);
}
END_TEST

START_TEST(nodes_on_this_host_move_payloads_over_shared_memory_unless_turned_off) {
    void *s = open_sm("auto");
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 2);
    ck_assert_uint_eq(stats.nodes_shared_memory,
                      2); /* UCX_TLS=tcp,sm,self, same host and namespace */
    round_trip_in_pool(s, 500, 6);
    kvs_remote_backend()->destroy(s);
    s = open_sm("off");
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 2);
    ck_assert_uint_eq(stats.nodes_shared_memory, 0);
    round_trip_in_pool(s, 600, 6);
    kvs_remote_backend()->destroy(s);
}
END_TEST

/* A node whose DRAM tier is shared between processes (shm_name), with the nodes' key: four slabs
 * of 2 MiB, over an SSD tier that takes what they cannot hold. */
static void shared_node_start(kvs_test_node *d, const char *shm_name) {
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n"
             "    capacity: 8MiB\n    options:\n      shm_name: %s\n"
             "  - name: ssd\n    type: ssd\n    capacity: 32MiB\n    paths: [ssd0]\n",
             shm_name);
    kvs_test_remote_node_start_with(d, key_path, yaml);
}

/* Keys the node has all made findable: an object its tier evicted is written to its SSD tier in the
 * background and found there once written (test_remote reads only after that). */
typedef struct key_set {
    void *tier;
    const kvs_key *keys;
    uint64_t n;
} key_set;

static int all_findable(void *arg) {
    const key_set *k = arg;
    for (uint64_t i = 0; i < k->n; i++) {
        uint64_t present = 0;
        if (kvs_remote_backend()->contains(k->tier, &k->keys[i], 1, &present) != KVS_OK ||
            present != 1)
            return 0;
    }
    return 1;
}

static int no_shared_tier(void *s) {
    kvs_remote_stats_t st;
    return kvs_remote_stats(s, &st) == KVS_OK && st.nodes_shared_tier == 0 && st.nodes_up == 0;
}

START_TEST(gets_from_a_node_on_this_host_copy_out_of_its_shared_tier) {
    char shm_name[64], shm_path[96];
    snprintf(shm_name, sizeof shm_name, "kvs-test-remote-%d", (int)getpid());
    snprintf(shm_path, sizeof shm_path, "/%s", shm_name);
    kvs_test_node shared;
    shared_node_start(&shared, shm_name);
    const kvs_backend_ops *ops = kvs_remote_backend();
    enum { N = 6 };
    for (int mode = 0; mode < 2; mode++) { /* shared_memory left at its default (auto), then off */
        kvs_backend_option opts[] = {{"node", shared.id},
                                     {"psk_file", key_path},
                                     {"tenant", "test-tenant"},
                                     {"timeout_ms", "2000"},
                                     {"shared_memory", mode == 0 ? "auto" : "off"}};
        char err[512];
        void *s = NULL;
        ck_assert_int_eq(kvs_test_remote_create(opts, mode == 0 ? 4 : 5, err, sizeof err, &s,
                                                staging, STAGING_BYTES),
                         KVS_OK);
        kvs_remote_stats_t before, after;
        ck_assert_int_eq(kvs_remote_stats(s, &before), KVS_OK);
        ck_assert_uint_eq(before.nodes_shared_tier, mode == 0 ? 1 : 0);
        kvs_key keys[N + 1];
        void *dsts[N + 1];
        uint64_t caps[N + 1], lens[N + 1];
        kvs_status sts[N + 1];
        for (uint32_t i = 0; i < N + 1; i++) {
            keys[i] = kvs_test_remote_key(700 + 10 * (uint32_t)mode + i);
            dsts[i] = staging + (uint64_t)i * MIB;
            caps[i] = i == 1 ? MIB / 2 : MIB; /* one buffer too small for its object */
            if (i == N) continue;             /* the last key is never put: a miss */
            kvs_test_fill(staging, MIB, 700 + 10 * (uint32_t)mode + i);
            ck_assert_int_eq(ops->put(s, &keys[i], staging, MIB), KVS_OK);
            /* two PUTs (the node reserves room for a whole PUT): the second moves the first two
             * objects down to the node's SSD tier */
            if (i == 3) ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
        }
        ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
        key_set written = {s, keys, N};
        ck_assert_msg(kvs_test_wait_for(all_findable, &written, 5000), "objects not findable");
        memset(staging, 0, (uint64_t)(N + 1) * MIB);
        ck_assert_int_eq(ops->get_many(s, keys, dsts, caps, N + 1, lens, sts), KVS_OK);
        uint8_t *want = malloc(MIB);
        for (uint32_t i = 0; i < N; i++) {
            if (i == 1) {
                ck_assert_int_eq(sts[i], KVS_EOVERFLOW);
                ck_assert_uint_eq(lens[i], MIB);
                continue;
            }
            ck_assert_msg(sts[i] == KVS_OK, "object %u: status %d", i, sts[i]);
            ck_assert_uint_eq(lens[i], MIB);
            kvs_test_fill(want, MIB, 700 + 10 * (uint32_t)mode + i);
            ck_assert_msg(memcmp(dsts[i], want, MIB) == 0, "object %u differs", i);
        }
        free(want);
        ck_assert_int_eq(sts[N], KVS_ENOTFOUND);
        ck_assert_int_eq(kvs_remote_stats(s, &after), KVS_OK);
        /* with auto the four objects still in the node's DRAM came out of the shared tier and
         * the first two, the too-small buffer among them, from the node's SSD tier; with off all
         * came from the node */
        ck_assert_uint_eq(after.shared_tier_gets - before.shared_tier_gets, mode == 0 ? 4 : 0);
        if (mode == 0) {
            /* the node gone: its session's attachment goes with it (the shared memory object is
             * removed by the last process to detach; a node still exiting when this tier detaches
             * counts as alive, so here it may stay for the next node of that name to take over) */
            kvs_test_node_kill(&shared);
            uint64_t got = 0;
            /* the tier sees the node's control connection close */
            ck_assert_msg(kvs_test_wait_for(no_shared_tier, s, 5000), "still attached");
            /* the node back (its tier made anew): the tier reconnects and attaches it again */
            (void)kvs_test_node_stop(&shared);
            shared_node_start(&shared, shm_name);
            kvs_backend_option again[] = {{"node", shared.id},
                                          {"psk_file", key_path},
                                          {"tenant", "test-tenant"},
                                          {"timeout_ms", "2000"},
                                          {"shared_memory", "auto"}};
            ops->destroy(s); /* the port changed: a tier on the new one */
            ck_assert_int_eq(
                kvs_test_remote_create(again, 5, err, sizeof err, &s, staging, STAGING_BYTES),
                KVS_OK);
            ck_assert_int_eq(kvs_remote_stats(s, &before), KVS_OK);
            ck_assert_uint_eq(before.nodes_shared_tier, 1);
            kvs_test_fill(staging, MIB, 777);
            ck_assert_int_eq(ops->put(s, &keys[0], staging, MIB), KVS_OK);
            ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
            memset(staging, 0, MIB);
            ck_assert_int_eq(ops->get_many(s, keys, dsts, caps, 1, &got, sts), KVS_OK);
            ck_assert_int_eq(sts[0], KVS_OK);
            uint8_t *again_want = malloc(MIB);
            kvs_test_fill(again_want, MIB, 777);
            ck_assert(memcmp(staging, again_want, MIB) == 0);
            free(again_want);
            ck_assert_int_eq(kvs_remote_stats(s, &after), KVS_OK);
            ck_assert_uint_eq(after.shared_tier_gets - before.shared_tier_gets, 1);
            ops->destroy(s);
            (void)kvs_test_node_stop(&shared);
            shared_node_start(&shared, shm_name);
        } else {
            ops->destroy(s);
        }
    }
    (void)kvs_test_node_stop(&shared);
    (void)shm_unlink(shm_path); /* if a node killed above left it */
}
END_TEST

/* Puts to a node on this host with a shared tier are copied straight into free slabs of it
 * (shared_tier_puts); the node keeps an eighth of its slabs free, passing what it evicts down to its
 * SSD tier, and every object reads back, also by a client that does not attach the tier. */
START_TEST(puts_go_into_the_nodes_shared_tier_and_the_node_keeps_room) {
    char shm_name[64], shm_path[96];
    snprintf(shm_name, sizeof shm_name, "kvs-test-remote-p%d", (int)getpid());
    snprintf(shm_path, sizeof shm_path, "/%s", shm_name);
    char yaml[512];
    snprintf(yaml, sizeof yaml, /* 16 slabs of 2 MiB: the node keeps 2 free */
             "version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n"
             "    capacity: 32MiB\n    options:\n      shm_name: %s\n"
             "  - name: ssd\n    type: ssd\n    capacity: 64MiB\n    paths: [ssd0]\n",
             shm_name);
    kvs_test_node shared;
    kvs_test_remote_node_start_with(&shared, key_path, yaml);
    const kvs_backend_ops *ops = kvs_remote_backend();
    kvs_backend_option opts[] = {{"node", shared.id},
                                 {"psk_file", key_path},
                                 {"tenant", "test-tenant"},
                                 {"timeout_ms", "2000"},
                                 {"shared_memory", "off"}};
    char err[512];
    void *s = NULL, *off = NULL;
    ck_assert_int_eq(kvs_test_remote_create(opts, 4, err, sizeof err, &s, staging, STAGING_BYTES),
                     KVS_OK);
    enum { N = 20 };
    kvs_remote_stats_t st0, st1, st2;
    ck_assert_int_eq(kvs_remote_stats(s, &st0), KVS_OK);
    ck_assert_uint_eq(st0.nodes_shared_tier, 1);
    for (uint32_t i = 0; i < N - 2; i++) {
        kvs_key k = kvs_test_remote_key(900 + i);
        kvs_test_fill(staging, MIB, 900 + i);
        ck_assert_int_eq(ops->put(s, &k, staging, MIB), KVS_OK);
    }
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    ck_assert_int_eq(kvs_remote_stats(s, &st1), KVS_OK);
    /* the first 16 found free slabs at least (the node may have freed more meanwhile) */
    ck_assert_msg(st1.shared_tier_puts - st0.shared_tier_puts >= 16, "%llu shared puts",
                  (unsigned long long)(st1.shared_tier_puts - st0.shared_tier_puts));
    kvs_test_pause_ms(500);                /* the node checks its room every 100 ms */
    for (uint32_t i = N - 2; i < N; i++) { /* the room it kept takes these */
        kvs_key k = kvs_test_remote_key(900 + i);
        kvs_test_fill(staging, MIB, 900 + i);
        ck_assert_int_eq(ops->put(s, &k, staging, MIB), KVS_OK);
    }
    ck_assert_int_eq(kvs_remote_stats(s, &st2), KVS_OK);
    ck_assert_uint_eq(st2.shared_tier_puts - st1.shared_tier_puts, 2);
    kvs_test_pause_ms(500); /* the node frees its room again: two more go down to its SSD tier */
    kvs_key keys[N];
    for (uint32_t i = 0; i < N; i++) keys[i] = kvs_test_remote_key(900 + i);
    key_set written = {s, keys, N};
    ck_assert_msg(kvs_test_wait_for(all_findable, &written, 5000), "objects not findable");
    /* every object reads back: from the shared tier or, evicted there, from the node's SSD tier;
     * and through the node alone by a client that does not attach its tier */
    ck_assert_int_eq(kvs_test_remote_create(opts, 5, err, sizeof err, &off, staging, STAGING_BYTES),
                     KVS_OK);
    uint8_t *want = malloc(MIB);
    ck_assert_ptr_nonnull(want);
    for (int reader = 0; reader < 2; reader++)
        for (uint32_t i = 0; i < N; i++) {
            kvs_key k = kvs_test_remote_key(900 + i);
            uint64_t got = 0;
            memset(staging, 0, MIB);
            kvs_status rc = ops->get(reader ? off : s, &k, staging, MIB, &got);
            ck_assert_msg(rc == KVS_OK, "reader %d object %u: %d", reader, i, rc);
            kvs_test_fill(want, MIB, 900 + i);
            ck_assert_msg(got == MIB && memcmp(staging, want, MIB) == 0, "object %u differs", i);
        }
    free(want);
    ops->destroy(off);
    ops->destroy(s);
    (void)kvs_test_node_stop(&shared);
    /* a write-through first tier is not offered: puts into it would skip the copy below it */
    snprintf(yaml, sizeof yaml,
             "version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n"
             "    capacity: 32MiB\n    write: through\n    options:\n      shm_name: %s\n"
             "  - name: ssd\n    type: ssd\n    capacity: 64MiB\n    paths: [ssd0]\n",
             shm_name);
    kvs_test_remote_node_start_with(&shared, key_path, yaml);
    opts[0].value = shared.id;
    ck_assert_int_eq(kvs_test_remote_create(opts, 4, err, sizeof err, &s, staging, STAGING_BYTES),
                     KVS_OK);
    ck_assert_int_eq(kvs_remote_stats(s, &st0), KVS_OK);
    ck_assert_uint_eq(st0.nodes_up, 1);
    ck_assert_uint_eq(st0.nodes_shared_tier, 0);
    ops->destroy(s);
    (void)kvs_test_node_stop(&shared);
    (void)shm_unlink(shm_path);
}
END_TEST

/* A client killed in the middle of gets (shared_memory: mode): the nodes live on; over tcp (off)
 * they notice at once and serve the next client. Over shared memory UCX 1.13 gives no failure
 * detection, the node watches the client's pidfd, and the next client is not asserted (a known
 * issue: the node's other endpoints can time out after such a kill; docs/remote.md). */
static int a_node_exited(void *unused) {
    (void)unused;
    return !kvs_test_node_alive(&nodes[0]) || !kvs_test_node_alive(&nodes[1]);
}

static void kill_a_client_during_gets(const char *mode) {
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        if (close(ready[0]) != 0) _exit(2);
        void *s = open_sm(mode);
        const kvs_backend_ops *ops = kvs_remote_backend();
        enum { N = 6 };
        kvs_key keys[N];
        void *dsts[N];
        uint64_t caps[N], lens[N];
        kvs_status sts[N];
        for (uint32_t i = 0; i < N; i++) {
            keys[i] = kvs_test_remote_key(700 + i);
            kvs_test_fill(staging, MIB, 700 + i);
            if (ops->put(s, &keys[i], staging, MIB) != KVS_OK) _exit(2);
            dsts[i] = staging + (size_t)i * MIB;
            caps[i] = MIB;
        }
        /* one round of gets done: the parent kills it in the middle of the next ones */
        if (ops->get_many(s, keys, dsts, caps, N, lens, sts) != KVS_OK ||
            write(ready[1], "g", 1) != 1)
            _exit(2);
        for (;;) /* until killed */
            if (ops->get_many(s, keys, dsts, caps, N, lens, sts) != KVS_OK) _exit(2);
    }
    ck_assert_int_eq(close(ready[1]), 0);
    struct pollfd p = {.fd = ready[0], .events = POLLIN};
    char started = 0;
    ck_assert_msg(poll(&p, 1, kvs_test_scaled_ms(10000)) == 1 && read(ready[0], &started, 1) == 1,
                  "the client did not get to its gets");
    ck_assert_int_eq(close(ready[0]), 0);
    ck_assert_int_eq(kill(child, SIGKILL), 0);
    int status = 0;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert(WIFSIGNALED(status));
    /* a node the kill takes down goes within moments: watch for that rather than sleep */
    ck_assert_msg(!kvs_test_wait_for(a_node_exited, NULL, 100), "a node died with the client");
    ck_assert_int_eq(kill(nodes[0].pid, 0), 0);
    ck_assert_int_eq(kill(nodes[1].pid, 0), 0);
}

START_TEST(a_client_killed_during_gets_leaves_the_nodes_serving) {
    kill_a_client_during_gets("off");
    void *s = open_sm("off");
    round_trip_in_pool(s, 800, 4);
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_msg(stats.nodes_up == 2, "nodes up %u: %s", stats.nodes_up,
                  kvs_remote_backend()->last_error(s));
    kvs_remote_backend()->destroy(s);
}
END_TEST

START_TEST(a_client_killed_during_shared_memory_gets_does_not_kill_the_nodes) {
    kill_a_client_during_gets("auto");
}
END_TEST

/* A node on shared memory reads the put queue without this process's help. When both nodes hang,
 * the tier gives up on a put after timeout_ms and reuses its room for the next put; a node that then
 * resumes and serves the first PUT reads the second object's bytes. It must store nothing rather
 * than those bytes under the first key: the PUT carries the time from which the room may be reused,
 * and a node stores nothing it finished reading later. */
START_TEST(a_node_that_resumes_after_the_tier_gave_up_stores_no_stale_put) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    kvs_backend_option opts[] = {{"node", nodes[0].id},  {"node", nodes[1].id},
                                 {"psk_file", key_path}, {"tenant", "test-tenant"},
                                 {"timeout_ms", "400"},  {"connect_backoff_ms", "50"},
                                 {"put_queue_mb", "1"},  {"shared_memory", "auto"}};
    char err[512];
    void *s = NULL;
    ck_assert_int_eq(kvs_test_remote_create(opts, 8, err, sizeof err, &s, staging, STAGING_BYTES),
                     KVS_OK);
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_shared_memory, 2);
    const uint64_t len =
        512 * 1024; /* two fill the 1 MiB queue: the third reuses the first's room */
    uint8_t *buf = malloc(len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(kill(nodes[0].pid, SIGSTOP), 0);
    ck_assert_int_eq(kill(nodes[1].pid, SIGSTOP), 0);
    for (uint32_t i = 0; i < 6; i++) { /* each is given up after 400 ms; later ones reuse room */
        kvs_key k = kvs_test_remote_key(1100 + i);
        kvs_test_fill(buf, len, 1100 + i);
        kvs_status st = ops->put(s, &k, buf, len);
        ck_assert_msg(st == KVS_OK || st == KVS_ETIMEDOUT, "put %u: %d", i, st);
    }
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    ck_assert_int_eq(kill(nodes[0].pid, SIGCONT), 0);
    ck_assert_int_eq(kill(nodes[1].pid, SIGCONT), 0);
    ck_assert_msg(kvs_test_wait_for(both_nodes_up, s, 5000), "the nodes did not come back: %s",
                  ops->last_error(s));
    kvs_test_pause_ms(300);            /* the resumed nodes serve what they had received */
    for (uint32_t i = 0; i < 6; i++) { /* each key holds its own bytes, or nothing */
        kvs_key k = kvs_test_remote_key(1100 + i);
        uint64_t got = 0;
        memset(staging, 0, len);
        kvs_status st = ops->get(s, &k, staging, len, &got);
        if (st == KVS_ENOTFOUND) continue;
        ck_assert_int_eq(st, KVS_OK);
        kvs_test_fill(buf, len, 1100 + i);
        ck_assert_msg(got == len && memcmp(staging, buf, len) == 0,
                      "key %u holds bytes that are not its object's", 1100 + i);
    }
    ops->destroy(s);
    free(buf);
}
END_TEST

START_TEST(an_idle_tier_uses_almost_no_cpu) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    void *s = open_ok("1", "2000");
    uint64_t n = 0;
    kvs_key k = kvs_test_remote_key(1);
    ck_assert_int_eq(ops->contains(s, &k, 1, &n), KVS_OK);
    struct rusage a, b;
    ck_assert_int_eq(getrusage(RUSAGE_SELF, &a), 0);
    kvs_test_pause_ms(300); /* the window the CPU use is measured over */
    ck_assert_int_eq(getrusage(RUSAGE_SELF, &b), 0);
    double used_ms = (double)(b.ru_utime.tv_sec - a.ru_utime.tv_sec) * 1e3 +
                     (double)(b.ru_utime.tv_usec - a.ru_utime.tv_usec) / 1e3 +
                     (double)(b.ru_stime.tv_sec - a.ru_stime.tv_sec) * 1e3 +
                     (double)(b.ru_stime.tv_usec - a.ru_stime.tv_usec) / 1e3;
    ck_assert_msg(used_ms < 50.0, "idle CPU %.1f ms over 300 ms", used_ms);
    ops->destroy(s);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("remote");
    TCase *options = tcase_create("options");
    tcase_add_test(options, bad_options_are_refused_with_a_sentence);
    tcase_add_test(options, a_missing_key_file_fails_create_naming_it);
    suite_add_tcase(suite, options);
    TCase *live = tcase_create("two_nodes");
    tcase_add_checked_fixture(live, nodes_setup, nodes_teardown);
    tcase_set_timeout(live, 60);
    tcase_add_loop_test(live, put_then_get_returns_the_same_bytes, 0, 3);
    tcase_add_test(live, a_lookup_right_after_puts_on_the_stream_sees_them_all);
    tcase_add_test(live, queued_puts_go_out_in_batches_and_read_back_exactly);
    tcase_add_test(live, a_closed_tier_sends_its_queued_puts_first);
    tcase_add_test(live, get_many_reads_keys_from_both_nodes);
    tcase_add_test(live, with_two_replicas_a_killed_node_leaves_the_other_serving);
    tcase_add_test(live, a_wrong_key_fails_create_with_a_sentence);
    tcase_add_test(live, puts_queued_behind_a_hung_node_do_not_take_the_live_node_down);
    tcase_add_test(live, a_node_back_after_an_outage_is_logged_with_how_long_it_was_down);
    tcase_add_test(live, payloads_stay_on_tcp_unless_the_node_turns_shared_memory_on);
    tcase_add_test(live, a_client_killed_during_gets_leaves_the_nodes_serving);
    suite_add_tcase(suite, live);
    TCase *shm = tcase_create("shm_payloads");
    tcase_add_checked_fixture(shm, shm_nodes_setup, nodes_teardown);
    tcase_set_timeout(shm, 60);
    tcase_add_test(shm, nodes_on_this_host_move_payloads_over_shared_memory_unless_turned_off);
    tcase_add_test(shm, a_client_killed_during_shared_memory_gets_does_not_kill_the_nodes);
    tcase_add_test(shm, a_node_that_resumes_after_the_tier_gave_up_stores_no_stale_put);
    suite_add_tcase(suite, shm);
    TCase *shared_tier = tcase_create("shared_tier");
    tcase_add_checked_fixture(shared_tier, nodes_setup, nodes_teardown);
    tcase_set_timeout(shared_tier, 60);
    tcase_add_test(shared_tier, gets_from_a_node_on_this_host_copy_out_of_its_shared_tier);
    tcase_add_test(shared_tier, puts_go_into_the_nodes_shared_tier_and_the_node_keeps_room);
    suite_add_tcase(suite, shared_tier);
    /* they measure time (puts against hung nodes within the timeout, idle CPU): run by
     * test_remote_timing (label timing) */
    TCase *timing = tcase_create("two_nodes_timing");
    tcase_set_tags(timing, "timing");
    tcase_add_checked_fixture(timing, nodes_setup, nodes_teardown);
    tcase_set_timeout(timing, 60);
    tcase_add_test(timing, puts_to_hung_nodes_are_dropped_within_the_timeout);
    tcase_add_test(timing, an_idle_tier_uses_almost_no_cpu);
    suite_add_tcase(suite, timing);
    SRunner *runner = srunner_create(suite);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
