/* metrics_http.c - the Prometheus endpoint (metrics_http.h). Non-blocking sockets under the instance
 * thread's poll: a client that sends garbage, too much or nothing is answered or closed at its
 * deadline, and no engine thread ever waits on it. */
#include "metrics_http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"

void kvs_mhttp_init(kvs_mhttp *s, kvs_mhttp_render_fn render, void *ctx) {
    memset(s, 0, sizeof *s);
    s->listen_fd = -1;
    for (int i = 0; i < KVS_MHTTP_CLIENTS; i++) s->clients[i].fd = -1;
    s->render = render;
    s->ctx = ctx;
}

static int resolve(kvs_mhttp *s, const char *listen_at) {
    char host[128];
    const char *colon = strrchr(listen_at, ':');
    if (!colon || (size_t)(colon - listen_at) >= sizeof host) return errno = EINVAL, -1;
    uint64_t now = kvs_now_ns();
    if (now < s->resolve_after_ns) return errno = EINVAL, -1;
    memcpy(host, listen_at, (size_t)(colon - listen_at));
    host[colon - listen_at] = '\0';
    char *h = host;
    size_t hl = strlen(h);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') h[hl - 1] = '\0', h++; /* [::1]:9400 */
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(*h ? h : NULL, colon + 1, &hints, &res) != 0 || !res) {
        s->resolve_after_ns = now + KVS_MHTTP_RESOLVE_RETRY_MS * 1000000ull;
        return errno = EINVAL, -1;
    }
    s->n_addrs = 0;
    for (struct addrinfo *ai = res; ai && s->n_addrs < KVS_MHTTP_ADDRS; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof s->addrs[0]) continue;
        memcpy(&s->addrs[s->n_addrs], ai->ai_addr, ai->ai_addrlen);
        s->addr_lens[s->n_addrs++] = (unsigned)ai->ai_addrlen;
    }
    freeaddrinfo(res);
    s->resolved = 1;
    return 0;
}

int kvs_mhttp_listen(kvs_mhttp *s, const char *listen_at) {
    if (!s->resolved && resolve(s, listen_at) != 0) return -1;
    int fd = -1, saved = EADDRINUSE;
    for (unsigned i = 0; i < s->n_addrs && fd < 0; i++) {
        const struct sockaddr *sa = (const struct sockaddr *)&s->addrs[i];
        fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one =
            1; /* a restarted server rebinds past TIME_WAIT; two live listeners still cannot */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, sa, (socklen_t)s->addr_lens[i]) != 0 || listen(fd, 16) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0) return errno = saved, -1;
    s->listen_fd = fd;
    return 0;
}

size_t kvs_mhttp_pollfds(const kvs_mhttp *s, struct pollfd *fds, size_t cap) {
    size_t n = 0;
    if (s->listen_fd >= 0 && n < cap &&
        (!s->accept_paused_until_ns || kvs_now_ns() >= s->accept_paused_until_ns))
        fds[n++] = (struct pollfd){s->listen_fd, POLLIN, 0};
    for (int i = 0; i < KVS_MHTTP_CLIENTS && n < cap; i++) {
        const kvs_mhttp_client *c = &s->clients[i];
        if (c->fd >= 0) fds[n++] = (struct pollfd){c->fd, c->out ? POLLOUT : POLLIN, 0};
    }
    return n;
}

static void drop(kvs_mhttp_client *c) {
    if (c->fd >= 0) close(c->fd);
    free(c->out);
    c->fd = -1;
    c->out = NULL;
    c->req_len = c->out_len = c->out_off = 0;
}

/* body NULL with body_len > 0: a HEAD answer, the length of what GET sends and no body. */
static void respond(kvs_mhttp_client *c, int code, const char *reason, const char *type,
                    const char *body, size_t body_len, const char *extra) {
    char head[512];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                     "Connection: close\r\n\r\n",
                     code, reason, type, body_len, extra ? extra : "");
    if (n < 0 || (size_t)n >= sizeof head) {
        drop(c);
        return;
    }
    size_t sent = body ? body_len : 0;
    c->out = malloc((size_t)n + sent);
    if (!c->out) {
        drop(c);
        return;
    }
    memcpy(c->out, head, (size_t)n);
    if (sent) memcpy(c->out + n, body, sent);
    c->out_len = (size_t)n + sent;
    c->out_off = 0;
}

static void plain(kvs_mhttp_client *c, int code, const char *reason, const char *extra) {
    char body[128];
    int n = snprintf(body, sizeof body, "%d %s\n", code, reason);
    respond(c, code, reason, "text/plain; charset=utf-8", body, (size_t)n, extra);
}

/* The request head is complete in c->req: answer it. */
static void answer(kvs_mhttp *s, kvs_mhttp_client *c) {
    char method[16], target[256], version[16];
    c->req[c->req_len] = '\0';
    if (sscanf(c->req, "%15s %255s %15s", method, target, version) != 3 ||
        strncmp(version, "HTTP/1.", 7) != 0) {
        plain(c, 400, "Bad Request", NULL);
        return;
    }
    char *query = strchr(target, '?');
    if (query) *query = '\0';
    if (strcmp(target, "/metrics") != 0) {
        plain(c, 404, "Not Found", NULL);
        return;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        plain(c, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
        return;
    }
    char *text = NULL;
    size_t len = 0;
    if (s->render(s->ctx, &text, &len) != KVS_OK) {
        plain(c, 503, "Service Unavailable", NULL);
        return;
    }
    /* HEAD: the length of what GET would send, no body */
    if (strcmp(method, "HEAD") == 0) {
        respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", NULL, len, NULL);
        free(text);
        return;
    }
    respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, len, NULL);
    free(text);
}

static void on_readable(kvs_mhttp *s, kvs_mhttp_client *c) {
    ssize_t n = recv(c->fd, c->req + c->req_len, sizeof c->req - 1 - c->req_len, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        drop(c);
        return;
    }
    if (n < 0) return;
    c->req_len += (size_t)n;
    c->req[c->req_len] = '\0';
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) {
        answer(s, c);
        return;
    }
    if (c->req_len >= sizeof c->req - 1) {
        plain(c, 431, "Request Header Fields Too Large", NULL);
        return;
    }
}

static void on_writable(kvs_mhttp_client *c) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        drop(c);
        return;
    }
    c->out_off += (size_t)n;
    if (c->out_off == c->out_len) drop(c);
}

static void accept_all(kvs_mhttp *s) {
    s->accept_paused_until_ns = 0;
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* out of descriptors (or kernel memory): the connection stays pending and would make
             * the listener readable at once; come back to it later */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                s->accept_paused_until_ns = kvs_now_ns() + KVS_MHTTP_ACCEPT_PAUSE_MS * 1000000ull;
            return;
        }
        kvs_mhttp_client *c = NULL;
        for (int i = 0; i < KVS_MHTTP_CLIENTS && !c; i++)
            if (s->clients[i].fd < 0) c = &s->clients[i];
        if (!c) { /* full: the oldest clients are served first; this one is told to retry */
            static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: "
                                       "0\r\nConnection: close\r\n\r\n";
            ssize_t ignored = send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)ignored;
            close(fd);
            continue;
        }
        c->fd = fd;
        c->req_len = 0;
        c->deadline_ns = kvs_now_ns() + KVS_MHTTP_TIMEOUT_MS * 1000000ull;
    }
}

void kvs_mhttp_step(kvs_mhttp *s, const struct pollfd *fds, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!fds[i].revents) continue;
        if (fds[i].fd == s->listen_fd) {
            accept_all(s);
            continue;
        }
        for (int k = 0; k < KVS_MHTTP_CLIENTS; k++) {
            kvs_mhttp_client *c = &s->clients[k];
            if (c->fd != fds[i].fd) continue;
            if (c->out && (fds[i].revents & (POLLOUT | POLLERR | POLLHUP)))
                on_writable(c);
            else if (!c->out && (fds[i].revents & (POLLIN | POLLERR | POLLHUP)))
                on_readable(s, c);
            break;
        }
    }
    uint64_t now = kvs_now_ns();
    for (int k = 0; k < KVS_MHTTP_CLIENTS; k++)
        if (s->clients[k].fd >= 0 && now > s->clients[k].deadline_ns) drop(&s->clients[k]);
}

void kvs_mhttp_close(kvs_mhttp *s) {
    for (int k = 0; k < KVS_MHTTP_CLIENTS; k++) drop(&s->clients[k]);
    if (s->listen_fd >= 0) close(s->listen_fd);
    s->listen_fd = -1;
}
