/* swarm_planted.h - the planted co-activation workload (swarm_synth.h) made ready for the swarm
 * suites: the workload, its profile over a number of steps, and its clusters. Failures are Check
 * assertions; objects returned are the caller's (free with the matching _destroy / _free). */
#ifndef KVS_TEST_SWARM_PLANTED_H
#define KVS_TEST_SWARM_PLANTED_H

#include <stdint.h>

#include "schedulers/swarm/swarm.h"
#include "tools/workloads/swarm_synth.h"

/* Calibrated once on the fixed seed and frozen (docs/swarm.md): a pair needs 3 co-activations to be an
 * edge; tau 0.65 for the workload whose overlapping entries fire with two or three groups. */
#define KVS_TEST_PLANTED_MIN_COUNT 3
#define KVS_TEST_PLANTED_TAU       0.65

/* The planted workload of notes §6.1 (swarm_synth.h defaults: N 4096, G 192, Zipf 0.5, noise 0.5%). */
kvs_swarm_synth kvs_test_planted_workload(int scattered, double overlap);
/* The same with the default 10% overlap. */
kvs_swarm_synth kvs_test_planted(int scattered);
/* The co-activation profile of `steps` steps of the workload. */
kvs_swarm_profile *kvs_test_planted_profile(kvs_swarm_synth *s, uint32_t steps);
/* Algorithm 1 over the Jaccard graph (min count KVS_TEST_PLANTED_MIN_COUNT) of 300 steps. */
kvs_swarm_clusters *kvs_test_planted_clusters(kvs_swarm_synth *s,
                                              const kvs_swarm_cluster_params *prm);

#endif
