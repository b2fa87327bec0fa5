/* tcp_stream.c - one plain TCP stream, the reference of the remote tier over TCP (tcp_stream.h).
 * The peer greets with 8 bytes; a request is one byte ('U' upload, 'D' download) and the count, 8
 * bytes little-endian. */
#include "tcp_stream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        ssize_t k = write(fd, p, n < CHUNK ? n : CHUNK);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (uint64_t)k;
    }
    return 0;
}

/* Read n bytes into buf (CHUNK bytes, reused: the bytes are not kept). */
static int read_all(int fd, uint8_t *buf, uint64_t n) {
    while (n) {
        ssize_t k = read(fd, buf, n < CHUNK ? n : CHUNK);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        n -= (uint64_t)k;
    }
    return 0;
}

/* Send n bytes from buf (CHUNK bytes, sent again and again). */
static int send_n(int fd, const uint8_t *buf, uint64_t n) {
    while (n) {
        uint64_t k = n < CHUNK ? n : CHUNK;
        if (write_all(fd, buf, k) != 0) return -1;
        n -= k;
    }
    return 0;
}

static int parse(const char *addr, unsigned port, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, addr, &sa->sin_addr) == 1 ? 0 : -1;
}

int kvs_tcp_peer_main(const char *addr) {
    struct sockaddr_in sa;
    socklen_t sa_len = sizeof sa;
    uint8_t *buf = malloc(CHUNK);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!buf || ls < 0 || parse(addr, 0, &sa) != 0 ||
        bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&sa, &sa_len) != 0) {
        fprintf(stderr, "tcp peer: cannot listen on %s: %s\n", addr, strerror(errno));
        return 1;
    }
    printf("port %u\n", (unsigned)ntohs(sa.sin_port));
    fflush(stdout);
    int fd = accept(ls, NULL, NULL);
    uint8_t req[9];
    int rc = 1;
    if (fd >= 0) bound_waits(fd);
    if (fd >= 0 && write_all(fd, HELLO, sizeof HELLO) == 0 && read_all(fd, req, sizeof req) == 0) {
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)req[1 + i] << (8 * i);
        memset(buf, 0x5a, CHUNK);
        if (req[0] == 'U')
            rc = read_all(fd, buf, n) == 0 && write_all(fd, buf, 1) == 0 ? 0 : 1;
        else if (req[0] == 'D')
            rc = send_n(fd, buf, n) == 0 ? 0 : 1;
    }
    if (rc) fprintf(stderr, "tcp peer: the stream on %s failed\n", addr);
    if (fd >= 0) close(fd);
    close(ls);
    free(buf);
    return rc;
}

double kvs_tcp_stream(const char *addr, unsigned port, uint64_t bytes, int upload,
                      const char **why) {
    struct sockaddr_in sa;
    if (parse(addr, port, &sa) != 0) return *why = "not an IPv4 address", -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return *why = "socket failed", -1;
    bound_waits(fd);
    uint8_t *buf = malloc(CHUNK);
    if (!buf || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        free(buf);
        return *why = "cannot connect to the peer", -1;
    }
    if (read_all(fd, buf, sizeof HELLO) != 0 || memcmp(buf, HELLO, sizeof HELLO) != 0) {
        close(fd);
        free(buf);
        return *why = "what answered on the port is not the peer", -1;
    }
    memset(buf, 0xa5, CHUNK);
    uint8_t req[9] = {upload ? 'U' : 'D'};
    for (int i = 0; i < 8; i++) req[1 + i] = (uint8_t)(bytes >> (8 * i));
    double t0 = now_s();
    int rc = write_all(fd, req, sizeof req);
    if (rc == 0)
        rc = upload ? (send_n(fd, buf, bytes) || read_all(fd, buf, 1)) : read_all(fd, buf, bytes);
    double t1 = now_s();
    close(fd);
    free(buf);
    if (rc != 0) return *why = "the stream broke off", -1;
    return t1 - t0;
}
