/* rng.h - splitmix64, the suites' deterministic random numbers: every instance is the same on every
 * run. The caller owns the state word. */
#ifndef KVS_TEST_RNG_H
#define KVS_TEST_RNG_H

#include <stdint.h>

/* The next value of the stream whose state is *state. */
uint64_t kvs_test_rng_next(uint64_t *state);
/* A value in [0, n) (n >= 1). */
uint32_t kvs_test_rng_below(uint64_t *state, uint32_t n);

#endif
