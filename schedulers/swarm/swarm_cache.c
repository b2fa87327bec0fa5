/* swarm_cache.c - S-score and LRU cluster caches (see swarm_cache.h). */
#include "swarm_cache.h"

#include <stdlib.h>
#include <string.h>

#define NOT_IN_HEAP UINT32_MAX

double kvs_swarm_cache_score(const kvs_swarm_cache *c, uint32_t k) {
    if (!c || k >= c->n_clusters || c->size[k] == 0) return 0.0;
    double f = c->freq[k], s = c->size[k];
    if (c->params.formula == KVS_SWARM_SCORE_SAVED_TIME)
        return f * (c->params.t_base_s + s * c->params.t_transfer_s) / s;
    return (f * c->params.t_base_s + s * c->params.t_transfer_s) / s;
}

/* Heap order: the cluster to evict first is smallest. */
static int heap_less(const kvs_swarm_cache *c, uint32_t a, uint32_t b) {
    if (c->params.policy == KVS_SWARM_CACHE_LRU) {
        if (c->last_use[a] != c->last_use[b]) return c->last_use[a] < c->last_use[b];
    } else {
        double sa = kvs_swarm_cache_score(c, a), sb = kvs_swarm_cache_score(c, b);
        if (sa != sb) return sa < sb;
    }
    return a < b;
}

static void heap_set(kvs_swarm_cache *c, uint32_t pos, uint32_t id) {
    c->heap[pos] = id;
    c->heap_pos[id] = pos;
}

static void sift_down(kvs_swarm_cache *c, uint32_t pos) {
    for (;;) {
        uint32_t child = 2 * pos + 1;
        if (child >= c->n_heap) return;
        if (child + 1 < c->n_heap && heap_less(c, c->heap[child + 1], c->heap[child])) child++;
        if (!heap_less(c, c->heap[child], c->heap[pos])) return;
        uint32_t t = c->heap[pos];
        heap_set(c, pos, c->heap[child]);
        heap_set(c, child, t);
        pos = child;
    }
}

static void sift_up(kvs_swarm_cache *c, uint32_t pos) {
    while (pos > 0) {
        uint32_t parent = (pos - 1) / 2;
        if (!heap_less(c, c->heap[pos], c->heap[parent])) return;
        uint32_t t = c->heap[pos];
        heap_set(c, pos, c->heap[parent]);
        heap_set(c, parent, t);
        pos = parent;
    }
}

static void heap_push(kvs_swarm_cache *c, uint32_t id) {
    heap_set(c, c->n_heap++, id);
    sift_up(c, c->n_heap - 1);
}

static uint32_t heap_pop(kvs_swarm_cache *c) {
    uint32_t top = c->heap[0];
    c->heap_pos[top] = NOT_IN_HEAP;
    if (--c->n_heap > 0) {
        heap_set(c, 0, c->heap[c->n_heap]);
        sift_down(c, 0);
    }
    return top;
}

static kvs_status grow(kvs_swarm_cache *c, uint32_t need) {
    if (need <= c->capacity) return KVS_OK;
    uint32_t cap = c->capacity ? c->capacity : 16;
    while (cap < need) cap = cap > UINT32_MAX / 2 ? need : cap * 2;
        /* Each array is replaced only once its realloc succeeded, so a failure leaves a usable cache. */
#define GROW(field)                                                  \
    do {                                                             \
        void *p = realloc(c->field, (size_t)cap * sizeof *c->field); \
        if (!p) return KVS_ENOMEM;                                   \
        c->field = p;                                                \
    } while (0)
    GROW(size);
    GROW(freq);
    GROW(last_use);
    GROW(cached);
    GROW(heap);
    GROW(heap_pos);
    GROW(active);
    GROW(scratch);
    GROW(victims);
#undef GROW
    c->capacity = cap;
    return KVS_OK;
}

void kvs_swarm_cache_destroy(kvs_swarm_cache *c) {
    if (!c) return;
    free(c->size);
    free(c->freq);
    free(c->last_use);
    free(c->cached);
    free(c->heap);
    free(c->heap_pos);
    free(c->active);
    free(c->scratch);
    free(c->victims);
    free(c);
}

kvs_status kvs_swarm_cache_add_cluster(kvs_swarm_cache *c, uint32_t size, uint32_t freq,
                                       uint32_t *id) {
    if (!c || c->n_clusters == UINT32_MAX) return KVS_EINVAL;
    kvs_status st = grow(c, c->n_clusters + 1);
    if (st != KVS_OK) return st;
    uint32_t k = c->n_clusters++;
    c->size[k] = size;
    c->freq[k] = freq;
    c->last_use[k] = 0;
    c->cached[k] = 0;
    c->heap_pos[k] = NOT_IN_HEAP;
    c->active[k] = 0;
    if (id) *id = k;
    return KVS_OK;
}

kvs_status kvs_swarm_cache_create(const kvs_swarm_cache_params *params, uint32_t n_clusters,
                                  const uint32_t *sizes, const uint32_t *freqs,
                                  kvs_swarm_cache **out) {
    if (!out) return KVS_EINVAL;
    *out = NULL;
    if (!params || (n_clusters && !sizes) || !(params->t_base_s >= 0.0) ||
        !(params->t_transfer_s >= 0.0))
        return KVS_EINVAL;
    kvs_swarm_cache *c = calloc(1, sizeof *c);
    if (!c) return KVS_ENOMEM;
    c->params = *params;
    kvs_status st = grow(c, n_clusters);
    for (uint32_t k = 0; st == KVS_OK && k < n_clusters; k++)
        st = kvs_swarm_cache_add_cluster(c, sizes[k], freqs ? freqs[k] : 0, NULL);
    if (st != KVS_OK) {
        kvs_swarm_cache_destroy(c);
        return st;
    }
    *out = c;
    return KVS_OK;
}

static void evict(kvs_swarm_cache *c, uint32_t k, kvs_swarm_cache_result *r) {
    c->cached[k] = 0;
    c->used_entries -= c->size[k];
    r->evicted++;
}

static void admit(kvs_swarm_cache *c, uint32_t k, kvs_swarm_cache_result *r) {
    c->cached[k] = 1;
    c->used_entries += c->size[k];
    heap_push(c, k);
    r->admitted++;
}

/* SCORE admission of k: pop minima scoring below k until k fits; put them back if it still does not. */
static void admit_by_score(kvs_swarm_cache *c, uint32_t k, kvs_swarm_cache_result *r) {
    uint64_t room = c->params.capacity_entries - c->used_entries;
    uint32_t n_popped = 0;
    double score = kvs_swarm_cache_score(c, k);
    while (room < c->size[k] && c->n_heap > 0 && kvs_swarm_cache_score(c, c->heap[0]) < score) {
        uint32_t victim = heap_pop(c);
        c->victims[n_popped++] = victim;
        room += c->size[victim];
    }
    if (room < c->size[k]) {
        for (uint32_t i = 0; i < n_popped; i++) heap_push(c, c->victims[i]);
        return;
    }
    for (uint32_t i = 0; i < n_popped; i++) evict(c, c->victims[i], r);
    admit(c, k, r);
}

static void admit_lru(kvs_swarm_cache *c, uint32_t k, kvs_swarm_cache_result *r) {
    while (c->params.capacity_entries - c->used_entries < c->size[k] && c->n_heap > 0)
        evict(c, heap_pop(c), r);
    admit(c, k, r);
}

/* Highest score first, ties by id, for the SCORE admission order. */
static int better_candidate(const kvs_swarm_cache *c, uint32_t a, uint32_t b) {
    double sa = kvs_swarm_cache_score(c, a), sb = kvs_swarm_cache_score(c, b);
    if (sa != sb) return sa > sb;
    return a < b;
}

kvs_status kvs_swarm_cache_step(kvs_swarm_cache *c, const uint32_t *activated, uint32_t n,
                                kvs_swarm_cache_result *result) {
    if (!c || (n && !activated)) return KVS_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (activated[i] >= c->n_clusters) return KVS_EINVAL;
    kvs_swarm_cache_result r;
    memset(&r, 0, sizeof r);
    uint64_t step = ++c->step;

    /* Hits against the cache as it was; the distinct misses become admission candidates in scratch. */
    uint32_t n_cand = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = activated[i];
        if (c->active[k] == step) continue;
        c->active[k] = step;
        c->last_use[k] = step;
        if (c->cached[k]) {
            r.hits++;
            r.hit_entries += c->size[k];
        } else {
            r.misses++;
            r.miss_entries += c->size[k];
            c->scratch[n_cand++] = k;
        }
    }
    /* f: +1 for every activated cluster, -1 (not below 0) for every cached one that was not. */
    for (uint32_t k = 0; k < c->n_clusters; k++) {
        if (c->active[k] == step)
            c->freq[k]++;
        else if (c->cached[k] && c->freq[k] > 0)
            c->freq[k]--;
    }
    /* The decrements move keys by different amounts (t_base / s_k), so rebuild rather than patch. */
    for (uint32_t i = c->n_heap / 2; i-- > 0;) sift_down(c, i);

    if (c->params.policy == KVS_SWARM_CACHE_SCORE) {
        for (uint32_t i = 1; i < n_cand; i++) { /* few candidates per step: insertion sort */
            uint32_t k = c->scratch[i], j = i;
            while (j > 0 && better_candidate(c, k, c->scratch[j - 1])) {
                c->scratch[j] = c->scratch[j - 1];
                j--;
            }
            c->scratch[j] = k;
        }
    }
    for (uint32_t i = 0; i < n_cand; i++) {
        uint32_t k = c->scratch[i];
        if (c->size[k] > c->params.capacity_entries) continue;
        if (c->params.policy == KVS_SWARM_CACHE_SCORE)
            admit_by_score(c, k, &r);
        else
            admit_lru(c, k, &r);
    }

    c->total.hits += r.hits;
    c->total.misses += r.misses;
    c->total.hit_entries += r.hit_entries;
    c->total.miss_entries += r.miss_entries;
    c->total.admitted += r.admitted;
    c->total.evicted += r.evicted;
    if (result) *result = r;
    return KVS_OK;
}
