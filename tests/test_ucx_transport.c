/* test_ucx_transport.c - the UCX transport between this process (client) and a forked child
 * (server) on this host: endpoints from worker addresses swapped over pipes (as the remote tier swaps
 * them over its control connection), active messages, remote keys, RMA, timeouts, peer death, idle
 * CPU. */
#include <stdio.h>
#include <stdlib.h>

#ifndef KVS_HAVE_UCX
int main(void) {
    printf("test_ucx_transport: skipped, this build has no UCX\n");
    return 77;
}
#else

#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "abi/kvstrata_backend.h"
#include "backends/ucx/ucx_transport.h"
#include "tests/support/objects.h"
#include "tests/support/wait.h"

#define MIB        (1024u * 1024u)
#define RMA_BYTES  MIB
#define TIMEOUT_MS 5000

enum {
    AM_ECHO = 1,
    AM_ECHO_REPLY,
    AM_RKEY_REQUEST,
    AM_RKEY_REPLY,
    AM_CHECK,
    AM_CHECK_REPLY,
    AM_STALL,
    AM_PAYLOAD,      /* a payload message the server places (or refuses) */
    AM_PAYLOAD_REPLY /* what became of it: landed status, bytes as sent */
};

/* The header of a test payload message: where the server puts it, or a refusal. */
typedef struct payload_header {
    uint16_t id;
    uint8_t accept; /* 0: the server's place refuses it */
    uint8_t pad;
    uint32_t seed;   /* the bytes are kvs_test_fill(seed) */
    uint32_t offset; /* in the server's buffer */
} payload_header;

typedef struct payload_reply {
    uint16_t id;
    uint16_t pad;
    int32_t status; /* the landed call's */
    uint32_t seed;
    uint8_t match; /* the placed bytes are the sender's */
} payload_reply;

typedef struct rkey_header {
    uint64_t addr;
    uint64_t len;
} rkey_header;

/* UCX_TLS=tcp,sm,self, set before ucp_init (each side reads it at create): there is no RDMA
 * here, and without the restriction UCX also opens the ib/rdmacm modules and prints diagnostics
 * about missing devices. (UCX_MEM_* hook settings cannot be set this way: libucm reads them when
 * the library loads, before main; see backends/ucx/README.md for ASan.) */
static int ucx_env(void) {
    return setenv("UCX_TLS", "tcp,sm,self", 0);
}

/* ---- the server (forked child) --------------------------------------------------------------- */

typedef struct server {
    kvs_ucx_transport *t;
    kvs_ucx_conn *peer; /* to the client's worker address: replies go here */
    uint8_t *buf;
    kvs_ucx_mem *mem;
    int done;
} server;

static void server_am(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                      const void *data, size_t data_len);

static void server_dead(void *user, kvs_ucx_conn *conn, const char *why) {
    server *s = user;
    (void)why;
    kvs_ucx_conn_close(conn);
    s->done = 1;
}

/* The server's sends: one that fails ends the server, which the client sees as its peer dying. */
static void server_send(server *s, uint16_t id, const void *header, size_t header_len,
                        const void *data, size_t data_len) {
    if (kvs_ucx_am_send(s->peer, id, header, header_len, data, data_len, TIMEOUT_MS) != KVS_OK) {
        fprintf(stderr, "server: reply %u: %s\n", id, kvs_ucx_last_error(s->t));
        _exit(3);
    }
}

static void server_am(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                      const void *data, size_t data_len) {
    server *s = user;
    (void)conn; /* UCX may name an endpoint of its own as the sender */
    uint16_t id = 0;
    memcpy(&id, header, sizeof id); /* every test header starts with the message id */
    if (id == AM_ECHO) {
        uint16_t reply = AM_ECHO_REPLY;
        uint8_t h[64];
        memcpy(h, header, header_len);
        memcpy(h, &reply, sizeof reply);
        server_send(s, AM_ECHO_REPLY, h, header_len, data, data_len);
    } else if (id == AM_RKEY_REQUEST) {
        uint8_t blob[1024];
        size_t blob_len = 0;
        if (kvs_ucx_mem_pack(s->mem, blob, sizeof blob, &blob_len) != KVS_OK) blob_len = 0;
        struct {
            uint16_t id;
            rkey_header r;
        } h = {AM_RKEY_REPLY, {(uint64_t)(uintptr_t)s->buf, RMA_BYTES}};
        server_send(s, AM_RKEY_REPLY, &h, sizeof h, blob, blob_len);
    } else if (id == AM_CHECK) {
        uint32_t seed;
        memcpy(&seed, (const uint8_t *)header + 4, sizeof seed);
        uint8_t ok = (uint8_t)kvs_test_bytes_match(s->buf, RMA_BYTES, seed);
        uint16_t reply = AM_CHECK_REPLY;
        server_send(s, AM_CHECK_REPLY, &reply, sizeof reply, &ok, 1);
    } else if (id == AM_STALL) {
        for (;;) pause(); /* stop progressing until killed */
    }
    (void)data;
    (void)data_len;
}

/* Place a test payload in the server's buffer at the offset its header names, unless told not to. */
static void *server_place(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                          size_t data_len, void **cookie) {
    server *s = user;
    (void)conn;
    payload_header h;
    if (header_len != sizeof h) return NULL;
    memcpy(&h, header, sizeof h);
    *cookie = s;
    if (!h.accept || h.offset > RMA_BYTES || data_len > RMA_BYTES - h.offset) return NULL;
    return s->buf + h.offset;
}

static void server_landed(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                          void *dst, size_t data_len, void *cookie, kvs_status st) {
    server *s = user;
    (void)conn;
    payload_header h;
    if (header_len != sizeof h || cookie != s) _exit(4); /* the cookie travels to the landed call */
    memcpy(&h, header, sizeof h);
    payload_reply r = {.id = AM_PAYLOAD_REPLY, .status = st, .seed = h.seed};
    r.match = (uint8_t)(st == KVS_OK && dst == s->buf + h.offset &&
                        kvs_test_bytes_match(dst, data_len, h.seed));
    server_send(s, AM_PAYLOAD_REPLY, &r, sizeof r, NULL, 0);
}

#define MAX_ADDR 16384u

/* A worker address over a pipe: its length, then its bytes. */
static int addr_write(int fd, const uint8_t *addr, uint32_t len) {
    return write(fd, &len, sizeof len) == (ssize_t)sizeof len &&
                   write(fd, addr, len) == (ssize_t)len
               ? 0
               : -1;
}

static int addr_read(int fd, uint8_t *addr, uint32_t *len) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 10000) != 1 || read(fd, len, sizeof *len) != (ssize_t)sizeof *len ||
        *len == 0 || *len > MAX_ADDR)
        return -1;
    size_t got = 0;
    while (got < *len) {
        ssize_t k = read(fd, addr + got, *len - got);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

/* The server sends its worker address, takes the client's and connects back to it. */
static void server_main(int out_fd, int in_fd) {
    if (ucx_env() != 0) _exit(1);
    server s = {0};
    kvs_ucx_params p = {.struct_size = sizeof p,
                        .name = "test-server",
                        .log_level = KVS_LOG_ERROR,
                        .on_dead = server_dead,
                        .user = &s};
    char err[512];
    static uint8_t addr[MAX_ADDR];
    size_t len = 0;
    uint32_t alen = 0;
    if (kvs_ucx_create(&p, &s.t, err, sizeof err) != KVS_OK) {
        fprintf(stderr, "server: %s\n", err);
    } else {
        s.buf = malloc(RMA_BYTES);
        if (!s.buf) _exit(1);
        kvs_test_fill(s.buf, RMA_BYTES, 1);
        for (uint16_t id = AM_ECHO; id <= AM_STALL; id++)
            if (kvs_ucx_am_handler(s.t, id, server_am, &s) != KVS_OK) _exit(1);
        if (kvs_ucx_payload_handler(s.t, AM_PAYLOAD, server_place, server_landed, &s) != KVS_OK)
            _exit(1);
        if (kvs_ucx_mem_register(s.t, s.buf, RMA_BYTES, &s.mem) != KVS_OK ||
            kvs_ucx_worker_address(s.t, addr, sizeof addr, &len) != KVS_OK)
            len = 0;
    }
    alen = (uint32_t)len;
    if (addr_write(out_fd, addr, alen) != 0 || alen == 0 || close(out_fd) != 0) _exit(1);
    if (addr_read(in_fd, addr, &alen) != 0 ||
        kvs_ucx_connect_address(s.t, addr, alen, "test-client", 1, TIMEOUT_MS, &s.peer) != KVS_OK)
        _exit(1);
    while (!s.done) {
        kvs_status st = kvs_ucx_wait(s.t, 1000);
        if (st != KVS_OK && st != KVS_ETIMEDOUT) _exit(2);
    }
    kvs_ucx_destroy(s.t);
    free(s.buf);
    _exit(0);
}

typedef struct server_ref {
    pid_t pid;
    int to_server; /* the pipe the client's worker address goes into */
    uint8_t addr[MAX_ADDR];
    uint32_t addr_len;
} server_ref;

static void start_server(server_ref *srv) {
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    srv->pid = fork();
    ck_assert_int_ge(srv->pid, 0);
    if (srv->pid == 0) {
        /* a failed assertion in the client never reaches stop_server: die with the client */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || close(up[0]) != 0 || close(down[1]) != 0)
            _exit(1);
        server_main(up[1], down[0]);
    }
    ck_assert_int_eq(close(up[1]), 0);
    ck_assert_int_eq(close(down[0]), 0);
    ck_assert_msg(addr_read(up[0], srv->addr, &srv->addr_len) == 0,
                  "the server did not report its address");
    ck_assert_int_eq(close(up[0]), 0);
    srv->to_server = down[1];
}

/* Give the server our address (it connects back) and connect to its address. */
static kvs_status connect_server(kvs_ucx_transport *t, server_ref *srv, kvs_ucx_conn **conn) {
    static uint8_t addr[MAX_ADDR];
    size_t len = 0;
    ck_assert_int_eq(kvs_ucx_worker_address(t, addr, sizeof addr, &len), KVS_OK);
    ck_assert_int_eq(addr_write(srv->to_server, addr, (uint32_t)len), 0);
    return kvs_ucx_connect_address(t, srv->addr, srv->addr_len, "test-server", 1, TIMEOUT_MS, conn);
}

static void stop_server(server_ref *srv) {
    ck_assert_int_eq(kill(srv->pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(srv->pid, NULL, 0), srv->pid);
    ck_assert_int_eq(close(srv->to_server), 0);
}

/* ---- the client ------------------------------------------------------------------------------ */

typedef struct reply {
    int arrived;
    uint8_t header[64];
    size_t header_len;
    uint8_t *data;
    size_t data_len;
} reply;

static reply replies[AM_STALL + 1];
static int dead_count;
static char dead_why[256];

static void client_am(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                      const void *data, size_t data_len) {
    reply *r = user;
    (void)conn;
    free(r->data);
    r->arrived = 1;
    r->header_len = header_len < sizeof r->header ? header_len : sizeof r->header;
    memcpy(r->header, header, r->header_len);
    r->data = malloc(data_len ? data_len : 1);
    ck_assert_ptr_nonnull(r->data);
    memcpy(r->data, data, data_len);
    r->data_len = data_len;
}

static void client_dead(void *user, kvs_ucx_conn *conn, const char *why) {
    (void)user;
    (void)conn;
    dead_count++;
    snprintf(dead_why, sizeof dead_why, "%s", why);
}

/* The server's payload replies, in arrival order (one per payload message). */
static payload_reply payload_replies[8];
static int n_payload_replies;

static void client_payload_reply(void *user, kvs_ucx_conn *conn, const void *header,
                                 size_t header_len, const void *data, size_t data_len) {
    (void)user;
    (void)conn;
    (void)data;
    (void)data_len;
    if (header_len == sizeof(payload_reply) && n_payload_replies < 8)
        memcpy(&payload_replies[n_payload_replies++], header, sizeof(payload_reply));
}

static kvs_ucx_transport *client_create(void) {
    ck_assert_int_eq(ucx_env(), 0);
    kvs_ucx_params p = {.struct_size = sizeof p,
                        .name = "test-client",
                        .log_level = KVS_LOG_INFO,
                        .on_dead = client_dead};
    kvs_ucx_transport *t = NULL;
    char err[512];
    kvs_status rc = kvs_ucx_create(&p, &t, err, sizeof err);
    ck_assert_msg(rc == KVS_OK, "create: %s", err);
    for (uint16_t id = AM_ECHO_REPLY; id <= AM_CHECK_REPLY; id += 2)
        ck_assert_int_eq(kvs_ucx_am_handler(t, id, client_am, &replies[id]), KVS_OK);
    ck_assert_int_eq(kvs_ucx_am_handler(t, AM_PAYLOAD_REPLY, client_payload_reply, NULL), KVS_OK);
    return t;
}

static reply *await_reply(kvs_ucx_transport *t, uint16_t id) {
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(TIMEOUT_MS);
    while (!replies[id].arrived && kvs_test_now_ms() < until) {
        kvs_status st = kvs_ucx_wait(t, 100);
        ck_assert(st == KVS_OK || st == KVS_ETIMEDOUT);
    }
    ck_assert_msg(replies[id].arrived, "no reply %u within %d ms", id, TIMEOUT_MS);
    replies[id].arrived = 0;
    return &replies[id];
}

static void setup(void) {
    memset(replies, 0, sizeof replies);
    n_payload_replies = 0;
    dead_count = 0;
    dead_why[0] = '\0';
}

static void teardown(void) {
    for (size_t i = 0; i < sizeof replies / sizeof replies[0]; i++) free(replies[i].data);
}

static void echo(kvs_ucx_transport *t, kvs_ucx_conn *conn, size_t len, uint32_t seed) {
    uint8_t *payload = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(payload);
    kvs_test_fill(payload, len, seed);
    struct {
        uint16_t id;
        uint32_t seed;
    } h = {AM_ECHO, seed};
    kvs_status rc = kvs_ucx_am_send(conn, AM_ECHO, &h, sizeof h, payload, len, TIMEOUT_MS);
    ck_assert_msg(rc == KVS_OK, "send: %s", kvs_ucx_last_error(t));
    reply *r = await_reply(t, AM_ECHO_REPLY);
    ck_assert_uint_eq(r->header_len, sizeof h);
    ck_assert_uint_eq(r->data_len, len);
    ck_assert_msg(memcmp(r->data, payload, len) == 0, "the %zu-byte echo differs", len);
    free(payload);
}

static kvs_ucx_rkey *fetch_rkey(kvs_ucx_transport *t, kvs_ucx_conn *conn, uint64_t *remote_addr) {
    uint16_t id = AM_RKEY_REQUEST;
    ck_assert_int_eq(kvs_ucx_am_send(conn, AM_RKEY_REQUEST, &id, sizeof id, NULL, 0, TIMEOUT_MS),
                     KVS_OK);
    reply *r = await_reply(t, AM_RKEY_REPLY);
    rkey_header h;
    memcpy(&h, r->header + 8, sizeof h); /* after the id and padding of the server's struct */
    ck_assert_uint_eq(h.len, RMA_BYTES);
    ck_assert_uint_gt(r->data_len, 0);
    kvs_ucx_rkey *rkey = NULL;
    kvs_status rc = kvs_ucx_rkey_unpack(conn, r->data, r->data_len, &rkey);
    ck_assert_msg(rc == KVS_OK, "unpack: %s", kvs_ucx_last_error(t));
    *remote_addr = h.addr;
    return rkey;
}

START_TEST(connects_and_echoes_small_and_4mib_messages) {
    static server_ref srv;
    start_server(&srv);
    kvs_ucx_transport *t = client_create();
    kvs_ucx_conn *conn = NULL;
    kvs_status rc = connect_server(t, &srv, &conn);
    ck_assert_msg(rc == KVS_OK, "connect: %s", kvs_ucx_last_error(t));
    ck_assert(kvs_ucx_conn_alive(conn));
    printf("ucx loopback transports: %s\n", kvs_ucx_conn_transports(conn));
    ck_assert_str_ne(kvs_ucx_conn_transports(conn), "unknown");
    echo(t, conn, 100, 7);
    echo(t, conn, 4 * MIB, 8);
    echo(t, conn, 0, 9);
    kvs_ucx_conn_close(conn);
    kvs_ucx_destroy(t);
    stop_server(&srv);
}
END_TEST

START_TEST(rma_get_and_put_of_1mib_through_an_exchanged_key_are_byte_exact) {
    static server_ref srv;
    start_server(&srv);
    kvs_ucx_transport *t = client_create();
    kvs_ucx_conn *conn = NULL;
    ck_assert_int_eq(connect_server(t, &srv, &conn), KVS_OK);
    uint64_t remote = 0;
    kvs_ucx_rkey *rkey = fetch_rkey(t, conn, &remote);

    uint8_t *local = calloc(1, RMA_BYTES);
    ck_assert_ptr_nonnull(local);
    kvs_ucx_mem *mem = NULL;
    ck_assert_int_eq(kvs_ucx_mem_register(t, local, RMA_BYTES, &mem), KVS_OK);
    size_t blob_len = 0;
    uint8_t tiny[1];
    ck_assert_int_eq(kvs_ucx_mem_pack(mem, tiny, sizeof tiny, &blob_len), KVS_EOVERFLOW);
    ck_assert_uint_gt(blob_len, sizeof tiny);

    kvs_status rc = kvs_ucx_get(conn, local, RMA_BYTES, mem, remote, rkey, TIMEOUT_MS);
    ck_assert_msg(rc == KVS_OK, "get: %s", kvs_ucx_last_error(t));
    ck_assert_msg(kvs_test_bytes_match(local, RMA_BYTES, 1), "the 1 MiB get returned other bytes");

    kvs_test_fill(local, RMA_BYTES, 2);
    rc = kvs_ucx_put(conn, local, RMA_BYTES, mem, remote, rkey, TIMEOUT_MS);
    ck_assert_msg(rc == KVS_OK, "put: %s", kvs_ucx_last_error(t));
    struct {
        uint16_t id;
        uint32_t seed;
    } h = {AM_CHECK, 2};
    ck_assert_int_eq(kvs_ucx_am_send(conn, AM_CHECK, &h, sizeof h, NULL, 0, TIMEOUT_MS), KVS_OK);
    reply *r = await_reply(t, AM_CHECK_REPLY);
    ck_assert_uint_eq(r->data_len, 1);
    ck_assert_msg(r->data[0] == 1, "the server's buffer does not hold the put bytes");

    /* a get without a local registration works too (UCX registers on the fly) */
    uint8_t *plain = malloc(4096);
    ck_assert_ptr_nonnull(plain);
    ck_assert_int_eq(kvs_ucx_get(conn, plain, 4096, NULL, remote, rkey, TIMEOUT_MS), KVS_OK);
    ck_assert(memcmp(plain, local, 4096) == 0);
    free(plain);

    kvs_ucx_rkey_destroy(rkey);
    kvs_ucx_mem_deregister(mem);
    kvs_ucx_conn_close(conn);
    kvs_ucx_destroy(t);
    free(local);
    stop_server(&srv);
}
END_TEST

START_TEST(connect_to_the_address_of_a_dead_worker_fails_within_the_timeout) {
    static server_ref srv;
    start_server(&srv);
    stop_server(&srv); /* its address names ports nobody listens on any more */
    kvs_ucx_transport *t = client_create();
    kvs_ucx_conn *conn = (kvs_ucx_conn *)&srv;
    double start = kvs_test_now_ms();
    kvs_status rc =
        kvs_ucx_connect_address(t, srv.addr, srv.addr_len, "dead-server", 1, 2000, &conn);
    double elapsed = kvs_test_now_ms() - start;
    ck_assert_msg(rc == KVS_EIO || rc == KVS_ETIMEDOUT, "connect returned %d", rc);
    ck_assert_ptr_null(conn);
    ck_assert_msg(elapsed < 2500, "connect took %.0f ms", elapsed);
    ck_assert_msg(strstr(kvs_ucx_last_error(t), "dead-server") != NULL, "sentence: %s",
                  kvs_ucx_last_error(t));
    printf("refused connect (%.0f ms): %s\n", elapsed, kvs_ucx_last_error(t));
    ck_assert_int_eq(kvs_ucx_wait(t, 10), KVS_ETIMEDOUT);
    ck_assert_int_eq(dead_count, 0); /* a failed connect is reported by its status, not on_dead */
    kvs_ucx_destroy(t);
}
END_TEST

typedef struct killer {
    pid_t pid;
    int delay_ms;
    int killed; /* kill's result */
} killer;

/* A timer, by nature: the kill must land while a send is pending. */
static void *kill_later(void *arg) {
    killer *k = arg;
    kvs_test_pause_ms(k->delay_ms);
    k->killed = kill(k->pid, SIGKILL);
    return NULL;
}

static int dead_reported(void *arg) {
    kvs_status st = kvs_ucx_wait(arg, 10);
    ck_assert(st == KVS_OK || st == KVS_ETIMEDOUT);
    return dead_count > 0;
}

START_TEST(a_peer_killed_mid_operation_turns_it_into_an_error_before_the_timeout) {
    static server_ref srv;
    start_server(&srv);
    kvs_ucx_transport *t = client_create();
    kvs_ucx_conn *conn = NULL;
    ck_assert_int_eq(connect_server(t, &srv, &conn), KVS_OK);
    uint64_t remote = 0;
    kvs_ucx_rkey *rkey = fetch_rkey(t, conn, &remote);
    uint16_t id = AM_STALL;
    ck_assert_int_eq(kvs_ucx_am_send(conn, AM_STALL, &id, sizeof id, NULL, 0, TIMEOUT_MS), KVS_OK);

    /* Send 4 MiB messages to the stalled server until one fails. Whether the first send stays
     * pending (rendezvous) or lands in socket buffers depends on the transport UCX picks and on
     * the machine's load, so keep sending: once the buffers are full a send pends until the kill,
     * and the kill must turn it into an error, not a hang. */
    killer k = {srv.pid, 300, -1};
    pthread_t thread;
    ck_assert_int_eq(pthread_create(&thread, NULL, kill_later, &k), 0);
    uint8_t *big = calloc(1, 4 * MIB);
    ck_assert_ptr_nonnull(big);
    double start = kvs_test_now_ms(), elapsed = 0;
    kvs_status rc = KVS_OK;
    while (rc == KVS_OK && elapsed < 10000) {
        rc = kvs_ucx_am_send(conn, AM_ECHO, &id, sizeof id, big, 4 * MIB, 10000);
        elapsed = kvs_test_now_ms() - start;
    }
    ck_assert_int_eq(pthread_join(thread, NULL), 0);
    ck_assert_int_eq(k.killed, 0);
    ck_assert_msg(rc == KVS_EIO, "send returned %d after %.0f ms: %s", rc, elapsed,
                  kvs_ucx_last_error(t));
    ck_assert_msg(elapsed >= 250 && elapsed < 5000, "failed after %.0f ms", elapsed);
    ck_assert(!kvs_ucx_conn_alive(conn));
    printf("killed peer (%.0f ms): %s\n", elapsed, kvs_ucx_last_error(t));

    /* later operations fail at once, with the reason */
    start = kvs_test_now_ms();
    ck_assert_int_eq(kvs_ucx_get(conn, big, RMA_BYTES, NULL, remote, rkey, TIMEOUT_MS), KVS_EIO);
    ck_assert(kvs_test_now_ms() - start < 100);
    ck_assert_msg(strstr(kvs_ucx_last_error(t), "dead") != NULL, "%s", kvs_ucx_last_error(t));

    /* the owner hears of it once */
    ck_assert(kvs_test_wait_for(dead_reported, t, TIMEOUT_MS));
    kvs_status st = kvs_ucx_wait(t, 10);
    ck_assert(st == KVS_OK || st == KVS_ETIMEDOUT);
    ck_assert_int_eq(dead_count, 1);
    ck_assert_msg(strstr(dead_why, "test-server") != NULL, "%s", dead_why);
    kvs_ucx_conn_close(conn); /* also destroys rkey */
    kvs_ucx_destroy(t);
    free(big);
    ck_assert_int_eq(waitpid(srv.pid, NULL, 0), srv.pid);
    ck_assert_int_eq(close(srv.to_server), 0);
}
END_TEST

START_TEST(an_operation_past_its_timeout_fails_and_marks_the_connection_dead) {
    static server_ref srv;
    start_server(&srv);
    kvs_ucx_transport *t = client_create();
    kvs_ucx_conn *conn = NULL;
    ck_assert_int_eq(connect_server(t, &srv, &conn), KVS_OK);
    uint16_t id = AM_STALL;
    /* Freeze the whole server process (a stalled handler is not enough: UCX's own threads there
     * keep receiving over tcp). It reads nothing now, so once socket buffers are full a send cannot
     * complete. Send until one fails (the first ones may land in buffers). */
    ck_assert_int_eq(kill(srv.pid, SIGSTOP), 0);
    uint8_t *big = calloc(1, 4 * MIB);
    ck_assert_ptr_nonnull(big);
    kvs_status rc = KVS_OK;
    double elapsed = 0, total = 0;
    for (int i = 0; rc == KVS_OK && i < 64; i++) {
        double start = kvs_test_now_ms();
        rc = kvs_ucx_am_send(conn, AM_ECHO, &id, sizeof id, big, 4 * MIB, 300);
        elapsed = kvs_test_now_ms() - start;
        total += elapsed;
    }
    ck_assert_msg(rc == KVS_ETIMEDOUT, "send returned %d after %.0f ms in all: %s", rc, total,
                  kvs_ucx_last_error(t));
    ck_assert_msg(elapsed >= 290 && elapsed < 2000, "timed out after %.0f ms", elapsed);
    ck_assert(!kvs_ucx_conn_alive(conn));
    ck_assert_msg(strstr(kvs_ucx_last_error(t), "300 ms") != NULL, "%s", kvs_ucx_last_error(t));
    kvs_ucx_conn_close(conn);
    kvs_ucx_destroy(t);
    free(big);
    stop_server(&srv);
}
END_TEST

/* Payload messages: the receiver places small (eager) and large (rendezvous) data where it chose,
 * learns each one's fate once, and a refusal never writes anything; a refused large message fails
 * that send only, on the sender's side. */
START_TEST(payload_messages_land_where_the_receiver_places_them) {
    static server_ref srv;
    start_server(&srv);
    kvs_ucx_transport *t = client_create();
    kvs_ucx_conn *conn = NULL;
    ck_assert_int_eq(connect_server(t, &srv, &conn), KVS_OK);
    enum { N = 4 };
    static const size_t lens[N] = {100, 512 * 1024, 256 * 1024, 64};
    static const uint8_t accept[N] = {1, 1, 0, 0};
    static const uint32_t offsets[N] = {0, 4096, 0, 0};
    payload_header h[N];
    kvs_ucx_am_out out[N];
    uint8_t *data[N];
    for (int i = 0; i < N; i++) {
        data[i] = malloc(lens[i]);
        ck_assert_ptr_nonnull(data[i]);
        kvs_test_fill(data[i], lens[i], 40u + (uint32_t)i);
        h[i] = (payload_header){
            .id = AM_PAYLOAD, .accept = accept[i], .seed = 40u + (uint32_t)i, .offset = offsets[i]};
        out[i] = (kvs_ucx_am_out){
            .header = &h[i], .header_len = sizeof h[i], .data = data[i], .data_len = lens[i]};
    }
    kvs_status rc = kvs_ucx_am_send_many(conn, AM_PAYLOAD, out, N, TIMEOUT_MS);
    /* the refused rendezvous message fails its own send; whether UCX sent the 64-byte refused one
     * eagerly (it is then dropped on arrival) is UCX's choice, so only the large one is asserted */
    ck_assert_int_eq(rc, KVS_EIO);
    ck_assert_int_eq(out[0].status, KVS_OK);
    ck_assert_int_eq(out[1].status, KVS_OK);
    ck_assert_int_eq(out[2].status, KVS_EIO);
    ck_assert(kvs_ucx_conn_alive(conn)); /* a refusal is not a failure of the connection */
    int seen[N] = {0};
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(TIMEOUT_MS);
    while (n_payload_replies < N && kvs_test_now_ms() < until) kvs_ucx_wait(t, 100);
    ck_assert_int_eq(n_payload_replies, N); /* each message's fate, once */
    for (int k = 0; k < N; k++) {
        payload_reply pr = payload_replies[k];
        int i = (int)pr.seed - 40;
        ck_assert(i >= 0 && i < N && !seen[i]);
        seen[i] = 1;
        if (accept[i]) {
            ck_assert_int_eq(pr.status, KVS_OK);
            ck_assert_msg(pr.match, "payload %d landed with other bytes", i);
        } else {
            ck_assert_int_eq(pr.status, KVS_ENOTFOUND);
        }
    }
    echo(t, conn, 100, 3); /* the connection still carries messages */
    for (int i = 0; i < N; i++) free(data[i]);
    kvs_ucx_conn_close(conn);
    kvs_ucx_destroy(t);
    stop_server(&srv);
}
END_TEST

START_TEST(an_idle_wait_sleeps_instead_of_spinning) {
    static server_ref srv;
    start_server(&srv);
    kvs_ucx_transport *t = client_create();
    kvs_ucx_conn *conn = NULL;
    ck_assert_int_eq(connect_server(t, &srv, &conn), KVS_OK);
    echo(t, conn, 100, 3);
    ck_assert_int_ge(kvs_ucx_event_fd(t), 0);
    double cpu0 = kvs_test_cpu_ms(), wall0 = kvs_test_now_ms();
    while (kvs_test_now_ms() - wall0 < 300) {
        kvs_status st = kvs_ucx_wait(t, 300);
        ck_assert(st == KVS_OK || st == KVS_ETIMEDOUT);
    }
    double cpu = kvs_test_cpu_ms() - cpu0;
    double wall = kvs_test_now_ms() - wall0;
    printf("idle wait: %.1f ms CPU over %.0f ms\n", cpu, wall);
    ck_assert_msg(cpu < 50, "an idle 300 ms wait used %.1f ms of CPU", cpu);
    kvs_ucx_conn_close(conn);
    kvs_ucx_destroy(t);
    stop_server(&srv);
}
END_TEST

static Suite *ucx_suite(void) {
    Suite *s = suite_create("ucx_transport");
    TCase *tc = tcase_create("loopback");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, connects_and_echoes_small_and_4mib_messages);
    tcase_add_test(tc, rma_get_and_put_of_1mib_through_an_exchanged_key_are_byte_exact);
    tcase_add_test(tc, payload_messages_land_where_the_receiver_places_them);
    suite_add_tcase(s, tc);
    /* they measure time (a timeout against a dead or hung peer, idle CPU): run by
     * test_ucx_transport_timing (label timing) */
    TCase *timing = tcase_create("loopback_timing");
    tcase_set_tags(timing, "timing");
    tcase_add_checked_fixture(timing, setup, teardown);
    tcase_set_timeout(timing, 60);
    tcase_add_test(timing, connect_to_the_address_of_a_dead_worker_fails_within_the_timeout);
    tcase_add_test(timing, a_peer_killed_mid_operation_turns_it_into_an_error_before_the_timeout);
    tcase_add_test(timing, an_operation_past_its_timeout_fails_and_marks_the_connection_dead);
    tcase_add_test(timing, an_idle_wait_sleeps_instead_of_spinning);
    suite_add_tcase(s, timing);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(ucx_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
