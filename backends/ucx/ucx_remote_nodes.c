/*
 * ucx_remote_nodes.c - the remote tier's connections to its nodes (see ucx_remote_nodes.h): the
 * non-blocking handshake on each node's control connection, the request endpoint made from the
 * worker address the node returns, and the up/down state with its reconnect backoff. Progress
 * thread only.
 */
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "ucx_remote_error.h"
#include "ucx_remote_nodes.h"
#include "ucx_remote_shared.h"

void remote_control_close(rnode *nd) {
    kvs_chan_close(&nd->ctl);
    free(nd->rd);
    nd->rd = NULL;
}

void remote_node_down(remote *r, rnode *nd, const char *why) {
    remote_shared_detach(r, nd); /* its next session names its tier again */
    if (nd->stream_out) {        /* PUTs written on its stream that it will never answer now */
        uint64_t lost = 0;
        for (uint32_t i = 0; i < nd->stream_out; i++) lost += nd->stream_out_n[i];
        nd->stream_out = 0;
        pthread_mutex_lock(&r->mutex);
        r->stats.puts_dropped += lost;
        pthread_mutex_unlock(&r->mutex);
    }
    if (nd->conn) {
        kvs_ucx_conn_set_user(nd->conn, NULL);
        kvs_ucx_conn_abort(nd->conn); /* the node may still read queue room we are about to reuse */
        nd->conn = NULL;
    }
    remote_control_close(nd);
    nd->pending = 0;
    nd->conn_dead = 0;
    if (nd->up) {
        nd->up = 0;
        pthread_mutex_lock(&r->mutex); /* callers' puts read the ring under it (shared-tier puts) */
        kvs_remote_ring_set_down(&r->ring, node_id(r, nd), 1);
        r->stats.node_failures++;
        r->stats.nodes_up--;
        r->stats.nodes_shared_memory -= (uint32_t)nd->shared_memory;
        r->stats.nodes_messages -= (uint32_t)nd->messages;
        r->stats.nodes_stream -= (uint32_t)nd->stream;
        nd->shared_memory = 0;
        nd->messages = 0;
        nd->stream = 0;
        pthread_mutex_unlock(&r->mutex);
        remote_set_error(r, "node %s is down (%s); its keys are misses until it reconnects",
                         node_id(r, nd), why);
        if (nd->was_up) nd->down_since_ns = nd->down_logged_ns = kvs_now_ns();
        nd->down_attempts = 0;
    } else if (nd->down_since_ns) {
        /* A reconnect that failed: in a plain log, a line at most every 5 s says how long the
         * outage has lasted (the backoff grows to 30 s; the line keeps a steady pace). */
        uint64_t now = kvs_now_ns();
        nd->down_attempts++;
        if (now - nd->down_logged_ns >= 5000000000ull) {
            nd->down_logged_ns = now;
            char line[512];
            snprintf(line, sizeof line,
                     "remote tier \"%s\": node %s is still down after %.0f s and %u attempts (%s); "
                     "next in %llu ms",
                     r->name, node_id(r, nd), (double)(now - nd->down_since_ns) / 1e9,
                     nd->down_attempts, why, (unsigned long long)nd->backoff_ms);
            remote_log(r, KVS_LOG_WARN, line);
        }
    }
    nd->next_attempt_ns = kvs_now_ns() + nd->backoff_ms * 1000000ull;
    nd->backoff_ms = nd->backoff_ms * 2 > KVS_REMOTE_MAX_BACKOFF_MS ? KVS_REMOTE_MAX_BACKOFF_MS
                                                                    : nd->backoff_ms * 2;
}

kvs_status remote_send_msg(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline) {
    size_t len = 0;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    kvs_status st = kvs_wire_encode(m, r->send_buf, KVS_WIRE_MAX_MESSAGE_BYTES, &len, &why);
    if (st != KVS_OK) {
        snprintf(nd->refusal, sizeof nd->refusal, "cannot encode a %s: %s",
                 kvs_wire_type_name(m->type), why.text);
        return st;
    }
    int ms = ms_left(deadline);
    if (ms <= 0) return KVS_ETIMEDOUT;
    st = kvs_ucx_am_send(nd->conn, REMOTE_AM_ID, nd->token, sizeof nd->token, r->send_buf, len, ms);
    if (st != KVS_OK) snprintf(nd->refusal, sizeof nd->refusal, "%s", kvs_ucx_last_error(r->t));
    return st;
}

/* Send one handshake frame on the control connection by the deadline. */
static kvs_status handshake_send(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline) {
    char err[256];
    size_t len = 0;
    kvs_status st =
        kvs_control_encode(m, r->send_buf, KVS_WIRE_MAX_MESSAGE_BYTES, &len, err, sizeof err);
    if (st == KVS_OK) st = kvs_control_write(&nd->ctl, r->send_buf, len, deadline, err, sizeof err);
    if (st != KVS_OK) snprintf(nd->refusal, sizeof nd->refusal, "handshake: %s", err);
    return st;
}

/* The node's next handshake frame, if it is all there, decoded into *m (pointing into nd->rd):
 * KVS_OK, KVS_EAGAIN (not yet), or an error with nd->refusal set. Whatever the peer sends (garbage, a
 * huge length) ends in a status, never in a crash. */
static kvs_status control_take(remote *r, rnode *nd, kvs_wire_msg *m) {
    char err[160];
    size_t len = 0;
    kvs_status st = kvs_control_read(nd->rd, &nd->ctl, &len, err, sizeof err);
    if (st == KVS_EAGAIN) return st;
    if (st != KVS_OK) {
        snprintf(nd->refusal, sizeof nd->refusal, "handshake: %s", err);
        return st;
    }
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_decode(nd->rd->frame, len, r->reply_entries, KVS_WIRE_MAX_KEYS, m, &why) == KVS_OK)
        return KVS_OK;
    snprintf(nd->refusal, sizeof nd->refusal, "unreadable handshake reply: %s", why.text);
    return KVS_ECORRUPT;
}

/* The node's answer to a handshake step, if it came: the wanted type (KVS_OK), not yet (KVS_EAGAIN),
 * ERROR (refused), or anything else. */
static kvs_status handshake_step(remote *r, rnode *nd, uint32_t want, kvs_wire_msg *m) {
    kvs_status st = control_take(r, nd, m);
    if (st != KVS_OK) return st;
    if (m->type == KVS_WIRE_ERROR) {
        snprintf(nd->refusal, sizeof nd->refusal, "%.*s", (int)m->error_text_len,
                 m->error_text ? m->error_text : "");
        nd->hs = HS_REFUSED;
        pthread_mutex_lock(&r->mutex);
        r->stats.auth_refusals++;
        pthread_mutex_unlock(&r->mutex);
        return KVS_EIO;
    }
    if (m->type != want || m->request_id != nd->request_id) {
        snprintf(nd->refusal, sizeof nd->refusal,
                 "handshake: a %s (request %llu) where a %s was due", kvs_wire_type_name(m->type),
                 (unsigned long long)m->request_id, kvs_wire_type_name(want));
        return KVS_ECORRUPT;
    }
    return KVS_OK;
}

/* Say once per connect what the node's requests and payloads run over; tcp-only payloads loudly. */
static void log_transports(remote *r, rnode *nd) {
    const char *req = kvs_ucx_conn_transports(nd->conn);
    const char *pay = nd->payload_tls[0] ? nd->payload_tls : "unknown (the node did not say)";
    int slow = kvs_ucx_tls_slow(nd->payload_tls) && !nd->messages && !nd->stream;
    if (!r->host || !r->host->log ||
        r->host->struct_size < offsetof(kvs_backend_host, log) + sizeof r->host->log)
        return;
    char line[ERROR_BYTES];
    snprintf(
        line, sizeof line, "remote tier \"%s\": node %s: requests over %s, payloads %s%s%s",
        r->name, node_id(r, nd), req,
        nd->stream     ? "on the session's TCP stream (UCX's payload path: "
        : nd->messages ? "as messages over "
                       : "over ",
        pay,
        slow         ? (r->worker_addr
                            ? " only - a slow fallback (RMA emulated over messages; no RDMA, and the node "
                              "is on another host or shared memory did not connect)"
                            : " only - a slow fallback (shared_memory: off)")
        : nd->stream ? ")"
                     : "");
    r->host->log(r->host->ctx, slow ? KVS_LOG_WARN : KVS_LOG_INFO, line);
}

/* Begin a node's handshake: a control connection that is still being made (HS_CONNECTING). On
 * failure nd->refusal says why and the caller's remote_node_down closes what was opened. */
static kvs_status handshake_begin(remote *r, rnode *nd) {
    char err[256];
    nd->refusal[0] = '\0';
    nd->hs = HS_NONE;
    nd->conn_dead = 0;
    remote_control_close(nd);
    nd->hs_deadline_ns = kvs_now_ns() + (uint64_t)r->opt.timeout_ms * 1000000ull;
    if (!(nd->rd = malloc(sizeof *nd->rd))) {
        snprintf(nd->refusal, sizeof nd->refusal, "no memory for a control connection");
        return KVS_ENOMEM;
    }
    nd->rd->have_prefix = 0;
    int fd = -1;
    kvs_status st = kvs_control_connect_start(r->opt.hosts[nd->index], r->opt.ports[nd->index], &fd,
                                              err, sizeof err);
    if (st != KVS_OK) {
        snprintf(nd->refusal, sizeof nd->refusal, "%s", err);
        return st;
    }
    kvs_chan_plain(&nd->ctl, fd);
    nd->hs = HS_CONNECTING;
    return KVS_OK;
}

/* The handshake as this client sent and received it so far. */
static kvs_remote_transcript transcript(const remote *r, const rnode *nd) {
    return (kvs_remote_transcript){.tenant = r->opt.tenant,
                                   .tenant_len = strlen(r->opt.tenant),
                                   .nonce = nd->nonce,
                                   .challenge = nd->challenge,
                                   .node_proof = nd->node_proof,
                                   .client_worker_addr = r->worker_addr,
                                   .client_worker_addr_len = (uint32_t)r->worker_addr_len,
                                   .host_id = r->offer_shared_memory ? r->host_id : NULL,
                                   .host_id_len =
                                       r->offer_shared_memory ? (uint32_t)sizeof r->host_id : 0,
                                   .pid = nd->pid};
}

/* The node authenticated us and sent its worker address and our session token in AUTH_OK: make the
 * request endpoint from the address (a short wait bounded by the handshake's deadline) and count the
 * node up. */
static kvs_status handshake_finish(remote *r, rnode *nd, const kvs_wire_msg *m) {
    if (!m->worker_addr_len || !m->session_token) {
        snprintf(nd->refusal, sizeof nd->refusal,
                 "handshake: auth_ok without a worker address and session token "
                 "(a node older than wire version %u?)",
                 KVS_WIRE_VERSION);
        return KVS_ECORRUPT;
    }
    memcpy(nd->token, m->session_token, sizeof nd->token);
    snprintf(nd->payload_tls, sizeof nd->payload_tls, "%.*s", (int)m->transports_len,
             m->transports ? m->transports : "");
    char peer[96];
    snprintf(peer, sizeof peer, "node %s", node_id(r, nd));
    int ms = ms_left(nd->hs_deadline_ns);
    kvs_status st = ms > 0 ? kvs_ucx_connect_address(r->t, m->worker_addr, m->worker_addr_len, peer,
                                                     1, ms, &nd->conn)
                           : KVS_ETIMEDOUT;
    if (st != KVS_OK) {
        nd->conn = NULL;
        snprintf(nd->refusal, sizeof nd->refusal, "%s",
                 ms > 0 ? kvs_ucx_last_error(r->t) : "handshake took the whole timeout");
        return st;
    }
    kvs_ucx_conn_set_user(nd->conn, nd);
    free(nd->rd); /* the control connection stays open, read only for its end */
    nd->rd = NULL;
    nd->hs = HS_OK;
    nd->up = 1;
    nd->backoff_ms = r->opt.connect_backoff_ms;
    nd->shared_memory = nd->payload_tls[0] && !kvs_ucx_tls_slow(nd->payload_tls);
    /* over tcp only UCX emulates RMA with request and reply messages; messages carrying the
     * objects reach the stream's rate there (docs/remote.md, "Payloads") */
    nd->messages = r->opt.payloads == KVS_REMOTE_PAYLOADS_MESSAGES;
    nd->stream = r->tls || r->opt.payloads == KVS_REMOTE_PAYLOADS_STREAM ||
                 (r->opt.payloads == KVS_REMOTE_PAYLOADS_AUTO && nd->payload_tls[0] &&
                  kvs_ucx_tls_slow(nd->payload_tls));
    log_transports(r, nd);
    remote_shared_attach(r, nd, m);
    pthread_mutex_lock(&r->mutex);
    kvs_remote_ring_set_down(&r->ring, node_id(r, nd), 0);
    r->stats.nodes_up++;
    r->stats.nodes_shared_memory += (uint32_t)nd->shared_memory;
    r->stats.nodes_messages += (uint32_t)nd->messages;
    r->stats.nodes_stream += (uint32_t)nd->stream;
    if (nd->was_up) r->stats.reconnects++;
    pthread_mutex_unlock(&r->mutex);
    nd->was_up = 1;
    if (nd->down_since_ns) {
        char line[512];
        snprintf(line, sizeof line,
                 "remote tier \"%s\": node %s is back after %.1f s down (%u attempt%s); serving "
                 "its keys",
                 r->name, node_id(r, nd), (double)(kvs_now_ns() - nd->down_since_ns) / 1e9,
                 nd->down_attempts + 1, nd->down_attempts ? "s" : "");
        remote_log(r, KVS_LOG_INFO, line);
        nd->down_since_ns = 0;
    }
    return KVS_OK;
}

/* The handshake is refused (why: the node refused our key, or did not prove it holds it): the
 * state says so and the refusal is counted. */
static kvs_status handshake_refused(remote *r, rnode *nd, const char *why) {
    snprintf(nd->refusal, sizeof nd->refusal, "%s", why);
    nd->hs = HS_REFUSED;
    pthread_mutex_lock(&r->mutex);
    r->stats.auth_refusals++;
    pthread_mutex_unlock(&r->mutex);
    return KVS_EIO;
}

/* HS_CONNECTING: the control connection is made; with encryption TLS is attached to it. */
static kvs_status handshake_connected(remote *r, rnode *nd) {
    kvs_status st;
    char err[200];
    if ((st = kvs_control_connect_finish(nd->ctl.fd, err, sizeof err)) != KVS_OK) {
        if (st != KVS_EAGAIN) snprintf(nd->refusal, sizeof nd->refusal, "%s", err);
        return st;
    }
    if (r->tls && (st = kvs_tls_attach(r->tls, &nd->ctl, err, sizeof err)) != KVS_OK) {
        snprintf(nd->refusal, sizeof nd->refusal, "%s", err);
        return st;
    }
    nd->hs = HS_TLS;
    return KVS_OK;
}

/* HS_TLS: the TLS handshake done (a no-op without encryption), send HELLO with a fresh nonce. */
static kvs_status handshake_hello(remote *r, rnode *nd) {
    kvs_wire_msg m;
    kvs_status st;
    char err[200];
    if ((st = kvs_tls_handshake(&nd->ctl, err, sizeof err)) == KVS_EINVAL)
        /* the node refused our TLS key: a refused handshake, as a wrong proof is */
        return handshake_refused(r, nd, err);
    if (st != KVS_OK) {
        if (st != KVS_EAGAIN) snprintf(nd->refusal, sizeof nd->refusal, "%s", err);
        return st;
    }
    kvs_wire_msg_init(&m, KVS_WIRE_HELLO, nd->request_id = ++r->next_id);
    if ((st = kvs_remote_random(nd->nonce, sizeof nd->nonce)) != KVS_OK) return st;
    m.tenant = r->opt.tenant;
    m.tenant_len = (uint32_t)strlen(r->opt.tenant);
    m.nonce = nd->nonce;
    nd->hs = HS_HELLO_SENT;
    return handshake_send(r, nd, &m, nd->hs_deadline_ns);
}

/* HS_HELLO_SENT: the node's CHALLENGE must prove it holds the tenant's key; answer with AUTH (our
 * proof, worker address, and for shared memory our host id and pid). */
static kvs_status handshake_auth(remote *r, rnode *nd) {
    kvs_wire_msg m;
    kvs_status st;
    if ((st = handshake_step(r, nd, KVS_WIRE_CHALLENGE, &m)) != KVS_OK) return st;
    memcpy(nd->challenge, m.challenge, KVS_WIRE_CHALLENGE_BYTES);
    memcpy(nd->node_proof, m.proof, KVS_WIRE_PROOF_BYTES);
    kvs_remote_transcript t = transcript(r, nd);
    if (kvs_remote_proof_check(&r->psk, KVS_REMOTE_PROOF_NODE, &t, m.proof, KVS_WIRE_PROOF_BYTES) !=
        KVS_OK)
        /* not a node holding our key: it gets neither our proof nor our worker address */
        return handshake_refused(r, nd,
                                 "the peer's challenge does not prove it holds the tenant's key "
                                 "(not a kvstrata node, another master key, a key of another "
                                 "tenant, or a message changed on the way)");
    nd->hs = HS_CHALLENGE;
    kvs_wire_msg_init(&m, KVS_WIRE_AUTH, nd->request_id = ++r->next_id);
    m.worker_addr = r->worker_addr;
    m.worker_addr_len = (uint32_t)r->worker_addr_len;
    if (r->offer_shared_memory) {
        m.host_id = r->host_id;
        m.host_id_len = sizeof r->host_id;
        m.pid = (uint32_t)getpid();
    }
    nd->pid = m.pid;
    t = transcript(r, nd);
    if ((st = kvs_remote_proof(&r->psk, KVS_REMOTE_PROOF_CLIENT, &t, nd->client_proof)) != KVS_OK)
        return st;
    m.proof = nd->client_proof;
    nd->payload_tls[0] = '\0';
    nd->hs = HS_AUTH_SENT;
    return handshake_send(r, nd, &m, nd->hs_deadline_ns);
}

/* HS_AUTH_SENT: the node's AUTH_OK must prove the whole handshake before anything of it reaches
 * UCX. */
static kvs_status handshake_auth_ok(remote *r, rnode *nd) {
    kvs_wire_msg m;
    kvs_status st;
    if ((st = handshake_step(r, nd, KVS_WIRE_AUTH_OK, &m)) != KVS_OK) return st;
    /* nothing of it reaches UCX unless the node proves it sent all of it, to us */
    kvs_remote_transcript t = transcript(r, nd);
    kvs_remote_transcript_ok(&t, nd->client_proof, &m);
    if (kvs_remote_proof_check(&r->psk, KVS_REMOTE_PROOF_OK, &t, m.proof, KVS_WIRE_PROOF_BYTES) !=
        KVS_OK)
        return handshake_refused(
            r, nd, "the node's auth_ok does not prove the handshake (changed on the way)");
    return handshake_finish(r, nd, &m);
}

/* Take a node's handshake as far as it can go now, without waiting: KVS_OK once the node is up,
 * KVS_EAGAIN while it waits for the connection or a reply (remote_handshake_events says for what), else a
 * failure with nd->refusal set (its deadline passing included). Each state falls through to the
 * next as soon as it is done: the reply may be there already. */
static kvs_status handshake_advance(remote *r, rnode *nd) {
    kvs_status st;
    if (kvs_now_ns() >= nd->hs_deadline_ns) {
        snprintf(nd->refusal, sizeof nd->refusal,
                 nd->hs == HS_CONNECTING ? "no connection within %u ms"
                                         : "no handshake reply within %u ms",
                 r->opt.timeout_ms);
        return KVS_ETIMEDOUT;
    }
    switch (nd->hs) {
        case HS_CONNECTING:
            if ((st = handshake_connected(r, nd)) != KVS_OK) return st;
            __attribute__((fallthrough));
        case HS_TLS:
            if ((st = handshake_hello(r, nd)) != KVS_OK) return st;
            __attribute__((fallthrough));
        case HS_HELLO_SENT:
            if ((st = handshake_auth(r, nd)) != KVS_OK) return st;
            __attribute__((fallthrough));
        case HS_AUTH_SENT: return handshake_auth_ok(r, nd);
        default:
            snprintf(nd->refusal, sizeof nd->refusal, "handshake in an unexpected state %d",
                     nd->hs);
            return KVS_ESTATE;
    }
}

/* What a node in its handshake waits for on its control connection. */
short remote_handshake_events(const rnode *nd) {
    return nd->hs == HS_CONNECTING ? POLLOUT : kvs_chan_events(&nd->ctl, POLLIN);
}

/* 1 while a node's handshake is under way (begun, neither up nor failed). */
int remote_in_handshake(const rnode *nd) {
    return !nd->up && nd->ctl.fd >= 0 && nd->hs >= HS_CONNECTING && nd->hs <= HS_AUTH_SENT;
}

/* Connect and authenticate one node, waiting for it (at create, before the progress loop runs): the
 * worker progresses meanwhile, as the node wires up its endpoint to us before AUTH_OK. */
kvs_status remote_node_connect(remote *r, rnode *nd) {
    kvs_status st = handshake_begin(r, nd);
    if (st != KVS_OK) return st;
    while ((st = handshake_advance(r, nd)) == KVS_EAGAIN) {
        kvs_ucx_progress(r->t);
        if (kvs_ucx_arm(r->t) == KVS_EAGAIN) continue;
        struct pollfd p[2] = {{.fd = nd->ctl.fd, .events = remote_handshake_events(nd)},
                              {.fd = kvs_ucx_event_fd(r->t), .events = POLLIN}};
        int ms = ms_left(nd->hs_deadline_ns);
        (void)poll(p, 2, ms > 0 ? ms : 0);
    }
    return st;
}

/* Start the handshakes that are due and move on those under way, without waiting on any. */
void remote_reconnect_due(remote *r, uint64_t *next_ns) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        if (nd->up) continue;
        kvs_status st = KVS_EAGAIN;
        if (remote_in_handshake(nd))
            st = handshake_advance(r, nd);
        else if (kvs_now_ns() >= nd->next_attempt_ns) {
            st = handshake_begin(r, nd);
            if (st == KVS_OK) st = handshake_advance(r, nd);
        } else {
            if (nd->next_attempt_ns < *next_ns) *next_ns = nd->next_attempt_ns;
            continue;
        }
        if (st == KVS_EAGAIN) {
            if (nd->hs_deadline_ns < *next_ns) *next_ns = nd->hs_deadline_ns;
        } else if (st == KVS_OK) {
            remote_set_error(r, "node %s is up again", node_id(r, nd));
        } else {
            char why[KVS_WIRE_MAX_ERROR_TEXT + 1];
            snprintf(why, sizeof why, "%s", nd->refusal);
            remote_node_down(r, nd, why);
            if (nd->next_attempt_ns < *next_ns) *next_ns = nd->next_attempt_ns;
        }
    }
}

void remote_on_dead(void *user, kvs_ucx_conn *conn, const char *why) {
    (void)user;
    rnode *nd = kvs_ucx_conn_user(conn);
    if (!nd) return;
    nd->conn_dead = 1;
    snprintf(nd->refusal, sizeof nd->refusal, "%s", why ? why : "connection lost");
    if (nd->pending) {
        nd->pending = 0;
        nd->failed = 1;
    }
}
