/* control.h - the remote tier's control connection: TCP (or TLS) carrying the handshake (HELLO,
 * CHALLENGE, AUTH, AUTH_OK/ERROR) as frames of a 4-byte big-endian length and one wire message, so
 * no byte from an unauthenticated peer reaches UCX. UCX endpoints are made from worker addresses
 * only after AUTH_OK; the connection then stays open as the session's liveness signal.
 *
 * Frames travel on a channel (channel.h): plain TCP, or TLS with `encrypt: true`.
 * Sockets are non-blocking; every call that waits takes a deadline (CLOCK_MONOTONIC ns, kvs_now_ns).
 * All calls are thread-safe on distinct sockets and readers. */
#ifndef KVS_REMOTE_CONTROL_H
#define KVS_REMOTE_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"
#include "channel.h"
#include "wire.h"

/* Largest handshake frame either side takes: a few KiB of fields plus a worker address. A length
 * prefix over it is refused before any of its bytes are read. */
#define KVS_CONTROL_MAX_FRAME_BYTES (4096u + KVS_WIRE_MAX_WORKER_ADDR_BYTES)
#define KVS_CONTROL_PREFIX_BYTES    4u

/* Reads one frame at a time from a non-blocking socket, never past the frame's end. */
typedef struct kvs_control_reader {
    uint8_t prefix[KVS_CONTROL_PREFIX_BYTES];
    uint32_t have_prefix;
    uint32_t need; /* frame length once the prefix is in */
    uint32_t have;
    uint8_t frame[KVS_CONTROL_MAX_FRAME_BYTES];
} kvs_control_reader;

/* A listening IPv4 socket (non-blocking, close-on-exec, SO_REUSEADDR so a restarted node rebinds at
 * once) on host:port; *port_out gets the bound port (the chosen one for 0). */
kvs_status kvs_control_listen(const char *host, uint16_t port, int *fd_out, uint16_t *port_out,
                              char *err, size_t err_len);
/* Start connecting to host:port without waiting: *fd_out (non-blocking) becomes writable when the
 * connection is made or fails; kvs_control_connect_finish tells which. KVS_EIO/KVS_EINVAL with a
 * sentence when it cannot even start. */
kvs_status kvs_control_connect_start(const char *host, uint16_t port, int *fd_out, char *err,
                                     size_t err_len);
/* Without waiting: KVS_OK once fd's connection is made, KVS_EAGAIN while it is in progress, KVS_EIO
 * (a sentence in err) when it failed. */
kvs_status kvs_control_connect_finish(int fd, char *err, size_t err_len);
/* Connect to host:port by the deadline; *fd_out is non-blocking. KVS_ETIMEDOUT or KVS_EIO with a
 * sentence naming the peer. */
kvs_status kvs_control_connect(const char *host, uint16_t port, uint64_t deadline_ns, int *fd_out,
                               char *err, size_t err_len);

/* Take the bytes the socket has, up to the end of the current frame. KVS_OK: a whole frame is in
 * r->frame[0..*len) (the next call starts a new one); KVS_EAGAIN: more bytes are needed; KVS_EINVAL:
 * a length prefix of 0 or over KVS_CONTROL_MAX_FRAME_BYTES; KVS_EIO: the peer closed or the read
 * failed. err says which. */
kvs_status kvs_control_read(kvs_control_reader *r, kvs_chan *ch, size_t *len, char *err,
                            size_t err_len);

/* Encode msg as one frame into buf[0..cap) (cap at least KVS_CONTROL_MAX_FRAME_BYTES + prefix);
 * *len gets the frame size. KVS_EINVAL when the message does not encode or is over the frame cap. */
kvs_status kvs_control_encode(const kvs_wire_msg *msg, uint8_t *buf, size_t cap, size_t *len,
                              char *err, size_t err_len);
/* Write buf[0..len) whole, waiting for room until the deadline (0: do not wait; a socket without
 * room is then KVS_EAGAIN). */
kvs_status kvs_control_write(kvs_chan *ch, const void *buf, size_t len, uint64_t deadline_ns,
                             char *err, size_t err_len);

#endif
