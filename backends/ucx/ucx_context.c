/* ucx_context.c - the transport's UCP context and worker (see ucx_transport.h): create and destroy,
 * events, and making and closing connections (endpoints). It stands on ucx_transport.c, delivers
 * the messages of ucx_am.c and releases what ucx_rma.c registered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "ucx_transport_internal.h"

/* ---- a new connection's state ------------------------------------------------------------- */

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
    kvs_ucx_conn *conn = arg;
    (void)ep;
    if (conn->dead) return;
    conn->dead = 1;
    kvs_fmt(conn->why, sizeof conn->why, "peer %s failed: %s", conn->peer,
            ucs_status_string(status));
    kvs_log(conn->t->log_level, KVS_LOG_INFO, "ucx \"%s\": %s", conn->t->name, conn->why);
}

static kvs_ucx_conn *conn_new(kvs_ucx_transport *t, const char *peer) {
    kvs_ucx_conn *conn = calloc(1, sizeof *conn);
    if (!conn) return NULL;
    conn->t = t;
    conn->watch_fd = -1;
    kvs_fmt(conn->peer, sizeof conn->peer, "%s", peer);
    kvs_fmt(conn->transports, sizeof conn->transports, "unknown");
    return conn;
}

static void conn_link(kvs_ucx_conn *conn) {
    conn->next = conn->t->conns;
    conn->t->conns = conn;
}

/* ---- events ---------------------------------------------------------------------------------- */

kvs_status kvs_ucx_progress(kvs_ucx_transport *t) {
    if (!t) return KVS_EINVAL;
    ucx_progress_all(t);
    ucx_deliver_all(t);
    return KVS_OK;
}

kvs_status kvs_ucx_arm(kvs_ucx_transport *t) {
    if (!t) return KVS_EINVAL;
    /* Messages still queued after ucx_deliver_all are not ready yet (a rendezvous payload arriving, or
     * held behind one): their completion is UCX progress, which the armed event fd reports. So only
     * work done now asks the caller to come back, or a busy-wait would follow every large message. */
    unsigned n = ucx_progress_all(t);
    n += ucx_deliver_all(t);
    if (n > 0) return KVS_EAGAIN;
    if (ucx_busy_poll(t, ~0ull)) return KVS_EAGAIN;
    ucs_status_t st = ucp_worker_arm(t->worker);
    if (st == UCS_ERR_BUSY) return KVS_EAGAIN;
    return st == UCS_OK ? KVS_OK : KVS_EIO;
}

kvs_status kvs_ucx_wait(kvs_ucx_transport *t, int timeout_ms) {
    if (!t) return KVS_EINVAL;
    unsigned long long deadline = ucx_deadline_after(timeout_ms);
    for (;;) {
        unsigned n = ucx_progress_all(t);
        n += ucx_deliver_all(t);
        if (n > 0) return KVS_OK;
        if (kvs_now_ns() >= deadline) return KVS_ETIMEDOUT;
        ucx_sleep_until_event(t, deadline);
    }
}

/* ---- lifetime -------------------------------------------------------------------------------- */

/* UCX's TCP transport moves a message in segments of UCX_TCP_TX_SEG_SIZE (8K by default) and
 * receives into UCX_TCP_RX_SEG_SIZE buffers (64K), so a 1 MiB object crosses as 128 sends, each a
 * trip through UCX's progress; and RMA over TCP is emulated in those segments. Larger ones move
 * objects at 2.5-3x the rate (docs/benchmarks.md, kvs-bench-ucx). A value the user set in the
 * environment wins. The names are the transport's own (no "TCP_"): UCX applies a name it does not
 * know at its layer to each transport's configuration as it opens it, and only TCP's has these. */
static const struct {
    const char *name, *value;
} TCP_TUNING[] = {{"TX_SEG_SIZE", "256K"}, {"RX_SEG_SIZE", "1M"}};

static void tune_tcp(kvs_ucx_transport *t, ucp_config_t *config) {
    for (size_t i = 0; i < sizeof TCP_TUNING / sizeof TCP_TUNING[0]; i++) {
        char env[64];
        snprintf(env, sizeof env, "UCX_TCP_%s", TCP_TUNING[i].name);
        if (getenv(env)) continue;
        ucs_status_t st = ucp_config_modify(config, TCP_TUNING[i].name, TCP_TUNING[i].value);
        if (st != UCS_OK)
            kvs_log(t->log_level, KVS_LOG_DEBUG, "ucx \"%s\": cannot set %s=%s: %s", t->name, env,
                    TCP_TUNING[i].value, ucs_status_string(st));
    }
}

kvs_status kvs_ucx_create(const kvs_ucx_params *params, kvs_ucx_transport **out, char *err,
                          size_t err_len) {
    if (out) *out = NULL;
    if (!params || !out || params->struct_size < sizeof(kvs_ucx_params)) {
        kvs_fmt(err, err_len, "ucx: missing parameters or out pointer");
        return KVS_EINVAL;
    }
    kvs_status rc = KVS_EIO;
    ucs_status_t st;
    kvs_ucx_transport *t = calloc(1, sizeof *t);
    if (!t) {
        kvs_fmt(err, err_len, "ucx: no memory for a transport");
        return KVS_ENOMEM;
    }
    kvs_fmt(t->name, sizeof t->name, "%s", params->name ? params->name : "ucx");
    t->log_level = params->log_level;
    t->busy_poll_ns = (uint64_t)params->busy_poll_us * 1000ull;
    t->on_dead = params->on_dead;
    t->user = params->user;
    t->event_fd = -1;

    ucp_config_t *config = NULL;
    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": cannot read the UCX configuration (UCX_* variables): %s", t->name,
                ucs_status_string(st));
        goto fail;
    }
    tune_tcp(t, config);
    ucp_params_t cp;
    memset(&cp, 0, sizeof cp);
    cp.field_mask =
        UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    cp.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    cp.mt_workers_shared = 0;
    cp.name = t->name;
    st = ucp_init(&cp, config, &t->context);
    ucp_config_release(config);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": ucp_init failed: %s", t->name, ucs_status_string(st));
        goto fail;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(t->context, &wp, &t->worker);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": cannot create a worker: %s", t->name, ucs_status_string(st));
        goto fail_context;
    }
    st = ucp_worker_get_efd(t->worker, &t->event_fd);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": the worker has no event fd: %s", t->name, ucs_status_string(st));
        goto fail_worker;
    }
    *out = t;
    return KVS_OK;

fail_worker:
    ucp_worker_destroy(t->worker);
fail_context:
    ucp_cleanup(t->context);
fail:
    kvs_fmt(err, err_len, "%s", t->err);
    free(t);
    return rc;
}

void kvs_ucx_destroy(kvs_ucx_transport *t) {
    if (!t) return;
    while (t->conns) kvs_ucx_conn_close(t->conns);
    /* rendezvous receives whose connection closed complete with an error shortly */
    unsigned long long deadline = ucx_deadline_after(CLOSE_TIMEOUT_MS);
    for (message *m = t->queue_head; m; m = m->next)
        if (m->request) ucp_request_cancel(t->worker, m->request);
    for (;;) {
        int pending = 0;
        for (message *m = t->queue_head; m; m = m->next) pending |= m->request != NULL;
        if (!pending || kvs_now_ns() >= deadline) break;
        t->depth++;
        ucx_progress_all(t);
        ucx_sleep_until_event(t, deadline);
        t->depth--;
    }
    while (t->queue_head) {
        message *m = t->queue_head;
        t->queue_head = m->next;
        if (m->request) continue; /* still owned by UCX: leaking beats a use after free */
        if (m->payload)
            ucx_payload_end(t, m, NULL, KVS_EIO);
        else
            ucx_message_free(m);
    }
    while (t->mems) kvs_ucx_mem_deregister(t->mems);
    ucp_worker_destroy(t->worker);
    ucp_cleanup(t->context);
    free(t);
}

const char *kvs_ucx_last_error(const kvs_ucx_transport *t) {
    return t ? t->err : "no transport";
}
int kvs_ucx_event_fd(const kvs_ucx_transport *t) {
    return t ? t->event_fd : -1;
}

/* Wait until a new endpoint is wired up (its flush completes) or fails; closes it on failure. */
static kvs_status finish_connect(kvs_ucx_transport *t, kvs_ucx_conn *conn, int timeout_ms,
                                 kvs_ucx_conn **out) {
    const char *peer = conn->peer;
    /* The flush completes once the wire-up with the server did (or fails when it cannot). */
    ucp_request_param_t fp;
    memset(&fp, 0, sizeof fp);
    void *request = ucp_ep_flush_nbx(conn->ep, &fp);
    int timed_out;
    ucs_status_t st = ucx_request_wait(t, request, ucx_deadline_after(timeout_ms), &timed_out);
    if (timed_out) {
        char why[128];
        kvs_fmt(why, sizeof why, "no connection within %d ms", timeout_ms);
        ucx_fail_conn(conn, why);
        ucx_request_abandon(t, request);
        set_err(t, "ucx \"%s\": connect to %s: %s", t->name, peer, why);
        conn->dead_reported = 1;
        kvs_ucx_conn_close(conn);
        return KVS_ETIMEDOUT;
    }
    if (st != UCS_OK || conn->dead) {
        set_err(t, "ucx \"%s\": connect to %s failed: %s", t->name, peer,
                conn->dead ? conn->why : ucs_status_string(st));
        conn->dead_reported = 1;
        kvs_ucx_conn_close(conn);
        return KVS_EIO;
    }
    ucx_learn_transports(conn);
    *out = conn;
    return KVS_OK;
}

kvs_status kvs_ucx_worker_address(kvs_ucx_transport *t, void *buf, size_t cap, size_t *len_out) {
    if (!t || !len_out || (cap && !buf)) return KVS_EINVAL;
    ucp_address_t *addr = NULL;
    size_t len = 0;
    ucs_status_t st = ucp_worker_get_address(t->worker, &addr, &len);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": cannot get the worker address: %s", t->name, ucs_status_string(st));
        return KVS_EIO;
    }
    *len_out = len;
    kvs_status rc = KVS_OK;
    if (len > cap) {
        set_err(t, "ucx \"%s\": the worker address needs %zu bytes, the buffer has %zu", t->name,
                len, cap);
        rc = KVS_EOVERFLOW;
    } else {
        memcpy(buf, addr, len);
    }
    ucp_worker_release_address(t->worker, addr);
    return rc;
}

/* UCX unpacks a worker address trusting its bytes: a header naming an address version it does not
 * read trips an assertion that aborts the process (UCX 1.13 reads versions 1 and 2, 0 and 1 in the
 * low 4 bits of the first byte). So an address reaches ucp_ep_create only with one of those and at
 * least a header and a worker id (8 bytes) long. */
#define UCX_ADDRESS_VERSION_MASK 0x0fu
#define UCX_ADDRESS_VERSION_MAX  1u /* UCP_OBJECT_VERSION_V2 */

static kvs_status address_plausible(kvs_ucx_transport *t, const uint8_t *addr, size_t len,
                                    const char *peer) {
    unsigned version = addr[0] & UCX_ADDRESS_VERSION_MASK;
    size_t min = version == 0 ? 9 : 10; /* version 2's header is two bytes */
    if (version > UCX_ADDRESS_VERSION_MAX || len < min) {
        set_err(t,
                "ucx \"%s\": the worker address of %s is not one this UCX reads (%zu bytes, "
                "address version %u): refused before UCX sees it",
                t->name, peer ? peer : "a peer", len, version + 1);
        return KVS_EINVAL;
    }
    return KVS_OK;
}

kvs_status kvs_ucx_connect_address(kvs_ucx_transport *t, const void *addr, size_t len,
                                   const char *peer, int peer_errors, int timeout_ms,
                                   kvs_ucx_conn **out) {
    if (out) *out = NULL;
    if (!t || !addr || len == 0 || !out) return KVS_EINVAL;
    kvs_status ok = address_plausible(t, addr, len, peer);
    if (ok != KVS_OK) return ok;
    kvs_ucx_conn *conn = conn_new(t, peer ? peer : "worker address");
    if (!conn) {
        set_err(t, "ucx \"%s\": no memory to connect to %s", t->name,
                peer ? peer : "a worker address");
        return KVS_ENOMEM;
    }
    ucp_ep_params_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = addr;
    if (peer_errors) {
        p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        p.err_handler.cb = ep_error_cb;
        p.err_handler.arg = conn;
    } else {
        /* UCX 1.13 leaves shared-memory transports out of endpoints that ask for peer-failure
         * handling; the guard connection stands in for failure detection. */
        p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        conn->no_peer_errors = 1;
    }
    ucs_status_t st = ucp_ep_create(t->worker, &p, &conn->ep);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": cannot connect to the worker address of %s: %s", t->name,
                conn->peer, ucs_status_string(st));
        free(conn);
        return KVS_EIO;
    }
    conn_link(conn);
    return finish_connect(t, conn, timeout_ms, out);
}

static void conn_release(kvs_ucx_conn *conn, int force) {
    kvs_ucx_transport *t = conn->t;
    while (conn->rkeys) kvs_ucx_rkey_destroy(conn->rkeys);
    ucx_close_ep(conn, force || conn->dead);
    for (kvs_ucx_conn **pp = &t->conns; *pp; pp = &(*pp)->next) {
        if (*pp == conn) {
            *pp = conn->next;
            break;
        }
    }
    /* drop its undelivered messages; in-flight ones are dropped when they complete */
    message *prev = NULL;
    for (message *m = t->queue_head; m;) {
        message *next = m->next;
        if (m->conn == conn) {
            m->conn = NULL;
            m->orphaned = 1;
            if (!m->request) {
                if (prev)
                    prev->next = next;
                else
                    t->queue_head = next;
                if (t->queue_tail == m) t->queue_tail = prev;
                if (m->payload)
                    ucx_payload_end(t, m, NULL, KVS_EIO);
                else
                    ucx_message_free(m);
                m = next;
                continue;
            }
        }
        prev = m;
        m = next;
    }
    free(conn);
}

void kvs_ucx_conn_close(kvs_ucx_conn *conn) {
    if (conn) conn_release(conn, 0);
}

void kvs_ucx_conn_abort(kvs_ucx_conn *conn) {
    if (conn) conn_release(conn, 1);
}
