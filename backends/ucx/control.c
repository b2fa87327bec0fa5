/* control.c - the control connection's sockets and framing; see control.h for the contract. */
#include "control.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

static int ms_until(uint64_t deadline_ns) {
    unsigned long long now = kvs_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999ull) / 1000000ull;
    return ms > 60000 ? 60000 : (int)ms;
}

static kvs_status resolve(const char *host, uint16_t port, struct sockaddr_in *out, char *err,
                          size_t err_len) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        kvs_fmt(err, err_len, "cannot resolve \"%s\" to an IPv4 address: %s", host,
                gai_strerror(rc));
        return KVS_EINVAL;
    }
    memcpy(out, res->ai_addr, sizeof *out);
    out->sin_port = htons(port);
    freeaddrinfo(res);
    return KVS_OK;
}

kvs_status kvs_control_listen(const char *host, uint16_t port, int *fd_out, uint16_t *port_out,
                              char *err, size_t err_len) {
    *fd_out = -1;
    struct sockaddr_in sin;
    kvs_status st = resolve(host, port, &sin, err, err_len);
    if (st != KVS_OK) return st;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        kvs_fmt(err, err_len, "cannot make a socket: %s", strerror(errno));
        return KVS_EIO;
    }
    int one = 1;
    socklen_t sl = sizeof sin;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (const struct sockaddr *)&sin, sizeof sin) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &sl) != 0) {
        kvs_fmt(err, err_len, "cannot listen on %s:%u: %s", host, port, strerror(errno));
        close(fd);
        return KVS_EIO;
    }
    *fd_out = fd;
    *port_out = ntohs(sin.sin_port);
    return KVS_OK;
}

kvs_status kvs_control_connect_start(const char *host, uint16_t port, int *fd_out, char *err,
                                     size_t err_len) {
    *fd_out = -1;
    struct sockaddr_in sin;
    char why[160];
    kvs_status st = resolve(host, port, &sin, why, sizeof why);
    if (st != KVS_OK) {
        kvs_fmt(err, err_len, "connect to %s:%u: %s", host, port, why);
        return st;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        kvs_fmt(err, err_len, "connect to %s:%u: cannot make a socket: %s", host, port,
                strerror(errno));
        return KVS_EIO;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)&sin, sizeof sin) != 0 && errno != EINPROGRESS) {
        kvs_fmt(err, err_len, "connect to %s:%u failed: %s", host, port, strerror(errno));
        close(fd);
        return KVS_EIO;
    }
    *fd_out = fd;
    return KVS_OK;
}

kvs_status kvs_control_connect_finish(int fd, char *err, size_t err_len) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int rc;
    while ((rc = poll(&p, 1, 0)) < 0 && errno == EINTR) {
    }
    if (rc <= 0) return KVS_EAGAIN;
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) soerr = errno;
    if (soerr != 0) {
        kvs_fmt(err, err_len, "connect failed: %s", strerror(soerr));
        return KVS_EIO;
    }
    return KVS_OK;
}

kvs_status kvs_control_connect(const char *host, uint16_t port, uint64_t deadline_ns, int *fd_out,
                               char *err, size_t err_len) {
    int fd;
    kvs_status st = kvs_control_connect_start(host, port, &fd, err, err_len);
    if (st != KVS_OK) return st;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int ms;
    while ((st = kvs_control_connect_finish(fd, err, err_len)) == KVS_EAGAIN &&
           (ms = ms_until(deadline_ns)) > 0)
        (void)poll(&p, 1, ms);
    if (st == KVS_OK) {
        *fd_out = fd;
        return KVS_OK;
    }
    if (st == KVS_EAGAIN) {
        kvs_fmt(err, err_len, "connect to %s:%u: no connection by the deadline", host, port);
        st = KVS_ETIMEDOUT;
    } else {
        char why[200];
        kvs_fmt(why, sizeof why, "%s", err);
        kvs_fmt(err, err_len, "connect to %s:%u: %s", host, port, why);
    }
    close(fd);
    return st;
}

/* Read up to want bytes into dst; returns bytes read, 0 when none are there yet, -1 at EOF/error. */
static ssize_t read_some(kvs_chan *ch, uint8_t *dst, size_t want, char *err, size_t err_len) {
    for (;;) {
        ssize_t k = kvs_chan_recv(ch, dst, want);
        if (k > 0) return k;
        if (k == 0) {
            kvs_fmt(err, err_len, "the peer closed the connection");
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        kvs_fmt(err, err_len, "read failed: %s", strerror(errno));
        return -1;
    }
}

kvs_status kvs_control_read(kvs_control_reader *r, kvs_chan *ch, size_t *len, char *err,
                            size_t err_len) {
    *len = 0;
    while (r->have_prefix < KVS_CONTROL_PREFIX_BYTES) {
        ssize_t k = read_some(ch, r->prefix + r->have_prefix,
                              KVS_CONTROL_PREFIX_BYTES - r->have_prefix, err, err_len);
        if (k < 0) return KVS_EIO;
        if (k == 0) return KVS_EAGAIN;
        r->have_prefix += (uint32_t)k;
        if (r->have_prefix == KVS_CONTROL_PREFIX_BYTES) {
            r->need = (uint32_t)r->prefix[0] << 24 | (uint32_t)r->prefix[1] << 16 |
                      (uint32_t)r->prefix[2] << 8 | r->prefix[3];
            r->have = 0;
            if (r->need == 0 || r->need > KVS_CONTROL_MAX_FRAME_BYTES) {
                kvs_fmt(err, err_len, "a frame of %u bytes announced (1..%u taken)", r->need,
                        KVS_CONTROL_MAX_FRAME_BYTES);
                r->have_prefix = 0; /* never read into frame[] for it, should a caller read on */
                r->need = 0;
                return KVS_EINVAL;
            }
        }
    }
    while (r->have < r->need) {
        ssize_t k = read_some(ch, r->frame + r->have, r->need - r->have, err, err_len);
        if (k < 0) return KVS_EIO;
        if (k == 0) return KVS_EAGAIN;
        r->have += (uint32_t)k;
    }
    *len = r->need;
    r->have_prefix = 0; /* the next call starts the next frame; frame[] stays valid until then */
    return KVS_OK;
}

kvs_status kvs_control_encode(const kvs_wire_msg *msg, uint8_t *buf, size_t cap, size_t *len,
                              char *err, size_t err_len) {
    size_t n = 0;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (cap < KVS_CONTROL_PREFIX_BYTES) return KVS_EINVAL;
    kvs_status st = kvs_wire_encode(msg, buf + KVS_CONTROL_PREFIX_BYTES,
                                    cap - KVS_CONTROL_PREFIX_BYTES, &n, &why);
    if (st != KVS_OK || n > KVS_CONTROL_MAX_FRAME_BYTES) {
        kvs_fmt(err, err_len, "cannot frame a %s: %s", kvs_wire_type_name(msg->type),
                st != KVS_OK ? why.text : "over the frame cap");
        return KVS_EINVAL;
    }
    buf[0] = (uint8_t)(n >> 24);
    buf[1] = (uint8_t)(n >> 16);
    buf[2] = (uint8_t)(n >> 8);
    buf[3] = (uint8_t)n;
    *len = n + KVS_CONTROL_PREFIX_BYTES;
    return KVS_OK;
}

kvs_status kvs_control_write(kvs_chan *ch, const void *buf, size_t len, uint64_t deadline_ns,
                             char *err, size_t err_len) {
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t k = kvs_chan_send(ch, p + done, len - done);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            kvs_fmt(err, err_len, "write failed: %s", strerror(errno));
            return KVS_EIO;
        }
        int ms = ms_until(deadline_ns);
        if (ms <= 0) {
            kvs_fmt(err, err_len, "the peer took %zu of %zu bytes by the deadline", done, len);
            return deadline_ns == 0 ? KVS_EAGAIN : KVS_ETIMEDOUT;
        }
        struct pollfd pfd = {.fd = ch->fd, .events = kvs_chan_events(ch, POLLOUT)};
        (void)poll(&pfd, 1, ms);
    }
    return KVS_OK;
}
