/* request_tokens.h - a scheduler request's tokens and their chunk keys: checked against the
 * vocabulary, copied into buffers recycled through the handle, hashed reusing the keys of a prefix
 * the request already holds. */
#ifndef KVS_REQUEST_TOKENS_H
#define KVS_REQUEST_TOKENS_H

#include <stdint.h>

#include "handle.h"

/* A request's keys are key_ranks per chunk, chunk-major (one chain per TP rank with keys of its own,
 * handle.h): the keys of chunk c, rank 0 first. Pins are laid out the same way. */
static inline kvs_key *kvs_chunk_keys(const kvs_handle *h, kvs_key *keys, uint64_t c) {
    return keys + c * h->key_ranks;
}

/* A token buffer no request holds: kept as the handle's spare when larger than it, else freed. */
void kvs_tokens_give(kvs_handle *h, int32_t *buf, uint64_t cap);
/* tokens[n] (not NULL when n > 0) each in [0, vocab_size): else KVS_EINVAL naming the hook, the
 * request and the first bad token's position. */
kvs_status kvs_request_check_tokens(kvs_handle *h, const char *hook, const char *id,
                                    const int32_t *tokens, uint64_t n);
/* Copy n (checked) tokens into r's buffer. Returns 0 when out of memory (r unchanged). */
int kvs_request_store_tokens(kvs_handle *h, kvs_request *r, const int32_t *tokens, uint64_t n);
/* Keys of the first n_chunks chunks of (checked) tokens, reusing r's keys (r may be NULL) where
 * r's tokens are the same prefix: a malloc'd array, NULL with n_chunks 0 or (*oom set) without
 * memory. */
kvs_key *kvs_request_keys_for(kvs_handle *h, const kvs_request *r, const int32_t *tokens,
                              uint64_t n_tokens, uint64_t n_chunks, int *oom);
/* r's tokens and keys become tokens[n] and theirs, checked, copied and hashed in one pass (a lookup
 * reads the caller's tokens once). Refused tokens (KVS_EINVAL, as kvs_request_check_tokens) or no
 * memory leave r as it was. */
kvs_status kvs_request_set_tokens(kvs_handle *h, kvs_request *r, const char *hook,
                                  const int32_t *tokens, uint64_t n);

/* Room (kept: a request's buffers only grow) for n_tokens tokens, n_keys chunks' keys and n_blocks
 * block ids in r, its contents unchanged; 0 when out of memory. */
int kvs_request_reserve(kvs_handle *h, kvs_request *r, uint64_t n_tokens, uint64_t n_keys,
                        uint64_t n_blocks);
/* r's held block table becomes block_ids[n] (copied). 0 when out of memory. */
int kvs_request_store_table(kvs_handle *h, kvs_request *r, const uint32_t *block_ids, uint64_t n);
/* Keys of chunks [key_base, n_chunks) of a request whose tokens are r's first tokens_from followed by
 * tail (r may be NULL with key_base and tokens_from 0); the chain continues from r's key of chunk
 * key_base - 1, which r holds. A malloc'd array of (n_chunks - key_base) * key_ranks keys, NULL with
 * none or (*oom set) without memory. */
kvs_key *kvs_request_keys_delta(kvs_handle *h, const kvs_request *r, uint64_t key_base,
                                uint64_t tokens_from, const int32_t *tail, uint64_t n_chunks,
                                int *oom);
/* request_key_input: append an input (len >= 1 bytes, checked by the caller) to r's, which the keys
 * of the chunk holding from_token and every later one then include. KVS_ESTATE once r's keys were
 * computed; KVS_EINVAL past KVS_KEY_INPUTS_MAX inputs or KVS_KEY_INPUT_BYTES_MAX bytes (keys.h). */
kvs_status kvs_request_add_key_input(kvs_handle *h, kvs_request *r, uint64_t from_token,
                                     const void *bytes, uint64_t len);
/* Free r's key inputs and held block table (the request is done). */
void kvs_request_free_held(kvs_request *r);

#endif
