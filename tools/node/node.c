/* node.c - kvstrata-node's server: connections, handshake, and the LOOKUP/GET/PUT/DELETE/STATS
 * requests over the tier chain. One thread owns everything; requests run to completion in the
 * transport's message callback, so a connection's requests are answered in order.
 *
 * Payloads move without a copy on the node where the tier allows it: a GET pins each object in a
 * zero-copy tier (dram) and writes it from its slab into the client's memory, all of a request's
 * objects in flight at once with one flush; a PUT reserves room in the top tier and reads the
 * client's bytes straight into it. Tiers without those (ssd) go through staging slots. */
#include "node.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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
    kvs_ucx_conn *conn; /* requests and replies (the client's sockaddr connection) */
    kvs_ucx_conn *rma;  /* payloads: conn, or an endpoint to the client's worker address (same host) */
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
    uint32_t n_conns;
    kvs_wire_entry entries[KVS_WIRE_MAX_KEYS];
    kvs_wire_entry reply_entries[KVS_WIRE_MAX_KEYS];
    uint8_t *reply; /* KVS_WIRE_MAX_MESSAGE_BYTES */
    kvs_node_stats stats;
    uint8_t host_id[KVS_REMOTE_HOST_ID_BYTES];
    int host_id_ok;
    int log_level;
};

/* ---- connections ------------------------------------------------------------------------------ */

static void conn_free(node_conn *c) {
    for (uint32_t i = 0; i < RKEY_CACHE; i++)
        if (c->rkeys[i].len) kvs_ucx_rkey_destroy(c->rkeys[i].rkey);
    if (c->rma && c->rma != c->conn) kvs_ucx_conn_close(c->rma);
    kvs_ucx_conn_close(c->conn);
    if (c->pidfd >= 0) close(c->pidfd);
    kvs_remote_tenant_hasher_free(c->hasher);
    memset(&c->auth, 0, sizeof c->auth);
    free(c);
}

static void on_accept(void *user, kvs_ucx_conn *conn) {
    kvs_node *n = user;
    if (n->n_conns >= n->params.max_clients) {
        n->stats.rejected++;
        fprintf(stderr, "kvstrata-node: %s refused: already %u connections (--max-clients)\n",
                kvs_ucx_conn_peer(conn), n->n_conns);
        kvs_ucx_conn_close(conn);
        return;
    }
    node_conn *c = calloc(1, sizeof *c);
    if (!c) {
        kvs_ucx_conn_close(conn);
        return;
    }
    c->conn = conn;
    c->rma = conn;
    c->pidfd = -1;
    c->next = n->conns;
    n->conns = c;
    n->n_conns++;
    n->stats.connections++;
    kvs_ucx_conn_set_user(conn, c);
}

static void on_dead(void *user, kvs_ucx_conn *conn, const char *why) {
    (void)user;
    (void)why;
    node_conn *c = kvs_ucx_conn_user(conn);
    if (c) c->closing = 1; /* a connection refused at accept was closed there already */
}

/* Close the connections marked closing (never from inside their own callback). */
static void sweep(kvs_node *n) {
    for (node_conn **p = &n->conns; *p;) {
        node_conn *c = *p;
        if (c->closing) {
            *p = c->next;
            n->n_conns--;
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
        fprintf(stderr, "kvstrata-node: %s: %s\n", kvs_ucx_conn_peer(c->conn), kvs_ucx_last_error(n->t));
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
        fprintf(stderr, "kvstrata-node: %s: closed after %u refused messages\n", kvs_ucx_conn_peer(c->conn),
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
            fprintf(stderr, "kvstrata-node: %s: %s\n", kvs_ucx_conn_peer(c->conn), kvs_ucx_last_error(n->t));
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
        fprintf(stderr, "kvstrata-node: %s: %s\n", kvs_ucx_conn_peer(c->conn), kvs_ucx_last_error(n->t));
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
}

/* A client on this host that sent its worker address gets its payloads over an endpoint to that
 * address, where UCX can use shared memory; the sockaddr path reaches it over tcp only. Any failure
 * keeps the sockaddr connection for payloads (said at WARN). */
static void rma_by_address(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    if (!req->worker_addr_len) return; /* not offered (shared_memory: off) */
    if (!n->host_id_ok || req->host_id_len != sizeof n->host_id || memcmp(req->host_id, n->host_id, sizeof n->host_id)) {
        kvs_log(n->log_level, KVS_LOG_DEBUG, "kvstrata-node: client %s is on another host",
                kvs_ucx_conn_peer(c->conn));
        return;
    }
    /* UCX has no failure detection on that endpoint: the client's pidfd fires the moment it exits */
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)req->pid, 0);
    if (pidfd < 0) {
        kvs_log(n->log_level, KVS_LOG_WARN, "kvstrata-node: client %s: no pidfd for its pid %u (%s); payloads go "
                "over the request connection", kvs_ucx_conn_peer(c->conn), req->pid, strerror(errno));
        return;
    }
    char name[96];
    kvs_fmt(name, sizeof name, "%s (worker address)", kvs_ucx_conn_peer(c->conn));
    kvs_ucx_conn *rma = NULL;
    if (kvs_ucx_connect_address(n->t, req->worker_addr, req->worker_addr_len, name, n->params.timeout_ms, &rma) !=
        KVS_OK) {
        kvs_log(n->log_level, KVS_LOG_WARN,
                "kvstrata-node: client %s is on this host but its worker address does not connect (%s); "
                "payloads go over the request connection", kvs_ucx_conn_peer(c->conn), kvs_ucx_last_error(n->t));
        close(pidfd);
        return;
    }
    kvs_ucx_conn_set_user(rma, c);
    kvs_ucx_conn_guard(rma, c->conn); /* a client that dies shows on the request connection... */
    kvs_ucx_conn_watch_fd(rma, pidfd); /* ...or, sooner, on its pidfd */
    c->pidfd = pidfd;
    c->rma = rma;
}

static void handshake(kvs_node *n, node_conn *c, const kvs_wire_msg *req) {
    char err[256] = "";
    kvs_wire_msg rep;
    if (req->type == KVS_WIRE_HELLO) {
        const uint8_t *challenge = NULL;
        kvs_status st = kvs_remote_auth_node_hello(&c->auth, req, &challenge, err, sizeof err);
        if (st != KVS_OK) { /* the handshake is over for this connection (auth.c refuses from now on) */
            refuse(n, c, req->request_id, st == KVS_ESTATE ? KVS_WIRE_ERR_STATE : KVS_WIRE_ERR_AUTH,
                   err[0] ? err : "node: hello refused");
            c->closing = 1;
            return;
        }
        kvs_wire_msg_init(&rep, KVS_WIRE_CHALLENGE, req->request_id);
        rep.challenge = challenge;
        send_msg(n, c, &rep);
        return;
    }
    /* AUTH */
    kvs_status st = kvs_remote_auth_node_check(&c->auth, &n->psk, req->proof, req->proof ? KVS_WIRE_PROOF_BYTES : 0,
                                               err, sizeof err);
    if (st == KVS_ESTATE) {
        refuse(n, c, req->request_id, KVS_WIRE_ERR_STATE, err[0] ? err : "node: auth without a challenge");
        c->closing = 1;
        return;
    }
    if (st != KVS_OK) {
        n->stats.auth_failures++;
        fprintf(stderr, "kvstrata-node: %s: authentication failed for tenant \"%s\"\n",
                kvs_ucx_conn_peer(c->conn), c->auth.tenant);
        refuse(n, c, req->request_id, KVS_WIRE_ERR_AUTH, "node: authentication failed");
        c->closing = 1;
        return;
    }
    if (!(c->hasher = kvs_remote_tenant_hasher_new(c->auth.tenant, c->auth.tenant_len))) {
        refuse(n, c, req->request_id, KVS_WIRE_ERR_INTERNAL, "node: out of memory");
        c->closing = 1;
        return;
    }
    n->stats.auth_ok++;
    rma_by_address(n, c, req);
    const char *tls = kvs_ucx_conn_transports(c->rma);
    kvs_wire_msg_init(&rep, KVS_WIRE_AUTH_OK, req->request_id);
    rep.transports = tls;
    rep.transports_len = (uint32_t)strnlen(tls, KVS_WIRE_MAX_TRANSPORTS_TEXT);
    int slow = kvs_ucx_tls_slow(tls);
    kvs_log(n->log_level, slow ? KVS_LOG_WARN : KVS_LOG_INFO,
            "kvstrata-node: client %s (tenant \"%s\"): payloads over %s%s", kvs_ucx_conn_peer(c->conn),
            c->auth.tenant, tls, slow ? " only - a slow fallback (RMA emulated over messages)" : "");
    send_msg(n, c, &rep);
}

static void on_message(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len, const void *data,
                       size_t data_len) {
    kvs_node *n = user;
    node_conn *c = kvs_ucx_conn_user(conn);
    if (!c || c->closing) return;
    const void *buf = data_len ? data : header;
    size_t len = data_len ? data_len : header_len;
    kvs_wire_msg req;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_decode(buf, len, n->entries, KVS_WIRE_MAX_KEYS, &req, &why) != KVS_OK) {
        send_refusal(n, c, &why);
        return;
    }
    int authed = kvs_remote_auth_node_ok(&c->auth);
    if (req.type == KVS_WIRE_HELLO || req.type == KVS_WIRE_AUTH) {
        if (authed) refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE, "node: the connection is already authenticated");
        else handshake(n, c, &req);
        return;
    }
    if (!authed) {
        char text[128];
        kvs_fmt(text, sizeof text, "node: %s before the handshake finished", kvs_wire_type_name(req.type));
        refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE, text);
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
    n->params = *params;
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

    kvs_ucx_params p = {.struct_size = sizeof p, .name = "kvstrata-node", .listen_host = params->listen_host,
                        .listen_port = params->listen_port, .log_level = params->config->log_level,
                        .on_accept = on_accept, .on_dead = on_dead, .user = n};
    st = kvs_ucx_create(&p, &n->t, err, err_len);
    if (st != KVS_OK) goto fail;
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

uint16_t kvs_node_port(const kvs_node *n) { return kvs_ucx_listen_port(n->t); }
uint32_t kvs_node_tier_count(const kvs_node *n) { return kvs_tiers_count(n->chain); }
void kvs_node_get_stats(const kvs_node *n, kvs_node_stats *out) { *out = n->stats; }

kvs_status kvs_node_run(kvs_node *n, int stop_fd) {
    for (;;) {
        kvs_ucx_progress(n->t);
        sweep(n);
        if (kvs_ucx_arm(n->t) == KVS_EAGAIN) continue; /* events pending: progress again first */
        struct pollfd p[2] = {{.fd = stop_fd, .events = POLLIN}, {.fd = kvs_ucx_event_fd(n->t), .events = POLLIN}};
        if (poll(p, 2, LOOP_WAIT_MS) > 0 && (p[0].revents & POLLIN)) return KVS_OK;
    }
}

void kvs_node_destroy(kvs_node *n) {
    if (!n) return;
    for (node_conn *c = n->conns; c; c = c->next) c->closing = 1;
    sweep(n);
    for (uint32_t i = 0; i < n->n_regions; i++) kvs_ucx_mem_deregister(n->regions[i].mem);
    n->n_regions = 0; /* a staging registration made before a failed create goes with the transport */
    kvs_ucx_destroy(n->t);
    kvs_tiers_close(n->chain);
    free(n->reply);
    free(n->staging);
    kvs_remote_psk_clear(&n->psk);
    free(n);
}
