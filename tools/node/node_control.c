/* node_control.c - the node's control connections: the handshake (HELLO, CHALLENGE, AUTH) up to a
 * session, and a session's end when its control connection closes.
 *
 * A control connection is plain TCP with our own framing (control.h): the handshake is bounded in
 * bytes (KVS_CONTROL_MAX_FRAME_BYTES per frame) and time (timeout_ms for all of it), read without
 * blocking, and anything wrong closes it. Only after AUTH_OK does the node make a UCX endpoint (from
 * the client's worker address) and hand out its own worker address and a session token. */
#include "node_control.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node_metrics.h"

#define REFUSAL_LOG_INTERVAL_NS 1000000000ull /* at most one refusal line per second */

void node_log_refusal(kvs_node *n, const char *fmt, ...) {
    uint64_t now = kvs_now_ns();
    if (n->refusal_log_ns && now - n->refusal_log_ns < REFUSAL_LOG_INTERVAL_NS) {
        n->refusals_unlogged++;
        return;
    }
    char line[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n->refusals_unlogged)
        fprintf(stderr,
                "kvstrata-node: %s (and %llu more refusals not logged in the last second)\n", line,
                (unsigned long long)n->refusals_unlogged);
    else
        fprintf(stderr, "kvstrata-node: %s\n", line);
    n->refusal_log_ns = now;
    n->refusals_unlogged = 0;
}

/* Send one frame on a control connection without waiting: a handshake reply is small, and a peer
 * whose socket has no room for it is not worth waiting for. */
static int control_send(kvs_node *n, node_conn *c, const kvs_wire_msg *msg) {
    char err[192];
    size_t len = 0;
    if (kvs_control_encode(msg, n->frame, sizeof n->frame, &len, err, sizeof err) != KVS_OK ||
        kvs_control_write(&c->ch, n->frame, len, 0, err, sizeof err) != KVS_OK) {
        node_log_refusal(n, "%s: %s", c->peer, err);
        c->closing = 1;
        return -1;
    }
    return 0;
}

/* End a handshake: an ERROR frame when there is something to say (best effort), then close. */
static void handshake_close(kvs_node *n, node_conn *c, uint64_t request_id, kvs_wire_error code,
                            const char *text) {
    if (code != KVS_WIRE_ERR_NONE) {
        kvs_wire_refusal why;
        kvs_wire_refusal_make(&why, code, request_id, text);
        size_t len = 0;
        char err[64];
        if (kvs_wire_encode_refusal(&why, n->frame + KVS_CONTROL_PREFIX_BYTES,
                                    sizeof n->frame - KVS_CONTROL_PREFIX_BYTES, &len) == KVS_OK) {
            n->frame[0] = (uint8_t)(len >> 24);
            n->frame[1] = (uint8_t)(len >> 16);
            n->frame[2] = (uint8_t)(len >> 8);
            n->frame[3] = (uint8_t)len;
            (void)kvs_control_write(&c->ch, n->frame, len + KVS_CONTROL_PREFIX_BYTES, 0, err,
                                    sizeof err);
        }
    }
    c->closing = 1;
}

/* The same for a peer that broke the protocol: counted and logged (rate-limited). */
static void handshake_refuse(kvs_node *n, node_conn *c, uint64_t request_id, kvs_wire_error code,
                             const char *text) {
    n->stats.handshake_refusals++;
    node_log_refusal(n, "%s: handshake refused: %s", c->peer, text);
    handshake_close(n, c, request_id, code, text);
}

/* 1 when the client offered shared memory (a host id) and runs on this host. */
static int on_this_host(const kvs_node *n, const kvs_wire_msg *req) {
    return req->host_id_len && n->host_id_ok && req->host_id_len == sizeof n->host_id &&
           memcmp(req->host_id, n->host_id, sizeof n->host_id) == 0;
}

/* With --shared-memory-payloads on, a client on this host that offered shared memory (a host id
 * with its worker address) gets its payloads over a second endpoint to that address without
 * peer-failure handling, where UCX can use shared memory; the session's endpoint reaches it over
 * tcp only. Any failure keeps the session's endpoint for payloads (said at WARN). */
static void rma_by_address(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    if (!req->host_id_len) return; /* not offered (shared_memory: off) */
    if (!on_this_host(n, req)) {
        kvs_log(n->log_level, KVS_LOG_DEBUG, "kvstrata-node: client %s is on another host",
                c->peer);
        return;
    }
    /* UCX has no failure detection on that endpoint: the client's pidfd fires the moment it exits */
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)req->pid, 0);
    if (pidfd < 0) {
        kvs_log(n->log_level, KVS_LOG_WARN,
                "kvstrata-node: client %s: no pidfd for its pid %u (%s); payloads go "
                "over the request connection",
                c->peer, req->pid, strerror(errno));
        return;
    }
    char name[96];
    kvs_fmt(name, sizeof name, "%s (worker address)", c->peer);
    kvs_ucx_conn *rma = NULL;
    if (kvs_ucx_connect_address(n->t, req->worker_addr, req->worker_addr_len, name, 0,
                                n->params.timeout_ms, &rma) != KVS_OK) {
        kvs_log(n->log_level, KVS_LOG_WARN,
                "kvstrata-node: client %s is on this host but its worker address does not connect "
                "(%s); "
                "payloads go over the request connection",
                c->peer, kvs_ucx_last_error(n->t));
        close(pidfd);
        return;
    }
    kvs_ucx_conn_set_user(rma, c);
    kvs_ucx_conn_guard(rma, c->conn);  /* a client that dies shows on the session's endpoint... */
    kvs_ucx_conn_watch_fd(rma, pidfd); /* ...or, sooner, on its pidfd */
    c->pidfd = pidfd;
    c->rma = rma;
}

/* AUTH accepted: make the session's endpoint from the client's worker address, then AUTH_OK with
 * this node's worker address and the session token. The client progresses its worker while it
 * waits for AUTH_OK, so the endpoint's wire-up completes. */
static void session_open(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    char name[96];
    if (!req->worker_addr_len) {
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_VALUE,
                         "node: auth without a worker address");
        return;
    }
    if (n->n_sessions >= n->params.max_clients) {
        n->stats.rejected++;
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL,
                         "node: already serving --max-clients sessions");
        return;
    }
    uint32_t mine = 0; /* one tenant cannot take every session */
    for (node_conn *d = n->conns; d; d = d->next)
        mine += d->session && !d->closing && d->auth.tenant_len == c->auth.tenant_len &&
                memcmp(d->auth.tenant, c->auth.tenant, c->auth.tenant_len) == 0;
    if (n->params.max_sessions_per_tenant && mine >= n->params.max_sessions_per_tenant) {
        char text[KVS_WIRE_MAX_ERROR_TEXT];
        kvs_fmt(text, sizeof text, "node: tenant \"%s\" already holds %u sessions (%s)",
                c->auth.tenant, mine, "max_sessions_per_tenant");
        n->stats.rejected++;
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL, text);
        return;
    }
    if (!(c->hasher = kvs_remote_tenant_hasher_new(c->auth.tenant, c->auth.tenant_len)) ||
        kvs_remote_random(c->token, sizeof c->token) != KVS_OK) {
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL,
                         "node: out of memory or randomness");
        return;
    }
    kvs_fmt(name, sizeof name, "%s (tenant %s)", c->peer, c->auth.tenant);
    if (kvs_ucx_connect_address(n->t, req->worker_addr, req->worker_addr_len, name, 1,
                                n->params.timeout_ms, &c->conn) != KVS_OK) {
        char text[KVS_WIRE_MAX_ERROR_TEXT];
        kvs_fmt(text, sizeof text, "node: cannot reach the client's worker address: %s",
                kvs_ucx_last_error(n->t));
        c->conn = NULL;
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL, text);
        return;
    }
    kvs_ucx_conn_set_user(c->conn, c);
    c->rma = c->conn;
    if (n->params.shm_payloads) rma_by_address(n, c, req);
    const char *tls = kvs_ucx_conn_transports(c->rma);
    kvs_wire_msg rep;
    kvs_wire_msg_init(&rep, KVS_WIRE_AUTH_OK, req->request_id);
    rep.transports = tls;
    rep.transports_len = (uint32_t)strnlen(tls, KVS_WIRE_MAX_TRANSPORTS_TEXT);
    rep.worker_addr = n->worker_addr;
    rep.worker_addr_len = (uint32_t)n->worker_addr_len;
    rep.session_token = c->token;
    if (n->shared_tier[0] && on_this_host(n, req)) {
        rep.shared_tier = n->shared_tier;
        rep.shared_tier_len = (uint32_t)strlen(n->shared_tier);
        rep.shared_tier_capacity = n->shared_tier_capacity;
        rep.shared_tier_max_object = n->params.max_object_bytes;
    }
    uint8_t proof[KVS_WIRE_PROOF_BYTES]; /* over everything, req's fields too: before c->rd goes */
    if (kvs_remote_auth_node_ok_proof(&c->auth, req, &rep, proof) != KVS_OK) {
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL,
                         "node: could not compute its proof (libcrypto)");
        return;
    }
    rep.proof = proof;
    free(c->rd); /* req lies in it */
    c->rd = NULL;
    c->session = 1;
    n->n_handshakes--;
    n->n_sessions++;
    n->stats.auth_ok++;
    c->trow = node_tenant_row(n, c->auth.tenant);
    int slow = kvs_ucx_tls_slow(tls) && !kvs_chan_is_tls(&c->ch);
    if (kvs_chan_is_tls(&c->ch))
        kvs_log(n->log_level, KVS_LOG_INFO,
                "kvstrata-node: client %s (tenant \"%s\"): requests and payloads on its TLS "
                "connection",
                c->peer, c->auth.tenant);
    else
        kvs_log(n->log_level, slow ? KVS_LOG_WARN : KVS_LOG_INFO,
                "kvstrata-node: client %s (tenant \"%s\"): payloads over %s%s", c->peer,
                c->auth.tenant, tls,
                slow ? " only - a slow fallback (RMA emulated over messages)" : "");
    control_send(n, c, &rep);
}

/* One whole frame of a control connection in its handshake: HELLO, then AUTH; anything else, or
 * anything that does not decode, ends it. */
static void handshake(kvs_node *n, node_conn *c, const uint8_t *frame, size_t len) {
    char err[256] = "";
    kvs_wire_msg req;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_decode(frame, len, n->entries, KVS_WIRE_MAX_KEYS, &req, &why) != KVS_OK) {
        handshake_refuse(n, c, why.have_request_id ? why.request_id : 0, why.code, why.text);
        return;
    }
    if (req.type == KVS_WIRE_HELLO) {
        const uint8_t *challenge = NULL, *node_proof = NULL;
        const char *tls_tenant = kvs_tls_peer_tenant(&c->ch);
        if (kvs_chan_is_tls(&c->ch) && (!tls_tenant || req.tenant_len != strlen(tls_tenant) ||
                                        memcmp(req.tenant, tls_tenant, req.tenant_len) != 0)) {
            handshake_refuse(n, c, req.request_id, KVS_WIRE_ERR_AUTH,
                             "node: the hello names another tenant than the TLS key");
            return;
        }
        kvs_status st = kvs_remote_auth_node_hello(&c->auth, &n->psk, &req, &challenge, &node_proof,
                                                   err, sizeof err);
        if (st != KVS_OK) {
            handshake_refuse(n, c, req.request_id,
                             st == KVS_ESTATE ? KVS_WIRE_ERR_STATE : KVS_WIRE_ERR_AUTH,
                             err[0] ? err : "node: hello refused");
            return;
        }
        kvs_wire_msg rep;
        kvs_wire_msg_init(&rep, KVS_WIRE_CHALLENGE, req.request_id);
        rep.challenge = challenge;
        rep.proof = node_proof; /* the client checks it before it says anything of its own */
        control_send(n, c, &rep);
        return;
    }
    if (req.type != KVS_WIRE_AUTH) {
        char text[128];
        kvs_fmt(text, sizeof text, "node: %s before the handshake finished",
                kvs_wire_type_name(req.type));
        handshake_refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE, text);
        return;
    }
    kvs_status st = kvs_remote_auth_node_check(&c->auth, &req, err, sizeof err);
    if (st == KVS_ESTATE) {
        handshake_refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE,
                         err[0] ? err : "node: auth without a challenge");
        return;
    }
    if (st != KVS_OK) {
        n->stats.auth_failures++;
        fprintf(stderr, "kvstrata-node: %s: authentication failed for tenant \"%s\"\n", c->peer,
                c->auth.tenant);
        handshake_close(n, c, req.request_id, KVS_WIRE_ERR_AUTH, "node: authentication failed");
        return;
    }
    session_open(n, c, &req);
}

/* The control connection is readable: handshake bytes, or, for a session, a request on its stream
 * (1: the caller serves it, node_stream.c) or its end. */
int node_control_readable(kvs_node *n, node_conn *c) {
    char err[160];
    if (c->session) {
        int k = kvs_chan_peek(&c->ch);
        if (k > 0) return 1; /* a request on the stream (payloads: stream, or encrypt) */
        if (k == 0) return 0;
        c->peer_gone = 1;
        c->closing = 1;
        return 0;
    }
    kvs_status hs = kvs_tls_handshake(&c->ch, err, sizeof err);
    if (hs == KVS_EAGAIN) return 0;
    if (hs != KVS_OK) {
        c->peer_gone = 1;
        handshake_refuse(n, c, 0, KVS_WIRE_ERR_NONE, err);
        return 0;
    }
    for (;;) {
        size_t len = 0;
        kvs_status st = kvs_control_read(c->rd, &c->ch, &len, err, sizeof err);
        if (st == KVS_EAGAIN) return 0;
        if (st != KVS_OK) {
            /* 0x16 0x03: a TLS handshake record where a frame's length was due */
            if (st == KVS_EINVAL && !kvs_chan_is_tls(&c->ch) && c->rd->prefix[0] == 0x16 &&
                c->rd->prefix[1] == 0x03)
                kvs_fmt(err, sizeof err,
                        "a TLS client (encrypt: true) but this node runs without encrypt");
            c->peer_gone = 1;
            handshake_refuse(n, c, 0, KVS_WIRE_ERR_NONE, err);
            return 0;
        }
        handshake(n, c, c->rd->frame, len);
        if (c->closing || c->session) return 0;
    }
}

/* Handshakes past their deadline are closed: a peer that trickles bytes holds a slot for
 * timeout_ms at most. Returns the nearest deadline still ahead (UINT64_MAX: none). */
uint64_t node_expire_handshakes(kvs_node *n) {
    uint64_t now = kvs_now_ns(), next = UINT64_MAX;
    for (node_conn *c = n->conns; c; c = c->next) {
        if (c->session || c->closing) continue;
        if (now >= c->deadline_ns) {
            n->stats.handshake_timeouts++;
            node_log_refusal(n, "%s: handshake not finished within %d ms; closed", c->peer,
                             n->params.timeout_ms);
            c->peer_gone = 1;
            c->closing = 1;
        } else if (c->deadline_ns < next) {
            next = c->deadline_ns;
        }
    }
    return next;
}

/* The session a request header names (its token), or NULL. An encrypted session takes nothing over
 * UCX: its token travelled only inside TLS, and whoever sends it here took it from the client. */
node_conn *node_session_of(kvs_node *n, const void *header, size_t header_len) {
    if (header_len != KVS_WIRE_SESSION_TOKEN_BYTES) return NULL;
    for (node_conn *c = n->conns; c; c = c->next)
        if (c->session && !c->closing && !kvs_chan_is_tls(&c->ch) &&
            CRYPTO_memcmp(c->token, header, KVS_WIRE_SESSION_TOKEN_BYTES) == 0)
            return c;
    return NULL;
}
