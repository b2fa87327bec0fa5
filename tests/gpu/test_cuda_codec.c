/* test_cuda_codec.c - the GPU's fused decode-scatter (kernels/cuda/codec_cuda.h) writes the same bytes
 * into the pages as the host reference (kernels/cpu/codec.h), for every codec and dtype, in NHD and
 * HND layouts, and nothing outside the span. Needs a GPU: exits 77 without one. */
#include <check.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_support.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cuda/codec_cuda.h"

static float value(uint32_t i) { /* deterministic, signed, a few large channels */
    uint32_t x = i * 2654435761u;
    x ^= x >> 15;
    float v = (float)(x % 2001u) / 1000.0f - 1.0f;
    return i % 16 == 3 ? 8.0f + 4.0f * v : v;
}

START_TEST(gpu_decode_scatter_writes_the_host_bytes) {
    const kvs_codec codecs[] = {{KVS_CODEC_KIVI, 2, 32, 32},
                                {KVS_CODEC_KIVI, 4, 16, 8},
                                {KVS_CODEC_INT8, 8, 0, 0},
                                {KVS_CODEC_DROP, 0, 29, 0}};
    const uint32_t dtypes[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32, KVS_DTYPE_FP8_E4M3};
    const uint32_t heads = 4, dim = 64, bt = 16, n_blocks = 10, n = 70, first = 9;
    const uint32_t blocks[5] = {8, 1, 5, 3, 9};
    for (int layout = 0; layout < 2; layout++)
        for (size_t di = 0; di < 4; di++)
            for (size_t ci = 0; ci < 4; ci++) {
                uint32_t dtype = dtypes[di], el = kvs_dtype_bytes(dtype);
                kvs_kv_shape shape = {
                    .n_heads = heads, .head_bytes = dim * el, .block_tokens = bt, .has_v = 1};
                size_t page = (size_t)bt * heads * dim * el, cache = page * n_blocks;
                size_t part = (size_t)n * heads * dim * el;
                uint8_t *k = malloc(part), *v = malloc(part);
                for (uint32_t i = 0; i < n * heads * dim; i++) {
                    kvs_dtype_store(dtype, k, i, value(i));
                    kvs_dtype_store(dtype, v, i, value(i + 7777u));
                }
                uint64_t bytes = kvs_codec_layer_bytes(&codecs[ci], &shape, dtype, n);
                uint8_t *enc = malloc(bytes);
                ck_assert_int_eq(kvs_codec_encode_layer(&codecs[ci], &shape, dtype, n, k, v, enc),
                                 KVS_OK);
                uint8_t *hk = malloc(cache), *hv = malloc(cache), *gk = malloc(cache),
                        *gv = malloc(cache);
                memset(hk, 0x5a, cache), memset(hv, 0x5a, cache);
                kvs_layer_view view = {.struct_size = sizeof view,
                                       .n_blocks = n_blocks,
                                       .k_base = hk,
                                       .v_base = hv,
                                       .block_stride = (int64_t)page,
                                       .token_stride =
                                           layout ? dim * el : (int64_t)heads * dim * el,
                                       .head_stride = layout ? (int64_t)bt * dim * el : dim * el};
                kvs_token_span span = {
                    .block_ids = blocks, .n_block_ids = 5, .first_token = first, .n_tokens = n};
                ck_assert_int_eq(
                    kvs_codec_scatter_layer(&codecs[ci], &view, &shape, dtype, &span, enc), KVS_OK);

                void *dk, *dv, *denc, *dids;
                GPU_CHECK(cudaMalloc(&dk, cache));
                GPU_CHECK(cudaMalloc(&dv, cache));
                GPU_CHECK(cudaMalloc(&denc, bytes));
                GPU_CHECK(cudaMalloc(&dids, sizeof blocks));
                GPU_CHECK(cudaMemset(dk, 0x5a, cache));
                GPU_CHECK(cudaMemset(dv, 0x5a, cache));
                GPU_CHECK(cudaMemcpy(denc, enc, bytes, cudaMemcpyHostToDevice));
                GPU_CHECK(cudaMemcpy(dids, blocks, sizeof blocks, cudaMemcpyHostToDevice));
                kvs_layer_view dview = view;
                dview.k_base = dk, dview.v_base = dv;
                kvs_token_span dspan = span;
                dspan.block_ids = dids;
                GPU_CHECK(kvs_cuda_codec_scatter_layer(&codecs[ci], &dview, &shape, dtype, &dspan,
                                                       denc, 0));
                GPU_CHECK(cudaDeviceSynchronize());
                GPU_CHECK(cudaMemcpy(gk, dk, cache, cudaMemcpyDeviceToHost));
                GPU_CHECK(cudaMemcpy(gv, dv, cache, cudaMemcpyDeviceToHost));
                ck_assert_msg(memcmp(gk, hk, cache) == 0 && memcmp(gv, hv, cache) == 0,
                              "layout %d dtype %u codec %zu: the GPU wrote other bytes", layout,
                              dtype, ci);
                /* part of the chunk: rows 5.. at tokens first + 5.., over pages spoiled first */
                kvs_token_span rows = span;
                rows.first_token += 5, rows.n_tokens -= 5;
                memset(hk, 0x33, cache), memset(hv, 0x33, cache);
                ck_assert_int_eq(
                    kvs_codec_scatter_rows(&codecs[ci], &view, &shape, dtype, &rows, enc, n, 5),
                    KVS_OK);
                GPU_CHECK(cudaMemset(dk, 0x33, cache));
                GPU_CHECK(cudaMemset(dv, 0x33, cache));
                kvs_token_span drows = rows;
                drows.block_ids = dids;
                GPU_CHECK(kvs_cuda_codec_scatter_rows(&codecs[ci], &dview, &shape, dtype, &drows,
                                                      denc, n, 5, 0));
                GPU_CHECK(cudaDeviceSynchronize());
                GPU_CHECK(cudaMemcpy(gk, dk, cache, cudaMemcpyDeviceToHost));
                GPU_CHECK(cudaMemcpy(gv, dv, cache, cudaMemcpyDeviceToHost));
                ck_assert_msg(memcmp(gk, hk, cache) == 0 && memcmp(gv, hv, cache) == 0,
                              "layout %d dtype %u codec %zu: rows from 5 differ", layout, dtype,
                              ci);
                cudaFree(dk), cudaFree(dv), cudaFree(denc), cudaFree(dids);
                free(k), free(v), free(enc), free(hk), free(hv), free(gk), free(gv);
            }
}
END_TEST

int main(void) {
    gpu_require_device("test_cuda_codec");
    Suite *s = suite_create("cuda_codec");
    TCase *t = tcase_create("codec");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, gpu_decode_scatter_writes_the_host_bytes);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_set_fork_status(r, CK_NOFORK);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
