/* pace.h - a modelled device that serves operations one after another, each taking a fixed cost plus
 * its bytes at a set bandwidth: what the paced tiers (dram read_bandwidth, ssd sim_bandwidth) use to
 * stand for slower devices in benchmarks and tests. */
#ifndef KVS_PACE_H
#define KVS_PACE_H

#include <pthread.h>
#include <stdint.h>

typedef struct kvs_pace {
    pthread_mutex_t lock;
    uint64_t busy_until_ns; /* CLOCK_MONOTONIC: when the operations admitted so far are done */
} kvs_pace;

void kvs_pace_init(kvs_pace *p);
void kvs_pace_destroy(kvs_pace *p);
/* What one operation of `bytes` costs: per_op_ns + bytes / bytes_per_s (0: no bandwidth limit). */
uint64_t kvs_pace_cost_ns(uint64_t bytes, uint64_t bytes_per_s, uint64_t per_op_ns);
/* Admit an operation issued at start_ns (CLOCK_MONOTONIC) that costs cost_ns behind the ones
 * before it, and sleep (no CPU) until the modelled device has done it. */
void kvs_pace_wait(kvs_pace *p, uint64_t start_ns, uint64_t cost_ns);

#endif
