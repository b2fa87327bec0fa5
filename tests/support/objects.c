/* objects.c - test keys and object bytes (contract in objects.h). */
#include "objects.h"

#include <stdlib.h>
#include <string.h>

#include "common/nhpoly.h"

kvs_key kvs_test_key(uint32_t i) {
    kvs_key k;
    memset(&k, 0, sizeof k);
    uint32_t hi = i * 2654435761u + 1u;
    memcpy(k.bytes, &i, sizeof i);
    memcpy(k.bytes + 8, &hi, sizeof hi);
    return k;
}

static uint8_t next_byte(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return (uint8_t)(*x >> 24);
}

void kvs_test_fill(uint8_t *buf, uint64_t len, uint32_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < len; i++) buf[i] = next_byte(&x);
}

int kvs_test_bytes_match(const uint8_t *buf, uint64_t len, uint32_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < len; i++)
        if (buf[i] != next_byte(&x)) return 0;
    return 1;
}

static void *poly1305_mac;

static void poly1305_free(void) {
    kvs_nhpoly_mac_free(poly1305_mac);
}

void *kvs_test_poly1305(void) {
    if (!poly1305_mac && (poly1305_mac = kvs_nhpoly_mac_new())) atexit(poly1305_free);
    return poly1305_mac;
}
