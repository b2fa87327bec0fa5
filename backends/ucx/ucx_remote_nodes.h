/* ucx_remote_nodes.h - the remote tier's node connections (ucx_remote_nodes.c): the handshake,
 * a node going down and coming back, sending a request. Progress thread only. */
#ifndef KVS_UCX_REMOTE_NODES_H
#define KVS_UCX_REMOTE_NODES_H

#include <stdint.h>

#include "ucx_remote_state.h"
#include "ucx_transport.h"
#include "wire.h"

/* Close a node's control connection and drop its frame reader. */
void remote_control_close(rnode *nd);
/* Mark a node down (counted and reported once while it was up) and schedule its reconnect. */
void remote_node_down(remote *r, rnode *nd, const char *why);
/* Encode m and send it on the node's request endpoint by the deadline; nd->refusal says why not. */
kvs_status remote_send_msg(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline);
/* What a node in its handshake waits for on its control connection (poll events). */
short remote_handshake_events(const rnode *nd);
/* 1 while a node's handshake is under way (begun, neither up nor failed). */
int remote_in_handshake(const rnode *nd);
/* Connect and authenticate one node, waiting for it (at create, before the progress loop runs). */
kvs_status remote_node_connect(remote *r, rnode *nd);
/* Start the handshakes that are due and move on those under way, without waiting on any; lowers
 * *next_ns to the next instant one needs attention. */
void remote_reconnect_due(remote *r, uint64_t *next_ns);
/* The transport's callback for a request endpoint that died: its node fails its pending request. */
void remote_on_dead(void *user, kvs_ucx_conn *conn, const char *why);

#endif
