/* ucx_transport_internal.h - what the UCX transport's files share, nothing public: the structs
 * behind the handles of ucx_transport.h and the helpers that wait on requests. Same threading as
 * the transport: one thread per kvs_ucx_transport. */
#ifndef KVS_UCX_TRANSPORT_INTERNAL_H
#define KVS_UCX_TRANSPORT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "common/log.h"
#include "ucx_transport.h"

#define CLOSE_TIMEOUT_MS 1000 /* graceful endpoint close, then force */

typedef struct message {
    struct message *next;
    kvs_ucx_conn
        *conn; /* NULL: the sender is no connection of ours (the owner names it from the bytes) */
    int orphaned; /* its connection closed before delivery: dropped */
    uint16_t id;
    int ready;  /* bytes complete (or failed) */
    int failed; /* rendezvous receive failed; dropped at delivery */
    void *header;
    size_t header_len;
    void *data;
    size_t data_len;
    void *request; /* rendezvous receive still in flight */
    int payload;   /* a payload message: data is the owner's dst (or NULL: refused), not ours */
    void *cookie;  /* the place function's, for the landed call */
} message;

typedef struct am_slot {
    kvs_ucx_transport *t;
    uint16_t id;
    kvs_ucx_am_fn fn;
    kvs_ucx_place_fn place; /* payload messages: place and landed instead of fn */
    kvs_ucx_landed_fn landed;
    void *user;
} am_slot;

struct kvs_ucx_rkey {
    kvs_ucx_conn *conn;
    ucp_rkey_h rkey;
    kvs_ucx_rkey *next;
};

struct kvs_ucx_mem {
    kvs_ucx_transport *t;
    ucp_mem_h memh;
    kvs_ucx_mem *next;
};

struct kvs_ucx_conn {
    kvs_ucx_transport *t;
    ucp_ep_h ep; /* NULL once force-closed after a failure */
    int dead;
    int dead_reported;
    int transports_known; /* learned once wired up */
    int no_peer_errors; /* made without peer-failure handling (worker address): never force-closed */
    kvs_ucx_conn *guard; /* this connection is dead once the guard is (kvs_ucx_conn_guard) */
    int watch_fd;        /* ... or once this fd is readable (kvs_ucx_conn_watch_fd); -1: none */
    char peer[64];
    char transports[96];
    char why[256];
    void *user;
    kvs_ucx_rkey *rkeys;
    kvs_ucx_conn *next;
};

struct kvs_ucx_transport {
    ucp_context_h context;
    ucp_worker_h worker;
    int event_fd;
    int depth; /* > 0 inside a blocking call: events are queued, not delivered */
    int log_level;
    uint64_t busy_poll_ns; /* kvs_ucx_params.busy_poll_us */
    uint64_t last_work_ns; /* when UCX last made progress or delivered something */
    char name[64];
    kvs_ucx_dead_fn on_dead;
    void *user;
    kvs_ucx_conn *conns;
    kvs_ucx_conn *watch; /* during a transfer on it: stop waiting when its guard dies */
    kvs_ucx_mem *mems;
    message *queue_head, *queue_tail;
    am_slot am[KVS_UCX_MAX_AM_ID];
    char err[512];
};

#define set_err(t, ...) kvs_fmt((t)->err, sizeof(t)->err, __VA_ARGS__)

/* ---- shared helpers (ucx_transport.c) -------------------------------------------------------- */

/* The kvs_now_ns() instant timeout_ms from now; ~0 (never) for a negative timeout. */
unsigned long long ucx_deadline_after(int timeout_ms);
/* 1 once a connection's guard died or its watched fd fired (the peer process exited). */
int ucx_guard_dead(const kvs_ucx_conn *conn);
/* Progress the worker until it has nothing left to do; returns how much it did. */
unsigned ucx_progress_all(kvs_ucx_transport *t);
/* Within busy_poll_ns of the last progress, poll UCX instead of sleeping: 1 as soon as it makes
 * progress, 0 once the window (or the deadline) has passed with none. */
int ucx_busy_poll(kvs_ucx_transport *t, unsigned long long deadline);
/* Sleep on the worker's event fd (and the watched connection's fd) until one fires or deadline
 * passes; returns at once when the worker has events pending. */
void ucx_sleep_until_event(kvs_ucx_transport *t, unsigned long long deadline);
/* Poll a callback-less request until it completes or the deadline passes. Completed requests are
 * freed; on timeout *timed_out is set and the request is left to the caller. */
ucs_status_t ucx_request_wait(kvs_ucx_transport *t, void *request, unsigned long long deadline,
                              int *timed_out);
/* Release a request that timed out, once its (force-closed) endpoint completed it or after a grace.
 */
void ucx_request_abandon(kvs_ucx_transport *t, void *request);
/* Close a connection's endpoint (force: at once, without flushing), bounded by CLOSE_TIMEOUT_MS; a
 * dead endpoint without peer-failure handling is left to UCX. */
void ucx_close_ep(kvs_ucx_conn *conn, int force);
/* Mark a connection dead with a reason and force-close its endpoint. */
void ucx_fail_conn(kvs_ucx_conn *conn, const char *why);
/* The connection whose endpoint is ep, or NULL. */
kvs_ucx_conn *ucx_conn_of_ep(kvs_ucx_transport *t, ucp_ep_h ep);
/* Learn (once wired up) which UCX transports a connection's lanes use. */
void ucx_learn_transports(kvs_ucx_conn *conn);

/* ---- active messages (ucx_am.c), for ucx_context.c's events and teardown ----------------------- */

/* Free a queued message and its buffers. */
void ucx_message_free(message *m);
/* Tell the owner a payload message is over (conn NULL: its connection closed) and free it. */
void ucx_payload_end(kvs_ucx_transport *t, message *m, kvs_ucx_conn *conn, kvs_status st);
/* Deliver every deliverable message and death to the owner (none inside a blocking call); returns
 * how many. */
unsigned ucx_deliver_all(kvs_ucx_transport *t);

#endif
