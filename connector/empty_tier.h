/* empty_tier.h - the tier that stands in for one that could not open (tiers.c): it holds nothing, so
 * every lookup misses and every put is refused (KVS_EIO, with a sentence that names the tier and why
 * it is empty). Thread-safe. */
#ifndef KVS_EMPTY_TIER_H
#define KVS_EMPTY_TIER_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"

/* Its ops table: type "empty". create takes init->tier_name and two options, `type` (the type the
 * tier was configured with) and `reason` (why it could not open), both copied. */
const kvs_backend_ops *kvs_empty_tier_backend(void);

/* Puts the tier refused since create. */
uint64_t kvs_empty_tier_refused_puts(void *state);

#endif
