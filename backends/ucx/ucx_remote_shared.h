/* ucx_remote_shared.h - a node's shared DRAM tier (ucx_remote_shared.c): attached while the node's
 * session is up, when the node is on this host and named it, so gets and puts reach it without the
 * node. */
#ifndef KVS_UCX_REMOTE_SHARED_H
#define KVS_UCX_REMOTE_SHARED_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "ucx_remote_state.h"
#include "wire.h"

/* AUTH_OK of a node's new session: attach the shared DRAM tier it names (shared_memory: auto
 * only); a failure is said and leaves gets on the node's connection. Progress thread. */
void remote_shared_attach(remote *r, rnode *nd, const kvs_wire_msg *m);
/* Detach a node's shared tier (its session ended), once no get is copying out of it. Progress
 * thread, or any thread once it is gone. */
void remote_shared_detach(remote *r, rnode *nd);
/* Detach every node's shared tier (the tier is being freed, its thread gone). */
void remote_shared_detach_all(remote *r);
/* Get what the attached shared tiers hold of keys, straight into dsts. statuses come in as
 * KVS_ENOTFOUND; those answered are set (KVS_OK, or KVS_EOVERFLOW with the size in lens), the rest
 * stay. Returns how many were answered. Any thread. */
uint64_t remote_shared_gets(remote *r, const kvs_key *keys, void *const *dsts, const uint64_t *caps,
                            uint64_t n, uint64_t *lens, kvs_status *statuses);
/* A put straight into the shared tier of the key's home node (replicas 1, a node on this host
 * with one, room free there): KVS_OK when stored; otherwise nothing was stored and the caller
 * queues it. Any thread. */
kvs_status remote_shared_put(remote *r, const kvs_key *key, const void *object, uint64_t len);

#endif
