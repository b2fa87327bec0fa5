/* test_cacheflow.c - the CacheFlow restore planner (schedulers/cacheflow): one-request splits against
 * brute force and the closed forms, the batch scheduler's invariants and its gap to a brute-force
 * oracle on small batches, and the prefix-only planner against brute force. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/cacheflow/cacheflow.h"

/* xorshift, so every run draws the same instances */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(double lo, double hi) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

/* A random but plausible model: an 8B-class model on one GPU against a 1..100 Gbit/s tier. */
static void random_model(cf_params *p, cf_compute *m, cf_channel *c) {
    memset(p, 0, sizeof *p);
    p->chunk_tokens = (uint32_t)(uniform(0, 1) < 0.5 ? 256 : 512);
    p->n_layers = (uint32_t)uniform(8, 64);
    p->kv_bytes_per_token_layer = (uint64_t)uniform(1024, 8192);
    p->l_delta = 1; /* token mode unless a test says otherwise */
    m->fix_s = uniform(0.0005, 0.02);
    m->lin_s_per_token = uniform(5e-6, 6e-5);
    m->att_s_per_token2 = uniform(1e-11, 2e-9);
    c->lat_s = uniform(0, 0.002);
    c->bytes_per_s = uniform(1.25e8, 1.25e10);
}

/* max(recompute [0, k), load [k, K)) straight from the definitions. */
static double split_time(const cf_params *p, const cf_compute *m, const cf_channel *c, uint32_t n,
                         uint32_t k) {
    double a = 0, d = 0;
    uint32_t units = cf_chunks(p, n);
    for (uint32_t i = 0; i < units; i++) {
        uint32_t tok = cf_chunk_tokens(p, n, i);
        if (i < k)
            a += cf_forward_s(m, (uint64_t)i * p->chunk_tokens, tok);
        else
            d += c->lat_s +
                 (double)tok * p->n_layers * (double)p->kv_bytes_per_token_layer / c->bytes_per_s;
    }
    return a > d ? a : d;
}

START_TEST(the_token_split_is_the_brute_force_optimum_and_never_worse_than_either_pure_plan) {
    for (int trial = 0; trial < 2000; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel c;
        random_model(&p, &m, &c);
        uint32_t n = (uint32_t)uniform(1, 40000);
        cf_split s = cf_token_split(&p, &m, &c, n);
        uint32_t k = cf_chunks(&p, n);
        ck_assert_uint_eq(s.units, k);
        ck_assert_uint_le(s.split, k);
        double best = INFINITY;
        for (uint32_t j = 0; j <= k; j++) best = fmin(best, split_time(&p, &m, &c, n, j));
        ck_assert_msg(fabs(s.total_s - best) <= 1e-9 * best, "trial %d: %.9g vs brute force %.9g",
                      trial, s.total_s, best);
        ck_assert_msg(fabs(split_time(&p, &m, &c, n, s.split) - s.total_s) <= 1e-9 * best,
                      "split %u", s.split);
        double recompute = split_time(&p, &m, &c, n, k), load = split_time(&p, &m, &c, n, 0);
        ck_assert(s.total_s <= fmin(recompute, load) * (1 + 1e-12));
    }
}
END_TEST

START_TEST(the_layer_split_meets_the_closed_form_within_one_layer) {
    for (int trial = 0; trial < 2000; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel c;
        random_model(&p, &m, &c);
        uint32_t n = (uint32_t)uniform(1, 40000);
        cf_split s = cf_layer_split(&p, &m, &c, n);
        double tc = cf_forward_s(&m, 0, n);
        double tio = p.n_layers * cf_load_s(&c, (uint64_t)n * p.kv_bytes_per_token_layer);
        double closed = tc * tio / (tc + tio);
        ck_assert_uint_eq(s.units, p.n_layers);
        ck_assert_msg(fabs(s.total_s - closed) <= fmax(tc, tio) / p.n_layers * (1 + 1e-9),
                      "trial %d: %.6g vs Tc*Tio/(Tc+Tio) %.6g", trial, s.total_s, closed);
        ck_assert(s.total_s <= fmin(tc, tio) * (1 + 1e-12));
        ck_assert(s.total_s >= fmin(tc, tio) / 2 * (1 - 1e-12) - fmax(tc, tio) / p.n_layers);
    }
}
END_TEST

START_TEST(a_slow_tier_recomputes_everything_and_a_fast_one_loads_everything) {
    cf_params p;
    cf_compute m;
    cf_channel c;
    random_model(&p, &m, &c);
    uint32_t n = 20000, k = cf_chunks(&p, n);
    c.lat_s = 0;
    c.bytes_per_s = 1; /* a byte a second */
    cf_split s = cf_token_split(&p, &m, &c, n);
    ck_assert_uint_eq(s.split, k);
    ck_assert(fabs(s.total_s - split_time(&p, &m, &c, n, k)) < 1e-12);
    c.bytes_per_s = 1e18;
    s = cf_token_split(&p, &m, &c, n);
    ck_assert_uint_eq(s.split, 0);
    /* mode: l_delta decides when set; with 0 the faster predicted mode wins */
    c.bytes_per_s = 1e9;
    p.l_delta = 30000;
    ck_assert_int_eq(cf_best_split(&p, &m, &c, n).mode, CF_MODE_LAYER);
    p.l_delta = 1000;
    ck_assert_int_eq(cf_best_split(&p, &m, &c, n).mode, CF_MODE_TOKEN);
    p.l_delta = 0;
    cf_split t = cf_token_split(&p, &m, &c, n), l = cf_layer_split(&p, &m, &c, n),
             b = cf_best_split(&p, &m, &c, n);
    ck_assert(b.total_s == fmin(t.total_s, l.total_s));
}
END_TEST

START_TEST(stages_with_their_own_io_and_free_boundaries_divide_the_time) {
    for (int trial = 0; trial < 200; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel c;
        random_model(&p, &m, &c);
        p.n_layers = 32;
        p.l_delta = 0;
        uint32_t n = (uint32_t)uniform(2000, 30000);
        double one = cf_staged_s(&p, &m, &c, n, 1, 0, 0);
        ck_assert(fabs(one - cf_best_split(&p, &m, &c, n).total_s) < 1e-12);
        for (uint32_t s = 2; s <= 4; s *= 2) {
            double staged = cf_staged_s(&p, &m, &c, n, s, 0, 0);
            /* the one-stage time over S, up to one unit of slack (integral splits) */
            ck_assert_msg(staged <=
                              one / s * 1.02 + cf_forward_s(&m, 0, n) / p.n_layers +
                                  cf_load_s(&c, 512ull * p.n_layers * p.kv_bytes_per_token_layer),
                          "S=%u: %.6g vs %.6g", s, staged, one / s);
            /* sharing the channel or paying for boundaries can only be slower */
            ck_assert(cf_staged_s(&p, &m, &c, n, s, 0, 1) >= staged - 1e-12);
            ck_assert(cf_staged_s(&p, &m, &c, n, s, 8192, 0) >= staged - 1e-12);
        }
    }
}
END_TEST

/* The per-stage objective straight from the definition in cacheflow.h: boundaries read first, in stage
 * order, then every loaded layer; each stage computes from its boundary's arrival. */
static double stage_choice_time(const cf_params *p, const cf_compute *m, const cf_channel *c,
                                const cf_stages *st, uint64_t offset, uint32_t n,
                                const uint32_t *r) {
    double boundary = cf_load_s(c, (uint64_t)n * st->boundary_bytes_per_token);
    double layer = cf_load_s(c, (uint64_t)n * p->kv_bytes_per_token_layer);
    double lc = cf_forward_s(m, offset, n) / p->n_layers, comp = 0;
    uint32_t reads = 0, loaded = 0;
    for (uint32_t s = 0; s < st->n_stages; s++) {
        uint32_t end = s + 1 < st->n_stages ? st->first_layer[s + 1] : p->n_layers;
        loaded += end - st->first_layer[s] - r[s];
        if (r[s] == 0) continue;
        double start = s ? (double)++reads * boundary : 0.0;
        comp = fmax(comp, start + (double)r[s] * lc);
    }
    return fmax((double)reads * boundary + (double)loaded * layer, comp);
}

/* The same with every boundary read whatever the split (read_all_boundaries): stage s starts at
 * s * boundary, the reads end at (S - 1) * boundary + loaded * layer. */
static double stage_choice_time_all(const cf_params *p, const cf_compute *m, const cf_channel *c,
                                    const cf_stages *st, uint64_t offset, uint32_t n,
                                    const uint32_t *r) {
    double boundary = cf_load_s(c, (uint64_t)n * st->boundary_bytes_per_token);
    double layer = cf_load_s(c, (uint64_t)n * p->kv_bytes_per_token_layer);
    double lc = cf_forward_s(m, offset, n) / p->n_layers, comp = 0;
    uint32_t loaded = 0;
    for (uint32_t s = 0; s < st->n_stages; s++) {
        uint32_t end = s + 1 < st->n_stages ? st->first_layer[s + 1] : p->n_layers;
        loaded += end - st->first_layer[s] - r[s];
        if (r[s]) comp = fmax(comp, (s ? (double)s * boundary : 0.0) + (double)r[s] * lc);
    }
    return fmax((double)(st->n_stages - 1) * boundary + (double)loaded * layer, comp);
}

/* Random stages over p->n_layers: n_stages of them, first layers strictly increasing from 0. */
static void random_stages(const cf_params *p, cf_stages *st, uint32_t max_stages) {
    memset(st, 0, sizeof *st);
    uint32_t most = p->n_layers < max_stages ? p->n_layers : max_stages;
    st->n_stages = 1 + (uint32_t)uniform(0, most);
    if (st->n_stages > most) st->n_stages = most;
    for (;;) { /* distinct sorted cut points in 1..L-1 */
        uint32_t cuts = 0;
        for (uint32_t s = 1; s < st->n_stages; s++)
            st->first_layer[s] = 1 + (uint32_t)uniform(0, p->n_layers - 1);
        for (uint32_t a = 1; a < st->n_stages; a++)
            for (uint32_t b = a + 1; b < st->n_stages; b++)
                if (st->first_layer[b] < st->first_layer[a]) {
                    uint32_t t = st->first_layer[a];
                    st->first_layer[a] = st->first_layer[b];
                    st->first_layer[b] = t;
                }
        for (uint32_t s = 1; s < st->n_stages; s++)
            cuts += st->first_layer[s] > st->first_layer[s - 1];
        if (cuts == st->n_stages - 1) break;
    }
    double kv = (double)p->kv_bytes_per_token_layer; /* from 1/64 of a layer's KV to 16 times it */
    st->boundary_bytes_per_token = uniform(0, 1) < 0.05 ? 0 : (uint64_t)(kv * exp2(uniform(-6, 4)));
}

/* A second exact oracle for stages too deep for brute force: per set of boundary-reading stages (their
 * starts then fixed, each at least one layer), the least latest compute end for a total of R layers
 * comes from adding layers one at a time to the stage that would finish it first; scan R upward until
 * compute reaches the reads. Returns the optimum and the least total recompute reaching it. */
static double stage_split_by_subsets(const cf_params *p, const cf_compute *m, const cf_channel *c,
                                     const cf_stages *st, uint64_t offset, uint32_t n,
                                     uint32_t *least_total) {
    double boundary = cf_load_s(c, (uint64_t)n * st->boundary_bytes_per_token);
    double layer = cf_load_s(c, (uint64_t)n * p->kv_bytes_per_token_layer);
    double lc = cf_forward_s(m, offset, n) / p->n_layers, best = INFINITY;
    uint32_t S = st->n_stages, layers[CF_MAX_STAGES];
    for (uint32_t s = 0; s < S; s++)
        layers[s] = (s + 1 < S ? st->first_layer[s + 1] : p->n_layers) - st->first_layer[s];
    for (uint32_t mask = 0; mask < 1u << (S - 1); mask++) {
        uint32_t r[CF_MAX_STAGES] = {0}, total = 0, reads = 0;
        double start[CF_MAX_STAGES] = {0};
        for (uint32_t s = 1; s < S; s++)
            if (mask >> (s - 1) & 1) r[s] = 1, total++, start[s] = (double)++reads * boundary;
        for (;;) {
            double t = stage_choice_time(p, m, c, st, offset, n, r), comp = 0;
            if (t < best || (t == best && total < *least_total)) best = t, *least_total = total;
            for (uint32_t s = 0; s < S; s++)
                if (r[s]) comp = fmax(comp, start[s] + (double)r[s] * lc);
            if (comp >= (double)reads * boundary + (double)(p->n_layers - total) * layer) break;
            uint32_t pick = S;
            for (uint32_t s = 0; s < S; s++)
                if (r[s] < layers[s] && (s == 0 || r[s]) &&
                    (pick == S ||
                     start[s] + (double)(r[s] + 1) * lc < start[pick] + (double)(r[pick] + 1) * lc))
                    pick = s;
            if (pick == S) break;
            r[pick]++, total++;
        }
    }
    return best;
}

START_TEST(the_stage_split_is_the_brute_force_optimum) {
    int models = 0, with_boundary = 0, with_stage0 = 0, beats_one = 0;
    uint32_t most_stages = 0;
    for (int trial = 0; trial < 600; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel c;
        random_model(&p, &m, &c);
        int wide =
            trial >= 400; /* the last third: up to CF_MAX_STAGES stages over up to 16 layers */
        p.n_layers = wide ? (uint32_t)uniform(5, 17) : (uint32_t)uniform(2, 10);
        cf_stages st;
        random_stages(&p, &st, wide ? CF_MAX_STAGES : 4);
        uint32_t n = (uint32_t)uniform(1, 40000);
        uint64_t offset = uniform(0, 1) < 0.5 ? 0 : (uint64_t)uniform(0, 20000);
        uint32_t got[CF_MAX_STAGES];
        double t = cf_stage_split(&p, &m, &c, &st, offset, n, got);
        ck_assert_msg(t >= 0, "trial %d: refused", trial);
        /* every recompute vector */
        uint32_t layers[CF_MAX_STAGES] = {0}, r[CF_MAX_STAGES] = {0};
        for (uint32_t s = 0; s < st.n_stages; s++)
            layers[s] =
                (s + 1 < st.n_stages ? st.first_layer[s + 1] : p.n_layers) - st.first_layer[s];
        double best = INFINITY, best_all = INFINITY;
        uint32_t least = 0, least_all = 0; /* the least total recompute over the optimal vectors */
        cf_stages all = st;
        all.read_all_boundaries = 1;
        for (;;) {
            double v = stage_choice_time(&p, &m, &c, &st, offset, n, r);
            double va = stage_choice_time_all(&p, &m, &c, &st, offset, n, r);
            uint32_t total = 0;
            for (uint32_t s = 0; s < st.n_stages; s++) total += r[s];
            if (v < best || (v == best && total < least)) best = v, least = total;
            if (va < best_all || (va == best_all && total < least_all))
                best_all = va, least_all = total;
            uint32_t s = 0;
            while (s < st.n_stages && r[s] == layers[s]) r[s++] = 0;
            if (s == st.n_stages) break;
            r[s]++;
        }
        uint32_t ref_least = 0;
        ck_assert(stage_split_by_subsets(&p, &m, &c, &st, offset, n, &ref_least) == best &&
                  ref_least == least);
        ck_assert_msg(fabs(t - best) <= 1e-9 * best,
                      "trial %d (%u stages, %u layers): %.12g vs brute force %.12g", trial,
                      st.n_stages, p.n_layers, t, best);
        uint32_t got_total = 0;
        for (uint32_t s = 0; s < st.n_stages; s++) {
            ck_assert_uint_le(got[s], layers[s]);
            got_total += got[s];
        }
        ck_assert_msg(t != best || got_total == least,
                      "trial %d: %u layers recomputed, %u would do", trial, got_total, least);
        ck_assert_msg(fabs(stage_choice_time(&p, &m, &c, &st, offset, n, got) - t) <= 1e-12 * t,
                      "trial %d: the returned choice does not achieve the returned time", trial);
        /* never worse than loading everything or than splitting stage 0 alone */
        uint32_t zero[CF_MAX_STAGES] = {0};
        ck_assert(t <= stage_choice_time(&p, &m, &c, &st, offset, n, zero) * (1 + 1e-12));
        double stage0 = INFINITY;
        for (uint32_t k = 0; k <= layers[0]; k++) {
            memset(r, 0, sizeof r);
            r[0] = k;
            stage0 = fmin(stage0, stage_choice_time(&p, &m, &c, &st, offset, n, r));
        }
        ck_assert(t <= stage0 * (1 + 1e-12));
        /* every boundary read (the connector's model): the same exactness, ties and achievement */
        uint32_t got_all[CF_MAX_STAGES], all_total = 0;
        double ta = cf_stage_split(&p, &m, &c, &all, offset, n, got_all);
        for (uint32_t s = 0; s < st.n_stages; s++) all_total += got_all[s];
        ck_assert_msg(fabs(ta - best_all) <= 1e-9 * best_all,
                      "trial %d (all boundaries): %.12g vs brute force %.12g", trial, ta, best_all);
        ck_assert_msg(ta != best_all || all_total == least_all,
                      "trial %d (all boundaries): %u layers, %u would do", trial, all_total,
                      least_all);
        ck_assert(fabs(stage_choice_time_all(&p, &m, &c, &st, offset, n, got_all) - ta) <=
                  1e-12 * ta);
        ck_assert(ta >= t * (1 - 1e-12)); /* reading more never helps */
        /* one stage: the layer two-pointer */
        cf_stages one = {.n_stages = 1, .boundary_bytes_per_token = st.boundary_bytes_per_token};
        uint32_t r1;
        double single = cf_stage_split(&p, &m, &c, &one, 0, n, &r1),
               layer = cf_layer_split(&p, &m, &c, n).total_s;
        ck_assert_msg(fabs(single - layer) <= 1e-9 * layer,
                      "trial %d: one stage %.12g, layer split %.12g", trial, single, layer);
        models++;
        int reads = 0;
        for (uint32_t s = 1; s < st.n_stages; s++) reads |= got[s] > 0;
        with_boundary += reads;
        with_stage0 += got[0] > 0;
        beats_one += t < stage0 * (1 - 1e-9);
        if (st.n_stages > most_stages) most_stages = st.n_stages;
    }
    printf("cacheflow stage split, %d models of 1-%u stages: optimal in all (brute force), %d read "
           "a boundary, "
           "%d recompute in stage 0, %d beat the best stage-0-only split\n",
           models, most_stages, with_boundary, with_stage0, beats_one);
    ck_assert_int_gt(with_boundary, 20); /* the boundary path is exercised, not only stage 0 */
    /* deep stages (up to 320 layers): against the subset oracle */
    int deep_boundary = 0;
    for (int trial = 0; trial < 200; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel c;
        random_model(&p, &m, &c);
        p.n_layers = (uint32_t)uniform(8, 321);
        cf_stages st;
        random_stages(&p, &st, CF_MAX_STAGES);
        uint32_t n = (uint32_t)uniform(1, 40000), got[CF_MAX_STAGES], least = 0, got_total = 0;
        uint64_t offset = (uint64_t)uniform(0, 20000);
        double t = cf_stage_split(&p, &m, &c, &st, offset, n, got);
        double best = stage_split_by_subsets(&p, &m, &c, &st, offset, n, &least);
        ck_assert_msg(fabs(t - best) <= 1e-9 * best,
                      "deep trial %d (%u stages, %u layers): %.12g vs %.12g", trial, st.n_stages,
                      p.n_layers, t, best);
        ck_assert(stage_choice_time(&p, &m, &c, &st, offset, n, got) == t);
        for (uint32_t s = 0; s < st.n_stages; s++)
            got_total += got[s], deep_boundary += s && got[s];
        ck_assert(t != best || got_total == least);
    }
    printf("cacheflow stage split, 200 deep models (8-320 layers, 1-%u stages): optimal in all "
           "(subset oracle), "
           "%d boundary reads\n",
           CF_MAX_STAGES, deep_boundary);
    /* nothing cached: nothing to do */
    cf_params p;
    cf_compute m;
    cf_channel c;
    random_model(&p, &m, &c);
    cf_stages st = {.n_stages = 2, .first_layer = {0, 4}, .boundary_bytes_per_token = 1024};
    uint32_t r[CF_MAX_STAGES] = {7, 7};
    ck_assert(cf_stage_split(&p, &m, &c, &st, 0, 0, r) == 0);
    ck_assert_uint_eq(r[0], 0);
    ck_assert_uint_eq(r[1], 0);
    /* bad arguments */
    ck_assert(cf_stage_split(NULL, &m, &c, &st, 0, 100, r) < 0);
    ck_assert(cf_stage_split(&p, NULL, &c, &st, 0, 100, r) < 0);
    ck_assert(cf_stage_split(&p, &m, NULL, &st, 0, 100, r) < 0);
    ck_assert(cf_stage_split(&p, &m, &c, NULL, 0, 100, r) < 0);
    ck_assert(cf_stage_split(&p, &m, &c, &st, 0, 100, NULL) < 0);
    cf_stages bad = st;
    bad.n_stages = 0;
    ck_assert(cf_stage_split(&p, &m, &c, &bad, 0, 100, r) < 0);
    bad.n_stages = CF_MAX_STAGES + 1;
    ck_assert(cf_stage_split(&p, &m, &c, &bad, 0, 100, r) < 0);
    bad = st;
    bad.first_layer[0] = 1;
    ck_assert(cf_stage_split(&p, &m, &c, &bad, 0, 100, r) < 0);
    bad = (cf_stages){.n_stages = 3, .first_layer = {0, 4, 4}};
    ck_assert(cf_stage_split(&p, &m, &c, &bad, 0, 100, r) < 0);
    bad = (cf_stages){.n_stages = 3, .first_layer = {0, 5, 3}};
    ck_assert(cf_stage_split(&p, &m, &c, &bad, 0, 100, r) < 0);
    bad = (cf_stages){.n_stages = 2, .first_layer = {0, p.n_layers}};
    ck_assert(cf_stage_split(&p, &m, &c, &bad, 0, 100, r) < 0);
    cf_params few = p;
    few.n_layers = 2;
    bad = (cf_stages){.n_stages = 3, .first_layer = {0, 1, 2}};
    ck_assert(cf_stage_split(&few, &m, &c, &bad, 0, 100, r) < 0);
    few.n_layers = 3;
    ck_assert(cf_stage_split(&few, &m, &c, &bad, 0, 100, r) >= 0);
}
END_TEST

/* ---- the batch scheduler ---------------------------------------------------------------------- */

#define MAX_B      8
#define MAX_EVENTS 4096

static double plan(const cf_params *p, const cf_compute *m, const cf_channel *ch, uint32_t nch,
                   const cf_request *reqs, uint32_t n, cf_plan *plans, cf_event *ev,
                   uint32_t *n_ev) {
    void *scratch = malloc(cf_batch_scratch_bytes(n));
    ck_assert_ptr_nonnull(scratch);
    double span = cf_plan_batch(p, m, ch, nch, reqs, n, scratch, plans, ev, MAX_EVENTS, n_ev);
    free(scratch);
    ck_assert(span >= 0);
    ck_assert_uint_le(*n_ev, MAX_EVENTS);
    return span;
}

/* Every unit exactly once; recomputed units a prefix, loaded ones a suffix; a channel moves one unit
 * at a time; forwards do not overlap; a request is done when its last unit is. */
static void check_invariants(const cf_request *reqs, uint32_t n, const cf_plan *plans,
                             const cf_event *ev, uint32_t n_ev, uint32_t n_channels) {
    static uint8_t seen[MAX_B][512];
    memset(seen, 0, sizeof seen);
    double last[MAX_B] = {0};
    for (uint32_t i = 0; i < n_ev; i++) {
        const cf_event *e = &ev[i];
        ck_assert_uint_lt(e->request, n);
        ck_assert_uint_lt(e->unit, plans[e->request].units);
        ck_assert_msg(!seen[e->request][e->unit], "request %u unit %u claimed twice", e->request,
                      e->unit);
        seen[e->request][e->unit] = (uint8_t)(1 + e->loaded);
        ck_assert(e->end_s >= e->start_s);
        if (e->loaded) ck_assert_uint_eq(e->channel, reqs[e->request].channel);
        last[e->request] = fmax(last[e->request], e->end_s);
        for (uint32_t j = 0; j < i; j++) {
            const cf_event *f = &ev[j];
            int same_chan = e->loaded && f->loaded && e->channel == f->channel;
            int two_steps = !e->loaded && !f->loaded && e->step != f->step;
            if (same_chan || two_steps)
                ck_assert_msg(e->start_s >= f->end_s - 1e-12 || f->start_s >= e->end_s - 1e-12,
                              "overlap on %s", same_chan ? "a channel" : "the compute engine");
            if (!e->loaded && !f->loaded && e->step == f->step)
                ck_assert(e->start_s == f->start_s && e->end_s == f->end_s);
        }
    }
    for (uint32_t r = 0; r < n; r++) {
        for (uint32_t u = 0; u < plans[r].units; u++) {
            ck_assert_msg(seen[r][u], "request %u unit %u never restored", r, u);
            ck_assert_int_eq(seen[r][u],
                             u < plans[r].split ? 1 : 2); /* prefix recomputed, suffix loaded */
        }
        ck_assert(fabs(plans[r].done_s - last[r]) < 1e-12);
    }
    (void)n_channels;
}

START_TEST(a_single_request_plan_is_within_one_chunk_of_the_best_split) {
    static cf_event ev[MAX_EVENTS];
    for (int trial = 0; trial < 1000; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel c;
        random_model(&p, &m, &c);
        p.chunk_tokens = 512;
        cf_request r = {.n_cached = (uint32_t)uniform(1, 60000), .channel = 0};
        cf_plan pl;
        uint32_t n_ev = 0;
        double span = plan(&p, &m, &c, 1, &r, 1, &pl, ev, &n_ev);
        check_invariants(&r, 1, &pl, ev, n_ev, 1);
        cf_split best = cf_token_split(&p, &m, &c, r.n_cached);
        double unit =
            fmax(cf_forward_s(&m, (uint64_t)(best.units - 1) * p.chunk_tokens, p.chunk_tokens),
                 cf_load_s(&c, (uint64_t)p.chunk_tokens * p.n_layers * p.kv_bytes_per_token_layer));
        ck_assert_msg(span <= best.total_s + unit * (1 + 1e-9) && span >= best.total_s * (1 - 1e-9),
                      "trial %d: plan %.6g, best split %.6g, one chunk %.6g", trial, span,
                      best.total_s, unit);
    }
}
END_TEST

START_TEST(batches_over_several_channels_and_both_modes_keep_the_invariants) {
    static cf_event ev[MAX_EVENTS];
    for (int trial = 0; trial < 300; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel ch[3];
        random_model(&p, &m, &ch[0]);
        cf_params q;
        cf_compute m2;
        random_model(&q, &m2, &ch[1]);
        random_model(&q, &m2, &ch[2]);
        p.l_delta = trial % 2 ? 0 : 4096; /* per request by prediction, or by length */
        p.n_layers = (uint32_t)uniform(8, 40);
        p.priority = (cf_priority)(trial % CF_PRIO_COUNT);
        uint32_t n = (uint32_t)uniform(1, MAX_B + 1);
        cf_request reqs[MAX_B];
        for (uint32_t r = 0; r < n; r++)
            reqs[r] = (cf_request){.n_cached = (uint32_t)uniform(0, 40000),
                                   .channel = (uint32_t)uniform(0, 3)};
        cf_plan plans[MAX_B];
        uint32_t n_ev = 0;
        double span = plan(&p, &m, ch, 3, reqs, n, plans, ev, &n_ev);
        check_invariants(reqs, n, plans, ev, n_ev, 3);
        double worst = 0;
        for (uint32_t r = 0; r < n; r++) worst = fmax(worst, plans[r].done_s);
        ck_assert(span == worst);
    }
    /* a channel index out of range is refused */
    cf_params p;
    cf_compute m;
    cf_channel c;
    random_model(&p, &m, &c);
    cf_request bad = {.n_cached = 100, .channel = 1};
    cf_plan pl;
    char scratch[256];
    ck_assert(cf_plan_batch(&p, &m, &c, 1, &bad, 1, scratch, &pl, NULL, 0, NULL) < 0);
}
END_TEST

/* Every split vector and every service order of the one channel: the best makespan and mean finish. */
static void oracle(const cf_params *p, const cf_compute *m, const cf_channel *c,
                   const cf_request *reqs, uint32_t n, double *best_span, double *best_mean) {
    uint32_t split[4] = {0}, order[4], perm[24][4], n_perm = 0;
    uint32_t idx[4] = {0, 1, 2, 3};
    /* permutations of 0..n-1 (Heap's algorithm is overkill for n <= 4: filter 4-digit counters) */
    for (uint32_t a = 0; a < 256 && n_perm < 24; a++) {
        uint32_t used = 0, ok = 1;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t d = (a >> (2 * i)) & 3;
            if (d >= n || (used >> d & 1)) ok = 0;
            used |= 1u << d;
            idx[i] = d;
        }
        if (ok && (a >> (2 * n)) == 0) memcpy(perm[n_perm++], idx, sizeof idx);
    }
    *best_span = *best_mean = INFINITY;
    uint32_t units[4];
    for (uint32_t r = 0; r < n; r++) units[r] = cf_chunks(p, reqs[r].n_cached);
    for (;;) {
        for (uint32_t o = 0; o < n_perm; o++) {
            memcpy(order, perm[o], sizeof order);
            double span, mean, done[4];
            cf_evaluate_splits(p, m, c, reqs, n, split, order, &span, &mean, done);
            *best_span = fmin(*best_span, span);
            *best_mean = fmin(*best_mean, mean);
        }
        uint32_t r = 0;
        while (r < n && split[r] == units[r]) split[r++] = 0;
        if (r == n) break;
        split[r]++;
    }
}

START_TEST(small_batches_come_close_to_the_brute_force_oracle) {
    static cf_event ev[MAX_EVENTS];
    for (int prio = 0; prio < CF_PRIO_COUNT; prio++) {
        double sum_span = 0, sum_mean = 0, worst_span = 0, worst_mean = 0;
        int cases = 0;
        rng_state =
            0x1234567ull + (uint64_t)prio; /* the same instances for each rule would be fairer: */
        rng_state = 0x1234567ull;          /* so they are */
        for (int trial = 0; trial < 60; trial++) {
            cf_params p;
            cf_compute m;
            cf_channel c;
            random_model(&p, &m, &c);
            p.chunk_tokens = 512;
            p.priority = (cf_priority)prio;
            uint32_t n = 2 + (uint32_t)uniform(0, 3);
            cf_request reqs[4];
            for (uint32_t r = 0; r < n; r++)
                reqs[r] = (cf_request){.n_cached = (uint32_t)uniform(300, 3000), .channel = 0};
            double opt_span, opt_mean;
            oracle(&p, &m, &c, reqs, n, &opt_span, &opt_mean);
            cf_plan plans[4];
            uint32_t n_ev = 0;
            double span = plan(&p, &m, &c, 1, reqs, n, plans, ev, &n_ev);
            check_invariants(reqs, n, plans, ev, n_ev, 1);
            double mean = 0;
            for (uint32_t r = 0; r < n; r++) mean += plans[r].done_s / n;
            /* the oracle covers every plan the scheduler can make: nothing beats it */
            ck_assert_msg(span >= opt_span * (1 - 1e-9), "makespan %.9g below the optimum %.9g",
                          span, opt_span);
            ck_assert_msg(mean >= opt_mean * (1 - 1e-9), "mean %.9g below the optimum %.9g", mean,
                          opt_mean);
            sum_span += span / opt_span;
            sum_mean += mean / opt_mean;
            worst_span = fmax(worst_span, span / opt_span);
            worst_mean = fmax(worst_mean, mean / opt_mean);
            cases++;
        }
        printf(
            "cacheflow oracle, priority %s, %d batches of 2-4: makespan/opt mean %.3f worst %.3f; "
            "mean-finish/opt mean %.3f worst %.3f\n",
            cf_priority_name((cf_priority)prio), cases, sum_span / cases, worst_span,
            sum_mean / cases, worst_mean);
        ck_assert_msg(sum_span / cases <= 1.15, "average makespan gap %.3f", sum_span / cases);
        ck_assert_msg(worst_span <= 1.6, "worst makespan gap %.3f", worst_span);
    }
}
END_TEST

/* ---- prefix-only ------------------------------------------------------------------------------------ */

/* A range that starts late (its offset: tokens the engine already holds) costs more attention to
 * recompute, so the planners recompute no more of it and load no less, and finish no sooner. */
START_TEST(a_later_start_makes_recompute_costlier_and_plans_load_more) {
    int fewer = 0;
    for (int trial = 0; trial < 200; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel c;
        random_model(&p, &m, &c);
        p.l_delta = 1; /* token mode: the unit that moves is a chunk */
        uint32_t n = 2000 + (uint32_t)uniform(0, 8000);
        cf_request early = {n, 0, 0}, late = {n, 0, 16384};
        cf_plan a, b;
        cf_event ev[MAX_EVENTS];
        uint32_t n_ev;
        double ta = plan(&p, &m, &c, 1, &early, 1, &a, ev, &n_ev);
        double tb = plan(&p, &m, &c, 1, &late, 1, &b, ev, &n_ev);
        ck_assert_msg(b.split <= a.split + 1, "trial %d: %u chunks recomputed late, %u early",
                      trial, b.split, a.split);
        ck_assert(tb >= ta * (1 - 1e-9));
        fewer += b.split < a.split;
        uint32_t la = 0, lb = 0;
        ck_assert(cf_plan_prefix(&p, &m, &c, 1, &early, 1, &la, NULL) > 0);
        ck_assert(cf_plan_prefix(&p, &m, &c, 1, &late, 1, &lb, NULL) > 0);
        ck_assert_uint_ge(lb, la);
    }
    ck_assert_int_gt(fewer, 20); /* the offset changes plans, not only times */
}
END_TEST

START_TEST(the_prefix_plan_matches_brute_force_and_loads_nothing_from_a_slow_tier) {
    double gap_sum = 0, gap_worst = 0;
    int exact = 0;
    for (int trial = 0; trial < 200; trial++) {
        cf_params p;
        cf_compute m;
        cf_channel c;
        random_model(&p, &m, &c);
        p.chunk_tokens = 512;
        uint32_t n = 1 + (uint32_t)uniform(0, 3);
        cf_request reqs[3];
        uint32_t units[3];
        for (uint32_t r = 0; r < n; r++) {
            reqs[r] = (cf_request){.n_cached = (uint32_t)uniform(300, 4000), .channel = 0};
            units[r] = cf_chunks(&p, reqs[r].n_cached);
        }
        uint32_t x[3], best_x[3] = {0}, got[3];
        double done[3];
        double span = cf_plan_prefix(&p, &m, &c, 1, reqs, n, got, done);
        /* brute force over every load count, evaluated by the planner itself with fixed choices:
         * cf_plan_prefix with one choice per request is what it returns for a 1-choice space, so
         * compare against the model computed here */
        double best = INFINITY;
        memset(x, 0, sizeof x);
        for (;;) {
            /* channel order: longest tail first */
            double tails[3], loads[3];
            for (uint32_t r = 0; r < n; r++) {
                uint64_t first = (uint64_t)x[r] * p.chunk_tokens;
                tails[r] = first >= reqs[r].n_cached
                               ? 0
                               : cf_forward_s(&m, first, reqs[r].n_cached - first);
                loads[r] = 0;
                for (uint32_t i = 0; i < x[r]; i++)
                    loads[r] += cf_load_s(&c, (uint64_t)cf_chunk_tokens(&p, reqs[r].n_cached, i) *
                                                  p.n_layers * p.kv_bytes_per_token_layer);
            }
            uint32_t ord[3] = {0, 1, 2};
            for (uint32_t a = 0; a < n; a++)
                for (uint32_t b = a + 1; b < n; b++)
                    if (tails[ord[b]] > tails[ord[a]] ||
                        (tails[ord[b]] == tails[ord[a]] && ord[b] < ord[a])) {
                        uint32_t t = ord[a];
                        ord[a] = ord[b];
                        ord[b] = t;
                    }
            double t = 0, worst = 0;
            for (uint32_t i = 0; i < n; i++) {
                uint32_t r = ord[i];
                t += loads[r];
                worst = fmax(worst, (x[r] ? t : 0) + tails[r]);
            }
            if (worst < best) best = worst, memcpy(best_x, x, sizeof x);
            uint32_t r = 0;
            while (r < n && x[r] == units[r]) x[r++] = 0;
            if (r == n) break;
            x[r]++;
        }
        ck_assert_msg(span >= best * (1 - 1e-9), "trial %d: planner %.6g below brute force %.6g",
                      trial, span, best);
        gap_sum += span / best;
        gap_worst = fmax(gap_worst, span / best);
        exact += span <= best * (1 + 1e-9);
        for (uint32_t r = 0; r < n; r++) ck_assert(done[r] <= span + 1e-12);
    }
    printf("cacheflow prefix-only planner, 200 batches of 1-3: makespan/brute force mean %.4f "
           "worst %.4f, "
           "optimal in %d\n",
           gap_sum / 200, gap_worst, exact);
    ck_assert_msg(gap_sum / 200 <= 1.005 && gap_worst <= 1.06, "gap mean %.4f worst %.4f",
                  gap_sum / 200, gap_worst);
    /* a tier slower than recompute: nothing is loaded */
    cf_params p;
    cf_compute m;
    cf_channel c;
    random_model(&p, &m, &c);
    c.bytes_per_s = 1e3;
    cf_request reqs[2] = {{.n_cached = 5000, .channel = 0}, {.n_cached = 3000, .channel = 0}};
    uint32_t got[2];
    ck_assert(cf_plan_prefix(&p, &m, &c, 1, reqs, 2, got, NULL) > 0);
    ck_assert_uint_eq(got[0], 0);
    ck_assert_uint_eq(got[1], 0);
    /* a very fast one: everything is */
    c.bytes_per_s = 1e15;
    c.lat_s = 0;
    ck_assert(cf_plan_prefix(&p, &m, &c, 1, reqs, 2, got, NULL) > 0);
    ck_assert_uint_eq(got[0], cf_chunks(&p, 5000));
    ck_assert_uint_eq(got[1], cf_chunks(&p, 3000));
}
END_TEST

int main(void) {
    Suite *s = suite_create("cacheflow");
    TCase *one = tcase_create("one request");
    tcase_add_test(
        one, the_token_split_is_the_brute_force_optimum_and_never_worse_than_either_pure_plan);
    tcase_add_test(one, the_layer_split_meets_the_closed_form_within_one_layer);
    tcase_add_test(one, a_slow_tier_recomputes_everything_and_a_fast_one_loads_everything);
    tcase_add_test(one, stages_with_their_own_io_and_free_boundaries_divide_the_time);
    tcase_add_test(one, the_stage_split_is_the_brute_force_optimum);
    suite_add_tcase(s, one);
    TCase *batch = tcase_create("batch");
    tcase_set_timeout(batch, 120);
    tcase_add_test(batch, a_single_request_plan_is_within_one_chunk_of_the_best_split);
    tcase_add_test(batch, batches_over_several_channels_and_both_modes_keep_the_invariants);
    tcase_add_test(batch, small_batches_come_close_to_the_brute_force_oracle);
    tcase_add_test(batch, the_prefix_plan_matches_brute_force_and_loads_nothing_from_a_slow_tier);
    tcase_add_test(batch, a_later_start_makes_recompute_costlier_and_plans_load_more);
    suite_add_tcase(s, batch);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
