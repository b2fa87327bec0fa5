/*
 * ucx_remote_progress.c - the remote tier's progress thread (see ucx_remote_progress.h): it owns
 * the UCX transport and the registered memory, runs the queued jobs one at a time (a batch per
 * node, replies matched by request id) and sleeps on the worker's event fd and the eventfd
 * doorbell.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "ucx_remote_error.h"
#include "ucx_remote_nodes.h"
#include "ucx_remote_progress.h"
#include "ucx_remote_reply.h"
#include "ucx_remote_state.h"
#include "ucx_remote_stream.h"

/* ---- messages from nodes --------------------------------------------------------------------- */

/* The node waiting for the reply to request_id (request ids are unique across the tier's nodes). */
static rnode *node_of_request(remote *r, uint64_t request_id) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++)
        if (r->nodes[i].conn && r->nodes[i].pending && r->nodes[i].request_id == request_id)
            return &r->nodes[i];
    return NULL;
}

static void on_reply(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
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
    if (nd && nd->conn) remote_take_reply(r, nd, &m);
}

/* The entry of the running GET a payload message's header names (*k), or 0 when it names none: a
 * bad header, another request, an index past the batch. */
static int payload_entry(remote *r, const void *header, size_t header_len, uint32_t *k) {
    kvs_wire_payload h;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    const job *j = r->current;
    if (!j || j->kind != JOB_GET ||
        kvs_wire_payload_decode(header, header_len, KVS_WIRE_PAYLOAD_GET, &h, &why) != KVS_OK)
        return 0;
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        const rnode *nd = &r->nodes[i];
        if (!nd->msg_request || nd->msg_request != h.request_id) continue;
        if (h.index >= nd->n_batch) return 0;
        *k = nd->batch[h.index];
        return 1;
    }
    return 0;
}

/* A GET's object arriving as a payload message: place it in the caller's buffer while its request
 * is the one being answered and the caller still waits; refuse it otherwise (a late object is never
 * written). Runs inside UCX's progress. */
static void *on_place(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                      size_t data_len, void **cookie) {
    remote *r = user;
    (void)conn;
    (void)cookie;
    uint32_t k;
    if (!payload_entry(r, header, header_len, &k)) return NULL;
    job *j = r->current;
    if (j->landed[k] != LANDING_ASKED || data_len > j->cap[k]) return NULL;
    pthread_mutex_lock(&r->mutex); /* the caller gives up under the lock */
    int abandoned = j->abandoned;
    pthread_mutex_unlock(&r->mutex);
    if (abandoned) return NULL;
    j->landed[k] = LANDING_PLACED;
    j->inflight++;
    return j->dsts[k];
}

/* A placed object is in (or failed): record it on the GET it belongs to, if that is still running. */
static void on_landed(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                      void *dst, size_t data_len, void *cookie, kvs_status st) {
    remote *r = user;
    (void)conn;
    (void)cookie;
    (void)data_len;
    uint32_t k;
    if (!dst || !payload_entry(r, header, header_len, &k)) return;
    job *j = r->current;
    if (j->landed[k] != LANDING_PLACED || j->dsts[k] != dst) return;
    j->landed[k] = st == KVS_OK ? LANDING_OK : LANDING_FAILED;
    j->inflight--;
}

/* ---- jobs on the progress thread ------------------------------------------------------------- */

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

/* A PUT to a node whose objects travel as payload messages: one message per object, straight from
 * the put queue, all in flight at once; the node answers with one PUT_REPLY once all have landed.
 * A message the node refused (its room, a bad key) still gets its status in that reply, so only a
 * dead connection or the deadline fails the request here. */
static kvs_status send_put_payloads(remote *r, rnode *nd, uint64_t read_by_ns, uint64_t deadline) {
    int ms = ms_left(deadline);
    if (ms <= 0) return KVS_ETIMEDOUT;
    for (uint32_t b = 0; b < nd->n_batch; b++) {
        const job *pj = r->put_jobs[nd->batch[b]];
        kvs_wire_payload h = {.kind = KVS_WIRE_PAYLOAD_PUT,
                              .index = b,
                              .count = nd->n_batch,
                              .request_id = nd->request_id,
                              .read_by_ns = read_by_ns};
        memcpy(h.token, nd->token, sizeof h.token);
        memcpy(h.key, pj->keys[0].bytes, sizeof h.key);
        r->sends[b] =
            (kvs_ucx_am_out){.header = r->send_headers[b],
                             .header_len = kvs_wire_payload_encode(&h, r->send_headers[b]),
                             .data = pj->object,
                             .data_len = (size_t)pj->len,
                             .mem = r->queue_mem};
    }
    kvs_status st = kvs_ucx_am_send_many(nd->conn, PAYLOAD_AM_ID, r->sends, nd->n_batch, ms);
    if (st == KVS_EIO && kvs_ucx_conn_alive(nd->conn)) return KVS_OK; /* refusals: in the reply */
    if (st != KVS_OK) snprintf(nd->refusal, sizeof nd->refusal, "%s", kvs_ucx_last_error(r->t));
    return st;
}

/* Entry e of a batch to nd: key k of the running job, described for how the node moves its bytes
 * (on the stream, as payload messages, by RMA from or into our memory, or inline). */
static void describe_entry(remote *r, const rnode *nd, int type, job *j, uint32_t k,
                           kvs_wire_entry *e) {
    memset(e, 0, sizeof *e);
    e->key = type == KVS_WIRE_PUT ? r->put_jobs[k]->keys[0].bytes : j->keys[k].bytes;
    if (type == KVS_WIRE_GET && nd->stream) {
        e->by_message = 1; /* the node sends it on the stream, read into dsts[k] */
        e->length = j->cap[k];
    } else if (type == KVS_WIRE_PUT && nd->stream) {
        e->by_message = 1; /* its bytes follow the PUT on the stream */
        e->length = r->put_jobs[k]->len;
    } else if (type == KVS_WIRE_GET && nd->messages) {
        e->by_message = 1; /* the node sends the object; on_place puts it in dsts[k] */
        e->length = j->cap[k];
        j->landed[k] = LANDING_ASKED;
    } else if (type == KVS_WIRE_GET) {
        int direct = j->off[k] == UINT64_MAX;
        e->remote_addr =
            direct ? (uint64_t)(uintptr_t)j->dsts[k] : (uint64_t)(uintptr_t)(r->bounce + j->off[k]);
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

/* Send node nd its batch (a request of `type`) the way it takes it; one that cannot be sent marks
 * the node failed. A PUT may push *deadline later: each node gets timeout_ms from its own send. */
static void send_batch(remote *r, rnode *nd, int type, uint64_t *deadline) {
    kvs_wire_msg m;
    kvs_wire_msg_init(&m, (kvs_wire_type)type, nd->request_id = ++r->next_id);
    m.entries = r->entries;
    m.n_entries = nd->n_batch;
    job *j = r->current;
    for (uint32_t b = 0; b < nd->n_batch; b++)
        describe_entry(r, nd, type, j, nd->batch[b], &r->entries[b]);
    if (type == KVS_WIRE_STATS) m.n_entries = 0, m.entries = NULL;
    nd->read_by_ns = 0;
    if (type ==
        KVS_WIRE_PUT) { /* detached: each node gets timeout_ms from its own send (run_puts) */
        uint64_t fair = kvs_now_ns() + (uint64_t)r->opt.timeout_ms * 1000000ull;
        if (*deadline < fair) *deadline = fair;
        /* a node on shared memory reads the queue without our help: it is told until when
         * the room is the objects' (the same clock: one host, one time namespace) */
        if (nd->shared_memory) m.read_by_ns = nd->read_by_ns = fair;
    }
    if (type == KVS_WIRE_GET && nd->messages) nd->msg_request = nd->request_id;
    if (nd->stream_out && type != KVS_WIRE_PUT &&
        remote_stream_drain(r, nd, 0, *deadline) != KVS_OK) {
        /* its PUTs' answers first: what came before is seen by what comes after; the node
         * is down now and its keys go to their next homes */
        nd->pending = 0;
        return;
    }
    kvs_status sent;
    if (nd->stream && (type == KVS_WIRE_GET || type == KVS_WIRE_PUT)) {
        /* on the stream: a GET with its answer, a PUT answered later (stream_put) */
        m.read_by_ns = nd->read_by_ns = 0; /* the node never reads this process's memory */
        sent = type == KVS_WIRE_GET ? remote_stream_get(r, nd, j, &m, *deadline)
                                    : remote_stream_put(r, nd, &m, *deadline);
        if (sent == KVS_OK) nd->pending = 0;
    } else if (kvs_chan_is_tls(&nd->ctl)) {
        sent = remote_stream_call_send(r, nd, &m, *deadline); /* nothing of it goes on UCX */
    } else if (type == KVS_WIRE_PUT && nd->messages) {
        sent = send_put_payloads(r, nd, m.read_by_ns, *deadline);
    } else {
        sent = remote_send_msg(r, nd, &m, *deadline);
    }
    if (sent != KVS_OK) {
        nd->pending = 0;
        nd->failed = 1;
    } else if (type == KVS_WIRE_PUT) {
        pthread_mutex_lock(&r->mutex);
        r->stats.put_requests++;
        pthread_mutex_unlock(&r->mutex);
    }
}

/* Wait until every node sent has answered (encrypted nodes on their streams, the others through
 * UCX's progress), its connection died, or the deadline passed. */
static void await_replies(remote *r, uint64_t deadline) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) /* encrypted nodes' answers, on their streams */
        if (r->nodes[i].pending && kvs_chan_is_tls(&r->nodes[i].ctl))
            remote_stream_call_take(r, &r->nodes[i], deadline);
    for (;;) {
        int waiting = 0;
        for (uint32_t i = 0; i < r->opt.n_nodes; i++)
            waiting |= r->nodes[i].pending && !r->nodes[i].conn_dead;
        if (!waiting || ms_left(deadline) <= 0) break;
        kvs_ucx_wait(r->t, ms_left(deadline));
    }
}

/* Nodes that did not answer, or whose connection died, are marked down; a PUT's unconfirmed copies
 * are counted dropped, their room held until the node's read-by time. Every batch is emptied. */
static void settle_unanswered(remote *r, int type) {
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
                /* it may still read them until their read-by time: their room waits for it */
                if (nd->read_by_ns > r->queue_hold_until) r->queue_hold_until = nd->read_by_ns;
                pthread_mutex_unlock(&r->mutex);
            }
            remote_node_down(r, nd, nd->refusal[0] ? nd->refusal : "request failed");
        }
        nd->n_batch = 0;
    }
}

/* Send every node's batch, wait for the replies until the deadline; nodes that did not answer, or
 * whose connection died, are marked down (their batch keys stay unresolved). */
static void exchange(remote *r, int type, uint64_t deadline) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        nd->failed = 0;
        if (nd->pending) send_batch(r, nd, type, &deadline);
    }
    await_replies(r, deadline);
    settle_unanswered(r, type);
}

/* After a GET round: wait (until the job's deadline) for the objects its replies said were sent as
 * payload messages, then settle each key asked that way: landed is a hit; said sent but not landed
 * (nothing came, or the transfer failed) is a miss; unanswered (its node failed) is asked again
 * next round. An object still being received into the caller's buffer when the deadline passes is
 * a miss and counted (late_payloads): UCX cannot cancel a receive it has begun, which is why
 * on_place refuses every object once the caller gave up. */
static uint64_t await_landings(remote *r, job *j) {
    for (;;) {
        int waiting = j->inflight > 0;
        for (uint64_t k = 0; k < j->n && !waiting; k++)
            waiting = j->landed[k] == LANDING_ASKED && j->resolved[k] && j->statuses[k] == KVS_OK;
        if (!waiting || ms_left(j->deadline_ns) <= 0) break;
        kvs_ucx_wait(r->t, ms_left(j->deadline_ns));
    }
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) r->nodes[i].msg_request = 0;
    uint64_t by_message = 0, late = 0;
    for (uint64_t k = 0; k < j->n; k++) {
        uint8_t state = j->landed[k];
        if (state == LANDING_NONE || state == LANDING_DONE) continue;
        int ok = j->resolved[k] && j->statuses[k] == KVS_OK;
        if (state == LANDING_OK) {
            by_message += (uint64_t)ok;
        } else if (state == LANDING_PLACED) {
            late++;
            j->resolved[k] = 1;
            j->statuses[k] = KVS_EIO;
        } else if (ok) { /* said sent, but failed in transfer or never came */
            j->statuses[k] = KVS_EIO;
        }
        j->landed[k] = j->resolved[k] ? LANDING_DONE : LANDING_NONE;
    }
    j->inflight = 0;
    pthread_mutex_lock(&r->mutex);
    r->stats.message_gets += by_message;
    r->stats.late_payloads += late;
    pthread_mutex_unlock(&r->mutex);
    if (late)
        remote_set_error(r,
                         "%llu objects were still arriving when their get ended; their buffers "
                         "may be written after it",
                         (unsigned long long)late);
    return by_message;
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
            if (type == KVS_WIRE_GET && !nd->messages && !nd->stream &&
                !in_staging(r, j->dsts[k], j->cap[k])) {
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
        uint64_t stream_hits = j->stream_hits;
        exchange(r, type, j->deadline_ns);
        if (type != KVS_WIRE_GET) continue;
        stream_hits = j->stream_hits - stream_hits;
        uint64_t by_message = await_landings(r, j);
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
        r->stats.rma_gets += rma - by_message - stream_hits;
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

static void run_one_job(remote *r, job *j) {
    r->current = j;
    switch (j->kind) {
        case JOB_LOOKUP:
        case JOB_GET: run_keyed(r, j); break;
        case JOB_FLUSH: /* every job queued before it has finished; the answers of PUTs on nodes'
                         * streams are read now */
            for (uint32_t i = 0; i < r->opt.n_nodes; i++)
                if (r->nodes[i].stream_out) remote_stream_drain(r, &r->nodes[i], 0, j->deadline_ns);
            break;
        default: run_broadcast(r, j); break;
    }
    r->current = NULL;
}

/* ---- the progress thread --------------------------------------------------------------------- */

/* With the mutex held: give back the room held for a node that may still read it, once its
 * read-by time has passed. */
static void release_held(remote *r) {
    if (r->queue_held && kvs_now_ns() >= r->queue_hold_until) {
        r->queue_used -= r->queue_held;
        r->queue_held = 0;
        pthread_cond_broadcast(&r->cond);
    }
}

static void finish(remote *r, job *j) {
    pthread_mutex_lock(&r->mutex);
    if (j->kind == JOB_PUT) { /* its room in the queue: puts finish in the order they took it */
        release_held(r);
        if (r->queue_held || kvs_now_ns() < r->queue_hold_until)
            r->queue_held += j->queue_span; /* behind room a node may still read */
        else
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

/* Register the staging pool (when there is one), the bounce buffer and the put queue with UCX and
 * pack each one's rkey. */
static kvs_status register_buffers(remote *r) {
    kvs_status st;
    size_t len = 0;
    if (r->staging && r->staging_len) {
        if ((st = kvs_ucx_mem_register(r->t, r->staging, (size_t)r->staging_len,
                                       &r->staging_mem)) != KVS_OK)
            return st;
        if ((st = kvs_ucx_mem_pack(r->staging_mem, r->staging_rkey, sizeof r->staging_rkey,
                                   &len)) != KVS_OK)
            return st;
        r->staging_rkey_len = (uint32_t)len;
    }
    if ((st = kvs_ucx_mem_register(r->t, r->bounce, (size_t)r->bounce_len, &r->bounce_mem)) !=
        KVS_OK)
        return st;
    if ((st = kvs_ucx_mem_pack(r->bounce_mem, r->bounce_rkey, sizeof r->bounce_rkey, &len)) !=
        KVS_OK)
        return st;
    r->bounce_rkey_len = (uint32_t)len;
    if ((st = kvs_ucx_mem_register(r->t, r->queue, (size_t)r->queue_len, &r->queue_mem)) != KVS_OK)
        return st;
    if ((st = kvs_ucx_mem_pack(r->queue_mem, r->queue_rkey, sizeof r->queue_rkey, &len)) != KVS_OK)
        return st;
    r->queue_rkey_len = (uint32_t)len;
    return KVS_OK;
}

/* Connect every node. A node that refused authentication fails the start; one that cannot be
 * reached now is down from the start (reported once, not counted a failure) and retried later. */
static kvs_status connect_nodes(remote *r) {
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        if (remote_node_connect(r, nd) == KVS_OK) continue;
        if (nd->hs == HS_REFUSED) {
            remote_set_error(
                r, "node %s refused authentication for tenant \"%s\" (%s); check psk_file %s",
                node_id(r, nd), r->opt.tenant, nd->refusal[0] ? nd->refusal : "no reason given",
                r->opt.psk_file);
            return KVS_EIO;
        }
        char why[KVS_WIRE_MAX_ERROR_TEXT + 1];
        snprintf(why, sizeof why, "%s", nd->refusal);
        nd->up = 1; /* so remote_node_down reports and counts it once */
        pthread_mutex_lock(&r->mutex);
        r->stats.nodes_up++;
        pthread_mutex_unlock(&r->mutex);
        remote_node_down(r, nd, why);
        pthread_mutex_lock(&r->mutex);
        r->stats.node_failures--;
        pthread_mutex_unlock(&r->mutex);
    }
    return KVS_OK;
}

static kvs_status thread_start(remote *r) {
    kvs_ucx_params p;
    char err[256] = "";
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.name = r->name;
    p.log_level = KVS_LOG_WARN;
    p.on_dead = remote_on_dead;
    p.user = r;
    p.busy_poll_us = r->opt.busy_poll_us;
    kvs_status st = kvs_ucx_create(&p, &r->t, err, sizeof err);
    if (st != KVS_OK) {
        remote_set_error(r, "cannot start UCX: %s", err);
        return st;
    }
    if ((st = kvs_ucx_am_handler(r->t, REMOTE_AM_ID, on_reply, r)) != KVS_OK) goto ucx_fail;
    if ((st = kvs_ucx_payload_handler(r->t, PAYLOAD_AM_ID, on_place, on_landed, r)) != KVS_OK)
        goto ucx_fail;
    if ((st = register_buffers(r)) != KVS_OK) goto ucx_fail;
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
    if (r->opt.encrypt &&
        (st = kvs_tls_client_new(r->opt.tenant, &r->psk, &r->tls, err, sizeof err)) != KVS_OK) {
        remote_set_error(r, "%s", err);
        return st;
    }
    return connect_nodes(r);
ucx_fail:
    remote_set_error(r, "UCX setup failed: %s", kvs_ucx_last_error(r->t));
    return st;
}

static void thread_stop(remote *r) {
    /* the answers of PUTs still on the nodes' streams, so the counters say what was stored */
    for (uint32_t i = 0; i < r->opt.n_nodes; i++)
        if (r->nodes[i].stream_out)
            remote_stream_drain(r, &r->nodes[i], 0,
                                kvs_now_ns() + (uint64_t)r->opt.timeout_ms * 1000000ull);
    /* the queue goes away after this: not while a node on shared memory may still read it */
    for (;;) {
        pthread_mutex_lock(&r->mutex);
        uint64_t until = r->queue_held ? r->queue_hold_until : 0;
        release_held(r);
        pthread_mutex_unlock(&r->mutex);
        if (!until || kvs_now_ns() >= until) break;
        struct timespec pause = {0, 5000000};
        nanosleep(&pause, NULL);
    }
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        if (r->nodes[i].conn) {
            kvs_ucx_conn_set_user(r->nodes[i].conn, NULL);
            kvs_ucx_conn_close(r->nodes[i].conn);
            r->nodes[i].conn = NULL;
        }
        remote_control_close(&r->nodes[i]);
    }
    kvs_tls_free(r->tls);
    r->tls = NULL;
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

/* Nothing queued: sleep in poll until UCX, the doorbell, a node's control connection or the next
 * timer (a reconnect, held room to give back) needs the thread. An up node's control connection
 * becomes readable only when the node closes it (or breaks the protocol): either way the session
 * is over; a handshaking node's moves its handshake on (remote_reconnect_due, next pass). */
static void idle_wait(remote *r) {
    uint64_t next_ns = UINT64_MAX;
    remote_reconnect_due(r, &next_ns);
    pthread_mutex_lock(&r->mutex);
    int queued = r->head != NULL || r->stopping;
    release_held(r);
    if (r->queue_held && r->queue_hold_until < next_ns) next_ns = r->queue_hold_until;
    pthread_mutex_unlock(&r->mutex);
    if (queued) return;
    if (kvs_ucx_arm(r->t) == KVS_EAGAIN) return;
    int ms = -1;
    if (next_ns != UINT64_MAX) ms = ms_left(next_ns) + 1;
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) /* TLS holds bytes no poll sees */
        if (r->nodes[i].up && kvs_chan_pending(&r->nodes[i].ctl)) ms = 0;
    struct pollfd *fds = r->pfds;
    fds[0] = (struct pollfd){.fd = kvs_ucx_event_fd(r->t), .events = POLLIN};
    fds[1] = (struct pollfd){.fd = r->doorbell, .events = POLLIN};
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        const rnode *nd = &r->nodes[i];
        fds[2 + i] = (struct pollfd){.fd = nd->up || remote_in_handshake(nd) ? nd->ctl.fd : -1,
                                     .events = nd->up ? POLLIN : remote_handshake_events(nd)};
    }
    if (poll(fds, r->opt.n_nodes + 2, ms) < 0) return;
    if (fds[1].revents & POLLIN) {
        uint64_t v;
        if (read(r->doorbell, &v, sizeof v) < 0 && errno != EAGAIN) (void)0;
    }
    for (uint32_t i = 0; i < r->opt.n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        if ((!fds[2 + i].revents && !kvs_chan_pending(&nd->ctl)) || !nd->up) continue;
        if (nd->stream_out) /* answers of PUTs on its stream (or the end, which fails it) */
            remote_stream_drain(r, nd, 0, kvs_now_ns() + (uint64_t)r->opt.timeout_ms * 1000000ull);
        else
            remote_node_down(r, nd, "the node closed its control connection");
    }
}

void *remote_progress_main(void *arg) {
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
            if (r->nodes[i].conn_dead) remote_node_down(r, &r->nodes[i], r->nodes[i].refusal);
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
                run_one_job(r, j);
            finish(r, j);
            continue;
        }
        if (stopping) break;
        idle_wait(r);
    }
    thread_stop(r);
    return NULL;
}
