/* topk.c - exact and medoid-index top-k (topk.h). */
#include "topk.h"

#include <math.h>
#include <stdlib.h>

void kvs_topk_scores(const float *q, uint32_t m, const float *keys, uint64_t key_stride, uint32_t n,
                     uint32_t d, float *scores) {
    for (uint32_t t = 0; t < n; t++) {
        const float *k = keys + t * key_stride;
        double s = 0;
        for (uint32_t j = 0; j < m; j++)
            for (uint32_t i = 0; i < d; i++) s += (double)q[(uint64_t)j * d + i] * k[i];
        scores[t] = (float)s;
    }
}

typedef struct ranked {
    float score;
    uint32_t nan; /* 1: ranks below every number */
    uint32_t index;
} ranked;

/* highest first; a NaN last; ties by the lower index */
static int by_rank(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->nan != y->nan) return x->nan ? 1 : -1;
    if (!x->nan && x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int ascending(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static ranked *rank(const float *scores, uint32_t first, uint32_t end) {
    ranked *r = malloc(((size_t)(end - first) + 1) * sizeof *r);
    if (!r) return NULL;
    for (uint32_t t = first; t < end; t++)
        r[t - first] = (ranked){.score = scores[t], .nan = isnan(scores[t]) != 0, .index = t};
    qsort(r, end - first, sizeof *r, by_rank);
    return r;
}

uint32_t kvs_topk_exact(const float *scores, uint32_t n, uint32_t sink, uint32_t recent, uint32_t k,
                        uint32_t *out) {
    uint32_t end = kvs_topk_pool_end(n, recent);
    if (sink >= end || k == 0) return 0;
    ranked *r = rank(scores, sink, end);
    if (!r) return UINT32_MAX;
    uint32_t taken = end - sink < k ? end - sink : k;
    for (uint32_t i = 0; i < taken; i++) out[i] = r[i].index;
    free(r);
    qsort(out, taken, sizeof *out, ascending);
    return taken;
}

uint32_t kvs_topk_medoids(const kvs_topk_index *index, const float *medoid_scores, uint32_t n,
                          uint32_t sink, uint32_t recent, uint32_t k, uint8_t *seen, uint32_t *out,
                          uint32_t *n_taken) {
    *n_taken = 0;
    uint32_t end = kvs_topk_pool_end(n, recent);
    if (sink >= end || k == 0 || index->n_clusters == 0) return 0;
    ranked *r = rank(medoid_scores, 0, index->n_clusters);
    if (!r) return UINT32_MAX;
    uint32_t got = 0;
    for (uint32_t c = 0; c < index->n_clusters && got < k; c++) {
        uint32_t id = r[c].index;
        for (uint32_t i = index->offsets[id]; i < index->offsets[id + 1]; i++) {
            uint32_t row = index->rows[i];
            if (row < sink || row >= end || seen[row]) continue;
            seen[row] = 1;
            out[got++] = row;
        }
        (*n_taken)++;
    }
    free(r);
    for (uint32_t i = 0; i < got; i++) seen[out[i]] = 0;
    qsort(out, got, sizeof *out, ascending);
    return got;
}

kvs_status kvs_topk_index_from_clusters(const kvs_swarm_clusters *clusters, kvs_topk_index *out) {
    *out = (kvs_topk_index){0};
    uint64_t total = 0;
    for (uint32_t c = 0; c < clusters->n_clusters; c++) total += clusters->items[c].n_members;
    if (total > UINT32_MAX) return KVS_EINVAL;
    uint32_t *offsets = malloc(((size_t)clusters->n_clusters + 1) * sizeof *offsets);
    uint32_t *rows = malloc((total + 1) * sizeof *rows);
    if (!offsets || !rows) {
        free(offsets);
        free(rows);
        return KVS_ENOMEM;
    }
    uint32_t at = 0;
    for (uint32_t c = 0; c < clusters->n_clusters; c++) {
        offsets[c] = at;
        for (uint32_t i = 0; i < clusters->items[c].n_members; i++)
            rows[at++] = clusters->items[c].members[i];
    }
    offsets[clusters->n_clusters] = at;
    *out = (kvs_topk_index){.n_clusters = clusters->n_clusters, .offsets = offsets, .rows = rows};
    return KVS_OK;
}

void kvs_topk_index_free(kvs_topk_index *index) {
    free((void *)index->offsets);
    free((void *)index->rows);
    *index = (kvs_topk_index){0};
}
