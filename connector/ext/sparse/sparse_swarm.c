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
#include "sparse_swarm_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_sparse.h"
#include "common/xxh3.h"
#include "schedulers/swarm/swarm_cache.h"
#include "schedulers/swarm/swarm_cluster.h"
#include "schedulers/swarm/swarm_graph.h"

uint64_t sw_cl_bytes(const kvs_sparse_swarm *sw, uint32_t n) {
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
kvs_key sw_cluster_key(const kvs_sparse_swarm *sw, uint32_t nonce, uint32_t gen, uint32_t layer,
                       uint32_t head, uint32_t c) {
    kvs_sparse_swarm_params p = sw->p;
    p.nonce = nonce;
    return kvs_sparse_swarm_cluster_key(&p, gen, layer, head, c);
}

static kvs_key manifest_key(const kvs_sparse_swarm_params *p, uint32_t layer) {
    uint32_t what[3] = {MF_MAGIC, layer, p->n_heads};
    return raw_key(p, what, 3);
}

sw_plane *sw_plane_of(kvs_sparse_swarm *sw, uint32_t layer, uint32_t head) {
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
        sw_plane *pl = sw_plane_of(sw, layer, g);
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
            sw_plane *pl = sw_plane_of(sw, layer, g);
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

void sw_header(kvs_sparse_swarm *sw, uint8_t *at, uint32_t magic, uint32_t layer, uint32_t a,
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
    sw_header(sw, buf, MF_MAGIC, layer, sw->p.n_heads, sw->p.rows_end, sw->p.nonce, gen);
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
        sw_header(sw, want, MF_MAGIC, layer, sw->p.n_heads, sw->p.rows_end, nonce, gen);
        if (memcmp(want, buf, MF_HEADER) != 0) st = KVS_ECORRUPT;
    }
    for (uint32_t g = 0; st == KVS_OK && g < sw->p.n_heads; g++) {
        sw_plane *pl = sw_plane_of(sw, layer, g);
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
        for (uint32_t g = 0; g < sw->p.n_heads; g++) plane_free(sw_plane_of(sw, layer, g));
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
            if (!(obj[g][c] = calloc(1, sw_cl_bytes(sw, n)))) {
                st = KVS_ENOMEM;
                break;
            }
            sw_header(sw, obj[g][c], CL_MAGIC, layer, g, c, n, gen);
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
                uint8_t *kd = obj[g][c] + sw_cl_bytes(sw, n) - 2ull * n * sw->p.head_bytes;
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
            kvs_key key = sw_cluster_key(sw, sw->p.nonce, gen, layer, g, c);
            ops->remove(state, &key);
            st = ops->put(state, &key, obj[g][c], sw_cl_bytes(sw, n));
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
            kvs_key key = sw_cluster_key(sw, sw->p.nonce, gen, layer, g, c);
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
        sw_plane *old = sw_plane_of(sw, layer, g);
        for (uint32_t c = 0; ly->ready && c < old->n_clusters; c++) {
            kvs_key key = sw_cluster_key(sw, ly->nonce, ly->gen, layer, g, c);
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

void kvs_sparse_swarm_get_stats(const kvs_sparse_swarm *sw, kvs_sparse_swarm_stats *out) {
    *out = sw->st;
}
