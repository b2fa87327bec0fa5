/*
 * ucx_remote.c - the remote tier's I/O (contract in remote.h): one progress thread owns the UCX
 * transport, the connections and the registered memory; ops queue a job and wait on a condition
 * variable. The thread sleeps on the worker's event fd and an eventfd doorbell.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "common/log.h"
#include "control.h"
#include "hashring.h"
#include "remote.h"
#include "ucx_transport.h"
#include "wire.h"

#define REMOTE_AM_ID   1u          /* the id kvstrata-node speaks (tools/node/node.h) */
#define BOUNCE_DEFAULT (16u << 20) /* when the connector gives no max_object_bytes */
#define ERROR_BYTES    512u

#define PUT_BATCH_BYTES \
    (KVS_WIRE_MAX_MESSAGE_BYTES - 16384u) /* budget of one PUT message's entries */

enum { JOB_LOOKUP, JOB_GET, JOB_PUT, JOB_DELETE, JOB_STATS, JOB_FLUSH };
/* A node's handshake, driven without blocking by the progress thread (handshake_advance) so a node
 * that answers slowly or not at all never holds up requests to the others. */
enum { HS_NONE, HS_CONNECTING, HS_HELLO_SENT, HS_CHALLENGE, HS_AUTH_SENT, HS_OK, HS_REFUSED };

typedef struct job {
    int kind;
    uint64_t n;
    kvs_key *keys;        /* n, a copy */
    uint8_t *present;     /* LOOKUP: n */
    uint64_t *lens;       /* GET: n */
    kvs_status *statuses; /* GET, DELETE: n */
    void *const *dsts;    /* GET: the caller's, touched only under the lock while not abandoned */
    const uint64_t *caps; /* GET: copied into cap */
    uint64_t *cap;
    uint8_t *resolved;  /* n: answered (hit, miss or error) */
    uint64_t *off;      /* GET: n, offset in the bounce buffer, UINT64_MAX when direct */
    const void *object; /* PUT: the copy in the put queue */
    uint64_t len;
    uint64_t queue_span; /* PUT: bytes of the put queue this job holds (with any wrap-around gap) */
    uint64_t objects, bytes; /* STATS */
    uint64_t deadline_ns;
    kvs_status status;
    int done, abandoned;
    int detached; /* PUT: nobody waits; the thread frees it */
    struct job *next;
} job;

typedef struct rnode {
    uint32_t index;
    int ctl_fd;             /* the control connection (TCP): open while the session lives; -1 */
    kvs_control_reader *rd; /* its frames during the handshake */
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES]; /* AUTH_OK: the header of every request */
    kvs_ucx_conn *conn; /* requests: an endpoint to the node's worker address (from AUTH_OK) */
    int up;
    int conn_dead;
    int hs;
    uint64_t hs_deadline_ns; /* the whole handshake's, timeout_ms after it began */
    uint8_t nonce[KVS_WIRE_NONCE_BYTES];
    uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES];
    char refusal[KVS_WIRE_MAX_ERROR_TEXT + 1];
    char payload_tls[KVS_WIRE_MAX_TRANSPORTS_TEXT +
                     1]; /* AUTH_OK: what the node's RMA to us runs over */
    uint64_t backoff_ms;
    uint64_t next_attempt_ns;
    int was_up;
    int shared_memory; /* up, and its payloads run over something other than tcp */
    /* the one outstanding request of this node */
    int pending;
    uint64_t request_id;
    uint32_t n_batch;
    uint32_t *batch; /* KVS_WIRE_MAX_KEYS indices into the job's keys */
    int failed;      /* the batch's reply did not come or was an ERROR */
} rnode;

typedef struct remote {
    char name[64];
    kvs_remote_options opt;
    kvs_remote_psk psk;
    const kvs_backend_host *host;
    uint8_t *staging;
    uint64_t staging_len;
    uint64_t max_object_bytes;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t
        put_order; /* one put at a time takes queue room and queues: room is freed in order */
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int doorbell;
    job *head, *tail;
    int stopping;
    int ready; /* 1: started, -1: failed */
    kvs_status ready_status;
    char error[ERROR_BYTES];

    /* counters, under mutex */
    kvs_remote_stats_t stats;

    /* the put queue: a registered ring; puts copy their object in and return, the thread sends them
     * in batches and frees the room in queue order (head, used: under mutex) */
    uint8_t *queue;
    uint64_t queue_len, queue_head, queue_used;
    kvs_ucx_mem *queue_mem;
    uint8_t queue_rkey[KVS_WIRE_MAX_RKEY_BYTES];
    uint32_t queue_rkey_len;
    job **put_jobs; /* the batch being sent: KVS_WIRE_MAX_KEYS */
    uint32_t n_put_jobs;

    /* owned by the progress thread */
    kvs_ucx_transport *t;
    kvs_ucx_mem *staging_mem;
    uint8_t *bounce;
    uint64_t bounce_len;
    kvs_ucx_mem *bounce_mem;
    uint8_t staging_rkey[KVS_WIRE_MAX_RKEY_BYTES], bounce_rkey[KVS_WIRE_MAX_RKEY_BYTES];
    uint32_t staging_rkey_len, bounce_rkey_len;
    uint8_t *worker_addr; /* sent in AUTH: the node makes its endpoint to us from it */
    size_t worker_addr_len;
    uint8_t host_id[KVS_REMOTE_HOST_ID_BYTES];
    int offer_shared_memory; /* shared_memory: auto and a host id: AUTH carries host_id and pid too */
    struct pollfd *pfds;     /* the idle poll: worker, doorbell, each node's control connection */
    kvs_remote_ring ring;
    rnode *nodes;
    uint64_t next_id;
    uint8_t *send_buf;
    kvs_wire_entry *entries;       /* for encoding */
    kvs_wire_entry *reply_entries; /* for decoding */
    job *current;
} remote;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int ms_left(uint64_t deadline) {
    uint64_t now = now_ns();
    if (now >= deadline) return 0;
    uint64_t ms = (deadline - now + 999999ull) / 1000000ull;
    return ms > 600000 ? 600000 : (int)ms;
}

static void set_error(remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(remote *r, const char *fmt, ...) {
    char msg[ERROR_BYTES - 80];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&r->mutex);
    snprintf(r->error, sizeof r->error, "remote tier \"%s\": %s", r->name, msg);
    pthread_mutex_unlock(&r->mutex);
    if (r->host && r->host->log &&
        r->host->struct_size >= offsetof(kvs_backend_host, log) + sizeof r->host->log) {
        char line[ERROR_BYTES];
        snprintf(line, sizeof line, "remote tier \"%s\": %s", r->name, msg);
        r->host->log(r->host->ctx, KVS_LOG_WARN, line);
    }
}

static const char *node_id(const remote *r, const rnode *nd) {
    return r->opt.ids[nd->index];
}

/* ---- messages from nodes ----------------------------------------------------------------------- */

static void take_reply(remote *r, rnode *nd, const kvs_wire_msg *m) {
    job *j = r->current;
    if (m->type == KVS_WIRE_ERROR) {
        snprintf(nd->refusal, sizeof nd->refusal, "%.*s", (int)m->error_text_len,
                 m->error_text ? m->error_text : "");
        if (nd->pending && m->request_id == nd->request_id) {
            nd->pending = 0;
            nd->failed = 1;
        }
        return;
    }
    if (!nd->pending || m->request_id != nd->request_id || !j)
        return; /* late reply of a past job */
    uint32_t want = m->type == KVS_WIRE_STATS_REPLY ? 0 : nd->n_batch;
    if (m->n_entries != want) {
        nd->pending = 0;
        nd->failed = 1;
        return;
    }
    for (uint32_t i = 0; i < m->n_entries; i++) {
        uint32_t k = nd->batch[i];
        const kvs_wire_entry *e = &m->entries[i];
        switch (m->type) {
            case KVS_WIRE_LOOKUP_REPLY:
                j->present[k] = e->present;
                j->resolved[k] = 1;
                break;
            case KVS_WIRE_GET_REPLY:
                j->statuses[k] = e->status;
                j->lens[k] = e->length;
                j->resolved[k] = 1;
                break;
            case KVS_WIRE_PUT_REPLY:
                if (k < r->n_put_jobs) {
                    pthread_mutex_lock(&r->mutex);
                    if (e->status == KVS_OK)
                        r->stats.puts_stored++;
                    else
                        r->stats.puts_refused++;
                    pthread_mutex_unlock(&r->mutex);
                }
                break;
            case KVS_WIRE_DELETE_REPLY:
                if (e->status != KVS_OK && e->status != KVS_ENOTFOUND) j->statuses[k] = e->status;
                break;
            default: break;
        }
    }
    if (m->type == KVS_WIRE_STATS_REPLY) {
        j->objects += m->counters[KVS_WIRE_STAT_OBJECTS];
        j->bytes += m->counters[KVS_WIRE_STAT_BYTES_USED];
    }
    nd->pending = 0;
}

/* The node waiting for the reply to request_id (request ids are unique across the tier's nodes). */
static rnode *node_of_request(remote *r, uint64_t request_id) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++)
        if (r->nodes[i].conn && r->nodes[i].pending && r->nodes[i].request_id == request_id)
            return &r->nodes[i];
    return NULL;
}

static void on_message(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                       const void *data, size_t data_len) {
    remote *r = user;
    (void)header;
    (void)header_len;
    /* UCX names our endpoint as the sender when it paired it with the node's; else the request id does */
    rnode *nd = conn ? kvs_ucx_conn_user(conn) : NULL;
    kvs_wire_msg m;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_decode(data, data_len, r->reply_entries, KVS_WIRE_MAX_KEYS, &m, &why) != KVS_OK) {
        if (!nd && why.have_request_id) nd = node_of_request(r, why.request_id);
        if (!nd) return;
        snprintf(nd->refusal, sizeof nd->refusal, "unreadable reply: %s", why.text);
        if (nd->pending) {
            nd->pending = 0;
            nd->failed = 1;
        }
        return;
    }
    if (!nd) nd = node_of_request(r, m.request_id);
    if (nd && nd->conn) take_reply(r, nd, &m);
}

static void on_dead(void *user, kvs_ucx_conn *conn, const char *why) {
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

/* ---- connections ------------------------------------------------------------------------------- */

static void control_close(rnode *nd) {
    if (nd->ctl_fd >= 0) close(nd->ctl_fd);
    nd->ctl_fd = -1;
    free(nd->rd);
    nd->rd = NULL;
}

static void node_down(remote *r, rnode *nd, const char *why) {
    if (nd->conn) {
        kvs_ucx_conn_set_user(nd->conn, NULL);
        kvs_ucx_conn_abort(nd->conn); /* the node may still read queue room we are about to reuse */
        nd->conn = NULL;
    }
    control_close(nd);
    nd->pending = 0;
    nd->conn_dead = 0;
    if (nd->up) {
        nd->up = 0;
        kvs_remote_ring_set_down(&r->ring, node_id(r, nd), 1);
        pthread_mutex_lock(&r->mutex);
        r->stats.node_failures++;
        r->stats.nodes_up--;
        r->stats.nodes_shared_memory -= (uint32_t)nd->shared_memory;
        nd->shared_memory = 0;
        pthread_mutex_unlock(&r->mutex);
        set_error(r, "node %s is down (%s); its keys are misses until it reconnects",
                  node_id(r, nd), why);
    }
    nd->next_attempt_ns = now_ns() + nd->backoff_ms * 1000000ull;
    nd->backoff_ms = nd->backoff_ms * 2 > KVS_REMOTE_MAX_BACKOFF_MS ? KVS_REMOTE_MAX_BACKOFF_MS
                                                                    : nd->backoff_ms * 2;
}

static kvs_status send_msg(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline) {
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
static kvs_status control_send(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline) {
    char err[256];
    size_t len = 0;
    kvs_status st =
        kvs_control_encode(m, r->send_buf, KVS_WIRE_MAX_MESSAGE_BYTES, &len, err, sizeof err);
    if (st == KVS_OK)
        st = kvs_control_write(nd->ctl_fd, r->send_buf, len, deadline, err, sizeof err);
    if (st != KVS_OK) snprintf(nd->refusal, sizeof nd->refusal, "handshake: %s", err);
    return st;
}

/* The node's next handshake frame, if it is all there, decoded into *m (pointing into nd->rd):
 * KVS_OK, KVS_EAGAIN (not yet), or an error with nd->refusal set. Whatever the peer sends (garbage, a
 * huge length) ends in a status, never in a crash. */
static kvs_status control_take(remote *r, rnode *nd, kvs_wire_msg *m) {
    char err[160];
    size_t len = 0;
    kvs_status st = kvs_control_read(nd->rd, nd->ctl_fd, &len, err, sizeof err);
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
    int slow = kvs_ucx_tls_slow(nd->payload_tls);
    if (!r->host || !r->host->log ||
        r->host->struct_size < offsetof(kvs_backend_host, log) + sizeof r->host->log)
        return;
    char line[ERROR_BYTES];
    snprintf(
        line, sizeof line, "remote tier \"%s\": node %s: requests over %s, payloads over %s%s",
        r->name, node_id(r, nd), req, pay,
        slow ? (r->worker_addr
                    ? " only - a slow fallback (RMA emulated over messages; no RDMA, and the node "
                      "is on another host or shared memory did not connect)"
                    : " only - a slow fallback (shared_memory: off)")
             : "");
    r->host->log(r->host->ctx, slow ? KVS_LOG_WARN : KVS_LOG_INFO, line);
}

/* Begin a node's handshake: a control connection that is still being made (HS_CONNECTING). On
 * failure nd->refusal says why and the caller's node_down closes what was opened. */
static kvs_status handshake_begin(remote *r, rnode *nd) {
    char err[256];
    nd->refusal[0] = '\0';
    nd->hs = HS_NONE;
    nd->conn_dead = 0;
    control_close(nd);
    nd->hs_deadline_ns = now_ns() + (uint64_t)r->opt.timeout_ms * 1000000ull;
    if (!(nd->rd = malloc(sizeof *nd->rd))) {
        snprintf(nd->refusal, sizeof nd->refusal, "no memory for a control connection");
        return KVS_ENOMEM;
    }
    nd->rd->have_prefix = 0;
    kvs_status st = kvs_control_connect_start(r->opt.hosts[nd->index], r->opt.ports[nd->index],
                                              &nd->ctl_fd, err, sizeof err);
    if (st != KVS_OK) {
        snprintf(nd->refusal, sizeof nd->refusal, "%s", err);
        return st;
    }
    nd->hs = HS_CONNECTING;
    return KVS_OK;
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
    log_transports(r, nd);
    kvs_remote_ring_set_down(&r->ring, node_id(r, nd), 0);
    pthread_mutex_lock(&r->mutex);
    r->stats.nodes_up++;
    r->stats.nodes_shared_memory += (uint32_t)nd->shared_memory;
    if (nd->was_up) r->stats.reconnects++;
    pthread_mutex_unlock(&r->mutex);
    nd->was_up = 1;
    return KVS_OK;
}

/* Take a node's handshake as far as it can go now, without waiting: KVS_OK once the node is up,
 * KVS_EAGAIN while it waits for the connection or a reply (handshake_events says for what), else a
 * failure with nd->refusal set (its deadline passing included). */
static kvs_status handshake_advance(remote *r, rnode *nd) {
    kvs_wire_msg m;
    kvs_status st;
    char err[200];
    if (now_ns() >= nd->hs_deadline_ns) {
        snprintf(nd->refusal, sizeof nd->refusal,
                 nd->hs == HS_CONNECTING ? "no connection within %u ms"
                                         : "no handshake reply within %u ms",
                 r->opt.timeout_ms);
        return KVS_ETIMEDOUT;
    }
    switch (nd->hs) {
        case HS_CONNECTING:
            if ((st = kvs_control_connect_finish(nd->ctl_fd, err, sizeof err)) != KVS_OK) {
                if (st != KVS_EAGAIN) snprintf(nd->refusal, sizeof nd->refusal, "%s", err);
                return st;
            }
            kvs_wire_msg_init(&m, KVS_WIRE_HELLO, nd->request_id = ++r->next_id);
            if ((st = kvs_remote_random(nd->nonce, sizeof nd->nonce)) != KVS_OK) return st;
            m.tenant = r->opt.tenant;
            m.tenant_len = (uint32_t)strlen(r->opt.tenant);
            m.nonce = nd->nonce;
            nd->hs = HS_HELLO_SENT;
            if ((st = control_send(r, nd, &m, nd->hs_deadline_ns)) != KVS_OK) return st;
            __attribute__((fallthrough)); /* the challenge may be there already */
        case HS_HELLO_SENT: {
            if ((st = handshake_step(r, nd, KVS_WIRE_CHALLENGE, &m)) != KVS_OK) return st;
            if (kvs_remote_node_proof_check(&r->psk, m.challenge, nd->nonce, r->opt.tenant,
                                            strlen(r->opt.tenant), m.proof,
                                            m.proof ? KVS_WIRE_PROOF_BYTES : 0) != KVS_OK) {
                /* not a node holding our key: it gets neither our proof nor our worker address */
                snprintf(nd->refusal, sizeof nd->refusal,
                         "the peer's challenge does not prove it holds the key (not a "
                         "kvstrata node, or another psk_file)");
                nd->hs = HS_REFUSED;
                pthread_mutex_lock(&r->mutex);
                r->stats.auth_refusals++;
                pthread_mutex_unlock(&r->mutex);
                return KVS_EIO;
            }
            memcpy(nd->challenge, m.challenge, KVS_WIRE_CHALLENGE_BYTES);
            nd->hs = HS_CHALLENGE;
            uint8_t proof[KVS_WIRE_PROOF_BYTES];
            st = kvs_remote_auth_proof(&r->psk, nd->challenge, nd->nonce, r->opt.tenant,
                                       strlen(r->opt.tenant), proof);
            if (st != KVS_OK) return st;
            kvs_wire_msg_init(&m, KVS_WIRE_AUTH, nd->request_id = ++r->next_id);
            m.proof = proof;
            m.worker_addr = r->worker_addr;
            m.worker_addr_len = (uint32_t)r->worker_addr_len;
            if (r->offer_shared_memory) {
                m.host_id = r->host_id;
                m.host_id_len = sizeof r->host_id;
                m.pid = (uint32_t)getpid();
            }
            nd->payload_tls[0] = '\0';
            nd->hs = HS_AUTH_SENT;
            if ((st = control_send(r, nd, &m, nd->hs_deadline_ns)) != KVS_OK) return st;
        }
            __attribute__((fallthrough));
        case HS_AUTH_SENT:
            if ((st = handshake_step(r, nd, KVS_WIRE_AUTH_OK, &m)) != KVS_OK) return st;
            return handshake_finish(r, nd, &m);
        default:
            snprintf(nd->refusal, sizeof nd->refusal, "handshake in an unexpected state %d",
                     nd->hs);
            return KVS_ESTATE;
    }
}

/* What a node in its handshake waits for on its control connection. */
static short handshake_events(const rnode *nd) {
    return nd->hs == HS_CONNECTING ? POLLOUT : POLLIN;
}

/* 1 while a node's handshake is under way (begun, neither up nor failed). */
static int in_handshake(const rnode *nd) {
    return !nd->up && nd->ctl_fd >= 0 && nd->hs >= HS_CONNECTING && nd->hs <= HS_AUTH_SENT;
}

/* Connect and authenticate one node, waiting for it (at create, before the progress loop runs): the
 * worker progresses meanwhile, as the node wires up its endpoint to us before AUTH_OK. */
static kvs_status node_connect(remote *r, rnode *nd) {
    kvs_status st = handshake_begin(r, nd);
    if (st != KVS_OK) return st;
    while ((st = handshake_advance(r, nd)) == KVS_EAGAIN) {
        kvs_ucx_progress(r->t);
        if (kvs_ucx_arm(r->t) == KVS_EAGAIN) continue;
        struct pollfd p[2] = {{.fd = nd->ctl_fd, .events = handshake_events(nd)},
                              {.fd = kvs_ucx_event_fd(r->t), .events = POLLIN}};
        int ms = ms_left(nd->hs_deadline_ns);
        (void)poll(p, 2, ms > 0 ? ms : 0);
    }
    return st;
}

/* ---- jobs on the progress thread ---------------------------------------------------------------- */

static void finish(remote *r, job *j);

static int in_staging(const remote *r, const void *p, uint64_t len) {
    const uint8_t *b = p;
    return r->staging_mem && b >= r->staging && len <= r->staging_len &&
           (uint64_t)(b - r->staging) <= r->staging_len - len;
}

/* The first live home of key k, or -1. */
static int32_t first_home(remote *r, const kvs_key *k) {
    uint32_t homes[KVS_REMOTE_RING_MAX_REPLICAS], n = 0;
    if (kvs_remote_ring_homes(&r->ring, k, r->opt.replicas, homes, &n) != KVS_OK || n == 0)
        return -1;
    return (int32_t)homes[0];
}

/* Send every node's batch, wait for the replies until the deadline; nodes that did not answer, or
 * whose connection died, are marked down (their batch keys stay unresolved). */
static void exchange(remote *r, int type, uint64_t deadline) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        nd->failed = 0;
        if (!nd->pending) continue;
        kvs_wire_msg m;
        kvs_wire_msg_init(&m, (kvs_wire_type)type, nd->request_id = ++r->next_id);
        m.entries = r->entries;
        m.n_entries = nd->n_batch;
        job *j = r->current;
        for (uint32_t b = 0; b < nd->n_batch; b++) {
            kvs_wire_entry *e = &r->entries[b];
            memset(e, 0, sizeof *e);
            uint32_t k = nd->batch[b];
            e->key = type == KVS_WIRE_PUT ? r->put_jobs[k]->keys[0].bytes : j->keys[k].bytes;
            if (type == KVS_WIRE_GET) {
                int direct = j->off[k] == UINT64_MAX;
                e->remote_addr = direct ? (uint64_t)(uintptr_t)j->dsts[k]
                                        : (uint64_t)(uintptr_t)(r->bounce + j->off[k]);
                e->length = j->cap[k];
                e->rkey = direct ? r->staging_rkey : r->bounce_rkey;
                e->rkey_len = direct ? r->staging_rkey_len : r->bounce_rkey_len;
            } else if (type == KVS_WIRE_PUT) {
                const job *pj = r->put_jobs[k];
                e->length = pj->len;
                if (pj->len <= KVS_WIRE_MAX_INLINE_BYTES) {
                    e->inline_data = pj->object;
                } else {
                    e->remote_addr = (uint64_t)(uintptr_t)pj->object;
                    e->rkey = r->queue_rkey;
                    e->rkey_len = r->queue_rkey_len;
                }
            }
        }
        if (type == KVS_WIRE_STATS) m.n_entries = 0, m.entries = NULL;
        if (type ==
            KVS_WIRE_PUT) { /* detached: each node gets timeout_ms from its own send (run_puts) */
            uint64_t fair = now_ns() + (uint64_t)r->opt.timeout_ms * 1000000ull;
            if (deadline < fair) deadline = fair;
        }
        if (send_msg(r, nd, &m, deadline) != KVS_OK) {
            nd->pending = 0;
            nd->failed = 1;
        } else if (type == KVS_WIRE_PUT) {
            pthread_mutex_lock(&r->mutex);
            r->stats.put_requests++;
            pthread_mutex_unlock(&r->mutex);
        }
    }
    for (;;) {
        int waiting = 0;
        for (uint32_t i = 0; i < r->opt.n_nodes; i++)
            waiting |= r->nodes[i].pending && !r->nodes[i].conn_dead;
        if (!waiting || ms_left(deadline) <= 0) break;
        kvs_ucx_wait(r->t, ms_left(deadline));
    }
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        if (nd->pending) {
            if (!nd->conn_dead)
                snprintf(nd->refusal, sizeof nd->refusal, "no reply within %u ms",
                         r->opt.timeout_ms);
            nd->pending = 0;
            nd->failed = 1;
        }
        if (nd->failed || nd->conn_dead) {
            if (type == KVS_WIRE_PUT) { /* the copies this node did not confirm */
                pthread_mutex_lock(&r->mutex);
                r->stats.puts_dropped += nd->n_batch;
                pthread_mutex_unlock(&r->mutex);
            }
            node_down(r, nd, nd->refusal[0] ? nd->refusal : "request failed");
        }
        nd->n_batch = 0;
    }
}

/* LOOKUP and GET: rounds of one batch per first live home until every key is answered, no home is
 * left, or the deadline passes. A node that fails mid-round is marked down and its keys go to the
 * next home in the next round. */
static void run_keyed(remote *r, job *j) {
    int type = j->kind == JOB_LOOKUP ? KVS_WIRE_LOOKUP : KVS_WIRE_GET;
    while (ms_left(j->deadline_ns) > 0) {
        uint64_t bounce_used = 0;
        int any = 0;
        for (uint64_t k = 0; k < j->n; k++) {
            if (j->resolved[k]) continue;
            int32_t h = first_home(r, &j->keys[k]);
            if (h < 0) {
                j->resolved[k] = 1; /* no live home: a miss */
                continue;
            }
            rnode *nd = &r->nodes[h];
            if (nd->n_batch == KVS_WIRE_MAX_KEYS) continue; /* next round */
            j->off[k] = UINT64_MAX;
            if (type == KVS_WIRE_GET && !in_staging(r, j->dsts[k], j->cap[k])) {
                if (j->cap[k] > r->bounce_len) j->cap[k] = r->bounce_len; /* larger: EOVERFLOW */
                uint64_t need = (j->cap[k] + 63) & ~63ull;
                if (need > r->bounce_len - bounce_used) continue; /* next round */
                j->off[k] = bounce_used;
                bounce_used += need;
            }
            nd->batch[nd->n_batch++] = (uint32_t)k;
            nd->pending = 1;
            any = 1;
        }
        if (!any) return;
        exchange(r, type, j->deadline_ns);
        if (type != KVS_WIRE_GET) continue;
        uint64_t rma = 0, bounced = 0;
        pthread_mutex_lock(
            &r->mutex); /* an abandoning caller never races the copy into its memory */
        for (uint64_t k = 0; k < j->n; k++) {
            if (!j->resolved[k] || j->off[k] == UINT64_MAX - 1) continue;
            if (j->off[k] == UINT64_MAX) {
                rma += j->statuses[k] == KVS_OK;
            } else if (j->statuses[k] == KVS_OK && !j->abandoned) {
                uint64_t n = j->lens[k] <= j->cap[k] ? j->lens[k] : j->cap[k];
                memcpy(j->dsts[k], r->bounce + j->off[k], n);
                bounced++;
            }
            j->off[k] = UINT64_MAX - 1; /* copied or counted */
        }
        r->stats.rma_gets += rma;
        r->stats.bounce_gets += bounced;
        pthread_mutex_unlock(&r->mutex);
    }
}

/* Add key k of the current batch to each live home's batch; homes that are down drop their copy. */
static void to_homes(remote *r, const kvs_key *key, uint32_t k, int is_put) {
    uint32_t homes[KVS_REMOTE_RING_MAX_REPLICAS], n_homes = 0;
    if (kvs_remote_ring_homes(&r->ring, key, r->opt.replicas, homes, &n_homes) != KVS_OK)
        n_homes = 0;
    if (is_put && n_homes < r->opt.replicas) {
        pthread_mutex_lock(&r->mutex);
        r->stats.puts_dropped += r->opt.replicas - n_homes;
        pthread_mutex_unlock(&r->mutex);
    }
    for (uint32_t h = 0; h < n_homes; h++) {
        rnode *nd = &r->nodes[homes[h]];
        nd->batch[nd->n_batch++] = k;
        nd->pending = 1;
    }
}

/* DELETE at every live home, STATS from every live node. */
static void run_broadcast(remote *r, job *j) {
    if (j->kind == JOB_STATS) {
        for (uint32_t i = 0; i < r->opt.n_nodes; i++) r->nodes[i].pending = r->nodes[i].up;
        exchange(r, KVS_WIRE_STATS, j->deadline_ns);
        return;
    }
    for (uint64_t k = 0; k < j->n; k++) to_homes(r, &j->keys[k], (uint32_t)k, 0);
    exchange(r, KVS_WIRE_DELETE, j->deadline_ns);
}

/* What one queued put adds to a PUT message: the entry's fields, and the object when it is inline. */
static uint64_t put_entry_bytes(const job *j) {
    return 96u + (j->len <= KVS_WIRE_MAX_INLINE_BYTES ? j->len : KVS_WIRE_MAX_RKEY_BYTES);
}

/* The queued puts from first on, as many as one PUT message per node carries: one request per home
 * node, the node reads the objects out of the put queue with RMA (all in flight, one flush). Puts
 * whose deadline passed while queued are dropped and counted. */
static void run_puts(remote *r, job *first) {
    uint32_t n = 0;
    uint64_t bytes = 0, deadline = 0;
    job *j = first;
    for (;;) {
        if (ms_left(j->deadline_ns) > 0) {
            if (!n || j->deadline_ns < deadline) deadline = j->deadline_ns;
            r->put_jobs[n++] = j;
            bytes += put_entry_bytes(j);
        } else {
            pthread_mutex_lock(&r->mutex);
            r->stats.puts_dropped += r->opt.replicas;
            pthread_mutex_unlock(&r->mutex);
            r->put_jobs[n++] = j; /* finished with the batch, never sent */
            j->status = KVS_ETIMEDOUT;
        }
        pthread_mutex_lock(&r->mutex);
        j = r->head;
        if (j && j->kind == JOB_PUT && n < KVS_WIRE_MAX_KEYS &&
            bytes + put_entry_bytes(j) <= PUT_BATCH_BYTES) {
            r->head = j->next;
            if (!r->head) r->tail = NULL;
        } else {
            j = NULL;
        }
        pthread_mutex_unlock(&r->mutex);
        if (!j) break;
    }
    r->n_put_jobs = n;
    r->current = first;
    int any = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (r->put_jobs[k]->status == KVS_ETIMEDOUT) continue;
        to_homes(r, &r->put_jobs[k]->keys[0], k, 1);
        any = 1;
    }
    /* exchange gives each node timeout_ms from its send: a batch that waited in the queue (behind a
     * node that did not answer) must not cost a live node its connection for a wait that was ours.
     * The puts are detached, so nobody waits on the longer deadline, and their queue room stays held
     * until the nodes answer, so a late read by a node still finds its bytes. (Gets keep their own
     * deadline: their bytes land in the caller's buffer, which must not be written after it gave up.) */
    if (any) exchange(r, KVS_WIRE_PUT, deadline);
    r->current = NULL;
    r->n_put_jobs = 0;
    for (uint32_t k = 0; k < n; k++) finish(r, r->put_jobs[k]);
}

static void run_job(remote *r, job *j) {
    r->current = j;
    switch (j->kind) {
        case JOB_LOOKUP:
        case JOB_GET: run_keyed(r, j); break;
        case JOB_FLUSH: /* done by being reached: every job queued before it has finished */ break;
        default: run_broadcast(r, j); break;
    }
    r->current = NULL;
}

/* ---- the progress thread ------------------------------------------------------------------------ */

static void finish(remote *r, job *j) {
    pthread_mutex_lock(&r->mutex);
    if (j->kind == JOB_PUT) { /* its room in the queue: puts finish in the order they took it */
        r->queue_used -= j->queue_span;
        pthread_cond_broadcast(&r->cond);
    }
    if (j->abandoned || j->detached) {
        pthread_mutex_unlock(&r->mutex);
        free(j);
        return;
    }
    j->done = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mutex);
}

/* Start the handshakes that are due and move on those under way, without waiting on any. */
static void reconnect_due(remote *r, uint64_t *next_ns) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        if (nd->up) continue;
        kvs_status st = KVS_EAGAIN;
        if (in_handshake(nd))
            st = handshake_advance(r, nd);
        else if (now_ns() >= nd->next_attempt_ns) {
            st = handshake_begin(r, nd);
            if (st == KVS_OK) st = handshake_advance(r, nd);
        } else {
            if (nd->next_attempt_ns < *next_ns) *next_ns = nd->next_attempt_ns;
            continue;
        }
        if (st == KVS_EAGAIN) {
            if (nd->hs_deadline_ns < *next_ns) *next_ns = nd->hs_deadline_ns;
        } else if (st == KVS_OK) {
            set_error(r, "node %s is up again", node_id(r, nd));
        } else {
            char why[KVS_WIRE_MAX_ERROR_TEXT + 1];
            snprintf(why, sizeof why, "%s", nd->refusal);
            node_down(r, nd, why);
            if (nd->next_attempt_ns < *next_ns) *next_ns = nd->next_attempt_ns;
        }
    }
}

static kvs_status thread_start(remote *r) {
    kvs_ucx_params p;
    char err[256] = "";
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.name = r->name;
    p.log_level = KVS_LOG_WARN;
    p.on_dead = on_dead;
    p.user = r;
    kvs_status st = kvs_ucx_create(&p, &r->t, err, sizeof err);
    if (st != KVS_OK) {
        set_error(r, "cannot start UCX: %s", err);
        return st;
    }
    if ((st = kvs_ucx_am_handler(r->t, REMOTE_AM_ID, on_message, r)) != KVS_OK) goto ucx_fail;
    size_t len = 0;
    if (r->staging && r->staging_len) {
        if ((st = kvs_ucx_mem_register(r->t, r->staging, (size_t)r->staging_len,
                                       &r->staging_mem)) != KVS_OK)
            goto ucx_fail;
        if ((st = kvs_ucx_mem_pack(r->staging_mem, r->staging_rkey, sizeof r->staging_rkey,
                                   &len)) != KVS_OK)
            goto ucx_fail;
        r->staging_rkey_len = (uint32_t)len;
    }
    if ((st = kvs_ucx_mem_register(r->t, r->bounce, (size_t)r->bounce_len, &r->bounce_mem)) !=
        KVS_OK)
        goto ucx_fail;
    if ((st = kvs_ucx_mem_pack(r->bounce_mem, r->bounce_rkey, sizeof r->bounce_rkey, &len)) !=
        KVS_OK)
        goto ucx_fail;
    r->bounce_rkey_len = (uint32_t)len;
    if ((st = kvs_ucx_mem_register(r->t, r->queue, (size_t)r->queue_len, &r->queue_mem)) != KVS_OK)
        goto ucx_fail;
    if ((st = kvs_ucx_mem_pack(r->queue_mem, r->queue_rkey, sizeof r->queue_rkey, &len)) != KVS_OK)
        goto ucx_fail;
    r->queue_rkey_len = (uint32_t)len;
    /* every node gets the worker address in AUTH; with shared_memory: auto the host id too (a node on
     * another host ignores it) */
    r->offer_shared_memory = r->opt.shared_memory && kvs_remote_host_id(r->host_id) == KVS_OK;
    size_t need = 0;
    if (kvs_ucx_worker_address(r->t, NULL, 0, &need) != KVS_EOVERFLOW || need == 0 ||
        need > KVS_WIRE_MAX_WORKER_ADDR_BYTES || !(r->worker_addr = malloc(need)) ||
        kvs_ucx_worker_address(r->t, r->worker_addr, need, &r->worker_addr_len) != KVS_OK) {
        st = KVS_EIO;
        goto ucx_fail;
    }
    if (!(r->pfds = calloc(r->opt.n_nodes + 2, sizeof *r->pfds))) {
        st = KVS_ENOMEM;
        goto ucx_fail;
    }
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        if (node_connect(r, nd) == KVS_OK) continue;
        if (nd->hs == HS_REFUSED) {
            set_error(r, "node %s refused authentication for tenant \"%s\" (%s); check psk_file %s",
                      node_id(r, nd), r->opt.tenant,
                      nd->refusal[0] ? nd->refusal : "no reason given", r->opt.psk_file);
            return KVS_EIO;
        }
        char why[KVS_WIRE_MAX_ERROR_TEXT + 1];
        snprintf(why, sizeof why, "%s", nd->refusal);
        nd->up = 1; /* so node_down reports and counts it once */
        pthread_mutex_lock(&r->mutex);
        r->stats.nodes_up++;
        pthread_mutex_unlock(&r->mutex);
        node_down(r, nd, why);
        pthread_mutex_lock(&r->mutex);
        r->stats.node_failures--;
        pthread_mutex_unlock(&r->mutex);
    }
    return KVS_OK;
ucx_fail:
    set_error(r, "UCX setup failed: %s", kvs_ucx_last_error(r->t));
    return st;
}

static void thread_stop(remote *r) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        if (r->nodes[i].conn) {
            kvs_ucx_conn_set_user(r->nodes[i].conn, NULL);
            kvs_ucx_conn_close(r->nodes[i].conn);
            r->nodes[i].conn = NULL;
        }
        control_close(&r->nodes[i]);
    }
    kvs_ucx_mem_deregister(r->bounce_mem);
    kvs_ucx_mem_deregister(r->queue_mem);
    kvs_ucx_mem_deregister(r->staging_mem);
    kvs_ucx_destroy(r->t);
    r->t = NULL;
    free(r->worker_addr);
    r->worker_addr = NULL;
    free(r->pfds);
    r->pfds = NULL;
}

static void *progress_main(void *arg) {
    remote *r = arg;
    kvs_status st = thread_start(r);
    pthread_mutex_lock(&r->mutex);
    r->ready = st == KVS_OK ? 1 : -1;
    r->ready_status = st;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mutex);
    if (st != KVS_OK) {
        thread_stop(r);
        return NULL;
    }
    for (;;) {
        kvs_ucx_progress(r->t);
        for (uint32_t i = 0; i < r->opt.n_nodes; i++)
            if (r->nodes[i].conn_dead) node_down(r, &r->nodes[i], r->nodes[i].refusal);
        pthread_mutex_lock(&r->mutex);
        job *j = r->head;
        if (j) {
            r->head = j->next;
            if (!r->head) r->tail = NULL;
        }
        int stopping = r->stopping;
        pthread_mutex_unlock(&r->mutex);
        if (j) {
            if (j->kind ==
                JOB_PUT) { /* even when stopping: queued puts drain within their deadlines */
                run_puts(r, j);
                continue;
            }
            if (stopping)
                j->status = KVS_EIO;
            else if (!j->abandoned && ms_left(j->deadline_ns) > 0)
                run_job(r, j);
            finish(r, j);
            continue;
        }
        if (stopping) break;
        uint64_t next_ns = UINT64_MAX;
        reconnect_due(r, &next_ns);
        pthread_mutex_lock(&r->mutex);
        int queued = r->head != NULL || r->stopping;
        pthread_mutex_unlock(&r->mutex);
        if (queued) continue;
        if (kvs_ucx_arm(r->t) == KVS_EAGAIN) continue;
        int ms = -1;
        if (next_ns != UINT64_MAX) ms = ms_left(next_ns) + 1;
        /* an up node's control connection becomes readable only when the node closes it (or breaks
         * the protocol): either way the session is over; a handshaking node's moves its handshake on
         * (reconnect_due, next pass) */
        struct pollfd *fds = r->pfds;
        fds[0] = (struct pollfd){.fd = kvs_ucx_event_fd(r->t), .events = POLLIN};
        fds[1] = (struct pollfd){.fd = r->doorbell, .events = POLLIN};
        for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
            const rnode *nd = &r->nodes[i];
            fds[2 + i] = (struct pollfd){.fd = nd->up || in_handshake(nd) ? nd->ctl_fd : -1,
                                         .events = nd->up ? POLLIN : handshake_events(nd)};
        }
        if (poll(fds, r->opt.n_nodes + 2, ms) > 0) {
            if (fds[1].revents & POLLIN) {
                uint64_t v;
                if (read(r->doorbell, &v, sizeof v) < 0 && errno != EAGAIN) (void)0;
            }
            for (uint32_t i = 0; i < r->opt.n_nodes; i++)
                if (fds[2 + i].revents && r->nodes[i].up)
                    node_down(r, &r->nodes[i], "the node closed its control connection");
        }
    }
    thread_stop(r);
    return NULL;
}

/* ---- the ops ------------------------------------------------------------------------------------ */

/* One allocation for a job and its arrays (freed by whoever sees it last: caller or thread). */
static job *job_new(int kind, uint64_t n) {
    size_t size = sizeof(job) +
                  n * (sizeof(kvs_key) + 1 + 1 + sizeof(uint64_t) * 3 + sizeof(kvs_status)) + 64;
    job *j = calloc(1, size);
    if (!j) return NULL;
    uint8_t *p = (uint8_t *)(j + 1);
    j->kind = kind;
    j->n = n;
    j->keys = (kvs_key *)p;
    p += n * sizeof(kvs_key);
    j->lens = (uint64_t *)p;
    p += n * sizeof(uint64_t);
    j->cap = (uint64_t *)p;
    p += n * sizeof(uint64_t);
    j->off = (uint64_t *)p;
    p += n * sizeof(uint64_t);
    j->statuses = (kvs_status *)p;
    p += n * sizeof(kvs_status);
    j->present = p;
    p += n;
    j->resolved = p;
    for (uint64_t i = 0; i < n; i++) j->statuses[i] = KVS_ENOTFOUND;
    return j;
}

/* The CLOCK_REALTIME instant timeout_ns from now, for pthread_cond_timedwait. */
static struct timespec realtime_after(uint64_t timeout_ns) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + timeout_ns % 1000000000ull;
    until.tv_sec += (time_t)(timeout_ns / 1000000000ull + ns / 1000000000ull);
    until.tv_nsec = (long)(ns % 1000000000ull);
    return until;
}

/* Append j to the job queue and wake the thread. KVS_EIO (j not queued) once the tier is stopping. */
static kvs_status enqueue(remote *r, job *j) {
    pthread_mutex_lock(&r->mutex);
    if (r->stopping) {
        pthread_mutex_unlock(&r->mutex);
        return KVS_EIO;
    }
    if (r->tail)
        r->tail->next = j;
    else
        r->head = j;
    r->tail = j;
    if (j->kind == JOB_PUT) r->stats.puts_queued++;
    pthread_mutex_unlock(&r->mutex);
    uint64_t one = 1;
    if (write(r->doorbell, &one, sizeof one) < 0)
        (void)0; /* a full counter still wakes the thread */
    return KVS_OK;
}

/* Queue j and wait for it at most timeout_ms. KVS_OK: done (results in j; the caller frees it).
 * KVS_ETIMEDOUT: abandoned (the thread frees it). */
static kvs_status submit_for(remote *r, job *j, uint64_t timeout_ms) {
    uint64_t timeout_ns = timeout_ms * 1000000ull;
    uint64_t start = now_ns();
    /* the thread gives up a little before the caller does, so results normally arrive in time */
    uint64_t margin = timeout_ns / 10 < 20000000ull ? timeout_ns / 10 : 20000000ull;
    j->deadline_ns = start + timeout_ns - margin;
    struct timespec until = realtime_after(timeout_ns);
    if (enqueue(r, j) != KVS_OK) {
        free(j);
        return KVS_EIO;
    }
    pthread_mutex_lock(&r->mutex);
    int rc = 0;
    while (!j->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&r->cond, &r->mutex, &until);
    if (!j->done) {
        j->abandoned = 1;
        pthread_mutex_unlock(&r->mutex);
        set_error(r, "no answer within %llu ms", (unsigned long long)timeout_ms);
        return KVS_ETIMEDOUT;
    }
    pthread_mutex_unlock(&r->mutex);
    return KVS_OK;
}

static kvs_status submit(remote *r, job *j) {
    return submit_for(r, j, r->opt.timeout_ms);
}

kvs_status kvs_remote_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    remote *r = state;
    *n_present = 0;
    if (n == 0) return KVS_OK;
    job *j = job_new(JOB_LOOKUP, n);
    if (!j) return KVS_ENOMEM;
    memcpy(j->keys, keys, n * sizeof *keys);
    kvs_status st = submit(r, j);
    if (st == KVS_ETIMEDOUT) return KVS_OK; /* nothing answered in time: nothing is present */
    if (st != KVS_OK) return st;
    uint64_t k = 0;
    while (k < n && j->present[k]) k++;
    *n_present = k;
    free(j);
    return KVS_OK;
}

kvs_status kvs_remote_get_many(void *state, const kvs_key *keys, void *const *dsts,
                               const uint64_t *caps, uint64_t n, uint64_t *lens,
                               kvs_status *statuses) {
    remote *r = state;
    for (uint64_t i = 0; i < n; i++) lens[i] = 0, statuses[i] = KVS_ENOTFOUND;
    if (n == 0) return KVS_OK;
    job *j = job_new(JOB_GET, n);
    if (!j) return KVS_ENOMEM;
    memcpy(j->keys, keys, n * sizeof *keys);
    memcpy(j->cap, caps, n * sizeof *caps);
    j->dsts = dsts;
    j->caps = caps;
    kvs_status st = submit(r, j);
    if (st == KVS_ETIMEDOUT) {
        for (uint64_t i = 0; i < n; i++) statuses[i] = KVS_ETIMEDOUT;
        return KVS_OK;
    }
    if (st != KVS_OK) return st;
    for (uint64_t i = 0; i < n; i++) {
        statuses[i] = j->resolved[i] ? j->statuses[i] : KVS_ENOTFOUND;
        if (statuses[i] == KVS_EINVAL || statuses[i] == KVS_EIO)
            statuses[i] = KVS_ENOTFOUND; /* a failed node: a miss */
        lens[i] = statuses[i] == KVS_OK || statuses[i] == KVS_EOVERFLOW ? j->lens[i] : 0;
    }
    free(j);
    return KVS_OK;
}

/* Room for need bytes in the put queue, contiguous (under mutex). Allocations are freed in the order
 * they were made, so the live bytes run from tail = head - used (mod len) to head. */
static int queue_take(remote *r, uint64_t need, uint64_t *off, uint64_t *span) {
    if (r->queue_used == 0) r->queue_head = 0;
    uint64_t head = r->queue_head, len = r->queue_len;
    uint64_t tail = r->queue_used == 0      ? 0
                    : head >= r->queue_used ? head - r->queue_used
                                            : head + len - r->queue_used;
    if (r->queue_used == 0 || tail < head) {
        if (len - head >= need) {
            *off = head, *span = need;
        } else if (tail >= need) {
            *off = 0,
            *span = (len - head) + need; /* the gap at the end is charged to this object */
        } else {
            return 0;
        }
    } else if (tail - head >= need) {
        *off = head, *span = need;
    } else {
        return 0;
    }
    r->queue_head = *off + need;
    r->queue_used += *span;
    return 1;
}

/* Queue the object: copied into the put queue, sent by the progress thread with the puts queued
 * around it (one request per node), so the caller never waits for a node. It waits for queue room
 * only, at most timeout_ms. */
kvs_status kvs_remote_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    remote *r = state;
    if (len == 0) return KVS_EINVAL;
    uint64_t need = (len + 63) & ~63ull;
    if (need > r->queue_len) {
        set_error(r,
                  "an object of %llu bytes does not fit the put queue of %llu bytes (put_queue_mb)",
                  (unsigned long long)len, (unsigned long long)r->queue_len);
        return KVS_ENOMEM;
    }
    job *j = job_new(JOB_PUT, 1);
    if (!j) return KVS_ENOMEM;
    j->keys[0] = *key;
    j->len = len;
    j->detached = 1;
    j->status = KVS_OK;
    uint64_t timeout_ns = (uint64_t)r->opt.timeout_ms * 1000000ull;
    struct timespec until = realtime_after(timeout_ns);
    uint64_t off = 0;
    pthread_mutex_lock(&r->put_order);
    pthread_mutex_lock(&r->mutex);
    int rc = 0, got = 0;
    while (!r->stopping && !(got = queue_take(r, need, &off, &j->queue_span)) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&r->cond, &r->mutex, &until);
    if (!got) {
        r->stats.puts_dropped += r->opt.replicas;
        pthread_mutex_unlock(&r->mutex);
        pthread_mutex_unlock(&r->put_order);
        free(j);
        set_error(r, "put dropped: the put queue (%llu bytes) stayed full for timeout_ms %u",
                  (unsigned long long)r->queue_len, r->opt.timeout_ms);
        return KVS_ETIMEDOUT;
    }
    pthread_mutex_unlock(&r->mutex);
    memcpy(r->queue + off, object, len); /* the room is ours until the job finishes */
    j->object = r->queue + off;
    j->deadline_ns = now_ns() + timeout_ns;
    kvs_status st = enqueue(r, j);
    pthread_mutex_unlock(&r->put_order);
    if (st != KVS_OK) { /* the tier is closing: the room goes back, nothing is sent */
        pthread_mutex_lock(&r->mutex);
        r->queue_used -= j->queue_span;
        pthread_mutex_unlock(&r->mutex);
        free(j);
    }
    return st;
}

kvs_status kvs_remote_flush(void *state) {
    remote *r = state;
    if (!r) return KVS_EINVAL;
    job *j = job_new(JOB_FLUSH, 0);
    if (!j) return KVS_ENOMEM;
    /* every queued put finishes by its deadline (queued at most timeout_ms ago); a node marked down on
     * the way costs at most one more timeout */
    kvs_status st = submit_for(r, j, 2ull * r->opt.timeout_ms + 100);
    if (st != KVS_OK) return st;
    free(j);
    return KVS_OK;
}

kvs_status kvs_remote_remove(void *state, const kvs_key *key) {
    remote *r = state;
    job *j = job_new(JOB_DELETE, 1);
    if (!j) return KVS_ENOMEM;
    j->keys[0] = *key;
    j->statuses[0] = KVS_OK;
    kvs_status st = submit(r, j);
    if (st != KVS_OK) return st;
    free(j);
    return KVS_OK;
}

kvs_status kvs_remote_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    remote *r = state;
    *n_objects = *bytes = 0;
    job *j = job_new(JOB_STATS, 0);
    if (!j) return KVS_ENOMEM;
    kvs_status st = submit(r, j);
    if (st != KVS_OK) return st;
    *n_objects = j->objects;
    *bytes = j->bytes;
    free(j);
    return KVS_OK;
}

kvs_status kvs_remote_stats(void *state, kvs_remote_stats_t *out) {
    remote *r = state;
    if (!r || !out) return KVS_EINVAL;
    pthread_mutex_lock(&r->mutex);
    *out = r->stats;
    pthread_mutex_unlock(&r->mutex);
    out->n_nodes = r->opt.n_nodes;
    return KVS_OK;
}

const char *kvs_remote_last_error(void *state) {
    remote *r = state;
    return r ? r->error : "";
}

static void remote_free(remote *r) {
    if (r->doorbell >= 0) close(r->doorbell);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mutex);
    if (r->nodes)
        for (uint32_t i = 0; i < r->opt.n_nodes; i++) free(r->nodes[i].batch);
    free(r->nodes);
    free(r->entries);
    free(r->reply_entries);
    free(r->send_buf);
    free(r->bounce);
    free(r->queue);
    free(r->put_jobs);
    pthread_mutex_destroy(&r->put_order);
    kvs_remote_psk_clear(&r->psk);
    free(r);
}

void kvs_remote_destroy(void *state) {
    remote *r = state;
    if (!r) return;
    pthread_mutex_lock(&r->mutex);
    r->stopping = 1;
    pthread_mutex_unlock(&r->mutex);
    uint64_t one = 1;
    if (write(r->doorbell, &one, sizeof one) < 0) (void)0;
    pthread_join(r->thread, NULL);
    remote_free(r);
}

kvs_status kvs_remote_create(const kvs_backend_init *init, const kvs_remote_options *o,
                             void **state) {
    char err[256] = "";
    *state = NULL;
    remote *r = calloc(1, sizeof *r);
    if (!r) return KVS_ENOMEM;
    r->doorbell = -1;
    pthread_mutex_init(&r->put_order, NULL);
    pthread_mutex_init(&r->mutex, NULL);
    pthread_cond_init(&r->cond, NULL);
    snprintf(r->name, sizeof r->name, "%s", init->tier_name ? init->tier_name : "remote");
    r->opt = *o;
    r->host = init->host;
    kvs_status st = kvs_remote_psk_load(o->psk_file, &r->psk, err, sizeof err);
    if (st != KVS_OK) {
        snprintf(r->error, sizeof r->error, "remote tier \"%s\": %s", r->name, err);
        goto fail;
    }
    if (init->struct_size >= offsetof(kvs_backend_init, staging_len) + sizeof init->staging_len) {
        r->staging = init->staging_base;
        r->staging_len = init->staging_base ? init->staging_len : 0;
    }
    r->max_object_bytes = init->max_object_bytes;
    r->bounce_len = init->max_object_bytes ? init->max_object_bytes : BOUNCE_DEFAULT;
    if (r->bounce_len < (1u << 20)) r->bounce_len = 1u << 20;
    r->bounce = aligned_alloc(4096, (r->bounce_len + 4095) & ~4095ull);
    r->queue_len = (uint64_t)o->put_queue_mb << 20;
    if (r->queue_len < r->bounce_len)
        r->queue_len = r->bounce_len; /* room for the largest object */
    r->queue = aligned_alloc(4096, (r->queue_len + 4095) & ~4095ull);
    r->put_jobs = calloc(KVS_WIRE_MAX_KEYS, sizeof *r->put_jobs);
    r->send_buf = malloc(KVS_WIRE_MAX_MESSAGE_BYTES);
    r->entries = calloc(KVS_WIRE_MAX_KEYS, sizeof *r->entries);
    r->reply_entries = calloc(KVS_WIRE_MAX_KEYS, sizeof *r->reply_entries);
    r->nodes = calloc(o->n_nodes, sizeof *r->nodes);
    r->doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    st = KVS_ENOMEM;
    if (!r->bounce || !r->queue || !r->put_jobs || !r->send_buf || !r->entries ||
        !r->reply_entries || !r->nodes || r->doorbell < 0) {
        snprintf(r->error, sizeof r->error,
                 "remote tier \"%s\": out of memory or eventfd failed (%s)", r->name,
                 strerror(errno));
        goto fail;
    }
    kvs_remote_ring_init(&r->ring);
    for (uint32_t i = 0; i < o->n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        nd->index = i;
        nd->ctl_fd = -1;
        nd->backoff_ms = o->connect_backoff_ms;
        nd->batch = calloc(KVS_WIRE_MAX_KEYS, sizeof *nd->batch);
        if (!nd->batch || kvs_remote_ring_add(&r->ring, o->ids[i]) != KVS_OK) {
            snprintf(r->error, sizeof r->error, "remote tier \"%s\": cannot add node %s", r->name,
                     o->ids[i]);
            st = KVS_ECONFIG;
            goto fail;
        }
        kvs_remote_ring_set_down(&r->ring, o->ids[i], 1);
    }
    if (pthread_create(&r->thread, NULL, progress_main, r) != 0) {
        snprintf(r->error, sizeof r->error, "remote tier \"%s\": cannot start the progress thread",
                 r->name);
        st = KVS_EIO;
        goto fail;
    }
    pthread_mutex_lock(&r->mutex);
    while (r->ready == 0)
        pthread_cond_wait(&r->cond, &r->mutex); /* bounded: each connect has timeout_ms */
    st = r->ready_status;
    pthread_mutex_unlock(&r->mutex);
    if (st != KVS_OK) {
        pthread_join(r->thread, NULL);
        goto fail;
    }
    *state = r;
    return KVS_OK;
fail:
    if (init->error && init->error_len) snprintf(init->error, init->error_len, "%s", r->error);
    remote_free(r);
    return st;
}
