/* cacheflow.c - restore plans: cost model, one-request two-pointers, the batch scheduler and the
 * prefix-only planner (contract in cacheflow.h, design in docs/cacheflow.md). */
#include "cacheflow.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- cost model ---------------------------------------------------------------------------------- */

double cf_unit_compute_s(const cf_compute *m, uint64_t offset, uint64_t n) {
    double nn = (double)n;
    return m->lin_s_per_token * nn + m->att_s_per_token2 * nn * ((double)offset + (nn + 1.0) / 2.0);
}

double cf_forward_s(const cf_compute *m, uint64_t offset, uint64_t n) {
    return n ? m->fix_s + cf_unit_compute_s(m, offset, n) : 0.0;
}

double cf_load_s(const cf_channel *c, uint64_t bytes) {
    return bytes ? c->lat_s + (double)bytes / c->bytes_per_s : 0.0;
}

uint32_t cf_chunks(const cf_params *p, uint32_t n_cached) {
    return (uint32_t)(((uint64_t)n_cached + p->chunk_tokens - 1) / p->chunk_tokens);
}

uint32_t cf_chunk_tokens(const cf_params *p, uint32_t n_cached, uint32_t i) {
    uint64_t first = (uint64_t)i * p->chunk_tokens;
    if (first >= n_cached) return 0;
    uint64_t left = n_cached - first;
    return (uint32_t)(left < p->chunk_tokens ? left : p->chunk_tokens);
}

/* What one unit of a request costs: recomputed (variable part, plus the fixed share a layer unit
 * carries) and loaded. */
typedef struct unit_cost {
    double compute, load;
} unit_cost;

static unit_cost cost_of(const cf_params *p, const cf_compute *m, const cf_channel *c, cf_mode mode,
                         uint64_t offset, uint32_t n_cached, uint32_t unit) {
    unit_cost u;
    if (mode == CF_MODE_TOKEN) {
        uint32_t n = cf_chunk_tokens(p, n_cached, unit);
        u.compute = cf_unit_compute_s(m, offset + (uint64_t)unit * p->chunk_tokens, n);
        u.load = cf_load_s(c, (uint64_t)n * p->n_layers * p->kv_bytes_per_token_layer);
    } else { /* one layer of the whole prefix: a 1/L share of the full forward */
        u.compute = cf_forward_s(m, offset, n_cached) / p->n_layers;
        u.load = cf_load_s(c, (uint64_t)n_cached * p->kv_bytes_per_token_layer);
    }
    return u;
}

/* ---- one request -------------------------------------------------------------------------------- */

static cf_split scan_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                           cf_mode mode, uint64_t offset, uint32_t n_cached) {
    cf_split s = {.mode = mode};
    s.units = mode == CF_MODE_TOKEN ? cf_chunks(p, n_cached) : p->n_layers;
    if (n_cached == 0) return s;
    /* A(k) = recompute [0, k) (token mode: one forward per chunk), D(k) = load [k, K) */
    double load_all = 0;
    for (uint32_t i = 0; i < s.units; i++)
        load_all += cost_of(p, m, c, mode, offset, n_cached, i).load;
    double a = 0, d = load_all;
    s.split = 0;
    s.compute_s = 0;
    s.load_s = load_all;
    s.total_s = load_all;
    for (uint32_t k = 1; k <= s.units; k++) {
        unit_cost u = cost_of(p, m, c, mode, offset, n_cached, k - 1);
        a += mode == CF_MODE_TOKEN ? m->fix_s + u.compute : u.compute;
        d -= u.load;
        if (d < 0) d = 0;
        double t = a > d ? a : d;
        if (t < s.total_s) {
            s.split = k;
            s.compute_s = a;
            s.load_s = d;
            s.total_s = t;
        }
    }
    return s;
}

cf_split cf_token_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                        uint32_t n_cached) {
    return scan_split(p, m, c, CF_MODE_TOKEN, 0, n_cached);
}

cf_split cf_layer_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                        uint32_t n_cached) {
    return scan_split(p, m, c, CF_MODE_LAYER, 0, n_cached);
}

/* The mode params ask for, or the faster, for a prefix whose first token is at position offset. */
static cf_split best_split_at(const cf_params *p, const cf_compute *m, const cf_channel *c,
                              uint64_t offset, uint32_t n_cached) {
    int token = p->l_delta ? n_cached >= p->l_delta : -1;
    cf_split t = token != 0 ? scan_split(p, m, c, CF_MODE_TOKEN, offset, n_cached) : (cf_split){0};
    cf_split l = token != 1 ? scan_split(p, m, c, CF_MODE_LAYER, offset, n_cached) : (cf_split){0};
    return token == 1 ? t : token == 0 ? l : l.total_s < t.total_s ? l : t;
}

cf_split cf_best_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                       uint32_t n_cached) {
    return best_split_at(p, m, c, 0, n_cached);
}

uint32_t cf_crossover(const cf_params *p, const cf_compute *m, const cf_channel *c,
                      uint32_t max_tokens) {
    uint32_t last_worse = 0; /* the largest length at which token mode was slower */
    for (uint64_t n = p->chunk_tokens; n <= max_tokens; n += p->chunk_tokens) {
        double t = cf_token_split(p, m, c, (uint32_t)n).total_s,
               l = cf_layer_split(p, m, c, (uint32_t)n).total_s;
        if (t > l) last_worse = (uint32_t)n;
    }
    if (last_worse == 0) return p->chunk_tokens;
    return last_worse + p->chunk_tokens > max_tokens ? max_tokens + 1
                                                     : last_worse + p->chunk_tokens;
}

double cf_staged_s(const cf_params *p, const cf_compute *m, const cf_channel *c, uint32_t n_cached,
                   uint32_t stages, uint64_t boundary_bytes_per_token, int shared_channel) {
    if (stages == 0) stages = 1;
    if (stages > p->n_layers) stages = p->n_layers;
    cf_channel ch = *c;
    if (shared_channel) ch.bytes_per_s = c->bytes_per_s / stages;
    double worst = 0;
    for (uint32_t s = 0; s < stages; s++) {
        uint32_t layers = p->n_layers / stages + (s < p->n_layers % stages);
        double share = (double)layers / p->n_layers;
        cf_params ps = *p;
        ps.n_layers = layers;
        cf_compute ms = {m->fix_s * share, m->lin_s_per_token * share, m->att_s_per_token2 * share};
        double t = cf_best_split(&ps, &ms, &ch, n_cached).total_s;
        if (s > 0) t += cf_load_s(&ch, (uint64_t)n_cached * boundary_bytes_per_token);
        if (t > worst) worst = t;
    }
    return worst;
}

/* ---- per-stage split ------------------------------------------------------------------------------- */

/* One request's stages: layer counts and the three unit costs of cf_stage_split. */
typedef struct stage_ctx {
    uint32_t n_stages, n_layers, layers[CF_MAX_STAGES];
    double boundary, layer_load, lc;
} stage_ctx;

/* The times every formula here is built from, so that one choice evaluates the same everywhere: the
 * j-th boundary read (and the compute start of the stage reading it) ends at j * boundary; the reads
 * end at n_boundaries * boundary + loaded * layer_load; a stage starting at `start` finishes k layers
 * at start + k * lc. */
static double stage_io_end(const stage_ctx *x, uint32_t n_boundaries, uint32_t loaded) {
    return (double)n_boundaries * x->boundary + (double)loaded * x->layer_load;
}

static double stage_start(const stage_ctx *x, uint32_t position) {
    return position ? (double)position * x->boundary : 0.0;
}

static double stage_end(const stage_ctx *x, uint32_t position, uint32_t k) {
    return stage_start(x, position) + (double)k * x->lc;
}

/* The predicted time of one choice (the definition in cacheflow.h). */
static double stage_time(const stage_ctx *x, const uint32_t *recompute) {
    uint32_t n_boundaries = 0, loaded = 0;
    double comp = 0;
    for (uint32_t s = 0; s < x->n_stages; s++) {
        loaded += x->layers[s] - recompute[s];
        if (recompute[s] == 0) continue;
        double end = stage_end(x, s ? ++n_boundaries : 0, recompute[s]);
        if (end > comp) comp = end;
    }
    double io = stage_io_end(x, n_boundaries, loaded);
    return io > comp ? io : comp;
}

/* The most layers (0..most) a stage at `position` finishes by time t. */
static uint32_t stage_layers_by(const stage_ctx *x, uint32_t position, uint32_t most, double t) {
    double start = stage_start(x, position);
    if (start > t) return 0;
    if (!(x->lc > 0)) return most;
    double g = floor((t - start) / x->lc); /* a guess, corrected on the exact sums */
    uint32_t k = g <= 0 ? 0 : g >= (double)most ? most : (uint32_t)g;
    while (k < most && stage_end(x, position, k + 1) <= t) k++;
    while (k > 0 && stage_end(x, position, k) > t) k--;
    return k;
}

/* Whether some choice finishes by t. Stages in order, dp[j] the most layers recomputable by t with j
 * boundaries read so far (-1: none), took[s][j] whether stage s reads the j-th on that best way: a
 * stage's compute bound depends only on its position among the readers, and for a given number of
 * readers the reads end soonest with the most layers recomputed. */
static int stage_feasible(const stage_ctx *x, double t, int32_t *dp,
                          uint8_t took[][CF_MAX_STAGES]) {
    const uint32_t S = x->n_stages;
    dp[0] = (int32_t)stage_layers_by(x, 0, x->layers[0], t);
    for (uint32_t j = 1; j < S; j++) dp[j] = -1;
    for (uint32_t s = 1; s < S; s++) {
        memset(took[s], 0, sizeof took[s]);
        for (uint32_t j = s; j >= 1; j--) { /* stage s as the j-th reader; j - 1 before it */
            if (dp[j - 1] < 0) continue;
            uint32_t k = stage_layers_by(x, j, x->layers[s], t);
            if (k == 0) continue;
            int32_t v = dp[j - 1] + (int32_t)k;
            if (v > dp[j]) dp[j] = v, took[s][j] = 1;
        }
    }
    for (uint32_t j = 0; j < S; j++)
        if (dp[j] >= 0 && stage_io_end(x, j, x->n_layers - (uint32_t)dp[j]) <= t) return 1;
    return 0;
}

/* The candidate times: family f < S is the read ends with f boundaries, stage_io_end(f, k) for
 * k = 0..n_layers loaded layers; family S + j the compute ends at position j, stage_end(j, k) for
 * k = 1..(most layers of a stage that can be j-th). Each is non-decreasing in k. */
static double stage_candidate(const stage_ctx *x, uint32_t f, uint32_t k) {
    return f < x->n_stages ? stage_io_end(x, f, k) : stage_end(x, f - x->n_stages, k);
}

/* Every boundary read whatever the split: stage s starts at s * boundary. */
static double stage_time_all(const stage_ctx *x, const uint32_t *recompute) {
    uint32_t loaded = 0;
    double comp = 0;
    for (uint32_t s = 0; s < x->n_stages; s++) {
        loaded += x->layers[s] - recompute[s];
        if (recompute[s] && stage_end(x, s, recompute[s]) > comp)
            comp = stage_end(x, s, recompute[s]);
    }
    double io = stage_io_end(x, x->n_stages - 1, loaded);
    return io > comp ? io : comp;
}

/* Whether some split finishes by t when every boundary is read: each stage recomputes the most it can
 * by t (r[] gets it); the reads of the rest must end by t too. */
static int stage_feasible_all(const stage_ctx *x, double t, uint32_t *r) {
    uint32_t total = 0;
    for (uint32_t s = 0; s < x->n_stages; s++)
        total += r[s] = stage_layers_by(x, s, x->layers[s], t);
    return stage_io_end(x, x->n_stages - 1, x->n_layers - total) <= t;
}

/* cf_stage_split with read_all_boundaries: the optimum is the smallest feasible candidate among the
 * read ends ((S - 1) boundaries, k layers loaded) and each stage's compute ends (s * boundary + k * lc),
 * each family non-decreasing in k and feasibility monotone in t; then the least recompute by dropping
 * layers from the stage finishing last while the reads still end in time. */
static double stage_split_all_read(const stage_ctx *x, uint32_t *recompute) {
    const uint32_t S = x->n_stages, L = x->n_layers;
    uint32_t r[CF_MAX_STAGES];
    double best = stage_io_end(x, S - 1, L); /* load everything */
    for (uint32_t f = 0; f <= S; f++) { /* f == S: the read ends; else stage f's compute ends */
        uint32_t lo = f == S ? 0 : 1, hi = f == S ? L : x->layers[f];
#define CAND(k) (f == S ? stage_io_end(x, S - 1, (k)) : stage_end(x, f, (k)))
        if (lo > hi || !(CAND(lo) < best)) continue;
        while (lo < hi) { /* the last member below best */
            uint32_t mid = lo + (hi - lo + 1) / 2;
            if (CAND(mid) < best)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (!stage_feasible_all(x, CAND(lo), r)) continue;
        hi = lo;
        lo = f == S ? 0 : 1;
        while (lo < hi) { /* its first feasible member */
            uint32_t mid = lo + (hi - lo) / 2;
            if (stage_feasible_all(x, CAND(mid), r))
                hi = mid;
            else
                lo = mid + 1;
        }
        best = CAND(lo);
#undef CAND
    }
    stage_feasible_all(x, best, recompute);
    uint32_t total = 0;
    for (uint32_t s = 0; s < S; s++) total += recompute[s];
    for (; total > 0; total--) { /* drop from the stage finishing last while the reads keep up */
        uint32_t drop = S;
        for (uint32_t s = 0; s < S; s++)
            if (recompute[s] &&
                (drop == S || stage_end(x, s, recompute[s]) >= stage_end(x, drop, recompute[drop])))
                drop = s;
        if (stage_io_end(x, S - 1, L - (total - 1)) > best) break;
        recompute[drop]--;
    }
    return stage_time_all(x, recompute);
}

/* The stages cf_stage_split takes: 1..CF_MAX_STAGES of them, no more than the layers, the first at
 * layer 0 and each later one past the one before. */
static int stages_valid(const cf_params *p, const cf_stages *st) {
    if (st->n_stages == 0 || st->n_stages > CF_MAX_STAGES || st->n_stages > p->n_layers ||
        st->first_layer[0] != 0)
        return 0;
    for (uint32_t s = 1; s < st->n_stages; s++)
        if (st->first_layer[s] <= st->first_layer[s - 1] || st->first_layer[s] >= p->n_layers)
            return 0;
    return 1;
}

/* The optimal time: per candidate family, binary search for its smallest feasible member below the
 * best so far. dp and took are stage_feasible's scratch. */
static double stage_best_time(const stage_ctx *x, int32_t *dp, uint8_t took[][CF_MAX_STAGES]) {
    const uint32_t S = x->n_stages, L = x->n_layers;
    double best = stage_io_end(x, 0, L); /* load everything */
    for (uint32_t f = 0; f < 2 * S; f++) {
        uint32_t lo = f < S ? 0 : 1, hi = 0;
        if (f < S)
            hi = L;
        else
            for (uint32_t s = f - S; s < S; s++) hi = x->layers[s] > hi ? x->layers[s] : hi;
        if (!(stage_candidate(x, f, lo) < best)) continue;
        while (lo < hi) { /* the last member below best */
            uint32_t mid = lo + (hi - lo + 1) / 2;
            if (stage_candidate(x, f, mid) < best)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (!stage_feasible(x, stage_candidate(x, f, lo), dp, took)) continue;
        hi = lo;
        lo = f < S ? 0 : 1;
        while (lo < hi) { /* its first feasible member */
            uint32_t mid = lo + (hi - lo) / 2;
            if (stage_feasible(x, stage_candidate(x, f, mid), dp, took))
                hi = mid;
            else
                lo = mid + 1;
        }
        best = stage_candidate(x, f, lo);
    }
    return best;
}

/* The least recompute finishing by best (feasible), fewest readers on a tie, into recompute[]:
 * the dp choice with that many readers, then layers dropped from the stage finishing last. */
static double stage_least_recompute(const stage_ctx *x, double best, uint32_t *recompute) {
    const uint32_t S = x->n_stages, L = x->n_layers;
    int32_t dp[CF_MAX_STAGES];
    uint8_t took[CF_MAX_STAGES][CF_MAX_STAGES];
    stage_feasible(x, best, dp, took);
    uint32_t pick_j = S, pick_total = 0;
    for (uint32_t j = 0; j < S; j++) {
        if (dp[j] < 0) continue;
        uint32_t lo = 0, hi = L; /* the fewest recomputed layers whose reads end by best */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (stage_io_end(x, j, L - mid) <= best)
                hi = mid;
            else
                lo = mid + 1;
        }
        uint32_t need = lo > j ? lo : j;
        if (need <= (uint32_t)dp[j] && (pick_j == S || need < pick_total))
            pick_j = j, pick_total = need;
    }
    if (pick_j == S) return stage_time(x, recompute); /* not reached: best is feasible */
    uint32_t position[CF_MAX_STAGES] = {0}, total = 0;
    for (uint32_t s = S - 1, j = pick_j; s >= 1; s--) /* the dp choice with pick_j readers */
        if (took[s][j]) position[s] = j--;
    for (uint32_t s = 0; s < S; s++) {
        if (s && !position[s]) continue;
        recompute[s] = stage_layers_by(x, position[s], x->layers[s], best);
        total += recompute[s];
    }
    for (; total > pick_total;
         total--) { /* drop layers from the stage finishing last (the later on a tie) */
        uint32_t drop = S;
        double latest = 0;
        for (uint32_t s = 0; s < S; s++) {
            if (recompute[s] <= (s ? 1u : 0u)) continue;
            double end = stage_end(x, position[s], recompute[s]);
            if (drop == S || end >= latest) drop = s, latest = end;
        }
        if (drop == S) break;
        recompute[drop]--;
    }
    return stage_time(x, recompute);
}

/* The exact optimum: every choice's time is a candidate (its read end or a stage's compute end), and
 * whether some choice finishes by t is monotone in t, so the optimum is the smallest feasible
 * candidate: per family, binary search for its smallest feasible member below the best so far. Then
 * the least total recompute finishing by it: with j readers any total from max(j, what the reads
 * need) up to dp[j] is reachable by dropping layers from the dp choice. */
double cf_stage_split(const cf_params *p, const cf_compute *m, const cf_channel *c,
                      const cf_stages *st, uint64_t offset, uint32_t n_cached,
                      uint32_t *recompute) {
    if (!p || !m || !c || !st || !recompute || !stages_valid(p, st)) return -1;
    memset(recompute, 0, st->n_stages * sizeof *recompute);
    if (n_cached == 0) return 0;
    const uint32_t S = st->n_stages, L = p->n_layers;
    stage_ctx x = {.n_stages = S, .n_layers = L};
    for (uint32_t s = 0; s < S; s++)
        x.layers[s] = (s + 1 < S ? st->first_layer[s + 1] : L) - st->first_layer[s];
    x.boundary = cf_load_s(c, (uint64_t)n_cached * st->boundary_bytes_per_token);
    x.layer_load = cf_load_s(c, (uint64_t)n_cached * p->kv_bytes_per_token_layer);
    x.lc = cf_forward_s(m, offset, n_cached) / L;
    if (st->read_all_boundaries) return stage_split_all_read(&x, recompute);
    int32_t dp[CF_MAX_STAGES];
    uint8_t took[CF_MAX_STAGES][CF_MAX_STAGES];
    double best = stage_best_time(&x, dp, took);
    return stage_least_recompute(&x, best, recompute);
}

const char *cf_priority_name(cf_priority prio) {
    switch (prio) {
        case CF_PRIO_LRF: return "lrf";
        case CF_PRIO_SRF: return "srf";
        case CF_PRIO_MEAN: return "mean";
        default: return "?";
    }
}

/* ---- the batch scheduler -------------------------------------------------------------------------- */

typedef struct rstate {
    cf_mode mode;
    uint32_t units;
    int64_t pc, pio; /* unclaimed units are [pc, pio] */
    uint32_t inflight;
    int done;
    double done_s;
    uint32_t io_rank;
} rstate;

size_t cf_batch_scratch_bytes(uint32_t n_requests) {
    return (size_t)n_requests * (sizeof(rstate) + sizeof(uint32_t)) + 64;
}

typedef struct batch {
    const cf_params *p;
    const cf_compute *m;
    const cf_channel *ch;
    const cf_request *reqs;
    uint32_t n;
    rstate *st;
    cf_event *events;
    uint32_t cap, count;
    /* the simulation: the time, the compute engine's step in flight (its requests in step_units),
     * and per channel the unit it loads (-1: idle), whose request, until when */
    uint32_t n_channels;
    uint32_t *step_units;
    double t, step_end;
    int computing;
    uint32_t step, n_step, ranks[CF_MAX_CHANNELS];
    double chan_end[CF_MAX_CHANNELS];
    int64_t chan_unit[CF_MAX_CHANNELS];
    uint32_t chan_req[CF_MAX_CHANNELS];
} batch;

static unit_cost unit_of(const batch *b, uint32_t r, int64_t unit) {
    return cost_of(b->p, b->m, &b->ch[b->reqs[r].channel], b->st[r].mode, b->reqs[r].offset,
                   b->reqs[r].n_cached, (uint32_t)unit);
}

/* Recompute and load time of r's unclaimed units (compute with one fixed cost per token unit). */
static void remaining(const batch *b, uint32_t r, double *compute, double *load) {
    const rstate *s = &b->st[r];
    *compute = *load = 0;
    for (int64_t u = s->pc; u <= s->pio; u++) {
        unit_cost c = unit_of(b, r, u);
        *compute += c.compute + (s->mode == CF_MODE_TOKEN ? b->m->fix_s : 0);
        *load += c.load;
    }
}

static void record(batch *b, uint32_t r, int64_t unit, int loaded, uint32_t channel, uint32_t step,
                   double t0, double t1) {
    if (b->events && b->count < b->cap)
        b->events[b->count] = (cf_event){.request = r,
                                         .unit = (uint32_t)unit,
                                         .loaded = (uint8_t)loaded,
                                         .channel = channel,
                                         .step = step,
                                         .start_s = t0,
                                         .end_s = t1};
    b->count++;
}

/* The channel's pick from a request's remaining recompute and load time: smaller is served first. */
static double priority_key(const batch *b, double comp, double load) {
    switch (b->p->priority) {
        case CF_PRIO_LRF: return -comp;
        case CF_PRIO_SRF: return comp;
        default:
            return comp + load > 0 ? comp * load / (comp + load)
                                   : 0; /* the request alone, two-pointer */
    }
}

/* Each request's best split (its mode and units), all of its units unclaimed. */
static void init_requests(batch *b) {
    for (uint32_t r = 0; r < b->n; r++) {
        rstate *s = &b->st[r];
        const cf_request *q = &b->reqs[r];
        cf_split sp = best_split_at(b->p, b->m, &b->ch[q->channel], q->offset, q->n_cached);
        s->mode = sp.mode;
        s->units = q->n_cached ? sp.units : 0;
        s->pc = 0;
        s->pio = (int64_t)s->units - 1;
        s->inflight = 0;
        s->done = s->units == 0;
        s->done_s = 0;
        s->io_rank = UINT32_MAX;
    }
}

/* The compute engine, when idle: one batched forward over the next unit of each request it takes.
 * With guard, a unit is left to I/O when its channel could load everything left sooner. */
static void start_step(batch *b, int guard) {
    double cost = 0;
    int token = 0;
    b->n_step = 0;
    for (uint32_t r = 0; r < b->n; r++) {
        rstate *s = &b->st[r];
        if (s->pc > s->pio) continue;
        unit_cost u = unit_of(b, r, s->pc);
        double mine = u.compute + (s->mode == CF_MODE_TOKEN ? b->m->fix_s : 0);
        if (guard) { /* leave the unit to I/O if it could load everything left sooner */
            uint32_t k = b->reqs[r].channel;
            double comp, load, io_free = b->chan_unit[k] >= 0 ? b->chan_end[k] : b->t;
            remaining(b, r, &comp, &load);
            if (!(b->t + mine < io_free + load)) continue;
        }
        b->step_units[b->n_step++] = r;
        token |= s->mode == CF_MODE_TOKEN;
        cost += u.compute;
    }
    if (!b->n_step) return;
    cost += token ? b->m->fix_s : 0;
    b->step_end = b->t + cost;
    b->computing = 1;
    for (uint32_t i = 0; i < b->n_step; i++) {
        rstate *s = &b->st[b->step_units[i]];
        record(b, b->step_units[i], s->pc, 0, 0, b->step, b->t, b->step_end);
        s->pc++;
        s->inflight++;
    }
}

/* Each idle channel: the request the priority rule picks, its last unclaimed unit. With guard, a
 * unit is left to compute when it could recompute everything left sooner. 1 when a channel
 * loads. */
static int start_loads(batch *b, int guard) {
    int loading = 0;
    for (uint32_t k = 0; k < b->n_channels; k++) {
        if (b->chan_unit[k] >= 0) {
            loading = 1;
            continue;
        }
        int64_t best = -1;
        double best_key = 0;
        for (uint32_t r = 0; r < b->n; r++) {
            rstate *s = &b->st[r];
            if (b->reqs[r].channel != k || s->pc > s->pio) continue;
            double comp, load, comp_free = b->computing ? b->step_end : b->t;
            remaining(b, r, &comp, &load);
            /* the guard: leave the unit to compute if it could recompute everything left sooner */
            if (guard && !(b->t + unit_of(b, r, s->pio).load <= comp_free + comp)) continue;
            double key = priority_key(b, comp, load);
            if (best < 0 || key < best_key) best = r, best_key = key;
        }
        if (best < 0) continue;
        rstate *s = &b->st[best];
        double end = b->t + unit_of(b, (uint32_t)best, s->pio).load;
        if (s->io_rank == UINT32_MAX) s->io_rank = b->ranks[k]++;
        record(b, (uint32_t)best, s->pio, 1, k, 0, b->t, end);
        b->chan_unit[k] = s->pio;
        b->chan_req[k] = (uint32_t)best;
        b->chan_end[k] = end;
        s->pio--;
        s->inflight++;
        loading = 1;
    }
    return loading;
}

/* On to the next completion: the step or the loads ending then finish, and each request with
 * nothing unclaimed or in flight is done at that time. */
static void next_completion(batch *b) {
    double next = b->computing ? b->step_end : DBL_MAX;
    for (uint32_t k = 0; k < b->n_channels; k++)
        if (b->chan_unit[k] >= 0 && b->chan_end[k] < next) next = b->chan_end[k];
    b->t = next;
    if (b->computing && b->step_end <= b->t) {
        b->computing = 0;
        b->step++;
        for (uint32_t i = 0; i < b->n_step; i++) b->st[b->step_units[i]].inflight--;
    }
    for (uint32_t k = 0; k < b->n_channels; k++) {
        if (b->chan_unit[k] >= 0 && b->chan_end[k] <= b->t) {
            b->st[b->chan_req[k]].inflight--;
            b->chan_unit[k] = -1;
        }
    }
    for (uint32_t r = 0; r < b->n; r++) {
        rstate *s = &b->st[r];
        if (!s->done && s->pc > s->pio && s->inflight == 0) {
            s->done = 1;
            s->done_s = b->t;
        }
    }
}

double cf_plan_batch(const cf_params *p, const cf_compute *m, const cf_channel *channels,
                     uint32_t n_channels, const cf_request *reqs, uint32_t n, void *scratch,
                     cf_plan *plans, cf_event *events, uint32_t n_events_cap, uint32_t *n_events) {
    if (!p || !m || !channels || (!reqs && n) || (!scratch && n) || (!plans && n) ||
        n_channels == 0 || n_channels > CF_MAX_CHANNELS || p->chunk_tokens == 0 || p->n_layers == 0)
        return -1;
    for (uint32_t r = 0; r < n; r++)
        if (reqs[r].channel >= n_channels) return -1;
    batch b = {.p = p,
               .m = m,
               .ch = channels,
               .reqs = reqs,
               .n = n,
               .st = scratch,
               .events = events,
               .cap = n_events_cap,
               .n_channels = n_channels};
    b.step_units = (uint32_t *)(b.st + n);
    init_requests(&b);
    for (uint32_t k = 0; k < n_channels; k++)
        b.chan_end[k] = 0, b.chan_unit[k] = -1, b.chan_req[k] = 0;
    for (int guard = 1;;) {
        if (!b.computing) start_step(&b, guard);
        int loading = start_loads(&b, guard);
        if (!b.computing && !loading) {
            int left = 0;
            for (uint32_t r = 0; r < n; r++) left |= b.st[r].pc <= b.st[r].pio;
            if (!left) break;
            guard = 0; /* both sides declined the last units: compute takes them */
            continue;
        }
        guard = 1;
        next_completion(&b);
    }
    double makespan = 0;
    for (uint32_t r = 0; r < n; r++) {
        rstate *s = &b.st[r];
        plans[r] = (cf_plan){.mode = s->mode,
                             .units = s->units,
                             .split = (uint32_t)s->pc,
                             .done_s = s->done_s,
                             .io_rank = s->io_rank};
        if (s->done_s > makespan) makespan = s->done_s;
    }
    if (n_events) *n_events = b.count;
    return makespan;
}

void cf_evaluate_splits(const cf_params *p, const cf_compute *m, const cf_channel *channels,
                        const cf_request *reqs, uint32_t n, const uint32_t *split,
                        const uint32_t *order, double *makespan, double *mean, double *done) {
    double t = 0, sum = 0, worst = 0;
    uint32_t steps = 0;
    for (uint32_t r = 0; r < n; r++) {
        done[r] = 0;
        if (split[r] > steps) steps = split[r];
    }
    for (uint32_t k = 0; k < steps;
         k++) { /* forward k holds chunk k of every request recomputing it */
        double cost = m->fix_s;
        for (uint32_t r = 0; r < n; r++)
            if (split[r] > k)
                cost += cost_of(p, m, &channels[reqs[r].channel], CF_MODE_TOKEN, reqs[r].offset,
                                reqs[r].n_cached, k)
                            .compute;
        t += cost;
        for (uint32_t r = 0; r < n; r++)
            if (split[r] == k + 1) done[r] = t;
    }
    double chan_t[CF_MAX_CHANNELS] = {0};
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = order[i], k = reqs[r].channel, units = cf_chunks(p, reqs[r].n_cached);
        for (uint32_t u = split[r]; u < units; u++)
            chan_t[k] +=
                cost_of(p, m, &channels[k], CF_MODE_TOKEN, reqs[r].offset, reqs[r].n_cached, u)
                    .load;
        if (split[r] < units && chan_t[k] > done[r]) done[r] = chan_t[k];
    }
    for (uint32_t r = 0; r < n; r++) {
        sum += done[r];
        if (done[r] > worst) worst = done[r];
    }
    *makespan = worst;
    *mean = n ? sum / n : 0;
}

/* ---- prefix-only engines -------------------------------------------------------------------------- */

/* Loading chunks [0, x) of request r, then recomputing the tail [x, K) in one forward. */
static double prefix_load_s(const cf_params *p, const cf_channel *c, uint32_t n_cached,
                            uint32_t x) {
    double s = 0;
    for (uint32_t i = 0; i < x; i++)
        s += cf_load_s(c, (uint64_t)cf_chunk_tokens(p, n_cached, i) * p->n_layers *
                              p->kv_bytes_per_token_layer);
    return s;
}

static double prefix_tail_s(const cf_params *p, const cf_compute *m, const cf_request *q,
                            uint32_t x) {
    uint64_t first = (uint64_t)x * p->chunk_tokens;
    return first >= q->n_cached ? 0 : cf_forward_s(m, q->offset + first, q->n_cached - first);
}

#define EXHAUSTIVE_MAX 20000.0 /* prefix plans searched exhaustively up to this many choices */

typedef struct pjob {
    uint32_t r;
    double tail;
} pjob;

static int by_tail_desc(const void *a, const void *b) {
    const pjob *x = a, *y = b;
    if (x->tail != y->tail) return x->tail > y->tail ? -1 : 1;
    return x->r < y->r ? -1 : x->r > y->r;
}

/* Each channel serves its requests' loads back to back, longest tail first (a job's tail runs after
 * its loads, in parallel with others: Jackson's rule minimises the latest finish). */
static double prefix_eval(const cf_params *p, const cf_compute *m, const cf_channel *channels,
                          const cf_request *reqs, uint32_t n, const uint32_t *x, pjob *jobs,
                          double *done, double *mean) {
    for (uint32_t r = 0; r < n; r++) jobs[r] = (pjob){r, prefix_tail_s(p, m, &reqs[r], x[r])};
    qsort(jobs, n, sizeof *jobs, by_tail_desc);
    double chan_t[CF_MAX_CHANNELS] = {0}, worst = 0, sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t r = jobs[i].r, k = reqs[r].channel;
        chan_t[k] += prefix_load_s(p, &channels[k], reqs[r].n_cached, x[r]);
        double d = (x[r] ? chan_t[k] : 0) + jobs[i].tail;
        if (done) done[r] = d;
        sum += d;
        if (d > worst) worst = d;
    }
    if (mean) *mean = n ? sum / n : 0;
    return worst;
}

/* Improve x one request at a time while the batch gains (makespan first, then mean finish). */
static double prefix_descend(const cf_params *p, const cf_compute *m, const cf_channel *channels,
                             const cf_request *reqs, uint32_t n, uint32_t *x, pjob *jobs,
                             double *mean) {
    double span = prefix_eval(p, m, channels, reqs, n, x, jobs, NULL, mean);
    for (int pass = 0, improved = 1; improved && pass < 32; pass++) {
        improved = 0;
        for (uint32_t r = 0; r < n; r++) {
            uint32_t keep = x[r], k = cf_chunks(p, reqs[r].n_cached);
            for (uint32_t v = 0; v <= k; v++) {
                if (v == keep) continue;
                x[r] = v;
                double mn = 0, s = prefix_eval(p, m, channels, reqs, n, x, jobs, NULL, &mn);
                if (s < span - 1e-12 || (s <= span + 1e-12 && mn < *mean - 1e-12)) {
                    span = s, *mean = mn, keep = v, improved = 1;
                }
            }
            x[r] = keep;
        }
    }
    return span;
}

double cf_plan_prefix(const cf_params *p, const cf_compute *m, const cf_channel *channels,
                      uint32_t n_channels, const cf_request *reqs, uint32_t n,
                      uint32_t *load_chunks, double *done_s) {
    if (!p || !m || !channels || n_channels == 0 || n_channels > CF_MAX_CHANNELS ||
        p->chunk_tokens == 0)
        return -1;
    for (uint32_t r = 0; r < n; r++)
        if (reqs[r].channel >= n_channels) return -1;
    size_t count = n ? n : 1;
    pjob *jobs = malloc(count * sizeof *jobs);
    uint32_t *x = malloc(count * sizeof *x);
    if (!jobs || !x) {
        free(jobs);
        free(x);
        return -1;
    }
    double best_span = DBL_MAX, best_mean = DBL_MAX;
    /* small batches: every choice (up to EXHAUSTIVE_MAX of them) */
    double combos = 1;
    for (uint32_t r = 0; r < n; r++) combos *= cf_chunks(p, reqs[r].n_cached) + 1.0;
    if (combos <= EXHAUSTIVE_MAX) {
        memset(x, 0, count * sizeof *x);
        for (;;) {
            double mean = 0, span = prefix_eval(p, m, channels, reqs, n, x, jobs, NULL, &mean);
            if (span < best_span - 1e-12 ||
                (span <= best_span + 1e-12 && mean < best_mean - 1e-12)) {
                best_span = span, best_mean = mean;
                memcpy(load_chunks, x, n * sizeof *x);
            }
            uint32_t r = 0;
            while (r < n && x[r] == cf_chunks(p, reqs[r].n_cached)) x[r++] = 0;
            if (r == n) break;
            x[r]++;
        }
    }
    /* larger ones: local descent from three starts (each request's own best, load nothing, load
     * everything); the best end wins */
    for (int start = 0; start < 3 && combos > EXHAUSTIVE_MAX; start++) {
        for (uint32_t r = 0; r < n; r++) {
            uint32_t k = cf_chunks(p, reqs[r].n_cached), pick = start == 1 ? 0 : k;
            if (start == 0) {
                double best_t = DBL_MAX;
                for (uint32_t v = 0; v <= k; v++) {
                    double t = prefix_load_s(p, &channels[reqs[r].channel], reqs[r].n_cached, v) +
                               prefix_tail_s(p, m, &reqs[r], v);
                    if (t < best_t) best_t = t, pick = v;
                }
            }
            x[r] = pick;
        }
        double mean = 0, span = prefix_descend(p, m, channels, reqs, n, x, jobs, &mean);
        if (span < best_span - 1e-12 || (span <= best_span + 1e-12 && mean < best_mean - 1e-12)) {
            best_span = span, best_mean = mean;
            memcpy(load_chunks, x, n * sizeof *x);
        }
    }
    double span = prefix_eval(p, m, channels, reqs, n, load_chunks, jobs, done_s, NULL);
    free(jobs);
    free(x);
    return span;
}
