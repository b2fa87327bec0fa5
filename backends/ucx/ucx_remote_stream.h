/* ucx_remote_stream.h - requests on a node's stream (ucx_remote_stream.c), for nodes whose GETs and
 * PUTs go on the control connection. Progress thread only. */
#ifndef KVS_UCX_REMOTE_STREAM_H
#define KVS_UCX_REMOTE_STREAM_H

#include <stdint.h>

#include "ucx_remote_state.h"
#include "wire.h"

/* A GET of the node's batch on its stream: the frame, then groups of records and bytes, each hit
 * read straight into its destination; on any error the batch fails (the caller marks it down). */
kvs_status remote_stream_get(remote *r, rnode *nd, job *j, const kvs_wire_msg *m,
                             uint64_t deadline);
/* A PUT of the node's batch: the frame and the objects' bytes from the put queue; its answer is
 * read later (remote_stream_drain). */
kvs_status remote_stream_put(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline);
/* An encrypted node's LOOKUP, DELETE or STATS: written by send, its answer read by take (after
 * every node's was written) and taken as a UCX reply would be; a failure marks the node failed. */
kvs_status remote_stream_call_send(remote *r, rnode *nd, const kvs_wire_msg *m, uint64_t deadline);
void remote_stream_call_take(remote *r, rnode *nd, uint64_t deadline);

/* Read the answers of a stream node's PUTs in flight until at most `keep` are left (0: all), by the
 * deadline; counts what they say. A failure marks the node down (its unanswered copies are counted
 * dropped). Returns KVS_OK when the node is still up. Progress thread only. */
kvs_status remote_stream_drain(remote *r, rnode *nd, uint32_t keep, uint64_t deadline);

#endif
