/* nh.c - NH over 1 KiB units (nh.h): AVX2 where the CPU has it, a portable loop elsewhere. */
#include "nh.h"

#include <string.h>

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void unit_scalar(const uint32_t *key, const uint8_t *m, size_t len, uint8_t *out) {
    uint64_t sum[KVS_NH_PASSES] = {0};
    for (size_t i = 0; i < len / KVS_NH_STRIDE_BYTES; i++) {
        const uint8_t *s = m + i * KVS_NH_STRIDE_BYTES;
        uint32_t w0 = le32(s), w1 = le32(s + 4), w2 = le32(s + 8), w3 = le32(s + 12);
        for (uint32_t p = 0; p < KVS_NH_PASSES; p++) {
            const uint32_t *k = key + 4 * i + 4 * p;
            sum[p] += (uint64_t)(uint32_t)(w0 + k[0]) * (uint32_t)(w2 + k[2]) +
                      (uint64_t)(uint32_t)(w1 + k[1]) * (uint32_t)(w3 + k[3]);
        }
    }
    for (uint32_t p = 0; p < KVS_NH_PASSES; p++) put_le64(out + 8 * p, sum[p]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))

/* Two strides a vector: each 64-bit lane multiplies a word by the word two places on (shuffles
 * 0x10 and 0x32 put m[4i] and m[4i+2], m[4i+1] and m[4i+3] in the lanes' low halves), and a pass's
 * sum is its four lanes added at the end. */
static AVX2 void unit_avx2(const uint32_t *key, const uint8_t *m, size_t len, uint8_t *out,
                           uint8_t *dst, int stream) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t words = len / 4, j = 0;
#define NH_PASS(S, P)                                                                             \
    t = _mm256_add_epi32(w,                                                                       \
                         _mm256_loadu_si256((const __m256i *)(const void *)(key + j + 4 * (P)))); \
    S = _mm256_add_epi64(                                                                         \
        S, _mm256_mul_epu32(_mm256_shuffle_epi32(t, 0x10), _mm256_shuffle_epi32(t, 0x32)));
    for (; j + 8 <= words; j += 8) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(const void *)(m + 4 * j)), t;
        if (stream) /* the copy's store: past the cache when the destination is not read soon */
            _mm256_stream_si256((__m256i *)(void *)(dst + 4 * j), w);
        else if (dst)
            _mm256_storeu_si256((__m256i *)(void *)(dst + 4 * j), w);
        NH_PASS(s0, 0)
        NH_PASS(s1, 1)
        NH_PASS(s2, 2)
        NH_PASS(s3, 3)
    }
#undef NH_PASS
    uint64_t lanes[4][4];
    _mm256_storeu_si256((__m256i *)(void *)lanes[0], s0);
    _mm256_storeu_si256((__m256i *)(void *)lanes[1], s1);
    _mm256_storeu_si256((__m256i *)(void *)lanes[2], s2);
    _mm256_storeu_si256((__m256i *)(void *)lanes[3], s3);
    uint8_t tail[KVS_NH_OUT_BYTES] = {0};
    if (j < words) { /* an odd stride at the end of a short unit */
        if (dst) memcpy(dst + 4 * j, m + 4 * j, (words - j) * 4); /* then hashed from there */
        unit_scalar(key + j, dst ? dst + 4 * j : m + 4 * j, (words - j) * 4, tail);
    }
    for (int p = 0; p < 4; p++) {
        uint64_t t = 0;
        memcpy(&t, tail + 8 * p, 8); /* little-endian host: the scalar loop's sum as written */
        put_le64(out + 8 * p, lanes[p][0] + lanes[p][1] + lanes[p][2] + lanes[p][3] + t);
    }
}
#define HAVE_AVX2 1

#define AVX512 __attribute__((target("avx512f")))

/* The eight 64-bit lanes added modulo 2^64 by vector adds (GCC's reduce intrinsic adds them as
 * signed integers, whose overflow is undefined). */
static AVX512 uint64_t sum_lanes(__m512i v) {
    __m256i t = _mm256_add_epi64(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i u = _mm_add_epi64(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    u = _mm_add_epi64(u, _mm_unpackhi_epi64(u, u));
    return (uint64_t)_mm_cvtsi128_si64(u);
}

/* The same four strides a vector. */
static AVX512 void unit_avx512(const uint32_t *key, const uint8_t *m, size_t len, uint8_t *out,
                               uint8_t *dst, int stream) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t words = len / 4, j = 0;
#define NH_PASS(S, P)                                                                      \
    t = _mm512_add_epi32(w, _mm512_loadu_si512((const void *)(key + j + 4 * (P))));        \
    S = _mm512_add_epi64(S, _mm512_mul_epu32(_mm512_shuffle_epi32(t, (_MM_PERM_ENUM)0x10), \
                                             _mm512_shuffle_epi32(t, (_MM_PERM_ENUM)0x32)));
    for (; j + 16 <= words; j += 16) {
        __m512i w = _mm512_loadu_si512((const void *)(m + 4 * j)), t;
        if (stream)
            _mm512_stream_si512((void *)(dst + 4 * j), w);
        else if (dst)
            _mm512_storeu_si512((void *)(dst + 4 * j), w);
        NH_PASS(s0, 0)
        NH_PASS(s1, 1)
        NH_PASS(s2, 2)
        NH_PASS(s3, 3)
    }
#undef NH_PASS
    uint8_t tail[KVS_NH_OUT_BYTES] = {0};
    if (j < words) { /* strides past the last whole vector of a short unit */
        if (dst) memcpy(dst + 4 * j, m + 4 * j, (words - j) * 4); /* then hashed from there */
        unit_scalar(key + j, dst ? dst + 4 * j : m + 4 * j, (words - j) * 4, tail);
    }
    uint64_t t[4] = {0};
    memcpy(t, tail, sizeof t); /* little-endian host: the scalar loop's sums as written */
    put_le64(out, sum_lanes(s0) + t[0]);
    put_le64(out + 8, sum_lanes(s1) + t[1]);
    put_le64(out + 16, sum_lanes(s2) + t[2]);
    put_le64(out + 24, sum_lanes(s3) + t[3]);
}
#endif

static int simd_allowed = 2;

void kvs_nh_allow_simd(int allow) {
    simd_allowed = allow;
}

/* 2: AVX-512, 1: AVX2, 0: the portable loop. */
static int simd_level(void) {
#ifdef HAVE_AVX2
    if (simd_allowed >= 2 && __builtin_cpu_supports("avx512f")) return 2;
    if (simd_allowed >= 1 && __builtin_cpu_supports("avx2")) return 1;
#endif
    return 0;
}

void kvs_nh_unit(const uint32_t key[KVS_NH_KEY_WORDS], const uint8_t *m, size_t len,
                 uint8_t out[KVS_NH_OUT_BYTES]) {
#ifdef HAVE_AVX2
    int level = simd_level();
    if (level == 2)
        unit_avx512(key, m, len, out, NULL, 0);
    else if (level == 1)
        unit_avx2(key, m, len, out, NULL, 0);
    if (level) return;
#endif
    unit_scalar(key, m, len, out);
}

void kvs_nh_units_copy(const uint32_t key[KVS_NH_KEY_WORDS], uint8_t *dst, const uint8_t *m,
                       size_t n, uint8_t *out, int stream) {
#ifdef HAVE_AVX2
    int level = simd_level();
    if (level) {
        stream = stream && dst && ((uintptr_t)dst & (level == 2 ? 63 : 31)) == 0;
        for (size_t u = 0; u < n; u++) {
            const uint8_t *src = m + u * KVS_NH_UNIT_BYTES;
            uint8_t *to = dst ? dst + u * KVS_NH_UNIT_BYTES : NULL, *o = out + u * KVS_NH_OUT_BYTES;
            if (level == 2)
                unit_avx512(key, src, KVS_NH_UNIT_BYTES, o, to, stream);
            else
                unit_avx2(key, src, KVS_NH_UNIT_BYTES, o, to, stream);
        }
        return;
    }
#endif
    (void)stream;
    for (size_t u = 0; u < n; u++) { /* copied first, hashed from the copy: src is read once */
        const uint8_t *from = m + u * KVS_NH_UNIT_BYTES;
        if (dst) {
            memcpy(dst + u * KVS_NH_UNIT_BYTES, from, KVS_NH_UNIT_BYTES);
            from = dst + u * KVS_NH_UNIT_BYTES;
        }
        unit_scalar(key, from, KVS_NH_UNIT_BYTES, out + u * KVS_NH_OUT_BYTES);
    }
}

void kvs_nh_units(const uint32_t key[KVS_NH_KEY_WORDS], const uint8_t *m, size_t n, uint8_t *out) {
    kvs_nh_units_copy(key, NULL, m, n, out, 0);
}
