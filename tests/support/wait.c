/* wait.c - polling with a deadline and collecting children (contract in wait.h). */
#include "wait.h"

#include <errno.h>
#include <sys/wait.h>

#include "common/clock.h"

int kvs_test_wait_until(int (*done)(void *ctx), void *ctx, uint64_t timeout_ms) {
    uint64_t deadline = kvs_now_ns() + timeout_ms * 1000000ull;
    for (uint64_t pause_ns = 10000;; pause_ns = pause_ns < 2000000 ? pause_ns * 2 : pause_ns) {
        if (done(ctx)) return 0;
        uint64_t now = kvs_now_ns();
        if (now >= deadline) return -1;
        kvs_sleep_until_ns(now + pause_ns < deadline ? now + pause_ns : deadline);
    }
}

int kvs_test_wait_child(pid_t pid) {
    int status = 0;
    pid_t got;
    do {
        got = waitpid(pid, &status, 0);
    } while (got < 0 && errno == EINTR);
    if (got != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}
