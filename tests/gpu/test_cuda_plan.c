/* test_cuda_plan.c - the CUDA device's host-side arithmetic (kernels/cuda/copy_plan.c) on the
 * CPU, no GPU needed: the copy kernel's row addressing (the same inline function the kernel runs)
 * and the copy-engine runs are executed with memcpy on host "pages" and must produce the bytes of
 * the host reference (kvs_kernel_move_layer_kv), for every layout, element size and awkward copy.
 * Every address the emulated kernel touches is checked against the unit width it chose, so a
 * wrong alignment decision fails here instead of as a misaligned access on a GPU. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_cases.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/copy_plan.h"

/* --- the two emulated methods ----------------------------------------------------------------- */

static void reference_move(const gpu_cache *c, const gpu_copies *cp, int to_pages) {
    for (uint32_t l = 0; l < c->g.n_layers; l++)
        for (uint32_t i = 0; i < cp->n; i++) {
            const kvs_dev_copy *d = &cp->copies[l][i];
            kvs_token_span span = {d->block_ids, d->n_block_ids, d->first_token, d->n_tokens};
            kvs_kernel_move_layer_kv(&c->views[l], &c->shape, &span, d->k_payload, d->v_payload,
                                     to_pages);
        }
}

/* What one launch of the copy kernel does, thread by thread in sequence: same descriptor block,
 * same row location, same unit walk. Returns the unit width used for layer 0. */
static uint32_t emulate_kernel(const gpu_cache *c, const gpu_copies *cp, int to_pages) {
    uint32_t unit0 = 0;
    for (uint32_t l = 0; l < c->g.n_layers; l++) {
        kvs_cuda_layer layer;
        kvs_cuda_layer_from_view(&c->views[l], &c->shape, &layer);
        char err[256] = "";
        uint64_t n_tokens = 0;
        ck_assert_msg(kvs_cuda_check_copies(&layer, l, "test", cp->copies[l], cp->n, &n_tokens, err,
                                            sizeof err) == KVS_OK,
                      "%s", err);
        ck_assert_uint_eq(n_tokens, cp->tokens);
        const uint64_t max_ids = kvs_cuda_max_blocks_touched(cp->n, n_tokens, layer.block_tokens);
        const uint64_t block_bytes = kvs_cuda_desc_block_bytes(cp->n, max_ids);
        uint64_t *block = malloc(block_bytes); /* uint64_t: the alignment the device buffer has */
        ck_assert_ptr_nonnull(block);
        kvs_cuda_packed packed;
        ck_assert_msg(kvs_cuda_pack(&layer, cp->copies[l], cp->n, NULL, NULL, block, block_bytes,
                                    &packed, err, sizeof err) == KVS_OK,
                      "%s", err);
        ck_assert_uint_eq(packed.n_tokens, n_tokens);
        ck_assert_uint_le(packed.n_ids, max_ids);
        ck_assert_uint_eq(packed.ids_offset % 8, 0);
        const kvs_cuda_copy_desc *descs = (const kvs_cuda_copy_desc *)block;
        const uint32_t *ids =
            (const uint32_t *)(const void *)((const char *)block + packed.ids_offset);
        const uint32_t unit =
            kvs_cuda_unit_bytes(kvs_cuda_layer_align_bits(&layer) | packed.align_bits);
        if (l == 0) unit0 = unit;
        const uint32_t head_units = layer.head_bytes / unit;
        const uint32_t row_units = head_units * layer.n_heads;
        ck_assert_uint_eq(head_units * unit, layer.head_bytes);
        for (uint64_t row = 0; row < packed.n_tokens * layer.n_parts; row++) {
            uint64_t page = 0, payload = 0;
            kvs_cuda_locate_row(&layer, descs, packed.n_copies, ids, packed.n_tokens, row, &page,
                                &payload);
            for (uint32_t i = 0; i < row_units; i++) {
                const uint32_t head = i / head_units, u = i - head * head_units;
                char *cell = layer.heads_contiguous
                                 ? (char *)(uintptr_t)page + (uint64_t)i * unit
                                 : (char *)(uintptr_t)(page + head * (uint64_t)layer.head_stride) +
                                       (uint64_t)u * unit;
                char *pay = (char *)(uintptr_t)payload + (uint64_t)i * unit;
                ck_assert_msg((uintptr_t)cell % unit == 0 && (uintptr_t)pay % unit == 0,
                              "row %llu unit %u: page %p or payload %p is not %u-byte aligned",
                              (unsigned long long)row, i, (void *)cell, (void *)pay, unit);
                if (to_pages)
                    memcpy(cell, pay, unit);
                else
                    memcpy(pay, cell, unit);
            }
        }
        free(block);
    }
    return unit0;
}

/* What the copy engines do: every run of every layer. Returns the runs of layer 0. */
static uint64_t emulate_dma(const gpu_cache *c, const gpu_copies *cp, int to_pages) {
    uint64_t runs0 = 0;
    for (uint32_t l = 0; l < c->g.n_layers; l++) {
        kvs_cuda_layer layer;
        kvs_cuda_layer_from_view(&c->views[l], &c->shape, &layer);
        const uint64_t cap =
            layer.n_parts * kvs_cuda_max_blocks_touched(cp->n, cp->tokens, layer.block_tokens);
        kvs_cuda_runs runs = {malloc(cap * sizeof(void *)), malloc(cap * sizeof(void *)),
                              malloc(cap * sizeof(size_t)), 0, cap};
        ck_assert(runs.dst && runs.src && runs.bytes);
        char err[256] = "";
        ck_assert_msg(kvs_cuda_plan_runs(&layer, cp->copies[l], cp->n, to_pages, &runs, err,
                                         sizeof err) == KVS_OK,
                      "%s", err);
        for (uint64_t r = 0; r < runs.n; r++) {
            ck_assert_uint_gt(runs.bytes[r], 0);
            memcpy(runs.dst[r], runs.src[r], runs.bytes[r]);
        }
        if (l == 0) runs0 = runs.n;
        free(runs.dst);
        free((void *)runs.src);
        free(runs.bytes);
    }
    return runs0;
}

/* --- comparing against the reference ---------------------------------------------------------- */

enum method { KERNEL, DMA };

static void first_difference(const uint8_t *got, const uint8_t *want, size_t n, const char *what,
                             const gpu_geometry *g, int method) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            ck_abort_msg("%s %s elem %u bt %u: %s byte %zu is %u, reference %u",
                         method == KERNEL ? "kernel" : "dma", gpu_layout_name(g->layout),
                         g->elem_bytes, g->block_tokens, what, i, got[i], want[i]);
}

/* Gather (pages -> payload) and scatter (payload -> pages) by `method` against the reference. The
 * whole payload and the whole cache are compared, so bytes written where they should not be show. */
static void compare_both_directions(const gpu_geometry *g, int method) {
    gpu_cache c;
    ck_assert_int_eq(gpu_cache_alloc(&c, g), 0);
    const uint64_t payload_bytes = gpu_copies_payload_bytes(&c);
    uint8_t *payload = calloc(payload_bytes, 1), *expected = calloc(payload_bytes, 1);
    uint8_t *pages_expected = malloc(c.bytes);
    ck_assert(payload && expected && pages_expected);
    gpu_copies cp_ref, cp;
    gpu_copies_build(&cp_ref, &c, expected);
    gpu_copies_build(&cp, &c, payload);

    /* save */
    gpu_fill(c.buf, c.bytes, 1);
    reference_move(&c, &cp_ref, 0);
    if (method == KERNEL)
        emulate_kernel(&c, &cp, 0);
    else
        emulate_dma(&c, &cp, 0);
    first_difference(payload, expected, payload_bytes, "payload", g, method);

    /* load: the same pages, scattered into by the reference and by the method */
    gpu_fill(payload, payload_bytes, 2);
    gpu_fill(c.buf, c.bytes, 3);
    reference_move(&c, &cp, 1);
    memcpy(pages_expected, c.buf, c.bytes);
    gpu_fill(c.buf, c.bytes, 3);
    if (method == KERNEL)
        emulate_kernel(&c, &cp, 1);
    else
        emulate_dma(&c, &cp, 1);
    first_difference(c.buf, pages_expected, c.bytes, "page", g, method);

    free(pages_expected);
    free(expected);
    free(payload);
    gpu_cache_free(&c);
}

static const uint32_t elem_sizes[] = {1, 2, 4};

/* _i: layout _i / 3 (the five engine layouts and two padded ones), element size _i % 3. */
START_TEST(kernel_addressing_matches_the_host_reference_in_every_layout) {
    gpu_geometry g = gpu_standard_geometry(_i / 3, elem_sizes[_i % 3]);
    compare_both_directions(&g, KERNEL);
}
END_TEST

START_TEST(copy_engine_runs_match_the_host_reference_where_the_layout_has_runs) {
    gpu_geometry g = gpu_standard_geometry(_i / 3, elem_sizes[_i % 3]);
    gpu_cache c;
    ck_assert_int_eq(gpu_cache_alloc(&c, &g), 0);
    kvs_cuda_layer layer;
    kvs_cuda_layer_from_view(&c.views[0], &c.shape, &layer);
    const uint64_t run = kvs_cuda_run_bytes(&layer);
    gpu_cache_free(&c);
    const int has_runs = g.layout == KVS_TEST_LAYOUT_NHD ||
                         g.layout == KVS_TEST_LAYOUT_FLASHINFER ||
                         g.layout == KVS_TEST_LAYOUT_MLA || g.layout == KVS_TEST_LAYOUT_CROSS_LAYER;
    ck_assert_msg((run != 0) == has_runs, "%s: run bytes %llu", gpu_layout_name(g.layout),
                  (unsigned long long)run);
    if (!has_runs) return;
    ck_assert_uint_eq(run, (uint64_t)g.block_tokens * g.n_heads * g.head_dim * g.elem_bytes);
    compare_both_directions(&g, DMA);
}
END_TEST

/* Heads of 3, 6 and 12 bytes over 5-token blocks: byte, 2-byte and 4-byte units. */
START_TEST(odd_shapes_use_narrow_units_and_still_match) {
    static const int layouts[] = {KVS_TEST_LAYOUT_NHD, KVS_TEST_LAYOUT_HND,
                                  GPU_LAYOUT_PADDED_TOKENS, KVS_TEST_LAYOUT_CROSS_LAYER};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        gpu_geometry g = {layouts[k], 2, GPU_CASE_BLOCKS, 5, 2, 3, elem_sizes[_i]};
        compare_both_directions(&g, KERNEL);
        if (layouts[k] == KVS_TEST_LAYOUT_NHD || layouts[k] == KVS_TEST_LAYOUT_CROSS_LAYER)
            compare_both_directions(&g, DMA);
        gpu_cache c;
        ck_assert_int_eq(gpu_cache_alloc(&c, &g), 0);
        uint8_t *payload = calloc(gpu_copies_payload_bytes(&c), 1);
        gpu_copies cp;
        gpu_copies_build(&cp, &c, payload);
        const uint32_t want = elem_sizes[_i] == 1 ? 1 : elem_sizes[_i] == 2 ? 2 : 4;
        ck_assert_uint_eq(emulate_kernel(&c, &cp, 0), want);
        free(payload);
        gpu_cache_free(&c);
    }
}
END_TEST

START_TEST(one_token_blocks_match) {
    gpu_geometry g = {KVS_TEST_LAYOUT_NHD, 2, GPU_CASE_BLOCKS, 1, 2, 8, 2};
    compare_both_directions(&g, KERNEL);
    compare_both_directions(&g, DMA);
    g.layout = KVS_TEST_LAYOUT_HND;
    compare_both_directions(&g, KERNEL);
}
END_TEST

/* 16-byte units need every address 16-aligned: a payload pointer off by 2 drops the unit to 2. */
START_TEST(a_misaligned_payload_narrows_the_unit) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_NHD, 2);
    gpu_cache c;
    ck_assert_int_eq(gpu_cache_alloc(&c, &g), 0);
    const uint64_t bytes = gpu_copies_payload_bytes(&c);
    uint8_t *payload = calloc(bytes + 2, 1);
    gpu_copies cp;
    gpu_copies_build(&cp, &c, payload);
    ck_assert_uint_eq(emulate_kernel(&c, &cp, 0), 16);
    gpu_copies_build(&cp, &c, payload + 2);
    ck_assert_uint_eq(emulate_kernel(&c, &cp, 0), 2);
    free(payload);
    gpu_cache_free(&c);
}
END_TEST

/* NHD: K pages of adjacent blocks touch, and the chunk's two copies continue each other in both
 * the pages and the payload, so the chunk is one run per part. FlashInfer interleaves K and V
 * pages, so adjacent blocks do not touch: one run per block. */
START_TEST(runs_merge_across_adjacent_blocks_and_copies) {
    static const struct {
        int layout;
        uint64_t runs;
    } cases[] = {{KVS_TEST_LAYOUT_NHD, 2 * (4 + 1 + 3 + 1)},
                 {KVS_TEST_LAYOUT_FLASHINFER, 2 * (4 + 1 + 3 + 2)},
                 {KVS_TEST_LAYOUT_MLA, 4 + 1 + 3 + 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        gpu_geometry g = gpu_standard_geometry(cases[k].layout, 2);
        gpu_cache c;
        ck_assert_int_eq(gpu_cache_alloc(&c, &g), 0);
        uint8_t *payload = calloc(gpu_copies_payload_bytes(&c), 1);
        gpu_copies cp;
        gpu_copies_build(&cp, &c, payload);
        ck_assert_uint_eq(emulate_dma(&c, &cp, 0), cases[k].runs);
        ck_assert_uint_eq(emulate_dma(&c, &cp, 1), cases[k].runs);
        free(payload);
        gpu_cache_free(&c);
    }
}
END_TEST

/* --- refusals --------------------------------------------------------------------------------- */

static void expect_refused(const kvs_cuda_layer *layer, const kvs_dev_copy *copy, const char *a,
                           const char *b) {
    char err[256] = "";
    ck_assert_int_eq(kvs_cuda_check_copies(layer, 7, "load_layer", copy, 1, NULL, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_msg(strstr(err, "load_layer(7)") && strstr(err, a) && (!b || strstr(err, b)),
                  "\"%s\" does not name \"%s\"", err, a);
}

START_TEST(check_copies_refuses_what_would_fault_a_gpu) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_NHD, 2);
    gpu_cache c;
    ck_assert_int_eq(gpu_cache_alloc(&c, &g), 0);
    kvs_cuda_layer layer;
    kvs_cuda_layer_from_view(&c.views[0], &c.shape, &layer);
    uint32_t table[4] = {1, 2, GPU_CASE_BLOCKS, 3};
    char payload[8];
    kvs_dev_copy copy = {table, 4, 0, 32, payload, payload + 1, NULL, NULL, NULL};
    char err[256] = "";
    ck_assert_int_eq(kvs_cuda_check_copies(&layer, 0, "x", &copy, 1, NULL, err, sizeof err),
                     KVS_OK);
    copy.n_tokens = 33; /* reaches table[2] */
    expect_refused(&layer, &copy, "block id 32 at table index 2", "32 blocks");
    copy.first_token = 40;
    copy.n_tokens = 30; /* tokens 40..69 need 5 table entries */
    expect_refused(&layer, &copy, "block table has 4 ids", "need 5");
    copy.first_token = UINT64_MAX - 3;
    copy.n_tokens = 10;
    expect_refused(&layer, &copy, "overflows", NULL);
    copy.first_token = 0;
    copy.n_tokens = 4;
    copy.v_payload = NULL;
    expect_refused(&layer, &copy, "v_payload is NULL", NULL);
    copy.block_ids = NULL;
    expect_refused(&layer, &copy, "block_ids is NULL", NULL);
    /* An empty copy is skipped whatever it holds. */
    kvs_dev_copy empty = {NULL, 0, 0, 0, NULL, NULL, NULL, NULL, NULL};
    uint64_t n_tokens = 99;
    ck_assert_int_eq(kvs_cuda_check_copies(&layer, 0, "x", &empty, 1, &n_tokens, err, sizeof err),
                     KVS_OK);
    ck_assert_uint_eq(n_tokens, 0);
    gpu_cache_free(&c);
}
END_TEST

START_TEST(pack_and_plan_refuse_to_overflow_their_buffers) {
    gpu_geometry g = gpu_standard_geometry(KVS_TEST_LAYOUT_NHD, 2);
    gpu_cache c;
    ck_assert_int_eq(gpu_cache_alloc(&c, &g), 0);
    uint8_t *payload = calloc(gpu_copies_payload_bytes(&c), 1);
    gpu_copies cp;
    gpu_copies_build(&cp, &c, payload);
    kvs_cuda_layer layer;
    kvs_cuda_layer_from_view(&c.views[0], &c.shape, &layer);
    uint64_t block[64];
    kvs_cuda_packed packed;
    char err[256] = "";
    ck_assert_int_eq(
        kvs_cuda_pack(&layer, cp.copies[0], cp.n, NULL, NULL, block, 100, &packed, err, sizeof err),
        KVS_EOVERFLOW);
    ck_assert_ptr_nonnull(strstr(err, "descriptor block"));
    void *dst[3];
    const void *src[3];
    size_t bytes[3];
    kvs_cuda_runs runs = {dst, src, bytes, 0, 3};
    ck_assert_int_eq(kvs_cuda_plan_runs(&layer, cp.copies[0], cp.n, 1, &runs, err, sizeof err),
                     KVS_EOVERFLOW);
    ck_assert_ptr_nonnull(strstr(err, "contiguous runs"));
    free(payload);
    gpu_cache_free(&c);
}
END_TEST

/* --- properties ------------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Random copies: the blocks they touch never exceed the bound open sizes buffers with, and every
 * token finds the copy holding it. */
START_TEST(blocks_touched_stay_within_the_bound_and_every_token_finds_its_copy) {
    uint64_t seed = 42;
    for (int round = 0; round < 2000; round++) {
        const uint32_t bt = 1 + (uint32_t)(mix(seed++) % 32);
        const uint32_t n = 1 + (uint32_t)(mix(seed++) % 12);
        kvs_cuda_copy_desc descs[12];
        uint64_t touched = 0, tokens = 0;
        for (uint32_t i = 0; i < n; i++) {
            const uint64_t first = mix(seed++) % 1000;
            const uint32_t count = 1 + (uint32_t)(mix(seed++) % 300);
            touched += (first + count - 1) / bt - first / bt + 1;
            descs[i].row_begin = tokens;
            tokens += count;
        }
        ck_assert_uint_le(touched, kvs_cuda_max_blocks_touched(n, tokens, bt));
        for (uint32_t i = 0; i < n; i++) {
            const uint64_t end = i + 1 < n ? descs[i + 1].row_begin : tokens;
            ck_assert_uint_eq(kvs_cuda_find_copy(descs, n, descs[i].row_begin), i);
            ck_assert_uint_eq(kvs_cuda_find_copy(descs, n, end - 1), i);
        }
    }
}
END_TEST

START_TEST(unit_bytes_is_the_widest_power_of_two_dividing_every_address) {
    ck_assert_uint_eq(kvs_cuda_unit_bytes(0), 16);
    ck_assert_uint_eq(kvs_cuda_unit_bytes(0x1000 | 48), 16);
    ck_assert_uint_eq(kvs_cuda_unit_bytes(24), 8);
    ck_assert_uint_eq(kvs_cuda_unit_bytes(12), 4);
    ck_assert_uint_eq(kvs_cuda_unit_bytes(6), 2);
    ck_assert_uint_eq(kvs_cuda_unit_bytes(3), 1);
}
END_TEST

static Suite *plan_suite(void) {
    Suite *s = suite_create("cuda_plan");
    TCase *t = tcase_create("plan");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, kernel_addressing_matches_the_host_reference_in_every_layout, 0,
                        GPU_LAYOUT_COUNT * 3);
    tcase_add_loop_test(t, copy_engine_runs_match_the_host_reference_where_the_layout_has_runs, 0,
                        GPU_LAYOUT_COUNT * 3);
    tcase_add_loop_test(t, odd_shapes_use_narrow_units_and_still_match, 0, 3);
    tcase_add_test(t, one_token_blocks_match);
    tcase_add_test(t, a_misaligned_payload_narrows_the_unit);
    tcase_add_test(t, runs_merge_across_adjacent_blocks_and_copies);
    tcase_add_test(t, check_copies_refuses_what_would_fault_a_gpu);
    tcase_add_test(t, pack_and_plan_refuse_to_overflow_their_buffers);
    tcase_add_test(t, blocks_touched_stay_within_the_bound_and_every_token_finds_its_copy);
    tcase_add_test(t, unit_bytes_is_the_widest_power_of_two_dividing_every_address);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    SRunner *r = srunner_create(plan_suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
