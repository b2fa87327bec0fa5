/* test_cuda_abi.c - end to end through the public ABI (kvs_get_api) with CUDA layer views: the
 * connector loads libkvstrata-cuda.so.1 from beside libkvstrata.so, a request is saved from one
 * set of device pages and restored into other pages, and the restored bytes must equal what the
 * engine wrote. The engine's stream is handed over with set_stream (ABI 1.1); its one "computed"
 * token is written on that stream between wait_layer_load and save_layer. Needs a GPU: exits 77
 * without one. */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "gpu_support.h"
#include "tests/support/test_support.h"

enum { LAYERS = 2, HEADS = 2, HEAD_DIM = 64, BT = 16, CHUNK = 32, BLOCKS = 64, TOKENS = 128 };
#define HEAD_BYTES  (HEAD_DIM * 2)
#define TOKEN_BYTES (HEADS * HEAD_BYTES)
#define PART_BYTES  ((uint64_t)BLOCKS * BT * TOKEN_BYTES) /* one layer's K (or V) */
#define LAYER_BYTES (2 * PART_BYTES)

static const kvs_api *api;

/* Offset of K (kv 0) or V (kv 1) of token t with block table `blocks` in the NHD pages. */
static uint64_t kv_offset(int layer, int kv, const uint32_t *blocks, uint64_t t) {
    return (uint64_t)layer * LAYER_BYTES + (uint64_t)kv * PART_BYTES +
           ((uint64_t)blocks[t / BT] * BT + t % BT) * TOKEN_BYTES;
}

static uint8_t kv_byte(const int32_t *tokens, uint64_t t, int layer, int kv, int b) {
    return (uint8_t)(tokens[t] * 7 + (int)t * 3 + layer * 11 + kv * 5 + b);
}

typedef struct rig {
    kvs_handle *h;
    uint8_t *pages; /* device */
    uint8_t *host;  /* host image of the pages */
    cudaStream_t engine;
    char tmpdir[512];
} rig;

static void write_kv(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t to) {
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++)
            for (uint64_t t = 0; t < to; t++)
                for (int b = 0; b < TOKEN_BYTES; b++)
                    r->host[kv_offset(l, kv, blocks, t) + (uint64_t)b] =
                        kv_byte(tokens, t, l, kv, b);
}

/* One whole-prompt step of a request: lookup, alloc, meta, then the worker hooks. The engine
 * "computes" the tokens it was not offered by copying them from `source` blocks on its stream. */
static uint64_t step(rig *r, const char *id, const int32_t *tokens, const uint32_t *blocks,
                     const uint32_t *source) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, tokens, TOKENS, 0, &res), KVS_OK);
    const uint64_t nb = TOKENS / BT;
    ck_assert_int_eq(api->on_alloc(r->h, id, blocks, nb, res.n_hit_tokens), KVS_OK);
    kvs_step_request s = {
        id, tokens, TOKENS, blocks, nb, res.n_hit_tokens, TOKENS - res.n_hit_tokens};
    static uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_msg(api->bind_meta(r->h, meta, len) == KVS_OK, "%s", api->last_error(r->h));
    ck_assert_msg(api->start_load(r->h) == KVS_OK, "%s", api->last_error(r->h));
    for (uint32_t l = 0; l < LAYERS; l++) {
        ck_assert_msg(api->wait_layer_load(r->h, l) == KVS_OK, "%s", api->last_error(r->h));
        if (source)
            for (uint64_t t = res.n_hit_tokens; t < TOKENS; t++)
                for (int kv = 0; kv < 2; kv++)
                    GPU_CHECK(cudaMemcpyAsync(r->pages + kv_offset((int)l, kv, blocks, t),
                                              r->pages + kv_offset((int)l, kv, source, t),
                                              TOKEN_BYTES, cudaMemcpyDeviceToDevice, r->engine));
        ck_assert_msg(api->save_layer(r->h, l) == KVS_OK, "%s", api->last_error(r->h));
    }
    ck_assert_msg(api->wait_save(r->h) == KVS_OK, "%s", api->last_error(r->h));
    int keep = 1;
    ck_assert_int_eq(api->request_finished(r->h, id, &keep), KVS_OK);
    return res.n_hit_tokens;
}

START_TEST(restore_into_other_cuda_pages_is_byte_identical) {
    rig r;
    memset(&r, 0, sizeof r);
    api = kvs_get_api(KVS_ABI_MAJOR);
    ck_assert_ptr_nonnull(api);
    ck_assert_msg(api->abi_minor >= 1 &&
                      api->struct_size >= offsetof(kvs_api, set_stream) + sizeof(void *),
                  "this library predates set_stream (ABI %u.%u)", api->abi_major, api->abi_minor);
    ck_assert_int_eq(kvs_test_tmpdir(r.tmpdir, sizeof r.tmpdir), 0);
    char yaml[512], path[1024];
    snprintf(yaml, sizeof yaml,
             "chunk_tokens: %d\nlog_level: warn\npool:\n  staging_bytes: 4MiB\n"
             "device:\n  copy_method: %s\n  max_chunks_per_step: 16\n"
             "tiers:\n  - name: dram\n    type: dram\n    capacity: 16MiB\n",
             CHUNK,
             _i == 0   ? "kernel"
             : _i == 1 ? "dma"
                       : "auto");
    ck_assert_int_eq(kvs_test_write_file(r.tmpdir, "cuda.yaml", yaml, path, sizeof path), 0);
    kvs_model_desc m = {.struct_size = sizeof m,
                        .model_id = "test-cuda",
                        .dtype = KVS_DTYPE_FP16,
                        .n_layers = LAYERS,
                        .n_kv_heads = HEADS,
                        .head_dim = HEAD_DIM,
                        .block_tokens = BT,
                        .tp_size = 1,
                        .vocab_size = 1000};
    kvs_open_params p = {
        .struct_size = sizeof p, .role = KVS_ROLE_BOTH, .config_path = path, .model = &m};
    char err[512] = "";
    ck_assert_msg(api->open(&p, &r.h, err, sizeof err) == KVS_OK, "%s", err);

    const uint64_t bytes = (uint64_t)LAYERS * LAYER_BYTES;
    GPU_CHECK(cudaMalloc((void **)&r.pages, bytes));
    GPU_CHECK(cudaMemset(r.pages, 0, bytes));
    r.host = calloc(bytes, 1);
    ck_assert_ptr_nonnull(r.host);
    kvs_layer_view views[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        views[l] = (kvs_layer_view){.struct_size = sizeof(kvs_layer_view),
                                    .device_kind = KVS_DEVICE_CUDA,
                                    .device_index = 0,
                                    .n_blocks = BLOCKS,
                                    .k_base = r.pages + l * LAYER_BYTES,
                                    .v_base = r.pages + l * LAYER_BYTES + PART_BYTES,
                                    .block_stride = BT * TOKEN_BYTES,
                                    .token_stride = TOKEN_BYTES,
                                    .head_stride = HEAD_BYTES};
    ck_assert_msg(api->register_kv(r.h, views, LAYERS) == KVS_OK, "%s", api->last_error(r.h));
    GPU_CHECK(cudaStreamCreateWithFlags(&r.engine, cudaStreamNonBlocking));
    ck_assert_msg(api->set_stream(r.h, r.engine) == KVS_OK, "%s", api->last_error(r.h));

    int32_t tokens[TOKENS];
    for (int i = 0; i < TOKENS; i++) tokens[i] = (int32_t)((i * 37 + 101) % 1000);
    uint32_t a[TOKENS / BT], b[TOKENS / BT];
    for (uint32_t i = 0; i < TOKENS / BT; i++) {
        a[i] = 2 * i;              /* even blocks */
        b[i] = BLOCKS - 1 - 2 * i; /* odd blocks, in reverse order */
    }
    write_kv(&r, a, tokens, TOKENS); /* the engine computed the whole prompt into blocks a */
    GPU_CHECK(cudaMemcpy(r.pages, r.host, bytes, cudaMemcpyHostToDevice));
    ck_assert_uint_eq(step(&r, "a", tokens, a, NULL), 0);
    /* Everything but the last token comes from the connector; the engine computes that one. */
    ck_assert_uint_eq(step(&r, "b", tokens, b, a), TOKENS - 1);
    GPU_CHECK(gpu_wait_stream(r.engine, 30000));

    uint8_t *back = malloc(bytes);
    ck_assert_ptr_nonnull(back);
    GPU_CHECK(cudaMemcpy(back, r.pages, bytes, cudaMemcpyDeviceToHost));
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++)
            for (uint64_t t = 0; t < TOKENS; t++)
                for (int x = 0; x < TOKEN_BYTES; x++) {
                    uint8_t got = back[kv_offset(l, kv, b, t) + (uint64_t)x];
                    if (got != kv_byte(tokens, t, l, kv, x))
                        ck_abort_msg("layer %d %s token %llu byte %d: restored %u, saved %u", l,
                                     kv ? "V" : "K", (unsigned long long)t, x, got,
                                     kv_byte(tokens, t, l, kv, x));
                }
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.chunks_saved, TOKENS / CHUNK);
    ck_assert_uint_eq(s.chunks_loaded, TOKENS / CHUNK);
    ck_assert_uint_eq(s.load_errors, 0);

    free(back);
    api->close(r.h);
    GPU_CHECK(cudaStreamDestroy(r.engine));
    GPU_CHECK(cudaFree(r.pages));
    free(r.host);
    kvs_test_rmtree(r.tmpdir);
}
END_TEST

static Suite *abi_suite(void) {
    Suite *s = suite_create("cuda_abi");
    TCase *t = tcase_create("abi");
    tcase_set_timeout(t, 300);
    /* _i: copy_method kernel, dma, auto */
    tcase_add_loop_test(t, restore_into_other_cuda_pages_is_byte_identical, 0, 3);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    gpu_require_device("test_cuda_abi");
    SRunner *r = srunner_create(abi_suite());
    srunner_set_fork_status(r, CK_NOFORK); /* CUDA is initialised in this process */
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
