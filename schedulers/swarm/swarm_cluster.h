/* swarm_cluster.h - Swarm's offline phase for one layer (notes §2.3): Algorithm 1 (medoid selection
 * and cluster expansion with a replication budget) over the distance graph of swarm_graph.h, and
 * the Eq. 7 layout of clusters over SSD paths with the route table the scheduler reads.
 *
 * Objects made by a _create call are owned by the caller and freed with the matching _destroy; none
 * is thread-safe (one owner thread each), and every result is deterministic. */
#ifndef KVS_SWARM_CLUSTER_H
#define KVS_SWARM_CLUSTER_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "swarm_graph.h"

/* Also defined, identically, in swarm.h (an identical redefinition is valid C). */
#define KVS_SWARM_MAX_PATHS 64u

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
