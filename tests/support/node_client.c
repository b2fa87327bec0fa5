/* node_client.c - see node_client.h. */
#include "node_client.h"

#ifdef KVS_HAVE_UCX

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/ucx/auth.h"
#include "common/clock.h"
#include "common/log.h"
#include "tools/node/node.h" /* KVS_NODE_AM_ID */
#include "wait.h"

static void client_am(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                      const void *data, size_t data_len) {
    kvs_test_client *c = user;
    (void)conn;
    (void)header;
    (void)header_len;
    c->arrived = 1;
    c->n_arrived++;
    c->reply_len = data_len <= sizeof c->reply ? data_len : 0;
    if (c->reply_len) memcpy(c->reply, data, data_len);
}

static void client_dead(void *user, kvs_ucx_conn *conn, const char *why) {
    kvs_test_client *c = user;
    (void)conn;
    (void)why;
    c->dead = 1;
}

kvs_test_client *kvs_test_client_open(const kvs_test_node *d) {
    kvs_test_client *c = calloc(1, sizeof *c);
    ck_assert_ptr_nonnull(c);
    kvs_ucx_params p = {.struct_size = sizeof p,
                        .name = "test-node-client",
                        .log_level = KVS_LOG_ERROR,
                        .on_dead = client_dead,
                        .user = c};
    char err[512];
    ck_assert_msg(kvs_ucx_create(&p, &c->t, err, sizeof err) == KVS_OK, "create: %s", err);
    ck_assert_int_eq(kvs_ucx_am_handler(c->t, KVS_NODE_AM_ID, client_am, c), KVS_OK);
    ck_assert_msg(kvs_control_connect("127.0.0.1", d->port,
                                      kvs_now_ns() + KVS_TEST_NODE_TIMEOUT_MS * 1000000ull,
                                      &c->ctl_fd, err, sizeof err) == KVS_OK,
                  "connect: %s", err);
    kvs_chan_plain(&c->ch, c->ctl_fd);
    c->mem = aligned_alloc(4096, KVS_TEST_CLIENT_BYTES);
    ck_assert_ptr_nonnull(c->mem);
    memset(c->mem, 0, KVS_TEST_CLIENT_BYTES);
    ck_assert_int_eq(kvs_ucx_mem_register(c->t, c->mem, KVS_TEST_CLIENT_BYTES, &c->mem_reg),
                     KVS_OK);
    ck_assert_int_eq(kvs_ucx_mem_pack(c->mem_reg, c->rkey, sizeof c->rkey, &c->rkey_len), KVS_OK);
    c->next_id = 100;
    return c;
}

void kvs_test_client_close(kvs_test_client *c) {
    kvs_ucx_conn_close(c->conn);
    if (c->ch.ssl && c->ctl_fd >= 0) /* the channel closes the socket with its TLS session */
        kvs_chan_close(&c->ch);
    else if (c->ctl_fd >= 0)
        ck_assert_int_eq(close(c->ctl_fd), 0);
    kvs_tls_free(c->tls);
    kvs_ucx_mem_deregister(c->mem_reg);
    kvs_ucx_destroy(c->t);
    free(c->mem);
    free(c);
}

kvs_status kvs_test_client_tls(kvs_test_client *c, const char *tenant, const uint8_t *psk_bytes,
                               size_t psk_len) {
    kvs_remote_psk psk;
    char err[256];
    ck_assert_int_eq(kvs_remote_psk_set(&psk, psk_bytes, psk_len, err, sizeof err), KVS_OK);
    ck_assert_msg(kvs_tls_client_new(tenant, &psk, &c->tls, err, sizeof err) == KVS_OK, "%s", err);
    kvs_remote_psk_clear(&psk);
    ck_assert_msg(kvs_tls_attach(c->tls, &c->ch, err, sizeof err) == KVS_OK, "%s", err);
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(KVS_TEST_NODE_TIMEOUT_MS);
    kvs_status st;
    while ((st = kvs_tls_handshake(&c->ch, err, sizeof err)) == KVS_EAGAIN &&
           kvs_test_now_ms() < until) {
        struct pollfd p = {.fd = c->ch.fd, .events = kvs_chan_events(&c->ch, POLLIN)};
        (void)poll(&p, 1, 50);
    }
    return st;
}

/* Send raw bytes and wait for one reply; 1 when a reply arrived. */
int kvs_test_client_send_raw(kvs_test_client *c, const void *bytes, size_t len) {
    c->arrived = 0;
    if (!c->conn) return 0;
    if (kvs_ucx_am_send(c->conn, KVS_NODE_AM_ID, c->token, sizeof c->token, bytes, len,
                        KVS_TEST_NODE_TIMEOUT_MS) != KVS_OK)
        return 0;
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(KVS_TEST_NODE_TIMEOUT_MS);
    while (!c->arrived && !c->dead && kvs_test_now_ms() < until) {
        kvs_status st = kvs_ucx_wait(c->t, 50);
        ck_assert(st == KVS_OK || st == KVS_ETIMEDOUT);
        /* the node ends a session by closing its control connection */
        struct pollfd p = {.fd = c->ctl_fd, .events = POLLIN};
        if (!c->arrived && poll(&p, 1, 0) > 0) c->dead = 1;
    }
    return c->arrived;
}

/* Encode msg (its request_id is set here), send it, decode the reply into *rep. */
void kvs_test_client_request(kvs_test_client *c, kvs_wire_msg *msg, kvs_wire_msg *rep) {
    static uint8_t buf[KVS_WIRE_MAX_MESSAGE_BYTES];
    size_t len = 0;
    kvs_wire_refusal why;
    msg->request_id = ++c->next_id;
    ck_assert_int_eq(kvs_wire_encode(msg, buf, sizeof buf, &len, &why), KVS_OK);
    ck_assert_msg(kvs_test_client_send_raw(c, buf, len), "no reply to %s",
                  kvs_wire_type_name(msg->type));
    kvs_status st =
        kvs_wire_decode(c->reply, c->reply_len, c->entries, KVS_WIRE_MAX_KEYS, rep, &why);
    ck_assert_msg(st == KVS_OK, "reply does not decode: %s", why.text);
    ck_assert_uint_eq(rep->request_id, msg->request_id);
}

/* A request of one entry; the reply must be reply_type with one entry, which is returned. */
const kvs_wire_entry *kvs_test_client_request_one(kvs_test_client *c, uint32_t type,
                                                  uint32_t reply_type, kvs_wire_entry *e) {
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, (kvs_wire_type)type, 0);
    m.entries = e;
    m.n_entries = 1;
    kvs_test_client_request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, reply_type);
    ck_assert_uint_eq(rep.n_entries, 1);
    return &c->entries[0]; /* where the reply was decoded: rep.entries */
}

/* Send msg on the control connection and wait for the node's next frame there (progressing UCX
 * meanwhile: the node wires up its endpoint to us before AUTH_OK), decoded into *rep; 0 when the
 * node closed the connection or said nothing within the timeout. */
int kvs_test_client_control_request(kvs_test_client *c, kvs_wire_msg *msg, kvs_wire_msg *rep) {
    char err[256];
    size_t len = 0;
    msg->request_id = ++c->next_id;
    ck_assert_msg(kvs_control_encode(msg, c->frame, sizeof c->frame, &len, err, sizeof err) ==
                      KVS_OK,
                  "%s", err);
    if (kvs_control_write(&c->ch, c->frame, len,
                          kvs_now_ns() + KVS_TEST_NODE_TIMEOUT_MS * 1000000ull, err,
                          sizeof err) != KVS_OK)
        return 0;
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(KVS_TEST_NODE_TIMEOUT_MS);
    for (;;) {
        kvs_status st = kvs_control_read(&c->rd, &c->ch, &len, err, sizeof err);
        if (st == KVS_OK) break;
        if (st != KVS_EAGAIN || kvs_test_now_ms() > until) return 0;
        ck_assert_int_eq(kvs_ucx_progress(c->t), KVS_OK);
        struct pollfd p[2] = {{.fd = c->ctl_fd, .events = kvs_chan_events(&c->ch, POLLIN)},
                              {.fd = kvs_ucx_event_fd(c->t), .events = POLLIN}};
        if (kvs_ucx_arm(c->t) == KVS_OK) ck_assert_int_ge(poll(p, 2, 50), 0);
    }
    kvs_wire_refusal why;
    ck_assert_msg(kvs_wire_decode(c->rd.frame, len, c->entries, KVS_WIRE_MAX_KEYS, rep, &why) ==
                      KVS_OK,
                  "control reply does not decode: %s", why.text);
    ck_assert_uint_eq(rep->request_id, msg->request_id);
    return 1;
}

/* 1 once the node has closed the control connection (EOF) within the timeout. */
int kvs_test_control_closed(int fd) {
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(KVS_TEST_NODE_TIMEOUT_MS);
    uint8_t buf[256];
    while (kvs_test_now_ms() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return 1;
    }
    return 0;
}

/* HELLO + AUTH with the given tenant key; returns the type of the answer to AUTH (AUTH_OK or ERROR).
 * On AUTH_OK whose proof holds the client makes its endpoint to the node's worker address and keeps
 * the session token. */
uint32_t kvs_test_client_handshake(kvs_test_client *c, const char *tenant, const uint8_t *psk_bytes,
                                   size_t psk_len, uint32_t *error_code) {
    return kvs_test_client_handshake_with(c, tenant, psk_bytes, psk_len, NULL, 0, error_code);
}

uint32_t kvs_test_client_handshake_with(kvs_test_client *c, const char *tenant,
                                        const uint8_t *psk_bytes, size_t psk_len,
                                        const uint8_t *worker_addr, size_t worker_addr_len,
                                        uint32_t *error_code) {
    kvs_remote_psk psk;
    char err[256];
    ck_assert_int_eq(kvs_remote_psk_set(&psk, psk_bytes, psk_len, err, sizeof err), KVS_OK);
    uint8_t nonce[KVS_WIRE_NONCE_BYTES], challenge[KVS_WIRE_CHALLENGE_BYTES],
        node_proof[KVS_WIRE_PROOF_BYTES], proof[KVS_WIRE_PROOF_BYTES];
    ck_assert_int_eq(kvs_remote_random(nonce, sizeof nonce), KVS_OK);
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_HELLO, 0);
    m.tenant = tenant;
    m.tenant_len = (uint32_t)strlen(tenant);
    m.nonce = nonce;
    ck_assert_msg(kvs_test_client_control_request(c, &m, &rep), "no challenge");
    ck_assert_uint_eq(rep.type, KVS_WIRE_CHALLENGE);
    memcpy(challenge, rep.challenge, sizeof challenge);
    memcpy(node_proof, rep.proof, sizeof node_proof);
    uint8_t addr[KVS_WIRE_MAX_WORKER_ADDR_BYTES];
    size_t addr_len = 0;
    ck_assert_int_eq(kvs_ucx_worker_address(c->t, addr, sizeof addr, &addr_len), KVS_OK);
    if (worker_addr) { /* what a test sends instead of its own */
        ck_assert_uint_le(worker_addr_len, sizeof addr);
        memcpy(addr, worker_addr, worker_addr_len);
        addr_len = worker_addr_len;
    }
    kvs_remote_transcript t = {.tenant = tenant,
                               .tenant_len = strlen(tenant),
                               .nonce = nonce,
                               .challenge = challenge,
                               .node_proof = node_proof,
                               .client_worker_addr = addr,
                               .client_worker_addr_len = (uint32_t)addr_len};
    /* the node proves it holds the key before the client says anything of its own (the tier stops
     * here when it does not; a test client goes on, to see the node refuse a wrong proof) */
    c->node_proved = kvs_remote_proof_check(&psk, KVS_REMOTE_PROOF_NODE, &t, node_proof,
                                            KVS_WIRE_PROOF_BYTES) == KVS_OK;
    ck_assert_int_eq(kvs_remote_proof(&psk, KVS_REMOTE_PROOF_CLIENT, &t, proof), KVS_OK);
    kvs_wire_msg_init(&m, KVS_WIRE_AUTH, 0);
    m.proof = proof;
    m.worker_addr = addr;
    m.worker_addr_len = (uint32_t)addr_len;
    ck_assert_msg(kvs_test_client_control_request(c, &m, &rep), "no answer to auth");
    if (error_code) *error_code = rep.type == KVS_WIRE_ERROR ? rep.error_code : 0;
    if (rep.type == KVS_WIRE_AUTH_OK) {
        ck_assert_uint_gt(rep.worker_addr_len, 0);
        ck_assert_ptr_nonnull(rep.session_token);
        kvs_remote_transcript_ok(&t, proof, &rep);
        c->ok_proved = kvs_remote_proof_check(&psk, KVS_REMOTE_PROOF_OK, &t, rep.proof,
                                              KVS_WIRE_PROOF_BYTES) == KVS_OK;
        memcpy(c->token, rep.session_token, sizeof c->token);
        ck_assert_msg(kvs_ucx_connect_address(c->t, rep.worker_addr, rep.worker_addr_len, "node", 1,
                                              KVS_TEST_NODE_TIMEOUT_MS, &c->conn) == KVS_OK,
                      "connect: %s", kvs_ucx_last_error(c->t));
    }
    kvs_remote_psk_clear(&psk);
    return rep.type;
}

kvs_test_client *kvs_test_client_authed(const kvs_test_node *d, const char *tenant) {
    kvs_test_client *c = kvs_test_client_open(d);
    uint8_t key[32];
    kvs_test_node_tenant_key(d, tenant, key, NULL, 0);
    ck_assert_uint_eq(kvs_test_client_handshake(c, tenant, key, sizeof key, NULL),
                      KVS_WIRE_AUTH_OK);
    ck_assert(c->node_proved);
    ck_assert(c->ok_proved);
    return c;
}

void kvs_test_node_key(uint8_t key[16], uint32_t n) {
    memset(key, 0, 16);
    memcpy(key, &n, sizeof n);
    key[15] = 0xA5;
}

/* PUT one object from client memory at offset off (RMA), or inline when inline_ok and it fits. */
int32_t kvs_test_client_put(kvs_test_client *c, const uint8_t key[16], size_t off, size_t len,
                            int use_inline) {
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
    return kvs_test_client_request_one(c, KVS_WIRE_PUT, KVS_WIRE_PUT_REPLY, &e)->status;
}

/* GET one object into client memory at offset off with capacity cap; *len gets the reported length. */
int32_t kvs_test_client_get(kvs_test_client *c, const uint8_t key[16], size_t off, size_t cap,
                            uint64_t *len) {
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    e.remote_addr = (uint64_t)(uintptr_t)(c->mem + off);
    e.length = cap;
    e.rkey = c->rkey;
    e.rkey_len = (uint32_t)c->rkey_len;
    const kvs_wire_entry *r = kvs_test_client_request_one(c, KVS_WIRE_GET, KVS_WIRE_GET_REPLY, &e);
    *len = r->length;
    return r->status;
}

uint8_t kvs_test_client_lookup(kvs_test_client *c, const uint8_t key[16]) {
    kvs_wire_entry e;
    memset(&e, 0, sizeof e);
    e.key = key;
    return kvs_test_client_request_one(c, KVS_WIRE_LOOKUP, KVS_WIRE_LOOKUP_REPLY, &e)->present;
}

void kvs_test_client_stats(kvs_test_client *c, uint64_t counters[KVS_WIRE_STATS_COUNT]) {
    kvs_wire_msg m, rep;
    kvs_wire_msg_init(&m, KVS_WIRE_STATS, 0);
    kvs_test_client_request(c, &m, &rep);
    ck_assert_uint_eq(rep.type, KVS_WIRE_STATS_REPLY);
    memcpy(counters, rep.counters, sizeof rep.counters);
}
#endif /* KVS_HAVE_UCX */
