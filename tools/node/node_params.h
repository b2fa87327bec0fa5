/* node_params.h - what a kvstrata-node is asked to do (kvs_node_params), what it counts
 * (kvs_node_stats) and the active message ids it speaks: the node's vocabulary, shared by its API
 * (node.h) and its state (node_state.h). */
#ifndef KVS_NODE_PARAMS_H
#define KVS_NODE_PARAMS_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_server.h"
#include "backends/ucx/auth.h"

/* Requests and replies travel as one active message of this id; the encoded wire message is the
 * message's data segment. A request's header is the session token of AUTH_OK
 * (KVS_WIRE_SESSION_TOKEN_BYTES); a request naming no live session is dropped. Replies have an
 * empty header. */
#define KVS_NODE_AM_ID         1u
/* Objects that travel as payload messages (kvs_ucx_payload_handler) use this id: a GET's objects
 * sent to a client that asked for them so (node -> client), a PUT's objects (client -> node), each
 * with the binary header of wire.h ("payload message headers"). */
#define KVS_NODE_PAYLOAD_AM_ID 2u

typedef struct kvs_node kvs_node;

typedef struct kvs_node_params {
    const kvs_server_config *config; /* tiers to serve; borrowed for kvs_node_create only */
    const kvs_remote_psk *psk;       /* copied */
    const char *listen_host;         /* IPv4 address or name */
    uint16_t listen_port;            /* 0: pick a free one (kvs_node_port) */
    uint32_t max_clients; /* authenticated sessions; connections beyond this are closed at accept */
    uint32_t
        max_handshakes; /* control connections not yet authenticated; more are closed at accept */
    int timeout_ms;     /* bound on each send and RMA transfer, and on a whole handshake */
    uint32_t max_sessions_per_tenant; /* sessions one tenant holds at once (0: max_clients) */
    uint64_t max_object_bytes; /* largest object stored or served; the size of a staging slot */
    uint32_t max_refusals;     /* refused messages a connection may send before it is closed */
    uint32_t
        busy_poll_us; /* kvs_ucx_params.busy_poll_us: poll UCX this long after work, then sleep */
    int shm_payloads; /* a client on this host that offers shared memory gets a UCX endpoint for
                         payloads that may use it (experimental; docs/remote.md) */
    int encrypt; /* every control connection is TLS 1.3 and every request and object of a session
                    goes on it; plain connections and requests over UCX are refused */
    const char *metrics_listen; /* HOST:PORT of the Prometheus endpoint (docs/node.md); NULL: off */
    const char *metrics_name;   /* the instance's shared segment (common/metrics.h) */
} kvs_node_params;

/* Node counters since create; also printed as the final stats line. */
typedef struct kvs_node_stats {
    uint64_t connections; /* accepted */
    uint64_t rejected;    /* closed at accept: over max_clients or max_handshakes, or no fd left */
    uint64_t
        handshake_refusals; /* control connections closed for bad bytes, size, order or early EOF */
    uint64_t handshake_timeouts; /* control connections closed at the handshake deadline */
    uint64_t unknown_sessions;   /* UCX requests dropped because they named no live session */
    uint64_t auth_ok;
    uint64_t auth_failures;
    uint64_t refusals; /* ERROR replies for malformed or out-of-state messages */
    uint64_t lookups;  /* keys asked by LOOKUP */
    uint64_t hits;     /* keys found by LOOKUP or GET */
    uint64_t misses;
    uint64_t gets;             /* keys asked by GET */
    uint64_t puts;             /* objects stored */
    uint64_t deletes;          /* keys removed */
    uint64_t bytes_in;         /* object bytes stored */
    uint64_t bytes_out;        /* object bytes written to clients */
    uint64_t late_puts;        /* objects not stored: read at or after their PUT's read-by time */
    uint64_t payloads_refused; /* payload messages dropped: bad header, no session, no room */
    uint64_t quota_evictions;  /* objects removed to keep their tenant within its share */
} kvs_node_stats;

/* Tenants with traffic counters of their own: the first that authenticate; sessions of later ones
 * count together in one more row named KVS_NODE_OTHER_TENANT (never a tenant's name: tenants are
 * A-Z a-z 0-9 . _ -). Rows last as long as the node, so their counters never go backwards. */
#define KVS_NODE_TENANT_ROWS  64u
#define KVS_NODE_OTHER_TENANT "(other)"

/* One tenant's part of kvs_node_stats' traffic counters (same meanings). */
typedef struct kvs_node_tenant_stats {
    char tenant[KVS_WIRE_MAX_TENANT_BYTES + 1];
    uint64_t lookups, hits, misses, gets, puts, deletes, bytes_in, bytes_out;
} kvs_node_tenant_stats;

#endif
