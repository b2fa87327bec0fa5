/* test_lsc.c - the layer stream cache hooks (engine ABI 1.8, connector/ext/lsc/lsc.c) over a peer_gpu tier
 * whose memory a real kvstrata-lend lends: reserving stream blocks, storing and fetching layers
 * apart, a reclaim turning them into KVS_EIO, and the calls it refuses. docs/peer_gpu.md. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_lsc.h"
#include "tests/support/connector_rig.h"
#include "tests/support/lend_proc.h"

static const kvs_api *api;

enum { PAGES = 8, PER = CHUNK / BT }; /* the buffer: 8 pages, a stream block takes 2 */

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* One layer of pages [2][PAGES][BT][HEADS][HEAD_BYTES] (NHD) and its view. */
typedef struct buffer {
    uint8_t bytes[2 * PAGES * BT * TOKEN_BYTES];
    kvs_layer_view view;
} buffer;

static void buffer_init(buffer *b) {
    memset(b->bytes, 0, sizeof b->bytes);
    b->view = (kvs_layer_view){.struct_size = sizeof b->view,
                               .device_kind = KVS_DEVICE_HOST,
                               .n_blocks = PAGES,
                               .k_base = b->bytes,
                               .v_base = b->bytes + PAGES * BT * TOKEN_BYTES,
                               .block_stride = BT * TOKEN_BYTES,
                               .token_stride = TOKEN_BYTES,
                               .head_stride = HEAD_BYTES};
}

/* What layer l of stream block s holds in the test: a byte pattern over its pages. */
static void fill_pages(buffer *b, const uint32_t *pages, uint32_t layer, uint32_t block) {
    for (int kv = 0; kv < 2; kv++)
        for (uint32_t p = 0; p < PER; p++) {
            uint8_t *at = b->bytes + (uint64_t)kv * PAGES * BT * TOKEN_BYTES +
                          (uint64_t)pages[p] * BT * TOKEN_BYTES;
            for (uint32_t i = 0; i < BT * TOKEN_BYTES; i++)
                at[i] = (uint8_t)(layer * 71 + block * 13 + kv * 5 + p * 3 + i * 7);
        }
}

static int pages_hold(const buffer *b, const uint32_t *pages, uint32_t layer, uint32_t block) {
    for (int kv = 0; kv < 2; kv++)
        for (uint32_t p = 0; p < PER; p++) {
            const uint8_t *at = b->bytes + (uint64_t)kv * PAGES * BT * TOKEN_BYTES +
                                (uint64_t)pages[p] * BT * TOKEN_BYTES;
            for (uint32_t i = 0; i < BT * TOKEN_BYTES; i++)
                if (at[i] != (uint8_t)(layer * 71 + block * 13 + kv * 5 + p * 3 + i * 7)) return 0;
        }
    return 1;
}

/* Stream blocks are raw: no tier event ever names them, and none lands in the dram tier below. */
static void expect_no_events(rig *r) {
    kvs_event ev[16];
    uint64_t n = 99;
    ck_assert_int_eq(api->take_events(r->h, ev, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r->h, &s), KVS_OK);
    ck_assert_uint_eq(s.evictions, 0);
}

static const char *peer_config(const char *sock) {
    static char text[1024];
    snprintf(text, sizeof text,
             "chunk_tokens: %d\ntiers:\n  - name: peer\n    type: peer_gpu\n    options:\n"
             "      socket: %s\n  - name: dram\n    type: dram\n    capacity: 1MiB\n",
             CHUNK, sock);
    return rig_config("peer.yaml", text);
}

/* A lender of `units` units of 64KiB (a handful of stream blocks each) and a worker over it. */
static void open_over_lender(rig *r, kvs_test_lender *l, unsigned units) {
    char sock[600];
    snprintf(sock, sizeof sock, "%s/lend.sock", rig_tmpdir);
    kvs_test_lender_start(l, sock, units, "64KiB", NULL);
    ck_assert_int_eq(rig_open(r, KVS_ROLE_WORKER, peer_config(sock)), KVS_OK);
    ck_assert_msg(kvs_test_lender_expect(l, "accepted", (int)units, 5000), "%s", l->out);
}

START_TEST(layers_of_stream_blocks_are_kept_apart_bit_for_bit) {
    rig r;
    kvs_test_lender l;
    open_over_lender(&r, &l, 4);
    buffer *b = malloc(sizeof *b);
    buffer_init(b);
    uint32_t granted = 99, tokens = 0;
    ck_assert_int_eq(api->lsc_reserve(r.h, NULL, 0, &granted, &tokens), KVS_OK);
    ck_assert_uint_eq(granted, 0);
    ck_assert_uint_eq(tokens, CHUNK);
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 3, &granted, NULL), KVS_OK);
    ck_assert_uint_eq(granted, 3);
    /* store every layer of every block through the same two pages... */
    uint32_t pages[PER] = {5, 2}; /* a stream block's tokens in pages 5 then 2 */
    for (uint32_t layer = 0; layer < LAYERS; layer++)
        for (uint32_t s = 0; s < 3; s++) {
            fill_pages(b, pages, layer, s);
            ck_assert_int_eq(api->lsc_store(r.h, layer, &s, pages, 1), KVS_OK);
        }
    /* ... and fetch them back, several at once, into other pages */
    uint32_t blocks[3] = {2, 0, 1}, many[3 * PER] = {0, 1, 3, 4, 6, 7};
    for (uint32_t layer = 0; layer < LAYERS; layer++) {
        memset(b->bytes, 0, sizeof b->bytes);
        ck_assert_int_eq(api->lsc_fetch(r.h, layer, blocks, many, 3), KVS_OK);
        for (uint32_t i = 0; i < 3; i++)
            ck_assert_msg(pages_hold(b, many + i * PER, layer, blocks[i]), "layer %u block %u",
                          layer, blocks[i]);
    }
    /* a new block starts zeroed; keeping the reserved ones keeps their bytes */
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 4, &granted, NULL), KVS_OK);
    ck_assert_uint_eq(granted, 4);
    uint32_t fourth = 3, zero_pages[PER] = {0, 1};
    memset(b->bytes, 0xee, sizeof b->bytes);
    ck_assert_int_eq(api->lsc_fetch(r.h, 1, &fourth, zero_pages, 1), KVS_OK);
    ck_assert_uint_eq(b->bytes[0], 0);
    ck_assert_uint_eq(b->bytes[PAGES * BT * TOKEN_BYTES + BT * TOKEN_BYTES + 5], 0);
    uint32_t first = 0;
    ck_assert_int_eq(api->lsc_fetch(r.h, 1, &first, pages, 1), KVS_OK);
    ck_assert(pages_hold(b, pages, 1, 0));
    rig_close(&r);
    kvs_test_lender_stop(&l);
    free(b);
}
END_TEST

START_TEST(a_reserve_gets_what_the_lent_memory_holds) {
    rig r;
    kvs_test_lender l;
    open_over_lender(&r, &l, 2);
    buffer *b = malloc(sizeof *b);
    buffer_init(b);
    uint32_t granted = 0;
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 1000, &granted, NULL), KVS_OK);
    ck_assert_uint_gt(granted, 0);
    ck_assert_uint_lt(granted, 1000);
    uint32_t most = granted;
    /* giving back some, then all */
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 1, &granted, NULL), KVS_OK);
    ck_assert_uint_eq(granted, 1);
    ck_assert_int_eq(api->lsc_reserve(r.h, NULL, 0, &granted, NULL), KVS_OK);
    ck_assert_uint_eq(granted, 0);
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 1000, &granted, NULL), KVS_OK);
    ck_assert_uint_eq(granted, most); /* what was given back is there again */
    expect_no_events(&r);             /* the block that found no room went nowhere */
    rig_close(&r);
    kvs_test_lender_stop(&l);
    free(b);
}
END_TEST

START_TEST(a_reclaimed_stream_block_fails_its_fetch_and_store) {
    rig r;
    kvs_test_lender l;
    open_over_lender(&r, &l, 4);
    buffer *b = malloc(sizeof *b);
    buffer_init(b);
    uint32_t granted = 0, pages[PER] = {0, 1}, s = 0;
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 2, &granted, NULL), KVS_OK);
    ck_assert_uint_eq(granted, 2);
    kvs_test_lender_say(&l, "reclaim 4");
    ck_assert(kvs_test_lender_expect(&l, "released", 4, 5000));
    ck_assert_int_eq(api->lsc_fetch(r.h, 0, &s, pages, 1), KVS_EIO);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "taken back"));
    ck_assert_int_eq(api->lsc_store(r.h, 0, &s, pages, 1), KVS_EIO);
    expect_no_events(&r); /* the reclaim dropped them, and wrote none down */
    rig_close(&r);
    kvs_test_lender_stop(&l);
    free(b);
}
END_TEST

START_TEST(calls_out_of_place_are_refused) {
    rig r;
    kvs_test_lender l;
    open_over_lender(&r, &l, 2);
    buffer *b = malloc(sizeof *b);
    buffer_init(b);
    uint32_t granted = 0, pages[PER] = {0, 1}, s = 0, far = 7;
    ck_assert_int_eq(api->lsc_fetch(r.h, 0, &s, pages, 1), KVS_ESTATE); /* nothing reserved */
    ck_assert_int_eq(api->lsc_reserve(r.h, NULL, 2, &granted, NULL), KVS_EINVAL);
    buffer_init(b);
    b->view.n_blocks = 1; /* smaller than one stream block */
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 2, &granted, NULL), KVS_EINVAL);
    buffer_init(b);
    b->view.head_stride = 1; /* heads overlapping */
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 2, &granted, NULL), KVS_EINVAL);
    buffer_init(b);
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 2, &granted, NULL), KVS_OK);
    ck_assert_int_eq(api->lsc_fetch(r.h, LAYERS, &s, pages, 1), KVS_EINVAL);
    ck_assert_int_eq(api->lsc_fetch(r.h, 0, &far, pages, 1), KVS_EINVAL);
    uint32_t bad_pages[PER] = {0, PAGES};
    ck_assert_int_eq(api->lsc_store(r.h, 0, &s, bad_pages, 1), KVS_EINVAL);
    ck_assert_int_eq(api->lsc_fetch(r.h, 0, NULL, NULL, 1), KVS_EINVAL);
    ck_assert_int_eq(api->lsc_fetch(r.h, 0, NULL, NULL, 0), KVS_OK);
    rig_close(&r);
    kvs_test_lender_stop(&l);
    /* without a peer_gpu tier, and from a scheduler */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_WORKER, rig_dram_config(8, 30000)), KVS_OK);
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 2, &granted, NULL), KVS_ENOTSUP);
    rig_close(&r);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_SCHEDULER, rig_dram_config(8, 30000)), KVS_OK);
    ck_assert_int_eq(api->lsc_reserve(r.h, &b->view, 2, &granted, NULL), KVS_ESTATE);
    rig_close(&r);
    free(b);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("lsc");
    TCase *tc = tcase_create("lsc");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, layers_of_stream_blocks_are_kept_apart_bit_for_bit);
    tcase_add_test(tc, a_reserve_gets_what_the_lent_memory_holds);
    tcase_add_test(tc, a_reclaimed_stream_block_fails_its_fetch_and_store);
    tcase_add_test(tc, calls_out_of_place_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
