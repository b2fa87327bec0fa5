/* swarm_cluster.h - Swarm's offline phase for one layer (notes §2): co-activation profiling, the
 * distance metric, Algorithm 1 (medoid selection and cluster expansion with a replication budget) and
 * the Eq. 7 layout of clusters over SSD paths with the route table the scheduler reads.
 *
 * Entries are dense ids 0..n_entries-1 (for the connector: the (page, layer) units of one context).
 * Objects made by a _create call are owned by the caller and freed with the matching _destroy; none is
 * thread-safe (one owner thread each), and every result is deterministic. */
#ifndef KVS_SWARM_CLUSTER_H
#define KVS_SWARM_CLUSTER_H

#include <stdint.h>

#include "abi/kvstrata.h"

/* Also defined, identically, in swarm.h (an identical redefinition is valid C). */
#define KVS_SWARM_MAX_PATHS 64u

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

/* ---- clusters (notes §2.3, Algorithm 1) --------------------------------------------------------- */

typedef struct kvs_swarm_cluster_params {
    double tau;             /* cluster radius: D(medoid, x) <= tau and mean distance <= tau */
    uint32_t max_copies;    /* R_max: clusters one entry may be in; 0 = no limit */
    double max_extra_slots; /* global cap: replicas <= this fraction of the entries; < 0 = no cap */
    int medoid_only;        /* ablation: admit everything within tau of the medoid, no mean test */
    int no_replica;         /* ablation: a covered entry is never admitted again */
    int fixpoint;           /* retry rejected candidates until a pass admits nothing */
} kvs_swarm_cluster_params;

/* tau 0.5 (Jaccard), R_max 3, +25% slots, single pass, no ablation. */
void kvs_swarm_cluster_defaults(kvs_swarm_cluster_params *params);

/* One cluster, the atomic retrieval unit: members[0] is the medoid, then members in admission order.
 * paths/slots give each member copy's location once placed (KVS_SWARM_UNPLACED before). */
typedef struct kvs_swarm_cluster {
    uint32_t *members;
    uint32_t *paths;
    uint64_t *slots;
    uint32_t n_members;
    uint32_t capacity;
    uint32_t start_path; /* Eq. 7's id_i, set by placement */
    uint32_t placed;     /* members[0..placed) have a location */
} kvs_swarm_cluster;

#define KVS_SWARM_UNPLACED UINT32_MAX

/* A layer's clusters. copies[e] counts the clusters holding entry e; n_slots = the sum of copies. */
typedef struct kvs_swarm_clusters {
    kvs_swarm_cluster *items;
    uint32_t n_clusters;
    uint32_t capacity;
    uint32_t max_entries; /* ids are < max_entries */
    uint32_t *copies;     /* [max_entries] */
    uint64_t n_slots;
    uint64_t n_covered; /* entries with at least one copy */
} kvs_swarm_clusters;

kvs_status kvs_swarm_clusters_create(uint32_t max_entries, kvs_swarm_clusters **out);
void kvs_swarm_clusters_destroy(kvs_swarm_clusters *clusters);
/* Append a member (a copy) to cluster `index`; the copy is unplaced. KVS_EINVAL for bad ids. */
kvs_status kvs_swarm_clusters_add_member(kvs_swarm_clusters *clusters, uint32_t index,
                                         uint32_t entry);
/* Append an empty cluster; its index goes to *index. */
kvs_status kvs_swarm_clusters_add(kvs_swarm_clusters *clusters, uint32_t *index);

/* Density rho[e] = |{j != e : D(e, j) <= tau}| for every entry and the medoid queue Q_m: order[] =
 * entries by rho descending, ties by id ascending. Both arrays hold graph->n_entries values. */
kvs_status kvs_swarm_cluster_order(const kvs_swarm_graph *graph, double tau, uint32_t *rho,
                                   uint32_t *order);

/* Algorithm 1 over all entries of the graph (n_entries <= clusters->max_entries), appending clusters.
 * Medoids are taken from Q_m while uncovered; each cluster admits its medoid's tau-neighbours in
 * ascending distance (ties by id) when the mean distance to the current members is <= tau; failed
 * candidates are skipped. A covered candidate (a replica) is admitted only while it has fewer than
 * max_copies copies and the replica count is under the global cap; with no_replica never. Every entry
 * ends up covered (an entry without neighbours is a singleton). */
kvs_status kvs_swarm_cluster_build(const kvs_swarm_graph *graph,
                                   const kvs_swarm_cluster_params *params,
                                   kvs_swarm_clusters *clusters);
/* The same restricted to entries[0..n) (distinct ids): neighbours outside the subset are ignored and
 * replicas are counted against the subset's size. Maintenance clusters its pending pool with it. */
kvs_status kvs_swarm_cluster_build_subset(const kvs_swarm_graph *graph,
                                          const kvs_swarm_cluster_params *params,
                                          const uint32_t *entries, uint32_t n,
                                          kvs_swarm_clusters *clusters);

/* ---- layout (Eq. 7) and routes ------------------------------------------------------------------ */

typedef enum kvs_swarm_balance {
    KVS_SWARM_BALANCE_GLOBAL_POINTER = 0, /* Eq. 7: each cluster continues the global stripe */
    KVS_SWARM_BALANCE_NONE = 1 /* ablation "No Balance": every cluster starts at path 0 */
} kvs_swarm_balance;

/* Where the next copy goes: the global pointer and each path's next free slot (slot = index of a
 * fixed-size record within the path's file). */
typedef struct kvs_swarm_layout {
    uint32_t n_paths; /* 1..KVS_SWARM_MAX_PATHS */
    kvs_swarm_balance balance;
    uint64_t pointer;
    uint64_t next_slot[KVS_SWARM_MAX_PATHS];
} kvs_swarm_layout;

/* KVS_EINVAL when n_paths is 0 or above KVS_SWARM_MAX_PATHS. */
kvs_status kvs_swarm_layout_init(kvs_swarm_layout *layout, uint32_t n_paths,
                                 kvs_swarm_balance balance);
/* Place every cluster from `first` on whose members are all unplaced, in cluster order, medoid first:
 * kvs_swarm_place with one replica, then slots appended per path in stripe order (so a cluster's copies
 * on one path have consecutive slots). */
void kvs_swarm_layout_place(kvs_swarm_layout *layout, kvs_swarm_clusters *clusters, uint32_t first);
/* Place the unplaced members at the end of cluster `index`, continuing that cluster's own stripe: the member
 * at position k (0-based) goes to (start_path + k + paper_offset) mod n_paths. paper_offset 0 continues
 * the stripe (our default); 1 is the formula as printed in §3.5, (id_i + |C_i| + 1) mod N_disk, with
 * |C_i| counted before the append. */
void kvs_swarm_layout_append(kvs_swarm_layout *layout, kvs_swarm_clusters *clusters, uint32_t index,
                             uint32_t paper_offset);

/* Route table for the scheduler: for entry e < n_entries, n_copies[e] copies (at most max_copies, in
 * cluster order) at paths[e * max_copies + k] and slots[e * max_copies + k] (slots may be NULL).
 * Unplaced copies are skipped. Returns the number of copies dropped because an entry had more than
 * max_copies. */
uint64_t kvs_swarm_routes(const kvs_swarm_clusters *clusters, uint32_t n_entries,
                          uint32_t max_copies, uint32_t *n_copies, uint32_t *paths,
                          uint64_t *slots);

#endif
