/* test_compress.c - the compress tier (backends/compress/, docs/compress.md) under a connector: what
 * does not fit raw is kept compressed or passed down, never lossy without allow_lossy; lookups say
 * which tokens load lossy and end before them without loads.accept_lossy; loaded lossy chunks lie
 * within their codec's bound; the placement runs again every reevaluate_ms; a chain that cannot
 * encode refuses the tier. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_lossy.h"
#include "backends/compress/compress.h"
#include "connector/config.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/object.h"
#include "connector/tiers.h"
#include "kernels/cpu/dtype.h"
#include "tests/support/connector_rig.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* A raw chunk object of the rig is 12288 bytes (4096 of header, two layers of 4096). */
enum { RAW_OBJECT = 12288 };

#define LOSSY_OPTIONS "      allow_lossy: true\n      next_capacity: 0\n      recompute_ms: 200\n"

/* A compress tier of `capacity` bytes with these options, then `below` (a tier's YAML or ""). */
static const char *config(uint64_t capacity, const char *options, const char *below, int accept) {
    static char text[1024];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n"
             "  - name: zip\n    type: compress\n    capacity: %llu\n    options:\n%s%s%s"
             "placement:\n  reevaluate_ms: 500\n",
             rig_device_section(), CHUNK, (unsigned long long)capacity, options, below,
             accept ? "loads:\n  accept_lossy: true\n" : "");
    return rig_config("compress.yaml", text);
}

static void open_finite(rig *r, const char *cfg) {
    ck_assert_msg(rig_open(r, KVS_ROLE_BOTH, cfg) == KVS_OK, "%s", r->error);
    r->finite = 1; /* KV values a codec takes */
    ck_assert_int_eq(kvs_compress_set_clock(kvs_tiers_state(r->h->tiers, 0), &r->clock), KVS_OK);
}

static kvs_compress_counts counts_at(rig *r, uint32_t tier) {
    kvs_compress_counts c;
    ck_assert_int_eq(kvs_compress_counts_of(kvs_tiers_state(r->h->tiers, tier), &c), KVS_OK);
    return c;
}

static kvs_compress_counts counts(rig *r) {
    return counts_at(r, 0);
}

/* Lookup of tokens t[0..128) with nothing computed: its result. */
static kvs_lookup_result lookup(rig *r, const char *id, const int32_t *t) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, t, 128, 0, &res), KVS_OK);
    return res;
}

/* Load the looked-up hit of request id into blocks b, the step built by handle s and run by worker
 * handle w (one handle of role both for both, or vLLM's two processes); returns the error blocks. */
static uint64_t load_split(rig *s, rig *w, const char *id, const int32_t *t, const uint32_t *b,
                           uint64_t hit) {
    ck_assert_int_eq(api->on_alloc(s->h, id, b, 8, hit), KVS_OK);
    kvs_step_request q = {id, t, 128, b, 8, hit, 128 - hit};
    uint8_t meta[65536];
    uint64_t mlen, n = 0;
    uint32_t errs[16];
    ck_assert_int_eq(api->build_meta(s->h, &q, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(w, meta, mlen, b, t, hit, 128);
    ck_assert_int_eq(api->load_error_blocks(w->h, errs, 16, &n), KVS_OK);
    return n;
}

static uint64_t load(rig *r, const char *id, const int32_t *t, const uint32_t *b, uint64_t hit) {
    return load_split(r, r, id, t, b, hit);
}

/* The codec each of the request's four chunks is stored with, as the tiers say. */
static void chunk_codecs(rig *r, const int32_t *t, uint16_t codecs[4]) {
    kvs_key keys[4];
    uint32_t tiers[4];
    kvs_keys_chain(&r->h->fingerprint, t, 4, CHUNK, keys);
    for (int i = 0; i < 4; i++) tiers[i] = (uint32_t)kvs_tiers_find(r->h->tiers, &keys[i]);
    kvs_tiers_codecs(r->h->tiers, keys, tiers, 4, codecs);
}

/* Largest |x - x'| over tokens [from, to) of every layer between blocks a (as computed) and b (as
 * loaded), in fp16 values. */
static double max_error(rig *r, const uint32_t *a, const uint32_t *b, uint64_t from, uint64_t to) {
    double worst = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++)
            for (uint64_t tok = from; tok < to; tok++) {
                const uint8_t *x = rig_kv_at(r, l, kv, a, tok), *y = rig_kv_at(r, l, kv, b, tok);
                for (int i = 0; i < TOKEN_BYTES / 2; i++) {
                    uint16_t hx, hy;
                    memcpy(&hx, x + 2 * i, 2);
                    memcpy(&hy, y + 2 * i, 2);
                    double d = fabs((double)kvs_f16_to_f32(hx) - (double)kvs_f16_to_f32(hy));
                    if (!(d <= worst)) worst = d; /* a NaN is the worst */
                }
            }
    return worst;
}

START_TEST(without_allow_lossy_what_does_not_fit_goes_down_raw) {
    rig r;
    char below[160];
    snprintf(below, sizeof below, "  - name: dram\n    type: dram\n    capacity: 1MiB\n");
    open_finite(&r, config(2 * RAW_OBJECT + 100, "      next_capacity: 1MiB\n", below, 0));
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 5);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_compress_counts c = counts(&r);
    ck_assert_uint_eq(c.here_raw, 2);
    ck_assert_uint_eq(c.here_lossy, 0);
    ck_assert_uint_eq(c.passed_down, 2);
    ck_assert_uint_eq(c.encoded, 0);
    ck_assert_uint_le(c.bytes_here, 2 * RAW_OBJECT + 100);
    uint64_t n_below = 0, bytes_below = 0;
    ck_assert_int_eq(
        kvs_tiers_ops(r.h->tiers, 1)->usage(kvs_tiers_state(r.h->tiers, 1), &n_below, &bytes_below),
        KVS_OK);
    ck_assert_uint_eq(n_below, 2);
    kvs_lookup_result res = lookup(&r, "two", t);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_uint_eq(res.n_lossy_tokens, 0);
    ck_assert_uint_eq(load(&r, "two", t, b, 127), 0);
    ck_assert(rig_kv_matches(&r, b, t, 0, 127)); /* byte for byte, from both tiers */
    rig_close(&r);
}
END_TEST

START_TEST(with_allow_lossy_what_does_not_fit_raw_is_kept_compressed) {
    rig r;
    /* room for two raw objects, or four compressed ones; nothing below; a recompute costs more
     * than any codec's loss of quality (alpha 0.1 s: KIVI-2's 0.25 is worth 25 ms) */
    open_finite(&r, config(30000, LOSSY_OPTIONS, "", 1));
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 9);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_compress_counts c = counts(&r);
    ck_assert_uint_eq(c.here_raw + c.here_lossy, 4); /* every chunk kept */
    ck_assert_uint_ge(c.here_lossy, 2);
    ck_assert_uint_le(c.bytes_here, 30000);
    ck_assert_uint_ge(c.encoded, c.here_lossy); /* some went raw, INT8, then KIVI-4 */
    uint16_t codecs[4];
    chunk_codecs(&r, t, codecs);
    uint64_t lossy_tokens = 0, lossy_chunks = 0;
    for (int i = 0; i < 4; i++) {
        lossy_chunks += codecs[i] != 0;
        lossy_tokens += codecs[i] ? (i == 3 ? 31 : 32) : 0; /* the last token is computed */
    }
    ck_assert_uint_eq(lossy_chunks, c.here_lossy);
    kvs_lookup_result res = lookup(&r, "two", t);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_uint_eq(res.n_lossy_tokens, lossy_tokens);
    ck_assert_uint_eq(load(&r, "two", t, b, 127), 0);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.chunks_loaded, 4);
    ck_assert_uint_eq(st.lossy_chunks_loaded, lossy_chunks);
    for (int i = 0; i < 4; i++) {
        uint64_t from = (uint64_t)i * 32, to = i == 3 ? 127 : from + 32;
        if (!codecs[i]) {
            ck_assert(rig_kv_matches(&r, b, t, from, to));
            continue;
        }
        ck_assert(!rig_kv_matches(&r, b, t, from, to)); /* the codec changed some values */
        /* values in [-4, 4): even KIVI-2's step is at most 8/3, so no error exceeds 4/3 + ulp */
        double e = max_error(&r, a, b, from, to);
        ck_assert_msg(e <= 4.0 / 3 + 0.01, "chunk %d: error %g", i, e);
    }
    rig_close(&r);
}
END_TEST

START_TEST(without_accept_lossy_a_lookup_ends_before_the_first_lossy_chunk) {
    rig r;
    open_finite(&r, config(30000, LOSSY_OPTIONS, "", 0));
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 13);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    uint16_t codecs[4];
    chunk_codecs(&r, t, codecs);
    uint64_t clean = 0;
    while (clean < 4 && !codecs[clean]) clean++;
    ck_assert_uint_lt(clean, 4); /* some chunk is lossy */
    kvs_lookup_result res = lookup(&r, "two", t);
    ck_assert_uint_eq(res.n_hit_tokens, clean * 32);
    ck_assert_uint_eq(res.n_lossy_tokens, 0);
    ck_assert_uint_eq(load(&r, "two", t, b, res.n_hit_tokens), 0);
    ck_assert(rig_kv_matches(&r, b, t, 0, 128)); /* loaded raw, the rest computed */
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.lossy_chunks_loaded, 0);
    rig_close(&r);
}
END_TEST

/* Regression: a lossy chunk the placement stores nowhere was kept (its "encoding" for a drop is raw,
 * which a lossy chunk may not take), so the room the placement counted on never came and every
 * later put failed. */
START_TEST(lossy_chunks_are_dropped_when_the_placement_says_so) {
    rig r;
    open_finite(&r, config(30000, LOSSY_OPTIONS, "", 0));
    int32_t t[128], u[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 21);
    rig_make_tokens(u, 128, 22);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    ck_assert_uint_ge(counts(&r).here_lossy, 2);
    ck_assert_uint_eq(rig_prefill(&r, "two", u, 128, a), 0); /* four more chunks: no room */
    kvs_compress_counts c = counts(&r);
    ck_assert_uint_gt(c.dropped, 0);
    ck_assert_uint_le(c.bytes_here, 30000);
    ck_assert_uint_ge(c.here_raw + c.here_lossy, 4); /* room for four compressed or more */
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.saves_skipped, 0); /* every put was stored */
    rig_close(&r);
}
END_TEST

/* Regression: a chunk the compress tier passed down lossy and the tier below wrote back further was
 * reported raw (only the tier right above the holder was asked), so a lookup without accept_lossy
 * offered it and its load failed. */
START_TEST(a_lossy_chunk_written_further_down_is_still_reported_lossy) {
    rig r;
    char below[256];
    snprintf(below, sizeof below,
             "  - name: mid\n    type: dram\n    capacity: %d\n"
             "  - name: low\n    type: dram\n    capacity: 1MiB\n",
             RAW_OBJECT);
    /* room for one chunk here: the rest goes down lossy (the next tier is slow, 1MB/s) */
    open_finite(&r, config(RAW_OBJECT,
                           "      allow_lossy: true\n      recompute_ms: 200\n"
                           "      next_capacity: 1MiB\n      next_bandwidth: 1MB/s\n",
                           below, 0));
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 29);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_key keys[4];
    uint32_t tiers[4];
    uint16_t codecs[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    int deep = -1;
    for (int i = 0; i < 4; i++) {
        ck_assert_int_ge(kvs_tiers_find(r.h->tiers, &keys[i]), 0);
        tiers[i] = (uint32_t)kvs_tiers_find(r.h->tiers, &keys[i]);
    }
    kvs_tiers_codecs(r.h->tiers, keys, tiers, 4, codecs);
    for (int i = 0; i < 4; i++)
        if (tiers[i] == 2 && codecs[i] != 0 && deep < 0) deep = i;
    ck_assert_msg(deep >= 0, "no lossy chunk reached the third tier (tiers %u %u %u %u)", tiers[0],
                  tiers[1], tiers[2], tiers[3]);
    uint64_t clean = 0;
    while (clean < 4 && !codecs[clean]) clean++;
    kvs_lookup_result res = lookup(&r, "two", t);
    ck_assert_uint_eq(res.n_hit_tokens, clean * 32); /* it ends before the first lossy chunk */
    ck_assert_uint_eq(load(&r, "two", t, b, res.n_hit_tokens), 0);
    rig_close(&r);
}
END_TEST

/* KV the engine computes over lossy chunks is not exact: the chunks it saves after them are sealed
 * as derived, so lookups count them lossy and a reader without accept_lossy refuses them. */
START_TEST(chunks_computed_over_lossy_ones_are_saved_as_derived) {
    char text[1024];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n"
             "  - name: dram\n    type: dram\n    capacity: 1MiB\n"
             "  - name: zip\n    type: compress\n    capacity: 30000\n    options:\n%s"
             "loads:\n  accept_lossy: true\n",
             rig_device_section(), CHUNK, LOSSY_OPTIONS);
    rig r;
    ck_assert_msg(rig_open(&r, KVS_ROLE_BOTH, rig_config("derived.yaml", text)) == KVS_OK, "%s",
                  r.error);
    r.finite = 1;
    int32_t t[192];
    uint32_t a[12], b[12];
    rig_make_tokens(t, 192, 33);
    rig_blocks_from(a, 12, 0);
    rig_blocks_from(b, 12, 20);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_key keys[6];
    kvs_keys_chain(&r.h->fingerprint, t, 6, CHUNK, keys);
    /* push the four chunks out of dram into the compress tier, where some are kept lossy */
    const kvs_backend_ops *dram = kvs_tiers_ops(r.h->tiers, 0);
    void *dram_state = kvs_tiers_state(r.h->tiers, 0);
    uint8_t *obj = malloc(r.h->object_bytes);
    uint64_t len = 0;
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(dram->get(dram_state, &keys[i], obj, r.h->object_bytes, &len), KVS_OK);
        ck_assert_int_eq(
            kvs_tiers_ops(r.h->tiers, 1)->put(kvs_tiers_state(r.h->tiers, 1), &keys[i], obj, len),
            KVS_OK);
        ck_assert_int_eq(dram->remove(dram_state, &keys[i]), KVS_OK);
    }
    ck_assert_uint_ge(counts_at(&r, 1).here_lossy, 1);
    /* a longer prompt over them: its chunks 4 and 5 are computed over lossy KV */
    uint64_t hit = rig_prefill(&r, "two", t, 192, b);
    ck_assert_uint_eq(hit, 128);
    for (int i = 4; i < 6; i++) {
        ck_assert_int_eq(dram->get(dram_state, &keys[i], obj, r.h->object_bytes, &len), KVS_OK);
        ck_assert_uint_eq(((const kvs_object_header *)obj)->codec, KVS_CODEC_DERIVED);
    }
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "three", t, 192, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 191);
    uint16_t codecs[6];
    uint32_t tiers[6];
    for (int i = 0; i < 6; i++) tiers[i] = (uint32_t)kvs_tiers_find(r.h->tiers, &keys[i]);
    kvs_tiers_codecs(r.h->tiers, keys, tiers, 6, codecs);
    uint64_t lossy = 0;
    for (int i = 0; i < 6; i++) lossy += codecs[i] ? (i == 5 ? 31 : 32) : 0;
    ck_assert_uint_eq(codecs[4], KVS_CODEC_DERIVED); /* read from the dram tier's header */
    ck_assert_uint_eq(res.n_lossy_tokens, lossy);
    int keep = 1;
    ck_assert_int_eq(api->request_finished(r.h, "three", &keep), KVS_OK);
    free(obj);
    rig_close(&r);
}
END_TEST

/* A put with room still asks the placement about its object: where reading it back costs more than
 * recomputing it (a 1MB/s tier, 1 ms recomputes), it is stored nowhere (regression: a put that fit
 * was stored raw without asking). */
START_TEST(a_chunk_worth_less_than_a_recompute_is_not_stored_even_with_room) {
    rig r;
    open_finite(&r,
                config(1 << 20,
                       "      bandwidth: 1MB/s\n      recompute_ms: 1\n      next_capacity: 0\n",
                       "", 0));
    int32_t t[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 37);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_compress_counts c = counts(&r);
    ck_assert_uint_eq(c.here_raw + c.here_lossy, 0);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.saves_skipped, 4);
    rig_close(&r);
}
END_TEST

START_TEST(the_placement_runs_again_every_reevaluate_ms) {
    rig r;
    open_finite(&r, config(1 << 20, "      next_capacity: 0\n", "", 0));
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 17);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    uint64_t plans = counts(&r).plans;
    ck_assert_uint_eq(plans, 0); /* every put had room: stored raw without a placement */
    kvs_lookup_result res = lookup(&r, "two", t);
    ck_assert_uint_eq(load(&r, "two", t, b, res.n_hit_tokens), 0);
    ck_assert_uint_eq(counts(&r).plans, plans); /* reads within reevaluate_ms: none */
    int keep = 1;
    ck_assert_int_eq(api->request_finished(r.h, "two", &keep), KVS_OK);
    kvs_clock_advance(&r.clock, 500ull * 1000000);
    res = lookup(&r, "three", t);
    ck_assert_uint_eq(load(&r, "three", t, b, res.n_hit_tokens), 0);
    ck_assert_uint_eq(counts(&r).plans, plans + 1); /* the first read after it re-places */
    ck_assert_uint_eq(counts(&r).here_raw, 4);      /* with room for all, raw stays raw */
    rig_close(&r);
}
END_TEST

START_TEST(a_chain_that_cannot_encode_refuses_a_compress_tier) {
    const char *path = config(1 << 20, "      allow_lossy: true\n", "", 0);
    kvs_config *cfg = NULL;
    char err[512];
    ck_assert_int_eq(kvs_config_load(path, &cfg, err, sizeof err), KVS_OK);
    kvs_tier_chain *chain = NULL;
    /* no encoder: a chain opened without a model (kvstrata-node) */
    kvs_status st =
        kvs_tiers_open(cfg, 1 << 20, NULL, NULL, 0, NULL, NULL, &chain, err, sizeof err);
    ck_assert_int_ne(st, KVS_OK);
    ck_assert_ptr_null(chain);
    ck_assert_msg(strstr(err, "compress tier needs") != NULL, "%s", err);
    kvs_config_free(cfg);
}
END_TEST

START_TEST(a_bad_option_names_itself) {
    rig r;
    const char *path = config(1 << 20, "      next_bandwidth: fast\n", "", 0);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, path), KVS_ECONFIG);
    ck_assert_msg(strstr(r.error, "next_bandwidth") != NULL, "%s", r.error);
    if (r.h) rig_close(&r);
}
END_TEST

/* Placement codecs [drop50]: what does not fit raw is kept with half of each chunk's tokens. An
 * engine that masks (_i 1) gets those chunks in its hit and load_dropped names the positions they
 * left out (their slots zero, the kept ones exact); one that does not (_i 0) gets a hit that ends
 * before the first of them. */
START_TEST(a_compress_tier_drops_tokens_only_for_engines_that_mask) {
    rig r;
    char text[1024];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n"
             "  - name: zip\n    type: compress\n    capacity: 30000\n    options:\n%s"
             "placement:\n  reevaluate_ms: 500\n  codecs: [drop50]\nloads:\n  accept_lossy: true\n",
             rig_device_section(), CHUNK, LOSSY_OPTIONS);
    open_finite(&r, rig_config("drop.yaml", text));
    if (_i) ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_MASK), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 21);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    kvs_key keys[4];
    uint32_t tiers[4];
    uint16_t codecs[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    uint64_t stored = 0, dropping = 0, first_drop = 4;
    for (int i = 0; i < 4; i++) {
        int at = kvs_tiers_find(r.h->tiers, &keys[i]);
        tiers[i] = at < 0 ? 0 : (uint32_t)at;
        if (at >= 0 && stored == (uint64_t)i) stored++;
    }
    kvs_tiers_codecs(r.h->tiers, keys, tiers, 4, codecs);
    for (uint64_t i = 0; i < stored; i++) {
        ck_assert(codecs[i] == KVS_CODEC_RAW || codecs[i] == KVS_CODEC_DROP);
        if (codecs[i] == KVS_CODEC_DROP) dropping++, first_drop = first_drop < i ? first_drop : i;
    }
    ck_assert_uint_ge(dropping, 1);
    uint64_t hit_chunks = _i ? stored : first_drop, hit = hit_chunks * 32;
    if (hit == 128) hit = 127;
    kvs_lookup_result res = lookup(&r, "two", t);
    ck_assert_uint_eq(res.n_hit_tokens, hit);
    uint8_t dropped[128];
    uint64_t n_dropped = 0;
    ck_assert_uint_eq(rig_drop_step(&r, "two", t, b, 0, hit, dropped, &n_dropped), 0);
    uint64_t want = 0;
    for (uint64_t i = 0; i < hit_chunks; i++) {
        uint64_t from = i * 32, to = from + 32 > hit ? hit : from + 32, in_chunk = 0;
        for (uint64_t p = from; p < to; p++) {
            int zero = 1;
            for (int l = 0; l < LAYERS; l++)
                for (int kv = 0; kv < 2; kv++)
                    for (int k = 0; k < TOKEN_BYTES; k++)
                        zero &= rig_kv_at(&r, l, kv, b, p)[k] == 0;
            if (codecs[i] != KVS_CODEC_DROP) {
                ck_assert(!dropped[p]);
                ck_assert(rig_kv_matches(&r, b, t, p, p + 1));
            } else if (dropped[p]) {
                ck_assert(zero);
                in_chunk++;
            } else {
                ck_assert(rig_kv_matches(&r, b, t, p, p + 1)); /* kept rows are exact */
            }
        }
        if (codecs[i] == KVS_CODEC_DROP) /* 16 of 32 kept; the last token of chunk 3 is computed */
            ck_assert(to - from == 32 ? in_chunk == 16 : in_chunk == 15 || in_chunk == 16);
        want += in_chunk;
    }
    ck_assert_uint_eq(n_dropped, want);
    ck_assert_uint_eq(_i ? n_dropped > 0 : n_dropped == 0, 1);
    rig_close(&r);
}
END_TEST

/* A chunk stored with tokens dropped is never encoded again, and a chunk already quantised never
 * has tokens dropped (its kept rows would not be exact): the tier does not even ask (the encoder
 * would refuse, each refusal an encode wasted and, when it passes a chunk down, a move that does not
 * happen). Several prompts through a tier with room for few chunks and three codecs to choose from. */
START_TEST(dropped_chunks_are_never_encoded_again) {
    rig r;
    char text[1024];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n"
             "  - name: zip\n    type: compress\n    capacity: 40000\n    options:\n%s"
             "placement:\n  reevaluate_ms: 500\n  alpha: 0.001\n"
             "  codecs: [kivi4, drop50, drop25]\n",
             rig_device_section(), CHUNK, LOSSY_OPTIONS);
    open_finite(&r, rig_config("redrop.yaml", text));
    uint32_t a[8];
    rig_blocks_from(a, 8, 0);
    for (int p = 0; p < 6; p++) {
        int32_t t[128];
        char id[16];
        rig_make_tokens(t, 128, 100 + p);
        snprintf(id, sizeof id, "p%d", p);
        rig_prefill(&r, id, t, 128, a);
    }
    kvs_compress_counts c = counts(&r);
    ck_assert_uint_gt(c.encoded, 4);
    ck_assert_uint_gt(c.here_lossy, 0);
    ck_assert_uint_eq(c.encode_failures, 0);
    rig_close(&r);
}
END_TEST

/* vLLM's layout: the scheduler and a worker are handles in processes of their own (two handles here,
 * attached to the same shared memory as two processes would be). With index_shm the worker's tier
 * publishes what it holds: the scheduler's lookups find it, say which chunks are lossy, and pin it
 * (the worker's placement keeps what they pinned), and the worker loads it exact. */
static void prefill_split(rig *s, rig *w, const char *id, const int32_t *t, const uint32_t *a) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s->h, id, t, 128, 0, &res), KVS_OK);
    ck_assert_int_eq(api->on_alloc(s->h, id, a, 8, res.n_hit_tokens), KVS_OK);
    kvs_step_request q = {id, t, 128, a, 8, res.n_hit_tokens, 128 - res.n_hit_tokens};
    uint8_t meta[65536];
    uint64_t mlen;
    ck_assert_int_eq(api->build_meta(s->h, &q, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(w, meta, mlen, a, t, res.n_hit_tokens, 128);
    int keep = 1;
    ck_assert_int_eq(api->request_finished(s->h, id, &keep), KVS_OK);
}

/* vLLM's two processes as two handles on cfg: a worker (finite KV a codec takes) and a scheduler. */
static void open_split(rig *s, rig *w, const char *cfg) {
    ck_assert_msg(rig_open(w, KVS_ROLE_WORKER, cfg) == KVS_OK, "%s", w->error);
    ck_assert_msg(rig_open(s, KVS_ROLE_SCHEDULER, cfg) == KVS_OK, "%s", s->error);
    w->finite = 1;
}

static const char *indexed_config(uint64_t capacity, const char *options, int accept) {
    char opts[512];
    snprintf(opts, sizeof opts, "%s      index_shm: kvs-test-zip-%d\n", options, (int)getpid());
    return config(capacity, opts, "", accept);
}

START_TEST(a_scheduler_handle_finds_and_pins_what_a_worker_s_tier_holds) {
    rig s, w;
    /* room for four raw chunks, nothing below: the second prompt's saves need the first's room */
    const char *cfg = indexed_config(4 * RAW_OBJECT + 100, "      next_capacity: 0\n", 0);
    open_split(&s, &w, cfg);
    int32_t t[128], t2[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 71);
    rig_make_tokens(t2, 128, 72);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    prefill_split(&s, &w, "one", t, a);
    ck_assert_uint_eq(counts(&w).here_raw, 4);
    uint64_t n = 0, bytes = 0;
    const kvs_backend_ops *ops = kvs_tiers_ops(s.h->tiers, 0);
    ck_assert_int_eq(ops->usage(kvs_tiers_state(s.h->tiers, 0), &n, &bytes), KVS_OK);
    ck_assert_uint_eq(n, 4); /* published */
    ck_assert(ops->instance_caps(kvs_tiers_state(s.h->tiers, 0)) & KVS_BACKEND_CAP_SHARED);
    uint64_t len = 0;
    uint8_t byte;
    kvs_key k0;
    kvs_keys_chain(&s.h->fingerprint, t, 1, CHUNK, &k0);
    ck_assert_int_eq(ops->get(kvs_tiers_state(s.h->tiers, 0), &k0, &byte, 1, &len), KVS_ENOTSUP);
    ck_assert_msg(strstr(ops->last_error(kvs_tiers_state(s.h->tiers, 0)), "index_shm"), "%s",
                  ops->last_error(kvs_tiers_state(s.h->tiers, 0)));

    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127); /* found in the worker's tier, and pinned */
    /* another prompt's saves while "two" holds its pins: they find no room they may take */
    uint32_t c[8];
    rig_blocks_from(c, 8, 16);
    prefill_split(&s, &w, "other", t2, c);
    ck_assert_uint_eq(counts(&w).here_raw, 4);
    ck_assert_uint_eq(load_split(&s, &w, "two", t, b, 127), 0);
    ck_assert(rig_kv_matches(&w, b, t, 0, 128));
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(w.h, &st), KVS_OK);
    ck_assert_uint_eq(st.chunks_loaded, 4);
    int keep = 1;
    ck_assert_int_eq(api->request_finished(s.h, "two", &keep), KVS_OK);
    ck_assert_int_eq(api->lookup(s.h, "three", t2, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0); /* none of the other prompt's saves was stored */
    rig_close(&s);
    rig_close(&w);
}
END_TEST

START_TEST(a_scheduler_handle_counts_the_lossy_chunks_a_worker_s_tier_holds) {
    rig s, w;
    const char *cfg = indexed_config(30000, LOSSY_OPTIONS, 1);
    open_split(&s, &w, cfg);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 73);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    prefill_split(&s, &w, "one", t, a);
    uint16_t codecs[4];
    chunk_codecs(&w, t, codecs);
    uint64_t lossy_tokens = 0;
    for (int i = 0; i < 4; i++) lossy_tokens += codecs[i] ? (i == 3 ? 31 : 32) : 0;
    ck_assert_uint_gt(lossy_tokens, 0);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_uint_eq(res.n_lossy_tokens, lossy_tokens); /* as the worker's tier stores them */
    ck_assert_uint_eq(load_split(&s, &w, "two", t, b, 127), 0);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(w.h, &st), KVS_OK);
    ck_assert_uint_eq(st.chunks_loaded, 4);
    rig_close(&s);
    rig_close(&w);
}
END_TEST

/* A worker killed and started again: its tier is empty, the index still names what the old one
 * held (here the old handle stays open, as a killed process never detaches). The scheduler's hit
 * loads as error blocks (a recompute, never wrong KV), the loads' misses withdraw the entries, and
 * the next lookup misses. A worker that closes withdraws what it held. */
START_TEST(a_restarted_worker_s_empty_tier_turns_stale_entries_into_one_recompute) {
    rig s, w;
    const char *cfg = indexed_config(1 << 20, "      next_capacity: 0\n", 0);
    open_split(&s, &w, cfg);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 74);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    prefill_split(&s, &w, "one", t, a);
    rig dead = w;
    ck_assert_msg(rig_open(&w, KVS_ROLE_WORKER, cfg) == KVS_OK, "%s", w.error);
    w.finite = 1;
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127); /* the stale entries */
    ck_assert_uint_gt(load_split(&s, &w, "two", t, b, 127), 0);
    int keep = 1;
    ck_assert_int_eq(api->request_finished(s.h, "two", &keep), KVS_OK);
    ck_assert_int_eq(api->lookup(s.h, "three", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    ck_assert_int_eq(api->request_finished(s.h, "three", &keep), KVS_OK);
    /* the new worker's own saves are found; it closes, and they are withdrawn */
    prefill_split(&s, &w, "four", t, a);
    ck_assert_int_eq(api->lookup(s.h, "five", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->request_finished(s.h, "five", &keep), KVS_OK);
    rig_close(&w);
    ck_assert_int_eq(api->lookup(s.h, "six", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    rig_close(&s);
    rig_close(&dead);
}
END_TEST

/* MLA under tensor parallelism: every rank saves the same keys into its own tier, so a tier that
 * publishes what its process holds is refused, with a sentence. */
START_TEST(index_shm_is_refused_for_ranks_that_share_keys) {
    rig w;
    kvs_model_desc m = rig_model();
    m.is_mla = 1; /* one latent of HEADS * HEAD_DIM: a token is still TOKEN_BYTES */
    m.n_kv_heads = 1;
    m.head_dim = HEADS * HEAD_DIM;
    m.tp_size = 2;
    m.tp_rank = 0;
    const char *cfg = indexed_config(1 << 20, "      next_capacity: 0\n", 0);
    ck_assert_int_eq(rig_open_model(&w, KVS_ROLE_WORKER, cfg, &m), KVS_ECONFIG);
    ck_assert_msg(strstr(w.error, "share their keys (MLA)") != NULL, "%s", w.error);
    if (w.h) rig_close(&w);
    m.tp_size = 1; /* one rank: nothing shared */
    ck_assert_msg(rig_open_model(&w, KVS_ROLE_WORKER, cfg, &m) == KVS_OK, "%s", w.error);
    rig_close(&w);
}
END_TEST

static Suite *compress_suite(void) {
    Suite *s = suite_create("compress");
    TCase *tc = tcase_create("compress tier");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, without_allow_lossy_what_does_not_fit_goes_down_raw);
    tcase_add_test(tc, with_allow_lossy_what_does_not_fit_raw_is_kept_compressed);
    tcase_add_test(tc, without_accept_lossy_a_lookup_ends_before_the_first_lossy_chunk);
    tcase_add_test(tc, lossy_chunks_are_dropped_when_the_placement_says_so);
    tcase_add_test(tc, a_lossy_chunk_written_further_down_is_still_reported_lossy);
    tcase_add_test(tc, chunks_computed_over_lossy_ones_are_saved_as_derived);
    tcase_add_test(tc, a_chunk_worth_less_than_a_recompute_is_not_stored_even_with_room);
    tcase_add_test(tc, the_placement_runs_again_every_reevaluate_ms);
    tcase_add_test(tc, a_chain_that_cannot_encode_refuses_a_compress_tier);
    tcase_add_test(tc, a_bad_option_names_itself);
    tcase_add_loop_test(tc, a_compress_tier_drops_tokens_only_for_engines_that_mask, 0, 2);
    tcase_add_test(tc, dropped_chunks_are_never_encoded_again);
    tcase_add_test(tc, a_scheduler_handle_finds_and_pins_what_a_worker_s_tier_holds);
    tcase_add_test(tc, a_scheduler_handle_counts_the_lossy_chunks_a_worker_s_tier_holds);
    tcase_add_test(tc, a_restarted_worker_s_empty_tier_turns_stale_entries_into_one_recompute);
    tcase_add_test(tc, index_shm_is_refused_for_ranks_that_share_keys);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(compress_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
