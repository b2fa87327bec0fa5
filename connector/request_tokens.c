/* request_tokens.c - a scheduler request's tokens and their chunk keys (request_tokens.h). */
#include "request_tokens.h"

#include <stdlib.h>
#include <string.h>

#include "keys.h"
#include "last_error.h"

/* A token buffer of at least n that is not a request's: the handle's spare when large enough, else a
 * new one (NULL when out of memory). */
static int32_t *take_tokens(kvs_handle *h, uint64_t n, uint64_t *cap) {
    if (h->spare_tokens && h->spare_cap >= n) {
        int32_t *buf = h->spare_tokens;
        *cap = h->spare_cap;
        h->spare_tokens = NULL, h->spare_cap = 0;
        return buf;
    }
    *cap = n ? n : 1;
    return malloc(*cap * sizeof(int32_t));
}

/* A token buffer no request holds: kept as the spare when larger than it, else freed. */
void kvs_tokens_give(kvs_handle *h, int32_t *buf, uint64_t cap) {
    if (buf && cap > h->spare_cap) {
        free(h->spare_tokens);
        h->spare_tokens = buf, h->spare_cap = cap;
    } else {
        free(buf);
    }
}

/* Copy n tokens into r's buffer: its own when large enough, else the handle's spare, else a new
 * one. Returns 0 when out of memory (r unchanged). */
int kvs_request_store_tokens(kvs_handle *h, kvs_request *r, const int32_t *tokens, uint64_t n) {
    if (r->tokens_cap < n) {
        uint64_t cap;
        int32_t *buf = take_tokens(h, n, &cap);
        if (!buf) return 0;
        kvs_tokens_give(h, r->tokens, r->tokens_cap);
        r->tokens = buf;
        r->tokens_cap = cap;
    }
    if (n) memcpy(r->tokens, tokens, n * sizeof *tokens);
    r->n_tokens = n;
    return 1;
}

/* Tokens are below the vocabulary size (any int32 >= 0 without one). */
static uint32_t token_limit(const kvs_handle *h) {
    return h->model.vocab_size ? h->model.vocab_size : (uint32_t)INT32_MAX + 1u;
}

/* The refusal of tokens kvs_tokens_check found bad: names the first bad one. */
static kvs_status bad_token(kvs_handle *h, const char *hook, const char *id,
                            const int32_t *tokens) {
    uint32_t limit = token_limit(h);
    uint64_t i = 0;
    while ((uint32_t)tokens[i] < limit) i++;
    return kvs_set_error(h, KVS_EINVAL,
                         "%s: request '%s': token %d at position %llu is outside [0, %u)", hook, id,
                         tokens[i], (unsigned long long)i,
                         h->model.vocab_size ? h->model.vocab_size : (uint32_t)INT32_MAX);
}

kvs_status kvs_request_check_tokens(kvs_handle *h, const char *hook, const char *id,
                                    const int32_t *tokens, uint64_t n) {
    if (n && !tokens)
        return kvs_set_error(h, KVS_EINVAL, "%s: request '%s': tokens is NULL", hook, id);
    if (n && kvs_tokens_check(tokens, n, token_limit(h))) return bad_token(h, hook, id, tokens);
    return KVS_OK;
}

/* Keys of the first n_chunks chunks of tokens that r already holds, copied into keys: r's tokens
 * are the same prefix up to there. Returns how many chunks; *prev gets the keys the next chunk
 * chains from (its own, or the fingerprints with none). */
static uint64_t reuse_keys(const kvs_handle *h, const kvs_request *r, const int32_t *tokens,
                           uint64_t n_tokens, uint64_t n_chunks, kvs_key *keys,
                           const kvs_key **prev) {
    uint64_t reuse = 0;
    *prev = h->rank_fingerprints;
    if (!r || !r->n_keys || !n_chunks) return 0; /* no chunks: tokens may be NULL */
    uint64_t same = r->n_tokens < n_tokens ? r->n_tokens : n_tokens;
    if (memcmp(r->tokens, tokens, same * sizeof *tokens) != 0) return 0;
    reuse = same / h->chunk_tokens;
    if (reuse > r->n_keys) reuse = r->n_keys;
    if (reuse > n_chunks) reuse = n_chunks;
    if (reuse) {
        memcpy(keys, r->keys, reuse * h->key_ranks * sizeof *keys);
        *prev = kvs_chunk_keys(h, keys, reuse - 1);
    }
    return reuse;
}

/* Keys of the first n_chunks chunks of tokens, reusing r's keys where r's tokens are the same prefix.
 * Returns a malloc'd array (NULL with n_chunks 0 is fine). */
kvs_key *kvs_request_keys_for(kvs_handle *h, const kvs_request *r, const int32_t *tokens,
                              uint64_t n_tokens, uint64_t n_chunks, int *oom) {
    *oom = 0;
    if (n_chunks == 0) return NULL;
    uint32_t ranks = h->key_ranks;
    kvs_key *keys = malloc(n_chunks * ranks * sizeof *keys);
    if (!keys) {
        *oom = 1;
        return NULL;
    }
    const kvs_key *prev;
    uint64_t reuse = reuse_keys(h, r, tokens, n_tokens, n_chunks, keys, &prev);
    kvs_keys_chains_from(prev, ranks, tokens + reuse * h->chunk_tokens, reuse, n_chunks - reuse,
                         h->chunk_tokens, r ? r->extras : NULL, r ? r->n_extras : 0, 0, NULL,
                         kvs_chunk_keys(h, keys, reuse));
    return keys;
}

/* r's tokens and keys become tokens[n] and theirs, checked, copied and hashed in one pass (a lookup
 * reads the caller's tokens once). Refused tokens or no memory leave r as it was. */
kvs_status kvs_request_set_tokens(kvs_handle *h, kvs_request *r, const char *hook,
                                  const int32_t *tokens, uint64_t n) {
    if (n && !tokens)
        return kvs_request_check_tokens(h, hook, r->id, tokens, n); /* says it is NULL */
    uint64_t C = h->chunk_tokens, n_chunks = n / C;
    uint32_t ranks = h->key_ranks;
    /* r's own buffer is written only while it holds no tokens, so a refusal changes nothing. */
    int own = r->n_tokens == 0 && r->tokens && r->tokens_cap >= n;
    uint64_t cap = r->tokens_cap;
    int32_t *buf = own ? r->tokens : take_tokens(h, n, &cap);
    kvs_key *keys = n_chunks ? malloc(n_chunks * ranks * sizeof *keys) : NULL;
    if (!buf || (n_chunks && !keys)) {
        free(keys);
        if (!own) kvs_tokens_give(h, buf, cap);
        return kvs_set_error(h, KVS_ENOMEM, "%s: request '%s': out of memory for %llu tokens", hook,
                             r->id, (unsigned long long)n);
    }
    /* the reused prefix equals r's tokens, which were checked when they were stored */
    const kvs_key *prev;
    uint64_t reuse = reuse_keys(h, r, tokens, n, n_chunks, keys, &prev);
    if (reuse) memcpy(buf, tokens, reuse * C * sizeof *tokens);
    uint32_t limit = token_limit(h);
    uint32_t bad = 0;
    if (n) {                  /* no tokens: tokens may be NULL */
        if (n_chunks > reuse) /* keys is NULL without whole chunks */
            bad = kvs_keys_chains_from(prev, ranks, tokens + reuse * C, reuse, n_chunks - reuse,
                                       h->chunk_tokens, r->extras, r->n_extras, limit,
                                       buf + reuse * C, kvs_chunk_keys(h, keys, reuse));
        bad |= kvs_tokens_copy_check(buf + n_chunks * C, tokens + n_chunks * C, n - n_chunks * C,
                                     limit);
    }
    if (bad) {
        free(keys);
        if (!own) kvs_tokens_give(h, buf, cap);
        return bad_token(h, hook, r->id, tokens);
    }
    if (!own) {
        kvs_tokens_give(h, r->tokens, r->tokens_cap);
        r->tokens = buf, r->tokens_cap = cap;
    }
    r->n_tokens = n;
    free(r->keys);
    r->keys = keys;
    r->n_keys = r->keys_cap = n_chunks;
    r->keys_fixed = 1;
    return KVS_OK;
}

/* Room for n elements of size in *buf (capacity *cap): grown to at least twice its size, so appending
 * one step at a time copies each element O(1) times. 0 when out of memory (*buf unchanged). */
static int reserve(void **buf, uint64_t *cap, uint64_t n, size_t size) {
    if (n <= *cap && *buf) return 1;
    uint64_t grown = *cap * 2 > n ? *cap * 2 : n;
    if (grown < 16) grown = 16;
    void *p = realloc(*buf, (size_t)(grown * size));
    if (!p) return 0;
    *buf = p;
    *cap = grown;
    return 1;
}

int kvs_request_reserve(kvs_handle *h, kvs_request *r, uint64_t n_tokens, uint64_t n_keys,
                        uint64_t n_blocks) {
    void *t = r->tokens, *k = r->keys, *b = r->table;
    uint64_t kc = r->keys_cap * h->key_ranks;
    int ok = reserve(&t, &r->tokens_cap, n_tokens, sizeof *r->tokens);
    r->tokens = t;
    ok = ok && reserve(&k, &kc, n_keys * h->key_ranks, sizeof *r->keys);
    r->keys = k;
    r->keys_cap = kc / h->key_ranks;
    ok = ok && reserve(&b, &r->table_cap, n_blocks, sizeof *r->table);
    r->table = b;
    return ok;
}

int kvs_request_store_table(kvs_handle *h, kvs_request *r, const uint32_t *block_ids, uint64_t n) {
    if (!kvs_request_reserve(h, r, 0, 0, n)) return 0;
    if (n) memcpy(r->table, block_ids, n * sizeof *block_ids);
    r->n_table = n;
    return 1;
}

/* The tokens of chunk c of a request whose tokens are held[0..from) followed by tail: in place when
 * the chunk lies in one of them, else copied into scratch (chunk_tokens of them). */
static const int32_t *chunk_at(const int32_t *held, uint64_t from, const int32_t *tail, uint64_t c,
                               uint32_t chunk_tokens, int32_t *scratch) {
    uint64_t lo = c * chunk_tokens, hi = lo + chunk_tokens;
    if (hi <= from) return held + lo;
    if (lo >= from) return tail + (lo - from);
    memcpy(scratch, held + lo, (size_t)(from - lo) * sizeof *held);
    memcpy(scratch + (from - lo), tail, (size_t)(hi - from) * sizeof *tail);
    return scratch;
}

kvs_key *kvs_request_keys_delta(kvs_handle *h, const kvs_request *r, uint64_t key_base,
                                uint64_t tokens_from, const int32_t *tail, uint64_t n_chunks,
                                int *oom) {
    *oom = 0;
    if (n_chunks <= key_base) return NULL;
    uint32_t ranks = h->key_ranks, C = h->chunk_tokens;
    kvs_key *keys = malloc((n_chunks - key_base) * ranks * sizeof *keys);
    int32_t *scratch = malloc((size_t)C * sizeof *scratch);
    if (!keys || !scratch) {
        free(keys);
        free(scratch);
        *oom = 1;
        return NULL;
    }
    const kvs_key *prev =
        key_base ? kvs_chunk_keys(h, r->keys, key_base - 1) : h->rank_fingerprints;
    const int32_t *held = r ? r->tokens : NULL;
    const kvs_key_extra *x = r ? r->extras : NULL;
    uint32_t n_x = r ? r->n_extras : 0;
    for (uint64_t c = key_base; c < n_chunks;) {
        /* a run of chunks lying wholly after `from` hashes in one call */
        uint64_t run = 1;
        if (c * C >= tokens_from) run = n_chunks - c;
        const int32_t *t = chunk_at(held, tokens_from, tail, c, C, scratch);
        kvs_key *out = kvs_chunk_keys(h, keys, c - key_base);
        kvs_keys_chains_from(prev, ranks, t, c, run, C, x, n_x, 0, NULL, out);
        c += run;
        prev = kvs_chunk_keys(h, keys, c - 1 - key_base);
    }
    free(scratch);
    return keys;
}

kvs_status kvs_request_add_key_input(kvs_handle *h, kvs_request *r, uint64_t from_token,
                                     const void *bytes, uint64_t len) {
    if (r->keys_fixed)
        return kvs_set_error(h, KVS_ESTATE,
                             "request_key_input: request '%s' already has its keys (a lookup or "
                             "build_meta computed them): inputs go in before its first lookup",
                             r->id);
    if (r->n_inputs == KVS_KEY_INPUTS_MAX || len > KVS_KEY_INPUT_BYTES_MAX - r->input_bytes)
        return kvs_set_error(h, KVS_EINVAL,
                             "request_key_input: request '%s': %u inputs of %llu bytes so far; "
                             "at most %u inputs of %u bytes in all",
                             r->id, r->n_inputs, (unsigned long long)r->input_bytes,
                             KVS_KEY_INPUTS_MAX, KVS_KEY_INPUT_BYTES_MAX);
    if (!r->inputs) {
        r->inputs = malloc(KVS_KEY_INPUTS_MAX * sizeof *r->inputs);
        r->extras = malloc(KVS_KEY_INPUTS_MAX * sizeof *r->extras);
    }
    uint8_t *data = realloc(r->input_data, (size_t)(r->input_bytes + len));
    if (!r->inputs || !r->extras || !data)
        return kvs_set_error(h, KVS_ENOMEM, "request_key_input: request '%s': out of memory",
                             r->id);
    r->input_data = data;
    memcpy(data + r->input_bytes, bytes, (size_t)len);
    r->inputs[r->n_inputs++] = (kvs_key_input){from_token, r->input_bytes, len};
    r->input_bytes += len;
    r->n_extras =
        kvs_keys_input_extras(r->inputs, r->n_inputs, r->input_data, h->chunk_tokens, r->extras);
    return KVS_OK;
}

void kvs_request_free_held(kvs_request *r) {
    free(r->table);
    r->table = NULL;
    r->n_table = r->table_cap = 0;
    free(r->inputs);
    free(r->extras);
    free(r->input_data);
    r->inputs = NULL;
    r->extras = NULL;
    r->input_data = NULL;
    r->n_inputs = r->n_extras = 0;
    r->input_bytes = 0;
}
