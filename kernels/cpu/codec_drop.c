/* codec_drop.c - token dropping (codec.h, KVS_CODEC_DROP): a layer keeps some of its tokens' K and V
 * rows exactly, as stored, and a mask of which; decoding copies them to their places in the pages
 * and zeroes the rest, which an engine that declared KVS_PLAN_CAP_MASK leaves out of attention. */
#include "kernels/cpu/codec_drop.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dtype.h"

kvs_status kvs_codec_check_layer(const kvs_codec *c, uint32_t n_tokens, const void *encoded) {
    if (c->kind != KVS_CODEC_DROP) return KVS_OK;
    const uint8_t *mask = encoded;
    uint64_t bytes = kvs_codec_mask_bytes(n_tokens), ones = 0;
    for (uint64_t b = 0; b < bytes; b++) {
        uint32_t bits = mask[b];
        uint64_t first = b * 8u; /* bits for tokens past the last are 0 */
        if (first >= n_tokens ? bits != 0 : first + 8u > n_tokens && bits >> (n_tokens - first))
            return KVS_ECORRUPT;
        ones += (uint64_t)__builtin_popcount(bits);
    }
    uint32_t keep = c->k_group < n_tokens ? c->k_group : n_tokens;
    return ones == keep ? KVS_OK : KVS_ECORRUPT;
}

typedef struct scored {
    double norm;
    uint32_t t;
} scored;

/* Largest norm first, then the earlier token. */
static int by_norm(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->norm != y->norm) return x->norm > y->norm ? -1 : 1;
    return x->t < y->t ? -1 : x->t > y->t;
}

void kvs_codec_drop_select(const kvs_kv_shape *shape, uint32_t dtype, uint32_t n,
                           const void *k_rows, uint32_t keep, uint8_t *mask) {
    memset(mask, 0, kvs_codec_mask_bytes(n));
    if (keep >= n) {
        for (uint32_t t = 0; t < n; t++) mask[t / 8u] |= (uint8_t)(1u << (t % 8u));
        return;
    }
    uint32_t elem = kvs_dtype_bytes(dtype);
    uint64_t row = elem ? (uint64_t)shape->n_heads * shape->head_bytes / elem : 0;
    scored *s = malloc((n ? n : 1) * sizeof *s);
    if (!s) { /* no scratch to rank them: the first `keep` tokens (a valid mask all the same) */
        for (uint32_t t = 0; t < keep; t++) mask[t / 8u] |= (uint8_t)(1u << (t % 8u));
        return;
    }
    for (uint32_t t = 0; t < n; t++) {
        double sum = 0;
        for (uint64_t i = 0; i < row; i++) {
            double x = kvs_dtype_load(dtype, k_rows, (uint64_t)t * row + i);
            sum += x * x;
        }
        /* a non-finite key ranks last: it would spoil attention wherever it is kept */
        s[t] = (scored){.norm = sum - sum == 0.0 ? sum : -1.0, .t = t};
    }
    qsort(s, n, sizeof *s, by_norm);
    for (uint32_t i = 0; i < keep; i++) mask[s[i].t / 8u] |= (uint8_t)(1u << (s[i].t % 8u));
    free(s);
}

kvs_status kvs_codec_drop_encode(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                 uint32_t n_tokens, const void *k_rows, const void *v_rows,
                                 const uint8_t *kept_mask, void *out) {
    kvs_codec_geom g = kvs_codec_geometry(c, shape, kvs_dtype_bytes(dtype), n_tokens);
    uint8_t *mask = out;
    uint64_t row = (uint64_t)g.heads * g.row_codes; /* one token's rows of every head */
    /* what the other codecs refuse, DROP refuses too: a value that is not finite */
    uint64_t elems = (uint64_t)n_tokens * row / (g.elem ? g.elem : 1);
    for (uint64_t i = 0; i < elems; i++) {
        float k = kvs_dtype_load(dtype, k_rows, i);
        float v = shape->has_v ? kvs_dtype_load(dtype, v_rows, i) : 0.0f;
        if (!(k - k == 0.0f && v - v == 0.0f)) return KVS_EINVAL;
    }
    if (!kept_mask)
        kvs_codec_drop_select(shape, dtype, n_tokens, k_rows, g.kept, mask);
    else if (kept_mask != mask) /* the caller may have chosen it in place */
        memcpy(mask, kept_mask, g.k_meta);
    if (kvs_codec_check_layer(c, n_tokens, mask) != KVS_OK) return KVS_EINVAL;
    uint8_t *k = mask + g.k_meta, *v = k + g.codes;
    for (uint32_t t = 0, i = 0; t < n_tokens; t++) {
        if (!kvs_codec_kept(mask, t)) continue;
        memcpy(k + i * row, (const uint8_t *)k_rows + t * row, row);
        if (shape->has_v) memcpy(v + i * row, (const uint8_t *)v_rows + t * row, row);
        i++;
    }
    return KVS_OK;
}

kvs_status kvs_codec_drop_scatter_rows(const kvs_codec *c, const kvs_layer_view *view,
                                       const kvs_kv_shape *shape, uint32_t dtype,
                                       const kvs_token_span *span, const void *encoded,
                                       uint32_t encoded_tokens, uint32_t first_row) {
    kvs_codec_geom g = kvs_codec_geometry(c, shape, kvs_dtype_bytes(dtype), encoded_tokens);
    const uint8_t *mask = encoded, *k = mask + g.k_meta, *v = k + g.codes;
    uint64_t row = (uint64_t)g.heads * g.row_codes;
    uint32_t i = 0; /* kept rows before row r */
    for (uint32_t r = 0; r < first_row; r++) i += (uint32_t)kvs_codec_kept(mask, r);
    for (uint32_t t = 0; t < span->n_tokens; t++) {
        uint32_t r = first_row + t;
        uint64_t pos = span->first_token + t;
        int64_t off = (int64_t)span->block_ids[pos / shape->block_tokens] * view->block_stride +
                      (int64_t)(pos % shape->block_tokens) * view->token_stride;
        /* a mask keeping more rows than stored (a reader checks it first) reads no further */
        int have = kvs_codec_kept(mask, r) && i < g.kept;
        for (uint32_t h = 0; h < g.heads; h++) {
            int64_t at = off + (int64_t)h * view->head_stride;
            uint64_t src = (uint64_t)i * row + (uint64_t)h * g.row_codes;
            if (have)
                memcpy((uint8_t *)view->k_base + at, k + src, g.row_codes);
            else
                memset((uint8_t *)view->k_base + at, 0, g.row_codes);
            if (!shape->has_v) continue;
            if (have)
                memcpy((uint8_t *)view->v_base + at, v + src, g.row_codes);
            else
                memset((uint8_t *)view->v_base + at, 0, g.row_codes);
        }
        i += (uint32_t)kvs_codec_kept(mask, r);
    }
    return KVS_OK;
}
