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

/* Tokens hash as little-endian int32, so a key does not depend on the host's byte order; on a
 * little-endian host that is their bytes in memory. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define TOKENS_ARE_LE 1
#else
#define TOKENS_ARE_LE 0
#endif

/* key = XXH3-128(prev || the chunk's tokens as little-endian int32 [|| the digest of the request's key
 * inputs in this chunk]): a chunk without inputs keys as it always did. */
static void chunk_key(const kvs_key *prev, const int32_t *t, uint32_t chunk_tokens,
                      const kvs_key *extra, kvs_key *out) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, prev->bytes, sizeof prev->bytes);
    if (TOKENS_ARE_LE) {
        XXH3_128bits_update(&st, t, (size_t)chunk_tokens * sizeof *t);
    } else {
        uint8_t buf[4096];
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
    }
    if (extra) XXH3_128bits_update(&st, extra->bytes, sizeof extra->bytes);
    digest_to_key(XXH3_128bits_digest(&st), out);
}

/* The one token check: a token read as unsigned is outside [0, limit) when >= limit (a negative one
 * is >= 2^31), which is one signed compare after flipping the sign bits. Four tokens per compare
 * (vector extensions, SSE2 on x86-64), no branch per token. Copies to dst unless it is NULL (a
 * constant at each inlined call, so neither loop tests it). */
static inline __attribute__((always_inline)) uint32_t copy_check(int32_t *dst, const int32_t *src,
                                                                 uint64_t n, uint32_t limit) {
    typedef int32_t i32x4 __attribute__((vector_size(16)));
    const int32_t flip = INT32_MIN, lim_s = (int32_t)(limit ^ 0x80000000u);
    const i32x4 flips = {flip, flip, flip, flip}, lim = {lim_s, lim_s, lim_s, lim_s};
    i32x4 acc = {0};
    uint64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        i32x4 v;
        memcpy(&v, src + k, sizeof v);
        if (dst) memcpy(dst + k, &v, sizeof v);
        acc |= (v ^ flips) >= lim; /* unsigned v >= limit */
    }
    uint32_t bad = (uint32_t)(acc[0] | acc[1] | acc[2] | acc[3]);
    for (; k < n; k++) {
        if (dst) dst[k] = src[k];
        bad |= (uint32_t)src[k] >= limit;
    }
    return bad;
}

uint32_t kvs_tokens_copy_check_portable(int32_t *dst, const int32_t *src, uint64_t n,
                                        uint32_t limit) {
    return copy_check(dst, src, n, limit);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The same with AVX2 where the CPU has it (chosen per call, __builtin_cpu_supports): sixteen
 * tokens per step in two vectors of eight, and one unsigned max per vector instead of a flip, a
 * compare and an or, so a 1 KiB chunk costs about half the instructions; the largest token is
 * compared with limit once at the end (when a vector step ran: with none, largest is no token). */
#define KVS_TOKENS_AVX2 1
static inline __attribute__((always_inline, target("avx2"))) uint32_t copy_check_avx2(
    int32_t *dst, const int32_t *src, uint64_t n, uint32_t limit) {
    __m256i top = _mm256_setzero_si256(), top2 = _mm256_setzero_si256();
    uint64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(src + k));
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src + k + 8));
        if (dst) {
            _mm256_storeu_si256((__m256i *)(void *)(dst + k), a);
            _mm256_storeu_si256((__m256i *)(void *)(dst + k + 8), b);
        }
        top = _mm256_max_epu32(top, a);
        top2 = _mm256_max_epu32(top2, b);
    }
    top = _mm256_max_epu32(top, top2);
    uint32_t lanes[8], largest = 0;
    _mm256_storeu_si256((__m256i *)(void *)lanes, top);
    for (int i = 0; i < 8; i++) largest = lanes[i] > largest ? lanes[i] : largest;
    uint32_t bad = k > 0 && largest >= limit;
    for (; k < n; k++) {
        if (dst) dst[k] = src[k];
        bad |= (uint32_t)src[k] >= limit;
    }
    return bad;
}

static __attribute__((target("avx2"))) uint32_t check_avx2(const int32_t *src, uint64_t n,
                                                           uint32_t limit) {
    return copy_check_avx2(NULL, src, n, limit);
}

static __attribute__((target("avx2"))) uint32_t copy_avx2(int32_t *dst, const int32_t *src,
                                                          uint64_t n, uint32_t limit) {
    return copy_check_avx2(dst, src, n, limit);
}

static int have_avx2(void) {
    return __builtin_cpu_supports("avx2");
}
#else
#define KVS_TOKENS_AVX2 0
#endif

uint32_t kvs_tokens_check(const int32_t *tokens, uint64_t n, uint32_t limit) {
#if KVS_TOKENS_AVX2
    if (have_avx2()) return check_avx2(tokens, n, limit);
#endif
    return copy_check(NULL, tokens, n, limit);
}

uint32_t kvs_tokens_copy_check(int32_t *dst, const int32_t *src, uint64_t n, uint32_t limit) {
#if KVS_TOKENS_AVX2
    if (have_avx2()) return copy_avx2(dst, src, n, limit);
#endif
    return copy_check(dst, src, n, limit);
}

/* The chains of kvs_keys_chains over chunks first_chunk.. (tokens starts at first_chunk's), extras
 * entering the chunks they name; with copy, each chunk is then checked against limit and copied
 * while it is still in cache (the hashing's own reads run ahead in memory). Returns the check's
 * result. */
static inline __attribute__((always_inline)) uint32_t chains(
    const kvs_key *prev, uint32_t n_ranks, const int32_t *tokens, uint64_t first_chunk,
    uint64_t n_chunks, uint32_t chunk_tokens, const kvs_key_extra *x, uint32_t n_x, uint32_t limit,
    int32_t *copy, kvs_key *out) {
    uint32_t bad = 0;
    while (n_x && x->chunk < first_chunk) x++, n_x--;
    for (uint64_t c = 0; c < n_chunks; c++) {
        const int32_t *t = tokens + c * chunk_tokens;
        kvs_key *row = out + c * n_ranks;
        const kvs_key *extra = NULL;
        if (n_x && x->chunk == first_chunk + c) extra = &x->digest, x++, n_x--;
        for (uint32_t r = 0; r < n_ranks; r++) chunk_key(&prev[r], t, chunk_tokens, extra, &row[r]);
        if (copy) bad |= kvs_tokens_copy_check(copy + c * chunk_tokens, t, chunk_tokens, limit);
        prev = row;
    }
    return bad;
}

void kvs_keys_chain(const kvs_key *fingerprint, const int32_t *tokens, uint64_t n_chunks,
                    uint32_t chunk_tokens, kvs_key *out) {
    kvs_keys_chains(fingerprint, 1, tokens, n_chunks, chunk_tokens, out);
}

void kvs_keys_chains(const kvs_key *prev, uint32_t n_ranks, const int32_t *tokens,
                     uint64_t n_chunks, uint32_t chunk_tokens, kvs_key *out) {
    chains(prev, n_ranks, tokens, 0, n_chunks, chunk_tokens, NULL, 0, 0, NULL, out);
}

uint32_t kvs_keys_chains_copy(const kvs_key *prev, uint32_t n_ranks, const int32_t *tokens,
                              uint64_t n_chunks, uint32_t chunk_tokens, uint32_t limit,
                              int32_t *copy, kvs_key *out) {
    return chains(prev, n_ranks, tokens, 0, n_chunks, chunk_tokens, NULL, 0, limit, copy, out);
}

uint32_t kvs_keys_chains_from(const kvs_key *prev, uint32_t n_ranks, const int32_t *tokens,
                              uint64_t first_chunk, uint64_t n_chunks, uint32_t chunk_tokens,
                              const kvs_key_extra *extras, uint32_t n_extras, uint32_t limit,
                              int32_t *copy, kvs_key *out) {
    return chains(prev, n_ranks, tokens, first_chunk, n_chunks, chunk_tokens, extras, n_extras,
                  limit, copy, out);
}

/* Inputs in the order they hash: by position, then in call order (an insertion sort: at most
 * KVS_KEY_INPUTS_MAX of them). */
static void sort_inputs(const kvs_key_input *in, uint32_t n, uint32_t *order) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j = i;
        while (j > 0 && in[order[j - 1]].from_token > in[i].from_token) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
}

static void put_u64(XXH3_state_t *st, uint64_t v) {
    put_u32(st, (uint32_t)v);
    put_u32(st, (uint32_t)(v >> 32));
}

uint32_t kvs_keys_input_extras(const kvs_key_input *inputs, uint32_t n, const uint8_t *data,
                               uint32_t chunk_tokens, kvs_key_extra *out) {
    uint32_t order[KVS_KEY_INPUTS_MAX], n_out = 0;
    if (n > KVS_KEY_INPUTS_MAX) n = KVS_KEY_INPUTS_MAX; /* the caller bounds them */
    sort_inputs(inputs, n, order);
    for (uint32_t i = 0; i < n;) {
        uint64_t chunk = inputs[order[i]].from_token / chunk_tokens;
        XXH3_state_t st;
        XXH3_128bits_reset(&st);
        put_str(&st, "kvstrata-key-inputs-v1");
        for (; i < n && inputs[order[i]].from_token / chunk_tokens == chunk; i++) {
            const kvs_key_input *k = &inputs[order[i]];
            put_u64(&st, k->from_token); /* where in the chunk: an image one token later differs */
            put_u64(&st, k->len);
            XXH3_128bits_update(&st, data + k->offset, (size_t)k->len);
        }
        out[n_out].chunk = chunk;
        digest_to_key(XXH3_128bits_digest(&st), &out[n_out].digest);
        n_out++;
    }
    return n_out;
}
