/* swarm_graph.h - the input of Swarm's offline phase for one layer (notes §2.1-2.2): the
 * co-activation profile of a trace, the distance metric over it, and the sparse distance graph
 * Algorithm 1 reads.
 *
 * Entries are dense ids 0..n_entries-1 (for the connector: the (page, layer) units of one context).
 * Objects made by a _create or _build call are owned by the caller and freed with the matching
 * _destroy; none is thread-safe (one owner thread each), and every result is deterministic. */
#ifndef KVS_SWARM_GRAPH_H
#define KVS_SWARM_GRAPH_H

#include <stdint.h>

#include "abi/kvstrata.h"

/* ---- profiling (notes §2.1) --------------------------------------------------------------------- */

/* Co-activation counts f: f[i][i] = steps in which i was active, f[i][j] (i != j, symmetric) = steps in
 * which both were. The diagonal is a dense array; pairs live in an open-addressing table that holds
 * only pairs seen at least once. When it would exceed max_pairs (0 = no bound) the rarest pairs are
 * dropped, lossy-counting style: the floor rises one count at a time and every pair whose count plus
 * its delta (the floor when it was inserted) is at or below it goes, until at most half of max_pairs
 * remain. A reported count is then never above the true one and low by at most prune_floor (0 while
 * nothing was dropped: exact). */
typedef struct kvs_swarm_profile {
    uint32_t n_entries;
    uint64_t n_steps;
    uint64_t
        pair_increments;   /* sum over steps of |S_t| choose 2: exact, pruning does not change it */
    uint32_t *activations; /* [n_entries] the diagonal */
    uint64_t *pair_keys;   /* [pair_capacity] i << 32 | j with i < j, UINT64_MAX when empty */
    uint32_t *pair_counts; /* [pair_capacity] */
    uint32_t *pair_deltas; /* [pair_capacity] prune_floor when the pair was inserted */
    uint64_t pair_capacity; /* a power of two */
    uint64_t n_pairs;
    uint64_t max_pairs;
    uint32_t prune_floor;
    uint32_t *step_ids;   /* [n_entries] scratch: one step's distinct ids */
    uint64_t *step_stamp; /* [n_entries] step number an id was last taken in */
} kvs_swarm_profile;

kvs_status kvs_swarm_profile_create(uint32_t n_entries, uint64_t max_pairs,
                                    kvs_swarm_profile **out);
void kvs_swarm_profile_destroy(kvs_swarm_profile *profile);
/* Count one step's activation set S_t (active[0..n_active), duplicates allowed, ids < n_entries).
 * O(|S_t|^2) expected. KVS_EINVAL for an out-of-range id (nothing counted), KVS_ENOMEM when the table
 * cannot grow (the step is partly counted). */
kvs_status kvs_swarm_profile_add_step(kvs_swarm_profile *profile, const uint32_t *active,
                                      uint32_t n_active);
/* f[i][j]; the activation count of i when i == j; 0 for ids out of range. */
uint32_t kvs_swarm_profile_count(const kvs_swarm_profile *profile, uint32_t i, uint32_t j);
/* Eq. 2's denominator: the sum of f over all ordered pairs i != j (2 * pair_increments). */
uint64_t kvs_swarm_profile_total(const kvs_swarm_profile *profile);

/* ---- distance (notes §2.2) ---------------------------------------------------------------------- */

typedef enum kvs_swarm_metric {
    KVS_SWARM_METRIC_JACCARD = 0, /* d = 1 - f_ij / (f_ii + f_jj - f_ij); 0 iff always together */
    KVS_SWARM_METRIC_GLOBAL = 1,  /* paper Eq. 2-3: d = 1 - f_ij / total, total as profile_total */
    KVS_SWARM_METRIC_RATE = 2     /* d = 1 - f_ij / n_steps: Eq. 9's per-window form */
} kvs_swarm_metric;

/* d(i, j) in [0, 1] under the metric; 0 when i == j, 1 when the pair was never seen together. */
double kvs_swarm_distance(const kvs_swarm_profile *profile, kvs_swarm_metric metric, uint32_t i,
                          uint32_t j);

/* The sparse distance matrix D: for each entry, its neighbours at distance <= keep_radius in
 * ascending id order (CSR). Every pair absent from it reads as distance 1. Keep keep_radius >= the
 * clustering radius; 1.0 keeps every pair the profile saw, which makes Algorithm 1's mean-distance
 * test exact (a pair never seen together has distance exactly 1 under every metric).
 * min_count is the support a pair needs to be kept at all (1 = every pair seen): two entries that
 * each fired once, in the same step, have Jaccard distance 0, so one chance co-firing of rarely active
 * entries would otherwise glue them together. Pairs below it read as distance 1. */
typedef struct kvs_swarm_graph {
    uint32_t n_entries;
    uint64_t *row_start; /* [n_entries + 1] */
    uint32_t *neighbour; /* [row_start[n_entries]] */
    double *distance;    /* parallel to neighbour */
} kvs_swarm_graph;

kvs_status kvs_swarm_graph_build(const kvs_swarm_profile *profile, kvs_swarm_metric metric,
                                 double keep_radius, uint32_t min_count, kvs_swarm_graph **out);
/* A graph from explicit undirected pairs (a[k], b[k]) at distance d[k] in [0, 1] (tests, hand graphs).
 * A repeated pair keeps its last distance; self pairs are ignored. KVS_EINVAL on an id >= n_entries or
 * a distance outside [0, 1]. */
kvs_status kvs_swarm_graph_from_pairs(uint32_t n_entries, const uint32_t *a, const uint32_t *b,
                                      const double *d, uint64_t n_pairs, kvs_swarm_graph **out);
void kvs_swarm_graph_destroy(kvs_swarm_graph *graph);
/* D(i, j): 0 on the diagonal, the stored distance, else 1. O(log degree). */
double kvs_swarm_graph_distance(const kvs_swarm_graph *graph, uint32_t i, uint32_t j);

#endif
