/* connector_rig.c - the connector rig of connector_rig.h. */
#include "connector_rig.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "connector/handle.h"
#include "connector/keys.h"
#include "kernels/cpu/dtype.h"
#include "test_support.h"

char rig_tmpdir[512];
int rig_layers = LAYERS;
uint32_t rig_transfer_role = KVS_TRANSFER_BOTH;

static const kvs_api *rig_api(void) {
    return kvs_get_api(KVS_ABI_MAJOR);
}

void rig_setup(void) {
    rig_layers = LAYERS;
    rig_transfer_role = KVS_TRANSFER_BOTH;
    ck_assert_int_eq(kvs_test_tmpdir(rig_tmpdir, sizeof rig_tmpdir), 0);
}

void rig_teardown(void) {
    kvs_test_rmtree(rig_tmpdir);
}

const char *rig_config(const char *name, const char *text) {
    static char path[1024];
    ck_assert_int_eq(kvs_test_write_file(rig_tmpdir, name, text, path, sizeof path), 0);
    return path;
}

const char *rig_device_section(void) {
    const char *mode = getenv("KVS_TEST_HOST_COPIES");
    if (mode && strcmp(mode, "deferred") == 0)
        return "device:\n  host_copies: deferred\n  hash_threads: 2\n";
    if (mode && strcmp(mode, "threads") == 0) return "device:\n  host_threads: 3\n";
    return "";
}

const char *rig_dram_config(uint64_t capacity_objects, uint64_t lease_ms) {
    /* one object: 4096 header + 2 layers * 2 * 32 tokens * 64 bytes = 12288 bytes */
    static char text[512];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\nlease_timeout_ms: %llu\npool:\n  staging_bytes: 1MiB\n"
             "tiers:\n  - name: dram\n    type: dram\n    capacity: %llu\n",
             rig_device_section(), CHUNK, (unsigned long long)lease_ms,
             (unsigned long long)(capacity_objects * 12288));
    return rig_config("dram.yaml", text);
}

const char *rig_shared_config(void) {
    static char text[512];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\ntiers:\n  - name: dram\n    type: dram\n    capacity: 4MiB\n"
             "    options:\n      shm_name: kvs-test-%d\n",
             rig_device_section(), CHUNK, (int)getpid());
    return rig_config("shared.yaml", text);
}

kvs_model_desc rig_model(void) {
    return (kvs_model_desc){.struct_size = sizeof(kvs_model_desc),
                            .model_id = "test-model",
                            .dtype = KVS_DTYPE_FP16,
                            .n_layers = (uint32_t)rig_layers,
                            .n_kv_heads = HEADS,
                            .head_dim = HEAD_DIM,
                            .block_tokens = BT,
                            .tp_size = 1,
                            .vocab_size = 1000};
}

uint64_t rig_layer_span(void) {
    return 2ull * BLOCKS * BT * TOKEN_BYTES;
}

kvs_status rig_open(rig *r, kvs_role role, const char *cfg) {
    kvs_model_desc m = rig_model();
    return rig_open_model(r, role, cfg, &m);
}

kvs_status rig_open_model(rig *r, kvs_role role, const char *cfg, const kvs_model_desc *m) {
    memset(r, 0, sizeof *r);
    r->mla = m->is_mla != 0;
    kvs_open_params p = {.struct_size = sizeof p,
                         .role = role,
                         .config_path = cfg,
                         .model = m,
                         .transfer_role = rig_transfer_role};
    kvs_status st = rig_api()->open(&p, &r->h, r->error, sizeof r->error);
    if (st == KVS_OK) {
        kvs_clock_init_manual(&r->clock, kvs_now_ns());
        r->h->reqs.clock = &r->clock;
    }
    if (st != KVS_OK || !(role & KVS_ROLE_WORKER)) return st;
    r->pages = calloc((size_t)rig_layers, rig_layer_span());
    if (!r->pages) return KVS_ENOMEM;
    for (int l = 0; l < rig_layers; l++) {
        uint8_t *base = r->pages + l * rig_layer_span();
        r->views[l] = (kvs_layer_view){.struct_size = sizeof(kvs_layer_view),
                                       .device_kind = KVS_DEVICE_HOST,
                                       .n_blocks = BLOCKS,
                                       .k_base = base,
                                       .v_base = r->mla ? NULL : base + rig_layer_span() / 2,
                                       .block_stride = BT * TOKEN_BYTES,
                                       .token_stride = TOKEN_BYTES,
                                       .head_stride = HEAD_BYTES};
    }
    return rig_api()->register_kv(r->h, r->views, (uint32_t)rig_layers);
}

void rig_close(rig *r) {
    rig_api()->close(r->h);
    free(r->pages);
    r->h = NULL;
    r->pages = NULL;
}

uint8_t *rig_kv_at(rig *r, int layer, int kv, const uint32_t *blocks, uint64_t t) {
    return r->pages + layer * rig_layer_span() + kv * (rig_layer_span() / 2) +
           ((uint64_t)blocks[t / BT] * BT + t % BT) * TOKEN_BYTES;
}

/* Byte b of token t's K (kv 0) or V in layer l: a byte pattern, or with r->finite the bytes of
 * fp16 values in [-4, 4). */
static uint8_t kv_byte(const rig *r, const int32_t *tokens, uint64_t t, int l, int kv, int b) {
    int x = tokens[t] * 7 + (int)t * 3 + l * 11 + kv * 5 + r->kv_seed * 13;
    if (!r->finite) return (uint8_t)(x + b);
    uint16_t h = kvs_f32_to_f16((float)((x * 31 + (b / 2) * 17) % 2000 - 1000) / 250.0f);
    return (uint8_t)(b & 1 ? h >> 8 : h);
}

void rig_write_kv_layers(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                         uint64_t to, int l0, int l1) {
    for (int l = l0; l < l1; l++)
        for (int kv = 0; kv < 2 - r->mla; kv++)
            for (uint64_t t = from; t < to; t++) {
                uint8_t *p = rig_kv_at(r, l, kv, blocks, t);
                for (int b = 0; b < TOKEN_BYTES; b++) p[b] = kv_byte(r, tokens, t, l, kv, b);
            }
}

void rig_write_kv(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                  uint64_t to) {
    rig_write_kv_layers(r, blocks, tokens, from, to, 0, rig_layers);
}

int rig_kv_matches(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                   uint64_t to) {
    for (int l = 0; l < rig_layers; l++)
        for (int kv = 0; kv < 2 - r->mla; kv++)
            for (uint64_t t = from; t < to; t++) {
                uint8_t *p = rig_kv_at(r, l, kv, blocks, t);
                for (int b = 0; b < TOKEN_BYTES; b++)
                    if (p[b] != kv_byte(r, tokens, t, l, kv, b)) return 0;
            }
    return 1;
}

void rig_make_tokens(int32_t *tokens, uint64_t n, int seed) {
    for (uint64_t i = 0; i < n; i++) tokens[i] = (int32_t)((i * 37 + (uint64_t)seed * 101) % 1000);
}

void rig_blocks_from(uint32_t *blocks, uint64_t n, uint32_t first) {
    for (uint64_t i = 0; i < n; i++) blocks[i] = first + (uint32_t)i;
}

void rig_worker_step(rig *r, const void *meta, uint64_t len, const uint32_t *blocks,
                     const int32_t *tokens, uint64_t compute_from, uint64_t compute_to) {
    const kvs_api *api = rig_api();
    ck_assert_int_eq(api->bind_meta(r->h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(r->h), KVS_OK);
    for (uint32_t l = 0; l < (uint32_t)rig_layers; l++)
        ck_assert_int_eq(api->wait_layer_load(r->h, l), KVS_OK);
    rig_write_kv(r, blocks, tokens, compute_from, compute_to);
    for (uint32_t l = 0; l < (uint32_t)rig_layers; l++)
        ck_assert_int_eq(api->save_layer(r->h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(r->h), KVS_OK);
}

uint64_t rig_prefill(rig *r, const char *id, const int32_t *tokens, uint64_t n,
                     const uint32_t *blocks) {
    const kvs_api *api = rig_api();
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, tokens, n, 0, &res), KVS_OK);
    uint64_t nb = (n + BT - 1) / BT;
    ck_assert_int_eq(api->on_alloc(r->h, id, blocks, nb, res.n_hit_tokens), KVS_OK);
    kvs_step_request s = {id, tokens, n, blocks, nb, res.n_hit_tokens, n - res.n_hit_tokens};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    rig_worker_step(r, meta, len, blocks, tokens, res.n_hit_tokens, n);
    int keep = 1;
    ck_assert_int_eq(api->request_finished(r->h, id, &keep), KVS_OK);
    ck_assert_int_eq(keep, 0);
    return res.n_hit_tokens;
}

int rig_stored(rig *r, const int32_t *tokens, uint64_t chunk) {
    kvs_key keys[16];
    kvs_keys_chain(&r->h->fingerprint, tokens, chunk + 1, CHUNK, keys);
    return kvs_tiers_find(r->h->tiers, &keys[chunk]) >= 0;
}

uint64_t rig_drop_step(rig *r, const char *id, const int32_t *t, const uint32_t *b,
                       uint64_t n_computed, uint64_t hit, uint8_t *dropped, uint64_t *n_dropped) {
    const kvs_api *api = rig_api();
    ck_assert_int_eq(api->on_alloc(r->h, id, b, 8, hit), KVS_OK);
    kvs_step_request s = {id, t, 128, b, 8, n_computed + hit, 128 - n_computed - hit};
    uint8_t meta[65536];
    uint64_t mlen, n = 0;
    uint32_t errs[16];
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r->h, meta, mlen), KVS_OK);
    ck_assert_int_eq(api->load_dropped(r->h, id, 0, 128, dropped, n_dropped), KVS_ESTATE);
    ck_assert_int_eq(api->start_load(r->h), KVS_OK);
    memset(dropped, 0, 128);
    ck_assert_int_eq(api->load_dropped(r->h, id, 0, 128, dropped, n_dropped), KVS_OK);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->wait_layer_load(r->h, l), KVS_OK);
    rig_write_kv(r, b, t, n_computed + hit, 128);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->save_layer(r->h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(r->h), KVS_OK);
    ck_assert_int_eq(api->load_error_blocks(r->h, errs, 16, &n), KVS_OK);
    return n;
}
