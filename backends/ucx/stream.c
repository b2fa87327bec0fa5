/* stream.c - objects over the control connection (see stream.h): whole reads and writes with a
 * deadline, frames, and the GET answer's group headers and records. */
#include "stream.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/log.h"

static int ms_until(uint64_t deadline_ns) {
    uint64_t now = kvs_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999ull) / 1000000ull;
    return ms > 60000 ? 60000 : (int)ms;
}

/* Wait until ch is ready for `events` (or what TLS waits for) or the deadline passes: 1 ready, 0
 * timed out. */
static int wait_ready(kvs_chan *ch, short events, uint64_t deadline_ns) {
    for (;;) {
        int ms = ms_until(deadline_ns);
        if (ms <= 0) return 0;
        struct pollfd p = {.fd = ch->fd, .events = kvs_chan_events(ch, events)};
        int k = poll(&p, 1, ms);
        if (k > 0) return 1;
        if (k < 0 && errno != EINTR) return 1; /* the next call reports the error */
    }
}

/* Drop `done` bytes from the front of iov[*first..n). */
static void advance(struct iovec *iov, size_t n, size_t *first, size_t done) {
    while (*first < n && done >= iov[*first].iov_len) done -= iov[(*first)++].iov_len;
    if (*first < n) {
        iov[*first].iov_base = (uint8_t *)iov[*first].iov_base + done;
        iov[*first].iov_len -= done;
    }
}

static uint64_t total_len(const struct iovec *iov, size_t n) {
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) t += iov[i].iov_len;
    return t;
}

static kvs_status io_all(kvs_chan *ch, int is_write, struct iovec *iov, size_t n,
                         uint64_t deadline_ns, char *err, size_t err_len) {
    size_t first = 0;
    uint64_t want = total_len(iov, n), done_total = 0;
    advance(iov, n, &first, 0); /* skip empty leading entries */
    while (first < n) {
        size_t batch = n - first > IOV_MAX ? IOV_MAX : n - first;
        ssize_t k = is_write ? kvs_chan_sendv(ch, iov + first, batch)
                             : kvs_chan_recvv(ch, iov + first, batch);
        if (k > 0) {
            done_total += (uint64_t)k;
            advance(iov, n, &first, (size_t)k);
            continue;
        }
        if (k == 0 && !is_write) {
            kvs_fmt(err, err_len, "the peer closed the connection after %llu of %llu bytes",
                    (unsigned long long)done_total, (unsigned long long)want);
            return KVS_EIO;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            kvs_fmt(err, err_len, "%s failed after %llu of %llu bytes: %s",
                    is_write ? "write" : "read", (unsigned long long)done_total,
                    (unsigned long long)want, strerror(errno));
            return KVS_EIO;
        }
        if (!wait_ready(ch, is_write ? POLLOUT : POLLIN, deadline_ns)) {
            kvs_fmt(err, err_len, "%llu of %llu bytes %s by the deadline",
                    (unsigned long long)done_total, (unsigned long long)want,
                    is_write ? "sent" : "received");
            return KVS_ETIMEDOUT;
        }
    }
    return KVS_OK;
}

kvs_status kvs_stream_readv(kvs_chan *ch, struct iovec *iov, size_t n, uint64_t deadline_ns,
                            char *err, size_t err_len) {
    return io_all(ch, 0, iov, n, deadline_ns, err, err_len);
}

kvs_status kvs_stream_writev(kvs_chan *ch, struct iovec *iov, size_t n, uint64_t deadline_ns,
                             char *err, size_t err_len) {
    return io_all(ch, 1, iov, n, deadline_ns, err, err_len);
}

kvs_status kvs_stream_read(kvs_chan *ch, void *buf, size_t len, uint64_t deadline_ns, char *err,
                           size_t err_len) {
    struct iovec v = {.iov_base = buf, .iov_len = len};
    return io_all(ch, 0, &v, 1, deadline_ns, err, err_len);
}

kvs_status kvs_stream_skip(kvs_chan *ch, uint64_t len, uint64_t deadline_ns, char *err,
                           size_t err_len) {
    uint8_t sink[16384];
    while (len > 0) {
        size_t k = len < sizeof sink ? (size_t)len : sizeof sink;
        kvs_status st = kvs_stream_read(ch, sink, k, deadline_ns, err, err_len);
        if (st != KVS_OK) return st;
        len -= k;
    }
    return KVS_OK;
}

kvs_status kvs_stream_write_msg(kvs_chan *ch, const kvs_wire_msg *msg, uint8_t *buf, size_t cap,
                                uint64_t deadline_ns, char *err, size_t err_len) {
    size_t len = 0;
    kvs_wire_refusal why;
    memset(&why, 0, sizeof why);
    if (cap < 4 || kvs_wire_encode(msg, buf + 4, cap - 4, &len, &why) != KVS_OK) {
        kvs_fmt(err, err_len, "cannot encode a %s: %s", kvs_wire_type_name(msg->type), why.text);
        return KVS_EINVAL;
    }
    buf[0] = (uint8_t)(len >> 24);
    buf[1] = (uint8_t)(len >> 16);
    buf[2] = (uint8_t)(len >> 8);
    buf[3] = (uint8_t)len;
    struct iovec v = {.iov_base = buf, .iov_len = len + 4};
    return io_all(ch, 1, &v, 1, deadline_ns, err, err_len);
}

kvs_status kvs_stream_read_frame(kvs_chan *ch, uint8_t *buf, size_t cap, size_t *len,
                                 uint64_t deadline_ns, char *err, size_t err_len) {
    uint8_t prefix[4];
    kvs_status st = kvs_stream_read(ch, prefix, sizeof prefix, deadline_ns, err, err_len);
    if (st != KVS_OK) return st;
    uint32_t n = (uint32_t)prefix[0] << 24 | (uint32_t)prefix[1] << 16 | (uint32_t)prefix[2] << 8 |
                 prefix[3];
    if (n == 0 || n > cap) {
        kvs_fmt(err, err_len, "a frame of %u bytes (1..%zu allowed)", n, cap);
        return KVS_EINVAL;
    }
    *len = n;
    return kvs_stream_read(ch, buf, n, deadline_ns, err, err_len);
}

void kvs_stream_group_encode(uint8_t out[KVS_STREAM_GROUP_BYTES], uint32_t count,
                             uint64_t request_id) {
    out[0] = KVS_WIRE_VERSION;
    out[1] = KVS_STREAM_KIND_GROUP;
    kvs_wire_le_put(out + 2, 0, 2);
    kvs_wire_le_put(out + 4, count, 4);
    kvs_wire_le_put(out + 8, request_id, 8);
}

kvs_status kvs_stream_group_decode(const uint8_t in[KVS_STREAM_GROUP_BYTES], uint64_t request_id,
                                   uint32_t left, uint32_t *count, char *err, size_t err_len) {
    *count = (uint32_t)kvs_wire_le_get(in + 4, 4);
    uint64_t id = kvs_wire_le_get(in + 8, 8);
    if (in[0] != KVS_WIRE_VERSION || in[1] != KVS_STREAM_KIND_GROUP ||
        kvs_wire_le_get(in + 2, 2) != 0) {
        kvs_fmt(err, err_len, "not a get answer (version %u, kind %u)", in[0], in[1]);
        return KVS_ECORRUPT;
    }
    if (id != request_id || *count == 0 || *count > left) {
        kvs_fmt(err, err_len, "a get answer of %u entries for request %llu (%u left of %llu)",
                *count, (unsigned long long)id, left, (unsigned long long)request_id);
        return KVS_ECORRUPT;
    }
    return KVS_OK;
}

void kvs_stream_record_encode(uint8_t out[KVS_STREAM_RECORD_BYTES], kvs_status status,
                              uint64_t length) {
    kvs_wire_le_put(out, (uint32_t)(int32_t)status, 4);
    kvs_wire_le_put(out + 4, 0, 4);
    kvs_wire_le_put(out + 8, length, 8);
}

void kvs_stream_record_decode(const uint8_t in[KVS_STREAM_RECORD_BYTES], kvs_status *status,
                              uint64_t *length) {
    *status = (kvs_status)(int32_t)(uint32_t)kvs_wire_le_get(in, 4);
    *length = kvs_wire_le_get(in + 8, 8);
}
