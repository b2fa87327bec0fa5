/* node_state.h - the node and its connections: the state that node.c, node_control.c,
 * node_requests.c and node_stream.c all read and write. node.c owns the node's lifetime and routes
 * its events; node_control.c runs the control connections and their handshake up to a session;
 * node_requests.c and node_stream.c serve a session's requests. The calls between those files are in
 * their own headers. Private to tools/node: main.c and tests use node.h. Like node.h, nothing here is
 * thread-safe. */
#ifndef KVS_NODE_STATE_H
#define KVS_NODE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_server.h"
#include "backends/ucx/control.h"
#include "backends/ucx/ucx_transport.h"
#include "backends/ucx/wire.h"
#include "node_params.h"

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
    uint32_t trow; /* the session's row in kvs_node.tenants (from AUTH_OK on) */
    int closing;   /* closed by the loop after the current callback returns */
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
    /* per-tenant traffic: n_tenants rows named by their tenant, then the shared row of tenants past
     * them at KVS_NODE_TENANT_ROWS (node_metrics.h) */
    kvs_node_tenant_stats tenants[KVS_NODE_TENANT_ROWS + 1];
    uint32_t n_tenants;
    int tenants_overflowed;       /* the shared row has had a tenant */
    struct node_metrics *metrics; /* NULL: no metrics (node_metrics.h) */
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

/* Count v in the node's counter `field` and in tenant row `row`'s. */
#define NODE_COUNT(n, row, field, v)    \
    do {                                \
        (n)->stats.field += (v);        \
        (n)->tenants[row].field += (v); \
    } while (0)

#endif
