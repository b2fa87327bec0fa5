/* node_stream.h - a session's requests on its control connection (node_stream.c), for clients whose
 * payloads travel on the stream (backends/ucx/stream.h). Private to tools/node; nothing here is
 * thread-safe. */
#ifndef KVS_NODE_STREAM_H
#define KVS_NODE_STREAM_H

#include <stdint.h>

#include "node_state.h"

/* Serve one request frame arriving on session c's control connection (payloads: stream;
 * backends/ucx/stream.h): a GET answered in groups with the objects' bytes, a PUT whose bytes
 * follow its frame. Anything wrong ends the session (the stream cannot be resynchronised). */
void node_stream_request(kvs_node *n, node_conn *c);
/* 1 when session c has an answer waiting for room in its socket (poll it for POLLOUT). */
int node_stream_sending(const node_conn *c);
/* Sessions whose request frame or PUT on the stream is not in by its deadline (timeout_ms from its
 * first byte) are ended. Returns the nearest deadline still ahead (UINT64_MAX: none). */
uint64_t node_expire_streams(kvs_node *n);
/* What session c's stream PUT holds (a reservation, a buffer), let go; before c is freed. */
void node_stream_drop(kvs_node *n, node_conn *c);

#endif
