/* test_connector.c - the connector through its ABI table: save/restore round trips, lookups, leases,
 * eviction, plugins, the process boundary and every class of bad input. The library is driven with
 * the host device and a vLLM FlashAttention (NHD) layout; other layouts are covered in test_kernels. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "abi/kvstrata.h"
#include "common/clock.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/meta.h"
#include "connector/scheduler.h"
#include "tests/support/test_support.h"

#ifndef KVS_TEST_LIB_DIR
#define KVS_TEST_LIB_DIR "build/lib"
#endif

enum { LAYERS = 2, HEADS = 2, HEAD_DIM = 16, BT = 16, CHUNK = 32, BLOCKS = 64 };
#define HEAD_BYTES  (HEAD_DIM * 2)
#define TOKEN_BYTES (HEADS * HEAD_BYTES)

static const kvs_api *api;
static char tmpdir[512];
static int rig_layers =
    LAYERS; /* registered layers of the rigs a test opens (stage tests add some) */
#define RIG_MAX_LAYERS 8

typedef struct rig {
    kvs_handle *h;
    uint8_t *pages; /* [LAYERS][2][BLOCKS][BT][HEADS][HEAD_BYTES] */
    kvs_layer_view views[RIG_MAX_LAYERS];
    char error[512];
    kvs_clock clock; /* the handle's leases run on it: a test moves it on instead of sleeping */
} rig;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_layers = LAYERS;
    ck_assert_int_eq(kvs_test_tmpdir(tmpdir, sizeof tmpdir), 0);
}

static void teardown(void) {
    kvs_test_rmtree(tmpdir);
}

static const char *config(const char *name, const char *text) {
    static char path[1024];
    ck_assert_int_eq(kvs_test_write_file(tmpdir, name, text, path, sizeof path), 0);
    return path;
}

/* KVS_TEST_HOST_COPIES=deferred runs the suite with the host device acting like an asynchronous
 * one (copies at wait_layer_load / wait_save, checksums on the hash pool): the CUDA ordering path. */
static const char *device_section(void) {
    const char *mode = getenv("KVS_TEST_HOST_COPIES");
    return mode && strcmp(mode, "deferred") == 0
               ? "device:\n  host_copies: deferred\n  hash_threads: 2\n"
               : "";
}

static kvs_model_desc model(void) {
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

static uint64_t layer_span(void) {
    return 2ull * BLOCKS * BT * TOKEN_BYTES;
}

static kvs_status rig_open(rig *r, kvs_role role, const char *cfg) {
    memset(r, 0, sizeof *r);
    kvs_model_desc m = model();
    kvs_open_params p = {.struct_size = sizeof p, .role = role, .config_path = cfg, .model = &m};
    kvs_status st = api->open(&p, &r->h, r->error, sizeof r->error);
    if (st == KVS_OK) {
        kvs_clock_init_manual(&r->clock, kvs_now_ns());
        r->h->clock = &r->clock;
    }
    if (st != KVS_OK || !(role & KVS_ROLE_WORKER)) return st;
    r->pages = calloc((size_t)rig_layers, layer_span());
    for (int l = 0; l < rig_layers; l++) {
        uint8_t *base = r->pages + l * layer_span();
        r->views[l] = (kvs_layer_view){.struct_size = sizeof(kvs_layer_view),
                                       .device_kind = KVS_DEVICE_HOST,
                                       .n_blocks = BLOCKS,
                                       .k_base = base,
                                       .v_base = base + layer_span() / 2,
                                       .block_stride = BT * TOKEN_BYTES,
                                       .token_stride = TOKEN_BYTES,
                                       .head_stride = HEAD_BYTES};
    }
    return api->register_kv(r->h, r->views, (uint32_t)rig_layers);
}

static void rig_close(rig *r) {
    api->close(r->h);
    free(r->pages);
    r->h = NULL;
    r->pages = NULL;
}

/* Address of K (kv=0) or V (kv=1) of token t of a request with block table `blocks`. */
static uint8_t *kv_at(rig *r, int layer, int kv, const uint32_t *blocks, uint64_t t) {
    return r->pages + layer * layer_span() + kv * (layer_span() / 2) +
           ((uint64_t)blocks[t / BT] * BT + t % BT) * TOKEN_BYTES;
}

/* What the engine "computed" for a token in layers [l0, l1): a function of the token's value,
 * position, layer and kv. */
static void write_kv_layers(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                            uint64_t to, int l0, int l1) {
    for (int l = l0; l < l1; l++)
        for (int kv = 0; kv < 2; kv++)
            for (uint64_t t = from; t < to; t++) {
                uint8_t *p = kv_at(r, l, kv, blocks, t);
                for (int b = 0; b < TOKEN_BYTES; b++)
                    p[b] = (uint8_t)(tokens[t] * 7 + (int)t * 3 + l * 11 + kv * 5 + b);
            }
}

static void write_kv(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                     uint64_t to) {
    write_kv_layers(r, blocks, tokens, from, to, 0, rig_layers);
}

static int kv_matches(rig *r, const uint32_t *blocks, const int32_t *tokens, uint64_t from,
                      uint64_t to) {
    for (int l = 0; l < rig_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (uint64_t t = from; t < to; t++) {
                uint8_t *p = kv_at(r, l, kv, blocks, t);
                for (int b = 0; b < TOKEN_BYTES; b++)
                    if (p[b] != (uint8_t)(tokens[t] * 7 + (int)t * 3 + l * 11 + kv * 5 + b))
                        return 0;
            }
    return 1;
}

static void make_tokens(int32_t *tokens, uint64_t n, int seed) {
    for (uint64_t i = 0; i < n; i++) tokens[i] = (int32_t)((i * 37 + (uint64_t)seed * 101) % 1000);
}

static void blocks_from(uint32_t *blocks, uint64_t n, uint32_t first) {
    for (uint64_t i = 0; i < n; i++) blocks[i] = first + (uint32_t)i;
}

/* The worker half of one step: bind, load, (compute), save, finish. */
static void worker_step(rig *r, const void *meta, uint64_t len, const uint32_t *blocks,
                        const int32_t *tokens, uint64_t compute_from, uint64_t compute_to) {
    ck_assert_int_eq(api->bind_meta(r->h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(r->h), KVS_OK);
    for (uint32_t l = 0; l < (uint32_t)rig_layers; l++)
        ck_assert_int_eq(api->wait_layer_load(r->h, l), KVS_OK);
    write_kv(r, blocks, tokens, compute_from, compute_to);
    for (uint32_t l = 0; l < (uint32_t)rig_layers; l++)
        ck_assert_int_eq(api->save_layer(r->h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(r->h), KVS_OK);
}

/* One whole prefill of a request in one step, on a handle of role both: returns the hit tokens. */
static uint64_t prefill(rig *r, const char *id, const int32_t *tokens, uint64_t n,
                        const uint32_t *blocks) {
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, tokens, n, 0, &res), KVS_OK);
    uint64_t nb = (n + BT - 1) / BT;
    ck_assert_int_eq(api->on_alloc(r->h, id, blocks, nb, res.n_hit_tokens), KVS_OK);
    kvs_step_request s = {id, tokens, n, blocks, nb, res.n_hit_tokens, n - res.n_hit_tokens};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    worker_step(r, meta, len, blocks, tokens, res.n_hit_tokens, n);
    int keep = 1;
    ck_assert_int_eq(api->request_finished(r->h, id, &keep), KVS_OK);
    ck_assert_int_eq(keep, 0);
    return res.n_hit_tokens;
}

static const char *dram_config(uint64_t capacity_objects, uint64_t lease_ms) {
    /* one object: 4096 header + 2 layers * 2 * 32 tokens * 64 bytes = 12288 bytes */
    static char text[512];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\nlease_timeout_ms: %llu\npool:\n  staging_bytes: 1MiB\n"
             "tiers:\n  - name: dram\n    type: dram\n    capacity: %llu\n",
             device_section(), CHUNK, (unsigned long long)lease_ms,
             (unsigned long long)(capacity_objects * 12288));
    return config("dram.yaml", text);
}

/* --- round trips ---------------------------------------------------------------------------------- */

START_TEST(restore_into_other_pages_is_byte_identical) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8], b[8];
    make_tokens(tokens, 128, 1);
    blocks_from(a, 8, 0);
    blocks_from(b, 8, 20);
    ck_assert_uint_eq(prefill(&r, "a", tokens, 128, a), 0);
    /* Whole prompt stored: the connector offers all but the last token. */
    ck_assert_uint_eq(prefill(&r, "b", tokens, 128, b), 127);
    ck_assert(kv_matches(&r, b, tokens, 0, 128));
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.chunks_saved, 4);
    ck_assert_uint_eq(s.chunks_loaded, 4);
    ck_assert_uint_eq(s.bytes_loaded, 127ull * LAYERS * 2 * TOKEN_BYTES);
    ck_assert_uint_eq(s.load_errors, 0);
    rig_close(&r);
}
END_TEST

START_TEST(lookup_stops_at_first_missing_chunk) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8];
    make_tokens(tokens, 128, 2);
    blocks_from(a, 8, 0);
    prefill(&r, "a", tokens, 128, a);
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

START_TEST(partial_local_hit_loads_only_the_rest) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8], b[8];
    make_tokens(tokens, 128, 3);
    blocks_from(a, 8, 0);
    blocks_from(b, 8, 30);
    prefill(&r, "a", tokens, 128, a);
    /* The engine holds the first 48 tokens itself (blocks b[0..2]); the connector fills 48..127. */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "b", tokens, 128, 48, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 79);
    ck_assert_int_eq(api->on_alloc(r.h, "b", b, 8, 79), KVS_OK);
    kvs_step_request s = {"b", tokens, 128, b, 8, 127, 1};
    uint8_t meta[65536];
    uint64_t len;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    worker_step(&r, meta, len, b, tokens, 127, 128);
    ck_assert(kv_matches(&r, b, tokens, 48, 128));
    /* Tokens 0..47 were not touched by the load. */
    uint8_t zero[TOKEN_BYTES] = {0};
    ck_assert_mem_eq(kv_at(&r, 0, 0, b, 0), zero, TOKEN_BYTES);
    rig_close(&r);
}
END_TEST

/* --- keys ----------------------------------------------------------------------------------------- */

static void print_keys(void) {
    kvs_model_desc m = model();
    kvs_key fp, keys[4];
    int32_t tokens[128];
    make_tokens(tokens, 128, 9);
    kvs_keys_fingerprint(&m, CHUNK, &fp);
    kvs_keys_chain(&fp, tokens, 4, CHUNK, keys);
    for (int i = 0; i < 4; i++) {
        char hex[33];
        kvs_key_hex(&keys[i], hex);
        printf("%s\n", hex);
    }
}

START_TEST(keys_are_deterministic_across_processes) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execl("/proc/self/exe", "test_connector", "--print-keys", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char child[512] = {0};
    size_t got = 0;
    ssize_t n;
    while ((n = read(fds[0], child + got, sizeof child - 1 - got)) > 0) got += (size_t)n;
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char mine[512] = {0};
    FILE *f = fmemopen(mine, sizeof mine, "w");
    FILE *saved = stdout;
    stdout = f;
    print_keys();
    stdout = saved;
    fclose(f);
    ck_assert_uint_eq(strlen(child), 4 * 33);
    ck_assert_str_eq(child, mine);
}
END_TEST

START_TEST(keys_chain_on_the_prefix_and_the_model) {
    kvs_model_desc m = model();
    kvs_key fp, fp2, k1[2], k2[2];
    int32_t tokens[64];
    make_tokens(tokens, 64, 4);
    kvs_keys_fingerprint(&m, CHUNK, &fp);
    kvs_keys_chain(&fp, tokens, 2, CHUNK, k1);
    tokens[0]++; /* a change in chunk 0 changes chunk 1's key too */
    kvs_keys_chain(&fp, tokens, 2, CHUNK, k2);
    ck_assert(memcmp(&k1[0], &k2[0], 16) != 0);
    ck_assert(memcmp(&k1[1], &k2[1], 16) != 0);
    tokens[0]--;
    m.tp_rank = 1;
    m.tp_size = 2;
    kvs_keys_fingerprint(&m, CHUNK, &fp2);
    ck_assert(memcmp(&fp, &fp2, 16) != 0);
    m.is_mla = 1; /* MLA keys ignore the rank */
    kvs_key a, b;
    kvs_keys_fingerprint(&m, CHUNK, &a);
    m.tp_rank = 0;
    kvs_keys_fingerprint(&m, CHUNK, &b);
    ck_assert_mem_eq(&a, &b, 16);
    /* A known value: changes here break every stored object in every deployment. */
    m = model();
    kvs_keys_fingerprint(&m, CHUNK, &fp);
    char hex[33];
    kvs_key_hex(&fp, hex);
    ck_assert_uint_eq(strlen(hex), 32);
    kvs_key again;
    kvs_keys_fingerprint(&m, CHUNK, &again);
    ck_assert_mem_eq(&fp, &again, 16);
}
END_TEST

/* --- leases and eviction -------------------------------------------------------------------------- */

static int stored(rig *r, const int32_t *tokens, uint64_t chunk) {
    kvs_key keys[16];
    kvs_keys_chain(&r->h->fingerprint, tokens, chunk + 1, CHUNK, keys);
    return kvs_tiers_find(r->h->tiers, &keys[chunk]) >= 0;
}

START_TEST(eviction_under_pressure_keeps_the_newest) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(4, 30000)), KVS_OK);
    int32_t t1[128], t2[128];
    uint32_t a[8];
    blocks_from(a, 8, 0);
    make_tokens(t1, 128, 11);
    make_tokens(t2, 128, 12);
    prefill(&r, "one", t1, 128, a);
    prefill(&r, "two", t2, 128, a);
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.chunks_saved, 8);
    ck_assert_uint_eq(s.evictions, 4);
    for (int c = 0; c < 4; c++) {
        ck_assert(!stored(&r, t1, (uint64_t)c));
        ck_assert(stored(&r, t2, (uint64_t)c));
    }
    kvs_event ev[64];
    uint64_t n = 0;
    ck_assert_int_eq(api->take_events(r.h, ev, 64, &n), KVS_OK);
    ck_assert_uint_eq(n, 12); /* 8 stored, 4 removed */
    rig_close(&r);
}
END_TEST

START_TEST(a_lease_pins_until_it_expires) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(4, 30000)), KVS_OK);
    int32_t t1[128], t2[128], t3[128];
    uint32_t a[8];
    blocks_from(a, 8, 0);
    make_tokens(t1, 128, 21);
    make_tokens(t2, 128, 22);
    make_tokens(t3, 128, 23);
    prefill(&r, "one", t1, 128, a);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "holder", t1, 64, 0, &res), KVS_OK); /* pins chunks 0, 1 */
    ck_assert_uint_eq(res.n_hit_tokens, 63);
    prefill(&r, "two", t2, 128, a); /* needs 4 slots: only chunks 2, 3 of t1 may go */
    ck_assert(stored(&r, t1, 0));
    ck_assert(stored(&r, t1, 1));
    ck_assert(!stored(&r, t1, 2));
    kvs_clock_advance(&r.clock, 30100 * 1000000ull); /* past the 30 s lease */
    prefill(&r, "three", t3, 128, a); /* the lease has expired: everything may go now */
    ck_assert(!stored(&r, t1, 0));
    ck_assert(!stored(&r, t1, 1));
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.leases_expired, 1);
    ck_assert_uint_eq(s.leases_active, 0);
    rig_close(&r);
}
END_TEST

START_TEST(releasing_twice_is_harmless) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(4, 30000)), KVS_OK);
    int32_t t1[128], t2[128];
    uint32_t a[8];
    blocks_from(a, 8, 0);
    make_tokens(t1, 128, 31);
    make_tokens(t2, 128, 32);
    prefill(&r, "one", t1, 128, a);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "x", t1, 128, 0, &res), KVS_OK);
    int keep;
    ck_assert_int_eq(api->request_finished(r.h, "x", &keep), KVS_OK);
    ck_assert_int_eq(api->request_finished(r.h, "x", &keep), KVS_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "'x'"));
    /* No pin outlived the release: all four chunks can be evicted. */
    prefill(&r, "two", t2, 128, a);
    for (int c = 0; c < 4; c++) ck_assert(!stored(&r, t1, (uint64_t)c));
    kvs_stats s = {.struct_size = sizeof s};
    api->stats(r.h, &s);
    ck_assert_uint_eq(s.leases_active, 0);
    rig_close(&r);
}
END_TEST

/* A tier that cannot be written in place (a backend ABI 1.0 plugin) saves through staging slabs. */
START_TEST(saves_without_staging_memory_are_skipped_and_counted) {
    char text[1024];
    snprintf(
        text, sizeof text,
        "chunk_tokens: 32\npool:\n  staging_bytes: 16KiB\ntiers:\n  - name: mem\n    type: plugin\n"
        "    plugin: %s/plugin_memory.so\n    options:\n      slots: \"16\"\n",
        KVS_TEST_LIB_DIR);
    const char *cfg = config("tiny.yaml", text);
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    make_tokens(t, 128, 41);
    blocks_from(a, 8, 0);
    prefill(&r, "one", t, 128, a);
    kvs_stats s = {.struct_size = sizeof s};
    api->stats(r.h, &s);
    ck_assert_uint_eq(s.chunks_saved, 1);
    ck_assert_uint_eq(s.saves_skipped, 3);
    rig_close(&r);
}
END_TEST

/* --- corruption ----------------------------------------------------------------------------------- */

START_TEST(a_corrupt_object_becomes_error_blocks_and_is_dropped) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    make_tokens(t, 128, 51);
    blocks_from(a, 8, 0);
    blocks_from(b, 8, 40);
    prefill(&r, "one", t, 128, a);
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    const void *obj;
    uint64_t len;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[1], &obj, &len), KVS_OK);
    ((uint8_t *)obj)[len - 100] ^= 0x40; /* flip a bit in the last layer of chunk 1 */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 127), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, 127, 1};
    uint8_t meta[65536];
    uint64_t mlen;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    worker_step(&r, meta, mlen, b, t, 127, 128);
    uint32_t errs[16];
    uint64_t n = 0;
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 2); /* chunk 1 = tokens 32..63 = blocks b[2], b[3] */
    ck_assert(errs[0] + errs[1] == b[2] + b[3]);
    ck_assert(!stored(&r, t, 1));
    ck_assert(stored(&r, t, 2));
    ck_assert(kv_matches(&r, b, t, 0, 32));
    kvs_stats st = {.struct_size = sizeof st};
    api->stats(r.h, &st);
    ck_assert_uint_eq(st.load_errors, 1);
    rig_close(&r);
}
END_TEST

/* Chunks computed in the step of a failed load attended to garbage, so they are not stored; when the
 * engine recomputes the request, saving resumes from where it rolled back. */
START_TEST(chunks_computed_after_a_failed_load_are_not_stored) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8], c[8];
    make_tokens(t, 128, 57);
    blocks_from(a, 8, 0);
    blocks_from(b, 8, 20);
    blocks_from(c, 8, 40);
    prefill(&r, "one", t, 64, a); /* stores chunks 0 and 1 */
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    const void *obj;
    uint64_t len;
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r.h->tiers, 0), &keys[0], &obj, &len), KVS_OK);
    ((uint8_t *)obj)[len - 10] ^= 0x01; /* corrupt chunk 0 */

    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 64);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, 64), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, 64, 64};
    uint8_t meta[65536];
    uint64_t mlen;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    worker_step(&r, meta, mlen, b, t, 64, 128);
    uint64_t n = 0;
    uint32_t errs[16];
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);      /* chunk 0 = blocks b[0], b[1] */
    ck_assert(!stored(&r, t, 0)); /* corrupt: dropped */
    ck_assert(stored(&r, t, 1));  /* loaded fine, untouched */
    ck_assert(!stored(&r, t, 2)); /* computed on top of the failed chunk */
    ck_assert(!stored(&r, t, 3));

    /* The engine recomputes the whole request in the next step. */
    kvs_step_request again = {"two", t, 128, b, 8, 0, 128};
    ck_assert_int_eq(api->build_meta(r.h, &again, 1, meta, sizeof meta, &mlen), KVS_OK);
    worker_step(&r, meta, mlen, b, t, 0, 128);
    ck_assert_int_eq(api->load_error_blocks(r.h, errs, 16, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    for (uint64_t k = 0; k < 4; k++) ck_assert(stored(&r, t, k));
    int keep = 1;
    ck_assert_int_eq(api->request_finished(r.h, "two", &keep), KVS_OK);

    ck_assert_uint_eq(prefill(&r, "three", t, 128, c), 127);
    ck_assert(kv_matches(&r, c, t, 0, 128));
    rig_close(&r);
}
END_TEST

/* --- plugins -------------------------------------------------------------------------------------- */

static const char *plugin_config(const char *so) {
    static char text[1024];
    snprintf(text, sizeof text,
             "%schunk_tokens: 32\ntiers:\n  - name: mem\n    type: plugin\n    plugin: %s/%s\n"
             "    options:\n      slots: \"16\"\n",
             device_section(), KVS_TEST_LIB_DIR, so);
    return config("plugin.yaml", text);
}

START_TEST(a_plugin_backend_round_trips_through_staging) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, plugin_config("plugin_memory.so")), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    make_tokens(t, 128, 61);
    blocks_from(a, 8, 0);
    blocks_from(b, 8, 10);
    prefill(&r, "one", t, 128, a);
    ck_assert_uint_eq(prefill(&r, "two", t, 128, b), 127);
    ck_assert(kv_matches(&r, b, t, 0, 127));
    rig_close(&r);
}
END_TEST

START_TEST(a_plugin_of_another_major_is_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, plugin_config("plugin_future_major.so")),
                     KVS_EVERSION);
    ck_assert_ptr_null(r.h);
    ck_assert_ptr_nonnull(strstr(r.error, "major 2"));
}
END_TEST

START_TEST(a_shared_object_that_is_not_a_backend_is_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, plugin_config("plugin_not_backend.so")),
                     KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, ": key 'tiers[0].plugin': "));
    ck_assert_ptr_nonnull(strstr(r.error, "not a kvstrata backend"));
    char text[1024];
    snprintf(text, sizeof text,
             "tiers:\n  - name: mem\n    type: plugin\n    plugin: %s/dram.yaml\n", tmpdir);
    dram_config(4, 100); /* a file that exists and is not a shared object */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, config("p.yaml", text)), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, "p.yaml:4:13: key 'tiers[0].plugin'"));
    ck_assert_ptr_nonnull(strstr(r.error, "cannot load plugin"));
}
END_TEST

/* An ssd top tier whose device refuses every write (ENOSPC, nothing to evict) accepts each put and
 * drops it in the background: the drops reach the stats as skipped saves, not as saved chunks. */
START_TEST(saves_a_full_device_drops_after_accepting_them_count_as_skipped) {
    rig r;
    char text[1024], disk[600];
    snprintf(disk, sizeof disk, "%s/disk", tmpdir);
    ck_assert_int_eq(mkdir(disk, 0700), 0);
    snprintf(
        text, sizeof text,
        "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n  - name: nvme\n    type: ssd\n"
        "    capacity: 4MiB\n    paths: [%s]\n    options:\n      fault_inject: enospc_after:0\n",
        device_section(), CHUNK, disk);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, config("ssd.yaml", text)), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8];
    make_tokens(tokens, 128, 5);
    blocks_from(a, 8, 0);
    prefill(&r, "a", tokens, 128, a);
    kvs_stats s = {.struct_size = sizeof s};
    for (int tries = 0; tries < 2000; tries++) { /* the writes finish in the background */
        ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
        if (s.saves_skipped == 4) break;
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    ck_assert_uint_eq(s.saves_skipped, 4);
    ck_assert_uint_eq(s.chunks_saved, 0);
    ck_assert_uint_eq(s.evictions, 0); /* a dropped save is not an eviction */
    /* A router that saw the saves stored also learns they are gone. */
    kvs_event ev[16];
    uint64_t n = 0, stored_events = 0, removed_events = 0;
    ck_assert_int_eq(api->take_events(r.h, ev, 16, &n), KVS_OK);
    for (uint64_t i = 0; i < n; i++) {
        stored_events += ev[i].kind == KVS_EVENT_STORED;
        removed_events += ev[i].kind == KVS_EVENT_REMOVED;
    }
    ck_assert_uint_eq(stored_events, 4);
    ck_assert_uint_eq(removed_events, 4);
    rig_close(&r);
}
END_TEST

/* --- bad input ------------------------------------------------------------------------------------ */

START_TEST(another_abi_major_gets_no_table) {
    ck_assert_ptr_null(kvs_get_api(KVS_ABI_MAJOR + 1));
    ck_assert_ptr_null(kvs_get_api(0));
    ck_assert_uint_eq(api->abi_major, KVS_ABI_MAJOR);
    ck_assert_uint_eq(api->struct_size, sizeof(kvs_api));
    ck_assert_str_eq(api->strerror(KVS_ECONFIG), "invalid configuration");
}
END_TEST

START_TEST(a_bad_config_refuses_to_open) {
    rig r;
    const char *cfg =
        config("bad.yaml", "chunk_tokens: 32\ntiers:\n  - name: dram\n    type: dram\n"
                           "    capacity: 1GiB\n    colour: blue\n");
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_ECONFIG);
    ck_assert_ptr_null(r.h);
    ck_assert_ptr_nonnull(strstr(r.error, "bad.yaml:6:5"));
    ck_assert_ptr_nonnull(strstr(r.error, "colour"));
    cfg = config("chunk.yaml",
                 "chunk_tokens: 40\ntiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n");
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, cfg), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, "multiple of the engine block size 16"));
    kvs_model_desc m = model();
    m.is_mla = 1; /* with two heads */
    kvs_open_params p = {.struct_size = sizeof p, .role = KVS_ROLE_BOTH, .model = &m};
    kvs_handle *h = (kvs_handle *)&p;
    char err[256];
    ck_assert_int_eq(api->open(&p, &h, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_null(h);
    ck_assert_ptr_nonnull(strstr(err, "MLA"));
}
END_TEST

START_TEST(impossible_strides_are_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_WORKER, NULL), KVS_OK);
    rig_close(&r);
    kvs_model_desc m = model();
    kvs_open_params p = {.struct_size = sizeof p, .role = KVS_ROLE_WORKER, .model = &m};
    kvs_handle *h;
    ck_assert_int_eq(api->open(&p, &h, NULL, 0), KVS_OK);
    uint8_t *mem = calloc(1, layer_span() * LAYERS);
    kvs_layer_view v[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        v[l] = (kvs_layer_view){.struct_size = sizeof v[l],
                                .n_blocks = BLOCKS,
                                .k_base = mem + l * layer_span(),
                                .v_base = mem + l * layer_span() + layer_span() / 2,
                                .block_stride = BT * TOKEN_BYTES,
                                .token_stride = HEAD_BYTES, /* overlaps heads */
                                .head_stride = HEAD_BYTES};
    ck_assert_int_eq(api->register_kv(h, v, LAYERS), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(h), "layer 0"));
    v[0].token_stride = v[1].token_stride = TOKEN_BYTES;
    v[1].v_base = NULL; /* a non-MLA model needs V */
    ck_assert_int_eq(api->register_kv(h, v, LAYERS), KVS_EINVAL);
    ck_assert_int_eq(api->register_kv(h, v, 1), KVS_EINVAL);
    v[1].v_base = mem + layer_span() + layer_span() / 2;
    ck_assert_int_eq(api->register_kv(h, v, LAYERS), KVS_OK);
    ck_assert_int_eq(api->register_kv(h, v, LAYERS), KVS_ESTATE);
    api->close(h);
    free(mem);
}
END_TEST

START_TEST(token_ids_out_of_range_are_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, NULL), KVS_OK);
    int32_t t[64];
    make_tokens(t, 64, 1);
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

START_TEST(hooks_out_of_order_are_refused) {
    kvs_model_desc m = model();
    kvs_open_params p = {.struct_size = sizeof p, .role = KVS_ROLE_WORKER, .model = &m};
    kvs_handle *w;
    ck_assert_int_eq(api->open(&p, &w, NULL, 0), KVS_OK);
    uint8_t blob[4] = {0x90};
    ck_assert_int_eq(api->bind_meta(w, blob, 1), KVS_ESTATE); /* before register_kv */
    ck_assert_int_eq(api->start_load(w), KVS_ESTATE);
    ck_assert_int_eq(api->save_layer(w, 0), KVS_ESTATE);
    ck_assert_int_eq(api->wait_save(w), KVS_ESTATE);
    kvs_lookup_result res = {.struct_size = sizeof res};
    int32_t t[4] = {1, 2, 3, 4};
    ck_assert_int_eq(api->lookup(w, "a", t, 4, 0, &res), KVS_ESTATE);
    ck_assert_ptr_nonnull(strstr(api->last_error(w), "role worker"));
    api->close(w);

    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, NULL), KVS_OK);
    uint8_t meta[4096];
    uint64_t len;
    ck_assert_int_eq(api->build_meta(r.h, NULL, 0, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->wait_layer_load(r.h, 0), KVS_ESTATE);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_ESTATE);
    ck_assert_int_eq(api->wait_layer_load(r.h, 0), KVS_ESTATE);
    ck_assert_int_eq(api->start_load(r.h), KVS_OK);
    ck_assert_int_eq(api->start_load(r.h), KVS_ESTATE);
    ck_assert_int_eq(api->wait_layer_load(r.h, LAYERS), KVS_EINVAL);
    ck_assert_int_eq(api->save_layer(r.h, 0), KVS_OK);
    ck_assert_int_eq(api->save_layer(r.h, 0), KVS_ESTATE);
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    ck_assert_int_eq(api->wait_save(r.h), KVS_ESTATE);
    rig_close(&r);
    ck_assert_int_eq(api->lookup(NULL, "a", t, 4, 0, &res), KVS_EINVAL);
    api->close(NULL);
}
END_TEST

START_TEST(build_meta_overflow_changes_nothing) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    make_tokens(t, 128, 71);
    blocks_from(a, 8, 0);
    kvs_step_request s = {"a", t, 128, a, 8, 0, 128};
    uint8_t meta[65536];
    uint64_t need = 0, len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, 8, &need), KVS_EOVERFLOW);
    ck_assert_uint_gt(need, 8);
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_uint_eq(len, need); /* the failed call scheduled nothing: the same four saves */
    worker_step(&r, meta, len, a, t, 0, 128);
    kvs_stats st = {.struct_size = sizeof st};
    api->stats(r.h, &st);
    ck_assert_uint_eq(st.chunks_saved, 4);
    rig_close(&r);
}
END_TEST

/* Step metadata carries a checksum of its body (KVS_META_HEADER_BYTES); a test that edits the body
 * seals it again so the edit reaches the decoder. */
static void reseal(uint8_t *blob, uint64_t len) {
    uint64_t sum = XXH3_64bits(blob + KVS_META_HEADER_BYTES, len - KVS_META_HEADER_BYTES);
    for (unsigned i = 0; i < 8; i++) blob[4 + i] = (uint8_t)(sum >> (56 - 8 * i));
}

/* A blob of header + body; returns its length. */
static uint64_t sealed(uint8_t *out, const uint8_t *body, uint64_t n) {
    memcpy(out, KVS_META_MAGIC, 4);
    memcpy(out + KVS_META_HEADER_BYTES, body, n);
    reseal(out, n + KVS_META_HEADER_BYTES);
    return n + KVS_META_HEADER_BYTES;
}

START_TEST(every_flipped_bit_of_step_metadata_is_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    make_tokens(t, 128, 89);
    blocks_from(a, 8, 40); /* block 47 and block 6 differ in one bit of the blob: 0x2f, 0x06 */
    kvs_step_request s = {"a", t, 128, a, 8, 0, 128};
    uint8_t meta[4096], bad[4096];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    for (uint64_t k = 0; k < len; k++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(bad, meta, len);
            bad[k] ^= (uint8_t)(1u << bit);
            kvs_status st = api->bind_meta(r.h, bad, len);
            if (st == KVS_OK)
                ck_abort_msg("a flip of bit %d of byte %llu was bound", bit, (unsigned long long)k);
            ck_assert(st == KVS_ECORRUPT || st == KVS_EINVAL); /* the checksum, or the magic */
        }
    memcpy(bad, meta, len);
    bad[len - 1] ^= 1;
    ck_assert_int_eq(api->bind_meta(r.h, bad, len), KVS_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "checksum mismatch"));
    ck_assert_int_eq(api->bind_meta(r.h, meta, len - 1), KVS_ECORRUPT); /* cut short */
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    rig_close(&r);
}
END_TEST

START_TEST(garbage_metadata_is_refused_without_harm) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    make_tokens(t, 128, 81);
    blocks_from(a, 8, 0);
    kvs_step_request s = {"a", t, 128, a, 8, 0, 128};
    uint8_t meta[65536], bad[65536];
    uint64_t len;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    unsigned seed = 12345;
    int refused = 0;
    for (int i = 0; i < 3000; i++) {
        uint64_t blen = len;
        memcpy(bad, meta, len);
        if (i % 3 == 0) {
            for (uint64_t k = 0; k < len; k++) bad[k] = (uint8_t)rand_r(&seed);
        } else if (i % 3 == 1) {
            blen = (uint64_t)rand_r(&seed) % len; /* truncated */
        } else {
            bad[(uint64_t)rand_r(&seed) % len] ^= (uint8_t)(1u << (rand_r(&seed) % 8));
        }
        if (i % 2 &&
            blen > KVS_META_HEADER_BYTES) { /* half of them sealed again: the decoder sees them */
            memcpy(bad, KVS_META_MAGIC, 4);
            reseal(bad, blen);
        }
        kvs_status st = api->bind_meta(r.h, bad, blen);
        if (st != KVS_OK) {
            refused++;
            ck_assert_str_ne(api->last_error(r.h), "");
            continue;
        }
        /* a flip that still decodes must still be safe to run */
        ck_assert_int_eq(api->start_load(r.h), KVS_OK);
        for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->save_layer(r.h, l), KVS_OK);
        ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    }
    ck_assert_int_gt(refused, 1500);
    /* counts and lengths larger than the blob are refused before anything is allocated for them */
    const uint8_t huge_array[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01},
                  huge_map[] = {0x95, 0xdf, 0x7f, 0xff, 0xff, 0xff},
                  huge_bin[] = {0x95, 0x04, 0x00, 0xc6, 0xff, 0xff, 0xff, 0x00, 0x00};
    ck_assert_int_eq(api->bind_meta(r.h, bad, sealed(bad, huge_array, sizeof huge_array)),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "the root has 4294967295 elements"));
    ck_assert_int_eq(api->bind_meta(r.h, bad, sealed(bad, huge_map, sizeof huge_map)), KVS_EINVAL);
    ck_assert_int_eq(api->bind_meta(r.h, bad, sealed(bad, huge_bin, sizeof huge_bin)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h),
                                 "the fingerprint of 4294967040 bytes is over the limit of 16"));
    /* a request list declaring 2^32-1 requests in a few bytes is refused before calloc sees the count */
    const uint8_t huge_reqs[] = {0x95, 0x04, 0x00, 0xc4, 0x10, 0,    0,    0,   0, 0,
                                 0,    0,    0,    0,    0,    0,    0,    0,   0, 0,
                                 0,    0x20, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90};
    ck_assert_int_eq(api->bind_meta(r.h, bad, sealed(bad, huge_reqs, sizeof huge_reqs)),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(
        strstr(api->last_error(r.h), "the request list declares 4294967295 elements"));
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK); /* still usable */
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    /* The request's layer mask (metadata v3) is the blob's last field, here an empty bin (every layer):
     * one of the right size is taken, one naming a layer past the model's two or of another size is not. */
    ck_assert(len > 2 && meta[len - 2] == 0xc4 && meta[len - 1] == 0x00);
    const uint8_t masks[][4] = {{0xc4, 0x01, 0x01}, {0xc4, 0x01, 0x07}, {0xc4, 0x02, 0x03, 0x00}};
    const uint64_t mask_len[] = {3, 3, 4};
    for (int k = 0; k < 3; k++) {
        memcpy(bad, meta, len - 2);
        memcpy(bad + len - 2, masks[k], mask_len[k]);
        reseal(bad, len - 2 + mask_len[k]);
        kvs_status st = api->bind_meta(r.h, bad, len - 2 + mask_len[k]);
        if (k == 0) {
            ck_assert_int_eq(st, KVS_OK);
            ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
        } else {
            ck_assert_int_eq(st, KVS_EINVAL);
            ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "layer mask"));
        }
    }
    rig_close(&r);
}
END_TEST

/* --- the process boundary ------------------------------------------------------------------------- */

static const char *shared_config(void) {
    static char text[512];
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\ntiers:\n  - name: dram\n    type: dram\n    capacity: 4MiB\n"
             "    options:\n      shm_name: kvs-test-%d\n",
             device_section(), CHUNK, (int)getpid());
    return config("shared.yaml", text);
}

static int write_all(int fd, const void *buf, uint64_t len) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n <= 0) return -1;
        p += n;
        len -= (uint64_t)n;
    }
    return 0;
}

static int read_all(int fd, void *buf, uint64_t len) {
    uint8_t *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n <= 0) return -1;
        p += n;
        len -= (uint64_t)n;
    }
    return 0;
}

/* The worker process: receives (len, blob, compute_from, compute_to, block base) messages and runs
 * each step; replies 1 if the pages after the step hold the expected KV for [0, compute_to). */
static int worker_process(const char *cfg, int in, int out) {
    rig r;
    if (rig_open(&r, KVS_ROLE_WORKER, cfg) != KVS_OK) return 2;
    int32_t t[128];
    make_tokens(t, 128, 91);
    for (;;) {
        uint64_t hdr[4];
        if (read_all(in, hdr, sizeof hdr) != 0) break;
        uint8_t *blob = malloc(hdr[0]);
        if (read_all(in, blob, hdr[0]) != 0) return 3;
        uint32_t blocks[8];
        blocks_from(blocks, 8, (uint32_t)hdr[3]);
        worker_step(&r, blob, hdr[0], blocks, t, hdr[1], hdr[2]);
        free(blob);
        uint8_t ok = (uint8_t)kv_matches(&r, blocks, t, 0, hdr[2]);
        if (write_all(out, &ok, 1) != 0) return 4;
    }
    rig_close(&r);
    return 0;
}

static uint8_t send_step(int to, int from, const void *meta, uint64_t len, uint64_t c0, uint64_t c1,
                         uint64_t base) {
    uint64_t hdr[4] = {len, c0, c1, base};
    ck_assert_int_eq(write_all(to, hdr, sizeof hdr), 0);
    ck_assert_int_eq(write_all(to, meta, len), 0);
    uint8_t ok = 0;
    ck_assert_int_eq(read_all(from, &ok, 1), 0);
    return ok;
}

START_TEST(metadata_crosses_a_process_boundary) {
    const char *cfg = shared_config();
    int down[2], up[2];
    ck_assert_int_eq(pipe(down), 0);
    ck_assert_int_eq(pipe(up), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(worker_process(cfg, down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    rig s;
    ck_assert_int_eq(rig_open(&s, KVS_ROLE_SCHEDULER, cfg), KVS_OK);
    int32_t t[128];
    make_tokens(t, 128, 91);
    uint32_t a[8], b[8];
    blocks_from(a, 8, 0);
    blocks_from(b, 8, 16);
    uint8_t meta[65536];
    uint64_t len;
    /* Step 1: request a computes everything; the worker saves 4 chunks into the shared tier. */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(s.h, "a", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 0);
    kvs_step_request sa = {"a", t, 128, a, 8, 0, 128};
    ck_assert_int_eq(api->build_meta(s.h, &sa, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_uint_eq(send_step(down[1], up[0], meta, len, 0, 128, 0), 1);
    /* Step 2: request b finds them (the scheduler sees the worker's saves) and loads into other pages. */
    ck_assert_int_eq(api->lookup(s.h, "b", t, 128, 0, &res), KVS_OK);
    ck_assert_uint_eq(res.n_hit_tokens, 127);
    ck_assert_int_eq(api->on_alloc(s.h, "b", b, 8, 127), KVS_OK);
    kvs_step_request sb = {"b", t, 128, b, 8, 127, 1};
    ck_assert_int_eq(api->build_meta(s.h, &sb, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_uint_eq(send_step(down[1], up[0], meta, len, 127, 128, 16), 1);
    close(down[1]);
    int status;
    waitpid(pid, &status, 0);
    close(up[0]);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    rig_close(&s);
}
END_TEST

/* --- several threads, one shared tier -------------------------------------------------------------- */

typedef struct thread_arg {
    const char *cfg;
    int index;
    int ok;
} thread_arg;

/* Each thread owns a handle on the same shared DRAM tier; half of them store one shared prefix and
 * all restore it, so saves, lookups, pins and loads interleave across threads. */
static void *thread_main(void *p) {
    thread_arg *a = p;
    rig r;
    if (rig_open(&r, KVS_ROLE_BOTH, a->cfg) != KVS_OK) return NULL;
    int32_t t[128];
    make_tokens(t, 128, 100 + a->index % 2);
    uint32_t own[8], other[8];
    blocks_from(own, 8, 0);
    blocks_from(other, 8, 32);
    int ok = 1;
    for (int round = 0; round < 20 && ok; round++) {
        char id[32];
        snprintf(id, sizeof id, "t%d-%d", a->index, round);
        prefill(&r, id, t, 128, round % 2 ? other : own);
        ok = kv_matches(&r, round % 2 ? other : own, t, 0, 128);
    }
    rig_close(&r);
    a->ok = ok;
    return NULL;
}

START_TEST(threads_sharing_a_tier_restore_exact_kv) {
    const char *cfg = shared_config();
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){cfg, i, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(args[i].ok, "thread %d restored wrong KV", i);
    }
}
END_TEST

/* --- restore plans (ABI 1.3, docs/cacheflow.md) ---------------------------------------------------- */

/* A dram config with `restore: cacheflow` and a profile: per_token_us of recompute per token, mb_s of
 * tier bandwidth (an object is 8 KiB of KV: 32 tokens x 2 layers x 2 x 64 bytes). */
static const char *restore_config(double per_token_us, double mb_s, const char *tier_name) {
    char profile[512];
    snprintf(profile, sizeof profile,
             "compute:\n  fixed_us: 0\n  per_token_us: %g\n  attention_ns_per_token2: 0\n"
             "tiers:\n  - name: %s\n    latency_us: 0\n    bandwidth_mb_s: %g\n",
             per_token_us, tier_name, mb_s);
    config("profile.yaml", profile);
    static char text[768];
    snprintf(
        text, sizeof text,
        "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\nrestore:\n  scheduler: cacheflow\n"
        "  profile: profile.yaml\ntiers:\n  - name: dram\n    type: dram\n    capacity: 1MiB\n",
        device_section(), CHUNK);
    return config("restore.yaml", text);
}

static int stage_first[KVS_MAX_STAGES]; /* the first KV layer of each stage, for stage plans */

/* Store 256 tokens (8 chunks) under request "a", then restore them for "b" into other pages as an
 * engine that follows the plan: it computes the front the plan leaves to it, the connector loads the
 * rest. Returns the plan; *loaded gets the chunks the connector loaded. */
/* The scheduler half of a planned restore: 256 tokens (8 chunks) stored under request "a", then
 * request "b" with the same prompt looked up, allocated other pages and its step's metadata built. */
typedef struct plan_step {
    int32_t tokens[257];
    uint32_t a[17], b[17];
    kvs_lookup_result res;
    kvs_step_request st;
    uint8_t meta[65536];
    uint64_t len;
} plan_step;

static void store_and_plan(rig *r, plan_step *ps) {
    make_tokens(ps->tokens, 257, 9);
    blocks_from(ps->a, 17, 0);
    blocks_from(ps->b, 17, 20);
    prefill(r, "a", ps->tokens, 257, ps->a);
    ps->res = (kvs_lookup_result){.struct_size = sizeof ps->res};
    ck_assert_int_eq(api->lookup(r->h, "b", ps->tokens, 257, 0, &ps->res), KVS_OK);
    ck_assert_int_eq(api->on_alloc(r->h, "b", ps->b, 17, ps->res.n_hit_tokens), KVS_OK);
    ps->st = (kvs_step_request){
        "b", ps->tokens, 257, ps->b, 17, ps->res.n_hit_tokens, 257 - ps->res.n_hit_tokens};
    ck_assert_int_eq(api->build_meta(r->h, &ps->st, 1, ps->meta, sizeof ps->meta, &ps->len),
                     KVS_OK);
}

static kvs_restore_plan restore_with_plan(rig *r, uint32_t caps, uint64_t *loaded,
                                          uint64_t *bytes) {
    ck_assert_int_eq(api->set_plan_caps(r->h, caps), KVS_OK);
    static plan_step ps;
    store_and_plan(r, &ps);
    kvs_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    ck_assert_int_eq(api->stats(r->h, &s0), KVS_OK); /* nothing loads before the worker step */
    kvs_restore_plan plan = {.struct_size = sizeof plan};
    kvs_status st = api->plan(r->h, "b", &plan);
    if (ps.res.n_hit_tokens == 0) {
        ck_assert_int_eq(st, KVS_ENOTFOUND);
        plan.mode = KVS_PLAN_RECOMPUTE;
        plan.end_token = 0;
    } else {
        ck_assert_int_eq(st, KVS_OK);
        ck_assert_uint_eq(plan.first_token, 0);
        ck_assert_uint_eq(plan.end_token, ps.res.n_hit_tokens);
        ck_assert_uint_le(plan.recompute_tokens, plan.end_token - plan.first_token);
        uint64_t from = plan.first_token, to = plan.first_token + plan.recompute_tokens;
        if (plan.mode ==
            KVS_PLAN_STAGE) /* each stage its lowest layers (the rig's stages: stage_first) */
            for (uint32_t s = 0; s < plan.n_stages; s++)
                write_kv_layers(r, ps.b, ps.tokens, from, to, stage_first[s],
                                stage_first[s] + (int)plan.stage_recompute_layers[s]);
        else
            write_kv_layers(r, ps.b, ps.tokens, from, to, 0,
                            plan.mode == KVS_PLAN_LAYER ? (int)plan.recompute_layers : rig_layers);
    }
    worker_step(r, ps.meta, ps.len, ps.b, ps.tokens, ps.res.n_hit_tokens, 257);
    ck_assert_msg(kv_matches(r, ps.b, ps.tokens, 0, 257),
                  "restored KV differs (mode %u, recompute %llu)", plan.mode,
                  (unsigned long long)plan.recompute_tokens);
    ck_assert_int_eq(api->stats(r->h, &s1), KVS_OK);
    *loaded = s1.chunks_loaded - s0.chunks_loaded;
    *bytes = s1.bytes_loaded - s0.bytes_loaded;
    /* The plan belongs to the step that loads: the next one has none. */
    ck_assert_int_eq(api->build_meta(r->h, &ps.st, 1, ps.meta, sizeof ps.meta, &ps.len), KVS_OK);
    ck_assert_int_eq(api->plan(r->h, "b", &plan), KVS_ENOTFOUND);
    worker_step(r, ps.meta, ps.len, ps.b, ps.tokens, 257, 257);
    int keep;
    ck_assert_int_eq(api->request_finished(r->h, "b", &keep), KVS_OK);
    return plan;
}

START_TEST(without_a_planner_every_plan_loads_everything) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    uint64_t loaded = 0, bytes = 0;
    kvs_restore_plan p = restore_with_plan(&r, KVS_PLAN_CAP_TOKEN, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LOAD);
    ck_assert_uint_eq(p.recompute_tokens, 0);
    ck_assert_uint_eq(p.end_token, 256);
    ck_assert_uint_eq(loaded, 8);
    rig_close(&r);
}
END_TEST

START_TEST(token_plans_split_the_range_between_compute_and_the_tier) {
    rig r;
    /* one chunk: 320 us of recompute, 8192 B / 25.6 MB/s = 320 us of load: they meet in the middle */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 25.6, "dram")), KVS_OK);
    uint64_t loaded = 0, bytes = 0;
    kvs_restore_plan p = restore_with_plan(&r, KVS_PLAN_CAP_TOKEN, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_TOKEN);
    ck_assert_uint_eq(p.recompute_tokens % CHUNK, 0);
    ck_assert_uint_ge(p.recompute_tokens, 3 * CHUNK);
    ck_assert_uint_le(p.recompute_tokens, 5 * CHUNK);
    ck_assert_uint_eq(loaded, 8 - p.recompute_tokens / CHUNK);
    ck_assert(p.predicted_ms > 0.9 && p.predicted_ms < 1.7);
    rig_close(&r);
}
END_TEST

START_TEST(plans_follow_the_cost_model_to_either_end) {
    rig r;
    uint64_t loaded = 0, bytes = 0;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(0.001, 0.01, "dram")), KVS_OK);
    kvs_restore_plan p =
        restore_with_plan(&r, KVS_PLAN_CAP_TOKEN, &loaded, &bytes); /* a slow tier, cheap compute */
    ck_assert_uint_eq(p.mode, KVS_PLAN_RECOMPUTE);
    ck_assert_uint_eq(p.recompute_tokens, 256);
    ck_assert_uint_eq(loaded, 0);
    rig_close(&r);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(1000, 100000, "dram")), KVS_OK);
    p = restore_with_plan(&r, KVS_PLAN_CAP_TOKEN, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LOAD);
    ck_assert_uint_eq(loaded, 8);
    rig_close(&r);
}
END_TEST

/* An engine with no plan caps gets prefix plans: lookup offers only the prefix worth loading (for one
 * request with uniform chunk costs that is all or nothing; batches are planned in test_cacheflow). */
START_TEST(stock_engines_get_prefix_plans_through_lookup) {
    rig r;
    uint64_t loaded = 0, bytes = 0;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(0.001, 0.01, "dram")), KVS_OK);
    restore_with_plan(&r, 0, &loaded, &bytes);
    ck_assert_uint_eq(loaded, 0); /* lookup offered nothing: recomputing is faster */
    rig_close(&r);
    /* loading a chunk (160 us) beats recomputing it (320 us): the whole prefix is offered */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 51.2, "dram")), KVS_OK);
    kvs_restore_plan p = restore_with_plan(&r, 0, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LOAD);
    ck_assert_uint_eq(p.end_token, 256);
    ck_assert_uint_eq(loaded, 8);
    rig_close(&r);
}
END_TEST

/* Layer plans: the engine computes the lower layers of the whole range, the connector reads and
 * copies only the upper layers of each chunk (get_range on the dram tier). */
START_TEST(layer_plans_load_only_the_upper_layers) {
    rig r;
    /* one layer of the 256-token range: 2560 us / 2 of recompute, 32 KiB / 25.6 MB/s = 1280 us of load */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 25.6, "dram")), KVS_OK);
    uint64_t loaded = 0, bytes = 0;
    kvs_restore_plan p = restore_with_plan(&r, KVS_PLAN_CAP_LAYER, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LAYER);
    ck_assert_uint_eq(p.recompute_layers, 1);
    ck_assert_uint_eq(p.recompute_tokens, 256);
    ck_assert_uint_eq(loaded, 8);
    ck_assert_uint_eq(bytes, 256ull * 1 * 2 * TOKEN_BYTES); /* one layer of K and V */
    rig_close(&r);
    /* both caps: each request gets the faster mode; a slow tier still means recompute */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(0.001, 0.01, "dram")), KVS_OK);
    p = restore_with_plan(&r, KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_RECOMPUTE);
    ck_assert_uint_eq(loaded, 0);
    rig_close(&r);
}
END_TEST

START_TEST(plan_caps_and_profiles_are_checked) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(10, 25.6, "dram")), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, 0x80), KVS_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "unknown capability"));
    int32_t tokens[64];
    make_tokens(tokens, 64, 4);
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "x", tokens, 64, 0, &res), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_TOKEN), KVS_ESTATE);
    kvs_restore_plan p = {.struct_size = sizeof p};
    ck_assert_int_eq(api->plan(r.h, "nobody", &p), KVS_ENOTFOUND);
    p.struct_size = 8;
    ck_assert_int_eq(api->plan(r.h, "x", &p), KVS_EINVAL);
    rig_close(&r);
    /* A profile without the chain's tier refuses to open, naming the tier and the profile. */
    kvs_model_desc m = model();
    kvs_open_params op = {.struct_size = sizeof op,
                          .role = KVS_ROLE_BOTH,
                          .config_path = restore_config(10, 25.6, "ssd"),
                          .model = &m};
    kvs_handle *h = NULL;
    char err[512];
    ck_assert_int_eq(api->open(&op, &h, err, sizeof err), KVS_ECONFIG);
    ck_assert_ptr_null(h);
    ck_assert_msg(strstr(err, "profile.yaml") && strstr(err, "tier 'dram'"), "error: %s", err);
}
END_TEST

/* Stage plans (ABI 1.4): 4 KV layers in two stages ({0, 1} and {2, 3}) and one registered layer of
 * boundary activations (layer 4, the input of stage 1). */
static void stage_rig(rig *r, const char *cfg) {
    rig_layers = 5;
    ck_assert_int_eq(rig_open(r, KVS_ROLE_BOTH, cfg), KVS_OK);
    kvs_stage_desc d = {.struct_size = sizeof d,
                        .n_stages = 2,
                        .n_kv_layers = 4,
                        .boundary_layers = 1,
                        .first_layer = {0, 2}};
    stage_first[0] = 0;
    stage_first[1] = 2;
    ck_assert_int_eq(api->set_stages(r->h, &d), KVS_OK);
}

START_TEST(stage_plans_restore_each_stage_from_its_boundary) {
    rig r;
    /* A layer of the 256-token range: 640 us / 2 = 320 us of recompute, 32 KiB / 25.6 MB/s = 1280 us of
     * load (the boundary costs the same). Loading all 4 layers: 5120 us; stage 0 recomputing its two
     * layers while 2 load: 2560 us; reading the boundary (1280 us) and then recomputing both stages'
     * layers at once: 1280 + 640 = 1920 us, the optimum, which loads nothing but the boundary. */
    stage_rig(&r, restore_config(5, 25.6, "dram"));
    uint64_t loaded = 0, bytes = 0;
    kvs_restore_plan p = restore_with_plan(&r, KVS_PLAN_CAP_STAGE, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_STAGE);
    ck_assert_uint_eq(p.n_stages, 2);
    ck_assert_uint_eq(p.stage_recompute_layers[0], 2);
    ck_assert_uint_eq(p.stage_recompute_layers[1], 2);
    ck_assert_uint_eq(p.recompute_tokens, 256);
    ck_assert(p.predicted_ms > 1.9 && p.predicted_ms < 1.95);
    ck_assert_uint_eq(loaded, 8);
    ck_assert_uint_eq(bytes, 256ull * 2 * TOKEN_BYTES); /* the boundary layer only */
    rig_close(&r);
    /* Layer plans of a staged engine: the mask spans every registered layer, boundaries loaded. */
    stage_rig(&r, restore_config(10, 25.6, "dram"));
    p = restore_with_plan(&r, KVS_PLAN_CAP_LAYER, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LAYER);
    ck_assert_uint_ge(p.recompute_layers, 1);
    ck_assert_uint_le(p.recompute_layers, 3);
    ck_assert_uint_eq(bytes, 256ull * (5 - p.recompute_layers) * 2 * TOKEN_BYTES);
    rig_close(&r);
    /* A fast tier: stage plans still load everything when that is soonest, boundaries included. */
    stage_rig(&r, restore_config(1000, 100000, "dram"));
    p = restore_with_plan(&r, KVS_PLAN_CAP_STAGE | KVS_PLAN_CAP_TOKEN, &loaded, &bytes);
    ck_assert_uint_eq(p.mode, KVS_PLAN_LOAD);
    ck_assert_uint_eq(bytes, 256ull * 5 * 2 * TOKEN_BYTES);
    rig_close(&r);
}
END_TEST

START_TEST(stage_descriptions_and_old_plan_structs_are_checked) {
    rig r;
    rig_layers = 5;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, restore_config(5, 25.6, "dram")), KVS_OK);
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_STAGE),
                     KVS_ESTATE); /* stages not described */
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "set_stages"));
    kvs_stage_desc d = {.struct_size = sizeof d,
                        .n_stages = 2,
                        .n_kv_layers = 4,
                        .boundary_layers = 2,
                        .first_layer = {0, 2}};
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_EINVAL); /* 4 + 2 layers, the model has 5 */
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "the model has 5"));
    d.boundary_layers = 1;
    d.first_layer[1] = 0;
    ck_assert_int_eq(api->set_stages(r.h, &d),
                     KVS_EINVAL); /* stages must start at increasing layers */
    d.first_layer[1] = 4;
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_EINVAL); /* stage 1 would own no layer */
    d.first_layer[1] = 3;
    d.struct_size = 8;
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_EINVAL);
    d.struct_size = sizeof d;
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_OK);
    stage_first[0] = 0;
    stage_first[1] = 3;
    /* An engine built against 1.3 passes the smaller plan struct: a stage plan does not fit in it. */
    ck_assert_int_eq(api->set_plan_caps(r.h, KVS_PLAN_CAP_STAGE), KVS_OK);
    ck_assert_int_eq(api->set_stages(r.h, &d), KVS_ESTATE); /* after set_plan_caps */
    static plan_step ps;
    store_and_plan(&r, &ps);
    kvs_restore_plan p = {.struct_size = KVS_RESTORE_PLAN_SIZE_1_3};
    ck_assert_int_eq(api->plan(r.h, "b", &p), KVS_ENOTSUP);
    p.struct_size = sizeof p;
    ck_assert_int_eq(api->plan(r.h, "b", &p), KVS_OK);
    ck_assert_uint_eq(p.mode, KVS_PLAN_STAGE);
    rig_close(&r);
}
END_TEST

/* --- the engine's contract, from outside (leases, unequal layers, duplicate saves) ---------------- */

/* Leases of LEASE_MS that run out only when a test moves their clock past them (stall_ms). */
#define LEASE_MS 10000u

/* A rig with LEASE_MS leases and the 128 tokens of seed `seed` stored from blocks 0..7; b gets blocks
 * 20..27, where a second request restores them. */
static void lease_rig(rig *r, int32_t *t, uint32_t *b, int seed) {
    uint32_t a[8];
    ck_assert_int_eq(rig_open(r, KVS_ROLE_BOTH, dram_config(64, LEASE_MS)), KVS_OK);
    make_tokens(t, 128, seed);
    blocks_from(a, 8, 0);
    blocks_from(b, 8, 20);
    prefill(r, "one", t, 128, a);
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
    worker_step(r, meta, len, b, t, 127, 128);
    ck_assert_int_eq(api->load_error_blocks(r->h, errs, 16, &n), KVS_OK);
    return n;
}

START_TEST(a_lease_expiring_after_on_alloc_still_loads_what_it_accepted) {
    rig r;
    int32_t t[128];
    uint32_t b[8], errs[16];
    lease_rig(&r, t, b, 81);
    offer_and_alloc(&r, "two", t, b, LEASE_MS + 30); /* the lease runs out before build_meta */
    ck_assert_uint_eq(load_accepted(&r, "two", t, b, errs), 0);
    ck_assert(kv_matches(&r, b, t, 0, 128)); /* loaded, not silently left stale */
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
    kvs_sched_expire_leases(r.h); /* any later hook notices the expiry; the chunk may then go */
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    ck_assert_int_eq(kvs_tiers_ops(r.h->tiers, 0)->remove(kvs_tiers_state(r.h->tiers, 0), &keys[1]),
                     KVS_OK);
    ck_assert_uint_eq(load_accepted(&r, "two", t, b, errs), 2); /* chunk 1 = blocks b[2], b[3] */
    ck_assert_uint_eq(errs[0] < errs[1] ? errs[0] : errs[1], b[2]);
    ck_assert_uint_eq(errs[0] < errs[1] ? errs[1] : errs[0], b[3]);
    ck_assert(kv_matches(&r, b, t, 0, 32));
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
    ck_assert(kv_matches(&r, b, t, 0, 128));
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.leases_expired, 1); /* counted once */
    rig_close(&r);
}
END_TEST

START_TEST(a_lookup_that_offers_nothing_leaves_other_leases_counted) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    make_tokens(t, 128, 84);
    blocks_from(a, 8, 0);
    prefill(&r, "one", t, 128, a);
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

START_TEST(block_ids_are_checked_against_the_layer_with_the_fewest_pages) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    api->close(r.h);
    kvs_model_desc m = model();
    kvs_open_params p = {.struct_size = sizeof p,
                         .role = KVS_ROLE_BOTH,
                         .config_path = dram_config(64, 30000),
                         .model = &m};
    ck_assert_int_eq(api->open(&p, &r.h, r.error, sizeof r.error), KVS_OK);
    r.views[1].n_blocks = 8; /* layer 1 holds pages 0..7 only */
    ck_assert_int_eq(api->register_kv(r.h, r.views, LAYERS), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    make_tokens(t, 128, 85);
    blocks_from(a, 8, 0);
    blocks_from(b, 8, 20);         /* past layer 1's pages */
    prefill(&r, "one", t, 128, a); /* fits every layer */
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r.h, "two", t, 128, 0, &res), KVS_OK);
    ck_assert_int_eq(api->on_alloc(r.h, "two", b, 8, res.n_hit_tokens), KVS_OK);
    kvs_step_request s = {"two", t, 128, b, 8, res.n_hit_tokens, 128 - res.n_hit_tokens};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, &s, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "layer 1"));
    /* A save into those pages is refused the same way, before any gather reads past layer 1. */
    kvs_step_request fresh = {"three", t, 128, b, 8, 0, 128};
    int32_t u[128];
    make_tokens(u, 128, 86);
    fresh.tokens = u;
    ck_assert_int_eq(api->build_meta(r.h, &fresh, 1, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "save: layer 1"));
    rig_close(&r);
}
END_TEST

START_TEST(two_requests_with_one_prefix_in_one_step_save_each_chunk_once) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t t[160];
    uint32_t a[10], b[10];
    make_tokens(t, 160, 87);
    blocks_from(a, 10, 0);
    blocks_from(b, 10, 20);
    kvs_step_request s[2] = {{"x", t, 160, a, 10, 0, 160}, {"y", t, 160, b, 10, 0, 160}};
    uint8_t meta[65536];
    uint64_t len = 0;
    ck_assert_int_eq(api->build_meta(r.h, s, 2, meta, sizeof meta, &len), KVS_OK);
    kvs_meta *m = NULL;
    char err[256];
    ck_assert_int_eq(kvs_meta_decode(meta, len, &m, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(m->n_reqs, 2);
    ck_assert_uint_eq(m->reqs[0].n_saves + m->reqs[1].n_saves, 5); /* 5 chunks, one save each */
    kvs_meta_free(m);
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK);
    ck_assert_int_eq(api->start_load(r.h), KVS_OK);
    write_kv(&r, a, t, 0, 160);
    write_kv(&r, b, t, 0, 160);
    for (uint32_t l = 0; l < LAYERS; l++) ck_assert_int_eq(api->save_layer(r.h, l), KVS_OK);
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    kvs_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(api->stats(r.h, &st), KVS_OK);
    ck_assert_uint_eq(st.chunks_saved, 5);
    ck_assert_uint_eq(st.saves_skipped, 0);
    /* The next step does not save them again for either request. */
    kvs_step_request next[2] = {{"x", t, 160, a, 10, 160, 0}, {"y", t, 160, b, 10, 160, 0}};
    ck_assert_int_eq(api->build_meta(r.h, next, 2, meta, sizeof meta, &len), KVS_OK);
    ck_assert_int_eq(kvs_meta_decode(meta, len, &m, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(m->reqs[0].n_saves + m->reqs[1].n_saves, 0);
    kvs_meta_free(m);
    rig_close(&r);
}
END_TEST

START_TEST(finishing_a_request_twice_says_it_already_finished) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    make_tokens(t, 128, 88);
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

static Suite *connector_suite(void) {
    Suite *s = suite_create("connector");
    TCase *tc = tcase_create("connector");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, saves_a_full_device_drops_after_accepting_them_count_as_skipped);
    tcase_add_test(tc, restore_into_other_pages_is_byte_identical);
    tcase_add_test(tc, lookup_stops_at_first_missing_chunk);
    tcase_add_test(tc, partial_local_hit_loads_only_the_rest);
    tcase_add_test(tc, keys_are_deterministic_across_processes);
    tcase_add_test(tc, keys_chain_on_the_prefix_and_the_model);
    tcase_add_test(tc, eviction_under_pressure_keeps_the_newest);
    tcase_add_test(tc, a_lease_pins_until_it_expires);
    tcase_add_test(tc, releasing_twice_is_harmless);
    tcase_add_test(tc, saves_without_staging_memory_are_skipped_and_counted);
    tcase_add_test(tc, a_corrupt_object_becomes_error_blocks_and_is_dropped);
    tcase_add_test(tc, chunks_computed_after_a_failed_load_are_not_stored);
    tcase_add_test(tc, a_plugin_backend_round_trips_through_staging);
    tcase_add_test(tc, a_plugin_of_another_major_is_refused);
    tcase_add_test(tc, a_shared_object_that_is_not_a_backend_is_refused);
    tcase_add_test(tc, another_abi_major_gets_no_table);
    tcase_add_test(tc, a_bad_config_refuses_to_open);
    tcase_add_test(tc, impossible_strides_are_refused);
    tcase_add_test(tc, token_ids_out_of_range_are_refused);
    tcase_add_test(tc, unknown_requests_are_refused);
    tcase_add_test(tc, hooks_out_of_order_are_refused);
    tcase_add_test(tc, build_meta_overflow_changes_nothing);
    tcase_add_test(tc, garbage_metadata_is_refused_without_harm);
    tcase_add_test(tc, metadata_crosses_a_process_boundary);
    tcase_add_test(tc, threads_sharing_a_tier_restore_exact_kv);
    tcase_add_test(tc, without_a_planner_every_plan_loads_everything);
    tcase_add_test(tc, token_plans_split_the_range_between_compute_and_the_tier);
    tcase_add_test(tc, plans_follow_the_cost_model_to_either_end);
    tcase_add_test(tc, stock_engines_get_prefix_plans_through_lookup);
    tcase_add_test(tc, layer_plans_load_only_the_upper_layers);
    tcase_add_test(tc, plan_caps_and_profiles_are_checked);
    tcase_add_test(tc, stage_plans_restore_each_stage_from_its_boundary);
    tcase_add_test(tc, stage_descriptions_and_old_plan_structs_are_checked);
    suite_add_tcase(s, tc);
    TCase *contract = tcase_create("contract");
    tcase_add_checked_fixture(contract, setup, teardown);
    tcase_set_timeout(contract, 60);
    tcase_add_test(contract, a_lease_expiring_after_on_alloc_still_loads_what_it_accepted);
    tcase_add_test(contract, a_chunk_evicted_after_its_lease_expired_comes_back_as_error_blocks);
    tcase_add_test(contract, on_alloc_after_the_lease_expired_counts_the_expiry_and_pins_again);
    tcase_add_test(contract, a_lookup_that_offers_nothing_leaves_other_leases_counted);
    tcase_add_test(contract, block_ids_are_checked_against_the_layer_with_the_fewest_pages);
    tcase_add_test(contract, two_requests_with_one_prefix_in_one_step_save_each_chunk_once);
    tcase_add_test(contract, finishing_a_request_twice_says_it_already_finished);
    tcase_add_test(contract, every_flipped_bit_of_step_metadata_is_refused);
    suite_add_tcase(s, contract);
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--print-keys") == 0) {
        print_keys();
        return 0;
    }
    SRunner *sr = srunner_create(connector_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
