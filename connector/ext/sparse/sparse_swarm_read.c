/* sparse_swarm_read.c - a step's rows read out of Swarm's clusters in the SSD tier
 * (kvs_sparse_swarm_read, sparse_swarm.h): choose the clusters that cover the rows, read those the
 * hot-cluster cache lacks in one batch, check each, place the rows, keep what the cache admits. */
#include "sparse_swarm.h"
#include "sparse_swarm_state.h"

#include <stdlib.h>
#include <string.h>

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
    sw_plane *pl = sw_plane_of(sw, rd->layer, g);
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
    sw_plane *pl = sw_plane_of(sw, rd->layer, g);
    uint32_t c = lid - pl->base, m = pl->start[c + 1] - pl->start[c];
    if (ly->cache && ly->cache->cached[lid] && ly->cached && ly->cached[lid]) {
        rd->buf[i] = ly->cached[lid];
        sw->st.cache_hits++;
        return;
    }
    if (!(rd->buf[i] = malloc(sw_cl_bytes(sw, m)))) return;
    uint32_t x = (*n_read)++;
    rd->keys[x] = sw_cluster_key(sw, ly->nonce, ly->gen, rd->layer, g, c);
    rd->sts[x] = KVS_EIO;
    rd->lens[x] = 0;
    rd->dsts[x] = rd->buf[i];
    rd->caps[x] = sw_cl_bytes(sw, m);
    rd->which[x] = i;
}

/* Read x of the batch: kept when whole and the cluster the manifest names, else let go. */
static void check_cluster(sw_read *rd, uint32_t x) {
    kvs_sparse_swarm *sw = rd->sw;
    sw_layer *ly = rd->ly;
    uint32_t i = rd->which[x], g = rd->chosen_head[i];
    sw_plane *pl = sw_plane_of(sw, rd->layer, g);
    uint32_t c = rd->chosen[i] - pl->base, m = pl->start[c + 1] - pl->start[c];
    uint8_t want[CL_HEADER];
    sw_header(sw, want, CL_MAGIC, rd->layer, g, c, m, ly->gen);
    if (rd->sts[x] != KVS_OK || rd->lens[x] != sw_cl_bytes(sw, m) ||
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
        sw_plane *pl = sw_plane_of(sw, rd->layer, g);
        uint32_t c = rd->chosen[x] - pl->base, m = pl->start[c + 1] - pl->start[c];
        const uint8_t *kd = rd->buf[x] + sw_cl_bytes(sw, m) - 2ull * m * sw->p.head_bytes;
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
