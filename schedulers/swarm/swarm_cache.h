/* swarm_cache.h - which clusters the DRAM tier keeps (notes §2.4 item 3 and §3.6): a min-heap of the
 * cached clusters keyed by the cost-effectiveness score S (Eq. 6), with LRU on the same interface as the
 * comparator. Decisions only: the caller copies bytes in and out as kvs_swarm_cache_step reports.
 * A cache is owned by one thread; every result is deterministic. */
#ifndef KVS_SWARM_CACHE_H
#define KVS_SWARM_CACHE_H

#include <stdint.h>

#include "abi/kvstrata.h"

typedef enum kvs_swarm_cache_policy {
    KVS_SWARM_CACHE_SCORE = 0, /* Swarm: evict the lowest S first, admit only over lower S */
    KVS_SWARM_CACHE_LRU = 1 /* comparator: admit every miss, evict the least recently activated */
} kvs_swarm_cache_policy;

typedef enum kvs_swarm_score_formula {
    KVS_SWARM_SCORE_PAPER = 0, /* Eq. 6 as printed: (f * t_base + s * t_transfer) / s */
    KVS_SWARM_SCORE_SAVED_TIME =
        1 /* I/O time saved per cached entry: f * (t_base + s * t_transfer) / s */
} kvs_swarm_score_formula;

typedef struct kvs_swarm_cache_params {
    kvs_swarm_cache_policy policy;
    kvs_swarm_score_formula formula;
    uint64_t capacity_entries; /* DRAM budget, in entries */
    double t_base_s;           /* SSD per-I/O latency, seconds (QD1 4 KiB read) */
    double t_transfer_s;       /* transfer time of one entry, seconds (slot bytes / bandwidth) */
} kvs_swarm_cache_params;

/* What one step did. Hits and misses count distinct activated clusters; *_entries their sizes. */
typedef struct kvs_swarm_cache_result {
    uint32_t hits, misses;
    uint64_t hit_entries, miss_entries;
    uint32_t admitted, evicted;
} kvs_swarm_cache_result;

/* Plain state, readable by tests and tools; change it only through the calls below. */
typedef struct kvs_swarm_cache {
    kvs_swarm_cache_params params;
    uint32_t n_clusters, capacity;
    uint32_t *size;     /* [capacity] s_i, entries */
    uint32_t *freq;     /* [capacity] f_i, activations (profiled, then +1 / -1 per step) */
    uint64_t *last_use; /* [capacity] step of the last activation (LRU key) */
    uint8_t *cached;    /* [capacity] */
    uint32_t *heap; /* [capacity] cached cluster ids, min-heap on the policy's key, ties by id */
    uint32_t *heap_pos; /* [capacity] index in heap, UINT32_MAX when not cached */
    uint64_t *active; /* [capacity] step a cluster was last activated in (this step's membership) */
    uint32_t *scratch; /* [capacity] this step's admission candidates */
    uint32_t *victims; /* [capacity] clusters popped while making room for one candidate */
    uint32_t n_heap;
    uint64_t used_entries;
    uint64_t step;
    kvs_swarm_cache_result total; /* sums over all steps */
} kvs_swarm_cache;

/* A cache over n_clusters clusters of sizes[k] entries with profiled frequencies freqs[k] (NULL: 0).
 * Nothing is cached at first. KVS_EINVAL for a NULL argument or t_base_s, t_transfer_s < 0. */
kvs_status kvs_swarm_cache_create(const kvs_swarm_cache_params *params, uint32_t n_clusters,
                                  const uint32_t *sizes, const uint32_t *freqs,
                                  kvs_swarm_cache **out);
void kvs_swarm_cache_destroy(kvs_swarm_cache *cache);
/* Track one more cluster (made by maintenance); its index goes to *id. */
kvs_status kvs_swarm_cache_add_cluster(kvs_swarm_cache *cache, uint32_t size, uint32_t freq,
                                       uint32_t *id);
/* S(C_k) under the configured formula with the current f_k. */
double kvs_swarm_cache_score(const kvs_swarm_cache *cache, uint32_t k);

/* One decoding step with the clusters activated[0..n) (duplicates count once; ids >= n_clusters give
 * KVS_EINVAL and change nothing). In order: hits are judged against the cache as it was; f_k += 1 for
 * every activated cluster and f_k -= 1 (clamped at 0) for every cached one that was not; the heap is
 * rebuilt on the new keys; then each activated, uncached cluster that fits the budget at all is
 * considered, highest S first (SCORE) or in the given order (LRU): SCORE evicts heap minima while they
 * score below the candidate and room is short, and rolls back if that does not make room; LRU evicts
 * least recently used clusters until it fits. *result (may be NULL) gets this step's figures. */
kvs_status kvs_swarm_cache_step(kvs_swarm_cache *cache, const uint32_t *activated, uint32_t n,
                                kvs_swarm_cache_result *result);

#endif
