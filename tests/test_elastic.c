/* test_elastic.c - SwiftCache's sizing, exchange unit, Alg. 1 and pool layouts (schedulers/elastic/)
 * against the paper's worked example and golden values derived from its formulas
 * (SwiftCache's §1.2-1.7, §4.4). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "schedulers/elastic/elastic.h"
#include "schedulers/elastic/elastic_pool.h"

/* fp16, 16-token blocks */
static const kvs_el_model LWM = {32, 16, 32, 128, 2, 2};
static const kvs_el_model QWEN8 = {36, 16, 8, 128, 2, 2};
static const kvs_el_model QWEN14 = {40, 16, 8, 128, 2, 2};
static const kvs_el_model QWEN32 = {64, 16, 8, 128, 2, 2};

START_TEST(block_bytes_follow_eq_1) {
    ck_assert_uint_eq(kvs_el_layer_block_bytes(&LWM), 262144);
    ck_assert_uint_eq(kvs_el_layer_block_bytes(&QWEN8), 65536);
    ck_assert_uint_eq(kvs_el_layer_block_bytes(&QWEN14), 65536);
    ck_assert_uint_eq(kvs_el_layer_block_bytes(&QWEN32), 65536);
    /* per token, every layer: the paper's table 2 */
    ck_assert_uint_eq(kvs_el_block_bytes(&LWM) / 16, 524288);
    ck_assert_uint_eq(kvs_el_block_bytes(&QWEN8) / 16, 147456);
    ck_assert_uint_eq(kvs_el_block_bytes(&QWEN14) / 16, 163840);
    ck_assert_uint_eq(kvs_el_block_bytes(&QWEN32) / 16, 262144);
    kvs_el_model zero = LWM, huge = LWM;
    zero.head_dim = 0;
    huge.kv_heads = UINT32_MAX, huge.head_dim = UINT32_MAX, huge.block_tokens = UINT32_MAX;
    ck_assert_uint_eq(kvs_el_layer_block_bytes(&zero), 0);
    ck_assert_uint_eq(kvs_el_layer_block_bytes(&huge), 0); /* overflow */
}
END_TEST

/* A model whose single-layer block is `bytes` bytes and has L layers (1 plane, 1 head, dim 1). */
static kvs_el_model unit_model(uint32_t layers, uint32_t bytes) {
    return (kvs_el_model){layers, 1, 1, bytes, 1, 1};
}

START_TEST(the_papers_example_gives_25_blocks_against_10) {
    /* L = 10, K_master = 100 single-layer blocks, workers lending 9 and 8 whole blocks */
    kvs_el_model m = unit_model(10, 64);
    uint64_t workers[2] = {9 * 640 + 639, 8 * 640}, k[2];
    kvs_el_capacity c;
    ck_assert_int_eq(kvs_el_plan_capacity(&m, 100 * 64 + 63, workers, 2, 1, k, &c), KVS_OK);
    ck_assert_uint_eq(k[0], 9);
    ck_assert_uint_eq(k[1], 8);
    ck_assert_uint_eq(c.k_master, 100);
    ck_assert_uint_eq(c.k_workers, 17);
    ck_assert_uint_eq(c.n_lsc, 17);
    ck_assert_uint_eq(c.n_rc, 8); /* floor(83 / 10) */
    ck_assert_uint_eq(c.max_tokens, 25);
    ck_assert_uint_eq(c.max_tokens_without_lsc, 10);
    /* saturated: the LSC can never exceed the master's own memory */
    uint64_t big[2] = {60 * 640, 70 * 640};
    ck_assert_int_eq(kvs_el_plan_capacity(&m, 100 * 64, big, 2, 1, NULL, &c), KVS_OK);
    ck_assert_uint_eq(c.n_lsc, 100);
    ck_assert_uint_eq(c.n_rc, 0);
    ck_assert_uint_eq(c.max_tokens, 100);
    /* no workers: RC only */
    ck_assert_int_eq(kvs_el_plan_capacity(&m, 100 * 64, NULL, 0, 1, NULL, &c), KVS_OK);
    ck_assert_uint_eq(c.n_lsc, 0);
    ck_assert_uint_eq(c.n_rc, 10);
    ck_assert_uint_eq(c.max_tokens, c.max_tokens_without_lsc);
    /* two LSC buffers: each lent block takes two slots, so 17 lent leave 66 single-layer blocks */
    ck_assert_int_eq(kvs_el_plan_capacity(&m, 100 * 64, workers, 2, 2, NULL, &c), KVS_OK);
    ck_assert_uint_eq(c.n_lsc, 17);
    ck_assert_uint_eq(c.n_rc, 6);
    ck_assert_uint_eq(c.max_tokens, 23);
    ck_assert_int_eq(kvs_el_plan_capacity(&m, 100 * 64, big, 2, 2, NULL, &c), KVS_OK);
    ck_assert_uint_eq(c.n_lsc, 50);
    ck_assert_uint_eq(c.n_rc, 0);
    /* refusals */
    ck_assert_int_eq(kvs_el_plan_capacity(&m, 100 * 64, workers, 2, 3, NULL, &c), KVS_EINVAL);
    ck_assert_int_eq(kvs_el_plan_capacity(&m, 100 * 64, NULL, 2, 1, NULL, &c), KVS_EINVAL);
    kvs_el_model bad = m;
    bad.n_layers = 0;
    ck_assert_int_eq(kvs_el_plan_capacity(&bad, 100 * 64, NULL, 0, 1, NULL, &c), KVS_EINVAL);
}
END_TEST

/* LWM master with 60 GiB of its own, workers lending 40 and 30 GiB: 2.13x the context. */
START_TEST(a_realistic_pool_gives_the_derived_context) {
    uint64_t gib = 1ull << 30, workers[2] = {40 * gib, 30 * gib}, k[2];
    kvs_el_capacity c;
    ck_assert_int_eq(kvs_el_plan_capacity(&LWM, 60 * gib, workers, 2, 1, k, &c), KVS_OK);
    ck_assert_uint_eq(c.k_master, 245760);
    ck_assert_uint_eq(k[0], 5120);
    ck_assert_uint_eq(k[1], 3840);
    ck_assert_uint_eq(c.n_lsc, 8960);
    ck_assert_uint_eq(c.n_rc, 7400);
    ck_assert_uint_eq(c.max_tokens, 261760);
    ck_assert_uint_eq(c.max_tokens_without_lsc, 122880);
}
END_TEST

/* The more is lent, the longer the context, up to L times the local one. */
START_TEST(more_lent_memory_never_shortens_the_context) {
    kvs_el_model m = unit_model(8, 32);
    uint64_t prev = 0;
    for (uint64_t lent = 0; lent <= 200; lent++) {
        uint64_t w = lent * 8 * 32;
        kvs_el_capacity c;
        ck_assert_int_eq(kvs_el_plan_capacity(&m, 100 * 32, &w, 1, 1, NULL, &c), KVS_OK);
        ck_assert_uint_ge(c.max_tokens, prev);
        ck_assert_uint_le(c.max_tokens, 8 * c.max_tokens_without_lsc + 8);
        prev = c.max_tokens;
    }
    ck_assert_uint_eq(prev, 100); /* K_master once everything is lent */
}
END_TEST

START_TEST(the_exchange_unit_is_the_byte_lcm) {
    const struct {
        const kvs_el_model *m, *w;
        uint64_t lcm_mib_x2, meu_m, meu_w; /* lcm in half MiB */
    } rows[] = {
        {&LWM, &QWEN14, 80, 5, 16},   {&LWM, &QWEN8, 144, 9, 32},   {&LWM, &QWEN32, 16, 1, 2},
        {&QWEN32, &QWEN14, 40, 5, 8}, {&QWEN32, &QWEN8, 72, 9, 16}, {&QWEN14, &QWEN32, 40, 8, 5},
        {&QWEN14, &QWEN8, 45, 9, 10},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        kvs_el_unit u;
        ck_assert_int_eq(kvs_el_exchange_unit(rows[i].m, rows[i].w, &u), KVS_OK);
        ck_assert_uint_eq(u.lcm_bytes, rows[i].lcm_mib_x2 << 19);
        ck_assert_uint_eq(u.meu_master, rows[i].meu_m);
        ck_assert_uint_eq(u.meu_worker, rows[i].meu_w);
        ck_assert_uint_eq(u.meu_master * kvs_el_block_bytes(rows[i].m), u.lcm_bytes);
        ck_assert_uint_eq(u.meu_worker * kvs_el_block_bytes(rows[i].w), u.lcm_bytes);
    }
    /* fp16 master, fp8 worker of the same shape: the element count would say 1:1, the bytes 1:2 */
    kvs_el_model fp8 = QWEN14;
    fp8.elem_bytes = 1;
    kvs_el_unit u;
    ck_assert_int_eq(kvs_el_exchange_unit(&QWEN14, &fp8, &u), KVS_OK);
    ck_assert_uint_eq(u.meu_master, 1);
    ck_assert_uint_eq(u.meu_worker, 2);
    ck_assert_uint_eq(u.lcm_bytes, kvs_el_block_bytes(&QWEN14));
    /* an LCM past 64 bits, and a zero geometry, are refused */
    kvs_el_model a = unit_model(1, 0x7fffffff), b = unit_model(1, 0x7ffffffd);
    a.kv_heads = 0x7fffffff, b.kv_heads = 0x7fffffed;
    ck_assert_int_eq(kvs_el_exchange_unit(&a, &b, &u), KVS_EOVERFLOW);
    kvs_el_model z = QWEN8;
    z.n_layers = 0;
    ck_assert_int_eq(kvs_el_exchange_unit(&z, &QWEN8, &u), KVS_EINVAL);
}
END_TEST

START_TEST(scale_up_rounds_up_and_scale_down_rounds_down) {
    const kvs_el_unit u = {.lcm_bytes = 1, .meu_master = 5, .meu_worker = 16};
    uint64_t lent = 1000;
    kvs_el_delta d =
        kvs_el_scale_up(100, 125, lent, &u); /* a 2000-token request, 16-token blocks */
    ck_assert(d.units == 2 && d.worker_blocks == 32 && d.master_blocks == 10 && !d.short_of_demand);
    d = kvs_el_scale_up(100, 100, lent, &u);
    ck_assert(d.units == 0 && d.worker_blocks == 0 && d.master_blocks == 0);
    d = kvs_el_scale_up(100, 101, lent, &u);
    ck_assert(d.worker_blocks == 16 && d.master_blocks == 5);
    d = kvs_el_scale_down(132, 63, &u); /* 1000 tokens at most over the window */
    ck_assert(d.worker_blocks == 64 && d.master_blocks == 20);
    d = kvs_el_scale_down(80, 63, &u);
    ck_assert(d.worker_blocks == 16 && d.master_blocks == 5);
    d = kvs_el_scale_down(70, 63, &u);
    ck_assert(d.units == 0 && d.worker_blocks == 0);
    d = kvs_el_scale_down(60, 63, &u);
    ck_assert(d.units == 0);
    /* the master lent back only 2 units' worth: taken, and the shortfall said */
    d = kvs_el_scale_up(100, 200, 12, &u);
    ck_assert(d.units == 2 && d.worker_blocks == 32 && d.master_blocks == 10 && d.short_of_demand);
    /* a take-back too large to count is none, and says the demand stays short */
    const kvs_el_unit wide = {.lcm_bytes = 1, .meu_master = 1, .meu_worker = UINT64_MAX / 2};
    d = kvs_el_scale_up(0, UINT64_MAX, UINT64_MAX, &wide);
    ck_assert(d.units == 0 && d.short_of_demand);
    /* the batch, not its longest request: 3 requests of 1000, 17 and 16 tokens on 16-token blocks */
    uint64_t batch[3] = {1000, 17, 16};
    ck_assert_uint_eq(kvs_el_batch_blocks(batch, 3, 16), 63 + 2 + 1);
    ck_assert_uint_eq(kvs_el_batch_blocks(batch, 3, 0), UINT64_MAX);
    uint64_t over[2] = {UINT64_MAX, UINT64_MAX};
    ck_assert_uint_eq(kvs_el_batch_blocks(over, 2, 1), UINT64_MAX);
}
END_TEST

START_TEST(the_window_keeps_the_largest_recent_demand) {
    kvs_el_window *w = malloc(sizeof *w);
    kvs_el_window_init(w, 60000);
    ck_assert_uint_eq(kvs_el_window_max(w, 0), 0);
    kvs_el_window_note(w, 1000, 50);
    kvs_el_window_note(w, 2000, 80);
    kvs_el_window_note(w, 30000, 20);
    ck_assert_uint_eq(kvs_el_window_max(w, 30000), 80);
    ck_assert_uint_eq(kvs_el_window_max(w, 62000), 80); /* 80 was 60.0 s ago: still in */
    ck_assert_uint_eq(kvs_el_window_max(w, 62233), 80); /* a slot's span (234 ms) late at most */
    ck_assert_uint_eq(kvs_el_window_max(w, 62234), 20);
    ck_assert_uint_eq(kvs_el_window_max(w, 90234), 0); /* nothing in the last minute and a span */
    /* a full ring folds its oldest samples forward: the peak is not lost inside the window */
    kvs_el_window_init(w, 1000000);
    kvs_el_window_note(w, 0, 999);
    for (uint64_t t = 1; t < 3 * KVS_EL_WINDOW_SAMPLES; t++) kvs_el_window_note(w, t, 1);
    ck_assert_uint_eq(kvs_el_window_max(w, 3 * KVS_EL_WINDOW_SAMPLES), 999);
    /* ... and a peak leaves the window once it is older, however often samples come: a minute's
     * window, a sample every 100 ms for ten minutes */
    kvs_el_window_init(w, 60000);
    kvs_el_window_note(w, 0, 999);
    for (uint64_t t = 100; t <= 600000; t += 100) kvs_el_window_note(w, t, 5);
    ck_assert_uint_eq(kvs_el_window_max(w, 600000), 5);
    kvs_el_window_note(w, 600050, 40); /* a slot spans 234 ms: it shares the newest one */
    ck_assert_uint_eq(kvs_el_window_max(w, 600050), 40);
    ck_assert_uint_eq(kvs_el_window_max(w, 600050 + 60000), 40);
    ck_assert_uint_eq(kvs_el_window_max(w, 600000 + 60000 + 234), 0); /* at most a span late */
    /* a sample dated after the query still counts */
    kvs_el_window_init(w, 1000);
    kvs_el_window_note(w, 1000, 7);
    ck_assert_uint_eq(kvs_el_window_max(w, 999), 7);
    free(w);
}
END_TEST

/* 3 layers of 4 blocks (the paper's Fig. 5): growing by one moves 8 blocks layer-major, shrinking
 * by one 6; block-major moves none; every kept block keeps its bytes either way. */
START_TEST(a_block_major_resize_moves_nothing) {
    for (int layout = 0; layout < 2; layout++) {
        kvs_el_pool p;
        ck_assert_int_eq(kvs_el_pool_init(&p, (kvs_el_layout)layout, 3, 32, 16, 4), KVS_OK);
        for (uint32_t l = 0; l < 3; l++)
            for (uint64_t b = 0; b < 4; b++)
                memset(kvs_el_pool_at(&p, l, b), (int)(l * 16 + b), 32);
        ck_assert_int_eq(kvs_el_pool_resize(&p, 5), KVS_OK);
        ck_assert_uint_eq(p.blocks_moved, layout == KVS_EL_LAYER_MAJOR ? 8 : 0);
        for (uint32_t l = 0; l < 3; l++)
            for (uint64_t b = 0; b < 4; b++)
                for (int i = 0; i < 32; i++)
                    ck_assert_uint_eq(kvs_el_pool_at(&p, l, b)[i], l * 16 + b);
        ck_assert_int_eq(kvs_el_pool_resize(&p, 4), KVS_OK);
        ck_assert_int_eq(kvs_el_pool_resize(&p, 3), KVS_OK); /* shrink 4 -> 3: (L - 1) * 3 */
        ck_assert_uint_eq(p.blocks_moved, layout == KVS_EL_LAYER_MAJOR ? 8 + 8 + 6 : 0);
        ck_assert_uint_eq(p.bytes_moved, p.blocks_moved * 32);
        for (uint32_t l = 0; l < 3; l++)
            for (uint64_t b = 0; b < 3; b++)
                for (int i = 0; i < 32; i++)
                    ck_assert_uint_eq(kvs_el_pool_at(&p, l, b)[i], l * 16 + b);
        ck_assert_ptr_null(kvs_el_pool_at(&p, 0, 3));
        ck_assert_ptr_null(kvs_el_pool_at(&p, 3, 0));
        ck_assert_int_eq(kvs_el_pool_resize(&p, 17), KVS_EINVAL);
        kvs_el_pool_free(&p);
    }
    /* a general layer-major resize: (L - 1) * n to grow, (L - 1) * n' to shrink */
    kvs_el_pool p;
    ck_assert_int_eq(kvs_el_pool_init(&p, KVS_EL_LAYER_MAJOR, 32, 8, 1000, 100), KVS_OK);
    ck_assert_int_eq(kvs_el_pool_resize(&p, 164), KVS_OK);
    ck_assert_uint_eq(p.blocks_moved, 31 * 100);
    ck_assert_int_eq(kvs_el_pool_resize(&p, 64), KVS_OK);
    ck_assert_uint_eq(p.blocks_moved, 31 * 100 + 31 * 64);
    kvs_el_pool_free(&p);
    ck_assert_int_eq(kvs_el_pool_init(&p, KVS_EL_BLOCK_MAJOR, 32, 8, 10, 11), KVS_EINVAL);
}
END_TEST

int main(void) {
    Suite *s = suite_create("elastic");
    TCase *tc = tcase_create("elastic");
    tcase_add_test(tc, block_bytes_follow_eq_1);
    tcase_add_test(tc, the_papers_example_gives_25_blocks_against_10);
    tcase_add_test(tc, a_realistic_pool_gives_the_derived_context);
    tcase_add_test(tc, more_lent_memory_never_shortens_the_context);
    tcase_add_test(tc, the_exchange_unit_is_the_byte_lcm);
    tcase_add_test(tc, scale_up_rounds_up_and_scale_down_rounds_down);
    tcase_add_test(tc, the_window_keeps_the_largest_recent_demand);
    tcase_add_test(tc, a_block_major_resize_moves_nothing);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
