/* topk.h - which KV rows a sparse decode step attends to: the exact top-k of a KV
 * head's scores, the reference, and the approximate selection the tiers can serve without reading
 * every key: Swarm's medoid index (docs/sparse.md), each
 * cluster of co-activated rows represented by its medoid's key, clusters taken whole in descending
 * medoid score. Both keep the sink and recent rows outside the budget: they are always attended
 * and never part of the pool. Pure functions, deterministic (ties go to the lower index). */
#ifndef KVS_QSAC_TOPK_H
#define KVS_QSAC_TOPK_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "schedulers/swarm/swarm_cluster.h"

#ifdef __cplusplus
extern "C" {
#endif

/* scores[t] = sum over the group's m query heads of q_j . k_t, for n keys of d floats with
 * key_stride floats from one key to the next (a KV head's score under GQA). */
void kvs_topk_scores(const float *q, uint32_t m, const float *keys, uint64_t key_stride, uint32_t n,
                     uint32_t d, float *scores);

/* The pool of a context of n rows: [sink, n - recent), empty when they overlap. */
static inline uint32_t kvs_topk_pool_end(uint32_t n, uint32_t recent) {
    return n > recent ? n - recent : 0;
}

/* Exact top-k: the k rows of the pool with the highest scores (ties: the lower row), written to
 * out in ascending row order; returns how many (min(k, pool size)), or UINT32_MAX when out of
 * memory. A NaN score ranks lowest. */
uint32_t kvs_topk_exact(const float *scores, uint32_t n, uint32_t sink, uint32_t recent, uint32_t k,
                        uint32_t *out);

/* A medoid index: cluster c's rows are rows[offsets[c] .. offsets[c + 1]) (rows[offsets[c]] is
 * its medoid), for n_clusters clusters; a row may be in several clusters (replicas). */
typedef struct kvs_topk_index {
    uint32_t n_clusters;
    const uint32_t *offsets; /* n_clusters + 1 */
    const uint32_t *rows;
} kvs_topk_index;

/* Approximate top-k from the index: clusters in descending medoid score (medoid_scores[c], ties:
 * the lower cluster) are taken whole while the distinct pool rows taken are fewer than k; rows
 * outside the pool (sink, recent, >= n) are not counted and not returned. Writes the distinct pool
 * rows taken, ascending, to out (room for n rows) and the clusters taken to *n_taken; returns the
 * rows, or UINT32_MAX when out of memory. seen is caller scratch of n bytes, zeroed on return. */
uint32_t kvs_topk_medoids(const kvs_topk_index *index, const float *medoid_scores, uint32_t n,
                          uint32_t sink, uint32_t recent, uint32_t k, uint8_t *seen, uint32_t *out,
                          uint32_t *n_taken);

/* The index of a layer's Swarm clusters (kvs_swarm_cluster_build over the co-activation of the
 * rows a decode trace selected): cluster c's rows are its members, medoid first. The arrays are
 * allocated here and freed by kvs_topk_index_free. KVS_ENOMEM. */
kvs_status kvs_topk_index_from_clusters(const kvs_swarm_clusters *clusters, kvs_topk_index *out);
void kvs_topk_index_free(kvs_topk_index *index);

#ifdef __cplusplus
}
#endif

#endif
