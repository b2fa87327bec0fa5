/* objects.h - the keys and object bytes the backend suites store: a key per number and a byte pattern
 * per seed, so a test can tell whose bytes came back (pure functions, thread-safe); and the
 * Poly1305 of keyed tags. */
#ifndef KVS_TEST_OBJECTS_H
#define KVS_TEST_OBJECTS_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"

/* Key number i: both halves differ from key to key, so an index sees realistic hashes. */
kvs_key kvs_test_key(uint32_t i);
/* The bytes of object `seed` (an xorshift stream: any torn, shifted or foreign unit mismatches). */
void kvs_test_fill(uint8_t *buf, uint64_t len, uint32_t seed);
/* 1 when buf[0..len) holds the bytes kvs_test_fill writes for seed, else 0. */
int kvs_test_bytes_match(const uint8_t *buf, uint64_t len, uint32_t seed);
/* libcrypto's Poly1305 for keyed layer tags (common/nhpoly.h), fetched at the first call and freed
 * at exit. Not thread-safe at the first call. */
void *kvs_test_poly1305(void);

#endif
