/* test_scheduler.c - the scheduler-role hooks (connector/requests.c) through the ABI table: lookups,
 * leases on the handle's clock (moved on by the test, never slept through), on_alloc, build_meta and
 * request_finished, and the requests they refuse. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/meta.h"
#include "connector/requests.h"
#include "connector/tiers.h"
#include "tests/support/connector_rig.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* Leases of LEASE_MS that run out only when a test moves their clock past them (stall_ms). */
#define LEASE_MS 10000u

/* A rig with LEASE_MS leases and the 128 tokens of seed `seed` stored from blocks 0..7; b gets blocks
 * 20..27, where a second request restores them. */
static void lease_rig(rig *r, int32_t *t, uint32_t *b, int seed) {
    uint32_t a[8];
    ck_assert_int_eq(rig_open(r, KVS_ROLE_BOTH, rig_dram_config(64, LEASE_MS)), KVS_OK);
    rig_make_tokens(t, 128, seed);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);
    ck_assert_uint_eq(rig_prefill(r, "one", t, 128, a), 0);
}

/* A scheduler that stalls for ms: the leases' clock moves on (no sleeping, whatever the machine's load). */
static void stall_ms(rig *r, uint64_t ms) {
    kvs_clock_advance(&r->clock, ms * 1000000ull);
}

/* Lookup and on_alloc of 127 tokens of t into blocks b, then a stalled scheduler for stall_for ms. */
static void offer_and_alloc(rig *r, const char *id, const int32_t *t, const uint32_t *b,
                            uint64_t stall_for) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->on_alloc(r->h, id, b, 8, 127), KVS_OK);
    stall_ms(r, stall_for);
}

/* The worker step of a request whose 127 external tokens on_alloc accepted; returns the error blocks. */
static uint64_t load_accepted(rig *r, const char *id, const int32_t *t, const uint32_t *b,
                              uint32_t *errs) {
    kvs_step_request s = {id, t, 128, b, 8, 127, 1};
    uint8_t meta[65536];
    uint64_t len = 0, n = 0;
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    rig_worker_step(r, meta, len, b, t, 127, 128);
    ck_assert_int_eq(api->load_error_blocks(r->h, errs, 16, &n), KVS_OK);
    return n;
}

START_TEST(lookup_stops_at_first_missing_chunk) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8];
    rig_make_tokens(tokens, 128, 2);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "a", tokens, 128, a), 0);
    tokens[70] = (tokens[70] + 1) % 1000; /* chunk 2 differs, so chunks 2 and 3 are new prefixes */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "b", tokens, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 64);
    /* Tokens the engine already has are not counted again. */
    ck_assert_int_eq(api->lookup(r.h, "b", tokens, 128, 48, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 16);
    ck_assert_int_eq(api->lookup(r.h, "b", tokens, 128, 64, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    rig_close(&r);
}
END_TEST

START_TEST(a_lease_pins_until_it_expires) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(4, LEASE_MS)), KVS_OK);
    int32_t t1[128], t2[128], t3[128];
    uint32_t a[8];
    rig_blocks_from(a, 8, 0);
    rig_make_tokens(t1, 128, 21);
    rig_make_tokens(t2, 128, 22);
    rig_make_tokens(t3, 128, 23);
    ck_assert_uint_eq(rig_prefill(&r, "one", t1, 128, a), 0);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "holder", t1, 64, 0, &res), KVS_OK); /* pins chunks 0, 1 */
    ck_assert_uint_eq(res.n_hit_tokens, 63);
    ck_assert_uint_eq(rig_prefill(&r, "two", t2, 128, a),
                      0); /* needs 4 slots: only chunks 2, 3 of t1 may go */
    ck_assert(rig_stored(&r, t1, 0));
    ck_assert(rig_stored(&r, t1, 1));
    ck_assert(!rig_stored(&r, t1, 2));
    stall_ms(&r, LEASE_MS + 100); /* past the lease */
    ck_assert_uint_eq(rig_prefill(&r, "three", t3, 128, a),
                      0); /* the lease has expired: everything may go now */
    ck_assert(!rig_stored(&r, t1, 0));
    ck_assert(!rig_stored(&r, t1, 1));
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.leases_expired, 1);
    ck_assert_uint_eq(s.leases_active, 0);
    rig_close(&r);
}
END_TEST

/* A lookup of another request's first chunk and its end (any hook sweeps leases), then the stats. */
static kvs_stats probe(rig *r, const int32_t *t) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->lookup(r->h, "probe", t, 32, 0, &res), KVS_OK);
    ck_assert_int_eq(api->request_finished(r->h, "probe", NULL), KVS_OK);
    ck_assert_int_eq(api->stats(r->h, &s), KVS_OK);
    return s;
}

/* The sweep skips the request table until the earliest deadline set since its last walk: leases set
 * at different times each expire when their own time passes, including after the earliest one was
 * released early (its time passing then expires nothing) and after a lease was taken again. */
START_TEST(staggered_leases_each_expire_on_time) {
    rig r;
    int32_t t[128];
    uint32_t b[8];
    lease_rig(&r, t, b, 31);
    kvs_lookup_result res = {.struct_size = sizeof res};
    kvs_stats s;
    ck_assert_int_eq(api->lookup(r.h, "early", t, 128, 0, &res), KVS_OK); /* due at LEASE_MS */
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    stall_ms(&r, LEASE_MS / 2);
    ck_assert_int_eq(api->lookup(r.h, "late", t, 128, 0, &res), KVS_OK); /* due at 1.5 LEASE_MS */
    ck_assert_int_eq(api->request_finished(r.h, "early", NULL), KVS_OK);
    stall_ms(&r, LEASE_MS / 2 + 10); /* past the released one's time: nothing expires */
    s = probe(&r, t);
    ck_assert_uint_eq(s.leases_expired, 0);
    ck_assert_uint_eq(s.leases_active, 1);
    stall_ms(&r, LEASE_MS / 2); /* past the late one's */
    s = probe(&r, t);
    ck_assert_uint_eq(s.leases_expired, 1);
    ck_assert_uint_eq(s.leases_active, 0);
    /* a lease taken again after an expiry runs out at its own time too */
    ck_assert_int_eq(api->lookup(r.h, "late", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    stall_ms(&r, LEASE_MS - 10);
    s = probe(&r, t);
    ck_assert_uint_eq(s.leases_expired, 1);
    stall_ms(&r, 20);
    s = probe(&r, t);
    ck_assert_uint_eq(s.leases_expired, 2);
    ck_assert_uint_eq(s.leases_active, 0);
    rig_close(&r);
}
END_TEST

START_TEST(releasing_twice_is_harmless) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(4, 30000)), KVS_OK);
    int32_t t1[128], t2[128];
    uint32_t a[8];
    rig_blocks_from(a, 8, 0);
    rig_make_tokens(t1, 128, 31);
    rig_make_tokens(t2, 128, 32);
    ck_assert_uint_eq(rig_prefill(&r, "one", t1, 128, a), 0);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "x", t1, 128, 0, &res), KVS_OK);
    int keep;
    ck_assert_int_eq(api->request_finished(r.h, "x", &keep), KVS_OK);
    ck_assert_int_eq(api->request_finished(r.h, "x", &keep), KVS_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "'x'"));
    /* No pin outlived the release: all four chunks can be evicted. */
    ck_assert_uint_eq(rig_prefill(&r, "two", t2, 128, a), 0);
    for (int c = 0; c < 4; c++) ck_assert(!rig_stored(&r, t1, (uint64_t)c));
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.leases_active, 0);
    rig_close(&r);
}
END_TEST

START_TEST(unknown_requests_are_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, NULL), KVS_OK);
    uint32_t a[4] = {0, 1, 2, 3};
    int keep;
    ck_assert_int_eq(api->on_alloc(r.h, "ghost", a, 4, 16), KVS_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "ghost"));
    ck_assert_int_eq(api->request_finished(r.h, "ghost", &keep), KVS_ENOTFOUND);
    rig_close(&r);
}
END_TEST

START_TEST(token_ids_out_of_range_are_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, NULL), KVS_OK);
    int32_t t[64];
    rig_make_tokens(t, 64, 1);
    t[40] = 5000;
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "a", t, 64, 0, &res), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "position 40"));
    t[40] = -1;
    uint32_t a[4] = {0, 1, 2, 3};
    kvs_step_request s = {"a", t, 64, a, 4, 0, 64};
    uint8_t meta[4096];
    uint64_t len;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_EINVAL);
    ck_assert_int_eq(api->lookup(r.h, "a", t, 64, 65, &res), KVS_EINVAL);
    ck_assert_int_eq(api->lookup(r.h, "", t, 64, 0, &res), KVS_EINVAL);
    ck_assert_int_eq(api->lookup(r.h, NULL, t, 64, 0, &res), KVS_EINVAL);
    rig_close(&r);
}
END_TEST

START_TEST(build_meta_overflow_changes_nothing) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 71);
    rig_blocks_from(a, 8, 0);
    kvs_step_request s = {"a", t, 128, a, 8, 0, 128};
    uint8_t meta[65536];
    uint64_t need = 0, len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, 8, &need), KVS_EOVERFLOW);
    ck_assert_uint_gt(need, 8);
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_uint_eq(len, need); /* the failed call scheduled nothing: the same four saves */
    rig_worker_step(&r, meta, len, a, t, 0, 128);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.chunks_saved, 4);
    rig_close(&r);
}
END_TEST

START_TEST(finishing_a_request_twice_says_it_already_finished) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    rig_make_tokens(t, 128, 88);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "once", t, 128, 0, &res), KVS_OK);
    int keep = 1;
    ck_assert_int_eq(api->request_finished(r.h, "once", &keep), KVS_OK);
    ck_assert_int_eq(api->request_finished(r.h, "once", &keep), KVS_ENOTFOUND);
    ck_assert_int_eq(keep, 0);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "'once' already finished"));
    ck_assert_int_eq(api->request_finished(r.h, "never", &keep), KVS_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "'never' was never seen"));
    rig_close(&r);
}
END_TEST

START_TEST(two_requests_with_one_prefix_in_one_step_save_each_chunk_once) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[160];
    uint32_t a[10], b[10];
    rig_make_tokens(t, 160, 87);
    rig_blocks_from(a, 10, 0);
    rig_blocks_from(b, 10, 20);
    kvs_step_request s[2] = {{"x", t, 160, a, 10, 0, 160}, {"y", t, 160, b, 10, 0, 160}};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, s, 2, meta, sizeof meta, &len), KVS_OK);
    kvs_meta *m = NULL;
    char err[256];
    ck_assert_int_eq(kvs_meta_decode(meta, len, 0, &m, err, sizeof err), KVS_OK);
    /* 5 chunks, one save each: the first request saves them all, the second has nothing to move
     * and is not in the metadata */
    ck_assert_uint_eq(m->n_reqs, 1);
    ck_assert_uint_eq(m->reqs[0].n_saves, 5);
    kvs_meta_free(m);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(r.h), KVS_OK);
    rig_write_kv(&r, a, t, 0, 160);
    rig_write_kv(&r, b, t, 0, 160);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->save_layer(r.h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.chunks_saved, 5);
    ck_assert_uint_eq(st.saves_skipped, 0);
    /* The next step does not save them again for either request. */
    kvs_step_request next[2] = {{"x", t, 160, a, 10, 160, 0}, {"y", t, 160, b, 10, 160, 0}};
    ck_assert_int_eq(api->build_meta(r.h, next, 2, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(kvs_meta_decode(meta, len, 0, &m, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(m->n_reqs, 0);
    kvs_meta_free(m);
    rig_close(&r);
}
END_TEST

START_TEST(a_lease_expiring_after_on_alloc_still_loads_what_it_accepted) {
    rig r;
    int32_t t[128];
    uint32_t b[8], errs[16];
    lease_rig(&r, t, b, 81);
    offer_and_alloc(&r, "two", t, b, LEASE_MS + 30); /* the lease runs out before build_meta */
    ck_assert_uint_eq(load_accepted(&r, "two", t, b, errs), 0);
    ck_assert(rig_kv_matches(&r, b, t, 0, 128)); /* loaded, not silently left stale */
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.chunks_loaded, 4);
    ck_assert_uint_eq(s.leases_expired, 1);
    ck_assert_uint_eq(s.leases_active, 0);
    rig_close(&r);
}
END_TEST

START_TEST(a_chunk_evicted_after_its_lease_expired_comes_back_as_error_blocks) {
    rig r;
    int32_t t[128];
    uint32_t b[8], errs[16];
    lease_rig(&r, t, b, 82);
    offer_and_alloc(&r, "two", t, b, LEASE_MS + 30);
    kvs_reqs_expire_leases(r.h); /* any later hook notices the expiry; the chunk may then go */
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    ck_assert_int_eq(kvs_tiers_ops(r.h->tiers, 0)->remove(kvs_tiers_state(r.h->tiers, 0), &keys[1]),
                     KVS_OK);
    ck_assert_uint_eq(load_accepted(&r, "two", t, b, errs), 2); /* chunk 1 = blocks b[2], b[3] */
    ck_assert_uint_eq(errs[0] < errs[1] ? errs[0] : errs[1], b[2]);
    ck_assert_uint_eq(errs[0] < errs[1] ? errs[1] : errs[0], b[3]);
    ck_assert(rig_kv_matches(&r, b, t, 0, 32));
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.leases_expired, 1);
    rig_close(&r);
}
END_TEST

START_TEST(on_alloc_after_the_lease_expired_counts_the_expiry_and_pins_again) {
    rig r;
    int32_t t[128];
    uint32_t b[8], errs[16];
    lease_rig(&r, t, b, 83);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    stall_ms(&r, LEASE_MS + 30); /* expired before on_alloc, and no other hook ran */
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 127), KVS_OK);
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.leases_expired, 1);
    ck_assert_uint_eq(s.leases_active, 1); /* the new pins */
    ck_assert_uint_eq(load_accepted(&r, "two", t, b, errs), 0);
    ck_assert(rig_kv_matches(&r, b, t, 0, 128));
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.leases_expired, 1); /* counted once */
    rig_close(&r);
}
END_TEST

START_TEST(a_lookup_that_offers_nothing_leaves_other_leases_counted) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 84);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "holder", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    /* The engine holds 127 tokens itself: the stored chunk 3 is found and pinned, nothing offered. */
    ck_assert_int_eq(api->lookup(r.h, "nothing", t, 128, 127, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.leases_active, 1);
    rig_close(&r);
}
END_TEST

/* Every token is checked, wherever it stands (the check reads four at a time, then a tail): one
 * token out of [0, vocab) at any position of 1..13-token prompts is refused with its position, and
 * the request is left as it was. */
START_TEST(a_token_out_of_range_is_refused_at_any_position) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_SCHEDULER, NULL), KVS_OK);
    const int32_t bad_values[] = {-1, INT32_MIN, 1000, 1001, INT32_MAX};
    for (uint64_t n = 1; n <= 13; n++)
        for (uint64_t at = 0; at < n; at++)
            for (size_t v = 0; v < sizeof bad_values / sizeof *bad_values; v++) {
                int32_t tokens[13];
                for (uint64_t i = 0; i < n; i++) tokens[i] = (int32_t)(i * 37 % 1000);
                tokens[at] = bad_values[v];
                kvs_lookup_result res = {.struct_size = sizeof res};
                ck_assert_int_eq(api->lookup(r.h, "t", tokens, n, 0, &res), KVS_EINVAL);
                char want[64];
                snprintf(want, sizeof want, "token %d at position %llu", bad_values[v],
                         (unsigned long long)at);
                ck_assert_msg(strstr(api->last_error(r.h), want), "%s (want '%s')",
                              api->last_error(r.h), want);
                tokens[at] = 999; /* the highest valid token */
                ck_assert_int_eq(api->lookup(r.h, "t", tokens, n, 0, &res), KVS_OK);
            }
    rig_close(&r);
}
END_TEST

/* A lookup hashes, checks and copies the tokens in one pass: a bad token inside the whole chunks is
 * refused with its position, and the request keeps its tokens and keys: a repeated lookup with the
 * good tokens then takes none of the old prompt's keys. */
START_TEST(a_refused_repeat_lookup_leaves_the_request_as_it_was) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128], u[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 9);
    rig_make_tokens(u, 128, 4);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "r", u, 128, 0, &res), KVS_OK); /* not stored */
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    const uint64_t spots[] = {0, CHUNK + 1, 3 * CHUNK + 2, 127};
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        int32_t bad[128];
        memcpy(bad, t, sizeof bad);
        bad[spots[i]] = -7;
        ck_assert_int_eq(api->lookup(r.h, "r", bad, 128, 0, &res), KVS_EINVAL);
        char want[64];
        snprintf(want, sizeof want, "token -7 at position %llu", (unsigned long long)spots[i]);
        ck_assert_msg(strstr(api->last_error(r.h), want), "%s", api->last_error(r.h));
        /* r still holds u's tokens and keys: a shorter prompt that the refused tokens began with
         * takes none of u's keys */
        ck_assert_int_eq(api->lookup(r.h, "r", t, 64, 0, &res), KVS_OK);
        ck_assert_uint_eq(res.n_hit_tokens, 63);
        ck_assert_int_eq(api->lookup(r.h, "r", u, 128, 0, &res), KVS_OK);
        ck_assert_uint_eq(res.n_hit_tokens, 0);
    }
    /* an empty prompt (tokens NULL) on a request with keys: nothing to compare or hash */
    ck_assert_int_eq(api->lookup(r.h, "r", NULL, 0, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    ck_assert_int_eq(api->lookup(r.h, "r", t, 64, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 63);
    ck_assert_int_eq(api->request_finished(r.h, "r", NULL), KVS_OK);
    /* a new request refused outright leaves nothing behind */
    int32_t bad[128];
    memcpy(bad, t, sizeof bad);
    bad[2 * CHUNK] = 1000;
    ck_assert_int_eq(api->lookup(r.h, "s", bad, 128, 0, &res), KVS_EINVAL);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.leases_active, 0);
    ck_assert_int_eq(api->lookup(r.h, "s", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->request_finished(r.h, "s", NULL), KVS_OK);
    rig_close(&r);
}
END_TEST

/* A run whose chunks sit in two tiers (the top tier lacks the middle ones, which the lower one
 * holds) is offered whole, each chunk pinned where it is, and restores exactly: the top tier's runs
 * are pinned in one call each, the chunk it lacks in the lower tier. request_finished then leaves no
 * lease behind. */
START_TEST(a_run_across_two_tiers_is_pinned_and_restored_whole) {
    rig r;
    char text[512];
    snprintf(text, sizeof text,
             "chunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n  - name: top\n"
             "    type: dram\n    capacity: 4MiB\n  - name: low\n    type: dram\n"
             "    capacity: 4MiB\n",
             CHUNK);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_config("two.yaml", text)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 9);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    /* chunks 1 and 2 move from the top tier to the lower one */
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    const kvs_backend_ops *top = kvs_tiers_ops(r.h->tiers, 0), *low = kvs_tiers_ops(r.h->tiers, 1);
    void *top_state = kvs_tiers_state(r.h->tiers, 0), *low_state = kvs_tiers_state(r.h->tiers, 1);
    static uint8_t object[1 << 20];
    for (int c = 1; c <= 2; c++) {
        uint64_t len = 0;
        ck_assert_int_eq(top->get(top_state, &keys[c], object, sizeof object, &len), KVS_OK);
        ck_assert_int_eq(low->put(low_state, &keys[c], object, len), KVS_OK);
        ck_assert_int_eq(top->remove(top_state, &keys[c]), KVS_OK);
    }
    offer_and_alloc(&r, "two", t, b, 0);
    uint32_t errs[16];
    ck_assert_uint_eq(load_accepted(&r, "two", t, b, errs), 0);
    ck_assert(rig_kv_matches(&r, b, t, 0, 127));
    ck_assert_int_eq(api->request_finished(r.h, "two", NULL), KVS_OK);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.leases_active, 0);
    ck_assert_uint_eq(st.tier_chunks_loaded[0], 2);
    ck_assert_uint_eq(st.tier_chunks_loaded[1], 2);
    rig_close(&r);
}
END_TEST

static Suite *scheduler_suite(void) {
    Suite *s = suite_create("scheduler");
    TCase *tc = tcase_create("scheduler");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, lookup_stops_at_first_missing_chunk);
    tcase_add_test(tc, a_token_out_of_range_is_refused_at_any_position);
    tcase_add_test(tc, a_refused_repeat_lookup_leaves_the_request_as_it_was);
    tcase_add_test(tc, a_run_across_two_tiers_is_pinned_and_restored_whole);
    tcase_add_test(tc, a_lease_pins_until_it_expires);
    tcase_add_test(tc, staggered_leases_each_expire_on_time);
    tcase_add_test(tc, releasing_twice_is_harmless);
    tcase_add_test(tc, unknown_requests_are_refused);
    tcase_add_test(tc, token_ids_out_of_range_are_refused);
    tcase_add_test(tc, build_meta_overflow_changes_nothing);
    tcase_add_test(tc, finishing_a_request_twice_says_it_already_finished);
    tcase_add_test(tc, two_requests_with_one_prefix_in_one_step_save_each_chunk_once);
    suite_add_tcase(s, tc);
    TCase *contract = tcase_create("contract");
    tcase_add_checked_fixture(contract, setup, teardown);
    tcase_set_timeout(contract, 60);
    tcase_add_test(contract, a_lease_expiring_after_on_alloc_still_loads_what_it_accepted);
    tcase_add_test(contract, a_chunk_evicted_after_its_lease_expired_comes_back_as_error_blocks);
    tcase_add_test(contract, on_alloc_after_the_lease_expired_counts_the_expiry_and_pins_again);
    tcase_add_test(contract, a_lookup_that_offers_nothing_leaves_other_leases_counted);
    suite_add_tcase(s, contract);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(scheduler_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
