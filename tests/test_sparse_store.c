/* test_sparse_store.c - the rows sparse decode selects from (connector/ext/sparse/sparse_store.h): keys and
 * row hashes taken from checked chunk objects, rows checked alone, damaged objects refused whole,
 * and a layer's selection against a brute-force top-k with QSAC's reuse and delta fetch. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/xxh3.h"
#include "connector/ext/sparse/sparse_store.h"
#include "connector/object.h"
#include "kernels/cpu/dtype.h"

enum { LAYERS = 2, HEADS = 2, DIM = 8, CHUNK = 16, CHUNKS = 4, M = 2 };

static uint64_t rng = 0x1234567;
static float rnd_float(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}

static const kvs_kv_shape SHAPE = {
    .n_heads = HEADS, .head_bytes = DIM * 2, .block_tokens = 16, .has_v = 1};
static kvs_key fp, keys[CHUNKS];

/* A sealed raw object of chunk c with random fp16 K and V. */
static uint8_t *make_object(uint32_t c, uint64_t *len) {
    uint64_t layer_bytes = kvs_kernel_layer_bytes(&SHAPE, CHUNK);
    *len = kvs_object_bytes(LAYERS, layer_bytes);
    uint8_t *o = calloc(1, *len);
    memset(&keys[c], 0, sizeof keys[c]);
    keys[c].bytes[0] = (uint8_t)(c + 1);
    kvs_object_init(o, &fp, &keys[c], LAYERS, CHUNK, layer_bytes);
    for (uint32_t l = 0; l < LAYERS; l++) {
        uint8_t *p = kvs_object_layer(o, l);
        for (uint64_t i = 0; i < layer_bytes / 2; i++)
            kvs_dtype_store(KVS_DTYPE_FP16, p, i, rnd_float());
        kvs_object_layer_hashes(o)[l] = kvs_xxh3_64(p, layer_bytes);
    }
    kvs_object_seal(o);
    return o;
}

static kvs_sparse_store *store_with(uint32_t skip_chunk, uint8_t **objects) {
    kvs_sparse_store *s;
    ck_assert_int_eq(kvs_sparse_store_create(&SHAPE, KVS_DTYPE_FP16, LAYERS, CHUNK, CHUNKS, &s),
                     KVS_OK);
    char err[256];
    for (uint32_t c = 0; c < CHUNKS; c++) {
        uint64_t len;
        objects[c] = make_object(c, &len);
        if (c != skip_chunk)
            ck_assert_int_eq(
                kvs_sparse_store_add(s, c, objects[c], len, &fp, &keys[c], err, sizeof err),
                KVS_OK);
    }
    return s;
}

START_TEST(rows_come_from_checked_objects_and_are_checked_alone) {
    uint8_t *obj[CHUNKS];
    kvs_sparse_store *s = store_with(2, obj);
    uint64_t layer_bytes = kvs_kernel_layer_bytes(&SHAPE, CHUNK);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t h = 0; h < HEADS; h++) {
            uint32_t n_rows;
            const float *k = kvs_sparse_store_keys(s, l, h, &n_rows);
            ck_assert_uint_eq(n_rows, CHUNKS * CHUNK);
            for (uint32_t r = 0; r < n_rows; r++) {
                uint32_t c = r / CHUNK, t = r % CHUNK;
                uint64_t ko, vo;
                kvs_sparse_row_offsets(s, l, h, r, &ko, &vo);
                /* the payload layout: K [tokens][heads][head_bytes], then V */
                uint64_t want_k = kvs_object_payload_offset(LAYERS) + l * layer_bytes +
                                  ((uint64_t)t * HEADS + h) * DIM * 2;
                ck_assert_uint_eq(ko, want_k);
                ck_assert_uint_eq(vo, want_k + (uint64_t)CHUNK * HEADS * DIM * 2);
                if (c == 2) { /* never added */
                    ck_assert(!kvs_sparse_store_has_row(s, r));
                    ck_assert_int_eq(kvs_sparse_row_check(s, l, h, r, obj[c] + ko, obj[c] + vo),
                                     KVS_ECORRUPT);
                    continue;
                }
                for (uint32_t i = 0; i < DIM; i++)
                    ck_assert_float_eq(k[(uint64_t)r * DIM + i],
                                       kvs_dtype_load(KVS_DTYPE_FP16, obj[c] + ko, i));
                ck_assert_int_eq(kvs_sparse_row_check(s, l, h, r, obj[c] + ko, obj[c] + vo),
                                 KVS_OK);
                uint8_t v[DIM * 2];
                memcpy(v, obj[c] + vo, sizeof v);
                v[r % sizeof v] ^= 0x10; /* one bit of V */
                ck_assert_int_eq(kvs_sparse_row_check(s, l, h, r, obj[c] + ko, v), KVS_ECORRUPT);
                /* another head's row is not this one */
                uint64_t ko2, vo2;
                kvs_sparse_row_offsets(s, l, (h + 1) % HEADS, r, &ko2, &vo2);
                ck_assert_int_eq(kvs_sparse_row_check(s, l, h, r, obj[c] + ko2, obj[c] + vo2),
                                 KVS_ECORRUPT);
            }
        }
    for (uint32_t c = 0; c < CHUNKS; c++) free(obj[c]);
    kvs_sparse_store_destroy(s);
}
END_TEST

START_TEST(a_damaged_object_is_refused_whole) {
    kvs_sparse_store *s;
    ck_assert_int_eq(kvs_sparse_store_create(&SHAPE, KVS_DTYPE_FP16, LAYERS, CHUNK, CHUNKS, &s),
                     KVS_OK);
    uint64_t len;
    uint8_t *o = make_object(1, &len);
    char err[256] = "";
    kvs_object_layer(o, 1)[5] ^= 1; /* a byte of layer 1 */
    ck_assert_int_eq(kvs_sparse_store_add(s, 1, o, len, &fp, &keys[1], err, sizeof err),
                     KVS_ECORRUPT);
    ck_assert_msg(strstr(err, "layer 1 does not match"), "%s", err);
    ck_assert(!kvs_sparse_store_has_row(s, CHUNK));
    kvs_object_layer(o, 1)[5] ^= 1;
    ck_assert_int_eq(kvs_sparse_store_add(s, 1, o, len, &fp, &keys[0], err, sizeof err),
                     KVS_ECORRUPT); /* another chunk's key */
    ck_assert_int_eq(kvs_sparse_store_add(s, 1, o, len - 1, &fp, &keys[1], err, sizeof err),
                     KVS_ECORRUPT); /* cut short */
    ck_assert(!kvs_sparse_store_has_row(s, CHUNK));
    ck_assert_int_eq(kvs_sparse_store_add(s, CHUNKS, o, len, &fp, &keys[1], err, sizeof err),
                     KVS_EINVAL);
    ck_assert_int_eq(kvs_sparse_store_add(s, 1, o, len, &fp, &keys[1], err, sizeof err), KVS_OK);
    ck_assert(kvs_sparse_store_has_row(s, CHUNK) && !kvs_sparse_store_has_row(s, 0));
    kvs_sparse_store_destroy(s);
    free(o);
    kvs_kv_shape mla = SHAPE;
    mla.has_v = 0;
    ck_assert_int_eq(kvs_sparse_store_create(&mla, KVS_DTYPE_FP16, LAYERS, CHUNK, CHUNKS, &s),
                     KVS_EINVAL);
    kvs_kv_shape odd = SHAPE;
    odd.head_bytes = 15;
    ck_assert_int_eq(kvs_sparse_store_create(&odd, KVS_DTYPE_FP16, LAYERS, CHUNK, CHUNKS, &s),
                     KVS_EINVAL);
}
END_TEST

/* The oracle: the k best rows of (layer, head) for the group's queries, by double-precision dot
 * products, present rows of the pool only, ties to the lower row. */
static uint32_t oracle(const kvs_sparse_store *s, uint32_t layer, uint32_t head, const float *q,
                       uint32_t n_rows, uint32_t sink, uint32_t recent, uint32_t k, uint32_t *out) {
    uint32_t n_keys;
    const float *keys_f = kvs_sparse_store_keys(s, layer, head, &n_keys);
    double score[CHUNKS * CHUNK] = {0};
    uint8_t used[CHUNKS * CHUNK] = {0};
    uint32_t end = n_rows > recent ? n_rows - recent : 0, n = 0;
    for (uint32_t r = 0; r < n_rows; r++) {
        score[r] = 0;
        for (uint32_t j = 0; j < M; j++)
            for (uint32_t i = 0; i < DIM; i++)
                score[r] += (double)q[j * DIM + i] * keys_f[r * DIM + i];
    }
    for (; n < k; n++) {
        int best = -1;
        for (uint32_t r = sink; r < end; r++)
            if (!used[r] && kvs_sparse_store_has_row(s, r) &&
                (best < 0 || (float)score[r] > (float)score[best]))
                best = (int)r;
        if (best < 0) break;
        used[best] = 1;
    }
    uint32_t j = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        if (used[r]) out[j++] = r;
    return n;
}

/* HEADS empty head caches of `slots` rows with threshold tau, and random queries for them. */
static void init_heads(kvs_sparse_head *heads, float *labels, uint32_t *slot_rows, uint32_t slots,
                       double tau, float *q) {
    for (uint32_t g = 0; g < HEADS; g++) {
        heads[g] =
            (kvs_sparse_head){.qsac = {.label = labels + g * M * DIM, .m = M, .d = DIM, .tau = tau},
                              .slot_rows = slot_rows + (uint64_t)g * slots,
                              .slots = slots};
        for (uint32_t i = 0; i < slots; i++) heads[g].slot_rows[i] = KVS_QSAC_EMPTY;
    }
    for (uint32_t i = 0; i < HEADS * M * DIM; i++) q[i] = rnd_float();
}

START_TEST(a_layer_step_selects_the_top_k_reuses_on_a_hit_and_fetches_only_what_is_missing) {
    uint8_t *obj[CHUNKS];
    kvs_sparse_store *s = store_with(1, obj); /* chunk 1 missing: never selected */
    enum { SLOTS = 12 };
    float labels[HEADS][M * DIM];
    uint32_t slot_rows[HEADS][SLOTS];
    kvs_sparse_head heads[HEADS];
    float q[HEADS * M * DIM];
    init_heads(heads, &labels[0][0], &slot_rows[0][0], SLOTS, 0.9, q);
    uint8_t hit[HEADS];
    uint32_t rows[HEADS * SLOTS], slots[HEADS * SLOTS], n[HEADS];
    const uint32_t n_rows = CHUNKS * CHUNK, sink = 2, recent = 5, topk = 10;
    ck_assert_int_eq(
        kvs_sparse_store_select(s, 1, q, heads, n_rows, sink, recent, topk, hit, rows, slots, n),
        KVS_OK);
    for (uint32_t g = 0; g < HEADS; g++) {
        ck_assert_uint_eq(hit[g], 0); /* the first step misses */
        uint32_t want[SLOTS];
        uint32_t nw = oracle(s, 1, g, q + g * M * DIM, n_rows, sink, recent, topk, want);
        ck_assert_uint_eq(n[g], nw);
        for (uint32_t i = 0; i < nw; i++) {
            ck_assert_uint_eq(rows[g * SLOTS + i], want[i]);
            ck_assert(kvs_sparse_store_has_row(s, want[i]));
            ck_assert(want[i] >= sink && want[i] < n_rows - recent);
            ck_assert_uint_eq(slot_rows[g][slots[g * SLOTS + i]], want[i]);
        }
    }
    /* the same queries: every head hits and fetches nothing */
    ck_assert_int_eq(
        kvs_sparse_store_select(s, 1, q, heads, n_rows, sink, recent, topk, hit, rows, slots, n),
        KVS_OK);
    for (uint32_t g = 0; g < HEADS; g++) ck_assert(hit[g] == 1 && n[g] == 0);
    /* head 1 turns away: it misses and fetches only the rows its cache lacks */
    uint32_t before[SLOTS];
    memcpy(before, slot_rows[1], sizeof before);
    for (uint32_t i = 0; i < M * DIM; i++) q[M * DIM + i] = -q[M * DIM + i] + 0.3f * rnd_float();
    ck_assert_int_eq(
        kvs_sparse_store_select(s, 1, q, heads, n_rows, sink, recent, topk, hit, rows, slots, n),
        KVS_OK);
    ck_assert(hit[0] == 1 && n[0] == 0 && hit[1] == 0);
    uint32_t want[SLOTS];
    uint32_t nw = oracle(s, 1, 1, q + M * DIM, n_rows, sink, recent, topk, want);
    uint32_t missing = 0;
    for (uint32_t i = 0; i < nw; i++) {
        int held = 0;
        for (uint32_t j = 0; j < SLOTS; j++) held |= before[j] == want[i];
        missing += !held;
    }
    ck_assert_uint_eq(n[1], missing);
    for (uint32_t i = 0; i < nw; i++) {
        int in = 0;
        for (uint32_t j = 0; j < SLOTS; j++) in |= slot_rows[1][j] == want[i];
        ck_assert(in);
    }
    /* a budget of as many rows as the pool stores takes every one of them: the missing chunk's
     * rows (no keys, so scores of 0) must not crowd out stored rows that score below 0 */
    enum { BIG = CHUNKS * CHUNK };
    static float big_labels[M * DIM];
    static uint32_t big_slots[BIG];
    kvs_sparse_head one = {.qsac = {.label = big_labels, .m = M, .d = DIM, .tau = 0.9},
                           .slot_rows = big_slots,
                           .slots = BIG};
    for (uint32_t i = 0; i < BIG; i++) big_slots[i] = KVS_QSAC_EMPTY;
    kvs_sparse_head two[HEADS] = {one, one};
    static uint32_t big_slots2[BIG];
    static float big_labels2[M * DIM];
    memcpy(big_slots2, big_slots, sizeof big_slots2);
    two[1].slot_rows = big_slots2;
    two[1].qsac.label = big_labels2;
    static uint32_t brows2[HEADS * BIG], bslots2[HEADS * BIG];
    uint32_t stored = 0;
    for (uint32_t r = sink; r < n_rows - recent; r++) stored += kvs_sparse_store_has_row(s, r);
    ck_assert_int_eq(kvs_sparse_store_select(s, 0, q, two, n_rows, sink, recent, stored, hit,
                                             brows2, bslots2, n),
                     KVS_OK);
    for (uint32_t g = 0; g < HEADS; g++) {
        ck_assert_uint_eq(n[g], stored);
        for (uint32_t i = 0; i < n[g]; i++)
            ck_assert(kvs_sparse_store_has_row(s, brows2[g * BIG + i]));
    }
    /* bad arguments: refused before any head is stepped */
    float labels_before[HEADS][M * DIM];
    memcpy(labels_before, labels, sizeof labels);
    uint64_t misses0 = heads[0].qsac.misses, hits0 = heads[0].qsac.hits;
    for (uint32_t i = 0; i < M * DIM; i++) q[i] = -q[i]; /* head 0 would miss */
    heads[1].slots = SLOTS - 1;
    ck_assert_int_eq(
        kvs_sparse_store_select(s, 1, q, heads, n_rows, sink, recent, topk, hit, rows, slots, n),
        KVS_EINVAL);
    ck_assert_mem_eq(labels, labels_before, sizeof labels);
    ck_assert(heads[0].qsac.misses == misses0 && heads[0].qsac.hits == hits0);
    ck_assert_int_eq(kvs_sparse_store_select(s, LAYERS, q, heads, n_rows, sink, recent, topk, hit,
                                             rows, slots, n),
                     KVS_EINVAL);
    for (uint32_t c = 0; c < CHUNKS; c++) free(obj[c]);
    kvs_sparse_store_destroy(s);
}
END_TEST

/* The context runs past the stored rows (decode has added rows not stored yet): the pool still
 * ends at the last stored row, not `recent` rows before it; an empty pool selects nothing and is
 * never reused; a selection short of the budget is made again the next step. */
START_TEST(the_pool_is_the_stored_rows_before_the_recent_window) {
    uint8_t *obj[CHUNKS];
    kvs_sparse_store *s = store_with(CHUNKS, obj); /* every chunk */
    enum { SLOTS = CHUNKS * CHUNK };
    static float labels[HEADS][M * DIM];
    static uint32_t slot_rows[HEADS][SLOTS], rows[HEADS * SLOTS], slots[HEADS * SLOTS];
    kvs_sparse_head heads[HEADS];
    float q[HEADS * M * DIM];
    init_heads(heads, &labels[0][0], &slot_rows[0][0], SLOTS, 0.5, q);
    uint8_t hit[HEADS];
    uint32_t n[HEADS];
    const uint32_t stored = CHUNKS * CHUNK, sink = 3, recent = 8;
    /* 20 rows decoded past the stored ones: the pool is [3, 64), all of it taken */
    ck_assert_int_eq(kvs_sparse_store_select(s, 0, q, heads, stored + 20, sink, recent, SLOTS, hit,
                                             rows, slots, n),
                     KVS_OK);
    for (uint32_t g = 0; g < HEADS; g++) {
        ck_assert_uint_eq(n[g], stored - sink);
        ck_assert(heads[g].qsac.valid == 0); /* short of the budget: selected again next step */
    }
    ck_assert_int_eq(kvs_sparse_store_select(s, 0, q, heads, stored + 20, sink, recent, SLOTS, hit,
                                             rows, slots, n),
                     KVS_OK);
    ck_assert(hit[0] == 0 && hit[1] == 0 && n[0] == 0 && n[1] == 0); /* nothing new to fetch */
    /* a budget of 10 is met: those rows are cached already, and the next step reuses them */
    ck_assert_int_eq(
        kvs_sparse_store_select(s, 0, q, heads, stored, sink, recent, 10, hit, rows, slots, n),
        KVS_OK);
    ck_assert(n[0] == 0 && heads[0].qsac.valid == 1);
    ck_assert_int_eq(
        kvs_sparse_store_select(s, 0, q, heads, stored, sink, recent, 10, hit, rows, slots, n),
        KVS_OK);
    ck_assert(hit[0] == 1 && hit[1] == 1);
    /* an empty pool: nothing selected, never a hit on it */
    for (uint32_t g = 0; g < HEADS; g++) heads[g].qsac.valid = 0;
    for (int step = 0; step < 2; step++) {
        ck_assert_int_eq(kvs_sparse_store_select(s, 0, q, heads, 8, 4, 4, 10, hit, rows, slots, n),
                         KVS_OK);
        ck_assert(hit[0] == 0 && hit[1] == 0 && n[0] == 0 && n[1] == 0);
    }
    for (uint32_t g = 0; g < HEADS; g++) ck_assert_uint_eq(heads[g].slot_rows[0], KVS_QSAC_EMPTY);
    for (uint32_t c = 0; c < CHUNKS; c++) free(obj[c]);
    kvs_sparse_store_destroy(s);
}
END_TEST

static Suite *suite(void) {
    memset(&fp, 0x42, sizeof fp);
    Suite *s = suite_create("sparse_store");
    TCase *tc = tcase_create("sparse_store");
    tcase_add_test(tc, rows_come_from_checked_objects_and_are_checked_alone);
    tcase_add_test(tc, a_damaged_object_is_refused_whole);
    tcase_add_test(tc,
                   a_layer_step_selects_the_top_k_reuses_on_a_hit_and_fetches_only_what_is_missing);
    tcase_add_test(tc, the_pool_is_the_stored_rows_before_the_recent_window);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
