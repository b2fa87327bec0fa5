/* copy.c - copies of long runs with non-temporal stores (copy.h). */
#include "copy.h"

#include <string.h>

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
