/* sparse_swarm_state.h - what sparse_swarm.c (clustering, manifests) and sparse_swarm_read.c
 * (reading a step's rows out of clusters) share: the object layout's constants, a layer's planes
 * and the module's state. Internal to connector/ext/sparse. */
#ifndef KVS_SPARSE_SWARM_STATE_H
#define KVS_SPARSE_SWARM_STATE_H

#include <stdint.h>

#include "connector/tiers.h"
#include "schedulers/swarm/swarm_cache.h"
#include "schedulers/swarm/swarm_graph.h"
#include "sparse_swarm_types.h"

#define CL_MAGIC     0x4357534bu /* "KSWC" */
#define MF_MAGIC     0x4d57534bu /* "KSWM" */
#define CL_HEADER    48u
#define MF_HEADER    48u
#define POS_GROUP    32u        /* rows never selected while profiling: grouped by position */
#define MAINT_WINDOW 4096u      /* rows read from clusters between maintenance checks */
#define MAX_PAIRS    (1u << 16) /* a plane's profile keeps at most this many pairs (lossy) */
#define LOST_READS   64u /* cluster reads a window judges: more failed than not re-clusters */

typedef struct
    sw_plane { /* one (layer, head): its clusters and, per row, the clusters holding it */
    uint32_t n_clusters;
    uint32_t *start, *members;    /* CSR: cluster c's rows members[start[c] .. start[c + 1]) */
    uint32_t *row_start, *row_cl; /* CSR over rows [0, rows_end): clusters holding the row */
    uint32_t *row_pos;            /* parallel to row_cl: the row's place in that cluster */
    uint32_t base;                /* the layer-wide id of its cluster 0 (the cache's ids) */
} sw_plane;

typedef struct sw_layer {
    uint32_t gen, nonce;      /* of the clusters read: the manifest's */
    uint32_t lost, found;     /* cluster reads that failed and that did, in the current window */
    int ready;                /* reads come from clusters */
    int profiling;            /* selections are being profiled (first time or maintenance) */
    uint32_t profiled;        /* steps profiled so far */
    kvs_swarm_profile **prof; /* [n_heads] while profiling */
    uint64_t win_read, win_useful;
    kvs_swarm_cache *cache; /* the layer's hot clusters (NULL: none) */
    uint8_t **cached;       /* [clusters of the layer]: the bytes of a cached one */
    uint32_t n_clusters;    /* of all its heads */
} sw_layer;

struct kvs_sparse_swarm {
    kvs_tier_chain *chain;
    kvs_sparse_swarm_params p;
    uint64_t prefix_hash;
    sw_layer *layers;
    sw_plane *planes; /* [n_layers][n_heads] */
    uint32_t *need;   /* [rows_end]: index of the row in a head's fetch list + 1, or 0 */
    uint32_t *mark;   /* [mark_cap]: stamp of the read that chose a cluster (layer-wide ids) */
    uint32_t mark_cap, stamp;
    kvs_sparse_swarm_stats st;
    /* set by kvs_sparse_swarm_set_source before a layer is clustered */
    kvs_sparse_swarm_row_fn row;
    void *row_ctx;
};

/* A cluster object's bytes for n rows. */
uint64_t sw_cl_bytes(const kvs_sparse_swarm *sw, uint32_t n);
/* The key of cluster c of (layer, head) in generation gen of the prefix with this nonce. */
kvs_key sw_cluster_key(const kvs_sparse_swarm *sw, uint32_t nonce, uint32_t gen, uint32_t layer,
                       uint32_t head, uint32_t c);
sw_plane *sw_plane_of(kvs_sparse_swarm *sw, uint32_t layer, uint32_t head);
/* An object's header: magic, version, layer, a, b, c, gen, sink, prefix hash, head bytes. */
void sw_header(kvs_sparse_swarm *sw, uint8_t *at, uint32_t magic, uint32_t layer, uint32_t a,
               uint32_t b, uint32_t c, uint32_t gen);

#endif
