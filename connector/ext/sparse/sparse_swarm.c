/* sparse_swarm.c - Swarm's clusters in the SSD tier for sparse decode (sparse_swarm.h).
 *
 * Objects, all under raw keys (KVS_TIERS_SPARSE_MAGIC: never written down the chain, never
 * announced), in the SSD tier:
 * - a cluster: a header (magic, layer, head, cluster, rows, generation, prefix hash), its rows'
 *   ids, then their K rows and their V rows back to back;
 * - a layer's manifest: a header (magic, layer, heads, sink, rows_end, generation, prefix hash,
 *   head bytes), per head the clusters' member lists (CSR), and an XXH3 of all of it.
 * Keys hash the prefix's last chunk key with what the object is, so the same prefix finds them
 * again; a cluster's key also holds its generation, so re-clustering never overwrites one a
 * manifest still names. */
#include "sparse_swarm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_sparse.h"
#include "common/xxh3.h"
#include "schedulers/swarm/swarm_cache.h"
#include "schedulers/swarm/swarm_cluster.h"
#include "schedulers/swarm/swarm_graph.h"

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

static uint64_t cl_bytes(const kvs_sparse_swarm *sw, uint32_t n) {
    uint64_t ids = ((uint64_t)CL_HEADER + 4ull * n + 15) & ~15ull;
    return ids + 2ull * n * sw->p.head_bytes;
}

static uint32_t max_cluster_rows(const kvs_sparse_swarm *sw) {
    uint64_t per = 4 + 2 * sw->p.head_bytes, room = sw->p.max_object_bytes - CL_HEADER - 16;
    uint64_t n = room / per;
    return n > 4096 ? 4096 : (uint32_t)n;
}

static kvs_key raw_key(const kvs_sparse_swarm_params *p, const uint32_t *what, uint32_t n) {
    kvs_xxh3 st;
    kvs_xxh3_reset(&st);
    kvs_xxh3_update(&st, p->prefix.bytes, sizeof p->prefix.bytes);
    kvs_xxh3_update(&st, &p->rows_end, 4);
    kvs_xxh3_update(&st, &p->sink, 4);
    kvs_xxh3_update(&st, &p->head_bytes, 8);
    kvs_xxh3_update(&st, &p->positional, 4);
    kvs_xxh3_update(&st, what, n * 4);
    uint64_t h = kvs_xxh3_digest(&st);
    kvs_key k;
    memcpy(k.bytes, KVS_TIERS_SPARSE_MAGIC, 8);
    memcpy(k.bytes + 8, &h, 8);
    return k;
}

kvs_key kvs_sparse_swarm_cluster_key(const kvs_sparse_swarm_params *params, uint32_t gen,
                                     uint32_t layer, uint32_t head, uint32_t c) {
    uint32_t what[6] = {CL_MAGIC, gen, layer, head, c, params->nonce};
    return raw_key(params, what, 6);
}

/* The key of a cluster of layer's clusters in generation gen by nonce. */
static kvs_key cluster_key(const kvs_sparse_swarm *sw, uint32_t nonce, uint32_t gen, uint32_t layer,
                           uint32_t head, uint32_t c) {
    kvs_sparse_swarm_params p = sw->p;
    p.nonce = nonce;
    return kvs_sparse_swarm_cluster_key(&p, gen, layer, head, c);
}

static kvs_key manifest_key(const kvs_sparse_swarm_params *p, uint32_t layer) {
    uint32_t what[3] = {MF_MAGIC, layer, p->n_heads};
    return raw_key(p, what, 3);
}

static sw_plane *plane_of(kvs_sparse_swarm *sw, uint32_t layer, uint32_t head) {
    return &sw->planes[(uint64_t)layer * sw->p.n_heads + head];
}

static void plane_free(sw_plane *pl) {
    free(pl->start);
    free(pl->members);
    free(pl->row_start);
    free(pl->row_cl);
    free(pl->row_pos);
    memset(pl, 0, sizeof *pl);
}

static void cache_free(kvs_sparse_swarm *sw, sw_layer *ly) {
    for (uint32_t c = 0; ly->cached && c < ly->n_clusters; c++) free(ly->cached[c]);
    free(ly->cached);
    kvs_swarm_cache_destroy(ly->cache);
    ly->cached = NULL;
    ly->cache = NULL;
    (void)sw;
}

static void profile_free(kvs_sparse_swarm *sw, sw_layer *ly) {
    for (uint32_t g = 0; ly->prof && g < sw->p.n_heads; g++) kvs_swarm_profile_destroy(ly->prof[g]);
    free(ly->prof);
    ly->prof = NULL;
    ly->profiling = 0;
    ly->profiled = 0;
}

/* Profiling of `layer` from now on. */
static void profile_start(kvs_sparse_swarm *sw, sw_layer *ly) {
    profile_free(sw, ly);
    ly->profiling = 1;
    if (sw->p.positional) return; /* nothing to profile: runs of rows */
    ly->prof = calloc(sw->p.n_heads, sizeof *ly->prof);
    for (uint32_t g = 0; ly->prof && g < sw->p.n_heads; g++)
        if (kvs_swarm_profile_create(sw->p.rows_end, MAX_PAIRS, &ly->prof[g]) != KVS_OK) {
            profile_free(sw, ly);
            return;
        }
    ly->profiling = ly->prof != NULL;
}

/* The per-row index of a plane whose clusters (start, members) are set. */
static kvs_status index_rows(kvs_sparse_swarm *sw, sw_plane *pl) {
    uint32_t rows = sw->p.rows_end, total = pl->start[pl->n_clusters];
    pl->row_start = calloc((uint64_t)rows + 1, sizeof *pl->row_start);
    pl->row_cl = malloc(((uint64_t)total + 1) * sizeof *pl->row_cl);
    pl->row_pos = malloc(((uint64_t)total + 1) * sizeof *pl->row_pos);
    if (!pl->row_start || !pl->row_cl || !pl->row_pos) return KVS_ENOMEM;
    for (uint32_t i = 0; i < total; i++) pl->row_start[pl->members[i] + 1]++;
    for (uint32_t r = 0; r < rows; r++) pl->row_start[r + 1] += pl->row_start[r];
    uint32_t *fill = calloc(rows ? rows : 1, sizeof *fill);
    if (!fill) return KVS_ENOMEM;
    for (uint32_t c = 0; c < pl->n_clusters; c++)
        for (uint32_t j = pl->start[c]; j < pl->start[c + 1]; j++) {
            uint32_t r = pl->members[j], at = pl->row_start[r] + fill[r]++;
            pl->row_cl[at] = c;
            pl->row_pos[at] = j - pl->start[c];
        }
    free(fill);
    return KVS_OK;
}

/* The layer's hot-cluster cache over its planes' clusters (numbered plane by plane). */
static void cache_start(kvs_sparse_swarm *sw, uint32_t layer) {
    sw_layer *ly = &sw->layers[layer];
    uint32_t n = 0;
    for (uint32_t g = 0; g < sw->p.n_heads; g++) {
        sw_plane *pl = plane_of(sw, layer, g);
        pl->base = n;
        n += pl->n_clusters;
    }
    ly->n_clusters = n;
    if (!sw->p.cache_rows || !n) return;
    uint32_t *sizes = malloc((uint64_t)n * sizeof *sizes);
    ly->cached = calloc(n, sizeof *ly->cached);
    kvs_swarm_cache_params cp = {
        .policy = sw->p.cache_policy == KVS_SPARSE_CACHE_LRU ? KVS_SWARM_CACHE_LRU
                                                             : KVS_SWARM_CACHE_SCORE,
        .formula = KVS_SWARM_SCORE_PAPER,
        .capacity_entries = sw->p.cache_rows / sw->p.n_layers,
        .t_base_s = 80e-6, /* a small read of the SSD tier, as measured (docs/sparse.md) */
        .t_transfer_s = (double)(2 * sw->p.head_bytes) / 2e9};
    if (sizes && ly->cached) {
        for (uint32_t g = 0; g < sw->p.n_heads; g++) {
            sw_plane *pl = plane_of(sw, layer, g);
            for (uint32_t c = 0; c < pl->n_clusters; c++)
                sizes[pl->base + c] = pl->start[c + 1] - pl->start[c];
        }
        if (kvs_swarm_cache_create(&cp, n, sizes, NULL, &ly->cache) != KVS_OK) ly->cache = NULL;
    }
    free(sizes);
    if (!ly->cache) {
        free(ly->cached);
        ly->cached = NULL;
    }
}

/* ---- manifests ------------------------------------------------------------------------------ */

static void put32(uint8_t **p, uint32_t v) {
    memcpy(*p, &v, 4);
    *p += 4;
}

static uint32_t get32(const uint8_t **p) {
    uint32_t v;
    memcpy(&v, *p, 4);
    *p += 4;
    return v;
}

static uint64_t manifest_bytes(kvs_sparse_swarm *sw, const sw_plane *planes) {
    uint64_t n = MF_HEADER + 8;
    for (uint32_t g = 0; g < sw->p.n_heads; g++) {
        const sw_plane *pl = &planes[g];
        n += 8 + 4ull * (pl->n_clusters + 1) + 4ull * pl->start[pl->n_clusters];
    }
    return n;
}

static void header(kvs_sparse_swarm *sw, uint8_t *at, uint32_t magic, uint32_t layer, uint32_t a,
                   uint32_t b, uint32_t c, uint32_t gen) {
    uint8_t *p = at;
    put32(&p, magic);
    put32(&p, 1); /* version */
    put32(&p, layer);
    put32(&p, a);
    put32(&p, b);
    put32(&p, c);
    put32(&p, gen);
    put32(&p, sw->p.sink);
    memcpy(p, &sw->prefix_hash, 8);
    memcpy(p + 8, &sw->p.head_bytes, 8);
}

/* Write layer's manifest of planes[n_heads] in generation gen (replacing an older one). */
static kvs_status write_manifest(kvs_sparse_swarm *sw, uint32_t layer, const sw_plane *planes,
                                 uint32_t gen) {
    uint64_t len = manifest_bytes(sw, planes);
    if (len > sw->p.max_object_bytes) return KVS_ENOMEM;
    uint8_t *buf = calloc(1, len), *p;
    if (!buf) return KVS_ENOMEM;
    header(sw, buf, MF_MAGIC, layer, sw->p.n_heads, sw->p.rows_end, sw->p.nonce, gen);
    p = buf + MF_HEADER;
    for (uint32_t g = 0; g < sw->p.n_heads; g++) {
        const sw_plane *pl = &planes[g];
        put32(&p, pl->n_clusters);
        put32(&p, pl->start[pl->n_clusters]);
        for (uint32_t c = 0; c <= pl->n_clusters; c++) put32(&p, pl->start[c]);
        for (uint32_t i = 0; i < pl->start[pl->n_clusters]; i++) put32(&p, pl->members[i]);
    }
    uint64_t sum = kvs_xxh3_64(buf, (size_t)(p - buf));
    memcpy(p, &sum, 8);
    const kvs_backend_ops *ops = kvs_tiers_ops(sw->chain, sw->p.tier);
    void *state = kvs_tiers_state(sw->chain, sw->p.tier);
    kvs_key key = manifest_key(&sw->p, layer);
    ops->remove(state, &key);
    kvs_status st = ops->put(state, &key, buf, len);
    free(buf);
    return st;
}

/* Load layer's manifest into its planes: KVS_OK only with one that is whole and matches. */
static kvs_status read_manifest(kvs_sparse_swarm *sw, uint32_t layer) {
    kvs_key key = manifest_key(&sw->p, layer);
    uint8_t *buf = malloc(sw->p.max_object_bytes);
    if (!buf) return KVS_ENOMEM;
    uint64_t len = 0;
    kvs_status st = kvs_tiers_get(sw->chain, sw->p.tier, &key, buf, sw->p.max_object_bytes, &len);
    uint64_t sum = 0;
    if (st == KVS_OK && len >= MF_HEADER + 8) memcpy(&sum, buf + len - 8, 8);
    if (st == KVS_OK && (len < MF_HEADER + 8 || kvs_xxh3_64(buf, len - 8) != sum))
        st = KVS_ECORRUPT;
    const uint8_t *p = buf + MF_HEADER, *end = buf + (st == KVS_OK ? len - 8 : MF_HEADER);
    uint8_t want[MF_HEADER];
    uint32_t gen = 0, nonce = 0;
    if (st == KVS_OK) {
        memcpy(&nonce, buf + 20, 4);
        memcpy(&gen, buf + 24, 4);
        header(sw, want, MF_MAGIC, layer, sw->p.n_heads, sw->p.rows_end, nonce, gen);
        if (memcmp(want, buf, MF_HEADER) != 0) st = KVS_ECORRUPT;
    }
    for (uint32_t g = 0; st == KVS_OK && g < sw->p.n_heads; g++) {
        sw_plane *pl = plane_of(sw, layer, g);
        if (end - p < 8) {
            st = KVS_ECORRUPT;
            break;
        }
        uint64_t nc = get32(&p), nm = get32(&p);
        if (nc > nm || (uint64_t)(end - p) < 4 * (nc + 1) + 4 * nm) {
            st = KVS_ECORRUPT;
            break;
        }
        pl->n_clusters = (uint32_t)nc;
        pl->start = malloc(4 * (nc + 1));
        pl->members = malloc(4 * (nm + 1));
        if (!pl->start || !pl->members) {
            st = KVS_ENOMEM;
            break;
        }
        for (uint64_t c = 0; c <= nc; c++) pl->start[c] = get32(&p);
        for (uint64_t i = 0; i < nm; i++) pl->members[i] = get32(&p);
        int ok = pl->start[0] == 0 && pl->start[nc] == nm;
        for (uint64_t c = 0; ok && c < nc; c++)
            ok = pl->start[c] < pl->start[c + 1] &&
                 pl->start[c + 1] - pl->start[c] <= max_cluster_rows(sw);
        for (uint64_t i = 0; ok && i < nm; i++)
            ok = pl->members[i] >= sw->p.sink && pl->members[i] < sw->p.rows_end;
        if (!ok) st = KVS_ECORRUPT;
        if (st == KVS_OK) st = index_rows(sw, pl);
    }
    if (st == KVS_OK && p != end) st = KVS_ECORRUPT; /* bytes past the last head */
    free(buf);
    if (st != KVS_OK) {
        for (uint32_t g = 0; g < sw->p.n_heads; g++) plane_free(plane_of(sw, layer, g));
        return st;
    }
    sw->layers[layer].gen = gen;
    sw->layers[layer].nonce = nonce;
    return KVS_OK;
}

/* ---- clustering a layer --------------------------------------------------------------------- */

/* Append cluster rows[0..n) to a plane being built, split so no part passes the object size. */
static kvs_status push_cluster(kvs_sparse_swarm *sw, sw_plane *pl, uint32_t *cap_c, uint32_t *cap_m,
                               const uint32_t *rows, uint32_t n) {
    uint32_t most = max_cluster_rows(sw);
    if (!most) return KVS_ENOMEM;
    for (uint32_t from = 0; from < n; from += most) {
        uint32_t k = n - from < most ? n - from : most;
        uint32_t nm = pl->start[pl->n_clusters];
        if (pl->n_clusters + 2 > *cap_c) {
            *cap_c = 2 * *cap_c + 16;
            uint32_t *s = realloc(pl->start, 4ull * *cap_c);
            if (!s) return KVS_ENOMEM;
            pl->start = s;
        }
        if (nm + k > *cap_m) {
            *cap_m = 2 * (nm + k) + 64;
            uint32_t *m = realloc(pl->members, 4ull * *cap_m);
            if (!m) return KVS_ENOMEM;
            pl->members = m;
        }
        memcpy(pl->members + nm, rows + from, 4ull * k);
        pl->n_clusters++;
        pl->start[pl->n_clusters] = nm + k;
    }
    return KVS_OK;
}

/* A plane's clusters from its profile: Algorithm 1 over the rows selected at least once, the
 * others in runs of POS_GROUP consecutive rows. */
static kvs_status cluster_plane(kvs_sparse_swarm *sw, kvs_swarm_profile *prof, sw_plane *pl) {
    uint32_t rows = sw->p.rows_end, cap_c = 64, cap_m = 1024;
    pl->start = calloc(cap_c, 4);
    pl->members = malloc(4ull * cap_m);
    uint32_t *active = malloc(4ull * (rows ? rows : 1)), *run = malloc(4ull * POS_GROUP);
    kvs_swarm_graph *graph = NULL;
    kvs_swarm_clusters *cl = NULL;
    kvs_status st = pl->start && pl->members && active && run ? KVS_OK : KVS_ENOMEM;
    uint32_t n_active = 0;
    for (uint32_t r = sw->p.sink; prof && st == KVS_OK && r < rows; r++)
        if (kvs_swarm_profile_count(prof, r, r)) active[n_active++] = r;
    if (st == KVS_OK && n_active) {
        kvs_swarm_cluster_params cp;
        kvs_swarm_cluster_defaults(&cp);
        st = kvs_swarm_graph_build(prof, KVS_SWARM_METRIC_JACCARD, 1.0, 1, &graph);
        if (st == KVS_OK) st = kvs_swarm_clusters_create(rows, &cl);
        if (st == KVS_OK) st = kvs_swarm_cluster_build_subset(graph, &cp, active, n_active, cl);
        for (uint32_t c = 0; st == KVS_OK && c < cl->n_clusters; c++)
            st = push_cluster(sw, pl, &cap_c, &cap_m, cl->items[c].members, cl->items[c].n_members);
    }
    /* the rows no step selected: by position */
    uint32_t n_run = 0;
    for (uint32_t r = sw->p.sink; st == KVS_OK && r <= rows; r++) {
        int take = r < rows && (!prof || !kvs_swarm_profile_count(prof, r, r));
        if (take) run[n_run++] = r;
        if ((!take || n_run == POS_GROUP || r + 1 == rows) && n_run) {
            st = push_cluster(sw, pl, &cap_c, &cap_m, run, n_run);
            n_run = 0;
        }
    }
    kvs_swarm_clusters_destroy(cl);
    kvs_swarm_graph_destroy(graph);
    free(active);
    free(run);
    if (st == KVS_OK) st = index_rows(sw, pl);
    return st;
}

/* Every cluster's object of the fresh planes with its header and row ids; the rows come later. */
static kvs_status cluster_objects(kvs_sparse_swarm *sw, uint32_t layer, uint32_t gen,
                                  const sw_plane *fresh, uint8_t ***obj) {
    kvs_status st = KVS_OK;
    for (uint32_t g = 0; st == KVS_OK && g < sw->p.n_heads; g++) {
        const sw_plane *pl = &fresh[g];
        obj[g] = calloc(pl->n_clusters, sizeof *obj[g]);
        if (!obj[g]) st = KVS_ENOMEM;
        for (uint32_t c = 0; st == KVS_OK && c < pl->n_clusters; c++) {
            uint32_t n = pl->start[c + 1] - pl->start[c];
            if (!(obj[g][c] = calloc(1, cl_bytes(sw, n)))) {
                st = KVS_ENOMEM;
                break;
            }
            header(sw, obj[g][c], CL_MAGIC, layer, g, c, n, gen);
            memcpy(obj[g][c] + CL_HEADER, pl->members + pl->start[c], 4ull * n);
        }
    }
    return st;
}

/* The rows into the clusters' objects, chunk by chunk in row order: the source reads each chunk
 * once. */
static kvs_status fill_rows(kvs_sparse_swarm *sw, uint32_t layer, const sw_plane *fresh,
                            uint8_t ***obj) {
    kvs_status st = KVS_OK;
    uint8_t *k = malloc(sw->p.head_bytes), *v = malloc(sw->p.head_bytes);
    if (!k || !v) st = KVS_ENOMEM;
    for (uint32_t r = sw->p.sink; st == KVS_OK && r < sw->p.rows_end; r++)
        for (uint32_t g = 0; st == KVS_OK && g < sw->p.n_heads; g++) {
            const sw_plane *pl = &fresh[g];
            if (pl->row_start[r] == pl->row_start[r + 1]) continue;
            st = sw->row(sw->row_ctx, layer, g, r, k, v); /* checked against its row hash */
            for (uint32_t i = pl->row_start[r]; st == KVS_OK && i < pl->row_start[r + 1]; i++) {
                uint32_t c = pl->row_cl[i], j = pl->row_pos[i], n = pl->start[c + 1] - pl->start[c];
                uint8_t *kd = obj[g][c] + cl_bytes(sw, n) - 2ull * n * sw->p.head_bytes;
                memcpy(kd + (uint64_t)j * sw->p.head_bytes, k, sw->p.head_bytes);
                memcpy(kd + ((uint64_t)n + j) * sw->p.head_bytes, v, sw->p.head_bytes);
            }
        }
    free(k);
    free(v);
    return st;
}

/* Write the clusters' objects into the tier in generation gen; counts what was written. */
static kvs_status put_clusters(kvs_sparse_swarm *sw, uint32_t layer, uint32_t gen,
                               const sw_plane *fresh, uint8_t ***obj, uint64_t *clusters,
                               uint64_t *members) {
    const kvs_backend_ops *ops = kvs_tiers_ops(sw->chain, sw->p.tier);
    void *state = kvs_tiers_state(sw->chain, sw->p.tier);
    kvs_status st = KVS_OK;
    for (uint32_t g = 0; st == KVS_OK && g < sw->p.n_heads; g++)
        for (uint32_t c = 0; st == KVS_OK && c < fresh[g].n_clusters; c++) {
            uint32_t n = fresh[g].start[c + 1] - fresh[g].start[c];
            kvs_key key = cluster_key(sw, sw->p.nonce, gen, layer, g, c);
            ops->remove(state, &key);
            st = ops->put(state, &key, obj[g][c], cl_bytes(sw, n));
            (*clusters)++;
            *members += n;
        }
    return st;
}

static void objects_free(kvs_sparse_swarm *sw, const sw_plane *fresh, uint8_t ***obj) {
    for (uint32_t g = 0; obj && g < sw->p.n_heads; g++) {
        for (uint32_t c = 0; obj[g] && c < fresh[g].n_clusters; c++) free(obj[g][c]);
        free(obj[g]);
    }
    free(obj);
}

/* A build that failed: the layer goes on as it was (its old manifest may be gone: a restart then
 * profiles again); what was written of the new clusters goes. */
static void drop_fresh(kvs_sparse_swarm *sw, uint32_t layer, uint32_t gen, sw_plane *fresh) {
    const kvs_backend_ops *ops = kvs_tiers_ops(sw->chain, sw->p.tier);
    void *state = kvs_tiers_state(sw->chain, sw->p.tier);
    for (uint32_t g = 0; g < sw->p.n_heads; g++) {
        for (uint32_t c = 0; fresh[g].start && c < fresh[g].n_clusters; c++) {
            kvs_key key = cluster_key(sw, sw->p.nonce, gen, layer, g, c);
            ops->remove(state, &key);
        }
        plane_free(&fresh[g]);
    }
}

/* The fresh planes replace the layer's; the old generation's clusters go from the tier. */
static void adopt_fresh(kvs_sparse_swarm *sw, uint32_t layer, sw_plane *fresh) {
    sw_layer *ly = &sw->layers[layer];
    const kvs_backend_ops *ops = kvs_tiers_ops(sw->chain, sw->p.tier);
    void *state = kvs_tiers_state(sw->chain, sw->p.tier);
    for (uint32_t g = 0; g < sw->p.n_heads; g++) {
        sw_plane *old = plane_of(sw, layer, g);
        for (uint32_t c = 0; ly->ready && c < old->n_clusters; c++) {
            kvs_key key = cluster_key(sw, ly->nonce, ly->gen, layer, g, c);
            ops->remove(state, &key);
        }
        plane_free(old);
        *old = fresh[g];
    }
}

/* Cluster `layer` from its profile and write its clusters, then its manifest. The layer reads
 * from the new clusters only once all of it is written. */
static kvs_status build_layer(kvs_sparse_swarm *sw, uint32_t layer) {
    sw_layer *ly = &sw->layers[layer];
    /* a generation of its own: the clusters a manifest names are never overwritten */
    uint32_t G = sw->p.n_heads, gen = ly->ready ? ly->gen + 1 : 0;
    sw_plane *fresh = calloc(G, sizeof *fresh);
    if (!fresh || !sw->row) {
        free(fresh);
        return KVS_ENOMEM;
    }
    kvs_status st = KVS_OK;
    for (uint32_t g = 0; st == KVS_OK && g < G; g++)
        st = cluster_plane(sw, ly->prof ? ly->prof[g] : NULL, &fresh[g]);
    if (st == KVS_OK && manifest_bytes(sw, fresh) > sw->p.max_object_bytes)
        st = KVS_ENOMEM; /* the layer stays on rows: its manifest would not fit an object */
    uint8_t ***obj = calloc(G, sizeof *obj);
    if (!obj) st = KVS_ENOMEM;
    if (st == KVS_OK) st = cluster_objects(sw, layer, gen, fresh, obj);
    if (st == KVS_OK) st = fill_rows(sw, layer, fresh, obj);
    uint64_t clusters = 0, members = 0;
    if (st == KVS_OK) st = put_clusters(sw, layer, gen, fresh, obj, &clusters, &members);
    objects_free(sw, fresh, obj);
    /* the manifest last: one that is found names clusters that were all written */
    if (st == KVS_OK) st = write_manifest(sw, layer, fresh, gen);
    if (st != KVS_OK) {
        drop_fresh(sw, layer, gen, fresh);
        free(fresh);
        return st;
    }
    adopt_fresh(sw, layer, fresh);
    free(fresh);
    cache_free(sw, ly);
    cache_start(sw, layer);
    if (ly->ready) sw->st.reclustered++;
    ly->gen = gen;
    ly->nonce = sw->p.nonce;
    ly->lost = ly->found = 0;
    ly->ready = 1;
    ly->win_read = ly->win_useful = 0;
    sw->st.layers_written++;
    sw->st.clusters += clusters;
    sw->st.cluster_rows += members;
    return KVS_OK;
}

/* ---- the module ----------------------------------------------------------------------------- */

kvs_status kvs_sparse_swarm_open(kvs_tier_chain *chain, const kvs_sparse_swarm_params *params,
                                 kvs_sparse_swarm **out) {
    *out = NULL;
    if (!params->n_layers || !params->n_heads || !params->head_bytes ||
        params->rows_end <= params->sink || params->max_object_bytes < CL_HEADER + 1024)
        return KVS_EINVAL;
    kvs_sparse_swarm *sw = calloc(1, sizeof *sw);
    if (!sw) return KVS_ENOMEM;
    sw->chain = chain;
    sw->p = *params;
    if (!sw->p.profile_steps) sw->p.profile_steps = 16;
    if (sw->p.positional) sw->p.profile_steps = 1, sw->p.min_useful = 0;
    sw->prefix_hash = kvs_xxh3_64(params->prefix.bytes, sizeof params->prefix.bytes);
    uint64_t planes = (uint64_t)params->n_layers * params->n_heads;
    sw->layers = calloc(params->n_layers, sizeof *sw->layers);
    sw->planes = calloc(planes, sizeof *sw->planes);
    sw->need = calloc(params->rows_end, sizeof *sw->need);
    if (!sw->layers || !sw->planes || !sw->need) {
        kvs_sparse_swarm_close(sw);
        return KVS_ENOMEM;
    }
    for (uint32_t l = 0; l < params->n_layers; l++) {
        if (read_manifest(sw, l) == KVS_OK) {
            sw->layers[l].ready = 1;
            sw->st.layers_found++;
            cache_start(sw, l);
        } else {
            profile_start(sw, &sw->layers[l]);
        }
    }
    *out = sw;
    return KVS_OK;
}

void kvs_sparse_swarm_close(kvs_sparse_swarm *sw) {
    if (!sw) return;
    for (uint32_t l = 0; sw->layers && l < sw->p.n_layers; l++) {
        profile_free(sw, &sw->layers[l]);
        cache_free(sw, &sw->layers[l]);
    }
    for (uint64_t i = 0; sw->planes && i < (uint64_t)sw->p.n_layers * sw->p.n_heads; i++)
        plane_free(&sw->planes[i]);
    free(sw->layers);
    free(sw->planes);
    free(sw->need);
    free(sw->mark);
    free(sw);
}

void kvs_sparse_swarm_set_source(kvs_sparse_swarm *sw, kvs_sparse_swarm_row_fn row, void *ctx) {
    sw->row = row;
    sw->row_ctx = ctx;
}

int kvs_sparse_swarm_index(const kvs_sparse_swarm *sw, uint32_t layer, uint32_t head,
                           uint32_t *n_clusters, const uint32_t **offsets, const uint32_t **rows) {
    if (!kvs_sparse_swarm_ready(sw, layer) || head >= sw->p.n_heads) return 0;
    const sw_plane *pl = &sw->planes[(uint64_t)layer * sw->p.n_heads + head];
    *n_clusters = pl->n_clusters;
    *offsets = pl->start;
    *rows = pl->members;
    return pl->n_clusters > 0;
}

int kvs_sparse_swarm_ready(const kvs_sparse_swarm *sw, uint32_t layer) {
    return sw && layer < sw->p.n_layers && sw->layers[layer].ready;
}

void kvs_sparse_swarm_observe(kvs_sparse_swarm *sw, uint32_t layer, uint32_t head,
                              const uint32_t *rows, uint32_t n) {
    sw_layer *ly = &sw->layers[layer];
    if (!ly->profiling || head >= sw->p.n_heads || sw->p.positional) return;
    uint32_t kept = 0, *in = sw->need; /* scratch: need is all zeros between reads */
    for (uint32_t i = 0; i < n; i++)
        if (rows[i] >= sw->p.sink && rows[i] < sw->p.rows_end) in[kept++] = rows[i];
    kvs_swarm_profile_add_step(ly->prof[head], in, kept);
    memset(in, 0, (uint64_t)kept * sizeof *in);
}

void kvs_sparse_swarm_step_done(kvs_sparse_swarm *sw, uint32_t layer) {
    sw_layer *ly = &sw->layers[layer];
    if (!ly->profiling && ly->ready && ly->lost + ly->found >= LOST_READS) {
        int gone = ly->lost > ly->found;
        ly->lost = ly->found = 0;
        if (gone) { /* most of its clusters are gone from the tier (evicted, or writes the tier
                     * dropped): cluster again */
            profile_start(sw, ly);
            return;
        }
    }
    if (!ly->profiling && ly->ready && sw->p.min_useful > 0 && ly->win_read >= MAINT_WINDOW) {
        /* maintenance: too little of what the clusters bring is needed: profile again */
        if ((double)ly->win_useful < sw->p.min_useful * (double)ly->win_read) profile_start(sw, ly);
        ly->win_read = ly->win_useful = 0;
        return;
    }
    if (!ly->profiling || ++ly->profiled < sw->p.profile_steps) return;
    build_layer(sw, layer); /* a failure leaves the layer reading rows as before */
    profile_free(sw, ly);
}

/* ---- reading a step's rows out of clusters --------------------------------------------------- */

/* One kvs_sparse_swarm_read: its request, the clusters it chose and the bytes read for them. */
typedef struct sw_read {
    kvs_sparse_swarm *sw;
    sw_layer *ly;
    uint32_t layer, stride;
    const uint32_t *rows, *n;       /* per head: rows + head * stride, n[head] of them */
    uint32_t *chosen, *chosen_head; /* layer-wide cluster ids, and the head of each */
    uint32_t n_chosen;
    uint8_t **buf; /* [n_chosen]: a chosen cluster's bytes, NULL where its rows come from chunks */
    /* the batched read of the clusters the cache lacks; `which` maps a read to its chosen one */
    kvs_key *keys;
    void **dsts;
    uint64_t *caps, *lens;
    kvs_status *sts;
    uint32_t *which;
} sw_read;

/* Stamps for a read of ly's clusters: grown when it has more, restarted when they ran out. */
static int marks_ready(kvs_sparse_swarm *sw, const sw_layer *ly) {
    if (ly->n_clusters <= sw->mark_cap && sw->stamp != UINT32_MAX) return 1;
    free(sw->mark);
    sw->mark_cap = ly->n_clusters > sw->mark_cap ? ly->n_clusters : sw->mark_cap;
    sw->mark = calloc(sw->mark_cap, sizeof *sw->mark);
    sw->stamp = 0;
    if (!sw->mark) {
        sw->mark_cap = 0;
        return 0;
    }
    return 1;
}

/* need[r] = its index in a head's rows hr[0..n) + 1, for the rows clusters may hold. */
static void need_set(kvs_sparse_swarm *sw, const uint32_t *hr, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (hr[i] >= sw->p.sink && hr[i] < sw->p.rows_end) sw->need[hr[i]] = i + 1;
}

/* need back to all zeros after a head. */
static void need_clear(kvs_sparse_swarm *sw, const uint32_t *hr, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (hr[i] < sw->p.rows_end) sw->need[hr[i]] = 0;
}

/* The cluster of pl to cover row r: one chosen already in this read, else the one holding most
 * of the rows still needed (UINT32_MAX: none holds it). */
static uint32_t best_cluster(const kvs_sparse_swarm *sw, const sw_plane *pl, uint32_t r,
                             uint32_t stamp) {
    uint32_t best = UINT32_MAX, best_n = 0;
    for (uint32_t x = pl->row_start[r]; x < pl->row_start[r + 1]; x++) {
        uint32_t c = pl->row_cl[x];
        if (sw->mark[pl->base + c] == stamp) return c; /* chosen already: take it */
        uint32_t covers = 0;
        for (uint32_t j = pl->start[c]; j < pl->start[c + 1]; j++)
            covers += sw->need[pl->members[j]] != 0;
        if (covers > best_n) best = c, best_n = covers;
    }
    return best;
}

/* Head g's clusters covering its rows, appended to rd->chosen. */
static void choose_for_head(sw_read *rd, uint32_t g, uint32_t stamp) {
    kvs_sparse_swarm *sw = rd->sw;
    sw_plane *pl = plane_of(sw, rd->layer, g);
    const uint32_t *hr = rd->rows + (uint64_t)g * rd->stride;
    need_set(sw, hr, rd->n[g]);
    for (uint32_t i = 0; i < rd->n[g]; i++) {
        uint32_t r = hr[i];
        if (r < sw->p.sink || r >= sw->p.rows_end || !sw->need[r]) continue;
        uint32_t best = best_cluster(sw, pl, r, stamp);
        if (best == UINT32_MAX) continue;
        for (uint32_t j = pl->start[best]; j < pl->start[best + 1]; j++)
            sw->need[pl->members[j]] = 0; /* covered */
        if (sw->mark[pl->base + best] != stamp) {
            sw->mark[pl->base + best] = stamp;
            rd->chosen[rd->n_chosen] = pl->base + best;
            rd->chosen_head[rd->n_chosen++] = g;
        }
    }
    need_clear(sw, hr, rd->n[g]);
}

/* Per head, the clusters covering its rows; 0 when there is no room to note them. */
static int choose_clusters(sw_read *rd) {
    uint64_t total = 0;
    for (uint32_t g = 0; g < rd->sw->p.n_heads; g++) total += rd->n[g];
    rd->chosen = malloc((total + 1) * sizeof *rd->chosen);
    rd->chosen_head = malloc((total + 1) * sizeof *rd->chosen_head);
    if (!rd->chosen || !rd->chosen_head) return 0;
    uint32_t stamp = ++rd->sw->stamp;
    for (uint32_t g = 0; g < rd->sw->p.n_heads; g++) choose_for_head(rd, g, stamp);
    return 1;
}

/* Chosen cluster i's bytes: the cache's, or a buffer queued for the batched read. */
static void queue_cluster(sw_read *rd, uint32_t i, uint32_t *n_read) {
    kvs_sparse_swarm *sw = rd->sw;
    sw_layer *ly = rd->ly;
    uint32_t lid = rd->chosen[i], g = rd->chosen_head[i];
    sw_plane *pl = plane_of(sw, rd->layer, g);
    uint32_t c = lid - pl->base, m = pl->start[c + 1] - pl->start[c];
    if (ly->cache && ly->cache->cached[lid] && ly->cached && ly->cached[lid]) {
        rd->buf[i] = ly->cached[lid];
        sw->st.cache_hits++;
        return;
    }
    if (!(rd->buf[i] = malloc(cl_bytes(sw, m)))) return;
    uint32_t x = (*n_read)++;
    rd->keys[x] = cluster_key(sw, ly->nonce, ly->gen, rd->layer, g, c);
    rd->sts[x] = KVS_EIO;
    rd->lens[x] = 0;
    rd->dsts[x] = rd->buf[i];
    rd->caps[x] = cl_bytes(sw, m);
    rd->which[x] = i;
}

/* Read x of the batch: kept when whole and the cluster the manifest names, else let go. */
static void check_cluster(sw_read *rd, uint32_t x) {
    kvs_sparse_swarm *sw = rd->sw;
    sw_layer *ly = rd->ly;
    uint32_t i = rd->which[x], g = rd->chosen_head[i];
    sw_plane *pl = plane_of(sw, rd->layer, g);
    uint32_t c = rd->chosen[i] - pl->base, m = pl->start[c + 1] - pl->start[c];
    uint8_t want[CL_HEADER];
    header(sw, want, CL_MAGIC, rd->layer, g, c, m, ly->gen);
    if (rd->sts[x] != KVS_OK || rd->lens[x] != cl_bytes(sw, m) ||
        memcmp(rd->buf[i], want, CL_HEADER) != 0 ||
        memcmp(rd->buf[i] + CL_HEADER, pl->members + pl->start[c], 4ull * m) != 0) {
        free(rd->buf[i]); /* missing or damaged: its rows are read from their chunks */
        rd->buf[i] = NULL;
        ly->lost++;
        return;
    }
    ly->found++;
    sw->st.clusters_read++;
    sw->st.cluster_bytes += rd->lens[x];
}

/* The chosen clusters the cache lacks, in one read. */
static void read_clusters(sw_read *rd) {
    uint32_t n = rd->n_chosen + 1;
    rd->buf = calloc(n, sizeof *rd->buf);
    rd->keys = malloc(n * sizeof *rd->keys);
    rd->dsts = malloc(n * sizeof *rd->dsts);
    rd->caps = malloc(n * 8ull);
    rd->lens = malloc(n * 8ull);
    rd->sts = malloc(n * sizeof *rd->sts);
    rd->which = malloc(n * 4ull);
    if (!rd->buf || !rd->keys || !rd->dsts || !rd->caps || !rd->lens || !rd->sts || !rd->which)
        return;
    uint32_t n_read = 0;
    for (uint32_t i = 0; i < rd->n_chosen; i++) queue_cluster(rd, i, &n_read);
    if (n_read && kvs_tiers_get_many(rd->sw->chain, rd->sw->p.tier, rd->keys, rd->dsts, rd->caps,
                                     n_read, rd->lens, rd->sts) != KVS_OK)
        for (uint32_t x = 0; x < n_read; x++) rd->sts[x] = KVS_EIO; /* the call failed whole */
    for (uint32_t x = 0; x < n_read; x++) check_cluster(rd, x);
}

/* Head g's rows out of its clusters into their slots. */
static void place_head_rows(sw_read *rd, uint32_t g, const uint32_t *slots, uint8_t *done,
                            kvs_sparse_swarm_place_fn place, void *ctx) {
    kvs_sparse_swarm *sw = rd->sw;
    sw_layer *ly = rd->ly;
    const uint32_t *hr = rd->rows + (uint64_t)g * rd->stride;
    need_set(sw, hr, rd->n[g]);
    for (uint32_t x = 0; x < rd->n_chosen; x++) {
        if (rd->chosen_head[x] != g || !rd->buf[x]) continue;
        sw_plane *pl = plane_of(sw, rd->layer, g);
        uint32_t c = rd->chosen[x] - pl->base, m = pl->start[c + 1] - pl->start[c];
        const uint8_t *kd = rd->buf[x] + cl_bytes(sw, m) - 2ull * m * sw->p.head_bytes;
        for (uint32_t j = 0; j < m; j++) {
            uint32_t r = pl->members[pl->start[c] + j], i = sw->need[r];
            ly->win_read++;
            if (!i) continue;
            i--;
            sw->need[r] = 0;
            ly->win_useful++;
            uint64_t at = (uint64_t)g * rd->stride + i;
            if (place(ctx, g, slots[at], r, kd + (uint64_t)j * sw->p.head_bytes,
                      kd + ((uint64_t)m + j) * sw->p.head_bytes) == 0) {
                done[at] = 1;
                sw->st.rows_placed++;
            }
        }
    }
    need_clear(sw, hr, rd->n[g]);
}

/* The hot-cluster cache steps over what was read: keep what it admits, let go of what it evicts
 * (and, without a cache, of all that was read). */
static void keep_in_cache(sw_read *rd) {
    sw_layer *ly = rd->ly;
    if (!ly->cache || !rd->buf) {
        for (uint32_t i = 0; rd->buf && i < rd->n_chosen; i++) free(rd->buf[i]);
        return;
    }
    uint32_t n_got = 0; /* only clusters with bytes behind them take room in the cache */
    for (uint32_t i = 0; i < rd->n_chosen; i++)
        if (rd->buf[i]) rd->which[n_got++] = rd->chosen[i];
    kvs_swarm_cache_step(ly->cache, rd->which, n_got, NULL);
    for (uint32_t i = 0; i < rd->n_chosen; i++) {
        uint32_t lid = rd->chosen[i];
        if (!rd->buf[i] || ly->cached[lid] == rd->buf[i]) continue;
        if (ly->cache->cached[lid] && !ly->cached[lid])
            ly->cached[lid] = rd->buf[i]; /* admitted */
        else
            free(rd->buf[i]);
        rd->buf[i] = NULL;
    }
    for (uint32_t lid = 0; lid < ly->n_clusters; lid++)
        if (ly->cached[lid] && !ly->cache->cached[lid]) {
            free(ly->cached[lid]);
            ly->cached[lid] = NULL;
        }
}

static void read_free(sw_read *rd) {
    free(rd->buf);
    free(rd->keys);
    free(rd->dsts);
    free(rd->caps);
    free(rd->lens);
    free(rd->sts);
    free(rd->which);
    free(rd->chosen);
    free(rd->chosen_head);
}

void kvs_sparse_swarm_read(kvs_sparse_swarm *sw, uint32_t layer, const uint32_t *rows,
                           const uint32_t *slots, const uint32_t *n, uint32_t stride, uint8_t *done,
                           kvs_sparse_swarm_place_fn place, void *ctx) {
    sw_layer *ly = &sw->layers[layer];
    if (!ly->ready || !ly->n_clusters) return;
    if (!marks_ready(sw, ly)) return;
    sw_read rd = {.sw = sw, .ly = ly, .layer = layer, .stride = stride, .rows = rows, .n = n};
    if (!choose_clusters(&rd)) {
        read_free(&rd);
        return;
    }
    read_clusters(&rd);
    for (uint32_t g = 0; rd.buf && g < sw->p.n_heads; g++)
        place_head_rows(&rd, g, slots, done, place, ctx);
    keep_in_cache(&rd);
    read_free(&rd);
}

void kvs_sparse_swarm_get_stats(const kvs_sparse_swarm *sw, kvs_sparse_swarm_stats *out) {
    *out = sw->st;
}
