/* metrics_http.h - the instance's HTTP endpoint: GET /metrics only, a few clients at once, each
 * request bounded in size and time, driven by the instance thread's poll loop (metrics.c). */
#ifndef KVS_METRICS_HTTP_H
#define KVS_METRICS_HTTP_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "abi/kvstrata.h"

#define KVS_MHTTP_CLIENTS     8
#define KVS_MHTTP_REQUEST_MAX 8192 /* a longer request head is answered 431 and closed */
#define KVS_MHTTP_TIMEOUT_MS  5000 /* a client that takes longer to ask and read is closed */

/* The body of GET /metrics: malloc'd text, or a status (answered 503). */
typedef kvs_status (*kvs_mhttp_render_fn)(void *ctx, char **text, size_t *len);

typedef struct kvs_mhttp_client {
    int fd;
    uint64_t deadline_ns;
    char req[KVS_MHTTP_REQUEST_MAX];
    size_t req_len;
    char *out; /* the response, being written */
    size_t out_len, out_off;
} kvs_mhttp_client;

#define KVS_MHTTP_ADDRS 4
#define KVS_MHTTP_ACCEPT_PAUSE_MS \
    1000 /* out of descriptors: the listener is left alone this long */
#define KVS_MHTTP_RESOLVE_RETRY_MS 30000

typedef struct kvs_mhttp {
    int listen_fd; /* -1 while another process serves */
    uint64_t accept_paused_until_ns;
    /* the listen address, resolved once (a name's lookup may wait on DNS) */
    int resolved;
    uint64_t resolve_after_ns;
    struct sockaddr_storage addrs[KVS_MHTTP_ADDRS];
    unsigned addr_lens[KVS_MHTTP_ADDRS];
    unsigned n_addrs;
    kvs_mhttp_client clients[KVS_MHTTP_CLIENTS];
    kvs_mhttp_render_fn render;
    void *ctx;
} kvs_mhttp;

void kvs_mhttp_init(kvs_mhttp *s, kvs_mhttp_render_fn render, void *ctx);
/* Tries to listen on "HOST:PORT": 0 when this process now serves, -1 (errno EADDRINUSE: another
 * process of the instance serves) otherwise. HOST is resolved at the first call only (a failed
 * lookup again after KVS_MHTTP_RESOLVE_RETRY_MS), so retries never wait on DNS. */
int kvs_mhttp_listen(kvs_mhttp *s, const char *listen);
/* The descriptors to poll into fds[cap] (at most 1 + KVS_MHTTP_CLIENTS); returns how many. The
 * listener is left out for KVS_MHTTP_ACCEPT_PAUSE_MS after an accept failed for want of descriptors
 * (a pending connection would otherwise wake the poll at once, again and again). */
size_t kvs_mhttp_pollfds(const kvs_mhttp *s, struct pollfd *fds, size_t cap);
/* Handles what poll reported for those fds (accept, read, answer, write, deadlines). Never blocks. */
void kvs_mhttp_step(kvs_mhttp *s, const struct pollfd *fds, size_t n);
/* Closes the listener and every client. */
void kvs_mhttp_close(kvs_mhttp *s);

#endif
