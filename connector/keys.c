#include "keys.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static void put_u32(XXH3_state_t *st, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    XXH3_128bits_update(st, b, sizeof b);
}

static void put_str(XXH3_state_t *st, const char *s) {
    size_t n = s ? strlen(s) : 0;
    put_u32(st, (uint32_t)n); /* length first so ("ab","c") and ("a","bc") differ */
    if (n) XXH3_128bits_update(st, s, n);
}

static void digest_to_key(XXH128_hash_t h, kvs_key *out) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out->bytes, c.digest, sizeof out->bytes);
}

void kvs_keys_fingerprint(const kvs_model_desc *model, uint32_t chunk_tokens, kvs_key *out) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    put_str(&st, "kvstrata-fingerprint-v1");
    put_str(&st, model->model_id);
    put_u32(&st, (uint32_t)model->dtype);
    put_u32(&st, model->n_layers);
    put_u32(&st, model->n_kv_heads);
    put_u32(&st, model->head_dim);
    put_u32(&st, model->block_tokens);
    put_u32(&st, chunk_tokens);
    put_u32(&st, model->is_mla ? 1u : 0u);
    /* MLA's latent is the same on every TP rank, so its keys are rank-agnostic. */
    put_u32(&st, model->is_mla ? 0u : model->tp_rank);
    put_u32(&st, model->is_mla ? 0u : model->tp_size);
    put_str(&st, model->salt);
    digest_to_key(XXH3_128bits_digest(&st), out);
}

uint32_t kvs_keys_n_ranks(const kvs_model_desc *model) {
    return model->is_mla || model->tp_size <= 1 ? 1u : model->tp_size;
}

uint32_t kvs_keys_own_rank(const kvs_model_desc *model) {
    return kvs_keys_n_ranks(model) == 1 ? 0u : model->tp_rank;
}

void kvs_keys_rank_fingerprints(const kvs_model_desc *model, uint32_t chunk_tokens, kvs_key *out) {
    kvs_model_desc rank = *model;
    uint32_t n = kvs_keys_n_ranks(model);
    for (uint32_t r = 0; r < n; r++) {
        rank.tp_rank = r; /* with one key rank: MLA ignores it, tp_size 1 has rank 0 only */
        kvs_keys_fingerprint(&rank, chunk_tokens, &out[r]);
    }
}

/* key = XXH3-128(prev || the chunk's tokens as little-endian int32). */
static void chunk_key(const kvs_key *prev, const int32_t *t, uint32_t chunk_tokens, kvs_key *out) {
    XXH3_state_t st;
    uint8_t buf[4096];
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, prev->bytes, sizeof prev->bytes);
    /* Tokens as little-endian int32 so the key does not depend on the host's byte order. */
    size_t fill = 0;
    for (uint32_t i = 0; i < chunk_tokens; i++) {
        uint32_t v = (uint32_t)t[i];
        buf[fill++] = (uint8_t)v;
        buf[fill++] = (uint8_t)(v >> 8);
        buf[fill++] = (uint8_t)(v >> 16);
        buf[fill++] = (uint8_t)(v >> 24);
        if (fill == sizeof buf) {
            XXH3_128bits_update(&st, buf, fill);
            fill = 0;
        }
    }
    if (fill) XXH3_128bits_update(&st, buf, fill);
    digest_to_key(XXH3_128bits_digest(&st), out);
}

void kvs_keys_chain(const kvs_key *fingerprint, const int32_t *tokens, uint64_t n_chunks,
                    uint32_t chunk_tokens, kvs_key *out) {
    kvs_keys_chains(fingerprint, 1, tokens, n_chunks, chunk_tokens, out);
}

void kvs_keys_chains(const kvs_key *prev, uint32_t n_ranks, const int32_t *tokens,
                     uint64_t n_chunks, uint32_t chunk_tokens, kvs_key *out) {
    for (uint64_t c = 0; c < n_chunks; c++) {
        const int32_t *t = tokens + c * chunk_tokens;
        kvs_key *row = out + c * n_ranks;
        for (uint32_t r = 0; r < n_ranks; r++) chunk_key(&prev[r], t, chunk_tokens, &row[r]);
        prev = row;
    }
}
