/* test_remote_tls.c - `encrypt: true` (backends/ucx/channel.h): the remote tier and kvstrata-node
 * with every control connection over TLS 1.3 keyed per tenant. A relay between the tier and the node
 * records every byte on the wire: with encrypt no object byte is on it, without it they are; plain
 * and TLS peers of the other kind are refused with a sentence; a TLS key names one tenant only; an
 * encrypted session takes nothing over UCX; payload modes that carry objects in the clear are
 * refused. */
#include <stdio.h>
#include <stdlib.h>

#ifndef KVS_HAVE_UCX
int main(void) {
    printf("test_remote_tls: skipped, this build has no UCX\n");
    return 77;
}
#else

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/ucx/channel.h"
#include "backends/ucx/control.h"
#include "backends/ucx/remote.h"
#include "backends/ucx/stream.h"
#include "common/clock.h"
#include "tests/support/node_client.h"
#include "tests/support/node_proc.h"
#include "tests/support/objects.h"
#include "tests/support/remote_tier.h"
#include "tests/support/test_support.h"
#include "tests/support/wait.h"

#define KIB           1024u
#define MIB           (1024u * 1024u)
#define STAGING_BYTES (8u * MIB)
#define OBJECT_BYTES  (256u * KIB)
#define N_OBJECTS     4u

static char key_dir[512], key_path[600], wrong_key_path[600];
static kvs_test_node node;
static uint8_t *staging;

/* ---- a relay that keeps what it forwards ------------------------------------------------------ */

typedef struct relay {
    int listen_fd;
    uint16_t port, to_port;
    char id[64];
    volatile int stop;
    pthread_t thread;
    pthread_mutex_t mutex;
    uint8_t *seen; /* every byte forwarded either way, in arrival order */
    size_t seen_len, seen_cap;
} relay;

static void relay_keep(relay *r, const uint8_t *b, size_t n) {
    pthread_mutex_lock(&r->mutex);
    if (r->seen_len + n > r->seen_cap) {
        size_t cap = (r->seen_len + n) * 2;
        uint8_t *p = realloc(r->seen, cap);
        if (!p) {
            pthread_mutex_unlock(&r->mutex);
            return;
        }
        r->seen = p;
        r->seen_cap = cap;
    }
    memcpy(r->seen + r->seen_len, b, n);
    r->seen_len += n;
    pthread_mutex_unlock(&r->mutex);
}

/* One client connection at a time, forwarded to the node until either side closes. */
static void *relay_main(void *arg) {
    relay *r = arg;
    static uint8_t buf[64 * 1024];
    while (!r->stop) {
        struct pollfd lp = {.fd = r->listen_fd, .events = POLLIN};
        if (poll(&lp, 1, 50) <= 0) continue;
        int a = accept(r->listen_fd, NULL, NULL);
        if (a < 0) continue;
        int b = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(r->to_port)};
        sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (b < 0 || connect(b, (struct sockaddr *)&sin, sizeof sin) != 0) {
            close(a);
            if (b >= 0) close(b);
            continue;
        }
        int open = 1;
        while (open && !r->stop) {
            struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
            if (poll(p, 2, 50) <= 0) continue;
            for (int i = 0; i < 2 && open; i++) {
                if (!p[i].revents) continue;
                ssize_t k = recv(p[i].fd, buf, sizeof buf, 0);
                if (k <= 0) {
                    open = 0;
                    break;
                }
                relay_keep(r, buf, (size_t)k);
                for (ssize_t done = 0; done < k;) {
                    ssize_t w = send(i ? a : b, buf + done, (size_t)(k - done), MSG_NOSIGNAL);
                    if (w <= 0) {
                        open = 0;
                        break;
                    }
                    done += w;
                }
            }
        }
        close(a);
        close(b);
    }
    return NULL;
}

static void relay_start(relay *r, uint16_t to_port) {
    memset(r, 0, sizeof *r);
    char err[256];
    ck_assert_msg(kvs_control_listen("127.0.0.1", 0, &r->listen_fd, &r->port, err, sizeof err) ==
                      KVS_OK,
                  "%s", err);
    r->to_port = to_port;
    snprintf(r->id, sizeof r->id, "127.0.0.1:%u", r->port);
    pthread_mutex_init(&r->mutex, NULL);
    ck_assert_int_eq(pthread_create(&r->thread, NULL, relay_main, r), 0);
}

static void relay_stop(relay *r) {
    r->stop = 1;
    pthread_join(r->thread, NULL);
    close(r->listen_fd);
    pthread_mutex_destroy(&r->mutex);
    free(r->seen);
}

/* 1 when the relay forwarded any 64-byte run of buf[0..len). */
static int relay_saw(relay *r, const uint8_t *buf, size_t len) {
    int found = 0;
    pthread_mutex_lock(&r->mutex);
    for (size_t at = 0; !found && at + 64 <= len; at += 4096)
        found = memmem(r->seen, r->seen_len, buf + at, 64) != NULL;
    pthread_mutex_unlock(&r->mutex);
    return found;
}

/* ---- fixtures --------------------------------------------------------------------------------- */

static void keys_setup(void) {
    ck_assert_int_eq(setenv("UCX_TLS", "tcp,sm,self", 0), 0);
    ck_assert(signal(SIGPIPE, SIG_IGN) != SIG_ERR);
    kvs_test_remote_keys(key_dir, sizeof key_dir, key_path, sizeof key_path, wrong_key_path,
                         sizeof wrong_key_path);
    staging = aligned_alloc(4096, STAGING_BYTES);
    ck_assert_ptr_nonnull(staging);
}

static void keys_teardown(void) {
    if (node.pid) (void)kvs_test_node_stop(&node);
    memset(&node, 0, sizeof node);
    free(staging);
    staging = NULL;
    kvs_test_rmtree(key_dir);
}

static void *open_tier(const char *node_id, const char *encrypt, const char *payloads, char *err,
                       size_t err_len, kvs_status *st) {
    kvs_backend_option opts[] = {
        {"node", node_id},      {"psk_file", key_path},       {"tenant", "test-tenant"},
        {"timeout_ms", "2000"}, {"connect_backoff_ms", "50"}, {"encrypt", encrypt},
        {"payloads", payloads}};
    void *s = NULL;
    *st = kvs_test_remote_create(opts, 7, err, err_len, &s, staging, STAGING_BYTES);
    return s;
}

/* Put N_OBJECTS objects through the tier, look them up, get them back byte for byte and delete one;
 * then the relay is asked whether it forwarded any of their bytes. */
static int round_trip_and_look_on_the_wire(const char *encrypt, const char *payloads, relay *r) {
    const kvs_backend_ops *ops = kvs_remote_backend();
    char err[512] = "";
    kvs_status st;
    void *s = open_tier(r->id, encrypt, payloads, err, sizeof err, &st);
    ck_assert_msg(st == KVS_OK, "create: %d %s", st, err);
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 1);
    ck_assert_uint_eq(stats.nodes_stream, 1);
    uint8_t *obj = malloc(N_OBJECTS * OBJECT_BYTES), *back = staging;
    ck_assert_ptr_nonnull(obj);
    kvs_key keys[N_OBJECTS];
    for (uint32_t i = 0; i < N_OBJECTS; i++) {
        keys[i] = kvs_test_remote_key(300 + i);
        kvs_test_fill(obj + i * OBJECT_BYTES, OBJECT_BYTES, 300 + i);
        ck_assert_int_eq(ops->put(s, &keys[i], obj + i * OBJECT_BYTES, OBJECT_BYTES), KVS_OK);
    }
    uint64_t n = 0;
    ck_assert_int_eq(ops->contains(s, keys, N_OBJECTS, &n), KVS_OK);
    ck_assert_uint_eq(n, N_OBJECTS);
    for (uint32_t i = 0; i < N_OBJECTS; i++) {
        uint64_t got = 0;
        memset(back, 0, OBJECT_BYTES);
        ck_assert_int_eq(ops->get(s, &keys[i], back, OBJECT_BYTES, &got), KVS_OK);
        ck_assert_uint_eq(got, OBJECT_BYTES);
        ck_assert_int_eq(memcmp(back, obj + i * OBJECT_BYTES, OBJECT_BYTES), 0);
    }
    ck_assert_int_eq(ops->remove(s, &keys[0]), KVS_OK);
    ck_assert_int_eq(ops->contains(s, keys, 1, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    uint64_t objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(s, &objects, &bytes), KVS_OK); /* STATS */
    ck_assert_uint_eq(objects, N_OBJECTS - 1);
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.stream_gets, N_OBJECTS);
    ck_assert_uint_eq(stats.rma_gets + stats.bounce_gets + stats.message_gets, 0);
    ck_assert_uint_eq(stats.puts_stored, N_OBJECTS);
    ck_assert_uint_eq(stats.node_failures, 0);
    ops->destroy(s);
    int saw = relay_saw(r, obj, N_OBJECTS * OBJECT_BYTES);
    free(obj);
    return saw;
}

/* With encrypt the objects, lookups, deletes and stats all go on the TLS stream and none of the
 * objects' bytes is on the wire; the same round trip over a plain stream puts them there (what a
 * passive observer of the network read before). */
START_TEST(an_encrypted_tier_round_trips_and_the_wire_carries_no_object_byte) {
    kvs_test_remote_node_start_flag(&node, key_path, KVS_TEST_REMOTE_NODE_YAML, "--encrypt", "on");
    relay r;
    relay_start(&r, node.port);
    ck_assert_msg(!round_trip_and_look_on_the_wire("true", "auto", &r),
                  "object bytes in the clear on an encrypted connection");
    ck_assert_uint_gt(r.seen_len, N_OBJECTS * OBJECT_BYTES); /* they did pass, encrypted */
    relay_stop(&r);
    ck_assert_int_eq(kvs_test_node_stop(&node), 0);

    kvs_test_remote_node_start(&node, key_path);
    relay_start(&r, node.port);
    ck_assert_msg(round_trip_and_look_on_the_wire("false", "stream", &r),
                  "the relay did not see the objects of a plain stream: it proves nothing");
    relay_stop(&r);
}
END_TEST

/* A HELLO naming tenant (a static nonce: these hellos are refused before it matters). */
static void hello(kvs_wire_msg *m, const char *tenant) {
    static const uint8_t nonce[KVS_WIRE_NONCE_BYTES] = {1};
    kvs_wire_msg_init(m, KVS_WIRE_HELLO, 0);
    m->tenant = tenant;
    m->tenant_len = (uint32_t)strlen(tenant);
    m->nonce = nonce;
}

/* A client of node in a session of tenant over TLS under key (the tenant's). */
static kvs_test_client *authed(const kvs_test_node *d, const char *tenant, const uint8_t key[32]) {
    kvs_test_client *c = kvs_test_client_open(d);
    ck_assert_int_eq(kvs_test_client_tls(c, tenant, key, 32), KVS_OK);
    ck_assert_uint_eq(kvs_test_client_handshake(c, tenant, key, 32, NULL), KVS_WIRE_AUTH_OK);
    return c;
}

/* An encrypted node started, and a session of tenant on it. */
static kvs_test_client *encrypted_session(const char *tenant) {
    kvs_test_remote_node_start_flag(&node, key_path, KVS_TEST_REMOTE_NODE_YAML, "--encrypt", "on");
    uint8_t key[32];
    kvs_test_node_tenant_key(&node, tenant, key, NULL, 0);
    return authed(&node, tenant, key);
}

/* A tier with encrypt against a node without it, and the other way round: no session, a sentence
 * that names the mismatch, and the node serves its own kind meanwhile. */
START_TEST(plain_and_tls_peers_of_the_other_kind_are_refused_with_a_sentence) {
    kvs_test_node_capture_stderr = 1;
    kvs_test_remote_node_start(&node, key_path);
    kvs_test_node_capture_stderr = 0;
    char err[512] = "";
    kvs_status st;
    void *s = open_tier(node.id, "true", "auto", err, sizeof err, &st);
    ck_assert_msg(st == KVS_OK, "create: %d %s", st, err); /* the node is down, not the tier */
    kvs_remote_stats_t stats;
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 0);
    const kvs_backend_ops *ops = kvs_remote_backend();
    const char *why = ops->last_error(s);
    ck_assert_msg(why && strstr(why, "TLS") && strstr(why, "is the peer run with encrypt"),
                  "the tier's error does not name TLS: %s", why ? why : "(none)");
    ops->destroy(s);
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(3000);
    while (kvs_test_node_log_lines(&node, "runs without encrypt") == 0 && kvs_test_now_ms() < until)
        usleep(20000);
    ck_assert_uint_ge(kvs_test_node_log_lines(&node, "runs without encrypt"), 1);
    s = open_tier(node.id, "false", "auto", err, sizeof err, &st);
    ck_assert_msg(st == KVS_OK, "create: %d %s", st, err);
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 1);
    ops->destroy(s);
    ck_assert_int_eq(kvs_test_node_stop(&node), 0);

    /* an encrypted node: a plain client's HELLO gets no answer but the connection's end */
    kvs_test_remote_node_start_flag(&node, key_path, KVS_TEST_REMOTE_NODE_YAML, "--encrypt", "on");
    kvs_test_client *c = kvs_test_client_open(&node);
    kvs_wire_msg m, rep;
    hello(&m, "test-tenant");
    ck_assert_msg(!kvs_test_client_control_request(c, &m, &rep),
                  "an encrypted node answered a plain hello");
    ck_assert(kvs_test_control_closed(c->ctl_fd));
    kvs_test_client_close(c);
    s = open_tier(node.id, "true", "auto", err, sizeof err, &st);
    ck_assert_msg(st == KVS_OK, "create: %d %s", st, err);
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.nodes_up, 1);
    ops->destroy(s);
}
END_TEST

/* The TLS key is the tenant's: another tenant's key under this tenant's name fails the TLS
 * handshake, and a session whose HELLO names another tenant than its TLS identity is refused. */
START_TEST(a_tls_key_names_one_tenant_only) {
    kvs_test_remote_node_start_flag(&node, key_path, KVS_TEST_REMOTE_NODE_YAML, "--encrypt", "on");
    uint8_t key_a[32], key_b[32];
    kvs_test_node_tenant_key(&node, "tenant-a", key_a, NULL, 0);
    kvs_test_node_tenant_key(&node, "tenant-b", key_b, NULL, 0);
    kvs_test_client *c = kvs_test_client_open(&node);
    ck_assert_int_eq(kvs_test_client_tls(c, "tenant-a", key_b, sizeof key_b),
                     KVS_EINVAL); /* refused */
    ck_assert(kvs_test_control_closed(c->ctl_fd));
    kvs_test_client_close(c);

    c = kvs_test_client_open(&node);
    ck_assert_int_eq(kvs_test_client_tls(c, "tenant-b", key_b, sizeof key_b), KVS_OK);
    kvs_wire_msg m, rep;
    hello(&m, "tenant-a");
    ck_assert(kvs_test_client_control_request(c, &m, &rep));
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_AUTH);
    ck_assert(kvs_test_control_closed(c->ctl_fd));
    kvs_test_client_close(c);

    kvs_test_client_close(authed(&node, "tenant-a", key_a));
}
END_TEST

/* An encrypted session's token never travels in the clear, and a request over UCX naming it (one
 * taken from the client's memory, say) is dropped as naming no session; on the stream the same
 * lookup is answered. */
START_TEST(an_encrypted_session_takes_nothing_over_ucx) {
    kvs_test_client *c = encrypted_session("tenant-a");
    uint8_t key[16];
    kvs_test_node_key(key, 7);
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_LOOKUP, 0);
    m.entries = &e;
    m.n_entries = 1;
    static uint8_t buf[KVS_WIRE_MAX_MESSAGE_BYTES + 4];
    size_t len = 0;
    kvs_wire_refusal why;
    m.request_id = 9;
    ck_assert_int_eq(kvs_wire_encode(&m, buf, sizeof buf, &len, &why), KVS_OK);
    ck_assert_msg(!kvs_test_client_send_raw(c, buf, len), "a request over UCX was answered");
    char err[256] = "";
    uint64_t deadline = kvs_now_ns() + 5000ull * 1000000ull;
    ck_assert_int_eq(kvs_stream_write_msg(&c->ch, &m, buf, sizeof buf, deadline, err, sizeof err),
                     KVS_OK);
    ck_assert_msg(kvs_stream_read_frame(&c->ch, buf, sizeof buf, &len, deadline, err, sizeof err) ==
                      KVS_OK,
                  "%s", err);
    ck_assert_int_eq(kvs_wire_decode(buf, len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why), KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_LOOKUP_REPLY);
    ck_assert_uint_eq(rep.request_id, 9);
    kvs_test_client_close(c);
    ck_assert_int_eq(kvs_test_node_stop(&node), 0);
    ck_assert_msg(strstr(node.out, "unknown_sessions=1"), "stats: %s", node.out);
}
END_TEST

/* The node's CPU time so far, in clock ticks (utime + stime of /proc/PID/stat). */
static unsigned long cpu_ticks(pid_t pid) {
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    fclose(f);
    unsigned long ut = 0, st = 0;
    const char *p = strrchr(line, ')'); /* fields 14 and 15 follow the command's name */
    ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st),
                     2);
    return ut + st;
}

/* A tenant that sends a GET and the first bytes of its next frame in one TLS record, then reads
 * nothing: the node holds those bytes decrypted while it waits for room for the answer, and must
 * wait on poll, not spin on them (it took a whole core for the GET's timeout_ms). */
START_TEST(bytes_tls_holds_do_not_make_the_node_spin_while_it_waits_to_send) {
    kvs_test_client *c = encrypted_session("tenant-a");
    enum { LEN = 2 * MIB, N = 16 };
    uint8_t *obj = malloc(LEN);
    static uint8_t buf[KVS_WIRE_MAX_MESSAGE_BYTES + 64];
    ck_assert_ptr_nonnull(obj);
    kvs_test_fill(obj, LEN, 3);
    uint8_t key[16];
    kvs_test_node_key(key, 1);
    kvs_wire_entry e[N];
    memset(e, 0, sizeof e);
    for (int i = 0; i < N; i++) e[i] = (kvs_wire_entry){.key = key, .by_message = 1, .length = LEN};
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_PUT, 1);
    m.entries = e;
    m.n_entries = 1;
    char err[256] = "";
    size_t len = 0;
    uint64_t deadline = kvs_now_ns() + 5000ull * 1000000ull;
    ck_assert_int_eq(kvs_stream_write_msg(&c->ch, &m, buf, sizeof buf, deadline, err, sizeof err),
                     KVS_OK);
    struct iovec v = {obj, LEN};
    ck_assert_int_eq(kvs_stream_writev(&c->ch, &v, 1, deadline, err, sizeof err), KVS_OK);
    ck_assert_int_eq(
        kvs_stream_read_frame(&c->ch, buf, sizeof buf, &len, deadline, err, sizeof err), KVS_OK);
    /* 16 copies of it asked for (32 MiB: more than the sockets hold), with 8 more bytes */
    kvs_wire_msg_init(&m, KVS_WIRE_GET, 2);
    m.entries = e;
    m.n_entries = N;
    kvs_wire_refusal why;
    ck_assert_int_eq(kvs_wire_encode(&m, buf + 4, sizeof buf - 12, &len, &why), KVS_OK);
    buf[0] = (uint8_t)(len >> 24);
    buf[1] = (uint8_t)(len >> 16);
    buf[2] = (uint8_t)(len >> 8);
    buf[3] = (uint8_t)len;
    memset(buf + 4 + len, 0, 8);
    buf[4 + len + 3] = 20; /* the next frame's length prefix, and more */
    ck_assert_int_eq(kvs_chan_send(&c->ch, buf, len + 12), (ssize_t)(len + 12));
    usleep(300000); /* the node has filled the socket and waits for room */
    unsigned long t0 = cpu_ticks(node.pid);
    usleep(1500000);
    unsigned long used = cpu_ticks(node.pid) - t0,
                  of = (unsigned long)(3 * sysconf(_SC_CLK_TCK) / 2);
    ck_assert_msg(used * 4 < of, "the node used %lu of %lu ticks while it waited", used, of);
    kvs_test_client_close(c);
    free(obj);
}
END_TEST

/* A tier whose psk_file is another tenant's key fails at create with a sentence naming the key, as
 * it does without encrypt; the node refused it in the TLS handshake. */
START_TEST(a_wrong_key_with_encrypt_fails_create_with_a_sentence) {
    kvs_test_remote_node_start_flag(&node, key_path, KVS_TEST_REMOTE_NODE_YAML, "--encrypt", "on");
    kvs_backend_option opts[] = {{"node", node.id},
                                 {"psk_file", wrong_key_path},
                                 {"tenant", "test-tenant"},
                                 {"timeout_ms", "2000"},
                                 {"encrypt", "true"}};
    char err[512] = "";
    void *s = NULL;
    kvs_status st = kvs_test_remote_create(opts, 5, err, sizeof err, &s, staging, STAGING_BYTES);
    ck_assert_int_eq(st, KVS_EIO);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(err, "refused authentication") && strstr(err, "check psk_file") &&
                      strstr(err, "TLS"),
                  "%s", err);
}
END_TEST

/* A TLS write to a connection the peer has gone from fails with EPIPE; it does not raise SIGPIPE
 * (a C engine that left SIGPIPE at its default would die of it). */
START_TEST(a_tls_write_to_a_gone_peer_raises_no_sigpipe) {
    ck_assert(signal(SIGPIPE, SIG_DFL) != SIG_ERR);
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    kvs_remote_psk key;
    uint8_t bytes[32];
    kvs_test_fill(bytes, sizeof bytes, 9);
    char err[256] = "";
    ck_assert_int_eq(kvs_remote_psk_set(&key, bytes, sizeof bytes, err, sizeof err), KVS_OK);
    kvs_tls *tls = NULL;
    ck_assert_int_eq(kvs_tls_client_new("tenant-a", &key, &tls, err, sizeof err), KVS_OK);
    kvs_chan ch;
    kvs_chan_plain(&ch, sv[0]);
    ck_assert_int_eq(kvs_tls_attach(tls, &ch, err, sizeof err), KVS_OK);
    close(sv[1]);
    ck_assert_int_eq(kvs_tls_handshake(&ch, err, sizeof err), KVS_EIO); /* its ClientHello */
    ck_assert_int_eq(kvs_chan_send(&ch, bytes, sizeof bytes), -1);
    kvs_chan_close(&ch);
    kvs_tls_free(tls);
    ck_assert(signal(SIGPIPE, SIG_IGN) != SIG_ERR);
}
END_TEST

/* A lookup across two encrypted nodes, one of them stopped: every node's request is written before
 * any answer is awaited, so the live node's answer is in when the stopped node's deadline passes,
 * and only the stopped node is marked down (asked one after the other, both were). */
START_TEST(a_stopped_encrypted_node_takes_no_other_node_down) {
    static kvs_test_node other;
    kvs_test_remote_node_start_flag(&node, key_path, KVS_TEST_REMOTE_NODE_YAML, "--encrypt", "on");
    kvs_test_remote_node_start_flag(&other, key_path, KVS_TEST_REMOTE_NODE_YAML, "--encrypt", "on");
    const kvs_backend_ops *ops = kvs_remote_backend();
    kvs_backend_option opts[] = {{"node", node.id},      {"node", other.id},
                                 {"psk_file", key_path}, {"tenant", "test-tenant"},
                                 {"timeout_ms", "1000"}, {"connect_backoff_ms", "30000"},
                                 {"encrypt", "true"}};
    char err[512] = "";
    void *s = NULL;
    ck_assert_int_eq(kvs_test_remote_create(opts, 7, err, sizeof err, &s, staging, STAGING_BYTES),
                     KVS_OK);
    enum { N = 24 };
    kvs_key keys[N];
    uint8_t obj[4096];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = kvs_test_remote_key(700 + i);
        kvs_test_fill(obj, sizeof obj, 700 + i);
        ck_assert_int_eq(ops->put(s, &keys[i], obj, sizeof obj), KVS_OK);
    }
    ck_assert_int_eq(kvs_remote_flush(s), KVS_OK);
    uint64_t n = 0;
    ck_assert_int_eq(ops->contains(s, keys, N, &n), KVS_OK);
    ck_assert_uint_eq(n, N);
    ck_assert_int_eq(kill(node.pid, SIGSTOP), 0);
    ck_assert_int_eq(ops->contains(s, keys, N, &n), KVS_OK); /* across both nodes */
    kvs_remote_stats_t stats;
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(5000);
    do { /* the tier's thread marks nodes down as its lookup's deadline passes */
        usleep(100000);
        ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    } while (stats.node_failures == 0 && kvs_test_now_ms() < until);
    usleep(200000);
    ck_assert_int_eq(kvs_remote_stats(s, &stats), KVS_OK);
    ck_assert_uint_eq(stats.node_failures, 1);
    ck_assert_uint_eq(stats.nodes_up, 1);
    uint64_t found = 0; /* the live node's keys, one lookup each */
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_int_eq(ops->contains(s, &keys[i], 1, &n), KVS_OK);
        found += n;
    }
    ck_assert_int_eq(kill(node.pid, SIGCONT), 0);
    ck_assert_msg(found > 0 && found < N, "%llu of %d keys found with one of two nodes stopped",
                  (unsigned long long)found, N);
    ops->destroy(s);
    (void)kvs_test_node_stop(&other);
}
END_TEST

/* Payload modes that carry objects over UCX in the clear cannot be combined with encrypt. */
START_TEST(encrypt_refuses_payloads_in_the_clear) {
    static const char *const modes[2] = {"rma", "messages"};
    kvs_backend_option opts[] = {{"node", "127.0.0.1:1"},
                                 {"psk_file", key_path},
                                 {"tenant", "test-tenant"},
                                 {"encrypt", "true"},
                                 {"payloads", modes[_i]}};
    kvs_remote_options o;
    char why[512] = "", refused[64] = "";
    ck_assert_int_eq(
        kvs_remote_options_parse_named(opts, 5, &o, why, sizeof why, refused, sizeof refused),
        KVS_ECONFIG);
    ck_assert_str_eq(refused, "payloads");
    ck_assert_msg(strstr(why, "in the clear"), "%s", why);
    opts[4].value = "stream";
    ck_assert_int_eq(kvs_remote_options_parse(opts, 5, &o, why, sizeof why), KVS_OK);
    ck_assert_int_eq(o.encrypt, 1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("remote_tls");
    TCase *tc = tcase_create("tls");
    tcase_add_checked_fixture(tc, keys_setup, keys_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, an_encrypted_tier_round_trips_and_the_wire_carries_no_object_byte);
    tcase_add_test(tc, plain_and_tls_peers_of_the_other_kind_are_refused_with_a_sentence);
    tcase_add_test(tc, a_tls_key_names_one_tenant_only);
    tcase_add_test(tc, an_encrypted_session_takes_nothing_over_ucx);
    tcase_add_loop_test(tc, encrypt_refuses_payloads_in_the_clear, 0, 2);
    tcase_add_test(tc, bytes_tls_holds_do_not_make_the_node_spin_while_it_waits_to_send);
    tcase_add_test(tc, a_wrong_key_with_encrypt_fails_create_with_a_sentence);
    tcase_add_test(tc, a_tls_write_to_a_gone_peer_raises_no_sigpipe);
    tcase_add_test(tc, a_stopped_encrypted_node_takes_no_other_node_down);
    suite_add_tcase(s, tc);
    SRunner *runner = srunner_create(s);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed ? 1 : 0;
}

#endif
