/*
 * kvstrata_sparse.h - sparse decode, an extension of the engine-facing ABI (since 1.9).
 *
 * The engine decodes a request attending, per KV head, to a selected set of its context rows
 * instead of all of them: its own sink and recent rows, plus the rows the connector selects from
 * the request's stored chunks and reads into the engine's head cache (docs/sparse.md).
 *
 * Hooks (kvs_api; worker role, after register_kv; host device only, KVS_ENOTSUP elsewhere; not
 * MLA):
 *
 * sparse_begin(h, req_id, tokens, n_tokens, cache, params, stored_tokens): the rows come from the
 *   chunks of `tokens` the tiers hold: the stored prefix, read once here and checked whole, pinned
 *   until sparse_end; *stored_tokens (may be NULL) gets its length: the stored prefix ends at the
 *   first chunk no tier holds, that a tier would not pin, or whose object failed its check
 *   (chunks_refused; the engine recomputes from there). The connector keeps each row's key (for
 *   selection) and a hash of its K and V bytes (each row read later is checked against it). `cache`
 *   and `params` are copied; the memory cache points to is borrowed until sparse_end. Calling it
 *   again for a request already begun takes the chunks of tokens it has not taken yet (decode
 *   completed and saved more): cache and params are then ignored and may be NULL, and tokens must
 *   begin with the tokens taken (KVS_EINVAL otherwise).
 *
 * sparse_select(h, req_id, layer, q, n_rows, flags): the step of layer `layer` for a query at
 *   context row n_rows - 1: q holds n_kv_heads * q_per_kv query heads of head_dim floats
 *   (post-RoPE, any scale), grouped by KV head. For each KV head, QSAC decides: a hit reuses the
 *   head's rows (hit = 1, nothing moves); a miss selects the exact top-k of the group's scores q.k
 *   over the pool, rows [sink, min(n_rows - recent, stored_tokens)), and reads only the rows the
 *   head's slots lack. The engine attends to the selected rows (slot_rows), to [0, sink) and to
 *   [attend_from, n_rows) itself; attend_from is the pool's end when the slots were selected (a
 *   head whose pool shrank since, the context having gone back, selects again). The call only
 *   enqueues when every tier may be read from another thread (the work runs on the request's own
 *   thread); the layer's slots, slot_rows, hit flags and attend_from are the connector's until
 *   sparse_wait for the layer returns. flags: KVS_SPARSE_FINAL or KVS_SPARSE_SPECULATIVE. A FINAL
 *   call after a SPECULATIVE one for the same layer is decided against the label the speculative
 *   step left (its query where it selected, the older one where it reused): a head whose real query
 *   is close keeps the rows (spec_kept), any other selects again and reads the difference
 *   (spec_corrected).
 *
 * sparse_wait(h, req_id, layer): return when every sparse_select of layer `layer` so far has
 *   landed. A row that could not be read, or failed its hash, is not in the slots (rows_failed);
 *   the call still returns KVS_OK.
 *
 * sparse_stats(h, req_id, out): the request's counters (out->struct_size set by the caller).
 *
 * sparse_end(h, req_id): wait for the request's selections, unpin its chunks and forget it. close
 *   ends every request still begun: a step in progress finishes (it may still write into the head
 *   cache while close runs), steps only queued are dropped.
 */
#ifndef KVSTRATA_SPARSE_H
#define KVSTRATA_SPARSE_H

#include "kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The engine's head cache: for every layer and KV head, `slots` rows of K and of V the connector
 * fills with the rows each decode step selects (LiteCache's query-similarity head cache). Row r of
 * the context is position r of the request. Host memory only. */
typedef struct kvs_sparse_cache {
    uint32_t struct_size; /* sizeof(kvs_sparse_cache) */
    uint32_t slots;       /* rows per (layer, KV head) */
    void *k; /* [n_layers][n_kv_heads][slots][head bytes]: K of the rows in the slots, as stored */
    void *v; /* the same for V */
    /* [n_layers][n_kv_heads][slots]: the context row each slot holds, or UINT32_MAX for none.
     * Written by the connector only; begin sets every entry to UINT32_MAX */
    uint32_t *slot_rows;
    /* [n_layers][n_kv_heads]: 1 when the head's last step reused its rows (moved nothing), 0 when
     * it selected again */
    uint8_t *hit;
    /* [n_layers][n_kv_heads]: the row from which the engine attends its own rows at the head's
     * last step: the pool's end when the slots' rows were selected (a reusing head keeps it, so
     * the rows that entered the pool since are attended by the engine, not dropped) */
    uint32_t *attend_from;
} kvs_sparse_cache;
#define KVS_SPARSE_CACHE_SIZE_1_9 48u

/* How a request's sparse decode selects. Zero fields take the defaults. */
typedef struct kvs_sparse_params {
    uint32_t struct_size; /* sizeof(kvs_sparse_params) */
    uint32_t topk;        /* rows selected per KV head and step (<= slots; 0: slots) */
    uint32_t sink;        /* leading rows the engine attends itself (never selected) */
    uint32_t recent;      /* trailing rows the engine attends itself (never selected) */
    uint32_t q_per_kv;    /* query heads a KV head serves (GQA group); 0: 1 */
    float eta;            /* QSAC: a head of importance 1 reuses while its similarity > eta (0.8) */
    float p;              /* QSAC: lambda = importance^p (3) */
    uint32_t reserved;
    const float *importance; /* [n_layers][n_kv_heads] in [0, 1], copied; NULL: all 1 */
    /* the longest the request's context gets (sizes the connector's copy of its keys); 0: n_tokens
     * of the first sparse_begin */
    uint64_t max_tokens;
    uint32_t layout;             /* where missed rows are read from: KVS_SPARSE_LAYOUT_ROWS (0) */
    uint32_t profile_steps;      /* LAYOUT_SWARM: steps of each layer profiled first (0: 16) */
    uint64_t cluster_cache_rows; /* LAYOUT_SWARM: rows of hot clusters kept in DRAM (0: none) */
    uint32_t cluster_cache;      /* KVS_SPARSE_CACHE_SCORE (Swarm's Eq. 6) or _LRU */
    /* LAYOUT_SWARM: a layer is profiled and clustered again once less than this share of the rows
     * its clusters bring is needed (0: never) */
    float min_useful;
    uint32_t index; /* how a miss selects: KVS_SPARSE_INDEX_EXACT (0) or _MEDOIDS */
    /* adaptive thresholds: every audit_every-th step of a head is measured (0: 8) */
    uint32_t audit_every;
    /* adaptive thresholds (0: none, tau stays as eta and p make it): each head's tau rises while
     * the attention its reused rows lose, measured against the exact top-k on audited steps, is
     * above this, and falls while it is below half of it (kvs_qsac_adapt, docs/sparse.md) */
    float target_error;
    /* softmax logits are q.k * score_scale (0: 1/sqrt(head_dim), for unscaled queries) */
    float score_scale;
} kvs_sparse_params;
#define KVS_SPARSE_PARAMS_SIZE_1_9 88u

/* kvs_sparse_params.index. EXACT: the top-k of every stored key's score. MEDOIDS (with a cluster
 * layout, once a layer's clusters exist): only each cluster's medoid is scored, and whole clusters
 * are taken, best medoid first, while fewer than topk rows are taken (Swarm's retrieval: no
 * oracle, an approximate top-k); the exact top-k before that. */
#define KVS_SPARSE_INDEX_EXACT   0u
#define KVS_SPARSE_INDEX_MEDOIDS 1u

/* kvs_sparse_params.layout. ROWS: each row is read from its chunk object, in the tier holding
 * it. SWARM: Swarm's clusters in the chain's SSD tier: each layer's selections are profiled, its
 * rows clustered by co-activation and written as cluster objects, and a miss reads whole clusters
 * (docs/sparse.md). */
#define KVS_SPARSE_LAYOUT_ROWS      0u
#define KVS_SPARSE_LAYOUT_SWARM     1u
/* the same cluster objects, but of consecutive rows (no profiling): Swarm's comparator */
#define KVS_SPARSE_LAYOUT_POSITIONS 2u
/* kvs_sparse_params.cluster_cache */
#define KVS_SPARSE_CACHE_SCORE      0u /* keep the clusters of highest Eq. 6 score */
#define KVS_SPARSE_CACHE_LRU        1u /* keep the most recently used clusters */

/* sparse_select flags */
#define KVS_SPARSE_FINAL       0u /* the layer's real query */
/* an approximate query issued early (e.g. for layer i + 1 while layer i computes); a later FINAL
 * call corrects it */
#define KVS_SPARSE_SPECULATIVE 1u

/* Counters of a request's sparse decode (sparse_stats). Head steps count one per KV head. */
typedef struct kvs_sparse_stats {
    uint32_t struct_size;
    uint32_t reserved;
    uint64_t stored_tokens;  /* the context rows the connector selects from */
    uint64_t chunks_refused; /* chunks whose object failed its check at begin: never selected */
    uint64_t steps;          /* sparse_select calls run */
    uint64_t head_hits;      /* head steps that reused the cached rows */
    uint64_t head_misses;    /* head steps that selected again */
    uint64_t rows_fetched;   /* rows read from the tiers into the head cache */
    uint64_t bytes_fetched;  /* their K and V bytes */
    /* rows a tier could not read or that failed their row hash (their slots hold UINT32_MAX) */
    uint64_t rows_failed;
    uint64_t spec_steps; /* SPECULATIVE calls run */
    /* head steps of a FINAL call that selected again after a SPECULATIVE one of the same layer
     * (the speculation was wrong) */
    uint64_t spec_corrected;
    uint64_t spec_kept; /* head steps of such FINAL calls that kept the speculative rows */
    uint64_t select_ns; /* time scoring and selecting */
    uint64_t fetch_ns;  /* time reading rows (clustering included) */
    /* LAYOUT_SWARM */
    uint64_t layouts_found;      /* layers whose clusters a manifest in the tier named at begin */
    uint64_t layouts_written;    /* layers clustered and written (re-clustering included) */
    uint64_t reclustered;        /* of those, re-clusterings by maintenance */
    uint64_t clusters_read;      /* cluster objects read from the tier */
    uint64_t cluster_bytes_read; /* their bytes */
    uint64_t cluster_cache_hits; /* clusters the hot-cluster cache held */
    uint64_t rows_from_clusters; /* of rows_fetched, those that came out of clusters */
    uint64_t keys_scored;        /* keys (rows, or medoids) the selections scored */
    uint64_t medoid_selections;  /* head steps that selected through the medoid index */
    /* adaptive thresholds */
    uint64_t audits;                  /* head steps measured */
    uint64_t audit_error_micro;       /* the sum of their attention errors, in millionths */
    uint64_t tau_raised, tau_lowered; /* threshold changes */
} kvs_sparse_stats;
#define KVS_SPARSE_STATS_SIZE_1_9 216u

#ifdef __cplusplus
}
#endif
#endif /* KVSTRATA_SPARSE_H */
