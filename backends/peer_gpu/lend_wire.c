/* lend_wire.c - the lending protocol's packets (lend_wire.h). */
#include "backends/peer_gpu/lend_wire.h"

#include <errno.h>
#include <msgpack.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/mp_reader.h"

/* msgpack into a fixed buffer: the packer's writer appends while it fits. */
typedef struct fixed {
    uint8_t *p;
    size_t n, cap;
    int over;
} fixed;

static int fixed_write(void *data, const char *buf, size_t len) {
    fixed *f = data;
    if (f->n + len > f->cap) {
        f->over = 1;
        return -1;
    }
    memcpy(f->p + f->n, buf, len);
    f->n += len;
    return 0;
}

size_t kvs_lend_encode(const kvs_lend_msg *m, uint8_t *buf) {
    if (m->type < KVS_LEND_HELLO || m->type > KVS_LEND_BYE) return 0;
    fixed f = {.p = buf, .cap = KVS_LEND_WIRE_MAX};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &f, fixed_write);
    int hello = m->type == KVS_LEND_HELLO;
    msgpack_pack_array(&pk, hello ? 10 : 4);
    msgpack_pack_uint32(&pk, KVS_LEND_WIRE_VERSION);
    msgpack_pack_uint32(&pk, m->type);
    msgpack_pack_uint32(&pk, m->unit);
    msgpack_pack_uint32(&pk, m->epoch);
    if (hello) {
        msgpack_pack_uint32(&pk, m->n_units);
        msgpack_pack_uint64(&pk, m->unit_bytes);
        msgpack_pack_uint64(&pk, m->region_bytes);
        msgpack_pack_uint32(&pk, m->region_kind);
        msgpack_pack_uint32(&pk, m->device);
        int cuda = m->region_kind == KVS_LEND_REGION_CUDA; /* handle, then UUID, in one bin */
        msgpack_pack_bin(&pk, cuda ? KVS_LEND_IPC_BYTES + KVS_LEND_UUID_BYTES : 0);
        if (cuda) {
            msgpack_pack_bin_body(&pk, m->ipc, KVS_LEND_IPC_BYTES);
            msgpack_pack_bin_body(&pk, m->uuid, KVS_LEND_UUID_BYTES);
        }
    }
    return f.over ? 0 : f.n;
}

kvs_status kvs_lend_decode(const void *buf, size_t len, uint32_t max_units, kvs_lend_msg *m,
                           char *err, size_t err_len) {
    memset(m, 0, sizeof *m);
    kvs_mp_reader rd;
    kvs_mp_reader_init(&rd, buf, len, "lending message", err, err_len);
    uint32_t fields;
    uint64_t version, type, unit, epoch;
    if (kvs_mp_read_array_header(&rd, 4, 10, &fields, "the message") != 0 ||
        kvs_mp_read_uint(&rd, UINT32_MAX, &version, "the version") != 0)
        return KVS_EINVAL;
    if (version != KVS_LEND_WIRE_VERSION) {
        kvs_mp_refuse(&rd, KVS_MP_VALUE, "version %llu, this library speaks version %d",
                      (unsigned long long)version, KVS_LEND_WIRE_VERSION);
        return KVS_EINVAL;
    }
    if (kvs_mp_read_uint(&rd, KVS_LEND_BYE, &type, "the type") != 0 ||
        kvs_mp_read_uint(&rd, UINT32_MAX, &unit, "the unit") != 0 ||
        kvs_mp_read_uint(&rd, UINT32_MAX, &epoch, "the epoch") != 0)
        return KVS_EINVAL;
    int hello = type == KVS_LEND_HELLO;
    if (type < KVS_LEND_HELLO || fields != (hello ? 10u : 4u)) {
        kvs_mp_refuse(&rd, KVS_MP_TYPE, "type %llu with %u fields", (unsigned long long)type,
                      fields);
        return KVS_EINVAL;
    }
    m->type = (uint32_t)type, m->unit = (uint32_t)unit, m->epoch = (uint32_t)epoch;
    if (hello) {
        uint64_t n;
        if (kvs_mp_read_uint(&rd, UINT32_MAX, &n, "the unit count") != 0 ||
            kvs_mp_read_uint(&rd, UINT64_MAX, &m->unit_bytes, "the unit size") != 0 ||
            kvs_mp_read_uint(&rd, UINT64_MAX, &m->region_bytes, "the region size") != 0)
            return KVS_EINVAL;
        m->n_units = (uint32_t)n;
        uint64_t need;
        if (n == 0 || m->unit_bytes == 0 || __builtin_mul_overflow(n, m->unit_bytes, &need) ||
            need > m->region_bytes) {
            kvs_mp_refuse(&rd, KVS_MP_VALUE,
                          "a region of %llu bytes cannot hold %llu units of %llu bytes",
                          (unsigned long long)m->region_bytes, (unsigned long long)n,
                          (unsigned long long)m->unit_bytes);
            return KVS_EINVAL;
        }
        uint64_t kind, device;
        const uint8_t *handle;
        uint32_t handle_len;
        if (kvs_mp_read_uint(&rd, KVS_LEND_REGION_CUDA, &kind, "the region kind") != 0 ||
            kvs_mp_read_uint(&rd, INT32_MAX, &device, "the device") != 0 ||
            kvs_mp_read_bytes(&rd, 0, KVS_LEND_IPC_BYTES + KVS_LEND_UUID_BYTES, &handle,
                              &handle_len, "the IPC handle") != 0)
            return KVS_EINVAL;
        uint32_t want = kind == KVS_LEND_REGION_CUDA ? KVS_LEND_IPC_BYTES + KVS_LEND_UUID_BYTES : 0;
        if (handle_len != want) {
            kvs_mp_refuse(&rd, KVS_MP_VALUE, "a %s region with an IPC handle of %u bytes, not %u",
                          kind == KVS_LEND_REGION_CUDA ? "CUDA" : "host", handle_len, want);
            return KVS_EINVAL;
        }
        m->region_kind = (uint32_t)kind;
        m->device = (uint32_t)device;
        if (handle_len) {
            memcpy(m->ipc, handle, KVS_LEND_IPC_BYTES);
            memcpy(m->uuid, handle + KVS_LEND_IPC_BYTES, KVS_LEND_UUID_BYTES);
        }
    } else if (max_units && type != KVS_LEND_BYE && unit >= max_units) {
        kvs_mp_refuse(&rd, KVS_MP_VALUE, "unit %llu of %u", (unsigned long long)unit, max_units);
        return KVS_EINVAL;
    }
    return kvs_mp_read_end(&rd) == 0 ? KVS_OK : KVS_EINVAL;
}

kvs_status kvs_lend_send(int sock, const kvs_lend_msg *m, int pass_fd, int timeout_ms, char *err,
                         size_t err_len) {
    uint8_t buf[KVS_LEND_WIRE_MAX];
    size_t n = kvs_lend_encode(m, buf);
    if (!n) {
        snprintf(err, err_len, "lending message: type %u is not one to send", m->type);
        return KVS_EINVAL;
    }
    struct iovec io = {.iov_base = buf, .iov_len = n};
    union {
        char raw[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr mh = {.msg_iov = &io, .msg_iovlen = 1};
    if (pass_fd >= 0) {
        mh.msg_control = ctl.raw;
        mh.msg_controllen = sizeof ctl.raw;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass_fd, sizeof pass_fd);
    }
    /* never blocked for good behind a peer that does not read: wait for room, then send at once */
    struct pollfd pfd = {.fd = sock, .events = POLLOUT};
    int r;
    do r = poll(&pfd, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    ssize_t sent = -1;
    if (r > 0) {
        do sent = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (sent < 0 && errno == EINTR);
    }
    if (r == 0 || (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
        snprintf(err, err_len,
                 "lending channel: no room to send within %d ms (the peer reads "
                 "nothing)",
                 timeout_ms);
        return KVS_ETIMEDOUT;
    }
    if (sent != (ssize_t)n) {
        snprintf(err, err_len, "lending channel: send failed (%s): the peer is gone",
                 sent < 0 ? strerror(errno) : "short");
        return KVS_EIO;
    }
    return KVS_OK;
}

kvs_status kvs_lend_recv(int sock, int timeout_ms, uint32_t max_units, kvs_lend_msg *m,
                         int *passed_fd, char *err, size_t err_len) {
    *passed_fd = -1;
    struct pollfd pfd = {.fd = sock, .events = POLLIN};
    int r;
    do r = poll(&pfd, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    if (r == 0) {
        snprintf(err, err_len, "lending channel: no message within %d ms", timeout_ms);
        return KVS_ETIMEDOUT;
    }
    uint8_t buf[KVS_LEND_WIRE_MAX + 1];
    union {
        char raw[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } ctl;
    struct iovec io = {.iov_base = buf, .iov_len = sizeof buf};
    struct msghdr mh = {
        .msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl.raw, .msg_controllen = sizeof ctl.raw};
    ssize_t got = r < 0 ? -1 : recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0) {
        snprintf(err, err_len, "lending channel: %s: the connection is lost", strerror(errno));
        return KVS_EIO;
    }
    /* every descriptor that came is ours to close unless it is the HELLO's one */
    int fds[4], n_fds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && n_fds < 4; k++)
                memcpy(&fds[n_fds++], CMSG_DATA(c) + k * sizeof(int), sizeof(int));
    /* 0 bytes: the end of the stream (the peer closed it), or an empty packet from a live one */
    if (got == 0) {
        for (int k = 0; k < n_fds; k++) close(fds[k]);
        if (pfd.revents & POLLHUP) {
            snprintf(err, err_len, "lending channel: closed: the connection is lost");
            return KVS_EIO;
        }
        snprintf(err, err_len, "lending channel: an empty packet");
        return KVS_EINVAL;
    }
    kvs_status st = (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || got > KVS_LEND_WIRE_MAX
                        ? KVS_EINVAL
                        : kvs_lend_decode(buf, (size_t)got, max_units, m, err, err_len);
    if (st == KVS_EINVAL && (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC) || got > KVS_LEND_WIRE_MAX))
        snprintf(err, err_len, "lending channel: a packet longer than any message");
    /* a host region comes with its descriptor; a CUDA region with none */
    int want_fd =
        st == KVS_OK && m->type == KVS_LEND_HELLO && m->region_kind == KVS_LEND_REGION_MEMFD;
    if (st == KVS_OK && m->type == KVS_LEND_HELLO && !want_fd && n_fds) {
        snprintf(err, err_len, "lending channel: a CUDA region's HELLO with %d descriptors", n_fds);
        st = KVS_EINVAL;
    }
    struct stat sb;
    if (want_fd && n_fds != 1) {
        snprintf(err, err_len, "lending channel: a HELLO with %d descriptors, not 1", n_fds);
        st = KVS_EINVAL;
        want_fd = 0;
    } else if (want_fd && (fstat(fds[0], &sb) != 0 || (uint64_t)sb.st_size < m->region_bytes)) {
        /* mapping more than the file holds would fault on the first touch past its end */
        snprintf(err, err_len, "lending channel: a HELLO's region of %llu bytes in a file of %lld",
                 (unsigned long long)m->region_bytes, (long long)sb.st_size);
        st = KVS_EINVAL;
        want_fd = 0;
    }
    for (int k = 0; k < n_fds; k++) {
        if (want_fd && k == 0)
            *passed_fd = fds[0];
        else
            close(fds[k]);
    }
    return st;
}
