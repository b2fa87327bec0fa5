/*
 * cacheflow.h - restore plans after CacheFlow (docs/cacheflow.md): for each request's cached prefix,
 * what is recomputed and what is loaded from a tier, so the restore finishes soonest.
 *
 * Pure functions over plain structs: no allocation inside a call except where a function says so,
 * no globals, no I/O. Times are seconds (double); ties are broken by request index so every rank
 * that plans the same batch gets the same plan.
 *
 * Model (docs/cacheflow.md, "Cost model"):
 *   a batched forward over units U costs  fix + lin * sum(n_u) + att * sum(n_u * (o_u + (n_u + 1) / 2))
 *   (n_u tokens at context offset o_u), so recomputing chunk i alone costs c(i) = fwd({i}); loading b
 *   bytes over channel k costs lat_k + b / bw_k, one transfer at a time per channel.
 * Token mode: chunks 0..K-1, recompute [0, m) from the front while loading [m, K) from the back.
 * Layer mode: layers 0..L-1, recompute the whole prefix through layers [0, l) while loading the KV of
 * layers [l, L).
 */
#ifndef KVS_CACHEFLOW_H
#define KVS_CACHEFLOW_H

#include <stddef.h>
#include <stdint.h>

#define CF_MAX_CHANNELS 16u

typedef enum cf_mode { CF_MODE_TOKEN = 0, CF_MODE_LAYER = 1 } cf_mode;

/* Which request an idle I/O channel serves next. */
typedef enum cf_priority {
    CF_PRIO_LRF = 0,  /* largest remaining recompute cost first (the paper's rule) */
    CF_PRIO_SRF = 1,  /* smallest remaining recompute cost first */
    CF_PRIO_MEAN = 2, /* smallest predicted remaining restore time first (aims at mean TTFT) */
    CF_PRIO_COUNT
} cf_priority;

typedef struct cf_compute {
    double fix_s;            /* fixed cost of one batched forward (launches, weight streaming) */
    double lin_s_per_token;  /* linear part per token (GEMMs) */
    double att_s_per_token2; /* attention: per token per context token */
} cf_compute;

typedef struct cf_channel {
    double lat_s;       /* per transfer */
    double bytes_per_s; /* > 0 */
} cf_channel;

typedef struct cf_params {
    uint32_t chunk_tokens;             /* token-mode unit, > 0 */
    uint32_t n_layers;                 /* > 0 */
    uint64_t kv_bytes_per_token_layer; /* K and V of one token in one layer */
    uint32_t l_delta;                  /* 0: pick each request's mode by predicted time; else token
                                          * mode from this many cached tokens on, layer mode below */
    cf_priority priority;
} cf_params;

typedef struct cf_request {
    uint32_t n_cached; /* restorable prefix tokens */
    uint32_t channel;  /* index of the channel (tier) its stored KV is read from */
    uint32_t offset; /* position of its first restorable token (tokens before it are already in the
                        * engine): recomputing costs more attention the later a range starts */
} cf_request;

/* ---- cost model ---------------------------------------------------------------------------------- */

/* One forward over a single unit of n tokens at context offset o (fixed cost included). */
double cf_forward_s(const cf_compute *m, uint64_t offset, uint64_t n);
/* The variable part of a unit inside a batched forward (no fixed cost). */
double cf_unit_compute_s(const cf_compute *m, uint64_t offset, uint64_t n);
double cf_load_s(const cf_channel *c, uint64_t bytes);

/* Chunks of a prefix: K = ceil(n / chunk_tokens); chunk i has cf_chunk_tokens(...) tokens. */
uint32_t cf_chunks(const cf_params *p, uint32_t n_cached);
uint32_t cf_chunk_tokens(const cf_params *p, uint32_t n_cached, uint32_t i);

/* ---- one request -------------------------------------------------------------------------------- */

typedef struct cf_split {
    cf_mode mode;
    uint32_t units;   /* K chunks (token mode) or L layers (layer mode) */
    uint32_t split;   /* recompute units [0, split), load [split, units) */
    double compute_s; /* predicted time of the recomputed part */
    double load_s;    /* predicted time of the loaded part */
    double total_s;   /* max of the two: they run at once */
} cf_split;

/* Token-wise two-pointer: chunks recomputed one forward each from the front, loaded from the back. */
cf_split cf_token_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                        uint32_t n_cached);
/* Layer-wise two-pointer: whole-prefix layers recomputed bottom-up, loaded top-down. */
cf_split cf_layer_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                        uint32_t n_cached);
/* The mode params ask for (l_delta), or the faster of the two when l_delta is 0. */
cf_split cf_best_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                       uint32_t n_cached);
/* The smallest prefix length from which token mode is predicted no slower than layer mode, searched
 * up to max_tokens in steps of chunk_tokens (the last crossing); max_tokens + 1 if never. */
uint32_t cf_crossover(const cf_params *p, const cf_compute *m, const cf_channel *c,
                      uint32_t max_tokens);

/* Multi-stage (pipeline) restore: S stages each own n_layers / S layers (the first ones one more when
 * it does not divide) and restore them at once, stage s > 0 first fetching the boundary activations
 * of the prefix (boundary_bytes_per_token each) over the channel. shared_channel: the stages share
 * the channel's bandwidth (each sees bw / S). Returns the slowest stage's predicted time. */
double cf_staged_s(const cf_params *p, const cf_compute *m, const cf_channel *c, uint32_t n_cached,
                   uint32_t stages, uint64_t boundary_bytes_per_token, int shared_channel);

#define CF_MAX_STAGES 8u

/* An engine's pipeline stages: stage s owns layers [first_layer[s], first_layer[s + 1]) (p->n_layers
 * after the last); first_layer[0] = 0, strictly increasing. */
typedef struct cf_stages {
    uint32_t n_stages; /* 1..CF_MAX_STAGES */
    uint32_t first_layer[CF_MAX_STAGES];
    uint64_t boundary_bytes_per_token; /* stored activations entering one stage s > 0 */
    uint8_t read_all_boundaries;       /* 1: every boundary is read (first, in stage order) whatever
                                          * the split, so stage s starts at s * boundary; 0: only those of
                                          * stages that recompute */
} cf_stages;

/* Per-stage layer split, the exact optimum. Every stage restores its own L_s layers at once: stage s
 * recomputes its first recompute[s] (0..L_s) layers over the whole prefix of n_cached tokens starting
 * at context position offset, each costing lc = cf_forward_s(m, offset, n_cached) / p->n_layers;
 * stage 0 starts from the token embeddings at time 0, a stage s > 0 from its stored boundary
 * activations, which it reads first. The rest of each stage's layers is loaded. The one channel c
 * serves the reads one at a time, in this order: the boundary of every stage s > 0 with
 * recompute[s] > 0, in stage order (cf_load_s(c, n_cached * boundary_bytes_per_token) each), then the
 * KV of every loaded layer (cf_load_s(c, n_cached * kv_bytes_per_token_layer) each). Stage s computes
 * from the end of its boundary's read (stage 0 from 0) for recompute[s] * lc, on its own device, in
 * parallel with the others. Predicted time: max(end of the last read, latest stage compute end); the
 * k-th boundary read ends at k * boundary, the last read at n_boundaries * boundary + n_loaded * layer.
 * Returns the minimum over every choice of recompute[] (exact, evaluated with that formula) and writes
 * the minimising one to recompute[0..n_stages) (ties: the least total recompute, then the fewest
 * boundaries, then deterministic). n_cached 0: 0, nothing recomputed. Negative on bad arguments: a
 * NULL pointer, n_stages 0 or above CF_MAX_STAGES or p->n_layers, first_layer not starting at 0, not
 * strictly increasing or reaching p->n_layers. With one stage and offset 0 it is
 * cf_layer_split(...).total_s. Cost: O(S^3 log L) (S stages, L layers); a few microseconds at S = 8.
 * With st->read_all_boundaries every boundary is read whatever the split (what the connector does, so
 * pages it loads never hold stale activations): stage s computes from s * boundary, the reads end at
 * (S - 1) * boundary + loaded * layer; the same exactness and ties, O(S^2 log L). */
double cf_stage_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                      const cf_stages *st, uint64_t offset, uint32_t n_cached, uint32_t *recompute);

/* ---- a batch --------------------------------------------------------------------------------------- */

/* One unit of work in a plan's trace. */
typedef struct cf_event {
    uint32_t request;
    uint32_t unit;
    uint8_t loaded; /* 1: read over `channel`; 0: recomputed in forward `step` */
    uint32_t channel;
    uint32_t step; /* recomputed: index of the batched forward */
    double start_s, end_s;
} cf_event;

typedef struct cf_plan {
    cf_mode mode;
    uint32_t units;
    uint32_t split;   /* recompute [0, split), load [split, units) */
    double done_s;    /* predicted restore finish (batch starts at 0) */
    uint32_t io_rank; /* order of its first load on its channel (UINT32_MAX: loads nothing) */
} cf_plan;

/* Scratch for cf_plan_batch, sized by cf_batch_scratch_bytes. */
size_t cf_batch_scratch_bytes(uint32_t n_requests);

/* Batch-aware restore plan: an event-driven run of the cost model in which the compute engine runs
 * one batched forward at a time holding the next unit of every request still recomputing, and each
 * idle channel serves the request params->priority picks, one unit at a time, from the back. A
 * resource takes a request's last unclaimed unit only if it would finish it before the other side
 * could (the guard that makes a single request's plan optimal). Fills plans[n]; when events is not
 * NULL it gets the trace (capacity n_events_cap; *n_events the count, or what was needed if larger).
 * Returns the makespan, or a negative value on bad arguments (a channel index out of range). */
double cf_plan_batch(const cf_params *p, const cf_compute *m, const cf_channel *channels,
                     uint32_t n_channels, const cf_request *reqs, uint32_t n, void *scratch,
                     cf_plan *plans, cf_event *events, uint32_t n_events_cap, uint32_t *n_events);

/* Batch makespan and mean finish of fixed token-mode splits (split[r] chunks recomputed) with each
 * channel serving requests whole, in the order given by order[] (request indices; a request's loads
 * back to back), compute as in cf_plan_batch. For the brute-force oracle in the tests. */
void cf_evaluate_splits(const cf_params *p, const cf_compute *m, const cf_channel *channels,
                        const cf_request *reqs, uint32_t n, const uint32_t *split,
                        const uint32_t *order, double *makespan, double *mean, double *done);

/* ---- prefix-only engines (stock vLLM) ------------------------------------------------------------- */

/* Engines that can only load a prefix and recompute the rest: per request, how many leading chunks
 * to load (load_chunks[r] in 0..K_r; 0 = load nothing) so the batch finishes soonest. Model: each
 * channel serves its requests' loads back to back, longest remaining recompute first; a request's
 * tail is recomputed after its loads land, chunk by chunk. done_s[r] (optional) gets each finish.
 * Returns the makespan. */
double cf_plan_prefix(const cf_params *p, const cf_compute *m, const cf_channel *channels,
                      uint32_t n_channels, const cf_request *reqs, uint32_t n,
                      uint32_t *load_chunks, double *done_s);

const char *cf_priority_name(cf_priority prio);

#endif
