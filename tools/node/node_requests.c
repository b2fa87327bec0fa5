/* node_requests.c - a session's LOOKUP/GET/PUT/DELETE/STATS requests over the tier chain, and their
 * replies. Requests run to completion in the transport's message callback (node.c routes them here),
 * so a session's requests are answered in order.
 *
 * Payloads move without a copy on the node where the tier allows it: a GET pins each object in a
 * zero-copy tier (dram) and writes it from its slab into the client's memory, all of a request's
 * objects in flight at once with one flush; a PUT reserves room in the top tier and reads the
 * client's bytes straight into it. Tiers without those (ssd) go through staging slots. */
#include "node_requests.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "node_control.h"
#include "node_metrics.h"
#include "node_quota.h"

/* ---- replies ---------------------------------------------------------------------------------- */

static void send_encoded(kvs_node *n, node_conn *c, size_t len) {
    if (kvs_ucx_am_send(c->conn, KVS_NODE_AM_ID, NULL, 0, n->reply, len, n->params.timeout_ms) !=
        KVS_OK) {
        fprintf(stderr, "kvstrata-node: %s: %s\n", c->peer, kvs_ucx_last_error(n->t));
        c->closing = 1;
    }
}

void node_send_msg(kvs_node *n, node_conn *c, const kvs_wire_msg *msg) {
    size_t len = 0;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_encode(msg, n->reply, KVS_WIRE_MAX_MESSAGE_BYTES, &len, &why) != KVS_OK) {
        fprintf(stderr, "kvstrata-node: cannot encode a %s reply: %s\n",
                kvs_wire_type_name(msg->type), why.text);
        c->closing = 1;
        return;
    }
    send_encoded(n, c, len);
}

/* Answer with ERROR; a connection that keeps sending what the node refuses is closed. */
void node_send_refusal(kvs_node *n, node_conn *c, const kvs_wire_refusal *why) {
    size_t len = 0;
    n->stats.refusals++;
    if (kvs_wire_encode_refusal(why, n->reply, KVS_WIRE_MAX_MESSAGE_BYTES, &len) == KVS_OK)
        send_encoded(n, c, len);
    if (++c->refusals > n->params.max_refusals) {
        fprintf(stderr, "kvstrata-node: %s: closed after %u refused messages\n", c->peer,
                c->refusals);
        c->closing = 1;
    }
}

void node_refuse(kvs_node *n, node_conn *c, uint64_t request_id, kvs_wire_error code,
                 const char *text) {
    kvs_wire_refusal why;
    kvs_wire_refusal_make(&why, code, request_id, text);
    node_send_refusal(n, c, &why);
}

/* ---- requests --------------------------------------------------------------------------------- */

int node_alive(const node_conn *c) {
    return kvs_ucx_conn_alive(c->conn) && kvs_ucx_conn_alive(c->rma);
}

/* The stored key of a request key: namespaced by the connection's tenant. */
int node_stored_key(const node_conn *c, const uint8_t *key_bytes, kvs_key *out) {
    kvs_key k;
    memcpy(k.bytes, key_bytes, KVS_WIRE_KEY_BYTES);
    return kvs_remote_tenant_hasher_key(c->hasher, &k, out) == KVS_OK ? 0 : -1;
}

void node_do_lookup(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    for (uint32_t i = 0; i < req->n_entries; i++) {
        kvs_key k;
        int present = node_stored_key(c, req->entries[i].key, &k) == 0 &&
                      kvs_server_tiers_find(n->chain, &k) >= 0;
        n->reply_entries[i].present = (uint8_t)present;
        NODE_COUNT(n, c->trow, lookups, 1);
        if (present)
            NODE_COUNT(n, c->trow, hits, 1);
        else
            NODE_COUNT(n, c->trow, misses, 1);
    }
}

/* The unpacked key for a client's packed rkey blob, from the connection's cache or unpacked now. */
static kvs_ucx_rkey *rkey_for(node_conn *c, const uint8_t *blob, uint32_t len) {
    for (uint32_t i = 0; i < RKEY_CACHE; i++)
        if (c->rkeys[i].len == len && memcmp(c->rkeys[i].blob, blob, len) == 0)
            return c->rkeys[i].rkey;
    kvs_ucx_rkey *rkey = NULL;
    if (c->closing || len == 0 || len > KVS_WIRE_MAX_RKEY_BYTES) return NULL;
    if (kvs_ucx_rkey_unpack_untrusted(c->rma, blob, len, &rkey) != KVS_OK) {
        /* a key UCX cannot read is a broken or hostile client: its session ends, so the rest of
         * its batch costs no more tries */
        c->closing = 1;
        return NULL;
    }
    rkey_slot *s = &c->rkeys[c->rkey_next];
    c->rkey_next = (c->rkey_next + 1) % RKEY_CACHE;
    if (s->len) kvs_ucx_rkey_destroy(s->rkey);
    memcpy(s->blob, blob, len);
    s->len = len;
    s->rkey = rkey;
    return rkey;
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
    if (n->n_sends > 0) {
        kvs_status st = kvs_ucx_am_send_many(c->rma, KVS_NODE_PAYLOAD_AM_ID, n->sends, n->n_sends,
                                             n->params.timeout_ms);
        for (uint32_t i = 0; i < n->n_sends; i++) {
            kvs_wire_entry *r = &n->reply_entries[n->send_entry[i]];
            if (n->sends[i].status == KVS_OK) {
                NODE_COUNT(n, c->trow, bytes_out, n->sends[i].data_len);
            } else {
                r->status = KVS_EIO;
                r->length = 0;
            }
        }
        if (st != KVS_OK)
            fprintf(stderr, "kvstrata-node: %s: %s\n", c->peer, kvs_ucx_last_error(n->t));
    }
    if (n->n_batch > 0) {
        kvs_status st = kvs_ucx_rma_many(c->rma, 1, n->batch, n->n_batch, n->params.timeout_ms);
        for (uint32_t i = 0; i < n->n_batch; i++) {
            kvs_wire_entry *r = &n->reply_entries[n->batch_entry[i]];
            if (st == KVS_OK) {
                NODE_COUNT(n, c->trow, bytes_out, n->batch[i].len);
            } else {
                r->status = KVS_EIO;
                r->length = 0;
            }
        }
        if (st != KVS_OK)
            fprintf(stderr, "kvstrata-node: %s: %s\n", c->peer, kvs_ucx_last_error(n->t));
    }
    node_unpin_all(n);
    n->n_batch = n->n_sends = 0;
}

void node_unpin_all(kvs_node *n) {
    for (uint32_t i = 0; i < n->n_pins; i++) {
        const pinned *p = &n->pins[i];
        kvs_server_tiers_ops(n->chain, p->tier)
            ->unpin(kvs_server_tiers_state(n->chain, p->tier), &p->key, 1);
    }
    n->n_pins = n->slots_used = 0;
}

kvs_status node_object_ref(kvs_node *n, node_conn *c, const uint8_t *key_bytes, const void **object,
                           uint64_t *len) {
    kvs_key k;
    *len = 0;
    *object = NULL;
    if (node_stored_key(c, key_bytes, &k) != 0) return KVS_EINVAL;
    int tier = kvs_server_tiers_find(n->chain, &k);
    if (tier < 0) return KVS_ENOTFOUND;
    const kvs_backend_ops *ops = kvs_server_tiers_ops(n->chain, (uint32_t)tier);
    void *state = kvs_server_tiers_state(n->chain, (uint32_t)tier);
    kvs_status st;
    if ((ops->caps & KVS_BACKEND_CAP_ZERO_COPY) && ops->get_ref) {
        uint64_t n_pinned = 0;
        /* the pin outlives the batch's transfers, which are bounded by timeout_ms */
        st = ops->pin(state, &k, 1, (uint64_t)n->params.timeout_ms * 2 + 1000, &n_pinned);
        if (st != KVS_OK || n_pinned != 1) return KVS_ENOTFOUND; /* evicted meanwhile */
        st = ops->get_ref(state, &k, object, len);
        if (st != KVS_OK) {
            ops->unpin(state, &k, 1);
            *len = 0;
            *object = NULL;
            return st;
        }
        n->pins[n->n_pins++] = (pinned){.tier = (uint32_t)tier, .key = k};
        return KVS_OK;
    }
    if (n->slots_used == n->staging_slots) return KVS_EAGAIN;
    uint8_t *slot = n->staging + (uint64_t)n->slots_used * n->slot_len;
    st = ops->get(state, &k, slot, n->params.max_object_bytes, len);
    if (st != KVS_OK) return st; /* ENOTFOUND if evicted meanwhile; EOVERFLOW with the size */
    *object = slot;
    n->slots_used++;
    return KVS_OK;
}

/* Find one object and add its transfer to the batch: a pinned slab of a zero-copy tier, or a copy
 * in a staging slot (flushing the batch first when the slots are taken). */
static kvs_status get_one(kvs_node *n, node_conn *c, uint32_t index, const kvs_wire_entry *e,
                          uint64_t *len) {
    const void *object = NULL;
    kvs_status st = node_object_ref(n, c, e->key, &object, len);
    if (st == KVS_EAGAIN) {
        get_flush(n, c);
        st = node_object_ref(n, c, e->key, &object, len);
    }
    if (st != KVS_OK) return st;
    kvs_ucx_rkey *rkey = NULL;
    if (*len > e->length)
        st = KVS_EOVERFLOW; /* its pin, if any, goes with the batch's */
    else if (*len > 0 && !e->by_message && !(rkey = rkey_for(c, e->rkey, e->rkey_len)))
        st = KVS_EINVAL;
    if (st != KVS_OK || *len == 0) {
        if (st == KVS_EINVAL) *len = 0;
        return st;
    }
    if (e->by_message) { /* sent as a payload message: the client places it */
        kvs_wire_payload h = {
            .kind = KVS_WIRE_PAYLOAD_GET, .index = index, .request_id = n->get_request};
        n->sends[n->n_sends] =
            (kvs_ucx_am_out){.header = n->send_headers[n->n_sends],
                             .header_len = kvs_wire_payload_encode(&h, n->send_headers[n->n_sends]),
                             .data = object,
                             .data_len = (size_t)*len,
                             .mem = mem_for(n, object, *len)};
        n->send_entry[n->n_sends++] = index;
        return KVS_OK;
    }
    n->batch[n->n_batch] = (kvs_ucx_rma){.local = (void *)(uintptr_t)object,
                                         .len = (size_t)*len,
                                         .local_mem = mem_for(n, object, *len),
                                         .remote_addr = e->remote_addr,
                                         .rkey = rkey};
    n->batch_entry[n->n_batch++] = index;
    return KVS_OK;
}

void node_do_get(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    n->get_request = req->request_id;
    for (uint32_t i = 0; i < req->n_entries; i++) {
        kvs_wire_entry *r = &n->reply_entries[i];
        r->status = node_alive(c) ? get_one(n, c, i, &req->entries[i], &r->length) : KVS_EIO;
    }
    get_flush(n, c);
    for (uint32_t i = 0; i < req->n_entries; i++) {
        kvs_status st = n->reply_entries[i].status;
        NODE_COUNT(n, c->trow, gets, 1);
        if (st == KVS_OK || st == KVS_EOVERFLOW)
            NODE_COUNT(n, c->trow, hits, 1);
        else if (st == KVS_ENOTFOUND)
            NODE_COUNT(n, c->trow, misses, 1);
    }
}

static void quota_remove(void *ctx, const kvs_key *key) {
    kvs_node *n = ctx;
    kvs_server_tiers_remove(n->chain, key);
    n->stats.quota_evictions++;
}

kvs_status node_admit(kvs_node *n, node_conn *c, const kvs_key *key, uint64_t len, char *err,
                      size_t err_len) {
    (void)key;
    kvs_status st = node_quota_admit(n->quota, c->auth.tenant, len);
    if (st != KVS_OK)
        kvs_fmt(err, err_len, "a %llu-byte object does not fit tenant \"%s\"'s share",
                (unsigned long long)len, c->auth.tenant);
    return st;
}

void node_put_abandon(kvs_node *n, const put_pending *p) {
    if (p->reserved) kvs_server_tiers_abort(n->chain, p->ticket);
}

/* Count a stored object of tenant (its share too), or log why it was not stored. row: the tenant's
 * row (node_metrics.h). */
static void put_outcome(kvs_node *n, const char *tenant, uint32_t row, const kvs_key *key,
                        kvs_status st, uint64_t len, const char *err) {
    if (st != KVS_OK) {
        fprintf(stderr, "kvstrata-node: put for tenant \"%s\": %s\n", tenant, err);
        return;
    }
    NODE_COUNT(n, row, puts, 1);
    NODE_COUNT(n, row, bytes_in, len);
    uint64_t evicted = 0;
    node_quota_stored(n->quota, tenant, key, len, quota_remove, n, &evicted);
}

void node_put_stored(kvs_node *n, node_conn *c, const kvs_key *key, kvs_status st, uint64_t len,
                     const char *err) {
    put_outcome(n, c->auth.tenant, c->trow, key, st, len, err);
}

kvs_status node_publish(kvs_node *n, node_conn *c, const put_pending *p, const void *bytes,
                        uint64_t len) {
    char err[256] = "";
    kvs_status st =
        p->reserved
            ? kvs_server_tiers_commit(n->chain, &p->key, p->ticket, bytes, len, err, sizeof err)
            : kvs_server_tiers_put(n->chain, &p->key, bytes, len, err, sizeof err);
    /* a session gone since the object came keeps its tenant's row (rows are never dropped) */
    if (c)
        put_outcome(n, c->auth.tenant, c->trow, &p->key, st, len, err);
    else
        put_outcome(n, p->tenant, node_tenant_row(n, p->tenant), &p->key, st, len, err);
    return st;
}

/* Milliseconds from now until read_by_ns (0: none, the node's own timeout), at least 1. */
static uint32_t read_window_ms(const kvs_node *n, uint64_t read_by_ns) {
    uint64_t now = kvs_now_ns(), ms = n->params.timeout_ms;
    if (read_by_ns && read_by_ns > now && (read_by_ns - now) / 1000000ull < ms)
        ms = (read_by_ns - now) / 1000000ull;
    return ms ? (uint32_t)ms : 1;
}

/* Read the batch's objects from the client (all in flight, one flush), then publish each: commit
 * its reservation or put its staging slot into the tiers. A failed read stores none of them, and
 * neither does one that finished at or after the PUT's read-by time (docs/remote.md, "Shared memory
 * on one host"): the client may have reused the room by then, so the bytes may not be the object's.
 * Checked after the reads completed: a read seen complete before the time read the client's bytes. */
static void put_flush(kvs_node *n, node_conn *c, uint64_t read_by_ns) {
    if (n->n_batch == 0) return;
    kvs_status st =
        read_by_ns && kvs_now_ns() >= read_by_ns
            ? KVS_ETIMEDOUT
            : kvs_ucx_rma_many(c->rma, 0, n->batch, n->n_batch, read_window_ms(n, read_by_ns));
    if (st == KVS_OK && read_by_ns && kvs_now_ns() >= read_by_ns) st = KVS_ETIMEDOUT;
    if (st == KVS_ETIMEDOUT && read_by_ns) {
        n->stats.late_puts += n->n_batch;
        fprintf(stderr,
                "kvstrata-node: %s: %u objects of a put not stored: read at or after the client's "
                "read-by time (the client may have reused their room)\n",
                c->peer, n->n_batch);
    } else if (st != KVS_OK) {
        fprintf(stderr, "kvstrata-node: %s: %s\n", c->peer, kvs_ucx_last_error(n->t));
    }
    for (uint32_t i = 0; i < n->n_batch; i++) {
        const put_pending *p = &n->puts[i];
        const kvs_ucx_rma *op = &n->batch[i];
        kvs_status *out = &n->reply_entries[n->batch_entry[i]].status;
        if (st != KVS_OK) {
            node_put_abandon(n, p);
            *out = st == KVS_ETIMEDOUT ? KVS_ETIMEDOUT : KVS_EIO;
            continue;
        }
        *out = node_publish(n, c, p, op->local, op->len);
    }
    n->n_batch = n->slots_used = 0;
}

/* Store one object of a PUT: inline ones at once; others join the batch of RMA reads, into room
 * reserved in the top tier when it allows (no copy on the node), else into a staging slot (flushing
 * the batch first when the slots are taken). */
static kvs_status put_one(kvs_node *n, node_conn *c, uint32_t index, const kvs_wire_entry *e,
                          uint64_t read_by_ns) {
    kvs_key k;
    char err[256] = "";
    if (node_stored_key(c, e->key, &k) != 0) return KVS_EINVAL;
    if (e->length == 0 || e->length > n->params.max_object_bytes) return KVS_EINVAL;
    kvs_status st = node_admit(n, c, &k, e->length, err, sizeof err);
    if (st != KVS_OK) {
        node_put_stored(n, c, &k, st, e->length, err);
        return st;
    }
    if (e->inline_data) {
        st = kvs_server_tiers_put(n->chain, &k, e->inline_data, e->length, err, sizeof err);
        node_put_stored(n, c, &k, st, e->length, err);
        return st;
    }
    kvs_ucx_rkey *rkey = rkey_for(c, e->rkey, e->rkey_len);
    if (!rkey) return KVS_EINVAL;
    int reserve = kvs_server_tiers_can_reserve(n->chain);
    if (!reserve && n->slots_used == n->staging_slots) put_flush(n, c, read_by_ns);
    put_pending *p = &n->puts[n->n_batch];
    void *dst = NULL;
    *p = (put_pending){.key = k};
    snprintf(p->tenant, sizeof p->tenant, "%s", c->auth.tenant);
    if (reserve) {
        st = kvs_server_tiers_reserve(n->chain, &k, e->length, &dst, &p->ticket, err, sizeof err);
        if (st != KVS_OK) {
            node_put_stored(n, c, &k, st, e->length, err);
            return st;
        }
        p->reserved = 1;
    } else {
        dst = n->staging + (uint64_t)n->slots_used++ * n->slot_len;
    }
    n->batch[n->n_batch] = (kvs_ucx_rma){.local = dst,
                                         .len = (size_t)e->length,
                                         .local_mem = mem_for(n, dst, e->length),
                                         .remote_addr = e->remote_addr,
                                         .rkey = rkey};
    n->batch_entry[n->n_batch++] = index;
    return KVS_OK; /* for now: put_flush writes the outcome */
}

void node_do_put(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    for (uint32_t i = 0; i < req->n_entries; i++)
        n->reply_entries[i].status =
            node_alive(c) ? put_one(n, c, i, &req->entries[i], req->read_by_ns) : KVS_EIO;
    put_flush(n, c, req->read_by_ns);
}

/* ---- PUT objects as payload messages --------------------------------------------------------- */

/* One object being received: where it goes and what became of it. */
typedef struct put_payload {
    put_pending put; /* reserved room, or buf (tiers that cannot reserve) */
    void *buf;
    kvs_status st; /* KVS_OK, or why place refused it */
} put_payload;

void *node_put_place(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                     size_t data_len, void **cookie) {
    kvs_node *n = user;
    (void)conn; /* the token names the session */
    kvs_wire_payload h;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_payload_decode(header, header_len, KVS_WIRE_PAYLOAD_PUT, &h, &why) != KVS_OK)
        return NULL; /* landed counts it */
    node_conn *c = node_session_of(n, h.token, sizeof h.token);
    put_payload *p = c ? calloc(1, sizeof *p) : NULL;
    if (!p) return NULL;
    *cookie = p;
    char err[256] = "";
    void *dst = NULL;
    snprintf(p->put.tenant, sizeof p->put.tenant, "%s", c->auth.tenant);
    if (node_stored_key(c, h.key, &p->put.key) != 0 || data_len == 0 ||
        data_len > n->params.max_object_bytes) {
        p->st = KVS_EINVAL;
    } else if (h.read_by_ns && kvs_now_ns() >= h.read_by_ns) {
        p->st = KVS_ETIMEDOUT; /* the client may have reused the room already: never read it */
    } else if ((p->st = node_admit(n, c, &p->put.key, data_len, err, sizeof err)) != KVS_OK) {
        node_put_stored(n, c, &p->put.key, p->st, data_len, err);
    } else if (kvs_server_tiers_can_reserve(n->chain)) {
        p->st = kvs_server_tiers_reserve(n->chain, &p->put.key, data_len, &dst, &p->put.ticket, err,
                                         sizeof err);
        p->put.reserved = p->st == KVS_OK;
        if (p->st != KVS_OK) node_put_stored(n, c, &p->put.key, p->st, data_len, err);
    } else if (!(dst = p->buf = malloc(data_len))) {
        p->st = KVS_ENOMEM;
    }
    return p->st == KVS_OK ? dst : NULL;
}

/* Record object h.index of session c's payload PUT; answer the PUT once all its objects landed. */
static void put_payload_done(kvs_node *n, node_conn *c, const kvs_wire_payload *h, kvs_status st) {
    if (!c->put_status && !(c->put_status = calloc(KVS_WIRE_MAX_KEYS, sizeof *c->put_status)))
        return; /* no reply: the client times out and counts the puts dropped */
    if (c->put_count == 0 || c->put_request != h->request_id) {
        if (c->put_count && c->put_landed < c->put_count)
            fprintf(stderr, "kvstrata-node: %s: put %llu left with %u of %u objects\n", c->peer,
                    (unsigned long long)c->put_request, c->put_landed, c->put_count);
        c->put_request = h->request_id;
        c->put_count = h->count;
        c->put_landed = 0;
        for (uint32_t i = 0; i < h->count; i++) c->put_status[i] = KVS_EIO;
    }
    if (h->count != c->put_count) return; /* not this PUT's shape: ignored, the PUT times out */
    c->put_status[h->index] = st;
    if (++c->put_landed < c->put_count) return;
    kvs_wire_msg rep;
    kvs_wire_msg_init(&rep, KVS_WIRE_PUT_REPLY, c->put_request);
    memset(n->reply_entries, 0, sizeof(kvs_wire_entry) * c->put_count);
    for (uint32_t i = 0; i < c->put_count; i++) n->reply_entries[i].status = c->put_status[i];
    rep.entries = n->reply_entries;
    rep.n_entries = c->put_count;
    c->put_count = c->put_landed = 0;
    if (node_alive(c))
        node_send_msg(n, c, &rep);
    else
        c->closing = 1;
}

void node_put_landed(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                     void *dst, size_t data_len, void *cookie, kvs_status st) {
    kvs_node *n = user;
    put_payload *p = cookie;
    kvs_wire_payload h;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    int ok_header =
        kvs_wire_payload_decode(header, header_len, KVS_WIRE_PAYLOAD_PUT, &h, &why) == KVS_OK;
    node_conn *c = ok_header && conn ? node_session_of(n, h.token, sizeof h.token) : NULL;
    if (!p) { /* refused before any room was taken: a bad header, no session, no memory */
        n->stats.payloads_refused++;
        if (!ok_header)
            node_log_refusal(n, "dropped a %zu-byte payload: %s", data_len, why.text);
        else if (!c)
            n->stats.unknown_sessions++;
        if (c) put_payload_done(n, c, &h, KVS_ENOMEM);
        return;
    }
    if (st == KVS_OK && h.read_by_ns && kvs_now_ns() >= h.read_by_ns) {
        /* read at or after the read-by time: the bytes may be another object's */
        n->stats.late_puts++;
        st = KVS_ETIMEDOUT;
    }
    if (st == KVS_OK) {
        st = node_publish(n, c, &p->put, dst, data_len);
    } else {
        if (p->st == KVS_OK) node_put_abandon(n, &p->put); /* admitted, never stored */
        if (p->st != KVS_OK) {
            st = p->st;
            n->stats.payloads_refused++;
        } else if (st == KVS_ENOTFOUND) {
            st = KVS_EIO;
        }
    }
    free(p->buf);
    free(p);
    if (c) put_payload_done(n, c, &h, st);
}

void node_do_delete(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    for (uint32_t i = 0; i < req->n_entries; i++) {
        kvs_key k;
        kvs_status st = KVS_EINVAL;
        if (node_stored_key(c, req->entries[i].key, &k) == 0) {
            st = kvs_server_tiers_find(n->chain, &k) >= 0 ? KVS_OK : KVS_ENOTFOUND;
            node_quota_forget(n->quota, &k);
            if (st == KVS_OK) {
                kvs_server_tiers_remove(n->chain, &k);
                NODE_COUNT(n, c->trow, deletes, 1);
            }
        }
        n->reply_entries[i].status = st;
    }
}

void node_do_stats(kvs_node *n, kvs_wire_msg *rep) {
    uint64_t objects = 0, bytes = 0;
    for (uint32_t i = 0; i < kvs_server_tiers_count(n->chain); i++) {
        uint64_t o = 0, b = 0;
        const kvs_backend_ops *ops = kvs_server_tiers_ops(n->chain, i);
        if (ops->usage(kvs_server_tiers_state(n->chain, i), &o, &b) == KVS_OK) {
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
    rep->counters[KVS_WIRE_STAT_EVICTIONS] = kvs_server_tiers_evictions(n->chain);
    rep->counters[KVS_WIRE_STAT_AUTH_FAILURES] = n->stats.auth_failures;
    rep->counters[KVS_WIRE_STAT_HANDSHAKE_REFUSALS] = n->stats.handshake_refusals;
    rep->counters[KVS_WIRE_STAT_HANDSHAKE_TIMEOUTS] = n->stats.handshake_timeouts;
    rep->counters[KVS_WIRE_STAT_CONNECTIONS_REJECTED] = n->stats.rejected;
}
