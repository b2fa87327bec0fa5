/* qsac.h - LiteCache's query-similarity approximate cache (QSAC;
 * docs/sparse.md) as pure functions: per-head thresholds
 * from importance (Eq. 3-5), the GQA similarity of a KV head's query group (Eq. 2), reuse difficulty
 * and the heads kept fully resident, the hit/miss rule with the label updated only on a miss, the
 * delta fetch of a miss (only the rows the head cache does not hold), and an online threshold that
 * adapts to the observed attention error instead of staying static (the paper's thresholds are
 * fixed offline). No I/O, no clock; every result is deterministic. One owner thread per object. */
#ifndef KVS_QSAC_H
#define KVS_QSAC_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_qsac_params {
    double eta;     /* threshold upper bound (a head of importance 1 reuses while sim > eta) */
    double p;       /* lambda = importance^p */
    double epsilon; /* tolerance of the reuse difficulty */
} kvs_qsac_params;

/* eta 0.8, p 3, epsilon 0.1 (the paper's Llama3-8B values). */
void kvs_qsac_defaults(kvs_qsac_params *params);

/* Eq. 3-5: theta* = arccos(eta), lambda = s^p, theta = lambda theta* + (1 - lambda) pi, tau =
 * cos(theta). importance is clamped to [0, 1] (NaN: 0), eta to [-1, 1], and p must be > 0 (other
 * values are taken as 1): tau(1) = eta, tau(0) = -1, and tau never decreases with importance. */
double kvs_qsac_threshold(double importance, double eta, double p);

/* Cosine similarity of two d-vectors in double precision; 0 when either is all zeros. */
double kvs_qsac_cosine(const float *a, const float *b, uint32_t d);

/* Eq. 2: the KV head's similarity from its m query heads' similarities, the weighted harmonic mean
 * sum(w) / sum(w / sim) over the heads with a positive weight (all weights <= 0 or NULL: equal
 * weights); it lies between the smallest and the largest of them, nearer the smallest. The mean
 * is not defined once a similarity is <= 0; there the value is the smallest weighted similarity,
 * where the mean tends as that similarity falls to 0, so the value is continuous. (The notes force
 * a miss there instead; but tau is below 0 for heads of low importance, which should go on
 * reusing, and the smallest similarity still makes such a group miss whenever tau is above it.)
 * m 0: -1. */
double kvs_qsac_aggregate(const double *sims, const double *weights, uint32_t m);

/* Reuse difficulty D = tau - (mean_sim - epsilon): how far the head's mean adjacent-step similarity
 * (within epsilon) falls short of its threshold. */
double kvs_qsac_difficulty(double tau, double mean_sim, double epsilon);

/* The heads kept fully resident: those with difficulty > 0, hardest first (ties: lower index), each
 * taken while its bytes fit what is left of budget_bytes (a head that does not fit is skipped, the
 * next may). Writes their indices to out (n entries room); returns how many. */
uint32_t kvs_qsac_pick_resident(const double *difficulty, const uint64_t *bytes, uint32_t n,
                                uint64_t budget_bytes, uint32_t *out);

/* ---- one KV head's cache state (Alg. 1) ---------------------------------------------------- */

/* The label is the query group that selected what the head cache holds: m query heads of d floats.
 * tau is the head's current threshold (kvs_qsac_threshold, then kvs_qsac_adapt). */
typedef struct kvs_qsac_head {
    float *label; /* m * d, caller-owned */
    uint32_t m, d;
    int valid; /* 0 until the first miss: the first step always misses */
    double tau;
    uint64_t hits, misses;
} kvs_qsac_head;

/* Decide a step: the group's similarity to the label (Eq. 2 with weights, NULL: equal) into *sim,
 * and 1 (a hit: attend to the cached rows, move nothing) when the label is valid and sim > tau.
 * A miss (0) relabels the head with q (m * d floats) at once; a hit leaves the label alone, so it
 * stays the query that chose the cached rows. Counts hits and misses. */
int kvs_qsac_step(kvs_qsac_head *head, const float *q, const double *weights, double *sim);

/* ---- the delta fetch of a miss ------------------------------------------------------------- */

/* The head cache has cap slots; slot_token[s] is the token row it holds (KVS_QSAC_EMPTY: none).
 * want[0..n_want) is the new selection (distinct tokens, n_want <= cap). Rows kept by the new
 * selection stay in their slots; each wanted row the cache lacks goes into a slot whose row is no
 * longer wanted (lowest slot first) and is listed in fetch_tokens/fetch_slots (n_want entries
 * room each), in the order of want. slot_token is updated to the new contents; slots not needed
 * become KVS_QSAC_EMPTY. Returns the rows to fetch (|want \ cached|), or UINT32_MAX for bad
 * arguments (n_want > cap, a repeated token in want, out of memory). */
#define KVS_QSAC_EMPTY UINT32_MAX
uint32_t kvs_qsac_delta(uint32_t *slot_token, uint32_t cap, const uint32_t *want, uint32_t n_want,
                        uint32_t *fetch_tokens, uint32_t *fetch_slots);

/* ---- an adaptive threshold ------------------------------------------------------------------ */

/* The paper fixes tau offline. Online, a head whose reused rows lose too much attention is made to
 * miss more, and one that loses little is allowed to reuse more: after every `window` measured
 * steps, when the mean attention error (1 - the attention mass the cached rows capture over the
 * mass the exact top-k captures, measured by the engine on sampled steps) is above target_error,
 * tau rises above the window's mean similarity (by step, and at least step above the old tau), so
 * the next steps like these miss and refresh the cache; when it is below half the target, tau
 * falls by step. tau stays within [tau_min, tau_max]. */
typedef struct kvs_qsac_adapt {
    double target_error; /* e.g. 0.02 */
    double step;         /* e.g. 0.02 */
    double tau_min, tau_max;
    uint32_t window;
    /* running */
    uint32_t n;
    double error_sum, sim_sum;
    uint64_t raised, lowered;
} kvs_qsac_adapt;

/* One measured step: the group's similarity to its label that step (kvs_qsac_step's *sim; a step
 * without a valid label counts as 1) and its attention error (0..1). Returns the head's new tau
 * (changed only when a window closes). */
double kvs_qsac_adapt_observe(kvs_qsac_adapt *adapt, double tau, double sim, double error);

/* The attention error of reusing `cached` instead of the exact selection `exact`: 1 - mass(cached)
 * / mass(exact) over softmax weights of scores (n tokens, scaled by `scale` > 0), in [0, 1]; 0
 * when there is no exact selection, 1 for a scale that is not > 0 or a result that is not a
 * number. Tokens are indices into scores. For a GQA group, scores of one query head measure that
 * head's error; the group's summed scores (kvs_topk_scores) give an approximation. */
double kvs_qsac_attention_error(const float *scores, uint32_t n, double scale,
                                const uint32_t *cached, uint32_t n_cached, const uint32_t *exact,
                                uint32_t n_exact);

#ifdef __cplusplus
}
#endif

#endif
