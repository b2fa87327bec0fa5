/* stream.h - objects over the session's control connection, for nodes reached over TCP only
 * (payloads: stream; docs/remote.md, "Payloads"). After AUTH_OK the control connection is a plain,
 * authenticated TCP (or TLS: channel.h) stream; GET and PUT requests go on it as frames (a 4-byte big-endian length and
 * one wire message, up to KVS_WIRE_MAX_MESSAGE_BYTES), and the objects' bytes follow them raw, read
 * and written straight between the socket and their place (readv/writev): the two copies a plain
 * TCP stream makes, nothing more.
 *
 * A GET's answer comes in groups: a group header, one record per entry of the group, then the bytes
 * of the group's hits in order, until every entry of the request is answered:
 *   group header, 16 bytes: version u8, kind 3 u8, 0 u16, count u32 (1..entries left), request_id u64
 *   record, 16 bytes:       status i32 (a kvs_status), 0 u32, length u64 (with KVS_OK: the bytes
 *                           that follow; with KVS_EOVERFLOW: the object's size, no bytes)
 * A PUT frame's entries are [length] and their bytes follow the frame in entry order; the answer is
 * a PUT_REPLY frame. Integers little-endian. Any error ends the session (the stream cannot be
 * resynchronised). Sockets are non-blocking; every call waits at most until its deadline
 * (CLOCK_MONOTONIC ns). */
#ifndef KVS_REMOTE_STREAM_H
#define KVS_REMOTE_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "abi/kvstrata.h"
#include "channel.h"
#include "wire.h"

#define KVS_STREAM_GROUP_BYTES  16u
#define KVS_STREAM_RECORD_BYTES 16u
#define KVS_STREAM_KIND_GROUP   3u

/* Read exactly len bytes into buf. KVS_EIO when the peer closed or the read failed, KVS_ETIMEDOUT
 * at the deadline; err says which and how far it got. */
kvs_status kvs_stream_read(kvs_chan *ch, void *buf, size_t len, uint64_t deadline_ns, char *err,
                           size_t err_len);
/* Read exactly the iovecs' bytes (n of them, any number: taken IOV_MAX at a time). iov is modified.
 */
kvs_status kvs_stream_readv(kvs_chan *ch, struct iovec *iov, size_t n, uint64_t deadline_ns,
                            char *err, size_t err_len);
/* Write exactly the iovecs' bytes. iov is modified. */
kvs_status kvs_stream_writev(kvs_chan *ch, struct iovec *iov, size_t n, uint64_t deadline_ns,
                             char *err, size_t err_len);
/* Read and throw away len bytes (what a refused object's sender had already sent). */
kvs_status kvs_stream_skip(kvs_chan *ch, uint64_t len, uint64_t deadline_ns, char *err,
                           size_t err_len);

/* Encode msg as a frame into buf[0..cap) and write it. */
kvs_status kvs_stream_write_msg(kvs_chan *ch, const kvs_wire_msg *msg, uint8_t *buf, size_t cap,
                                uint64_t deadline_ns, char *err, size_t err_len);
/* Read one frame into buf[0..cap) (cap at most KVS_WIRE_MAX_MESSAGE_BYTES is enough for any frame);
 * *len gets its size. KVS_EINVAL for a length of 0 or over cap. */
kvs_status kvs_stream_read_frame(kvs_chan *ch, uint8_t *buf, size_t cap, size_t *len,
                                 uint64_t deadline_ns, char *err, size_t err_len);

/* GET answer headers and records. */
void kvs_stream_group_encode(uint8_t out[KVS_STREAM_GROUP_BYTES], uint32_t count,
                             uint64_t request_id);
/* KVS_OK with *count in 1..left and the request id checked; KVS_ECORRUPT otherwise (err says). */
kvs_status kvs_stream_group_decode(const uint8_t in[KVS_STREAM_GROUP_BYTES], uint64_t request_id,
                                   uint32_t left, uint32_t *count, char *err, size_t err_len);
void kvs_stream_record_encode(uint8_t out[KVS_STREAM_RECORD_BYTES], kvs_status status,
                              uint64_t length);
void kvs_stream_record_decode(const uint8_t in[KVS_STREAM_RECORD_BYTES], kvs_status *status,
                              uint64_t *length);

#endif
