/* xxh3.c - XXH3-64 fed by a copy (xxh3.h).
 *
 * The long-input XXH3 (more than 240 bytes): eight 64-bit accumulators take the input 64 bytes (a
 * stripe) at a time, each stripe mixed with the secret at 8 bytes further on; after 16 stripes (a
 * block) the accumulators are scrambled with the secret's last 64 bytes. The input's last 64 bytes
 * are mixed once more at secret offset 121, and the digest merges the accumulators with the secret at
 * offset 11 and the input's length. A stripe is accumulated only when the input goes on after it, so
 * the one-shot and the streamed hash agree however the input is split. Inputs of at most 240 bytes
 * are hashed by libxxhash from the copy kept in the state. */
#include "xxh3.h"
#include "xxh3_secret.h"

#include "copy.h"

#include <string.h>
#include <xxhash.h>

#define STRIPE            64
#define STRIPES_PER_BLOCK 16  /* (192-byte secret - 64) / 8 */
#define SCRAMBLE_AT       128 /* secret offset of the scramble: its last 64 bytes */
#define LAST_STRIPE_AT    121 /* secret offset of the last stripe: 192 - 64 - 7 */
#define MERGE_AT          11  /* secret offset of the merge */
#define SHORT_MAX         240 /* inputs this long or shorter are hashed another way */

#define P32_1 0x9E3779B1U
#define P32_2 0x85EBCA77U
#define P32_3 0xC2B2AE3DU
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL

/* How a run of stripes is copied while it is hashed. */
enum { NO_COPY, COPY_PLAIN, COPY_STREAM };

static inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline void accumulate_scalar(uint64_t acc[8], const uint8_t *in, const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t data = read64(in + 8 * i);
        uint64_t key = data ^ read64(secret + 8 * i);
        acc[i ^ 1] += data;
        acc[i] += (uint64_t)(uint32_t)key * (key >> 32);
    }
}

static inline void scramble_scalar(uint64_t acc[8], const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= read64(secret + 8 * i);
        acc[i] = a * P32_1;
    }
}

/* n stripes at src into st's accumulators, the last of them into st->last. Unless NO_COPY they are
 * copied to dst first (plain stores: non-temporal ones would make the hash's read slow) and hashed
 * from there, so the hash is of what dst got even if src changes meanwhile. */
static void stripes_scalar(kvs_xxh3 *st, uint8_t *dst, const uint8_t *src, size_t n, int mode) {
    const uint8_t *secret = kvs_xxh3_secret();
    if (mode != NO_COPY) {
        memcpy(dst, src, n * STRIPE);
        src = dst;
    }
    if (n) memcpy(st->last, src + (n - 1) * STRIPE, STRIPE);
    for (size_t i = 0; i < n; i++, src += STRIPE) {
        accumulate_scalar(st->acc, src, secret + 8 * st->stripes);
        if (++st->stripes == STRIPES_PER_BLOCK) {
            scramble_scalar(st->acc, secret + SCRAMBLE_AT);
            st->stripes = 0;
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVS_XXH3_AVX2 1

#define AVX2 __attribute__((target("avx2")))

/* One 32-byte half of a stripe into one half of the accumulators: acc[i^1] += data[i],
 * acc[i] += lo32(k) * hi32(k) with k = data[i] ^ secret[i]. */
static inline AVX2 __m256i accumulate_half(__m256i acc, __m256i data, __m256i secret) {
    __m256i key = _mm256_xor_si256(data, secret);
    __m256i key_hi = _mm256_srli_epi64(key, 32); /* a shift: the shuffle unit has the swap */
    __m256i product = _mm256_mul_epu32(key, key_hi);
    __m256i swapped = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
    return _mm256_add_epi64(acc, _mm256_add_epi64(swapped, product)); /* one add on acc's chain */
}

static inline AVX2 __m256i scramble_half(__m256i acc, __m256i secret) {
    const __m256i prime = _mm256_set1_epi32((int)P32_1);
    acc = _mm256_xor_si256(_mm256_xor_si256(acc, _mm256_srli_epi64(acc, 47)), secret);
    __m256i lo = _mm256_mul_epu32(acc, prime);
    __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(acc, 32), prime);
    return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
}

/* Stripes ahead whose lines are asked for: the hardware prefetcher stops at each 4 KiB page, and a
 * run of the engine's pages (a block, 32 KiB in the benchmark's model) crosses several. Without it
 * a hashed copy ran 5-10 % below the same copy unhashed; with 512-1024 bytes ahead, at its rate
 * (a standalone gather and scatter of 32 KiB runs, 2026-11-27). */
#define PREFETCH_STRIPES 16

/* One stripe: loaded once into d, stored to dst from the same registers (per `mode`, a constant at
 * each call) and hashed with the secret at `key`: what dst gets is what is hashed, even if src
 * changes meanwhile. */
#define INLINE static inline __attribute__((always_inline))
INLINE AVX2 void stripe_avx2(__m256i *a0, __m256i *a1, __m256i d[2], uint8_t *dst,
                             const uint8_t *src, const uint8_t *key, int prefetch, int mode) {
    if (prefetch) _mm_prefetch((const char *)src + PREFETCH_STRIPES * STRIPE, _MM_HINT_T0);
    __m256i d0 = d[0] = _mm256_loadu_si256((const __m256i *)(const void *)src);
    __m256i d1 = d[1] = _mm256_loadu_si256((const __m256i *)(const void *)(src + 32));
    if (mode == COPY_STREAM) {
        _mm256_stream_si256((__m256i *)(void *)dst, d0);
        _mm256_stream_si256((__m256i *)(void *)(dst + 32), d1);
    } else if (mode == COPY_PLAIN) {
        _mm256_storeu_si256((__m256i *)(void *)dst, d0);
        _mm256_storeu_si256((__m256i *)(void *)(dst + 32), d1);
    }
    *a0 = accumulate_half(*a0, d0, _mm256_loadu_si256((const __m256i *)(const void *)key));
    *a1 = accumulate_half(*a1, d1, _mm256_loadu_si256((const __m256i *)(const void *)(key + 32)));
}

INLINE AVX2 void scramble_avx2(__m256i *a0, __m256i *a1, const uint8_t *secret) {
    const uint8_t *sk = secret + SCRAMBLE_AT;
    *a0 = scramble_half(*a0, _mm256_loadu_si256((const __m256i *)(const void *)sk));
    *a1 = scramble_half(*a1, _mm256_loadu_si256((const __m256i *)(const void *)(sk + 32)));
}

/* The accumulators stay in two registers for the whole run. Whole blocks are unrolled with fixed
 * secret offsets; the stripes before and after them go one at a time. The last stripe's registers
 * go to st->last. */
INLINE AVX2 void stripes_avx2_mode(kvs_xxh3 *st, uint8_t *dst, const uint8_t *src, size_t n,
                                   int mode) {
    const uint8_t *secret = kvs_xxh3_secret();
    __m256i a0 = _mm256_load_si256((const __m256i *)(const void *)st->acc);
    __m256i a1 = _mm256_load_si256((const __m256i *)(const void *)(st->acc + 4));
    __m256i d[2] = {a0, a1}; /* the stripe last loaded */
    uint32_t s = st->stripes;
    size_t i = 0;
    for (; i < n && s != 0; i++, src += STRIPE) { /* the rest of a block begun */
        stripe_avx2(&a0, &a1, d, dst, src, secret + 8 * s, i + PREFETCH_STRIPES < n, mode);
        if (mode != NO_COPY) dst += STRIPE; /* dst is NULL without a copy */
        if (++s == STRIPES_PER_BLOCK) {
            scramble_avx2(&a0, &a1, secret);
            s = 0;
        }
    }
    for (; i + STRIPES_PER_BLOCK <= n; i += STRIPES_PER_BLOCK) {
        int prefetch = i + STRIPES_PER_BLOCK + PREFETCH_STRIPES <= n;
        for (uint32_t k = 0; k < STRIPES_PER_BLOCK; k++, src += STRIPE) {
            stripe_avx2(&a0, &a1, d, dst, src, secret + 8 * k, prefetch, mode);
            if (mode != NO_COPY) dst += STRIPE;
        }
        scramble_avx2(&a0, &a1, secret);
    }
    for (; i < n; i++, src += STRIPE, s++) { /* a block begun, not finished */
        stripe_avx2(&a0, &a1, d, dst, src, secret + 8 * s, i + PREFETCH_STRIPES < n, mode);
        if (mode != NO_COPY) dst += STRIPE;
    }
    if (n) {
        _mm256_storeu_si256((__m256i *)(void *)st->last, d[0]);
        _mm256_storeu_si256((__m256i *)(void *)(st->last + 32), d[1]);
    }
    _mm256_store_si256((__m256i *)(void *)st->acc, a0);
    _mm256_store_si256((__m256i *)(void *)(st->acc + 4), a1);
    st->stripes = s;
}

static AVX2 void stripes_avx2(kvs_xxh3 *st, uint8_t *dst, const uint8_t *src, size_t n, int mode) {
    switch (mode) {
        case COPY_STREAM: stripes_avx2_mode(st, dst, src, n, COPY_STREAM); break;
        case COPY_PLAIN: stripes_avx2_mode(st, dst, src, n, COPY_PLAIN); break;
        default: stripes_avx2_mode(st, dst, src, n, NO_COPY); break;
    }
}

/* The same with a whole stripe and all eight accumulators in one AVX-512 register: half the
 * instructions a stripe, what a keyed save (its tag and this checksum both computed from one copy)
 * needs to keep up with memory. */
#define AVX512 __attribute__((target("avx512f")))

INLINE AVX512 __m512i accumulate_512(__m512i acc, __m512i data, __m512i secret) {
    __m512i key = _mm512_xor_si512(data, secret);
    __m512i product = _mm512_mul_epu32(key, _mm512_srli_epi64(key, 32));
    __m512i swapped = _mm512_shuffle_epi32(data, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2));
    return _mm512_add_epi64(acc, _mm512_add_epi64(swapped, product));
}

INLINE AVX512 __m512i scramble_512(__m512i acc, const uint8_t *secret) {
    const __m512i prime = _mm512_set1_epi32((int)P32_1);
    __m512i sk = _mm512_loadu_si512((const void *)(secret + SCRAMBLE_AT));
    acc = _mm512_xor_si512(_mm512_xor_si512(acc, _mm512_srli_epi64(acc, 47)), sk);
    __m512i lo = _mm512_mul_epu32(acc, prime);
    __m512i hi = _mm512_mul_epu32(_mm512_srli_epi64(acc, 32), prime);
    return _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
}

INLINE AVX512 __m512i stripe_512(__m512i acc, __m512i *d, uint8_t *dst, const uint8_t *src,
                                 const uint8_t *key, int prefetch, int mode) {
    if (prefetch) _mm_prefetch((const char *)src + PREFETCH_STRIPES * STRIPE, _MM_HINT_T0);
    __m512i v = *d = _mm512_loadu_si512((const void *)src);
    if (mode == COPY_STREAM)
        _mm512_stream_si512((void *)dst, v);
    else if (mode == COPY_PLAIN)
        _mm512_storeu_si512((void *)dst, v);
    return accumulate_512(acc, v, _mm512_loadu_si512((const void *)key));
}

INLINE AVX512 void stripes_avx512_mode(kvs_xxh3 *st, uint8_t *dst, const uint8_t *src, size_t n,
                                       int mode) {
    const uint8_t *secret = kvs_xxh3_secret();
    __m512i a = _mm512_loadu_si512((const void *)st->acc);
    __m512i d = a; /* the stripe last loaded */
    uint32_t s = st->stripes;
    size_t i = 0;
    for (; i < n && s != 0; i++, src += STRIPE) { /* the rest of a block begun */
        a = stripe_512(a, &d, dst, src, secret + 8 * s, i + PREFETCH_STRIPES < n, mode);
        if (mode != NO_COPY) dst += STRIPE;
        if (++s == STRIPES_PER_BLOCK) {
            a = scramble_512(a, secret);
            s = 0;
        }
    }
    for (; i + STRIPES_PER_BLOCK <= n; i += STRIPES_PER_BLOCK) {
        int prefetch = i + STRIPES_PER_BLOCK + PREFETCH_STRIPES <= n;
        for (uint32_t k = 0; k < STRIPES_PER_BLOCK; k++, src += STRIPE) {
            a = stripe_512(a, &d, dst, src, secret + 8 * k, prefetch, mode);
            if (mode != NO_COPY) dst += STRIPE;
        }
        a = scramble_512(a, secret);
    }
    for (; i < n; i++, src += STRIPE, s++) { /* a block begun, not finished */
        a = stripe_512(a, &d, dst, src, secret + 8 * s, i + PREFETCH_STRIPES < n, mode);
        if (mode != NO_COPY) dst += STRIPE;
    }
    if (n) _mm512_storeu_si512((void *)st->last, d);
    _mm512_storeu_si512((void *)st->acc, a);
    st->stripes = s;
}

static AVX512 void stripes_avx512(kvs_xxh3 *st, uint8_t *dst, const uint8_t *src, size_t n,
                                  int mode) {
    switch (mode) {
        case COPY_STREAM: stripes_avx512_mode(st, dst, src, n, COPY_STREAM); break;
        case COPY_PLAIN: stripes_avx512_mode(st, dst, src, n, COPY_PLAIN); break;
        default: stripes_avx512_mode(st, dst, src, n, NO_COPY); break;
    }
}
#endif

static int simd_allowed = 2; /* kvs_xxh3_allow_simd: tests run the narrower loops too */

void kvs_xxh3_allow_simd(int allow) {
    simd_allowed = allow;
}

static void stripes(kvs_xxh3 *st, uint8_t *dst, const uint8_t *src, size_t n, int mode) {
#ifdef KVS_XXH3_AVX2
    if (simd_allowed >= 2 && __builtin_cpu_supports("avx512f")) {
        /* non-temporal stores of 64 bytes need dst aligned to 64 */
        if (mode == COPY_STREAM && ((uintptr_t)dst & 63) != 0) mode = COPY_PLAIN;
        stripes_avx512(st, dst, src, n, mode);
        return;
    }
    if (simd_allowed && __builtin_cpu_supports("avx2")) {
        /* non-temporal stores of 32 bytes need dst aligned to 32; the stripes keep what the first
         * one has */
        if (mode == COPY_STREAM && ((uintptr_t)dst & 31) != 0) mode = COPY_PLAIN;
        stripes_avx2(st, dst, src, n, mode);
        return;
    }
#endif
    stripes_scalar(st, dst, src, n, mode);
}

void kvs_xxh3_reset(kvs_xxh3 *st) {
    static const uint64_t init[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    memcpy(st->acc, init, sizeof init);
    st->total = 0;
    st->stripes = 0;
    st->pending = 0;
}

/* The pending stripe (full, and the input goes on) into the accumulators (and st->last). */
static void take_pending(kvs_xxh3 *st) {
    stripes(st, NULL, st->pend, 1, NO_COPY);
    st->pending = 0;
}

/* k bytes at src to dst (when copying), and into the state at `to` from what dst got. */
static void copy_then_keep(uint8_t *to, uint8_t *dst, const uint8_t *src, size_t k) {
    if (dst) {
        memcpy(dst, src, k);
        src = dst;
    }
    memcpy(to, src, k);
}

/* Every byte hashed is read from src once, or after it was copied, from dst: a copy of bytes that
 * change under it (a tier slab reused while a load reads it) is hashed as dst got it, so the
 * connector's check sees the tear. */
static void feed(kvs_xxh3 *st, uint8_t *dst, const uint8_t *src, size_t n, int mode) {
    if (n == 0) return;
    uint64_t before = st->total;
    uint8_t *dst0 = dst;
    const uint8_t *src0 = src;
    st->total += n;
    if (st->pending == STRIPE) take_pending(st);
    if (st->pending > 0) { /* complete the pending stripe first */
        size_t k = STRIPE - st->pending < n ? STRIPE - st->pending : n;
        copy_then_keep(st->pend + st->pending, dst, src, k);
        if (dst) dst += k;
        st->pending += (uint32_t)k;
        src += k;
        n -= k;
        if (n == 0) goto start;
        take_pending(st);
    }
    /* every stripe the input goes on after; the last 1..64 bytes wait in pend */
    size_t whole = (n - 1) / STRIPE;
    if (whole > 0) {
        stripes(st, dst, src, whole, dst ? mode : NO_COPY);
        src += whole * STRIPE;
        if (dst) dst += whole * STRIPE;
        n -= whole * STRIPE;
    }
    copy_then_keep(st->pend, dst, src, n);
    st->pending = (uint32_t)n;
start:
    if (before < SHORT_MAX) { /* the input's first bytes, as delivered (read back from dst) */
        size_t k = SHORT_MAX - before < st->total - before ? SHORT_MAX - (size_t)before
                                                           : (size_t)(st->total - before);
        memcpy(st->start + before, dst0 ? dst0 : src0, k);
    }
}

void kvs_xxh3_update(kvs_xxh3 *st, const void *src, size_t n) {
    feed(st, NULL, src, n, NO_COPY);
}

void kvs_xxh3_copy_update(kvs_xxh3 *st, void *dst, const void *src, size_t n, int stream) {
    feed(st, dst, src, n, stream && n >= KVS_COPY_STREAM_MIN ? COPY_STREAM : COPY_PLAIN);
}

/* The 128-bit product of a and b, its halves xored. */
static uint64_t mul_fold(uint64_t a, uint64_t b) {
#ifdef __SIZEOF_INT128__
    unsigned __int128 p = (unsigned __int128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#else /* 32-bit targets: four 32 x 32 products */
    uint64_t lo_lo = (a & 0xFFFFFFFFu) * (b & 0xFFFFFFFFu);
    uint64_t hi_lo = (a >> 32) * (b & 0xFFFFFFFFu);
    uint64_t lo_hi = (a & 0xFFFFFFFFu) * (b >> 32);
    uint64_t hi_hi = (a >> 32) * (b >> 32);
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;
    uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
    uint64_t lower = (cross << 32) | (lo_lo & 0xFFFFFFFFu);
    return lower ^ upper;
#endif
}

uint64_t kvs_xxh3_digest(const kvs_xxh3 *st) {
    if (st->total <= SHORT_MAX) return XXH3_64bits(st->start, (size_t)st->total);
    const uint8_t *secret = kvs_xxh3_secret();
    uint64_t acc[8];
    memcpy(acc, st->acc, sizeof acc);
    uint8_t last[STRIPE];
    memcpy(last, st->last + st->pending, STRIPE - st->pending);
    memcpy(last + STRIPE - st->pending, st->pend, st->pending);
    accumulate_scalar(acc, last, secret + LAST_STRIPE_AT);
    uint64_t h = st->total * P64_1;
    for (int i = 0; i < 4; i++)
        h += mul_fold(acc[2 * i] ^ read64(secret + MERGE_AT + 16 * i),
                      acc[2 * i + 1] ^ read64(secret + MERGE_AT + 16 * i + 8));
    h ^= h >> 37;
    h *= 0x165667919E3779F9ULL;
    return h ^ (h >> 32);
}

uint64_t kvs_xxh3_64(const void *src, size_t n) {
    kvs_xxh3 st;
    kvs_xxh3_reset(&st);
    kvs_xxh3_update(&st, src, n);
    return kvs_xxh3_digest(&st);
}

uint64_t kvs_xxh3_copy64(void *dst, const void *src, size_t n, int stream) {
    kvs_xxh3 st;
    kvs_xxh3_reset(&st);
    kvs_xxh3_copy_update(&st, dst, src, n, stream);
    if (stream) kvs_copy_fence();
    return kvs_xxh3_digest(&st);
}
