/* wait.h - waiting in tests without sleeping as synchronisation: poll a condition until it holds or a
 * generous deadline passes, and collect a child process's exit. */
#ifndef KVS_TEST_WAIT_H
#define KVS_TEST_WAIT_H

#include <stdint.h>
#include <sys/types.h>

/* Call done(ctx) until it returns non-zero, pausing briefly between calls, for at most timeout_ms.
 * 0 once it held, -1 when the deadline passed first. */
int kvs_test_wait_until(int (*done)(void *ctx), void *ctx, uint64_t timeout_ms);
/* Wait for child pid: its exit status, 128 when a signal ended it, -1 when it cannot be waited for. */
int kvs_test_wait_child(pid_t pid);

#endif
