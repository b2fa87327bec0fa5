/* node_requests.h - a session's requests and their replies (node_requests.c): LOOKUP, GET, PUT,
 * DELETE and STATS over the tier chain, the payload handlers, and the pieces of a PUT and a GET that
 * the stream (node_stream.h) serves too. Private to tools/node; nothing here is thread-safe. */
#ifndef KVS_NODE_REQUESTS_H
#define KVS_NODE_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

#include "backends/ucx/ucx_transport.h"
#include "backends/ucx/wire.h"
#include "node_state.h"

/* Whether both of the session's endpoints (replies, payloads) still reach the client. */
int node_alive(const node_conn *c);
/* Encode and send a reply on the session's endpoint; a failure marks c closing. */
void node_send_msg(kvs_node *n, node_conn *c, const kvs_wire_msg *msg);
/* Answer with ERROR (counted); past params.max_refusals refused messages c is marked closing. */
void node_send_refusal(kvs_node *n, node_conn *c, const kvs_wire_refusal *why);
/* node_send_refusal with a refusal built from a request id, an error code and its text. */
void node_refuse(kvs_node *n, node_conn *c, uint64_t request_id, kvs_wire_error code,
                 const char *text);
/* Serve one decoded request of session c: each fills n->reply_entries[0, req->n_entries), zeroed by the
 * caller, and counts in n->stats; the caller sends the reply. GET and PUT move the payloads by RMA. */
void node_do_lookup(kvs_node *n, node_conn *c, const kvs_wire_msg *req);
void node_do_get(kvs_node *n, node_conn *c, const kvs_wire_msg *req);
void node_do_put(kvs_node *n, node_conn *c, const kvs_wire_msg *req);
void node_do_delete(kvs_node *n, node_conn *c, const kvs_wire_msg *req);
/* The payload handlers of KVS_NODE_PAYLOAD_AM_ID (user: the node): a PUT's object is received
 * straight into room reserved in the tiers (a buffer for tiers that cannot reserve) and stored when
 * it has landed; the PUT is answered once all its objects have. */
void *node_put_place(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                     size_t data_len, void **cookie);
void node_put_landed(void *user, kvs_ucx_conn *conn, const void *header, size_t header_len,
                     void *dst, size_t data_len, void *cookie, kvs_status st);
/* The stored key of a request key: namespaced by the session's tenant. 0 on success. */
int node_stored_key(const node_conn *c, const uint8_t *key_bytes, kvs_key *out);
/* Admit len bytes under key for session c's tenant within its share (node_quota.h), before any
 * room is taken: KVS_OK, or KVS_ENOMEM with a sentence in err. */
kvs_status node_admit(kvs_node *n, node_conn *c, const kvs_key *key, uint64_t len, char *err,
                      size_t err_len);
/* Count a stored object (st KVS_OK) or log why it was not (its share no longer counts it). */
void node_put_stored(kvs_node *n, node_conn *c, const kvs_key *key, kvs_status st, uint64_t len,
                     const char *err);
/* A put whose bytes never came: its reservation aborted, its share no longer counting it. */
void node_put_abandon(kvs_node *n, const put_pending *p);
/* Store an object whose bytes are in: commit its reservation (bytes: where it was built, for
 * write-through copies) or put bytes into the tiers; counted or logged (node_put_stored) when c is
 * not NULL (its session still open). */
kvs_status node_publish(kvs_node *n, node_conn *c, const put_pending *p, const void *bytes,
                        uint64_t len);
/* A request key's object for sending: pinned in a zero-copy tier (the pin joins n->pins) or copied
 * into the next free staging slot. KVS_EAGAIN when it needs a slot and none is free (send what the
 * slots hold and node_unpin_all first), KVS_ENOTFOUND, KVS_EOVERFLOW (a copy tier's object over
 * max_object_bytes), KVS_EINVAL (a key this session cannot name). */
kvs_status node_object_ref(kvs_node *n, node_conn *c, const uint8_t *key_bytes, const void **object,
                           uint64_t *len);
/* Drop the pins of n->pins and free the staging slots. */
void node_unpin_all(kvs_node *n);
/* Fill the STATS reply's counters: the tiers' usage and the node's counters. */
void node_do_stats(kvs_node *n, kvs_wire_msg *rep);

#endif
