/* swarm_maint.h - cluster maintenance for entries created while decoding (notes §3.5, Eq. 9). A new
 * entry spends W steps in the DRAM window; meanwhile every step in which it and a selected cluster's
 * medoid are both active counts f(e, m_i). On leaving, it joins every cluster with
 * d = 1 - f / W <= tau (closest first, at most max_copies), each copy placed by continuing that
 * cluster's stripe; an entry that matches none waits in a pending pool, which Algorithm 1 clusters every
 * pending_windows windows (new clusters take the global-pointer placement). Medoids never change.
 *
 * The maintainer borrows the caller's clusters and layout (both must outlive it) and appends to them;
 * it is owned by one thread. Deterministic. */
#ifndef KVS_SWARM_MAINT_H
#define KVS_SWARM_MAINT_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "swarm_cluster.h"

typedef struct kvs_swarm_maint_params {
    uint32_t window_steps; /* W, >= 1 */
    double tau;            /* join when 1 - f / W <= tau */
    uint32_t max_copies;   /* clusters one new entry joins at most; 0 = no limit */
    uint32_t
        paper_offset; /* 0: path (id_i + |C_i|) mod N, our default; 1: (id_i + |C_i| + 1) as printed */
    uint32_t
        pending_windows; /* cluster the pending pool every this many windows; 0 = only on flush */
    kvs_swarm_metric pending_metric; /* metric for the pool's co-activation graph */
    uint32_t pending_min_count;      /* support a pool pair needs (kvs_swarm_graph_build) */
    kvs_swarm_cluster_params pending_cluster; /* Algorithm 1 parameters for the pool */
} kvs_swarm_maint_params;

/* W 256, tau 0.5, max_copies 3, paper_offset 0, pool every 4 windows, Jaccard with support 3,
 * cluster defaults. */
void kvs_swarm_maint_defaults(kvs_swarm_maint_params *params);

/* One copy written by maintenance: the caller stores `entry` at (path, slot). */
typedef struct kvs_swarm_placement {
    uint32_t entry;
    uint32_t cluster;
    uint32_t path;
    uint64_t slot;
} kvs_swarm_placement;

/* A new entry inside the window and the medoids it co-fired with. */
typedef struct kvs_swarm_window_entry {
    uint32_t entry;
    uint64_t enter_step;
    uint32_t n_counts, cap_counts;
    uint32_t *cluster; /* [n_counts] cluster ids, in first-seen order */
    uint32_t *count;   /* [n_counts] f(entry, medoid of cluster) */
} kvs_swarm_window_entry;

typedef struct kvs_swarm_maint {
    kvs_swarm_maint_params params;
    kvs_swarm_clusters *clusters;    /* borrowed */
    kvs_swarm_layout *layout;        /* borrowed */
    kvs_swarm_profile *pool_profile; /* co-activation among new entries while in the window */
    kvs_swarm_window_entry *window;  /* [window_head, n_window) are live, oldest first */
    uint32_t window_head, n_window;
    uint64_t cap_window;
    uint32_t *window_of; /* [clusters->max_entries] index into window + 1, 0 when not in it */
    uint32_t *pending;   /* entries that matched no cluster */
    uint32_t n_pending;
    uint64_t cap_pending;
    uint64_t step;           /* steps seen */
    uint64_t last_pool_step; /* step the pool was last clustered */
    /* Copies written since the caller last set n_placed to 0; the caller performs these writes. */
    kvs_swarm_placement *placed;
    uint64_t n_placed, cap_placed;
    uint64_t n_joined;   /* entries that joined at least one existing cluster */
    uint64_t n_replicas; /* joins beyond each entry's first */
    uint64_t n_pooled;   /* entries sent to the pending pool */
    uint64_t n_pool_clusters;
} kvs_swarm_maint;

kvs_status kvs_swarm_maint_create(const kvs_swarm_maint_params *params,
                                  kvs_swarm_clusters *clusters, kvs_swarm_layout *layout,
                                  kvs_swarm_maint **out);
void kvs_swarm_maint_destroy(kvs_swarm_maint *maint);
/* A new entry (id < clusters->max_entries, not in the window already) enters the window now. */
kvs_status kvs_swarm_maint_add(kvs_swarm_maint *maint, uint32_t entry);
/* One decoding step: active_entries[0..n_entries) is S_t (ids outside the window are ignored) and
 * active_clusters[0..n_clusters) the clusters whose medoids were activated (selected). Counts
 * co-firing, then retires entries that have spent W steps in the window, then clusters the pool when
 * it is due. Copies written go to maint->placed. */
kvs_status kvs_swarm_maint_step(kvs_swarm_maint *maint, const uint32_t *active_entries,
                                uint32_t n_entries, const uint32_t *active_clusters,
                                uint32_t n_clusters);
/* Cluster the pending pool now (Algorithm 1 over the pool's own co-activation graph). */
kvs_status kvs_swarm_maint_flush(kvs_swarm_maint *maint);

#endif
