/* swarm_maint.c - window bookkeeping, Eq. 9 joins and the pending pool (see swarm_maint.h). */
#include "swarm.h"

#include <stdlib.h>
#include <string.h>

void kvs_swarm_maint_defaults(kvs_swarm_maint_params *params) {
    if (!params) return;
    memset(params, 0, sizeof *params);
    params->window_steps = 256;
    params->tau = 0.5;
    params->max_copies = 3;
    params->paper_offset = 0;
    params->pending_windows = 4;
    params->pending_metric = KVS_SWARM_METRIC_JACCARD;
    params->pending_min_count = 3;
    kvs_swarm_cluster_defaults(&params->pending_cluster);
}

kvs_status kvs_swarm_maint_create(const kvs_swarm_maint_params *params,
                                  kvs_swarm_clusters *clusters, kvs_swarm_layout *layout,
                                  kvs_swarm_maint **out) {
    if (!out) return KVS_EINVAL;
    *out = NULL;
    if (!params || !clusters || !layout || params->window_steps == 0 || params->paper_offset > 1 ||
        !(params->tau >= 0.0))
        return KVS_EINVAL;
    kvs_swarm_maint *m = calloc(1, sizeof *m);
    if (!m) return KVS_ENOMEM;
    m->params = *params;
    m->clusters = clusters;
    m->layout = layout;
    m->window_of = calloc(clusters->max_entries, sizeof *m->window_of);
    kvs_status st = m->window_of
                        ? kvs_swarm_profile_create(clusters->max_entries, 0, &m->pool_profile)
                        : KVS_ENOMEM;
    if (st != KVS_OK) {
        kvs_swarm_maint_destroy(m);
        return st;
    }
    *out = m;
    return KVS_OK;
}

void kvs_swarm_maint_destroy(kvs_swarm_maint *m) {
    if (!m) return;
    for (uint32_t k = m->window_head; k < m->n_window; k++) {
        free(m->window[k].cluster);
        free(m->window[k].count);
    }
    free(m->window);
    free(m->window_of);
    free(m->pending);
    free(m->placed);
    kvs_swarm_profile_destroy(m->pool_profile);
    free(m);
}

/* The array grown to hold need elements of `size` bytes (*cap doubles), or NULL with the old array
 * and *cap unchanged when memory runs out. */
static void *grow_array(void *array, uint64_t *cap, uint64_t need, size_t size) {
    if (need <= *cap) return array;
    uint64_t new_cap = *cap ? *cap : 16;
    while (new_cap < need) new_cap *= 2;
    void *p = realloc(array, (size_t)new_cap * size);
    if (p) *cap = new_cap;
    return p;
}

static kvs_status log_copy(kvs_swarm_maint *m, uint32_t entry, uint32_t c, uint32_t member) {
    kvs_swarm_placement *placed =
        grow_array(m->placed, &m->cap_placed, m->n_placed + 1, sizeof *placed);
    if (!placed) return KVS_ENOMEM;
    m->placed = placed;
    const kvs_swarm_cluster *cl = &m->clusters->items[c];
    m->placed[m->n_placed++] =
        (kvs_swarm_placement){entry, c, cl->paths[member], cl->slots[member]};
    return KVS_OK;
}

kvs_status kvs_swarm_maint_add(kvs_swarm_maint *m, uint32_t entry) {
    if (!m || entry >= m->clusters->max_entries || m->window_of[entry]) return KVS_EINVAL;
    if (m->n_window == m->cap_window && m->window_head > 0) {
        /* Slide the live part down rather than grow; the index map follows. */
        uint32_t live = m->n_window - m->window_head;
        memmove(m->window, m->window + m->window_head, (size_t)live * sizeof *m->window);
        m->window_head = 0;
        m->n_window = live;
        for (uint32_t k = 0; k < live; k++) m->window_of[m->window[k].entry] = k + 1;
    }
    kvs_swarm_window_entry *window =
        grow_array(m->window, &m->cap_window, (uint64_t)m->n_window + 1, sizeof *window);
    if (!window || m->n_window == UINT32_MAX - 1) return KVS_ENOMEM;
    m->window = window;
    m->window[m->n_window] = (kvs_swarm_window_entry){entry, m->step, 0, 0, NULL, NULL};
    m->window_of[entry] = ++m->n_window;
    return KVS_OK;
}

static kvs_status count_cofire(kvs_swarm_window_entry *w, uint32_t cluster) {
    for (uint32_t k = 0; k < w->n_counts; k++) {
        if (w->cluster[k] == cluster) {
            w->count[k]++;
            return KVS_OK;
        }
    }
    if (w->n_counts == w->cap_counts) {
        uint32_t cap = w->cap_counts ? w->cap_counts * 2 : 4;
        uint32_t *ids = realloc(w->cluster, (size_t)cap * sizeof *ids);
        if (!ids) return KVS_ENOMEM;
        w->cluster = ids;
        uint32_t *counts = realloc(w->count, (size_t)cap * sizeof *counts);
        if (!counts) return KVS_ENOMEM;
        w->count = counts;
        w->cap_counts = cap;
    }
    w->cluster[w->n_counts] = cluster;
    w->count[w->n_counts++] = 1;
    return KVS_OK;
}

/* The entry at the window's head has had its W steps: join matching clusters or go to the pool. */
static kvs_status retire(kvs_swarm_maint *m) {
    kvs_swarm_window_entry *w = &m->window[m->window_head];
    double window = m->params.window_steps;
    /* Sort the matches closest first (highest count, then lowest cluster id); lists are short. */
    uint32_t n_match = 0;
    for (uint32_t k = 0; k < w->n_counts; k++) {
        if (1.0 - (double)w->count[k] / window > m->params.tau) continue;
        uint32_t c = w->cluster[k], f = w->count[k], j = n_match++;
        while (j > 0 && (w->count[j - 1] < f || (w->count[j - 1] == f && w->cluster[j - 1] > c))) {
            w->cluster[j] = w->cluster[j - 1];
            w->count[j] = w->count[j - 1];
            j--;
        }
        w->cluster[j] = c;
        w->count[j] = f;
    }
    if (m->params.max_copies && n_match > m->params.max_copies) n_match = m->params.max_copies;
    kvs_status st = KVS_OK;
    for (uint32_t k = 0; k < n_match && st == KVS_OK; k++) {
        uint32_t c = w->cluster[k];
        st = kvs_swarm_clusters_add_member(m->clusters, c, w->entry);
        if (st != KVS_OK) break;
        kvs_swarm_layout_append(m->layout, m->clusters, c, m->params.paper_offset);
        st = log_copy(m, w->entry, c, m->clusters->items[c].n_members - 1);
    }
    if (st == KVS_OK && n_match == 0) {
        uint32_t *pending =
            grow_array(m->pending, &m->cap_pending, (uint64_t)m->n_pending + 1, sizeof *pending);
        if (pending) {
            m->pending = pending;
            m->pending[m->n_pending++] = w->entry;
            m->n_pooled++;
        } else {
            st = KVS_ENOMEM;
        }
    } else if (st == KVS_OK) {
        m->n_joined++;
        m->n_replicas += n_match - 1;
    }
    m->window_of[w->entry] = 0;
    free(w->cluster);
    free(w->count);
    m->window_head++;
    return st;
}

kvs_status kvs_swarm_maint_flush(kvs_swarm_maint *m) {
    if (!m) return KVS_EINVAL;
    m->last_pool_step = m->step;
    if (m->n_pending == 0) return KVS_OK;
    kvs_swarm_graph *g = NULL;
    uint32_t first = m->clusters->n_clusters;
    kvs_status st = kvs_swarm_graph_build(m->pool_profile, m->params.pending_metric, 1.0,
                                          m->params.pending_min_count, &g);
    if (st == KVS_OK)
        st = kvs_swarm_cluster_build_subset(g, &m->params.pending_cluster, m->pending, m->n_pending,
                                            m->clusters);
    kvs_swarm_graph_destroy(g);
    if (st != KVS_OK) return st;
    kvs_swarm_layout_place(m->layout, m->clusters, first);
    for (uint32_t c = first; c < m->clusters->n_clusters && st == KVS_OK; c++) {
        const kvs_swarm_cluster *cl = &m->clusters->items[c];
        for (uint32_t k = 0; k < cl->n_members && st == KVS_OK; k++)
            st = log_copy(m, cl->members[k], c, k);
    }
    m->n_pool_clusters += m->clusters->n_clusters - first;
    m->n_pending = 0;
    return st;
}

kvs_status kvs_swarm_maint_step(kvs_swarm_maint *m, const uint32_t *active_entries,
                                uint32_t n_entries, const uint32_t *active_clusters,
                                uint32_t n_clusters) {
    if (!m || (n_entries && !active_entries) || (n_clusters && !active_clusters)) return KVS_EINVAL;
    for (uint32_t k = 0; k < n_clusters; k++)
        if (active_clusters[k] >= m->clusters->n_clusters) return KVS_EINVAL;
    /* The window entries active this step (each once) and the distinct selected clusters. */
    uint32_t *in_window = malloc((size_t)n_entries * sizeof *in_window + 1);
    uint32_t *selected = malloc((size_t)n_clusters * sizeof *selected + 1);
    kvs_status st = in_window && selected ? KVS_OK : KVS_ENOMEM;
    uint32_t n_in = 0, n_selected = 0;
    for (uint32_t c = 0; c < n_clusters && st == KVS_OK; c++) {
        uint32_t j = 0;
        while (j < n_selected && selected[j] != active_clusters[c]) j++;
        if (j == n_selected) selected[n_selected++] = active_clusters[c];
    }
    for (uint32_t k = 0; k < n_entries && st == KVS_OK; k++) {
        uint32_t e = active_entries[k];
        if (e >= m->clusters->max_entries || !m->window_of[e]) continue;
        uint32_t j = 0;
        while (j < n_in && in_window[j] != e) j++;
        if (j < n_in) continue;
        in_window[n_in++] = e;
        kvs_swarm_window_entry *w = &m->window[m->window_of[e] - 1];
        for (uint32_t c = 0; c < n_selected && st == KVS_OK; c++) st = count_cofire(w, selected[c]);
    }
    free(selected);
    if (st == KVS_OK) st = kvs_swarm_profile_add_step(m->pool_profile, in_window, n_in);
    free(in_window);
    if (st != KVS_OK) return st;
    m->step++;
    while (st == KVS_OK && m->window_head < m->n_window &&
           m->step - m->window[m->window_head].enter_step >= m->params.window_steps)
        st = retire(m);
    if (m->window_head == m->n_window) m->window_head = m->n_window = 0;
    if (st == KVS_OK && m->params.pending_windows &&
        m->step - m->last_pool_step >= (uint64_t)m->params.pending_windows * m->params.window_steps)
        st = kvs_swarm_maint_flush(m);
    return st;
}
