/*
 * redis_batch.c - one call's requests over the tier's connections: queued per connection in the
 * order they are sent, written with as few sendmsg calls as the in-flight cap allows, and their
 * replies read as they come, GET values straight into the caller's buffers. One progress loop polls
 * every connection the call uses, so all masters work at once.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "redis_internal.h"

#define MAX_IOV 64

static int pump_read(kvs_redis *r, redis_conn *c, const char **why);
static int pump_write(kvs_redis *r, redis_conn *c);
static int push(redis_conn *c, redis_req *req);
static redis_req *new_asking(kvs_redis *r);

kvs_status redis_req_init(redis_req *req, uint8_t op, uint32_t argc, const char *const *argv,
                          const size_t *lens, const void *value, uint64_t value_len) {
    memset(req, 0, sizeof *req);
    req->op = op;
    size_t n = kvs_resp_command(req->inline_head, sizeof req->inline_head, argc, argv, lens,
                                value ? value_len : UINT64_MAX);
    if (n == 0) return KVS_EINVAL;
    req->head = req->inline_head;
    req->head_len = (uint32_t)n;
    req->value = value;
    req->value_len = value ? value_len : 0;
    req->weight = value ? value_len : 64;
    req->status = KVS_EIO;
    return KVS_OK;
}

static uint64_t req_bytes(const redis_req *req) {
    return req->head_len + (req->value ? req->value_len + 2 : 0);
}

static void complete(kvs_redis *r, redis_req *req, kvs_status status) {
    if (req->done) return;
    req->done = 1;
    req->status = status;
    if (req->counted && r->outstanding > 0) r->outstanding--;
}

void redis_call_begin(kvs_redis *r) {
    r->deadline_ns = kvs_now_ns() + r->opt.timeout_ms * 1000000ull;
    r->n_active = 0;
    r->outstanding = 0;
}

void redis_conn_close(kvs_redis *r, redis_conn *c) {
    for (uint32_t i = c->q_done; i < c->q_len; i++) complete(r, c->q[i], KVS_EIO);
    kvs_redis_conn_close(&c->io);
    c->q_len = c->q_sent = c->q_done = 0;
    c->inflight = 0;
    c->rstart = c->rend = 0;
    c->in_body = c->discard = 0;
    if (c->deferred_counted > 0) /* the call no longer waits for them */
        r->outstanding =
            r->outstanding > c->deferred_counted ? r->outstanding - c->deferred_counted : 0;
    c->deferred = c->deferred_counted = 0;
}

void redis_node_down(kvs_redis *r, redis_node *node, const char *why) {
    for (uint32_t i = 0; i < r->opt.connections_per_node; i++)
        if (node->conns[i].io.fd >= 0) redis_conn_close(r, &node->conns[i]);
    uint64_t now = kvs_now_ns();
    if (node->down_until_ns == 0 || now >= node->down_until_ns) {
        node->backoff_ms = node->down_until_ns == 0 || node->backoff_ms == 0
                               ? r->opt.connect_backoff_ms
                               : (node->backoff_ms * 2 > 5000 ? 5000 : node->backoff_ms * 2);
        node->down_until_ns = now + node->backoff_ms * 1000000ull;
        if (node->down_since_ns == 0) {
            node->down_since_ns = now;
            node->down_attempts = 0;
            redis_error(r, KVS_LOG_WARN, "%s is down (%s); its keys are misses, retried in %llu ms",
                        node->ep.name, why, (unsigned long long)node->backoff_ms);
        } else {
            /* One line per retry: the backoff doubles to 5 s, so an outage logs a line every few
             * seconds with how long it has lasted - the reconnect's progress in a plain log. */
            node->down_attempts++;
            redis_error(r, KVS_LOG_WARN,
                        "%s is still down after %.1f s and %u attempt%s (%s); retried in %llu ms",
                        node->ep.name, (double)(now - node->down_since_ns) / 1e9,
                        node->down_attempts, node->down_attempts == 1 ? "" : "s", why,
                        (unsigned long long)node->backoff_ms);
        }
    }
    if (r->opt.cluster) r->refresh_due = 1; /* a replica may be taking its slots over */
}

/* A connection that failed: its requests fail, it closes, its node is marked down. */
static void conn_failed(kvs_redis *r, redis_conn *c, const char *why) {
    r->stats.failures++;
    redis_node_down(r, c->node, why);
}

static int push(redis_conn *c, redis_req *req) {
    if (c->q_len == c->q_cap) {
        uint32_t cap = c->q_cap ? c->q_cap * 2 : 64;
        redis_req **q = realloc(c->q, cap * sizeof *q);
        if (!q) return -1;
        c->q = q;
        c->q_cap = cap;
    }
    c->q[c->q_len++] = req;
    return 0;
}

/* 1 when the call still waits for something on c: replies to its requests, or acknowledgements of
 * earlier puts it counts. */
static int owes(const redis_conn *c) {
    return c->q_done < c->q_len || c->deferred_counted > 0;
}

/* 1 when an idle connection has been closed by the server (or sent something unasked). */
static int idle_conn_dead(redis_conn *c) {
    struct pollfd p = {.fd = c->io.fd, .events = POLLIN};
    return poll(&p, 1, 0) != 0 || kvs_redis_conn_pending(&c->io);
}

/* A connected, authenticated connection of node for this call, or NULL (node down). */
static redis_conn *node_conn(kvs_redis *r, redis_node *node) {
    uint64_t now = kvs_now_ns();
    if (node->down_until_ns && now < node->down_until_ns) return NULL;
    redis_conn *c = &node->conns[node->next_conn++ % r->opt.connections_per_node];
    if (c->io.fd >= 0 && !c->active && c->q_len == 0 && c->deferred == 0 && idle_conn_dead(c)) {
        kvs_redis_conn_close(&c->io);
        c->rstart = c->rend = 0;
    }
    if (c->io.fd >= 0) return c;
    char why[320];
    if (now >= r->deadline_ns) return NULL;
    /* connect, TLS and AUTH get half the call's time at most: a master that accepts and never
     * answers (or drops SYNs) must leave the call time for the masters that do */
    uint64_t call_deadline = r->deadline_ns, budget = r->opt.timeout_ms * 500000ull;
    if (r->deadline_ns - now > budget) r->deadline_ns = now + budget;
    kvs_status st = kvs_redis_conn_open(&c->io, &node->ep, r->tls,
                                        r->tls_server_name[0] ? r->tls_server_name : NULL,
                                        r->deadline_ns, why, sizeof why);
    if (st == KVS_OK && !c->rbuf && !(c->rbuf = malloc(REDIS_RBUF_BYTES))) {
        kvs_redis_conn_close(&c->io);
        snprintf(why, sizeof why, "out of memory");
        st = KVS_ENOMEM;
    }
    c->rstart = c->rend = 0;
    kvs_status hello = st == KVS_OK ? redis_conn_hello(r, c) : st;
    r->deadline_ns = call_deadline;
    if (st != KVS_OK) {
        r->stats.failures++;
        redis_node_down(r, node, why);
        return NULL;
    }
    if (hello != KVS_OK) {
        conn_failed(r, c,
                    hello == KVS_ETIMEDOUT ? "no answer to AUTH in time" : "AUTH was refused");
        return NULL;
    }
    if (c->ever_connected) r->stats.reconnects++;
    c->ever_connected = 1;
    if (node->down_since_ns && r->host && r->host->log) {
        char line[512]; /* a log line only: the tier's last error stays the failure it names */
        snprintf(line, sizeof line,
                 "redis tier \"%s\": %s is back after %.1f s down (%u attempt%s); serving its keys",
                 r->tier_name, node->ep.name, (double)(kvs_now_ns() - node->down_since_ns) / 1e9,
                 node->down_attempts + 1, node->down_attempts ? "s" : "");
        r->host->log(r->host->ctx, KVS_LOG_INFO, line);
    }
    node->down_since_ns = 0;
    node->down_until_ns = 0;
    node->backoff_ms = 0;
    return c;
}

static int activate(kvs_redis *r, redis_conn *c) {
    if (c->active) return 0;
    redis_conn **a = realloc(r->active, (r->n_active + 1) * sizeof *a);
    if (!a) return -1;
    r->active = a;
    r->active[r->n_active++] = c;
    c->active = 1;
    return 0;
}

static redis_conn *queue_on(kvs_redis *r, uint32_t node, redis_req *req, redis_req *before) {
    if (node >= r->n_nodes) {
        complete(r, req, KVS_EIO);
        return NULL;
    }
    redis_conn *c = node_conn(r, &r->nodes[node]);
    /* a master that stays down may have been replaced by its replica: ask the map again */
    if (!c && r->opt.cluster) r->refresh_due = 1;
    if (!c || activate(r, c) != 0 || (before && push(c, before) != 0) || push(c, req) != 0) {
        if (c && before && c->q_len > 0 && c->q[c->q_len - 1] == before) c->q_len--;
        complete(r, req, KVS_EIO);
        return NULL;
    }
    return c;
}

void redis_queue(kvs_redis *r, uint32_t node, redis_req *req) {
    queue_on(r, node, req, NULL);
}

void redis_wait_deferred(kvs_redis *r, uint32_t at_least, uint32_t keep) {
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        for (uint32_t k = 0; k < r->opt.connections_per_node; k++) {
            redis_conn *c = &r->nodes[i].conns[k];
            if (c->io.fd < 0 || c->deferred == 0 || c->deferred < at_least || c->deferred <= keep)
                continue;
            if (activate(r, c) != 0) continue;
            uint32_t wait = c->deferred - keep; /* the oldest answers: they come first */
            if (wait > c->deferred_counted) r->outstanding += wait - c->deferred_counted;
            if (wait > c->deferred_counted) c->deferred_counted = wait;
            if (c->q_done == c->q_len) c->wait_since_ns = kvs_now_ns();
        }
    }
}

/* Reset a request to go again (a redirection) and queue it on node, after `before` if given. */
static void requeue(kvs_redis *r, uint32_t node, redis_req *req, redis_req *before) {
    req->sent = 0;
    req->done = 0;
    req->status = KVS_EIO;
    queue_on(r, node, req, before);
}

/* The reply to q[q_done] is in: it no longer counts in flight. */
static void reply_done(redis_conn *c, redis_req *req) {
    c->q_done++;
    c->wait_since_ns = kvs_now_ns(); /* the server is answering: what follows waits from now */
    c->inflight = c->inflight > req->weight ? c->inflight - req->weight : 0;
    if (c->q_done == c->q_len) c->q_len = c->q_sent = c->q_done = 0;
}

/* "<slot> <host:port>" after MOVED or ASK. */
static int parse_redirect(const kvs_resp_node *e, size_t skip, uint16_t *slot, char *ep,
                          size_t ep_cap) {
    char text[KVS_REDIS_ENDPOINT_MAX + 16];
    if (e->len - skip >= sizeof text) return -1;
    memcpy(text, e->text + skip, e->len - skip);
    text[e->len - skip] = '\0';
    char *sp = strchr(text, ' ');
    if (!sp || sp == text || sp - text > 5) return -1;
    *sp = '\0';
    char *end = NULL;
    unsigned long s = strtoul(text, &end, 10);
    if (*end != '\0' || s >= KVS_REDIS_SLOTS || strlen(sp + 1) >= ep_cap) return -1;
    *slot = (uint16_t)s;
    snprintf(ep, ep_cap, "%s", sp + 1);
    return 0;
}

static void handle_error(kvs_redis *r, redis_conn *c, redis_req *req, const kvs_resp_node *e) {
    int moved = kvs_resp_text_is(e, "MOVED", 1), ask = kvs_resp_text_is(e, "ASK", 1);
    /* only a key's command is redirected: AUTH, CLUSTER SLOTS, INFO or DBSIZE answered with a
     * redirection is a broken server's answer, and such a request belongs to its connection */
    int keyed = req->op == OP_GET || req->op == OP_SET || req->op == OP_EXISTS || req->op == OP_DEL;
    if ((moved || ask) && !keyed) {
        redis_error(r, KVS_LOG_WARN, "%s redirected a command that has no key", c->node->ep.name);
        complete(r, req, KVS_EIO);
        return;
    }
    if (moved || ask) {
        uint16_t slot = 0;
        char ep[KVS_REDIS_ENDPOINT_MAX];
        uint32_t node = REDIS_NO_NODE;
        if (parse_redirect(e, moved ? 6 : 4, &slot, ep, sizeof ep) == 0)
            node = redis_node_find_or_add(r, ep, 0);
        if (moved) {
            r->stats.moved++;
            r->refresh_due = 1;
            if (node != REDIS_NO_NODE && r->slot_owner) {
                r->slot_owner[slot] = (uint16_t)node;
                r->nodes[node].is_master = 1;
            }
            if (node != REDIS_NO_NODE && !req->moved) {
                req->moved = 1;
                requeue(r, node, req, NULL);
                return;
            }
        } else {
            r->stats.asked++;
            redis_req *asking = node != REDIS_NO_NODE && !req->asked ? new_asking(r) : NULL;
            if (asking) {
                req->asked = 1;
                requeue(r, node, req, asking);
                if (!req->done) return;
            }
        }
        complete(r, req, KVS_EIO);
        return;
    }
    (void)c;
    if (kvs_resp_text_is(e, "OOM", 1)) {
        r->stats.puts_refused_oom++;
        redis_error(r, KVS_LOG_DEBUG, "%s refused a write: %.*s", c->node->ep.name, (int)e->len,
                    e->text);
        complete(r, req, KVS_ENOMEM);
        return;
    }
    if (kvs_resp_text_is(e, "NOPERM", 1) || kvs_resp_text_is(e, "NOAUTH", 1) ||
        kvs_resp_text_is(e, "WRONGPASS", 1)) {
        r->stats.refused_noperm++;
        if (!r->refusal[0])
            snprintf(r->refusal, sizeof r->refusal, "%s refused user \"%s\": %.*s",
                     c->node->ep.name, r->user[0] ? r->user : "default",
                     (int)(e->len > 200 ? 200 : e->len), e->text);
        redis_error(r, KVS_LOG_WARN, "%s refused a command of user \"%s\": %.*s", c->node->ep.name,
                    r->user[0] ? r->user : "default", (int)e->len, e->text);
        complete(r, req, KVS_EIO);
        return;
    }
    if (kvs_resp_text_is(e, "CLUSTERDOWN", 1) || kvs_resp_text_is(e, "LOADING", 1) ||
        kvs_resp_text_is(e, "MASTERDOWN", 1) || kvs_resp_text_is(e, "TRYAGAIN", 1) ||
        kvs_resp_text_is(e, "BUSY", 1)) {
        r->stats.unavailable++;
        if (r->opt.cluster) r->refresh_due = 1;
        complete(r, req, KVS_EIO);
        return;
    }
    if (req->op == OP_SLOTS &&
        kvs_resp_text_is(e, "ERR This instance has cluster support disabled", 0))
        r->not_cluster = 1;
    redis_error(r, KVS_LOG_WARN, "%s answered an error: %.*s", c->node->ep.name,
                (int)(e->len > 200 ? 200 : e->len), e->text);
    complete(r, req, KVS_EIO);
}

static uint64_t info_field(const kvs_resp_node *b, const char *name) {
    size_t nl = strlen(name);
    const char *p = b->text, *end = b->text + b->len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        if ((size_t)(eol - p) > nl + 1 && memcmp(p, name, nl) == 0 && p[nl] == ':') {
            uint64_t v = 0;
            for (const char *d = p + nl + 1; d < eol && *d >= '0' && *d <= '9'; d++)
                v = v * 10 + (uint64_t)(*d - '0');
            return v;
        }
        p = eol + 1;
    }
    return 0;
}

/* A whole reply (not a GET's) to req. */
static void handle_reply(kvs_redis *r, redis_conn *c, redis_req *req, const kvs_resp_node *nodes,
                         uint32_t n) {
    const kvs_resp_node *root = &nodes[0];
    if (root->kind == KVS_RESP_ERROR) {
        if (req->op == OP_ASKING) return; /* the request after it gets the answer that matters */
        handle_error(r, c, req, root);
        return;
    }
    kvs_status st = KVS_EIO;
    switch (req->op) {
        case OP_SET:
            if (kvs_resp_text_is(root, "OK", 0)) {
                st = KVS_OK;
                r->stats.puts_stored++;
            }
            break;
        case OP_EXISTS:
        case OP_DEL:
        case OP_DBSIZE:
            if (root->kind == KVS_RESP_INTEGER) {
                req->integer = root->integer;
                st = KVS_OK;
            }
            break;
        case OP_ASKING:
        case OP_AUTH:
        case OP_PING:
            if (root->kind == KVS_RESP_STATUS) st = KVS_OK;
            break;
        case OP_SLOTS:
            if (root->kind == KVS_RESP_ARRAY) {
                redis_apply_slots(r, nodes, n, c->node);
                st = KVS_OK;
            }
            break;
        case OP_INFO:
            if (root->kind == KVS_RESP_BULK) {
                req->info_used_memory = info_field(root, "used_memory");
                st = KVS_OK;
            }
            break;
        default: break;
    }
    complete(r, req, st);
}

/* Consume the replies now in rbuf. 0, or -1 (with *why) when the stream is not RESP2 or breaks a
 * bound: the connection must be closed. */
static int process(kvs_redis *r, redis_conn *c, const char **why) {
    while (c->deferred > 0) { /* acknowledgements of puts that already returned come first */
        uint32_t n = 0;
        size_t used = 0;
        kvs_resp_result pr = kvs_resp_parse(c->rbuf + c->rstart, c->rend - c->rstart, 4096,
                                            r->reply_nodes, 16, &n, &used, why);
        if (pr == KVS_RESP_MALFORMED) return -1;
        if (pr == KVS_RESP_INCOMPLETE) return 0;
        const kvs_resp_node *e = &r->reply_nodes[0];
        if (kvs_resp_text_is(e, "OOM", 1)) {
            r->stats.puts_refused_oom++;
        } else if (e->kind == KVS_RESP_ERROR) {
            if (kvs_resp_text_is(e, "NOPERM", 1)) r->stats.refused_noperm++;
            redis_error(r, KVS_LOG_WARN, "%s refused a put: %.*s", c->node->ep.name,
                        (int)(e->len > 200 ? 200 : e->len), e->text);
        } else if (kvs_resp_text_is(e, "OK", 0)) {
            r->stats.puts_stored++;
        } else {
            *why = "SET was answered with neither OK nor an error";
            return -1;
        }
        c->rstart += used;
        c->deferred--;
        if (c->deferred_counted > 0) {
            c->deferred_counted--;
            if (r->outstanding > 0) r->outstanding--;
        }
    }
    while (c->q_done < c->q_len) {
        redis_req *req = c->q[c->q_done];
        size_t avail = c->rend - c->rstart;
        const char *at = c->rbuf + c->rstart;
        if (avail > 0 && c->q_done >= c->q_sent) {
            *why = "a reply came before its request was sent";
            return -1;
        }
        if (c->in_body) {
            if (c->body_got < c->body_len) {
                uint64_t take = c->body_len - c->body_got;
                if (take > avail) take = avail;
                if (!c->discard) memcpy((char *)req->dst + c->body_got, at, take);
                c->body_got += take;
                c->rstart += take;
                avail -= take;
                at += take;
                if (c->body_got < c->body_len) return 0;
            }
            if (avail < 2) return 0;
            if (at[0] != '\r' || at[1] != '\n') {
                *why = "a value not followed by CRLF";
                return -1;
            }
            c->rstart += 2;
            c->in_body = 0;
            req->len = c->body_len;
            reply_done(c, req);
            if (!c->discard) r->stats.hits++;
            complete(r, req, c->discard ? KVS_EOVERFLOW : KVS_OK);
            continue;
        }
        if (avail == 0) return 0;
        if (req->op == OP_GET) {
            kvs_resp_node h;
            size_t line = 0;
            kvs_resp_result pr = kvs_resp_header(at, avail, &h, &line, why);
            if (pr == KVS_RESP_INCOMPLETE) return 0;
            if (pr == KVS_RESP_MALFORMED) return -1;
            if (h.kind == KVS_RESP_BULK) {
                c->rstart += line;
                c->in_body = 1;
                c->body_len = (uint64_t)h.integer;
                c->body_got = 0;
                c->discard = c->body_len > req->cap;
                continue;
            }
            if (h.kind == KVS_RESP_NIL) {
                c->rstart += line;
                reply_done(c, req);
                complete(r, req, KVS_ENOTFOUND);
                continue;
            }
            if (h.kind != KVS_RESP_ERROR) {
                *why = "GET was answered with neither a value, nil nor an error";
                return -1;
            }
            c->rstart += line;
            reply_done(c, req);
            handle_error(r, c, req, &h);
            continue;
        }
        uint32_t n = 0;
        size_t used = 0;
        kvs_resp_result pr = kvs_resp_parse(at, avail, REDIS_RBUF_BYTES, r->reply_nodes,
                                            REDIS_MAX_REPLY, &n, &used, why);
        if (pr == KVS_RESP_MALFORMED) return -1;
        if (pr == KVS_RESP_INCOMPLETE) {
            if (c->rstart == 0 && c->rend == REDIS_RBUF_BYTES) {
                *why = "a reply larger than this client's 256 KiB buffer";
                return -1;
            }
            return 0;
        }
        reply_done(c, req);
        handle_reply(r, c, req, r->reply_nodes, n); /* reads rbuf: consumed only after */
        c->rstart += used;
    }
    return 0;
}

/* Read what the connection has. 0, or -1 when it failed (reason in *why). */
static int pump_read(kvs_redis *r, redis_conn *c, const char **why) {
    for (;;) {
        if (process(r, c, why) != 0) {
            r->stats.protocol_errors++;
            return -1;
        }
        if (c->q_done == c->q_len && c->deferred == 0) {
            if (c->rend > c->rstart) {
                *why = "the server sent bytes nobody asked for";
                r->stats.protocol_errors++;
                return -1;
            }
            c->rstart = c->rend = 0;
            return 0;
        }
        if (c->rstart == c->rend) c->rstart = c->rend = 0;
        if (c->rend == REDIS_RBUF_BYTES && c->rstart > 0) {
            memmove(c->rbuf, c->rbuf + c->rstart, c->rend - c->rstart);
            c->rend -= c->rstart;
            c->rstart = 0;
        }
        struct iovec iov[2];
        int n = 0;
        uint64_t direct = 0;
        redis_req *req = c->q_done < c->q_len ? c->q[c->q_done] : NULL;
        if (req && c->in_body && !c->discard && c->body_got < c->body_len && c->rstart == c->rend) {
            direct = c->body_len - c->body_got;
            iov[n++] = (struct iovec){(char *)req->dst + c->body_got, direct};
        }
        /* When the answer read next is a large value, rbuf takes only its header (a few KiB):
         * the value itself then goes straight to the caller's buffer instead of through rbuf. */
        uint32_t next = c->q_done + (direct > 0 || c->in_body ? 1u : 0u);
        size_t tail = REDIS_RBUF_BYTES - c->rend;
        if (c->deferred == 0 && next < c->q_len && c->q[next]->op == OP_GET &&
            c->q[next]->weight >= REDIS_LARGE_VALUE && tail > REDIS_HEADER_READ)
            tail = REDIS_HEADER_READ;
        iov[n++] = (struct iovec){c->rbuf + c->rend, tail};
        int64_t got = kvs_redis_conn_readv(&c->io, iov, n);
        if (got == KVS_REDIS_IO_AGAIN) return 0;
        if (got < 0) {
            *why = "the connection was closed or failed";
            return -1;
        }
        r->stats.bytes_read += (uint64_t)got;
        uint64_t to_body = (uint64_t)got < direct ? (uint64_t)got : direct;
        c->body_got += to_body;
        c->rend += (size_t)((uint64_t)got - to_body);
    }
}

/* Write what the in-flight cap allows. 0, or -1 when the connection failed. */
static int pump_write(kvs_redis *r, redis_conn *c) {
    while (c->q_sent < c->q_len) {
        struct iovec iov[MAX_IOV];
        int n = 0;
        uint64_t inflight = c->inflight;
        for (uint32_t i = c->q_sent; i < c->q_len && n <= MAX_IOV - 3; i++) {
            redis_req *req = c->q[i];
            if (req->sent == 0) {
                if (inflight > 0 && inflight + req->weight > r->opt.inflight_bytes) break;
                inflight += req->weight;
            }
            uint64_t off = req->sent;
            if (off < req->head_len)
                iov[n++] = (struct iovec){(char *)req->head + off, req->head_len - off};
            if (req->value) {
                uint64_t voff = off > req->head_len ? off - req->head_len : 0;
                if (voff < req->value_len)
                    iov[n++] = (struct iovec){(char *)req->value + voff, req->value_len - voff};
                uint64_t toff =
                    off > req->head_len + req->value_len ? off - req->head_len - req->value_len : 0;
                iov[n++] = (struct iovec){(char *)"\r\n" + toff, 2 - toff};
            }
        }
        if (n == 0) return 0;
        int64_t w = kvs_redis_conn_writev(&c->io, iov, n);
        if (w == KVS_REDIS_IO_AGAIN) return 0;
        if (w < 0) return -1;
        r->stats.bytes_written += (uint64_t)w;
        uint64_t left = (uint64_t)w;
        while (left > 0 && c->q_sent < c->q_len) {
            redis_req *req = c->q[c->q_sent];
            if (req->sent == 0) {
                if (c->q_done == c->q_sent) c->wait_since_ns = kvs_now_ns();
                c->inflight += req->weight;
                if (c->inflight > r->stats.max_inflight_bytes)
                    r->stats.max_inflight_bytes = c->inflight;
            }
            uint64_t rest = req_bytes(req) - req->sent;
            uint64_t take = rest < left ? rest : left;
            req->sent += take;
            left -= take;
            if (req->sent == req_bytes(req)) {
                c->q_sent++;
                /* a put returns once its bytes are written; its answer is read later */
                if (req->op == OP_SET) complete(r, req, KVS_OK);
            }
        }
    }
    return 0;
}

/* 1 when the connection has bytes it may write now: a request begun, or one the cap lets start. */
static int wants_write(const kvs_redis *r, const redis_conn *c) {
    if (c->q_sent >= c->q_len) return 0;
    const redis_req *next = c->q[c->q_sent];
    return next->sent > 0 || c->inflight == 0 ||
           c->inflight + next->weight <= r->opt.inflight_bytes;
}

/* An ASKING request made during the call, freed when the call ends. */
static redis_req *new_asking(kvs_redis *r) {
    if (r->n_extra == r->cap_extra) {
        uint32_t cap = r->cap_extra ? r->cap_extra * 2 : 16;
        redis_req **e = realloc(r->extra, cap * sizeof *e);
        if (!e) return NULL;
        r->extra = e;
        r->cap_extra = cap;
    }
    static const char *const argv[] = {"ASKING"};
    static const size_t lens[] = {6};
    redis_req *a = calloc(1, sizeof *a);
    if (!a || redis_req_init(a, OP_ASKING, 1, argv, lens, NULL, 0) != KVS_OK) {
        free(a);
        return NULL;
    }
    r->extra[r->n_extra++] = a;
    return a;
}

kvs_status redis_conn_exec(kvs_redis *r, redis_conn *c, redis_req *req) {
    req->counted = 0;
    if (push(c, req) != 0) return KVS_ENOMEM;
    const char *why = "";
    while (!req->done) {
        if (pump_write(r, c) != 0) break;
        uint64_t now = kvs_now_ns();
        if (now >= r->deadline_ns) {
            why = "no answer within timeout_ms";
            break;
        }
        struct pollfd p = {.fd = c->io.fd,
                           .events = kvs_redis_conn_events(&c->io, 1, wants_write(r, c))};
        uint64_t ms = (r->deadline_ns - now + 999999) / 1000000;
        if (!kvs_redis_conn_pending(&c->io) && poll(&p, 1, (int)(ms > 60000 ? 60000 : ms)) < 0 &&
            errno != EINTR)
            break;
        if (pump_read(r, c, &why) != 0) break;
    }
    if (!req->done) {
        int late = kvs_now_ns() >= r->deadline_ns;
        redis_error(r, KVS_LOG_WARN, "%s: %s", c->node->ep.name, why[0] ? why : "a write failed");
        redis_conn_close(r, c);
        return late ? KVS_ETIMEDOUT : KVS_EIO;
    }
    return req->status;
}

kvs_status redis_conn_hello(kvs_redis *r, redis_conn *c) {
    if (r->password_len == 0) return KVS_OK;
    const char *argv[3] = {"AUTH", r->user, r->password};
    size_t lens[3] = {4, strlen(r->user), r->password_len};
    uint32_t argc = 3;
    if (!r->user[0]) {
        argv[1] = r->password;
        lens[1] = r->password_len;
        argc = 2;
    }
    redis_req *req = malloc(sizeof *req); /* AUTH may not fit the inline head: build it here */
    char *head = malloc(sizeof r->user + sizeof r->password + 64);
    kvs_status st = KVS_ENOMEM;
    if (req && head) {
        memset(req, 0, sizeof *req);
        req->op = OP_AUTH;
        req->status = KVS_EIO;
        req->weight = 64;
        size_t len = kvs_resp_command(head, sizeof r->user + sizeof r->password + 64, argc, argv,
                                      lens, UINT64_MAX);
        req->head = head;
        req->head_len = (uint32_t)len;
        st = len ? redis_conn_exec(r, c, req) : KVS_EINVAL;
        OPENSSL_cleanse(head, len);
    }
    free(head);
    free(req);
    return st;
}

/* The call ran out of time: one last look at what has arrived, then each connection still owing
 * replies is closed (a reply may still come: never into a buffer the caller has back). Its master is
 * marked down only when it had half of timeout_ms to answer and did not: one that got its requests
 * late (another master took the time) is not at fault. */
static void run_out_of_time(kvs_redis *r, struct pollfd *pfd, redis_conn **polled, uint32_t np) {
    r->stats.timeouts++;
    if (poll(pfd, np, 0) > 0) {
        for (uint32_t i = 0; i < np; i++) {
            const char *why = "";
            if (pfd[i].revents && polled[i]->io.fd >= 0 && pump_read(r, polled[i], &why) != 0)
                conn_failed(r, polled[i], why);
        }
    }
    uint64_t now = kvs_now_ns(), fair = r->opt.timeout_ms * 500000ull;
    for (uint32_t i = 0; i < np; i++) {
        redis_conn *c = polled[i];
        if (c->io.fd < 0 || !owes(c)) continue;
        if ((c->q_done < c->q_sent || c->deferred_counted > 0) && now - c->wait_since_ns >= fair)
            redis_node_down(r, c->node, "no answer within timeout_ms");
        else
            redis_conn_close(r, c);
    }
}

void redis_run(kvs_redis *r) {
    struct pollfd *pfd = malloc((r->n_active + 1) * sizeof *pfd);
    redis_conn **polled = malloc((r->n_active + 1) * sizeof *polled);
    uint32_t cap = r->n_active;
    while (r->outstanding > 0 && pfd && polled) {
        const char *why = "";
        for (uint32_t a = 0; a < r->n_active; a++) {
            redis_conn *c = r->active[a];
            if (c->io.fd < 0) continue;
            if (pump_write(r, c) != 0 ||
                (kvs_redis_conn_pending(&c->io) && pump_read(r, c, &why) != 0))
                conn_failed(r, c, why[0] ? why : "a write failed");
        }
        if (r->outstanding == 0) break;
        if (r->n_active > cap) { /* a redirection reached another master */
            struct pollfd *p2 = realloc(pfd, (r->n_active + 1) * sizeof *pfd);
            if (p2) pfd = p2;
            redis_conn **c2 = realloc(polled, (r->n_active + 1) * sizeof *polled);
            if (c2) polled = c2;
            if (!p2 || !c2) break;
            cap = r->n_active;
        }
        uint32_t np = 0;
        for (uint32_t a = 0; a < r->n_active; a++) {
            redis_conn *c = r->active[a];
            if (c->io.fd < 0 || !owes(c)) continue;
            pfd[np] = (struct pollfd){
                .fd = c->io.fd, .events = kvs_redis_conn_events(&c->io, 1, wants_write(r, c))};
            polled[np++] = c;
        }
        if (np == 0) break; /* nothing left on a live connection: the rest failed */
        uint64_t now = kvs_now_ns();
        if (now >= r->deadline_ns) {
            run_out_of_time(r, pfd, polled, np);
            break;
        }
        uint64_t ms = (r->deadline_ns - now + 999999) / 1000000;
        int k = poll(pfd, np, (int)(ms > 60000 ? 60000 : ms));
        r->stats.polls++;
        if (k < 0 && errno != EINTR) break;
        for (uint32_t i = 0; k > 0 && i < np; i++) {
            if (!pfd[i].revents || polled[i]->io.fd < 0) continue;
            why = "";
            if (pump_read(r, polled[i], &why) != 0) conn_failed(r, polled[i], why);
        }
    }
    free(pfd);
    free(polled);
    for (uint32_t a = 0; a < r->n_active; a++) {
        redis_conn *c = r->active[a];
        int only_puts = c->q_sent == c->q_len;
        for (uint32_t i = c->q_done; only_puts && i < c->q_len; i++)
            only_puts = c->q[i]->op == OP_SET;
        c->deferred_counted = 0;
        if (c->q_done < c->q_len && only_puts && c->io.fd >= 0) {
            /* whole puts whose answers are still coming: read with a later call */
            c->deferred += c->q_len - c->q_done;
            c->q_len = c->q_sent = c->q_done = 0;
            c->inflight = 0;
        } else if (c->q_done < c->q_len) {
            redis_conn_close(r, c); /* a reply may still come: never into a buffer the caller
                                       has back */
        }
        c->active = 0;
    }
    r->n_active = 0;
    for (uint32_t i = 0; i < r->n_extra; i++) free(r->extra[i]);
    r->n_extra = 0;
}
