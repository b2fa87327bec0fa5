/* swarm_planted.c - see swarm_planted.h. */
#include "swarm_planted.h"

#include <check.h>
#include <stdlib.h>

kvs_swarm_synth kvs_test_planted_workload(int scattered, double overlap) {
    kvs_swarm_synth s;
    kvs_swarm_synth_params sp = kvs_swarm_synth_defaults();
    sp.scattered = scattered;
    sp.overlap_fraction = overlap;
    ck_assert_int_eq(kvs_swarm_synth_init(&s, &sp), 0);
    return s;
}

kvs_swarm_synth kvs_test_planted(int scattered) {
    return kvs_test_planted_workload(scattered, 0.10);
}

kvs_swarm_profile *kvs_test_planted_profile(kvs_swarm_synth *s, uint32_t steps) {
    kvs_swarm_profile *p = NULL;
    uint32_t n = s->params.n_entries;
    uint32_t *active = malloc(n * sizeof *active);
    ck_assert_ptr_nonnull(active);
    ck_assert_int_eq(kvs_swarm_profile_create(n, 0, &p), KVS_OK);
    for (uint32_t t = 0; t < steps; t++) {
        uint32_t k = kvs_swarm_synth_step(s, active, NULL);
        ck_assert_int_eq(kvs_swarm_profile_add_step(p, active, k), KVS_OK);
    }
    free(active);
    return p;
}

kvs_swarm_clusters *kvs_test_planted_clusters(kvs_swarm_synth *s,
                                              const kvs_swarm_cluster_params *prm) {
    kvs_swarm_profile *p = kvs_test_planted_profile(s, 300);
    kvs_swarm_graph *g = NULL;
    ck_assert_int_eq(
        kvs_swarm_graph_build(p, KVS_SWARM_METRIC_JACCARD, 1.0, KVS_TEST_PLANTED_MIN_COUNT, &g),
        KVS_OK);
    kvs_swarm_clusters *c = NULL;
    ck_assert_int_eq(kvs_swarm_clusters_create(s->params.n_entries, &c), KVS_OK);
    ck_assert_int_eq(kvs_swarm_cluster_build(g, prm, c), KVS_OK);
    kvs_swarm_graph_destroy(g);
    kvs_swarm_profile_destroy(p);
    return c;
}
