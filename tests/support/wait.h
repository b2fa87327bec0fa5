/* wait.h - time for the suites: the monotonic clock and process CPU time in ms, deadlines scaled for
 * slow (sanitizer) runs, waiting on a condition with a deadline instead of sleeping a guess, and
 * collecting a child process.
 * Any thread; the condition is called on the waiting thread. */
#ifndef KVS_TEST_WAIT_H
#define KVS_TEST_WAIT_H

#include <sys/types.h>

/* CLOCK_MONOTONIC in milliseconds. */
double kvs_test_now_ms(void);
/* CPU time this process used so far (all threads, user and system), in milliseconds. */
double kvs_test_cpu_ms(void);
/* ms times CK_TIMEOUT_MULTIPLIER when that is set to a number above 1 (sanitizer runs), else ms: for
 * deadlines a slow run may need, never for a bound a test asserts. */
int kvs_test_scaled_ms(int ms);
/* Call cond(arg) until it returns non-zero or kvs_test_scaled_ms(deadline_ms) passed, pausing a few ms
 * between calls. Returns 1 when the condition held, 0 at the deadline. */
int kvs_test_wait_for(int (*cond)(void *arg), void *arg, int deadline_ms);
/* Pause ms milliseconds: for pacing (a trickle of bytes, requests spread over time), never to let
 * something happen. */
void kvs_test_pause_ms(int ms);
/* Wait for child pid: its exit status, 128 when a signal ended it, -1 when it cannot be waited for. */
int kvs_test_wait_child(pid_t pid);

#endif
