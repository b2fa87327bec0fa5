/*
 * redis_conn.h - one connection to a Redis server: a non-blocking TCP or unix-domain socket, with
 * TLS over OpenSSL when a context is given. Opening is bounded by a deadline; reads and writes never
 * block (they report "try again" and which poll events would let them progress). One owner thread.
 */
#ifndef KVS_REDIS_CONN_H
#define KVS_REDIS_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <openssl/ssl.h>

#include "slots.h"

/* Where a server listens: a unix socket path (contains a '/'), or host and TCP port. */
typedef struct kvs_redis_endpoint {
    char name[KVS_REDIS_ENDPOINT_MAX]; /* "host:port" or the path, as given or announced */
    char host[KVS_REDIS_HOST_BYTES];   /* empty for a unix socket */
    uint16_t port;
} kvs_redis_endpoint;

/* Parse "host:port", "[v6]:port" or a path into *ep. 0, or -1 with a sentence in why. */
int kvs_redis_endpoint_parse(const char *text, kvs_redis_endpoint *ep, char *why, size_t why_len);

typedef struct kvs_redis_conn {
    int fd; /* -1 when closed */
    SSL *ssl;
    int read_wants_write; /* TLS: the last read needs the socket writable */
    int write_wants_read; /* TLS: the last write needs the socket readable */
} kvs_redis_conn;

#define KVS_REDIS_IO_AGAIN (-1) /* nothing moved now: poll for kvs_redis_conn_events */
#define KVS_REDIS_IO_ERROR (-2) /* the connection failed or was closed by the peer */

/* Connect to ep (TLS when ctx is not NULL: the server's certificate is checked against server_name,
 * or the endpoint's host when it is NULL) before deadline_ns (CLOCK_MONOTONIC). KVS_OK, or
 * KVS_EIO / KVS_ETIMEDOUT with a sentence naming the endpoint in why; nothing is left open. */
int kvs_redis_conn_open(kvs_redis_conn *c, const kvs_redis_endpoint *ep, SSL_CTX *ctx,
                        const char *server_name, uint64_t deadline_ns, char *why, size_t why_len);
/* Bytes read into iov[0..n) (filled in order), or KVS_REDIS_IO_AGAIN / KVS_REDIS_IO_ERROR. */
int64_t kvs_redis_conn_readv(kvs_redis_conn *c, const struct iovec *iov, int n);
/* Bytes written from iov[0..n), or KVS_REDIS_IO_AGAIN / KVS_REDIS_IO_ERROR. */
int64_t kvs_redis_conn_writev(kvs_redis_conn *c, const struct iovec *iov, int n);
/* The poll events under which a read (want_read) or write (want_write) can progress. */
short kvs_redis_conn_events(const kvs_redis_conn *c, int want_read, int want_write);
/* 1 when TLS holds decrypted bytes not yet read (poll would not show them). */
int kvs_redis_conn_pending(const kvs_redis_conn *c);
void kvs_redis_conn_close(kvs_redis_conn *c);

#endif
