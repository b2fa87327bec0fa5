/* node.h - the kvstrata-node server: serves a tier chain (kvs_server_tiers_open,
 * abi/kvstrata_server.h) to remote-tier clients over UCX, speaking the wire protocol of
 * backends/ucx/wire.h after the PSK handshake of auth.h, which runs over a plain TCP control
 * connection (backends/ucx/control.h) before any UCX endpoint exists.
 *
 * Threading: a node and its transport belong to the thread that created it; no call is thread-safe.
 * kvs_node_run is the event loop: it returns when stop_fd (a signalfd or pipe) becomes readable. */
#ifndef KVS_NODE_H
#define KVS_NODE_H

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

/* Open the tiers, register the staging buffer, start listening. On failure *out is NULL and err
 * holds a sentence naming what failed. */
kvs_status kvs_node_create(const kvs_node_params *params, kvs_node **out, char *err,
                           size_t err_len);
/* The bound listener port. */
uint16_t kvs_node_port(const kvs_node *node);
uint32_t kvs_node_tier_count(const kvs_node *node);
/* Serve until stop_fd is readable (the caller drains it). Returns KVS_OK then. */
kvs_status kvs_node_run(kvs_node *node, int stop_fd);
/* Use master as the key tenants' keys derive from from now on (a rotation: SIGHUP re-reads the key
 * file); handshakes under way finish under the key they began with. Copied. */
void kvs_node_set_psk(kvs_node *node, const kvs_remote_psk *master);
void kvs_node_get_stats(const kvs_node *node, kvs_node_stats *out);
/* Close every connection, the transport and the tiers; wipe the key. NULL is a no-op. */
void kvs_node_destroy(kvs_node *node);

#endif
