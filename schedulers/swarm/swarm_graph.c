/* swarm_graph.c - the co-activation profile and the sparse distance graph built from it (see
 * swarm_graph.h). */
#include "swarm_graph.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY_KEY             UINT64_MAX
#define INITIAL_PAIR_CAPACITY 1024u

/* ---- profile ------------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t pair_key(uint32_t i, uint32_t j) {
    return i < j ? ((uint64_t)i << 32) | j : ((uint64_t)j << 32) | i;
}

/* Slot of key, or of the empty slot where it would go. The table is never full (load <= 0.7). */
static uint64_t pair_find(const kvs_swarm_profile *p, uint64_t key) {
    uint64_t mask = p->pair_capacity - 1, slot = mix64(key) & mask;
    while (p->pair_keys[slot] != EMPTY_KEY && p->pair_keys[slot] != key) slot = (slot + 1) & mask;
    return slot;
}

/* Re-insert every pair whose count + delta is above drop_limit into a table of new_capacity slots. */
static kvs_status pair_rehash(kvs_swarm_profile *p, uint64_t new_capacity, uint32_t drop_limit) {
    uint64_t *keys = malloc(new_capacity * sizeof *keys);
    uint32_t *counts = malloc(new_capacity * sizeof *counts);
    uint32_t *deltas = malloc(new_capacity * sizeof *deltas);
    if (!keys || !counts || !deltas) {
        free(keys);
        free(counts);
        free(deltas);
        return KVS_ENOMEM;
    }
    for (uint64_t s = 0; s < new_capacity; s++) keys[s] = EMPTY_KEY;
    uint64_t *old_keys = p->pair_keys, old_capacity = p->pair_capacity;
    uint32_t *old_counts = p->pair_counts, *old_deltas = p->pair_deltas;
    p->pair_keys = keys;
    p->pair_counts = counts;
    p->pair_deltas = deltas;
    p->pair_capacity = new_capacity;
    p->n_pairs = 0;
    for (uint64_t s = 0; s < old_capacity; s++) {
        if (old_keys[s] == EMPTY_KEY || (uint64_t)old_counts[s] + old_deltas[s] <= drop_limit)
            continue;
        uint64_t slot = pair_find(p, old_keys[s]);
        keys[slot] = old_keys[s];
        counts[slot] = old_counts[s];
        deltas[slot] = old_deltas[s];
        p->n_pairs++;
    }
    free(old_keys);
    free(old_counts);
    free(old_deltas);
    return KVS_OK;
}

kvs_status kvs_swarm_profile_create(uint32_t n_entries, uint64_t max_pairs,
                                    kvs_swarm_profile **out) {
    if (!out) return KVS_EINVAL;
    *out = NULL;
    if (n_entries == 0) return KVS_EINVAL;
    kvs_swarm_profile *p = calloc(1, sizeof *p);
    if (!p) return KVS_ENOMEM;
    p->n_entries = n_entries;
    p->max_pairs = max_pairs;
    p->activations = calloc(n_entries, sizeof *p->activations);
    p->step_ids = malloc((size_t)n_entries * sizeof *p->step_ids);
    p->step_stamp = calloc(n_entries, sizeof *p->step_stamp);
    p->pair_keys = malloc(INITIAL_PAIR_CAPACITY * sizeof *p->pair_keys);
    p->pair_counts = malloc(INITIAL_PAIR_CAPACITY * sizeof *p->pair_counts);
    p->pair_deltas = malloc(INITIAL_PAIR_CAPACITY * sizeof *p->pair_deltas);
    if (!p->activations || !p->step_ids || !p->step_stamp || !p->pair_keys || !p->pair_counts ||
        !p->pair_deltas) {
        kvs_swarm_profile_destroy(p);
        return KVS_ENOMEM;
    }
    p->pair_capacity = INITIAL_PAIR_CAPACITY;
    for (uint64_t s = 0; s < p->pair_capacity; s++) p->pair_keys[s] = EMPTY_KEY;
    *out = p;
    return KVS_OK;
}

void kvs_swarm_profile_destroy(kvs_swarm_profile *p) {
    if (!p) return;
    free(p->activations);
    free(p->step_ids);
    free(p->step_stamp);
    free(p->pair_keys);
    free(p->pair_counts);
    free(p->pair_deltas);
    free(p);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Make room for one more pair: grow while under max_pairs, else drop the rarest pairs (lossy counting:
 * a pair goes when count + delta <= floor, so a pair that is not stored occurred at most floor times,
 * and a stored one at most count + delta times, with delta the floor when it was last inserted). */
static kvs_status pair_make_room(kvs_swarm_profile *p) {
    if (p->max_pairs && p->n_pairs + 1 > p->max_pairs) {
        /* The new floor in one go: the largest count + delta that must go for at most half of
         * max_pairs to stay (all pairs tied with it go too), and at least one above the old floor. */
        uint32_t *values = malloc((size_t)p->n_pairs * sizeof *values + 1);
        if (!values) return KVS_ENOMEM;
        uint64_t n = 0, keep = p->max_pairs / 2;
        for (uint64_t s = 0; s < p->pair_capacity; s++) {
            if (p->pair_keys[s] == EMPTY_KEY) continue;
            uint64_t v = (uint64_t)p->pair_counts[s] + p->pair_deltas[s];
            values[n++] = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
        }
        qsort(values, n, sizeof *values, cmp_u32);
        uint32_t new_floor = n > keep ? values[n - keep - 1] : 0;
        free(values);
        p->prune_floor = new_floor > p->prune_floor ? new_floor : p->prune_floor + 1;
        kvs_status st = pair_rehash(p, p->pair_capacity, p->prune_floor);
        if (st != KVS_OK) return st;
    }
    if ((p->n_pairs + 1) * 10 > p->pair_capacity * 7)
        return pair_rehash(p, p->pair_capacity * 2, 0);
    return KVS_OK;
}

kvs_status kvs_swarm_profile_add_step(kvs_swarm_profile *p, const uint32_t *active,
                                      uint32_t n_active) {
    if (!p || (n_active && !active)) return KVS_EINVAL;
    for (uint32_t k = 0; k < n_active; k++)
        if (active[k] >= p->n_entries) return KVS_EINVAL;
    /* Duplicates within one step count once (the stamp marks ids taken this step); sorting makes each
     * pair's key and the order of table updates a function of the set alone. */
    uint64_t step = p->n_steps + 1;
    uint32_t n = 0;
    for (uint32_t k = 0; k < n_active; k++) {
        if (p->step_stamp[active[k]] == step) continue;
        p->step_stamp[active[k]] = step;
        p->step_ids[n++] = active[k];
    }
    qsort(p->step_ids, n, sizeof *p->step_ids, cmp_u32);
    p->n_steps++;
    for (uint32_t a = 0; a < n; a++) p->activations[p->step_ids[a]]++;
    for (uint32_t a = 0; a < n; a++) {
        for (uint32_t b = a + 1; b < n; b++) {
            uint64_t key = pair_key(p->step_ids[a], p->step_ids[b]);
            uint64_t slot = pair_find(p, key);
            if (p->pair_keys[slot] == EMPTY_KEY) {
                kvs_status st = pair_make_room(p);
                if (st != KVS_OK) return st;
                slot = pair_find(p, key);
                p->pair_keys[slot] = key;
                p->pair_counts[slot] = 0;
                p->pair_deltas[slot] = p->prune_floor;
                p->n_pairs++;
            }
            p->pair_counts[slot]++;
            p->pair_increments++;
        }
    }
    return KVS_OK;
}

uint32_t kvs_swarm_profile_count(const kvs_swarm_profile *p, uint32_t i, uint32_t j) {
    if (!p || i >= p->n_entries || j >= p->n_entries) return 0;
    if (i == j) return p->activations[i];
    uint64_t slot = pair_find(p, pair_key(i, j));
    return p->pair_keys[slot] == EMPTY_KEY ? 0 : p->pair_counts[slot];
}

uint64_t kvs_swarm_profile_total(const kvs_swarm_profile *p) {
    return p ? 2 * p->pair_increments : 0;
}

/* ---- distance ----------------------------------------------------------------------------------- */

static double metric_distance(const kvs_swarm_profile *p, kvs_swarm_metric metric, uint32_t i,
                              uint32_t j, uint32_t f_ij) {
    double f = (double)f_ij;
    switch (metric) {
        case KVS_SWARM_METRIC_GLOBAL: {
            uint64_t total = kvs_swarm_profile_total(p);
            return total ? 1.0 - f / (double)total : 1.0;
        }
        case KVS_SWARM_METRIC_RATE: return p->n_steps ? 1.0 - f / (double)p->n_steps : 1.0;
        case KVS_SWARM_METRIC_JACCARD:
        default: {
            /* f_ij <= min(f_ii, f_jj), so the union is at least max(f_ii, f_jj) and d is in [0, 1]. */
            double uni = (double)p->activations[i] + (double)p->activations[j] - f;
            return uni > 0.0 ? 1.0 - f / uni : 1.0;
        }
    }
}

double kvs_swarm_distance(const kvs_swarm_profile *p, kvs_swarm_metric metric, uint32_t i,
                          uint32_t j) {
    if (!p || i >= p->n_entries || j >= p->n_entries) return 1.0;
    if (i == j) return 0.0;
    return metric_distance(p, metric, i, j, kvs_swarm_profile_count(p, i, j));
}

/* ---- graph -------------------------------------------------------------------------------------- */

typedef struct row_item {
    uint32_t neighbour;
    uint32_t
        position; /* arrival order within the row, so a repeated pair keeps its last distance */
    double distance;
} row_item;

static int cmp_row_item(const void *a, const void *b) {
    const row_item *x = a, *y = b;
    if (x->neighbour != y->neighbour) return x->neighbour < y->neighbour ? -1 : 1;
    return (x->position > y->position) - (x->position < y->position);
}

void kvs_swarm_graph_destroy(kvs_swarm_graph *g) {
    if (!g) return;
    free(g->row_start);
    free(g->neighbour);
    free(g->distance);
    free(g);
}

/* CSR from undirected edges (a[k], b[k], d[k]); each edge is stored in both rows. */
static kvs_status graph_from_edges(uint32_t n_entries, const uint32_t *a, const uint32_t *b,
                                   const double *d, uint64_t n_edges, kvs_swarm_graph **out) {
    kvs_status st = KVS_ENOMEM;
    kvs_swarm_graph *g = calloc(1, sizeof *g);
    row_item *items = NULL;
    uint64_t *fill = NULL;
    if (!g) goto fail;
    g->n_entries = n_entries;
    g->row_start = calloc((size_t)n_entries + 1, sizeof *g->row_start);
    fill = calloc((size_t)n_entries, sizeof *fill);
    items = malloc((size_t)(2 * n_edges + 1) * sizeof *items);
    if (!g->row_start || !fill || !items) goto fail;
    for (uint64_t k = 0; k < n_edges; k++) {
        g->row_start[a[k] + 1]++;
        g->row_start[b[k] + 1]++;
    }
    for (uint32_t i = 0; i < n_entries; i++) g->row_start[i + 1] += g->row_start[i];
    for (uint64_t k = 0; k < n_edges; k++) {
        uint64_t pa = g->row_start[a[k]] + fill[a[k]], pb = g->row_start[b[k]] + fill[b[k]];
        items[pa] = (row_item){b[k], (uint32_t)fill[a[k]]++, d[k]};
        items[pb] = (row_item){a[k], (uint32_t)fill[b[k]]++, d[k]};
    }
    /* Sort each row by neighbour and keep the last of each repeated neighbour, compacting in place. */
    uint64_t write = 0;
    for (uint32_t i = 0; i < n_entries; i++) {
        uint64_t begin = g->row_start[i], end = g->row_start[i + 1];
        qsort(items + begin, end - begin, sizeof *items, cmp_row_item);
        g->row_start[i] = write;
        for (uint64_t k = begin; k < end; k++) {
            if (k + 1 < end && items[k + 1].neighbour == items[k].neighbour) continue;
            items[write++] = items[k];
        }
    }
    g->row_start[n_entries] = write;
    g->neighbour = malloc((size_t)(write + 1) * sizeof *g->neighbour);
    g->distance = malloc((size_t)(write + 1) * sizeof *g->distance);
    if (!g->neighbour || !g->distance) goto fail;
    for (uint64_t k = 0; k < write; k++) {
        g->neighbour[k] = items[k].neighbour;
        g->distance[k] = items[k].distance;
    }
    free(items);
    free(fill);
    *out = g;
    return KVS_OK;
fail:
    free(items);
    free(fill);
    kvs_swarm_graph_destroy(g);
    return st;
}

kvs_status kvs_swarm_graph_from_pairs(uint32_t n_entries, const uint32_t *a, const uint32_t *b,
                                      const double *d, uint64_t n_pairs, kvs_swarm_graph **out) {
    if (!out) return KVS_EINVAL;
    *out = NULL;
    if (n_entries == 0 || (n_pairs && (!a || !b || !d))) return KVS_EINVAL;
    uint64_t n_edges = 0;
    for (uint64_t k = 0; k < n_pairs; k++) {
        if (a[k] >= n_entries || b[k] >= n_entries || !(d[k] >= 0.0 && d[k] <= 1.0))
            return KVS_EINVAL;
        if (a[k] != b[k]) n_edges++;
    }
    uint32_t *ea = malloc((size_t)(n_edges + 1) * sizeof *ea),
             *eb = malloc((size_t)(n_edges + 1) * sizeof *eb);
    double *ed = malloc((size_t)(n_edges + 1) * sizeof *ed);
    kvs_status st = KVS_ENOMEM;
    if (ea && eb && ed) {
        uint64_t e = 0;
        for (uint64_t k = 0; k < n_pairs; k++) {
            if (a[k] == b[k]) continue;
            ea[e] = a[k];
            eb[e] = b[k];
            ed[e++] = d[k];
        }
        st = graph_from_edges(n_entries, ea, eb, ed, n_edges, out);
    }
    free(ea);
    free(eb);
    free(ed);
    return st;
}

kvs_status kvs_swarm_graph_build(const kvs_swarm_profile *p, kvs_swarm_metric metric,
                                 double keep_radius, uint32_t min_count, kvs_swarm_graph **out) {
    if (!out) return KVS_EINVAL;
    *out = NULL;
    if (!p) return KVS_EINVAL;
    uint64_t n_edges = 0;
    for (uint64_t s = 0; s < p->pair_capacity; s++) {
        if (p->pair_keys[s] == EMPTY_KEY) continue;
        uint32_t i = (uint32_t)(p->pair_keys[s] >> 32), j = (uint32_t)p->pair_keys[s];
        if (p->pair_counts[s] >= min_count &&
            metric_distance(p, metric, i, j, p->pair_counts[s]) <= keep_radius)
            n_edges++;
    }
    uint32_t *ea = malloc((size_t)(n_edges + 1) * sizeof *ea),
             *eb = malloc((size_t)(n_edges + 1) * sizeof *eb);
    double *ed = malloc((size_t)(n_edges + 1) * sizeof *ed);
    kvs_status st = KVS_ENOMEM;
    if (ea && eb && ed) {
        /* Table order is a fixed function of the keys, so the graph is deterministic. */
        uint64_t e = 0;
        for (uint64_t s = 0; s < p->pair_capacity; s++) {
            if (p->pair_keys[s] == EMPTY_KEY || p->pair_counts[s] < min_count) continue;
            uint32_t i = (uint32_t)(p->pair_keys[s] >> 32), j = (uint32_t)p->pair_keys[s];
            double d = metric_distance(p, metric, i, j, p->pair_counts[s]);
            if (d > keep_radius) continue;
            ea[e] = i;
            eb[e] = j;
            ed[e++] = d;
        }
        st = graph_from_edges(p->n_entries, ea, eb, ed, n_edges, out);
    }
    free(ea);
    free(eb);
    free(ed);
    return st;
}

double kvs_swarm_graph_distance(const kvs_swarm_graph *g, uint32_t i, uint32_t j) {
    if (!g || i >= g->n_entries || j >= g->n_entries) return 1.0;
    if (i == j) return 0.0;
    uint64_t lo = g->row_start[i], hi = g->row_start[i + 1];
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (g->neighbour[mid] < j)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < g->row_start[i + 1] && g->neighbour[lo] == j ? g->distance[lo] : 1.0;
}
