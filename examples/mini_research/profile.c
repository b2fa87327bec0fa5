/* profile.c - `kvs-mini-research --profile FILE`: measure this engine's recompute cost and the load cost
 * of the configured connector on this machine and write them as a restore profile (the YAML
 * `restore.profile` names, docs/cacheflow.md). */
#include "profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPEATS 3

/* Least squares for y = X b with k <= 3 columns (normal equations, Gaussian elimination). */
static int least_squares(const double *x, const double *y, int n, int k, double *b) {
    double a[3][4] = {{0}};
    for (int i = 0; i < n; i++)
        for (int r = 0; r < k; r++) {
            for (int c = 0; c < k; c++) a[r][c] += x[i * k + r] * x[i * k + c];
            a[r][k] += x[i * k + r] * y[i];
        }
    for (int p = 0; p < k; p++) {
        int best = p;
        for (int r = p + 1; r < k; r++)
            if (a[r][p] * a[r][p] > a[best][p] * a[best][p]) best = r;
        if (a[best][p] == 0) return -1;
        for (int c = 0; c <= k; c++) {
            double t = a[p][c];
            a[p][c] = a[best][c];
            a[best][c] = t;
        }
        for (int r = 0; r < k; r++) {
            if (r == p) continue;
            double f = a[r][p] / a[p][p];
            for (int c = p; c <= k; c++) a[r][c] -= f * a[p][c];
        }
    }
    for (int r = 0; r < k; r++) b[r] = a[r][k] / a[r][r];
    return 0;
}

static double clamp0(double v) {
    return v > 0 ? v : 0;
}

/* One forward over n tokens at offset o, through every layer: the time of the fastest of REPEATS. */
static double time_forward(engine *e, uint64_t o, int n) {
    const int n_layers = model_config_of(e->m)->n_layers;
    double best = 1e30;
    for (int k = 0; k < REPEATS; k++) {
        double t0 = engine_now_ms() / 1e3;
        model_embed(e->m, e->s, e->tokens + o, n);
        for (int l = 0; l < n_layers; l++)
            model_layer(e->m, e->s, e->kv, (uint32_t)l, e->table, o, n);
        double t = engine_now_ms() / 1e3 - t0;
        if (t < best) best = t;
    }
    return best;
}

/* Restore the first `tokens` tokens of the stored prompt through the hooks (no engine prefix cache,
 * nothing computed): seconds from build_meta to the last layer landed, and the chunks it loaded. */
static int time_load(engine *e, uint64_t tokens, int serial, double *secs, uint64_t *chunks,
                     uint64_t *bytes, int *tier) {
    connector *c = e->conn;
    char id[64];
    snprintf(id, sizeof id, "profile/load%d", serial);
    uint64_t n = tokens + 1; /* one token left to compute, so the whole prefix can be offered */
    kvs_lookup_result lr = {.struct_size = sizeof lr};
    kvs_status st = c->api->lookup(c->h, id, e->tokens, n, 0, &lr);
    uint32_t n_blocks = (uint32_t)((n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    if (st != KVS_OK || lr.unknown_yet || lr.n_hit_tokens == 0) {
        mini_err("profile: lookup of the stored prompt found %llu tokens (%s)\n",
                 (unsigned long long)lr.n_hit_tokens,
                 st != KVS_OK ? c->api->last_error(c->h) : "no hit");
        return -1;
    }
    if (kvcache_alloc(e->kv, n_blocks, e->table) != 0) {
        mini_err("profile: no pages for %llu tokens\n", (unsigned long long)n);
        return -1;
    }
    kvs_stats before = {.struct_size = sizeof before}, after = {.struct_size = sizeof after};
    c->api->stats(c->h, &before);
    kvs_step_request r = {.req_id = id,
                          .tokens = e->tokens,
                          .n_tokens = n,
                          .block_ids = e->table,
                          .n_block_ids = n_blocks,
                          .n_computed = lr.n_hit_tokens,
                          .n_scheduled = 0};
    uint64_t n_bad = 0;
    int keep = 0;
    int rc = -1;
    st = c->api->on_alloc(c->h, id, e->table, n_blocks, lr.n_hit_tokens);
    double t0 = engine_now_ms() / 1e3;
    if (st == KVS_OK && connector_step_meta(c, &r, 1) != 0) {
        kvcache_release(e->kv, e->table, n_blocks, e->tokens, 0);
        return -1;
    }
    if (st == KVS_OK) st = c->api->start_load(c->h);
    for (int l = 0; st == KVS_OK && l < model_config_of(e->m)->n_layers; l++)
        st = c->api->wait_layer_load(c->h, (uint32_t)l);
    *secs = engine_now_ms() / 1e3 - t0;
    if (st == KVS_OK) st = c->api->wait_save(c->h);
    if (st == KVS_OK) st = c->api->load_error_blocks(c->h, c->errors, c->errors_cap, &n_bad);
    if (st == KVS_OK) st = c->api->stats(c->h, &after);
    if (st == KVS_OK) st = c->api->request_finished(c->h, id, &keep);
    if (st != KVS_OK) {
        mini_err("profile: %s\n", c->api->last_error(c->h));
    } else if (n_bad) {
        mini_err("profile: %llu blocks failed to load\n", (unsigned long long)n_bad);
    } else {
        *chunks = after.chunks_loaded - before.chunks_loaded;
        *bytes = after.bytes_loaded - before.bytes_loaded;
        *tier = -1;
        rc = 0;
        for (uint32_t t = 0; t < after.n_tiers && t < KVS_STATS_MAX_TIERS; t++) {
            if (after.tier_chunks_loaded[t] == before.tier_chunks_loaded[t]) continue;
            if (*tier >= 0) {
                mini_err(
                    "profile: loads came from more than one tier; profile a config with one\n");
                rc = -1;
            }
            *tier = (int)t;
        }
    }
    kvcache_release(e->kv, e->table, n_blocks, e->tokens, 0);
    return rc;
}

/* What the profile fitted. */
typedef struct fit {
    double b[3];  /* compute: fixed, per token, attention per token^2 (seconds) */
    double worst; /* the compute fit's worst relative error */
    int m;        /* forwards fitted */
    double lb[2]; /* loads: per restore, per chunk (seconds) */
    int lm;       /* restores fitted */
    int tier;     /* the index of the tier that served them */
    uint64_t bytes_per_chunk;
} fit;

/* Compute: forwards of n tokens at offset o; fit fixed + per-token + attention coefficients. */
static int fit_compute(engine *e, uint64_t max_tokens, fit *f) {
    uint32_t n_blocks = (uint32_t)((max_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    if (kvcache_alloc(e->kv, n_blocks, e->table) != 0) {
        mini_err("profile: no pages for %llu tokens\n", (unsigned long long)max_tokens);
        return -1;
    }
    double x[64 * 3], y[64];
    int m = 0;
    for (int ni = 0; ni < 4; ni++) {
        int n = e->prefill_chunk >> (2 * (3 - ni)); /* chunk/64, chunk/16, chunk/4, chunk */
        if (n < 1) n = 1;
        /* a profile shorter than a prefill chunk times forwards of at most its own length: the
         * offsets below count down from max_tokens - n */
        if ((uint64_t)n > max_tokens) n = (int)max_tokens;
        for (int oi = 0; oi < 4; oi++) {
            uint64_t o = (max_tokens - (uint64_t)n) * (uint64_t)oi / 3;
            x[m * 3] = 1;
            x[m * 3 + 1] = n;
            x[m * 3 + 2] = (double)n * ((double)o + (double)(n + 1) / 2);
            y[m++] = time_forward(e, o, n);
        }
    }
    kvcache_release(e->kv, e->table, n_blocks, e->tokens, 0);
    /* relative least squares: each forward weighs the same whatever its size */
    double wx[64 * 3], wy[64];
    for (int i = 0; i < m; i++) {
        for (int k = 0; k < 3; k++) wx[i * 3 + k] = x[i * 3 + k] / y[i];
        wy[i] = 1;
    }
    if (least_squares(wx, wy, m, 3, f->b) != 0) {
        mini_err("profile: the compute fit is singular\n");
        return -1;
    }
    f->m = m;
    f->worst = 0;
    for (int i = 0; i < m; i++) {
        double at =
            clamp0(f->b[0]) + clamp0(f->b[1]) * x[i * 3 + 1] + clamp0(f->b[2]) * x[i * 3 + 2];
        double err = at > y[i] ? at / y[i] - 1 : y[i] / at - 1;
        if (err > f->worst) f->worst = err;
    }
    return 0;
}

/* Loads: store the prompt once, then restore prefixes of it through the hooks; fit a cost per
 * restore and per chunk. */
static int fit_loads(engine *e, uint64_t max_tokens, fit *f) {
    turn_result tr;
    if (engine_serve(e, "profile/store", max_tokens, 1, &tr, NULL, NULL) != 0) return -1;
    double lx[32 * 2], ly[32];
    int lm = 0, serial = 0;
    f->tier = -1;
    f->bytes_per_chunk = 0;
    for (int k = 1; k <= 4; k++) {
        uint64_t tokens = max_tokens * (uint64_t)k / 4 - 1;
        double best = 1e30;
        uint64_t chunks = 0, bytes = 0;
        for (int r = 0; r < REPEATS; r++) {
            double t;
            int got_tier;
            if (time_load(e, tokens, serial++, &t, &chunks, &bytes, &got_tier) != 0) return -1;
            if (chunks) f->bytes_per_chunk = bytes / chunks;
            if (got_tier >= 0) f->tier = got_tier;
            if (t < best) best = t;
        }
        lx[lm * 2] = 1;
        lx[lm * 2 + 1] = (double)chunks;
        ly[lm++] = best;
    }
    f->lm = lm;
    double *lb = f->lb;
    if (f->tier < 0 || f->bytes_per_chunk == 0 || least_squares(lx, ly, lm, 2, lb) != 0) {
        mini_err("profile: the load measurements do not fit a cost per chunk\n");
        return -1;
    }
    if (lb[1] <=
        0) { /* loads too fast to tell from noise: charge each restore's time to its chunks */
        lb[0] = 0;
        lb[1] = 0;
        for (int i = 0; i < lm; i++)
            if (lx[i * 2 + 1] > 0 && ly[i] / lx[i * 2 + 1] > lb[1]) lb[1] = ly[i] / lx[i * 2 + 1];
        if (lb[1] <= 0) {
            mini_err("profile: no restore loaded a chunk\n");
            return -1;
        }
    }
    return 0;
}

/* The profile, as YAML with a comment on how it was measured; and a line on stdout. */
static int write_profile(const engine *e, uint64_t max_tokens, const fit *fi, const char *tier_name,
                         const char *out_path) {
    const double *b = fi->b, *lb = fi->lb;
    double mb_s = (double)fi->bytes_per_chunk / lb[1] / 1e6;
    FILE *f = fopen(out_path, "w");
    if (!f) {
        perror(out_path);
        return -1;
    }
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    fprintf(f,
            "# restore profile written by %s --profile on %s\n"
            "# engine %s; %d forwards fitted (worst relative error %.2f);\n"
            "# loads: %d restores of 1/4..4/4 of a %llu-token prompt from tier index %d, %.1f us "
            "per chunk of\n"
            "# %llu bytes (+ %.1f us per restore), charged to bandwidth (latency 0).\n"
            "compute:\n"
            "  fixed_us: %.3f\n"
            "  per_token_us: %.5f\n"
            "  attention_ns_per_token2: %.6f\n"
            "tiers:\n"
            "  - name: %s\n"
            "    latency_us: 0\n"
            "    bandwidth_mb_s: %.3f\n",
            mini_prog, when, e->conn->model_id, fi->m, fi->worst, fi->lm,
            (unsigned long long)max_tokens, fi->tier, lb[1] * 1e6,
            (unsigned long long)fi->bytes_per_chunk, clamp0(lb[0]) * 1e6, clamp0(b[0]) * 1e6,
            clamp0(b[1]) * 1e6, clamp0(b[2]) * 1e9, tier_name, mb_s);
    if (fclose(f) != 0) {
        perror(out_path);
        return -1;
    }
    printf("profile: compute %.1f us + %.3f us/token + %.4f ns/token^2 (worst fit error %.0f%%); "
           "tier '%s' "
           "%.1f MB/s (%.1f us per %llu-byte chunk); written to %s\n",
           clamp0(b[0]) * 1e6, clamp0(b[1]) * 1e6, clamp0(b[2]) * 1e9, fi->worst * 100, tier_name,
           mb_s, lb[1] * 1e6, (unsigned long long)fi->bytes_per_chunk, out_path);
    return 0;
}

int profile_run(engine *e, uint64_t max_tokens, const char *tier_name, const char *out_path) {
    const int vocab = model_config_of(e->m)->vocab;
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < max_tokens; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        e->tokens[i] = (int32_t)((state >> 33) % (uint64_t)vocab);
    }
    fit f;
    if (fit_compute(e, max_tokens, &f) != 0 || fit_loads(e, max_tokens, &f) != 0) return -1;
    return write_profile(e, max_tokens, &f, tier_name, out_path);
}
