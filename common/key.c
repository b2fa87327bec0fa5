/* key.c - key hashing and spelling (contract in key.h). */
#include "key.h"

#include <string.h>

uint64_t kvs_key_hash(const kvs_key *key) {
    uint64_t a, b;
    memcpy(&a, key->bytes, 8);
    memcpy(&b, key->bytes + 8, 8);
    uint64_t h = a ^ (b * 0x9E3779B97F4A7C15ull);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

void kvs_key_hex(const kvs_key *key, char out[33]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[key->bytes[i] >> 4];
        out[2 * i + 1] = digits[key->bytes[i] & 15];
    }
    out[32] = '\0';
}
