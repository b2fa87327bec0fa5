/*
 * remote.h - the remote tier client: a backend (`type: remote`) that keeps objects in the DRAM of
 * kvstrata-node daemons over UCX (docs/remote.md, "Client tier").
 *
 * Options (YAML `nodes:` arrive first as repeated `node`):
 *   node                host:port of a kvstrata-node, at least one
 *   psk_file            the pre-shared key file (required; rules in auth.h)
 *   tenant              namespace on the nodes (required; 1..64 of [A-Za-z0-9._-])
 *   replicas            homes per key, 1..min(8, nodes) (default 1)
 *   timeout_ms          bound on every operation (default 2000)
 *   connect_backoff_ms  first reconnect delay of a down node; doubles to 30 s (default 100)
 *   shared_memory       auto (default): the tier tells nodes its host; a node on this host whose
 *                       first tier is a dram tier with shm_name names that tier, and gets copy
 *                       objects out of it here (puts into its free slabs, with replicas 1); a node started with --shared-memory-payloads on
 *                       (experimental: a client killed mid-transfer can stall the node's other
 *                       clients) also moves payloads over UCX shared memory; off: none of it,
 *                       payloads over the request connection (docs/remote.md)
 *   put_queue_mb        room for puts not yet confirmed by their nodes, MiB (default 64; at least
 *                       the largest object)
 *   payloads            auto | rma | messages | stream: how objects move (default auto: on the
 *                       session's TCP stream to a node UCX reaches over tcp only, where it
 *                       emulates RMA; RMA elsewhere; docs/remote.md, "Payloads")
 *   encrypt             true: each node's control connection is TLS 1.3 keyed from psk_file
 *                       (channel.h) and every request and object of the session goes on it
 *                       (payloads rma and messages refused); the nodes must run with encrypt
 *                       (default false)
 *   busy_poll_us        after UCX made progress the progress thread keeps polling it this many
 *                       microseconds before it sleeps (default 200; 0: sleep at once)
 *
 * Capabilities: THREAD_SAFE and GET_MANY. One progress thread owns the UCX transport; ops from any
 * thread queue a job for it and wait at most timeout_ms (KVS_ETIMEDOUT then). A put does not wait for
 * a node: it copies the object into the put queue and returns (waiting at most timeout_ms for room);
 * the thread sends the queued puts in batches, one request per node. Jobs run in the order they were
 * queued, so a lookup or get after a put sees it (if the node stored it). A node that fails is
 * marked down and reconnected in the background: its keys are misses, puts to it are dropped and
 * counted. Remote objects are not leased: pin only counts present keys. Without UCX in the build,
 * create fails with KVS_ENOTSUP.
 */
#ifndef KVS_REMOTE_H
#define KVS_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "hashring.h"

#define KVS_REMOTE_DEFAULT_TIMEOUT_MS   2000u
#define KVS_REMOTE_DEFAULT_BACKOFF_MS   100u
#define KVS_REMOTE_MAX_BACKOFF_MS       30000u
#define KVS_REMOTE_DEFAULT_PUT_QUEUE_MB 64u
#define KVS_REMOTE_HOST_BYTES           96u

/* Parsed options. Strings point into the options given to kvs_remote_options_parse. */
typedef struct kvs_remote_options {
    char hosts[KVS_REMOTE_RING_MAX_NODES][KVS_REMOTE_HOST_BYTES]; /* NUL-terminated */
    uint16_t ports[KVS_REMOTE_RING_MAX_NODES];
    const char *ids[KVS_REMOTE_RING_MAX_NODES]; /* "host:port" as written */
    uint32_t n_nodes;
    const char *psk_file;
    const char *tenant;
    uint32_t replicas;
    uint32_t timeout_ms;
    uint32_t connect_backoff_ms;
    int shared_memory;     /* 1 (auto): tell nodes this host (AUTH's host id and pid) */
    int payloads;          /* KVS_REMOTE_PAYLOADS_*: how objects move */
    uint32_t busy_poll_us; /* the progress thread polls UCX this long after work before sleeping */
    uint32_t put_queue_mb;
    int encrypt; /* every node's control connection over TLS, every request and object on it */
} kvs_remote_options;

#define KVS_REMOTE_DEFAULT_BUSY_POLL_US 200u

/* payloads: auto (stream where the node's payload path is tcp only, RMA elsewhere), rma (the node
 * reads and writes the tier's registered memory), messages (objects travel as UCX payload messages
 * the receiver places), stream (objects on the session's control connection, stream.h). */
enum {
    KVS_REMOTE_PAYLOADS_AUTO,
    KVS_REMOTE_PAYLOADS_RMA,
    KVS_REMOTE_PAYLOADS_MESSAGES,
    KVS_REMOTE_PAYLOADS_STREAM
};

/* Strict parse: KVS_ECONFIG and a sentence in why (listing the valid options for an unknown one). */
kvs_status kvs_remote_options_parse(const kvs_backend_option *options, uint64_t n_options,
                                    kvs_remote_options *o, char *why, size_t why_len);

/* The same, also naming what a refusal is about in refused (an option's name, `node[k]` for the k-th
 * node; see kvs_backend_init.error_option). refused may be NULL. */
kvs_status kvs_remote_options_parse_named(const kvs_backend_option *options, uint64_t n_options,
                                          kvs_remote_options *o, char *why, size_t why_len,
                                          char *refused, size_t refused_len);

/* Counters of a tier made by kvs_remote_backend()->create (thread-safe snapshot). */
typedef struct kvs_remote_stats_t {
    uint32_t n_nodes;
    uint32_t nodes_up;     /* connected and authenticated now */
    uint64_t puts_queued;  /* puts accepted into the put queue */
    uint64_t put_requests; /* PUT messages sent: queued puts go out in batches, one per node */
    uint64_t puts_stored;  /* copies a node confirmed, and copies put into its shared tier here */
    uint64_t puts_refused; /* copies a node answered with an error (full, bad key) */
    uint64_t
        puts_dropped; /* copies lost: home node down or failing mid-put, queue full, deadline passed */
    uint64_t node_failures;  /* times a node was marked down */
    uint64_t reconnects;     /* successful reconnects after a failure */
    uint64_t auth_refusals;  /* handshakes a node refused */
    uint64_t rma_gets;       /* objects the node wrote straight into the staging pool */
    uint64_t bounce_gets;    /* objects that went through the bounce buffer */
    uint64_t message_gets;   /* objects received as payload messages, straight into place */
    uint64_t late_payloads;  /* objects still arriving into a caller's buffer after its get ended */
    uint32_t nodes_messages; /* nodes up whose objects travel as payload messages */
    uint64_t stream_gets;    /* objects read off the session's stream, straight into place */
    uint32_t nodes_stream;   /* nodes up whose objects travel on the session's stream */
    uint32_t nodes_shared_memory; /* nodes up whose payloads run over shared memory (same host) */
    uint32_t nodes_shared_tier;   /* nodes whose shared DRAM tier this tier attached (same host) */
    uint64_t shared_tier_gets;    /* objects copied out of an attached shared tier */
    uint64_t shared_tier_puts;    /* objects copied into an attached shared tier (not queued) */
} kvs_remote_stats_t;

/* The remote backend's ops table (static storage). */
const kvs_backend_ops *kvs_remote_backend(void);
kvs_status kvs_remote_stats(void *state, kvs_remote_stats_t *out);
/* Wait (at most 2 x timeout_ms) until every put queued before the call is confirmed or dropped. */
kvs_status kvs_remote_flush(void *state);

/* Implemented by ucx_remote.c (or refused without UCX); used by the ops table in remote.c. */
kvs_status kvs_remote_create(const kvs_backend_init *init, const kvs_remote_options *o,
                             void **state);
void kvs_remote_destroy(void *state);
const char *kvs_remote_last_error(void *state);
kvs_status kvs_remote_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present);
kvs_status kvs_remote_get_many(void *state, const kvs_key *keys, void *const *dsts,
                               const uint64_t *caps, uint64_t n, uint64_t *lens,
                               kvs_status *statuses);
kvs_status kvs_remote_put(void *state, const kvs_key *key, const void *object, uint64_t len);
kvs_status kvs_remote_remove(void *state, const kvs_key *key);
kvs_status kvs_remote_usage(void *state, uint64_t *n_objects, uint64_t *bytes);

#endif
