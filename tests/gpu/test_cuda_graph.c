/* test_cuda_graph.c - wait_layer inside CUDA graph capture. A stream is captured that, for every
 * layer, calls the device's wait_layer(l) and then launches a kernel copying layer l's pages into a
 * check buffer (an attention kernel's read). The graph is instantiated once and replayed 100 times;
 * before each replay every layer is loaded from new payload bytes with load_layer, and after it
 * the check buffer must hold exactly the pages those loads produced (computed by the host device
 * on a host mirror). Replays 51..100 go in pairs without a host wait between them (load, replay A,
 * load, replay B), which also checks that the second loads wait for replay A's reads, and that a
 * replay waits for the loads recorded before its launch, not later ones. Loads and saves inside
 * the capture are refused without breaking it. Needs a GPU: exits 77 without one. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_backend.h" /* KVS_LOG_* */
#include "gpu_cases.h"
#include "gpu_support.h"

#define REPLAYS            100
#define SEQUENTIAL_REPLAYS 50

static const kvs_device_ops *ops;

typedef struct graph_rig {
    gpu_cache mirror; /* host pages, kept equal to the device's expected pages */
    uint8_t *pages;   /* device */
    kvs_layer_view views[GPU_MAX_LAYERS];
    uint64_t layer_bytes; /* per-layer layouts: layer l is [l, l + 1) * layer_bytes */
    uint8_t *payload[2];  /* registered */
    uint64_t payload_bytes;
    gpu_copies cp[2];
    uint8_t *check[2]; /* device: what each graph's kernels read */
    cudaGraphExec_t exec[2];
    cudaStream_t engine;
    void *cuda;
    void *host;
    char err[512];
} graph_rig;

/* Capture one replayable step reading into check buffer `which`. */
static void capture(graph_rig *r, int which) {
    cudaGraph_t graph = NULL;
    GPU_CHECK(cudaStreamBeginCapture(r->engine, cudaStreamCaptureModeGlobal));
    for (uint32_t l = 0; l < r->mirror.g.n_layers; l++) {
        ck_assert_msg(ops->wait_layer(r->cuda, l, r->err, sizeof r->err) == KVS_OK, "%s", r->err);
        GPU_CHECK(gpu_copy_kernel(r->check[which] + l * r->layer_bytes,
                                  r->pages + l * r->layer_bytes, r->layer_bytes, r->engine));
    }
    /* Refused, and the capture is still valid afterwards (EndCapture below succeeds). */
    ck_assert_int_eq(
        ops->save_layer(r->cuda, 0, r->cp[0].copies[0], r->cp[0].n, r->err, sizeof r->err),
        KVS_ESTATE);
    ck_assert_msg(strstr(r->err, "captured") != NULL, "%s", r->err);
    ck_assert_int_eq(
        ops->load_layer(r->cuda, 0, r->cp[0].copies[0], r->cp[0].n, r->err, sizeof r->err),
        KVS_ESTATE);
    GPU_CHECK(cudaStreamEndCapture(r->engine, &graph));
    GPU_CHECK(cudaGraphInstantiate(&r->exec[which], graph, 0));
    GPU_CHECK(cudaGraphDestroy(graph));
}

static void load_all_layers(graph_rig *r, int which, uint32_t seed) {
    gpu_fill(r->payload[which], r->payload_bytes, seed);
    for (uint32_t l = 0; l < r->mirror.g.n_layers; l++) {
        ck_assert_msg(ops->load_layer(r->cuda, l, r->cp[which].copies[l], r->cp[which].n, r->err,
                                      sizeof r->err) == KVS_OK,
                      "%s", r->err);
        /* The mirror follows: the host device scatters the same payload into it at once. */
        ck_assert_int_eq(kvs_host_device()->load_layer(r->host, l, r->cp[which].copies[l],
                                                       r->cp[which].n, r->err, sizeof r->err),
                         KVS_OK);
    }
}

/* The check buffer of graph `which` equals the mirror as it was after that replay's loads. */
static void expect_check(graph_rig *r, int which, const uint8_t *mirror, int replay) {
    const uint64_t bytes = r->layer_bytes * r->mirror.g.n_layers;
    uint8_t *got = malloc(bytes);
    ck_assert_ptr_nonnull(got);
    GPU_CHECK(cudaMemcpy(got, r->check[which], bytes, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < bytes; i++)
        if (got[i] != mirror[i])
            ck_abort_msg("replay %d: layer %llu byte %llu read by the graph is %u, loaded %u",
                         replay, (unsigned long long)(i / r->layer_bytes),
                         (unsigned long long)(i % r->layer_bytes), got[i], mirror[i]);
    free(got);
}

/* _i: 0 copy kernel, 1 copy engines. */
START_TEST(captured_wait_layer_orders_every_replay_after_its_loads) {
    graph_rig r;
    memset(&r, 0, sizeof r);
    /* 4 layers of 32 blocks x 16 tokens x 2 heads x 128 bytes (NHD fp16): 256 KiB per layer. */
    gpu_geometry g = {KVS_TEST_LAYOUT_NHD, 4, GPU_CASE_BLOCKS, 16, 2, 64, 2};
    ck_assert_int_eq(gpu_cache_alloc(&r.mirror, &g), 0);
    r.layer_bytes = r.mirror.bytes / g.n_layers;
    gpu_fill(r.mirror.buf, r.mirror.bytes, 1);
    GPU_CHECK(cudaMalloc((void **)&r.pages, r.mirror.bytes));
    GPU_CHECK(cudaMemcpy(r.pages, r.mirror.buf, r.mirror.bytes, cudaMemcpyHostToDevice));
    gpu_cache_rebase(&r.mirror, r.pages, KVS_DEVICE_CUDA, 0, r.views);
    r.payload_bytes = gpu_copies_payload_bytes(&r.mirror);
    for (int k = 0; k < 2; k++) {
        r.payload[k] = aligned_alloc(4096, (r.payload_bytes + 4095) & ~(uint64_t)4095);
        ck_assert_ptr_nonnull(r.payload[k]);
        gpu_copies_build(&r.cp[k], &r.mirror, r.payload[k]);
        GPU_CHECK(cudaMalloc((void **)&r.check[k], r.mirror.bytes));
    }
    kvs_device_init init = {.struct_size = sizeof init,
                            .views = r.views,
                            .n_layers = g.n_layers,
                            .shape = r.mirror.shape,
                            .max_tokens_per_layer = (uint32_t)r.cp[0].tokens,
                            .max_copies_per_layer = r.cp[0].n,
                            .method = _i ? KVS_DEV_COPY_DMA : KVS_DEV_COPY_KERNEL,
                            .log_level = KVS_LOG_WARN};
    ck_assert_msg(ops->open(&init, &r.cuda, NULL, r.err, sizeof r.err) == KVS_OK, "%s", r.err);
    init.views = r.mirror.views;
    ck_assert_int_eq(kvs_host_device()->open(&init, &r.host, NULL, r.err, sizeof r.err), KVS_OK);
    for (int k = 0; k < 2; k++)
        ck_assert_msg(ops->register_host(r.cuda, r.payload[k], r.payload_bytes, r.err,
                                         sizeof r.err) == KVS_OK,
                      "%s", r.err);
    GPU_CHECK(cudaStreamCreateWithFlags(&r.engine, cudaStreamNonBlocking));
    ck_assert_int_eq(ops->set_stream(r.cuda, r.engine, r.err, sizeof r.err), KVS_OK);
    capture(&r, 0);
    capture(&r, 1);

    uint8_t *mirror_a = malloc(r.mirror.bytes);
    ck_assert_ptr_nonnull(mirror_a);
    int replay = 1;
    for (; replay <= SEQUENTIAL_REPLAYS; replay++) {
        load_all_layers(&r, 0, (uint32_t)replay * 2);
        GPU_CHECK(cudaGraphLaunch(r.exec[0], r.engine));
        GPU_CHECK(gpu_wait_stream(r.engine, 30000));
        ck_assert_msg(ops->sync(r.cuda, r.err, sizeof r.err) == KVS_OK, "%s", r.err);
        expect_check(&r, 0, r.mirror.buf, replay);
    }
    for (; replay <= REPLAYS; replay += 2) {
        load_all_layers(&r, 0, (uint32_t)replay * 2);
        memcpy(mirror_a, r.mirror.buf, r.mirror.bytes);
        GPU_CHECK(cudaGraphLaunch(r.exec[0], r.engine));
        load_all_layers(&r, 1, (uint32_t)replay * 2 + 1);
        GPU_CHECK(cudaGraphLaunch(r.exec[1], r.engine));
        cudaError_t rc = gpu_wait_stream(r.engine, 30000);
        ck_assert_msg(rc == cudaSuccess,
                      "replays %d and %d did not finish in 30 s (%s): a replay may be waiting for "
                      "loads recorded after its launch",
                      replay, replay + 1, cudaGetErrorName(rc));
        ck_assert_msg(ops->sync(r.cuda, r.err, sizeof r.err) == KVS_OK, "%s", r.err);
        expect_check(&r, 0, mirror_a, replay);
        expect_check(&r, 1, r.mirror.buf, replay + 1);
    }
    ck_assert_int_eq(replay, REPLAYS + 1);

    free(mirror_a);
    for (int k = 0; k < 2; k++) GPU_CHECK(cudaGraphExecDestroy(r.exec[k]));
    ops->close(r.cuda);
    kvs_host_device()->close(r.host);
    GPU_CHECK(cudaStreamDestroy(r.engine));
    for (int k = 0; k < 2; k++) {
        GPU_CHECK(cudaFree(r.check[k]));
        free(r.payload[k]);
    }
    GPU_CHECK(cudaFree(r.pages));
    gpu_cache_free(&r.mirror);
}
END_TEST

static Suite *graph_suite(void) {
    Suite *s = suite_create("cuda_graph");
    TCase *t = tcase_create("graph");
    tcase_set_timeout(t, 600);
    tcase_add_loop_test(t, captured_wait_layer_orders_every_replay_after_its_loads, 0, 2);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    gpu_require_device("test_cuda_graph");
    ops = gpu_load_module();
    SRunner *r = srunner_create(graph_suite());
    srunner_set_fork_status(r, CK_NOFORK); /* CUDA is initialised in this process */
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
