/*
 * peer_gpu_link.c - the peer_gpu tier's link to its lender (peer_gpu.h): connecting, taking the
 * HELLO's region, answering OFFER and RECLAIM on the tier's own thread, and losing the lender.
 * Every message is read with the strict reader (lend_wire.h); a packet that is not a message ends
 * the link, as a closed socket does.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "lend_wire.h"
#include "peer_gpu_link.h"
#include "peer_gpu_region.h"
#include "peer_gpu_slots.h"

/* Wait until no copy into or out of lent memory runs (lock held). */
static void wait_copies(pg_state *st) {
    while (st->in_flight) pthread_cond_wait(&st->changed, &st->lock);
}

/* Take a new lender's region (lock held, no copy in flight): the slots, the index, a borrower of
 * its units afresh. */
static kvs_status take_region(pg_state *st, const kvs_lend_msg *m, uint8_t *region, int device) {
    uint32_t per = (uint32_t)(m->unit_bytes / st->slot_bytes);
    uint64_t n_slots = (uint64_t)per * m->n_units;
    uint32_t n_buckets = 16;
    while (n_buckets < 2 * n_slots && n_buckets < (1u << 30)) n_buckets <<= 1;
    pg_slot *slots = calloc(n_slots, sizeof *slots);
    uint32_t *buckets = malloc(n_buckets * sizeof *buckets);
    uint32_t *free_stack = malloc((n_slots + 1) * sizeof *free_stack);
    if (!slots || !buckets || !free_stack ||
        kvs_borrower_init(&st->borrower, m->n_units) != KVS_OK) {
        free(slots);
        free(buckets);
        free(free_stack);
        return KVS_ENOMEM;
    }
    for (uint32_t b = 0; b < n_buckets; b++) buckets[b] = PG_NIL;
    for (uint64_t s = 0; s < n_slots; s++) slots[s].prev = slots[s].next = slots[s].hnext = PG_NIL;
    free(st->slots);
    free(st->buckets);
    free(st->free_stack);
    st->slots = slots;
    st->buckets = buckets;
    st->free_stack = free_stack;
    st->n_free = 0; /* no unit is lent yet */
    st->n_buckets = n_buckets;
    st->n_slots = (uint32_t)n_slots;
    st->slots_per_unit = per;
    st->lru_head = st->lru_tail = PG_NIL;
    st->region = region;
    st->region_kind = m->region_kind;
    st->region_device = device;
    st->region_bytes = m->region_bytes;
    st->unit_bytes = m->unit_bytes;
    return KVS_OK;
}

/* A socket connected to the lender in *out. Non-blocking: a lender that accepts nothing (its queue
 * full) never holds the tier's thread; the wire's sends and receives poll for themselves. */
static kvs_status connect_socket(pg_state *st, int *out) {
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0) {
        pg_set_error(st, "socket: %s", strerror(errno));
        return KVS_EIO;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, st->socket_path, strlen(st->socket_path) + 1);
    if (connect(sock, (struct sockaddr *)&sa, sizeof sa) != 0) {
        pg_set_error(st, "no lender at %s (%s)", st->socket_path,
                     errno == EAGAIN ? "it accepts no connection: its queue is full"
                                     : strerror(errno));
        close(sock);
        return KVS_ENOTFOUND;
    }
    *out = sock;
    return KVS_OK;
}

/* The lender's HELLO (with its region's descriptor in *fd, if it sent one), within timeout_ms
 * unless destroy wakes the thread first, and with units this tier can use. On a failure why says
 * it. */
static kvs_status receive_hello(pg_state *st, int sock, uint64_t timeout_ms, kvs_lend_msg *m,
                                int *fd, char *why, size_t why_len) {
    struct pollfd p[2] = {{.fd = sock, .events = POLLIN}, {.fd = st->wake[0], .events = POLLIN}};
    int ready;
    do ready = poll(p, 2, (int)timeout_ms);
    while (ready < 0 && errno == EINTR);
    kvs_status rc;
    if (ready > 0 && !p[1].revents) {
        rc = kvs_lend_recv(sock, 0, 0, m, fd, why, why_len);
    } else {
        snprintf(why, why_len, "%s",
                 ready > 0 ? "the tier is closing" : "no HELLO within connect_timeout_ms");
        rc = KVS_ETIMEDOUT;
    }
    if (rc == KVS_OK && m->type != KVS_LEND_HELLO) {
        snprintf(why, why_len, "the lender's first message is type %u, not a HELLO", m->type);
        rc = KVS_EIO;
    }
    if (rc == KVS_OK && m->unit_bytes < st->slot_bytes) {
        snprintf(why, why_len, "its units of %llu bytes hold no object of %llu",
                 (unsigned long long)m->unit_bytes, (unsigned long long)st->slot_bytes);
        rc = KVS_ECONFIG;
    } else if (rc == KVS_OK && (m->unit_bytes / st->slot_bytes) * m->n_units >= PG_MAX_SLOTS) {
        snprintf(why, why_len, "%u units of %llu objects each are more than the tier indexes (%u)",
                 m->n_units, (unsigned long long)(m->unit_bytes / st->slot_bytes), PG_MAX_SLOTS);
        rc = KVS_ECONFIG;
    }
    return rc;
}

/* Connect and take the lender's HELLO within timeout_ms. KVS_OK with the link up; otherwise the
 * reason is in st->error and nothing is held. */
static kvs_status link_connect(pg_state *st, uint64_t timeout_ms) {
    int sock = -1;
    kvs_status rc = connect_socket(st, &sock);
    if (rc != KVS_OK) return rc;
    kvs_lend_msg m = {0};
    int fd = -1;
    char why[256];
    rc = receive_hello(st, sock, timeout_ms, &m, &fd, why, sizeof why);
    uint8_t *region = NULL;
    int device = -1;
    if (rc == KVS_OK) rc = pg_region_open(st, &m, fd, &region, &device, why, sizeof why);
    if (fd >= 0) close(fd);
    if (rc == KVS_OK) {
        pthread_mutex_lock(&st->lock);
        wait_copies(st);
        rc = take_region(st, &m, region, device);
        if (rc == KVS_OK) {
            st->sock = sock;
            st->stats.lenders++;
            pthread_cond_broadcast(&st->changed);
        }
        pthread_mutex_unlock(&st->lock);
        if (rc != KVS_OK) snprintf(why, sizeof why, "out of memory for its slots");
    }
    if (rc != KVS_OK) {
        pg_region_close(st, region, m.region_bytes, m.region_kind, device);
        pg_set_error(st, "lender at %s refused: %s", st->socket_path, why);
        kvs_lend_msg bye = {.type = KVS_LEND_BYE};
        char ignored[64];
        kvs_lend_send(sock, &bye, -1, 0, ignored, sizeof ignored);
        close(sock);
        return rc;
    }
    char where[64] = "host memory";
    if (m.region_kind == KVS_LEND_REGION_CUDA)
        snprintf(where, sizeof where, "cuda:%u, opened on cuda:%d", m.device, device);
    pg_log(st, KVS_LOG_INFO,
           "peer_gpu tier \"%s\": lender at %s lends up to %u units of %llu bytes (%s)",
           st->tier_name, st->socket_path, m.n_units, (unsigned long long)m.unit_bytes, where);
    return KVS_OK;
}

/* The lender is lost (lock held): no unit is usable from now on; what they held is gone; the
 * mapping is dropped once the copies in flight end. */
/* Let go of the lender (lock held): no unit usable, the mapping dropped once the copies in flight
 * end, then BYE (waiting at most bye_ms for room) and the socket closed. The BYE promises the
 * mapping is gone: a lender that still reads takes its units back at once instead of keeping them
 * until this process ends. */
static void let_go(pg_state *st, int bye_ms) {
    kvs_borrower_lender_died(&st->borrower);
    wait_copies(st);
    pg_region_close(st, st->region, st->region_bytes, st->region_kind, st->region_device);
    st->region = NULL;
    kvs_lend_msg m = {.type = KVS_LEND_BYE};
    char ignored[64];
    kvs_lend_send(st->sock, &m, -1, bye_ms, ignored, sizeof ignored);
    close(st->sock);
    st->sock = -1;
    pthread_cond_broadcast(&st->changed);
}

static void link_lost(pg_state *st, const char *why) {
    kvs_borrower_lender_died(&st->borrower);
    for (uint32_t u = 0; u < st->borrower.n_units; u++) pg_empty_unit(st, u, 0);
    st->stats.lost_lenders++;
    let_go(st, 0);
    pg_log(st, KVS_LOG_WARN, "peer_gpu tier \"%s\": lost the lender at %s (%s)", st->tier_name,
           st->socket_path, why);
}

/* Answer one message of the lender (lock held). 0; or, when the link is to end, a sentence why. */
static const char *on_lender_message(pg_state *st, const kvs_lend_msg *m) {
    char why[256];
    int release = 0;
    switch (m->type) {
        case KVS_LEND_OFFER: {
            kvs_status rc = kvs_borrower_on_offer(&st->borrower, m->unit, m->epoch);
            kvs_lend_msg a = {.type = rc == KVS_OK ? KVS_LEND_ACCEPT : KVS_LEND_DECLINE,
                              .unit = m->unit,
                              .epoch = m->epoch};
            if (kvs_lend_send(st->sock, &a, -1, (int)st->opt.send_timeout_ms, why, sizeof why) !=
                KVS_OK) {
                /* the lender may take the offer back as never accepted: nothing may start on it */
                kvs_borrower_lender_died(&st->borrower);
                return "it reads none of the tier's answers";
            }
            if (rc == KVS_OK) {
                st->stats.accepted++;
                pg_unit_lent(st, m->unit);
            } else {
                st->stats.declined++;
            }
            return NULL;
        }
        case KVS_LEND_RECLAIM:
            if (kvs_borrower_on_reclaim(&st->borrower, m->unit, m->epoch, 0, &release) != KVS_OK)
                return NULL; /* stale: about an earlier lending of the unit */
            pg_empty_unit(st, m->unit, 1);
            if (pg_unit_empty(st, m->unit)) kvs_borrower_drained(&st->borrower, m->unit, &release);
            if (release) pg_send_released(st, m->unit);
            return NULL;
        case KVS_LEND_BYE: return "it said BYE";
        default: return "a message out of place"; /* a HELLO again, or a borrower's message */
    }
}

static void drain_wake(pg_state *st) {
    char buf[64];
    while (read(st->wake[0], buf, sizeof buf) > 0) {
    }
}

static void *link_thread(void *arg) {
    pg_state *st = arg;
    for (;;) {
        pthread_mutex_lock(&st->lock);
        int stop = st->stop, sock = st->sock;
        pthread_mutex_unlock(&st->lock);
        if (stop) break;
        if (sock < 0) {
            struct pollfd p = {.fd = st->wake[0], .events = POLLIN};
            if (poll(&p, 1, (int)st->opt.retry_ms) > 0) {
                drain_wake(st);
                continue;
            }
            if (link_connect(st, st->opt.connect_timeout_ms) != KVS_OK &&
                strcmp(st->error, st->logged) != 0) {
                /* each new reason once: a lender that refuses the tier is not retried in silence */
                pg_log(st, KVS_LOG_WARN, "%s; trying again every %llu ms", st->error,
                       (unsigned long long)st->opt.retry_ms);
                snprintf(st->logged, sizeof st->logged, "%s", st->error);
            }
            continue;
        }
        struct pollfd p[2] = {{.fd = sock, .events = POLLIN},
                              {.fd = st->wake[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0) continue;
        if (p[1].revents) {
            drain_wake(st);
            continue;
        }
        kvs_lend_msg m;
        int fd = -1;
        char why[256];
        pthread_mutex_lock(&st->lock);
        kvs_status rc = kvs_lend_recv(sock, 0, st->borrower.n_units, &m, &fd, why, sizeof why);
        if (fd >= 0) close(fd);
        const char *end = rc == KVS_OK ? on_lender_message(st, &m) : NULL;
        if (end)
            link_lost(st, end);
        else if (rc == KVS_EIO || rc == KVS_EINVAL)
            link_lost(st, why);
        pthread_mutex_unlock(&st->lock);
    }
    return NULL;
}

kvs_status pg_link_start(pg_state *st) {
    if (pipe2(st->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        pg_set_error(st, "pipe: %s", strerror(errno));
        return KVS_EIO;
    }
    if (link_connect(st, st->opt.connect_timeout_ms) != KVS_OK) {
        /* not an error: the tier is empty until a lender comes (peer_gpu.h) */
        pg_log(st, KVS_LOG_WARN, "%s; the tier stays empty and tries again every %llu ms",
               st->error, (unsigned long long)st->opt.retry_ms);
        snprintf(st->logged, sizeof st->logged, "%s", st->error);
    }
    if (pthread_create(&st->link, NULL, link_thread, st) != 0) {
        pg_set_error(st, "cannot start its link thread");
        pthread_mutex_lock(&st->lock);
        if (st->sock >= 0) link_lost(st, "the tier could not start");
        pthread_mutex_unlock(&st->lock);
        close(st->wake[0]);
        close(st->wake[1]);
        return KVS_ENOMEM;
    }
    return KVS_OK;
}

void pg_link_stop(pg_state *st) {
    if (st->wake[1] < 0) return;
    pthread_mutex_lock(&st->lock);
    st->stop = 1;
    pthread_mutex_unlock(&st->lock);
    ssize_t ignored = write(st->wake[1], "x", 1);
    (void)ignored;
    pthread_join(st->link, NULL);
    pthread_mutex_lock(&st->lock);
    if (st->sock >= 0) let_go(st, (int)st->opt.send_timeout_ms);
    pthread_mutex_unlock(&st->lock);
    close(st->wake[0]);
    close(st->wake[1]);
    st->wake[0] = st->wake[1] = -1;
}
