/* test_nh.c - NH (common/nh.h): values worked out by hand, the AVX2 and portable loops against each
 * other on every unit length, the Toeplitz key shift between passes, one flipped bit; NHPoly1305
 * (common/nhpoly.h) streamed in pieces and by copies. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/nh.h"
#include "common/nhpoly.h"
#include "tests/support/objects.h"

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Words of 1 under a zero key: each stride adds 1*1 + 1*1 to every pass; with key words k[i] = i
 * and a zero message, pass p's stride i adds (4i+4p)(4i+4p+2) + (4i+4p+1)(4i+4p+3). */
START_TEST(values_worked_out_by_hand) {
    uint32_t key[KVS_NH_KEY_WORDS];
    uint8_t m[KVS_NH_UNIT_BYTES], out[KVS_NH_OUT_BYTES];
    memset(key, 0, sizeof key);
    for (uint32_t i = 0; i < KVS_NH_UNIT_BYTES / 4; i++) put32(m + 4 * i, 1);
    for (int simd = 0; simd < 3; simd++) {
        kvs_nh_allow_simd(simd);
        kvs_nh_unit(key, m, KVS_NH_UNIT_BYTES, out);
        for (int p = 0; p < 4; p++) ck_assert_uint_eq(le64(out + 8 * p), 2 * 64);
        kvs_nh_unit(key, m, 112, out); /* seven strides: past the vectors' last whole one */
        for (int p = 0; p < 4; p++) ck_assert_uint_eq(le64(out + 8 * p), 2 * 7);
    }
    for (uint32_t i = 0; i < KVS_NH_KEY_WORDS; i++) key[i] = i;
    memset(m, 0, sizeof m);
    for (int simd = 0; simd < 3; simd++) {
        kvs_nh_allow_simd(simd);
        kvs_nh_unit(key, m, KVS_NH_UNIT_BYTES, out);
        for (uint64_t p = 0; p < 4; p++) {
            uint64_t want = 0;
            for (uint64_t i = 0; i < 64; i++) {
                uint64_t b = 4 * i + 4 * p;
                want += b * (b + 2) + (b + 1) * (b + 3);
            }
            ck_assert_uint_eq(le64(out + 8 * p), want);
        }
    }
    kvs_nh_allow_simd(2);
}
END_TEST

/* The AVX2 and AVX-512 loops (where the CPU has them) give what the portable loop gives, for every length a unit
 * can have and for whole units in a row; with the key shifted by 4 words, pass 0 is pass 1. */
START_TEST(the_vector_loop_agrees_with_the_portable_one) {
    uint32_t key[KVS_NH_KEY_WORDS + 4];
    kvs_test_fill((uint8_t *)key, sizeof key, 5);
    enum { UNITS = 9 };
    uint8_t *m = malloc(UNITS * KVS_NH_UNIT_BYTES);
    ck_assert_ptr_nonnull(m);
    kvs_test_fill(m, UNITS * KVS_NH_UNIT_BYTES, 6);
    uint8_t a[UNITS * KVS_NH_OUT_BYTES], b[UNITS * KVS_NH_OUT_BYTES];
    for (size_t len = KVS_NH_STRIDE_BYTES; len <= KVS_NH_UNIT_BYTES; len += KVS_NH_STRIDE_BYTES)
        for (int simd = 1; simd < 3; simd++) {
            kvs_nh_allow_simd(simd);
            kvs_nh_unit(key, m + len, len, a);
            kvs_nh_allow_simd(0);
            kvs_nh_unit(key, m + len, len, b);
            ck_assert_msg(memcmp(a, b, KVS_NH_OUT_BYTES) == 0,
                          "a unit of %zu bytes differs (vectors %d)", len, simd);
        }
    kvs_nh_allow_simd(0);
    kvs_nh_units(key, m, UNITS, b);
    for (int simd = 1; simd < 3; simd++) {
        kvs_nh_allow_simd(simd);
        kvs_nh_units(key, m, UNITS, a);
        ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
    }
    kvs_nh_unit(key + 4, m, KVS_NH_UNIT_BYTES, b);
    ck_assert_uint_eq(le64(b), le64(a + 8)); /* Toeplitz: pass 1 is pass 0 under the shifted key */
    ck_assert_uint_eq(le64(b + 16), le64(a + 24));
    kvs_nh_allow_simd(2);
    free(m);
}
END_TEST

/* One bit of the message changes every pass's sum. */
START_TEST(a_flipped_bit_changes_every_pass) {
    uint32_t key[KVS_NH_KEY_WORDS];
    kvs_test_fill((uint8_t *)key, sizeof key, 7);
    uint8_t m[KVS_NH_UNIT_BYTES], a[KVS_NH_OUT_BYTES], b[KVS_NH_OUT_BYTES];
    kvs_test_fill(m, sizeof m, 8);
    kvs_nh_unit(key, m, sizeof m, a);
    m[517] ^= 0x10;
    kvs_nh_unit(key, m, sizeof m, b);
    for (int p = 0; p < 4; p++) ck_assert_uint_ne(le64(a + 8 * p), le64(b + 8 * p));
}
END_TEST

/* NHPoly1305 fed in pieces of any size, by copies or not, gives one tag and copies every byte; its
 * length counts (a zero byte more is another tag), and so does the one-time key. */
START_TEST(a_tag_is_the_same_however_the_bytes_are_split) {
    uint32_t key[KVS_NH_KEY_WORDS];
    kvs_test_fill((uint8_t *)key, sizeof key, 11);
    uint8_t otk[KVS_NHPOLY_KEY_BYTES];
    kvs_test_fill(otk, sizeof otk, 12);
    enum { LEN = 70000 }; /* 68 units and a partial one of 368 bytes */
    uint8_t *src = malloc(LEN + 1), *dst = calloc(1, LEN);
    ck_assert_ptr_nonnull(src);
    ck_assert_ptr_nonnull(dst);
    kvs_test_fill(src, LEN, 13);
    src[LEN] = 0;
    uint8_t whole[KVS_NHPOLY_TAG_BYTES], split[KVS_NHPOLY_TAG_BYTES], other[KVS_NHPOLY_TAG_BYTES];
    kvs_nhpoly s;
    ck_assert(kvs_nhpoly_init(&s, kvs_test_poly1305(), key, otk));
    kvs_nhpoly_update(&s, src, LEN);
    ck_assert(kvs_nhpoly_final(&s, whole));
    static const size_t pieces[] = {1, 15, 1000, 1024, 3000, 7, 4096, 64, 333};
    for (int simd = 0; simd < 3; simd++) {
        kvs_nh_allow_simd(simd);
        memset(dst, 0, LEN);
        ck_assert(kvs_nhpoly_init(&s, kvs_test_poly1305(), key, otk));
        size_t at = 0;
        for (int i = 0; at < LEN; i = (i + 1) % 9) {
            size_t k = LEN - at < pieces[i] ? LEN - at : pieces[i];
            if (i % 2)
                kvs_nhpoly_copy_update(&s, dst + at, src + at, k, i % 4 == 1);
            else {
                memcpy(dst + at, src + at, k);
                kvs_nhpoly_update(&s, src + at, k);
            }
            at += k;
        }
        ck_assert(kvs_nhpoly_final(&s, split));
        ck_assert_int_eq(memcmp(whole, split, sizeof whole), 0);
        ck_assert_int_eq(memcmp(dst, src, LEN), 0);
    }
    kvs_nh_allow_simd(2);
    ck_assert(kvs_nhpoly_init(&s, kvs_test_poly1305(), key, otk));
    kvs_nhpoly_update(&s, src, LEN + 1); /* one zero byte more: the same NH, another length */
    ck_assert(kvs_nhpoly_final(&s, other));
    ck_assert_int_ne(memcmp(whole, other, sizeof whole), 0);
    otk[0] ^= 1;
    ck_assert(kvs_nhpoly_init(&s, kvs_test_poly1305(), key, otk));
    kvs_nhpoly_update(&s, src, LEN);
    ck_assert(kvs_nhpoly_final(&s, other));
    ck_assert_int_ne(memcmp(whole, other, sizeof whole), 0);
    free(src);
    free(dst);
}
END_TEST

int main(void) {
    Suite *s = suite_create("nh");
    TCase *tc = tcase_create("nh");
    tcase_add_test(tc, values_worked_out_by_hand);
    tcase_add_test(tc, the_vector_loop_agrees_with_the_portable_one);
    tcase_add_test(tc, a_flipped_bit_changes_every_pass);
    tcase_add_test(tc, a_tag_is_the_same_however_the_bytes_are_split);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
