/*
 * ssd_place.h - the ssd tier's own placement and read scheduling, used when the connector offers no
 * policy (kvs_backend_host.place / .schedule are NULL). Same contracts as those callbacks; pure
 * functions over plain arrays, so they are tested without I/O.
 */
#ifndef KVS_SSD_PLACE_H
#define KVS_SSD_PLACE_H

#include <stdint.h>

/* Global-pointer striping: copy r of unit u goes to path (*pointer + u + r) mod n_paths, so the
 * copies of one unit land on distinct paths while replicas <= n_paths, and consecutive objects
 * continue the stripe. *pointer advances by n_units. This is kvs_swarm_place_stride with
 * KVS_SWARM_STRIDE_UNITS (schedulers/swarm/swarm.h); n_paths, n_units and replicas are >= 1. */
void ssd_place_stripe(uint64_t *pointer, uint32_t n_paths, uint32_t n_units, uint32_t replicas,
                      uint32_t *paths_out);

/* Replica-aware bucket scheduling: reads with fewer copies are placed first, each on the least
 * loaded of its paths (ties: lowest path); the order then takes one read per path in turn, so one
 * batched submission keeps every device busy. Returns 0, or -1 when out of memory (outputs then
 * hold the first copy of each read and the identity order). */
int ssd_place_schedule(uint32_t n_paths, uint64_t n, uint32_t max_copies, const uint32_t *n_copies,
                       const uint32_t *paths, uint32_t *chosen, uint64_t *order);

#endif /* KVS_SSD_PLACE_H */
