/* rng.c - see rng.h. */
#include "rng.h"

uint64_t kvs_test_rng_next(uint64_t *state) {
    uint64_t x = (*state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint32_t kvs_test_rng_below(uint64_t *state, uint32_t n) {
    return (uint32_t)(kvs_test_rng_next(state) % n);
}
