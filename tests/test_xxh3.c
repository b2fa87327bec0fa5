/* test_xxh3.c - XXH3-64 fed by a copy (common/xxh3.c) against libxxhash: the same digest for every
 * length around the format's edges (240 bytes, stripes of 64, blocks of 1 KiB), however the input is
 * split into updates, copied or not, with and without non-temporal stores, from and to addresses of
 * every alignment; the copy lands byte for byte and writes nothing past its end. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/copy.h"
#include "common/xxh3.h"
#include "tests/support/flipper.h"

#define MAX_LEN ((size_t)(70 * 1024))

static uint8_t *input;

static void setup(void) {
    input = malloc(MAX_LEN + 64);
    ck_assert_ptr_nonnull(input);
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (size_t i = 0; i < MAX_LEN + 64; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        input[i] = (uint8_t)(x >> 24);
    }
}

static void teardown(void) {
    kvs_xxh3_allow_simd(2);
    free(input);
}

static uint64_t next_random(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Lengths on both sides of every edge XXH3 has: short inputs, 240, stripes, blocks. */
static const size_t edge_lengths[] = {
    0,    1,    3,     4,     8,     9,     16,    17,    64,    128,      129,
    239,  240,  241,   255,   256,   257,   319,   320,   321,   1023,     1024,
    1025, 1087, 1088,  1089,  2047,  2048,  2049,  4095,  4096,  4097,     8191,
    8192, 8193, 16384, 32767, 32768, 32769, 65536, 65537, 70000, 70 * 1024};

/* Loop index 0: the AVX-512 loop where the CPU has it, 1: the AVX2 loop, 2: the portable loop. */
START_TEST(one_update_equals_libxxhash_at_every_edge) {
    kvs_xxh3_allow_simd(2 - _i);
    for (size_t i = 0; i < sizeof edge_lengths / sizeof edge_lengths[0]; i++) {
        size_t n = edge_lengths[i];
        ck_assert_msg(kvs_xxh3_64(input, n) == XXH3_64bits(input, n), "length %zu", n);
        /* from an odd address too */
        ck_assert_msg(kvs_xxh3_64(input + 3, n) == XXH3_64bits(input + 3, n), "length %zu at +3",
                      n);
    }
}
END_TEST

/* The same bytes fed in pieces of sizes drawn at random (0 included) give the same digest, and the
 * digest can be read in the middle without changing what follows. */
START_TEST(any_split_into_updates_gives_the_same_digest) {
    kvs_xxh3_allow_simd(2 - _i);
    uint64_t seed = 12345;
    for (int round = 0; round < 400; round++) {
        size_t n = (size_t)(next_random(&seed) % (round < 200 ? 3000 : MAX_LEN));
        size_t piece_max = 1 + (size_t)(next_random(&seed) % (round % 4 == 0 ? 70 : 9000));
        kvs_xxh3 st;
        kvs_xxh3_reset(&st);
        size_t off = 0;
        while (off < n) {
            size_t m = (size_t)(next_random(&seed) % (piece_max + 1));
            if (m > n - off) m = n - off;
            kvs_xxh3_update(&st, input + off, m);
            off += m;
            if (n < 3000 && kvs_xxh3_digest(&st) != XXH3_64bits(input, off))
                ck_abort_msg("round %d: digest after %zu of %zu bytes", round, off, n);
        }
        ck_assert_msg(kvs_xxh3_digest(&st) == XXH3_64bits(input, n), "round %d length %zu", round,
                      n);
    }
}
END_TEST

/* Bytes of p[0, n) that are not `v` (one assertion per range: Check records every assertion). */
static size_t count_not(const uint8_t *p, size_t n, uint8_t v) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += p[i] != v;
    return k;
}

/* Copying while hashing: the digest is the library's, dst holds the bytes, nothing around dst is
 * touched; for both store kinds, every alignment of both ends modulo 64, and splits. */
START_TEST(copies_land_and_hash_like_the_library) {
    kvs_xxh3_allow_simd(2 - _i);
    uint8_t *out = malloc(MAX_LEN + 256);
    ck_assert_ptr_nonnull(out);
    uint64_t seed = 777;
    for (int round = 0; round < 300; round++) {
        size_t n = (size_t)(next_random(&seed) % (round < 100 ? 5000 : MAX_LEN - 64));
        size_t src_off = (size_t)(next_random(&seed) % 64);
        size_t dst_off = 64 + (size_t)(next_random(&seed) % 64);
        int stream = round % 2;
        size_t piece = round % 3 == 0 ? n : 1 + (size_t)(next_random(&seed) % 20000);
        memset(out, 0xA5, MAX_LEN + 256);
        kvs_xxh3 st;
        kvs_xxh3_reset(&st);
        for (size_t off = 0; off < n; off += piece) {
            size_t m = n - off < piece ? n - off : piece;
            kvs_xxh3_copy_update(&st, out + dst_off + off, input + src_off + off, m, stream);
        }
        kvs_copy_fence();
        ck_assert_msg(kvs_xxh3_digest(&st) == XXH3_64bits(input + src_off, n),
                      "round %d length %zu", round, n);
        ck_assert_mem_eq(out + dst_off, input + src_off, n);
        ck_assert_uint_eq(count_not(out, dst_off, 0xA5), 0);
        ck_assert_uint_eq(count_not(out + dst_off + n, MAX_LEN + 256 - dst_off - n, 0xA5), 0);
    }
    free(out);
}
END_TEST

/* The one-call copy and hash keeps its promise: the copy followed by the hash. */
START_TEST(copy_hash64_is_the_hash_of_the_source) {
    kvs_xxh3_allow_simd(2 - _i);
    uint8_t *out = malloc(MAX_LEN);
    ck_assert_ptr_nonnull(out);
    for (size_t i = 0; i < sizeof edge_lengths / sizeof edge_lengths[0]; i++) {
        size_t n = edge_lengths[i];
        for (int stream = 0; stream < 2; stream++) {
            memset(out, 0, MAX_LEN);
            ck_assert_uint_eq(kvs_xxh3_copy64(out, input, n, stream), XXH3_64bits(input, n));
            ck_assert_mem_eq(out, input, n);
        }
    }
    free(out);
}
END_TEST

/* A source that changes while it is copied (a tier slab reused under a load): the digest is always
 * that of the bytes dst got, so the connector's check sees the tear. */
START_TEST(a_source_changing_under_the_copy_hashes_as_dst_got_it) {
    kvs_xxh3_allow_simd(2 - _i / 2);
    int stream = _i % 2;
    static const size_t lengths[] = {200, 1000, 5000};
    uint8_t *src = aligned_alloc(64, 8192), *dst = aligned_alloc(64, 8192);
    ck_assert(src && dst);
    memcpy(src, input, 8192);
    kvs_test_flipper *f = kvs_test_flipper_start(src, 8192, 7);
    size_t bad = 0;
    for (int round = 0; round < 20000; round++) {
        size_t n = lengths[round % 3];
        uint64_t h = kvs_xxh3_copy64(dst, src, n, stream);
        bad += h != XXH3_64bits(dst, n);
    }
    kvs_test_flipper_stop(f);
    ck_assert_uint_eq(bad, 0);
    free(src);
    free(dst);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("xxh3");
    TCase *tc = tcase_create("xxh3");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, one_update_equals_libxxhash_at_every_edge, 0, 3);
    tcase_add_loop_test(tc, any_split_into_updates_gives_the_same_digest, 0, 3);
    tcase_add_loop_test(tc, copies_land_and_hash_like_the_library, 0, 3);
    tcase_add_loop_test(tc, copy_hash64_is_the_hash_of_the_source, 0, 3);
    tcase_add_loop_test(tc, a_source_changing_under_the_copy_hashes_as_dst_got_it, 0, 6);
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
