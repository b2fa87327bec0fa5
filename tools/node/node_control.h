/* node_control.h - the node's control connections (node_control.c): the handshake up to a session,
 * a session's end, and the refusal lines. Private to tools/node; nothing here is thread-safe. */
#ifndef KVS_NODE_CONTROL_H
#define KVS_NODE_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "node_state.h"

/* A refusal line on stderr, at most one a second; the lines left out are counted in the next one. */
void node_log_refusal(kvs_node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The control connection c is readable: handshake bytes (at AUTH_OK c becomes a session), a
 * session's end, or (returns 1) a request on a session's stream for node_stream_request. Anything
 * wrong marks c closing; the loop closes it. */
int node_control_readable(kvs_node *n, node_conn *c);
/* Mark closing the handshakes past their deadline. Returns the nearest deadline still ahead (CLOCK_MONOTONIC
 * ns, kvs_now_ns), UINT64_MAX when none. */
uint64_t node_expire_handshakes(kvs_node *n);
/* The live session whose token a request header holds, or NULL (never an encrypted one). */
node_conn *node_session_of(kvs_node *n, const void *header, size_t header_len);

#endif
