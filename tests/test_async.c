/* test_async.c - vLLM's call order through the ABI (1.5): loads between steps (`loads.async`), which
 * build_meta emits for requests the engine does not schedule and get_finished reports once their KV is
 * in the pages; failed chunks of such a load as error blocks of the step that reports it; steps with
 * no forward pass, closed by the next bind_meta; `loads.async: slow` deciding per tier from the
 * restore profile. Runs with the host device immediate and deferred (the CUDA ordering). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "abi/kvstrata.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "support/connector_rig.h"
#include "support/wait.h"

static const kvs_api *api;

static void setup(void) {
    rig_setup();
    api = kvs_get_api(KVS_ABI_MAJOR);
}

/* A 64-object dram tier, optionally paced, with `loads:` set to `loads`. */
static const char *async_config(const char *loads, const char *tier_options) {
    static char text[1024];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\n%s"
             "tiers:\n  - name: dram\n    type: dram\n    capacity: %d\n%s",
             rig_device_section(), CHUNK, loads, 64 * 12288, tier_options);
    return rig_config("async.yaml", text);
}

typedef struct finished_probe {
    rig *r;
    const char *id;
    int seen;   /* times id was reported */
    int others; /* other ids reported */
} finished_probe;

static int poll_finished(void *arg) {
    finished_probe *p = arg;
    char sending[256], receiving[1024];
    uint64_t ns = 9, nr = 9;
    ck_assert_int_eq(
        api->get_finished(p->r->h, sending, sizeof sending, &ns, receiving, sizeof receiving, &nr),
        KVS_OK);
    ck_assert_uint_eq(ns, 0);
    const char *at = receiving;
    for (uint64_t i = 0; i < nr; i++, at += strlen(at) + 1) {
        if (strcmp(at, p->id) == 0)
            p->seen++;
        else
            p->others++;
    }
    return p->seen > 0;
}

/* Lookup and on_alloc of request id over tokens, its pages `blocks`; returns the lookup's answer. */
static kvs_lookup_result arm(rig *r, const char *id, const int32_t *t, uint64_t n,
                             const uint32_t *blocks) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, t, n, 0, &res), KVS_OK);
    ck_assert_int_eq(api->on_alloc(r->h, id, blocks, (n + BT - 1) / BT, res.n_hit_tokens), KVS_OK);
    return res;
}

/* Tokens t[0..n) with seed, the pages a (from block 0) of request "first", which stored them, and the
 * pages b (from block b_first) a second request restores them into. */
static void stored_prefix(rig *r, int32_t *t, uint64_t n, int seed, uint32_t *a, uint32_t *b,
                          uint32_t b_first) {
    uint64_t nb = (n + BT - 1) / BT;
    rig_make_tokens(t, n, seed);
    rig_blocks_from(a, nb, 0);
    rig_blocks_from(b, nb, b_first);
    rig_prefill(r, "first", t, n, a);
}

/* build_meta over reqs, then the worker's half of a step with no layer hooks (the forward of other
 * requests is not the point here). */
static void step_without_layers(rig *r, const kvs_step_request *reqs, uint64_t n) {
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r->h, reqs, n, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r->h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(r->h), KVS_OK);
    ck_assert_int_eq(api->wait_save(r->h), KVS_OK);
}

/* One step with nothing scheduled. */
static void empty_step(rig *r) {
    step_without_layers(r, NULL, 0);
}

START_TEST(an_async_load_lands_between_steps_and_is_reported_once) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("loads:\n  async: always\n", "")),
                     KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    stored_prefix(&r, t, 128, 7, a, b, 40);
    kvs_lookup_result res = arm(&r, "second", t, 128, b);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_uint_eq(res.load_async, 1);
    /* The engine does not schedule "second" (it waits for its KV): build_meta emits its load. */
    empty_step(&r);
    finished_probe p = {&r, "second", 0, 0};
    ck_assert(kvs_test_wait_for(poll_finished, &p, 10000));
    ck_assert(rig_kv_matches(&r, b, t, 0, 127));
    ck_assert_int_eq(p.others, 0);
    /* reported once; the scheduler's lease stays until the request computes again (a worker of
     * another process pins only when its loader thread reaches the load) */
    empty_step(&r);
    poll_finished(&p);
    ck_assert_int_eq(p.seen, 1);
    kvs_stats lease = {.struct_size = sizeof lease};
    ck_assert_int_eq(api->stats(r.h, &lease), KVS_OK);
    ck_assert_uint_eq(lease.leases_active, 1);
    uint32_t errs[8];
    uint64_t n = 9;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 8, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.async_loads_started, 1);
    ck_assert_uint_eq(st.async_loads_done, 1);
    ck_assert_uint_eq(st.async_loads_failed, 0);
    ck_assert_uint_eq(st.tokens_loaded, 127);
    ck_assert_uint_eq(st.tier_bytes_loaded[0], st.bytes_loaded);
    ck_assert_uint_eq(st.bytes_loaded, 127ull * LAYERS * 2 * TOKEN_BYTES);
    ck_assert_str_eq(api->tier_name(r.h, 0), "dram");
    ck_assert_ptr_null(api->tier_name(r.h, 1));
    /* The request resumes with its KV counted as computed: its next step saves only what follows. */
    kvs_step_request s = {"second", t, 128, b, 8, 127, 1};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    rig_worker_step(&r, meta, len, b, t, 127, 128);
    ck_assert(rig_kv_matches(&r, b, t, 0, 128));
    ck_assert_int_eq(api->stats(r.h, &lease), KVS_OK);
    ck_assert_uint_eq(lease.leases_active, 0);
    ck_assert_int_eq(api->request_finished(r.h, "second", NULL), KVS_OK);
    rig_close(&r);
}
END_TEST

START_TEST(an_async_load_scheduled_by_the_engine_is_emitted_once) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("loads:\n  async: always\n", "")),
                     KVS_OK);
    int32_t t[96];
    uint32_t a[6], b[6];
    stored_prefix(&r, t, 96, 8, a, b, 20);
    arm(&r, "second", t, 96, b);
    /* an engine that lists the waiting request with nothing to compute */
    kvs_step_request s = {"second", t, 96, b, 6, 0, 0};
    step_without_layers(&r, &s, 1);
    finished_probe p = {&r, "second", 0, 0};
    ck_assert(kvs_test_wait_for(poll_finished, &p, 10000));
    ck_assert(rig_kv_matches(&r, b, t, 0, 95));
    /* the next build_meta does not emit it again */
    empty_step(&r);
    poll_finished(&p);
    ck_assert_int_eq(p.seen, 1);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.async_loads_started, 1);
    rig_close(&r);
}
END_TEST

START_TEST(a_corrupt_chunk_of_an_async_load_becomes_error_blocks_when_reported) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("loads:\n  async: always\n", "")),
                     KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    stored_prefix(&r, t, 128, 9, a, b, 40);
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    const void *obj;
    uint64_t len;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[2], &obj, &len), KVS_OK);
    ((uint8_t *)obj)[len - 7] ^= 0x10; /* chunk 2: tokens 64..95, blocks b[4], b[5] */
    arm(&r, "second", t, 128, b);
    empty_step(&r);
    finished_probe p = {&r, "second", 0, 0};
    ck_assert(kvs_test_wait_for(poll_finished, &p, 10000));
    uint32_t errs[8];
    uint64_t n = 0;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 8, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(errs[0] + errs[1], b[4] + b[5]);
    ck_assert(rig_kv_matches(&r, b, t, 0, 64));
    ck_assert(!rig_stored(&r, t, 2)); /* dropped: a miss from now on */
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.async_loads_failed, 1);
    ck_assert_uint_eq(st.load_errors, 1);
    /* taken once: the next step starts with an empty list */
    empty_step(&r);
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 8, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    rig_close(&r);
}
END_TEST

static void *no_memory(void *ptr, size_t bytes) {
    (void)ptr;
    (void)bytes;
    return NULL;
}

/* Memory runs out after the bind that queued an async load: when the load lands, between steps,
 * its failed chunk's blocks are still listed (bind_meta took the room for them). */
START_TEST(an_async_load_s_error_blocks_are_never_dropped_when_memory_runs_out) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("loads:\n  async: always\n", "")),
                     KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    stored_prefix(&r, t, 128, 19, a, b, 40);
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    const void *obj;
    uint64_t len;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[1], &obj, &len), KVS_OK);
    ((uint8_t *)obj)[len - 7] ^= 0x10; /* chunk 1: tokens 32..63, blocks b[2], b[3] */
    arm(&r, "second", t, 128, b);
    empty_step(&r); /* binds: the load is queued */
    r.h->worker.error_blocks_realloc = no_memory;
    finished_probe p = {&r, "second", 0, 0};
    ck_assert(kvs_test_wait_for(poll_finished, &p, 10000));
    uint32_t errs[8];
    uint64_t n = 0;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 8, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(errs[0] + errs[1], b[2] + b[3]);
    ck_assert_uint_eq(r.h->worker.error_blocks_async, 0); /* landed: nothing more is owed */
    r.h->worker.error_blocks_realloc = NULL;
    rig_close(&r);
}
END_TEST

START_TEST(a_receiving_list_too_small_reports_nothing_until_it_fits) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("loads:\n  async: always\n", "")),
                     KVS_OK);
    int32_t t[64];
    uint32_t a[4], b[4];
    stored_prefix(&r, t, 64, 10, a, b, 30);
    arm(&r, "a-rather-long-request-id", t, 64, b);
    empty_step(&r);
    char small[8], sending[8];
    uint64_t ns = 0, nr = 0;
    /* wait until it is read, then the small buffer must be refused with the count */
    for (int i = 0; i < 2000; i++) {
        kvs_status st =
            api->get_finished(r.h, sending, sizeof sending, &ns, small, sizeof small, &nr);
        if (st == KVS_EOVERFLOW) break;
        ck_assert_int_eq(st, KVS_OK);
        ck_assert_uint_eq(nr, 0);
        kvs_test_pause_ms(5);
    }
    ck_assert_uint_eq(nr, 1);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "receiving holds 8"));
    finished_probe p = {&r, "a-rather-long-request-id", 0, 0};
    ck_assert(poll_finished(&p));
    ck_assert(rig_kv_matches(&r, b, t, 0, 63));
    rig_close(&r);
}
END_TEST

START_TEST(closing_with_async_loads_in_flight_releases_them) {
    rig r;
    /* paced: 64 KiB/s, so the read is still going when the handle closes */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH,
                              async_config("loads:\n  async: always\n",
                                           "    options:\n      read_bandwidth: 64KiB/s\n")),
                     KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    stored_prefix(&r, t, 128, 11, a, b, 40);
    arm(&r, "second", t, 128, b);
    empty_step(&r);
    rig_close(&r); /* no leak, no hang past the read in progress (the sanitizer run checks) */
}
END_TEST

typedef struct stored_probe {
    rig *r;
    const int32_t *t1, *t2;
} stored_probe;

static int all_stored(void *arg) {
    stored_probe *p = arg;
    return rig_stored(p->r, p->t1, 0) && rig_stored(p->r, p->t1, 1) && rig_stored(p->r, p->t2, 0) &&
           rig_stored(p->r, p->t2, 1);
}

/* Async loads from a tier that copies into staging slabs hold them until they land: a request read
 * ahead waits for room instead of failing chunks for lack of a slab. */
START_TEST(async_loads_wait_for_staging_room_instead_of_failing) {
    char dir[600], text[1024];
    snprintf(dir, sizeof dir, "%s/ssd0", rig_tmpdir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    /* three slabs of one object each (12 KiB): the loader may hold one for read jobs */
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 36KiB\nloads:\n  async: always\n"
             "tiers:\n  - name: ssd\n    type: ssd\n    capacity: 8MiB\n    paths: [%s]\n",
             rig_device_section(), CHUNK, dir);
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_config("ssd.yaml", text)), KVS_OK);
    int32_t t1[64], t2[64];
    uint32_t a1[4], a2[4], b1[4], b2[4];
    rig_make_tokens(t1, 64, 21);
    rig_make_tokens(t2, 64, 22);
    rig_blocks_from(a1, 4, 0);
    rig_blocks_from(a2, 4, 4);
    rig_blocks_from(b1, 4, 20);
    rig_blocks_from(b2, 4, 30);
    rig_prefill(&r, "first", t1, 64, a1);
    rig_prefill(&r, "other", t2, 64, a2);
    stored_probe sp = {&r, t1, t2};
    ck_assert(
        kvs_test_wait_for(all_stored, &sp, 10000)); /* the ssd tier writes in the background */
    ck_assert_uint_eq(arm(&r, "x", t1, 64, b1).n_hit_tokens, 63);
    ck_assert_uint_eq(arm(&r, "y", t2, 64, b2).n_hit_tokens, 63);
    empty_step(&r); /* emits both: two chunks each, three slabs in the pool */
    finished_probe px = {&r, "x", 0, 0}, py = {&r, "y", 0, 0};
    uint64_t errors = 0;
    for (int i = 0; i < 4000 && !(px.seen && py.seen); i++) {
        char sending[8], receiving[64];
        uint64_t ns = 0, nr = 0, n = 0;
        uint32_t errs[8];
        ck_assert_int_eq(
            api->get_finished(r.h, sending, sizeof sending, &ns, receiving, sizeof receiving, &nr),
            KVS_OK);
        for (const char *at = receiving; nr--; at += strlen(at) + 1)
            (strcmp(at, "x") == 0 ? &px : &py)->seen++;
        ck_assert_int_eq(api->load_error_blocks(r.h, errs, 8, &n), KVS_OK);
        errors += n;
        if (!(px.seen && py.seen)) {
            empty_step(&r);
            kvs_test_pause_ms(2);
        }
    }
    ck_assert(px.seen && py.seen);
    ck_assert_uint_eq(errors, 0);
    ck_assert(rig_kv_matches(&r, b1, t1, 0, 63));
    ck_assert(rig_kv_matches(&r, b2, t2, 0, 63));
    rig_close(&r);
}
END_TEST

START_TEST(a_step_without_a_forward_pass_is_closed_by_the_next_bind) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("", "")), KVS_OK);
    int32_t t[96];
    uint32_t a[6], b[6];
    stored_prefix(&r, t, 96, 12, a, b, 20);
    kvs_lookup_result res = arm(&r, "second", t, 96, b);
    ck_assert_uint_eq(res.load_async, 0);
    kvs_step_request s = {"second", t, 96, b, 6, 0, 95};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    /* vLLM's no-forward step: bind, start_load, get_finished, load_error_blocks, no layer hooks */
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(r.h), KVS_OK);
    finished_probe p = {&r, "second", 0, 0};
    poll_finished(&p);
    uint32_t errs[8];
    uint64_t n = 9;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 8, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert(rig_kv_matches(&r, b, t, 0, 95)); /* the loads landed to complete the list */
    /* the next step binds without ESTATE */
    empty_step(&r);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.steps_closed, 1);
    ck_assert_uint_eq(st.chunks_loaded, 3);
    ck_assert_uint_eq(st.leases_active, 0);
    rig_close(&r);
}
END_TEST

START_TEST(a_step_closed_before_start_load_reports_its_loads_as_errors) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("", "")), KVS_OK);
    int32_t t[96];
    uint32_t a[6], b[6];
    stored_prefix(&r, t, 96, 13, a, b, 20);
    arm(&r, "second", t, 96, b);
    kvs_step_request s = {"second", t, 96, b, 6, 0, 95};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    /* the engine skips start_load and everything after: the next bind closes the step */
    empty_step(&r);
    uint32_t errs[8];
    uint64_t n = 0;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 8, &n), KVS_OK);
    ck_assert_uint_eq(n, 6); /* tokens 0..94: blocks b[0..5] */
    uint64_t sum = 0;
    for (int i = 0; i < 6; i++) sum += errs[i];
    ck_assert_uint_eq(sum, b[0] + b[1] + b[2] + b[3] + b[4] + b[5]);
    rig_close(&r);
}
END_TEST

/* `slow` makes a hit asynchronous when the profile says its tier reads slower than async_below. */
static kvs_lookup_result lookup_with_profile(const char *bandwidth) {
    char profile[512], loads[512];
    snprintf(profile, sizeof profile,
             "compute:\n  fixed_us: 0\n  per_token_us: 1\n  attention_ns_per_token2: 0\n"
             "tiers:\n  - name: dram\n    latency_us: 0\n    bandwidth: %s\n",
             bandwidth);
    ck_assert_ptr_nonnull(rig_config("profile.yaml", profile));
    snprintf(loads, sizeof loads,
             "restore:\n  profile: profile.yaml\nloads:\n  async: slow\n  async_below: 1GB/s\n");
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config(loads, "")), KVS_OK);
    int32_t t[64];
    uint32_t a[4];
    rig_make_tokens(t, 64, 14);
    rig_blocks_from(a, 4, 0);
    rig_prefill(&r, "first", t, 64, a);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "second", t, 64, 0, &res), KVS_OK);
    rig_close(&r);
    return res;
}

START_TEST(slow_loads_are_async_by_the_profile_bandwidth) {
    kvs_lookup_result slow = lookup_with_profile("200MB/s");
    ck_assert_uint_eq(slow.n_hit_tokens, 63);
    ck_assert_uint_eq(slow.load_async, 1);
    kvs_lookup_result fast = lookup_with_profile("20GB/s");
    ck_assert_uint_eq(fast.n_hit_tokens, 63);
    ck_assert_uint_eq(fast.load_async, 0);
}
END_TEST

START_TEST(loads_section_is_checked) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("loads:\n  async: slow\n", "")),
                     KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, "async_below"));
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH,
                              async_config("loads:\n  async: slow\n  async_below: 1GB/s\n", "")),
                     KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, "restore.profile"));
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH,
                              async_config("loads:\n  async: always\n  async_below: 1GB/s\n", "")),
                     KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, "only meaningful"));
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, async_config("loads:\n  async: sometimes\n", "")),
                     KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, "loads.async"));
}
END_TEST

static Suite *async_suite(void) {
    Suite *s = suite_create("async");
    TCase *tc = tcase_create("async");
    tcase_add_checked_fixture(tc, setup, rig_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, an_async_load_lands_between_steps_and_is_reported_once);
    tcase_add_test(tc, an_async_load_scheduled_by_the_engine_is_emitted_once);
    tcase_add_test(tc, a_corrupt_chunk_of_an_async_load_becomes_error_blocks_when_reported);
    tcase_add_test(tc, an_async_load_s_error_blocks_are_never_dropped_when_memory_runs_out);
    tcase_add_test(tc, a_receiving_list_too_small_reports_nothing_until_it_fits);
    tcase_add_test(tc, closing_with_async_loads_in_flight_releases_them);
    tcase_add_test(tc, async_loads_wait_for_staging_room_instead_of_failing);
    tcase_add_test(tc, a_step_without_a_forward_pass_is_closed_by_the_next_bind);
    tcase_add_test(tc, a_step_closed_before_start_load_reports_its_loads_as_errors);
    tcase_add_test(tc, slow_loads_are_async_by_the_profile_bandwidth);
    tcase_add_test(tc, loads_section_is_checked);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(async_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
