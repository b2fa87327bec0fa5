/* test_cuda_module.c - the CUDA module as the connector loads it, on any machine: it dlopens
 * without a GPU or even a driver (the CUDA runtime is linked in statically), answers only its own
 * device ABI version, refuses bad open arguments with a sentence before touching CUDA, and without
 * a usable GPU fails open with KVS_EIO and the reason instead of crashing. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "abi/kvstrata_backend.h" /* KVS_LOG_* */
#include "gpu_support.h"

static const kvs_device_ops *ops;
static char fake_pages[4096]; /* never dereferenced: open refuses before any copy */

static kvs_device_init good_init(kvs_layer_view *views) {
    for (int l = 0; l < 2; l++)
        views[l] = (kvs_layer_view){.struct_size = sizeof(kvs_layer_view),
                                    .device_kind = KVS_DEVICE_CUDA,
                                    .device_index = 0,
                                    .n_blocks = 4,
                                    .k_base = fake_pages + 1024 * l,
                                    .v_base = fake_pages + 1024 * l + 512,
                                    .block_stride = 128,
                                    .token_stride = 32,
                                    .head_stride = 16};
    return (kvs_device_init){.struct_size = sizeof(kvs_device_init),
                             .views = views,
                             .n_layers = 2,
                             .shape = {2, 16, 4, 1},
                             .max_tokens_per_layer = 16,
                             .max_copies_per_layer = 2,
                             .method = KVS_DEV_COPY_AUTO,
                             .log_level = KVS_LOG_ERROR};
}

static void expect_refused(const kvs_device_init *init, const char *fragment) {
    void *state = (void *)1;
    char err[512] = "";
    ck_assert_int_eq(ops->open(init, &state, NULL, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_null(state);
    ck_assert_msg(strstr(err, fragment) != NULL, "\"%s\" does not mention \"%s\"", err, fragment);
}

START_TEST(the_module_answers_only_its_own_version) {
    ck_assert_str_eq(ops->name, "cuda");
    ck_assert_uint_eq(ops->version, KVS_DEVICE_ABI_VERSION);
}
END_TEST

START_TEST(open_refuses_bad_arguments_with_a_sentence) {
    kvs_layer_view views[2];
    kvs_device_init init = good_init(views);
    expect_refused(NULL, "init is NULL");
    init.struct_size = 8;
    expect_refused(&init, "struct_size");
    init = good_init(views);
    init.max_copies_per_layer = 0;
    expect_refused(&init, "max_copies_per_layer (0)");
    init = good_init(views);
    views[1].device_kind = KVS_DEVICE_HOST;
    expect_refused(&init, "layer 1 is not a CUDA view");
    init = good_init(views);
    views[1].device_index = 3;
    expect_refused(&init, "layer 1 is on another device");
    init = good_init(views);
    views[0].v_base = NULL;
    expect_refused(&init, "no v_base");
    init = good_init(views);
    views[0].token_stride = -32;
    expect_refused(&init, "negative stride");
}
END_TEST

/* Without a GPU: KVS_EIO naming the CUDA error. With one: the fake host pointers are refused. */
START_TEST(open_fails_cleanly_when_no_gpu_can_take_the_views) {
    kvs_layer_view views[2];
    kvs_device_init init = good_init(views);
    void *state = (void *)1;
    char err[512] = "";
    int count = 0;
    const int have_gpu = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    kvs_status st = ops->open(&init, &state, NULL, err, sizeof err);
    ck_assert_ptr_null(state);
    if (have_gpu) {
        ck_assert_int_eq(st, KVS_EINVAL);
        ck_assert_msg(strstr(err, "not memory of this device") != NULL, "%s", err);
    } else {
        ck_assert_int_eq(st, KVS_EIO);
        ck_assert_msg(strstr(err, "no usable CUDA device") != NULL, "%s", err);
    }
}
END_TEST

/* The memory table (device ABI 3) the peer_gpu tier and its lender use: there on any machine;
 * without a GPU every call says why; with one, a handle nobody exported does not open, and an
 * allocation exports, fills and copies back. */
START_TEST(the_memory_table_answers_with_or_without_a_gpu) {
    const kvs_device_mem_ops *mem = ops->mem;
    ck_assert_ptr_nonnull(mem);
    char err[512] = "";
    int n = -1;
    kvs_status st = mem->count(&n, err, sizeof err);
    int cuda_count = 0;
    const int have_gpu = cudaGetDeviceCount(&cuda_count) == cudaSuccess && cuda_count > 0;
    if (!have_gpu) {
        ck_assert_int_eq(st, KVS_ENOTFOUND);
        ck_assert_int_eq(n, 0);
        ck_assert_msg(strstr(err, "cuda") != NULL, "%s", err);
        void *p = (void *)1;
        ck_assert_int_ne(mem->alloc(0, 4096, &p, err, sizeof err), KVS_OK);
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(err, "cuda:0: alloc") != NULL, "%s", err);
        return;
    }
    ck_assert_int_eq(st, KVS_OK);
    ck_assert_int_eq(n, cuda_count);
    uint8_t zero[KVS_DEVICE_IPC_HANDLE_BYTES] = {0}, handle[KVS_DEVICE_IPC_HANDLE_BYTES];
    void *p = (void *)1;
    uint64_t span = 7;
    ck_assert_int_ne(mem->open_handle(0, zero, &p, &span, err, sizeof err), KVS_OK);
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(span, 0);
    uint8_t u1[KVS_DEVICE_UUID_BYTES], u2[KVS_DEVICE_UUID_BYTES];
    ck_assert_int_eq(mem->uuid(0, u1, err, sizeof err), KVS_OK);
    ck_assert_int_eq(mem->uuid(0, u2, err, sizeof err), KVS_OK);
    ck_assert_mem_eq(u1, u2, sizeof u1);
    ck_assert_int_ne(mem->uuid(cuda_count, u1, err, sizeof err), KVS_OK); /* past the last */
    ck_assert_msg(strstr(err, "cudaIpcOpenMemHandle") != NULL, "%s", err);
    ck_assert_int_eq(mem->alloc(0, 1 << 20, &p, err, sizeof err), KVS_OK);
    ck_assert_int_eq(mem->export_handle(0, p, handle, err, sizeof err), KVS_OK);
    ck_assert_int_eq(mem->fill(0, p, 0xa5, 1 << 20, err, sizeof err), KVS_OK);
    uint8_t *back = NULL;
    ck_assert_int_eq(mem->host_alloc(1 << 20, (void **)&back, err, sizeof err), KVS_OK);
    ck_assert_int_eq(mem->copy(0, back, p, 1 << 20, err, sizeof err), KVS_OK);
    for (size_t i = 0; i < (1 << 20); i += 4093) ck_assert_uint_eq(back[i], 0xa5);
    /* the calling thread keeps its own current device */
    int before = -1, after = -2;
    ck_assert_int_eq(cudaGetDevice(&before), cudaSuccess);
    ck_assert_int_eq(mem->copy(cuda_count - 1, back, p, 0, err, sizeof err), KVS_OK);
    ck_assert_int_eq(cudaGetDevice(&after), cudaSuccess);
    ck_assert_int_eq(before, after);
    mem->host_release(back);
    mem->release(0, p);
}
END_TEST

static Suite *module_suite(void) {
    Suite *s = suite_create("cuda_module");
    TCase *t = tcase_create("module");
    tcase_add_test(t, the_module_answers_only_its_own_version);
    tcase_add_test(t, open_refuses_bad_arguments_with_a_sentence);
    tcase_add_test(t, open_fails_cleanly_when_no_gpu_can_take_the_views);
    tcase_add_test(t, the_memory_table_answers_with_or_without_a_gpu);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    ops = gpu_load_module();
    SRunner *r = srunner_create(module_suite());
    srunner_set_fork_status(r, CK_NOFORK); /* CUDA may be initialised in this process */
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
