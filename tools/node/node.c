/* node.c - kvstrata-node's server: control connections and their handshake, sessions, and the
 * LOOKUP/GET/PUT/DELETE/STATS requests over the tier chain. One thread owns everything and sleeps in
 * one poll over the listening socket, every control connection and the UCX worker; requests run to
 * completion in the transport's message callback, so a session's requests are answered in order.
 *
 * A control connection is plain TCP with our own framing (control.h): the handshake is bounded in
 * bytes (KVS_CONTROL_MAX_FRAME_BYTES per frame) and time (timeout_ms for all of it), read without
 * blocking, and anything wrong closes it. Only after AUTH_OK does the node make a UCX endpoint (from
 * the client's worker address) and hand out its own worker address and a session token.
 *
 * Payloads move without a copy on the node where the tier allows it: a GET pins each object in a
 * zero-copy tier (dram) and writes it from its slab into the client's memory, all of a request's
 * objects in flight at once with one flush; a PUT reserves room in the top tier and reads the
 * client's bytes straight into it. Tiers without those (ssd) go through staging slots. */
#include "node.h"

#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "control.h"
#include "log.h"
#include "tiers.h"
#include "ucx_transport.h"
#include "wire.h"

#define RKEY_CACHE 8      /* unpacked client keys kept per connection */
#define LOOP_WAIT_MS 1000 /* the loop progresses UCX at least this often, events or not */
#define STAGING_ALIGN 4096u
#define STAGING_MAX_SLOTS 8u              /* objects of one GET batch read out of copy-only tiers */
#define STAGING_SLOT_BUDGET (64ull << 20) /* slots beyond the first only while they fit in this */
#define MAX_REGIONS 8u                    /* tier ranges registered with UCX, plus the staging */
#define ACCEPTS_PER_WAKE 64u              /* accepts per loop pass, so sessions are served meanwhile */
#define ACCEPT_PAUSE_MS 100               /* out of fds: stop accepting for this long */
#define REFUSAL_LOG_INTERVAL_NS 1000000000ull /* at most one refusal line per second */

typedef struct region {
    const uint8_t *base;
    uint64_t len;
    kvs_ucx_mem *mem;
} region;

typedef struct pinned {
    uint32_t tier;
    kvs_key key;
} pinned;

/* One object of a PUT batch being read from the client: into a reservation or a staging slot. */
typedef struct put_pending {
    kvs_key key;
    uint64_t ticket;
    int reserved; /* 0: in a staging slot, put into the tiers after the read */
} put_pending;

typedef struct rkey_slot {
    uint8_t blob[KVS_WIRE_MAX_RKEY_BYTES];
    uint32_t len; /* 0: empty */
    kvs_ucx_rkey *rkey;
} rkey_slot;

typedef struct node_conn {
    int fd;                 /* the control connection (TCP); the session lives while it is open */
    char peer[64];          /* its host:port, for messages */
    kvs_control_reader *rd; /* during the handshake; freed at AUTH_OK */
    uint64_t deadline_ns;   /* the handshake's */
    int session;            /* authenticated: conn, token and hasher are set */
    int peer_gone;          /* the control connection ended: endpoints are aborted, not flushed */
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES];
    kvs_ucx_conn *conn; /* replies: an endpoint to the client's worker address, peer failures detected */
    kvs_ucx_conn *rma;  /* payloads: conn, or a shared-memory endpoint to the same address (same host) */
    int pidfd;          /* with that endpoint: the client process, readable once it exits; else -1 */
    kvs_remote_auth_node auth;
    kvs_remote_tenant_hasher *hasher; /* the tenant's stored keys, from AUTH_OK on */
    uint32_t refusals;
    int closing; /* closed by the loop after the current callback returns */
    rkey_slot rkeys[RKEY_CACHE];
    uint32_t rkey_next; /* round-robin replacement */
    struct node_conn *next;
} node_conn;

struct kvs_node {
    kvs_node_params params;
    kvs_remote_psk psk;
    kvs_tier_chain *chain;
    uint64_t capacity_bytes; /* sum over tiers, for STATS */
    kvs_ucx_transport *t;
    uint8_t *staging; /* staging_slots x slot_len, registered with UCX and given to the tiers */
    uint64_t slot_len;
    uint32_t staging_slots;
    kvs_ucx_mem *staging_mem;
    region regions[MAX_REGIONS];
    uint32_t n_regions;
    /* one GET batch: transfers, their reply entries, the pins to drop after */
    kvs_ucx_rma batch[KVS_WIRE_MAX_KEYS];
    uint32_t batch_entry[KVS_WIRE_MAX_KEYS];
    pinned pins[KVS_WIRE_MAX_KEYS];
    put_pending puts[KVS_WIRE_MAX_KEYS]; /* one PUT batch: with batch[] and batch_entry[] */
    uint32_t n_batch, n_pins, slots_used;
    node_conn *conns;
    uint32_t n_sessions, n_handshakes;
    int listen_fd;
    uint16_t port;
    uint64_t accept_paused_until_ns;
    struct pollfd *pfds; /* the loop's poll set: stop, worker, listener, then one per connection */
    node_conn **pconns;  /* the connection of each pfds entry from index 3 */
    uint32_t pfds_cap;
    uint8_t *worker_addr; /* this node's, sent in AUTH_OK */
    size_t worker_addr_len;
    uint8_t frame[KVS_CONTROL_MAX_FRAME_BYTES + KVS_CONTROL_PREFIX_BYTES]; /* a control reply */
    uint64_t refusal_log_ns; /* rate limit of refusal lines */
    uint64_t refusals_unlogged;
    kvs_wire_entry entries[KVS_WIRE_MAX_KEYS];
    kvs_wire_entry reply_entries[KVS_WIRE_MAX_KEYS];
    uint8_t *reply; /* KVS_WIRE_MAX_MESSAGE_BYTES */
    kvs_node_stats stats;
    uint8_t host_id[KVS_REMOTE_HOST_ID_BYTES];
    int host_id_ok;
    int log_level;
};

/* ---- connections ------------------------------------------------------------------------------ */

/* A refusal line on stderr, at most one a second; the lines left out are counted in the next one. */
static void log_refusal(kvs_node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_refusal(kvs_node *n, const char *fmt, ...) {
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
        fprintf(stderr, "kvstrata-node: %s (and %llu more refusals not logged in the last second)\n", line,
                (unsigned long long)n->refusals_unlogged);
    else
        fprintf(stderr, "kvstrata-node: %s\n", line);
    n->refusal_log_ns = now;
    n->refusals_unlogged = 0;
}

static void conn_free(node_conn *c) {
    for (uint32_t i = 0; i < RKEY_CACHE; i++)
        if (c->rkeys[i].len) kvs_ucx_rkey_destroy(c->rkeys[i].rkey);
    if (c->rma && c->rma != c->conn) kvs_ucx_conn_close(c->rma);
    /* a client whose control connection ended is gone or gave up: no flush towards it */
    if (c->peer_gone) kvs_ucx_conn_abort(c->conn);
    else kvs_ucx_conn_close(c->conn);
    if (c->pidfd >= 0) close(c->pidfd);
    if (c->fd >= 0) close(c->fd);
    free(c->rd);
    kvs_remote_tenant_hasher_free(c->hasher);
    memset(&c->auth, 0, sizeof c->auth);
    memset(c->token, 0, sizeof c->token);
    free(c);
}

/* Take the connections waiting on the listener: each gets the handshake deadline and a frame
 * reader, unless a cap is reached (then it is closed at once, counted and logged). */
static void accept_all(kvs_node *n) {
    for (uint32_t i = 0; i < ACCEPTS_PER_WAKE; i++) {
        struct sockaddr_in sin;
        socklen_t sl = sizeof sin;
        int fd = accept4(n->listen_fd, (struct sockaddr *)&sin, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* the connection stays in the backlog; try again shortly rather than spin on it */
                n->stats.rejected++;
                n->accept_paused_until_ns = kvs_now_ns() + ACCEPT_PAUSE_MS * 1000000ull;
                log_refusal(n, "cannot accept a connection: %s; accepting again in %d ms", strerror(errno),
                            ACCEPT_PAUSE_MS);
            }
            return; /* EAGAIN: none left; others (ECONNABORTED, ...) concern that connection only */
        }
        char peer[64] = "unknown peer", host[INET_ADDRSTRLEN];
        if (sin.sin_family == AF_INET && inet_ntop(AF_INET, &sin.sin_addr, host, sizeof host))
            kvs_fmt(peer, sizeof peer, "%s:%u", host, ntohs(sin.sin_port));
        const char *cap = NULL;
        if (n->n_handshakes >= n->params.max_handshakes) cap = "handshakes in progress (--max-handshakes)";
        else if (n->n_sessions >= n->params.max_clients) cap = "sessions (--max-clients)";
        node_conn *c = cap ? NULL : calloc(1, sizeof *c);
        kvs_control_reader *rd = c ? malloc(sizeof *rd) : NULL;
        if (!rd) {
            n->stats.rejected++;
            if (cap)
                log_refusal(n, "%s refused: already %u %s", peer,
                            cap[0] == 'h' ? n->n_handshakes : n->n_sessions, cap);
            else
                log_refusal(n, "%s refused: no memory for a connection", peer);
            free(c);
            close(fd);
            continue;
        }
        rd->have_prefix = 0;
        c->fd = fd;
        c->rd = rd;
        c->pidfd = -1;
        c->deadline_ns = kvs_now_ns() + (uint64_t)n->params.timeout_ms * 1000000ull;
        kvs_fmt(c->peer, sizeof c->peer, "%s", peer);
        c->next = n->conns;
        n->conns = c;
        n->n_handshakes++;
        n->stats.connections++;
    }
}

static void on_dead(void *user, kvs_ucx_conn *conn, const char *why) {
    (void)user;
    (void)why;
    node_conn *c = kvs_ucx_conn_user(conn);
    if (c) c->closing = 1;
}

/* Close the connections marked closing (never from inside their own callback). */
static void sweep(kvs_node *n) {
    for (node_conn **p = &n->conns; *p;) {
        node_conn *c = *p;
        if (c->closing) {
            *p = c->next;
            if (c->session) n->n_sessions--;
            else n->n_handshakes--;
            conn_free(c);
        } else {
            p = &c->next;
        }
    }
}

/* The unpacked key for a client's packed rkey blob, from the connection's cache or unpacked now. */
static kvs_ucx_rkey *rkey_for(node_conn *c, const uint8_t *blob, uint32_t len) {
    for (uint32_t i = 0; i < RKEY_CACHE; i++)
        if (c->rkeys[i].len == len && memcmp(c->rkeys[i].blob, blob, len) == 0) return c->rkeys[i].rkey;
    kvs_ucx_rkey *rkey = NULL;
    if (len == 0 || len > KVS_WIRE_MAX_RKEY_BYTES) return NULL;
    if (kvs_ucx_rkey_unpack(c->rma, blob, len, &rkey) != KVS_OK) return NULL;
    rkey_slot *s = &c->rkeys[c->rkey_next];
    c->rkey_next = (c->rkey_next + 1) % RKEY_CACHE;
    if (s->len) kvs_ucx_rkey_destroy(s->rkey);
    memcpy(s->blob, blob, len);
    s->len = len;
    s->rkey = rkey;
    return rkey;
}

/* ---- replies ---------------------------------------------------------------------------------- */

static void send_encoded(kvs_node *n, node_conn *c, size_t len) {
    if (kvs_ucx_am_send(c->conn, KVS_NODE_AM_ID, NULL, 0, n->reply, len, n->params.timeout_ms) != KVS_OK) {
        fprintf(stderr, "kvstrata-node: %s: %s\n", c->peer, kvs_ucx_last_error(n->t));
        c->closing = 1;
    }
}

static void send_msg(kvs_node *n, node_conn *c, const kvs_wire_msg *msg) {
    size_t len = 0;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_encode(msg, n->reply, KVS_WIRE_MAX_MESSAGE_BYTES, &len, &why) != KVS_OK) {
        fprintf(stderr, "kvstrata-node: cannot encode a %s reply: %s\n", kvs_wire_type_name(msg->type),
                why.text);
        c->closing = 1;
        return;
    }
    send_encoded(n, c, len);
}

/* Answer with ERROR; a connection that keeps sending what the node refuses is closed. */
static void send_refusal(kvs_node *n, node_conn *c, const kvs_wire_refusal *why) {
    size_t len = 0;
    n->stats.refusals++;
    if (kvs_wire_encode_refusal(why, n->reply, KVS_WIRE_MAX_MESSAGE_BYTES, &len) == KVS_OK) send_encoded(n, c, len);
    if (++c->refusals > n->params.max_refusals) {
        fprintf(stderr, "kvstrata-node: %s: closed after %u refused messages\n", c->peer,
                c->refusals);
        c->closing = 1;
    }
}

static void refuse(kvs_node *n, node_conn *c, uint64_t request_id, kvs_wire_error code, const char *text) {
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    why.code = code;
    why.request_id = request_id;
    why.have_request_id = 1;
    kvs_fmt(why.text, sizeof why.text, "%s", text);
    send_refusal(n, c, &why);
}

/* ---- requests --------------------------------------------------------------------------------- */

static int alive(const node_conn *c) { return kvs_ucx_conn_alive(c->conn) && kvs_ucx_conn_alive(c->rma); }

/* The stored key of a request key: namespaced by the connection's tenant. */
static int stored_key(const node_conn *c, const uint8_t *key_bytes, kvs_key *out) {
    kvs_key k;
    memcpy(k.bytes, key_bytes, KVS_WIRE_KEY_BYTES);
    return kvs_remote_tenant_hasher_key(c->hasher, &k, out) == KVS_OK ? 0 : -1;
}

static void do_lookup(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    for (uint32_t i = 0; i < req->n_entries; i++) {
        kvs_key k;
        int present = stored_key(c, req->entries[i].key, &k) == 0 && kvs_tiers_find(n->chain, &k) >= 0;
        n->reply_entries[i].present = (uint8_t)present;
        n->stats.lookups++;
        if (present) n->stats.hits++;
        else n->stats.misses++;
    }
}

/* The registration holding [p, p + len), or NULL (UCX then registers on the fly). */
static kvs_ucx_mem *mem_for(const kvs_node *n, const void *p, uint64_t len) {
    const uint8_t *b = p;
    for (uint32_t i = 0; i < n->n_regions; i++) {
        const region *r = &n->regions[i];
        if (b >= r->base && len <= r->len && (uint64_t)(b - r->base) <= r->len - len) return r->mem;
    }
    return NULL;
}

/* Write the batch's objects into the client and drop the batch's pins. A failed batch turns its
 * entries into KVS_EIO with no length. */
static void get_flush(kvs_node *n, node_conn *c) {
    if (n->n_batch > 0) {
        kvs_status st = kvs_ucx_rma_many(c->rma, 1, n->batch, n->n_batch, n->params.timeout_ms);
        for (uint32_t i = 0; i < n->n_batch; i++) {
            kvs_wire_entry *r = &n->reply_entries[n->batch_entry[i]];
            if (st == KVS_OK) {
                n->stats.bytes_out += n->batch[i].len;
            } else {
                r->status = KVS_EIO;
                r->length = 0;
            }
        }
        if (st != KVS_OK)
            fprintf(stderr, "kvstrata-node: %s: %s\n", c->peer, kvs_ucx_last_error(n->t));
    }
    for (uint32_t i = 0; i < n->n_pins; i++) {
        const pinned *p = &n->pins[i];
        kvs_tiers_ops(n->chain, p->tier)->unpin(kvs_tiers_state(n->chain, p->tier), &p->key, 1);
    }
    n->n_batch = n->n_pins = n->slots_used = 0;
}

/* Find one object and add its transfer to the batch: a pinned slab of a zero-copy tier, or a copy
 * in a staging slot (flushing the batch first when the slots are taken). */
static kvs_status get_one(kvs_node *n, node_conn *c, uint32_t index, const kvs_wire_entry *e, uint64_t *len) {
    kvs_key k;
    *len = 0;
    if (stored_key(c, e->key, &k) != 0) return KVS_EINVAL;
    int tier = kvs_tiers_find(n->chain, &k);
    if (tier < 0) return KVS_ENOTFOUND;
    const kvs_backend_ops *ops = kvs_tiers_ops(n->chain, (uint32_t)tier);
    void *state = kvs_tiers_state(n->chain, (uint32_t)tier);
    const void *object = NULL;
    int pin = 0;
    kvs_status st;
    if ((ops->caps & KVS_BACKEND_CAP_ZERO_COPY) && ops->get_ref) {
        uint64_t n_pinned = 0;
        /* the pin outlives the batch's transfers, which are bounded by timeout_ms */
        st = ops->pin(state, &k, 1, (uint64_t)n->params.timeout_ms * 2 + 1000, &n_pinned);
        if (st != KVS_OK || n_pinned != 1) return KVS_ENOTFOUND; /* evicted meanwhile */
        st = ops->get_ref(state, &k, &object, len);
        if (st != KVS_OK) {
            ops->unpin(state, &k, 1);
            *len = 0;
            return st;
        }
        pin = 1;
    } else {
        if (n->slots_used == n->staging_slots) get_flush(n, c);
        uint8_t *slot = n->staging + (uint64_t)n->slots_used * n->slot_len;
        st = ops->get(state, &k, slot, n->params.max_object_bytes, len);
        if (st != KVS_OK) return st; /* ENOTFOUND if evicted meanwhile; EOVERFLOW with the size */
        object = slot;
        n->slots_used++;
    }
    kvs_ucx_rkey *rkey = NULL;
    st = KVS_OK;
    if (*len > e->length) st = KVS_EOVERFLOW;
    else if (*len > 0 && !(rkey = rkey_for(c, e->rkey, e->rkey_len))) st = KVS_EINVAL;
    if (st != KVS_OK || *len == 0) {
        if (pin) ops->unpin(state, &k, 1);
        if (st == KVS_EINVAL) *len = 0;
        return st;
    }
    if (pin) n->pins[n->n_pins++] = (pinned){.tier = (uint32_t)tier, .key = k};
    n->batch[n->n_batch] = (kvs_ucx_rma){.local = (void *)(uintptr_t)object, .len = (size_t)*len,
                                         .local_mem = mem_for(n, object, *len), .remote_addr = e->remote_addr,
                                         .rkey = rkey};
    n->batch_entry[n->n_batch++] = index;
    return KVS_OK;
}

static void do_get(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    for (uint32_t i = 0; i < req->n_entries; i++) {
        kvs_wire_entry *r = &n->reply_entries[i];
        r->status = alive(c) ? get_one(n, c, i, &req->entries[i], &r->length) : KVS_EIO;
    }
    get_flush(n, c);
    for (uint32_t i = 0; i < req->n_entries; i++) {
        kvs_status st = n->reply_entries[i].status;
        n->stats.gets++;
        if (st == KVS_OK || st == KVS_EOVERFLOW) n->stats.hits++;
        else if (st == KVS_ENOTFOUND) n->stats.misses++;
    }
}

static void put_stored(kvs_node *n, node_conn *c, kvs_status st, uint64_t len, const char *err) {
    if (st != KVS_OK) {
        fprintf(stderr, "kvstrata-node: put for tenant \"%s\": %s\n", c->auth.tenant, err);
        return;
    }
    n->stats.puts++;
    n->stats.bytes_in += len;
}

/* Read the batch's objects from the client (all in flight, one flush), then publish each: commit
 * its reservation or put its staging slot into the tiers. A failed read stores none of them. */
static void put_flush(kvs_node *n, node_conn *c) {
    if (n->n_batch == 0) return;
    kvs_status st = kvs_ucx_rma_many(c->rma, 0, n->batch, n->n_batch, n->params.timeout_ms);
    if (st != KVS_OK)
        fprintf(stderr, "kvstrata-node: %s: %s\n", c->peer, kvs_ucx_last_error(n->t));
    for (uint32_t i = 0; i < n->n_batch; i++) {
        const put_pending *p = &n->puts[i];
        const kvs_ucx_rma *op = &n->batch[i];
        kvs_status *out = &n->reply_entries[n->batch_entry[i]].status;
        char err[256] = "";
        if (st != KVS_OK) {
            if (p->reserved) kvs_tiers_abort(n->chain, p->ticket);
            *out = KVS_EIO;
            continue;
        }
        *out = p->reserved ? kvs_tiers_commit(n->chain, &p->key, p->ticket, op->local, op->len, err, sizeof err)
                           : kvs_tiers_put(n->chain, &p->key, op->local, op->len, err, sizeof err);
        put_stored(n, c, *out, op->len, err);
    }
    n->n_batch = n->slots_used = 0;
}

/* Store one object of a PUT: inline ones at once; others join the batch of RMA reads, into room
 * reserved in the top tier when it allows (no copy on the node), else into a staging slot (flushing
 * the batch first when the slots are taken). */
static kvs_status put_one(kvs_node *n, node_conn *c, uint32_t index, const kvs_wire_entry *e) {
    kvs_key k;
    char err[256] = "";
    if (stored_key(c, e->key, &k) != 0) return KVS_EINVAL;
    if (e->length == 0 || e->length > n->params.max_object_bytes) return KVS_EINVAL;
    kvs_status st;
    if (e->inline_data) {
        st = kvs_tiers_put(n->chain, &k, e->inline_data, e->length, err, sizeof err);
        put_stored(n, c, st, e->length, err);
        return st;
    }
    kvs_ucx_rkey *rkey = rkey_for(c, e->rkey, e->rkey_len);
    if (!rkey) return KVS_EINVAL;
    int reserve = kvs_tiers_can_reserve(n->chain);
    if (!reserve && n->slots_used == n->staging_slots) put_flush(n, c);
    put_pending *p = &n->puts[n->n_batch];
    void *dst = NULL;
    *p = (put_pending){.key = k};
    if (reserve) {
        st = kvs_tiers_reserve(n->chain, &k, e->length, &dst, &p->ticket, err, sizeof err);
        if (st != KVS_OK) {
            put_stored(n, c, st, e->length, err);
            return st;
        }
        p->reserved = 1;
    } else {
        dst = n->staging + (uint64_t)n->slots_used++ * n->slot_len;
    }
    n->batch[n->n_batch] = (kvs_ucx_rma){.local = dst, .len = (size_t)e->length, .local_mem = mem_for(n, dst, e->length),
                                         .remote_addr = e->remote_addr, .rkey = rkey};
    n->batch_entry[n->n_batch++] = index;
    return KVS_OK; /* for now: put_flush writes the outcome */
}

static void do_put(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    for (uint32_t i = 0; i < req->n_entries; i++)
        n->reply_entries[i].status = alive(c) ? put_one(n, c, i, &req->entries[i]) : KVS_EIO;
    put_flush(n, c);
}

static void do_delete(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    for (uint32_t i = 0; i < req->n_entries; i++) {
        kvs_key k;
        kvs_status st = KVS_EINVAL;
        if (stored_key(c, req->entries[i].key, &k) == 0) {
            st = kvs_tiers_find(n->chain, &k) >= 0 ? KVS_OK : KVS_ENOTFOUND;
            if (st == KVS_OK) {
                kvs_tiers_remove(n->chain, &k);
                n->stats.deletes++;
            }
        }
        n->reply_entries[i].status = st;
    }
}

static void do_stats(kvs_node *n, kvs_wire_msg *rep) {
    uint64_t objects = 0, bytes = 0;
    for (uint32_t i = 0; i < kvs_tiers_count(n->chain); i++) {
        uint64_t o = 0, b = 0;
        const kvs_backend_ops *ops = kvs_tiers_ops(n->chain, i);
        if (ops->usage(kvs_tiers_state(n->chain, i), &o, &b) == KVS_OK) {
            objects += o;
            bytes += b;
        }
    }
    rep->counters[KVS_WIRE_STAT_OBJECTS] = objects;
    rep->counters[KVS_WIRE_STAT_BYTES_USED] = bytes;
    rep->counters[KVS_WIRE_STAT_CAPACITY_BYTES] = n->capacity_bytes;
    rep->counters[KVS_WIRE_STAT_HITS] = n->stats.hits;
    rep->counters[KVS_WIRE_STAT_MISSES] = n->stats.misses;
    rep->counters[KVS_WIRE_STAT_PUTS] = n->stats.puts;
    rep->counters[KVS_WIRE_STAT_EVICTIONS] = kvs_tiers_evictions(n->chain);
    rep->counters[KVS_WIRE_STAT_AUTH_FAILURES] = n->stats.auth_failures;
    rep->counters[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] = n->stats.handshake_refusals;
    rep->counters[KVS_WIRE_STAT_HANDSHAKE_TIMEOUTS] = n->stats.handshake_timeouts;
    rep->counters[KVS_WIRE_STAT_CONNECTIONS_REJECTED] = n->stats.rejected;
}

/* A client on this host that offered shared memory (a host id with its worker address) gets its
 * payloads over a second endpoint to that address without peer-failure handling, where UCX can use
 * shared memory; the session's endpoint reaches it over tcp only. Any failure keeps the session's
 * endpoint for payloads (said at WARN). */
static void rma_by_address(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    if (!req->host_id_len) return; /* not offered (shared_memory: off) */
    if (!n->host_id_ok || req->host_id_len != sizeof n->host_id || memcmp(req->host_id, n->host_id, sizeof n->host_id)) {
        kvs_log(n->log_level, KVS_LOG_DEBUG, "kvstrata-node: client %s is on another host",
                c->peer);
        return;
    }
    /* UCX has no failure detection on that endpoint: the client's pidfd fires the moment it exits */
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)req->pid, 0);
    if (pidfd < 0) {
        kvs_log(n->log_level, KVS_LOG_WARN, "kvstrata-node: client %s: no pidfd for its pid %u (%s); payloads go "
                "over the request connection", c->peer, req->pid, strerror(errno));
        return;
    }
    char name[96];
    kvs_fmt(name, sizeof name, "%s (worker address)", c->peer);
    kvs_ucx_conn *rma = NULL;
    if (kvs_ucx_connect_address(n->t, req->worker_addr, req->worker_addr_len, name, 0, n->params.timeout_ms,
                                &rma) != KVS_OK) {
        kvs_log(n->log_level, KVS_LOG_WARN,
                "kvstrata-node: client %s is on this host but its worker address does not connect (%s); "
                "payloads go over the request connection", c->peer, kvs_ucx_last_error(n->t));
        close(pidfd);
        return;
    }
    kvs_ucx_conn_set_user(rma, c);
    kvs_ucx_conn_guard(rma, c->conn); /* a client that dies shows on the session's endpoint... */
    kvs_ucx_conn_watch_fd(rma, pidfd); /* ...or, sooner, on its pidfd */
    c->pidfd = pidfd;
    c->rma = rma;
}

/* ---- control connections ---------------------------------------------------------------------- */

/* Send one frame on a control connection without waiting: a handshake reply is small, and a peer
 * whose socket has no room for it is not worth waiting for. */
static int control_send(kvs_node *n, node_conn *c, const kvs_wire_msg *msg) {
    char err[192];
    size_t len = 0;
    if (kvs_control_encode(msg, n->frame, sizeof n->frame, &len, err, sizeof err) != KVS_OK ||
        kvs_control_write(c->fd, n->frame, len, 0, err, sizeof err) != KVS_OK) {
        log_refusal(n, "%s: %s", c->peer, err);
        c->closing = 1;
        return -1;
    }
    return 0;
}

/* End a handshake: an ERROR frame when there is something to say (best effort), then close. */
static void handshake_close(kvs_node *n, node_conn *c, uint64_t request_id, kvs_wire_error code, const char *text) {
    if (code != KVS_WIRE_ERR_NONE) {
        kvs_wire_refusal why;
        memset(&why, 0, sizeof why);
        why.code = code;
        why.request_id = request_id;
        why.have_request_id = 1;
        kvs_fmt(why.text, sizeof why.text, "%s", text);
        size_t len = 0;
        char err[64];
        if (kvs_wire_encode_refusal(&why, n->frame + KVS_CONTROL_PREFIX_BYTES,
                                    sizeof n->frame - KVS_CONTROL_PREFIX_BYTES, &len) == KVS_OK) {
            n->frame[0] = (uint8_t)(len >> 24);
            n->frame[1] = (uint8_t)(len >> 16);
            n->frame[2] = (uint8_t)(len >> 8);
            n->frame[3] = (uint8_t)len;
            (void)kvs_control_write(c->fd, n->frame, len + KVS_CONTROL_PREFIX_BYTES, 0, err, sizeof err);
        }
    }
    c->closing = 1;
}

/* The same for a peer that broke the protocol: counted and logged (rate-limited). */
static void handshake_refuse(kvs_node *n, node_conn *c, uint64_t request_id, kvs_wire_error code, const char *text) {
    n->stats.handshake_refusals++;
    log_refusal(n, "%s: handshake refused: %s", c->peer, text);
    handshake_close(n, c, request_id, code, text);
}

/* AUTH accepted: make the session's endpoint from the client's worker address, then AUTH_OK with
 * this node's worker address and the session token. The client progresses its worker while it
 * waits for AUTH_OK, so the endpoint's wire-up completes. */
static void session_open(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    char name[96];
    if (!req->worker_addr_len) {
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_VALUE, "node: auth without a worker address");
        return;
    }
    if (n->n_sessions >= n->params.max_clients) {
        n->stats.rejected++;
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL, "node: already serving --max-clients sessions");
        return;
    }
    if (!(c->hasher = kvs_remote_tenant_hasher_new(c->auth.tenant, c->auth.tenant_len)) ||
        kvs_remote_random(c->token, sizeof c->token) != KVS_OK) {
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL, "node: out of memory or randomness");
        return;
    }
    kvs_fmt(name, sizeof name, "%s (tenant %s)", c->peer, c->auth.tenant);
    if (kvs_ucx_connect_address(n->t, req->worker_addr, req->worker_addr_len, name, 1, n->params.timeout_ms,
                                &c->conn) != KVS_OK) {
        char text[KVS_WIRE_MAX_ERROR_TEXT];
        kvs_fmt(text, sizeof text, "node: cannot reach the client's worker address: %s", kvs_ucx_last_error(n->t));
        c->conn = NULL;
        handshake_refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL, text);
        return;
    }
    kvs_ucx_conn_set_user(c->conn, c);
    c->rma = c->conn;
    rma_by_address(n, c, req);
    free(c->rd);
    c->rd = NULL;
    c->session = 1;
    n->n_handshakes--;
    n->n_sessions++;
    n->stats.auth_ok++;
    const char *tls = kvs_ucx_conn_transports(c->rma);
    kvs_wire_msg rep;
    kvs_wire_msg_init(&rep, KVS_WIRE_AUTH_OK, req->request_id);
    rep.transports = tls;
    rep.transports_len = (uint32_t)strnlen(tls, KVS_WIRE_MAX_TRANSPORTS_TEXT);
    rep.worker_addr = n->worker_addr;
    rep.worker_addr_len = (uint32_t)n->worker_addr_len;
    rep.session_token = c->token;
    int slow = kvs_ucx_tls_slow(tls);
    kvs_log(n->log_level, slow ? KVS_LOG_WARN : KVS_LOG_INFO,
            "kvstrata-node: client %s (tenant \"%s\"): payloads over %s%s", c->peer, c->auth.tenant, tls,
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
        const uint8_t *challenge = NULL;
        kvs_status st = kvs_remote_auth_node_hello(&c->auth, &req, &challenge, err, sizeof err);
        if (st != KVS_OK) {
            handshake_refuse(n, c, req.request_id, st == KVS_ESTATE ? KVS_WIRE_ERR_STATE : KVS_WIRE_ERR_AUTH,
                             err[0] ? err : "node: hello refused");
            return;
        }
        kvs_wire_msg rep;
        kvs_wire_msg_init(&rep, KVS_WIRE_CHALLENGE, req.request_id);
        rep.challenge = challenge;
        control_send(n, c, &rep);
        return;
    }
    if (req.type != KVS_WIRE_AUTH) {
        char text[128];
        kvs_fmt(text, sizeof text, "node: %s before the handshake finished", kvs_wire_type_name(req.type));
        handshake_refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE, text);
        return;
    }
    kvs_status st = kvs_remote_auth_node_check(&c->auth, &n->psk, req.proof, req.proof ? KVS_WIRE_PROOF_BYTES : 0,
                                               err, sizeof err);
    if (st == KVS_ESTATE) {
        handshake_refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE, err[0] ? err : "node: auth without a challenge");
        return;
    }
    if (st != KVS_OK) {
        n->stats.auth_failures++;
        fprintf(stderr, "kvstrata-node: %s: authentication failed for tenant \"%s\"\n", c->peer, c->auth.tenant);
        handshake_close(n, c, req.request_id, KVS_WIRE_ERR_AUTH, "node: authentication failed");
        return;
    }
    session_open(n, c, &req);
}

/* The control connection is readable: handshake bytes, or, for a session, its end (a session's
 * client sends nothing more on it; bytes there are a protocol error and end the session too). */
static void control_readable(kvs_node *n, node_conn *c) {
    char err[160];
    if (c->session) {
        uint8_t byte;
        ssize_t k = recv(c->fd, &byte, 1, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (k > 0) log_refusal(n, "%s: bytes on the control connection of a session; session closed", c->peer);
        c->peer_gone = 1;
        c->closing = 1;
        return;
    }
    for (;;) {
        size_t len = 0;
        kvs_status st = kvs_control_read(c->rd, c->fd, &len, err, sizeof err);
        if (st == KVS_EAGAIN) return;
        if (st != KVS_OK) {
            c->peer_gone = 1;
            handshake_refuse(n, c, 0, KVS_WIRE_ERR_NONE, err);
            return;
        }
        handshake(n, c, c->rd->frame, len);
        if (c->closing || c->session) return;
    }
}

/* Handshakes past their deadline are closed: a peer that trickles bytes holds a slot for
 * timeout_ms at most. Returns the nearest deadline still ahead (UINT64_MAX: none). */
static uint64_t expire_handshakes(kvs_node *n) {
    uint64_t now = kvs_now_ns(), next = UINT64_MAX;
    for (node_conn *c = n->conns; c; c = c->next) {
        if (c->session || c->closing) continue;
        if (now >= c->deadline_ns) {
            n->stats.handshake_timeouts++;
            log_refusal(n, "%s: handshake not finished within %d ms; closed", c->peer, n->params.timeout_ms);
            c->peer_gone = 1;
            c->closing = 1;
        } else if (c->deadline_ns < next) {
            next = c->deadline_ns;
        }
    }
    return next;
}

/* The session a request header names (its token), or NULL. */
static node_conn *session_of(kvs_node *n, const void *header, size_t header_len) {
    if (header_len != KVS_WIRE_SESSION_TOKEN_BYTES) return NULL;
    for (node_conn *c = n->conns; c; c = c->next)
        if (c->session && !c->closing && CRYPTO_memcmp(c->token, header, KVS_WIRE_SESSION_TOKEN_BYTES) == 0)
            return c;
    return NULL;
}

static void on_message(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len, const void *data,
                       size_t data_len) {
    kvs_node *n = user;
    (void)conn; /* UCX may deliver on an endpoint of its own making: the token names the session */
    node_conn *c = session_of(n, header, header_len);
    if (!c) {
        n->stats.unknown_sessions++;
        log_refusal(n, "dropped a %zu-byte request that names no live session", data_len);
        return;
    }
    const void *buf = data;
    size_t len = data_len;
    kvs_wire_msg req;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_decode(buf, len, n->entries, KVS_WIRE_MAX_KEYS, &req, &why) != KVS_OK) {
        send_refusal(n, c, &why);
        return;
    }
    if (req.type == KVS_WIRE_HELLO || req.type == KVS_WIRE_AUTH) {
        refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE, "node: the session is already authenticated");
        return;
    }
    kvs_wire_msg rep;
    switch (req.type) {
    case KVS_WIRE_LOOKUP: kvs_wire_msg_init(&rep, KVS_WIRE_LOOKUP_REPLY, req.request_id); break;
    case KVS_WIRE_GET: kvs_wire_msg_init(&rep, KVS_WIRE_GET_REPLY, req.request_id); break;
    case KVS_WIRE_PUT: kvs_wire_msg_init(&rep, KVS_WIRE_PUT_REPLY, req.request_id); break;
    case KVS_WIRE_DELETE: kvs_wire_msg_init(&rep, KVS_WIRE_DELETE_REPLY, req.request_id); break;
    case KVS_WIRE_STATS:
        kvs_wire_msg_init(&rep, KVS_WIRE_STATS_REPLY, req.request_id);
        do_stats(n, &rep);
        send_msg(n, c, &rep);
        return;
    default: {
        char text[128];
        kvs_fmt(text, sizeof text, "node: %s is not a request", kvs_wire_type_name(req.type));
        refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE, text);
        return;
    }
    }
    memset(n->reply_entries, 0, sizeof(kvs_wire_entry) * req.n_entries);
    rep.entries = n->reply_entries;
    rep.n_entries = req.n_entries;
    if (req.type == KVS_WIRE_LOOKUP) do_lookup(n, c, &req);
    else if (req.type == KVS_WIRE_GET) do_get(n, c, &req);
    else if (req.type == KVS_WIRE_PUT) do_put(n, c, &req);
    else do_delete(n, c, &req);
    if (alive(c)) send_msg(n, c, &rep);
    else c->closing = 1;
}

/* ---- lifetime --------------------------------------------------------------------------------- */

kvs_status kvs_node_create(const kvs_node_params *params, kvs_node **out, char *err, size_t err_len) {
    kvs_status st = KVS_EINVAL;
    *out = NULL;
    if (!params || !params->config || !params->psk || !params->listen_host || params->max_object_bytes == 0) {
        kvs_fmt(err, err_len, "node: missing parameters");
        return KVS_EINVAL;
    }
    kvs_node *n = calloc(1, sizeof *n);
    if (!n) {
        kvs_fmt(err, err_len, "node: no memory");
        return KVS_ENOMEM;
    }
    n->listen_fd = -1;
    n->params = *params;
    if (n->params.max_handshakes == 0) n->params.max_handshakes = 16;
    n->host_id_ok = kvs_remote_host_id(n->host_id) == KVS_OK;
    n->log_level = params->config->log_level;
    n->params.config = NULL;
    n->params.psk = NULL;
    n->psk = *params->psk;
    n->slot_len = (params->max_object_bytes + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
    n->staging_slots = 1;
    while (n->staging_slots < STAGING_MAX_SLOTS && (n->staging_slots + 1) * n->slot_len <= STAGING_SLOT_BUDGET)
        n->staging_slots++;
    uint64_t staging_len = n->slot_len * n->staging_slots;
    n->staging = aligned_alloc(STAGING_ALIGN, (size_t)staging_len);
    n->reply = malloc(KVS_WIRE_MAX_MESSAGE_BYTES);
    if (!n->staging || !n->reply) {
        kvs_fmt(err, err_len, "node: no memory for a %llu-byte staging buffer",
                (unsigned long long)staging_len);
        st = KVS_ENOMEM;
        goto fail;
    }
    memset(n->staging, 0, (size_t)staging_len);
    st = kvs_tiers_open(params->config, params->max_object_bytes, n->staging, staging_len, NULL, NULL, &n->chain,
                        err, err_len);
    if (st != KVS_OK) goto fail;
    for (size_t i = 0; i < params->config->n_tiers; i++) {
        const kvs_tier_config *tc = &params->config->tiers[i];
        n->capacity_bytes += tc->capacity_bytes;
        /* The dram tier gives every object a slab sized for the largest one. */
        if (strcmp(tc->type, "dram") == 0 && tc->capacity_bytes / params->max_object_bytes < 64) {
            char cap[32], obj[32];
            kvs_log(params->config->log_level, KVS_LOG_WARN,
                    "tier \"%s\" holds at most %llu objects: each takes a slab of --max-object-bytes %s out "
                    "of its %s; set --max-object-bytes to the engine's object size",
                    tc->name, (unsigned long long)(tc->capacity_bytes / params->max_object_bytes),
                    kvs_fmt_bytes(obj, sizeof obj, params->max_object_bytes),
                    kvs_fmt_bytes(cap, sizeof cap, tc->capacity_bytes));
        }
    }

    n->pfds_cap = params->max_clients + params->max_handshakes + 3;
    n->pfds = calloc(n->pfds_cap, sizeof *n->pfds);
    n->pconns = calloc(n->pfds_cap, sizeof *n->pconns);
    if (!n->pfds || !n->pconns) {
        kvs_fmt(err, err_len, "node: no memory for %u connections", n->pfds_cap);
        st = KVS_ENOMEM;
        goto fail;
    }
    char why[256];
    st = kvs_control_listen(params->listen_host, params->listen_port, &n->listen_fd, &n->port, why, sizeof why);
    if (st != KVS_OK) {
        kvs_fmt(err, err_len, "node: %s", why);
        goto fail;
    }
    kvs_ucx_params p = {.struct_size = sizeof p, .name = "kvstrata-node", .log_level = params->config->log_level,
                        .on_dead = on_dead, .user = n};
    st = kvs_ucx_create(&p, &n->t, err, err_len);
    if (st != KVS_OK) goto fail;
    size_t need = 0;
    if (kvs_ucx_worker_address(n->t, NULL, 0, &need) != KVS_EOVERFLOW || need == 0 ||
        need > KVS_WIRE_MAX_WORKER_ADDR_BYTES || !(n->worker_addr = malloc(need)) ||
        kvs_ucx_worker_address(n->t, n->worker_addr, need, &n->worker_addr_len) != KVS_OK) {
        kvs_fmt(err, err_len, "node: no UCX worker address of at most %u bytes (%zu): %s",
                KVS_WIRE_MAX_WORKER_ADDR_BYTES, need, kvs_ucx_last_error(n->t));
        st = KVS_EIO;
        goto fail;
    }
    st = kvs_ucx_mem_register(n->t, n->staging, (size_t)staging_len, &n->staging_mem);
    if (st == KVS_OK) st = kvs_ucx_am_handler(n->t, KVS_NODE_AM_ID, on_message, n);
    if (st != KVS_OK) {
        kvs_fmt(err, err_len, "%s", kvs_ucx_last_error(n->t));
        goto fail;
    }
    n->regions[n->n_regions++] = (region){.base = n->staging, .len = staging_len, .mem = n->staging_mem};
    /* Tiers that keep their objects in one range (dram) are registered whole, so RMA moves objects
     * straight out of and into their slabs. */
    for (uint32_t i = 0; i < kvs_tiers_count(n->chain) && n->n_regions < MAX_REGIONS; i++) {
        void *base = NULL;
        uint64_t len = 0;
        kvs_ucx_mem *mem = NULL;
        if (kvs_tiers_memory(n->chain, i, &base, &len) != KVS_OK || !base || len == 0) continue;
        if (kvs_ucx_mem_register(n->t, base, (size_t)len, &mem) != KVS_OK) {
            kvs_log(params->config->log_level, KVS_LOG_WARN, "tier \"%s\": %s; its objects are registered per "
                    "transfer instead", kvs_tiers_name(n->chain, i), kvs_ucx_last_error(n->t));
            continue;
        }
        n->regions[n->n_regions++] = (region){.base = base, .len = len, .mem = mem};
    }
    *out = n;
    return KVS_OK;
fail:
    kvs_node_destroy(n);
    return st;
}

uint16_t kvs_node_port(const kvs_node *n) { return n->port; }
uint32_t kvs_node_tier_count(const kvs_node *n) { return kvs_tiers_count(n->chain); }
void kvs_node_get_stats(const kvs_node *n, kvs_node_stats *out) { *out = n->stats; }

kvs_status kvs_node_run(kvs_node *n, int stop_fd) {
    for (;;) {
        kvs_ucx_progress(n->t);
        uint64_t next_ns = expire_handshakes(n);
        sweep(n);
        if (kvs_ucx_arm(n->t) == KVS_EAGAIN) continue; /* events pending: progress again first */
        uint64_t now = kvs_now_ns();
        int accepting = now >= n->accept_paused_until_ns;
        if (!accepting && n->accept_paused_until_ns < next_ns) next_ns = n->accept_paused_until_ns;
        n->pfds[0] = (struct pollfd){.fd = stop_fd, .events = POLLIN};
        n->pfds[1] = (struct pollfd){.fd = kvs_ucx_event_fd(n->t), .events = POLLIN};
        n->pfds[2] = (struct pollfd){.fd = accepting ? n->listen_fd : -1, .events = POLLIN};
        uint32_t np = 3;
        for (node_conn *c = n->conns; c && np < n->pfds_cap; c = c->next) {
            n->pfds[np] = (struct pollfd){.fd = c->fd, .events = POLLIN};
            n->pconns[np++] = c;
        }
        int ms = LOOP_WAIT_MS;
        if (next_ns != UINT64_MAX) {
            uint64_t left = next_ns > now ? (next_ns - now + 999999ull) / 1000000ull : 0;
            if (left < (uint64_t)ms) ms = (int)left;
        }
        if (poll(n->pfds, np, ms) <= 0) continue;
        if (n->pfds[0].revents & POLLIN) return KVS_OK;
        for (uint32_t i = 3; i < np; i++)
            if (n->pfds[i].revents) control_readable(n, n->pconns[i]);
        if (n->pfds[2].revents & POLLIN) accept_all(n);
    }
}

void kvs_node_destroy(kvs_node *n) {
    if (!n) return;
    for (node_conn *c = n->conns; c; c = c->next) c->closing = 1;
    sweep(n);
    for (uint32_t i = 0; i < n->n_regions; i++) kvs_ucx_mem_deregister(n->regions[i].mem);
    n->n_regions = 0; /* a staging registration made before a failed create goes with the transport */
    kvs_ucx_destroy(n->t);
    if (n->listen_fd >= 0) close(n->listen_fd);
    free(n->worker_addr);
    free(n->pfds);
    free(n->pconns);
    kvs_tiers_close(n->chain);
    free(n->reply);
    free(n->staging);
    kvs_remote_psk_clear(&n->psk);
    free(n);
}
