#include "http_get.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* target -> host, port, path. 0 or -1. */
static int split(const char *target, char *host, size_t host_len, char *port, size_t port_len,
                 char *path, size_t path_len) {
    const char *p = target;
    if (!strncmp(p, "http://", 7)) p += 7;
    const char *slash = strchr(p, '/');
    snprintf(path, path_len, "%s", slash ? slash : "/metrics");
    size_t hp = slash ? (size_t)(slash - p) : strlen(p);
    char hostport[300];
    if (hp == 0 || hp >= sizeof hostport) return -1;
    memcpy(hostport, p, hp);
    hostport[hp] = '\0';
    char *colon;
    if (hostport[0] == '[') {
        char *close = strchr(hostport, ']');
        if (!close || close[1] != ':') return -1;
        *close = '\0';
        snprintf(host, host_len, "%s", hostport + 1);
        colon = close + 1;
    } else {
        colon = strrchr(hostport, ':');
        if (!colon) return -1;
        *colon = '\0';
        snprintf(host, host_len, "%s", hostport);
    }
    snprintf(port, port_len, "%s", colon + 1);
    return port[0] && strspn(port, "0123456789") == strlen(port) ? 0 : -1;
}

int http_is_endpoint(const char *target) {
    char host[256], port[16], path[256];
    if (!strncmp(target, "http://", 7)) return 1;
    return split(target, host, sizeof host, port, sizeof port, path, sizeof path) == 0;
}

static int wait_fd(int fd, short events, long long deadline) {
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0) return 0;
        struct pollfd pfd = {.fd = fd, .events = events};
        int rc = poll(&pfd, 1, (int)left);
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

int http_get(const char *target, int timeout_ms, char **body, size_t *len, char *err,
             size_t err_len) {
    char host[256], port[16], path[256];
    *body = NULL;
    *len = 0;
    if (split(target, host, sizeof host, port, sizeof port, path, sizeof path) != 0) {
        snprintf(err, err_len, "%s: not HOST:PORT or http://HOST:PORT/PATH", target);
        return -1;
    }
    long long deadline = now_ms() + timeout_ms;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        snprintf(err, err_len, "%s: %s", target, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    char why[128] = "no address";
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (wait_fd(fd, POLLOUT, deadline) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                break;
            snprintf(why, sizeof why, "%s", soerr ? strerror(soerr) : "connect timed out");
        } else {
            snprintf(why, sizeof why, "%s", strerror(errno));
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot connect (%s)", target, why);
        return -1;
    }
    char req[640];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\nAccept: text/plain\r\n\r\n",
                     path, host);
    for (int off = 0; off < n;) {
        if (wait_fd(fd, POLLOUT, deadline) != 1) goto timeout;
        ssize_t w = send(fd, req + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(err, err_len, "%s: send: %s", target, strerror(errno));
            goto fail;
        }
        if (w > 0) off += (int)w;
    }
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        snprintf(err, err_len, "%s: out of memory", target);
        goto fail;
    }
    for (;;) {
        if (got == cap) {
            if (cap >= HTTP_GET_MAX_BODY) {
                free(buf);
                snprintf(err, err_len, "%s: answer larger than %u bytes", target,
                         HTTP_GET_MAX_BODY);
                goto fail;
            }
            char *bigger = realloc(buf, cap * 2 + 1);
            if (!bigger) {
                free(buf);
                snprintf(err, err_len, "%s: out of memory", target);
                goto fail;
            }
            buf = bigger;
            cap *= 2;
        }
        if (wait_fd(fd, POLLIN, deadline) != 1) {
            free(buf);
            goto timeout;
        }
        ssize_t r = recv(fd, buf + got, cap - got, 0);
        if (r == 0) break;
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            free(buf);
            snprintf(err, err_len, "%s: recv: %s", target, strerror(errno));
            goto fail;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    int code = 0;
    char *head_end = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*d.%*d %d", &code) != 1 || !head_end) {
        free(buf);
        snprintf(err, err_len, "%s: not an HTTP answer", target);
        return -1;
    }
    if (code != 200) {
        char *eol = strstr(buf, "\r\n");
        if (eol) *eol = '\0';
        snprintf(err, err_len, "%s%s: answered \"%s\"", target, path, buf);
        free(buf);
        return -1;
    }
    size_t off = (size_t)(head_end + 4 - buf);
    memmove(buf, buf + off, got - off + 1);
    *body = buf;
    *len = got - off;
    return 0;

timeout:
    snprintf(err, err_len, "%s: no answer within %d ms", target, timeout_ms);
fail:
    close(fd);
    return -1;
}
