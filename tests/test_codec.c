/* test_codec.c - the lossy codecs (kernels/cpu/codec.h): every element within the stated bound for
 * every codec, dtype and shape; exact where the bound says exact; refusals for what cannot be encoded;
 * the fused decode-scatter equal to decoding then scattering, touching nothing outside the span. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/codec.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/kernels.h"
#include "kernels/device.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}

static double normal(void) {
    double u = uniform() + 1e-300, v = uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* KV-like rows: [n][heads][dim] of dtype, channel means and scales per (head, dim), a few outlier
 * channels (as real keys have), values rounded into the dtype. */
static void *make_rows(uint32_t dtype, uint32_t n, uint32_t heads, uint32_t dim, int outliers) {
    uint32_t el = kvs_dtype_bytes(dtype);
    uint8_t *rows = malloc((size_t)n * heads * dim * el);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < heads; h++)
            for (uint32_t d = 0; d < dim; d++) {
                double mean = outliers && d % 16 == 3 ? 8.0 : 0.3 * sin((double)(h * dim + d));
                double sd = outliers && d % 16 == 3 ? 4.0 : 1.0;
                kvs_dtype_store(dtype, rows, ((uint64_t)t * heads + h) * dim + d,
                                (float)(mean + sd * normal()));
            }
    return rows;
}

static const kvs_codec kivi2 = {.kind = KVS_CODEC_KIVI, .bits = 2, .k_group = 32, .v_group = 32};
static const kvs_codec kivi4 = {.kind = KVS_CODEC_KIVI, .bits = 4, .k_group = 32, .v_group = 32};
static const kvs_codec int8 = {.kind = KVS_CODEC_INT8, .bits = 8};
static const kvs_codec drop20 = {.kind = KVS_CODEC_DROP, .k_group = 20};

/* Largest |x - x'| over its bound, checking every element of one part (K or V). The group of each
 * element is recomputed here from the codec's definition. */
static double worst_over_bound(const kvs_codec *c, uint32_t dtype, uint32_t n, uint32_t heads,
                               uint32_t dim, int is_v, const void *x, const void *y) {
    double worst = 0.0;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < heads; h++)
            for (uint32_t d = 0; d < dim; d++) {
                /* the group: K of KIVI runs over tokens, V of KIVI over channels, INT8 the row */
                uint32_t t0 = t, t1 = t + 1, d0 = d, d1 = d + 1;
                if (c->kind == KVS_CODEC_INT8) {
                    d0 = 0, d1 = dim;
                } else if (!is_v) {
                    t0 = t / c->k_group * c->k_group;
                    t1 = t0 + c->k_group < n ? t0 + c->k_group : n;
                } else {
                    d0 = d / c->v_group * c->v_group;
                    d1 = d0 + c->v_group < dim ? d0 + c->v_group : dim;
                }
                float lo = INFINITY, hi = -INFINITY;
                for (uint32_t tt = t0; tt < t1; tt++)
                    for (uint32_t dd = d0; dd < d1; dd++) {
                        float v = kvs_dtype_load(dtype, x, ((uint64_t)tt * heads + h) * dim + dd);
                        lo = v < lo ? v : lo;
                        hi = v > hi ? v : hi;
                    }
                uint64_t i = ((uint64_t)t * heads + h) * dim + d;
                float a = kvs_dtype_load(dtype, x, i), b = kvs_dtype_load(dtype, y, i);
                float mag = fabsf(a) > fabsf(b) ? fabsf(a) : fabsf(b);
                double bound = kvs_codec_step_bound(c, lo, hi) / 2.0 * (1.0 + 0x1p-20) +
                               kvs_dtype_ulp(dtype, mag);
                double r = fabs((double)a - (double)b) / bound;
                if (isnan(r) || isinf(b)) r = INFINITY; /* an infinity or NaN decoded: never fine */
                if (r > worst) worst = r;
            }
    return worst;
}

static double rel_error(uint32_t dtype, uint64_t count, const void *x, const void *y) {
    double num = 0, den = 0;
    for (uint64_t i = 0; i < count; i++) {
        double a = kvs_dtype_load(dtype, x, i), b = kvs_dtype_load(dtype, y, i);
        num += (a - b) * (a - b);
        den += a * a;
    }
    return sqrt(num / den);
}

static const uint32_t dtypes[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32,
                                  KVS_DTYPE_FP8_E4M3, KVS_DTYPE_FP8_E5M2};

START_TEST(every_element_is_within_the_stated_bound) {
    const kvs_codec *codecs[] = {&kivi2, &kivi4, &int8};
    for (size_t ci = 0; ci < 3; ci++)
        for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++)
            for (int has_v = 0; has_v < 2; has_v++) {
                const kvs_codec *c = codecs[ci];
                uint32_t dtype = dtypes[di], n = 77, heads = 3, dim = 64; /* n: a partial group */
                kvs_kv_shape shape = {.n_heads = heads,
                                      .head_bytes = dim * kvs_dtype_bytes(dtype),
                                      .block_tokens = 16,
                                      .has_v = has_v};
                char err[128];
                ck_assert_int_eq(kvs_codec_check(c, &shape, dtype, err, sizeof err), KVS_OK);
                void *k = make_rows(dtype, n, heads, dim, 1),
                     *v = make_rows(dtype, n, heads, dim, 0);
                uint64_t bytes = kvs_codec_layer_bytes(c, &shape, dtype, n);
                uint8_t *enc = malloc(bytes + 64);
                memset(enc + bytes, 0xa5, 64);
                ck_assert_int_eq(kvs_codec_encode_layer(c, &shape, dtype, n, k, v, enc), KVS_OK);
                for (int i = 0; i < 64; i++) ck_assert_uint_eq(enc[bytes + (size_t)i], 0xa5);
                size_t part = (size_t)n * heads * dim * kvs_dtype_bytes(dtype);
                void *k2 = malloc(part), *v2 = malloc(part);
                ck_assert_int_eq(kvs_codec_decode_layer(c, &shape, dtype, n, enc, k2, v2), KVS_OK);
                double wk = worst_over_bound(c, dtype, n, heads, dim, 0, k, k2);
                ck_assert_msg(wk <= 1.0, "codec %zu dtype %u: K error %.3f of its bound", ci, dtype,
                              wk);
                if (has_v) {
                    double wv = worst_over_bound(c, dtype, n, heads, dim, 1, v, v2);
                    ck_assert_msg(wv <= 1.0, "codec %zu dtype %u: V error %.3f of its bound", ci,
                                  dtype, wv);
                }
                free(k), free(v), free(k2), free(v2), free(enc);
            }
}
END_TEST

/* Values at the top of the dtype's range: a step rounded up could put the grid's far end past what
 * the pages hold (fp16 rounds 65520 up to infinity). Each group is then encoded with a step that
 * keeps the grid inside, or the layer is refused (kept raw): never an infinity in the pages. */
START_TEST(values_at_the_top_of_the_range_never_decode_to_infinity) {
    const uint32_t tops[][2] = {{KVS_DTYPE_FP16, 0}, {KVS_DTYPE_FP8_E5M2, 0}};
    const float big[2][4] = {{65504.0f, 65472.0f, 65280.0f, 60000.0f},
                             {57344.0f, 49152.0f, 40960.0f, 53248.0f}};
    const kvs_codec *codecs[] = {&kivi2, &kivi4, &int8};
    for (int di = 0; di < 2; di++)
        for (int ci = 0; ci < 3; ci++)
            for (int shape_kind = 0; shape_kind < 3; shape_kind++) {
                uint32_t dtype = tops[di][0], n = 32, heads = 1, dim = 32;
                kvs_kv_shape shape = {.n_heads = heads,
                                      .head_bytes = dim * kvs_dtype_bytes(dtype),
                                      .block_tokens = 16,
                                      .has_v = 1};
                uint8_t *k = malloc(n * dim * 4), *v = malloc(n * dim * 4);
                for (uint32_t i = 0; i < n * dim; i++) {
                    /* groups from 0 up to the top, from -top to top, or near the top only */
                    float x = shape_kind == 0   ? big[di][i % 4] * (float)(i % 3) / 2.0f
                              : shape_kind == 1 ? big[di][i % 4] * (i % 2 ? 1.0f : -1.0f)
                                                : big[di][i % 4];
                    kvs_dtype_store(dtype, k, i, x);
                    kvs_dtype_store(dtype, v, i, x);
                }
                uint8_t *enc = malloc(kvs_codec_layer_bytes(codecs[ci], &shape, dtype, n));
                kvs_status st = kvs_codec_encode_layer(codecs[ci], &shape, dtype, n, k, v, enc);
                if (st == KVS_EINVAL) goto next; /* kept raw: fine */
                ck_assert_int_eq(st, KVS_OK);
                uint8_t *k2 = malloc(n * dim * 4), *v2 = malloc(n * dim * 4);
                ck_assert_int_eq(kvs_codec_decode_layer(codecs[ci], &shape, dtype, n, enc, k2, v2),
                                 KVS_OK);
                double wk = worst_over_bound(codecs[ci], dtype, n, heads, dim, 0, k, k2);
                double wv = worst_over_bound(codecs[ci], dtype, n, heads, dim, 1, v, v2);
                ck_assert_msg(wk <= 1.0 && wv <= 1.0, "dtype %u codec %d data %d: %.3f / %.3f",
                              dtype, ci, shape_kind, wk, wv);
                free(k2), free(v2);
            next:
                free(k), free(v), free(enc);
            }
}
END_TEST

/* The sizes of codec.h's layout, and the rates they give a Llama-like head (dim 128, fp16). */
START_TEST(sizes_follow_the_layout) {
    kvs_kv_shape shape = {.n_heads = 8, .head_bytes = 256, .block_tokens = 16, .has_v = 1};
    uint32_t n = 256;
    uint64_t codes2 = (uint64_t)n * 8 * 128 * 2 / 8, k_meta = (uint64_t)(n / 32) * 8 * 128 * 4,
             v_meta = (uint64_t)n * 8 * (128 / 32) * 4;
    ck_assert_uint_eq(kvs_codec_layer_bytes(&kivi2, &shape, KVS_DTYPE_FP16, n),
                      2 * codes2 + k_meta + v_meta);
    ck_assert_double_eq_tol(kvs_codec_rate(&kivi2, &shape, KVS_DTYPE_FP16, n), 0.1875, 1e-9);
    ck_assert_double_eq_tol(kvs_codec_rate(&kivi4, &shape, KVS_DTYPE_FP16, n), 0.3125, 1e-9);
    ck_assert_double_eq_tol(kvs_codec_rate(&int8, &shape, KVS_DTYPE_FP16, n), (128.0 + 2.0) / 256.0,
                            1e-9);
    shape.has_v = 0; /* MLA: K only */
    ck_assert_uint_eq(kvs_codec_layer_bytes(&kivi2, &shape, KVS_DTYPE_FP16, n), codes2 + k_meta);
}
END_TEST

/* Values on a group's grid come back bit for bit; so does a constant group. */
START_TEST(values_on_the_grid_and_constant_groups_are_exact) {
    uint32_t n = 32, heads = 1, dim = 32;
    kvs_kv_shape shape = {.n_heads = heads, .head_bytes = dim * 2, .block_tokens = 16, .has_v = 1};
    uint16_t *k = malloc(n * dim * 2), *v = malloc(n * dim * 2);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t d = 0; d < dim; d++) {
            /* K channel d: m = -1.5 + d/8, s = 0.25: grid points m + q*s, q = t % 4 */
            k[t * dim + d] = kvs_f32_to_f16(-1.5f + (float)d / 8.0f + 0.25f * (float)(t % 4));
            v[t * dim + d] = kvs_f32_to_f16(0.75f); /* constant V rows */
        }
    /* every channel must reach both ends of its grid within the group: q 0 and 3 appear */
    uint8_t *enc = malloc(kvs_codec_layer_bytes(&int8, &shape, KVS_DTYPE_FP16, n)); /* the larger */
    ck_assert_int_eq(kvs_codec_encode_layer(&kivi2, &shape, KVS_DTYPE_FP16, n, k, v, enc), KVS_OK);
    uint16_t *k2 = malloc(n * dim * 2), *v2 = malloc(n * dim * 2);
    ck_assert_int_eq(kvs_codec_decode_layer(&kivi2, &shape, KVS_DTYPE_FP16, n, enc, k2, v2),
                     KVS_OK);
    ck_assert_mem_eq(k2, k, n * dim * 2);
    ck_assert_mem_eq(v2, v, n * dim * 2);
    /* INT8: rows of multiples of 1/8 whose largest |x| is 127/8, so the step is exactly 1/8 */
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t d = 0; d < dim; d++)
            k[t * dim + d] = kvs_f32_to_f16(
                0.125f * (float)(d == 0 ? 127 : (int)((t * 7 + d * 13) % 255) - 127));
    ck_assert_int_eq(kvs_codec_encode_layer(&int8, &shape, KVS_DTYPE_FP16, n, k, v, enc), KVS_OK);
    ck_assert_int_eq(kvs_codec_decode_layer(&int8, &shape, KVS_DTYPE_FP16, n, enc, k2, v2), KVS_OK);
    ck_assert_mem_eq(k2, k, n * dim * 2); /* (V's constant rows: 0.75/127 is no fp16 step) */
    free(k), free(v), free(k2), free(v2), free(enc);
}
END_TEST

START_TEST(what_cannot_be_encoded_is_refused) {
    uint32_t n = 16, heads = 2, dim = 16;
    kvs_kv_shape shape = {.n_heads = heads, .head_bytes = dim * 4, .block_tokens = 16, .has_v = 1};
    float *k = make_rows(KVS_DTYPE_FP32, n, heads, dim, 0),
          *v = make_rows(KVS_DTYPE_FP32, n, heads, dim, 0);
    uint8_t *enc = malloc(kvs_codec_layer_bytes(&int8, &shape, KVS_DTYPE_FP32, n) +
                          kvs_codec_layer_bytes(&kivi4, &shape, KVS_DTYPE_FP32, n));
    const kvs_codec *codecs[] = {&kivi2, &kivi4, &int8};
    for (int ci = 0; ci < 3; ci++) {
        float keep = v[37];
        v[37] = NAN;
        ck_assert_int_eq(kvs_codec_encode_layer(codecs[ci], &shape, KVS_DTYPE_FP32, n, k, v, enc),
                         KVS_EINVAL);
        v[37] = INFINITY;
        ck_assert_int_eq(kvs_codec_encode_layer(codecs[ci], &shape, KVS_DTYPE_FP32, n, k, v, enc),
                         KVS_EINVAL);
        v[37] = 1e9f; /* a step fp16 cannot hold */
        ck_assert_int_eq(kvs_codec_encode_layer(codecs[ci], &shape, KVS_DTYPE_FP32, n, k, v, enc),
                         KVS_EINVAL);
        v[37] = keep;
        ck_assert_int_eq(kvs_codec_encode_layer(codecs[ci], &shape, KVS_DTYPE_FP32, n, k, v, enc),
                         KVS_OK);
    }
    char err[128];
    kvs_codec bad = kivi2;
    bad.bits = 3;
    ck_assert_int_eq(kvs_codec_check(&bad, &shape, KVS_DTYPE_FP32, err, sizeof err), KVS_EINVAL);
    bad = kivi2;
    bad.v_group = (uint16_t)(dim + 1);
    ck_assert_int_eq(kvs_codec_check(&bad, &shape, KVS_DTYPE_FP32, err, sizeof err), KVS_EINVAL);
    bad.v_group = 8;
    bad.k_group = 0;
    ck_assert_int_eq(kvs_codec_check(&bad, &shape, KVS_DTYPE_FP32, err, sizeof err), KVS_EINVAL);
    bad = int8;
    bad.kind = 9;
    ck_assert_int_eq(kvs_codec_check(&bad, &shape, KVS_DTYPE_FP32, err, sizeof err), KVS_EINVAL);
    kvs_kv_shape odd = {.n_heads = 1, .head_bytes = 6, .block_tokens = 16, .has_v = 1};
    ck_assert_int_eq(kvs_codec_check(&kivi2, &odd, KVS_DTYPE_FP16, err, sizeof err), KVS_EINVAL);
    odd.head_bytes = 5;
    ck_assert_int_eq(kvs_codec_check(&int8, &odd, KVS_DTYPE_FP16, err, sizeof err), KVS_EINVAL);
    free(k), free(v), free(enc);
}
END_TEST

static float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kvs_f16_to_f32(h);
}

/* codec.h's layout read element by element, written independently of codec.c. */
static void ref_decode(const kvs_codec *c, uint32_t dtype, uint32_t n, uint32_t heads, uint32_t dim,
                       int has_v, const uint8_t *enc, uint8_t *k_rows, uint8_t *v_rows) {
    uint64_t rows = (uint64_t)n * heads;
    for (int part = 0; part < 1 + has_v; part++) {
        uint8_t *out = part ? v_rows : k_rows;
        if (c->kind == KVS_CODEC_INT8) {
            const uint8_t *codes = enc + part * (rows * dim + rows * 2),
                          *steps = codes + rows * dim;
            for (uint64_t r = 0; r < rows; r++)
                for (uint32_t d = 0; d < dim; d++)
                    kvs_dtype_store(dtype, out, r * dim + d,
                                    (float)(int8_t)codes[r * dim + d] * half(steps + r * 2));
            continue;
        }
        uint64_t code_bytes = rows * dim * c->bits / 8;
        uint64_t k_meta = (uint64_t)((n + c->k_group - 1) / c->k_group) * heads * dim * 4;
        const uint8_t *codes = enc + (part ? code_bytes + k_meta : 0), *meta = codes + code_bytes;
        uint32_t vg = (dim + c->v_group - 1) / c->v_group;
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t h = 0; h < heads; h++)
                for (uint32_t d = 0; d < dim; d++) {
                    uint64_t e = ((uint64_t)t * heads + h) * dim + d, bit = e * c->bits;
                    uint32_t q = (codes[bit / 8] >> (bit % 8)) & ((1u << c->bits) - 1);
                    const uint8_t *g =
                        part ? meta + (((uint64_t)t * heads + h) * vg + d / c->v_group) * 4
                             : meta + (((uint64_t)(t / c->k_group) * heads + h) * dim + d) * 4;
                    kvs_dtype_store(dtype, out, e, (float)q * half(g + 2) + half(g));
                }
    }
}

START_TEST(decoding_follows_the_documented_layout) {
    const kvs_codec odd = {.kind = KVS_CODEC_KIVI, .bits = 2, .k_group = 7, .v_group = 12};
    const kvs_codec *codecs[] = {&kivi2, &kivi4, &int8, &odd};
    for (size_t ci = 0; ci < 4; ci++)
        for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++)
            for (int has_v = 0; has_v < 2; has_v++) {
                uint32_t dtype = dtypes[di], n = 45, heads = 3, dim = 32;
                kvs_kv_shape shape = {.n_heads = heads,
                                      .head_bytes = dim * kvs_dtype_bytes(dtype),
                                      .block_tokens = 16,
                                      .has_v = has_v};
                void *k = make_rows(dtype, n, heads, dim, 1),
                     *v = make_rows(dtype, n, heads, dim, 0);
                uint8_t *enc = malloc(kvs_codec_layer_bytes(codecs[ci], &shape, dtype, n));
                ck_assert_int_eq(kvs_codec_encode_layer(codecs[ci], &shape, dtype, n, k, v, enc),
                                 KVS_OK);
                size_t part = (size_t)n * heads * dim * kvs_dtype_bytes(dtype);
                uint8_t *a = calloc(2, part), *b = calloc(2, part);
                ck_assert_int_eq(
                    kvs_codec_decode_layer(codecs[ci], &shape, dtype, n, enc, a, a + part), KVS_OK);
                ref_decode(codecs[ci], dtype, n, heads, dim, has_v, enc, b, b + part);
                ck_assert_msg(memcmp(a, b, 2 * part) == 0, "codec %zu dtype %u v %d", ci, dtype,
                              has_v);
                free(k), free(v), free(enc), free(a), free(b);
            }
}
END_TEST

/* Decoding straight into pages equals decoding into rows and scattering those, for a paged layout
 * with scattered blocks and a span that starts inside a block; bytes outside the span stay. */
START_TEST(the_fused_scatter_equals_decode_then_scatter) {
    uint32_t dtype = KVS_DTYPE_BF16, heads = 4, dim = 32, bt = 16, n_blocks = 12;
    uint32_t n = 50, first = 5; /* tokens 5 .. 54 of the request */
    kvs_kv_shape shape = {.n_heads = heads, .head_bytes = dim * 2, .block_tokens = bt, .has_v = 1};
    uint32_t blocks[4] = {7, 2, 11, 4};
    for (int layout = 0; layout < 2; layout++) { /* NHD and HND */
        size_t page = (size_t)bt * heads * dim * 2, cache = page * n_blocks;
        uint8_t *ka = malloc(cache), *va = malloc(cache), *kb = malloc(cache), *vb = malloc(cache);
        memset(ka, 0x5a, cache), memset(va, 0x5a, cache), memset(kb, 0x5a, cache),
            memset(vb, 0x5a, cache);
        kvs_layer_view a = {.struct_size = sizeof a,
                            .n_blocks = n_blocks,
                            .k_base = ka,
                            .v_base = va,
                            .block_stride = (int64_t)page,
                            .token_stride = layout ? dim * 2 : (int64_t)heads * dim * 2,
                            .head_stride = layout ? (int64_t)bt * dim * 2 : dim * 2};
        kvs_layer_view b = a;
        b.k_base = kb, b.v_base = vb;
        kvs_token_span span = {
            .block_ids = blocks, .n_block_ids = 4, .first_token = first, .n_tokens = n};
        char err[128];
        ck_assert_int_eq(kvs_kernel_check_span(&a, &shape, &span, err, sizeof err), KVS_OK);
        void *k = make_rows(dtype, n, heads, dim, 1), *v = make_rows(dtype, n, heads, dim, 0);
        const kvs_codec *codecs[] = {&kivi2, &kivi4, &int8, &drop20};
        for (int ci = 0; ci < 4; ci++) {
            uint64_t bytes = kvs_codec_layer_bytes(codecs[ci], &shape, dtype, n);
            uint8_t *enc = malloc(bytes);
            ck_assert_int_eq(kvs_codec_encode_layer(codecs[ci], &shape, dtype, n, k, v, enc),
                             KVS_OK);
            ck_assert_int_eq(kvs_codec_scatter_layer(codecs[ci], &a, &shape, dtype, &span, enc),
                             KVS_OK);
            uint8_t *rows = malloc(kvs_kernel_layer_bytes(&shape, n));
            ck_assert_int_eq(kvs_codec_decode_layer(codecs[ci], &shape, dtype, n, enc, rows,
                                                    rows + kvs_kernel_layer_bytes(&shape, n) / 2),
                             KVS_OK);
            kvs_kernel_scatter_layer(&b, &shape, &span, rows);
            ck_assert_mem_eq(ka, kb, cache);
            ck_assert_mem_eq(va, vb, cache);
            /* part of the chunk (a load from inside it): rows 9.. land where the whole scatter
             * put them, in pages of their own */
            uint8_t *kc = malloc(cache), *vc = malloc(cache);
            memset(kc, 0x33, cache), memset(vc, 0x33, cache);
            kvs_layer_view c = a;
            c.k_base = kc, c.v_base = vc;
            kvs_token_span part = span;
            part.first_token += 9, part.n_tokens -= 9;
            ck_assert_int_eq(
                kvs_codec_scatter_rows(codecs[ci], &c, &shape, dtype, &part, enc, n, 9), KVS_OK);
            uint64_t row = (uint64_t)heads * dim * 2, half = kvs_kernel_layer_bytes(&shape, n) / 2;
            uint8_t *got = malloc(2 * half);
            kvs_kernel_gather_layer(&c, &shape, &part, got);
            for (uint32_t t = 0; t < part.n_tokens; t++) {
                ck_assert_mem_eq(got + t * row, rows + (t + 9) * row, row);
                ck_assert_mem_eq(got + (part.n_tokens + t) * row, rows + half + (t + 9) * row, row);
            }
            part.n_tokens += 1; /* one row past the chunk: refused, no page written */
            memset(kc, 0x33, cache);
            ck_assert_int_eq(
                kvs_codec_scatter_rows(codecs[ci], &c, &shape, dtype, &part, enc, n, 9),
                KVS_EINVAL);
            for (size_t i = 0; i < cache; i++) ck_assert(kc[i] == 0x33);
            free(kc), free(vc);
            free(got), free(rows), free(enc);
        }
        /* untouched: block 0 (not in the table) and, NHD, the first 5 slots of block 7 */
        for (size_t i = 0; i < page; i++) ck_assert(ka[i] == 0x5a && va[i] == 0x5a);
        if (layout == 0)
            for (size_t i = 0; i < (size_t)first * heads * dim * 2; i++)
                ck_assert(ka[7 * page + i] == 0x5a && va[7 * page + i] == 0x5a);
        free(k), free(v), free(ka), free(va), free(kb), free(vb);
    }
}
END_TEST

/* DROP keeps the tokens whose keys have the largest norm, their rows bit for bit, and decodes the
 * others to zeros; a reader refuses a mask that keeps another count or tokens past the last; a
 * mask given to the encoder is the one stored. */
START_TEST(token_dropping_keeps_rows_exactly) {
    uint32_t dtype = KVS_DTYPE_FP16, heads = 2, dim = 16, n = 70, keep = 23;
    kvs_kv_shape shape = {.n_heads = heads, .head_bytes = dim * 2, .block_tokens = n, .has_v = 1};
    kvs_codec c = {.kind = KVS_CODEC_DROP, .k_group = (uint16_t)keep};
    char err[128];
    ck_assert_int_eq(kvs_codec_check(&c, &shape, dtype, err, sizeof err), KVS_OK);
    kvs_codec bad = c;
    bad.k_group = 0;
    ck_assert_int_eq(kvs_codec_check(&bad, &shape, dtype, err, sizeof err), KVS_EINVAL);
    bad = c, bad.bits = 2;
    ck_assert_int_eq(kvs_codec_check(&bad, &shape, dtype, err, sizeof err), KVS_EINVAL);
    /* token t's keys scaled so their norms are all different and not in token order */
    uint8_t *k = make_rows(dtype, n, heads, dim, 0), *v = make_rows(dtype, n, heads, dim, 0);
    double scale[70];
    for (uint32_t t = 0; t < n; t++) {
        scale[t] = 0.1 + (double)((t * 37u) % n);
        for (uint32_t e = 0; e < heads * dim; e++) {
            uint64_t i = (uint64_t)t * heads * dim + e;
            kvs_dtype_store(dtype, k, i, (float)(scale[t] * (e % 2 ? 1 : -1)));
        }
    }
    uint64_t bytes = kvs_codec_layer_bytes(&c, &shape, dtype, n);
    uint64_t row = (uint64_t)heads * dim * 2;
    ck_assert_uint_eq(bytes, kvs_codec_mask_bytes(n) + 2 * keep * row);
    ck_assert_uint_eq(kvs_codec_mask_bytes(n), 16);
    uint8_t *enc = malloc(bytes), *rows = malloc(2 * n * row);
    ck_assert_int_eq(kvs_codec_encode_layer(&c, &shape, dtype, n, k, v, enc), KVS_OK);
    ck_assert_int_eq(kvs_codec_check_layer(&c, n, enc), KVS_OK);
    ck_assert_ptr_eq(kvs_codec_kept_mask(&c, enc), enc);
    ck_assert_ptr_null(kvs_codec_kept_mask(&int8, enc));
    ck_assert_int_eq(kvs_codec_decode_layer(&c, &shape, dtype, n, enc, rows, rows + n * row),
                     KVS_OK);
    uint32_t kept = 0;
    for (uint32_t t = 0; t < n; t++) {
        int in = enc[t / 8] >> (t % 8) & 1;
        /* kept exactly when fewer than `keep` tokens have a larger norm */
        uint32_t larger = 0;
        for (uint32_t u = 0; u < n; u++) larger += scale[u] > scale[t];
        ck_assert_int_eq(in, larger < keep);
        kept += (uint32_t)in;
        if (in) {
            ck_assert_mem_eq(rows + t * row, k + t * row, row);
            ck_assert_mem_eq(rows + (n + t) * row, v + t * row, row);
        } else {
            for (uint64_t b = 0; b < row; b++)
                ck_assert(rows[t * row + b] == 0 && rows[(n + t) * row + b] == 0);
        }
    }
    ck_assert_uint_eq(kept, keep);
    /* masks a reader refuses: one token more, one less, a bit past the last token */
    uint8_t saved[16];
    memcpy(saved, enc, 16);
    uint32_t off = 0;
    while (enc[off / 8] >> (off % 8) & 1) off++;
    enc[off / 8] |= (uint8_t)(1u << (off % 8)); /* one more */
    ck_assert_int_eq(kvs_codec_check_layer(&c, n, enc), KVS_ECORRUPT);
    memcpy(enc, saved, 16);
    uint32_t on = 0;
    while (!(enc[on / 8] >> (on % 8) & 1)) on++;
    enc[on / 8] &= (uint8_t) ~(1u << (on % 8)); /* one less */
    ck_assert_int_eq(kvs_codec_check_layer(&c, n, enc), KVS_ECORRUPT);
    enc[70 / 8] |= (uint8_t)(1u << (70 % 8)); /* ... and one past the end: the count is right */
    ck_assert_int_eq(kvs_codec_check_layer(&c, n, enc), KVS_ECORRUPT);
    memcpy(enc, saved, 16);
    /* a mask given to the encoder: the first `keep` tokens */
    uint8_t mask[16] = {0};
    for (uint32_t t = 0; t < keep; t++) mask[t / 8] |= (uint8_t)(1u << (t % 8));
    ck_assert_int_eq(kvs_codec_encode_layer_kept(&c, &shape, dtype, n, k, v, mask, enc), KVS_OK);
    ck_assert_mem_eq(enc, mask, 16);
    ck_assert_mem_eq(enc + 16, k, keep * row);
    mask[0] ^= 1; /* keeps keep - 1 tokens: refused */
    ck_assert_int_eq(kvs_codec_encode_layer_kept(&c, &shape, dtype, n, k, v, mask, enc),
                     KVS_EINVAL);
    /* a non-finite key ranks last: the token of the largest norm (scale 69.1) with one infinite
     * element is no longer kept */
    uint32_t top = 0;
    while (scale[top] < 69.0) top++;
    kvs_dtype_store(dtype, k, (uint64_t)top * heads * dim + 3, INFINITY);
    uint8_t sel[16];
    kvs_codec_drop_select(&shape, dtype, n, k, keep, sel);
    ck_assert_int_eq(sel[top / 8] >> (top % 8) & 1, 0);
    /* ... and DROP refuses to store a value that is not finite, as the quantisers do */
    ck_assert_int_eq(kvs_codec_encode_layer(&c, &shape, dtype, n, k, v, enc), KVS_EINVAL);
    double rk, rv;
    ck_assert_int_eq(kvs_codec_layer_error(&c, &shape, dtype, n, k, v, &rk, &rv), KVS_EINVAL);
    free(enc), free(rows), free(k), free(v);
}
END_TEST

/* On Gaussian data the errors are what the quantisation step predicts (about step / sqrt(12) per
 * element), and K with outlier channels loses far less with KIVI's per-channel groups than a
 * per-token step would give it. */
START_TEST(errors_on_gaussian_data_are_as_predicted) {
    uint32_t dtype = KVS_DTYPE_FP32, n = 256, heads = 4, dim = 128;
    kvs_kv_shape shape = {.n_heads = heads, .head_bytes = dim * 4, .block_tokens = 16, .has_v = 1};
    void *k = make_rows(dtype, n, heads, dim, 1), *v = make_rows(dtype, n, heads, dim, 0);
    size_t part = (size_t)n * heads * dim * 4;
    void *k2 = malloc(part), *v2 = malloc(part);
    uint8_t *enc = malloc(kvs_codec_layer_bytes(&int8, &shape, dtype, n));
    double rel[3][2];
    const kvs_codec *codecs[] = {&kivi2, &kivi4, &int8};
    for (int ci = 0; ci < 3; ci++) {
        ck_assert_int_eq(kvs_codec_encode_layer(codecs[ci], &shape, dtype, n, k, v, enc), KVS_OK);
        ck_assert_int_eq(kvs_codec_decode_layer(codecs[ci], &shape, dtype, n, enc, k2, v2), KVS_OK);
        rel[ci][0] = rel_error(dtype, (uint64_t)n * heads * dim, k, k2);
        rel[ci][1] = rel_error(dtype, (uint64_t)n * heads * dim, v, v2);
    }
    /* kvs_codec_layer_error gives the same errors in one call */
    for (int ci = 0; ci < 3; ci++) {
        double ek = -1, ev = -1;
        ck_assert_int_eq(kvs_codec_layer_error(codecs[ci], &shape, dtype, n, k, v, &ek, &ev),
                         KVS_OK);
        ck_assert_double_eq_tol(ek, rel[ci][0], 1e-12);
        ck_assert_double_eq_tol(ev, rel[ci][1], 1e-12);
    }
    float keep = ((float *)v)[5];
    ((float *)v)[5] = NAN;
    double ek, ev;
    ck_assert_int_eq(kvs_codec_layer_error(&kivi2, &shape, dtype, n, k, v, &ek, &ev), KVS_EINVAL);
    ((float *)v)[5] = keep;
    /* V ~ N(mean, 1) in groups of 32: 4 bits about 0.07-0.09, 2 bits about 0.33-0.45 (relative to
     * the rows' norm, which the channel means raise a little) */
    ck_assert_msg(rel[1][1] > 0.05 && rel[1][1] < 0.09, "V 4 bits %.4f", rel[1][1]);
    ck_assert_msg(rel[0][1] > 0.25 && rel[0][1] < 0.45, "V 2 bits %.4f", rel[0][1]);
    ck_assert_msg(rel[2][1] < 0.01, "V int8 %.4f", rel[2][1]);
    /* more bits, less error, for K and V */
    ck_assert(rel[0][0] > rel[1][0] && rel[1][0] > rel[2][0]);
    ck_assert(rel[0][1] > rel[1][1] && rel[1][1] > rel[2][1]);
    free(k), free(v), free(k2), free(v2), free(enc);
}
END_TEST

START_TEST(fp16_and_fp8_conversions_round_to_nearest_even) {
    /* every fp16 pattern converts to fp32 and back unchanged (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536u; h++) {
        float f = kvs_f16_to_f32((uint16_t)h);
        if (f != f) {
            ck_assert(kvs_f16_to_f32(kvs_f32_to_f16(f)) != kvs_f16_to_f32(kvs_f32_to_f16(f)));
            continue;
        }
        ck_assert_uint_eq(kvs_f32_to_f16(f), h);
    }
    for (uint32_t b = 0; b < 256u; b++) {
        float f = kvs_e5m2_to_f32((uint8_t)b);
        if (f == f) ck_assert_uint_eq(kvs_f32_to_e5m2(f), b);
        f = kvs_e4m3_to_f32((uint8_t)b);
        if (f == f) ck_assert_uint_eq(kvs_f32_to_e4m3(f), b);
    }
    ck_assert_uint_eq(kvs_f32_to_f16(1.0f + 0x1p-11f), 0x3c00u); /* a tie goes to even */
    ck_assert_uint_eq(kvs_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01u);
    ck_assert_uint_eq(kvs_f32_to_e5m2(1.0f + 0x1p-3f), 0x3cu); /* tie to even: 1.0 */
    ck_assert_uint_eq(kvs_f32_to_e5m2(1.0f + 0x1p-3f + 0x1p-9f), 0x3du);
    ck_assert_uint_eq(kvs_f32_to_e5m2(1e6f), 0x7cu); /* overflow: infinity */
    ck_assert_float_eq(kvs_dtype_ulp(KVS_DTYPE_FP16, 1.5f), 0x1p-10f);
    ck_assert_float_eq(kvs_dtype_ulp(KVS_DTYPE_FP16, 1e-7f), 0x1p-24f);
    ck_assert_float_eq(kvs_dtype_ulp(KVS_DTYPE_BF16, 3.0f), 0x1p-6f);
}
END_TEST

/* Decoding into fp16 pages (the CPU's converter where it has one) rounds every element exactly as
 * kvs_f32_to_f16 rounds the same decoded float: the GPU kernel's conversion. */
START_TEST(fp16_pages_round_as_the_reference_conversion) {
    uint32_t n = 96, heads = 2, dim = 64;
    kvs_kv_shape s16 = {.n_heads = heads, .head_bytes = dim * 2, .block_tokens = 16, .has_v = 1};
    kvs_kv_shape s32 = s16;
    s32.head_bytes = dim * 4;
    void *k = make_rows(KVS_DTYPE_FP16, n, heads, dim, 1),
         *v = make_rows(KVS_DTYPE_FP16, n, heads, dim, 0);
    const kvs_codec *codecs[] = {&kivi2, &kivi4, &int8};
    size_t count = (size_t)n * heads * dim;
    uint16_t *k16 = malloc(count * 2), *v16 = malloc(count * 2);
    float *k32 = malloc(count * 4), *v32 = malloc(count * 4);
    for (int ci = 0; ci < 3; ci++) {
        uint8_t *enc = malloc(kvs_codec_layer_bytes(codecs[ci], &s16, KVS_DTYPE_FP16, n));
        ck_assert_int_eq(kvs_codec_encode_layer(codecs[ci], &s16, KVS_DTYPE_FP16, n, k, v, enc),
                         KVS_OK);
        ck_assert_int_eq(kvs_codec_decode_layer(codecs[ci], &s16, KVS_DTYPE_FP16, n, enc, k16, v16),
                         KVS_OK);
        ck_assert_int_eq(kvs_codec_decode_layer(codecs[ci], &s32, KVS_DTYPE_FP32, n, enc, k32, v32),
                         KVS_OK);
        for (size_t i = 0; i < count; i++) {
            ck_assert_uint_eq(k16[i], kvs_f32_to_f16(k32[i]));
            ck_assert_uint_eq(v16[i], kvs_f32_to_f16(v32[i]));
        }
        free(enc);
    }
    free(k), free(v), free(k16), free(v16), free(k32), free(v32);
}
END_TEST

/* The host device decodes a lossy copy as it lands; one it cannot decode (rows past the encoded
 * chunk) fails the load at once, or, deferred, the sync that runs it: never a success over pages it
 * did not write. */
START_TEST(a_lossy_copy_the_host_device_cannot_decode_fails_its_load_or_sync) {
    enum { BT = 16, HEADS = 2, DIM = 16 };
    kvs_kv_shape shape = {.n_heads = HEADS, .head_bytes = DIM * 2, .block_tokens = BT, .has_v = 1};
    size_t page = (size_t)BT * HEADS * DIM * 2;
    uint8_t *k = calloc(2, page), *v = calloc(2, page);
    kvs_layer_view view = {.struct_size = sizeof view,
                           .n_blocks = 2,
                           .k_base = k,
                           .v_base = v,
                           .block_stride = (int64_t)page,
                           .token_stride = HEADS * DIM * 2,
                           .head_stride = DIM * 2};
    uint8_t enc[8192] = {0};
    uint32_t blocks[2] = {0, 1};
    kvs_dev_codec codec = {
        .codec = kivi4, .dtype = KVS_DTYPE_FP16, .encoded_tokens = 16, .first_row = 16};
    kvs_dev_copy copy = {.block_ids = blocks,
                         .n_block_ids = 2,
                         .first_token = 0,
                         .n_tokens = 1,
                         .k_payload = enc,
                         .codec = &codec};
    const kvs_device_ops *dev = kvs_host_device();
    for (int deferred = 0; deferred < 2; deferred++) {
        kvs_device_init init = {.struct_size = sizeof init,
                                .views = &view,
                                .n_layers = 1,
                                .shape = shape,
                                .max_tokens_per_layer = 32,
                                .max_copies_per_layer = 4,
                                .host_deferred = deferred};
        void *st = NULL;
        kvs_device_info info;
        char err[256] = "";
        ck_assert_int_eq(dev->open(&init, &st, &info, err, sizeof err), KVS_OK);
        kvs_status loaded = dev->load_layer(st, 0, &copy, 1, err, sizeof err);
        if (!deferred) {
            ck_assert_int_ne(loaded, KVS_OK);
        } else {
            ck_assert_int_eq(loaded, KVS_OK); /* queued */
            ck_assert_int_ne(dev->sync(st, err, sizeof err), KVS_OK);
            ck_assert_int_eq(dev->sync(st, err, sizeof err), KVS_OK); /* reported once */
        }
        ck_assert_msg(strstr(err, "lossy") != NULL, "%s", err);
        dev->close(st);
    }
    free(k), free(v);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("codec");
    TCase *tc = tcase_create("codec");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_element_is_within_the_stated_bound);
    tcase_add_test(tc, sizes_follow_the_layout);
    tcase_add_test(tc, values_on_the_grid_and_constant_groups_are_exact);
    tcase_add_test(tc, what_cannot_be_encoded_is_refused);
    tcase_add_test(tc, values_at_the_top_of_the_range_never_decode_to_infinity);
    tcase_add_test(tc, the_fused_scatter_equals_decode_then_scatter);
    tcase_add_test(tc, token_dropping_keeps_rows_exactly);
    tcase_add_test(tc, decoding_follows_the_documented_layout);
    tcase_add_test(tc, errors_on_gaussian_data_are_as_predicted);
    tcase_add_test(tc, fp16_and_fp8_conversions_round_to_nearest_even);
    tcase_add_test(tc, fp16_pages_round_as_the_reference_conversion);
    tcase_add_test(tc, a_lossy_copy_the_host_device_cannot_decode_fails_its_load_or_sync);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
