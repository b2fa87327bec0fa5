/* hashring.c - rendezvous hashing over a small node list: O(N * R) per key, no tables to rebuild. */
#include "hashring.h"

#include <string.h>
#include <xxhash.h>

void kvs_remote_ring_init(kvs_remote_ring *ring) {
    memset(ring, 0, sizeof *ring);
}

int32_t kvs_remote_ring_find(const kvs_remote_ring *ring, const char *id) {
    if (!ring || !id) return -1;
    for (uint32_t i = 0; i < ring->n_nodes; i++)
        if (strcmp(ring->nodes[i].id, id) == 0) return (int32_t)i;
    return -1;
}

kvs_status kvs_remote_ring_add(kvs_remote_ring *ring, const char *id) {
    if (!ring || !id) return KVS_EINVAL;
    size_t len = strnlen(id, KVS_REMOTE_RING_MAX_ID_BYTES + 1);
    if (len == 0 || len > KVS_REMOTE_RING_MAX_ID_BYTES || kvs_remote_ring_find(ring, id) >= 0)
        return KVS_EINVAL;
    if (ring->n_nodes >= KVS_REMOTE_RING_MAX_NODES) return KVS_ENOMEM;
    kvs_remote_ring_node *node = &ring->nodes[ring->n_nodes++];
    memset(node, 0, sizeof *node);
    memcpy(node->id, id, len);
    node->seed = XXH3_64bits(id, len);
    return KVS_OK;
}

kvs_status kvs_remote_ring_remove(kvs_remote_ring *ring, const char *id) {
    int32_t at = kvs_remote_ring_find(ring, id);
    if (at < 0) return KVS_ENOTFOUND;
    memmove(&ring->nodes[at], &ring->nodes[at + 1],
            (ring->n_nodes - (uint32_t)at - 1) * sizeof ring->nodes[0]);
    ring->n_nodes--;
    return KVS_OK;
}

kvs_status kvs_remote_ring_set_down(kvs_remote_ring *ring, const char *id, int down) {
    int32_t at = kvs_remote_ring_find(ring, id);
    if (at < 0) return KVS_ENOTFOUND;
    ring->nodes[at].down = down ? 1 : 0;
    return KVS_OK;
}

/* a ranks before b: higher weight, and on a tie (rare) the smaller id, so the order never depends on
 * where a node sits in the array. */
static int ranks_before(const kvs_remote_ring *ring, uint64_t wa, uint32_t a, uint64_t wb,
                        uint32_t b) {
    if (wa != wb) return wa > wb;
    return strcmp(ring->nodes[a].id, ring->nodes[b].id) < 0;
}

kvs_status kvs_remote_ring_homes(const kvs_remote_ring *ring, const kvs_key *key, uint32_t r,
                                 uint32_t *out, uint32_t *n_out) {
    if (!ring || !key || !out || !n_out || r == 0 || r > KVS_REMOTE_RING_MAX_REPLICAS)
        return KVS_EINVAL;
    uint64_t best_w[KVS_REMOTE_RING_MAX_REPLICAS];
    uint32_t n = 0;
    for (uint32_t i = 0; i < ring->n_nodes; i++) {
        if (ring->nodes[i].down) continue;
        uint64_t w = XXH3_64bits_withSeed(key->bytes, sizeof key->bytes, ring->nodes[i].seed);
        /* insertion into the sorted top-r list */
        uint32_t at = n;
        while (at > 0 && ranks_before(ring, w, i, best_w[at - 1], out[at - 1])) at--;
        if (at >= r) continue;
        uint32_t last = n < r ? n : r - 1;
        for (uint32_t j = last; j > at; j--) {
            best_w[j] = best_w[j - 1];
            out[j] = out[j - 1];
        }
        best_w[at] = w;
        out[at] = i;
        if (n < r) n++;
    }
    *n_out = n;
    return n ? KVS_OK : KVS_ENOTFOUND;
}
