/* codec_cuda.cu - the fused decode-scatter (codec_cuda.h). One thread per element of K (and V): it
 * reads its code and its group's (m, s), and stores m + q * s into its page in the cache dtype; for
 * DROP it copies its element of a kept row as stored, or zeroes it for a dropped one. */
#include "codec_cuda.h"

#include "kernels/cpu/dtype.h"

namespace {

constexpr int kThreads = 256;

struct decode_args {
    kvs_codec c;
    kvs_codec_geom g; /* the layout, as the host reads it */
    uint32_t dtype, block_tokens;
    uint32_t n_tokens, first_row; /* the span's tokens are encoded rows first_row .. */
    uint64_t first_token;
    int has_v;
    uint8_t *k_base, *v_base;
    int64_t block_stride, token_stride, head_stride;
    const uint32_t *block_ids;
    const uint8_t *enc;
};

__device__ float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kvs_f16_to_f32(h);
}

/* Element (t, h, d) of K (is_v 0) or V, decoded as the host's decode_row does. */
__device__ float decode(const decode_args &a, int is_v, uint32_t t, uint32_t h, uint32_t d) {
    const kvs_codec_geom &g = a.g;
    const uint8_t *codes = a.enc + (is_v ? g.codes + g.k_meta : 0);
    const uint8_t *meta = codes + g.codes;
    uint64_t r = (uint64_t)t * g.heads + h;
    if (a.c.kind == KVS_CODEC_INT8) {
        float s = half_at(meta + r * 2u);
        return __fmul_rn((float)(int8_t)codes[r * g.dim + d], s);
    }
    uint32_t bit = d * a.c.bits;
    uint32_t q =
        (uint32_t)(codes[r * g.row_codes + bit / 8u] >> (bit % 8u)) & ((1u << a.c.bits) - 1u);
    const uint8_t *gm = is_v
                            ? meta + (r * g.v_groups + d / a.c.v_group) * 4u
                            : meta + (((uint64_t)(t / a.c.k_group) * g.heads + h) * g.dim + d) * 4u;
    return __fadd_rn(__fmul_rn((float)q, half_at(gm + 2)), half_at(gm));
}

/* DROP: where row r of the chunk is among the stored rows (the kept rows before it), or -1 if it was
 * dropped (or the mask keeps more rows than are stored: a reader checked it, nothing is read past). */
__device__ int64_t kept_rank(const decode_args &a, uint32_t r) {
    const uint8_t *mask = a.enc;
    if (!(mask[r / 8u] >> (r % 8u) & 1u)) return -1;
    uint32_t rank = 0;
    for (uint32_t b = 0; b < r / 8u; b++) rank += (uint32_t)__popc(mask[b]);
    rank += (uint32_t)__popc(mask[r / 8u] & ((1u << (r % 8u)) - 1u));
    return rank < a.g.kept ? (int64_t)rank : -1;
}

__global__ void __launch_bounds__(kThreads) decode_scatter(const decode_args a) {
    const kvs_codec_geom &g = a.g;
    const uint64_t per_part = (uint64_t)a.n_tokens * g.heads * g.dim;
    const uint64_t total = a.has_v ? 2 * per_part : per_part;
    const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    const uint32_t el = kvs_dtype_bytes(a.dtype);
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int is_v = i >= per_part;
        const uint64_t e = is_v ? i - per_part : i;
        const uint32_t d = (uint32_t)(e % g.dim);
        const uint32_t h = (uint32_t)(e / g.dim % g.heads);
        const uint32_t t = (uint32_t)(e / g.dim / g.heads);
        const uint64_t pos = a.first_token + t;
        const int64_t at = (int64_t)a.block_ids[pos / a.block_tokens] * a.block_stride +
                           (int64_t)(pos % a.block_tokens) * a.token_stride +
                           (int64_t)h * a.head_stride + (int64_t)d * el;
        uint8_t *dst = (is_v ? a.v_base : a.k_base) + at;
        if (a.c.kind == KVS_CODEC_DROP) { /* the stored bytes, or zeros */
            const int64_t rank = kept_rank(a, a.first_row + t);
            const uint8_t *src = a.enc + g.k_meta + (is_v ? g.codes : 0) +
                                 ((uint64_t)rank * g.heads + h) * g.row_codes + (uint64_t)d * el;
            for (uint32_t b = 0; b < el; b++) dst[b] = rank < 0 ? 0 : src[b];
            continue;
        }
        kvs_dtype_store(a.dtype, dst, 0, decode(a, is_v, a.first_row + t, h, d));
    }
}

} // namespace

extern "C" cudaError_t kvs_cuda_codec_scatter_layer(const kvs_codec *c, const kvs_layer_view *view,
                                                    const kvs_kv_shape *shape, uint32_t dtype,
                                                    const kvs_token_span *span, const void *encoded,
                                                    cudaStream_t stream) {
    return kvs_cuda_codec_scatter_rows(c, view, shape, dtype, span, encoded, span->n_tokens, 0,
                                       stream);
}

extern "C" cudaError_t kvs_cuda_codec_scatter_rows(const kvs_codec *c, const kvs_layer_view *view,
                                                   const kvs_kv_shape *shape, uint32_t dtype,
                                                   const kvs_token_span *span, const void *encoded,
                                                   uint32_t encoded_tokens, uint32_t first_row,
                                                   cudaStream_t stream) {
    if (first_row > encoded_tokens || span->n_tokens > encoded_tokens - first_row)
        return cudaErrorInvalidValue;
    if (!kvs_codec_is_lossy(c->kind)) return cudaErrorInvalidValue;
    decode_args a = {};
    a.c = *c;
    a.g = kvs_codec_geometry(c, shape, kvs_dtype_bytes(dtype), encoded_tokens);
    a.n_tokens = span->n_tokens;
    a.first_row = first_row;
    a.dtype = dtype;
    a.block_tokens = shape->block_tokens;
    a.first_token = span->first_token;
    a.has_v = shape->has_v;
    a.k_base = static_cast<uint8_t *>(view->k_base);
    a.v_base = static_cast<uint8_t *>(view->v_base);
    a.block_stride = view->block_stride;
    a.token_stride = view->token_stride;
    a.head_stride = view->head_stride;
    a.block_ids = span->block_ids;
    a.enc = static_cast<const uint8_t *>(encoded);
    uint64_t total = (uint64_t)a.n_tokens * a.g.heads * a.g.dim * (a.has_v ? 2u : 1u);
    if (total == 0) return cudaSuccess;
    uint64_t blocks = (total + kThreads - 1) / kThreads;
    if (blocks > 4096) blocks = 4096;
    void *args[] = {&a};
    return cudaLaunchKernel(reinterpret_cast<const void *>(&decode_scatter), dim3((unsigned)blocks),
                            dim3(kThreads), args, 0, stream);
}
