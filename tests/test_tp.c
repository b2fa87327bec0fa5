/* test_tp.c - tensor parallelism as vLLM runs it: one scheduler-role handle answers for every rank,
 * and one worker-role handle per rank binds the same metadata, each saving and restoring its own
 * rank's shard. The three handles share one DRAM tier in shared memory, as the scheduler's and the
 * workers' processes would. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/kvstrata.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/meta.h"
#include "tests/support/connector_rig.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* A 4MiB DRAM tier in shared memory named for this test alone. */
static const char *shared_config(void) {
    static int serial;
    char text[512];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n  - name: dram\n"
             "    type: dram\n    capacity: 4MiB\n    options:\n      shm_name: kvs-tp-%d-%d\n",
             rig_device_section(), CHUNK, (int)getpid(), serial++);
    return rig_config("tp.yaml", text);
}

static kvs_model_desc tp_model(uint32_t tp_size, uint32_t tp_rank, int mla) {
    kvs_model_desc m = rig_model();
    m.tp_size = tp_size;
    m.tp_rank = tp_rank;
    if (mla) { /* one latent of HEADS * HEAD_DIM: a token is still TOKEN_BYTES */
        m.is_mla = 1;
        m.n_kv_heads = 1;
        m.head_dim = HEADS * HEAD_DIM;
    }
    return m;
}

/* The scheduler and the two ranks' workers of one deployment. */
typedef struct tp_rig {
    rig sched;
    rig rank[2];
} tp_rig;

static void tp_open(tp_rig *t, int mla) {
    const char *cfg = shared_config();
    kvs_model_desc ms = tp_model(2, 0, mla), m0 = tp_model(2, 0, mla), m1 = tp_model(2, 1, mla);
    ck_assert_int_eq(rig_open_model(&t->sched, KVS_ROLE_SCHEDULER, cfg, &ms), KVS_OK);
    ck_assert_int_eq(rig_open_model(&t->rank[0], KVS_ROLE_WORKER, cfg, &m0), KVS_OK);
    ck_assert_int_eq(rig_open_model(&t->rank[1], KVS_ROLE_WORKER, cfg, &m1), KVS_OK);
    /* each rank computes its own shard of the heads: other bytes, unless the latent is shared */
    t->rank[1].kv_seed = mla ? 0 : 1;
}

static void tp_close(tp_rig *t) {
    rig_close(&t->rank[1]);
    rig_close(&t->rank[0]);
    rig_close(&t->sched);
}

static uint64_t lookup(rig *s, const char *id, const int32_t *t, uint64_t n) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s->h, id, t, n, 0, &res), KVS_OK);
    return res.n_hit_tokens;
}

/* One prefill step of request id over blocks, hit tokens loaded, the rest computed: the scheduler
 * builds the metadata and the workers in `ranks` (bit r: rank r) run it. */
static void prefill(tp_rig *t, unsigned ranks, const char *id, const int32_t *tok, uint64_t n,
                    const uint32_t *blocks, uint64_t hit) {
    uint64_t nb = (n + BT - 1) / BT;
    ck_assert_int_eq(api->on_alloc(t->sched.h, id, blocks, nb, hit), KVS_OK);
    kvs_step_request s = {id, tok, n, blocks, nb, hit, n - hit};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(t->sched.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    for (int r = 0; r < 2; r++)
        if (ranks >> r & 1) rig_worker_step(&t->rank[r], meta, len, blocks, tok, hit, n);
}

static uint64_t chunks_loaded(rig *r) {
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r->h, &st), KVS_OK);
    return st.chunks_loaded;
}

START_TEST(one_scheduler_serves_both_ranks_and_each_restores_its_own_shard) {
    tp_rig t;
    tp_open(&t, 0);
    int32_t tok[128];
    uint32_t a[8], b[8];
    rig_make_tokens(tok, 128, 61);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 24);
    /* Step 1: request a computes its 4 chunks on both ranks; each rank saves its own shard. */
    ck_assert_uint_eq(lookup(&t.sched, "a", tok, 128), 0);
    prefill(&t, 3, "a", tok, 128, a, 0);
    for (uint64_t c = 0; c < 4; c++) {
        ck_assert(rig_stored(&t.rank[0], tok, c));
        ck_assert(rig_stored(&t.rank[1], tok, c));
    }
    ck_assert(memcmp(&t.rank[0].h->fingerprint, &t.rank[1].h->fingerprint, sizeof(kvs_key)) != 0);
    /* Step 2: request b with the same prompt is a hit for both ranks; each worker restores exactly
     * its own rank's bytes into other blocks (the two ranks' bytes differ). */
    ck_assert_uint_eq(lookup(&t.sched, "b", tok, 128), 127);
    prefill(&t, 3, "b", tok, 128, b, 127);
    for (int r = 0; r < 2; r++) {
        ck_assert(rig_kv_matches(&t.rank[r], b, tok, 0, 128));
        ck_assert_uint_eq(chunks_loaded(&t.rank[r]), 4);
    }
    rig probe = t.rank[1]; /* rank 1's pages read as rank 0's would not match */
    probe.kv_seed = 0;
    ck_assert(!rig_kv_matches(&probe, b, tok, 0, 32));
    ck_assert_int_eq(api->request_finished(t.sched.h, "a", NULL), KVS_OK);
    ck_assert_int_eq(api->request_finished(t.sched.h, "b", NULL), KVS_OK);
    tp_close(&t);
}
END_TEST

START_TEST(a_chunk_one_rank_lacks_ends_the_hit_for_all) {
    tp_rig t;
    tp_open(&t, 0);
    int32_t tok[128];
    uint32_t a[8], b[8], c[8];
    rig_make_tokens(tok, 128, 62);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 16);
    rig_blocks_from(c, 8, 32);
    ck_assert_uint_eq(lookup(&t.sched, "a", tok, 128), 0);
    prefill(&t, 3, "a", tok, 128, a, 0);
    /* Rank 1's shard of chunk 2 goes (as if its tier evicted it); rank 0's stays. */
    kvs_key k1[4];
    kvs_keys_chain(&t.rank[1].h->fingerprint, tok, 4, CHUNK, k1);
    kvs_tiers_remove(t.rank[1].h->tiers, &k1[2]);
    ck_assert(!rig_stored(&t.rank[1], tok, 2));
    ck_assert(rig_stored(&t.rank[0], tok, 2) && rig_stored(&t.rank[0], tok, 3));
    ck_assert(rig_stored(&t.rank[1], tok, 3));
    /* The hit stops before chunk 2 for both ranks: no rank could restore past it. */
    ck_assert_uint_eq(lookup(&t.sched, "b", tok, 128), 2 * CHUNK);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(t.sched.h, &st), KVS_OK);
    ck_assert_uint_eq(st.leases_active, 1);
    /* Both restore chunks 0 and 1 and compute the rest; the step saves chunk 2 again (rank 0's
     * worker finds its shard stored and skips it, rank 1's stores its own). */
    prefill(&t, 3, "b", tok, 128, b, 2 * CHUNK);
    for (int r = 0; r < 2; r++) {
        ck_assert(rig_kv_matches(&t.rank[r], b, tok, 0, 128));
        ck_assert_uint_eq(chunks_loaded(&t.rank[r]), 2);
    }
    ck_assert(rig_stored(&t.rank[1], tok, 2));
    /* Whole again: a third request hits every chunk on both ranks. */
    ck_assert_uint_eq(lookup(&t.sched, "c", tok, 128), 127);
    prefill(&t, 3, "c", tok, 128, c, 127);
    for (int r = 0; r < 2; r++) ck_assert(rig_kv_matches(&t.rank[r], c, tok, 0, 128));
    tp_close(&t);
}
END_TEST

START_TEST(a_chunk_only_one_rank_saved_is_no_hit) {
    tp_rig t;
    tp_open(&t, 0);
    int32_t tok[128];
    uint32_t a[8];
    rig_make_tokens(tok, 128, 63);
    rig_blocks_from(a, 8, 0);
    /* Only rank 0's worker ran the step: rank 1 never saved a shard. */
    ck_assert_uint_eq(lookup(&t.sched, "a", tok, 128), 0);
    prefill(&t, 1, "a", tok, 128, a, 0);
    ck_assert(rig_stored(&t.rank[0], tok, 0) && !rig_stored(&t.rank[1], tok, 0));
    ck_assert_uint_eq(lookup(&t.sched, "b", tok, 128), 0);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(t.sched.h, &st), KVS_OK);
    ck_assert_uint_eq(st.leases_active, 0); /* rank 0's pins went with the miss */
    tp_close(&t);
}
END_TEST

START_TEST(metadata_of_another_tensor_parallel_size_is_refused) {
    const char *cfg = shared_config();
    kvs_model_desc m4 = tp_model(4, 0, 0), m2 = tp_model(2, 1, 0), m43 = tp_model(4, 3, 0),
                   m1 = tp_model(1, 0, 0), s2 = tp_model(2, 0, 0);
    rig s4, s, w1, w3, w0;
    ck_assert_int_eq(rig_open_model(&s4, KVS_ROLE_SCHEDULER, cfg, &m4), KVS_OK);
    ck_assert_int_eq(rig_open_model(&s, KVS_ROLE_SCHEDULER, cfg, &s2), KVS_OK);
    ck_assert_int_eq(rig_open_model(&w1, KVS_ROLE_WORKER, cfg, &m2), KVS_OK);
    ck_assert_int_eq(rig_open_model(&w3, KVS_ROLE_WORKER, cfg, &m43), KVS_OK);
    ck_assert_int_eq(rig_open_model(&w0, KVS_ROLE_WORKER, cfg, &m1), KVS_OK);
    int32_t tok[64];
    uint32_t a[4];
    rig_make_tokens(tok, 64, 64);
    rig_blocks_from(a, 4, 0);
    kvs_step_request step = {"a", tok, 64, a, 4, 0, 64};
    uint8_t meta4[65536], meta2[65536];
    uint64_t len4 = 0, len2 = 0;
    ck_assert_int_eq(api->build_meta(s4.h, &step, 1, meta4, sizeof meta4, &len4), KVS_OK);
    ck_assert_int_eq(api->build_meta(s.h, &step, 1, meta2, sizeof meta2, &len2), KVS_OK);
    /* rank 1 of 2 bound to metadata built for tp_size 4 */
    ck_assert_int_eq(api->bind_meta(w1.h, meta4, len4), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(w1.h),
                                 "carries the keys of 4 tensor-parallel ranks, this worker's model "
                                 "has 2 (tp_size 2)"));
    /* rank 3 of 4 bound to metadata built for tp_size 2: no keys for it */
    ck_assert_int_eq(api->bind_meta(w3.h, meta2, len2), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(w3.h), "none for this worker's rank 3"));
    /* a one-rank worker bound to two ranks' metadata */
    ck_assert_int_eq(api->bind_meta(w0.h, meta2, len2), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(w0.h), "tensor-parallel"));
    /* the right size binds, and each worker is still usable after a refusal */
    ck_assert_int_eq(api->bind_meta(w1.h, meta2, len2), KVS_OK);
    ck_assert_int_eq(api->wait_save(w1.h), KVS_OK);
    /* the same tp_size with another model is the other sentence */
    kvs_model_desc other = tp_model(2, 1, 0);
    other.model_id = "another-model";
    rig wo;
    ck_assert_int_eq(rig_open_model(&wo, KVS_ROLE_WORKER, cfg, &other), KVS_OK);
    ck_assert_int_eq(api->bind_meta(wo.h, meta2, len2), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(wo.h), "another model, layout or chunk size"));
    rig_close(&wo);
    rig_close(&w0);
    rig_close(&w3);
    rig_close(&w1);
    rig_close(&s);
    rig_close(&s4);
}
END_TEST

START_TEST(mla_keys_stay_rank_agnostic) {
    tp_rig t;
    tp_open(&t, 1);
    ck_assert_uint_eq(t.sched.h->key_ranks, 1);
    ck_assert_mem_eq(&t.rank[0].h->fingerprint, &t.rank[1].h->fingerprint, sizeof(kvs_key));
    int32_t tok[128];
    uint32_t a[8], b[8];
    rig_make_tokens(tok, 128, 65);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    /* Only rank 0 saves: the latent is the same on every rank, so one copy serves both. */
    ck_assert_uint_eq(lookup(&t.sched, "a", tok, 128), 0);
    prefill(&t, 1, "a", tok, 128, a, 0);
    ck_assert(rig_stored(&t.rank[1], tok, 3));
    ck_assert_uint_eq(lookup(&t.sched, "b", tok, 128), 127);
    uint64_t nb = 8;
    ck_assert_int_eq(api->on_alloc(t.sched.h, "b", b, nb, 127), KVS_OK);
    kvs_step_request s = {"b", tok, 128, b, nb, 127, 1};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(t.sched.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    kvs_meta *m = NULL;
    char err[256];
    ck_assert_int_eq(kvs_meta_decode(meta, len, 0, &m, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(m->key_ranks, 1); /* one key per chunk */
    ck_assert_uint_eq(m->reqs[0].n_loads, 4);
    kvs_meta_free(m);
    for (int r = 0; r < 2; r++) {
        rig_worker_step(&t.rank[r], meta, len, b, tok, 127, 128);
        ck_assert(rig_kv_matches(&t.rank[r], b, tok, 0, 128));
        ck_assert_uint_eq(chunks_loaded(&t.rank[r]), 4);
    }
    tp_close(&t);
}
END_TEST

START_TEST(a_tensor_parallel_size_past_the_key_limit_is_refused_at_open) {
    kvs_model_desc m = tp_model(KVS_KEYS_MAX_RANKS + 1, 0, 0);
    rig r;
    ck_assert_int_eq(rig_open_model(&r, KVS_ROLE_SCHEDULER, NULL, &m), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(r.error, "tp_size 1025"));
    m = tp_model(KVS_KEYS_MAX_RANKS + 1, 7, 1); /* MLA: one key rank whatever the size */
    ck_assert_int_eq(rig_open_model(&r, KVS_ROLE_SCHEDULER, NULL, &m), KVS_OK);
    ck_assert_uint_eq(r.h->key_ranks, 1);
    rig_close(&r);
}
END_TEST

static Suite *tp_suite(void) {
    Suite *s = suite_create("tp");
    TCase *tc = tcase_create("tp");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, one_scheduler_serves_both_ranks_and_each_restores_its_own_shard);
    tcase_add_test(tc, a_chunk_one_rank_lacks_ends_the_hit_for_all);
    tcase_add_test(tc, a_chunk_only_one_rank_saved_is_no_hit);
    tcase_add_test(tc, metadata_of_another_tensor_parallel_size_is_refused);
    tcase_add_test(tc, mla_keys_stay_rank_agnostic);
    tcase_add_test(tc, a_tensor_parallel_size_past_the_key_limit_is_refused_at_open);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(tp_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
