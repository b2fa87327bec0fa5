/* clock.h - the one monotonic clock. Code that times leases, pins or deadlines reads a kvs_clock it was
 * given; production passes NULL (the system's CLOCK_MONOTONIC), tests pass a manual clock and advance
 * it instead of sleeping. Reading and advancing are thread-safe. */
#ifndef KVS_CLOCK_H
#define KVS_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

/* A manual clock: reads return its value, which only kvs_clock_advance moves. */
typedef struct kvs_clock {
    _Atomic uint64_t manual_ns;
} kvs_clock;

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t kvs_now_ns(void);
/* Sleep (no CPU) until CLOCK_MONOTONIC reaches ns; signals do not cut it short. */
void kvs_sleep_until_ns(uint64_t ns);
/* The instant timeout_ns from now on `which` (CLOCK_MONOTONIC, CLOCK_REALTIME), for
 * pthread_cond_timedwait on a condition variable of that clock. */
struct timespec kvs_timespec_after(clockid_t which, uint64_t timeout_ns);
/* The same for timeout_ms milliseconds (any uint64_t: no overflow of a nanosecond count). */
struct timespec kvs_timespec_after_ms(clockid_t which, uint64_t timeout_ms);
/* Nanoseconds on `clock`: CLOCK_MONOTONIC when clock is NULL, else the manual clock's value. */
uint64_t kvs_clock_now_ns(const kvs_clock *clock);
/* Start a manual clock at start_ns (tests usually start at the real monotonic time). */
void kvs_clock_init_manual(kvs_clock *clock, uint64_t start_ns);
/* Move a manual clock on by ns. */
void kvs_clock_advance(kvs_clock *clock, uint64_t ns);

#endif
