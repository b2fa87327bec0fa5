/* ucx_transport.h - the UCX layer under the remote tier: one UCP context and worker per transport,
 * endpoints made from a peer's worker address (exchanged out of band, after authentication: UCX
 * parses nothing an unauthenticated peer sends), active messages (header + payload, eager or
 * rendezvous), memory registration with packed remote keys, and RMA get/put with timeouts.
 *
 * Threading: a transport and everything made from it (connections, memory, remote keys) belong to
 * the thread that created the transport (UCS_THREAD_MODE_SINGLE). No call is thread-safe; another
 * thread that wants to talk to a peer hands work to the owner through its own queue and wakes it.
 *
 * Events (message, dead connection) are delivered only from kvs_ucx_progress
 * and kvs_ucx_wait, never from inside a blocking call, so callbacks may call any kvs_ucx_ function,
 * blocking ones included. Every blocking call has a timeout; a timeout or a peer failure fails the
 * operation and marks the connection dead (later operations on it return KVS_EIO at once). */
#ifndef KVS_UCX_TRANSPORT_H
#define KVS_UCX_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

typedef struct kvs_ucx_transport kvs_ucx_transport; /* opaque */
typedef struct kvs_ucx_conn kvs_ucx_conn; /* one endpoint to one peer; owned by the transport */
typedef struct kvs_ucx_mem kvs_ucx_mem;   /* a registered caller buffer */
typedef struct kvs_ucx_rkey kvs_ucx_rkey; /* a peer's memory key, usable on one connection */

#define KVS_UCX_MAX_AM_ID 64u /* active-message ids are 0 .. KVS_UCX_MAX_AM_ID - 1 */

/* A message arrived. header and data are valid only during the call (the library frees them after).
 * conn is the connection it came on, or NULL when UCX names no connection of ours as the sender (a
 * peer's endpoint that UCX did not pair with ours): the owner then names the sender from the bytes. */
typedef void (*kvs_ucx_am_fn)(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                              const void *data, size_t data_len);
/* A connection failed or the peer closed it (`why` is a sentence). Reported once per connection; the
 * owner still calls kvs_ucx_conn_close to release it. */
typedef void (*kvs_ucx_dead_fn)(void *user, kvs_ucx_conn *conn, const char *why);

typedef struct kvs_ucx_params {
    uint32_t struct_size;    /* sizeof(kvs_ucx_params) */
    const char *name;        /* for messages ("kvstrata-node"); copied; NULL: "ucx" */
    int log_level;           /* KVS_LOG_*: failures at WARN, details at DEBUG */
    kvs_ucx_dead_fn on_dead; /* may be NULL */
    void *user;              /* passed to on_dead */
    /* After UCX made progress, keep polling it for up to this many microseconds before sleeping on
     * the event fd (blocking calls and kvs_ucx_arm): a transfer's next step (a rendezvous reply, the
     * next segment) usually comes within that, and each sleep and wake-up costs a few
     * microseconds on both sides. An idle transport sleeps once the window has passed. 0: never. */
    uint32_t busy_poll_us;
} kvs_ucx_params;

/* Create the context and worker. UCX reads its UCX_*
 * environment variables here. On failure *out is NULL and, when err is not NULL, err[0..err_len)
 * holds the sentence. */
kvs_status kvs_ucx_create(const kvs_ucx_params *params, kvs_ucx_transport **out, char *err,
                          size_t err_len);
/* Close every connection (force on dead peers), release remote keys and registrations the caller
 * left, destroy the worker and context. NULL is a no-op. */
void kvs_ucx_destroy(kvs_ucx_transport *t);
/* The last error sentence of this transport; valid until the next call on it. */
const char *kvs_ucx_last_error(const kvs_ucx_transport *t);
/* The worker's event fd: readable when kvs_ucx_progress has work. For the owner's own poll loop;
 * call kvs_ucx_progress when it fires and before sleeping on it again. */
int kvs_ucx_event_fd(const kvs_ucx_transport *t);

/* Arm the event fd before the owner sleeps on it in its own poll loop: KVS_OK when armed (the fd
 * fires on the next event), KVS_EAGAIN when events are already pending (progress instead). */
kvs_status kvs_ucx_arm(kvs_ucx_transport *t);
/* Progress without blocking and deliver pending events. Returns KVS_OK. */
kvs_status kvs_ucx_progress(kvs_ucx_transport *t);
/* Sleep on the event fd (no busy loop) until something happens or timeout_ms passes (-1: forever),
 * then progress and deliver events. KVS_OK when an event was delivered or UCX made progress,
 * KVS_ETIMEDOUT when nothing happened. */
kvs_status kvs_ucx_wait(kvs_ucx_transport *t, int timeout_ms);

/* Register the handler for active-message id `id` (replacing any earlier one; fn NULL removes it). */
kvs_status kvs_ucx_am_handler(kvs_ucx_transport *t, uint16_t id, kvs_ucx_am_fn fn, void *user);

/* This transport's worker address (for a peer's kvs_ucx_connect_address) into buf[0..cap); *len_out
 * gets its size. A too small buf returns KVS_EOVERFLOW with the needed size in *len_out. */
kvs_status kvs_ucx_worker_address(kvs_ucx_transport *t, void *buf, size_t cap, size_t *len_out);
/* Connect to a peer's worker address (learnt over an authenticated control connection), waiting at
 * most timeout_ms for the wire-up (the peer must progress its worker meanwhile). `peer` names it in
 * messages. *out is owned by the transport until kvs_ucx_conn_close.
 * peer_errors 1: UCP_ERR_HANDLING_MODE_PEER, a dead peer fails the connection (UCX 1.13 then picks
 * tcp only). peer_errors 0: UCX may pick shared memory (posix, cma) for a peer on this host, but the
 * endpoint has no peer-failure detection: a transfer to a dead peer hangs until its timeout, and a
 * dead endpoint is left to UCX rather than closed. Give it a guard (kvs_ucx_conn_guard) and a
 * watched fd so it fails as soon as those do. */
kvs_status kvs_ucx_connect_address(kvs_ucx_transport *t, const void *addr, size_t len,
                                   const char *peer, int peer_errors, int timeout_ms,
                                   kvs_ucx_conn **out);
/* Close a connection (gracefully when alive, bounded by a short timeout, forced otherwise), destroy
 * its remote keys and drop its undelivered messages. NULL is a no-op. */
void kvs_ucx_conn_close(kvs_ucx_conn *conn);
/* Close a connection at once, without flushing, as for a peer given up on. Unlike a graceful close
 * this retires the endpoint immediately, so requests the peer sends later (a stalled node that
 * resumes and reads the memory of a request this side timed out) find no endpoint and are dropped
 * by UCX instead of being answered through a failed one, which UCX 1.13 treats as fatal. */
void kvs_ucx_conn_abort(kvs_ucx_conn *conn);
/* 1 while the connection is usable, 0 once it failed, timed out, the peer went away or its guard
 * died. */
int kvs_ucx_conn_alive(const kvs_ucx_conn *conn);
/* Tie conn's life to guard's (both on one transport; the guard must outlive conn or be unset with
 * NULL first): once guard is dead, transfers on conn fail at once and conn is never closed. */
void kvs_ucx_conn_guard(kvs_ucx_conn *conn, kvs_ucx_conn *guard);
/* Also treat conn as dead once fd is readable (a pidfd of the peer process: it fires at exit);
 * waits on conn wake up when it fires. The caller keeps fd open while conn lives; -1 removes it. */
void kvs_ucx_conn_watch_fd(kvs_ucx_conn *conn, int fd);
/* "host:port" of the peer, for messages. Valid while the connection is. */
const char *kvs_ucx_conn_peer(const kvs_ucx_conn *conn);
/* The UCX transports carrying this connection ("tcp", "posix+cma", ...) as UCX reported them
 * once the connection was established; "unknown" before. Valid while the connection is. */
const char *kvs_ucx_conn_transports(kvs_ucx_conn *conn);
/* 1 when UCX reaches the peer over tcp only (RMA emulated over messages: a slow fallback the
 * owner should say loudly), 0 otherwise or while not yet known. */
int kvs_ucx_conn_is_slow(kvs_ucx_conn *conn);
/* The same test on a "+"-joined transport list (as kvs_ucx_conn_transports gives, or a peer sent):
 * 1 when it names nothing but tcp and self, 0 otherwise or when empty. */
int kvs_ucx_tls_slow(const char *list);
/* The dead connection's reason, or "" while alive. */
const char *kvs_ucx_conn_error(const kvs_ucx_conn *conn);
/* A pointer the owner keeps with the connection (NULL until set). */
void kvs_ucx_conn_set_user(kvs_ucx_conn *conn, void *user);
void *kvs_ucx_conn_user(const kvs_ucx_conn *conn);

/* Send header (up to a few hundred bytes) + data as one message with id `id` and wait for local
 * completion: both buffers are caller-owned and reusable on return. Small payloads go eager, large
 * ones rendezvous (UCX decides). */
kvs_status kvs_ucx_am_send(kvs_ucx_conn *conn, uint16_t id, const void *header, size_t header_len,
                           const void *data, size_t data_len, int timeout_ms);

/* ---- payload messages ---------------------------------------------------------------------
 * A payload message is an active message whose data the receiver places: when its header arrives
 * the transport asks the owner where the data goes (kvs_ucx_place_fn, inside UCX's progress: it
 * must not call any kvs_ucx_ function), receives the data straight there (a copy for small eager
 * messages, a rendezvous receive for large ones: no intermediate buffer), and tells the owner once
 * it has landed (kvs_ucx_landed_fn, delivered like any message, in order per connection). A place
 * function that answers NULL refuses the data: it is never written anywhere, and a large message's
 * send fails on the sender's side. */

/* Where the data_len bytes of a payload message go, or NULL to refuse them. *cookie (NULL before
 * the call) travels to the landed call. conn as in kvs_ucx_am_fn. */
typedef void *(*kvs_ucx_place_fn)(void *user, kvs_ucx_conn *conn, const void *header,
                                  size_t header_len, size_t data_len, void **cookie);
/* A payload message is over: st is KVS_OK when data_len bytes are in dst, KVS_EIO when the transfer
 * failed (dst's bytes are undefined), KVS_ENOTFOUND when place refused it (dst NULL), KVS_EIO with
 * conn NULL when its connection closed before delivery. Called exactly once per placed message,
 * except for a transfer still in flight when the transport is destroyed (UCX may still write dst:
 * it is never reported, so the owner never frees memory UCX writes). */
typedef void (*kvs_ucx_landed_fn)(void *user, kvs_ucx_conn *conn, const void *header,
                                  size_t header_len, void *dst, size_t data_len, void *cookie,
                                  kvs_status st);

/* Register the payload handlers of message id `id` (replacing a kvs_ucx_am_handler of the id). */
kvs_status kvs_ucx_payload_handler(kvs_ucx_transport *t, uint16_t id, kvs_ucx_place_fn place,
                                   kvs_ucx_landed_fn landed, void *user);

/* One message of kvs_ucx_am_send_many: its header, its data (inside mem when not NULL, else UCX
 * registers it on the fly for a rendezvous), and on return its own status. */
typedef struct kvs_ucx_am_out {
    const void *header;
    size_t header_len;
    const void *data;
    size_t data_len;
    kvs_ucx_mem *mem;
    kvs_status status; /* out: KVS_OK once sent (a rendezvous: the receiver has the data) */
} kvs_ucx_am_out;

/* Send n messages with id `id` on conn, all in flight at once, and return when every one is done
 * (buffers reusable). KVS_OK when all were sent; KVS_EIO when one or more failed (their status says
 * which: a receiver that refused a large message fails that message only); KVS_ETIMEDOUT when the
 * batch did not finish within timeout_ms, which kills the connection as kvs_ucx_get does. */
kvs_status kvs_ucx_am_send_many(kvs_ucx_conn *conn, uint16_t id, kvs_ucx_am_out *msgs, size_t n,
                                int timeout_ms);

/* Register [addr, addr + len) of a caller buffer for RMA; the buffer must outlive the registration. */
kvs_status kvs_ucx_mem_register(kvs_ucx_transport *t, void *addr, size_t len, kvs_ucx_mem **out);
/* Release a registration. NULL is a no-op. */
void kvs_ucx_mem_deregister(kvs_ucx_mem *mem);
/* Pack the registration's remote key into buf[0..cap) for a peer; *len_out gets its size. A too
 * small buf returns KVS_EOVERFLOW with the needed size in *len_out. */
kvs_status kvs_ucx_mem_pack(kvs_ucx_mem *mem, void *buf, size_t cap, size_t *len_out);
/* Unpack a peer's packed key for use on `conn`; the key is destroyed with the connection at the
 * latest (do not call kvs_ucx_rkey_destroy after kvs_ucx_conn_close). */
kvs_status kvs_ucx_rkey_unpack(kvs_ucx_conn *conn, const void *blob, size_t len,
                               kvs_ucx_rkey **out);
/* The same for a key from a peer that is not trusted with the process (a node's clients): one whose
 * layout promises more bytes than it has, or that UCX fails or crashes on when a child process
 * unpacks it first, is refused (KVS_ECORRUPT) before this process's UCX reads it. Costs a fork per
 * key: for keys that are cached. */
kvs_status kvs_ucx_rkey_unpack_untrusted(kvs_ucx_conn *conn, const void *blob, size_t len,
                                         kvs_ucx_rkey **out);
/* Destroy a remote key before its connection closes. NULL is a no-op. */
void kvs_ucx_rkey_destroy(kvs_ucx_rkey *rkey);

/* Read len bytes at the peer's remote_addr (inside the registration `rkey` came from) into local
 * buffer `local`, which `local_mem` registers (NULL: UCX registers it on the fly). Returns when the
 * bytes are in `local`, or with an error / KVS_ETIMEDOUT after timeout_ms (the connection is then
 * dead). */
kvs_status kvs_ucx_get(kvs_ucx_conn *conn, void *local, size_t len, kvs_ucx_mem *local_mem,
                       uint64_t remote_addr, kvs_ucx_rkey *rkey, int timeout_ms);
/* Write len bytes of `local` to the peer's remote_addr and flush: on KVS_OK the bytes are in the
 * peer's memory. Same timeout and failure rules as kvs_ucx_get. */
kvs_status kvs_ucx_put(kvs_ucx_conn *conn, const void *local, size_t len, kvs_ucx_mem *local_mem,
                       uint64_t remote_addr, kvs_ucx_rkey *rkey, int timeout_ms);

/* One transfer of a batch: len bytes between local (inside local_mem, or NULL: UCX registers it on
 * the fly) and the peer's remote_addr inside the registration rkey came from. */
typedef struct kvs_ucx_rma {
    void *local; /* a put only reads it */
    size_t len;
    kvs_ucx_mem *local_mem;
    uint64_t remote_addr;
    kvs_ucx_rkey *rkey;
} kvs_ucx_rma;

/* Run n gets (is_put 0) or puts (is_put 1) on one connection with all of them in flight at once,
 * and return when every one is done (puts: flushed, the bytes are in the peer's memory). One
 * failure fails the batch (KVS_EIO; which bytes arrived is unknown); the timeout covers the whole
 * batch and, when it passes, kills the connection as kvs_ucx_get does. */
kvs_status kvs_ucx_rma_many(kvs_ucx_conn *conn, int is_put, const kvs_ucx_rma *ops, size_t n,
                            int timeout_ms);

#endif
