/* test_step_update.c - build_meta_update (ABI 1.10) through the ABI table: driven through the same
 * random steps as build_meta on a twin handle it builds the same metadata, byte for byte, and the
 * workers move the same chunks; a decode step of a long request costs the workers nothing to read;
 * deltas that do not fit what the library holds are refused and change nothing. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "connector/handle.h"
#include "connector/meta.h"
#include "tests/support/connector_rig.h"
#include "tests/support/rng.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* A dram tier of 64 chunks with leases of 30 s that saves decode chunks too. */
static const char *decode_config(const char *name) {
    char text[512];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\nlease_timeout_ms: 30000\nsave_decode: true\npool:\n"
             "  staging_bytes: 1MiB\ntiers:\n  - name: dram\n    type: dram\n    capacity: %d\n",
             rig_device_section(), CHUNK, 64 * 12288);
    return rig_config(name, text);
}

enum { SLOTS = 4, SLOT_BLOCKS = 15, MAX_TOKENS = SLOT_BLOCKS * BT, PREFIXES = 3 };

/* One request as the engine's scheduler sees it, and what the update path last sent of it. */
typedef struct engine_req {
    int live, paused;
    char id[16];
    int32_t tokens[MAX_TOKENS];
    uint64_t n_tokens, n_computed;
    uint32_t blocks[SLOT_BLOCKS];
    uint64_t sent_tokens, sent_blocks; /* what the library holds: tokens_from is at most these */
} engine_req;

typedef struct twin {
    rig full, delta; /* build_meta on one, build_meta_update on the other */
    engine_req req[SLOTS];
    int32_t prefix[PREFIXES][MAX_TOKENS];
    uint64_t rng;
    uint64_t next_id;
    uint64_t loads, saves, rollbacks, resumes, overflows;
} twin;

/* One step of the single update u through build_meta_update into meta (cap bytes, *len written),
 * decoded as rank 0 reads it; the caller frees what it returns with kvs_meta_free. */
static kvs_meta *update_decoded(rig *r, const kvs_step_update *u, uint8_t *meta, uint64_t cap,
                                uint64_t *len) {
    ck_assert_int_eq(api->build_meta_update(r->h, u, 1, meta, cap, len), KVS_OK);
    kvs_meta *m = NULL;
    char err[256];
    ck_assert_msg(kvs_meta_decode(meta, *len, 0, &m, err, sizeof err) == KVS_OK, "%s", err);
    return m;
}

static uint64_t blocks_for(uint64_t tokens) {
    return (tokens + BT - 1) / BT;
}

/* Lookup and on_alloc of slot k's request on both handles, which must agree; it computes from the
 * hit on. The library now holds its tokens and block table. */
static void admit(twin *t, engine_req *e) {
    kvs_lookup_result a = {.struct_size = sizeof a}, b = {.struct_size = sizeof b};
    ck_assert_int_eq(api->lookup(t->full.h, e->id, e->tokens, e->n_tokens, 0, &a), KVS_OK);
    ck_assert_int_eq(api->lookup(t->delta.h, e->id, e->tokens, e->n_tokens, 0, &b), KVS_OK);
    ck_assert_uint_eq(a.n_hit_tokens, b.n_hit_tokens);
    uint64_t nb = blocks_for(e->n_tokens);
    ck_assert_int_eq(api->on_alloc(t->full.h, e->id, e->blocks, nb, a.n_hit_tokens), KVS_OK);
    ck_assert_int_eq(api->on_alloc(t->delta.h, e->id, e->blocks, nb, b.n_hit_tokens), KVS_OK);
    e->n_computed = a.n_hit_tokens;
    e->sent_tokens = e->n_tokens;
    e->sent_blocks = nb;
}

static void start_request(twin *t, int k) {
    engine_req *e = &t->req[k];
    memset(e, 0, sizeof *e);
    e->live = 1;
    snprintf(e->id, sizeof e->id, "r%llu", (unsigned long long)t->next_id++);
    uint32_t p = kvs_test_rng_below(&t->rng, PREFIXES);
    e->n_tokens = 20 + kvs_test_rng_below(&t->rng, 140);
    memcpy(e->tokens, t->prefix[p], e->n_tokens * sizeof *e->tokens);
    rig_blocks_from(e->blocks, SLOT_BLOCKS, (uint32_t)(k * SLOT_BLOCKS));
    admit(t, e);
}

/* The worker half of a step on a rig: bind, load, save (the pages' bytes do not matter here). */
static void worker_step(rig *r, const void *meta, uint64_t len) {
    ck_assert_int_eq(api->bind_meta(r->h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(r->h), KVS_OK);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->wait_layer_load(r->h, l), KVS_OK);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->save_layer(r->h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(r->h), KVS_OK);
}

/* One engine step: each live, unpaused request is scheduled (prefill chunks, then decode with one
 * new token, sometimes a rollback of its last tokens), both builds run and must agree byte for byte,
 * and both workers run the step. */
static void step(twin *t) {
    kvs_step_request full[SLOTS];
    kvs_step_update delta[SLOTS];
    uint64_t n = 0, scheduled[SLOTS];
    int order[SLOTS];
    for (int k = 0; k < SLOTS; k++) {
        engine_req *e = &t->req[k];
        if (!e->live || e->paused) continue;
        uint64_t keep = e->n_tokens;        /* tokens the library's copy keeps */
        if (e->n_computed == e->n_tokens) { /* decode */
            if (e->n_tokens > 40 && kvs_test_rng_below(&t->rng, 8) == 0) {
                uint64_t back = 1 + kvs_test_rng_below(&t->rng, 3); /* rejected draft tokens */
                e->n_tokens -= back;
                e->n_computed = e->n_tokens;
                keep = e->n_tokens;
                t->rollbacks++;
            }
            e->tokens[e->n_tokens++] = (int32_t)kvs_test_rng_below(&t->rng, 1000);
        }
        uint64_t left = e->n_tokens - e->n_computed;
        uint64_t s = left == 1 ? 1 : 1 + kvs_test_rng_below(&t->rng, (uint32_t)left);
        uint64_t nb = blocks_for(e->n_tokens);
        uint64_t tf = keep < e->sent_tokens ? keep : e->sent_tokens;
        uint64_t bf = nb < e->sent_blocks ? nb : e->sent_blocks;
        full[n] =
            (kvs_step_request){e->id, e->tokens, e->n_tokens, e->blocks, nb, e->n_computed, s};
        delta[n] = (kvs_step_update){.struct_size = sizeof delta[n],
                                     .req_id = e->id,
                                     .tokens_from = tf,
                                     .tokens = e->tokens + tf,
                                     .n_tokens = e->n_tokens - tf,
                                     .blocks_from = bf,
                                     .block_ids = e->blocks + bf,
                                     .n_block_ids = nb - bf,
                                     .n_computed = e->n_computed,
                                     .n_scheduled = s};
        scheduled[n] = s;
        order[n++] = k;
    }
    static uint8_t a[1 << 16], b[1 << 16];
    uint64_t la = 0, lb = 0, need = 0;
    if (kvs_test_rng_below(&t->rng, 4) == 0) { /* too small a buffer changes nothing */
        kvs_status st = api->build_meta_update(t->delta.h, delta, n, b, 8, &need);
        ck_assert_msg(st == KVS_EOVERFLOW, "%d: %s", st, api->last_error(t->delta.h));
        ck_assert_uint_gt(need, 8);
        t->overflows++;
    }
    ck_assert_int_eq(api->build_meta(t->full.h, full, n, a, sizeof a, &la), KVS_OK);
    kvs_status st = api->build_meta_update(t->delta.h, delta, n, b, sizeof b, &lb);
    ck_assert_msg(st == KVS_OK, "%d: %s", st, api->last_error(t->delta.h));
    ck_assert_uint_eq(la, lb);
    if (need) ck_assert_uint_eq(need, lb);
    ck_assert_mem_eq(a, b, la);
    kvs_meta *m = NULL;
    char err[256];
    ck_assert_int_eq(kvs_meta_decode(b, lb, 0, &m, err, sizeof err), KVS_OK);
    for (uint64_t i = 0; i < m->n_reqs; i++) {
        t->loads += m->reqs[i].n_loads;
        t->saves += m->reqs[i].n_saves;
        ck_assert(m->reqs[i].n_loads || m->reqs[i].n_saves || m->reqs[i].load_async);
    }
    kvs_meta_free(m);
    worker_step(&t->full, a, la);
    worker_step(&t->delta, b, lb);
    for (uint64_t i = 0; i < n; i++) {
        engine_req *e = &t->req[order[i]];
        e->n_computed += scheduled[i];
        e->sent_tokens = e->n_tokens;
        e->sent_blocks = blocks_for(e->n_tokens);
    }
}

static void finish(twin *t, engine_req *e) {
    ck_assert_int_eq(api->request_finished(t->full.h, e->id, NULL), KVS_OK);
    ck_assert_int_eq(api->request_finished(t->delta.h, e->id, NULL), KVS_OK);
    e->live = 0;
}

START_TEST(random_steps_build_the_same_metadata_from_deltas_as_from_whole_lists) {
    twin *t = calloc(1, sizeof *t);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(rig_open(&t->full, KVS_ROLE_BOTH, decode_config("full.yaml")), KVS_OK);
    ck_assert_int_eq(rig_open(&t->delta, KVS_ROLE_BOTH, decode_config("delta.yaml")), KVS_OK);
    t->rng = 0x5eed0000u + (uint64_t)_i;
    for (int p = 0; p < PREFIXES; p++) rig_make_tokens(t->prefix[p], MAX_TOKENS, 40 + p);
    for (int s = 0; s < 400; s++) {
        for (int k = 0; k < SLOTS; k++) {
            engine_req *e = &t->req[k];
            uint32_t roll = kvs_test_rng_below(&t->rng, 16);
            if (!e->live) {
                if (roll < 6) start_request(t, k);
            } else if (e->paused) {
                if (roll < 4) { /* resumed: computed again from what the tiers hold */
                    e->paused = 0;
                    admit(t, e);
                    t->resumes++;
                }
            } else if (e->n_tokens + 4 >= MAX_TOKENS || roll == 0) {
                finish(t, e);
            } else if (roll == 1) {
                e->paused = 1; /* preempted: its pages are gone */
            }
        }
        step(t);
    }
    for (int k = 0; k < SLOTS; k++)
        if (t->req[k].live) finish(t, &t->req[k]);
    ck_assert_uint_gt(t->loads, 10);
    ck_assert_uint_gt(t->saves, 20);
    ck_assert_uint_gt(t->rollbacks, 3);
    ck_assert_uint_gt(t->resumes, 3);
    ck_assert_uint_gt(t->overflows, 10);
    kvs_stats sa = {.struct_size = sizeof sa}, sb = {.struct_size = sizeof sb};
    ck_assert_int_eq(api->stats(t->full.h, &sa), KVS_OK);
    ck_assert_int_eq(api->stats(t->delta.h, &sb), KVS_OK);
    ck_assert_uint_gt(sb.chunks_loaded, 0);
    ck_assert_uint_eq(sa.chunks_loaded, sb.chunks_loaded);
    ck_assert_uint_eq(sa.chunks_saved, sb.chunks_saved);
    ck_assert_uint_eq(sa.saves_skipped, sb.saves_skipped);
    ck_assert_uint_eq(sa.leases_active, sb.leases_active);
    rig_close(&t->full);
    rig_close(&t->delta);
    free(t);
}
END_TEST

/* A scheduler handle with request `id` of n tokens computed whole (its prompt steps done): the
 * length of the metadata of a decode step that completes no chunk, and that metadata's requests. */
static uint64_t decode_step_len(rig *r, const char *id, uint64_t n, uint64_t *n_reqs) {
    int32_t *tokens = malloc((n + 1) * sizeof *tokens);
    uint64_t nb = n / BT + 1;
    uint32_t *blocks = malloc(nb * sizeof *blocks);
    ck_assert(tokens && blocks);
    rig_make_tokens(tokens, n + 1, 5);
    for (uint64_t i = 0; i < nb; i++) blocks[i] = (uint32_t)i;
    kvs_step_update u = {.struct_size = sizeof u,
                         .req_id = id,
                         .tokens = tokens,
                         .n_tokens = n,
                         .block_ids = blocks,
                         .n_block_ids = n / BT,
                         .n_scheduled = n};
    static uint8_t buf[4 << 20];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta_update(r->h, &u, 1, buf, sizeof buf, &len), KVS_OK);
    /* the decode step: one token, one block more */
    u = (kvs_step_update){.struct_size = sizeof u,
                          .req_id = id,
                          .tokens_from = n,
                          .tokens = tokens + n,
                          .n_tokens = 1,
                          .blocks_from = n / BT,
                          .block_ids = blocks + n / BT,
                          .n_block_ids = 1,
                          .n_computed = n,
                          .n_scheduled = 1};
    ck_assert_int_eq(api->build_meta_update(r->h, &u, 1, buf, sizeof buf, &len), KVS_OK);
    kvs_meta *m = NULL;
    char err[256];
    ck_assert_int_eq(kvs_meta_decode(buf, len, 0, &m, err, sizeof err), KVS_OK);
    *n_reqs = m->n_reqs;
    kvs_meta_free(m);
    free(tokens);
    free(blocks);
    return len;
}

START_TEST(a_decode_step_of_a_long_request_carries_nothing_per_request) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_SCHEDULER, decode_config("decode.yaml")), KVS_OK);
    uint64_t short_reqs = 1, long_reqs = 1;
    uint64_t short_len = decode_step_len(&r, "short", 1024, &short_reqs);
    uint64_t long_len = decode_step_len(&r, "long", 65536, &long_reqs);
    ck_assert_uint_eq(short_reqs, 0);
    ck_assert_uint_eq(long_reqs, 0);
    ck_assert_uint_eq(long_len, short_len); /* the blob does not grow with the context */
    ck_assert_uint_lt(long_len, 64);
    rig_close(&r);
}
END_TEST

START_TEST(deltas_past_what_the_library_holds_are_refused_and_change_nothing) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_SCHEDULER, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t b[8];
    rig_make_tokens(t, 128, 3);
    rig_blocks_from(b, 8, 0);
    uint8_t meta[65536];
    uint64_t len = 0;
    kvs_step_update u = {.struct_size = sizeof u,
                         .req_id = "a",
                         .tokens_from = 1, /* a new request holds nothing */
                         .tokens = t,
                         .n_tokens = 96,
                         .block_ids = b,
                         .n_block_ids = 4,
                         .n_scheduled = 64};
    ck_assert_int_eq(api->build_meta_update(r.h, &u, 1, meta, sizeof meta, &len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "tokens_from 1"));
    u.tokens_from = 0;
    ck_assert_int_eq(api->build_meta_update(r.h, &u, 1, meta, sizeof meta, &len), KVS_OK);
    /* the library holds 96 tokens and 4 blocks of "a" now */
    kvs_step_update v = {.struct_size = sizeof v,
                         .req_id = "a",
                         .tokens_from = 97,
                         .tokens = t + 64,
                         .n_tokens = 32,
                         .blocks_from = 4,
                         .block_ids = b + 4,
                         .n_block_ids = 2,
                         .n_computed = 64,
                         .n_scheduled = 32};
    ck_assert_int_eq(api->build_meta_update(r.h, &v, 1, meta, sizeof meta, &len), KVS_EINVAL);
    v.tokens_from = 64;
    v.blocks_from = 5;
    ck_assert_int_eq(api->build_meta_update(r.h, &v, 1, meta, sizeof meta, &len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "blocks_from 5"));
    v.blocks_from = 4;
    int32_t bad[32];
    memcpy(bad, t + 64, sizeof bad);
    bad[31] = -1;
    v.tokens = bad;
    ck_assert_int_eq(api->build_meta_update(r.h, &v, 1, meta, sizeof meta, &len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "token -1"));
    v.tokens = t + 64;
    kvs_step_update twice[2] = {v, v};
    ck_assert_int_eq(api->build_meta_update(r.h, twice, 2, meta, sizeof meta, &len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "named twice"));
    v.struct_size = KVS_STEP_UPDATE_SIZE_1_10 - 8;
    ck_assert_int_eq(api->build_meta_update(r.h, &v, 1, meta, sizeof meta, &len), KVS_EINVAL);
    v.struct_size = sizeof v;
    v.n_scheduled = 33; /* past its 96 tokens */
    ck_assert_int_eq(api->build_meta_update(r.h, &v, 1, meta, sizeof meta, &len), KVS_EINVAL);
    v.n_scheduled = 32;
    /* nothing refused changed "a": the right delta saves chunk 2 (tokens 64..95) only */
    ck_assert_int_eq(api->build_meta_update(r.h, &v, 1, meta, sizeof meta, &len), KVS_OK);
    kvs_meta *m = NULL;
    char err[256];
    ck_assert_int_eq(kvs_meta_decode(meta, len, 0, &m, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(m->n_reqs, 1);
    ck_assert_uint_eq(m->reqs[0].n_saves, 1);
    ck_assert_uint_eq(m->reqs[0].saves[0].chunk_first, 64);
    /* its block ids are those of chunk 2 only: blocks 4 and 5 */
    ck_assert_uint_eq(m->reqs[0].block_first, 4);
    ck_assert_uint_eq(m->reqs[0].n_block_ids, 2);
    ck_assert_uint_eq(m->reqs[0].block_ids[0], b[4]);
    kvs_meta_free(m);
    /* the same request given whole to build_meta on a twin keys chunk 2 the same */
    rig other;
    ck_assert_int_eq(rig_open(&other, KVS_ROLE_SCHEDULER, rig_dram_config(64, 30000)), KVS_OK);
    kvs_step_request s = {"a", t, 96, b, 4, 0, 64};
    uint8_t meta2[65536];
    uint64_t len2 = 0;
    ck_assert_int_eq(api->build_meta(other.h, &s, 1, meta2, sizeof meta2, &len2), KVS_OK);
    s = (kvs_step_request){"a", t, 96, b, 6, 64, 32};
    ck_assert_int_eq(api->build_meta(other.h, &s, 1, meta2, sizeof meta2, &len2), KVS_OK);
    ck_assert_uint_eq(len2, len);
    ck_assert_mem_eq(meta2, meta, len);
    rig_close(&other);
    rig_close(&r);
}
END_TEST

/* A request that holds its first chunk itself loads the rest from its first sighting's tokens and
 * blocks (lookup, on_alloc); the step also saves its chunks (workers skip the stored ones), and a
 * step with a load carries a saving request's whole prefix of blocks (a failed load there would
 * taint its saves). The loaded KV lands in its own blocks. */
START_TEST(a_load_from_held_state_lands_in_its_own_blocks) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 11);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 32, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 95);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 95), KVS_OK);
    rig_write_kv(&r, b, t, 0, 32); /* what the engine held */
    /* lookup and on_alloc gave the library its tokens and blocks: nothing new to send */
    kvs_step_update u = {.struct_size = sizeof u,
                         .req_id = "two",
                         .tokens_from = 128,
                         .blocks_from = 8,
                         .n_computed = 127,
                         .n_scheduled = 1};
    uint8_t meta[65536];
    uint64_t len = 0;
    kvs_meta *m = update_decoded(&r, &u, meta, sizeof meta, &len);
    ck_assert_uint_eq(m->n_reqs, 1);
    ck_assert_uint_eq(m->reqs[0].n_loads, 3);
    ck_assert_uint_eq(m->reqs[0].loads[0].first_token, 32);
    ck_assert_uint_eq(m->reqs[0].n_saves, 4);
    ck_assert_uint_eq(m->reqs[0].block_first, 0);
    ck_assert_uint_eq(m->reqs[0].n_block_ids, 8);
    ck_assert_uint_eq(m->reqs[0].block_ids[2], b[2]);
    kvs_meta_free(m);
    rig_worker_step(&r, meta, len, b, t, 127, 128);
    ck_assert(rig_kv_matches(&r, b, t, 0, 128));
    rig_close(&r);
}
END_TEST

/* A worker refuses metadata whose load or save lies before the request's first carried block. */
START_TEST(a_move_before_the_carried_block_ids_is_refused_at_bind) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    uint32_t blocks[2] = {3, 4};
    kvs_meta_save save = {.chunk_first = 0};
    kvs_meta_req req = {.id = "r",
                        .block_ids = blocks,
                        .n_block_ids = 2,
                        .block_first = 2,
                        .saves = &save,
                        .n_saves = 1};
    kvs_meta m = {.step = 1,
                  .group_fingerprint = r.h->group_fingerprint,
                  .key_ranks = 1,
                  .chunk_tokens = CHUNK,
                  .reqs = &req,
                  .n_reqs = 1};
    void *blob = NULL;
    uint64_t len = 0;
    ck_assert_int_eq(kvs_meta_encode(&m, &blob, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, blob, len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "before its block ids"));
    free(blob);
    save.chunk_first = CHUNK; /* tokens 32..63: blocks 2 and 3 of its table, both carried */
    ck_assert_int_eq(kvs_meta_encode(&m, &blob, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, blob, len), KVS_OK);
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    free(blob);
    rig_close(&r);
}
END_TEST

/* A sliding-window group's table gives the blocks out of its window as KVS_BLOCK_NONE: a chunk
 * touching one is not saved (its KV is gone) while the later chunks are, and a load into one is
 * refused; a load from the first block the window holds lands whole. */
START_TEST(chunks_over_freed_blocks_are_not_saved_and_loads_into_them_are_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 17);
    rig_blocks_from(a, 8, 0);
    a[0] = KVS_BLOCK_NONE; /* tokens 0..15 left the window: chunk 0 cannot be saved */
    kvs_step_update u = {.struct_size = sizeof u,
                         .req_id = "one",
                         .tokens = t,
                         .n_tokens = 128,
                         .block_ids = a,
                         .n_block_ids = 8,
                         .n_computed = 0,
                         .n_scheduled = 128};
    uint8_t meta[65536];
    uint64_t len = 0;
    kvs_meta *m = update_decoded(&r, &u, meta, sizeof meta, &len);
    ck_assert_uint_eq(m->n_reqs, 1);
    ck_assert_uint_eq(m->reqs[0].n_saves, 3);
    ck_assert_uint_eq(m->reqs[0].saves[0].chunk_first, CHUNK);
    ck_assert_uint_eq(m->reqs[0].block_first, 2);
    kvs_meta_free(m);
    rig_worker_step(&r, meta, len, a, t, BT, 128); /* the engine holds blocks 1.. only */
    /* another request finds chunks 1..3 only from token 32 on, and none from 0 */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 40, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127 - 40);
    rig_blocks_from(b, 8, 40);
    b[1] = KVS_BLOCK_NONE; /* tokens 16..31: before the load (from 40): allowed */
    b[2] = KVS_BLOCK_NONE; /* tokens 32..47: in the load: refused */
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 127 - 40), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "KVS_BLOCK_NONE"));
    b[2] = 42;
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 127 - 40), KVS_OK);
    u = (kvs_step_update){.struct_size = sizeof u,
                          .req_id = "two",
                          .tokens_from = 128,
                          .blocks_from = 8,
                          .n_computed = 127,
                          .n_scheduled = 1};
    m = update_decoded(&r, &u, meta, sizeof meta, &len);
    ck_assert_uint_eq(m->reqs[0].n_loads, 3);
    ck_assert_uint_eq(m->reqs[0].loads[0].first_token, 40);
    for (uint64_t i = 0; i < m->reqs[0].n_saves; i++) /* chunks 0 (block 1) and 1 (block 2) */
        ck_assert_uint_ge(m->reqs[0].saves[i].chunk_first, CHUNK);
    kvs_meta_free(m);
    rig_worker_step(&r, meta, len, b, t, 127, 128);
    ck_assert(rig_kv_matches(&r, b, t, 40, 128));
    rig_close(&r);
}
END_TEST

static Suite *step_update_suite(void) {
    Suite *s = suite_create("step_update");
    TCase *tc = tcase_create("step_update");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, random_steps_build_the_same_metadata_from_deltas_as_from_whole_lists, 0,
                        4);
    tcase_add_test(tc, a_decode_step_of_a_long_request_carries_nothing_per_request);
    tcase_add_test(tc, deltas_past_what_the_library_holds_are_refused_and_change_nothing);
    tcase_add_test(tc, a_load_from_held_state_lands_in_its_own_blocks);
    tcase_add_test(tc, a_move_before_the_carried_block_ids_is_refused_at_bind);
    tcase_add_test(tc, chunks_over_freed_blocks_are_not_saved_and_loads_into_them_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(step_update_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
