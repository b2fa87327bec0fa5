/* swarm_synth.h - the planted co-activation workload of notes §6.1, a synthetic workload the swarm
 * suites and bench/bench_ssd_sim.c both drive; not part of the library (tools/workloads is built as
 * its own static library, kvs_workloads, which those programs link).
 *
 * N entries; G planted groups of 2..8 members, as contiguous runs (attention locality) or scattered;
 * a fraction of the grouped entries also belongs to one or two more groups (which forces replication);
 * Zipf group popularity over a random rank order. Each step activates k distinct groups by popularity,
 * every member of an active group fires with probability member_p, and noise_fraction * N random
 * entries fire on top. Deterministic in the seed. The caller owns the struct; not thread-safe. */
#ifndef KVS_WORKLOADS_SWARM_SYNTH_H
#define KVS_WORKLOADS_SWARM_SYNTH_H

#include <stdint.h>

#include "schedulers/swarm/swarm_cluster.h"

typedef struct kvs_swarm_synth_params {
    uint32_t n_entries; /* N */
    uint32_t n_groups;  /* G */
    uint32_t min_group; /* members per group, before overlap */
    uint32_t max_group;
    int scattered; /* 0: each group is a run of consecutive entries; 1: members anywhere */
    double overlap_fraction;  /* of the grouped entries, each also joins 1 or 2 more groups */
    double zipf_s;            /* popularity of rank r is 1 / (r + 1)^zipf_s */
    uint32_t groups_per_step; /* k */
    double member_p;          /* a member of an active group fires with this probability */
    double noise_fraction;    /* random entries per step, as a fraction of N */
    uint64_t seed;
} kvs_swarm_synth_params;

typedef struct kvs_swarm_synth {
    kvs_swarm_synth_params params;
    uint32_t *group_start;  /* [G + 1] CSR into group_member */
    uint32_t *group_member; /* members of every group, each group sorted ascending */
    double *cumulative;     /* [G] cumulative popularity */
    uint64_t *stamp;        /* [N] step an entry last fired in */
    uint8_t *step_group;    /* [G] scratch */
    uint64_t step;
    uint64_t rng;
} kvs_swarm_synth;

/* N 4096, G 192, groups of 2..8 in runs, 10% overlap, Zipf 0.5, 6 groups per step, p 0.9, noise 0.5%. */
kvs_swarm_synth_params kvs_swarm_synth_defaults(void);

/* Free what init allocated and zero the struct; NULL is a no-op. */
void kvs_swarm_synth_free(kvs_swarm_synth *s);

/* Build the groups. Returns 0, or -1 on bad parameters or no memory (the struct is then empty). */
int kvs_swarm_synth_init(kvs_swarm_synth *s, const kvs_swarm_synth_params *p);

/* Members of group g, its overlap entries included. */
uint32_t kvs_swarm_synth_group_size(const kvs_swarm_synth *s, uint32_t g);

/* One step: active[0..returned) gets the distinct entries that fired (active must hold N ids);
 * groups (may be NULL; k entries) gets the groups drawn. */
uint32_t kvs_swarm_synth_step(kvs_swarm_synth *s, uint32_t *active, uint32_t *groups);

/* Pairwise precision, recall and F1 of clusters against the planted groups: a pair is predicted when
 * some cluster holds both entries and true when some group does. Returns -1 on no memory. */
int kvs_swarm_synth_pair_f1(const kvs_swarm_synth *s, const kvs_swarm_clusters *c,
                            double *precision, double *recall, double *f1);

#endif
