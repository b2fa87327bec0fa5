/* test_node.c - the kvstrata-node daemon as a child process, driven by this process as a client on
 * 127.0.0.1 (handshake over the TCP control connection, requests over UCX): handshake, state checks,
 * put/lookup/get round trips through RMA, tenant isolation, malformed input, SIGTERM shutdown, and
 * hostile plain sockets (garbage, truncated frames, huge lengths, slowloris, floods). */
#include <stdio.h>
#include <stdlib.h>

#ifndef KVS_HAVE_UCX
int main(void) {
    printf("test_node: skipped, this build has no UCX\n");
    return 77;
}
#else

#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/ucx/auth.h"
#include "backends/ucx/control.h"
#include "backends/ucx/ucx_transport.h"
#include "backends/ucx/wire.h"
#include "common/clock.h"
#include "common/log.h"
#include "tests/support/test_support.h"
#include "tools/node/node.h" /* KVS_NODE_AM_ID */

#define TIMEOUT_MS   5000
#define KIB          1024u
#define MIB          (1024u * 1024u)
#define CLIENT_BYTES (4u * MIB) /* registered client memory: sources and destinations */

/* ---- the daemon ------------------------------------------------------------------------------ */

typedef struct daemon_proc {
    pid_t pid;
    int out_fd; /* its stdout */
    uint16_t port;
    char dir[512];
    char psk_path[600];
    uint8_t psk[32];
    char out[4096]; /* what it printed so far */
    size_t out_len;
} daemon_proc;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Read the daemon's stdout until `want` appears or deadline_ms passes; 1 if it appeared. */
static int read_until(daemon_proc *d, const char *want, int deadline_ms) {
    double until = now_ms() + deadline_ms;
    while (!strstr(d->out, want)) {
        int left = (int)(until - now_ms());
        if (left <= 0) return 0;
        struct pollfd p = {.fd = d->out_fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0) return 0;
        ssize_t k = read(d->out_fd, d->out + d->out_len, sizeof d->out - 1 - d->out_len);
        if (k <= 0) return strstr(d->out, want) != NULL;
        d->out_len += (size_t)k;
        d->out[d->out_len] = '\0';
    }
    return 1;
}

#define DRAM_YAML \
    "version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n    capacity: 32MiB\n"
/* 2 MiB of DRAM over an SSD tier: 1 MiB objects spill to the SSD tier after two puts. */
#define SSD_YAML                                                                                 \
    "version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n    capacity: 2MiB\n" \
    "  - name: ssd\n    type: ssd\n    capacity: 32MiB\n    paths: [ssd0]\n"

/* Settings from the `node:` section instead of flags (the key path relative to the config). */
#define NODE_SECTION                                                         \
    "node:\n  listen: 127.0.0.1:0\n  psk_file: node.key\n  max_clients: 8\n" \
    "  timeout_ms: 3000\n  max_object_bytes: 2MiB\n"

/* Start the daemon on yaml_text; from_yaml: its settings come from NODE_SECTION appended to it, and
 * the command line is only --config. */
static void daemon_start_as(daemon_proc *d, const char *yaml_text, uint32_t want_tiers,
                            int from_yaml) {
    memset(d, 0, sizeof *d);
    ck_assert_int_eq(kvs_test_tmpdir(d->dir, sizeof d->dir), 0);
    char ssd_dir[600];
    snprintf(ssd_dir, sizeof ssd_dir, "%s/ssd0", d->dir);
    ck_assert_int_eq(mkdir(ssd_dir, 0700), 0);
    for (size_t i = 0; i < sizeof d->psk; i++) d->psk[i] = (uint8_t)(i * 7 + 3);
    snprintf(d->psk_path, sizeof d->psk_path, "%s/node.key", d->dir);
    int fd = open(d->psk_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, d->psk, sizeof d->psk), (ssize_t)sizeof d->psk);
    close(fd);
    char yaml[700], text[2048];
    snprintf(text, sizeof text, "%s%s", yaml_text, from_yaml ? NODE_SECTION : "");
    ck_assert_int_eq(kvs_test_write_file(d->dir, "node.yaml", text, yaml, sizeof yaml), 0);
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a failed test never leaves a daemon behind */
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        close(pipefd[1]);
        if (from_yaml)
            execl(KVS_TEST_BIN_DIR "/kvstrata-node", "kvstrata-node", "--config", yaml,
                  (char *)NULL);
        execl(KVS_TEST_BIN_DIR "/kvstrata-node", "kvstrata-node", "--config", yaml, "--psk-file",
              d->psk_path, "--listen", "127.0.0.1:0", "--max-clients", "8", "--max-handshakes", "4",
              "--timeout-ms", "3000", "--max-object-bytes", "2MiB", (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    d->out_fd = pipefd[0];
    ck_assert_msg(read_until(d, "\n", 10000), "no readiness line; got \"%s\"", d->out);
    unsigned port = 0, tiers = 0;
    ck_assert_msg(
        sscanf(d->out, "kvstrata-node ready listen=127.0.0.1:%u tiers=%u", &port, &tiers) == 2,
        "readiness line: \"%s\"", d->out);
    ck_assert_uint_gt(port, 0);
    ck_assert_uint_eq(tiers, want_tiers);
    d->port = (uint16_t)port;
}

static void daemon_start(daemon_proc *d, const char *yaml_text, uint32_t want_tiers) {
    daemon_start_as(d, yaml_text, want_tiers, 0);
}

/* SIGTERM and reap; returns the wait status. */
static int daemon_stop(daemon_proc *d) {
    int status = -1;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        double until = now_ms() + 5000;
        while (waitpid(d->pid, &status, WNOHANG) == 0) {
            if (now_ms() > until) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, &status, 0);
                status = -1;
                break;
            }
            usleep(10000);
        }
        d->pid = 0;
    }
    if (d->out_fd > 0) {
        read_until(d, "bytes_out=", 1000);
        close(d->out_fd);
        d->out_fd = 0;
    }
    kvs_test_rmtree(d->dir);
    return status;
}

/* ---- the client ------------------------------------------------------------------------------ */

typedef struct client {
    kvs_ucx_transport *t;
    int ctl_fd; /* the control connection */
    kvs_control_reader rd;
    uint8_t frame[KVS_CONTROL_MAX_FRAME_BYTES + KVS_CONTROL_PREFIX_BYTES];
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES]; /* from AUTH_OK */
    kvs_ucx_conn *conn;                          /* to the node's worker address, after AUTH_OK */
    int node_proved; /* the node's CHALLENGE proved it holds this client's key */
    uint8_t reply[KVS_WIRE_MAX_MESSAGE_BYTES];
    size_t reply_len;
    int arrived;
    int dead;
    uint64_t next_id;
    kvs_wire_entry entries[KVS_WIRE_MAX_KEYS];
    uint8_t *mem; /* CLIENT_BYTES, registered */
    kvs_ucx_mem *mem_reg;
    uint8_t rkey[KVS_WIRE_MAX_RKEY_BYTES];
    size_t rkey_len;
} client;

static void client_am(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                      const void *data, size_t data_len) {
    client *c = user;
    (void)conn;
    (void)header;
    (void)header_len;
    c->arrived = 1;
    c->reply_len = data_len <= sizeof c->reply ? data_len : 0;
    if (c->reply_len) memcpy(c->reply, data, data_len);
}

static void client_dead(void *user, kvs_ucx_conn *conn, const char *why) {
    client *c = user;
    (void)conn;
    (void)why;
    c->dead = 1;
}

static client *client_open(const daemon_proc *d) {
    client *c = calloc(1, sizeof *c);
    ck_assert_ptr_nonnull(c);
    kvs_ucx_params p = {.struct_size = sizeof p,
                        .name = "test-node-client",
                        .log_level = KVS_LOG_ERROR,
                        .on_dead = client_dead,
                        .user = c};
    char err[512];
    ck_assert_msg(kvs_ucx_create(&p, &c->t, err, sizeof err) == KVS_OK, "create: %s", err);
    ck_assert_int_eq(kvs_ucx_am_handler(c->t, KVS_NODE_AM_ID, client_am, c), KVS_OK);
    ck_assert_msg(kvs_control_connect("127.0.0.1", d->port, kvs_now_ns() + TIMEOUT_MS * 1000000ull,
                                      &c->ctl_fd, err, sizeof err) == KVS_OK,
                  "connect: %s", err);
    c->mem = aligned_alloc(4096, CLIENT_BYTES);
    ck_assert_ptr_nonnull(c->mem);
    memset(c->mem, 0, CLIENT_BYTES);
    ck_assert_int_eq(kvs_ucx_mem_register(c->t, c->mem, CLIENT_BYTES, &c->mem_reg), KVS_OK);
    ck_assert_int_eq(kvs_ucx_mem_pack(c->mem_reg, c->rkey, sizeof c->rkey, &c->rkey_len), KVS_OK);
    c->next_id = 100;
    return c;
}

static void client_close(client *c) {
    kvs_ucx_conn_close(c->conn);
    if (c->ctl_fd >= 0) close(c->ctl_fd);
    kvs_ucx_mem_deregister(c->mem_reg);
    kvs_ucx_destroy(c->t);
    free(c->mem);
    free(c);
}

/* Send raw bytes and wait for one reply; 1 when a reply arrived. */
static int send_raw(client *c, const void *bytes, size_t len) {
    c->arrived = 0;
    if (!c->conn) return 0;
    if (kvs_ucx_am_send(c->conn, KVS_NODE_AM_ID, c->token, sizeof c->token, bytes, len,
                        TIMEOUT_MS) != KVS_OK)
        return 0;
    double until = now_ms() + TIMEOUT_MS;
    while (!c->arrived && !c->dead && now_ms() < until) {
        kvs_ucx_wait(c->t, 50);
        /* the node ends a session by closing its control connection */
        struct pollfd p = {.fd = c->ctl_fd, .events = POLLIN};
        if (!c->arrived && poll(&p, 1, 0) > 0) c->dead = 1;
    }
    return c->arrived;
}

/* Encode msg (its request_id is set here), send it, decode the reply into *rep. */
static void request(client *c, kvs_wire_msg *msg, kvs_wire_msg *rep) {
    static uint8_t buf[KVS_WIRE_MAX_MESSAGE_BYTES];
    size_t len = 0;
    kvs_wire_refusal why;
    msg->request_id = ++c->next_id;
    ck_assert_int_eq(kvs_wire_encode(msg, buf, sizeof buf, &len, &why), KVS_OK);
    ck_assert_msg(send_raw(c, buf, len), "no reply to %s", kvs_wire_type_name(msg->type));
    kvs_status st =
        kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, rep, &why);
    ck_assert_msg(st == KVS_OK, "reply does not decode: %s", why.text);
    ck_assert_uint_eq(rep->request_id, msg->request_id);
}

/* A request of one entry; the reply must be reply_type with one entry, which is returned. */
static const kvs_wire_entry *request_one(client *c, uint32_t type, uint32_t reply_type,
                                         kvs_wire_entry *e) {
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, (kvs_wire_type)type, 0);
    m.entries = e;
    m.n_entries = 1;
    request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, reply_type);
    ck_assert_uint_eq(rep.n_entries, 1);
    return &rep.entries[0]; /* points into c->entries */
}

/* Send msg on the control connection and wait for the node's next frame there (progressing UCX
 * meanwhile: the node wires up its endpoint to us before AUTH_OK), decoded into *rep; 0 when the
 * node closed the connection or said nothing within the timeout. */
static int control_request(client *c, kvs_wire_msg *msg, kvs_wire_msg *rep) {
    char err[256];
    size_t len = 0;
    msg->request_id = ++c->next_id;
    ck_assert_msg(kvs_control_encode(msg, c->frame, sizeof c->frame, &len, err, sizeof err) ==
                      KVS_OK,
                  "%s", err);
    if (kvs_control_write(c->ctl_fd, c->frame, len, kvs_now_ns() + TIMEOUT_MS * 1000000ull, err,
                          sizeof err) != KVS_OK)
        return 0;
    double until = now_ms() + TIMEOUT_MS;
    for (;;) {
        kvs_status st = kvs_control_read(&c->rd, c->ctl_fd, &len, err, sizeof err);
        if (st == KVS_OK) break;
        if (st != KVS_EAGAIN || now_ms() > until) return 0;
        kvs_ucx_progress(c->t);
        struct pollfd p[2] = {{.fd = c->ctl_fd, .events = POLLIN},
                              {.fd = kvs_ucx_event_fd(c->t), .events = POLLIN}};
        if (kvs_ucx_arm(c->t) == KVS_OK) poll(p, 2, 50);
    }
    kvs_wire_refusal why;
    ck_assert_msg(kvs_wire_decode(c->rd.frame, len, c->entries, KVS_WIRE_MAX_KEYS, rep, &why) ==
                      KVS_OK,
                  "control reply does not decode: %s", why.text);
    ck_assert_uint_eq(rep->request_id, msg->request_id);
    return 1;
}

/* 1 once the node has closed the control connection (EOF) within the timeout. */
static int control_closed(int fd) {
    double until = now_ms() + TIMEOUT_MS;
    uint8_t buf[256];
    while (now_ms() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return 1;
    }
    return 0;
}

/* HELLO + AUTH with the given key; returns the type of the answer to AUTH (AUTH_OK or ERROR). On
 * AUTH_OK the client makes its endpoint to the node's worker address and keeps the session token. */
static uint32_t handshake(client *c, const char *tenant, const uint8_t *psk_bytes, size_t psk_len,
                          uint32_t *error_code) {
    kvs_remote_psk psk;
    char err[256];
    ck_assert_int_eq(kvs_remote_psk_set(&psk, psk_bytes, psk_len, err, sizeof err), KVS_OK);
    uint8_t nonce[KVS_WIRE_NONCE_BYTES], challenge[KVS_WIRE_CHALLENGE_BYTES],
        proof[KVS_WIRE_PROOF_BYTES];
    ck_assert_int_eq(kvs_remote_random(nonce, sizeof nonce), KVS_OK);
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_HELLO, 0);
    m.tenant = tenant;
    m.tenant_len = (uint32_t)strlen(tenant);
    m.nonce = nonce;
    ck_assert_msg(control_request(c, &m, &rep), "no challenge");
    ck_assert_uint_eq(rep.type, KVS_WIRE_CHALLENGE);
    /* the node proves it holds the key before the client says anything of its own (the tier stops
     * here when it does not; a test client goes on, to see the node refuse a wrong proof) */
    c->node_proved = kvs_remote_node_proof_check(&psk, rep.challenge, nonce, tenant, strlen(tenant),
                                                 rep.proof, KVS_WIRE_PROOF_BYTES) == KVS_OK;
    memcpy(challenge, rep.challenge, sizeof challenge);
    ck_assert_int_eq(kvs_remote_auth_proof(&psk, challenge, nonce, tenant, strlen(tenant), proof),
                     KVS_OK);
    kvs_remote_psk_clear(&psk);
    uint8_t addr[KVS_WIRE_MAX_WORKER_ADDR_BYTES];
    size_t addr_len = 0;
    ck_assert_int_eq(kvs_ucx_worker_address(c->t, addr, sizeof addr, &addr_len), KVS_OK);
    kvs_wire_msg_init(&m, KVS_WIRE_AUTH, 0);
    m.proof = proof;
    m.worker_addr = addr;
    m.worker_addr_len = (uint32_t)addr_len;
    ck_assert_msg(control_request(c, &m, &rep), "no answer to auth");
    if (error_code) *error_code = rep.type == KVS_WIRE_ERROR ? rep.error_code : 0;
    if (rep.type == KVS_WIRE_AUTH_OK) {
        ck_assert_uint_gt(rep.worker_addr_len, 0);
        ck_assert_ptr_nonnull(rep.session_token);
        memcpy(c->token, rep.session_token, sizeof c->token);
        ck_assert_msg(kvs_ucx_connect_address(c->t, rep.worker_addr, rep.worker_addr_len, "node", 1,
                                              TIMEOUT_MS, &c->conn) == KVS_OK,
                      "connect: %s", kvs_ucx_last_error(c->t));
    }
    return rep.type;
}

static client *client_authed(const daemon_proc *d, const char *tenant) {
    client *c = client_open(d);
    ck_assert_uint_eq(handshake(c, tenant, d->psk, sizeof d->psk, NULL), KVS_WIRE_AUTH_OK);
    ck_assert(c->node_proved);
    return c;
}

static void fill(uint8_t *buf, size_t len, uint32_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)(x >> 24);
    }
}

static void make_key(uint8_t key[16], uint32_t n) {
    memset(key, 0, 16);
    memcpy(key, &n, sizeof n);
    key[15] = 0xA5;
}

/* PUT one object from client memory at offset off (RMA), or inline when inline_ok and it fits. */
static int32_t put_one(client *c, const uint8_t key[16], size_t off, size_t len, int use_inline) {
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    e.length = len;
    if (use_inline) {
        e.inline_data = c->mem + off;
    } else {
        e.remote_addr = (uint64_t)(uintptr_t)(c->mem + off);
        e.rkey = c->rkey;
        e.rkey_len = (uint32_t)c->rkey_len;
    }
    return request_one(c, KVS_WIRE_PUT, KVS_WIRE_PUT_REPLY, &e)->status;
}

/* GET one object into client memory at offset off with capacity cap; *len gets the reported length. */
static int32_t get_one(client *c, const uint8_t key[16], size_t off, size_t cap, uint64_t *len) {
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    e.remote_addr = (uint64_t)(uintptr_t)(c->mem + off);
    e.length = cap;
    e.rkey = c->rkey;
    e.rkey_len = (uint32_t)c->rkey_len;
    const kvs_wire_entry *r = request_one(c, KVS_WIRE_GET, KVS_WIRE_GET_REPLY, &e);
    *len = r->length;
    return r->status;
}

static uint8_t lookup_one(client *c, const uint8_t key[16]) {
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    return request_one(c, KVS_WIRE_LOOKUP, KVS_WIRE_LOOKUP_REPLY, &e)->present;
}

static void stats(client *c, uint64_t counters[KVS_WIRE_STATS_COUNT]) {
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_STATS, 0);
    request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, KVS_WIRE_STATS_REPLY);
    memcpy(counters, rep.counters, sizeof rep.counters);
}

static daemon_proc node;

static void setup(void) {
    setenv("UCX_TLS", "tcp,sm,self", 0);
    daemon_start(&node, DRAM_YAML, 1);
}

static void setup_ssd(void) {
    setenv("UCX_TLS", "tcp,sm,self", 0);
    daemon_start(&node, SSD_YAML, 2);
}

static void setup_from_yaml(void) {
    setenv("UCX_TLS", "tcp,sm,self", 0);
    daemon_start_as(&node, DRAM_YAML, 1, 1);
}

static void teardown(void) {
    daemon_stop(&node);
}

/* ---- tests ----------------------------------------------------------------------------------- */

START_TEST(handshake_with_the_right_key_is_accepted) {
    client *c = client_authed(&node, "tenant-a");
    uint64_t s[KVS_WIRE_STATS_COUNT];
    stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_AUTH_FAILURES], 0);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_CAPACITY_BYTES], 32u * MIB);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_OBJECTS], 0);
    client_close(c);
}
END_TEST

START_TEST(handshake_with_a_wrong_key_is_refused_and_the_connection_closed) {
    client *c = client_open(&node);
    uint8_t wrong[32];
    memcpy(wrong, node.psk, sizeof wrong);
    wrong[5] ^= 1;
    uint32_t code = 0;
    ck_assert_uint_eq(handshake(c, "tenant-a", wrong, sizeof wrong, &code), KVS_WIRE_ERROR);
    ck_assert(
        !c->node_proved); /* to a client with another key the node's proof does not check out */
    ck_assert_uint_eq(code, KVS_WIRE_ERR_AUTH);
    ck_assert_ptr_null(c->conn); /* no UCX endpoint was made */
    ck_assert_msg(control_closed(c->ctl_fd), "the node kept the connection after a wrong proof");
    client_close(c);
    /* A good client is still served and sees the failure counted. */
    c = client_authed(&node, "tenant-a");
    uint64_t s[KVS_WIRE_STATS_COUNT];
    stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_AUTH_FAILURES], 1);
    client_close(c);
}
END_TEST

START_TEST(requests_before_the_handshake_are_refused_with_state) {
    client *c = client_open(&node);
    uint8_t key[16];
    make_key(key, 1);
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_LOOKUP, 0);
    m.entries = &e;
    m.n_entries = 1;
    ck_assert(control_request(c, &m, &rep));
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_STATE);
    ck_assert_msg(control_closed(c->ctl_fd),
                  "the node kept a connection that sent a lookup before hello");
    client_close(c);
    c = client_open(&node);
    uint8_t proof[KVS_WIRE_PROOF_BYTES] = {0}, addr[1] = {1};
    kvs_wire_msg_init(&m, KVS_WIRE_AUTH, 0); /* AUTH without HELLO: no challenge yet */
    m.proof = proof;
    m.worker_addr = addr;
    m.worker_addr_len = 1;
    ck_assert(control_request(c, &m, &rep));
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_STATE);
    ck_assert_msg(control_closed(c->ctl_fd),
                  "the node kept a connection that sent auth before hello");
    client_close(c);
    c = client_authed(&node, "tenant-a");
    ck_assert_uint_eq(lookup_one(c, key), 0);
    /* HELLO again after AUTH_OK (over UCX): STATE, and the session stays authenticated. */
    uint8_t nonce[KVS_WIRE_NONCE_BYTES] = {0};
    kvs_wire_msg_init(&m, KVS_WIRE_HELLO, 0);
    m.tenant = "tenant-b";
    m.tenant_len = 8;
    m.nonce = nonce;
    request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_STATE);
    ck_assert_uint_eq(lookup_one(c, key), 0);
    client_close(c);
}
END_TEST

START_TEST(a_request_naming_no_session_is_dropped) {
    client *c = client_authed(&node, "tenant-a");
    uint8_t key[16];
    make_key(key, 2);
    c->token[0] ^= 0xff; /* a token the node never handed out */
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_LOOKUP, 1);
    m.entries = &e;
    m.n_entries = 1;
    uint8_t buf[256];
    size_t len = 0;
    kvs_wire_refusal why;
    ck_assert_int_eq(kvs_wire_encode(&m, buf, sizeof buf, &len, &why), KVS_OK);
    c->arrived = 0;
    ck_assert_int_eq(
        kvs_ucx_am_send(c->conn, KVS_NODE_AM_ID, c->token, sizeof c->token, buf, len, TIMEOUT_MS),
        KVS_OK);
    double until = now_ms() + 500;
    while (!c->arrived && now_ms() < until) kvs_ucx_wait(c->t, 50);
    ck_assert_msg(!c->arrived, "the node answered a request with a wrong session token");
    c->token[0] ^= 0xff;
    ck_assert_uint_eq(lookup_one(c, key), 0);
    client_close(c);
}
END_TEST

/* ---- hostile plain sockets ----------------------------------------------------------------------- */

/* A plain TCP connection to addr (sin_addr.s_addr) and port. */
static int raw_connect_to(uint32_t addr, uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    sin.sin_addr.s_addr = addr;
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof sin), 0);
    return fd;
}

static int raw_connect(uint16_t port) {
    return raw_connect_to(htonl(INADDR_LOOPBACK), port);
}

/* Connect, send bytes (as many as the peer takes before it closes), close at once. */
static void raw_send_close_to(uint32_t addr, uint16_t port, const void *bytes, size_t len) {
    int fd = raw_connect_to(addr, port);
    ssize_t sent = send(fd, bytes, len, MSG_NOSIGNAL);
    ck_assert_int_ge(sent, 0);
    close(fd);
}

static void raw_send_close(uint16_t port, const void *bytes, size_t len) {
    int fd = raw_connect(port);
    ck_assert_int_eq(send(fd, bytes, len, MSG_NOSIGNAL), (ssize_t)len);
    close(fd);
}

static int daemon_alive(const daemon_proc *d) {
    int status;
    return waitpid(d->pid, &status, WNOHANG) == 0;
}

static unsigned fd_count(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    ck_assert_ptr_nonnull(dir);
    unsigned n = 0;
    for (struct dirent *de; (de = readdir(dir)) != NULL;) n += de->d_name[0] != '.';
    closedir(dir);
    return n;
}

/* A fresh client authenticates and moves a 64 KiB object through the node. */
static void a_real_client_is_served(const daemon_proc *d, uint32_t seed) {
    client *c = client_authed(d, "tenant-real");
    uint8_t key[16];
    make_key(key, 1000 + seed);
    fill(c->mem, 64 * KIB, seed);
    ck_assert_int_eq(put_one(c, key, 0, 64 * KIB, 0), KVS_OK);
    uint64_t len = 0;
    ck_assert_int_eq(get_one(c, key, MIB, 64 * KIB, &len), KVS_OK);
    ck_assert_uint_eq(len, 64 * KIB);
    ck_assert_int_eq(memcmp(c->mem + MIB, c->mem, 64 * KIB), 0);
    client_close(c);
}

static void node_counters(const daemon_proc *d, uint64_t s[KVS_WIRE_STATS_COUNT]) {
    client *c = client_authed(d, "tenant-stats");
    stats(c, s);
    client_close(c);
}

START_TEST(garbage_truncated_frames_and_huge_lengths_from_plain_sockets_leave_the_node_serving) {
    uint8_t zeros[64] = {0};
    raw_send_close(node.port, zeros,
                   sizeof zeros); /* aborted UCX 1.13's sockaddr listener (issue #14) */
    uint8_t junk[4096];
    fill(junk, sizeof junk, 77);
    raw_send_close(node.port, junk, sizeof junk);
    uint8_t truncated[4 + 50];
    memset(truncated, 0x93, sizeof truncated);
    truncated[0] = 0, truncated[1] = 0, truncated[2] = 0,
    truncated[3] = 100; /* announces 100, sends 50 */
    raw_send_close(node.port, truncated, sizeof truncated);
    uint8_t huge[4 + 4096];
    memset(huge, 0xab, sizeof huge);
    huge[0] = huge[1] = huge[2] = huge[3] = 0xff; /* 4 GiB announced */
    raw_send_close(node.port, huge, sizeof huge);
    /* a well-framed message that is not msgpack */
    uint8_t framed[4 + 16] = {0, 0, 0, 16};
    memset(framed + 4, 0xc1, 16);
    raw_send_close(node.port, framed, sizeof framed);
    ck_assert_msg(daemon_alive(&node), "the node died of garbage from a plain socket");
    a_real_client_is_served(&node, 1);
    uint64_t s[KVS_WIRE_STATS_COUNT];
    node_counters(&node, s);
    /* each is refused, or closed at accept when the other four still hold the handshake slots */
    ck_assert_uint_ge(s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] + s[KVS_WIRE_STAT_CONNECTIONS_REJECTED],
                      5);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_AUTH_FAILURES], 0);
    ck_assert(daemon_alive(&node));
}
END_TEST

/* The IPv4 TCP sockets pid listens on other than port `skip` (its UCX transport's own listeners), up to
 * max: their addresses (as sin_addr.s_addr, 0 for any) and ports. */
static unsigned listening_ports(pid_t pid, uint16_t skip, uint32_t *addrs, uint16_t *ports,
                                unsigned max) {
    char path[64], line[512];
    unsigned long long inodes[64];
    unsigned n_inodes = 0, n = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    ck_assert_ptr_nonnull(dir);
    for (struct dirent *de; (de = readdir(dir)) != NULL && n_inodes < 64;) {
        char link[128], target[128];
        snprintf(link, sizeof link, "%s/%s", path, de->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = '\0';
        if (sscanf(target, "socket:[%llu]", &inodes[n_inodes]) == 1) n_inodes++;
    }
    closedir(dir);
    snprintf(path, sizeof path, "/proc/%d/net/tcp", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f) && n < max) {
        unsigned addr, port, state;
        unsigned long long inode;
        if (sscanf(line, " %*u: %x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %llu", &addr, &port,
                   &state, &inode) != 4 ||
            state != 0x0a || port == skip)
            continue;
        for (unsigned i = 0; i < n_inodes; i++)
            if (inodes[i] ==
                inode) { /* /proc prints the address as the host-order view of its bytes */
                addrs[n] = addr ? addr : htonl(INADDR_LOOPBACK);
                ports[n++] = (uint16_t)port;
            }
    }
    fclose(f);
    return n;
}

/* Nothing of ours listens there, but UCX's tcp transport does (endpoints from worker addresses reach
 * it): whatever a plain socket sends to those ports must not take the node down either. */
START_TEST(garbage_sent_to_the_nodes_ucx_ports_leaves_it_serving) {
    uint16_t ports[16];
    uint32_t addrs[16];
    unsigned n = listening_ports(node.pid, node.port, addrs, ports, 16);
    ck_assert_msg(n >= 1, "no UCX listening port found beside the control port %u", node.port);
    printf("garbage sent to %u UCX listening port(s) of the node, first %u\n", n, ports[0]);
    uint8_t zeros[64] = {0}, junk[65536],
            huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    fill(junk, sizeof junk, 91);
    for (unsigned i = 0; i < n; i++) {
        raw_send_close_to(addrs[i], ports[i], zeros, sizeof zeros);
        raw_send_close_to(addrs[i], ports[i], junk, sizeof junk);
        raw_send_close_to(addrs[i], ports[i], huge, sizeof huge);
        int fd = raw_connect_to(addrs[i], ports[i]); /* a trickle that stops halfway */
        for (int b = 0; b < 3; b++) {
            send(fd, junk + b, 1, MSG_NOSIGNAL);
            usleep(100 * 1000);
        }
        close(fd);
    }
    usleep(200 * 1000);
    ck_assert_msg(daemon_alive(&node), "the node died of garbage sent to a UCX port");
    a_real_client_is_served(&node, 3);
    ck_assert(daemon_alive(&node));
}
END_TEST

START_TEST(a_slowloris_is_closed_at_the_handshake_deadline_while_others_are_served) {
    /* a valid prefix, then one byte every 400 ms: never a whole frame before the 3 s deadline */
    int fd = raw_connect(node.port);
    const uint8_t prefix[4] = {0, 0, 0, 200};
    ck_assert_int_eq(send(fd, prefix, sizeof prefix, MSG_NOSIGNAL), 4);
    int closed = 0;
    uint8_t b = 0x93;
    for (int i = 0; i < 30 && !closed; i++) {
        if (i == 2) a_real_client_is_served(&node, 2); /* not stalled by the trickle */
        if (send(fd, &b, 1, MSG_NOSIGNAL) != 1) closed = 1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 400) > 0) {
            uint8_t buf[64];
            ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN)) closed = 1;
        }
    }
    close(fd);
    ck_assert_msg(closed, "the node kept a handshake that trickled bytes for 12 s");
    ck_assert(daemon_alive(&node));
    uint64_t s[KVS_WIRE_STATS_COUNT];
    node_counters(&node, s);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_HANDSHAKE_TIMEOUTS], 1);
}
END_TEST

START_TEST(two_thousand_junk_connections_do_not_grow_the_nodes_file_descriptors) {
    a_real_client_is_served(&node, 3); /* the node's own fds for UCX are made by now */
    unsigned before = fd_count(node.pid);
    uint8_t junk[4 + 4096];
    memset(junk, 0x5a, sizeof junk);
    junk[0] = 0x7f, junk[1] = 0xff, junk[2] = 0xff,
    junk[3] = 0xff; /* a huge length, a few KB, close */
    for (int i = 0; i < 2000; i++) raw_send_close(node.port, junk, sizeof junk);
    uint64_t s[KVS_WIRE_STATS_COUNT];
    double until = now_ms() + 20000;
    do {
        usleep(100000);
        node_counters(&node, s);
    } while (s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] + s[KVS_WIRE_STAT_CONNECTIONS_REJECTED] < 2000 &&
             now_ms() < until);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] + s[KVS_WIRE_STAT_CONNECTIONS_REJECTED],
                      2000);
    unsigned after = fd_count(node.pid);
    printf("node fds before 2000 junk connections: %u, after: %u (refused %llu, rejected at accept "
           "%llu)\n",
           before, after, (unsigned long long)s[KVS_WIRE_STAT_HANDSHAKE_REFUSALS],
           (unsigned long long)s[KVS_WIRE_STAT_CONNECTIONS_REJECTED]);
    ck_assert_msg(after <= before + 2, "node fds grew from %u to %u", before, after);
    a_real_client_is_served(&node, 4);
}
END_TEST

START_TEST(connections_over_the_handshake_cap_are_refused_while_a_session_is_served) {
    client *c = client_authed(&node, "tenant-a"); /* authenticated before the flood */
    int idle[10];
    for (int i = 0; i < 10; i++)
        idle[i] = raw_connect(node.port); /* say nothing: hold handshake slots */
    int refused = 0;
    for (int i = 0; i < 10; i++) {
        struct pollfd p = {.fd = idle[i], .events = POLLIN};
        uint8_t buf[8];
        if (poll(&p, 1, i < 4 ? 0 : 1000) > 0 && recv(idle[i], buf, sizeof buf, MSG_DONTWAIT) == 0)
            refused++;
    }
    ck_assert_int_eq(refused, 6); /* --max-handshakes 4: the first 4 hold, the other 6 are closed */
    uint8_t key[16];
    make_key(key, 3000);
    fill(c->mem, 64 * KIB, 9);
    ck_assert_int_eq(put_one(c, key, 0, 64 * KIB, 0), KVS_OK);
    uint64_t len = 0;
    ck_assert_int_eq(get_one(c, key, MIB, 64 * KIB, &len), KVS_OK);
    ck_assert_int_eq(memcmp(c->mem + MIB, c->mem, 64 * KIB), 0);
    uint64_t s[KVS_WIRE_STATS_COUNT];
    stats(c, s);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_CONNECTIONS_REJECTED], 6);
    for (int i = 0; i < 10; i++) close(idle[i]);
    client_close(c);
    a_real_client_is_served(&node, 5); /* slots free again once the idle ones are gone */
}
END_TEST

START_TEST(put_lookup_get_round_trip_64k_1m_and_inline_objects) {
    client *c = client_authed(&node, "tenant-a");
    const size_t sizes[3] = {64 * KIB, MIB, 1000};
    const size_t src_off[3] = {0, 64 * KIB, 64 * KIB + MIB};
    uint8_t keys[4][16];
    for (uint32_t i = 0; i < 4; i++) make_key(keys[i], 10 + i);
    for (uint32_t i = 0; i < 3; i++) {
        fill(c->mem + src_off[i], sizes[i], 50 + i);
        ck_assert_int_eq(put_one(c, keys[i], src_off[i], sizes[i], i == 2), KVS_OK);
    }
    for (uint32_t i = 0; i < 3; i++) ck_assert_uint_eq(lookup_one(c, keys[i]), 1);
    ck_assert_uint_eq(lookup_one(c, keys[3]), 0);

    const size_t dst = 2 * MIB;
    for (uint32_t i = 0; i < 3; i++) {
        memset(c->mem + dst, 0, MIB + 4096);
        uint64_t len = 0;
        ck_assert_int_eq(get_one(c, keys[i], dst, MIB + 4096, &len), KVS_OK);
        ck_assert_uint_eq(len, sizes[i]);
        ck_assert_msg(memcmp(c->mem + dst, c->mem + src_off[i], sizes[i]) == 0, "object %u differs",
                      i);
        ck_assert_uint_eq(c->mem[dst + sizes[i]], 0); /* nothing written past the object */
    }
    uint64_t len = 7;
    ck_assert_int_eq(get_one(c, keys[3], dst, MIB, &len), KVS_ENOTFOUND);
    ck_assert_uint_eq(len, 0);
    memset(c->mem + dst, 0xEE, 64 * KIB);
    ck_assert_int_eq(get_one(c, keys[1], dst, 64 * KIB, &len),
                     KVS_EOVERFLOW); /* 1 MiB into 64 KiB */
    ck_assert_uint_eq(len, MIB);
    ck_assert_uint_eq(c->mem[dst], 0xEE); /* the destination is untouched */

    uint64_t s[KVS_WIRE_STATS_COUNT];
    stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_OBJECTS], 3);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_PUTS], 3);
    ck_assert_uint_ge(s[KVS_WIRE_STAT_BYTES_USED], 64 * KIB + MIB + 1000);

    /* DELETE, then the key is gone. */
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = keys[0];
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_DELETE, 0);
    m.entries = &e;
    m.n_entries = 1;
    request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, KVS_WIRE_DELETE_REPLY);
    ck_assert_int_eq(rep.entries[0].status, KVS_OK);
    ck_assert_uint_eq(lookup_one(c, keys[0]), 0);
    client_close(c);
}
END_TEST

START_TEST(tenants_cannot_see_or_overwrite_each_others_objects) {
    client *a = client_authed(&node, "alice");
    client *b = client_authed(&node, "bob");
    uint8_t key[16];
    make_key(key, 77);
    fill(a->mem, 64 * KIB, 1);
    fill(b->mem, 64 * KIB, 2);
    ck_assert_int_eq(put_one(a, key, 0, 64 * KIB, 0), KVS_OK);
    ck_assert_uint_eq(lookup_one(b, key), 0);
    uint64_t len = 0;
    ck_assert_int_eq(get_one(b, key, MIB, 64 * KIB, &len), KVS_ENOTFOUND);
    ck_assert_int_eq(put_one(b, key, 0, 64 * KIB, 0),
                     KVS_OK); /* bob's own object of the same key */
    ck_assert_int_eq(get_one(a, key, MIB, 64 * KIB, &len), KVS_OK);
    ck_assert_uint_eq(len, 64 * KIB);
    ck_assert_msg(memcmp(a->mem + MIB, a->mem, 64 * KIB) == 0, "alice reads bob's bytes");
    ck_assert_int_eq(get_one(b, key, MIB, 64 * KIB, &len), KVS_OK);
    ck_assert_msg(memcmp(b->mem + MIB, b->mem, 64 * KIB) == 0, "bob reads alice's bytes");
    client_close(a);
    client_close(b);
}
END_TEST

START_TEST(malformed_messages_get_an_error_and_the_node_keeps_serving) {
    client *c = client_authed(&node, "tenant-a");
    kvs_wire_msg rep;
    kvs_wire_refusal why;
    const uint8_t garbage[] = {0xc1, 0xff, 0x00, 0x13};
    ck_assert(send_raw(c, garbage, sizeof garbage));
    ck_assert_int_eq(
        kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why), KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_ne(rep.error_code, KVS_WIRE_ERR_NONE);

    /* A valid LOOKUP cut short: TRUNCATED, naming its request id. */
    uint8_t buf[256], key[16];
    make_key(key, 5);
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, KVS_WIRE_LOOKUP, 4242);
    m.entries = &e;
    m.n_entries = 1;
    size_t len = 0;
    ck_assert_int_eq(kvs_wire_encode(&m, buf, sizeof buf, &len, &why), KVS_OK);
    ck_assert(send_raw(c, buf, len - 3));
    ck_assert_int_eq(
        kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, &rep, &why), KVS_OK);
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_TRUNCATED);
    ck_assert_uint_eq(rep.request_id, 4242);

    /* A reply type sent as a request. */
    kvs_wire_msg_init(&m, KVS_WIRE_AUTH_OK, 0);
    request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, KVS_WIRE_ERROR);
    ck_assert_uint_eq(rep.error_code, KVS_WIRE_ERR_STATE);

    /* Still serving on the same connection. */
    ck_assert_uint_eq(lookup_one(c, key), 0);
    ck_assert(!c->dead);
    client_close(c);
}
END_TEST

START_TEST(a_peer_that_keeps_sending_garbage_is_disconnected) {
    client *c = client_authed(&node, "tenant-a");
    const uint8_t garbage[] = {0x93, 0x01};
    int answered = 0;
    for (int i = 0; i < 40 && !c->dead; i++) answered += send_raw(c, garbage, sizeof garbage);
    ck_assert_msg(control_closed(c->ctl_fd), "the node kept an abusive session");
    ck_assert_int_ge(answered, 16);
    ck_assert_int_le(answered, 17);
    client_close(c);
    c = client_authed(&node, "tenant-a"); /* others are still served */
    client_close(c);
}
END_TEST

START_TEST(sigterm_stops_the_node_with_status_0_and_a_stats_line) {
    client *c = client_authed(&node, "tenant-a");
    uint8_t key[16];
    make_key(key, 9);
    fill(c->mem, 64 * KIB, 3);
    ck_assert_int_eq(put_one(c, key, 0, 64 * KIB, 0), KVS_OK);
    double t0 = now_ms();
    int status = daemon_stop(&node);
    double took = now_ms() - t0;
    ck_assert_msg(status != -1, "the node did not exit within 5 s of SIGTERM");
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    ck_assert_msg(took < 3000, "shutdown took %.0f ms", took);
    ck_assert_msg(strstr(node.out, "kvstrata-node stopped on SIGTERM") != NULL, "output: %s",
                  node.out);
    ck_assert_msg(strstr(node.out, " puts=1 ") != NULL, "output: %s", node.out);
    ck_assert_msg(strstr(node.out, " bytes_in=65536 ") != NULL, "output: %s", node.out);
    client_close(c);
}
END_TEST

START_TEST(objects_evicted_to_the_ssd_tier_are_still_served) {
    client *c = client_authed(&node, "tenant-a");
    uint8_t keys[4][16];
    for (uint32_t i = 0; i < 4; i++) {
        make_key(keys[i], 200 + i);
        fill(c->mem, MIB, 90 + i);
        ck_assert_int_eq(put_one(c, keys[i], 0, MIB, 0), KVS_OK);
    }
    uint64_t s[KVS_WIRE_STATS_COUNT];
    stats(c, s);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_CAPACITY_BYTES], 34u * MIB);
    ck_assert_uint_eq(s[KVS_WIRE_STAT_EVICTIONS], 0); /* nothing fell off the last tier */
    for (uint32_t i = 0; i < 4; i++) {
        ck_assert_uint_eq(lookup_one(c, keys[i]), 1);
        uint64_t len = 0;
        memset(c->mem + 2 * MIB, 0, MIB);
        ck_assert_int_eq(get_one(c, keys[i], 2 * MIB, MIB, &len), KVS_OK);
        ck_assert_uint_eq(len, MIB);
        fill(c->mem, MIB, 90 + i);
        ck_assert_msg(memcmp(c->mem + 2 * MIB, c->mem, MIB) == 0, "object %u differs", i);
    }
    client_close(c);
}
END_TEST

/* Started with --config only: listen address, key file (relative to the config), limits from node:. */
START_TEST(settings_come_from_the_node_section_of_the_config) {
    client *c = client_authed(&node, "tenant-y");
    uint8_t key[16];
    make_key(key, 7);
    fill(c->mem, 3 * MIB, 7);
    ck_assert_int_eq(put_one(c, key, 0, MIB, 0), KVS_OK);
    ck_assert_int_ne(put_one(c, key, 0, 3 * MIB, 0),
                     KVS_OK); /* over node.max_object_bytes (2MiB) */
    uint64_t len = 0;
    ck_assert_int_eq(get_one(c, key, 3 * MIB, MIB, &len), KVS_OK);
    ck_assert_uint_eq(len, MIB);
    ck_assert_int_eq(memcmp(c->mem + 3 * MIB, c->mem, MIB), 0);
    client_close(c);
}
END_TEST

/* Run the node on a config text with extra arguments; returns its exit status, its stderr in err. */
static int node_exit_status(const char *yaml_text, const char *extra, char *err, size_t err_len) {
    char dir[512], yaml[700];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    ck_assert_int_eq(kvs_test_write_file(dir, "node.yaml", yaml_text, yaml, sizeof yaml), 0);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "%s/kvstrata-node --config %s %s 2>&1 >/dev/null", KVS_TEST_BIN_DIR,
             yaml, extra);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(err, 1, err_len - 1, f);
    err[n] = '\0';
    int status = pclose(f);
    kvs_test_rmtree(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

START_TEST(a_bad_node_section_or_no_key_file_is_refused_with_a_sentence) {
    char err[2048];
    ck_assert_int_eq(
        node_exit_status(DRAM_YAML "node:\n  listen: 127.0.0.1\n", "", err, sizeof err), 2);
    ck_assert_msg(strstr(err, "node.listen") && strstr(err, "HOST:PORT"), "stderr: %s", err);
    ck_assert_int_eq(node_exit_status(DRAM_YAML "node:\n  colour: red\n", "", err, sizeof err), 2);
    ck_assert_msg(strstr(err, "unknown key") && strstr(err, "listen, psk_file"), "stderr: %s", err);
    ck_assert_int_eq(
        node_exit_status(DRAM_YAML "node:\n  max_object_bytes: 0\n", "", err, sizeof err), 2);
    ck_assert_msg(strstr(err, "node.max_object_bytes"), "stderr: %s", err);
    ck_assert_int_eq(node_exit_status(DRAM_YAML, "", err, sizeof err), 2);
    ck_assert_msg(strstr(err, "--psk-file or node.psk_file"), "stderr: %s", err);
    /* a flag wins over the section: a bad --listen is refused although node.listen is fine */
    ck_assert_int_eq(node_exit_status(DRAM_YAML
                                      "node:\n  listen: 127.0.0.1:0\n  psk_file: /nonexistent\n",
                                      "--listen nonsense", err, sizeof err),
                     2);
    ck_assert_msg(strstr(err, "--listen nonsense"), "stderr: %s", err);
}
END_TEST

int main(void) {
    Suite *s = suite_create("node");
    TCase *tc = tcase_create("node");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, handshake_with_the_right_key_is_accepted);
    tcase_add_test(tc, handshake_with_a_wrong_key_is_refused_and_the_connection_closed);
    tcase_add_test(tc, requests_before_the_handshake_are_refused_with_state);
    tcase_add_test(tc, put_lookup_get_round_trip_64k_1m_and_inline_objects);
    tcase_add_test(tc, tenants_cannot_see_or_overwrite_each_others_objects);
    tcase_add_test(tc, malformed_messages_get_an_error_and_the_node_keeps_serving);
    tcase_add_test(tc, a_peer_that_keeps_sending_garbage_is_disconnected);
    tcase_add_test(tc, sigterm_stops_the_node_with_status_0_and_a_stats_line);
    tcase_add_test(tc, a_request_naming_no_session_is_dropped);
    suite_add_tcase(s, tc);
    TCase *hostile = tcase_create("hostile");
    tcase_add_checked_fixture(hostile, setup, teardown);
    tcase_set_timeout(hostile, 60);
    tcase_add_test(
        hostile,
        garbage_truncated_frames_and_huge_lengths_from_plain_sockets_leave_the_node_serving);
    tcase_add_test(hostile, garbage_sent_to_the_nodes_ucx_ports_leaves_it_serving);
    tcase_add_test(hostile,
                   a_slowloris_is_closed_at_the_handshake_deadline_while_others_are_served);
    tcase_add_test(hostile, two_thousand_junk_connections_do_not_grow_the_nodes_file_descriptors);
    tcase_add_test(hostile,
                   connections_over_the_handshake_cap_are_refused_while_a_session_is_served);
    suite_add_tcase(s, hostile);
    TCase *ssd = tcase_create("ssd");
    tcase_add_checked_fixture(ssd, setup_ssd, teardown);
    tcase_set_timeout(ssd, 30);
    tcase_add_test(ssd, objects_evicted_to_the_ssd_tier_are_still_served);
    suite_add_tcase(s, ssd);
    TCase *yaml = tcase_create("yaml");
    tcase_add_checked_fixture(yaml, setup_from_yaml, teardown);
    tcase_set_timeout(yaml, 30);
    tcase_add_test(yaml, settings_come_from_the_node_section_of_the_config);
    suite_add_tcase(s, yaml);
    TCase *refused = tcase_create("refused");
    tcase_set_timeout(refused, 30);
    tcase_add_test(refused, a_bad_node_section_or_no_key_file_is_refused_with_a_sentence);
    suite_add_tcase(s, refused);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif
