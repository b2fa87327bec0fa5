/* codec.c - the reference codecs (codec.h): encoding from raw payload rows, decoding fused into the
 * scatter into the engine's pages. Quantisation arithmetic is done in double so the error bound holds
 * for every element; decoding is one fp32 multiply-add per element (q * s is exact in fp32: q has at
 * most 8 bits and s 11) and one rounding into the engine's dtype, the same operations the CUDA
 * kernel does. */
#include "kernels/cpu/codec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/codec_drop.h"
#include "kernels/cpu/dtype.h"

/* ---- fp16 steps and minima, rounded outwards --------------------------------------------------- */

#define F16_MAX 65504.0f

/* The largest fp16 <= x; 0 when x is out of fp16's range. */
static int f16_down(float x, uint16_t *out) {
    if (!(x >= -F16_MAX && x <= F16_MAX)) return 0;
    uint16_t h = kvs_f32_to_f16(x);
    if (kvs_f16_to_f32(h) > x) {
        if (h == 0x0000u)
            h = 0x8001u; /* +0 above a tiny negative: the smallest negative subnormal */
        else if (h & 0x8000u)
            h++; /* negative: one step further from zero */
        else
            h--;
    }
    if ((h & 0x7fffu) >= 0x7c00u) return 0;
    *out = h;
    return 1;
}

/* The smallest fp16 >= x, for x >= 0 given as a double; 0 when it does not fit. */
static int f16_up(double x, uint16_t *out) {
    if (!(x >= 0.0 && x <= (double)F16_MAX)) return 0;
    float f = (float)x;
    if ((double)f < x) f = nextafterf(f, INFINITY);
    uint16_t h = kvs_f32_to_f16(f);
    if (kvs_f16_to_f32(h) < f) h++;
    if ((h & 0x7fffu) >= 0x7c00u) return 0;
    *out = h;
    return 1;
}

static void put16(uint8_t *p, uint16_t v) {
    memcpy(p, &v, 2);
}

static uint16_t get16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* ---- geometry ------------------------------------------------------------------------------------ */

typedef kvs_codec_geom geom;

static geom geom_of(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype, uint32_t n) {
    return kvs_codec_geometry(c, shape, kvs_dtype_bytes(dtype), n);
}

kvs_status kvs_codec_check(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype, char *err,
                           size_t err_len) {
    uint32_t elem = kvs_dtype_bytes(dtype);
    const char *why = NULL;
    if (!elem)
        why = "an unknown dtype";
    else if (shape->n_heads == 0 || shape->head_bytes == 0 || shape->head_bytes % elem)
        why = "a head that is not a whole number of elements";
    else if (c->kind == KVS_CODEC_KIVI) {
        uint32_t dim = shape->head_bytes / elem;
        if (c->bits != 2 && c->bits != 4)
            why = "KIVI takes 2 or 4 bits";
        else if (c->k_group == 0)
            why = "a K group of 0 tokens";
        else if (c->v_group == 0 || c->v_group > dim)
            why = "a V group outside 1 .. head_dim channels";
        else if (dim * c->bits % 8u)
            why = "head_dim * bits not a whole number of bytes";
    } else if (c->kind == KVS_CODEC_INT8) {
        if (c->bits != 8) why = "INT8 takes 8 bits";
    } else if (c->kind == KVS_CODEC_DROP) {
        if (c->bits != 0 || c->v_group != 0)
            why = "DROP takes no bits and no V group";
        else if (c->k_group == 0)
            why = "DROP keeps at least one token";
    } else {
        why = "an unknown codec";
    }
    if (why) {
        snprintf(err, err_len, "codec %u/%u bits: %s", c->kind, c->bits, why);
        return KVS_EINVAL;
    }
    return KVS_OK;
}

uint64_t kvs_codec_layer_bytes(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                               uint32_t n_tokens) {
    geom g = geom_of(c, shape, dtype, n_tokens);
    uint64_t k = g.codes + g.k_meta;
    return shape->has_v ? k + g.codes + g.v_meta : k;
}

double kvs_codec_rate(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                      uint32_t n_tokens) {
    uint64_t raw = kvs_kernel_layer_bytes(shape, n_tokens);
    return raw ? (double)kvs_codec_layer_bytes(c, shape, dtype, n_tokens) / (double)raw : 0.0;
}

float kvs_codec_step_bound(const kvs_codec *c, float lo, float hi) {
    /* s is the exact step rounded up twice (to fp32, then to fp16): at most 2^-10 relative above it,
     * or one fp16 subnormal step (2^-24) for tiny ranges; 2^-9 covers both roundings */
    double exact;
    if (c->kind == KVS_CODEC_INT8) {
        double a = fabs((double)lo) > fabs((double)hi) ? fabs((double)lo) : fabs((double)hi);
        exact = a / 127.0;
    } else {
        /* the minimum is rounded down to fp16 first: the range grows by at most its ulp */
        double m = (double)lo - (double)kvs_dtype_ulp(KVS_DTYPE_FP16, lo);
        exact = ((double)hi - m) / (double)((1u << c->bits) - 1u);
    }
    return (float)(exact * (1.0 + 0x1p-9) + 0x1p-24);
}

float kvs_dtype_ulp(uint32_t dtype, float x) {
    int mant, min_exp; /* mantissa bits, smallest normal exponent */
    switch (dtype) {
        case KVS_DTYPE_FP16: mant = 10, min_exp = -14; break;
        case KVS_DTYPE_BF16: mant = 7, min_exp = -126; break;
        case KVS_DTYPE_FP8_E4M3: mant = 3, min_exp = -6; break;
        case KVS_DTYPE_FP8_E5M2: mant = 2, min_exp = -14; break;
        default: mant = 23, min_exp = -126; break;
    }
    float a = fabsf(x);
    int e = a > 0.0f ? ilogbf(a) : min_exp;
    if (e < min_exp) e = min_exp;
    return ldexpf(1.0f, e - mant);
}

/* ---- encoding ------------------------------------------------------------------------------------ */

/* The largest magnitude a decoded value may have in pages of dtype: beyond it fp16 and e5m2 round to
 * infinity (e4m3 saturates at its largest value, which only brings a value nearer; bf16 and fp32
 * hold anything fp16 steps reach). */
static double top_of(uint32_t dtype) {
    return dtype == KVS_DTYPE_FP16 ? 65504.0 : dtype == KVS_DTYPE_FP8_E5M2 ? 57344.0 : INFINITY;
}

/* The step of a grid of `levels` steps from base that covers reach (the exact step rounded up to
 * fp16) without its far end passing top (which the pages would round to infinity): then the
 * largest fp16 step that stays under top, if it still covers reach. 0 if none does. */
static int fitting_step(double base, double reach, uint32_t levels, double top, uint16_t *s) {
    if (!f16_up((reach - base) / (double)levels, s)) return 0;
    double end = base + (double)levels * kvs_f16_to_f32(*s);
    if (fabs(end) <= top) return 1;
    double room = (top - base) / (double)levels; /* the grid runs up from base */
    uint16_t down;
    if (room <= 0 || !f16_down((float)room, &down) || kvs_f16_to_f32(down) > room) return 0;
    if ((double)levels * kvs_f16_to_f32(down) < fabs(reach - base)) return 0;
    *s = down;
    return 1;
}

/* One asymmetric group's (m, s). Returns 0 if fp16 cannot hold them. */
static int group_params(float lo, float hi, uint32_t levels, double top, uint16_t *m, uint16_t *s) {
    if (!f16_down(lo, m)) return 0;
    double mn = (double)kvs_f16_to_f32(*m);
    if ((double)hi == mn) {
        *s = 0;
        return 1;
    }
    return fitting_step(mn, hi, levels, top, s);
}

/* Round to nearest, ties to even, for |v| < 2^51: adding and taking away 2^52 leaves the integer
 * (a plain add the compiler can vectorise, unlike rint without SSE4.1). */
static double round_even(double v) {
    const double big = 0x1p52; /* IEEE arithmetic: the compiler may not fold (v + big) - big */
    return v >= 0 ? (v + big) - big : -((-v + big) - big);
}

static uint32_t quantise(float x, double mn, double inv, uint32_t levels) {
    double q = round_even(((double)x - mn) * inv);
    if (q < 0.0) q = 0.0;
    if (q > (double)levels) q = (double)levels;
    return (uint32_t)q;
}

static void pack(uint8_t *row, uint32_t d, uint32_t bits, uint32_t q) {
    uint32_t bit = d * bits;
    row[bit / 8u] |= (uint8_t)(q << (bit % 8u));
}

static void load_f16(const uint8_t *src, uint64_t n, float *out);

/* n elements of dtype as floats; 0 if one is not finite. */
static int to_floats(uint32_t dtype, const void *src, uint64_t n, float *out) {
    int ok = 1;
    if (dtype == KVS_DTYPE_FP32) {
        memcpy(out, src, n * sizeof *out);
    } else if (dtype == KVS_DTYPE_FP16) {
        load_f16(src, n, out);
    } else {
        for (uint64_t i = 0; i < n; i++) out[i] = kvs_dtype_load(dtype, src, i);
    }
    for (uint64_t i = 0; i < n; i++) ok &= out[i] - out[i] == 0.0f; /* inf - inf and NaN are NaN */
    return ok;
}

/* K of KIVI: per channel over groups of k_group tokens; x holds the layer's K as floats. */
static int kivi_encode_k(const kvs_codec *c, const geom *g, double top, const float *x,
                         uint8_t *codes, uint8_t *meta, float *lo, float *hi, double *mn,
                         double *inv) {
    uint64_t row_elems = (uint64_t)g->heads * g->dim;
    memset(codes, 0, g->codes);
    for (uint32_t grp = 0; grp < g->k_groups; grp++) {
        uint32_t t0 = grp * c->k_group, t1 = t0 + c->k_group < g->n ? t0 + c->k_group : g->n;
        memcpy(lo, x + t0 * row_elems, row_elems * sizeof *lo);
        memcpy(hi, lo, row_elems * sizeof *hi);
        for (uint32_t t = t0 + 1; t < t1; t++) {
            const float *r = x + t * row_elems;
            for (uint64_t e = 0; e < row_elems; e++) {
                lo[e] = r[e] < lo[e] ? r[e] : lo[e];
                hi[e] = r[e] > hi[e] ? r[e] : hi[e];
            }
        }
        for (uint64_t e = 0; e < row_elems; e++) {
            uint16_t m, st;
            if (!group_params(lo[e], hi[e], g->levels, top, &m, &st)) return 0;
            uint8_t *gm = meta + ((uint64_t)grp * row_elems + e) * 4u;
            put16(gm, m);
            put16(gm + 2, st);
            mn[e] = kvs_f16_to_f32(m);
            inv[e] = st ? 1.0 / (double)kvs_f16_to_f32(st) : 0.0;
        }
        for (uint32_t t = t0; t < t1; t++) {
            const float *r = x + t * row_elems;
            for (uint32_t h = 0; h < g->heads; h++) {
                uint8_t *row = codes + ((uint64_t)t * g->heads + h) * g->row_codes;
                const uint64_t e0 = (uint64_t)h * g->dim;
                for (uint32_t d = 0; d < g->dim; d++)
                    pack(row, d, c->bits, quantise(r[e0 + d], mn[e0 + d], inv[e0 + d], g->levels));
            }
        }
    }
    return 1;
}

/* V of KIVI: per token over groups of v_group channels. */
static int kivi_encode_v(const kvs_codec *c, const geom *g, double top, const float *x,
                         uint8_t *codes, uint8_t *meta) {
    memset(codes, 0, g->codes);
    for (uint64_t r = 0; r < (uint64_t)g->n * g->heads; r++) {
        const float *v = x + r * g->dim;
        uint8_t *row = codes + r * g->row_codes;
        for (uint32_t grp = 0; grp < g->v_groups; grp++) {
            uint32_t d0 = grp * c->v_group,
                     d1 = d0 + c->v_group < g->dim ? d0 + c->v_group : g->dim;
            float lo = v[d0], hi = v[d0];
            for (uint32_t d = d0 + 1; d < d1; d++) {
                lo = v[d] < lo ? v[d] : lo;
                hi = v[d] > hi ? v[d] : hi;
            }
            uint16_t m, s;
            if (!group_params(lo, hi, g->levels, top, &m, &s)) return 0;
            uint8_t *gm = meta + (r * g->v_groups + grp) * 4u;
            put16(gm, m);
            put16(gm + 2, s);
            double mn = kvs_f16_to_f32(m), in = s ? 1.0 / (double)kvs_f16_to_f32(s) : 0.0;
            for (uint32_t d = d0; d < d1; d++)
                pack(row, d, c->bits, quantise(v[d], mn, in, g->levels));
        }
    }
    return 1;
}

/* INT8: one symmetric step per (token, head) row. */
static int int8_encode(const geom *g, double top, const float *x, uint8_t *codes, uint8_t *steps) {
    for (uint64_t r = 0; r < (uint64_t)g->n * g->heads; r++) {
        const float *v = x + r * g->dim;
        float a = 0.0f;
        for (uint32_t d = 0; d < g->dim; d++) a = fabsf(v[d]) > a ? fabsf(v[d]) : a;
        uint16_t s = 0;
        if (a > 0.0f && !fitting_step(0.0, (double)a, 127u, top, &s)) return 0;
        put16(steps + r * 2u, s);
        double inv = s ? 1.0 / (double)kvs_f16_to_f32(s) : 0.0;
        for (uint32_t d = 0; d < g->dim; d++) {
            double q = round_even((double)v[d] * inv);
            q = q > 127.0 ? 127.0 : q < -127.0 ? -127.0 : q;
            codes[r * g->dim + d] = (uint8_t)(int8_t)q;
        }
    }
    return 1;
}

kvs_status kvs_codec_encode_layer(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                  uint32_t n_tokens, const void *k_rows, const void *v_rows,
                                  void *out) {
    return kvs_codec_encode_layer_kept(c, shape, dtype, n_tokens, k_rows, v_rows, NULL, out);
}

kvs_status kvs_codec_encode_layer_kept(const kvs_codec *c, const kvs_kv_shape *shape,
                                       uint32_t dtype, uint32_t n_tokens, const void *k_rows,
                                       const void *v_rows, const uint8_t *kept_mask, void *out) {
    if (c->kind == KVS_CODEC_DROP)
        return kvs_codec_drop_encode(c, shape, dtype, n_tokens, k_rows, v_rows, kept_mask, out);
    geom g = geom_of(c, shape, dtype, n_tokens);
    uint64_t elems = (uint64_t)n_tokens * g.heads * g.dim, row = (uint64_t)g.heads * g.dim;
    double *mn = malloc(2 * row * sizeof(double) + (elems + 2 * row) * sizeof(float));
    if (!mn) return KVS_ENOMEM;
    double *inv = mn + row;
    float *x = (float *)(void *)(inv + row), *lo = x + elems, *hi = lo + row;
    uint8_t *o = out, *v = o + g.codes + g.k_meta;
    double top = top_of(dtype);
    int ok = to_floats(dtype, k_rows, elems, x);
    if (ok)
        ok = c->kind == KVS_CODEC_KIVI
                 ? kivi_encode_k(c, &g, top, x, o, o + g.codes, lo, hi, mn, inv)
                 : int8_encode(&g, top, x, o, o + g.codes);
    if (ok && shape->has_v) {
        ok = to_floats(dtype, v_rows, elems, x);
        if (ok)
            ok = c->kind == KVS_CODEC_KIVI ? kivi_encode_v(c, &g, top, x, v, v + g.codes)
                                           : int8_encode(&g, top, x, v, v + g.codes);
    }
    free(mn);
    return ok ? KVS_OK : KVS_EINVAL;
}

/* ---- decoding into pages ------------------------------------------------------------------------- */

/* Scratch of one decode call: a row of floats and codes, and K's (m, s) for the current token group,
 * every head, as floats. */
typedef struct dec {
    float *x;    /* [dim] */
    uint8_t *q;  /* [dim] */
    float *km;   /* [heads][dim] */
    float *ks;   /* [heads][dim] */
    uint32_t kg; /* the token group km/ks hold, UINT32_MAX: none */
} dec;

static void unpack_row(const uint8_t *row, uint32_t dim, uint32_t bits, uint8_t *q) {
    if (bits == 2) {
        for (uint32_t i = 0; i < dim / 4u; i++) {
            uint8_t b = row[i];
            q[4 * i] = b & 3u, q[4 * i + 1] = (b >> 2) & 3u;
            q[4 * i + 2] = (b >> 4) & 3u, q[4 * i + 3] = (uint8_t)(b >> 6);
        }
    } else {
        for (uint32_t i = 0; i < dim / 2u; i++) q[2 * i] = row[i] & 15u, q[2 * i + 1] = row[i] >> 4;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* fp32 -> fp16 with the CPU's converter (F16C rounds to nearest even exactly as kvs_f32_to_f16). */
__attribute__((target("avx,f16c"))) static void store_f16_f16c(uint8_t *dst, const float *x,
                                                               uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), h);
    }
    for (; i < n; i++) kvs_dtype_store(KVS_DTYPE_FP16, dst, i, x[i]);
}
static int have_f16c(void) { /* a read of what libgcc found at start; no state of ours */
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}
/* fp16 -> fp32: exact either way. */
__attribute__((target("avx,f16c"))) static void load_f16_f16c(const uint8_t *src, uint64_t n,
                                                              float *out) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(
                                      (const __m128i *)(const void *)(src + 2 * i))));
    for (; i < n; i++) out[i] = kvs_dtype_load(KVS_DTYPE_FP16, src, i);
}
#else
static void load_f16_f16c(const uint8_t *src, uint64_t n, float *out) {
    for (uint64_t i = 0; i < n; i++) out[i] = kvs_dtype_load(KVS_DTYPE_FP16, src, i);
}
static void store_f16_f16c(uint8_t *dst, const float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) kvs_dtype_store(KVS_DTYPE_FP16, dst, i, x[i]);
}
static int have_f16c(void) {
    return 0;
}
#endif

static void load_f16(const uint8_t *src, uint64_t n, float *out) {
    if (have_f16c()) {
        load_f16_f16c(src, n, out);
        return;
    }
    for (uint64_t i = 0; i < n; i++) out[i] = kvs_dtype_load(KVS_DTYPE_FP16, src, i);
}

static void store_row(uint32_t dtype, uint8_t *dst, const float *x, uint32_t n) {
    if (dtype == KVS_DTYPE_FP32) {
        memcpy(dst, x, n * sizeof *x);
    } else if (dtype == KVS_DTYPE_FP16 && have_f16c()) {
        store_f16_f16c(dst, x, n);
    } else if (dtype == KVS_DTYPE_BF16) {
        for (uint32_t i = 0; i < n; i++) {
            uint16_t h = kvs_f32_to_bf16(x[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
    } else {
        for (uint32_t i = 0; i < n; i++) kvs_dtype_store(dtype, dst, i, x[i]);
    }
}

/* Row (token t of the layer, head h) of K or V into dst (head_dim elements of dtype). q * s is
 * exact in fp32, so with or without a fused multiply-add each element rounds once, as on the GPU. */
static void decode_row(const kvs_codec *c, const geom *g, uint32_t dtype, const uint8_t *codes,
                       const uint8_t *meta, int is_v, uint32_t t, uint32_t h, uint8_t *dst,
                       dec *w) {
    uint64_t r = (uint64_t)t * g->heads + h;
    float *x = w->x;
    if (c->kind == KVS_CODEC_INT8) {
        float s = kvs_f16_to_f32(get16(meta + r * 2u));
        const int8_t *q = (const int8_t *)(codes + r * g->dim);
        for (uint32_t d = 0; d < g->dim; d++) x[d] = (float)q[d] * s;
        store_row(dtype, dst, x, g->dim);
        return;
    }
    unpack_row(codes + r * g->row_codes, g->dim, c->bits, w->q);
    if (!is_v) { /* K: the (m, s) of each channel in token t's group */
        uint32_t grp = t / c->k_group;
        if (w->kg != grp) {
            const uint8_t *gm = meta + (uint64_t)grp * g->heads * g->dim * 4u;
            for (uint64_t e = 0; e < (uint64_t)g->heads * g->dim; e++) {
                w->km[e] = kvs_f16_to_f32(get16(gm + e * 4u));
                w->ks[e] = kvs_f16_to_f32(get16(gm + e * 4u + 2));
            }
            w->kg = grp;
        }
        const float *m = w->km + (uint64_t)h * g->dim, *s = w->ks + (uint64_t)h * g->dim;
        for (uint32_t d = 0; d < g->dim; d++) x[d] = (float)w->q[d] * s[d] + m[d];
    } else {
        const uint8_t *gm = meta + r * g->v_groups * 4u;
        for (uint32_t grp = 0; grp < g->v_groups; grp++) {
            float m = kvs_f16_to_f32(get16(gm + grp * 4u)),
                  s = kvs_f16_to_f32(get16(gm + grp * 4u + 2));
            uint32_t d0 = grp * c->v_group,
                     d1 = d0 + c->v_group < g->dim ? d0 + c->v_group : g->dim;
            for (uint32_t d = d0; d < d1; d++) x[d] = (float)w->q[d] * s + m;
        }
    }
    store_row(dtype, dst, x, g->dim);
}

kvs_status kvs_codec_scatter_layer(const kvs_codec *c, const kvs_layer_view *view,
                                   const kvs_kv_shape *shape, uint32_t dtype,
                                   const kvs_token_span *span, const void *encoded) {
    return kvs_codec_scatter_rows(c, view, shape, dtype, span, encoded, span->n_tokens, 0);
}

kvs_status kvs_codec_scatter_rows(const kvs_codec *c, const kvs_layer_view *view,
                                  const kvs_kv_shape *shape, uint32_t dtype,
                                  const kvs_token_span *span, const void *encoded,
                                  uint32_t encoded_tokens, uint32_t first_row) {
    if (first_row > encoded_tokens || span->n_tokens > encoded_tokens - first_row)
        return KVS_EINVAL;
    if (c->kind == KVS_CODEC_DROP)
        return kvs_codec_drop_scatter_rows(c, view, shape, dtype, span, encoded, encoded_tokens,
                                           first_row);
    geom g = geom_of(c, shape, dtype, encoded_tokens);
    const uint8_t *k_codes = encoded, *k_meta = k_codes + g.codes;
    const uint8_t *v_codes = k_meta + g.k_meta, *v_meta = v_codes + g.codes;
    uint64_t row = (uint64_t)g.heads * g.dim;
    /* one allocation per layer: the row scratch and K's group table as floats */
    float *buf = malloc((g.dim + 2 * row) * sizeof(float) + g.dim);
    if (!buf) return KVS_ENOMEM;
    dec w = {.x = buf,
             .km = buf + g.dim,
             .ks = buf + g.dim + row,
             .q = (uint8_t *)(void *)(buf + g.dim + 2 * row),
             .kg = UINT32_MAX};
    for (uint32_t t = 0; t < span->n_tokens; t++) {
        uint64_t pos = span->first_token + t;
        int64_t off = (int64_t)span->block_ids[pos / shape->block_tokens] * view->block_stride +
                      (int64_t)(pos % shape->block_tokens) * view->token_stride;
        for (uint32_t h = 0; h < g.heads; h++) {
            int64_t at = off + (int64_t)h * view->head_stride;
            uint32_t r = first_row + t; /* its row in the encoded layer */
            decode_row(c, &g, dtype, k_codes, k_meta, 0, r, h, (uint8_t *)view->k_base + at, &w);
            if (shape->has_v)
                decode_row(c, &g, dtype, v_codes, v_meta, 1, r, h, (uint8_t *)view->v_base + at,
                           &w);
        }
    }
    free(buf);
    return KVS_OK;
}

kvs_status kvs_codec_decode_layer(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                  uint32_t n_tokens, const void *encoded, void *k_rows,
                                  void *v_rows) {
    if (n_tokens == 0) return KVS_OK;
    /* the rows as one page holding every token */
    kvs_kv_shape one = *shape;
    one.block_tokens = n_tokens;
    int64_t token = (int64_t)shape->n_heads * shape->head_bytes;
    kvs_layer_view v = {.struct_size = sizeof v,
                        .n_blocks = 1,
                        .k_base = k_rows,
                        .v_base = shape->has_v ? v_rows : NULL,
                        .block_stride = token * n_tokens,
                        .token_stride = token,
                        .head_stride = shape->head_bytes};
    const uint32_t block0 = 0;
    kvs_token_span span = {.block_ids = &block0, .n_block_ids = 1, .n_tokens = n_tokens};
    return kvs_codec_scatter_layer(c, &v, &one, dtype, &span, encoded);
}

/* ||a - b|| / ||a|| over n elements of dtype; 0 when a is all zero. */
static double rel_diff(uint32_t dtype, const void *a, const void *b, uint64_t n) {
    double num = 0, den = 0;
    for (uint64_t i = 0; i < n; i++) {
        double x = kvs_dtype_load(dtype, a, i), y = kvs_dtype_load(dtype, b, i);
        num += (x - y) * (x - y);
        den += x * x;
    }
    return den > 0 ? sqrt(num / den) : 0.0;
}

kvs_status kvs_codec_layer_error(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                 uint32_t n_tokens, const void *k_rows, const void *v_rows,
                                 double *rel_k, double *rel_v) {
    uint64_t part = (uint64_t)n_tokens * shape->n_heads * shape->head_bytes;
    uint64_t elems = part / (kvs_dtype_bytes(dtype) ? kvs_dtype_bytes(dtype) : 1);
    uint64_t enc = kvs_codec_layer_bytes(c, shape, dtype, n_tokens);
    uint8_t *buf = malloc(enc + 2 * part + 1);
    if (!buf) return KVS_ENOMEM;
    uint8_t *k2 = buf + enc, *v2 = k2 + part;
    kvs_status st = kvs_codec_encode_layer(c, shape, dtype, n_tokens, k_rows, v_rows, buf);
    if (st == KVS_OK)
        st = kvs_codec_decode_layer(c, shape, dtype, n_tokens, buf, k2, shape->has_v ? v2 : NULL);
    if (st == KVS_OK) {
        *rel_k = rel_diff(dtype, k_rows, k2, elems);
        *rel_v = shape->has_v ? rel_diff(dtype, v_rows, v2, elems) : 0.0;
    }
    free(buf);
    return st;
}
