/* test_kernels.c - the host reference kernels: paged <-> payload gather/scatter, their hashing
 * variants, and the view and span checks. Expected bytes come from each layout's own index
 * formula, not from the view's strides, so a wrong stride in the builder or a wrong walk in the
 * kernel shows. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/nhpoly.h"
#include "kernels/cpu/kernels.h"
#include "tests/support/flipper.h"
#include "tests/support/objects.h"
#include "tests/support/test_support.h"

/* --- fixtures ------------------------------------------------------------------------------- */

typedef struct geometry {
    kvs_test_layout layout;
    uint32_t n_layers;
    uint32_t n_blocks;
    uint32_t block_tokens;
    uint32_t n_heads;
    uint32_t head_dim;
    uint32_t elem_bytes;
} geometry;

static size_t head_bytes_of(const geometry *g) {
    return (size_t)g->head_dim * g->elem_bytes;
}

static kvs_kv_shape shape_of(const geometry *g) {
    kvs_kv_shape s = {g->n_heads, (uint32_t)head_bytes_of(g), g->block_tokens,
                      g->layout != KVS_TEST_LAYOUT_MLA};
    return s;
}

/* Byte offset of (layer, part, block, token-in-block, head, byte) in the cache buffer, computed
 * from the tensor shape each layout names. part 0 is K, 1 is V. */
static size_t layout_offset(const geometry *g, size_t layer, size_t part, size_t block,
                            size_t token, size_t head, size_t byte) {
    const size_t L = g->n_layers, B = g->n_blocks, T = g->block_tokens, H = g->n_heads;
    const size_t D = head_bytes_of(g);
    switch (g->layout) {
        case KVS_TEST_LAYOUT_NHD:
            return (((((layer * 2 + part) * B + block) * T + token) * H + head) * D) + byte;
        case KVS_TEST_LAYOUT_HND:
            return (((((layer * 2 + part) * B + block) * H + head) * T + token) * D) + byte;
        case KVS_TEST_LAYOUT_FLASHINFER:
            return (((((layer * B + block) * 2 + part) * T + token) * H + head) * D) + byte;
        case KVS_TEST_LAYOUT_MLA: return (((layer * B + block) * T + token) * D) + byte;
        case KVS_TEST_LAYOUT_CROSS_LAYER:
            return (((((block * L + layer) * 2 + part) * T + token) * H + head) * D) + byte;
        case KVS_TEST_LAYOUT_COUNT: break;
    }
    ck_abort_msg("unknown layout %d", (int)g->layout);
    return 0;
}

/* A byte that depends on its offset, so a row read from the wrong place differs. */
static uint8_t pattern_at(size_t offset) {
    uint32_t x = (uint32_t)offset * 0x9E3779B1u;
    x ^= x >> 15;
    x ^= (uint32_t)(offset >> 20);
    return (uint8_t)(x >> 7) | 1; /* never 0, so "still zero" is distinguishable */
}

static void fill_pattern(uint8_t *buf, size_t n) {
    for (size_t i = 0; i < n; i++) buf[i] = pattern_at(i);
}

typedef struct cache {
    geometry g;
    uint8_t *buf;
    size_t bytes;
    kvs_layer_view views[8];
} cache;

static void cache_alloc(cache *c, const geometry *g) {
    ck_assert_uint_le(g->n_layers, 8);
    c->g = *g;
    c->buf = kvs_test_alloc_kv_layout(g->layout, g->n_layers, g->n_blocks, g->block_tokens,
                                      g->n_heads, g->head_dim, g->elem_bytes, c->views, &c->bytes);
    ck_assert_msg(c->buf != NULL, "layout %s did not allocate", kvs_test_layout_name(g->layout));
}

static void cache_free(cache *c) {
    kvs_test_free_kv_layout(c->buf);
}

static geometry small_geometry(kvs_test_layout layout, uint32_t elem_bytes) {
    geometry g = {layout, 3, 12, 16, 3, 24, elem_bytes};
    if (layout == KVS_TEST_LAYOUT_MLA) {
        g.n_heads = 1;
        g.head_dim = 36; /* latent */
    }
    return g;
}

/* Tokens 21..75 of the request: starts mid-block, crosses four blocks, and the table's used ids
 * (4, 11, 0, 7) are neither sorted nor adjacent. */
static const uint32_t shuffled_table[] = {9, 4, 11, 0, 7, 2};
#define SHUFFLED_FIRST_TOKEN 21
#define SHUFFLED_N_TOKENS    55

static kvs_token_span shuffled_span(void) {
    kvs_token_span s = {shuffled_table, sizeof shuffled_table / sizeof shuffled_table[0],
                        SHUFFLED_FIRST_TOKEN, SHUFFLED_N_TOKENS};
    return s;
}

/* Every payload byte of `layer` equals the cache byte its (part, token, head, byte) names. */
static void check_payload(const cache *c, uint32_t layer, const kvs_token_span *span,
                          const uint8_t *payload) {
    const geometry *g = &c->g;
    const size_t parts = g->layout == KVS_TEST_LAYOUT_MLA ? 1 : 2, D = head_bytes_of(g);
    size_t at = 0;
    for (size_t part = 0; part < parts; part++)
        for (uint32_t t = 0; t < span->n_tokens; t++) {
            uint64_t token = span->first_token + t;
            size_t block = span->block_ids[token / g->block_tokens];
            size_t in_block = token % g->block_tokens;
            for (size_t h = 0; h < g->n_heads; h++)
                for (size_t b = 0; b < D; b++, at++) {
                    size_t off = layout_offset(g, layer, part, block, in_block, h, b);
                    if (payload[at] != c->buf[off])
                        ck_abort_msg("%s layer %u part %zu token %u head %zu byte %zu: payload %u, "
                                     "cache %u",
                                     kvs_test_layout_name(g->layout), layer, part, t, h, b,
                                     payload[at], c->buf[off]);
                }
        }
    ck_assert_uint_eq(at, kvs_kernel_layer_bytes(
                              &(kvs_kv_shape){g->n_heads, (uint32_t)D, g->block_tokens, parts == 2},
                              span->n_tokens));
}

/* After scattering `layer`'s span into the zeroed `dst`, the rows of that span equal `src`'s and
 * every other byte of dst is still zero. */
static void check_scattered(const cache *src, const cache *dst, uint32_t layer,
                            const kvs_token_span *span) {
    const geometry *g = &src->g;
    const size_t parts = g->layout == KVS_TEST_LAYOUT_MLA ? 1 : 2, D = head_bytes_of(g);
    uint8_t *touched = calloc(dst->bytes, 1);
    ck_assert_ptr_nonnull(touched);
    for (size_t part = 0; part < parts; part++)
        for (uint32_t t = 0; t < span->n_tokens; t++) {
            uint64_t token = span->first_token + t;
            size_t block = span->block_ids[token / g->block_tokens];
            size_t in_block = token % g->block_tokens;
            for (size_t h = 0; h < g->n_heads; h++)
                for (size_t b = 0; b < D; b++)
                    touched[layout_offset(g, layer, part, block, in_block, h, b)] = 1;
        }
    for (size_t i = 0; i < dst->bytes; i++) {
        uint8_t want = touched[i] ? src->buf[i] : 0;
        if (dst->buf[i] != want) {
            free(touched);
            ck_abort_msg("%s layer %u: byte %zu of the cache is %u, expected %u (%s row)",
                         kvs_test_layout_name(g->layout), layer, i, dst->buf[i], want,
                         want ? "a scattered" : "an untouched");
        }
    }
    free(touched);
}

static void round_trip(kvs_test_layout layout, uint32_t elem_bytes) {
    geometry g = small_geometry(layout, elem_bytes);
    cache src, dst;
    cache_alloc(&src, &g);
    cache_alloc(&dst, &g);
    fill_pattern(src.buf, src.bytes);
    kvs_kv_shape shape = shape_of(&g);
    kvs_token_span span = shuffled_span();
    size_t payload_bytes = kvs_kernel_layer_bytes(&shape, span.n_tokens);
    uint8_t *payload = malloc(payload_bytes);
    ck_assert_ptr_nonnull(payload);
    char err[256] = "";
    for (uint32_t l = 0; l < g.n_layers; l++) {
        ck_assert_msg(kvs_kernel_check_view(&src.views[l], &shape, err, sizeof err) == KVS_OK, "%s",
                      err);
        ck_assert_msg(kvs_kernel_check_span(&src.views[l], &shape, &span, err, sizeof err) ==
                          KVS_OK,
                      "%s", err);
        memset(payload, 0, payload_bytes);
        kvs_kernel_gather_layer(&src.views[l], &shape, &span, payload);
        check_payload(&src, l, &span, payload);

        memset(dst.buf, 0, dst.bytes);
        kvs_kernel_scatter_layer(&dst.views[l], &shape, &span, payload);
        check_scattered(&src, &dst, l, &span);
    }
    free(payload);
    cache_free(&dst);
    cache_free(&src);
}

#define ROUND_TRIP_TEST(name, layout, elem_bytes)        \
    START_TEST(gather_then_scatter_round_trips_##name) { \
        round_trip(layout, elem_bytes);                  \
    }                                                    \
    END_TEST

ROUND_TRIP_TEST(nhd_fp16, KVS_TEST_LAYOUT_NHD, 2)
ROUND_TRIP_TEST(nhd_fp32, KVS_TEST_LAYOUT_NHD, 4)
ROUND_TRIP_TEST(nhd_fp8, KVS_TEST_LAYOUT_NHD, 1)
ROUND_TRIP_TEST(hnd_fp16, KVS_TEST_LAYOUT_HND, 2)
ROUND_TRIP_TEST(hnd_fp32, KVS_TEST_LAYOUT_HND, 4)
ROUND_TRIP_TEST(hnd_fp8, KVS_TEST_LAYOUT_HND, 1)
ROUND_TRIP_TEST(flashinfer_fp16, KVS_TEST_LAYOUT_FLASHINFER, 2)
ROUND_TRIP_TEST(flashinfer_fp32, KVS_TEST_LAYOUT_FLASHINFER, 4)
ROUND_TRIP_TEST(flashinfer_fp8, KVS_TEST_LAYOUT_FLASHINFER, 1)
ROUND_TRIP_TEST(mla_fp16, KVS_TEST_LAYOUT_MLA, 2)
ROUND_TRIP_TEST(mla_fp32, KVS_TEST_LAYOUT_MLA, 4)
ROUND_TRIP_TEST(mla_fp8, KVS_TEST_LAYOUT_MLA, 1)
ROUND_TRIP_TEST(cross_layer_fp16, KVS_TEST_LAYOUT_CROSS_LAYER, 2)
ROUND_TRIP_TEST(cross_layer_fp32, KVS_TEST_LAYOUT_CROSS_LAYER, 4)
ROUND_TRIP_TEST(cross_layer_fp8, KVS_TEST_LAYOUT_CROSS_LAYER, 1)

/* Padding between heads (generic per-head path) or only between tokens (per-token path): the
 * expected offset follows the view's strides, and the padding bytes are never written. */
static void padded_round_trip(int64_t head_pad, int64_t token_pad) {
    const uint32_t n_blocks = 10, block_tokens = 8, n_heads = 4, head_bytes = 40;
    const int64_t head_stride = head_bytes + head_pad;
    const int64_t token_stride = n_heads * head_stride + token_pad;
    const int64_t block_stride = block_tokens * token_stride + 24;
    const size_t part_bytes = (size_t)n_blocks * (size_t)block_stride;
    uint8_t *src = malloc(2 * part_bytes), *dst = calloc(2 * part_bytes, 1);
    ck_assert(src && dst);
    fill_pattern(src, 2 * part_bytes);
    kvs_layer_view v = {sizeof v,     KVS_DEVICE_HOST, 0,          n_blocks, NULL, NULL,
                        block_stride, token_stride,    head_stride};
    kvs_kv_shape shape = {n_heads, head_bytes, block_tokens, 1};
    const uint32_t table[] = {3, 8, 1, 9, 0};
    kvs_token_span span = {table, 5, 5, 27}; /* tokens 5..31: table indices 0..3 */
    char err[256] = "";
    size_t payload_bytes = kvs_kernel_layer_bytes(&shape, span.n_tokens);
    uint8_t *payload = malloc(payload_bytes);
    ck_assert_ptr_nonnull(payload);

    v.k_base = src;
    v.v_base = src + part_bytes;
    ck_assert_msg(kvs_kernel_check_view(&v, &shape, err, sizeof err) == KVS_OK, "%s", err);
    ck_assert_msg(kvs_kernel_check_span(&v, &shape, &span, err, sizeof err) == KVS_OK, "%s", err);
    kvs_kernel_gather_layer(&v, &shape, &span, payload);
    uint8_t *touched = calloc(2 * part_bytes, 1);
    ck_assert_ptr_nonnull(touched);
    size_t at = 0;
    for (size_t part = 0; part < 2; part++)
        for (uint32_t t = 0; t < span.n_tokens; t++) {
            uint64_t token = span.first_token + t;
            size_t row = part * part_bytes +
                         (size_t)table[token / block_tokens] * (size_t)block_stride +
                         (size_t)(token % block_tokens) * (size_t)token_stride;
            for (size_t h = 0; h < n_heads; h++)
                for (size_t b = 0; b < head_bytes; b++, at++) {
                    size_t off = row + h * (size_t)head_stride + b;
                    ck_assert_uint_eq(payload[at], src[off]);
                    touched[off] = 1;
                }
        }
    v.k_base = dst;
    v.v_base = dst + part_bytes;
    kvs_kernel_scatter_layer(&v, &shape, &span, payload);
    for (size_t i = 0; i < 2 * part_bytes; i++) ck_assert_uint_eq(dst[i], touched[i] ? src[i] : 0);
    free(touched);
    free(payload);
    free(dst);
    free(src);
}

START_TEST(gather_then_scatter_round_trips_with_padding_between_heads) {
    padded_round_trip(8, 16);
}
END_TEST

START_TEST(gather_then_scatter_round_trips_with_padding_between_tokens_only) {
    padded_round_trip(0, 16);
}
END_TEST

/* --- hashing variants ------------------------------------------------------------------------ */

/* A keyed layer tag (common/nhpoly.h) under fixed test keys: of n bytes at p, or begun in s. */
static uint32_t tag_key[KVS_NH_KEY_WORDS];
static const uint8_t tag_otk[KVS_NHPOLY_KEY_BYTES] = {7, 1, 2, 3};

static void tag_begin(kvs_nhpoly *s) {
    for (uint32_t i = 0; i < KVS_NH_KEY_WORDS; i++) tag_key[i] = i * 2654435761u;
    ck_assert(kvs_nhpoly_init(s, kvs_test_poly1305(), tag_key, tag_otk));
}

static void tag_of(const void *p, size_t n, uint8_t tag[KVS_NHPOLY_TAG_BYTES]) {
    kvs_nhpoly s;
    tag_begin(&s);
    kvs_nhpoly_update(&s, p, n);
    ck_assert(kvs_nhpoly_final(&s, tag));
}

/* gather_hash writes what gather writes and returns its XXH3; scatter_hash writes what scatter
 * writes and returns XXH3 of its source. The tag variants write the same and feed the tag what
 * they moved (the gather returning the XXH3 too). */
static void check_hash_variants(const geometry *g, const kvs_token_span *span) {
    cache src, dst;
    cache_alloc(&src, g);
    cache_alloc(&dst, g);
    fill_pattern(src.buf, src.bytes);
    kvs_kv_shape shape = shape_of(g);
    size_t n = kvs_kernel_layer_bytes(&shape, span->n_tokens);
    uint8_t *plain = malloc(n), *hashed = malloc(n);
    ck_assert(plain && hashed);
    char err[256] = "";
    for (uint32_t l = 0; l < g->n_layers; l++) {
        ck_assert_msg(kvs_kernel_check_span(&src.views[l], &shape, span, err, sizeof err) == KVS_OK,
                      "%s", err);
        kvs_kernel_gather_layer(&src.views[l], &shape, span, plain);
        memset(hashed, 0, n);
        uint64_t h = kvs_kernel_gather_layer_hash(&src.views[l], &shape, span, hashed);
        ck_assert_mem_eq(hashed, plain, n);
        ck_assert_uint_eq(h, XXH3_64bits(plain, n));

        memset(dst.buf, 0, dst.bytes);
        ck_assert_uint_eq(kvs_kernel_scatter_layer_hash(&dst.views[l], &shape, span, plain),
                          XXH3_64bits(plain, n));
        check_scattered(&src, &dst, l, span);

        uint8_t want[KVS_NHPOLY_TAG_BYTES], got[KVS_NHPOLY_TAG_BYTES];
        tag_of(plain, n, want);
        kvs_nhpoly s;
        memset(hashed, 0, n);
        tag_begin(&s);
        h = kvs_kernel_gather_layer_tag(&src.views[l], &shape, span, hashed, &s);
        ck_assert(kvs_nhpoly_final(&s, got));
        ck_assert_mem_eq(hashed, plain, n);
        ck_assert_uint_eq(h, XXH3_64bits(plain, n));
        ck_assert_mem_eq(got, want, sizeof want);
        memset(dst.buf, 0, dst.bytes);
        tag_begin(&s);
        kvs_kernel_scatter_layer_tag(&dst.views[l], &shape, span, plain, &s);
        ck_assert(kvs_nhpoly_final(&s, got));
        ck_assert_mem_eq(got, want, sizeof want);
        check_scattered(&src, &dst, l, span);
    }
    free(hashed);
    free(plain);
    cache_free(&dst);
    cache_free(&src);
}

static const uint32_t elem_sizes[] = {2, 4, 1};

/* Loop index i: layout i / 3, element size elem_sizes[i % 3]. */
START_TEST(hash_variants_equal_xxh3_of_the_payload_in_every_layout) {
    geometry g = small_geometry((kvs_test_layout)(_i / 3), elem_sizes[_i % 3]);
    kvs_token_span span = shuffled_span();
    check_hash_variants(&g, &span);
}
END_TEST

/* Scatter a payload another thread keeps changing, 3000 times: the hash and the tag returned are
 * those of what the pages got. */
static void check_tear(const geometry *gp, kvs_token_span span) {
    geometry g = *gp;
    cache pages;
    cache_alloc(&pages, &g);
    kvs_kv_shape shape = shape_of(&g);
    size_t n = kvs_kernel_layer_bytes(&shape, span.n_tokens);
    uint8_t *payload = malloc(n), *back = malloc(n);
    ck_assert(payload && back);
    fill_pattern(payload, n);
    kvs_test_flipper *f = kvs_test_flipper_start(payload, n, 5);
    size_t bad = 0, bad_tags = 0;
    for (int r = 0; r < 3000; r++) {
        uint64_t h = kvs_kernel_scatter_layer_hash(&pages.views[0], &shape, &span, payload);
        kvs_kernel_gather_layer(&pages.views[0], &shape, &span, back);
        bad += h != XXH3_64bits(back, n);
        /* a keyed layer read in place: its tag is of what the pages got, too */
        kvs_nhpoly s;
        uint8_t got[KVS_NHPOLY_TAG_BYTES], want[KVS_NHPOLY_TAG_BYTES];
        tag_begin(&s);
        kvs_kernel_scatter_layer_tag(&pages.views[0], &shape, &span, payload, &s);
        ck_assert(kvs_nhpoly_final(&s, got));
        kvs_kernel_gather_layer(&pages.views[0], &shape, &span, back);
        tag_of(back, n, want);
        bad_tags += memcmp(got, want, sizeof got) != 0;
    }
    kvs_test_flipper_stop(f);
    ck_assert_msg(bad == 0, "%zu of 3000 loads hashed other bytes than the pages got", bad);
    ck_assert_msg(bad_tags == 0, "%zu of 3000 tagged loads tagged other bytes than the pages got",
                  bad_tags);
    free(back);
    free(payload);
    cache_free(&pages);
}

/* A load whose payload changes while it is scattered returns the hash of what the pages got, in
 * every layout (runs short and long), so the connector's check sees the tear. */
START_TEST(a_payload_changing_under_a_load_hashes_as_the_pages_got_it) {
    geometry g = small_geometry((kvs_test_layout)_i, 2);
    if (_i == KVS_TEST_LAYOUT_NHD) { /* 512-byte tokens: hashed run by run as they move */
        g.n_heads = 8;
        g.head_dim = 32;
    }
    check_tear(&g, shuffled_span());
}
END_TEST

/* The same with tokens larger than a hash piece whose heads are apart in the pages (40 heads of
 * 1152 bytes, head-major): hashed head by head as they move, never read twice. */
START_TEST(a_payload_changing_under_a_load_of_big_tokens_hashes_as_the_pages_got_it) {
    const uint32_t table[] = {2, 0, 3, 1};
    geometry g = {KVS_TEST_LAYOUT_HND, 1, 4, 4, 40, 576, 2};
    check_tear(&g, (kvs_token_span){table, 4, 3, 9});
}
END_TEST

/* 256 tokens of 8 heads of 256 bytes: a 1 MiB payload, hashed in many pieces that do not line up
 * with blocks (the span starts mid-block). */
START_TEST(hash_variants_equal_xxh3_over_many_pieces) {
    static uint32_t table[40];
    for (uint32_t i = 0; i < 40; i++) table[i] = (i * 17 + 5) % 40;
    kvs_token_span span = {table, 40, 7, 256};
    geometry nhd = {KVS_TEST_LAYOUT_NHD, 1, 40, 16, 8, 128, 2};
    check_hash_variants(&nhd, &span);
    geometry hnd = {KVS_TEST_LAYOUT_HND, 2, 40, 16, 8, 128, 2};
    check_hash_variants(&hnd, &span);
}
END_TEST

/* One token of 40 heads x 1152 bytes is larger than a hash piece. */
START_TEST(hash_variants_equal_xxh3_when_one_token_exceeds_a_piece) {
    const uint32_t table[] = {2, 0, 3, 1};
    kvs_token_span span = {table, 4, 3, 9};
    geometry g = {KVS_TEST_LAYOUT_FLASHINFER, 1, 4, 4, 40, 576, 2};
    check_hash_variants(&g, &span);
}
END_TEST

START_TEST(hash_variants_of_an_empty_span_hash_nothing) {
    geometry g = small_geometry(KVS_TEST_LAYOUT_NHD, 2);
    cache c;
    cache_alloc(&c, &g);
    kvs_kv_shape shape = shape_of(&g);
    kvs_token_span span = {shuffled_table, 6, 3, 0};
    uint8_t sentinel = 0x5a;
    ck_assert_uint_eq(kvs_kernel_gather_layer_hash(&c.views[0], &shape, &span, &sentinel),
                      XXH3_64bits(NULL, 0));
    ck_assert_uint_eq(kvs_kernel_scatter_layer_hash(&c.views[0], &shape, &span, &sentinel),
                      XXH3_64bits(NULL, 0));
    ck_assert_uint_eq(sentinel, 0x5a);
    cache_free(&c);
}
END_TEST

/* --- layer_bytes ---------------------------------------------------------------------------- */

START_TEST(layer_bytes_counts_v_only_when_the_shape_has_v) {
    kvs_kv_shape kv = {8, 256, 16, 1}, mla = {1, 1152, 16, 0};
    ck_assert_uint_eq(kvs_kernel_layer_bytes(&kv, 256), 2ull * 256 * 8 * 256);
    ck_assert_uint_eq(kvs_kernel_layer_bytes(&mla, 256), 256ull * 1152);
    ck_assert_uint_eq(kvs_kernel_layer_bytes(&kv, 0), 0);
}
END_TEST

/* --- check_view ----------------------------------------------------------------------------- */

/* A valid NHD view of 2 heads x 256 bytes, 16 tokens per block, 8 blocks, over a dummy buffer. */
static char view_buffer[2 * 8 * 16 * 2 * 256];

static kvs_layer_view good_view(void) {
    kvs_layer_view v = {sizeof v,    KVS_DEVICE_HOST,
                        0,           8,
                        view_buffer, view_buffer + sizeof view_buffer / 2,
                        16 * 512,    512,
                        256};
    return v;
}

static const kvs_kv_shape good_shape = {2, 256, 16, 1};

/* check_view returns EINVAL with a sentence containing each of the fragments (NULL-terminated). */
static void expect_view_rejected(const kvs_layer_view *v, const kvs_kv_shape *s, const char *a,
                                 const char *b) {
    char err[256] = "";
    ck_assert_int_eq(kvs_kernel_check_view(v, s, err, sizeof err), KVS_EINVAL);
    ck_assert_msg(strstr(err, a) != NULL, "\"%s\" does not mention \"%s\"", err, a);
    if (b) ck_assert_msg(strstr(err, b) != NULL, "\"%s\" does not mention \"%s\"", err, b);
}

START_TEST(check_view_accepts_every_built_layout) {
    geometry g = small_geometry((kvs_test_layout)(_i / 3), elem_sizes[_i % 3]);
    cache c;
    cache_alloc(&c, &g);
    kvs_kv_shape shape = shape_of(&g);
    char err[256] = "";
    for (uint32_t l = 0; l < g.n_layers; l++)
        ck_assert_msg(kvs_kernel_check_view(&c.views[l], &shape, err, sizeof err) == KVS_OK,
                      "%s layer %u: %s", kvs_test_layout_name(g.layout), l, err);
    cache_free(&c);
}
END_TEST

START_TEST(check_view_accepts_the_good_fixture) {
    kvs_layer_view v = good_view();
    char err[256] = "";
    ck_assert_msg(kvs_kernel_check_view(&v, &good_shape, err, sizeof err) == KVS_OK, "%s", err);
}
END_TEST

START_TEST(check_view_rejects_a_null_k_base) {
    kvs_layer_view v = good_view();
    v.k_base = NULL;
    expect_view_rejected(&v, &good_shape, "k_base", NULL);
}
END_TEST

START_TEST(check_view_rejects_a_missing_v_base_when_the_shape_has_v) {
    kvs_layer_view v = good_view();
    v.v_base = NULL;
    expect_view_rejected(&v, &good_shape, "v_base", NULL);
}
END_TEST

START_TEST(check_view_rejects_a_v_base_for_an_mla_shape) {
    kvs_layer_view v = good_view();
    kvs_kv_shape mla = good_shape;
    mla.has_v = 0;
    expect_view_rejected(&v, &mla, "v_base", "MLA");
}
END_TEST

START_TEST(check_view_rejects_k_base_equal_to_v_base) {
    kvs_layer_view v = good_view();
    v.v_base = v.k_base;
    expect_view_rejected(&v, &good_shape, "k_base and v_base", NULL);
}
END_TEST

START_TEST(check_view_rejects_zero_blocks) {
    kvs_layer_view v = good_view();
    v.n_blocks = 0;
    expect_view_rejected(&v, &good_shape, "n_blocks", NULL);
}
END_TEST

START_TEST(check_view_rejects_each_negative_stride) {
    kvs_layer_view v = good_view();
    v.block_stride = -16 * 512;
    expect_view_rejected(&v, &good_shape, "block_stride -8192", "negative");
    v = good_view();
    v.token_stride = -512;
    expect_view_rejected(&v, &good_shape, "token_stride -512", "negative");
    v = good_view();
    v.head_stride = -256;
    expect_view_rejected(&v, &good_shape, "head_stride -256", "negative");
}
END_TEST

START_TEST(check_view_rejects_each_zero_shape_field) {
    kvs_layer_view v = good_view();
    kvs_kv_shape s = good_shape;
    s.n_heads = 0;
    expect_view_rejected(&v, &s, "n_heads", NULL);
    s = good_shape;
    s.head_bytes = 0;
    expect_view_rejected(&v, &s, "head_bytes", NULL);
    s = good_shape;
    s.block_tokens = 0;
    expect_view_rejected(&v, &s, "block_tokens", NULL);
}
END_TEST

START_TEST(check_view_rejects_tokens_that_overlap_heads) {
    /* 16 heads of 32 bytes take 512 bytes; tokens 64 apart would share heads. */
    static char buf[2][8 * 16 * 512];
    kvs_layer_view v = {sizeof v, KVS_DEVICE_HOST, 0, 8, buf[0], buf[1], 16 * 512, 64, 32};
    kvs_kv_shape s = {16, 32, 16, 1};
    expect_view_rejected(&v, &s, "layer view: token_stride 64 makes tokens overlap heads", NULL);
    expect_view_rejected(&v, &s, "(needs >= 512)", NULL);
}
END_TEST

START_TEST(check_view_rejects_heads_that_overlap_each_other) {
    kvs_layer_view v = good_view();
    v.head_stride = 128;
    expect_view_rejected(&v, &good_shape, "head_stride 128 makes heads overlap",
                         ">= head_bytes 256");
    v.head_stride = 255; /* one byte short */
    expect_view_rejected(&v, &good_shape, "head_stride 255 makes heads overlap", NULL);
}
END_TEST

START_TEST(check_view_rejects_blocks_that_overlap_tokens) {
    kvs_layer_view v = good_view();
    v.block_stride = 15 * 512;
    expect_view_rejected(&v, &good_shape, "block_stride 7680 makes blocks overlap tokens",
                         "needs >= 8192");
}
END_TEST

START_TEST(check_view_rejects_overlap_in_an_hnd_permutation) {
    /* HND: heads outermost within a block. head_stride must cover 16 tokens of 256 bytes. */
    kvs_layer_view v = good_view();
    v.token_stride = 256;
    v.head_stride = 15 * 256;
    expect_view_rejected(&v, &good_shape, "head_stride 3840 makes heads overlap tokens",
                         "needs >= 4096");
    v.head_stride = 16 * 256;
    char err[256] = "";
    ck_assert_msg(kvs_kernel_check_view(&v, &good_shape, err, sizeof err) == KVS_OK, "%s", err);
}
END_TEST

START_TEST(check_view_rejects_a_zero_stride_on_a_dimension_of_several_rows) {
    kvs_layer_view v = good_view();
    v.block_stride = 0;
    expect_view_rejected(&v, &good_shape, "block_stride 0 makes blocks overlap", NULL);
}
END_TEST

START_TEST(check_view_ignores_the_stride_of_a_dimension_of_one_row) {
    kvs_layer_view v = good_view();
    kvs_kv_shape s = good_shape;
    s.n_heads = 1;
    v.head_stride = 0;
    v.token_stride = 256;
    v.block_stride = 16 * 256;
    char err[256] = "";
    ck_assert_msg(kvs_kernel_check_view(&v, &s, err, sizeof err) == KVS_OK, "%s", err);
    s.block_tokens = 1;
    v.token_stride = 0;
    v.block_stride = 256;
    ck_assert_msg(kvs_kernel_check_view(&v, &s, err, sizeof err) == KVS_OK, "%s", err);
}
END_TEST

START_TEST(check_view_rejects_strides_that_span_more_than_the_address_space) {
    kvs_layer_view v = good_view();
    v.block_stride = INT64_MAX / 4;
    expect_view_rejected(&v, &good_shape, "block_stride", "2^63");
}
END_TEST

/* --- check_span ----------------------------------------------------------------------------- */

static void expect_span(const kvs_token_span *span, kvs_status want, const char *fragment) {
    kvs_layer_view v = good_view(); /* 8 blocks of 16 tokens */
    char err[256] = "";
    ck_assert_int_eq(kvs_kernel_check_span(&v, &good_shape, span, err, sizeof err), want);
    if (fragment)
        ck_assert_msg(strstr(err, fragment) != NULL, "\"%s\" does not mention \"%s\"", err,
                      fragment);
}

START_TEST(check_span_accepts_a_table_that_exactly_covers_the_tokens) {
    const uint32_t table[] = {7, 0, 3};
    kvs_token_span span = {table, 3, 10, 38}; /* tokens 10..47: the last token of block index 2 */
    expect_span(&span, KVS_OK, NULL);
}
END_TEST

START_TEST(check_span_rejects_an_out_of_range_block_id) {
    const uint32_t table[] = {7, 8, 3};
    kvs_token_span span = {table, 3, 10, 38};
    expect_span(&span, KVS_EINVAL, "block id 8 at table index 1 is out of range");
    const uint32_t last_bad[] = {7, 0, 8};
    kvs_token_span at_end = {last_bad, 3, 10, 38}; /* only token 47 lives in block 8 */
    expect_span(&at_end, KVS_EINVAL, "block id 8 at table index 2 is out of range");
    const uint32_t first_bad[] = {8, 0, 3};
    kvs_token_span at_start = {first_bad, 3, 15, 2}; /* token 15 lives in block 8 */
    expect_span(&at_start, KVS_EINVAL, "block id 8 at table index 0 is out of range");
}
END_TEST

START_TEST(check_span_rejects_a_short_block_table) {
    const uint32_t table[] = {7, 0, 3};
    kvs_token_span span = {table, 3, 10, 39}; /* token 48 needs a fourth block */
    expect_span(&span, KVS_EINVAL, "block table has 3 ids but tokens 10..48 need 4");
}
END_TEST

START_TEST(check_span_ignores_table_entries_outside_the_span) {
    const uint32_t table[] = {99, 5, 2, 1000};
    kvs_token_span span = {table, 4, 16, 32}; /* tokens 16..47: table indices 1 and 2 */
    expect_span(&span, KVS_OK, NULL);
}
END_TEST

START_TEST(check_span_rejects_zero_tokens_and_a_null_table) {
    const uint32_t table[] = {1};
    kvs_token_span span = {table, 1, 0, 0};
    expect_span(&span, KVS_EINVAL, "n_tokens is 0");
    kvs_token_span no_table = {NULL, 1, 0, 4};
    expect_span(&no_table, KVS_EINVAL, "block_ids is NULL");
}
END_TEST

static Suite *kernels_suite(void) {
    Suite *s = suite_create("kernels");
    TCase *round = tcase_create("round_trip");
    tcase_add_test(round, gather_then_scatter_round_trips_nhd_fp16);
    tcase_add_test(round, gather_then_scatter_round_trips_nhd_fp32);
    tcase_add_test(round, gather_then_scatter_round_trips_nhd_fp8);
    tcase_add_test(round, gather_then_scatter_round_trips_hnd_fp16);
    tcase_add_test(round, gather_then_scatter_round_trips_hnd_fp32);
    tcase_add_test(round, gather_then_scatter_round_trips_hnd_fp8);
    tcase_add_test(round, gather_then_scatter_round_trips_flashinfer_fp16);
    tcase_add_test(round, gather_then_scatter_round_trips_flashinfer_fp32);
    tcase_add_test(round, gather_then_scatter_round_trips_flashinfer_fp8);
    tcase_add_test(round, gather_then_scatter_round_trips_mla_fp16);
    tcase_add_test(round, gather_then_scatter_round_trips_mla_fp32);
    tcase_add_test(round, gather_then_scatter_round_trips_mla_fp8);
    tcase_add_test(round, gather_then_scatter_round_trips_cross_layer_fp16);
    tcase_add_test(round, gather_then_scatter_round_trips_cross_layer_fp32);
    tcase_add_test(round, gather_then_scatter_round_trips_cross_layer_fp8);
    tcase_add_test(round, gather_then_scatter_round_trips_with_padding_between_heads);
    tcase_add_test(round, gather_then_scatter_round_trips_with_padding_between_tokens_only);
    suite_add_tcase(s, round);

    TCase *hash = tcase_create("hash");
    tcase_add_loop_test(hash, hash_variants_equal_xxh3_of_the_payload_in_every_layout, 0,
                        3 * KVS_TEST_LAYOUT_COUNT);
    tcase_add_test(hash, hash_variants_equal_xxh3_over_many_pieces);
    tcase_add_loop_test(hash, a_payload_changing_under_a_load_hashes_as_the_pages_got_it, 0,
                        KVS_TEST_LAYOUT_COUNT);
    tcase_add_test(hash, a_payload_changing_under_a_load_of_big_tokens_hashes_as_the_pages_got_it);
    tcase_add_test(hash, hash_variants_equal_xxh3_when_one_token_exceeds_a_piece);
    tcase_add_test(hash, hash_variants_of_an_empty_span_hash_nothing);
    tcase_add_test(hash, layer_bytes_counts_v_only_when_the_shape_has_v);
    suite_add_tcase(s, hash);

    TCase *view = tcase_create("check_view");
    tcase_add_loop_test(view, check_view_accepts_every_built_layout, 0, 3 * KVS_TEST_LAYOUT_COUNT);
    tcase_add_test(view, check_view_accepts_the_good_fixture);
    tcase_add_test(view, check_view_rejects_a_null_k_base);
    tcase_add_test(view, check_view_rejects_a_missing_v_base_when_the_shape_has_v);
    tcase_add_test(view, check_view_rejects_a_v_base_for_an_mla_shape);
    tcase_add_test(view, check_view_rejects_k_base_equal_to_v_base);
    tcase_add_test(view, check_view_rejects_zero_blocks);
    tcase_add_test(view, check_view_rejects_each_negative_stride);
    tcase_add_test(view, check_view_rejects_each_zero_shape_field);
    tcase_add_test(view, check_view_rejects_tokens_that_overlap_heads);
    tcase_add_test(view, check_view_rejects_heads_that_overlap_each_other);
    tcase_add_test(view, check_view_rejects_blocks_that_overlap_tokens);
    tcase_add_test(view, check_view_rejects_overlap_in_an_hnd_permutation);
    tcase_add_test(view, check_view_rejects_a_zero_stride_on_a_dimension_of_several_rows);
    tcase_add_test(view, check_view_ignores_the_stride_of_a_dimension_of_one_row);
    tcase_add_test(view, check_view_rejects_strides_that_span_more_than_the_address_space);
    suite_add_tcase(s, view);

    TCase *span = tcase_create("check_span");
    tcase_add_test(span, check_span_accepts_a_table_that_exactly_covers_the_tokens);
    tcase_add_test(span, check_span_rejects_an_out_of_range_block_id);
    tcase_add_test(span, check_span_rejects_a_short_block_table);
    tcase_add_test(span, check_span_ignores_table_entries_outside_the_span);
    tcase_add_test(span, check_span_rejects_zero_tokens_and_a_null_table);
    suite_add_tcase(s, span);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(kernels_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
