/*
 * ucx_remote_state.h - the remote tier's state, shared by its files, nothing public: the tier
 * (remote), its nodes (rnode) and its queued jobs (job). Ops on any thread queue jobs
 * (ucx_remote.c); the one progress thread runs them (ucx_remote_progress.c) and keeps the node
 * connections (ucx_remote_nodes.c). Each file's calls are in its own header.
 */
#ifndef KVS_UCX_REMOTE_STATE_H
#define KVS_UCX_REMOTE_STATE_H

#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include "auth.h"
#include "common/clock.h"
#include "control.h"
#include "hashring.h"
#include "remote.h"
#include "ucx_transport.h"
#include "wire.h"

#define REMOTE_AM_ID   1u          /* the id kvstrata-node speaks (tools/node/node.h) */
#define PAYLOAD_AM_ID  2u          /* objects as payload messages (KVS_NODE_PAYLOAD_AM_ID) */
#define BOUNCE_DEFAULT (16u << 20) /* when the connector gives no max_object_bytes */
#define ERROR_BYTES    512u

/* PUTs on a node's stream sent before their answers are read (payloads: stream) */
#define STREAM_PUTS_IN_FLIGHT 8u

#define PUT_BATCH_BYTES \
    (KVS_WIRE_MAX_MESSAGE_BYTES - 16384u) /* budget of one PUT message's entries */

/* A GET key's object sent as a payload message: not asked so, asked, placed in the caller's
 * buffer (in flight), landed, failed in transfer, settled (await_landings). */
enum { LANDING_NONE, LANDING_ASKED, LANDING_PLACED, LANDING_OK, LANDING_FAILED, LANDING_DONE };
enum { JOB_LOOKUP, JOB_GET, JOB_PUT, JOB_DELETE, JOB_STATS, JOB_FLUSH };
/* A node's handshake, driven without blocking by the progress thread (handshake_advance) so a node
 * that answers slowly or not at all never holds up requests to the others. */
enum {
    HS_NONE,
    HS_CONNECTING,
    HS_TLS, /* encrypt: the TLS handshake on the connection, before HELLO */
    HS_HELLO_SENT,
    HS_CHALLENGE,
    HS_AUTH_SENT,
    HS_OK,
    HS_REFUSED
};

typedef struct job {
    int kind;
    uint64_t n;
    kvs_key *keys;        /* n, a copy */
    uint8_t *present;     /* LOOKUP: n */
    uint64_t *lens;       /* GET: n */
    kvs_status *statuses; /* GET, DELETE: n */
    void *const *dsts;    /* GET: dst_copy (the buffers are the caller's) */
    void **dst_copy;      /* GET: n, the caller's destination pointers, copied */
    const uint64_t *caps; /* GET: copied into cap */
    uint64_t *cap;
    uint8_t *resolved;    /* n: answered (hit, miss or error) */
    uint8_t *landed;      /* GET n: a payload message's state (LANDING_*) */
    uint32_t inflight;    /* GET: payload messages placed in the caller's buffers, not yet landed */
    uint64_t stream_hits; /* GET: objects read off nodes' streams */
    uint64_t *off;        /* GET: n, offset in the bounce buffer, UINT64_MAX when direct */
    const void *object;   /* PUT: the copy in the put queue */
    uint64_t len;
    uint64_t queue_span; /* PUT: bytes of the put queue this job holds (with any wrap-around gap) */
    uint64_t objects, bytes; /* STATS */
    uint64_t deadline_ns;
    kvs_status status;
    int done, abandoned;
    int detached; /* PUT: nobody waits; the thread frees it */
    struct job *next;
} job;

typedef struct rnode {
    uint32_t index;
    kvs_chan ctl;           /* the control connection (TCP or TLS): open while the session lives */
    kvs_control_reader *rd; /* its frames during the handshake */
    uint8_t token[KVS_WIRE_SESSION_TOKEN_BYTES]; /* AUTH_OK: the header of every request */
    kvs_ucx_conn *conn; /* requests: an endpoint to the node's worker address (from AUTH_OK) */
    int up;
    int conn_dead;
    int hs;
    uint64_t hs_deadline_ns; /* the whole handshake's, timeout_ms after it began */
    uint8_t nonce[KVS_WIRE_NONCE_BYTES];
    uint8_t challenge[KVS_WIRE_CHALLENGE_BYTES];
    uint8_t node_proof[KVS_WIRE_PROOF_BYTES];   /* CHALLENGE's: the transcript's next part */
    uint8_t client_proof[KVS_WIRE_PROOF_BYTES]; /* AUTH's */
    uint32_t pid;                               /* AUTH's (0: not sent) */
    char refusal[KVS_WIRE_MAX_ERROR_TEXT + 1];
    char payload_tls[KVS_WIRE_MAX_TRANSPORTS_TEXT +
                     1]; /* AUTH_OK: what the node's RMA to us runs over */
    uint64_t backoff_ms;
    uint64_t next_attempt_ns;
    int was_up;
    uint64_t down_since_ns;  /* when an outage began (0: none), for the lines that follow it */
    uint64_t down_logged_ns; /* the last "still down" line */
    uint32_t down_attempts;  /* connects that failed since */
    int shared_memory;       /* up, and its payloads run over something other than tcp */
    int messages;            /* up, and its objects travel as payload messages (payloads option) */
    int stream;              /* up, and its GETs and PUTs go on the control connection (stream.h) */
    /* PUTs written on the stream whose PUT_REPLY is still to be read, oldest first: a PUT's bytes
     * are in the kernel once written, so its queue room is free and the next batch goes at once */
    uint32_t stream_out;
    uint64_t stream_out_id[STREAM_PUTS_IN_FLIGHT];
    uint32_t stream_out_n[STREAM_PUTS_IN_FLIGHT];
    /* The node's shared DRAM tier, attached (a dram backend state) while its session is up, when
     * the node is on this host and named it in AUTH_OK: set and cleared by the progress thread,
     * read by any thread between counting itself in and out of shared_readers
     * (ucx_remote_shared.c) */
    void *shared_tier;
    uint32_t shared_readers;
    uint64_t shared_shunned_until_ns; /* a get found its lock held past lock_timeout_ms: gets
                                         leave the shared tier to the node until then */
    uint64_t msg_request;             /* the GET whose payload messages may still land, else 0 */
    uint64_t read_by_ns; /* the read-by time of the PUT in flight to it (shared memory), else 0 */
    /* the one outstanding request of this node */
    int pending;
    uint64_t request_id;
    uint32_t n_batch;
    uint32_t *batch; /* KVS_WIRE_MAX_KEYS indices into the job's keys */
    int failed;      /* the batch's reply did not come or was an ERROR */
} rnode;

typedef struct remote {
    char name[64];
    kvs_remote_options opt;
    kvs_remote_psk psk;
    kvs_tls
        *tls; /* encrypt: the TLS context of every node's control connection (progress thread) */
    const kvs_backend_host *host;
    uint8_t *staging;
    uint64_t staging_len;
    uint64_t max_object_bytes;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t
        put_order; /* one put at a time takes queue room and queues: room is freed in order */
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    /* shared-tier gets and puts name their keys with one hasher (made at the first), one call at a
     * time: making one costs two digest contexts */
    pthread_mutex_t tenant_hasher_mutex;
    kvs_remote_tenant_hasher *tenant_hasher;
    int doorbell;
    job *head, *tail;
    int stopping;
    int ready; /* 1: started, -1: failed */
    kvs_status ready_status;
    char error[ERROR_BYTES];

    /* counters, under mutex */
    kvs_remote_stats_t stats;

    /* the put queue: a registered ring; puts copy their object in and return, the thread sends them
     * in batches and frees the room in queue order (head, used: under mutex) */
    uint8_t *queue;
    uint64_t queue_len, queue_head, queue_used;
    /* Room of finished puts not yet given back: a node on shared memory that did not answer may
     * read the queue without this process's help until queue_hold_until, so no room is reused
     * before then (docs/remote.md, "Shared memory on one host"). */
    uint64_t queue_held, queue_hold_until;
    kvs_ucx_mem *queue_mem;
    uint8_t queue_rkey[KVS_WIRE_MAX_RKEY_BYTES];
    uint32_t queue_rkey_len;
    job **put_jobs; /* the batch being sent: KVS_WIRE_MAX_KEYS */
    uint32_t n_put_jobs;

    /* owned by the progress thread */
    kvs_ucx_transport *t;
    kvs_ucx_mem *staging_mem;
    uint8_t *bounce;
    uint64_t bounce_len;
    kvs_ucx_mem *bounce_mem;
    uint8_t staging_rkey[KVS_WIRE_MAX_RKEY_BYTES], bounce_rkey[KVS_WIRE_MAX_RKEY_BYTES];
    uint32_t staging_rkey_len, bounce_rkey_len;
    uint8_t *worker_addr; /* sent in AUTH: the node makes its endpoint to us from it */
    size_t worker_addr_len;
    uint8_t host_id[KVS_REMOTE_HOST_ID_BYTES];
    int offer_shared_memory; /* shared_memory: auto and a host id: AUTH carries host_id and pid too */
    struct pollfd *pfds;     /* the idle poll: worker, doorbell, each node's control connection */
    kvs_remote_ring ring;
    rnode *nodes;
    uint64_t next_id;
    uint8_t *send_buf;
    kvs_wire_entry *entries;       /* for encoding */
    kvs_wire_entry *reply_entries; /* for decoding */
    kvs_ucx_am_out *sends;         /* a PUT's objects as payload messages: KVS_WIRE_MAX_KEYS */
    uint8_t *frame_buf;            /* a stream frame: KVS_WIRE_MAX_MESSAGE_BYTES + 4 */
    struct iovec *iov;             /* a stream transfer's objects: KVS_WIRE_MAX_KEYS + 1 */
    uint8_t (*send_headers)[KVS_WIRE_PUT_PAYLOAD_BYTES];
    job *current;
} remote;

static inline int ms_left(uint64_t deadline) {
    uint64_t now = kvs_now_ns();
    if (now >= deadline) return 0;
    uint64_t ms = (deadline - now + 999999ull) / 1000000ull;
    return ms > 600000 ? 600000 : (int)ms;
}

static inline const char *node_id(const remote *r, const rnode *nd) {
    return r->opt.ids[nd->index];
}

#endif
