/* redis_conn.c - a non-blocking socket to a Redis server, optionally under TLS (contract in
 * redis_conn.h). */
#include "redis_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "abi/kvstrata.h"
#include "common/clock.h"

int kvs_redis_endpoint_parse(const char *text, kvs_redis_endpoint *ep, char *why, size_t why_len) {
    memset(ep, 0, sizeof *ep);
    size_t len = strlen(text);
    if (len == 0 || len >= sizeof ep->name) {
        snprintf(why, why_len, "node \"%.80s\" is empty or too long", text);
        return -1;
    }
    memcpy(ep->name, text, len + 1);
    if (strchr(text, '/')) {
        if (len >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
            snprintf(why, why_len, "unix socket path \"%.80s\" is longer than %zu bytes", text,
                     sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
            return -1;
        }
        return 0;
    }
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text) {
        snprintf(why, why_len, "node \"%.80s\" is not HOST:PORT or a unix socket path", text);
        return -1;
    }
    char *end = NULL;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end != '\0' || errno != 0 || port < 1 ||
        port > 65535) {
        snprintf(why, why_len, "node \"%.80s\" has no port in 1..65535", text);
        return -1;
    }
    const char *host = text;
    size_t host_len = (size_t)(colon - text);
    if (host[0] == '[' && host_len >= 2 && host[host_len - 1] == ']') {
        host++;
        host_len -= 2;
    }
    if (host_len == 0 || host_len >= sizeof ep->host) {
        snprintf(why, why_len, "node \"%.80s\" has an empty or too long host", text);
        return -1;
    }
    memcpy(ep->host, host, host_len);
    ep->host[host_len] = '\0';
    ep->port = (uint16_t)port;
    return 0;
}

static int remaining_ms(uint64_t deadline_ns) {
    uint64_t now = kvs_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 600000 ? 600000 : (int)ms;
}

/* Wait for events on fd until deadline: 1 when they came, 0 on timeout, -1 on a poll failure. */
static int wait_fd(int fd, short events, uint64_t deadline_ns) {
    for (;;) {
        int ms = remaining_ms(deadline_ns);
        if (ms == 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r > 0) return 1;
    }
}

static int connect_unix(const kvs_redis_endpoint *ep, char *why, size_t why_len) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, why_len, "%s: socket: %s", ep->name, strerror(errno));
        return -1;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", ep->name);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        snprintf(why, why_len, "%s: connect: %s", ep->name, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int connect_tcp(const kvs_redis_endpoint *ep, uint64_t deadline_ns, int *timed_out,
                       char *why, size_t why_len) {
    char port[8];
    snprintf(port, sizeof port, "%u", ep->port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *list = NULL;
    int gai = getaddrinfo(ep->host, port, &hints, &list);
    if (gai != 0) {
        snprintf(why, why_len, "%s: cannot resolve host: %s", ep->name, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    snprintf(why, why_len, "%s: no address", ep->name);
    for (struct addrinfo *a = list; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            snprintf(why, why_len, "%s: socket: %s", ep->name, strerror(errno));
            continue;
        }
        int err = 0;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                int w = wait_fd(fd, POLLOUT, deadline_ns);
                socklen_t sl = sizeof err;
                if (w == 0) {
                    err = ETIMEDOUT;
                    *timed_out = 1;
                } else if (w < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0) {
                    err = errno;
                }
            }
        }
        if (err != 0) {
            snprintf(why, why_len, "%s: connect: %s", ep->name, strerror(err));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(list);
    if (fd >= 0) {
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

static void tls_reason(char *why, size_t why_len, const char *what, const kvs_redis_endpoint *ep,
                       SSL *ssl) {
    unsigned long e = ERR_get_error();
    char buf[256] = "";
    if (e) ERR_error_string_n(e, buf, sizeof buf);
    long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (v != X509_V_OK)
        snprintf(why, why_len, "%s: TLS %s: certificate not accepted (%s)", ep->name, what,
                 X509_verify_cert_error_string(v));
    else
        snprintf(why, why_len, "%s: TLS %s failed%s%s", ep->name, what, buf[0] ? ": " : "", buf);
    ERR_clear_error();
}

/* OpenSSL's own socket BIO writes with write(2), which raises SIGPIPE when the server has reset the
 * connection (a C engine that leaves SIGPIPE at its default would die): this one sends with
 * MSG_NOSIGNAL. The fd is kept as data + 1 so that 0 means unset. */
static int bio_fd(BIO *b) {
    return (int)(intptr_t)BIO_get_data(b) - 1;
}

static int bio_write(BIO *b, const char *buf, int len) {
    BIO_clear_retry_flags(b);
    ssize_t k = send(bio_fd(b), buf, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)k;
}

static int bio_read(BIO *b, char *buf, int len) {
    BIO_clear_retry_flags(b);
    ssize_t k = recv(bio_fd(b), buf, (size_t)len, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
    return (int)k;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)b, (void)num, (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static void bio_method_make(void) {
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "kvstrata redis");
    if (m && (!BIO_meth_set_write(m, bio_write) || !BIO_meth_set_read(m, bio_read) ||
              !BIO_meth_set_ctrl(m, bio_ctrl))) {
        BIO_meth_free(m);
        m = NULL;
    }
    bio_method = m; /* kept for the process's life: sessions of every tier use it */
}

static int tls_start(kvs_redis_conn *c, const kvs_redis_endpoint *ep, SSL_CTX *ctx,
                     const char *server_name, uint64_t deadline_ns, int *timed_out, char *why,
                     size_t why_len) {
    ERR_clear_error();
    pthread_once(&bio_once, bio_method_make);
    c->ssl = SSL_new(ctx);
    BIO *bio = bio_method && c->ssl ? BIO_new(bio_method) : NULL;
    if (!bio) {
        tls_reason(why, why_len, "setup", ep, NULL);
        return -1;
    }
    BIO_set_data(bio, (void *)(intptr_t)(c->fd + 1));
    BIO_set_init(bio, 1);
    SSL_set_bio(c->ssl, bio, bio);
    const char *name = server_name && server_name[0] ? server_name : ep->host;
    unsigned char addr[16];
    int is_ip = inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1;
    if (name[0]) {
        X509_VERIFY_PARAM *param = SSL_get0_param(c->ssl);
        int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name) : SSL_set1_host(c->ssl, name);
        if (!is_ip) ok = ok && SSL_set_tlsext_host_name(c->ssl, name);
        if (ok != 1) {
            tls_reason(why, why_len, "setup", ep, NULL);
            return -1;
        }
    }
    for (;;) {
        ERR_clear_error();
        int r = SSL_connect(c->ssl);
        if (r == 1) return 0;
        int e = SSL_get_error(c->ssl, r);
        short ev = e == SSL_ERROR_WANT_READ ? POLLIN : e == SSL_ERROR_WANT_WRITE ? POLLOUT : 0;
        if (ev == 0) {
            tls_reason(why, why_len, "handshake", ep, c->ssl);
            return -1;
        }
        int w = wait_fd(c->fd, ev, deadline_ns);
        if (w <= 0) {
            if (w == 0) *timed_out = 1;
            snprintf(why, why_len, "%s: TLS handshake %s", ep->name,
                     w == 0 ? "timed out" : "failed");
            return -1;
        }
    }
}

int kvs_redis_conn_open(kvs_redis_conn *c, const kvs_redis_endpoint *ep, SSL_CTX *ctx,
                        const char *server_name, uint64_t deadline_ns, char *why, size_t why_len) {
    memset(c, 0, sizeof *c);
    int timed_out = 0;
    c->fd = ep->host[0] ? connect_tcp(ep, deadline_ns, &timed_out, why, why_len)
                        : connect_unix(ep, why, why_len);
    if (c->fd < 0) return timed_out ? KVS_ETIMEDOUT : KVS_EIO;
    if (ctx && tls_start(c, ep, ctx, server_name, deadline_ns, &timed_out, why, why_len) != 0) {
        kvs_redis_conn_close(c);
        return timed_out ? KVS_ETIMEDOUT : KVS_EIO;
    }
    return KVS_OK;
}

static int64_t tls_result(kvs_redis_conn *c, int ok, size_t done, int reading) {
    if (ok == 1) return (int64_t)done;
    int e = SSL_get_error(c->ssl, 0);
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_READ) {
        if (!reading) c->write_wants_read = 1;
        return KVS_REDIS_IO_AGAIN;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
        if (reading) c->read_wants_write = 1;
        return KVS_REDIS_IO_AGAIN;
    }
    return KVS_REDIS_IO_ERROR;
}

int64_t kvs_redis_conn_readv(kvs_redis_conn *c, const struct iovec *iov, int n) {
    if (c->fd < 0) return KVS_REDIS_IO_ERROR;
    if (!c->ssl) {
        for (;;) {
            ssize_t r = readv(c->fd, iov, n);
            if (r > 0) return r;
            if (r == 0) return KVS_REDIS_IO_ERROR; /* the server closed the connection */
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? KVS_REDIS_IO_AGAIN
                                                           : KVS_REDIS_IO_ERROR;
        }
    }
    c->read_wants_write = 0;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len == 0) continue;
        size_t got = 0;
        ERR_clear_error();
        int ok = SSL_read_ex(c->ssl, iov[i].iov_base, iov[i].iov_len, &got);
        if (ok != 1) {
            int64_t r = tls_result(c, ok, 0, 1);
            return total > 0 ? total : r; /* a failure after bytes shows on the next read */
        }
        total += (int64_t)got;
        if (got < iov[i].iov_len) break;
    }
    return total;
}

int64_t kvs_redis_conn_writev(kvs_redis_conn *c, const struct iovec *iov, int n) {
    if (c->fd < 0) return KVS_REDIS_IO_ERROR;
    if (!c->ssl) {
        for (;;) {
            struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
            ssize_t r = sendmsg(c->fd, &m, MSG_NOSIGNAL); /* a reset peer must not raise SIGPIPE */
            if (r >= 0) return r;
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? KVS_REDIS_IO_AGAIN
                                                           : KVS_REDIS_IO_ERROR;
        }
    }
    c->write_wants_read = 0;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len == 0) continue;
        size_t done = 0;
        ERR_clear_error();
        int ok = SSL_write_ex(c->ssl, iov[i].iov_base, iov[i].iov_len, &done);
        return tls_result(c, ok, done, 0);
    }
    return 0;
}

short kvs_redis_conn_events(const kvs_redis_conn *c, int want_read, int want_write) {
    short ev = 0;
    if (want_read) ev |= c->read_wants_write ? POLLOUT : POLLIN;
    if (want_write) ev |= c->write_wants_read ? POLLIN : POLLOUT;
    return ev;
}

int kvs_redis_conn_pending(const kvs_redis_conn *c) {
    return c->ssl && SSL_pending(c->ssl) > 0;
}

void kvs_redis_conn_close(kvs_redis_conn *c) {
    if (c->ssl) {
        SSL_free(c->ssl); /* no close_notify: the socket may be dead, and closing must not block */
        c->ssl = NULL;
    }
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->read_wants_write = c->write_wants_read = 0;
}
