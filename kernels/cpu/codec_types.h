/* codec_types.h - what the codecs share (codec.h has the layouts and bounds): the codec kinds, the
 * codec parameters and where an encoded layer keeps what. */
#ifndef KVS_CODEC_TYPES_H
#define KVS_CODEC_TYPES_H

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Codec kinds: the object header's codec field (0 is KVS_CODEC_RAW, connector/object.h). */
#define KVS_CODEC_KIVI 1
#define KVS_CODEC_INT8 2
#define KVS_CODEC_DROP 4 /* 3 is KVS_CODEC_DERIVED (connector/object.h) */

/* The codecs that make a lossy object (a codec record after the layer table). */
static inline int kvs_codec_is_lossy(uint32_t kind) {
    return kind == KVS_CODEC_KIVI || kind == KVS_CODEC_INT8 || kind == KVS_CODEC_DROP;
}

/* Bytes of a DROP layer's kept mask over n tokens: whole 64-bit words, so the rows after it stay
 * aligned. */
static inline uint64_t kvs_codec_mask_bytes(uint32_t n) {
    return ((uint64_t)n + 63u) / 64u * 8u;
}

/* 1 when a DROP layer's kept mask keeps token t (bit t, least significant first). */
static inline int kvs_codec_kept(const uint8_t *mask, uint64_t t) {
    return mask[t / 8u] >> (t % 8u) & 1u;
}

typedef struct kvs_codec {
    uint8_t kind;     /* KVS_CODEC_KIVI, KVS_CODEC_INT8 or KVS_CODEC_DROP */
    uint8_t bits;     /* KIVI: 2 or 4; INT8: 8; DROP: 0 */
    uint16_t k_group; /* KIVI: tokens per K group (>= 1); DROP: tokens kept (>= 1) */
    uint16_t v_group; /* KIVI: channels per V group (1 .. dim); DROP: 0 */
} kvs_codec;

/* Where an encoded layer keeps what (the layout above), for n tokens: one definition for the host
 * codecs and the CUDA decode-scatter. */
typedef struct kvs_codec_geom {
    uint32_t n, heads, dim, elem;
    uint32_t levels;    /* KIVI: 2^bits - 1; INT8: 127 */
    uint32_t row_codes; /* code bytes of one (token, head) row */
    uint32_t k_groups;  /* KIVI: token groups of K */
    uint32_t v_groups;  /* KIVI: channel groups of one V row */
    uint32_t kept;      /* DROP: rows kept (k_group, at most n) */
    uint64_t codes;     /* code bytes of K (and of V); DROP: the kept rows */
    uint64_t k_meta;    /* bytes of K's group table (INT8: steps; DROP: the kept mask) */
    uint64_t v_meta;
} kvs_codec_geom;

static inline kvs_codec_geom kvs_codec_geometry(const kvs_codec *c, const kvs_kv_shape *shape,
                                                uint32_t elem, uint32_t n) {
    kvs_codec_geom g;
    memset(&g, 0, sizeof g);
    g.n = n;
    g.heads = shape->n_heads;
    g.elem = elem;
    g.dim = elem ? shape->head_bytes / elem : 0;
    if (c->kind == KVS_CODEC_KIVI) {
        g.levels = (1u << c->bits) - 1u;
        g.row_codes = g.dim * c->bits / 8u;
        g.k_groups = c->k_group ? (n + c->k_group - 1u) / c->k_group : 0;
        g.v_groups = c->v_group ? (g.dim + c->v_group - 1u) / c->v_group : 0;
        g.k_meta = (uint64_t)g.k_groups * g.heads * g.dim * 4u;
        g.v_meta = (uint64_t)n * g.heads * g.v_groups * 4u;
    } else if (c->kind == KVS_CODEC_DROP) {
        g.row_codes = shape->head_bytes;
        g.kept = c->k_group < n ? c->k_group : n;
        g.k_meta = kvs_codec_mask_bytes(n);
        g.codes = (uint64_t)g.kept * g.heads * g.row_codes;
        return g;
    } else {
        g.levels = 127;
        g.row_codes = g.dim;
        g.k_meta = g.v_meta = (uint64_t)n * g.heads * 2u;
    }
    g.codes = (uint64_t)n * g.heads * g.row_codes;
    return g;
}

#ifdef __cplusplus
}
#endif

#endif
