/* adaptcache.c - the joint marginal-utility placement (adaptcache.h). */
#include "schedulers/adaptcache/adaptcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One option of one entry. */
typedef struct opt {
    int8_t dev;
    uint8_t codec;
    uint64_t bytes; /* on dev (0 when not stored) */
    double u;
} opt;

typedef struct state {
    const kvs_ac_params *p;
    size_t n;
    opt *opts;       /* n * per */
    uint32_t *n_opt; /* options of each entry */
    uint32_t *cur;   /* index of its current option */
    double *freq;
    uint32_t per; /* options per entry at most: 2 devices x codecs + not stored */
    uint64_t used[2];
    double largest_step;
} state;

static double freq_of(const kvs_ac_params *p, const kvs_ac_entry *e) {
    return e->freq < 0 ? p->freq_prior : e->freq;
}

/* Delay of one hit on this option, and its quality. */
static double delay_of(const kvs_ac_params *p, const kvs_ac_entry *e, int device, uint32_t codec,
                       double *quality) {
    if (device == KVS_AC_NONE) {
        *quality = 1.0; /* a recompute */
        return e->recompute_s;
    }
    const kvs_ac_device *d = &p->devices[device];
    const kvs_ac_codec_cost *c = &p->codecs[codec];
    double t = d->latency_s + (double)e->bytes[codec] / d->bytes_per_s;
    if (codec != 0) t += c->fixed_s + c->s_per_raw_byte * (double)e->raw_bytes;
    *quality = codec == 0 ? 1.0 : e->quality[codec]; /* raw is lossless */
    return t;
}

double kvs_ac_utility(const kvs_ac_params *p, const kvs_ac_entry *e, int device, uint32_t codec) {
    double q, t = delay_of(p, e, device, codec, &q);
    return freq_of(p, e) * (p->alpha * q - t);
}

static int by_bytes_desc(const void *a, const void *b) {
    const opt *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : (int)x->codec - (int)y->codec;
}

/* The entry's options in the order moves may take: DRAM by size, SSD by size, not stored. */
static uint32_t build_options(const kvs_ac_params *p, const kvs_ac_entry *e, opt *o) {
    uint32_t k = 0;
    for (int d = KVS_AC_DRAM; d <= KVS_AC_SSD; d++) {
        if (!(e->devices & (1u << d))) continue;
        uint32_t first = k;
        for (uint32_t c = 0; c < p->n_codecs; c++) {
            if (!(e->allowed & (1u << c)) || e->bytes[c] == 0) continue;
            if (c != 0 && e->quality[c] < p->min_quality) continue;
            o[k++] = (opt){.dev = (int8_t)d,
                           .codec = (uint8_t)c,
                           .bytes = e->bytes[c],
                           .u = kvs_ac_utility(p, e, d, c)};
        }
        qsort(o + first, k - first, sizeof *o, by_bytes_desc);
    }
    o[k++] = (opt){.dev = KVS_AC_NONE, .u = kvs_ac_utility(p, e, KVS_AC_NONE, 0)};
    return k;
}

static uint64_t bytes_on(const opt *o, int dev) {
    return o->dev == dev ? o->bytes : 0;
}

/* The cheapest move (utility lost per byte freed on dev) of entry i among its later options, not
 * counting any price for room taken elsewhere; +inf if none frees bytes there. */
static double cheapest_on(const state *s, size_t i, int dev, uint32_t *to) {
    const opt *o = s->opts + i * s->per, *c = o + s->cur[i];
    double best = INFINITY;
    for (uint32_t j = s->cur[i] + 1; j < s->n_opt[i]; j++) {
        uint64_t after = bytes_on(&o[j], dev), before = bytes_on(c, dev);
        if (after >= before) continue;
        double d = (c->u - o[j].u) / (double)(before - after);
        if (d < best) {
            best = d;
            *to = j;
        }
    }
    return best;
}

/* Entry i takes its option j: the devices' usage follows. */
static void move(state *s, size_t i, uint32_t j) {
    const opt *o = s->opts + i * s->per, *from = o + s->cur[i], *to = o + j;
    if (from->dev != KVS_AC_NONE) s->used[from->dev] -= from->bytes;
    if (to->dev != KVS_AC_NONE) s->used[to->dev] += to->bytes;
    s->cur[i] = j;
}

/* The SSD's marginal utility per byte: what freeing room there costs now. +inf when nothing on it
 * can move (no room can be made). */
static double ssd_price(const state *s) {
    double price = INFINITY;
    for (size_t i = 0; i < s->n; i++) {
        if (s->opts[i * s->per + s->cur[i]].dev != KVS_AC_SSD) continue;
        uint32_t to;
        double d = cheapest_on(s, i, KVS_AC_SSD, &to);
        if (d < price) price = d;
    }
    return price;
}

/* One greedy step on the over-full device t: 1 if a move was made. */
static int step(state *s, int t) {
    const kvs_ac_params *p = s->p;
    double price = t == KVS_AC_DRAM ? ssd_price(s) : 0.0;
    uint64_t ssd_cap = p->devices[KVS_AC_SSD].capacity;
    double best = INFINITY;
    size_t bi = 0;
    uint32_t bj = 0;
    for (size_t i = 0; i < s->n; i++) {
        const opt *o = s->opts + i * s->per, *c = o + s->cur[i];
        if (c->dev != t) continue;
        for (uint32_t j = s->cur[i] + 1; j < s->n_opt[i]; j++) {
            uint64_t after = bytes_on(&o[j], t);
            if (after >= c->bytes) continue;
            double cost = c->u - o[j].u;
            if (t == KVS_AC_DRAM && o[j].dev == KVS_AC_SSD &&
                s->used[KVS_AC_SSD] + o[j].bytes > ssd_cap) {
                /* room on the SSD must be made for it: charge what that costs there */
                uint64_t over = s->used[KVS_AC_SSD] + o[j].bytes - ssd_cap;
                if (over > o[j].bytes) over = o[j].bytes;
                if (isinf(price)) continue;
                cost += price * (double)over;
            }
            double d = cost / (double)(c->bytes - after);
            /* ties: the colder entry moves first, then the lower index */
            if (d < best || (d == best && s->freq[i] < s->freq[bi])) {
                best = d;
                bi = i;
                bj = j;
            }
        }
    }
    if (isinf(best)) return 0;
    const opt *o = s->opts + bi * s->per;
    if (o[s->cur[bi]].u - o[bj].u > s->largest_step) s->largest_step = o[s->cur[bi]].u - o[bj].u;
    move(s, bi, bj);
    return 1;
}

/* After the greedy: use room it left (its last steps may free more than needed) for the upgrade that
 * gains the most utility per byte it takes, until none fits. 1 if one was made. */
static int upgrade(state *s) {
    const kvs_ac_params *p = s->p;
    double best = 0.0;
    size_t bi = 0;
    uint32_t bj = 0;
    for (size_t i = 0; i < s->n; i++) {
        const opt *o = s->opts + i * s->per, *c = o + s->cur[i];
        for (uint32_t j = 0; j < s->n_opt[i]; j++) {
            if (o[j].u <= c->u || j == s->cur[i]) continue;
            uint64_t used[2] = {s->used[0], s->used[1]};
            if (c->dev != KVS_AC_NONE) used[c->dev] -= c->bytes;
            if (o[j].dev != KVS_AC_NONE) used[o[j].dev] += o[j].bytes;
            if (used[0] > p->devices[0].capacity || used[1] > p->devices[1].capacity) continue;
            uint64_t taken = o[j].dev == KVS_AC_NONE ? 0 : o[j].bytes;
            double gain = (o[j].u - c->u) / (double)(taken ? taken : 1);
            if (gain > best) {
                best = gain;
                bi = i;
                bj = j;
            }
        }
    }
    if (best <= 0.0) return 0;
    move(s, bi, bj);
    return 1;
}

static int finite_in(double x, double lo, double hi) {
    return x >= lo && x <= hi; /* false for NaN */
}

static int params_ok(const kvs_ac_params *p) {
    if (!finite_in(p->alpha, 0.0, 1e300) || !finite_in(p->freq_prior, 1e-300, 1e300)) return 0;
    if (!finite_in(p->min_quality, -1e300, 1e300)) return 0;
    if (p->n_codecs < 1 || p->n_codecs > KVS_AC_MAX_CODECS) return 0;
    for (int d = 0; d < 2; d++)
        if (!finite_in(p->devices[d].bytes_per_s, 1e-300, 1e300) ||
            !finite_in(p->devices[d].latency_s, 0.0, 1e300))
            return 0;
    for (uint32_t c = 0; c < p->n_codecs; c++)
        if (!finite_in(p->codecs[c].fixed_s, 0.0, 1e300) ||
            !finite_in(p->codecs[c].s_per_raw_byte, 0.0, 1e300))
            return 0;
    return 1;
}

/* Every number an entry brings is finite (a NaN utility would stall the greedy over capacity). */
static int entry_ok(const kvs_ac_params *p, const kvs_ac_entry *e) {
    if (!(e->freq < 0.0 || finite_in(e->freq, 0.0, 1e300))) return 0;
    if (!finite_in(e->recompute_s, 0.0, 1e300)) return 0;
    for (uint32_t c = 1; c < p->n_codecs; c++)
        if (e->bytes[c] && !finite_in(e->quality[c], 0.0, 1.0)) return 0;
    return 1;
}

kvs_status kvs_ac_place(const kvs_ac_params *p, const kvs_ac_entry *entries, size_t n,
                        kvs_ac_choice *out, kvs_ac_result *result) {
    if (!params_ok(p)) return KVS_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!entry_ok(p, &entries[i])) return KVS_EINVAL;
    state s = {.p = p, .n = n, .per = 2 * p->n_codecs + 1};
    s.opts = malloc((n ? n : 1) * s.per * sizeof *s.opts);
    s.n_opt = malloc((n ? n : 1) * sizeof *s.n_opt);
    s.cur = malloc((n ? n : 1) * sizeof *s.cur);
    s.freq = malloc((n ? n : 1) * sizeof *s.freq);
    if (!s.opts || !s.n_opt || !s.cur || !s.freq) {
        free(s.opts), free(s.n_opt), free(s.cur), free(s.freq);
        return KVS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        opt *o = s.opts + i * s.per;
        s.n_opt[i] = build_options(p, &entries[i], o);
        s.freq[i] = freq_of(p, &entries[i]);
        uint32_t best = 0; /* start at the best option, capacity aside */
        for (uint32_t j = 1; j < s.n_opt[i]; j++)
            if (o[j].u > o[best].u) best = j;
        s.cur[i] = best;
        if (o[best].dev != KVS_AC_NONE) s.used[o[best].dev] += o[best].bytes;
    }
    uint64_t moves = 0;
    for (;;) {
        int t = s.used[KVS_AC_DRAM] > p->devices[KVS_AC_DRAM].capacity ? KVS_AC_DRAM
                : s.used[KVS_AC_SSD] > p->devices[KVS_AC_SSD].capacity ? KVS_AC_SSD
                                                                       : -1;
        if (t < 0 || !step(&s, t)) break; /* "not stored" is always a move, so step succeeds */
        moves++;
    }
    /* each upgrade raises the summed utility, so this ends; bounded all the same */
    for (size_t k = 0; k < n * s.per && upgrade(&s); k++) moves++;
    if (s.used[0] > p->devices[0].capacity || s.used[1] > p->devices[1].capacity) {
        /* cannot happen with finite utilities ("not stored" is always a move): never hand out an
         * over-full placement all the same */
        free(s.opts), free(s.n_opt), free(s.cur), free(s.freq);
        return KVS_EINVAL;
    }
    kvs_ac_result r = {
        .used = {s.used[0], s.used[1]}, .moves = moves, .largest_step = s.largest_step};
    double fsum = 0.0;
    for (size_t i = 0; i < n; i++) {
        const opt *o = s.opts + i * s.per + s.cur[i];
        out[i] = (kvs_ac_choice){.device = o->dev, .codec = o->dev == KVS_AC_NONE ? 0 : o->codec};
        double f = s.freq[i], q, t = delay_of(p, &entries[i], o->dev, o->codec, &q);
        r.utility += o->u;
        r.mean_quality += f * q;
        r.mean_delay_s += f * t;
        fsum += f;
    }
    if (fsum > 0) {
        r.mean_quality /= fsum;
        r.mean_delay_s /= fsum;
    }
    if (result) *result = r;
    free(s.opts), free(s.n_opt), free(s.cur), free(s.freq);
    return KVS_OK;
}

double kvs_ac_quality_from_error(const kvs_ac_curve *c, double rel_error) {
    uint32_t n = c->n < 16 ? c->n : 16;
    if (n == 0) return 1.0;
    double q = c->quality[0];
    if (rel_error <= c->error[0]) return q;
    for (uint32_t k = 1; k < n; k++) {
        double qk = c->quality[k] < q ? c->quality[k] : q; /* non-increasing */
        if (rel_error <= c->error[k]) {
            double span = c->error[k] - c->error[k - 1];
            double w = span > 0 ? (rel_error - c->error[k - 1]) / span : 1.0;
            return q + w * (qk - q);
        }
        q = qk;
    }
    return q;
}
