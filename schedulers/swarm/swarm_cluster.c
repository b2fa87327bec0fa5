/* swarm_cluster.c - Algorithm 1 and the cluster layout with its route table (see swarm_cluster.h).
 */
#include "swarm.h"

#include <stdlib.h>
#include <string.h>

/* ---- clusters ----------------------------------------------------------------------------------- */

void kvs_swarm_cluster_defaults(kvs_swarm_cluster_params *params) {
    if (!params) return;
    memset(params, 0, sizeof *params);
    params->tau = 0.5;
    params->max_copies = 3;
    params->max_extra_slots = 0.25;
}

kvs_status kvs_swarm_clusters_create(uint32_t max_entries, kvs_swarm_clusters **out) {
    if (!out) return KVS_EINVAL;
    *out = NULL;
    if (max_entries == 0) return KVS_EINVAL;
    kvs_swarm_clusters *c = calloc(1, sizeof *c);
    if (!c) return KVS_ENOMEM;
    c->max_entries = max_entries;
    c->copies = calloc(max_entries, sizeof *c->copies);
    if (!c->copies) {
        free(c);
        return KVS_ENOMEM;
    }
    *out = c;
    return KVS_OK;
}

void kvs_swarm_clusters_destroy(kvs_swarm_clusters *c) {
    if (!c) return;
    for (uint32_t k = 0; k < c->n_clusters; k++) {
        free(c->items[k].members);
        free(c->items[k].paths);
        free(c->items[k].slots);
    }
    free(c->items);
    free(c->copies);
    free(c);
}

kvs_status kvs_swarm_clusters_add(kvs_swarm_clusters *c, uint32_t *index) {
    if (!c) return KVS_EINVAL;
    if (c->n_clusters == UINT32_MAX) return KVS_ENOMEM;
    if (c->n_clusters == c->capacity) {
        uint32_t cap = c->capacity ? c->capacity * 2 : 64;
        kvs_swarm_cluster *items = realloc(c->items, (size_t)cap * sizeof *items);
        if (!items) return KVS_ENOMEM;
        c->items = items;
        c->capacity = cap;
    }
    memset(&c->items[c->n_clusters], 0, sizeof c->items[0]);
    c->items[c->n_clusters].start_path = KVS_SWARM_UNPLACED;
    if (index) *index = c->n_clusters;
    c->n_clusters++;
    return KVS_OK;
}

kvs_status kvs_swarm_clusters_add_member(kvs_swarm_clusters *c, uint32_t index, uint32_t entry) {
    if (!c || index >= c->n_clusters || entry >= c->max_entries) return KVS_EINVAL;
    kvs_swarm_cluster *cl = &c->items[index];
    if (cl->n_members == cl->capacity) {
        uint32_t cap = cl->capacity ? cl->capacity * 2 : 8;
        uint32_t *members = realloc(cl->members, (size_t)cap * sizeof *members);
        if (!members) return KVS_ENOMEM;
        cl->members = members;
        uint32_t *paths = realloc(cl->paths, (size_t)cap * sizeof *paths);
        if (!paths) return KVS_ENOMEM;
        cl->paths = paths;
        uint64_t *slots = realloc(cl->slots, (size_t)cap * sizeof *slots);
        if (!slots) return KVS_ENOMEM;
        cl->slots = slots;
        cl->capacity = cap;
    }
    cl->members[cl->n_members] = entry;
    cl->paths[cl->n_members] = KVS_SWARM_UNPLACED;
    cl->slots[cl->n_members] = 0;
    cl->n_members++;
    if (c->copies[entry]++ == 0) c->n_covered++;
    c->n_slots++;
    return KVS_OK;
}

typedef struct ranked {
    uint32_t key; /* rho, or unused */
    uint32_t id;
    double distance;
} ranked;

static int cmp_medoid_rank(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int cmp_candidate(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->distance != y->distance) return x->distance < y->distance ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* rho over the entries with member[e] set (all when member is NULL). */
static uint32_t density(const kvs_swarm_graph *g, double tau, const uint8_t *member, uint32_t e) {
    uint32_t rho = 0;
    for (uint64_t k = g->row_start[e]; k < g->row_start[e + 1]; k++)
        if (g->distance[k] <= tau && (!member || member[g->neighbour[k]])) rho++;
    return rho;
}

kvs_status kvs_swarm_cluster_order(const kvs_swarm_graph *g, double tau, uint32_t *rho,
                                   uint32_t *order) {
    if (!g || !rho || !order) return KVS_EINVAL;
    ranked *r = malloc((size_t)g->n_entries * sizeof *r);
    if (!r) return KVS_ENOMEM;
    for (uint32_t e = 0; e < g->n_entries; e++) {
        rho[e] = density(g, tau, NULL, e);
        r[e] = (ranked){rho[e], e, 0.0};
    }
    qsort(r, g->n_entries, sizeof *r, cmp_medoid_rank);
    for (uint32_t e = 0; e < g->n_entries; e++) order[e] = r[e].id;
    free(r);
    return KVS_OK;
}

/* The neighbours of medoid m within tau (in the subset), nearest first, into cand. Returns how
 * many. */
static uint32_t gather_candidates(const kvs_swarm_graph *g, double tau, const uint8_t *member,
                                  uint32_t m, ranked *cand) {
    uint32_t n_cand = 0;
    for (uint64_t k = g->row_start[m]; k < g->row_start[m + 1]; k++) {
        uint32_t x = g->neighbour[k];
        if (g->distance[k] <= tau && (!member || member[x]))
            cand[n_cand++] = (ranked){0, x, g->distance[k]};
    }
    qsort(cand, n_cand, sizeof *cand, cmp_candidate);
    return n_cand;
}

/* Admit cand[0..n_cand) to cluster ci, nearest first: an entry already covered only within the
 * replica budget (*replicas of replica_cap), and with the mean test unless medoid_only; with
 * fixpoint, again until a pass admits none. Counts each admission in *replicas or *n_uncovered. */
static kvs_status admit_candidates(const kvs_swarm_graph *g, const kvs_swarm_cluster_params *params,
                                   kvs_swarm_clusters *c, uint32_t ci, const ranked *cand,
                                   uint32_t n_cand, uint8_t *pending, uint64_t replica_cap,
                                   uint64_t *replicas, uint64_t *n_uncovered) {
    double tau = params->tau;
    kvs_status st;
    memset(pending, 1, n_cand);
    int admitted_any = 1;
    while (admitted_any) {
        admitted_any = 0;
        for (uint32_t k = 0; k < n_cand; k++) {
            if (!pending[k]) continue;
            uint32_t x = cand[k].id;
            int replica = c->copies[x] > 0;
            /* A budget refusal is final for this cluster; only the mean test can change. */
            if (replica &&
                (params->no_replica || (params->max_copies && c->copies[x] >= params->max_copies) ||
                 *replicas >= replica_cap)) {
                pending[k] = 0;
                continue;
            }
            if (!params->medoid_only) {
                const kvs_swarm_cluster *cl = &c->items[ci];
                double sum = 0.0;
                for (uint32_t y = 0; y < cl->n_members; y++)
                    sum += kvs_swarm_graph_distance(g, x, cl->members[y]);
                if (sum > tau * cl->n_members) continue;
            }
            if ((st = kvs_swarm_clusters_add_member(c, ci, x)) != KVS_OK) return st;
            pending[k] = 0;
            if (replica)
                (*replicas)++;
            else
                (*n_uncovered)--;
            admitted_any = 1;
        }
        if (!params->fixpoint) break;
    }
    return KVS_OK;
}

/* Algorithm 1 over entries[0..n) (subset flags in `member`). */
static kvs_status build(const kvs_swarm_graph *g, const kvs_swarm_cluster_params *params,
                        const uint32_t *entries, uint32_t n, const uint8_t *member,
                        kvs_swarm_clusters *c) {
    kvs_status st = KVS_ENOMEM;
    double tau = params->tau;
    ranked *queue = malloc((size_t)n * sizeof *queue + 1);
    ranked *cand = NULL;
    uint8_t *pending =
        NULL; /* pending[k]: candidate k may still be admitted to the current cluster */
    if (!queue) goto done;

    uint64_t n_uncovered = 0, max_degree = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t e = entries[k];
        queue[k] = (ranked){density(g, tau, member, e), e, 0.0};
        if (c->copies[e] == 0) n_uncovered++;
        uint64_t degree = g->row_start[e + 1] - g->row_start[e];
        if (degree > max_degree) max_degree = degree;
    }
    qsort(queue, n, sizeof *queue, cmp_medoid_rank);
    cand = malloc((size_t)max_degree * sizeof *cand + 1);
    pending = malloc((size_t)max_degree + 1);
    if (!cand || !pending) goto done;

    uint64_t replica_cap =
        params->max_extra_slots < 0.0 ? UINT64_MAX : (uint64_t)(params->max_extra_slots * n);
    uint64_t replicas = 0;
    st = KVS_OK;
    for (uint32_t q = 0; q < n && n_uncovered > 0; q++) {
        uint32_t m = queue[q].id;
        if (c->copies[m] > 0) continue;
        uint32_t ci;
        if ((st = kvs_swarm_clusters_add(c, &ci)) != KVS_OK) goto done;
        if ((st = kvs_swarm_clusters_add_member(c, ci, m)) != KVS_OK) goto done;
        n_uncovered--;
        uint32_t n_cand = gather_candidates(g, tau, member, m, cand);
        if ((st = admit_candidates(g, params, c, ci, cand, n_cand, pending, replica_cap, &replicas,
                                   &n_uncovered)) != KVS_OK)
            goto done;
    }
done:
    free(queue);
    free(cand);
    free(pending);
    return st;
}

kvs_status kvs_swarm_cluster_build(const kvs_swarm_graph *g, const kvs_swarm_cluster_params *params,
                                   kvs_swarm_clusters *c) {
    if (!g || !params || !c || g->n_entries > c->max_entries || !(params->tau >= 0.0))
        return KVS_EINVAL;
    uint32_t *entries = malloc((size_t)g->n_entries * sizeof *entries);
    if (!entries) return KVS_ENOMEM;
    for (uint32_t e = 0; e < g->n_entries; e++) entries[e] = e;
    kvs_status st = build(g, params, entries, g->n_entries, NULL, c);
    free(entries);
    return st;
}

kvs_status kvs_swarm_cluster_build_subset(const kvs_swarm_graph *g,
                                          const kvs_swarm_cluster_params *params,
                                          const uint32_t *entries, uint32_t n,
                                          kvs_swarm_clusters *c) {
    if (!g || !params || !c || (n && !entries) || g->n_entries > c->max_entries ||
        !(params->tau >= 0.0))
        return KVS_EINVAL;
    uint8_t *member = calloc(g->n_entries, 1);
    if (!member) return KVS_ENOMEM;
    kvs_status st = KVS_OK;
    for (uint32_t k = 0; k < n; k++) {
        if (entries[k] >= g->n_entries || member[entries[k]]) {
            st = KVS_EINVAL;
            break;
        }
        member[entries[k]] = 1;
    }
    if (st == KVS_OK) st = build(g, params, entries, n, member, c);
    free(member);
    return st;
}

/* ---- layout and routes -------------------------------------------------------------------------- */

kvs_status kvs_swarm_layout_init(kvs_swarm_layout *layout, uint32_t n_paths,
                                 kvs_swarm_balance balance) {
    if (!layout || n_paths == 0 || n_paths > KVS_SWARM_MAX_PATHS) return KVS_EINVAL;
    memset(layout, 0, sizeof *layout);
    layout->n_paths = n_paths;
    layout->balance = balance;
    return KVS_OK;
}

/* One cluster as a new stripe: Eq. 7 from the global pointer (or from path 0 without balance). */
static void place_cluster(kvs_swarm_layout *layout, kvs_swarm_cluster *cl) {
    uint64_t zero = 0;
    uint64_t *pointer = layout->balance == KVS_SWARM_BALANCE_NONE ? &zero : &layout->pointer;
    kvs_swarm_place(pointer, layout->n_paths, cl->n_members, 1, cl->paths);
    cl->start_path = cl->paths[0];
    for (uint32_t m = 0; m < cl->n_members; m++) cl->slots[m] = layout->next_slot[cl->paths[m]]++;
    cl->placed = cl->n_members;
}

void kvs_swarm_layout_place(kvs_swarm_layout *layout, kvs_swarm_clusters *c, uint32_t first) {
    if (!layout || !c) return;
    for (uint32_t k = first; k < c->n_clusters; k++)
        if (c->items[k].placed == 0 && c->items[k].n_members > 0)
            place_cluster(layout, &c->items[k]);
}

void kvs_swarm_layout_append(kvs_swarm_layout *layout, kvs_swarm_clusters *c, uint32_t index,
                             uint32_t paper_offset) {
    if (!layout || !c || index >= c->n_clusters || c->items[index].n_members == 0) return;
    kvs_swarm_cluster *cl = &c->items[index];
    if (cl->placed == 0) {
        place_cluster(layout, cl);
        return;
    }
    for (uint32_t m = cl->placed; m < cl->n_members; m++) {
        uint32_t d = (uint32_t)(((uint64_t)cl->start_path + m + paper_offset) % layout->n_paths);
        cl->paths[m] = d;
        cl->slots[m] = layout->next_slot[d]++;
    }
    cl->placed = cl->n_members;
}

uint64_t kvs_swarm_routes(const kvs_swarm_clusters *c, uint32_t n_entries, uint32_t max_copies,
                          uint32_t *n_copies, uint32_t *paths, uint64_t *slots) {
    if (!c || !n_copies || !paths || max_copies == 0) return 0;
    memset(n_copies, 0, (size_t)n_entries * sizeof *n_copies);
    uint64_t dropped = 0;
    for (uint32_t k = 0; k < c->n_clusters; k++) {
        const kvs_swarm_cluster *cl = &c->items[k];
        for (uint32_t m = 0; m < cl->placed; m++) {
            uint32_t e = cl->members[m];
            if (e >= n_entries) continue;
            if (n_copies[e] == max_copies) {
                dropped++;
                continue;
            }
            uint64_t at = (uint64_t)e * max_copies + n_copies[e]++;
            paths[at] = cl->paths[m];
            if (slots) slots[at] = cl->slots[m];
        }
    }
    return dropped;
}
