/* node_stream.c - a session's GET and PUT requests on its control connection (payloads: stream;
 * backends/ucx/stream.h): the objects' bytes move between the socket and the tiers' memory with
 * readv/writev, the copies of a plain TCP stream and no more. Requests are served to completion, one
 * at a time, each bounded by timeout_ms; anything wrong ends the session. */
#include "node_stream.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "backends/ucx/control.h"
#include "backends/ucx/stream.h"
#include "common/clock.h"
#include "common/log.h"
#include "node_control.h"
#include "node_quota.h"
#include "node_requests.h"

/* A frame, PUT or GET must be done by now + timeout_ms; never later than a minute, well within the
 * two minutes a tier keeps a reservation (dram.c) or a pin lease the node takes. */
#define STREAM_DEADLINE_MAX_MS 60000ull

static uint64_t stream_deadline(const kvs_node *n) {
    uint64_t ms = (uint64_t)n->params.timeout_ms;
    return kvs_now_ns() + (ms < STREAM_DEADLINE_MAX_MS ? ms : STREAM_DEADLINE_MAX_MS) * 1000000ull;
}

static void end_session(kvs_node *n, node_conn *c, const char *what, const char *err) {
    node_log_refusal(n, "%s: %s on the stream: %s; session closed", c->peer, what, err);
    c->closing = 1;
}

/* A GET on the stream, answered as the client takes the bytes: one object per group (a header, its
 * record, its bytes), written without waiting; the rest when the socket has room again. The object
 * is copied into a buffer of the session's own first: nothing of the tiers stays pinned across
 * loop turns (a DELETE or a quota eviction between them could hand a pinned slab to another
 * tenant's put), so a client that reads slowly holds up only its own session, and only until the
 * GET's deadline. */
typedef struct stream_get {
    uint64_t request_id;
    uint32_t n, at; /* entries; the one being sent */
    int started;    /* `at` is found and its group built */
    uint8_t head[KVS_STREAM_GROUP_BYTES + KVS_STREAM_RECORD_BYTES];
    uint64_t len, sent; /* of head and object together */
    uint8_t *buf;       /* the object's bytes: max_object_bytes, allocated at the first */
    struct {
        uint8_t key[KVS_WIRE_KEY_BYTES];
        uint64_t cap;
        uint8_t by_message;
    } * objects;
} stream_get;

/* Object g->at copied into g->buf: out of a zero-copy tier under a pin held for the copy only. */
static kvs_status get_find(kvs_node *n, node_conn *c, stream_get *g, uint64_t *len) {
    kvs_key k;
    *len = 0;
    if (node_stored_key(c, g->objects[g->at].key, &k) != 0) return KVS_EINVAL;
    int tier = kvs_server_tiers_find(n->chain, &k);
    if (tier < 0) return KVS_ENOTFOUND;
    if (!g->buf && !(g->buf = malloc(n->params.max_object_bytes))) return KVS_ENOMEM;
    const kvs_backend_ops *ops = kvs_server_tiers_ops(n->chain, (uint32_t)tier);
    void *state = kvs_server_tiers_state(n->chain, (uint32_t)tier);
    if (!(ops->caps & KVS_BACKEND_CAP_ZERO_COPY) || !ops->get_ref)
        return ops->get(state, &k, g->buf, n->params.max_object_bytes, len);
    uint64_t n_pinned = 0;
    const void *object = NULL;
    kvs_status st = ops->pin(state, &k, 1, (uint64_t)n->params.timeout_ms + 1000, &n_pinned);
    if (st != KVS_OK || n_pinned != 1) return KVS_ENOTFOUND; /* evicted meanwhile */
    st = ops->get_ref(state, &k, &object, len);
    if (st == KVS_OK && *len > n->params.max_object_bytes) st = KVS_EOVERFLOW;
    if (st == KVS_OK) memcpy(g->buf, object, (size_t)*len);
    ops->unpin(state, &k, 1);
    return st;
}

static void get_begin_object(kvs_node *n, node_conn *c, stream_get *g) {
    uint64_t len = 0;
    kvs_status st = g->objects[g->at].by_message ? get_find(n, c, g, &len) : KVS_EINVAL;
    if (st == KVS_OK && len > g->objects[g->at].cap) st = KVS_EOVERFLOW;
    NODE_COUNT(n, c->trow, gets, 1);
    if (st == KVS_OK || st == KVS_EOVERFLOW)
        NODE_COUNT(n, c->trow, hits, 1);
    else if (st == KVS_ENOTFOUND)
        NODE_COUNT(n, c->trow, misses, 1);
    kvs_stream_group_encode(g->head, 1, g->request_id);
    kvs_stream_record_encode(g->head + KVS_STREAM_GROUP_BYTES, st,
                             st == KVS_ENOTFOUND || st == KVS_EINVAL ? 0 : len);
    g->len = sizeof g->head + (st == KVS_OK ? len : 0);
    if (st == KVS_OK) NODE_COUNT(n, c->trow, bytes_out, len);
    g->sent = 0;
    g->started = 1;
}

void node_stream_drop(kvs_node *n, node_conn *c);

/* Write what the socket takes of the GET's groups; done when every entry is answered. */
static void get_continue(kvs_node *n, node_conn *c) {
    stream_get *g = c->sget;
    while (g->at < g->n) {
        if (!g->started) get_begin_object(n, c, g);
        while (g->sent < g->len) {
            struct iovec iov[2];
            int k = 0;
            if (g->sent < sizeof g->head)
                iov[k++] = (struct iovec){.iov_base = g->head + g->sent,
                                          .iov_len = sizeof g->head - (size_t)g->sent};
            uint64_t from = g->sent > sizeof g->head ? g->sent - sizeof g->head : 0;
            if (g->len > sizeof g->head)
                iov[k++] = (struct iovec){.iov_base = g->buf + from,
                                          .iov_len = (size_t)(g->len - sizeof g->head - from)};
            ssize_t w = kvs_chan_sendv(&c->ch, iov, (size_t)k);
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return; /* room later */
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                c->peer_gone = 1;
                end_session(n, c, "get answer", strerror(errno));
                return;
            }
            g->sent += (uint64_t)w;
        }
        g->started = 0;
        g->at++;
    }
    node_stream_drop(n, c);
}

static void get_start(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    stream_get *g = calloc(1, sizeof *g);
    if (g) g->objects = calloc(req->n_entries ? req->n_entries : 1, sizeof *g->objects);
    if (!g || !g->objects) {
        if (g) free(g->objects);
        free(g);
        end_session(n, c, "get", "no memory for its state");
        return;
    }
    for (uint32_t i = 0; i < req->n_entries; i++) {
        memcpy(g->objects[i].key, req->entries[i].key, KVS_WIRE_KEY_BYTES);
        g->objects[i].cap = req->entries[i].length;
        g->objects[i].by_message = req->entries[i].by_message;
    }
    g->request_id = req->request_id;
    g->n = req->n_entries;
    c->sget = g;
    c->stream_deadline_ns = stream_deadline(n);
}

/* A PUT on the stream, served as its bytes come: one object at a time goes straight into room
 * reserved in the tiers (a buffer of its own for tiers that cannot reserve), refused ones are read
 * and dropped, and the PUT_REPLY says what became of each. A client that trickles them holds up only
 * its own session, and only until the PUT's deadline. */
typedef struct stream_put {
    uint64_t request_id;
    uint32_t n, at;  /* entries; the one whose bytes come now */
    int started;     /* `at` has its room (or is being dropped) */
    uint64_t got;    /* of its bytes */
    put_pending cur; /* its reservation (cur.reserved) or */
    void *buf;       /* its buffer (tiers that cannot reserve) */
    void *dst;       /* where its bytes go; NULL: dropped */
    struct {
        uint8_t key[KVS_WIRE_KEY_BYTES];
        uint64_t length;
    } * objects;
    kvs_wire_entry *status; /* the reply's entries (status only) */
} stream_put;

static void put_free(stream_put *p) {
    if (!p) return;
    free(p->buf);
    free(p->objects);
    free(p->status);
    free(p);
}

void node_stream_drop(kvs_node *n, node_conn *c) {
    stream_put *p = c->sput;
    if (p && p->started && p->dst) node_put_abandon(n, &p->cur);
    put_free(p);
    c->sput = NULL;
    stream_get *g = c->sget;
    if (g) {
        free(g->buf);
        free(g->objects);
        free(g);
    }
    c->sget = NULL;
    free(c->sout);
    c->sout = NULL;
    c->sout_len = c->sout_sent = 0;
    c->stream_deadline_ns = 0;
}

/* Room for object p->at: admitted within its tenant's share, then reserved or a buffer of its own.
 * A refusal is its status; its bytes are then read and dropped. */
static void put_begin_object(kvs_node *n, node_conn *c, stream_put *p) {
    char err[256] = "";
    uint64_t len = p->objects[p->at].length;
    kvs_status *out = &p->status[p->at].status;
    p->started = 1;
    p->got = 0;
    p->dst = p->buf = NULL;
    p->cur = (put_pending){0};
    snprintf(p->cur.tenant, sizeof p->cur.tenant, "%s", c->auth.tenant);
    if (node_stored_key(c, p->objects[p->at].key, &p->cur.key) != 0 || len == 0 ||
        len > n->params.max_object_bytes) {
        *out = KVS_EINVAL;
    } else if ((*out = node_admit(n, c, &p->cur.key, len, err, sizeof err)) != KVS_OK) {
        node_put_stored(n, c, &p->cur.key, *out, len, err);
    } else if (kvs_server_tiers_can_reserve(n->chain)) {
        *out = kvs_server_tiers_reserve(n->chain, &p->cur.key, len, &p->dst, &p->cur.ticket, err,
                                        sizeof err);
        p->cur.reserved = *out == KVS_OK;
        if (*out != KVS_OK) node_put_stored(n, c, &p->cur.key, *out, len, err);
    } else if (!(p->dst = p->buf = malloc(len))) {
        *out = KVS_ENOMEM;
    }
}

/* Send what the socket takes of a queued answer (a PUT_REPLY); done, it is freed. */
static void out_continue(kvs_node *n, node_conn *c) {
    while (c->sout_sent < c->sout_len) {
        ssize_t w = kvs_chan_send(&c->ch, c->sout + c->sout_sent, c->sout_len - c->sout_sent);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return; /* room later */
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            c->peer_gone = 1;
            end_session(n, c, "put answer", strerror(errno));
            return;
        }
        c->sout_sent += (size_t)w;
    }
    node_stream_drop(n, c);
}

/* Queue rep as the answer frame and send what the socket takes of it; what the session held for
 * its request (a PUT's state) is let go once rep is encoded. */
static void answer(kvs_node *n, node_conn *c, const kvs_wire_msg *rep) {
    char err[160] = "";
    size_t len = 0;
    kvs_status st = kvs_control_encode(rep, n->stream_buf, KVS_WIRE_MAX_MESSAGE_BYTES + 4, &len,
                                       err, sizeof err);
    node_stream_drop(n, c);
    if (st == KVS_OK && !(c->sout = malloc(len))) {
        st = KVS_ENOMEM;
        kvs_fmt(err, sizeof err, "no memory for the answer");
    }
    if (st != KVS_OK) {
        end_session(n, c, kvs_wire_type_name(rep->type), err);
        return;
    }
    memcpy(c->sout, n->stream_buf, len);
    c->sout_len = len;
    c->sout_sent = 0;
    c->stream_deadline_ns = stream_deadline(n);
    out_continue(n, c);
}

/* A LOOKUP, DELETE or STATS on the stream (an encrypted session sends every request there):
 * served at once, answered with one frame. */
static void small_request(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    kvs_wire_msg rep;
    kvs_wire_type type = req->type == KVS_WIRE_LOOKUP   ? KVS_WIRE_LOOKUP_REPLY
                         : req->type == KVS_WIRE_DELETE ? KVS_WIRE_DELETE_REPLY
                                                        : KVS_WIRE_STATS_REPLY;
    kvs_wire_msg_init(&rep, type, req->request_id);
    if (req->type == KVS_WIRE_STATS) {
        node_do_stats(n, &rep);
    } else {
        memset(n->reply_entries, 0, sizeof(kvs_wire_entry) * req->n_entries);
        rep.entries = n->reply_entries;
        rep.n_entries = req->n_entries;
        if (req->type == KVS_WIRE_LOOKUP)
            node_do_lookup(n, c, req);
        else
            node_do_delete(n, c, req);
    }
    answer(n, c, &rep);
}

/* Read what has come of the PUT's objects; store each once whole; answer once all are in. */
static void put_continue(kvs_node *n, node_conn *c) {
    stream_put *p = c->sput;
    static uint8_t drop[16384]; /* the bytes of refused objects, read and thrown away */
    while (p->at < p->n) {
        if (!p->started) put_begin_object(n, c, p);
        uint64_t len = p->objects[p->at].length;
        while (p->got < len) {
            uint64_t want = len - p->got;
            void *to = p->dst ? (uint8_t *)p->dst + p->got : drop;
            if (!p->dst && want > sizeof drop) want = sizeof drop;
            ssize_t k = kvs_chan_recv(&c->ch, to, (size_t)want);
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return; /* more to come */
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) { /* closed, or failed halfway: nothing of this object is stored */
                c->peer_gone = 1;
                end_session(n, c, "put",
                            k == 0 ? "the connection closed halfway" : strerror(errno));
                return;
            }
            p->got += (uint64_t)k;
        }
        if (p->dst) {
            p->status[p->at].status = node_publish(n, c, &p->cur, p->dst, len);
            free(p->buf);
            p->buf = p->dst = NULL;
        }
        p->started = 0;
        p->at++;
    }
    kvs_wire_msg rep;
    kvs_wire_msg_init(&rep, KVS_WIRE_PUT_REPLY, p->request_id);
    rep.entries = p->status;
    rep.n_entries = p->n;
    answer(n, c, &rep); /* before the drop: rep's entries are the PUT's */
}

/* A decoded PUT: its objects' names and lengths kept (the frame goes), served as bytes come. */
static void put_start(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    stream_put *p = calloc(1, sizeof *p);
    if (p) {
        p->objects = calloc(req->n_entries ? req->n_entries : 1, sizeof *p->objects);
        p->status = calloc(req->n_entries ? req->n_entries : 1, sizeof *p->status);
    }
    if (!p || !p->objects || !p->status) {
        put_free(p);
        end_session(n, c, "put", "no memory for its state");
        return;
    }
    for (uint32_t i = 0; i < req->n_entries; i++) {
        if (!req->entries[i].by_message) {
            put_free(p);
            end_session(n, c, "put", "an object not sent on the stream");
            return;
        }
        memcpy(p->objects[i].key, req->entries[i].key, KVS_WIRE_KEY_BYTES);
        p->objects[i].length = req->entries[i].length;
    }
    p->request_id = req->request_id;
    p->n = req->n_entries;
    c->sput = p;
    c->stream_deadline_ns = stream_deadline(n);
}

int node_stream_sending(const node_conn *c) {
    return c->sget != NULL || c->sout != NULL;
}

uint64_t node_expire_streams(kvs_node *n) {
    uint64_t now = kvs_now_ns(), next = UINT64_MAX;
    for (node_conn *c = n->conns; c; c = c->next) {
        if (!c->session || c->closing || !c->stream_deadline_ns) continue;
        if (now >= c->stream_deadline_ns) {
            char why[96];
            kvs_fmt(why, sizeof why, "not in within %d ms", n->params.timeout_ms);
            c->peer_gone = 1;
            end_session(n, c,
                        c->sput   ? "put"
                        : c->sget ? "get answer"
                        : c->sout ? "put answer"
                                  : "request",
                        why);
        } else if (c->stream_deadline_ns < next) {
            next = c->stream_deadline_ns;
        }
    }
    return next;
}

/* Take the bytes of the session's next request frame that have come, without waiting: 1 once the
 * whole frame is in c->sframe, 0 while more are to come or the session ended. */
static int frame_in(kvs_node *n, node_conn *c) {
    for (;;) {
        int in_prefix = c->sprefix_have < sizeof c->sprefix;
        uint8_t *dst = in_prefix ? c->sprefix + c->sprefix_have : c->sframe + c->shave;
        size_t want = in_prefix ? sizeof c->sprefix - c->sprefix_have : c->sneed - c->shave;
        ssize_t k = kvs_chan_recv(&c->ch, dst, want);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { /* closed, or half a frame: either way this session is over */
            c->peer_gone = 1;
            c->closing = 1;
            return 0;
        }
        if (!in_prefix) {
            c->shave += (uint32_t)k;
            if (c->shave == c->sneed) return 1;
            continue;
        }
        if (c->sprefix_have == 0) /* a frame begins: it must be in within timeout_ms */
            c->stream_deadline_ns = stream_deadline(n);
        c->sprefix_have += (uint32_t)k;
        if (c->sprefix_have < sizeof c->sprefix) continue;
        c->sneed = (uint32_t)c->sprefix[0] << 24 | (uint32_t)c->sprefix[1] << 16 |
                   (uint32_t)c->sprefix[2] << 8 | c->sprefix[3];
        c->shave = 0;
        char why[96];
        if (c->sneed == 0 || c->sneed > KVS_WIRE_MAX_MESSAGE_BYTES) {
            kvs_fmt(why, sizeof why, "a frame of %u bytes (1..%u allowed)", c->sneed,
                    KVS_WIRE_MAX_MESSAGE_BYTES);
            end_session(n, c, "request", why);
            return 0;
        }
        if (!(c->sframe = malloc(c->sneed))) {
            end_session(n, c, "request", "no memory for its frame");
            return 0;
        }
    }
}

static void frame_done(node_conn *c) {
    free(c->sframe);
    c->sframe = NULL;
    c->sprefix_have = c->sneed = c->shave = 0;
}

/* No object is over 4 GiB (the most --max-object-bytes takes). A PUT announcing more ends its
 * session at once rather than have its bytes read and dropped, so a length of 2^62 cannot hold the
 * loop; an object over this node's max_object_bytes but under that is read, dropped and refused. */
#define STREAM_MAX_OBJECT_BYTES (1ull << 32)

static int put_lengths_ok(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    for (uint32_t i = 0; req->type == KVS_WIRE_PUT && i < req->n_entries; i++)
        if (req->entries[i].length > STREAM_MAX_OBJECT_BYTES) {
            char why[128];
            kvs_fmt(why, sizeof why, "an object of %llu bytes announced (no object is over %llu)",
                    (unsigned long long)req->entries[i].length,
                    (unsigned long long)STREAM_MAX_OBJECT_BYTES);
            n->stats.refusals++;
            end_session(n, c, "put", why);
            return 0;
        }
    return 1;
}

void node_stream_request(kvs_node *n, node_conn *c) {
    if (!n->stream_buf) n->stream_buf = malloc(KVS_WIRE_MAX_MESSAGE_BYTES + 4);
    if (!n->stream_buf) {
        end_session(n, c, "request", "no memory for its buffers");
        return;
    }
    if (c->sput) {
        put_continue(n, c);
        return;
    }
    if (c->sget) {
        get_continue(n, c);
        return;
    }
    if (c->sout) {
        out_continue(n, c);
        return;
    }
    if (!frame_in(n, c)) return;
    c->stream_deadline_ns = 0;
    kvs_wire_msg req;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    kvs_status decoded =
        kvs_wire_decode(c->sframe, c->sneed, n->entries, KVS_WIRE_MAX_KEYS, &req, &why);
    if (decoded == KVS_OK && (req.type == KVS_WIRE_GET || req.type == KVS_WIRE_PUT) &&
        put_lengths_ok(n, c, &req)) {
        if (req.type == KVS_WIRE_GET)
            get_start(n, c, &req);
        else
            put_start(n, c, &req);
        frame_done(c);
        if (c->sget) get_continue(n, c);
        if (c->sput) put_continue(n, c);
        return;
    } else if (decoded == KVS_OK && (req.type == KVS_WIRE_LOOKUP || req.type == KVS_WIRE_DELETE ||
                                     req.type == KVS_WIRE_STATS)) {
        small_request(n, c, &req);
    } else if (decoded != KVS_OK) {
        n->stats.refusals++;
        end_session(n, c, "request", why.text);
    } else if (!c->closing) {
        n->stats.refusals++;
        end_session(n, c, kvs_wire_type_name(req.type), "not a request");
    }
    frame_done(c);
}
