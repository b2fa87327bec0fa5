/* test_sparse.c - the sparse decode hooks (ABI 1.9, connector/ext/sparse/sparse.c) through the ABI table, over
 * chunks the rig's prefill saved into a dram tier: the rows a step puts in the head cache are the
 * exact top-k of the stored rows (brute force over the rig's pages) with the pages' bytes; a hit
 * moves nothing and a miss only what the cache lacks; a wrong speculation is corrected; a damaged
 * row is never handed over; a second begin takes the chunks saved since; bad calls are refused. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "abi/kvstrata_sparse.h"
#include "common/xxh3.h"
#include "connector/ext/sparse/sparse_swarm.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "kernels/cpu/dtype.h"
#include "tests/support/connector_rig.h"
#include "tests/support/wait.h"

#define SLOTS  12
#define SINK   4
#define RECENT 8
#define N_TOK  (4 * CHUNK) /* four chunks stored */

static const kvs_api *api;

typedef struct sparse_rig {
    rig r;
    int32_t tokens[N_TOK + CHUNK];
    uint32_t blocks[(N_TOK + CHUNK) / BT];
    uint8_t k[LAYERS][HEADS][SLOTS][HEAD_BYTES], v[LAYERS][HEADS][SLOTS][HEAD_BYTES];
    uint32_t slot_rows[LAYERS][HEADS][SLOTS];
    uint8_t hit[LAYERS][HEADS];
    uint32_t attend_from[LAYERS][HEADS];
    kvs_sparse_cache cache;
    kvs_sparse_params params;
} sparse_rig;

/* A handle on config, the request's tokens and pages, and the head cache. */
static void open_on(sparse_rig *s, const char *config) {
    memset(s, 0, sizeof *s);
    ck_assert_int_eq(rig_open(&s->r, KVS_ROLE_BOTH, config), KVS_OK);
    s->r.finite = 1; /* keys the connector reads as fp16 numbers (rig_open clears the rig) */
    rig_make_tokens(s->tokens, N_TOK + CHUNK, 3);
    rig_blocks_from(s->blocks, (N_TOK + CHUNK) / BT, 0);
    s->cache = (kvs_sparse_cache){.struct_size = sizeof s->cache,
                                  .slots = SLOTS,
                                  .k = s->k,
                                  .v = s->v,
                                  .slot_rows = &s->slot_rows[0][0][0],
                                  .hit = &s->hit[0][0],
                                  .attend_from = &s->attend_from[0][0]};
    s->params = (kvs_sparse_params){.struct_size = sizeof s->params,
                                    .topk = SLOTS,
                                    .sink = SINK,
                                    .recent = RECENT,
                                    .max_tokens = N_TOK + CHUNK};
}

/* A rig over a dram tier whose first `stored` tokens were prefilled (saved as chunks). */
static void open_rig(sparse_rig *s, uint64_t stored) {
    open_on(s, rig_dram_config(64, 60000));
    if (stored) rig_prefill(&s->r, "prefill", s->tokens, stored, s->blocks);
}

/* Begin request id over the rig's tokens with its cache and params: the status. */
static kvs_status begin(sparse_rig *s, const char *id) {
    return api->sparse_begin(s->r.h, id, s->tokens, N_TOK, &s->cache, &s->params, NULL);
}

/* End request "d" and the rig. */
static void finish(sparse_rig *s) {
    api->sparse_end(s->r.h, "d");
    rig_close(&s->r);
    free(s);
}

static float key_at(sparse_rig *s, int layer, int head, uint32_t row, int i) {
    const uint8_t *p = rig_kv_at(&s->r, layer, 0, s->blocks, row) + head * HEAD_BYTES;
    return kvs_dtype_load(KVS_DTYPE_FP16, p, (uint64_t)i);
}

static void random_q(float *q, uint64_t *seed) {
    for (int i = 0; i < HEADS * HEAD_DIM; i++) {
        *seed ^= *seed << 13, *seed ^= *seed >> 7, *seed ^= *seed << 17;
        q[i] = (float)((double)(*seed >> 11) / 9007199254740992.0 * 2 - 1);
    }
}

/* The exact top-k rows of (layer, head) for q over [SINK, n_rows - RECENT), ascending, by brute
 * force over the rig's pages (ties: the lower row). */
static uint32_t brute_top_k(sparse_rig *s, int layer, int head, const float *q, uint32_t n_rows,
                            uint8_t *chosen) {
    uint32_t end = n_rows - RECENT, n = 0;
    memset(chosen, 0, n_rows);
    for (uint32_t k = 0; k < SLOTS && k < end - SINK; k++) {
        uint32_t best = UINT32_MAX;
        float best_score = -INFINITY;
        for (uint32_t r = SINK; r < end; r++) {
            if (chosen[r]) continue;
            double sum = 0; /* as the connector scores: in double, then rounded */
            for (int i = 0; i < HEAD_DIM; i++)
                sum += (double)q[head * HEAD_DIM + i] * key_at(s, layer, head, r, i);
            float sc = (float)sum;
            if (best == UINT32_MAX || sc > best_score) best = r, best_score = sc;
        }
        chosen[best] = 1;
        n++;
    }
    return n;
}

/* Every slot of the layer holds a row of the brute-force top-k, with the pages' bytes. */
static void expect_exact(sparse_rig *s, int layer, const float *q, uint32_t n_rows) {
    uint8_t chosen[N_TOK + CHUNK];
    for (int h = 0; h < HEADS; h++) {
        uint32_t n = brute_top_k(s, layer, h, q, n_rows, chosen), seen = 0;
        for (int slot = 0; slot < SLOTS; slot++) {
            uint32_t row = s->slot_rows[layer][h][slot];
            if (row == UINT32_MAX) continue;
            ck_assert_msg(row < n_rows && chosen[row], "layer %d head %d slot %d row %u", layer, h,
                          slot, row);
            chosen[row] = 0;
            seen++;
            ck_assert(!memcmp(s->k[layer][h][slot],
                              rig_kv_at(&s->r, layer, 0, s->blocks, row) + h * HEAD_BYTES,
                              HEAD_BYTES));
            ck_assert(!memcmp(s->v[layer][h][slot],
                              rig_kv_at(&s->r, layer, 1, s->blocks, row) + h * HEAD_BYTES,
                              HEAD_BYTES));
        }
        ck_assert_uint_eq(seen, n);
    }
}

static kvs_sparse_stats stats_of(sparse_rig *s) {
    kvs_sparse_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->sparse_stats(s->r.h, "d", &st), KVS_OK);
    return st;
}

static void step(sparse_rig *s, int layer, const float *q, uint32_t n_rows, uint32_t flags) {
    ck_assert_int_eq(api->sparse_select(s->r.h, "d", (uint32_t)layer, q, n_rows, flags), KVS_OK);
    ck_assert_int_eq(api->sparse_wait(s->r.h, "d", (uint32_t)layer), KVS_OK);
}

START_TEST(a_step_holds_the_exact_top_k_of_the_stored_rows_bit_for_bit) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK);
    uint64_t stored = 0;
    ck_assert_int_eq(
        api->sparse_begin(s->r.h, "d", s->tokens, N_TOK, &s->cache, &s->params, &stored), KVS_OK);
    ck_assert_uint_eq(stored, N_TOK);
    ck_assert_uint_eq(s->slot_rows[1][1][SLOTS - 1], UINT32_MAX); /* begin empties the slots */
    uint64_t seed = 99;
    float q[HEADS * HEAD_DIM];
    for (int round = 0; round < 6; round++) {
        random_q(q, &seed);
        for (int l = 0; l < LAYERS; l++) {
            step(s, l, q, N_TOK, KVS_SPARSE_FINAL);
            expect_exact(s, l, q, N_TOK);
        }
    }
    /* a pool limited by the context: rows at or past n_rows - RECENT are never selected */
    random_q(q, &seed);
    for (int h = 0; h < HEADS; h++) q[h * HEAD_DIM] += 50.0f; /* a new direction: a miss */
    step(s, 0, q, 40, KVS_SPARSE_FINAL);
    expect_exact(s, 0, q, 40);
    kvs_sparse_stats st = stats_of(s);
    ck_assert_uint_eq(st.stored_tokens, N_TOK);
    ck_assert_uint_eq(st.steps, 13);
    ck_assert_uint_eq(st.head_hits + st.head_misses, 13 * HEADS);
    ck_assert_uint_eq(st.rows_failed, 0);
    ck_assert_uint_eq(st.bytes_fetched, st.rows_fetched * 2 * HEAD_BYTES);
    ck_assert_int_eq(api->sparse_end(s->r.h, "d"), KVS_OK);
    ck_assert_int_eq(api->sparse_end(s->r.h, "d"), KVS_ENOTFOUND);
    rig_close(&s->r);
    free(s);
}
END_TEST

START_TEST(a_hit_moves_nothing_and_a_miss_only_what_the_cache_lacks) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK);
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    uint64_t seed = 7;
    float q[HEADS * HEAD_DIM], q2[HEADS * HEAD_DIM];
    random_q(q, &seed);
    step(s, 0, q, N_TOK, KVS_SPARSE_FINAL);
    ck_assert_uint_eq(s->hit[0][0] + s->hit[0][1], 0); /* the first step always misses */
    kvs_sparse_stats a = stats_of(s);
    ck_assert_uint_eq(a.rows_fetched, HEADS * SLOTS);
    /* the same query: every head reuses, nothing moves */
    step(s, 0, q, N_TOK, KVS_SPARSE_FINAL);
    ck_assert_uint_eq(s->hit[0][0] + s->hit[0][1], HEADS);
    kvs_sparse_stats b = stats_of(s);
    ck_assert_uint_eq(b.rows_fetched, a.rows_fetched);
    ck_assert_uint_eq(b.head_hits, HEADS);
    /* a far query misses; it reads exactly the rows of its top-k the slots did not hold */
    uint32_t before[HEADS][SLOTS];
    memcpy(before, s->slot_rows[0], sizeof before);
    for (int i = 0; i < HEADS * HEAD_DIM; i++) q2[i] = -q[i];
    step(s, 0, q2, N_TOK, KVS_SPARSE_FINAL);
    ck_assert_uint_eq(s->hit[0][0] + s->hit[0][1], 0);
    expect_exact(s, 0, q2, N_TOK);
    uint64_t lacked = 0;
    for (int h = 0; h < HEADS; h++)
        for (int i = 0; i < SLOTS; i++) {
            uint32_t row = s->slot_rows[0][h][i];
            int held = 0;
            for (int j = 0; j < SLOTS; j++) held |= before[h][j] == row;
            lacked += !held;
            if (held) ck_assert_uint_eq(before[h][i], row); /* a kept row never moves */
        }
    ck_assert_uint_eq(stats_of(s).rows_fetched - b.rows_fetched, lacked);
    finish(s);
}
END_TEST

/* A reusing head keeps the pool's end of its selection: the rows that entered the pool since are
 * the engine's (attend_from), not dropped; a pool that shrank under the rows makes the head select
 * again, whatever its query. */
START_TEST(a_reusing_head_leaves_the_rows_since_its_selection_to_the_engine) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK);
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    ck_assert_uint_eq(s->attend_from[1][1], SINK); /* begin: nothing selected yet */
    uint64_t seed = 23;
    float q[HEADS * HEAD_DIM];
    random_q(q, &seed);
    step(s, 0, q, 100, KVS_SPARSE_FINAL);
    ck_assert_uint_eq(s->attend_from[0][0], 100 - RECENT);
    step(s, 0, q, 110, KVS_SPARSE_FINAL); /* the same query, ten rows on: reused */
    ck_assert_uint_eq(s->hit[0][0] + s->hit[0][1], HEADS);
    for (int h = 0; h < HEADS; h++) {
        ck_assert_uint_eq(s->attend_from[0][h], 100 - RECENT); /* rows 92..101 are the engine's */
        for (int i = 0; i < SLOTS; i++) ck_assert_uint_lt(s->slot_rows[0][h][i], 100 - RECENT);
    }
    step(s, 0, q, 60, KVS_SPARSE_FINAL); /* back: the pool ends at 52, under the rows held */
    ck_assert_uint_eq(s->hit[0][0] + s->hit[0][1], 0);
    expect_exact(s, 0, q, 60);
    for (int h = 0; h < HEADS; h++) ck_assert_uint_eq(s->attend_from[0][h], 60 - RECENT);
    step(s, 0, q, 8, KVS_SPARSE_FINAL); /* no pool at all: the engine attends from the sink */
    for (int h = 0; h < HEADS; h++) {
        ck_assert_uint_eq(s->attend_from[0][h], SINK);
        for (int i = 0; i < SLOTS; i++) ck_assert_uint_eq(s->slot_rows[0][h][i], UINT32_MAX);
    }
    finish(s);
}
END_TEST

START_TEST(a_wrong_speculation_is_corrected_and_a_right_one_kept) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK);
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    uint64_t seed = 11;
    float q[HEADS * HEAD_DIM], far[HEADS * HEAD_DIM];
    random_q(q, &seed);
    for (int i = 0; i < HEADS * HEAD_DIM; i++) far[i] = -q[i];
    /* layer 1 speculated with q, the real query far from it: every head selects again */
    ck_assert_int_eq(api->sparse_select(s->r.h, "d", 1, q, N_TOK, KVS_SPARSE_SPECULATIVE), KVS_OK);
    ck_assert_int_eq(api->sparse_select(s->r.h, "d", 1, far, N_TOK, KVS_SPARSE_FINAL), KVS_OK);
    ck_assert_int_eq(api->sparse_wait(s->r.h, "d", 1), KVS_OK);
    expect_exact(s, 1, far, N_TOK);
    kvs_sparse_stats st = stats_of(s);
    ck_assert_uint_eq(st.spec_steps, 1);
    ck_assert_uint_eq(st.spec_corrected, HEADS);
    ck_assert_uint_eq(st.spec_kept, 0);
    uint64_t fetched = st.rows_fetched;
    /* speculated right: the real query keeps the rows */
    ck_assert_int_eq(api->sparse_select(s->r.h, "d", 0, q, N_TOK, KVS_SPARSE_SPECULATIVE), KVS_OK);
    ck_assert_int_eq(api->sparse_select(s->r.h, "d", 0, q, N_TOK, KVS_SPARSE_FINAL), KVS_OK);
    ck_assert_int_eq(api->sparse_wait(s->r.h, "d", 0), KVS_OK);
    expect_exact(s, 0, q, N_TOK);
    st = stats_of(s);
    ck_assert_uint_eq(st.spec_kept, HEADS);
    ck_assert_uint_eq(st.spec_corrected, HEADS);
    ck_assert_uint_eq(st.rows_fetched, fetched + HEADS * SLOTS); /* the kept FINAL read nothing */
    finish(s);
}
END_TEST

/* Byte 0 of row `row`'s K in (layer, head) of the object stored in the dram tier. */
static uint8_t *stored_k_byte(sparse_rig *s, int layer, int head, uint32_t row) {
    kvs_key keys[N_TOK / CHUNK];
    kvs_keys_chain(&s->r.h->fingerprint, s->tokens, N_TOK / CHUNK, CHUNK, keys);
    const void *obj;
    uint64_t len;
    ck_assert_int_eq(kvs_tiers_get_ref(s->r.h->tiers, 0, &keys[row / CHUNK], &obj, &len), KVS_OK);
    uint64_t layer_bytes = (uint64_t)CHUNK * TOKEN_BYTES * 2;
    uint64_t off =
        4096 + (uint64_t)layer * layer_bytes + ((row % CHUNK) * HEADS + head) * HEAD_BYTES;
    ck_assert_uint_lt(off, len);
    return (uint8_t *)obj + off;
}

START_TEST(a_damaged_row_is_never_handed_over) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK);
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    uint64_t seed = 5;
    float q[HEADS * HEAD_DIM];
    random_q(q, &seed);
    /* the top row of head 0 in layer 0, damaged in the tier after begin read it whole */
    uint8_t chosen[N_TOK + CHUNK];
    brute_top_k(s, 0, 0, q, N_TOK, chosen);
    uint32_t victim = SINK;
    while (!chosen[victim]) victim++;
    *stored_k_byte(s, 0, 0, victim) ^= 0x40;
    step(s, 0, q, N_TOK, KVS_SPARSE_FINAL);
    kvs_sparse_stats st = stats_of(s);
    ck_assert_uint_eq(st.rows_failed, 1);
    for (int i = 0; i < SLOTS; i++) ck_assert_uint_ne(s->slot_rows[0][0][i], victim);
    ck_assert_uint_eq(st.rows_fetched, HEADS * SLOTS - 1);
    /* the head selects again next step (and fails again: the tier still holds the damage) */
    step(s, 0, q, N_TOK, KVS_SPARSE_FINAL);
    ck_assert_uint_eq(s->hit[0][0], 0);
    ck_assert_uint_eq(s->hit[0][1], 1);
    ck_assert_uint_eq(stats_of(s).rows_failed, 2);
    finish(s);
}
END_TEST

START_TEST(a_chunk_damaged_before_begin_is_never_selected) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK);
    *stored_k_byte(s, 1, 1, 2 * CHUNK + 3) ^= 0x01; /* chunk 2 */
    uint64_t stored = 0;
    ck_assert_int_eq(
        api->sparse_begin(s->r.h, "d", s->tokens, N_TOK, &s->cache, &s->params, &stored), KVS_OK);
    ck_assert_uint_eq(stored, 2 * CHUNK); /* the stored prefix ends at the damaged chunk */
    ck_assert_uint_eq(stats_of(s).chunks_refused, 1);
    uint64_t seed = 13;
    float q[HEADS * HEAD_DIM];
    for (int round = 0; round < 8; round++) {
        random_q(q, &seed);
        step(s, 1, q, N_TOK, KVS_SPARSE_FINAL);
        for (int h = 0; h < HEADS; h++)
            for (int i = 0; i < SLOTS; i++) {
                uint32_t row = s->slot_rows[1][h][i];
                ck_assert(row == UINT32_MAX || row < 2 * CHUNK);
            }
    }
    ck_assert_uint_eq(stats_of(s).rows_failed, 0);
    finish(s);
}
END_TEST

START_TEST(a_second_begin_takes_the_chunks_saved_since) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, 2 * CHUNK);
    uint64_t stored = 0;
    ck_assert_int_eq(
        api->sparse_begin(s->r.h, "d", s->tokens, N_TOK, &s->cache, &s->params, &stored), KVS_OK);
    ck_assert_uint_eq(stored, 2 * CHUNK);                    /* the rest is not stored yet */
    rig_prefill(&s->r, "more", s->tokens, N_TOK, s->blocks); /* chunks 2 and 3 saved */
    ck_assert_int_eq(api->sparse_begin(s->r.h, "d", s->tokens, N_TOK, NULL, NULL, &stored), KVS_OK);
    ck_assert_uint_eq(stored, N_TOK);
    /* tokens that do not begin with the chunks taken are refused, and change nothing */
    int32_t other[N_TOK];
    memcpy(other, s->tokens, sizeof other);
    other[3]++;
    ck_assert_int_eq(api->sparse_begin(s->r.h, "d", other, N_TOK, NULL, NULL, &stored), KVS_EINVAL);
    ck_assert_uint_eq(stored, N_TOK);
    uint64_t seed = 17;
    float q[HEADS * HEAD_DIM];
    random_q(q, &seed);
    step(s, 0, q, N_TOK, KVS_SPARSE_FINAL);
    expect_exact(s, 0, q, N_TOK);
    finish(s);
}
END_TEST

START_TEST(bad_calls_are_refused) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK);
    kvs_handle *h = s->r.h;
    float q[HEADS * HEAD_DIM] = {1};
    ck_assert_int_eq(api->sparse_select(h, "d", 0, q, N_TOK, 0), KVS_ENOTFOUND);
    ck_assert_int_eq(api->sparse_wait(h, "d", 0), KVS_ENOTFOUND);
    ck_assert_int_eq(api->sparse_begin(h, "d", s->tokens, N_TOK, NULL, &s->params, NULL),
                     KVS_EINVAL);
    kvs_sparse_params p = s->params;
    p.topk = SLOTS + 1;
    ck_assert_int_eq(api->sparse_begin(h, "d", s->tokens, N_TOK, &s->cache, &p, NULL), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(h), "topk"));
    p = s->params;
    p.struct_size = 8;
    ck_assert_int_eq(api->sparse_begin(h, "d", s->tokens, N_TOK, &s->cache, &p, NULL), KVS_EINVAL);
    p = s->params;
    p.max_tokens = CHUNK - 1;
    ck_assert_int_eq(api->sparse_begin(h, "d", s->tokens, N_TOK, &s->cache, &p, NULL), KVS_EINVAL);
    int32_t bad[N_TOK];
    memcpy(bad, s->tokens, sizeof bad);
    bad[5] = -1;
    ck_assert_int_eq(api->sparse_begin(h, "d", bad, N_TOK, &s->cache, &s->params, NULL),
                     KVS_EINVAL);
    ck_assert_int_eq(api->sparse_begin(h, "", s->tokens, N_TOK, &s->cache, &s->params, NULL),
                     KVS_EINVAL);
    ck_assert_int_eq(api->sparse_begin(h, "d", s->tokens, N_TOK, &s->cache, &s->params, NULL),
                     KVS_OK);
    ck_assert_int_eq(api->sparse_select(h, "d", LAYERS, q, N_TOK, 0), KVS_EINVAL);
    ck_assert_int_eq(api->sparse_select(h, "d", 0, NULL, N_TOK, 0), KVS_EINVAL);
    ck_assert_int_eq(api->sparse_select(h, "d", 0, q, 0, 0), KVS_EINVAL);
    ck_assert_int_eq(api->sparse_select(h, "d", 0, q, N_TOK, 7), KVS_EINVAL);
    ck_assert_int_eq(api->sparse_wait(h, "d", LAYERS), KVS_EINVAL);
    ck_assert_int_eq(api->sparse_wait(h, "d", UINT32_MAX), KVS_EINVAL);
    kvs_sparse_stats st = {.struct_size = 16};
    ck_assert_int_eq(api->sparse_stats(h, "d", &st), KVS_EINVAL);
    /* a query selected and never waited for: end waits, and close ends what is left */
    ck_assert_int_eq(api->sparse_select(h, "d", 0, q, N_TOK, 0), KVS_OK);
    ck_assert_int_eq(api->sparse_wait(h, "d", 0), KVS_OK); /* "e" begins over the same cache */
    ck_assert_int_eq(api->sparse_begin(h, "e", s->tokens, N_TOK, &s->cache, &s->params, NULL),
                     KVS_OK);
    ck_assert_int_eq(api->sparse_select(h, "e", 0, q, N_TOK, 0), KVS_OK); /* close drops it */
    ck_assert_int_eq(api->sparse_end(h, "d"), KVS_OK);
    rig_close(&s->r);
    /* a scheduler handle has no sparse decode */
    rig sched;
    memset(&sched, 0, sizeof sched);
    ck_assert_int_eq(rig_open(&sched, KVS_ROLE_SCHEDULER, rig_dram_config(64, 60000)), KVS_OK);
    ck_assert_int_eq(api->sparse_begin(sched.h, "d", s->tokens, N_TOK, &s->cache, &s->params, NULL),
                     KVS_ESTATE);
    rig_close(&sched);
    free(s);
}
END_TEST

/* ---- Swarm's clusters in the SSD tier ------------------------------------------------------- */

/* Two SSD paths in rig_tmpdir (made once), stripes of 4KiB. */
static const char *ssd_config(void) {
    char d0[600], d1[600], text[1024];
    snprintf(d0, sizeof d0, "%s/p0", rig_tmpdir);
    snprintf(d1, sizeof d1, "%s/p1", rig_tmpdir);
    mkdir(d0, 0700);
    mkdir(d1, 0700);
    snprintf(text, sizeof text,
             "chunk_tokens: %d\ntiers:\n  - name: nvme\n    type: ssd\n    capacity: 16MiB\n"
             "    paths: [%s, %s]\n    options:\n      stripe_bytes: 4KiB\n",
             CHUNK, d0, d1);
    return rig_config("ssd.yaml", text);
}

/* What the cluster keys of request "d" over the rig's stored prefix derive from. */
static kvs_sparse_swarm_params cluster_keys_of(sparse_rig *s) {
    kvs_key keys[N_TOK / CHUNK];
    kvs_keys_chain(&s->r.h->fingerprint, s->tokens, N_TOK / CHUNK, CHUNK, keys);
    return (kvs_sparse_swarm_params){.sink = SINK,
                                     .rows_end = N_TOK,
                                     .head_bytes = HEAD_BYTES,
                                     .prefix = keys[N_TOK / CHUNK - 1],
                                     .nonce = (uint32_t)kvs_xxh3_64("d", 1)};
}

static void open_ssd_rig(sparse_rig *s, int prefill) {
    open_on(s, ssd_config());
    if (prefill) {
        rig_prefill(&s->r, "prefill", s->tokens, N_TOK, s->blocks);
        /* the SSD tier writes in the background: a chunk is found once written */
        for (uint64_t c = 0; c < N_TOK / CHUNK; c++)
            for (int tries = 0; !rig_stored(&s->r, s->tokens, c); tries++) {
                ck_assert_int_lt(tries, 5000);
                kvs_test_pause_ms(2);
            }
    } else { /* the pages as the prefill wrote them (the brute force reads them) */
        rig_write_kv(&s->r, s->blocks, s->tokens, 0, N_TOK);
    }
    s->params.layout = KVS_SPARSE_LAYOUT_SWARM;
    s->params.profile_steps = 3;
    s->params.cluster_cache_rows = 64;
}

/* Steps of every layer with fresh queries, each checked against brute force. */
static void swarm_steps(sparse_rig *s, int steps, uint64_t *seed) {
    float q[HEADS * HEAD_DIM];
    for (int t = 0; t < steps; t++) {
        random_q(q, seed);
        for (int l = 0; l < LAYERS; l++) {
            step(s, l, q, N_TOK, KVS_SPARSE_FINAL);
            expect_exact(s, l, q, N_TOK);
        }
    }
}

START_TEST(swarm_clusters_serve_the_exact_rows_and_survive_a_restart) {
    sparse_rig *s = malloc(sizeof *s);
    open_ssd_rig(s, 1);
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    kvs_sparse_stats st = stats_of(s);
    ck_assert_uint_eq(st.layouts_found, 0);
    uint64_t seed = 31;
    swarm_steps(s, 3, &seed); /* profiled: rows from their chunks */
    st = stats_of(s);
    ck_assert_uint_eq(st.layouts_written, LAYERS);
    ck_assert_uint_eq(st.rows_from_clusters, 0);
    swarm_steps(s, 6, &seed); /* from clusters now, still the exact rows */
    st = stats_of(s);
    ck_assert_uint_gt(st.clusters_read, 0);
    ck_assert_uint_gt(st.rows_from_clusters, 0);
    ck_assert_uint_eq(st.rows_failed, 0);
    ck_assert_uint_ge(st.cluster_bytes_read, st.clusters_read * 48);
    ck_assert_int_eq(api->sparse_end(s->r.h, "d"), KVS_OK);
    rig_close(&s->r);
    /* a new handle over the same SSD directories: the chunks and the clusters are there */
    open_ssd_rig(s, 0);
    uint64_t stored = 0;
    ck_assert_int_eq(
        api->sparse_begin(s->r.h, "d", s->tokens, N_TOK, &s->cache, &s->params, &stored), KVS_OK);
    ck_assert_uint_eq(stored, N_TOK);
    st = stats_of(s);
    ck_assert_uint_eq(st.layouts_found, LAYERS);
    swarm_steps(s, 2, &seed);
    st = stats_of(s);
    ck_assert_uint_eq(st.layouts_written, 0); /* nothing profiled again */
    ck_assert_uint_gt(st.rows_from_clusters, 0);
    ck_assert_uint_eq(st.rows_failed, 0);
    finish(s);
}
END_TEST

/* Every cluster of (layer 0, head 0) damaged in the tier: its rows come from their chunks
 * instead, never from the damaged bytes. */
START_TEST(a_damaged_cluster_is_never_handed_over) {
    sparse_rig *s = malloc(sizeof *s);
    open_ssd_rig(s, 1);
    s->params.cluster_cache_rows = 0; /* every step reads the tier */
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    uint64_t seed = 37;
    swarm_steps(s, 3, &seed);
    ck_assert_uint_eq(stats_of(s).layouts_written, LAYERS);
    kvs_sparse_swarm_params sp = cluster_keys_of(s);
    /* the tier writes in the background: through a new handle, which finds every object the
     * first wrote, the clusters of head 0 of layer 0 are damaged; a third reads them */
    ck_assert_int_eq(api->sparse_end(s->r.h, "d"), KVS_OK);
    rig_close(&s->r);
    open_ssd_rig(s, 0);
    const kvs_backend_ops *ops = kvs_tiers_ops(s->r.h->tiers, 0);
    void *state = kvs_tiers_state(s->r.h->tiers, 0);
    uint8_t *obj = malloc(1 << 16);
    uint32_t damaged = 0;
    for (uint32_t c = 0;; c++) {
        kvs_key key = kvs_sparse_swarm_cluster_key(&sp, 0, 0, 0, c);
        uint64_t len = 0;
        if (ops->get(state, &key, obj, 1 << 16, &len) != KVS_OK) break;
        obj[len - 1] ^= 0x20; /* the last V byte of its last row */
        obj[len / 2 + 24] ^= 0x04;
        ops->remove(state, &key);
        ck_assert_int_eq(ops->put(state, &key, obj, len), KVS_OK);
        damaged++;
    }
    free(obj);
    ck_assert_uint_gt(damaged, 0);
    rig_close(&s->r);
    open_ssd_rig(s, 0);
    s->params.cluster_cache_rows = 0;
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    ck_assert_uint_eq(stats_of(s).layouts_found, LAYERS);
    kvs_sparse_stats before = stats_of(s);
    swarm_steps(s, 6, &seed);
    kvs_sparse_stats after = stats_of(s);
    ck_assert_uint_eq(after.rows_failed, 0);                      /* read again from their chunks */
    ck_assert_uint_gt(after.clusters_read, before.clusters_read); /* damaged ones among them */
    /* head 0 of layer 0 got none of its rows out of a cluster: all of them are damaged */
    ck_assert_uint_gt(after.rows_fetched - after.rows_from_clusters,
                      before.rows_fetched - before.rows_from_clusters);
    finish(s);
}
END_TEST

/* The manifests survive a restart but layer 0's clusters do not: the layer notices its reads
 * failing, profiles again and writes new clusters; no row is ever missing. */
START_TEST(clusters_lost_from_the_tier_are_written_again) {
    sparse_rig *s = malloc(sizeof *s);
    open_ssd_rig(s, 1);
    s->params.cluster_cache_rows = 0;
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    uint64_t seed = 41;
    swarm_steps(s, 3, &seed);
    ck_assert_uint_eq(stats_of(s).layouts_written, LAYERS);
    ck_assert_int_eq(api->sparse_end(s->r.h, "d"), KVS_OK);
    kvs_sparse_swarm_params sp = cluster_keys_of(s);
    /* a new handle finds every object the first wrote (the tier writes in the background);
     * layer 0's clusters are taken away through it */
    rig_close(&s->r);
    open_ssd_rig(s, 0);
    s->params.cluster_cache_rows = 0;
    const kvs_backend_ops *ops = kvs_tiers_ops(s->r.h->tiers, 0);
    void *state = kvs_tiers_state(s->r.h->tiers, 0);
    uint32_t removed = 0;
    for (uint32_t h = 0; h < HEADS; h++)
        for (uint32_t c = 0; c < 4096; c++) {
            kvs_key key = kvs_sparse_swarm_cluster_key(&sp, 0, 0, h, c);
            removed += ops->remove(state, &key) == KVS_OK;
        }
    ck_assert_uint_gt(removed, 0);
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    ck_assert_uint_eq(stats_of(s).layouts_found, LAYERS); /* the manifests are there */
    kvs_sparse_stats st;
    for (int round = 0; round < 40; round++) {
        swarm_steps(s, 1, &seed);
        st = stats_of(s);
        if (st.layouts_written) break;
    }
    ck_assert_uint_eq(st.layouts_written, 1); /* layer 0 again */
    ck_assert_uint_eq(st.rows_failed, 0);
    swarm_steps(s, 2, &seed);
    ck_assert_uint_gt(stats_of(s).rows_from_clusters, 0);
    finish(s);
}
END_TEST

/* Positional clusters need no profiling; maintenance re-clusters a layer whose clusters bring
 * rows it does not need (min_useful 1: any row unneeded is too many). */
START_TEST(positional_clusters_and_maintenance) {
    sparse_rig *s = malloc(sizeof *s);
    open_ssd_rig(s, 1);
    s->params.layout = KVS_SPARSE_LAYOUT_POSITIONS;
    s->params.cluster_cache_rows = 0;
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    uint64_t seed = 43;
    swarm_steps(s, 1, &seed);
    ck_assert_uint_eq(stats_of(s).layouts_written, LAYERS); /* at the first step */
    swarm_steps(s, 2, &seed);
    ck_assert_uint_gt(stats_of(s).rows_from_clusters, 0);
    ck_assert_int_eq(api->sparse_end(s->r.h, "d"), KVS_OK);
    s->params.layout = KVS_SPARSE_LAYOUT_SWARM;
    s->params.min_useful = 1.0f;
    memset(s->slot_rows, 0, sizeof s->slot_rows);
    ck_assert_int_eq(api->sparse_begin(s->r.h, "m", s->tokens, N_TOK, &s->cache, &s->params, NULL),
                     KVS_OK);
    kvs_sparse_stats st = {.struct_size = sizeof st};
    float q[HEADS * HEAD_DIM];
    for (int t = 0; t < 400 && !st.reclustered; t++) {
        random_q(q, &seed);
        for (int l = 0; l < LAYERS; l++) {
            ck_assert_int_eq(api->sparse_select(s->r.h, "m", (uint32_t)l, q, N_TOK, 0), KVS_OK);
            ck_assert_int_eq(api->sparse_wait(s->r.h, "m", (uint32_t)l), KVS_OK);
            expect_exact(s, l, q, N_TOK);
        }
        ck_assert_int_eq(api->sparse_stats(s->r.h, "m", &st), KVS_OK);
    }
    ck_assert_uint_gt(st.reclustered, 0);
    ck_assert_uint_eq(st.rows_failed, 0);
    api->sparse_end(s->r.h, "m");
    rig_close(&s->r);
    free(s);
}
END_TEST

/* Every slot of the layer holds a pool row with the pages' bytes, each row once. */
static void expect_rows_valid(sparse_rig *s, int layer, uint32_t n_rows) {
    for (int h = 0; h < HEADS; h++) {
        uint8_t seen[N_TOK + CHUNK] = {0};
        for (int slot = 0; slot < SLOTS; slot++) {
            uint32_t row = s->slot_rows[layer][h][slot];
            if (row == UINT32_MAX) continue;
            ck_assert_uint_ge(row, SINK);
            ck_assert_uint_lt(row, s->attend_from[layer][h]);
            ck_assert_uint_lt(s->attend_from[layer][h], n_rows + 1);
            ck_assert(!seen[row]);
            seen[row] = 1;
            ck_assert(!memcmp(s->k[layer][h][slot],
                              rig_kv_at(&s->r, layer, 0, s->blocks, row) + h * HEAD_BYTES,
                              HEAD_BYTES));
            ck_assert(!memcmp(s->v[layer][h][slot],
                              rig_kv_at(&s->r, layer, 1, s->blocks, row) + h * HEAD_BYTES,
                              HEAD_BYTES));
        }
    }
}

/* Swarm's retrieval: once a layer's clusters exist, a miss scores only their medoids and takes
 * whole clusters; the rows are pool rows with their bytes, never more than the slots. */
START_TEST(the_medoid_index_selects_by_medoid_scores_alone) {
    sparse_rig *s = malloc(sizeof *s);
    open_ssd_rig(s, 1);
    s->params.index = KVS_SPARSE_INDEX_MEDOIDS;
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    uint64_t seed = 47;
    swarm_steps(s, 3, &seed); /* exact while profiling */
    kvs_sparse_stats a = stats_of(s);
    ck_assert_uint_eq(a.medoid_selections, 0);
    ck_assert_uint_eq(a.layouts_written, LAYERS);
    float q[HEADS * HEAD_DIM];
    for (int t = 0; t < 6; t++) {
        random_q(q, &seed);
        for (int l = 0; l < LAYERS; l++) {
            step(s, l, q, N_TOK, KVS_SPARSE_FINAL);
            expect_rows_valid(s, l, N_TOK);
        }
    }
    kvs_sparse_stats b = stats_of(s);
    uint64_t misses = b.head_misses - a.head_misses;
    ck_assert_uint_eq(b.medoid_selections - a.medoid_selections, misses);
    /* an exact selection scores every row before the recent window; a medoid one, medoids */
    ck_assert_uint_eq(a.keys_scored, a.head_misses * (N_TOK - RECENT));
    ck_assert_uint_lt(b.keys_scored - a.keys_scored, misses * (N_TOK - RECENT));
    ck_assert_uint_eq(b.rows_failed, 0);
    api->sparse_end(s->r.h, "d");
    /* no cluster layout: no medoid index */
    s->params.layout = KVS_SPARSE_LAYOUT_ROWS;
    ck_assert_int_eq(api->sparse_begin(s->r.h, "e", s->tokens, N_TOK, &s->cache, &s->params, NULL),
                     KVS_EINVAL);
    rig_close(&s->r);
    free(s);
}
END_TEST

/* Adaptive thresholds: reused rows that lose attention against the exact top-k raise tau; heads
 * that lose none lower it. Every step audited here. */
START_TEST(thresholds_follow_the_measured_attention_error) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK);
    s->params.eta = 0.05f; /* reuse almost whatever the query: stale rows, errors */
    s->params.target_error = 0.001f;
    s->params.audit_every = 1;
    s->params.score_scale = 1.0f;
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    uint64_t seed = 53;
    float q[HEADS * HEAD_DIM];
    for (int t = 0; t < 40; t++) {
        random_q(q, &seed);
        for (int i = 0; i < HEADS * HEAD_DIM; i++) q[i] *= 4.0f; /* sharp softmax */
        step(s, 0, q, N_TOK, KVS_SPARSE_FINAL);
        expect_rows_valid(s, 0, N_TOK);
    }
    kvs_sparse_stats st = stats_of(s);
    ck_assert_uint_eq(st.audits, 40 * HEADS);
    ck_assert_uint_gt(st.audit_error_micro, 0);
    ck_assert_uint_gt(st.tau_raised, 0); /* (windows of misses alone lower it again) */
    ck_assert_int_eq(api->sparse_end(s->r.h, "d"), KVS_OK);
    /* a head that always selects afresh loses nothing: tau falls */
    s->params.eta = 0.999f;
    s->params.target_error = 0.5f;
    ck_assert_int_eq(begin(s, "d"), KVS_OK);
    for (int t = 0; t < 12; t++) {
        random_q(q, &seed);
        step(s, 0, q, N_TOK, KVS_SPARSE_FINAL);
    }
    st = stats_of(s);
    ck_assert_uint_gt(st.tau_lowered, 0);
    ck_assert_uint_eq(st.tau_raised, 0);
    api->sparse_end(s->r.h, "d");
    s->params.target_error = 2.0f;
    ck_assert_int_eq(begin(s, "d"), KVS_EINVAL);
    rig_close(&s->r);
    free(s);
}
END_TEST

START_TEST(swarm_needs_an_ssd_tier) {
    sparse_rig *s = malloc(sizeof *s);
    open_rig(s, N_TOK); /* dram only */
    s->params.layout = KVS_SPARSE_LAYOUT_SWARM;
    ck_assert_int_eq(begin(s, "d"), KVS_ENOTSUP);
    s->params.layout = KVS_SPARSE_LAYOUT_POSITIONS + 1;
    ck_assert_int_eq(begin(s, "d"), KVS_EINVAL);
    rig_close(&s->r);
    free(s);
}
END_TEST

static Suite *suite(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    Suite *s = suite_create("sparse");
    TCase *tc = tcase_create("sparse");
    tcase_add_checked_fixture(tc, rig_setup, rig_teardown);
    tcase_add_test(tc, a_step_holds_the_exact_top_k_of_the_stored_rows_bit_for_bit);
    tcase_add_test(tc, a_hit_moves_nothing_and_a_miss_only_what_the_cache_lacks);
    tcase_add_test(tc, a_reusing_head_leaves_the_rows_since_its_selection_to_the_engine);
    tcase_add_test(tc, a_wrong_speculation_is_corrected_and_a_right_one_kept);
    tcase_add_test(tc, a_damaged_row_is_never_handed_over);
    tcase_add_test(tc, a_chunk_damaged_before_begin_is_never_selected);
    tcase_add_test(tc, a_second_begin_takes_the_chunks_saved_since);
    tcase_add_test(tc, bad_calls_are_refused);
    tcase_add_test(tc, swarm_clusters_serve_the_exact_rows_and_survive_a_restart);
    tcase_add_test(tc, a_damaged_cluster_is_never_handed_over);
    tcase_add_test(tc, clusters_lost_from_the_tier_are_written_again);
    tcase_add_test(tc, positional_clusters_and_maintenance);
    tcase_add_test(tc, the_medoid_index_selects_by_medoid_scores_alone);
    tcase_add_test(tc, thresholds_follow_the_measured_attention_error);
    tcase_add_test(tc, swarm_needs_an_ssd_tier);
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
