/* wait.c - polling waits for tests (wait.h). */
#include "wait.h"

#include <time.h>

#include "common/clock.h"

int kvs_test_wait_until(int (*done)(void *ctx), void *ctx, uint64_t timeout_ms) {
    uint64_t deadline = kvs_now_ns() + timeout_ms * 1000000ull;
    for (;;) {
        if (done(ctx)) return 1;
        if (kvs_now_ns() >= deadline) return done(ctx) != 0;
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL); /* the poll interval; the condition decides, not the time */
    }
}
