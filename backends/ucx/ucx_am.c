/* ucx_am.c - the transport's active messages (see ucx_transport.h): a handler per message id, a
 * queue of received messages (rendezvous payloads completing in the background) delivered to the
 * owner in order per connection, and sends that wait for completion by a timeout. */
#include <stdlib.h>
#include <string.h>

#include "ucx_transport_internal.h"

void ucx_message_free(message *m) {
    free(m->header);
    if (!m->payload) free(m->data);
    free(m);
}

void ucx_payload_end(kvs_ucx_transport *t, message *m, kvs_ucx_conn *conn, kvs_status st) {
    am_slot *slot = &t->am[m->id];
    if (slot->landed)
        slot->landed(slot->user, conn, m->header, m->header_len, m->data, m->data_len, m->cookie,
                     st);
    ucx_message_free(m);
}

static void rndv_done(void *request, ucs_status_t status, size_t length, void *user_data);

/* Take a message's data into m->data: copied when UCX holds it already, received in the background
 * (rendezvous, rndv_done marks it ready) otherwise. */
static void receive_into(kvs_ucx_transport *t, message *m, void *data, size_t length, int rndv) {
    if (!rndv) {
        if (length) memcpy(m->data, data, length);
        m->ready = 1;
        return;
    }
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = rndv_done;
    p.user_data = m;
    void *request = ucp_am_recv_data_nbx(t->worker, data, m->data, length, &p);
    if (request == NULL) {
        m->ready = 1;
    } else if (UCS_PTR_IS_ERR(request)) {
        m->ready = 1;
        m->failed = 1;
    } else {
        m->request = request;
    }
}

static void queue_message(kvs_ucx_transport *t, message *m) {
    if (t->queue_tail)
        t->queue_tail->next = m;
    else
        t->queue_head = m;
    t->queue_tail = m;
}

/* A payload message's header arrived: ask the owner where its data goes and receive it there. */
static ucs_status_t payload_arrived(am_slot *slot, kvs_ucx_conn *conn, const void *header,
                                    size_t header_len, void *data, size_t length, int rndv) {
    kvs_ucx_transport *t = slot->t;
    message *m = calloc(1, sizeof *m);
    if (m && !(m->header = malloc(header_len ? header_len : 1))) {
        free(m);
        m = NULL;
    }
    if (!m) {
        kvs_log(t->log_level, KVS_LOG_ERROR, "ucx \"%s\": no memory for a %zu-byte payload from %s",
                t->name, length, conn ? conn->peer : "a peer");
        return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
    }
    m->conn = conn;
    m->id = slot->id;
    m->payload = 1;
    if (header_len) memcpy(m->header, header, header_len);
    m->header_len = header_len;
    m->data_len = length;
    m->data = slot->place(slot->user, conn, header, header_len, length, &m->cookie);
    ucs_status_t ret = UCS_OK;
    if (!m->data) {
        m->ready = 1;                     /* refused: the landed call says so */
        if (rndv) ret = UCS_ERR_CANCELED; /* the sender's send fails */
    } else {
        receive_into(t, m, data, length, rndv);
    }
    queue_message(t, m);
    return ret;
}

static void rndv_done(void *request, ucs_status_t status, size_t length, void *user_data) {
    message *m = user_data;
    (void)length;
    m->ready = 1;
    m->failed = status != UCS_OK;
    m->request = NULL;
    ucp_request_free(request);
}

static ucs_status_t am_recv_cb(void *arg, const void *header, size_t header_len, void *data,
                               size_t length, const ucp_am_recv_param_t *param) {
    am_slot *slot = arg;
    kvs_ucx_transport *t = slot->t;
    kvs_ucx_conn *conn = NULL;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
        conn = ucx_conn_of_ep(t, param->reply_ep);
    if (slot->place)
        return payload_arrived(slot, conn, header, header_len, data, length,
                               (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0);
    if (!slot->fn) {
        kvs_log(t->log_level, KVS_LOG_WARN,
                "ucx \"%s\": dropped message id %u of %zu bytes (no handler)", t->name, slot->id,
                length);
        return UCS_OK;
    }
    message *m = calloc(1, sizeof *m);
    if (m) {
        m->header = malloc(header_len ? header_len : 1);
        m->data = malloc(length ? length : 1);
    }
    if (!m || !m->header || !m->data) {
        if (m) ucx_message_free(m);
        kvs_log(t->log_level, KVS_LOG_ERROR, "ucx \"%s\": no memory for a %zu-byte message from %s",
                t->name, length, conn ? conn->peer : "a peer");
        return UCS_OK;
    }
    m->conn = conn;
    m->id = slot->id;
    if (header_len) memcpy(m->header, header, header_len);
    m->header_len = header_len;
    m->data_len = length;
    receive_into(t, m, data, length, (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0);
    queue_message(t, m);
    return UCS_OK;
}

static kvs_status set_handler(kvs_ucx_transport *t, uint16_t id, kvs_ucx_am_fn fn,
                              kvs_ucx_place_fn place, kvs_ucx_landed_fn landed, void *user);

kvs_status kvs_ucx_am_handler(kvs_ucx_transport *t, uint16_t id, kvs_ucx_am_fn fn, void *user) {
    return set_handler(t, id, fn, NULL, NULL, user);
}

kvs_status kvs_ucx_payload_handler(kvs_ucx_transport *t, uint16_t id, kvs_ucx_place_fn place,
                                   kvs_ucx_landed_fn landed, void *user) {
    if (!place != !landed) return KVS_EINVAL;
    return set_handler(t, id, NULL, place, landed, user);
}

static kvs_status set_handler(kvs_ucx_transport *t, uint16_t id, kvs_ucx_am_fn fn,
                              kvs_ucx_place_fn place, kvs_ucx_landed_fn landed, void *user) {
    if (!t) return KVS_EINVAL;
    if (id >= KVS_UCX_MAX_AM_ID) {
        set_err(t, "ucx \"%s\": message id %u is out of range (max %u)", t->name, id,
                KVS_UCX_MAX_AM_ID - 1);
        return KVS_EINVAL;
    }
    am_slot *slot = &t->am[id];
    slot->t = t;
    slot->id = id;
    slot->fn = fn;
    slot->place = place;
    slot->landed = landed;
    slot->user = user;
    ucp_am_handler_param_t p;
    memset(&p, 0, sizeof p);
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                   UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.id = id;
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    p.cb = fn || place ? am_recv_cb : NULL;
    p.arg = slot;
    ucs_status_t st = ucp_worker_set_am_recv_handler(t->worker, &p);
    if (st != UCS_OK) {
        set_err(t, "ucx \"%s\": cannot set the handler of message id %u: %s", t->name, id,
                ucs_status_string(st));
        return KVS_EIO;
    }
    return KVS_OK;
}

kvs_status kvs_ucx_am_send(kvs_ucx_conn *conn, uint16_t id, const void *header, size_t header_len,
                           const void *data, size_t data_len, int timeout_ms) {
    if (!conn || (header_len && !header) || (data_len && !data)) return KVS_EINVAL;
    kvs_ucx_transport *t = conn->t;
    if (conn->dead || !conn->ep) {
        set_err(t, "ucx \"%s\": cannot send to %s: %s", t->name, conn->peer, conn->why);
        return KVS_EIO;
    }
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    void *request = ucp_am_send_nbx(conn->ep, id, header, header_len, data, data_len, &p);
    int timed_out;
    ucs_status_t st = ucx_request_wait(t, request, ucx_deadline_after(timeout_ms), &timed_out);
    char size[32];
    kvs_fmt_bytes(size, sizeof size, data_len);
    if (timed_out) {
        char why[160];
        kvs_fmt(why, sizeof why, "a %s message (id %u) was not sent within %d ms", size, id,
                timeout_ms);
        ucx_fail_conn(conn, why);
        ucx_request_abandon(t, request);
        set_err(t, "ucx \"%s\": send to %s: %s", t->name, conn->peer, why);
        return KVS_ETIMEDOUT;
    }
    if (st != UCS_OK || conn->dead) {
        set_err(t, "ucx \"%s\": send of a %s message to %s failed: %s", t->name, size, conn->peer,
                conn->dead ? conn->why : ucs_status_string(st));
        return KVS_EIO;
    }
    return KVS_OK;
}

/* Issue msgs[0..n) on conn as messages `id`, each request kept in requests[]; stops at the first
 * UCX refuses (its status returned). *issued: how many were issued. */
static ucs_status_t am_issue(kvs_ucx_conn *conn, uint16_t id, const kvs_ucx_am_out *msgs, size_t n,
                             void **requests, size_t *issued) {
    for (*issued = 0; *issued < n; (*issued)++) {
        const kvs_ucx_am_out *o = &msgs[*issued];
        ucp_request_param_t p;
        memset(&p, 0, sizeof p);
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_AM_SEND_FLAG_REPLY;
        if (o->mem) {
            p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            p.memh = o->mem->memh;
        }
        void *request =
            ucp_am_send_nbx(conn->ep, id, o->header, o->header_len, o->data, o->data_len, &p);
        if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
        requests[*issued] = request;
    }
    return UCS_OK;
}

/* n messages (size: for the sentence) not sent within timeout_ms: the connection fails, the
 * requests still in flight (requests[waited..issued)) are abandoned, and requests is freed. */
static kvs_status am_timed_out(kvs_ucx_conn *conn, void **requests, size_t waited, size_t issued,
                               size_t n, const char *size, int timeout_ms) {
    kvs_ucx_transport *t = conn->t;
    char why[160];
    if (ucx_guard_dead(conn))
        kvs_fmt(why, sizeof why, "%s died during %zu messages of %s", conn->guard->peer, n, size);
    else
        kvs_fmt(why, sizeof why, "%zu messages of %s were not sent within %d ms", n, size,
                timeout_ms);
    ucx_fail_conn(conn, why);
    for (size_t i = waited; i < issued; i++) ucx_request_abandon(t, requests[i]);
    free(requests);
    set_err(t, "ucx \"%s\": %s: %s", t->name, conn->peer, why);
    return KVS_ETIMEDOUT;
}

kvs_status kvs_ucx_am_send_many(kvs_ucx_conn *conn, uint16_t id, kvs_ucx_am_out *msgs, size_t n,
                                int timeout_ms) {
    if (!conn || (n && !msgs)) return KVS_EINVAL;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if ((msgs[i].header_len && !msgs[i].header) || (msgs[i].data_len && !msgs[i].data))
            return KVS_EINVAL;
        msgs[i].status = KVS_EIO;
        total += msgs[i].data_len;
    }
    if (n == 0) return KVS_OK;
    kvs_ucx_transport *t = conn->t;
    char size[32];
    kvs_fmt_bytes(size, sizeof size, total);
    if (ucx_guard_dead(conn) && !conn->dead)
        ucx_fail_conn(conn, "the peer died (its guard connection or process)");
    if (conn->dead || !conn->ep) {
        set_err(t, "ucx \"%s\": cannot send %zu messages to %s: %s", t->name, n, conn->peer,
                conn->why);
        return KVS_EIO;
    }
    void **requests = calloc(n, sizeof *requests);
    if (!requests) {
        set_err(t, "ucx \"%s\": no memory for %zu messages", t->name, n);
        return KVS_ENOMEM;
    }
    unsigned long long deadline = ucx_deadline_after(timeout_ms);
    size_t issued, failed = 0;
    ucs_status_t first = am_issue(conn, id, msgs, n, requests, &issued);
    int timed_out = 0;
    size_t waited = 0;
    t->watch = conn;
    for (; waited < issued && !timed_out; waited++) {
        ucs_status_t s = ucx_request_wait(t, requests[waited], deadline, &timed_out);
        if (timed_out) break;
        requests[waited] = NULL;
        if (s == UCS_OK && !conn->dead) {
            msgs[waited].status = KVS_OK;
        } else {
            failed++;
            if (first == UCS_OK) first = s;
        }
    }
    t->watch = NULL;
    if (timed_out) return am_timed_out(conn, requests, waited, issued, n, size, timeout_ms);
    free(requests);
    if (issued < n || failed) {
        set_err(t, "ucx \"%s\": %zu of %zu messages (%s) to %s failed: %s", t->name,
                failed + (n - issued), n, size, conn->peer,
                conn->dead ? conn->why : ucs_status_string(first));
        return KVS_EIO;
    }
    return KVS_OK;
}

/* ---- delivery -------------------------------------------------------------------------------- */

/* Deliver one pending event to the owner; returns 1 if one was delivered. A message waits behind
 * an earlier, still incomplete message of the same connection, so per-connection order holds. */
static int deliver_one(kvs_ucx_transport *t) {
    message *prev = NULL;
    for (message *m = t->queue_head; m; prev = m, m = m->next) {
        int blocked = 0;
        if (!m->ready) continue;
        for (message *e = t->queue_head; e != m; e = e->next)
            if (!e->ready && !e->orphaned && e->conn == m->conn) blocked = 1;
        if (blocked) continue;
        if (prev)
            prev->next = m->next;
        else
            t->queue_head = m->next;
        if (t->queue_tail == m) t->queue_tail = prev;
        kvs_ucx_conn *conn = m->conn;
        if (m->payload) {
            if (conn && !m->orphaned) ucx_learn_transports(conn);
            ucx_payload_end(t, m, m->orphaned ? NULL : conn,
                            m->orphaned ? KVS_EIO
                            : !m->data  ? KVS_ENOTFOUND
                            : m->failed ? KVS_EIO
                                        : KVS_OK);
            return 1;
        }
        if (!m->orphaned && !m->failed) {
            if (conn) ucx_learn_transports(conn);
            am_slot *slot = &t->am[m->id];
            if (slot->fn)
                slot->fn(slot->user, conn, m->header, m->header_len, m->data, m->data_len);
        } else if (m->failed) {
            kvs_log(t->log_level, KVS_LOG_WARN,
                    "ucx \"%s\": a %zu-byte message (id %u) was lost "
                    "in transfer",
                    t->name, m->data_len, m->id);
        }
        ucx_message_free(m);
        return 1;
    }
    for (kvs_ucx_conn *c = t->conns; c; c = c->next) {
        if (c->dead && !c->dead_reported) {
            c->dead_reported = 1;
            if (t->on_dead) t->on_dead(t->user, c, c->why);
            return 1;
        }
    }
    return 0;
}

unsigned ucx_deliver_all(kvs_ucx_transport *t) {
    if (t->depth > 0) return 0;
    unsigned n = 0;
    while (deliver_one(t)) n++;
    return n;
}
