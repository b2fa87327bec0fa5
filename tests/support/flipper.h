/* flipper.h - a thread that keeps rewriting a buffer (every stride-th byte, a new value each pass)
 * until stopped: the source of a copy changing under it, as a tier's slab reused under a load. */
#ifndef KVS_TEST_FLIPPER_H
#define KVS_TEST_FLIPPER_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvs_test_flipper kvs_test_flipper;

/* Starts rewriting bytes[0, n) (a Check assertion fails when the thread cannot start). */
kvs_test_flipper *kvs_test_flipper_start(uint8_t *bytes, size_t n, size_t stride);
/* Stops the thread and frees f. */
void kvs_test_flipper_stop(kvs_test_flipper *f);

#endif
