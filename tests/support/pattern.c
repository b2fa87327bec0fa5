/* pattern.c - see pattern.h. */
#include "pattern.h"

#include <stdlib.h>
#include <string.h>

void kvs_test_fill(uint8_t *buf, size_t len, uint32_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)(x >> 24);
    }
}

int kvs_test_matches(const uint8_t *buf, size_t len, uint32_t seed) {
    uint8_t *want = malloc(len ? len : 1);
    if (!want) return 0;
    kvs_test_fill(want, len, seed);
    int same = memcmp(buf, want, len) == 0;
    free(want);
    return same;
}
