/* ucx_transport.c - what every part of the transport stands on (see the header for the contract):
 * deadlines, progressing the worker and sleeping on its events, waiting on requests, a connection's
 * failure and what is known of it. Requests are created without callbacks and polled, so a request
 * that outlives its timeout never calls back into freed memory. Above it: active messages in
 * ucx_am.c, RMA in ucx_rma.c, and the context, worker and connections' lifetime in ucx_context.c. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "ucx_transport_internal.h"

/* ---- small helpers --------------------------------------------------------------------------- */

unsigned long long ucx_deadline_after(int timeout_ms) {
    if (timeout_ms < 0) return ~0ull;
    return kvs_now_ns() + (unsigned long long)timeout_ms * 1000000ull;
}

/* 1 once a connection's guard died or its watched fd fired (the peer process exited). */
int ucx_guard_dead(const kvs_ucx_conn *conn) {
    if (conn->guard && conn->guard->dead) return 1;
    if (conn->watch_fd < 0) return 0;
    struct pollfd p = {.fd = conn->watch_fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* Sleep on the worker's event fd (and the watched connection's fd) until one fires or `deadline`
 * passes; returns at once when the worker has events pending (arm says busy). */
void ucx_sleep_until_event(kvs_ucx_transport *t, unsigned long long deadline) {
    if (ucx_busy_poll(t, deadline)) return;
    ucs_status_t st = ucp_worker_arm(t->worker);
    if (st == UCS_ERR_BUSY) return;
    int ms = -1;
    if (deadline != ~0ull) {
        unsigned long long now = kvs_now_ns();
        if (now >= deadline) return;
        unsigned long long left = (deadline - now + 999999ull) / 1000000ull;
        ms = left > 60000ull ? 60000 : (int)left;
    }
    struct pollfd p[2] = {{.fd = t->event_fd, .events = POLLIN}, {.fd = -1, .events = POLLIN}};
    if (t->watch) p[1].fd = t->watch->watch_fd;
    (void)poll(p, 2, ms);
}

unsigned ucx_progress_all(kvs_ucx_transport *t) {
    unsigned n = 0, k;
    while ((k = ucp_worker_progress(t->worker)) != 0) n += k;
    if (n && t->busy_poll_ns) t->last_work_ns = kvs_now_ns();
    return n;
}

/* Within busy_poll_ns of the last progress, poll UCX instead of sleeping: returns 1 as soon as it
 * makes progress, 0 once the window (or the deadline) has passed with none. */
int ucx_busy_poll(kvs_ucx_transport *t, unsigned long long deadline) {
    if (!t->busy_poll_ns) return 0;
    for (;;) {
        unsigned long long now = kvs_now_ns();
        if (now >= deadline || now - t->last_work_ns >= t->busy_poll_ns) return 0;
        if (t->watch && ucx_guard_dead(t->watch)) return 1;
        if (ucx_progress_all(t)) return 1;
    }
}

/* Poll a callback-less request until it completes or the deadline passes. Completed requests are
 * freed; on timeout *timed_out is set and the request is left to the caller. */
ucs_status_t ucx_request_wait(kvs_ucx_transport *t, void *request, unsigned long long deadline,
                              int *timed_out) {
    *timed_out = 0;
    if (request == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
    ucs_status_t st;
    t->depth++;
    for (;;) {
        ucx_progress_all(t);
        st = ucp_request_check_status(request);
        if (st != UCS_INPROGRESS) break;
        if (kvs_now_ns() >= deadline || (t->watch && ucx_guard_dead(t->watch))) {
            *timed_out = 1;
            break;
        }
        ucx_sleep_until_event(t, deadline);
    }
    t->depth--;
    if (!*timed_out) ucp_request_free(request);
    return st;
}

/* A request that timed out: its endpoint is force-closed by now, which completes it with an error
 * soon; wait a little so its buffer is no longer touched, then release it either way. */
void ucx_request_abandon(kvs_ucx_transport *t, void *request) {
    if (request == NULL || UCS_PTR_IS_ERR(request)) return;
    int timed_out;
    if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(t->worker, request);
    ucs_status_t st =
        ucx_request_wait(t, request, ucx_deadline_after(CLOSE_TIMEOUT_MS), &timed_out);
    (void)st;
    if (timed_out) ucp_request_free(request);
}

void ucx_close_ep(kvs_ucx_conn *conn, int force) {
    kvs_ucx_transport *t = conn->t;
    if (!conn->ep) return;
    if (conn->no_peer_errors && (force || conn->dead || ucx_guard_dead(conn))) {
        /* UCX cannot force-close an endpoint without peer-failure handling, and a graceful close to
         * a dead peer never completes: leave the endpoint to UCX until the worker is destroyed. */
        kvs_log(t->log_level, KVS_LOG_DEBUG, "ucx \"%s\": endpoint to %s left to UCX (peer gone)",
                t->name, conn->peer);
        conn->ep = NULL;
        return;
    }
    ucp_request_param_t param;
    memset(&param, 0, sizeof param);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void *request = ucp_ep_close_nbx(conn->ep, &param);
    int timed_out;
    ucs_status_t st =
        ucx_request_wait(t, request, ucx_deadline_after(CLOSE_TIMEOUT_MS), &timed_out);
    /* Either way the endpoint handle is no longer ours: UCX releases it when the close completes. */
    if (timed_out) ucp_request_free(request);
    if (timed_out || st != UCS_OK)
        kvs_log(t->log_level, KVS_LOG_DEBUG, "ucx \"%s\": close of %s: %s", t->name, conn->peer,
                timed_out ? "timed out" : ucs_status_string(st));
    conn->ep = NULL;
}

/* Mark a connection dead with a reason and force-close its endpoint so every pending operation on
 * it completes with an error. */
void ucx_fail_conn(kvs_ucx_conn *conn, const char *why) {
    if (!conn->dead) {
        conn->dead = 1;
        kvs_fmt(conn->why, sizeof conn->why, "%s", why);
        kvs_log(conn->t->log_level, KVS_LOG_WARN, "ucx \"%s\": connection to %s is dead: %s",
                conn->t->name, conn->peer, why);
    }
    ucx_close_ep(conn, 1);
}

kvs_ucx_conn *ucx_conn_of_ep(kvs_ucx_transport *t, ucp_ep_h ep) {
    for (kvs_ucx_conn *c = t->conns; c; c = c->next)
        if (c->ep == ep) return c;
    return NULL;
}

/* Transport names from ucp_ep_print_info's lane lines ("lane[0]:  2:tcp/lo.0 md[1] ..."): 1.13 has
 * no ucp_ep_query field for them. */
void ucx_learn_transports(kvs_ucx_conn *conn) {
    kvs_ucx_transport *t = conn->t;
    if (conn->transports_known || !conn->ep || conn->dead) return;
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    if (!f) return;
    ucp_ep_print_info(conn->ep, f);
    fclose(f);
    char found[96] = "";
    int any = 0;
    for (char *line = text; line && *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        char *lane = strstr(line, "lane[");
        char *colon = lane ? strchr(lane, ':') : NULL;
        /* after "lane[N]:" comes "<rsc index>:<tl>/<device>" */
        char *tl = colon ? strchr(colon + 1, ':') : NULL;
        if (tl) {
            tl++;
            size_t n = strcspn(tl, "/ ");
            char name[32];
            if (n > 0 && n < sizeof name) {
                memcpy(name, tl, n);
                name[n] = '\0';
                /* count each transport once */
                char probe[40];
                kvs_fmt(probe, sizeof probe, "+%s+", name);
                char have[100];
                kvs_fmt(have, sizeof have, "+%s+", found);
                if (!strstr(have, probe)) {
                    size_t used = strlen(found);
                    kvs_fmt(found + used, sizeof found - used, "%s%s", used ? "+" : "", name);
                }
                any = 1;
            }
        }
        line = end ? end + 1 : NULL;
    }
    free(text);
    if (!any) return; /* not wired up yet; try again later */
    conn->transports_known = 1;
    kvs_fmt(conn->transports, sizeof conn->transports, "%s", found);
    /* The owner logs the choice with its context (which tier, which node, what the lane carries). */
    kvs_log(t->log_level, KVS_LOG_DEBUG, "ucx \"%s\": peer %s uses %s", t->name, conn->peer, found);
}

/* ---- what is known of a connection ---------------------------------------------------------- */

int kvs_ucx_conn_alive(const kvs_ucx_conn *conn) {
    return conn && !conn->dead && conn->ep && !ucx_guard_dead(conn);
}

void kvs_ucx_conn_watch_fd(kvs_ucx_conn *conn, int fd) {
    if (conn) conn->watch_fd = fd;
}

void kvs_ucx_conn_guard(kvs_ucx_conn *conn, kvs_ucx_conn *guard) {
    if (conn && conn != guard) conn->guard = guard;
}
const char *kvs_ucx_conn_peer(const kvs_ucx_conn *conn) {
    return conn ? conn->peer : "";
}
const char *kvs_ucx_conn_error(const kvs_ucx_conn *conn) {
    return conn ? conn->why : "";
}
void kvs_ucx_conn_set_user(kvs_ucx_conn *conn, void *user) {
    if (conn) conn->user = user;
}
void *kvs_ucx_conn_user(const kvs_ucx_conn *conn) {
    return conn ? conn->user : NULL;
}

int kvs_ucx_tls_slow(const char *list) {
    int any = 0;
    for (const char *p = list ? list : ""; *p;) {
        size_t n = strcspn(p, "+");
        if (!((n == 3 && strncmp(p, "tcp", 3) == 0) || (n == 4 && strncmp(p, "self", 4) == 0)))
            return 0;
        any = 1;
        p += n + (p[n] == '+');
    }
    return any;
}

int kvs_ucx_conn_is_slow(kvs_ucx_conn *conn) {
    if (!conn) return 0;
    ucx_learn_transports(conn);
    return conn->transports_known && kvs_ucx_tls_slow(conn->transports);
}

const char *kvs_ucx_conn_transports(kvs_ucx_conn *conn) {
    if (!conn) return "";
    ucx_learn_transports(conn);
    return conn->transports;
}
