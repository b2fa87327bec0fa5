/* policy.c - the placement and retrieval policies the connector lends to tiers over several devices
 * (kvs_backend_host.place / .schedule): thin adapters over schedulers/swarm, so backends and
 * schedulers never include each other. */
#include "policy.h"

#include "schedulers/swarm/swarm.h"

static void policy_place(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                         uint32_t replicas, uint32_t *paths_out) {
    (void)ctx;
    kvs_swarm_place(pointer, n_paths, n_units, replicas, paths_out);
}

static void policy_schedule(void *ctx, uint32_t n_paths, uint64_t n, uint32_t max_copies,
                            const uint32_t *n_copies, const uint32_t *paths, uint32_t *chosen,
                            uint64_t *order) {
    (void)ctx;
    kvs_swarm_schedule(n_paths, n, max_copies, n_copies, paths, chosen, order);
}

void kvs_policy_install(kvs_backend_host *host) {
    host->place = policy_place;
    host->schedule = policy_schedule;
}
