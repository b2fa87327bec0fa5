/* sparse_swarm.h - Swarm's clusters in the SSD tier for one request's sparse decode
 * (docs/sparse.md "Swarm in the SSD tier").
 *
 * The first profile_steps steps of every layer read rows from their chunks while each KV head's
 * selections are profiled (which rows are selected together). Then, per layer and head, the rows
 * selected at least once are clustered by co-activation (Swarm's Algorithm 1, Jaccard distance,
 * rows admitted into up to max_copies clusters: selective replication) and the rows never selected
 * are grouped by position. Each cluster becomes one object of the SSD tier holding its rows' K and
 * V back to back, so the tier's striping spreads it over the paths (one read per path), and a
 * manifest object per layer records the clusters. Their keys derive from the stored prefix's last
 * chunk key: a later request over the same prefix, in this process or after a restart, finds the
 * manifests and reads clusters from its first step.
 *
 * A read of one layer's missing rows covers them with clusters (a cluster already chosen for the
 * step first, else the one holding most of the rows still needed), reads the chosen clusters the
 * hot-cluster cache does not hold with one get_many (the tier's least-loaded copy choice and its
 * deduplication), and hands each needed row to the caller, which checks it against its row hash.
 * The hot-cluster cache keeps cluster bytes in DRAM under Swarm's Eq. 6 score or LRU
 * (schedulers/swarm/swarm_cache.h). Maintenance: once the share of rows read that were needed falls
 * below min_useful over a window of reads, the layer is profiled and clustered again (a new
 * generation of objects). One owner thread. */
#ifndef KVS_SPARSE_SWARM_H
#define KVS_SPARSE_SWARM_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_backend.h"
#include "connector/tiers.h"
#include "sparse_swarm_types.h"

/* A request's clusters: the manifests are looked for at once (found: ready to read). */
kvs_status kvs_sparse_swarm_open(kvs_tier_chain *chain, const kvs_sparse_swarm_params *params,
                                 kvs_sparse_swarm **out);
void kvs_sparse_swarm_close(kvs_sparse_swarm *sw);
void kvs_sparse_swarm_set_source(kvs_sparse_swarm *sw, kvs_sparse_swarm_row_fn row, void *ctx);

/* The medoid index of (layer, head)'s clusters (cluster c's rows rows[offsets[c] ..
 * offsets[c + 1]), its medoid first): 1 when the layer reads from clusters, else 0. Valid until
 * the next call that may re-cluster (step_done). */
int kvs_sparse_swarm_index(const kvs_sparse_swarm *sw, uint32_t layer, uint32_t head,
                           uint32_t *n_clusters, const uint32_t **offsets, const uint32_t **rows);

/* 1 when layer `layer` reads from clusters. */
int kvs_sparse_swarm_ready(const kvs_sparse_swarm *sw, uint32_t layer);

/* A step of `layer` selected rows[0..n) for `head` (its whole selection, any order). */
void kvs_sparse_swarm_observe(kvs_sparse_swarm *sw, uint32_t layer, uint32_t head,
                              const uint32_t *rows, uint32_t n);
/* The step of `layer` is over: after profile_steps of them the layer is clustered and written. */
void kvs_sparse_swarm_step_done(kvs_sparse_swarm *sw, uint32_t layer);

/* Hands a row read from a cluster to the caller: 0 when it took it (its hash matched). */
typedef int (*kvs_sparse_swarm_place_fn)(void *ctx, uint32_t head, uint32_t slot, uint32_t row,
                                         const uint8_t *k, const uint8_t *v);

/* Read layer `layer`'s missing rows from clusters: head g wants rows[g * stride + i] into slot
 * slots[g * stride + i] for i < n[g]. done[g * stride + i] is set to 1 for every row placed; the
 * caller reads the others itself. */
void kvs_sparse_swarm_read(kvs_sparse_swarm *sw, uint32_t layer, const uint32_t *rows,
                           const uint32_t *slots, const uint32_t *n, uint32_t stride, uint8_t *done,
                           kvs_sparse_swarm_place_fn place, void *ctx);

void kvs_sparse_swarm_get_stats(const kvs_sparse_swarm *sw, kvs_sparse_swarm_stats *out);

/* The key of cluster c of (layer, head) in generation gen, written by a request of nonce
 * params->nonce (tests damage one through it). */
kvs_key kvs_sparse_swarm_cluster_key(const kvs_sparse_swarm_params *params, uint32_t gen,
                                     uint32_t layer, uint32_t head, uint32_t c);

#endif
