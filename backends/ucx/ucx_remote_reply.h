/* ucx_remote_reply.h - a node's reply taken into the running job (ucx_remote_reply.c), whether it
 * came as an active message or on the node's stream. Progress thread only. */
#ifndef KVS_UCX_REMOTE_REPLY_H
#define KVS_UCX_REMOTE_REPLY_H

#include "ucx_remote_state.h"
#include "wire.h"

/* A node's reply to its pending request into the current job: its entries answer the node's batch
 * (an ERROR, or a reply whose entries do not match the batch, fails it); a late reply of a past job
 * is dropped. Clears nd->pending. */
void remote_take_reply(remote *r, rnode *nd, const kvs_wire_msg *m);

#endif
