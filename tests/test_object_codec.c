/* test_object_codec.c - lossy objects (connector/object.h): a raw object encoded whole, its checksums
 * over the encoded bytes, the codec record under the header hash, and every refusal: a damaged raw
 * object is never sealed as lossy, a damaged or mismatched lossy one is never accepted, and a reader
 * of raw objects refuses lossy ones. Raw objects keep their format. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/xxh3.h"
#include "connector/object.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/dtype.h"

#define LAYERS 3
#define TOKENS 48
#define HEADS  2
#define DIM    32

static const kvs_kv_shape shape = {
    .n_heads = HEADS, .head_bytes = DIM * 2, .block_tokens = 16, .has_v = 1};
static const kvs_codec kivi4 = {.kind = KVS_CODEC_KIVI, .bits = 4, .k_group = 16, .v_group = 32};
static kvs_key fp, key;

/* A sealed raw object of fp16 values. */
static uint8_t *raw_object(uint64_t *len) {
    uint64_t lb = kvs_kernel_layer_bytes(&shape, TOKENS);
    *len = kvs_object_bytes(LAYERS, lb);
    uint8_t *o = calloc(1, *len);
    kvs_object_init(o, &fp, &key, LAYERS, TOKENS, lb);
    uint64_t x = 12345;
    for (uint32_t l = 0; l < LAYERS; l++) {
        uint8_t *layer = kvs_object_layer(o, l);
        for (uint64_t i = 0; i < lb / 2; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            kvs_dtype_store(KVS_DTYPE_FP16, layer, i, (float)((int64_t)(x >> 40) % 2000) / 500.0f);
        }
        kvs_object_layer_hashes(o)[l] = kvs_xxh3_64(layer, lb);
    }
    kvs_object_seal(o);
    return o;
}

static void setup(void) {
    memset(&fp, 0x11, sizeof fp);
    memset(&key, 0x22, sizeof key);
}

START_TEST(a_raw_object_encodes_into_a_checked_lossy_one) {
    setup();
    uint64_t len, out_len = 0;
    uint8_t *raw = raw_object(&len);
    uint64_t need = kvs_object_lossy_bytes(&kivi4, &shape, KVS_DTYPE_FP16, LAYERS, TOKENS);
    uint8_t *lossy = malloc(need);
    char err[256];
    ck_assert_int_eq(kvs_object_encode(raw, len, &kivi4, &shape, KVS_DTYPE_FP16, lossy, need,
                                       &out_len, err, sizeof err),
                     KVS_OK);
    ck_assert_uint_eq(out_len, need);
    ck_assert_uint_lt(need, len / 2); /* 4 bits and fp16 groups: about a third */
    kvs_codec got;
    ck_assert_msg(kvs_object_check_lossy(lossy, out_len, &fp, &key, LAYERS, TOKENS, &shape,
                                         KVS_DTYPE_FP16, &got, err, sizeof err) == KVS_OK,
                  "%s", err);
    ck_assert(got.kind == kivi4.kind && got.bits == 4 && got.k_group == 16 && got.v_group == 32);
    const kvs_object_header *h = (const kvs_object_header *)lossy;
    uint64_t enc = kvs_codec_layer_bytes(&kivi4, &shape, KVS_DTYPE_FP16, TOKENS);
    ck_assert_uint_eq(h->layer_bytes, enc);
    ck_assert_uint_eq(kvs_object_codec_of(lossy)->raw_layer_bytes,
                      kvs_kernel_layer_bytes(&shape, TOKENS));
    /* every layer: the codec's encoding of the raw layer, and its checksum covers those bytes */
    uint8_t *direct = malloc(enc);
    uint64_t lb = kvs_kernel_layer_bytes(&shape, TOKENS);
    for (uint32_t l = 0; l < LAYERS; l++) {
        const uint8_t *rl = kvs_object_layer(raw, l);
        ck_assert_int_eq(
            kvs_codec_encode_layer(&kivi4, &shape, KVS_DTYPE_FP16, TOKENS, rl, rl + lb / 2, direct),
            KVS_OK);
        ck_assert_mem_eq(kvs_object_layer(lossy, l), direct, enc);
        ck_assert_uint_eq(kvs_object_layer_hashes(lossy)[l],
                          kvs_xxh3_64(kvs_object_layer(lossy, l), enc));
    }
    /* a reader of raw objects refuses it */
    ck_assert_int_eq(
        kvs_object_check_header(lossy, out_len, &fp, &key, LAYERS, TOKENS, lb, err, sizeof err),
        KVS_ECORRUPT);
    free(raw), free(lossy), free(direct);
}
END_TEST

START_TEST(a_damaged_raw_object_is_never_sealed_as_lossy) {
    setup();
    uint64_t len, out_len = 0;
    uint8_t *raw = raw_object(&len);
    uint64_t need = kvs_object_lossy_bytes(&kivi4, &shape, KVS_DTYPE_FP16, LAYERS, TOKENS);
    uint8_t *lossy = malloc(need);
    char err[256];
    kvs_object_layer(raw, 2)[17] ^= 0x40; /* a payload byte: its layer checksum fails */
    ck_assert_int_eq(kvs_object_encode(raw, len, &kivi4, &shape, KVS_DTYPE_FP16, lossy, need,
                                       &out_len, err, sizeof err),
                     KVS_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "layer 2"));
    kvs_object_layer(raw, 2)[17] ^= 0x40;
    raw[40] ^= 1; /* a header field: the header checksum fails */
    ck_assert_int_eq(kvs_object_encode(raw, len, &kivi4, &shape, KVS_DTYPE_FP16, lossy, need,
                                       &out_len, err, sizeof err),
                     KVS_ECORRUPT);
    raw[40] ^= 1;
    ck_assert_int_eq(kvs_object_encode(raw, len - 1, &kivi4, &shape, KVS_DTYPE_FP16, lossy, need,
                                       &out_len, err, sizeof err),
                     KVS_ECORRUPT); /* short */
    ck_assert_int_eq(kvs_object_encode(raw, len, &kivi4, &shape, KVS_DTYPE_FP16, lossy, need - 1,
                                       &out_len, err, sizeof err),
                     KVS_EOVERFLOW);
    kvs_kv_shape other = shape;
    other.n_heads = 1; /* not this object's geometry */
    ck_assert_int_eq(kvs_object_encode(raw, len, &kivi4, &other, KVS_DTYPE_FP16, lossy, need,
                                       &out_len, err, sizeof err),
                     KVS_ECORRUPT);
    /* a crafted header whose layer count and size would wrap the length: refused before any read
     * it would size (the header checksum would have hashed gigabytes) */
    uint8_t crafted[8192];
    memcpy(crafted, raw, sizeof crafted);
    kvs_object_header *ch = (kvs_object_header *)crafted;
    ch->n_layers = 1u << 29;
    ch->layer_bytes = 1ull << 35;
    ch->payload_offset = kvs_object_payload_offset(ch->n_layers);
    ck_assert_int_eq(kvs_object_encode(crafted, sizeof crafted, &kivi4, &shape, KVS_DTYPE_FP16,
                                       lossy, need, &out_len, err, sizeof err),
                     KVS_ECORRUPT);
    ch->n_layers = 4; /* a plausible count whose layers are not all there */
    ch->layer_bytes = kvs_kernel_layer_bytes(&shape, TOKENS);
    ch->payload_offset = kvs_object_payload_offset(4);
    ck_assert_int_eq(kvs_object_encode(crafted, sizeof crafted, &kivi4, &shape, KVS_DTYPE_FP16,
                                       lossy, need, &out_len, err, sizeof err),
                     KVS_ECORRUPT);
    kvs_codec bad = kivi4;
    bad.bits = 3;
    ck_assert_int_eq(kvs_object_encode(raw, len, &bad, &shape, KVS_DTYPE_FP16, lossy, need,
                                       &out_len, err, sizeof err),
                     KVS_EINVAL);
    free(raw), free(lossy);
}
END_TEST

START_TEST(a_damaged_or_mismatched_lossy_object_is_refused) {
    setup();
    uint64_t len, out_len = 0;
    uint8_t *raw = raw_object(&len);
    uint64_t need = kvs_object_lossy_bytes(&kivi4, &shape, KVS_DTYPE_FP16, LAYERS, TOKENS);
    uint8_t *lossy = malloc(need), *copy = malloc(need);
    char err[256];
    ck_assert_int_eq(kvs_object_encode(raw, len, &kivi4, &shape, KVS_DTYPE_FP16, lossy, need,
                                       &out_len, err, sizeof err),
                     KVS_OK);
    kvs_codec got;
    uint64_t rec_at = sizeof(kvs_object_header) + LAYERS * sizeof(uint64_t);
    /* a byte of the codec record: the header checksum covers it */
    memcpy(copy, lossy, need);
    copy[rec_at + 1] ^= 2;
    ck_assert_int_eq(kvs_object_check_lossy(copy, need, &fp, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "checksum"));
    /* a record resealed but for other pages (bf16): not this model's */
    memcpy(copy, lossy, need);
    ((kvs_object_codec *)(copy + rec_at))->dtype = KVS_DTYPE_BF16;
    kvs_object_seal(copy);
    ck_assert_int_eq(kvs_object_check_lossy(copy, need, &fp, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    /* a record whose bits disagree with the layer size, resealed */
    memcpy(copy, lossy, need);
    ((kvs_object_codec *)(copy + rec_at))->bits = 2;
    kvs_object_seal(copy);
    ck_assert_int_eq(kvs_object_check_lossy(copy, need, &fp, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    /* truncated, another key, another fingerprint, another geometry */
    ck_assert_int_eq(kvs_object_check_lossy(lossy, need - 1, &fp, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    kvs_key other;
    memset(&other, 0x33, sizeof other);
    ck_assert_int_eq(kvs_object_check_lossy(lossy, need, &fp, &other, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    ck_assert_int_eq(kvs_object_check_lossy(lossy, need, &other, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    ck_assert_int_eq(kvs_object_check_lossy(lossy, need, &fp, &key, LAYERS, TOKENS + 1, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    /* a raw object is not a lossy one */
    ck_assert_int_eq(kvs_object_check_lossy(raw, len, &fp, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    ck_assert_int_eq(kvs_object_check_lossy(lossy, need, &fp, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_OK);
    free(raw), free(lossy), free(copy);
}
END_TEST

/* A raw object's header hash is what it always was: the header and the layer table, nothing more. */
START_TEST(raw_objects_keep_their_format) {
    setup();
    uint64_t len;
    uint8_t *raw = raw_object(&len);
    kvs_object_header h;
    memcpy(&h, raw, sizeof h);
    h.header_hash = 0;
    kvs_xxh3 st;
    kvs_xxh3_reset(&st);
    kvs_xxh3_update(&st, &h, sizeof h);
    kvs_xxh3_update(&st, raw + sizeof h, LAYERS * sizeof(uint64_t));
    ck_assert_uint_eq(kvs_xxh3_digest(&st), ((kvs_object_header *)raw)->header_hash);
    ck_assert_uint_eq(kvs_object_payload_offset(LAYERS), 4096);
    char err[256];
    ck_assert_int_eq(kvs_object_check_header(raw, len, &fp, &key, LAYERS, TOKENS,
                                             kvs_kernel_layer_bytes(&shape, TOKENS), err,
                                             sizeof err),
                     KVS_OK);
    free(raw);
}
END_TEST

/* A DROP object keeps the same tokens in every layer (chosen from the middle layer), decodes them
 * exactly and the rest to zeros; a layer whose mask differs from layer 0's, or keeps another count,
 * is refused even when its checksum was redone; a DROP record keeping more tokens than the chunk has
 * is refused, and so is encoding one. */
START_TEST(a_drop_object_keeps_the_same_tokens_in_every_layer) {
    setup();
    uint64_t len, out_len = 0;
    uint8_t *raw = raw_object(&len);
    const kvs_codec drop = {.kind = KVS_CODEC_DROP, .k_group = 12};
    uint64_t need = kvs_object_lossy_bytes(&drop, &shape, KVS_DTYPE_FP16, LAYERS, TOKENS);
    uint8_t *lossy = malloc(need), *copy = malloc(need), *back = malloc(len);
    char err[256];
    ck_assert_int_eq(kvs_object_encode(raw, len, &drop, &shape, KVS_DTYPE_FP16, lossy, need,
                                       &out_len, err, sizeof err),
                     KVS_OK);
    kvs_codec got;
    ck_assert_int_eq(kvs_object_check_lossy(lossy, need, &fp, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_OK);
    ck_assert(got.kind == KVS_CODEC_DROP && got.k_group == 12);
    ck_assert_int_eq(kvs_object_check_lossy_layers(lossy, err, sizeof err), KVS_OK);
    const uint8_t *mask = kvs_object_kept_mask(lossy);
    ck_assert_ptr_nonnull(mask);
    uint64_t lb = kvs_kernel_layer_bytes(&shape, TOKENS), mb = kvs_codec_mask_bytes(TOKENS);
    uint8_t expect[8];
    kvs_codec_drop_select(&shape, KVS_DTYPE_FP16, TOKENS, kvs_object_layer(raw, LAYERS / 2), 12,
                          expect);
    ck_assert_mem_eq(mask, expect, mb);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_mem_eq(kvs_object_layer(lossy, l), mask, mb);
    ck_assert_int_eq(kvs_object_decode(lossy, need, &fp, LAYERS, TOKENS, &shape, KVS_DTYPE_FP16,
                                       back, len, err, sizeof err),
                     KVS_OK);
    uint64_t row = (uint64_t)HEADS * DIM * 2;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t t = 0; t < TOKENS; t++)
            for (uint64_t part = 0; part < 2; part++) {
                const uint8_t *a = kvs_object_layer(raw, l) + part * lb / 2 + t * row;
                const uint8_t *b = kvs_object_layer(back, l) + part * lb / 2 + t * row;
                if (mask[t / 8] >> (t % 8) & 1)
                    ck_assert_mem_eq(a, b, row);
                else
                    for (uint64_t i = 0; i < row; i++) ck_assert(b[i] == 0);
            }
    /* layer 2 keeps other tokens (same count), checksum redone: refused */
    memcpy(copy, lossy, need);
    uint8_t *l2 = kvs_object_layer(copy, 2);
    uint32_t on = 0, off = 0;
    while (!(l2[on / 8] >> (on % 8) & 1)) on++;
    while (l2[off / 8] >> (off % 8) & 1) off++;
    l2[on / 8] &= (uint8_t) ~(1u << (on % 8));
    l2[off / 8] |= (uint8_t)(1u << (off % 8));
    kvs_object_layer_hashes(copy)[2] = kvs_xxh3_64(l2, ((kvs_object_header *)copy)->layer_bytes);
    kvs_object_seal(copy);
    ck_assert_int_eq(kvs_object_check_lossy_layers(copy, err, sizeof err), KVS_ECORRUPT);
    ck_assert_int_eq(kvs_object_decode(copy, need, &fp, LAYERS, TOKENS, &shape, KVS_DTYPE_FP16,
                                       back, len, err, sizeof err),
                     KVS_ECORRUPT);
    /* every layer keeps one token fewer than the record says (the masks still agree): refused */
    memcpy(copy, lossy, need);
    for (uint32_t l = 0; l < LAYERS; l++) {
        uint8_t *ll = kvs_object_layer(copy, l);
        ll[on / 8] &= (uint8_t) ~(1u << (on % 8));
        kvs_object_layer_hashes(copy)[l] =
            kvs_xxh3_64(ll, ((kvs_object_header *)copy)->layer_bytes);
    }
    kvs_object_seal(copy);
    ck_assert_int_eq(kvs_object_check_lossy_layers(copy, err, sizeof err), KVS_ECORRUPT);
    /* more tokens kept than the chunk has: not encoded, and a record saying so is refused */
    const kvs_codec too_many = {.kind = KVS_CODEC_DROP, .k_group = TOKENS + 1};
    uint64_t big_len = kvs_object_lossy_bytes(&too_many, &shape, KVS_DTYPE_FP16, LAYERS, TOKENS);
    uint8_t *big = malloc(big_len);
    ck_assert_int_eq(kvs_object_encode(raw, len, &too_many, &shape, KVS_DTYPE_FP16, big, big_len,
                                       &out_len, err, sizeof err),
                     KVS_EINVAL);
    memcpy(copy, lossy, need);
    ((kvs_object_codec *)(copy + sizeof(kvs_object_header) + LAYERS * sizeof(uint64_t)))->k_group =
        TOKENS + 1;
    kvs_object_seal(copy);
    ck_assert_int_eq(kvs_object_check_lossy(copy, need, &fp, &key, LAYERS, TOKENS, &shape,
                                            KVS_DTYPE_FP16, &got, err, sizeof err),
                     KVS_ECORRUPT);
    ck_assert_ptr_null(kvs_object_kept_mask(raw));
    free(raw), free(lossy), free(copy), free(back), free(big);
}
END_TEST

int main(void) {
    Suite *s = suite_create("object_codec");
    TCase *tc = tcase_create("lossy objects");
    tcase_add_test(tc, a_raw_object_encodes_into_a_checked_lossy_one);
    tcase_add_test(tc, a_damaged_raw_object_is_never_sealed_as_lossy);
    tcase_add_test(tc, a_damaged_or_mismatched_lossy_object_is_refused);
    tcase_add_test(tc, raw_objects_keep_their_format);
    tcase_add_test(tc, a_drop_object_keeps_the_same_tokens_in_every_layer);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
