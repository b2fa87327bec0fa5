/* keys.h - deterministic 128-bit chunk keys: key[i] = XXH3-128(key[i-1] || tokens of chunk i), with
 * key[-1] the model fingerprint. Same tokens and model give the same keys in any process or machine. */
#ifndef KVS_KEYS_H
#define KVS_KEYS_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "common/key.h" /* kvs_key_hex */

/* The most tensor-parallel ranks with keys of their own a handle answers for (tp_size above it is
 * refused at open). */
#define KVS_KEYS_MAX_RANKS 1024u

/* The fingerprint: model id, dtype, shape, block and chunk size, TP rank/size (or rank-agnostic for
 * MLA) and the salt, hashed. */
void kvs_keys_fingerprint(const kvs_model_desc *model, uint32_t chunk_tokens, kvs_key *out);

/* Key ranks of a model: 1 when its keys are rank-agnostic (MLA) or it has one rank, else tp_size. */
uint32_t kvs_keys_n_ranks(const kvs_model_desc *model);
/* The model's own rank among them: 0 with one key rank, else tp_rank. */
uint32_t kvs_keys_own_rank(const kvs_model_desc *model);
/* Every key rank's fingerprint into out[kvs_keys_n_ranks(model)]: out[r] is the model's with
 * tp_rank r, so out[own rank] is kvs_keys_fingerprint's. out[0] also names the group (model, layout,
 * chunk size and tp_size): workers compare it with the scheduler's. */
void kvs_keys_rank_fingerprints(const kvs_model_desc *model, uint32_t chunk_tokens, kvs_key *out);

/* Keys of the first n_chunks full chunks of tokens (n_tokens >= n_chunks * chunk_tokens). */
void kvs_keys_chain(const kvs_key *fingerprint, const int32_t *tokens, uint64_t n_chunks,
                    uint32_t chunk_tokens, kvs_key *out);
/* n_ranks chains over the same tokens, chunk-major: out[c * n_ranks + r] is rank r's key of chunk c,
 * chained from prev[r] (rank r's fingerprint, or its key of the chunk before the first). prev may
 * point into out, just before the first chunk written. */
void kvs_keys_chains(const kvs_key *prev, uint32_t n_ranks, const int32_t *tokens,
                     uint64_t n_chunks, uint32_t chunk_tokens, kvs_key *out);

/* Nonzero when a token of tokens[n], read as uint32, is >= limit (so a negative one is refused). */
uint32_t kvs_tokens_check(const int32_t *tokens, uint64_t n, uint32_t limit);
/* The same check while copying src[n] to dst (they must not overlap). */
uint32_t kvs_tokens_copy_check(int32_t *dst, const int32_t *src, uint64_t n, uint32_t limit);
/* The same without the CPU's wider vectors (SSE2 on x86-64): what the two above run where the CPU
 * has no AVX2; tests compare the two. */
uint32_t kvs_tokens_copy_check_portable(int32_t *dst, const int32_t *src, uint64_t n,
                                        uint32_t limit);
/* kvs_keys_chains, copying the n_chunks * chunk_tokens tokens to copy and checking them as
 * kvs_tokens_check does in the same pass (each chunk is hashed from tokens, then checked and copied
 * while it is still in cache): the keys are those of kvs_keys_chains, and the return value
 * kvs_tokens_check's. */
uint32_t kvs_keys_chains_copy(const kvs_key *prev, uint32_t n_ranks, const int32_t *tokens,
                              uint64_t n_chunks, uint32_t chunk_tokens, uint32_t limit,
                              int32_t *copy, kvs_key *out);

/* Per-request key inputs (request_key_input): each enters the key of the chunk holding from_token,
 * so (the chain) every later chunk's too; a request without any keys as before. */
#define KVS_KEY_INPUTS_MAX      64u
#define KVS_KEY_INPUT_BYTES_MAX (64u << 10) /* their total length */
typedef struct kvs_key_input {
    uint64_t from_token;
    uint64_t offset; /* of its bytes in the request's input data */
    uint64_t len;
} kvs_key_input;
/* What a chunk's inputs add to its key: a digest hashed after its tokens. */
typedef struct kvs_key_extra {
    uint64_t chunk;
    kvs_key digest;
} kvs_key_extra;

/* The extras of inputs[n] (bytes at data + offset), one per chunk holding any, by ascending chunk,
 * into out[n]; returns how many. Within a chunk the inputs hash by position, then in call order. */
uint32_t kvs_keys_input_extras(const kvs_key_input *inputs, uint32_t n, const uint8_t *data,
                               uint32_t chunk_tokens, kvs_key_extra *out);
/* kvs_keys_chains_copy (copy may be NULL: no copy, limit unused) over the chunks first_chunk ..
 * first_chunk + n_chunks (tokens points at first_chunk's), the extras[n_extras] (ascending chunks)
 * entering the chunks they name. */
uint32_t kvs_keys_chains_from(const kvs_key *prev, uint32_t n_ranks, const int32_t *tokens,
                              uint64_t first_chunk, uint64_t n_chunks, uint32_t chunk_tokens,
                              const kvs_key_extra *extras, uint32_t n_extras, uint32_t limit,
                              int32_t *copy, kvs_key *out);

#endif
