/* node.c - kvstrata-node's server: its lifetime and its event loop. One thread owns everything and
 * sleeps in one poll over the listening socket, every control connection and the UCX worker; it
 * accepts connections, hands control connections to node_control.c and routes each UCX request to
 * its session, served by node_requests.c. Connections are closed here, after the callback that
 * marked them returns. */
#include "node.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node_control.h"
#include "node_metrics.h"
#include "node_quota.h"
#include "node_requests.h"
#include "node_state.h"
#include "node_stream.h"

#define LOOP_WAIT_MS         1000 /* the loop progresses UCX at least this often, events or not */
#define SHARED_ROOM_CHECK_MS 100  /* how often the shared tier's free room is checked */
#define SHARED_ROOM_MAX      64   /* free slabs kept there at most */
#define SHARED_ROOM_STEP     4    /* evictions per check at most (each written down here) */
#define STAGING_ALIGN        4096u
#define STAGING_MAX_SLOTS    8u /* objects of one GET batch read out of copy-only tiers */
#define STAGING_SLOT_BUDGET  (64ull << 20) /* slots beyond the first only while they fit in this */
#define ACCEPTS_PER_WAKE     64u /* accepts per loop pass, so sessions are served meanwhile */
#define ACCEPT_PAUSE_MS      100 /* out of fds: stop accepting for this long */

/* ---- connections ------------------------------------------------------------------------------ */

static void conn_free(node_conn *c) {
    for (uint32_t i = 0; i < RKEY_CACHE; i++)
        if (c->rkeys[i].len) kvs_ucx_rkey_destroy(c->rkeys[i].rkey);
    if (c->rma && c->rma != c->conn) kvs_ucx_conn_close(c->rma);
    /* a client whose control connection ended is gone or gave up: no flush towards it */
    if (c->peer_gone)
        kvs_ucx_conn_abort(c->conn);
    else
        kvs_ucx_conn_close(c->conn);
    if (c->pidfd >= 0) close(c->pidfd);
    kvs_chan_close(&c->ch);
    free(c->rd);
    free(c->sframe);
    kvs_remote_tenant_hasher_free(c->hasher);
    free(c->put_status);
    kvs_remote_auth_node_clear(&c->auth); /* the tenant's key, wiped */
    memset(&c->auth, 0, sizeof c->auth);
    memset(c->token, 0, sizeof c->token);
    free(c);
}

static void sweep(kvs_node *n);

/* With every handshake slot taken, a new connection takes the slot of the oldest handshake of the
 * source holding the most of them (its own, when it is that source): idle connections from one
 * address cannot keep another address's clients out, and a client's handshake, which takes a
 * couple of round trips, is evicted only by a flood that outpaces it. Returns 1 when a slot was
 * freed. */
static int evict_a_handshake(kvs_node *n) {
    node_conn *victim = NULL;
    uint32_t victim_count = 0;
    for (node_conn *c = n->conns; c; c = c->next) {
        if (c->session || c->closing) continue;
        uint32_t same = 0; /* O(handshakes^2): --max-handshakes is small (16 by default) */
        for (node_conn *d = n->conns; d; d = d->next)
            same += !d->session && !d->closing && d->source == c->source;
        /* the list is newest first: a later one of as many is older */
        if (same >= victim_count) {
            victim = c;
            victim_count = same;
        }
    }
    if (!victim) return 0;
    n->stats.rejected++;
    node_log_refusal(n,
                     "%s: handshake evicted for a new connection (%u handshakes from its address)",
                     victim->peer, victim_count);
    victim->peer_gone = 1;
    victim->closing = 1;
    sweep(n);
    return 1;
}

/* Take the connections waiting on the listener: each gets the handshake deadline and a frame
 * reader, unless a cap is reached (then it is closed at once, counted and logged). */
static void accept_all(kvs_node *n) {
    for (uint32_t i = 0; i < ACCEPTS_PER_WAKE; i++) {
        struct sockaddr_in sin;
        socklen_t sl = sizeof sin;
        int fd = accept4(n->listen_fd, (struct sockaddr *)&sin, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* the connection stays in the backlog; try again shortly rather than spin on it */
                n->stats.rejected++;
                n->accept_paused_until_ns = kvs_now_ns() + ACCEPT_PAUSE_MS * 1000000ull;
                node_log_refusal(n, "cannot accept a connection: %s; accepting again in %d ms",
                                 strerror(errno), ACCEPT_PAUSE_MS);
            }
            return; /* EAGAIN: none left; others (ECONNABORTED, ...) concern that connection only */
        }
        char peer[64] = "unknown peer", host[INET_ADDRSTRLEN];
        if (sin.sin_family == AF_INET && inet_ntop(AF_INET, &sin.sin_addr, host, sizeof host))
            kvs_fmt(peer, sizeof peer, "%s:%u", host, ntohs(sin.sin_port));
        const char *cap = NULL;
        if (n->n_sessions >= n->params.max_clients) {
            cap = "sessions (--max-clients)"; /* before a live handshake is evicted for nothing */
        } else if (n->n_handshakes >= n->params.max_handshakes) {
            sweep(n); /* handshakes already closing count until they are swept */
            if (n->n_handshakes >= n->params.max_handshakes && !evict_a_handshake(n))
                cap = "handshakes in progress (--max-handshakes)";
        }
        node_conn *c = cap ? NULL : calloc(1, sizeof *c);
        kvs_control_reader *rd = c ? malloc(sizeof *rd) : NULL;
        if (!rd) {
            n->stats.rejected++;
            if (cap)
                node_log_refusal(n, "%s refused: already %u %s", peer,
                                 cap[0] == 'h' ? n->n_handshakes : n->n_sessions, cap);
            else
                node_log_refusal(n, "%s refused: no memory for a connection", peer);
            free(c);
            close(fd);
            continue;
        }
        int one = 1; /* answers go out at once: a small one never waits for the peer's ACK */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        rd->have_prefix = 0;
        kvs_chan_plain(&c->ch, fd);
        char why[160];
        if (n->tls && kvs_tls_attach(n->tls, &c->ch, why, sizeof why) != KVS_OK) {
            n->stats.rejected++;
            node_log_refusal(n, "%s refused: %s", peer, why);
            kvs_chan_close(&c->ch);
            free(rd);
            free(c);
            continue;
        }
        c->rd = rd;
        c->pidfd = -1;
        c->deadline_ns = kvs_now_ns() + (uint64_t)n->params.timeout_ms * 1000000ull;
        c->source = sin.sin_family == AF_INET ? sin.sin_addr.s_addr : 0;
        kvs_fmt(c->peer, sizeof c->peer, "%s", peer);
        c->next = n->conns;
        n->conns = c;
        n->n_handshakes++;
        n->stats.connections++;
    }
}

static void on_dead(void *user, kvs_ucx_conn *conn, const char *why) {
    (void)user;
    (void)why;
    node_conn *c = kvs_ucx_conn_user(conn);
    if (c) c->closing = 1;
}

/* Close the connections marked closing (never from inside their own callback). */
static void sweep(kvs_node *n) {
    for (node_conn **p = &n->conns; *p;) {
        node_conn *c = *p;
        if (c->closing) {
            *p = c->next;
            node_stream_drop(n, c);
            if (c->session)
                n->n_sessions--;
            else
                n->n_handshakes--;
            conn_free(c);
        } else {
            p = &c->next;
        }
    }
}

/* ---- requests --------------------------------------------------------------------------------- */

/* A request from UCX: to the session its token names, decoded, refused or handed to node_requests.c,
 * then answered. */
static void on_message(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                       const void *data, size_t data_len) {
    kvs_node *n = user;
    (void)conn; /* UCX may deliver on an endpoint of its own making: the token names the session */
    node_conn *c = node_session_of(n, header, header_len);
    if (!c) {
        n->stats.unknown_sessions++;
        node_log_refusal(n, "dropped a %zu-byte request that names no live session", data_len);
        return;
    }
    const void *buf = data;
    size_t len = data_len;
    kvs_wire_msg req;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (kvs_wire_decode(buf, len, n->entries, KVS_WIRE_MAX_KEYS, &req, &why) != KVS_OK) {
        node_send_refusal(n, c, &why);
        return;
    }
    if (req.type == KVS_WIRE_HELLO || req.type == KVS_WIRE_AUTH) {
        node_refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE,
                    "node: the session is already authenticated");
        return;
    }
    kvs_wire_msg rep;
    switch (req.type) {
        case KVS_WIRE_LOOKUP: kvs_wire_msg_init(&rep, KVS_WIRE_LOOKUP_REPLY, req.request_id); break;
        case KVS_WIRE_GET: kvs_wire_msg_init(&rep, KVS_WIRE_GET_REPLY, req.request_id); break;
        case KVS_WIRE_PUT: kvs_wire_msg_init(&rep, KVS_WIRE_PUT_REPLY, req.request_id); break;
        case KVS_WIRE_DELETE: kvs_wire_msg_init(&rep, KVS_WIRE_DELETE_REPLY, req.request_id); break;
        case KVS_WIRE_STATS:
            kvs_wire_msg_init(&rep, KVS_WIRE_STATS_REPLY, req.request_id);
            node_do_stats(n, &rep);
            node_send_msg(n, c, &rep);
            return;
        default: {
            char text[128];
            kvs_fmt(text, sizeof text, "node: %s is not a request", kvs_wire_type_name(req.type));
            node_refuse(n, c, req.request_id, KVS_WIRE_ERR_STATE, text);
            return;
        }
    }
    memset(n->reply_entries, 0, sizeof(kvs_wire_entry) * req.n_entries);
    rep.entries = n->reply_entries;
    rep.n_entries = req.n_entries;
    if (req.type == KVS_WIRE_LOOKUP)
        node_do_lookup(n, c, &req);
    else if (req.type == KVS_WIRE_GET)
        node_do_get(n, c, &req);
    else if (req.type == KVS_WIRE_PUT)
        node_do_put(n, c, &req);
    else
        node_do_delete(n, c, &req);
    if (node_alive(c))
        node_send_msg(n, c, &rep);
    else
        c->closing = 1;
}

/* ---- lifetime --------------------------------------------------------------------------------- */

/* The first tier, when it is a dram tier shared between processes (options.shm_name), is named
 * to clients on this host (n->shared_tier). */
static void shared_tier_of(kvs_node *n, const kvs_server_tier *tc) {
    if (strcmp(tc->type, "dram") != 0 || !tc->shm_name ||
        strlen(tc->shm_name) > KVS_WIRE_MAX_SHARED_TIER_NAME)
        return;
    kvs_fmt(n->shared_tier, sizeof n->shared_tier, "%s", tc->shm_name);
    n->shared_tier_capacity = tc->capacity_bytes;
    /* an eighth of its slabs (the dram tier's geometry), none in a tier of fewer than 8 */
    uint64_t slab = (n->params.max_object_bytes + 4095) / 4096 * 4096;
    n->shared_slabs = tc->capacity_bytes / slab;
    n->shared_room = n->shared_slabs / 8;
    if (n->shared_room > SHARED_ROOM_MAX) n->shared_room = SHARED_ROOM_MAX;
}

kvs_status kvs_node_create(const kvs_node_params *params, kvs_node **out, char *err,
                           size_t err_len) {
    kvs_status st = KVS_EINVAL;
    *out = NULL;
    if (!params || !params->config || !params->psk || !params->listen_host ||
        params->max_object_bytes == 0) {
        kvs_fmt(err, err_len, "node: missing parameters");
        return KVS_EINVAL;
    }
    kvs_node *n = calloc(1, sizeof *n);
    if (!n) {
        kvs_fmt(err, err_len, "node: no memory");
        return KVS_ENOMEM;
    }
    n->listen_fd = -1;
    n->params = *params;
    kvs_fmt(n->tenants[KVS_NODE_TENANT_ROWS].tenant, sizeof n->tenants[0].tenant, "%s",
            KVS_NODE_OTHER_TENANT);
    if (n->params.max_handshakes == 0) n->params.max_handshakes = 16;
    n->host_id_ok = kvs_remote_host_id(n->host_id) == KVS_OK;
    const kvs_server_settings *set = kvs_server_config_settings(params->config);
    n->log_level = set->log_level;
    n->params.config = NULL;
    n->params.psk = NULL;
    n->params.metrics_listen = n->params.metrics_name = NULL; /* borrowed: node_metrics_open */
    n->psk = *params->psk;
    if (params->encrypt && (st = kvs_tls_node_new(&n->psk, &n->tls, err, err_len)) != KVS_OK)
        goto fail;
    n->slot_len = (params->max_object_bytes + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
    n->staging_slots = 1;
    while (n->staging_slots < STAGING_MAX_SLOTS &&
           (n->staging_slots + 1) * n->slot_len <= STAGING_SLOT_BUDGET)
        n->staging_slots++;
    uint64_t staging_len = n->slot_len * n->staging_slots;
    n->staging = aligned_alloc(STAGING_ALIGN, (size_t)staging_len);
    n->reply = malloc(KVS_WIRE_MAX_MESSAGE_BYTES);
    if (!n->staging || !n->reply) {
        kvs_fmt(err, err_len, "node: no memory for a %llu-byte staging buffer",
                (unsigned long long)staging_len);
        st = KVS_ENOMEM;
        goto fail;
    }
    memset(n->staging, 0, (size_t)staging_len);
    st = kvs_server_tiers_open(params->config, params->max_object_bytes, n->staging, staging_len,
                               &n->chain, err, err_len);
    if (st != KVS_OK) goto fail;
    int oom = 0;
    n->quota = node_quota_create(set, &oom);
    if (oom) {
        kvs_fmt(err, err_len, "node: no memory for the tenants' shares");
        st = KVS_ENOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < set->n_tiers; i++) {
        const kvs_server_tier *tc = &set->tiers[i];
        n->capacity_bytes += tc->capacity_bytes;
        /* clients put into the shared tier themselves, past kvs_server_tiers_put: a write-through
         * tier's copies below would not be made, and its evictions pass nothing down (tiers.c) */
        if (i == 0 && (!tc->write_through || set->n_tiers == 1)) shared_tier_of(n, tc);
        /* The dram tier gives every object a slab sized for the largest one. */
        if (strcmp(tc->type, "dram") == 0 && tc->capacity_bytes / params->max_object_bytes < 64) {
            char cap[32], obj[32];
            kvs_log(set->log_level, KVS_LOG_WARN,
                    "tier \"%s\" holds at most %llu objects: each takes a slab of "
                    "--max-object-bytes %s out "
                    "of its %s; set --max-object-bytes to the engine's object size",
                    tc->name, (unsigned long long)(tc->capacity_bytes / params->max_object_bytes),
                    kvs_fmt_bytes(obj, sizeof obj, params->max_object_bytes),
                    kvs_fmt_bytes(cap, sizeof cap, tc->capacity_bytes));
        }
    }

    n->pfds_cap = params->max_clients + params->max_handshakes + 3;
    n->pfds = calloc(n->pfds_cap, sizeof *n->pfds);
    n->pconns = calloc(n->pfds_cap, sizeof *n->pconns);
    if (!n->pfds || !n->pconns) {
        kvs_fmt(err, err_len, "node: no memory for %u connections", n->pfds_cap);
        st = KVS_ENOMEM;
        goto fail;
    }
    char why[256];
    st = kvs_control_listen(params->listen_host, params->listen_port, &n->listen_fd, &n->port, why,
                            sizeof why);
    if (st != KVS_OK) {
        kvs_fmt(err, err_len, "node: %s", why);
        goto fail;
    }
    kvs_ucx_params p = {.struct_size = sizeof p,
                        .name = "kvstrata-node",
                        .log_level = set->log_level,
                        .on_dead = on_dead,
                        .user = n,
                        .busy_poll_us = params->busy_poll_us};
    st = kvs_ucx_create(&p, &n->t, err, err_len);
    if (st != KVS_OK) goto fail;
    size_t need = 0;
    if (kvs_ucx_worker_address(n->t, NULL, 0, &need) != KVS_EOVERFLOW || need == 0 ||
        need > KVS_WIRE_MAX_WORKER_ADDR_BYTES || !(n->worker_addr = malloc(need)) ||
        kvs_ucx_worker_address(n->t, n->worker_addr, need, &n->worker_addr_len) != KVS_OK) {
        kvs_fmt(err, err_len, "node: no UCX worker address of at most %u bytes (%zu): %s",
                KVS_WIRE_MAX_WORKER_ADDR_BYTES, need, kvs_ucx_last_error(n->t));
        st = KVS_EIO;
        goto fail;
    }
    st = kvs_ucx_mem_register(n->t, n->staging, (size_t)staging_len, &n->staging_mem);
    if (st == KVS_OK) st = kvs_ucx_am_handler(n->t, KVS_NODE_AM_ID, on_message, n);
    if (st == KVS_OK)
        st = kvs_ucx_payload_handler(n->t, KVS_NODE_PAYLOAD_AM_ID, node_put_place, node_put_landed,
                                     n);
    if (st != KVS_OK) {
        kvs_fmt(err, err_len, "%s", kvs_ucx_last_error(n->t));
        goto fail;
    }
    n->regions[n->n_regions++] =
        (region){.base = n->staging, .len = staging_len, .mem = n->staging_mem};
    /* The child that tries a client's rkey (kvs_ucx_rkey_unpack_untrusted) needs none of the
     * registered memory: not copying it keeps the fork cheap, and pages pinned for a NIC are never
     * moved by copy-on-write under it. */
    (void)madvise(n->staging, (size_t)staging_len, MADV_DONTFORK);
    /* Tiers that keep their objects in one range (dram) are registered whole, so RMA moves objects
     * straight out of and into their slabs. */
    for (uint32_t i = 0; i < kvs_server_tiers_count(n->chain) && n->n_regions < MAX_REGIONS; i++) {
        void *base = NULL;
        uint64_t len = 0;
        kvs_ucx_mem *mem = NULL;
        if (kvs_server_tiers_memory(n->chain, i, &base, &len) != KVS_OK || !base || len == 0)
            continue;
        if (kvs_ucx_mem_register(n->t, base, (size_t)len, &mem) != KVS_OK) {
            kvs_log(set->log_level, KVS_LOG_WARN,
                    "tier \"%s\": %s; its objects are registered per "
                    "transfer instead",
                    kvs_server_tiers_name(n->chain, i), kvs_ucx_last_error(n->t));
            continue;
        }
        n->regions[n->n_regions++] = (region){.base = base, .len = len, .mem = mem};
        (void)madvise(base, (size_t)len, MADV_DONTFORK);
    }
    node_metrics_open(n, params, set);
    *out = n;
    return KVS_OK;
fail:
    kvs_node_destroy(n);
    return st;
}

uint16_t kvs_node_port(const kvs_node *n) {
    return n->port;
}
uint32_t kvs_node_tier_count(const kvs_node *n) {
    return kvs_server_tiers_count(n->chain);
}
void kvs_node_get_stats(const kvs_node *n, kvs_node_stats *out) {
    *out = n->stats;
}

/* Clients on this host copy their puts straight into the shared tier, into free slabs only (they
 * never evict: an eviction here passes the object down this node's tiers, theirs would drop it).
 * Every SHARED_ROOM_CHECK_MS the node frees slabs up to shared_room by reserving them (which evicts
 * the least recently used objects, written back down the chain) and aborting the reservations. */
static void keep_shared_room(kvs_node *n) {
    if (!n->shared_room) return;
    uint64_t now = kvs_now_ns();
    if (now - n->shared_room_checked_ns < SHARED_ROOM_CHECK_MS * 1000000ull) return;
    n->shared_room_checked_ns = now;
    const kvs_backend_ops *ops = kvs_server_tiers_ops(n->chain, 0);
    void *state = kvs_server_tiers_state(n->chain, 0);
    uint64_t objects = 0, bytes = 0;
    if (ops->usage(state, &objects, &bytes) != KVS_OK) return;
    uint64_t free_now = objects < n->shared_slabs ? n->shared_slabs - objects : 0;
    if (free_now >= n->shared_room) return;
    uint64_t evict = n->shared_room - free_now;
    uint64_t want = free_now + (evict < SHARED_ROOM_STEP ? evict : SHARED_ROOM_STEP);
    uint64_t tickets[SHARED_ROOM_MAX], held = 0;
    char err[256];
    const kvs_key none = {{0}};
    for (; held < want; held++) { /* the free slabs first, then evictions */
        void *dst = NULL;
        if (kvs_server_tiers_reserve(n->chain, &none, 1, &dst, &tickets[held], err, sizeof err) !=
            KVS_OK)
            break;
    }
    for (uint64_t i = 0; i < held; i++) kvs_server_tiers_abort(n->chain, tickets[i]);
}

void kvs_node_set_psk(kvs_node *n, const kvs_remote_psk *master) {
    kvs_remote_psk_clear(&n->psk);
    n->psk = *master;
}

/* Whether c's next step is a read of bytes TLS already holds (see the loop). */
static int held(node_conn *c) {
    return !node_stream_sending(c) && kvs_chan_pending(&c->ch) > 0;
}

kvs_status kvs_node_run(kvs_node *n, int stop_fd) {
    for (;;) {
        kvs_ucx_progress(n->t);
        /* before the arm below, which a node kept busy may pass over for a while */
        if (n->metrics) node_metrics_tick(n, kvs_now_ns());
        uint64_t next_ns = node_expire_handshakes(n), streams_ns = node_expire_streams(n);
        if (streams_ns < next_ns) next_ns = streams_ns;
        sweep(n);
        if (kvs_ucx_arm(n->t) == KVS_EAGAIN) continue; /* events pending: progress again first */
        uint64_t now = kvs_now_ns();
        uint64_t metrics_ns = node_metrics_due(n);
        if (metrics_ns < next_ns) next_ns = metrics_ns;
        int accepting = now >= n->accept_paused_until_ns;
        if (!accepting && n->accept_paused_until_ns < next_ns) next_ns = n->accept_paused_until_ns;
        n->pfds[0] = (struct pollfd){.fd = stop_fd, .events = POLLIN};
        n->pfds[1] = (struct pollfd){.fd = kvs_ucx_event_fd(n->t), .events = POLLIN};
        n->pfds[2] = (struct pollfd){.fd = accepting ? n->listen_fd : -1, .events = POLLIN};
        uint32_t np = 3;
        /* bytes TLS took off a socket and holds: no poll event will say so, and a session that
         * reads next must be served without waiting (one still sending its answer waits for room,
         * which poll does say) */
        int decrypted = 0;
        for (node_conn *c = n->conns; c && np < n->pfds_cap; c = c->next) {
            n->pfds[np] = (struct pollfd){
                .fd = c->ch.fd,
                .events = kvs_chan_events(&c->ch, node_stream_sending(c) ? POLLOUT : POLLIN)};
            decrypted |= held(c);
            n->pconns[np++] = c;
        }
        keep_shared_room(n);
        int ms = decrypted ? 0 : n->shared_room ? SHARED_ROOM_CHECK_MS : LOOP_WAIT_MS;
        if (next_ns != UINT64_MAX) {
            uint64_t left = next_ns > now ? (next_ns - now + 999999ull) / 1000000ull : 0;
            if (left < (uint64_t)ms) ms = (int)left;
        }
        int ready = poll(n->pfds, np, ms);
        if (ready < 0 || (ready == 0 && !decrypted)) continue;
        if (n->pfds[0].revents & POLLIN) return KVS_OK;
        for (uint32_t i = 3; i < np; i++) {
            node_conn *c = n->pconns[i];
            if ((!n->pfds[i].revents && !held(c)) || c->closing) continue;
            /* a GET's answer goes on when there is room; its writes see a peer that went */
            if (node_stream_sending(c) || node_control_readable(n, c)) node_stream_request(n, c);
        }
        if (n->pfds[2].revents & POLLIN) accept_all(n);
    }
}

void kvs_node_destroy(kvs_node *n) {
    if (!n) return;
    for (node_conn *c = n->conns; c; c = c->next) c->closing = 1;
    sweep(n);
    node_metrics_close(n); /* the tiers' usage, so before they close */
    for (uint32_t i = 0; i < n->n_regions; i++) kvs_ucx_mem_deregister(n->regions[i].mem);
    n->n_regions =
        0; /* a staging registration made before a failed create goes with the transport */
    kvs_ucx_destroy(n->t);
    if (n->listen_fd >= 0) close(n->listen_fd);
    free(n->worker_addr);
    free(n->pfds);
    free(n->pconns);
    kvs_server_tiers_close(n->chain);
    node_quota_destroy(n->quota);
    free(n->reply);
    free(n->stream_buf);
    free(n->staging);
    kvs_tls_free(n->tls);
    kvs_remote_psk_clear(&n->psk);
    free(n);
}
