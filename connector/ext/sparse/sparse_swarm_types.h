/* sparse_swarm_types.h - the types of Swarm's clusters for sparse decode (sparse_swarm.h): what a
 * request's clusters are opened with, where clustering reads rows from, and the counters. */
#ifndef KVS_SPARSE_SWARM_TYPES_H
#define KVS_SPARSE_SWARM_TYPES_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_backend.h"

typedef struct kvs_sparse_swarm kvs_sparse_swarm;

typedef struct kvs_sparse_swarm_params {
    uint32_t tier; /* the chain's SSD tier */
    uint32_t n_layers, n_heads;
    uint32_t sink, rows_end; /* the clusters cover rows [sink, rows_end) */
    uint64_t head_bytes;
    uint64_t max_object_bytes;
    uint32_t profile_steps; /* steps of each layer profiled before clustering */
    uint32_t cache_policy;  /* KVS_SPARSE_CACHE_SCORE or KVS_SPARSE_CACHE_LRU */
    uint64_t cache_rows;    /* the hot-cluster cache's budget, in rows (0: none) */
    double min_useful;      /* maintenance threshold (0: never re-cluster) */
    uint32_t positional;    /* 1: no profiling, every cluster a run of consecutive rows (the
                              * comparator); built at the first step of each layer */
    kvs_key prefix;         /* the stored prefix's last chunk key */
    uint32_t nonce;         /* in the keys of the clusters this request writes: two requests
                             * over the same prefix never overwrite each other's */
} kvs_sparse_swarm_params;

/* Where clustering reads a row's K and V (head_bytes each) from: 0 with bytes that match the
 * row's hash. Rows come in ascending order, each row's heads together. */
typedef kvs_status (*kvs_sparse_swarm_row_fn)(void *ctx, uint32_t layer, uint32_t head,
                                              uint32_t row, uint8_t *k, uint8_t *v);

/* Counters: layers found at open, layouts written, clusters read from the tier, their bytes,
 * cluster cache hits, rows placed from clusters, re-clusterings. */
typedef struct kvs_sparse_swarm_stats {
    uint64_t layers_found, layers_written, clusters_read, cluster_bytes, cache_hits, rows_placed,
        reclustered, clusters, cluster_rows;
} kvs_sparse_swarm_stats;

#endif
