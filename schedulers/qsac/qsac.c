/* qsac.c - LiteCache's QSAC as pure functions (qsac.h). */
#include "qsac.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvs_qsac_defaults(kvs_qsac_params *params) {
    params->eta = 0.8;
    params->p = 3.0;
    params->epsilon = 0.1;
}

static double clamp(double x, double lo, double hi) {
    return x < lo ? lo : x > hi ? hi : x;
}

double kvs_qsac_threshold(double importance, double eta, double p) {
    double s = importance == importance ? clamp(importance, 0.0, 1.0) : 0.0;
    double theta_star = acos(clamp(eta, -1.0, 1.0));
    double lambda = pow(s, p > 0 ? p : 1.0); /* p <= 0 or NaN: taken as 1 */
    return cos(lambda * theta_star + (1.0 - lambda) * M_PI);
}

double kvs_qsac_cosine(const float *a, const float *b, uint32_t d) {
    double dot = 0, na = 0, nb = 0;
    for (uint32_t i = 0; i < d; i++) {
        dot += (double)a[i] * b[i];
        na += (double)a[i] * a[i];
        nb += (double)b[i] * b[i];
    }
    return na > 0 && nb > 0 ? dot / sqrt(na * nb) : 0.0;
}

double kvs_qsac_aggregate(const double *sims, const double *weights, uint32_t m) {
    if (m == 0) return -1.0;
    int any_weight = 0;
    for (uint32_t j = 0; weights && j < m; j++) any_weight |= weights[j] > 0;
    double w_sum = 0, inv_sum = 0, lowest = INFINITY;
    int non_positive = 0;
    for (uint32_t j = 0; j < m; j++) {
        double w = any_weight ? weights[j] : 1.0;
        if (!(w > 0)) continue;
        if (sims[j] < lowest) lowest = sims[j];
        if (sims[j] <= 0) {
            non_positive = 1;
            continue;
        }
        w_sum += w;
        inv_sum += w / sims[j];
    }
    return non_positive ? lowest : w_sum / inv_sum;
}

double kvs_qsac_difficulty(double tau, double mean_sim, double epsilon) {
    return tau - (mean_sim - epsilon);
}

uint32_t kvs_qsac_pick_resident(const double *difficulty, const uint64_t *bytes, uint32_t n,
                                uint64_t budget_bytes, uint32_t *out) {
    uint32_t k = 0;
    /* candidates in order: an insertion sort of the indices with D > 0 (n is heads, not tokens) */
    for (uint32_t i = 0; i < n; i++) {
        if (!(difficulty[i] > 0)) continue;
        uint32_t at = k++;
        while (at > 0 && difficulty[out[at - 1]] < difficulty[i]) {
            out[at] = out[at - 1];
            at--;
        }
        out[at] = i;
    }
    uint32_t taken = 0;
    uint64_t left = budget_bytes;
    for (uint32_t c = 0; c < k; c++) {
        uint32_t i = out[c];
        if (bytes[i] > left) continue;
        left -= bytes[i];
        out[taken++] = i;
    }
    return taken;
}

int kvs_qsac_step(kvs_qsac_head *head, const float *q, const double *weights, double *sim) {
    double s = -1.0;
    if (head->valid) {
        double one[64], *sims = head->m <= 64 ? one : malloc(head->m * sizeof *sims);
        if (sims) {
            for (uint32_t j = 0; j < head->m; j++)
                sims[j] = kvs_qsac_cosine(q + (size_t)j * head->d,
                                          head->label + (size_t)j * head->d, head->d);
            s = kvs_qsac_aggregate(sims, weights, head->m);
            if (sims != one) free(sims);
        }
    }
    if (sim) *sim = s;
    if (head->valid && s > head->tau) {
        head->hits++;
        return 1;
    }
    memcpy(head->label, q, (size_t)head->m * head->d * sizeof *q);
    head->valid = 1;
    head->misses++;
    return 0;
}

/* ---- delta fetch ---------------------------------------------------------------------------- */

typedef struct tok_at {
    uint32_t token, at;
} tok_at;

static int by_token(const void *a, const void *b) {
    const tok_at *x = a, *y = b;
    return x->token < y->token ? -1 : x->token > y->token ? 1 : (x->at > y->at) - (x->at < y->at);
}

/* index in sorted[0..n) of token, or UINT32_MAX */
static uint32_t find_token(const tok_at *sorted, uint32_t n, uint32_t token) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (sorted[mid].token < token)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && sorted[lo].token == token ? lo : UINT32_MAX;
}

uint32_t kvs_qsac_delta(uint32_t *slot_token, uint32_t cap, const uint32_t *want, uint32_t n_want,
                        uint32_t *fetch_tokens, uint32_t *fetch_slots) {
    if (n_want > cap || (!want && n_want) || (!slot_token && cap)) return UINT32_MAX;
    tok_at *w = malloc(((size_t)n_want + 1) * sizeof *w);
    uint8_t *keep = calloc((size_t)cap + 1, 1), *have = calloc((size_t)n_want + 1, 1);
    uint32_t n_fetch = UINT32_MAX;
    if (!w || !keep || !have) goto out;
    int sorted = 1; /* a top-k comes in ascending rows: no sort then */
    for (uint32_t i = 0; i < n_want; i++) {
        w[i] = (tok_at){want[i], i};
        sorted &= i == 0 || want[i - 1] < want[i];
    }
    if (!sorted) qsort(w, n_want, sizeof *w, by_token);
    for (uint32_t i = 1; i < n_want; i++)
        if (w[i].token == w[i - 1].token) goto out; /* a repeated token */
    /* the slots whose row stays, and which wanted rows are already there */
    for (uint32_t s = 0; s < cap; s++) {
        if (slot_token[s] == KVS_QSAC_EMPTY) continue;
        uint32_t i = find_token(w, n_want, slot_token[s]);
        if (i == UINT32_MAX || have[w[i].at]) continue; /* not wanted (or a duplicate slot) */
        have[w[i].at] = 1;
        keep[s] = 1;
    }
    for (uint32_t s = 0; s < cap; s++)
        if (!keep[s]) slot_token[s] = KVS_QSAC_EMPTY;
    /* the missing rows, in the order of want, into the lowest free slots */
    n_fetch = 0;
    uint32_t free_slot = 0;
    for (uint32_t i = 0; i < n_want; i++) {
        if (have[i]) continue;
        while (keep[free_slot]) free_slot++; /* n_want <= cap: a free slot is left */
        keep[free_slot] = 1;
        slot_token[free_slot] = want[i];
        fetch_tokens[n_fetch] = want[i];
        fetch_slots[n_fetch] = free_slot;
        n_fetch++;
    }
out:
    free(w);
    free(keep);
    free(have);
    return n_fetch;
}

/* ---- adaptive threshold --------------------------------------------------------------------- */

double kvs_qsac_adapt_observe(kvs_qsac_adapt *adapt, double tau, double sim, double error) {
    adapt->error_sum += error == error ? clamp(error, 0.0, 1.0) : 1.0; /* NaN: the worst */
    adapt->sim_sum += sim == sim ? clamp(sim, -1.0, 1.0) : 1.0;
    if (++adapt->n < adapt->window) return tau;
    double mean = adapt->error_sum / adapt->n, mean_sim = adapt->sim_sum / adapt->n;
    adapt->n = 0;
    adapt->error_sum = adapt->sim_sum = 0;
    if (mean > adapt->target_error) {
        double want = tau + adapt->step;
        if (mean_sim + adapt->step > want) want = mean_sim + adapt->step;
        double up = clamp(want, adapt->tau_min, adapt->tau_max);
        adapt->raised += up > tau;
        return up > tau ? up : tau;
    }
    if (mean < adapt->target_error / 2) {
        double down = clamp(tau - adapt->step, adapt->tau_min, adapt->tau_max);
        adapt->lowered += down < tau;
        return down < tau ? down : tau;
    }
    return tau;
}

double kvs_qsac_attention_error(const float *scores, uint32_t n, double scale,
                                const uint32_t *cached, uint32_t n_cached, const uint32_t *exact,
                                uint32_t n_exact) {
    if (n == 0 || n_exact == 0) return 0.0;
    if (!(scale > 0)) return 1.0; /* no softmax to weigh by: the worst */
    /* softmax weights share one denominator, and the ratio of masses is the same whatever is
     * subtracted: subtract the largest score of the rows counted, so neither mass underflows */
    double top = -INFINITY;
    for (uint32_t i = 0; i < n_cached; i++)
        if (cached[i] < n && scores[cached[i]] > top) top = scores[cached[i]];
    for (uint32_t i = 0; i < n_exact; i++)
        if (exact[i] < n && scores[exact[i]] > top) top = scores[exact[i]];
    if (!(top > -INFINITY)) return 1.0;
    double mass_cached = 0, mass_exact = 0;
    for (uint32_t i = 0; i < n_cached; i++)
        if (cached[i] < n) mass_cached += exp((scores[cached[i]] - top) * scale);
    for (uint32_t i = 0; i < n_exact; i++)
        if (exact[i] < n) mass_exact += exp((scores[exact[i]] - top) * scale);
    if (mass_exact != mass_exact || mass_cached != mass_cached) return 1.0; /* a NaN score */
    if (!(mass_exact > 0)) return 0.0;
    double e = 1.0 - mass_cached / mass_exact;
    return e == e ? clamp(e, 0.0, 1.0) : 1.0;
}
