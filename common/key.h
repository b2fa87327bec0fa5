/* key.h - what every layer does with a kvs_key besides storing it: the 64-bit hash an index puts it
 * in a bucket by, and its hex spelling for messages. Pure functions; thread-safe. */
#ifndef KVS_KEY_H
#define KVS_KEY_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"

/* A well-mixed 64-bit hash of key (keys are hashes already; this mixes both halves, so keys that
 * share one half still spread). Stable: the same key gives the same value in every process. */
uint64_t kvs_key_hash(const kvs_key *key);

/* key as 32 lower-case hex digits and a NUL. */
void kvs_key_hex(const kvs_key *key, char out[33]);

#endif /* KVS_KEY_H */
