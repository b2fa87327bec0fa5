/* swarm.c - Eq. 7 placement, the entry-bucket scheduler and the Eq. 8 merge (see swarm.h). */
#include "swarm.h"

#include <stddef.h>

/* ---- placement ---------------------------------------------------------------------------------- */

void kvs_swarm_place_stride(uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                            uint32_t replicas, kvs_swarm_stride stride, uint32_t *paths_out) {
    if (!pointer || n_paths == 0 || n_units == 0 || replicas == 0 || !paths_out) return;
    uint64_t start = *pointer % n_paths;
    /* How far along the stripe copy r + 1 of a unit starts after copy r. */
    uint64_t copy_stride = stride == KVS_SWARM_STRIDE_UNITS ? 1 : n_units;
    /* Unit 0's copies fix each copy layer's offset; unit k of layer r then sits k paths further on.
     * Layer r would begin r * copy_stride positions into the stripe; when that offset repeats an
     * earlier layer's (n_units a multiple of n_paths, say), shifting by one more path at a time finds a
     * free offset within r tries because r offsets are taken and r + 1 <= n_paths are tried. (With the
     * units stride the offsets 0..replicas-1 never repeat, so nothing shifts.) */
    for (uint32_t r = 0; r < replicas; r++) {
        uint64_t offset = ((uint64_t)r * copy_stride) % n_paths;
        if (replicas <= n_paths) {
            for (;;) {
                uint32_t candidate = (uint32_t)((start + offset) % n_paths), r_prev = 0;
                while (r_prev < r && paths_out[r_prev] != candidate) r_prev++;
                if (r_prev == r) break;
                offset = (offset + 1) % n_paths;
            }
        }
        paths_out[r] = (uint32_t)((start + offset) % n_paths);
    }
    for (uint64_t k = 1; k < n_units; k++)
        for (uint32_t r = 0; r < replicas; r++)
            paths_out[k * replicas + r] = (uint32_t)((paths_out[r] + k) % n_paths);
    *pointer += (uint64_t)n_units * (stride == KVS_SWARM_STRIDE_UNITS ? 1 : replicas);
}

void kvs_swarm_place(uint64_t *pointer, uint32_t n_paths, uint32_t n_units, uint32_t replicas,
                     uint32_t *paths_out) {
    kvs_swarm_place_stride(pointer, n_paths, n_units, replicas, KVS_SWARM_STRIDE_COPIES, paths_out);
}

/* ---- scheduler ---------------------------------------------------------------------------------- */

/* Bit d set when path d holds read r; duplicates and out-of-range entries fall away here. */
static uint64_t holder_mask(uint32_t n_paths, uint32_t max_copies, const uint32_t *n_copies,
                            const uint32_t *paths, const double *path_bytes_per_s, uint64_t r) {
    uint32_t n = n_copies[r] < max_copies ? n_copies[r] : max_copies;
    uint64_t mask = 0;
    for (uint32_t c = 0; c < n; c++) {
        uint32_t d = paths[r * max_copies + c];
        if (d >= n_paths) continue;
        if (path_bytes_per_s && !(path_bytes_per_s[d] > 0.0)) continue;
        mask |= 1ull << d;
    }
    return mask;
}

/* Index of the lowest set bit of a non-zero mask. */
static uint32_t lowest_bit(uint64_t mask) {
    uint32_t d = 0;
    while (!((mask >> d) & 1u)) d++;
    return d;
}

static uint32_t popcount64(uint64_t x) {
    uint32_t n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

/* Counting-sort key of a read held by `flexibility` distinct paths: 0..n_paths-1, unplaceable last. */
static uint32_t sort_key(uint32_t flexibility, uint32_t n_paths) {
    return flexibility == 0 ? n_paths : flexibility - 1;
}

/* The one scheduler; bytes and path_bytes_per_s are both NULL for the read-counting variant. */
static void schedule(uint32_t n_paths, uint64_t n, uint32_t max_copies, const uint32_t *n_copies,
                     const uint32_t *paths, const uint64_t *bytes, const double *path_bytes_per_s,
                     uint32_t *chosen, uint64_t *order) {
    if (n == 0 || !chosen || !order) return;
    if (n_paths == 0 || n_paths > KVS_SWARM_MAX_PATHS || max_copies == 0 || !n_copies || !paths) {
        for (uint64_t r = 0; r < n; r++) {
            chosen[r] = KVS_SWARM_NO_PATH;
            order[r] = r;
        }
        return;
    }

    /* Counting sort by flexibility, keys 1..n_paths, then the unplaceable reads (key 0) last. chosen[]
     * holds each read's key until the read is assigned, so no scratch array is needed. */
    uint64_t key_start[KVS_SWARM_MAX_PATHS + 2] = {0};
    for (uint64_t r = 0; r < n; r++) {
        chosen[r] =
            popcount64(holder_mask(n_paths, max_copies, n_copies, paths, path_bytes_per_s, r));
        key_start[sort_key(chosen[r], n_paths) + 1]++;
    }
    for (uint32_t k = 1; k <= n_paths + 1; k++) key_start[k] += key_start[k - 1];
    for (uint64_t r = 0; r < n; r++) order[key_start[sort_key(chosen[r], n_paths)]++] = r;

    double load[KVS_SWARM_MAX_PATHS] = {0};
    uint64_t bucket_size[KVS_SWARM_MAX_PATHS] = {0};
    uint64_t n_placed = 0;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t r = order[k];
        uint64_t mask = holder_mask(n_paths, max_copies, n_copies, paths, path_bytes_per_s, r);
        if (!mask) {
            chosen[r] = KVS_SWARM_NO_PATH;
            continue;
        }
        /* Holders visited upwards and replaced only when strictly better: ties go to the lowest index. */
        uint32_t best = lowest_bit(mask);
        double best_cost = bytes ? (double)bytes[r] / path_bytes_per_s[best] : 1.0;
        double best_finish = load[best] + best_cost;
        for (uint64_t m = mask & (mask - 1); m; m &= m - 1) {
            uint32_t d = lowest_bit(m);
            double cost = bytes ? (double)bytes[r] / path_bytes_per_s[d] : 1.0;
            if (load[d] + cost < best_finish) {
                best = d;
                best_finish = load[d] + cost;
                best_cost = cost;
            }
        }
        chosen[r] = best;
        load[best] += best_cost;
        bucket_size[best]++;
        n_placed++;
    }

    /* Interleave: round j takes the j-th read of every bucket that has one. Each path's cursor walks
     * the reads once, so a bucket comes out in ascending read index. */
    uint64_t cursor[KVS_SWARM_MAX_PATHS] = {0}, taken[KVS_SWARM_MAX_PATHS] = {0};
    uint64_t pos = 0;
    while (pos < n_placed) {
        for (uint32_t d = 0; d < n_paths; d++) {
            if (taken[d] == bucket_size[d]) continue;
            while (chosen[cursor[d]] != d) cursor[d]++;
            order[pos++] = cursor[d]++;
            taken[d]++;
        }
    }
    for (uint64_t r = 0; r < n; r++)
        if (chosen[r] == KVS_SWARM_NO_PATH) order[pos++] = r;
}

void kvs_swarm_schedule(uint32_t n_paths, uint64_t n, uint32_t max_copies, const uint32_t *n_copies,
                        const uint32_t *paths, uint32_t *chosen, uint64_t *order) {
    schedule(n_paths, n, max_copies, n_copies, paths, NULL, NULL, chosen, order);
}

void kvs_swarm_schedule_weighted(uint32_t n_paths, uint64_t n, uint32_t max_copies,
                                 const uint32_t *n_copies, const uint32_t *paths,
                                 const uint64_t *bytes, const double *path_bytes_per_s,
                                 uint32_t *chosen, uint64_t *order) {
    if (!bytes || !path_bytes_per_s) {
        schedule(0, n, max_copies, n_copies, paths, NULL, NULL, chosen, order); /* all unassigned */
        return;
    }
    schedule(n_paths, n, max_copies, n_copies, paths, bytes, path_bytes_per_s, chosen, order);
}

/* ---- merge and dedup ---------------------------------------------------------------------------- */

static int unit_cmp(const kvs_swarm_unit *a, const kvs_swarm_unit *b) {
    if (a->object != b->object) return a->object < b->object ? -1 : 1;
    if (a->unit != b->unit) return a->unit < b->unit ? -1 : 1;
    return 0;
}

/* Heap sorts without a comparator context (qsort has none in C11): one over units, one over indices
 * keyed by (units[index], index) so equal units keep their first occurrence first. */
static int index_less(const kvs_swarm_unit *units, uint64_t a, uint64_t b) {
    int c = unit_cmp(&units[a], &units[b]);
    return c < 0 || (c == 0 && a < b);
}

static void sift_indices(const kvs_swarm_unit *units, uint64_t *v, uint64_t root, uint64_t n) {
    for (;;) {
        uint64_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n &&
            (units ? index_less(units, v[child], v[child + 1]) : v[child] < v[child + 1]))
            child++;
        if (!(units ? index_less(units, v[root], v[child]) : v[root] < v[child])) return;
        uint64_t t = v[root];
        v[root] = v[child];
        v[child] = t;
        root = child;
    }
}

/* Ascending by (units[i], i), or by value when units is NULL. */
static void sort_indices(const kvs_swarm_unit *units, uint64_t *v, uint64_t n) {
    if (n < 2) return;
    for (uint64_t i = n / 2; i-- > 0;) sift_indices(units, v, i, n);
    for (uint64_t end = n - 1; end > 0; end--) {
        uint64_t t = v[0];
        v[0] = v[end];
        v[end] = t;
        sift_indices(units, v, 0, end);
    }
}

static void sift_units(kvs_swarm_unit *v, uint64_t root, uint64_t n) {
    for (;;) {
        uint64_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && unit_cmp(&v[child], &v[child + 1]) < 0) child++;
        if (unit_cmp(&v[root], &v[child]) >= 0) return;
        kvs_swarm_unit t = v[root];
        v[root] = v[child];
        v[child] = t;
        root = child;
    }
}

void kvs_swarm_units_sort(kvs_swarm_unit *units, uint64_t n) {
    if (!units || n < 2) return;
    for (uint64_t i = n / 2; i-- > 0;) sift_units(units, i, n);
    for (uint64_t end = n - 1; end > 0; end--) {
        kvs_swarm_unit t = units[0];
        units[0] = units[end];
        units[end] = t;
        sift_units(units, 0, end);
    }
}

kvs_status kvs_swarm_dedup(const kvs_swarm_unit *units, uint64_t n, const kvs_swarm_unit *resident,
                           uint64_t n_resident, uint64_t *keep, uint64_t *n_keep) {
    if (!n_keep) return KVS_EINVAL;
    *n_keep = 0;
    if ((n && (!units || !keep)) || (n_resident && !resident)) return KVS_EINVAL;
    for (uint64_t i = 1; i < n_resident; i++)
        if (unit_cmp(&resident[i - 1], &resident[i]) > 0) return KVS_EINVAL;

    for (uint64_t i = 0; i < n; i++) keep[i] = i;
    sort_indices(units, keep, n);
    /* One merge walk over the sorted requests and the resident list; the first index of each run of
     * equal units is the first occurrence. */
    uint64_t out = 0, res = 0;
    for (uint64_t i = 0; i < n; i++) {
        const kvs_swarm_unit *u = &units[keep[i]];
        if (i > 0 && unit_cmp(&units[keep[i - 1]], u) == 0) continue;
        while (res < n_resident && unit_cmp(&resident[res], u) < 0) res++;
        if (res < n_resident && unit_cmp(&resident[res], u) == 0) continue;
        keep[out++] = keep[i];
    }
    sort_indices(NULL, keep, out);
    *n_keep = out;
    return KVS_OK;
}

void kvs_swarm_seen_init(kvs_swarm_seen *seen, uint32_t *stamp, uint32_t n_entries) {
    if (!seen) return;
    seen->stamp = stamp;
    seen->n_entries = stamp ? n_entries : 0;
    seen->epoch = 0;
    for (uint32_t i = 0; i < seen->n_entries; i++) stamp[i] = 0;
}

void kvs_swarm_seen_begin(kvs_swarm_seen *seen) {
    if (!seen) return;
    if (seen->epoch == UINT32_MAX) { /* stamps from 2^32 - 1 steps ago would read as current */
        for (uint32_t i = 0; i < seen->n_entries; i++) seen->stamp[i] = 0;
        seen->epoch = 0;
    }
    seen->epoch++;
}

int kvs_swarm_seen_mark(kvs_swarm_seen *seen, uint32_t id) {
    if (!seen || id >= seen->n_entries || seen->epoch == 0 || seen->stamp[id] == seen->epoch)
        return 0;
    seen->stamp[id] = seen->epoch;
    return 1;
}
