/* test_lossy_loads.c - lossy objects on the load path (connector/worker_load.c, docs/compress.md):
 * with loads.accept_lossy a lossy chunk lands in the pages exactly as its codec decodes it, beside
 * raw chunks byte for byte; without it the load is refused and the engine recomputes (the object
 * stays); a damaged lossy object becomes error blocks and is dropped. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_lossy.h"
#include "common/xxh3.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/object.h"
#include "connector/tiers.h"
#include "kernels/cpu/dtype.h"
#include "tests/support/connector_rig.h"

static const kvs_api *api;
static const kvs_codec kivi4 = {.kind = KVS_CODEC_KIVI, .bits = 4, .k_group = 16, .v_group = 8};

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* accept_lossy 0 or 1 over a DRAM tier (zero-copy loads); 2: accept_lossy over a tier without
 * zero-copy (tests/plugins/plugin_memory.c), whose loads are copied into a staging slab first. */
static const char *config(int accept_lossy) {
    static char text[768];
    char tier[256];
    if (accept_lossy == 2)
        snprintf(tier, sizeof tier,
                 "  - name: mem\n    type: plugin\n    plugin: %s/plugin_memory.so\n",
                 KVS_TEST_LIB_DIR);
    else
        snprintf(tier, sizeof tier, "  - name: dram\n    type: dram\n    capacity: 1MiB\n");
    snprintf(text, sizeof text, "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n%s%s",
             rig_device_section(), CHUNK, tier,
             accept_lossy ? "loads:\n  accept_lossy: true\n" : "");
    return rig_config(accept_lossy ? "lossy.yaml" : "raw.yaml", text);
}

/* Replace chunk `c` of tokens in tier 0 with a lossy object: KV-like fp16 values (the rig's own
 * bytes are arbitrary bit patterns, NaNs among them, which no codec takes) sealed as a raw object,
 * then encoded. Its bytes go to *lossy (malloc'd, the caller frees) so a test can decode what the
 * pages should hold. */
static uint64_t make_coded(rig *r, const int32_t *t, int c, const kvs_codec *codec,
                           uint8_t **lossy) {
    kvs_key keys[4];
    kvs_keys_chain(&r->h->fingerprint, t, 4, CHUNK, keys);
    const kvs_backend_ops *ops = kvs_tiers_ops(r->h->tiers, 0);
    void *st = kvs_tiers_state(r->h->tiers, 0);
    uint64_t lb = r->h->layer_bytes, len = kvs_object_bytes(LAYERS, lb), out_len = 0;
    uint8_t *obj = calloc(1, len);
    kvs_object_init(obj, &r->h->fingerprint, &keys[c], LAYERS, CHUNK, lb);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)c;
    for (uint32_t l = 0; l < LAYERS; l++) {
        uint8_t *layer = kvs_object_layer(obj, l);
        for (uint64_t i = 0; i < lb / 2; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint16_t h = kvs_f32_to_f16((float)((int64_t)(x >> 40) % 4000) / 1000.0f);
            memcpy(layer + 2 * i, &h, 2);
        }
        kvs_object_layer_hashes(obj)[l] = kvs_xxh3_64(layer, lb);
    }
    kvs_object_seal(obj);
    uint64_t cap = kvs_object_lossy_bytes(codec, &r->h->shape, r->h->model.dtype, LAYERS, CHUNK);
    *lossy = malloc(cap);
    char err[256];
    ck_assert_msg(kvs_object_encode(obj, len, codec, &r->h->shape, r->h->model.dtype, *lossy, cap,
                                    &out_len, err, sizeof err) == KVS_OK,
                  "%s", err);
    ck_assert_int_eq(ops->remove(st, &keys[c]),
                     KVS_OK); /* the test plugin's put keeps a key's first */
    ck_assert_int_eq(ops->put(st, &keys[c], *lossy, out_len), KVS_OK);
    free(obj);
    return out_len;
}

static uint64_t make_lossy(rig *r, const int32_t *t, int c, uint8_t **lossy) {
    return make_coded(r, t, c, &kivi4, lossy);
}

/* Run the restore of request `id` over tokens t into blocks b (127 tokens offered). */
static uint64_t restore(rig *r, const char *id, const int32_t *t, const uint32_t *b,
                        uint32_t *errs) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->on_alloc(r->h, id, b, 8, 127), KVS_OK);
    kvs_step_request s = {id, t, 128, b, 8, 127, 1};
    uint8_t meta[65536];
    uint64_t mlen, n = 0;
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(r, meta, mlen, b, t, 127, 128);
    ck_assert_int_eq(api->load_error_blocks(r->h, errs, 16, &n), KVS_OK);
    return n;
}

/* 1 when row `row` of a DROP chunk with this kept mask was dropped. */
static int dropped_at(const uint8_t *kept, uint64_t row) {
    return !(kept[row / 8] >> (row % 8) & 1);
}

/* Open over config(tier) and, with decoded_first, act as a device that cannot decode codecs while
 * copying (a GPU today): lossy chunks are then decoded into raw objects on the host first, and
 * loaded as raw; the pages must come out the same. */
static void open_rig(rig *r, int tier, int decoded_first) {
    ck_assert_int_eq(rig_open(r, KVS_ROLE_BOTH, config(tier)), KVS_OK);
    ck_assert_int_eq(r->h->device.dev_info.decodes_codecs, 1); /* the host device */
    if (decoded_first) r->h->device.dev_info.decodes_codecs = 0;
}

/* Tokens [from, to) of chunk 1 (tokens 32..63) hold in blocks b what codec c decodes the stored
 * object `lossy` to, byte for byte, in every layer (a DROP object: its kept rows, and zeros). */
static void assert_decoded(rig *r, const kvs_codec *c, const uint8_t *lossy, const uint32_t *b,
                           uint64_t from, uint64_t to) {
    uint64_t lb = r->h->layer_bytes;
    uint8_t *rows = malloc(lb);
    for (int l = 0; l < LAYERS; l++) {
        ck_assert_int_eq(
            kvs_codec_decode_layer(c, &r->h->shape, r->h->model.dtype, CHUNK,
                                   kvs_object_layer((void *)(uintptr_t)lossy, (uint32_t)l), rows,
                                   rows + lb / 2),
            KVS_OK);
        for (int kv = 0; kv < 2; kv++)
            for (uint64_t tok = from; tok < to; tok++)
                ck_assert_mem_eq(rig_kv_at(r, l, kv, b, tok),
                                 rows + kv * lb / 2 + (tok - 32) * TOKEN_BYTES, TOKEN_BYTES);
    }
    free(rows);
}

START_TEST(an_accepted_lossy_chunk_lands_as_its_codec_decodes_it) {
    rig r;
    open_rig(&r, (_i - 1) % 2 + 1, _i > 2); /* 1: zero-copy, 2: copied; 3, 4: decoded first */
    int32_t t[128];
    uint32_t a[8], b[8], errs[16];
    rig_make_tokens(t, 128, 71);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    uint8_t *lossy;
    make_lossy(&r, t, 1, &lossy);
    ck_assert_uint_eq(restore(&r, "two", t, b, errs), 0);
    /* chunks 0, 2, 3 raw: byte for byte; chunk 1 (tokens 32..63): the codec's decoding of it */
    ck_assert(rig_kv_matches(&r, b, t, 0, 32));
    ck_assert(rig_kv_matches(&r, b, t, 64, 127));
    ck_assert(!rig_kv_matches(&r, b, t, 32, 64)); /* KIVI-4 changed the bytes */
    assert_decoded(&r, &kivi4, lossy, b, 32, 64);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.load_errors, 0);
    ck_assert_uint_eq(st.chunks_loaded, 4);
    free(lossy);
    rig_close(&r);
}
END_TEST

/* The engine holds tokens [0, 48) already: the load of chunk 1 starts inside it, so its rows 16..31
 * land at tokens 48..63, decoded straight into the pages from the right rows of the encoded layer. */
START_TEST(a_lossy_chunk_loaded_from_inside_lands_its_own_rows) {
    rig r;
    open_rig(&r, (_i - 1) % 2 + 1, _i > 2);
    int32_t t[128];
    uint32_t a[8], b[8], errs[16];
    rig_make_tokens(t, 128, 91);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    uint8_t *lossy;
    make_lossy(&r, t, 1, &lossy);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 48, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127 - 48);
    /* the dram tier's header says which tokens are lossy; the plugin tier cannot tell */
    ck_assert_uint_eq(res.n_lossy_tokens, _i % 2 == 1 ? 64 - 48 : 0);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 127 - 48), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, 127 - 48, 1};
    uint8_t meta[65536];
    uint64_t mlen, n = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(&r, meta, mlen, b, t, 127, 128);
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert(rig_kv_matches(&r, b, t, 64, 127));
    assert_decoded(&r, &kivi4, lossy, b, 48, 64);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.lossy_chunks_loaded, 1);
    free(lossy);
    rig_close(&r);
}
END_TEST

START_TEST(without_accept_lossy_a_lossy_chunk_is_recomputed_and_kept) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, config(0)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8], errs[16];
    rig_make_tokens(t, 128, 73);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    uint8_t *lossy;
    make_lossy(&r, t, 2, &lossy);
    ck_assert_uint_eq(restore(&r, "two", t, b, errs), 2); /* chunk 2: blocks b[4], b[5] */
    ck_assert(errs[0] + errs[1] == b[4] + b[5]);
    ck_assert(rig_stored(&r, t, 2)); /* refused, not corrupt: it stays for engines that accept it */
    ck_assert(rig_kv_matches(&r, b, t, 0, 64));
    free(lossy);
    rig_close(&r);
}
END_TEST

START_TEST(a_damaged_lossy_chunk_becomes_error_blocks_and_is_dropped) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, config(1)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8], errs[16];
    rig_make_tokens(t, 128, 79);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    uint8_t *lossy;
    uint64_t len = make_lossy(&r, t, 0, &lossy);
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    const void *obj;
    uint64_t got;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[0], &obj, &got), KVS_OK);
    ck_assert_uint_eq(got, len);
    ((uint8_t *)obj)[len - 20] ^= 0x08; /* a code in the last encoded layer */
    ck_assert_uint_eq(restore(&r, "two", t, b, errs), 2);
    ck_assert(errs[0] + errs[1] == b[0] + b[1]);
    ck_assert(!rig_stored(&r, t, 0));
    free(lossy);
    rig_close(&r);
}
END_TEST

/* A raw object whose header's codec field was flipped is damaged, not lossy: dropped, as before
 * lossy objects existed, whether or not the engine accepts lossy KV. */
/* A derived chunk (raw layout, computed over lossy KV): without accept_lossy its load refuses it and
 * keeps it (the engine recomputes); with accept_lossy a lookup counts it lossy (its dram tier's
 * header says so) and it loads byte for byte. */
START_TEST(a_derived_chunk_is_lossy_to_lookups_and_loads) {
    for (int accept = 0; accept < 2; accept++) {
        rig r;
        ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, config(accept)), KVS_OK);
        int32_t t[128];
        uint32_t a[8], b[8], errs[16];
        rig_make_tokens(t, 128, 95 + accept);
        rig_blocks_from(a, 8, 0);
        rig_blocks_from(b, 8, 40);
        ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
        kvs_key keys[4];
        kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
        const void *obj;
        uint64_t len;
        const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
        ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[2], &obj, &len),
                         KVS_OK);
        ((kvs_object_header *)(uintptr_t)obj)->codec = KVS_CODEC_DERIVED;
        kvs_object_seal((void *)(uintptr_t)obj);
        if (!accept) { /* no tier here tells codecs: offered, and its load refuses it */
            ck_assert_uint_eq(restore(&r, "two", t, b, errs), 2);
            ck_assert(errs[0] + errs[1] == b[4] + b[5]);
        } else {
            kvs_lookup_result res = {.struct_size = sizeof res};
            ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
            ck_assert_uint_eq(res.n_hit_tokens, 127);
            ck_assert_uint_eq(res.n_lossy_tokens, 32); /* its header, read in the dram tier */
            int keep = 1;
            ck_assert_int_eq(api->request_finished(r.h, "two", &keep), KVS_OK);
            ck_assert_uint_eq(restore(&r, "three", t, b, errs), 0);
            ck_assert(rig_kv_matches(&r, b, t, 0, 127)); /* its bytes are raw */
            kvs_stats st = {.struct_size = sizeof st};
            ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
            ck_assert_uint_eq(st.lossy_chunks_loaded, 1);
        }
        ck_assert(rig_stored(&r, t, 2));
        rig_close(&r);
    }
}
END_TEST

/* Regression: a lossy chunk no tier reported before its load (the plugin tier cannot tell codecs) was
 * loaded, and the chunk the engine then computed over it was saved raw; it is saved derived. */
START_TEST(a_chunk_computed_over_a_lossy_load_is_saved_derived) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, config(2)), KVS_OK);
    r.finite = 1;
    int32_t t[160];
    uint32_t a[10], b[10];
    rig_make_tokens(t, 160, 97);
    rig_blocks_from(a, 10, 0);
    rig_blocks_from(b, 10, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    uint8_t *lossy;
    make_lossy(&r, t, 1, &lossy);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 160, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 128);
    ck_assert_uint_eq(res.n_lossy_tokens, 0); /* the plugin tier cannot tell */
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 10, 128), KVS_OK);
    kvs_step_request s = {"two", t, 160, b, 10, 128, 32};
    uint8_t meta[65536];
    uint64_t mlen, n = 0;
    uint32_t errs[16];
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(&r, meta, mlen, b, t, 128, 160);
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    kvs_key keys[5];
    kvs_keys_chain(&r.h->fingerprint, t, 5, CHUNK, keys);
    uint8_t *obj = malloc(r.h->object_bytes);
    uint64_t len = 0;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(
        ops->get(kvs_tiers_state(r.h->tiers, 0), &keys[4], obj, r.h->object_bytes, &len), KVS_OK);
    ck_assert_uint_eq(((const kvs_object_header *)obj)->codec, KVS_CODEC_DERIVED);
    free(obj), free(lossy);
    rig_close(&r);
}
END_TEST

START_TEST(a_raw_object_with_a_damaged_codec_field_is_dropped) {
    for (int accept = 0; accept < 2; accept++) {
        rig r;
        ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, config(accept)), KVS_OK);
        int32_t t[128];
        uint32_t a[8], b[8], errs[16];
        rig_make_tokens(t, 128, 83 + accept);
        rig_blocks_from(a, 8, 0);
        rig_blocks_from(b, 8, 40);
        ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
        kvs_key keys[4];
        kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
        const void *obj;
        uint64_t len;
        const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
        ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[3], &obj, &len),
                         KVS_OK);
        ((kvs_object_header *)(uintptr_t)obj)->codec = KVS_CODEC_KIVI;
        ck_assert_uint_eq(restore(&r, "two", t, b, errs), 2);
        ck_assert(errs[0] + errs[1] == b[6] + b[7]);
        ck_assert(!rig_stored(&r, t, 3));
        rig_close(&r);
    }
}
END_TEST

/* Chunk 1 stored with 12 of its 32 tokens kept (DROP). _i bit 0: the tier copies (plugin) rather
 * than lends (dram); bit 1: the engine masks dropped tokens (KVS_PLAN_CAP_MASK). An engine that masks
 * gets the whole hit, the kept rows byte for byte, zeros in the dropped slots and load_dropped
 * naming exactly those; one that does not never loads the chunk: its lookup stops before it where
 * the tier tells codecs (dram), its load refuses it where not (plugin: error blocks, recomputed). */
START_TEST(dropped_tokens_are_reported_only_to_an_engine_that_masks_them) {
    int copied = _i & 1, masks = _i >> 1 & 1, decoded_first = _i >> 2 & 1;
    rig r;
    open_rig(&r, copied ? 2 : 1, decoded_first);
    if (masks) ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_MASK), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, 16), KVS_ENOTSUP); /* unknown bits */
    int32_t t[128];
    uint32_t a[8], b[8], errs[16];
    rig_make_tokens(t, 128, 77);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    const kvs_codec drop = {.kind = KVS_CODEC_DROP, .k_group = 12};
    uint8_t *lossy;
    make_coded(&r, t, 1, &drop, &lossy);
    const uint8_t *kept = kvs_object_kept_mask(lossy);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    uint64_t hit = masks || copied ? 127 : 32;
    ck_assert_uint_eq(res.n_hit_tokens, hit);
    ck_assert_uint_eq(res.n_lossy_tokens, masks && !copied ? 32 : 0);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, hit), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, hit, 128 - hit};
    uint8_t meta[65536], dropped[128];
    uint64_t mlen, n = 0, n_dropped = 99;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, meta, mlen), KVS_OK);
    ck_assert_int_eq(api->load_dropped(r.h, "two", 0, 128, dropped, &n_dropped), KVS_ESTATE);
    ck_assert_int_eq(api->start_load(r.h), KVS_OK);
    memset(dropped, 0, sizeof dropped);
    ck_assert_int_eq(api->load_dropped(r.h, "two", 0, 128, dropped, &n_dropped), KVS_OK);
    ck_assert_uint_eq(n_dropped, masks ? 20 : 0);
    for (uint64_t p = 0; p < 128; p++) {
        int want = masks && p >= 32 && p < 64 && dropped_at(kept, p - 32);
        ck_assert_int_eq(dropped[p], want);
    }
    /* a window of it, another request */
    memset(dropped, 0, sizeof dropped);
    ck_assert_int_eq(api->load_dropped(r.h, "two", 40, 10, dropped, &n_dropped), KVS_OK);
    uint64_t in_window = 0;
    for (uint64_t p = 40; p < 50; p++) in_window += (uint64_t)dropped_at(kept, p - 32);
    ck_assert_uint_eq(n_dropped, masks ? in_window : 0);
    ck_assert_int_eq(api->load_dropped(r.h, "three", 0, 128, dropped, &n_dropped), KVS_OK);
    ck_assert_uint_eq(n_dropped, 0);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->wait_layer_load(r.h, l), KVS_OK);
    rig_write_kv(&r, b, t, hit, 128);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->save_layer(r.h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, masks || !copied ? 0 : 2); /* refused by the load: chunk 1's blocks */
    ck_assert(rig_kv_matches(&r, b, t, 0, 32));
    ck_assert(rig_kv_matches(&r, b, t, 64, 128));
    if (!masks) {
        /* computed by the engine (dram: the hit stopped before; plugin: its error blocks, which an
         * engine recomputes and this rig does not) */
        if (!copied) ck_assert(rig_kv_matches(&r, b, t, 32, 64));
        ck_assert(rig_stored(&r, t, 1)); /* refused, not corrupt: kept */
    } else {
        assert_decoded(&r, &drop, lossy, b, 32, 64);
        for (uint64_t p = 32; p < 64; p++) /* the dropped slots: zeros */
            for (int l = 0; l < LAYERS && dropped_at(kept, p - 32); l++)
                for (int kv = 0; kv < 2; kv++)
                    for (int k = 0; k < TOKEN_BYTES; k++)
                        ck_assert(rig_kv_at(&r, l, kv, b, p)[k] == 0);
        kvs_stats st = {.struct_size = sizeof st};
        ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
        ck_assert_uint_eq(st.lossy_chunks_loaded, 1);
    }
    free(lossy);
    rig_close(&r);
}
END_TEST

/* An asynchronous load refuses chunks with tokens dropped (nothing could tell the engine what to
 * mask between steps): with loads.async always, a masking engine's hit ends before such a chunk
 * rather than being offered a load certain to fail. */
START_TEST(an_async_load_is_never_offered_dropped_tokens) {
    rig r;
    char text[768];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n"
             "  - name: dram\n    type: dram\n    capacity: 1MiB\n"
             "loads:\n  accept_lossy: true\n  async: always\n",
             rig_device_section(), CHUNK);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_config("async.yaml", text)), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_MASK), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 79);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    const kvs_codec drop = {.kind = KVS_CODEC_DROP, .k_group = 12};
    uint8_t *lossy;
    make_coded(&r, t, 1, &drop, &lossy);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 32);
    ck_assert_uint_eq(res.load_async, 1);
    ck_assert_uint_eq(res.n_lossy_tokens, 0);
    free(lossy);
    rig_close(&r);
}
END_TEST

/* The engine holds tokens [0, 40): the load of the DROP chunk 1 starts inside it, so load_dropped
 * names only its dropped positions from 40 on, and those land zeroed, the kept ones exact. */
START_TEST(a_drop_chunk_loaded_from_inside_reports_its_own_positions) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, config(1)), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_MASK), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 83);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    const kvs_codec drop = {.kind = KVS_CODEC_DROP, .k_group = 12};
    uint8_t *lossy;
    make_coded(&r, t, 1, &drop, &lossy);
    const uint8_t *kept = kvs_object_kept_mask(lossy);
    rig_write_kv(&r, b, t, 0, 40); /* what the engine holds */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 40, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127 - 40);
    ck_assert_uint_eq(res.n_lossy_tokens, 64 - 40);
    uint8_t dropped[128];
    uint64_t n_dropped = 0, want = 0;
    ck_assert_uint_eq(rig_drop_step(&r, "two", t, b, 40, 127 - 40, dropped, &n_dropped), 0);
    for (uint64_t p = 0; p < 128; p++) {
        int d = p >= 40 && p < 64 && dropped_at(kept, p - 32);
        ck_assert_int_eq(dropped[p], d);
        want += (uint64_t)d;
    }
    ck_assert_uint_gt(want, 0);
    ck_assert_uint_eq(n_dropped, want);
    ck_assert(rig_kv_matches(&r, b, t, 0, 40));
    ck_assert(rig_kv_matches(&r, b, t, 64, 128));
    assert_decoded(&r, &drop, lossy, b, 40, 64); /* kept rows the object's, dropped ones zero */
    free(lossy);
    rig_close(&r);
}
END_TEST

static Suite *lossy_suite(void) {
    Suite *s = suite_create("lossy_loads");
    TCase *tc = tcase_create("lossy loads");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, an_accepted_lossy_chunk_lands_as_its_codec_decodes_it, 1, 5);
    tcase_add_loop_test(tc, a_lossy_chunk_loaded_from_inside_lands_its_own_rows, 1, 5);
    tcase_add_test(tc, without_accept_lossy_a_lossy_chunk_is_recomputed_and_kept);
    tcase_add_test(tc, a_damaged_lossy_chunk_becomes_error_blocks_and_is_dropped);
    tcase_add_test(tc, a_derived_chunk_is_lossy_to_lookups_and_loads);
    tcase_add_test(tc, a_chunk_computed_over_a_lossy_load_is_saved_derived);
    tcase_add_test(tc, a_raw_object_with_a_damaged_codec_field_is_dropped);
    tcase_add_loop_test(tc, dropped_tokens_are_reported_only_to_an_engine_that_masks_them, 0, 8);
    tcase_add_test(tc, an_async_load_is_never_offered_dropped_tokens);
    tcase_add_test(tc, a_drop_chunk_loaded_from_inside_reports_its_own_positions);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(lossy_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
