/* node_internal.h - what the node's three files share: the node and its connections, and the calls
 * between them. node.c owns the node's lifetime and routes its events; node_control.c runs the control
 * connections and their handshake up to a session; node_requests.c serves a session's requests.
 * Private to tools/node: main.c and tests use node.h. Like node.h, nothing here is thread-safe. */
#ifndef KVS_NODE_INTERNAL_H
#define KVS_NODE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_server.h"
#include "backends/ucx/control.h"
#include "backends/ucx/ucx_transport.h"
#include "backends/ucx/wire.h"
#include "node.h"

#define RKEY_CACHE  8  /* unpacked client keys kept per connection */
#define MAX_REGIONS 8u /* tier ranges registered with UCX, plus the staging */

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
    char tenant[KVS_WIRE_MAX_TENANT_BYTES + 1]; /* whose share it counts in once stored */
} put_pending;

typedef struct rkey_slot {
    uint8_t blob[KVS_WIRE_MAX_RKEY_BYTES];
    uint32_t len; /* 0: empty */
    kvs_ucx_rkey *rkey;
} rkey_slot;

/* One control connection: a handshake, then from AUTH_OK a session. On the node's list from accept
 * until, once marked closing, the loop's sweep (node.c) frees it. */
typedef struct node_conn {
    kvs_chan ch;   /* the control connection (TCP or TLS); the session lives while it is open */
    char peer[64]; /* its host:port, for messages */
    kvs_control_reader *rd; /* during the handshake; freed at AUTH_OK */
    uint64_t deadline_ns;   /* the handshake's */
    uint32_t source;        /* the peer's IPv4 address, network order (0: unknown) */
    int session;            /* authenticated: conn, token and hasher are set */
    int peer_gone;          /* the control connection ended: endpoints are aborted, not flushed */
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES];
    kvs_ucx_conn
        *conn; /* replies: an endpoint to the client's worker address, peer failures detected */
    kvs_ucx_conn
        *rma;  /* payloads: conn, or a shared-memory endpoint to the same address (same host) */
    int pidfd; /* with that endpoint: the client process, readable once it exits; else -1 */
    kvs_remote_auth_node auth;
    kvs_remote_tenant_hasher *hasher; /* the tenant's stored keys, from AUTH_OK on */
    uint32_t refusals;
    int closing; /* closed by the loop after the current callback returns */
    rkey_slot rkeys[RKEY_CACHE];
    uint32_t rkey_next; /* round-robin replacement */
    /* the PUT whose objects arrive as payload messages: answered once all `put_count` landed */
    uint64_t put_request;
    uint32_t put_count, put_landed; /* put_count 0: none under way */
    kvs_status *put_status;         /* KVS_WIRE_MAX_KEYS, allocated at the first such PUT */
    /* a request frame on the session's stream, read as its bytes come (a client that trickles one
     * holds up only itself): its length prefix, then its bytes */
    uint8_t sprefix[4];
    uint32_t sprefix_have, sneed, shave;
    uint8_t *sframe; /* sneed bytes once the prefix is in; freed when its request is served */
    struct stream_put *sput; /* a PUT on the stream whose objects' bytes are still coming */
    struct stream_get *sget; /* a GET on the stream whose answer is still going out */
    uint8_t *sout;           /* an answer waiting for room in the socket (a PUT_REPLY frame) */
    size_t sout_len, sout_sent;
    uint64_t stream_deadline_ns; /* the frame, PUT or GET under way ends by then (0: none) */
    struct node_conn *next;
} node_conn;

/* The node: created, run and destroyed by node.c; every field belongs to the loop's thread. */
struct kvs_node {
    kvs_node_params params;
    kvs_remote_psk psk;
    kvs_tls *tls; /* encrypt: every control connection is TLS, keyed from psk (channel.h) */
    kvs_server_tiers *chain;
    struct node_quota *quota; /* tenants' shares (node_quota.h); NULL: none set */
    uint64_t capacity_bytes;  /* sum over tiers, for STATS */
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
    /* one GET batch sent as payload messages: the sends, their headers and reply entries */
    kvs_ucx_am_out sends[KVS_WIRE_MAX_KEYS];
    uint8_t send_headers[KVS_WIRE_MAX_KEYS][KVS_WIRE_GET_PAYLOAD_BYTES];
    uint32_t send_entry[KVS_WIRE_MAX_KEYS];
    uint32_t n_sends;
    uint64_t get_request; /* the GET being served */
    uint8_t *stream_buf;  /* a request frame on the stream: KVS_WIRE_MAX_MESSAGE_BYTES + 4 */
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
    /* The first tier when it is a dram tier shared between processes (options.shm_name): named with
     * its geometry in AUTH_OK to clients on this host, which attach it and read objects out of it
     * themselves (docs/remote.md, "Gets out of the node's shared tier"). Empty: none. */
    char shared_tier[KVS_WIRE_MAX_SHARED_TIER_NAME + 1];
    uint64_t shared_tier_capacity;
    uint64_t shared_slabs; /* its slabs (the dram tier's geometry) */
    uint64_t shared_room;  /* free slabs kept in it for clients' puts (keep_shared_room), 0: none */
    uint64_t shared_room_checked_ns;
    int log_level;
};

/* ---- node_control.c: control connections, handshake, sessions ---------------------------------- */

/* A refusal line on stderr, at most one a second; the lines left out are counted in the next one. */
void node_log_refusal(kvs_node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The control connection c is readable: handshake bytes (at AUTH_OK c becomes a session), a
 * session's end, or (returns 1) a request on a session's stream for node_stream_request. Anything
 * wrong marks c closing; the loop closes it. */
int node_control_readable(kvs_node *n, node_conn *c);
/* Mark closing the handshakes past their deadline. Returns the nearest deadline still ahead (CLOCK_MONOTONIC
 * ns, kvs_now_ns), UINT64_MAX when none. */
uint64_t node_expire_handshakes(kvs_node *n);
/* The live session whose token a request header holds, or NULL (never an encrypted one). */
node_conn *node_session_of(kvs_node *n, const void *header, size_t header_len);

/* ---- node_requests.c: a session's requests and their replies ------------------------------------ */

/* Whether both of the session's endpoints (replies, payloads) still reach the client. */
int node_alive(const node_conn *c);
/* Encode and send a reply on the session's endpoint; a failure marks c closing. */
void node_send_msg(kvs_node *n, node_conn *c, const kvs_wire_msg *msg);
/* Answer with ERROR (counted); past params.max_refusals refused messages c is marked closing. */
void node_send_refusal(kvs_node *n, node_conn *c, const kvs_wire_refusal *why);
/* node_send_refusal with a refusal built from a request id, an error code and its text. */
void node_refuse(kvs_node *n, node_conn *c, uint64_t request_id, kvs_wire_error code,
                 const char *text);
/* Serve one decoded request of session c: each fills n->reply_entries[0, req->n_entries), zeroed by the
 * caller, and counts in n->stats; the caller sends the reply. GET and PUT move the payloads by RMA. */
void node_do_lookup(kvs_node *n, node_conn *c, const kvs_wire_msg *req);
void node_do_get(kvs_node *n, node_conn *c, const kvs_wire_msg *req);
void node_do_put(kvs_node *n, node_conn *c, const kvs_wire_msg *req);
void node_do_delete(kvs_node *n, node_conn *c, const kvs_wire_msg *req);
/* The payload handlers of KVS_NODE_PAYLOAD_AM_ID (user: the node): a PUT's object is received
 * straight into room reserved in the tiers (a buffer for tiers that cannot reserve) and stored when
 * it has landed; the PUT is answered once all its objects have. */
void *node_put_place(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                     size_t data_len, void **cookie);
void node_put_landed(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                     void *dst, size_t data_len, void *cookie, kvs_status st);
/* The stored key of a request key: namespaced by the session's tenant. 0 on success. */
int node_stored_key(const node_conn *c, const uint8_t *key_bytes, kvs_key *out);
/* Admit len bytes under key for session c's tenant within its share (node_quota.h), before any
 * room is taken: KVS_OK, or KVS_ENOMEM with a sentence in err. */
kvs_status node_admit(kvs_node *n, node_conn *c, const kvs_key *key, uint64_t len, char *err,
                      size_t err_len);
/* Count a stored object (st KVS_OK) or log why it was not (its share no longer counts it). */
void node_put_stored(kvs_node *n, node_conn *c, const kvs_key *key, kvs_status st, uint64_t len,
                     const char *err);
/* A put whose bytes never came: its reservation aborted, its share no longer counting it. */
void node_put_abandon(kvs_node *n, const put_pending *p);
/* Store an object whose bytes are in: commit its reservation (bytes: where it was built, for
 * write-through copies) or put bytes into the tiers; counted or logged (node_put_stored) when c is
 * not NULL (its session still open). */
kvs_status node_publish(kvs_node *n, node_conn *c, const put_pending *p, const void *bytes,
                        uint64_t len);
/* A request key's object for sending: pinned in a zero-copy tier (the pin joins n->pins) or copied
 * into the next free staging slot. KVS_EAGAIN when it needs a slot and none is free (send what the
 * slots hold and node_unpin_all first), KVS_ENOTFOUND, KVS_EOVERFLOW (a copy tier's object over
 * max_object_bytes), KVS_EINVAL (a key this session cannot name). */
kvs_status node_object_ref(kvs_node *n, node_conn *c, const uint8_t *key_bytes, const void **object,
                           uint64_t *len);
/* Drop the pins of n->pins and free the staging slots. */
void node_unpin_all(kvs_node *n);
/* Serve one request frame arriving on session c's control connection (payloads: stream;
 * backends/ucx/stream.h): a GET answered in groups with the objects' bytes, a PUT whose bytes
 * follow its frame. Anything wrong ends the session (the stream cannot be resynchronised). */
void node_stream_request(kvs_node *n, node_conn *c);
/* 1 when session c has an answer waiting for room in its socket (poll it for POLLOUT). */
int node_stream_sending(const node_conn *c);
/* Sessions whose request frame or PUT on the stream is not in by its deadline (timeout_ms from its
 * first byte) are ended. Returns the nearest deadline still ahead (UINT64_MAX: none). */
uint64_t node_expire_streams(kvs_node *n);
/* What session c's stream PUT holds (a reservation, a buffer), let go; before c is freed. */
void node_stream_drop(kvs_node *n, node_conn *c);
/* Fill the STATS reply's counters: the tiers' usage and the node's counters. */
void node_do_stats(kvs_node *n, kvs_wire_msg *rep);

#endif
