#include "clock.h"

#include <errno.h>
#include <time.h>

uint64_t kvs_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kvs_sleep_until_ns(uint64_t ns) {
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

uint64_t kvs_clock_now_ns(const kvs_clock *clock) {
    if (!clock) return kvs_now_ns();
    return atomic_load_explicit(&clock->manual_ns, memory_order_acquire);
}

void kvs_clock_init_manual(kvs_clock *clock, uint64_t start_ns) {
    atomic_init(&clock->manual_ns, start_ns);
}

void kvs_clock_advance(kvs_clock *clock, uint64_t ns) {
    atomic_fetch_add_explicit(&clock->manual_ns, ns, memory_order_acq_rel);
}

static struct timespec after(clockid_t which, uint64_t sec, uint64_t nsec /* < 10^9 */) {
    struct timespec at;
    clock_gettime(which, &at);
    uint64_t ns = (uint64_t)at.tv_nsec + nsec;
    at.tv_sec += (time_t)(sec + ns / 1000000000ull);
    at.tv_nsec = (long)(ns % 1000000000ull);
    return at;
}

struct timespec kvs_timespec_after(clockid_t which, uint64_t timeout_ns) {
    return after(which, timeout_ns / 1000000000ull, timeout_ns % 1000000000ull);
}

struct timespec kvs_timespec_after_ms(clockid_t which, uint64_t timeout_ms) {
    return after(which, timeout_ms / 1000, (timeout_ms % 1000) * 1000000ull);
}
