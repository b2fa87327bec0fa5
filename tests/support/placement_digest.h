/* placement_digest.h - a fingerprint of a placement rule over a fixed grid of calls, so a test can
 * pin where every copy lands (a change to a rule that placed data on disk would lose it). Pure. */
#ifndef KVS_TEST_PLACEMENT_DIGEST_H
#define KVS_TEST_PLACEMENT_DIGEST_H

#include <stdint.h>

/* A placement rule with the contract of kvs_backend_host.place. */
typedef void (*kvs_test_place_fn)(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                                  uint32_t replicas, uint32_t *paths_out);

/* FNV-1a 64 over every path written and every pointer value: for n_paths 1..8 and replicas 1..9, a
 * run of 12 calls from *pointer = start with n_units (call * 7 + n_paths + replicas) mod 10 (0..9,
 * zero included). */
uint64_t kvs_test_placement_digest(kvs_test_place_fn place, void *ctx, uint64_t start);

#endif
