/* tcp_stream.h - the plain TCP reference of kvs-bench-ucx: one TCP stream of a number of bytes
 * between this process and a peer process (the same program run with --tcp-peer, in the server's
 * network namespace when there is one), the way the remote tier's payloads go over TCP. */
#ifndef KVS_BENCH_TCP_STREAM_H
#define KVS_BENCH_TCP_STREAM_H

#include <stdint.h>

/* The peer: listen on addr (IPv4) at a port the system picks, print "port N" on stdout, serve one
 * stream, exit 0 (1 on a failure, with a line on stderr). Every read and write gives up after 30 s. */
int kvs_tcp_peer_main(const char *addr);

/* Move bytes over one connection to the peer at addr:port: upload (1: this process sends, the peer
 * acknowledges the last byte) or download (0: the peer sends). Each side reads or writes a buffer
 * of `footprint` bytes (at least 1 MiB, at most KVS_TCP_STREAM_MAX_FOOTPRINT), front to back and
 * again: 1 MiB stays in the caches; the whole transfer's size moves the bytes from memory to
 * memory, as the remote tier moves objects. Both sides touch their buffer before the clock starts.
 * The peer greets first, so a connection to anything else fails instead of waiting; every read
 * and write gives up after 30 s. Returns the seconds from the start to the last byte (upload: to
 * the acknowledgement), or a negative value with *why set. */
#define KVS_TCP_STREAM_MAX_FOOTPRINT (256ull << 20)
double kvs_tcp_stream(const char *addr, unsigned port, uint64_t bytes, uint64_t footprint,
                      int upload, const char **why);

#endif
