/* channel.c - plain TCP or TLS 1.3 (PSK) byte channels; see channel.h for the contract. */
#include "channel.h"

#include <errno.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "wire.h"

/* SHA-256 suites only: a PSK given through the callbacks below is bound to SHA-256 */
#define TLS_SUITES "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256"

struct kvs_tls {
    SSL_CTX *ctx;
    BIO_METHOD *sock; /* the socket under every session of ctx */
    int server;
    char tenant[KVS_WIRE_MAX_TENANT_BYTES + 1]; /* client: the identity offered */
    uint8_t key[KVS_WIRE_PROOF_BYTES];          /* client: the TLS key of its tenant */
    const kvs_remote_psk *master;               /* node: borrowed, read at every handshake */
};

/* What a session carries besides OpenSSL's state: the identity a node's client offered. */
typedef struct chan_extra {
    char tenant[KVS_WIRE_MAX_TENANT_BYTES + 1];
} chan_extra;

void kvs_chan_plain(kvs_chan *ch, int fd) {
    memset(ch, 0, sizeof *ch);
    ch->fd = fd;
    ch->handshaken = 1;
}

void kvs_chan_close(kvs_chan *ch) {
    if (ch->ssl) {
        SSL *ssl = ch->ssl;
        free(SSL_get_app_data(ssl));
        SSL_free(ssl);
    }
    if (ch->fd >= 0) close(ch->fd);
    ch->ssl = NULL;
    ch->fd = -1;
    ch->handshaken = 0;
    ch->want = 0;
}

int kvs_chan_is_tls(const kvs_chan *ch) {
    return ch->ssl != NULL;
}

short kvs_chan_events(const kvs_chan *ch, short dflt) {
    return ch->ssl && ch->want ? ch->want : dflt;
}

size_t kvs_chan_pending(const kvs_chan *ch) {
    return ch->ssl && ch->handshaken ? (size_t)SSL_pending((SSL *)ch->ssl) : 0;
}

/* An SSL call that returned r <= 0, as recv/send would say it: 0 at a clean end (reads), else -1
 * with errno; ch->want set for a call that may go on later. */
static ssize_t ssl_failed(kvs_chan *ch, int r) {
    int e = SSL_get_error((SSL *)ch->ssl, r);
    switch (e) {
        case SSL_ERROR_WANT_READ:
            ch->want = POLLIN;
            errno = EAGAIN;
            return -1;
        case SSL_ERROR_WANT_WRITE:
            ch->want = POLLOUT;
            errno = EAGAIN;
            return -1;
        case SSL_ERROR_ZERO_RETURN: return 0;
        case SSL_ERROR_SYSCALL:
            if (errno == 0) return 0; /* the socket ended under the record layer */
            return -1;
        default:
            ERR_clear_error(); /* nothing of it is said: the channel is over */
            errno = EPROTO;
            return -1;
    }
}

ssize_t kvs_chan_recv(kvs_chan *ch, void *buf, size_t len) {
    if (!ch->ssl) return recv(ch->fd, buf, len, MSG_DONTWAIT);
    if (len == 0) return 0;
    size_t got = 0;
    ERR_clear_error();
    errno = 0;
    int r = SSL_read_ex((SSL *)ch->ssl, buf, len, &got);
    if (r == 1) {
        ch->want = 0;
        return (ssize_t)got;
    }
    return ssl_failed(ch, r);
}

ssize_t kvs_chan_send(kvs_chan *ch, const void *buf, size_t len) {
    if (!ch->ssl) return send(ch->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (len == 0) return 0;
    size_t put = 0;
    ERR_clear_error();
    errno = 0;
    int r = SSL_write_ex((SSL *)ch->ssl, buf, len, &put);
    if (r == 1) {
        ch->want = 0;
        return (ssize_t)put;
    }
    ssize_t k = ssl_failed(ch, r);
    if (k == 0) errno = EPIPE; /* a write cannot end cleanly */
    return -1;
}

/* Each iovec in turn: what TLS moves is records, one call per buffer. */
static ssize_t tls_each(kvs_chan *ch, const struct iovec *iov, size_t n, int write) {
    ssize_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (iov[i].iov_len == 0) continue;
        ssize_t k = write ? kvs_chan_send(ch, iov[i].iov_base, iov[i].iov_len)
                          : kvs_chan_recv(ch, iov[i].iov_base, iov[i].iov_len);
        if (k <= 0) return total > 0 ? total : k;
        total += k;
        if ((size_t)k < iov[i].iov_len) break;
    }
    return total;
}

ssize_t kvs_chan_recvv(kvs_chan *ch, const struct iovec *iov, size_t n) {
    if (ch->ssl) return tls_each(ch, iov, n, 0);
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = (struct iovec *)(uintptr_t)iov;
    m.msg_iovlen = n;
    return recvmsg(ch->fd, &m, MSG_DONTWAIT);
}

ssize_t kvs_chan_sendv(kvs_chan *ch, const struct iovec *iov, size_t n) {
    if (ch->ssl) return tls_each(ch, iov, n, 1);
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = (struct iovec *)(uintptr_t)iov;
    m.msg_iovlen = n;
    return sendmsg(ch->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
}

int kvs_chan_peek(kvs_chan *ch) {
    uint8_t byte;
    ssize_t k;
    if (!ch->ssl) {
        k = recv(ch->fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    } else {
        size_t got = 0;
        ERR_clear_error();
        errno = 0;
        int r = SSL_peek_ex((SSL *)ch->ssl, &byte, 1, &got);
        k = r == 1 ? (ssize_t)got : ssl_failed(ch, r);
        if (r == 1) ch->want = 0;
    }
    if (k > 0) return 1;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    return -1;
}

/* ---- the socket under TLS ----------------------------------------------------------------- */

/* OpenSSL's socket BIO writes with write(2), which raises SIGPIPE on a connection the peer reset: a
 * library must not kill its host for that, so TLS records go through send with MSG_NOSIGNAL. The
 * method belongs to a context (nothing of it outlives the library when its host unloads it). */

static int sock_fd(BIO *b) {
    return (int)(intptr_t)BIO_get_data(b) - 1;
}

static int sock_write(BIO *b, const char *buf, int len) {
    BIO_clear_retry_flags(b);
    ssize_t k = send(sock_fd(b), buf, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)k;
}

static int sock_read(BIO *b, char *buf, int len) {
    BIO_clear_retry_flags(b);
    ssize_t k = recv(sock_fd(b), buf, (size_t)len, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
    return (int)k;
}

static long sock_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0; /* nothing is buffered here */
}

static BIO_METHOD *sock_method_new(void) {
    BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOURCE_SINK, "kvstrata socket");
    if (m && (!BIO_meth_set_write(m, sock_write) || !BIO_meth_set_read(m, sock_read) ||
              !BIO_meth_set_ctrl(m, sock_ctrl))) {
        BIO_meth_free(m);
        m = NULL;
    }
    return m;
}

static BIO *sock_bio(BIO_METHOD *method, int fd) {
    BIO *b = method ? BIO_new(method) : NULL;
    if (b) {
        BIO_set_data(b, (void *)(intptr_t)(fd + 1));
        BIO_set_init(b, 1);
    }
    return b;
}

/* ---- TLS contexts ------------------------------------------------------------------------- */

static void say_ssl(char *err, size_t err_len, const char *what) {
    unsigned long e = ERR_peek_last_error();
    char why[160] = "";
    if (e) ERR_error_string_n(e, why, sizeof why);
    kvs_fmt(err, err_len, "%s%s%s", what, e ? ": " : "", why);
    ERR_clear_error();
}

static unsigned int client_psk(SSL *ssl, const char *hint, char *identity,
                               unsigned int max_identity_len, unsigned char *psk,
                               unsigned int max_psk_len) {
    (void)hint;
    const kvs_tls *tls = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    size_t tl = strlen(tls->tenant);
    if (tl + 1 > max_identity_len || sizeof tls->key > max_psk_len) return 0;
    memcpy(identity, tls->tenant, tl + 1);
    memcpy(psk, tls->key, sizeof tls->key);
    return (unsigned int)sizeof tls->key;
}

static unsigned int node_psk(SSL *ssl, const char *identity, unsigned char *psk,
                             unsigned int max_psk_len) {
    const kvs_tls *tls = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    chan_extra *x = SSL_get_app_data(ssl);
    size_t il = identity ? strnlen(identity, KVS_WIRE_MAX_TENANT_BYTES + 1) : 0;
    if (!x || il == 0 || il > KVS_WIRE_MAX_TENANT_BYTES ||
        !kvs_wire_tenant_ok(identity, (uint32_t)il) || max_psk_len < KVS_WIRE_PROOF_BYTES)
        return 0;
    kvs_remote_psk tenant_key;
    uint8_t key[KVS_WIRE_PROOF_BYTES];
    unsigned int n = 0;
    if (kvs_remote_tenant_psk(tls->master, identity, il, &tenant_key) == KVS_OK &&
        kvs_remote_tls_psk(&tenant_key, key) == KVS_OK) {
        memcpy(psk, key, sizeof key);
        memcpy(x->tenant, identity, il + 1);
        n = (unsigned int)sizeof key;
    }
    kvs_remote_psk_clear(&tenant_key);
    OPENSSL_cleanse(key, sizeof key);
    return n;
}

static kvs_status tls_new(int server, kvs_tls **out, char *err, size_t err_len) {
    *out = NULL;
    kvs_tls *tls = calloc(1, sizeof *tls);
    if (!tls) {
        kvs_fmt(err, err_len, "no memory for a TLS context");
        return KVS_ENOMEM;
    }
    tls->server = server;
    ERR_clear_error();
    tls->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    tls->sock = sock_method_new();
    if (!tls->ctx || !tls->sock || SSL_CTX_set_min_proto_version(tls->ctx, TLS1_3_VERSION) != 1 ||
        SSL_CTX_set_ciphersuites(tls->ctx, TLS_SUITES) != 1 ||
        SSL_CTX_set_num_tickets(tls->ctx, 0) != 1) {
        say_ssl(err, err_len, "cannot make a TLS 1.3 context");
        kvs_tls_free(tls);
        return KVS_EIO;
    }
    /* an end without close_notify is the peer gone, as with plain TCP; nothing is resumed */
    SSL_CTX_set_options(tls->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
    /* a write may end halfway (the socket full) and go on from another address: callers keep their
     * place in their own buffers, as with send */
    SSL_CTX_set_mode(tls->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* a record is read off the socket only when asked for: what SSL_pending reports is then all TLS
     * holds, and the loops that poll the socket see every other byte (kvs_chan_pending) */
    SSL_CTX_set_read_ahead(tls->ctx, 0);
    SSL_CTX_set_app_data(tls->ctx, tls);
    if (server)
        SSL_CTX_set_psk_server_callback(tls->ctx, node_psk);
    else
        SSL_CTX_set_psk_client_callback(tls->ctx, client_psk);
    *out = tls;
    return KVS_OK;
}

kvs_status kvs_tls_client_new(const char *tenant, const kvs_remote_psk *tenant_key, kvs_tls **out,
                              char *err, size_t err_len) {
    size_t tl = tenant ? strlen(tenant) : 0;
    *out = NULL;
    if (tl == 0 || tl > KVS_WIRE_MAX_TENANT_BYTES || !kvs_wire_tenant_ok(tenant, (uint32_t)tl) ||
        !tenant_key) {
        kvs_fmt(err, err_len, "TLS: no valid tenant to name");
        return KVS_EINVAL;
    }
    kvs_tls *tls;
    kvs_status st = tls_new(0, &tls, err, err_len);
    if (st != KVS_OK) return st;
    memcpy(tls->tenant, tenant, tl + 1);
    if (kvs_remote_tls_psk(tenant_key, tls->key) != KVS_OK) {
        kvs_fmt(err, err_len, "TLS: cannot derive the tenant's TLS key (libcrypto)");
        kvs_tls_free(tls);
        return KVS_EIO;
    }
    *out = tls;
    return KVS_OK;
}

kvs_status kvs_tls_node_new(const kvs_remote_psk *master, kvs_tls **out, char *err,
                            size_t err_len) {
    *out = NULL;
    if (!master) {
        kvs_fmt(err, err_len, "TLS: no master key");
        return KVS_EINVAL;
    }
    kvs_tls *tls;
    kvs_status st = tls_new(1, &tls, err, err_len);
    if (st != KVS_OK) return st;
    tls->master = master;
    *out = tls;
    return KVS_OK;
}

void kvs_tls_free(kvs_tls *tls) {
    if (!tls) return;
    SSL_CTX_free(tls->ctx);
    BIO_meth_free(tls->sock);
    OPENSSL_cleanse(tls->key, sizeof tls->key);
    free(tls);
}

kvs_status kvs_tls_attach(kvs_tls *tls, kvs_chan *ch, char *err, size_t err_len) {
    ERR_clear_error();
    SSL *ssl = SSL_new(tls->ctx);
    chan_extra *x = calloc(1, sizeof *x);
    BIO *bio = ssl && x ? sock_bio(tls->sock, ch->fd) : NULL;
    if (!bio) {
        say_ssl(err, err_len, "cannot start a TLS session");
        SSL_free(ssl);
        free(x);
        return ssl && x ? KVS_EIO : KVS_ENOMEM;
    }
    SSL_set_bio(ssl, bio, bio); /* the session owns it; the socket stays the channel's */
    SSL_set_app_data(ssl, x);
    if (tls->server)
        SSL_set_accept_state(ssl);
    else
        SSL_set_connect_state(ssl);
    ch->ssl = ssl;
    ch->handshaken = 0;
    ch->want = tls->server ? POLLIN : POLLOUT;
    return KVS_OK;
}

kvs_status kvs_tls_handshake(kvs_chan *ch, char *err, size_t err_len) {
    if (!ch->ssl || ch->handshaken) return KVS_OK;
    ERR_clear_error();
    errno = 0;
    int r = SSL_do_handshake((SSL *)ch->ssl);
    if (r == 1) {
        ch->handshaken = 1;
        ch->want = 0;
        return KVS_OK;
    }
    int e = SSL_get_error((SSL *)ch->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        ch->want = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return KVS_EAGAIN;
    }
    if (e == SSL_ERROR_SYSCALL && !ERR_peek_last_error()) {
        kvs_fmt(err, err_len, "TLS handshake: %s (is the peer run with encrypt?)",
                errno ? strerror(errno) : "the peer closed the connection");
        return KVS_EIO;
    }
    /* an alert from the peer (OpenSSL's reasons for those start at SSL_AD_REASON_OFFSET): it took
     * our first message as TLS and refused it, which with a PSK means the key */
    int refused = ERR_GET_LIB(ERR_peek_last_error()) == ERR_LIB_SSL &&
                  ERR_GET_REASON(ERR_peek_last_error()) >= SSL_AD_REASON_OFFSET;
    say_ssl(err, err_len,
            refused ? "TLS handshake refused by the peer (a key of another tenant or master)"
                    : "TLS handshake failed (a key of another tenant or master, or a peer without "
                      "encrypt)");
    return refused ? KVS_EINVAL : KVS_EIO;
}

const char *kvs_tls_peer_tenant(const kvs_chan *ch) {
    if (!ch->ssl || !ch->handshaken) return NULL;
    const chan_extra *x = SSL_get_app_data((SSL *)ch->ssl);
    return x && x->tenant[0] ? x->tenant : NULL;
}
