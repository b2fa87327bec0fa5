/* hashring.h - rendezvous (highest-random-weight) choice of the nodes that hold a key.
 *
 * Each node's weight for a key is XXH3-64 of the key seeded with the hash of the node's id; a key's
 * homes are the nodes in falling weight order. The order depends only on ids (not on insertion
 * order), and adding or removing one node of N moves only the keys it wins or held (about 1/N).
 * A ring is a plain value: no locks; readers may share it while nobody changes it. */
#ifndef KVS_REMOTE_HASHRING_H
#define KVS_REMOTE_HASHRING_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"

#define KVS_REMOTE_RING_MAX_NODES    256u
#define KVS_REMOTE_RING_MAX_ID_BYTES 127u
#define KVS_REMOTE_RING_MAX_REPLICAS 8u

typedef struct kvs_remote_ring_node {
    char id[KVS_REMOTE_RING_MAX_ID_BYTES + 1]; /* NUL-terminated, e.g. "10.0.0.7:13337" */
    uint64_t seed;                             /* XXH3-64 of id */
    int down;                                  /* skipped by kvs_remote_ring_homes */
} kvs_remote_ring_node;

typedef struct kvs_remote_ring {
    kvs_remote_ring_node nodes[KVS_REMOTE_RING_MAX_NODES];
    uint32_t n_nodes;
} kvs_remote_ring;

/* Empty the ring. */
void kvs_remote_ring_init(kvs_remote_ring *ring);
/* Add a node by id (copied). KVS_EINVAL: empty/too long id or already present; KVS_ENOMEM: full. */
kvs_status kvs_remote_ring_add(kvs_remote_ring *ring, const char *id);
/* Remove a node by id; node indices above it shift down. KVS_ENOTFOUND when absent. */
kvs_status kvs_remote_ring_remove(kvs_remote_ring *ring, const char *id);
/* Mark a node down (1) or up (0). KVS_ENOTFOUND when absent. */
kvs_status kvs_remote_ring_set_down(kvs_remote_ring *ring, const char *id, int down);
/* Index of node id in ring->nodes, or -1. */
int32_t kvs_remote_ring_find(const kvs_remote_ring *ring, const char *id);
/* The key's first up-to-r homes among nodes that are not down, most preferred first, as indices into
 * ring->nodes (valid until the ring changes). *n_out = min(r, nodes up); KVS_ENOTFOUND when no node
 * is up, KVS_EINVAL when r is 0 or over KVS_REMOTE_RING_MAX_REPLICAS. */
kvs_status kvs_remote_ring_homes(const kvs_remote_ring *ring, const kvs_key *key, uint32_t r,
                                 uint32_t *out, uint32_t *n_out);

#endif
