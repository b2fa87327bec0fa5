/* test_integrity.c - `integrity: keyed` (connector/integrity.c, connector/object_mac.c): objects a
 * writer without the tenant's integrity key changed and re-sealed with valid checksums are misses,
 * counted and dropped, never loaded; the same attack against a checksum tier loads wrong KV, which
 * is what the keyed tier is for. Also the object tags themselves and the configurations refused. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "abi/kvstrata.h"
#include "common/xxh3.h"
#include "connector/config.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/object_mac.h"
#include "tests/support/connector_rig.h"
#include "tests/support/test_support.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

/* A key file of 32 bytes made from seed, mode 0600 (or `mode`); its path in a static buffer. */
static const char *key_file(const char *name, int seed, mode_t mode) {
    char text[40];
    for (int i = 0; i < 32; i++) text[i] = (char)('a' + (seed * 7 + i) % 26);
    text[32] = '\0';
    static char path[1024];
    ck_assert_int_eq(kvs_test_write_file(rig_tmpdir, name, text, path, sizeof path), 0);
    ck_assert_int_eq(chmod(path, mode), 0);
    return path;
}

/* A dram tier (shared memory when shm: what another process on the host can write), keyed under
 * the key file `key` unless key is NULL. */
static const char *dram_config(const char *key, int shm) {
    static char text[1024];
    char shm_line[128] = "", keyed[1200] = "";
    if (shm)
        snprintf(shm_line, sizeof shm_line, "    options:\n      shm_name: kvs-integrity-%d\n",
                 (int)getpid());
    if (key)
        snprintf(keyed, sizeof keyed, "    integrity: keyed\n    integrity_key_file: %s\n", key);
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n  - name: dram\n"
             "    type: dram\n    capacity: 768KiB\n%s%s",
             rig_device_section(), CHUNK, keyed, shm_line);
    return rig_config("integrity.yaml", text);
}

/* The stored object of chunk `chunk` of tokens t, writable as its tier's memory is. */
static uint8_t *stored_object(rig *r, const int32_t *t, uint32_t chunk, uint64_t *len) {
    kvs_key keys[4];
    kvs_keys_chain(&r->h->fingerprint, t, 4, CHUNK, keys);
    const void *obj = NULL;
    const kvs_backend_ops *ops = kvs_tiers_ops(r->h->tiers, 0);
    ck_assert_int_eq(ops->get_ref(kvs_tiers_state(r->h->tiers, 0), &keys[chunk], &obj, len),
                     KVS_OK);
    return (uint8_t *)(uintptr_t)obj;
}

/* What a writer without the key can do: change KV bytes of the last layer and recompute every
 * checksum the object carries (its layer's XXH3 and the header's). */
static void forge(uint8_t *obj) {
    kvs_object_header *h = (kvs_object_header *)obj;
    uint32_t last = h->n_layers - 1;
    uint8_t *layer = kvs_object_layer(obj, last);
    for (uint32_t i = 0; i < 64; i++) layer[i] ^= 0x5a;
    kvs_object_layer_hashes(obj)[last] = kvs_xxh3_64(layer, h->layer_bytes);
    kvs_object_seal(obj);
}

/* 128 tokens from seed saved through request "one" (4 chunks); b gets the blocks a restore
 * loads them into. */
static void saved_prompt(rig *r, int seed, int32_t t[128], uint32_t b[8]) {
    uint32_t a[8];
    rig_make_tokens(t, 128, seed);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 40);
    ck_assert_uint_eq(rig_prefill(r, "one", t, 128, a), 0);
}

typedef struct restored {
    uint64_t hit, n_errors;
    uint32_t errors[16];
    kvs_stats stats;
} restored;

/* Request `id` over t restored into blocks b (the engine computes the last token). */
static restored restore(rig *r, const char *id, const int32_t *t, const uint32_t *b) {
    restored out = {.stats = {.struct_size = sizeof out.stats}};
    kvs_lookup_result res = {.struct_size = sizeof res};
    ck_assert_int_eq(api->lookup(r->h, id, t, 128, 0, &res), KVS_OK);
    out.hit = res.n_hit_tokens;
    ck_assert_int_eq(api->on_alloc(r->h, id, b, 8, out.hit), KVS_OK);
    kvs_step_request s = {id, t, 128, b, 8, 127, 1};
    uint8_t meta[65536];
    uint64_t mlen;
    ck_assert_int_eq(api->build_meta(r->h, &s, 1, meta, sizeof meta, &mlen), KVS_OK);
    rig_worker_step(r, meta, mlen, b, t, 127, 128);
    ck_assert_int_eq(api->load_error_blocks(r->h, out.errors, 16, &out.n_errors), KVS_OK);
    ck_assert_int_eq(api->stats(r->h, &out.stats), KVS_OK);
    return out;
}

/* The attack a checksum tier cannot see: the forged chunk loads as good KV. This is what a tier
 * shared across a trust boundary must not be left as. */
START_TEST(a_checksum_tier_loads_a_resealed_object) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(NULL, 1)), KVS_OK);
    ck_assert_ptr_null(r.h->mac);
    int32_t t[128];
    uint32_t b[8];
    saved_prompt(&r, 61, t, b);
    uint64_t len;
    uint8_t *obj = stored_object(&r, t, 1, &len);
    ck_assert_uint_eq(((kvs_object_header *)obj)->version, KVS_OBJECT_VERSION);
    forge(obj);
    restored got = restore(&r, "two", t, b);
    ck_assert_uint_eq(got.hit, 127);
    ck_assert_uint_eq(got.n_errors, 0);
    ck_assert_uint_eq(got.stats.load_errors, 0);
    ck_assert(!rig_kv_matches(&r, b, t, 32, 64)); /* wrong KV, and nothing noticed */
    rig_close(&r);
}
END_TEST

START_TEST(a_keyed_tier_turns_a_resealed_object_into_a_counted_miss) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(key_file("t.key", 1, 0600), 1)),
                     KVS_OK);
    ck_assert_ptr_nonnull(r.h->mac);
    int32_t t[128];
    uint32_t b[8];
    saved_prompt(&r, 61, t, b);
    uint64_t len;
    uint8_t *obj = stored_object(&r, t, 1, &len);
    ck_assert_uint_eq(((kvs_object_header *)obj)->version, KVS_OBJECT_VERSION_KEYED);
    forge(obj);
    restored got = restore(&r, "two", t, b);
    ck_assert_uint_eq(got.hit, 127);
    ck_assert_uint_eq(got.n_errors, 2); /* chunk 1 = tokens 32..63 = blocks b[2], b[3] */
    ck_assert(got.errors[0] + got.errors[1] == b[2] + b[3]);
    ck_assert_uint_eq(got.stats.integrity_rejects, 1);
    ck_assert_uint_eq(got.stats.load_errors, 1);
    ck_assert(!rig_stored(&r, t, 1)); /* dropped: a miss from now on */
    ck_assert(rig_stored(&r, t, 2));
    ck_assert(rig_kv_matches(&r, b, t, 0, 32));
    ck_assert(rig_kv_matches(&r, b, t, 64, 127));
    rig_close(&r);
}
END_TEST

/* Taking the tags away (an unkeyed object, checksums recomputed) or serving a valid object of this
 * tenant under another chunk's key is refused too: the header tag binds key and geometry. A header
 * whose sizes are not the model's is refused before any tag is computed over them. */
START_TEST(a_keyed_tier_refuses_stripped_and_moved_objects) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(key_file("t.key", 2, 0400), 0)),
                     KVS_OK);
    int32_t t[128];
    uint32_t b[8];
    saved_prompt(&r, 62, t, b);
    uint64_t len, len2;
    uint8_t *one = stored_object(&r, t, 1, &len);
    ((kvs_object_header *)one)->version = KVS_OBJECT_VERSION; /* strip */
    kvs_object_seal(one);
    uint8_t *two = stored_object(&r, t, 2, &len2);
    kvs_key key3 = ((kvs_object_header *)stored_object(&r, t, 3, &len2))->key;
    memcpy(stored_object(&r, t, 3, &len2), two, len2); /* chunk 2's object as chunk 3's */
    ((kvs_object_header *)stored_object(&r, t, 3, &len2))->key = key3;
    kvs_object_seal(stored_object(&r, t, 3, &len2));
    /* and sizes no reader may trust before they are checked: a header promising 2^20 layers */
    ((kvs_object_header *)stored_object(&r, t, 0, &len2))->n_layers = 1u << 20;
    restored got = restore(&r, "two", t, b);
    ck_assert_uint_eq(got.n_errors, 6);
    ck_assert_uint_eq(got.stats.integrity_rejects, 3);
    ck_assert(rig_kv_matches(&r, b, t, 64, 96));
    rig_close(&r);
}
END_TEST

/* A keyed tier's intact objects load byte for byte, read in place from a tier other processes may
 * write (its tags computed over the bytes the copies move), and the tags the saves' copies wrote
 * are those a whole check computes over the stored bytes. */
START_TEST(a_keyed_tier_loads_its_own_objects) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(key_file("t.key", 3, 0600), 1)),
                     KVS_OK);
    int32_t t[128];
    uint32_t b[8];
    saved_prompt(&r, 63, t, b);
    /* the tags the saves' copies computed are the ones a whole check computes over the stored bytes */
    for (uint32_t c = 0; c < 4; c++) {
        uint64_t len;
        const uint8_t *obj = stored_object(&r, t, c, &len);
        char why[256] = "";
        ck_assert_msg(kvs_object_check_keyed_header(r.h->mac, obj, len, why, sizeof why) == KVS_OK,
                      "%s", why);
        for (uint32_t l = 0; l < ((const kvs_object_header *)obj)->n_layers; l++)
            ck_assert_msg(kvs_object_check_keyed_layer(r.h->mac, obj, l, why, sizeof why) == KVS_OK,
                          "chunk %u: %s", c, why);
        ck_assert_uint_eq(kvs_object_layer_hashes((void *)(uintptr_t)obj)[1],
                          kvs_xxh3_64(kvs_object_layer((void *)(uintptr_t)obj, 1),
                                      ((const kvs_object_header *)obj)->layer_bytes));
    }
    restored got = restore(&r, "two", t, b);
    ck_assert_uint_eq(got.n_errors, 0);
    ck_assert_uint_eq(got.stats.chunks_loaded, 4);
    ck_assert_uint_eq(got.stats.integrity_rejects, 0);
    ck_assert(rig_kv_matches(&r, b, t, 0, 127));
    rig_close(&r);
}
END_TEST

/* A layer's bytes changed and nothing else (its checksum left stale): its tag fails. Loop 0: the
 * host device computes each layer's tag as its copy moves it into the pages (the object read in
 * place). Loop 1: a device that does not (deferred copies, as a GPU's): the object is read into a
 * slab and its tags checked on the host device's threads before any byte is copied. Either way the
 * chunk is an error and the others load. */
START_TEST(a_changed_layer_fails_its_tag_as_it_is_copied_or_before) {
    char text[2048];
    snprintf(text, sizeof text,
             "device:\n  host_threads: 3\n  host_copies: %s\nchunk_tokens: %d\npool:\n"
             "  staging_bytes: 1MiB\ntiers:\n  - name: dram\n    type: dram\n    capacity: 768KiB\n"
             "    integrity: keyed\n    integrity_key_file: %s\n",
             _i ? "deferred" : "immediate", CHUNK, key_file("t.key", 5, 0600));
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_config("threads.yaml", text)), KVS_OK);
    ck_assert_ptr_nonnull(r.h->mac_workers);
    ck_assert_int_eq(r.h->device.dev_info.hashes_inline, !_i);
    int32_t t[128];
    uint32_t b[8];
    saved_prompt(&r, 64, t, b);
    uint64_t len;
    uint8_t *obj = stored_object(&r, t, 2, &len);
    kvs_object_layer(obj, 0)[7] ^= 0x10;
    restored got = restore(&r, "two", t, b);
    ck_assert_uint_eq(got.n_errors, 2);
    ck_assert_uint_eq(got.stats.integrity_rejects, 1);
    ck_assert(rig_kv_matches(&r, b, t, 0, 64));
    ck_assert(rig_kv_matches(&r, b, t, 96, 127));
    rig_close(&r);
}
END_TEST

/* A writer of the tier's memory without the key toggling a stored object's header between two
 * chunk keys (each with its header checksum): the object is chunk 1's, valid under its tag with
 * chunk 1's key, stored where chunk 2 is looked up. */
typedef struct toggler {
    kvs_object_header *h;
    kvs_key keys[2];
    uint64_t hashes[2];
    volatile int stop;
} toggler;

static void *toggle(void *arg) {
    toggler *t = arg;
    for (uint64_t i = 0; !t->stop; i++) {
        t->h->key = t->keys[i & 1];
        t->h->header_hash = t->hashes[i & 1];
    }
    return NULL;
}

/* An object read in place is judged by its header as it was checked: its key, codec and layout are
 * read from the checked copy, never again from memory the writer changes meanwhile. Chunk 1's valid
 * object under chunk 2's key, its key toggled, never loads as chunk 2 (before, it did in some of the
 * rounds: the tag was checked on one read and the key compared on another; not in every run, the
 * toggling thread needing a core of its own). */
#define ROUNDS 300
START_TEST(a_header_changed_after_its_check_is_never_believed) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, dram_config(key_file("t.key", 6, 0600), 1)),
                     KVS_OK);
    int32_t t[128];
    uint32_t b[8];
    saved_prompt(&r, 66, t, b);
    kvs_key keys[4];
    kvs_keys_chain(&r.h->fingerprint, t, 4, CHUNK, keys);
    uint64_t len;
    uint8_t *one = stored_object(&r, t, 1, &len);
    uint8_t *good = malloc(len);
    ck_assert_ptr_nonnull(good);
    memcpy(good, one, len);
    const kvs_backend_ops *ops = kvs_tiers_ops(r.h->tiers, 0);
    void *state = kvs_tiers_state(r.h->tiers, 0);
    uint64_t loaded_as_two = 0;
    for (int round = 0; round < ROUNDS; round++) {
        (void)ops->remove(state, &keys[2]);
        ck_assert_int_eq(ops->put(state, &keys[2], good, len), KVS_OK);
        toggler tg = {.h = (kvs_object_header *)stored_object(&r, t, 2, &len),
                      .keys = {keys[1], keys[2]}};
        for (int k = 0; k < 2; k++) {
            tg.h->key = tg.keys[k];
            kvs_object_seal(tg.h); /* the header checksum of that key (the tag is chunk 1's) */
            tg.hashes[k] = tg.h->header_hash;
        }
        pthread_t th;
        ck_assert_int_eq(pthread_create(&th, NULL, toggle, &tg), 0);
        char id[16];
        snprintf(id, sizeof id, "r%d", round);
        restored got = restore(&r, id, t, b);
        tg.stop = 1;
        pthread_join(th, NULL);
        int two_failed = 0;
        for (uint64_t i = 0; i < got.n_errors; i++) two_failed |= got.errors[i] == b[4];
        loaded_as_two += got.hit >= 96 && !two_failed;
        int keep = 0;
        (void)api->request_finished(r.h, id, &keep);
    }
    ck_assert_msg(loaded_as_two == 0, "chunk 1's object loaded as chunk 2 in %llu of %d rounds",
                  (unsigned long long)loaded_as_two, ROUNDS);
    free(good);
    rig_close(&r);
}
END_TEST

/* ---- the tags ------------------------------------------------------------------------------- */

static void make_object(uint8_t *o, uint32_t n_layers, uint64_t layer_bytes) {
    kvs_key fp = {{1}}, key = {{2}};
    kvs_object_init(o, &fp, &key, n_layers, 32, layer_bytes);
    for (uint32_t l = 0; l < n_layers; l++) {
        uint8_t *p = kvs_object_layer(o, l);
        for (uint64_t i = 0; i < layer_bytes; i++) p[i] = (uint8_t)(i * 31 + l);
        kvs_object_layer_hashes(o)[l] = kvs_xxh3_64(p, layer_bytes);
    }
}

START_TEST(tags_bind_the_key_the_layers_and_a_fresh_nonce) {
    enum { NL = 3, LB = 8192 };
    uint64_t bytes = kvs_object_bytes(NL, LB);
    uint8_t *o = malloc(bytes), *p = malloc(bytes);
    kvs_object_mac *k1 = NULL, *k2 = NULL;
    const uint8_t key1[32] = {1}, key2[32] = {2};
    char err[256];
    ck_assert_int_eq(kvs_object_mac_open(key1, sizeof key1, &k1, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_object_mac_open(key2, sizeof key2, &k2, err, sizeof err), KVS_OK);
    ck_assert(!kvs_object_mac_same(k1, k2));
    make_object(o, NL, LB);
    memcpy(p, o, bytes);
    ck_assert_int_eq(kvs_object_seal_keyed(k1, o), KVS_OK);
    ck_assert_int_eq(kvs_object_seal_keyed(k1, p), KVS_OK);
    ck_assert_int_eq(kvs_object_check_keyed_header(k1, o, bytes, err, sizeof err), KVS_OK);
    for (uint32_t l = 0; l < NL; l++)
        ck_assert_int_eq(kvs_object_check_keyed_layer(k1, o, l, err, sizeof err), KVS_OK);
    /* the same bytes sealed twice: two nonces, so two sets of tags */
    uint64_t rec = kvs_object_mac_record_offset(NL);
    ck_assert_mem_ne(o + rec, p + rec, KVS_OBJECT_NONCE_BYTES);
    /* another tenant's key */
    ck_assert_int_eq(kvs_object_check_keyed_header(k2, o, bytes, err, sizeof err), KVS_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "header tag mismatch"));
    ck_assert_int_eq(kvs_object_check_keyed_layer(k2, o, 0, err, sizeof err), KVS_ECORRUPT);
    /* one byte of layer 1: its tag fails, the header's and the other layers' hold */
    kvs_object_layer(o, 1)[LB - 1] ^= 1;
    ck_assert_int_eq(kvs_object_check_keyed_header(k1, o, bytes, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_object_check_keyed_layer(k1, o, 1, err, sizeof err), KVS_ECORRUPT);
    ck_assert_int_eq(kvs_object_check_keyed_layer(k1, o, 2, err, sizeof err), KVS_OK);
    /* a header field, or a byte of a layer tag */
    ((kvs_object_header *)p)->n_tokens ^= 1;
    ck_assert_int_eq(kvs_object_check_keyed_header(k1, p, bytes, err, sizeof err), KVS_ECORRUPT);
    ((kvs_object_header *)p)->n_tokens ^= 1;
    p[rec + 32 + 5] ^= 1;
    ck_assert_int_eq(kvs_object_check_keyed_header(k1, p, bytes, err, sizeof err), KVS_ECORRUPT);
    /* shorter than its header area */
    p[rec + 32 + 5] ^= 1;
    ck_assert_int_eq(kvs_object_check_keyed_header(k1, p, 4000, err, sizeof err), KVS_ECORRUPT);
    ck_assert_int_eq(kvs_object_check_keyed_header(k1, p, bytes, err, sizeof err), KVS_OK);
    kvs_object_mac_close(k1);
    kvs_object_mac_close(k2);
    free(o);
    free(p);
}
END_TEST

/* A keyed object is laid out as an unkeyed one: its record fits the header page up to 166 layers
 * (a keyed tier refuses to open for a model of more). */
START_TEST(objects_of_up_to_166_layers_have_room_for_their_tags) {
    for (uint32_t n = 1; n <= 166; n++)
        ck_assert_uint_ge(kvs_object_payload_offset(n),
                          kvs_object_mac_record_offset(n) + kvs_object_mac_record_bytes(n));
    ck_assert_uint_eq(kvs_object_payload_offset(166), 4096);
    ck_assert(kvs_object_mac_fits(166));
    ck_assert(!kvs_object_mac_fits(167));
    ck_assert_uint_eq(kvs_object_payload_offset(167),
                      4096); /* the layout of every object is as before */
}
END_TEST

/* ---- configurations ------------------------------------------------------------------------- */

static kvs_status open_text(const char *text, char *err, size_t err_len) {
    const char *path = rig_config("c.yaml", text);
    kvs_model_desc m = rig_model();
    kvs_open_params p = {
        .struct_size = sizeof p, .role = KVS_ROLE_WORKER, .config_path = path, .model = &m};
    kvs_handle *h = NULL;
    kvs_status st = api->open(&p, &h, err, err_len);
    if (h) api->close(h);
    return st;
}

START_TEST(refused_configurations_say_why) {
    char text[2048], err[512];
    const char *k1 = key_file("a.key", 1, 0600);
    char k1c[1024];
    snprintf(k1c, sizeof k1c, "%s", k1);
    char k2[1024];
    snprintf(k2, sizeof k2, "%s", key_file("b.key", 2, 0600));
    snprintf(text, sizeof text,
             "tiers:\n  - name: c\n    type: compress\n    capacity: 1MiB\n    integrity: keyed\n"
             "    integrity_key_file: %s\n",
             k1c);
    ck_assert_int_eq(open_text(text, err, sizeof err), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(err, "cannot be keyed"));
    snprintf(
        text, sizeof text,
        "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n    integrity_key_file: %s\n",
        k1c);
    ck_assert_int_eq(open_text(text, err, sizeof err), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(err, "integrity: keyed"));
    snprintf(text, sizeof text,
             "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n"
             "    integrity: keyed\n");
    ck_assert_int_eq(open_text(text, err, sizeof err), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(err, "integrity_key_file"));
    snprintf(text, sizeof text,
             "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n    integrity: signed\n");
    ck_assert_int_eq(open_text(text, err, sizeof err), KVS_ECONFIG);
    /* a key others can read */
    const char *open_key = key_file("c.key", 3, 0644);
    snprintf(text, sizeof text,
             "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n    integrity: keyed\n"
             "    integrity_key_file: %s\n",
             open_key);
    ck_assert_int_eq(open_text(text, err, sizeof err), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(err, "chmod 600"));
    /* two keyed tiers, two keys */
    snprintf(text, sizeof text,
             "tiers:\n  - name: d\n    type: dram\n    capacity: 1MiB\n    integrity: keyed\n"
             "    integrity_key_file: %s\n  - name: e\n    type: dram\n    capacity: 1MiB\n"
             "    integrity: keyed\n    integrity_key_file: %s\n",
             k1c, k2);
    ck_assert_int_eq(open_text(text, err, sizeof err), KVS_ECONFIG);
    ck_assert_msg(strstr(err, "different integrity keys") != NULL, "%s", err);
}
END_TEST

/* A remote tier with a tenant key is keyed by default, under that key; one without keys is not. */
START_TEST(a_remote_tier_is_keyed_by_default_under_its_tenant_key) {
    char text[2048], err[512];
    const char *k = key_file("tenant.key", 4, 0600);
    char kc[1024];
    snprintf(kc, sizeof kc, "%s", k);
    snprintf(text, sizeof text,
             "tiers:\n  - name: r\n    type: remote\n    nodes: [\"127.0.0.1:1\"]\n"
             "    options:\n      psk_file: %s\n      tenant: t\n",
             kc);
    kvs_config *cfg = NULL;
    ck_assert_int_eq(kvs_config_load(rig_config("r.yaml", text), &cfg, err, sizeof err), KVS_OK);
    ck_assert_int_eq(cfg->tiers[0].keyed, 1);
    ck_assert_str_eq(cfg->tiers[0].integrity_key_file, kc);
    kvs_config_free(cfg);
    snprintf(text, sizeof text,
             "tiers:\n  - name: r\n    type: remote\n    nodes: [\"127.0.0.1:1\"]\n"
             "    integrity: checksum\n    options:\n      psk_file: %s\n      tenant: t\n",
             kc);
    ck_assert_int_eq(kvs_config_load(rig_config("r.yaml", text), &cfg, err, sizeof err), KVS_OK);
    ck_assert_int_eq(cfg->tiers[0].keyed, 0);
    kvs_config_free(cfg);
    snprintf(text, sizeof text,
             "tiers:\n  - name: r\n    type: remote\n    nodes: [\"127.0.0.1:1\"]\n");
    ck_assert_int_eq(kvs_config_load(rig_config("r.yaml", text), &cfg, err, sizeof err), KVS_OK);
    ck_assert_int_eq(cfg->tiers[0].keyed, 0);
    kvs_config_free(cfg);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("integrity");
    TCase *tc = tcase_create("keyed");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, a_checksum_tier_loads_a_resealed_object);
    tcase_add_test(tc, a_keyed_tier_turns_a_resealed_object_into_a_counted_miss);
    tcase_add_test(tc, a_keyed_tier_refuses_stripped_and_moved_objects);
    tcase_add_test(tc, a_keyed_tier_loads_its_own_objects);
    tcase_add_loop_test(tc, a_changed_layer_fails_its_tag_as_it_is_copied_or_before, 0, 2);
    tcase_add_test(tc, a_header_changed_after_its_check_is_never_believed);
    tcase_add_test(tc, tags_bind_the_key_the_layers_and_a_fresh_nonce);
    tcase_add_test(tc, objects_of_up_to_166_layers_have_room_for_their_tags);
    tcase_add_test(tc, refused_configurations_say_why);
    tcase_add_test(tc, a_remote_tier_is_keyed_by_default_under_its_tenant_key);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
