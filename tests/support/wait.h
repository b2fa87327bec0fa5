/* wait.h - waiting in a test for something another thread or process does: poll a condition until it
 * holds or a generous deadline passes (never an upper bound the test asserts on). */
#ifndef KVS_TEST_WAIT_H
#define KVS_TEST_WAIT_H

#include <stdint.h>

/* Call done(ctx) every millisecond or so until it returns non-zero (then 1) or timeout_ms of the
 * monotonic clock have passed (then 0; done is called once more at the deadline). */
int kvs_test_wait_until(int (*done)(void *ctx), void *ctx, uint64_t timeout_ms);

#endif
