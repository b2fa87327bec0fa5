/* tcp_stream.c - one plain TCP stream, the reference of the remote tier over TCP (tcp_stream.h).
 * The peer greets with 8 bytes; a request is one byte ('U' upload, 'D' download), the count and the
 * footprint, 8 bytes little-endian each; the peer answers 'R' once its buffer is touched. The
 * bytes then cross twice, the first time untimed: a new connection starts with small socket buffers
 * that grow as it carries data (the remote tier's connection to its node is long lived), so the
 * timed transfer runs at the rate a warm connection has. Upload: the client sends, the peer answers
 * one byte; download: the client sends 'G', the peer sends. */
#include "tcp_stream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1u << 20)
static const uint8_t HELLO[8] = {'k', 'v', 's', '-', 't', 'c', 'p', '1'};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* No read or write waits longer than 30 s: a lost peer fails the benchmark rather than hangs it. */
static void bound_waits(int fd) {
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int write_all(int fd, const uint8_t *p, uint64_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (uint64_t)k;
    }
    return 0;
}

/* Read n bytes into buf[0..len), front to back and again (the bytes are not kept). */
static int read_all(int fd, uint8_t *buf, uint64_t len, uint64_t n) {
    uint64_t at = 0;
    while (n) {
        uint64_t room = len - at, want = n < room ? n : room;
        ssize_t k = read(fd, buf + at, want); /* as much as the call takes: one wake-up each */
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        n -= (uint64_t)k;
        at = (at + (uint64_t)k) % len;
    }
    return 0;
}

/* Send n bytes from buf[0..len), front to back and again. */
static int send_n(int fd, const uint8_t *buf, uint64_t len, uint64_t n) {
    uint64_t at = 0;
    while (n) {
        uint64_t room = len - at, k = n < room ? n : room;
        if (write_all(fd, buf + at, k) != 0) return -1;
        n -= k;
        at = (at + k) % len;
    }
    return 0;
}

static uint64_t footprint_of(uint64_t footprint) {
    if (footprint < CHUNK) return CHUNK;
    return footprint > KVS_TCP_STREAM_MAX_FOOTPRINT ? KVS_TCP_STREAM_MAX_FOOTPRINT : footprint;
}

/* A buffer of len bytes in large pages where the kernel allows them, as the connector's staging
 * pool and the node's DRAM tier are (in a virtual machine a copy through 4 KiB pages runs at a
 * fraction of the speed: every page is a nested page walk), touched whole. */
static uint8_t *buffer(uint64_t len, int fill) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, len, MADV_HUGEPAGE);
    memset(p, fill, len);
    return p;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int parse(const char *addr, unsigned port, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, addr, &sa->sin_addr) == 1 ? 0 : -1;
}

/* The peer's side of one pass: 'U' read n bytes and answer one; 'D' wait for 'G', send n bytes. */
static int pass(int fd, uint8_t kind, uint8_t *buf, uint64_t len, uint64_t n) {
    uint8_t go = 0;
    if (kind == 'U') return read_all(fd, buf, len, n) == 0 && write_all(fd, buf, 1) == 0 ? 0 : -1;
    if (kind == 'D') return read_all(fd, &go, 1, 1) == 0 && send_n(fd, buf, len, n) == 0 ? 0 : -1;
    return -1;
}

int kvs_tcp_peer_main(const char *addr) {
    struct sockaddr_in sa;
    socklen_t sa_len = sizeof sa;
    uint8_t *buf = NULL;
    uint64_t footprint_len = 0;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ls < 0 || parse(addr, 0, &sa) != 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(ls, 1) != 0 || getsockname(ls, (struct sockaddr *)&sa, &sa_len) != 0) {
        fprintf(stderr, "tcp peer: cannot listen on %s: %s\n", addr, strerror(errno));
        return 1;
    }
    printf("port %u\n", (unsigned)ntohs(sa.sin_port));
    fflush(stdout);
    int fd = accept(ls, NULL, NULL);
    uint8_t req[17];
    int rc = 1;
    if (fd >= 0) bound_waits(fd);
    if (fd >= 0 && write_all(fd, HELLO, sizeof HELLO) == 0 &&
        read_all(fd, req, sizeof req, sizeof req) == 0) {
        uint64_t n = le64(req + 1), len = footprint_len = footprint_of(le64(req + 9));
        buf = buffer(len, 0x5a);
        uint8_t ready = 'R';
        if (!buf || write_all(fd, &ready, 1) != 0)
            rc = 1;
        else
            rc = pass(fd, req[0], buf, len, n) == 0 && pass(fd, req[0], buf, len, n) == 0 ? 0 : 1;
    }
    if (rc) fprintf(stderr, "tcp peer: the stream on %s failed\n", addr);
    if (fd >= 0) close(fd);
    close(ls);
    if (buf) munmap(buf, footprint_len);
    return rc;
}

double kvs_tcp_stream(const char *addr, unsigned port, uint64_t bytes, uint64_t footprint,
                      int upload, const char **why) {
    struct sockaddr_in sa;
    if (parse(addr, port, &sa) != 0) return *why = "not an IPv4 address", -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return *why = "socket failed", -1;
    bound_waits(fd);
    uint64_t len = footprint_of(footprint);
    uint8_t *buf = buffer(len, 0xa5);
    if (!buf || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        if (buf) munmap(buf, len);
        return *why = "cannot connect to the peer", -1;
    }
    if (read_all(fd, buf, len, sizeof HELLO) != 0 || memcmp(buf, HELLO, sizeof HELLO) != 0) {
        close(fd);
        munmap(buf, len);
        return *why = "what answered on the port is not the peer", -1;
    }
    uint8_t req[17] = {upload ? 'U' : 'D'};
    for (int i = 0; i < 8; i++) req[1 + i] = (uint8_t)(bytes >> (8 * i));
    for (int i = 0; i < 8; i++) req[9 + i] = (uint8_t)(footprint >> (8 * i));
    uint8_t ready = 0, go = 'G';
    int rc = write_all(fd, req, sizeof req);
    if (rc == 0 && (read_all(fd, &ready, 1, 1) != 0 || ready != 'R')) rc = -1;
    double t0 = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        t0 = now_s(); /* the second pass is the one timed */
        rc = upload ? (send_n(fd, buf, len, bytes) || read_all(fd, buf, len, 1))
                    : (write_all(fd, &go, 1) || read_all(fd, buf, len, bytes));
    }
    double t1 = now_s();
    close(fd);
    munmap(buf, len);
    if (rc != 0) return *why = "the stream broke off", -1;
    return t1 - t0;
}
