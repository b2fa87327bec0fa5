/* metrics.c - the instances of this process (metrics.h): one per segment name, shared by every
 * handle, store and node of the process that names it, each with a thread that polls the sources
 * whose counters are atomics, folds the slots of processes gone, retries the bind while another
 * process serves, and runs the HTTP endpoint. */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "metrics_http.h"
#include "metrics_render.h"

#define BIND_RETRY_MS 1000
#define SWEEP_MS      2000
#define LOOP_MS       250

typedef struct instance instance;

struct kvs_metrics_source {
    instance *in;
    int slot;
    pid_t pid; /* the process that attached it: a forked child's copy is not its own */
    kvs_metrics_poll_fn poll;
    void *ctx;
    kvs_mseg_values v; /* poll sources: the identity and the last values */
    /* kvs_metrics_stage: its owner's values, under a sequence counter (odd while written) */
    int staging;
    uint64_t stage_seq;
    kvs_mseg_values staged;
    kvs_metrics_source *next;
};

struct instance {
    pid_t pid; /* the process whose thread it has: a forked child makes its own */
    char name[KVS_MSEG_NAME_MAX], listen[128];
    int log_level;
    int refs;
    kvs_mseg seg;
    pthread_t thread;
    int wake[2]; /* a byte on wake[1] stops the thread */
    int serving;
    /* held by the thread while it binds or steps the server (never across its poll), so a fork
     * never copies a socket the records below do not hold yet */
    pthread_mutex_t io_lock;
    int forking; /* io_lock taken by fork_prepare */
    kvs_mhttp http;
    pthread_mutex_t lock; /* the sources list (poll callbacks run under it) */
    kvs_metrics_source *sources;
    instance *next;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static instance *g_instances;

/* A fork while another thread holds g_lock would leave the child's copy locked for good. The
 * instances' sockets are held still too (io_lock) so the child can close every one it copied. */
static void fork_prepare(void) {
    pthread_mutex_lock(&g_lock);
    pid_t me = getpid();
    for (instance *in = g_instances; in; in = in->next)
        if (in->pid == me) {
            pthread_mutex_lock(&in->io_lock);
            in->forking = 1;
        }
}
static void unlock_forking(void) {
    for (instance *in = g_instances; in; in = in->next)
        if (in->forking) {
            in->forking = 0;
            pthread_mutex_unlock(&in->io_lock);
        }
}
static void fork_parent(void) {
    unlock_forking();
    pthread_mutex_unlock(&g_lock);
}
static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}
/* The child has one thread and none of its parents' instance threads: the copies of their
 * listening socket (SOCK_CLOEXEC acts on exec only), clients and wake pipe are closed, or the
 * child would keep the port bound after the serving process exits (nobody could take over) and
 * leave scrapes hanging in the backlog. */
static void fork_child(void) {
    unlock_forking();
    pid_t me = getpid();
    for (instance *in = g_instances; in; in = in->next) {
        if (in->pid == me) continue;
        close_fd(&in->http.listen_fd);
        for (int k = 0; k < KVS_MHTTP_CLIENTS; k++) close_fd(&in->http.clients[k].fd);
        close_fd(&in->wake[0]);
        close_fd(&in->wake[1]);
    }
    pthread_mutex_unlock(&g_lock);
}
static void register_atfork(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}
static pthread_once_t g_atfork = PTHREAD_ONCE_INIT;

/* Words copied one relaxed atomic at a time (the owner may be writing them). */
static void copy_words(void *dst, const void *src, size_t bytes) {
    uint64_t *d = dst;
    const uint64_t *s = src;
    for (size_t i = 0; i < bytes / 8; i++)
        __atomic_store_n(&d[i], __atomic_load_n(&s[i], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* The staged values into s->v when a consistent copy comes in a few tries (else s->v stays). */
static void take_staged(kvs_metrics_source *s) {
    if (!s->staging) return;
    kvs_mseg_values tmp;
    for (int tries = 0; tries < 100; tries++) {
        uint64_t a = __atomic_load_n(&s->stage_seq, __ATOMIC_ACQUIRE);
        if (a == 0) return; /* nothing staged yet */
        if (a & 1) {
            sched_yield();
            continue;
        }
        copy_words(&tmp, &s->staged, sizeof tmp);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&s->stage_seq, __ATOMIC_RELAXED) == a) {
            s->v = tmp;
            return;
        }
    }
}

static kvs_status render_instance(void *ctx, char **text, size_t *len) {
    instance *in = ctx;
    return kvs_metrics_render_seg(&in->seg, text, len);
}

static void poll_sources(instance *in) {
    pthread_mutex_lock(&in->lock);
    for (kvs_metrics_source *s = in->sources; s; s = s->next) {
        kvs_mseg_heartbeat(&in->seg,
                           s->slot); /* every source's, those that publish themselves too */
        if (!s->poll) continue;
        take_staged(s);
        s->poll(s->ctx, &s->v, 0);
        kvs_mseg_publish(&in->seg, s->slot, &s->v);
    }
    pthread_mutex_unlock(&in->lock);
}

static void try_bind(instance *in, int *warned) {
    if (kvs_mhttp_listen(&in->http, in->listen) == 0) {
        __atomic_store_n(&in->serving, 1, __ATOMIC_RELEASE);
        kvs_log(in->log_level, KVS_LOG_INFO, "metrics: serving http://%s/metrics (segment %s)",
                in->listen, in->name);
        return;
    }
    if (errno != EADDRINUSE && !*warned) { /* in use: another process of the instance serves */
        *warned = 1;
        kvs_log(in->log_level, KVS_LOG_WARN,
                "metrics: cannot listen on %s (%s); retrying every %d ms", in->listen,
                strerror(errno), BIND_RETRY_MS);
    }
}

static void *instance_thread(void *arg) {
    instance *in = arg;
    uint64_t next_bind = 0, next_poll = 0, next_sweep = 0;
    int warned = 0;
    for (;;) {
        uint64_t now = kvs_now_ns();
        if (in->http.listen_fd < 0 && now >= next_bind) {
            pthread_mutex_lock(&in->io_lock);
            try_bind(in, &warned);
            pthread_mutex_unlock(&in->io_lock);
            next_bind = now + BIND_RETRY_MS * 1000000ull;
        }
        if (now >= next_poll) {
            poll_sources(in);
            next_poll = now + KVS_METRICS_POLL_MS * 1000000ull;
        }
        if (now >= next_sweep) {
            kvs_mseg_sweep(&in->seg);
            next_sweep = now + SWEEP_MS * 1000000ull;
        }
        struct pollfd fds[2 + KVS_MHTTP_CLIENTS];
        fds[0] = (struct pollfd){in->wake[0], POLLIN, 0};
        size_t n = 1 + kvs_mhttp_pollfds(&in->http, fds + 1, KVS_MHTTP_CLIENTS + 1);
        int rc = poll(fds, (nfds_t)n, LOOP_MS);
        if (rc > 0 && fds[0].revents) break;
        pthread_mutex_lock(&in->io_lock);
        kvs_mhttp_step(&in->http, fds + 1, rc > 0 ? n - 1 : 0); /* 0: deadlines only */
        pthread_mutex_unlock(&in->io_lock);
    }
    return NULL;
}

static void instance_free(instance *in) {
    kvs_mhttp_close(&in->http);
    kvs_mseg_close(&in->seg);
    if (in->wake[0] >= 0) close(in->wake[0]);
    if (in->wake[1] >= 0) close(in->wake[1]);
    pthread_mutex_destroy(&in->lock);
    pthread_mutex_destroy(&in->io_lock);
    free(in);
}

/* Under g_lock. */
static instance *instance_get(const char *listen_at, const char *name, int log_level) {
    pid_t me = getpid();
    for (instance *in = g_instances; in; in = in->next)
        if (in->pid == me && strcmp(in->name, name) == 0) {
            in->refs++;
            return in;
        }
    instance *in = calloc(1, sizeof *in);
    if (!in) return NULL;
    in->pid = me;
    snprintf(in->name, sizeof in->name, "%s", name);
    snprintf(in->listen, sizeof in->listen, "%s", listen_at);
    in->log_level = log_level;
    in->wake[0] = in->wake[1] = -1;
    pthread_mutex_init(&in->lock, NULL);
    pthread_mutex_init(&in->io_lock, NULL);
    kvs_mhttp_init(&in->http, render_instance, in);
    char err[300];
    if (kvs_mseg_open(name, 1, &in->seg, err, sizeof err) != KVS_OK) {
        kvs_log(log_level, KVS_LOG_WARN, "metrics: %s; metrics are off in this process", err);
        instance_free(in);
        return NULL;
    }
    if (pipe2(in->wake, O_CLOEXEC) != 0 ||
        pthread_create(&in->thread, NULL, instance_thread, in) != 0) {
        kvs_log(log_level, KVS_LOG_WARN, "metrics: cannot start the metrics thread (%s)",
                strerror(errno));
        instance_free(in);
        return NULL;
    }
    in->refs = 1;
    in->next = g_instances;
    g_instances = in;
    return in;
}

/* Under g_lock. */
static void instance_put(instance *in) {
    if (--in->refs > 0) return;
    for (instance **p = &g_instances; *p; p = &(*p)->next)
        if (*p == in) {
            *p = in->next;
            break;
        }
    char b = 1;
    ssize_t ignored = write(in->wake[1], &b, 1);
    (void)ignored;
    pthread_join(in->thread, NULL);
    instance_free(in);
}

kvs_metrics_source *kvs_metrics_attach(const char *listen_at, const char *name, int log_level,
                                       const kvs_mseg_values *identity, kvs_metrics_poll_fn poll,
                                       void *ctx) {
    kvs_metrics_source *src = calloc(1, sizeof *src);
    if (!src) return NULL;
    pthread_once(&g_atfork, register_atfork);
    src->pid = getpid();
    pthread_mutex_lock(&g_lock);
    instance *in = instance_get(listen_at, name, log_level);
    if (in) src->slot = kvs_mseg_claim(&in->seg, identity);
    if (in && src->slot < 0) {
        instance_put(in);
        in = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    if (!in) {
        free(src);
        return NULL;
    }
    src->in = in;
    src->poll = poll;
    src->ctx = ctx;
    src->v = *identity;
    pthread_mutex_lock(&in->lock);
    src->next = in->sources;
    in->sources = src;
    pthread_mutex_unlock(&in->lock);
    return src;
}

void kvs_metrics_publish(kvs_metrics_source *src, const kvs_mseg_values *v) {
    if (src) kvs_mseg_publish(&src->in->seg, src->slot, v);
}

void kvs_metrics_stage(kvs_metrics_source *src, const kvs_mseg_values *v) {
    if (!src) return;
    uint64_t q = __atomic_load_n(&src->stage_seq, __ATOMIC_RELAXED);
    __atomic_store_n(&src->stage_seq, q + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    copy_words(&src->staged, v, sizeof *v);
    __atomic_store_n(&src->stage_seq, q + 2, __ATOMIC_RELEASE);
    __atomic_store_n(&src->staging, 1, __ATOMIC_RELEASE);
}

void kvs_metrics_detach(kvs_metrics_source *src) {
    if (!src) return;
    if (src->pid != getpid()) {
        /* a forked child's copy: the slot, the thread and its wake pipe are the parent's, and the
         * instance's lock may have been held by that thread at the fork */
        free(src);
        return;
    }
    instance *in = src->in;
    pthread_mutex_lock(&in->lock);
    for (kvs_metrics_source **p = &in->sources; *p; p = &(*p)->next)
        if (*p == src) {
            *p = src->next;
            break;
        }
    if (src->poll) { /* what changed since the thread's last poll */
        take_staged(src);
        src->poll(src->ctx, &src->v, 1);
        kvs_mseg_publish(&in->seg, src->slot, &src->v);
    }
    pthread_mutex_unlock(&in->lock);
    kvs_mseg_release(&in->seg, src->slot);
    free(src);
    pthread_mutex_lock(&g_lock);
    instance_put(in);
    pthread_mutex_unlock(&g_lock);
}

int kvs_metrics_serving(const char *name) {
    int serving = 0;
    pthread_mutex_lock(&g_lock);
    for (instance *in = g_instances; in; in = in->next)
        if (in->pid == getpid() && strcmp(in->name, name) == 0)
            serving = __atomic_load_n(&in->serving, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&g_lock);
    return serving;
}

kvs_status kvs_metrics_render_named(const char *name, char **text, size_t *len, char *err,
                                    size_t err_len) {
    if (!name || !text || !len) return kvs_fmt(err, err_len, "metrics: NULL argument"), KVS_EINVAL;
    *text = NULL;
    *len = 0;
    kvs_mseg seg;
    kvs_status st = kvs_mseg_open(name, 0, &seg, err, err_len);
    if (st != KVS_OK) return st;
    st = kvs_metrics_render_seg(&seg, text, len);
    kvs_mseg_close(&seg);
    if (st == KVS_ENOMEM) kvs_fmt(err, err_len, "metrics: out of memory");
    if (st == KVS_EAGAIN) kvs_fmt(err, err_len, "metrics: the segment kept changing; try again");
    return st;
}

int kvs_metrics_check_listen(const char *listen, char *why, size_t why_len) {
    const char *colon = strrchr(listen, ':');
    char *end = NULL;
    unsigned long port = colon && colon[1] ? strtoul(colon + 1, &end, 10) : 0;
    if (!colon || colon == listen || !colon[1] || *end || port == 0 || port > 65535) {
        snprintf(why, why_len, "expected HOST:PORT (port 1..65535), found '%s'", listen);
        return -1;
    }
    return 0;
}

int kvs_metrics_name_char_ok(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
}

void kvs_metrics_default_name(const char *listen, char *out, size_t cap) {
    char host_port[128];
    size_t n = 0;
    for (const char *p = listen; *p && n + 1 < sizeof host_port; p++)
        host_port[n++] = kvs_metrics_name_char_ok(*p) ? *p : '_';
    host_port[n] = '\0';
    snprintf(out, cap, "kvs%u-%s", (unsigned)getuid(), host_port);
}
