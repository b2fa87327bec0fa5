/* pattern.h - deterministic byte patterns for payloads: the same seed gives the same bytes in every
 * process (a forked peer checks what the test sent). Pure. */
#ifndef KVS_TEST_PATTERN_H
#define KVS_TEST_PATTERN_H

#include <stddef.h>
#include <stdint.h>

/* Fill buf[0..len) with the xorshift pattern of seed. */
void kvs_test_fill(uint8_t *buf, size_t len, uint32_t seed);
/* 1 when buf[0..len) holds the pattern of seed (0 also when no memory for the comparison). */
int kvs_test_matches(const uint8_t *buf, size_t len, uint32_t seed);

#endif
