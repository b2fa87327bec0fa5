/* copy.c - copies of long runs, plain and hashed (copy.h). */
#include "copy.h"

#include <string.h>

/* Bytes copied and then hashed as one step: the step's source is still in L1 when it is hashed. */
#define STEP_BYTES ((size_t)4096)

#if defined(__SSE2__)
#include <emmintrin.h>
void kvs_copy_streaming(void *dst_, const void *src_, size_t n) {
    char *dst = dst_;
    const char *src = src_;
    if (n < 64 + 16) {
        memcpy(dst, src, n);
        return;
    }
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + 48));
        _mm_stream_si128((__m128i *)(void *)dst, a);
        _mm_stream_si128((__m128i *)(void *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(void *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(void *)(dst + 48), d);
    }
    memcpy(dst, src, n);
}

void kvs_copy_fence(void) {
    _mm_sfence();
}
#else
void kvs_copy_streaming(void *dst, const void *src, size_t n) {
    memcpy(dst, src, n);
}

void kvs_copy_fence(void) {}
#endif

void kvs_copy_hash_update(XXH3_state_t *st, void *dst_, const void *src_, size_t n, int stream) {
    char *dst = dst_;
    const char *src = src_;
    stream = stream && n >= KVS_COPY_STREAM_MIN;
    for (size_t off = 0; off < n; off += STEP_BYTES) {
        size_t m = n - off < STEP_BYTES ? n - off : STEP_BYTES;
        if (stream)
            kvs_copy_streaming(dst + off, src + off, m);
        else
            memcpy(dst + off, src + off, m);
        /* the next step's lines are asked for (into L2) while this one is hashed from L1: the
         * hardware prefetcher stops at the 4 KiB page, and the hash alone would leave memory idle */
        for (size_t i = off + m; i < n && i < off + 2 * m; i += 64)
            __builtin_prefetch(src + i, 0, 2);
        XXH3_64bits_update(st, src + off, m);
    }
}

uint64_t kvs_copy_hash64(void *dst, const void *src, size_t n, int stream) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    kvs_copy_hash_update(&st, dst, src, n, stream);
    if (stream) kvs_copy_fence();
    return XXH3_64bits_digest(&st);
}
