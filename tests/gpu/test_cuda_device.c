/* test_cuda_device.c - the CUDA device module through its table, against the host device on a
 * host mirror of the same pages: byte equality of the whole payload (save) and of the whole cache
 * (load), for every layout, element size and awkward copy (gpu_cases.h), by the copy kernel and
 * by the copy engines; and the refusals that keep a bad call from ever reaching the GPU.
 * Needs a GPU: exits 77 (skipped) without one. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_backend.h" /* KVS_LOG_* */
#include "gpu_cases.h"
#include "gpu_support.h"

static const kvs_device_ops *ops;

/* A CUDA device over a device copy of a gpu_cache, and a host device over the cache itself. */
typedef struct rig {
    gpu_cache cache;
    uint8_t *pages;                       /* device copy of cache.buf */
    kvs_layer_view views[GPU_MAX_LAYERS]; /* CUDA views over pages */
    uint8_t *payload;                     /* registered with the CUDA device */
    uint8_t *expected;                    /* the host device's payload */
    uint64_t payload_bytes;
    gpu_copies cp;     /* over payload */
    gpu_copies cp_ref; /* over expected */
    void *cuda;
    void *host;
    kvs_device_info info;
    cudaStream_t engine;
    char err[512];
} rig;

static void rig_open(rig *r, const gpu_geometry *g, kvs_dev_copy_method method) {
    memset(r, 0, sizeof *r);
    ck_assert_int_eq(gpu_cache_alloc(&r->cache, g), 0);
    gpu_fill(r->cache.buf, r->cache.bytes, 1);
    GPU_CHECK(cudaMalloc((void **)&r->pages, r->cache.bytes));
    GPU_CHECK(cudaMemcpy(r->pages, r->cache.buf, r->cache.bytes, cudaMemcpyHostToDevice));
    gpu_cache_rebase(&r->cache, r->pages, KVS_DEVICE_CUDA, 0, r->views);
    r->payload_bytes = gpu_copies_payload_bytes(&r->cache);
    r->payload = aligned_alloc(4096, (r->payload_bytes + 4095) & ~(uint64_t)4095);
    r->expected = calloc(r->payload_bytes, 1);
    ck_assert(r->payload && r->expected);
    memset(r->payload, 0, r->payload_bytes);
    gpu_copies_build(&r->cp, &r->cache, r->payload);
    gpu_copies_build(&r->cp_ref, &r->cache, r->expected);

    kvs_device_init init = {.struct_size = sizeof init,
                            .views = r->views,
                            .n_layers = g->n_layers,
                            .shape = r->cache.shape,
                            .max_tokens_per_layer = (uint32_t)r->cp.tokens,
                            .max_copies_per_layer = r->cp.n,
                            .method = method,
                            .log_level = KVS_LOG_WARN};
    ck_assert_msg(ops->open(&init, &r->cuda, &r->info, r->err, sizeof r->err) == KVS_OK, "%s",
                  r->err);
    ck_assert_msg(
        ops->register_host(r->cuda, r->payload, r->payload_bytes, r->err, sizeof r->err) == KVS_OK,
        "%s", r->err);
    GPU_CHECK(cudaStreamCreateWithFlags(&r->engine, cudaStreamNonBlocking));
    ck_assert_int_eq(ops->set_stream(r->cuda, r->engine, r->err, sizeof r->err), KVS_OK);

    init.views = r->cache.views;
    kvs_device_info host_info;
    ck_assert_msg(kvs_host_device()->open(&init, &r->host, &host_info, r->err, sizeof r->err) ==
                      KVS_OK,
                  "%s", r->err);
}

static void rig_close(rig *r) {
    kvs_host_device()->close(r->host);
    ops->close(r->cuda); /* unregisters the payload */
    GPU_CHECK(cudaStreamDestroy(r->engine));
    GPU_CHECK(cudaFree(r->pages));
    free(r->expected);
    free(r->payload);
    gpu_cache_free(&r->cache);
}

static void expect_equal(const uint8_t *got, const uint8_t *want, size_t n, const char *what,
                         const rig *r, const char *method) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            ck_abort_msg("%s %s elem %u bt %u: %s byte %zu of %zu is %u, host device %u", method,
                         gpu_layout_name(r->cache.g.layout), r->cache.g.elem_bytes,
                         r->cache.g.block_tokens, what, i, n, got[i], want[i]);
}

/* Save every layer, then load every layer from fresh payload, on both devices; compare. */
static void save_then_load(rig *r, const char *method) {
    const kvs_device_ops *host = kvs_host_device();
    const uint32_t n_layers = r->cache.g.n_layers;
    for (uint32_t l = 0; l < n_layers; l++) {
        ck_assert_msg(
            ops->save_layer(r->cuda, l, r->cp.copies[l], r->cp.n, r->err, sizeof r->err) == KVS_OK,
            "%s", r->err);
        ck_assert_int_eq(
            host->save_layer(r->host, l, r->cp_ref.copies[l], r->cp_ref.n, r->err, sizeof r->err),
            KVS_OK);
    }
    ck_assert_msg(ops->sync(r->cuda, r->err, sizeof r->err) == KVS_OK, "%s", r->err);
    expect_equal(r->payload, r->expected, r->payload_bytes, "saved payload", r, method);

    gpu_fill(r->payload, r->payload_bytes, 7);
    memcpy(r->expected, r->payload, r->payload_bytes);
    for (uint32_t l = 0; l < n_layers; l++) {
        ck_assert_msg(
            ops->load_layer(r->cuda, l, r->cp.copies[l], r->cp.n, r->err, sizeof r->err) == KVS_OK,
            "%s", r->err);
        ck_assert_msg(ops->wait_layer(r->cuda, l, r->err, sizeof r->err) == KVS_OK, "%s", r->err);
        ck_assert_int_eq(
            host->load_layer(r->host, l, r->cp_ref.copies[l], r->cp_ref.n, r->err, sizeof r->err),
            KVS_OK);
    }
    /* The engine stream waited for every layer: once it is done, so are the loads. */
    GPU_CHECK(gpu_wait_stream(r->engine, 30000));
    ck_assert_msg(ops->sync(r->cuda, r->err, sizeof r->err) == KVS_OK, "%s", r->err);
    uint8_t *back = malloc(r->cache.bytes);
    ck_assert_ptr_nonnull(back);
    GPU_CHECK(cudaMemcpy(back, r->pages, r->cache.bytes, cudaMemcpyDeviceToHost));
    expect_equal(back, r->cache.buf, r->cache.bytes, "loaded page", r, method);
    free(back);
}

static int layout_has_runs(int layout) {
    return layout == KVS_TEST_LAYOUT_NHD || layout == KVS_TEST_LAYOUT_FLASHINFER ||
           layout == KVS_TEST_LAYOUT_MLA || layout == KVS_TEST_LAYOUT_CROSS_LAYER;
}

static void check_geometry(const gpu_geometry *g) {
    rig r;
    rig_open(&r, g, KVS_DEV_COPY_KERNEL);
    ck_assert_int_eq(r.info.load_uses_dma, 0);
    ck_assert_int_eq(r.info.save_uses_dma, 0);
    ck_assert_int_eq(r.info.synchronous, 0);
    save_then_load(&r, "kernel");
    rig_close(&r);

    rig_open(&r, g, KVS_DEV_COPY_DMA);
    const int dma = layout_has_runs(g->layout);
    ck_assert_int_eq(r.info.load_uses_dma, dma);
    ck_assert_int_eq(r.info.save_uses_dma, dma);
    ck_assert_uint_eq(r.info.run_bytes,
                      dma ? (uint64_t)g->block_tokens * g->n_heads * g->head_dim * g->elem_bytes
                          : 0);
    save_then_load(&r, "dma");
    rig_close(&r);
}

static const uint32_t elem_sizes[] = {1, 2, 4};

/* _i: layout _i / 3 (five engine layouts, two padded), element size _i % 3. */
START_TEST(cuda_equals_host_device_in_every_layout_both_methods) {
    gpu_geometry g = gpu_standard_geometry(_i / 3, elem_sizes[_i % 3]);
    check_geometry(&g);
}
END_TEST

START_TEST(cuda_equals_host_device_for_odd_shapes) {
    gpu_geometry odd = {KVS_TEST_LAYOUT_NHD, 2, GPU_CASE_BLOCKS, 5, 2, 3, elem_sizes[_i]};
    check_geometry(&odd);
    odd.layout = KVS_TEST_LAYOUT_HND;
    check_geometry(&odd);
    odd.layout = KVS_TEST_LAYOUT_CROSS_LAYER;
    check_geometry(&odd);
    gpu_geometry one = {KVS_TEST_LAYOUT_NHD, 2, GPU_CASE_BLOCKS, 1, 2, 8, elem_sizes[_i]};
    check_geometry(&one);
}
END_TEST

/* AUTO measures at open and picks per direction; whichever it picks moves the same bytes. */
START_TEST(auto_method_picks_a_method_that_moves_the_same_bytes) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_NHD, 2);
    rig r;
    rig_open(&r, &g, KVS_DEV_COPY_AUTO);
    ck_assert_uint_gt(r.info.run_bytes, 0);
    ck_assert_ptr_nonnull(strstr(r.info.name, "cuda:0"));
    save_then_load(&r, "auto");
    rig_close(&r);
    g = gpu_standard_geometry(KVS_TEST_LAYOUT_HND, 2);
    rig_open(&r, &g, KVS_DEV_COPY_AUTO);
    ck_assert_int_eq(r.info.load_uses_dma, 0); /* no runs: nothing to measure */
    rig_close(&r);
}
END_TEST

/* A copy that would fault the GPU is refused before anything is enqueued, and the device keeps
 * working afterwards (no sticky CUDA error). */
START_TEST(bad_copies_are_refused_and_the_device_keeps_working) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_NHD, 2);
    rig r;
    rig_open(&r, &g, KVS_DEV_COPY_KERNEL);
    kvs_dev_copy bad[GPU_CASE_COPIES];
    memcpy(bad, r.cp.copies[0], sizeof bad);
    uint32_t table[GPU_CASE_TABLE];
    memcpy(table, r.cp.tables[0], sizeof table);
    table[2] = g.n_blocks; /* used by copy 0 */
    bad[0].block_ids = table;
    ck_assert_int_eq(ops->load_layer(r.cuda, 0, bad, r.cp.n, r.err, sizeof r.err), KVS_EINVAL);
    ck_assert_msg(strstr(r.err, "block id") && strstr(r.err, "load_layer(0)"), "%s", r.err);
    ck_assert_int_eq(ops->save_layer(r.cuda, 9, r.cp.copies[0], r.cp.n, r.err, sizeof r.err),
                     KVS_EINVAL);
    ck_assert_int_eq(ops->wait_layer(r.cuda, 9, r.err, sizeof r.err), KVS_EINVAL);
    ck_assert_int_eq(ops->load_layer(r.cuda, 0, r.cp.copies[0], r.cp.n + 1, r.err, sizeof r.err),
                     KVS_EINVAL);
    /* Pageable memory the device was never told about. */
    uint8_t *pageable = malloc(r.payload_bytes);
    ck_assert_ptr_nonnull(pageable);
    gpu_copies unregistered;
    gpu_copies_build(&unregistered, &r.cache, pageable);
    ck_assert_int_eq(
        ops->save_layer(r.cuda, 0, unregistered.copies[0], unregistered.n, r.err, sizeof r.err),
        KVS_EINVAL);
    ck_assert_msg(strstr(r.err, "register_host") != NULL, "%s", r.err);
    free(pageable);
    save_then_load(&r, "kernel after refusals");
    rig_close(&r);
}
END_TEST

/* Registering twice, or memory CUDA already pinned, is fine; the latter is not unregistered by
 * close (cudaFreeHost below would fail if it were). */
START_TEST(register_host_is_idempotent_and_accepts_memory_pinned_elsewhere) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_FLASHINFER, 2);
    rig r;
    rig_open(&r, &g, KVS_DEV_COPY_KERNEL);
    ck_assert_int_eq(ops->register_host(r.cuda, r.payload, r.payload_bytes, r.err, sizeof r.err),
                     KVS_OK);
    ck_assert_int_eq(ops->register_host(r.cuda, r.payload + 64, 64, r.err, sizeof r.err), KVS_OK);
    ck_assert_int_eq(ops->register_host(r.cuda, NULL, 64, r.err, sizeof r.err), KVS_EINVAL);
    uint8_t *pinned = NULL;
    GPU_CHECK(cudaMallocHost((void **)&pinned, r.payload_bytes));
    ck_assert_msg(ops->register_host(r.cuda, pinned, r.payload_bytes, r.err, sizeof r.err) ==
                      KVS_OK,
                  "%s", r.err);
    memset(pinned, 0, r.payload_bytes);
    gpu_copies cp;
    gpu_copies_build(&cp, &r.cache, pinned);
    for (uint32_t l = 0; l < g.n_layers; l++) {
        ck_assert_msg(ops->save_layer(r.cuda, l, cp.copies[l], cp.n, r.err, sizeof r.err) == KVS_OK,
                      "%s", r.err);
        ck_assert_int_eq(kvs_host_device()->save_layer(r.host, l, r.cp_ref.copies[l], r.cp_ref.n,
                                                       r.err, sizeof r.err),
                         KVS_OK);
    }
    ck_assert_msg(ops->sync(r.cuda, r.err, sizeof r.err) == KVS_OK, "%s", r.err);
    expect_equal(pinned, r.expected, r.payload_bytes, "payload in cudaMallocHost memory", &r,
                 "kernel");
    rig_close(&r);
    GPU_CHECK(cudaFreeHost(pinned));
}
END_TEST

START_TEST(open_refuses_views_that_are_not_this_devices_memory) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_NHD, 2);
    gpu_cache c;
    ck_assert_int_eq(gpu_cache_alloc(&c, &g), 0);
    kvs_layer_view views[GPU_MAX_LAYERS];
    gpu_cache_rebase(&c, c.buf, KVS_DEVICE_CUDA, 0, views); /* host memory claimed as CUDA */
    kvs_device_init init = {.struct_size = sizeof init,
                            .views = views,
                            .n_layers = g.n_layers,
                            .shape = c.shape,
                            .max_tokens_per_layer = 64,
                            .max_copies_per_layer = 4,
                            .method = KVS_DEV_COPY_KERNEL,
                            .log_level = KVS_LOG_WARN};
    void *state = (void *)1;
    char err[512] = "";
    ck_assert_int_eq(ops->open(&init, &state, NULL, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_null(state);
    ck_assert_msg(strstr(err, "not memory of this device") != NULL, "%s", err);
    views[1].device_kind = KVS_DEVICE_HOST;
    ck_assert_int_eq(ops->open(&init, &state, NULL, err, sizeof err), KVS_EINVAL);
    ck_assert_msg(strstr(err, "layer 1") != NULL, "%s", err);
    views[1].device_kind = KVS_DEVICE_CUDA;
    views[0].device_index = 4096;
    views[1].device_index = views[2].device_index = 4096;
    ck_assert_int_eq(ops->open(&init, &state, NULL, err, sizeof err), KVS_EINVAL);
    init.max_copies_per_layer = 0;
    ck_assert_int_eq(ops->open(&init, &state, NULL, err, sizeof err), KVS_EINVAL);
    gpu_cache_free(&c);
}
END_TEST

/* _i: 0 kernel, 1 copy engines. The engine stream is kept busy for 50 ms before it rewrites the
 * pages, so a save that did not wait for it would read the old bytes. */
START_TEST(save_waits_for_what_the_engine_stream_wrote_before_it) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_NHD, 2);
    rig r;
    rig_open(&r, &g, _i ? KVS_DEV_COPY_DMA : KVS_DEV_COPY_KERNEL);
    uint8_t *fresh = NULL;
    GPU_CHECK(cudaMalloc((void **)&fresh, r.cache.bytes));
    gpu_fill(r.cache.buf, r.cache.bytes, 9); /* the host mirror gets the new bytes at once */
    GPU_CHECK(cudaMemcpy(fresh, r.cache.buf, r.cache.bytes, cudaMemcpyHostToDevice));
    GPU_CHECK(gpu_spin_kernel(50ull * 1000 * 1000, r.engine));
    GPU_CHECK(gpu_copy_kernel(r.pages, fresh, r.cache.bytes, r.engine));
    for (uint32_t l = 0; l < g.n_layers; l++) {
        ck_assert_msg(ops->save_layer(r.cuda, l, r.cp.copies[l], r.cp.n, r.err, sizeof r.err) ==
                          KVS_OK,
                      "%s", r.err);
        ck_assert_int_eq(kvs_host_device()->save_layer(r.host, l, r.cp_ref.copies[l], r.cp_ref.n,
                                                       r.err, sizeof r.err),
                         KVS_OK);
    }
    ck_assert_msg(ops->sync(r.cuda, r.err, sizeof r.err) == KVS_OK, "%s", r.err);
    expect_equal(r.payload, r.expected, r.payload_bytes, "payload saved after the engine's write",
                 &r, _i ? "dma" : "kernel");
    GPU_CHECK(gpu_wait_stream(r.engine, 30000));
    GPU_CHECK(cudaFree(fresh));
    rig_close(&r);
}
END_TEST

/* The engine stream, busy for 50 ms, then reads every page into a snapshot; the loads enqueued
 * after that must not land before the snapshot is taken. _i: 0 kernel, 1 copy engines. */
START_TEST(first_load_of_a_step_waits_for_the_engine_stream) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_NHD, 2);
    rig r;
    rig_open(&r, &g, _i ? KVS_DEV_COPY_DMA : KVS_DEV_COPY_KERNEL);
    uint8_t *snapshot = NULL, *back = malloc(r.cache.bytes);
    ck_assert_ptr_nonnull(back);
    GPU_CHECK(cudaMalloc((void **)&snapshot, r.cache.bytes));
    GPU_CHECK(gpu_spin_kernel(50ull * 1000 * 1000, r.engine));
    GPU_CHECK(gpu_copy_kernel(snapshot, r.pages, r.cache.bytes, r.engine));
    gpu_fill(r.payload, r.payload_bytes, 11);
    for (uint32_t l = 0; l < g.n_layers; l++) {
        ck_assert_msg(ops->load_layer(r.cuda, l, r.cp.copies[l], r.cp.n, r.err, sizeof r.err) ==
                          KVS_OK,
                      "%s", r.err);
        ck_assert_int_eq(ops->wait_layer(r.cuda, l, r.err, sizeof r.err), KVS_OK);
    }
    GPU_CHECK(gpu_wait_stream(r.engine, 30000));
    ck_assert_msg(ops->sync(r.cuda, r.err, sizeof r.err) == KVS_OK, "%s", r.err);
    GPU_CHECK(cudaMemcpy(back, snapshot, r.cache.bytes, cudaMemcpyDeviceToHost));
    expect_equal(back, r.cache.buf, r.cache.bytes, "page read by the engine before the load", &r,
                 _i ? "dma" : "kernel");
    GPU_CHECK(cudaFree(snapshot));
    free(back);
    rig_close(&r);
}
END_TEST

static Suite *device_suite(void) {
    Suite *s = suite_create("cuda_device");
    TCase *t = tcase_create("device");
    tcase_set_timeout(t, 600);
    tcase_add_loop_test(t, cuda_equals_host_device_in_every_layout_both_methods, 0,
                        GPU_LAYOUT_COUNT * 3);
    tcase_add_loop_test(t, cuda_equals_host_device_for_odd_shapes, 0, 3);
    tcase_add_test(t, auto_method_picks_a_method_that_moves_the_same_bytes);
    tcase_add_test(t, bad_copies_are_refused_and_the_device_keeps_working);
    tcase_add_test(t, register_host_is_idempotent_and_accepts_memory_pinned_elsewhere);
    tcase_add_test(t, open_refuses_views_that_are_not_this_devices_memory);
    tcase_add_loop_test(t, save_waits_for_what_the_engine_stream_wrote_before_it, 0, 2);
    tcase_add_loop_test(t, first_load_of_a_step_waits_for_the_engine_stream, 0, 2);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    gpu_require_device("test_cuda_device");
    ops = gpu_load_module();
    SRunner *r = srunner_create(device_suite());
    srunner_set_fork_status(r, CK_NOFORK); /* CUDA is initialised in this process */
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
