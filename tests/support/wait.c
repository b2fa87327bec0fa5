/* wait.c - see wait.h. */
#include "wait.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

#include "common/clock.h"

double kvs_test_now_ms(void) {
    return (double)kvs_now_ns() / 1e6;
}

double kvs_test_cpu_ms(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0.0;
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int kvs_test_scaled_ms(int ms) {
    const char *text = getenv("CK_TIMEOUT_MULTIPLIER");
    double multiplier = text ? strtod(text, NULL) : 1.0;
    return multiplier > 1.0 ? (int)(ms * multiplier) : ms;
}

void kvs_test_pause_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int kvs_test_wait_for(int (*cond)(void *arg), void *arg, int deadline_ms) {
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(deadline_ms);
    for (;;) {
        if (cond(arg)) return 1;
        if (kvs_test_now_ms() >= until) return 0;
        kvs_test_pause_ms(5);
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
