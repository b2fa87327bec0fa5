/* codec.c - the reference codecs (codec.h): encoding from raw payload rows, decoding fused into the
 * scatter into the engine's pages. Quantisation arithmetic is done in double so the error bound holds
 * for every element; decoding is one fp32 multiply-add per element (q * s is exact in fp32: q has at
 * most 8 bits and s 11) and one rounding into the engine's dtype, the same operations the CUDA
 * kernel does. */
#include "kernels/cpu/codec.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

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

typedef struct geom {
    uint32_t n, heads, dim, elem;
    uint32_t levels;    /* KIVI: 2^bits - 1 */
    uint32_t row_codes; /* code bytes of one (token, head) row */
    uint32_t k_groups;  /* KIVI: token groups of K */
    uint32_t v_groups;  /* KIVI: channel groups of one V row */
    uint64_t codes;     /* code bytes of K (and of V) */
    uint64_t k_meta;    /* bytes of K's group table (INT8: steps) */
    uint64_t v_meta;
} geom;

static geom geometry(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype, uint32_t n) {
    geom g;
    memset(&g, 0, sizeof g);
    g.n = n;
    g.heads = shape->n_heads;
    g.elem = kvs_dtype_bytes(dtype);
    g.dim = g.elem ? shape->head_bytes / g.elem : 0;
    if (c->kind == KVS_CODEC_KIVI) {
        g.levels = (1u << c->bits) - 1u;
        g.row_codes = g.dim * c->bits / 8u;
        g.k_groups = c->k_group ? (n + c->k_group - 1u) / c->k_group : 0;
        g.v_groups = c->v_group ? (g.dim + c->v_group - 1u) / c->v_group : 0;
        g.k_meta = (uint64_t)g.k_groups * g.heads * g.dim * 4u;
        g.v_meta = (uint64_t)n * g.heads * g.v_groups * 4u;
    } else {
        g.levels = 127;
        g.row_codes = g.dim;
        g.k_meta = g.v_meta = (uint64_t)n * g.heads * 2u;
    }
    g.codes = (uint64_t)n * g.heads * g.row_codes;
    return g;
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
    geom g = geometry(c, shape, dtype, n_tokens);
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

static int is_finite(float x) {
    return x == x && x <= 3.4e38f && x >= -3.4e38f;
}

/* One asymmetric group: (m, s) and its codes through put(q, index). Returns 0 if unrepresentable. */
static int group_params(float lo, float hi, uint32_t levels, uint16_t *m, uint16_t *s) {
    if (!f16_down(lo, m)) return 0;
    double mn = (double)kvs_f16_to_f32(*m);
    if ((double)hi == mn) {
        *s = 0;
        return 1;
    }
    return f16_up(((double)hi - mn) / (double)levels, s);
}

static uint32_t quantise(float x, double mn, double inv, uint32_t levels) {
    double q = rint(((double)x - mn) * inv);
    if (q < 0.0) q = 0.0;
    if (q > (double)levels) q = (double)levels;
    return (uint32_t)q;
}

static void pack(uint8_t *row, uint32_t d, uint32_t bits, uint32_t q) {
    uint32_t bit = d * bits;
    row[bit / 8u] |= (uint8_t)(q << (bit % 8u));
}

static uint32_t unpack(const uint8_t *row, uint32_t d, uint32_t bits) {
    uint32_t bit = d * bits;
    return (uint32_t)(row[bit / 8u] >> (bit % 8u)) & ((1u << bits) - 1u);
}

/* K of KIVI: per channel over groups of k_group tokens. */
static int kivi_encode_k(const kvs_codec *c, const geom *g, uint32_t dtype, const uint8_t *rows,
                         uint8_t *codes, uint8_t *meta) {
    uint64_t row_elems = (uint64_t)g->heads * g->dim;
    memset(codes, 0, g->codes);
    for (uint32_t grp = 0; grp < g->k_groups; grp++) {
        uint32_t t0 = grp * c->k_group, t1 = t0 + c->k_group < g->n ? t0 + c->k_group : g->n;
        for (uint64_t e = 0; e < row_elems; e++) {
            float lo = INFINITY, hi = -INFINITY;
            for (uint32_t t = t0; t < t1; t++) {
                float x = kvs_dtype_load(dtype, rows, t * row_elems + e);
                if (!is_finite(x)) return 0;
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
            }
            uint16_t m, s;
            if (!group_params(lo, hi, g->levels, &m, &s)) return 0;
            uint8_t *gm = meta + ((uint64_t)grp * row_elems + e) * 4u;
            put16(gm, m);
            put16(gm + 2, s);
            double mn = kvs_f16_to_f32(m), step = kvs_f16_to_f32(s), inv = s ? 1.0 / step : 0.0;
            uint32_t h = (uint32_t)(e / g->dim), d = (uint32_t)(e % g->dim);
            for (uint32_t t = t0; t < t1; t++) {
                float x = kvs_dtype_load(dtype, rows, t * row_elems + e);
                uint8_t *row = codes + ((uint64_t)t * g->heads + h) * g->row_codes;
                pack(row, d, c->bits, s ? quantise(x, mn, inv, g->levels) : 0u);
            }
        }
    }
    return 1;
}

/* V of KIVI: per token over groups of v_group channels. */
static int kivi_encode_v(const kvs_codec *c, const geom *g, uint32_t dtype, const uint8_t *rows,
                         uint8_t *codes, uint8_t *meta) {
    memset(codes, 0, g->codes);
    for (uint64_t r = 0; r < (uint64_t)g->n * g->heads; r++) {
        uint64_t base = r * g->dim;
        uint8_t *row = codes + r * g->row_codes;
        for (uint32_t grp = 0; grp < g->v_groups; grp++) {
            uint32_t d0 = grp * c->v_group,
                     d1 = d0 + c->v_group < g->dim ? d0 + c->v_group : g->dim;
            float lo = INFINITY, hi = -INFINITY;
            for (uint32_t d = d0; d < d1; d++) {
                float x = kvs_dtype_load(dtype, rows, base + d);
                if (!is_finite(x)) return 0;
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
            }
            uint16_t m, s;
            if (!group_params(lo, hi, g->levels, &m, &s)) return 0;
            uint8_t *gm = meta + (r * g->v_groups + grp) * 4u;
            put16(gm, m);
            put16(gm + 2, s);
            double mn = kvs_f16_to_f32(m), step = kvs_f16_to_f32(s), inv = s ? 1.0 / step : 0.0;
            for (uint32_t d = d0; d < d1; d++) {
                float x = kvs_dtype_load(dtype, rows, base + d);
                pack(row, d, c->bits, s ? quantise(x, mn, inv, g->levels) : 0u);
            }
        }
    }
    return 1;
}

/* INT8: one symmetric step per (token, head) row. */
static int int8_encode(const geom *g, uint32_t dtype, const uint8_t *rows, uint8_t *codes,
                       uint8_t *steps) {
    for (uint64_t r = 0; r < (uint64_t)g->n * g->heads; r++) {
        uint64_t base = r * g->dim;
        double a = 0.0;
        for (uint32_t d = 0; d < g->dim; d++) {
            float x = kvs_dtype_load(dtype, rows, base + d);
            if (!is_finite(x)) return 0;
            a = fabs((double)x) > a ? fabs((double)x) : a;
        }
        uint16_t s = 0;
        if (a > 0.0 && !f16_up(a / 127.0, &s)) return 0;
        put16(steps + r * 2u, s);
        double inv = s ? 1.0 / (double)kvs_f16_to_f32(s) : 0.0;
        for (uint32_t d = 0; d < g->dim; d++) {
            double q = rint((double)kvs_dtype_load(dtype, rows, base + d) * inv);
            q = q > 127.0 ? 127.0 : q < -127.0 ? -127.0 : q;
            codes[base + d] = (uint8_t)(int8_t)q;
        }
    }
    return 1;
}

kvs_status kvs_codec_encode_layer(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                  uint32_t n_tokens, const void *k_rows, const void *v_rows,
                                  void *out) {
    geom g = geometry(c, shape, dtype, n_tokens);
    uint8_t *o = out;
    int ok;
    if (c->kind == KVS_CODEC_KIVI) {
        ok = kivi_encode_k(c, &g, dtype, k_rows, o, o + g.codes);
        if (ok && shape->has_v) {
            uint8_t *v = o + g.codes + g.k_meta;
            ok = kivi_encode_v(c, &g, dtype, v_rows, v, v + g.codes);
        }
    } else {
        ok = int8_encode(&g, dtype, k_rows, o, o + g.codes);
        if (ok && shape->has_v) {
            uint8_t *v = o + g.codes + g.k_meta;
            ok = int8_encode(&g, dtype, v_rows, v, v + g.codes);
        }
    }
    return ok ? KVS_OK : KVS_EINVAL;
}

/* ---- decoding into pages ------------------------------------------------------------------------- */

/* Row (token t of the layer, head h) of K or V into dst (head_dim elements of dtype). */
static void decode_row(const kvs_codec *c, const geom *g, uint32_t dtype, const uint8_t *codes,
                       const uint8_t *meta, int is_v, uint32_t t, uint32_t h, uint8_t *dst) {
    uint64_t r = (uint64_t)t * g->heads + h;
    if (c->kind == KVS_CODEC_INT8) {
        float s = kvs_f16_to_f32(get16(meta + r * 2u));
        const int8_t *q = (const int8_t *)(codes + r * g->dim);
        for (uint32_t d = 0; d < g->dim; d++) kvs_dtype_store(dtype, dst, d, (float)q[d] * s);
        return;
    }
    const uint8_t *row = codes + r * g->row_codes;
    if (!is_v) { /* K: the (m, s) of channel d in token t's group */
        const uint8_t *gm = meta + ((uint64_t)(t / c->k_group) * g->heads + h) * g->dim * 4u;
        for (uint32_t d = 0; d < g->dim; d++) {
            float m = kvs_f16_to_f32(get16(gm + d * 4u)),
                  s = kvs_f16_to_f32(get16(gm + d * 4u + 2));
            kvs_dtype_store(dtype, dst, d, (float)unpack(row, d, c->bits) * s + m);
        }
        return;
    }
    const uint8_t *gm = meta + r * g->v_groups * 4u;
    for (uint32_t d = 0; d < g->dim; d++) {
        const uint8_t *p = gm + (d / c->v_group) * 4u;
        float m = kvs_f16_to_f32(get16(p)), s = kvs_f16_to_f32(get16(p + 2));
        kvs_dtype_store(dtype, dst, d, (float)unpack(row, d, c->bits) * s + m);
    }
}

void kvs_codec_scatter_layer(const kvs_codec *c, const kvs_layer_view *view,
                             const kvs_kv_shape *shape, uint32_t dtype, const kvs_token_span *span,
                             const void *encoded) {
    geom g = geometry(c, shape, dtype, span->n_tokens);
    const uint8_t *k_codes = encoded, *k_meta = k_codes + g.codes;
    const uint8_t *v_codes = k_meta + g.k_meta, *v_meta = v_codes + g.codes;
    for (uint32_t t = 0; t < span->n_tokens; t++) {
        uint64_t pos = span->first_token + t;
        int64_t off = (int64_t)span->block_ids[pos / shape->block_tokens] * view->block_stride +
                      (int64_t)(pos % shape->block_tokens) * view->token_stride;
        for (uint32_t h = 0; h < g.heads; h++) {
            int64_t at = off + (int64_t)h * view->head_stride;
            decode_row(c, &g, dtype, k_codes, k_meta, 0, t, h, (uint8_t *)view->k_base + at);
            if (shape->has_v)
                decode_row(c, &g, dtype, v_codes, v_meta, 1, t, h, (uint8_t *)view->v_base + at);
        }
    }
}

void kvs_codec_decode_layer(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                            uint32_t n_tokens, const void *encoded, void *k_rows, void *v_rows) {
    if (n_tokens == 0) return;
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
    kvs_codec_scatter_layer(c, &v, &one, dtype, &span, encoded);
}
