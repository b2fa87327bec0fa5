/* channel.h - the control connection's byte channel: plain TCP, or TLS 1.3 over it (`encrypt:
 * true`; docs/remote.md, "Encryption"). Everything that reads or writes the control connection
 * (control.c's handshake frames, stream.c's objects, the node's sessions) goes through a channel, so
 * the same code runs over either.
 *
 * TLS is authenticated by a pre-shared key per tenant, no certificates: the PSK identity is the
 * tenant's name and the key is kvs_remote_tls_psk of the tenant's key (auth.h). A client holds its
 * tenant's key; the node derives it from its master key for whatever identity a client names, so a
 * client without the key of the tenant it names cannot finish the TLS handshake. TLS 1.3 only,
 * TLS_AES_128_GCM_SHA256 or TLS_CHACHA20_POLY1305_SHA256 with an ephemeral key exchange, no
 * session tickets (nothing is sent after the handshake but what the caller writes).
 *
 * Calls never wait: a channel's socket is non-blocking, and a call that cannot go on returns -1 with
 * errno EAGAIN and sets `want` to the poll events that let it go on (TLS may need to write to read).
 * Thread-safe on distinct channels; a kvs_tls context is shared read-only after it is made. */
#ifndef KVS_REMOTE_CHANNEL_H
#define KVS_REMOTE_CHANNEL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "abi/kvstrata.h"
#include "auth.h"

typedef struct kvs_tls kvs_tls;

typedef struct kvs_chan {
    int fd;         /* the TCP socket (non-blocking); -1 when closed */
    void *ssl;      /* the TLS session (an OpenSSL SSL *), NULL for plain TCP */
    int handshaken; /* TLS: the handshake finished (plain TCP: always 1) */
    short want;     /* the poll events the last call that returned EAGAIN waits for */
} kvs_chan;

/* A plain TCP channel on fd (taken: kvs_chan_close closes it). */
void kvs_chan_plain(kvs_chan *ch, int fd);
/* Close the socket and free the TLS session; the channel reads as closed (fd -1) after. */
void kvs_chan_close(kvs_chan *ch);

/* Like recv/send with MSG_DONTWAIT|MSG_NOSIGNAL: bytes moved (> 0), 0 when the peer closed (reads),
 * or -1 with errno: EAGAIN (ch->want says for what), EINTR, or a failure (EPROTO for a TLS record
 * that does not authenticate or a TLS alert). */
ssize_t kvs_chan_recv(kvs_chan *ch, void *buf, size_t len);
ssize_t kvs_chan_send(kvs_chan *ch, const void *buf, size_t len);
/* The same over iovecs (n of them, at most IOV_MAX): bytes moved before the first that could not. */
ssize_t kvs_chan_recvv(kvs_chan *ch, const struct iovec *iov, size_t n);
ssize_t kvs_chan_sendv(kvs_chan *ch, const struct iovec *iov, size_t n);
/* Whether at least one byte can be read now without the peer: 1, 0 (not yet: EAGAIN), or -1 (the
 * peer closed or the channel failed). Nothing is consumed. */
int kvs_chan_peek(kvs_chan *ch);
/* Bytes already taken off the socket and decrypted but not yet read: poll on fd cannot see them, so
 * a loop that polls reads these channels without waiting. 0 for plain TCP. */
size_t kvs_chan_pending(const kvs_chan *ch);
/* The poll events a caller that wants `dflt` waits for: ch->want while a TLS call waits on the
 * other direction, else dflt. */
short kvs_chan_events(const kvs_chan *ch, short dflt);
/* 1 for a TLS channel. */
int kvs_chan_is_tls(const kvs_chan *ch);

/* ---- TLS ----------------------------------------------------------------------------------- */

/* A client's context: it offers identity `tenant` (1..KVS_WIRE_MAX_TENANT_BYTES, valid per
 * kvs_wire_tenant_ok) with the TLS key of tenant_key. KVS_EIO (libssl failed) or KVS_EINVAL with a
 * sentence. */
kvs_status kvs_tls_client_new(const char *tenant, const kvs_remote_psk *tenant_key, kvs_tls **out,
                              char *err, size_t err_len);
/* The node's context: a client's identity names its tenant, whose key is derived from *master at
 * that handshake. master is borrowed and read at every handshake: a key it is changed to (a
 * rotation) is used from the next handshake on. */
kvs_status kvs_tls_node_new(const kvs_remote_psk *master, kvs_tls **out, char *err, size_t err_len);
void kvs_tls_free(kvs_tls *tls);

/* Make ch (a plain channel on a connected socket) a TLS channel of tls's side; the handshake is
 * driven by kvs_tls_handshake. KVS_ENOMEM or KVS_EIO with a sentence. */
kvs_status kvs_tls_attach(kvs_tls *tls, kvs_chan *ch, char *err, size_t err_len);
/* Move the TLS handshake on without waiting: KVS_OK when it has finished, KVS_EAGAIN while it waits
 * (ch->want says for what), KVS_EINVAL when the peer refused it with an alert (its key is not ours:
 * another tenant's or master's), KVS_EIO otherwise (not TLS, the peer gone), each with a sentence.
 * Plain channels are KVS_OK. */
kvs_status kvs_tls_handshake(kvs_chan *ch, char *err, size_t err_len);
/* The node side after the handshake: the PSK identity the client offered (the tenant it holds the
 * key of), NUL-terminated; NULL for a plain channel or before the handshake finished. */
const char *kvs_tls_peer_tenant(const kvs_chan *ch);

#endif
