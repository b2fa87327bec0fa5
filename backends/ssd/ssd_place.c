/*
 * ssd_place.c - built-in placement and read scheduling (contract in ssd_place.h): placement is
 * Swarm's rule with the units stride (schedulers/swarm); the scheduler is the Swarm entry-bucket
 * greedy, docs/research/seed-swarm.md section 3.3.
 */
#include "ssd_place.h"

#include <stdlib.h>

#include "schedulers/swarm/swarm.h"

void ssd_place_stripe(uint64_t *pointer, uint32_t n_paths, uint32_t n_units, uint32_t replicas,
                      uint32_t *paths_out) {
    kvs_swarm_place_stride(pointer, n_paths, n_units, replicas, KVS_SWARM_STRIDE_UNITS, paths_out);
}

int ssd_place_schedule(uint32_t n_paths, uint64_t n, uint32_t max_copies, const uint32_t *n_copies,
                       const uint32_t *paths, uint32_t *chosen, uint64_t *order) {
    for (uint64_t r = 0; r < n; r++) {
        chosen[r] = paths[r * max_copies];
        order[r] = r;
    }
    if (n == 0 || n_paths == 0 || max_copies == 0) return 0;
    uint64_t *by_copies = malloc(n * sizeof *by_copies);
    uint64_t *bucketed = malloc(n * sizeof *bucketed);
    uint64_t *load = calloc(n_paths, sizeof *load);
    uint64_t *start = calloc((size_t)n_paths + 1, sizeof *start);
    uint64_t *fill = calloc(n_paths, sizeof *fill);
    uint64_t *per_count = calloc((size_t)max_copies + 2, sizeof *per_count);
    int rc = -1;
    if (!by_copies || !bucketed || !load || !start || !fill || !per_count) goto out;

    /* Counting sort by how many copies a read has: the reads with no choice go first. */
    for (uint64_t r = 0; r < n; r++) {
        uint32_t c = n_copies[r] < 1 ? 1 : n_copies[r] > max_copies ? max_copies : n_copies[r];
        per_count[c + 1]++;
    }
    for (uint32_t c = 1; c <= max_copies; c++) per_count[c + 1] += per_count[c];
    for (uint64_t r = 0; r < n; r++) {
        uint32_t c = n_copies[r] < 1 ? 1 : n_copies[r] > max_copies ? max_copies : n_copies[r];
        by_copies[per_count[c]++] = r;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = by_copies[i];
        uint32_t c_max = n_copies[r] < 1 ? 1 : n_copies[r] > max_copies ? max_copies : n_copies[r];
        uint32_t best = UINT32_MAX;
        for (uint32_t c = 0; c < c_max; c++) {
            uint32_t p = paths[r * max_copies + c];
            if (p >= n_paths) continue;
            if (best == UINT32_MAX) {
                best = p;
                continue;
            }
            uint64_t here = load[p], there = load[best];
            if (here < there || (here == there && p < best)) best = p;
        }
        if (best == UINT32_MAX) best = paths[r * max_copies] < n_paths ? paths[r * max_copies] : 0;
        chosen[r] = best;
        load[best]++;
    }
    /* Buckets keep the reads' own order; the submission order takes one head per path in turn. */
    for (uint32_t p = 0; p < n_paths; p++) start[p + 1] = start[p] + load[p];
    uint64_t longest = 0;
    for (uint32_t p = 0; p < n_paths; p++) longest = load[p] > longest ? load[p] : longest;
    for (uint64_t r = 0; r < n; r++) bucketed[start[chosen[r]] + fill[chosen[r]]++] = r;
    uint64_t k = 0;
    for (uint64_t round = 0; round < longest; round++)
        for (uint32_t p = 0; p < n_paths; p++)
            if (round < load[p]) order[k++] = bucketed[start[p] + round];
    rc = 0;
out:
    free(by_copies);
    free(bucketed);
    free(load);
    free(start);
    free(fill);
    free(per_count);
    return rc;
}
