/*
 * redis_internal.h - what the redis tier's files share: its state, its masters and their
 * connections, and the requests of one call. redis.c owns the state and the ops; redis_batch.c
 * runs one call's requests over the connections (the progress loop). Everything here is used under
 * the tier's lock. Files, bottom up: redis_nodes.c (servers, slot map, error sentence),
 * redis_batch.c (a call's requests), redis.c (the ops).
 */
#ifndef KVS_REDIS_INTERNAL_H
#define KVS_REDIS_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "redis.h"
#include "redis_conn.h"
#include "resp.h"
#include "slots.h"

#define REDIS_MAX_NODES   256        /* masters and seeds the tier keeps (a cluster of 128 x 2) */
#define REDIS_NO_NODE     UINT16_MAX /* a slot no master is known for */
#define REDIS_RBUF_BYTES  (256u << 10)
#define REDIS_KEY_BYTES   (5 + KVS_REDIS_MAX_TENANT + 1 + 32 + 1) /* kvs1:<tenant>:<hex>, NUL */
#define REDIS_HEAD_BYTES  192   /* the encoded command before a value: SET key $len */
#define REDIS_MAX_REPLY   65536 /* nodes of one non-GET reply (CLUSTER SLOTS of a big cluster) */
#define REDIS_MAX_VALUE   (512ull << 20) /* Redis's proto-max-bulk-len default */
#define REDIS_LARGE_VALUE (128u << 10)   /* a GET that may answer this much is read around rbuf */
#define REDIS_HEADER_READ 4096u

enum redis_op {
    OP_GET,
    OP_SET,
    OP_EXISTS,
    OP_DEL,
    OP_ASKING,
    OP_AUTH,
    OP_PING,
    OP_SLOTS,
    OP_DBSIZE,
    OP_INFO,
};

typedef struct redis_req redis_req;
struct redis_req {
    uint8_t op;
    uint8_t moved, asked; /* redirections followed (each at most once) */
    uint8_t done;
    uint8_t counted; /* one of the call's outstanding requests (an ASKING is not) */
    uint16_t slot;
    const char *head; /* the encoded command (or its part before the value) */
    uint32_t head_len;
    char inline_head[REDIS_HEAD_BYTES];
    const void *value; /* SET: the object, written straight from the caller's buffer */
    uint64_t value_len;
    void *dst; /* GET: where the value goes */
    uint64_t cap;
    uint64_t sent;   /* bytes of this request written so far */
    uint64_t weight; /* bytes it counts in flight (its value, or the most its reply can be) */
    kvs_status status;
    uint64_t len;              /* GET: the object's length */
    int64_t integer;           /* EXISTS, DEL, DBSIZE */
    uint64_t info_used_memory; /* INFO memory */
};

typedef struct redis_node redis_node;

typedef struct redis_conn {
    kvs_redis_conn io;
    redis_node *node;
    char *rbuf; /* REDIS_RBUF_BYTES: replies land here, except GET values (straight to dst) */
    size_t rstart, rend;
    redis_req **q; /* this call's requests on this connection, in the order sent */
    uint32_t q_len, q_cap, q_sent, q_done;
    uint64_t inflight;
    int in_body;               /* reading a GET value */
    int discard;               /* ... that does not fit the caller's buffer: read and dropped */
    uint64_t body_len;         /* its length */
    uint64_t body_got;         /* bytes of it read so far */
    int active;                /* in the call's list of connections */
    uint64_t wait_since_ns;    /* when the oldest unanswered request went, or the last reply came */
    uint32_t deferred;         /* answers owed to puts that already returned (read first) */
    uint32_t deferred_counted; /* of them, those the current call waits for */
    int ever_connected;        /* a later connect is a reconnect */
} redis_conn;

struct redis_node {
    kvs_redis_endpoint ep;
    redis_conn *conns; /* connections_per_node */
    uint32_t next_conn;
    uint64_t down_until_ns; /* 0: up (or never tried) */
    uint64_t backoff_ms;
    uint64_t down_since_ns; /* when it went down (0: up); for the line saying it is back */
    uint32_t down_attempts; /* connects that failed since */
    int is_master;          /* owns slots in the map now (standalone: the one node) */
    int is_seed;            /* named in the YAML: kept in the table for good */
};

typedef struct kvs_redis {
    kvs_redis_options opt; /* strings point into the copies below */
    char tier_name[64];
    const kvs_backend_host *host;
    uint64_t max_object_bytes;
    pthread_mutex_t mutex;
    SSL_CTX *tls;
    char tls_server_name[KVS_REDIS_HOST_BYTES];
    char user[256];
    char password[1024];
    size_t password_len;
    char prefix[8 + KVS_REDIS_MAX_TENANT]; /* "kvs1:<tenant>:" */
    size_t prefix_len;
    redis_node nodes[REDIS_MAX_NODES];
    uint32_t n_nodes;
    uint16_t *slot_owner; /* [KVS_REDIS_SLOTS] node index (cluster) */
    int refresh_due;
    int not_cluster; /* a node answered CLUSTER SLOTS: cluster support disabled */
    uint64_t refresh_after_ns;
    /* the current call */
    redis_conn **active;
    uint32_t n_active;
    uint64_t outstanding;
    uint64_t deadline_ns;
    /* usage, asked of the servers at most once a second */
    uint64_t usage_at_ns, usage_objects, usage_bytes;
    kvs_redis_stats_t stats;
    kvs_resp_node *reply_nodes; /* REDIS_MAX_REPLY */
    redis_req **extra;          /* ASKING requests of the current call */
    uint32_t n_extra, cap_extra;
    char last_error[512];
    char refusal[300]; /* the first NOPERM/WRONGPASS/NOAUTH answer, for the refusal at open */
} kvs_redis;

/* redis_nodes.c (the bottom: used by redis_batch.c and redis.c) */
/* Set the tier's last error and log it at level. */
void redis_error(kvs_redis *r, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The index of the node at "host:port" (or, from_config only, a unix socket path), added when it
 * is new; REDIS_NO_NODE when the table is full or the text is not such an endpoint. */
uint32_t redis_node_find_or_add(kvs_redis *r, const char *endpoint, int from_config);
/* Apply a CLUSTER SLOTS reply asked of node asked. */
void redis_apply_slots(kvs_redis *r, const kvs_resp_node *nodes, uint32_t n,
                       const redis_node *asked);

/* redis_batch.c */
/* Fill req as the command argv[0..argc) (and a value sent from the caller's buffer when value is
 * not NULL). KVS_EINVAL when it does not fit the inline head. */
kvs_status redis_req_init(redis_req *req, uint8_t op, uint32_t argc, const char *const *argv,
                          const size_t *lens, const void *value, uint64_t value_len);
/* Queue req on a connection of node (connecting it first, bounded by the call's deadline). A
 * node that is down or cannot be reached completes req at once with KVS_EIO. */
void redis_queue(kvs_redis *r, uint32_t node, redis_req *req);
/* Run the call's requests until every counted one is done or the deadline passes (then every
 * connection with requests unanswered is closed and its requests fail with KVS_ETIMEDOUT). */
void redis_run(kvs_redis *r);
/* Make the call wait for the answers owed to earlier puts on every connection that owes at least
 * at_least of them, until keep remain (a read: 1 and 0, so it sees what was put before it; puts:
 * a connection far behind catches up halfway, the pipeline never drains). */
void redis_wait_deferred(kvs_redis *r, uint32_t at_least, uint32_t keep);
/* Begin a call: deadline now + timeout_ms, no requests. */
void redis_call_begin(kvs_redis *r);
/* Close every connection of node and mark it down (backoff doubles to 5 s). */
void redis_node_down(kvs_redis *r, redis_node *node, const char *why);
void redis_conn_close(kvs_redis *r, redis_conn *c);

/* Run req alone on c (a new connection the call has queued nothing on) until it is answered or
 * the deadline passes (then c is closed). Its status, or KVS_EIO. */
kvs_status redis_conn_exec(kvs_redis *r, redis_conn *c, redis_req *req);

/* Authenticate a new connection (AUTH) before the call uses it: KVS_OK, or a refusal. */
kvs_status redis_conn_hello(kvs_redis *r, redis_conn *c);

#endif
