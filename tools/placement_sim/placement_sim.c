/* placement_sim.c - kvs-placement-sim: the AdaptCache placement (schedulers/adaptcache) against fixed
 * policies, in virtual time, on the paper's setup (docs/compress.md, "Simulator").
 *
 * A catalogue of --contexts reusable contexts (lengths log-normal like LongBench's: median --median
 * tokens, clipped to [1000, 32000]), requested with Zipf(--zipf) popularity as a Poisson process.
 * A request's KV is loaded from where it is stored (DRAM or SSD: latency + bytes / bandwidth, plus
 * the codec's decode time) or recomputed (prefill, a*n + b*n^2). Its quality is the codec's (1 for
 * raw or a recompute). Policies:
 *   prefill       nothing stored
 *   lru-<codec>   one codec for every entry; DRAM then SSD, each least recently used first (a DRAM
 *                 victim moves to SSD, an SSD hit moves back to DRAM)
 *   adaptcache    kvs_ac_place over every entry stored or just computed, after every miss and every
 *                 --reevaluate requests, with alpha swept over --alphas
 * Codecs and their quality are those measured on the trained mini model (docs/benchmarks.md,
 * "kvs-bench-codec-quality": top-1 agreement); rates are a Llama-8B head's (head_dim 128, fp16).
 *
 * Output: one JSON line per policy point (mean delay, mean quality, where hits came from), then the
 * comparison: for each baseline, AdaptCache's delay at the baseline's quality (interpolated between
 * neighbouring alphas of the sweep) and its quality at the baseline's delay. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/adaptcache/adaptcache.h"

#define N_CODECS 6
static const char *const LRU_NAMES[N_CODECS] = {"lru-raw",   "lru-int8",    "lru-kivi4",
                                                "lru-kivi2", "lru-stream4", "lru-stream64"};
/* the last two are StreamingLLM (sinks and recent tokens, a fifth of the context kept): no decode,
 * for engines that can mask dropped positions */
static const double RATE[N_CODECS] = {1.0, 0.5078, 0.3125, 0.1875, 0.2, 0.2};
/* kinds: 0 quantised, 1 and 2 token-dropped with 4 and with 64 sinks (the KV one drops is gone for
 * the other) */
static const int DROPS[N_CODECS] = {0, 0, 0, 0, 1, 2};
/* top-1 agreement on the trained mini model, contexts of 448 bytes (docs/benchmarks.md): INT8,
 * KIVI-4 and KIVI-2 in groups of 32, StreamingLLM keeping 0.2 with 4 and with 64 sink positions */
static const double QUALITY[N_CODECS] = {1.0, 0.988, 0.920, 0.648, 0.300, 0.632};

typedef struct sim_opts {
    uint32_t contexts, requests, median, reevaluate;
    double zipf, rate, dram_gb, ssd_ratio, ssd_gbps, dram_gbps, half_life_s;
    double alphas[16];
    uint32_t n_alphas;
    uint64_t seed;
} sim_opts;

typedef struct ctx {
    uint64_t raw; /* bytes */
    uint32_t tokens;
    double freq;      /* decayed hits per second, < 0 unknown */
    double last_s;    /* time of the last request */
    int dev;          /* KVS_AC_DRAM, KVS_AC_SSD, KVS_AC_NONE */
    int codec;        /* what it is stored as */
    uint32_t allowed; /* codecs it may still take */
    uint64_t lru;     /* LRU stamp */
} ctx;

typedef struct point {
    const char *policy;
    double alpha, delay_s, quality, hits_dram, hits_ssd, misses;
} point;

static uint64_t rng_s;
static double urand(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return ((double)(rng_s >> 11) + 0.5) * 0x1p-53;
}

static double prefill_s(uint32_t n) {
    /* an 8B model on one A100/H100-class GPU: about 120 us per token at 8k tokens */
    return 100e-6 * n + 2.5e-9 * (double)n * n;
}

static kvs_ac_params base_params(const sim_opts *o, double alpha) {
    kvs_ac_params p;
    memset(&p, 0, sizeof p);
    p.alpha = alpha;
    p.freq_prior = log(2.0) / o->half_life_s;
    p.n_codecs = N_CODECS;
    for (int c = 1; c < N_CODECS; c++) /* dequantise on the GPU: ~1 TB/s and a launch */
        if (!DROPS[c]) p.codecs[c] = (kvs_ac_codec_cost){.fixed_s = 20e-6, .s_per_raw_byte = 1e-12};
    double dram = o->dram_gb * 1e9;
    p.devices[KVS_AC_DRAM] = (kvs_ac_device){50e-6, o->dram_gbps * 1e9, (uint64_t)dram};
    p.devices[KVS_AC_SSD] =
        (kvs_ac_device){100e-6, o->ssd_gbps * 1e9, (uint64_t)(dram * o->ssd_ratio)};
    return p;
}

static double load_s(const kvs_ac_params *p, const ctx *c) {
    const kvs_ac_device *d = &p->devices[c->dev];
    double t = d->latency_s + (double)c->raw * RATE[c->codec] / d->bytes_per_s;
    if (c->codec)
        t += p->codecs[c->codec].fixed_s + p->codecs[c->codec].s_per_raw_byte * (double)c->raw;
    return t;
}

/* Zipf over n items: the cumulative weights, for inverse sampling. */
static double *zipf_cdf(uint32_t n, double s) {
    double *cdf = malloc(n * sizeof *cdf), sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += (cdf[i] = pow(i + 1.0, -s));
    double acc = 0;
    for (uint32_t i = 0; i < n; i++) cdf[i] = (acc += cdf[i]) / sum;
    return cdf;
}

static uint32_t draw(const double *cdf, uint32_t n) {
    double u = urand();
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void make_catalogue(const sim_opts *o, ctx *cs) {
    rng_s = o->seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint32_t i = 0; i < o->contexts; i++) {
        double g = sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand());
        double n = o->median * exp(0.7 * g);
        n = n < 1000 ? 1000 : n > 32000 ? 32000 : n;
        cs[i] = (ctx){.tokens = (uint32_t)n,
                      .raw = (uint64_t)n * 131072u,
                      .freq = -1,
                      .dev = KVS_AC_NONE,
                      .allowed = (1u << N_CODECS) - 1};
    }
}

static void touch_freq(const sim_opts *o, ctx *c, double now) {
    double h = o->half_life_s;
    if (c->freq < 0)
        c->freq = log(2.0) / h;
    else
        c->freq = c->freq * pow(2.0, -(now - c->last_s) / h) + log(2.0) / h;
    c->last_s = now;
}

/* ---- LRU over DRAM then SSD with one codec ------------------------------------------------------- */

static void lru_make_room(const kvs_ac_params *p, ctx *cs, uint32_t n, uint64_t *used, int dev,
                          uint64_t need, int codec) {
    while (used[dev] + need > p->devices[dev].capacity) {
        uint32_t victim = UINT32_MAX;
        for (uint32_t i = 0; i < n; i++)
            if (cs[i].dev == dev && (victim == UINT32_MAX || cs[i].lru < cs[victim].lru))
                victim = i;
        if (victim == UINT32_MAX) return;
        uint64_t b = (uint64_t)((double)cs[victim].raw * RATE[codec]);
        used[dev] -= b;
        cs[victim].dev = KVS_AC_NONE;
        if (dev == KVS_AC_DRAM && b <= p->devices[KVS_AC_SSD].capacity) { /* demote */
            lru_make_room(p, cs, n, used, KVS_AC_SSD, b, codec);
            cs[victim].dev = KVS_AC_SSD;
            used[KVS_AC_SSD] += b;
        }
    }
}

static point run_lru(const sim_opts *o, int codec, int store) {
    kvs_ac_params p = base_params(o, 0);
    ctx *cs = calloc(o->contexts, sizeof *cs);
    make_catalogue(o, cs);
    double *cdf = zipf_cdf(o->contexts, o->zipf);
    uint64_t used[2] = {0, 0}, stamp = 0;
    double now = 0, delay = 0, quality = 0;
    point pt = {.policy = store ? LRU_NAMES[codec] : "prefill"};
    for (uint32_t r = 0; r < o->requests; r++) {
        now += -log(urand()) / o->rate;
        ctx *c = &cs[draw(cdf, o->contexts)];
        c->codec = codec;
        c->lru = ++stamp;
        uint64_t b = (uint64_t)((double)c->raw * RATE[codec]);
        if (c->dev != KVS_AC_NONE) {
            delay += load_s(&p, c);
            quality += QUALITY[codec];
            *(c->dev == KVS_AC_DRAM ? &pt.hits_dram : &pt.hits_ssd) += 1;
            if (c->dev == KVS_AC_SSD && b <= p.devices[0].capacity) { /* promote */
                used[KVS_AC_SSD] -= b;
                c->dev = KVS_AC_NONE;
                lru_make_room(&p, cs, o->contexts, used, KVS_AC_DRAM, b, codec);
                c->dev = KVS_AC_DRAM;
                used[KVS_AC_DRAM] += b;
            }
            continue;
        }
        delay += prefill_s(c->tokens);
        quality += 1.0;
        pt.misses += 1;
        if (!store) continue;
        int dev = b <= p.devices[0].capacity   ? KVS_AC_DRAM
                  : b <= p.devices[1].capacity ? KVS_AC_SSD
                                               : KVS_AC_NONE;
        if (dev == KVS_AC_NONE) continue;
        lru_make_room(&p, cs, o->contexts, used, dev, b, codec);
        c->dev = dev;
        used[dev] += b;
    }
    pt.delay_s = delay / o->requests, pt.quality = quality / o->requests;
    pt.hits_dram /= o->requests, pt.hits_ssd /= o->requests, pt.misses /= o->requests;
    free(cs), free(cdf);
    return pt;
}

/* ---- AdaptCache ----------------------------------------------------------------------------------- */

static void place(const kvs_ac_params *p, ctx *cs, uint32_t n, double now, const sim_opts *o,
                  kvs_ac_entry *e, kvs_ac_choice *out, uint32_t *idx) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (cs[i].dev == KVS_AC_NONE && !(cs[i].allowed & 0x100u)) continue; /* no KV to place */
        ctx *c = &cs[i];
        kvs_ac_entry *x = &e[k];
        memset(x, 0, sizeof *x);
        x->raw_bytes = c->raw;
        x->freq = c->freq < 0 ? -1 : c->freq * pow(2.0, -(now - c->last_s) / o->half_life_s);
        x->recompute_s = prefill_s(c->tokens);
        for (int cd = 0; cd < N_CODECS; cd++) {
            x->bytes[cd] = (uint64_t)((double)c->raw * RATE[cd]);
            x->quality[cd] = QUALITY[cd];
        }
        x->allowed = c->allowed & ((1u << N_CODECS) - 1);
        x->devices = 3;
        idx[k++] = i;
    }
    if (kvs_ac_place(p, e, k, out, NULL) != KVS_OK) {
        fprintf(stderr, "kvs-placement-sim: kvs_ac_place refused the entries\n");
        exit(1);
    }
    for (uint32_t j = 0; j < k; j++) {
        ctx *c = &cs[idx[j]];
        c->allowed &= ~0x100u; /* placed (or dropped) now */
        c->dev = out[j].device;
        if (c->dev == KVS_AC_NONE) {
            c->allowed = (1u << N_CODECS) - 1; /* a later recompute starts afresh */
            continue;
        }
        c->codec = out[j].codec;
        /* lossier from now on: codecs of no more than this rate, of the same kind (quantised KV is
         * not token-dropped KV) once it is lossy */
        for (int cd = 0; cd < N_CODECS; cd++)
            if (RATE[cd] > RATE[c->codec] || (c->codec && DROPS[cd] != DROPS[c->codec]))
                c->allowed &= ~(1u << cd);
    }
}

static point run_adaptcache(const sim_opts *o, double alpha) {
    kvs_ac_params p = base_params(o, alpha);
    ctx *cs = calloc(o->contexts, sizeof *cs);
    make_catalogue(o, cs);
    double *cdf = zipf_cdf(o->contexts, o->zipf);
    kvs_ac_entry *e = calloc(o->contexts, sizeof *e);
    kvs_ac_choice *out = calloc(o->contexts, sizeof *out);
    uint32_t *idx = calloc(o->contexts, sizeof *idx);
    double now = 0, delay = 0, quality = 0;
    point pt = {.policy = "adaptcache", .alpha = alpha};
    for (uint32_t r = 0; r < o->requests; r++) {
        now += -log(urand()) / o->rate;
        ctx *c = &cs[draw(cdf, o->contexts)];
        touch_freq(o, c, now);
        if (c->dev != KVS_AC_NONE) {
            delay += load_s(&p, c);
            quality += QUALITY[c->codec];
            *(c->dev == KVS_AC_DRAM ? &pt.hits_dram : &pt.hits_ssd) += 1;
        } else {
            delay += prefill_s(c->tokens);
            quality += 1.0;
            pt.misses += 1;
            c->allowed = ((1u << N_CODECS) - 1) | 0x100u; /* fresh KV, raw, to be placed */
            place(&p, cs, o->contexts, now, o, e, out, idx);
            continue;
        }
        if (o->reevaluate && r % o->reevaluate == 0)
            place(&p, cs, o->contexts, now, o, e, out, idx);
    }
    pt.delay_s = delay / o->requests, pt.quality = quality / o->requests;
    pt.hits_dram /= o->requests, pt.hits_ssd /= o->requests, pt.misses /= o->requests;
    free(cs), free(cdf), free(e), free(out), free(idx);
    return pt;
}

static void print_point(const point *pt) {
    printf("{\"bench\":\"placement_sim\",\"policy\":\"%s\",\"alpha\":%.3f,\"mean_delay_s\":%.6f,"
           "\"mean_quality\":%.5f,\"hits_dram\":%.4f,\"hits_ssd\":%.4f,\"misses\":%.4f}\n",
           pt->policy, pt->alpha, pt->delay_s, pt->quality, pt->hits_dram, pt->hits_ssd,
           pt->misses);
}

/* AdaptCache's curve along the alpha sweep (points in alpha order), interpolated between
 * neighbouring alphas only: the delay where the curve first reaches quality q, and the quality
 * where its delay first reaches d. INFINITY when the sweep never gets there. */
static double delay_at_quality(const point *a, uint32_t n, double q) {
    for (uint32_t i = 0; i < n; i++) {
        if (a[i].quality >= q && (i == 0 || a[i - 1].quality >= q)) return a[i].delay_s;
        if (i > 0 && a[i - 1].quality < q && a[i].quality >= q) {
            double w = (q - a[i - 1].quality) / (a[i].quality - a[i - 1].quality);
            return a[i - 1].delay_s + w * (a[i].delay_s - a[i - 1].delay_s);
        }
    }
    return INFINITY;
}

static double quality_at_delay(const point *a, uint32_t n, double d) {
    /* the last point of the sweep at or under d, and the step to the next one */
    for (uint32_t i = n; i-- > 0;) {
        if (a[i].delay_s > d) continue;
        if (i + 1 < n && a[i + 1].delay_s > a[i].delay_s) {
            double w = (d - a[i].delay_s) / (a[i + 1].delay_s - a[i].delay_s);
            return a[i].quality + w * (a[i + 1].quality - a[i].quality);
        }
        return a[i].quality;
    }
    return INFINITY;
}

int main(int argc, char **argv) {
    int help = 0;
    sim_opts o = {.contexts = 1100,
                  .requests = 20000,
                  .median = 7000,
                  .reevaluate = 200,
                  .zipf = 1.0,
                  .rate = 1.0,
                  .dram_gb = 100,
                  .ssd_ratio = 4,
                  .ssd_gbps = 1,
                  .dram_gbps = 20,
                  .half_life_s = 600,
                  .seed = 1,
                  .alphas = {0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30},
                  .n_alphas = 8};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            help = 1;
            goto usage;
        }
        if (!v) goto usage;
        if (!strcmp(a, "--contexts"))
            o.contexts = (uint32_t)atoi(v);
        else if (!strcmp(a, "--requests"))
            o.requests = (uint32_t)atoi(v);
        else if (!strcmp(a, "--median"))
            o.median = (uint32_t)atoi(v);
        else if (!strcmp(a, "--reevaluate"))
            o.reevaluate = (uint32_t)atoi(v);
        else if (!strcmp(a, "--zipf"))
            o.zipf = atof(v);
        else if (!strcmp(a, "--rate"))
            o.rate = atof(v);
        else if (!strcmp(a, "--dram-gb"))
            o.dram_gb = atof(v);
        else if (!strcmp(a, "--ssd-ratio"))
            o.ssd_ratio = atof(v);
        else if (!strcmp(a, "--ssd-gbps"))
            o.ssd_gbps = atof(v);
        else if (!strcmp(a, "--seed"))
            o.seed = (uint64_t)atoll(v);
        else
            goto usage;
        i++;
    }
    if (o.contexts < 2 || o.requests < 1 || o.median < 1 || !(o.zipf > 0) || !(o.rate > 0) ||
        !(o.dram_gb > 0) || !(o.ssd_ratio >= 0) || !(o.ssd_gbps > 0))
        goto usage;
    point base[2 + N_CODECS];
    uint32_t nb = 0;
    base[nb++] = run_lru(&o, 0, 0);
    for (int c = 0; c < N_CODECS; c++) base[nb++] = run_lru(&o, c, 1);
    point curve[16];
    for (uint32_t k = 0; k < o.n_alphas; k++) curve[k] = run_adaptcache(&o, o.alphas[k]);
    for (uint32_t k = 0; k < nb; k++) print_point(&base[k]);
    for (uint32_t k = 0; k < o.n_alphas; k++) print_point(&curve[k]);
    printf("%-12s %7s %10s %8s %6s %6s %6s\n", "policy", "alpha", "delay ms", "quality", "dram",
           "ssd", "miss");
    for (uint32_t k = 0; k < nb + o.n_alphas; k++) {
        const point *pt = k < nb ? &base[k] : &curve[k - nb];
        printf("%-12s %7.2f %10.2f %8.4f %6.3f %6.3f %6.3f\n", pt->policy, pt->alpha,
               pt->delay_s * 1e3, pt->quality, pt->hits_dram, pt->hits_ssd, pt->misses);
    }
    for (uint32_t k = 0; k < nb; k++) {
        double d = delay_at_quality(curve, o.n_alphas, base[k].quality);
        double q = quality_at_delay(curve, o.n_alphas, base[k].delay_s);
        /* unreachable points (never that good / never that fast) are reported as 0 ratios */
        printf("{\"bench\":\"placement_vs\",\"baseline\":\"%s\",\"baseline_delay_s\":%.6f,"
               "\"baseline_quality\":%.5f,\"adaptcache_delay_s_at_quality\":%.6f,"
               "\"delay_ratio\":%.3f,\"adaptcache_quality_at_delay\":%.5f,\"quality_gain\":%.4f}\n",
               base[k].policy, base[k].delay_s, base[k].quality, isinf(d) ? 0.0 : d,
               isinf(d) ? 0.0 : base[k].delay_s / d, isinf(q) ? 0.0 : q,
               isinf(q) ? 0.0 : q / base[k].quality - 1);
        char dtext[96], qtext[96];
        if (isinf(d))
            snprintf(dtext, sizeof dtext, "adaptcache never reaches its quality %.4f",
                     base[k].quality);
        else
            snprintf(dtext, sizeof dtext,
                     "at its quality %.4f adaptcache takes %.2f ms (%.2fx lower)", base[k].quality,
                     d * 1e3, base[k].delay_s / d);
        if (isinf(q))
            snprintf(qtext, sizeof qtext, "adaptcache is never that fast");
        else
            snprintf(qtext, sizeof qtext, "at its delay adaptcache's quality is %.4f (%+.1f %%)", q,
                     100 * (q / base[k].quality - 1));
        printf("vs %-10s (%.2f ms, quality %.4f): %s; %s\n", base[k].policy, base[k].delay_s * 1e3,
               base[k].quality, dtext, qtext);
    }
    return 0;
usage:
    fprintf(
        help ? stdout : stderr,
        "usage: kvs-placement-sim [--contexts N (1100)] [--requests N (20000)] [--median TOKENS "
        "(7000)]\n                         [--reevaluate N (200)] [--zipf S (1.0)] [--rate R "
        "(1.0)] [--dram-gb G (100)]\n                         [--ssd-ratio X (4)] [--ssd-gbps "
        "G (1)] [--seed N (1)]\n"
        "  AdaptCache placement against LRU with one codec and prefill only, in virtual time\n"
        "  (docs/compress.md)\n");
    return help ? 0 : 2;
}
