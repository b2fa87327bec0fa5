/*
 * redis.h - the redis tier (`type: redis`, docs/redis.md): objects kept in Redis 7 or Valkey, one
 * server or a Redis Cluster, through kvstrata's own RESP2 client (resp.h, redis_conn.h).
 *
 * Options (YAML `nodes:` arrive first as repeated `node`; `tls: {...}` as `tls.<key>`):
 *   node                  host:port, [v6]:port or a unix socket path; standalone: exactly one,
 *                         cluster: seeds the slot map is asked from (at least one)
 *   mode                  standalone (default) | cluster
 *   tenant                the key namespace: keys are kvs1:<tenant>:<32 hex of the chunk key>
 *                         (default "default"; 1..64 of A-Z a-z 0-9 . _ -)
 *   timeout_ms            bound on every call; what is not answered by then is a miss (default 500)
 *   connections_per_node  1..16 (default 2); a batch's requests to a master are spread over them
 *   inflight_bytes        cap on bytes requested but not yet read back per connection (default
 *                         2 MiB; at least one request always goes), so a pipelined batch never
 *                         fills the server's reply buffers
 *   connect_backoff_ms    first wait before a failed master is tried again; doubles to 5 s
 *                         (default 100)
 *   user, password_file   AUTH; the file is checked like every key file (mode 0600, not a link)
 *   tls.ca_file           TLS on, with the servers' certificates checked against this CA
 *   tls.cert_file, tls.key_file   a client certificate (both or neither; key mode 0600)
 *   tls.server_name       the name certificates are checked against (default each node's host)
 *
 * Capabilities: THREAD_SAFE (one lock: calls run one at a time; a batch drives every master at
 * once from one progress loop), GET_MANY, REMOTE, SHARED. Failures are misses within timeout_ms:
 * a master that fails or is slow is marked down and tried again with backoff; MOVED updates the
 * slot and retries once (and refreshes the whole map, at most every 100 ms); ASK follows once.
 * A put returns once its bytes are written (KVS_EIO when they could not be); its answer is read by
 * a later call, and a read waits for the answers of the puts before it. A refusal (OOM, NOPERM) is
 * counted then; its object is a miss.
 * Pins are not leased (Redis has none): pin reports what is present.
 */
#ifndef KVS_REDIS_H
#define KVS_REDIS_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"

#define KVS_REDIS_MAX_SEEDS       64
#define KVS_REDIS_MAX_TENANT      64
#define KVS_REDIS_DEFAULT_TIMEOUT 500

typedef struct kvs_redis_options {
    const char *nodes[KVS_REDIS_MAX_SEEDS];
    uint32_t n_nodes;
    uint8_t cluster; /* mode: 0 standalone, 1 cluster */
    const char *tenant;
    uint64_t timeout_ms;
    uint32_t connections_per_node;
    uint64_t inflight_bytes;
    uint64_t connect_backoff_ms;
    const char *user;
    const char *password_file;
    const char *tls_ca_file, *tls_cert_file, *tls_key_file, *tls_server_name;
} kvs_redis_options;

/* Parse a tier's options into *o (strings borrowed from options). KVS_OK, or KVS_ECONFIG with a
 * sentence in why and the option at fault in refused. */
kvs_status kvs_redis_options_parse(const kvs_backend_option *options, uint64_t n_options,
                                   kvs_redis_options *o, char *why, size_t why_len, char *refused,
                                   size_t refused_len);

/* Counters of a tier made by kvs_redis_backend()->create (a snapshot, under the tier's lock). */
typedef struct kvs_redis_stats_t {
    uint32_t n_masters;    /* masters in the slot map (1 standalone) */
    uint32_t masters_down; /* marked down now */
    uint64_t gets, hits;   /* objects asked for, objects returned */
    uint64_t puts, puts_stored;
    uint64_t puts_refused_oom;   /* SETs Redis refused with OOM (maxmemory, noeviction) */
    uint64_t refused_noperm;     /* commands the ACL user may not run on these keys */
    uint64_t unavailable;        /* CLUSTERDOWN, LOADING, MASTERDOWN, TRYAGAIN answers */
    uint64_t failures;           /* connections closed on an error, an EOF or a bad reply */
    uint64_t timeouts;           /* calls that ran out of timeout_ms with requests unanswered */
    uint64_t reconnects;         /* connections made again after a failure */
    uint64_t moved, asked;       /* redirections followed */
    uint64_t slot_map_refreshes; /* CLUSTER SLOTS asked and applied */
    uint64_t protocol_errors;    /* replies that were not RESP2 or broke a bound */
    uint64_t max_inflight_bytes; /* the most bytes one connection had requested and not read */
    uint64_t bytes_read, bytes_written;
    uint64_t polls; /* waits of the progress loop: about one per reply, never a spin */
} kvs_redis_stats_t;

kvs_status kvs_redis_stats(void *state, kvs_redis_stats_t *out);

/* The redis backend's ops table (static storage). */
const kvs_backend_ops *kvs_redis_backend(void);

#endif
