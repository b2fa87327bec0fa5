/* keys.h - deterministic 128-bit chunk keys: key[i] = XXH3-128(key[i-1] || tokens of chunk i), with
 * key[-1] the model fingerprint. Same tokens and model give the same keys in any process or machine. */
#ifndef KVS_KEYS_H
#define KVS_KEYS_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "common/key.h" /* kvs_key_hex */

/* The fingerprint: model id, dtype, shape, block and chunk size, TP rank/size (or rank-agnostic for
 * MLA) and the salt, hashed. */
void kvs_keys_fingerprint(const kvs_model_desc *model, uint32_t chunk_tokens, kvs_key *out);

/* Keys of the first n_chunks full chunks of tokens (n_tokens >= n_chunks * chunk_tokens). */
void kvs_keys_chain(const kvs_key *fingerprint, const int32_t *tokens, uint64_t n_chunks,
                    uint32_t chunk_tokens, kvs_key *out);

#endif
