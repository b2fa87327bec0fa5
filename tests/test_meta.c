/* test_meta.c - the step metadata (connector/meta.c) a scheduler-role handle sends to worker-role
 * handles: it crosses a process boundary, and every flipped bit, truncation or hostile count in it is
 * refused by bind_meta without harm. */
#include <check.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "abi/kvstrata.h"
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
    rig_make_tokens(t, 128, 91);
    for (;;) {
        uint64_t hdr[4];
        if (read_all(in, hdr, sizeof hdr) != 0) break;
        uint8_t *blob = malloc(hdr[0]);
        if (!blob || read_all(in, blob, hdr[0]) != 0) return 3;
        uint32_t blocks[8];
        rig_blocks_from(blocks, 8, (uint32_t)hdr[3]);
        rig_worker_step(&r, blob, hdr[0], blocks, t, hdr[1], hdr[2]);
        free(blob);
        uint8_t ok = (uint8_t)rig_kv_matches(&r, blocks, t, 0, hdr[2]);
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

START_TEST(garbage_metadata_is_refused_without_harm) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 81);
    rig_blocks_from(a, 8, 0);
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
                  huge_map[] = {0x98, 0xdf, 0x7f, 0xff, 0xff, 0xff},
                  huge_bin[] = {0x98, 0x08, 0x00, 0xc6, 0xff, 0xff, 0xff, 0x00, 0x00};
    ck_assert_int_eq(api->bind_meta(r.h, bad, sealed(bad, huge_array, sizeof huge_array)),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "the root has 4294967295 elements"));
    ck_assert_int_eq(api->bind_meta(r.h, bad, sealed(bad, huge_map, sizeof huge_map)), KVS_EINVAL);
    ck_assert_int_eq(api->bind_meta(r.h, bad, sealed(bad, huge_bin, sizeof huge_bin)), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(
        api->last_error(r.h), "the group fingerprint of 4294967040 bytes is over the limit of 16"));
    /* a request list declaring 2^32-1 requests in a few bytes is refused before calloc sees the count */
    const uint8_t huge_reqs[] = {0x98, 0x08, 0x00, 0xc4, 0x10, 0,    0,    0,    0,   0,
                                 0,    0,    0,    0,    0,    0,    0,    0,    0,   0,
                                 0,    0x01, 0x20, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90};
    ck_assert_int_eq(api->bind_meta(r.h, bad, sealed(bad, huge_reqs, sizeof huge_reqs)),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(
        strstr(api->last_error(r.h), "the request list declares 4294967295 elements"));
    ck_assert_int_eq(api->bind_meta(r.h, meta, len), KVS_OK); /* still usable */
    ck_assert_int_eq(api->wait_save(r.h), KVS_OK);
    /* The request's layer mask (metadata v3) comes before load_async (v5), derived_from (v6,
     * here none: 0xcf and eight 0xff) and block_first (v8, here 0); then the step's flags (v7, 0)
     * and the finished list (v8, empty: 0x90). Here the mask is an empty bin (every layer): one of
     * the right size is taken, one naming a layer past the model's two or of another size is
     * not. */
    const uint64_t tail = 12; /* derived_from, block_first, flags, the finished list */
    ck_assert_uint_eq(meta[len - 3], 0x00);
    ck_assert_uint_eq(meta[len - 2], 0x00);
    ck_assert_uint_eq(meta[len - 1], 0x90);
    /* flags: a bit this library does not know is refused */
    memcpy(bad, meta, len);
    bad[len - 2] = 0x02;
    reseal(bad, len);
    ck_assert_int_eq(api->bind_meta(r.h, bad, len), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(api->last_error(r.h), "flags"));
    /* the finished list: a count larger than the blob, an id that is empty, holds a NUL or is not
     * a string are refused; one good id is taken */
    const uint8_t huge_finished[] = {0xdd, 0xff, 0xff, 0xff, 0xff}, empty_id[] = {0x91, 0xa0},
                  nul_id[] = {0x91, 0xa3, 'a', 0x00, 'b'}, bin_id[] = {0x91, 0xc4, 0x01, 'a'},
                  good[] = {0x92, 0xa1, 'x', 0xa2, 'y', 'z'};
    const uint8_t *lists[] = {huge_finished, empty_id, nul_id, bin_id, good};
    const uint64_t list_len[] = {sizeof huge_finished, sizeof empty_id, sizeof nul_id,
                                 sizeof bin_id, sizeof good};
    const char *why[] = {"the finished list declares 4294967295 elements",
                         "a finished request id is not 1..255 bytes of text",
                         "a finished request id is not 1..255 bytes of text", "finished request id",
                         NULL};
    for (int k = 0; k < 5; k++) {
        memcpy(bad, meta, len - 1);
        memcpy(bad + len - 1, lists[k], list_len[k]);
        uint64_t n = len - 1 + list_len[k];
        reseal(bad, n);
        kvs_meta *m = NULL;
        char err[256] = "";
        kvs_status st = kvs_meta_decode(bad, n, 0, &m, err, sizeof err);
        if (!why[k]) {
            ck_assert_int_eq(st, KVS_OK);
            ck_assert_uint_eq(m->n_finished, 2);
            ck_assert_str_eq(m->finished[0], "x");
            ck_assert_str_eq(m->finished[1], "yz");
            kvs_meta_free(m);
            continue;
        }
        ck_assert_int_eq(st, KVS_EINVAL);
        ck_assert_ptr_null(m);
        ck_assert_msg(strstr(err, why[k]) != NULL, "%s", err);
    }
    ck_assert(len > 3 + tail && meta[len - tail - 3] == 0xc4 && meta[len - tail - 2] == 0x00 &&
              meta[len - tail - 1] == 0x00 && meta[len - tail] == 0xcf);
    const uint8_t masks[][5] = {
        {0xc4, 0x01, 0x01, 0x00}, {0xc4, 0x01, 0x07, 0x00}, {0xc4, 0x02, 0x03, 0x00, 0x00}};
    const uint64_t mask_len[] = {4, 4, 5};
    for (int k = 0; k < 3; k++) {
        uint64_t head = len - tail - 3, n = head + mask_len[k] + tail;
        memcpy(bad, meta, head);
        memcpy(bad + head, masks[k], mask_len[k]);
        memcpy(bad + head + mask_len[k], meta + len - tail, tail);
        reseal(bad, n);
        kvs_status st = api->bind_meta(r.h, bad, n);
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

START_TEST(metadata_crosses_a_process_boundary) {
    const char *cfg = rig_shared_config();
    int down[2], up[2];
    ck_assert_int_eq(pipe(down), 0);
    ck_assert_int_eq(pipe(up), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (close(down[1]) != 0 || close(up[0]) != 0) _exit(5);
        _exit(worker_process(cfg, down[0], up[1]));
    }
    ck_assert_int_eq(close(down[0]), 0);
    ck_assert_int_eq(close(up[1]), 0);
    rig s;
    ck_assert_int_eq(rig_open(&s, KVS_ROLE_SCHEDULER, cfg), KVS_OK);
    int32_t t[128];
    rig_make_tokens(t, 128, 91);
    uint32_t a[8], b[8];
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 16);
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
    ck_assert_int_eq(close(down[1]), 0);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_int_eq(close(up[0]), 0);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    rig_close(&s);
}
END_TEST

START_TEST(every_flipped_bit_of_step_metadata_is_refused) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(64, 30000)), KVS_OK);
    int32_t t[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 89);
    rig_blocks_from(a, 8, 40); /* block 47 and block 6 differ in one bit of the blob: 0x2f, 0x06 */
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

/* --- v5: every tensor-parallel rank's keys in one blob ------------------------------------------- */

/* A key whose bytes say which rank and chunk it belongs to. */
static kvs_key rank_key(uint32_t rank, uint64_t chunk) {
    kvs_key k;
    for (unsigned i = 0; i < sizeof k.bytes; i++) k.bytes[i] = (uint8_t)(0x10 * rank + chunk + i);
    return k;
}

/* Step 7 of a two-rank model: request "r" loads chunks 1 and 2 (tokens 40..96) asynchronously, with
 * a layer mask, and saves chunk 3. keys[c][rank] holds rank_key(rank, c). */
typedef struct two_rank_blob {
    kvs_key keys[4][2];
    kvs_meta_load loads[2];
    kvs_meta_save saves[1];
    uint32_t blocks[8];
    uint8_t layers[1];
    kvs_meta_req req;
    kvs_meta meta;
} two_rank_blob;

static void two_rank_meta(two_rank_blob *b) {
    memset(b, 0, sizeof *b);
    for (uint64_t c = 0; c < 4; c++)
        for (uint32_t q = 0; q < 2; q++) b->keys[c][q] = rank_key(q, c);
    b->loads[0] = (kvs_meta_load){b->keys[1][0], 32, 40, 24, b->keys[1]};
    b->loads[1] = (kvs_meta_load){b->keys[2][0], 64, 64, 32, b->keys[2]};
    b->saves[0] = (kvs_meta_save){b->keys[3][0], 96, b->keys[3]};
    rig_blocks_from(b->blocks, 8, 30);
    b->layers[0] = 0x02;
    strcpy(b->req.id, "r");
    b->req.block_ids = b->blocks;
    b->req.n_block_ids = 8;
    b->req.loads = b->loads;
    b->req.n_loads = 2;
    b->req.saves = b->saves;
    b->req.n_saves = 1;
    b->req.layers = b->layers;
    b->req.n_layer_bytes = 1;
    b->req.load_async = 1;
    b->req.derived = 1;
    b->req.derived_from = 64;
    b->req.block_first = 1;
    b->meta = (kvs_meta){.step = 7,
                         .group_fingerprint = rank_key(9, 9),
                         .key_ranks = 2,
                         .chunk_tokens = CHUNK,
                         .reqs = &b->req,
                         .n_reqs = 1};
}

START_TEST(each_rank_decodes_its_own_keys_from_one_blob) {
    two_rank_blob b;
    two_rank_meta(&b);
    void *blob = NULL;
    uint64_t len = 0;
    ck_assert_int_eq(kvs_meta_encode(&b.meta, &blob, &len), KVS_OK);
    for (uint32_t rank = 0; rank < 2; rank++) {
        kvs_meta *m = NULL;
        char err[256] = "";
        ck_assert_int_eq(kvs_meta_decode(blob, len, rank, &m, err, sizeof err), KVS_OK);
        ck_assert_uint_eq(m->step, 7);
        ck_assert_uint_eq(m->key_ranks, 2);
        ck_assert_uint_eq(m->chunk_tokens, CHUNK);
        kvs_key group = rank_key(9, 9);
        ck_assert_mem_eq(&m->group_fingerprint, &group, sizeof group);
        ck_assert_uint_eq(m->n_reqs, 1);
        const kvs_meta_req *r = &m->reqs[0];
        ck_assert_str_eq(r->id, "r");
        ck_assert_uint_eq(r->n_block_ids, 8);
        ck_assert_uint_eq(r->block_ids[7], 37);
        ck_assert_uint_eq(r->load_async, 1);
        ck_assert_uint_eq(r->derived, 1);
        ck_assert_uint_eq(r->derived_from, 64);
        ck_assert_uint_eq(r->block_first, 1);
        ck_assert_uint_eq(r->n_layer_bytes, 1);
        ck_assert_uint_eq(r->layers[0], 0x02);
        ck_assert_uint_eq(r->n_loads, 2);
        ck_assert_uint_eq(r->n_saves, 1);
        /* `key` is this rank's; the other rank's keys are not kept */
        for (uint64_t i = 0; i < 2; i++) {
            kvs_key want = rank_key(rank, i + 1);
            ck_assert_mem_eq(&r->loads[i].key, &want, sizeof want);
            ck_assert_ptr_null(r->loads[i].keys);
        }
        ck_assert_uint_eq(r->loads[0].first_token, 40);
        ck_assert_uint_eq(r->loads[0].n_tokens, 24);
        kvs_key want = rank_key(rank, 3);
        ck_assert_mem_eq(&r->saves[0].key, &want, sizeof want);
        ck_assert_uint_eq(r->saves[0].chunk_first, 96);
        kvs_meta_free(m);
    }
    /* a worker of a rank the blob has no keys for is refused with the reason */
    kvs_meta *m = (kvs_meta *)&b;
    char err[256] = "";
    ck_assert_int_eq(kvs_meta_decode(blob, len, 2, &m, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(
        strstr(err, "keys of 2 tensor-parallel ranks, none for this worker's rank 2"));
    free(blob);
    /* one rank: a load's lone `key` is its key, and load_async defaults to 0 */
    b.meta.key_ranks = 1;
    b.req.load_async = 0;
    b.loads[0].keys = b.loads[1].keys = NULL;
    b.saves[0].keys = NULL;
    ck_assert_int_eq(kvs_meta_encode(&b.meta, &blob, &len), KVS_OK);
    ck_assert_int_eq(kvs_meta_decode(blob, len, 0, &m, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(m->key_ranks, 1);
    ck_assert_uint_eq(m->reqs[0].load_async, 0);
    ck_assert_mem_eq(&m->reqs[0].loads[1].key, &b.keys[2][0], sizeof(kvs_key));
    ck_assert_mem_eq(&m->reqs[0].saves[0].key, &b.keys[3][0], sizeof(kvs_key));
    kvs_meta_free(m);
    ck_assert_int_eq(kvs_meta_decode(blob, len, 1, &m, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "keys of 1 tensor-parallel rank, none"));
    free(blob);
}
END_TEST

/* Decode body (a copy of blob's msgpack with bytes [at, at + cut) replaced by `with`) as rank `rank`;
 * returns the status, the sentence in err. */
static kvs_status decode_spliced(const uint8_t *blob, uint64_t len, uint64_t at, uint64_t cut,
                                 const uint8_t *with, uint64_t n, uint32_t rank, char *err,
                                 size_t err_len) {
    static uint8_t out[4096];
    ck_assert(len - cut + n <= sizeof out);
    memcpy(out, blob, at);
    memcpy(out + at, with, n);
    memcpy(out + at + n, blob + at + cut, len - at - cut);
    uint64_t out_len = len - cut + n;
    reseal(out, out_len);
    kvs_meta *m = NULL;
    err[0] = '\0';
    kvs_status st = kvs_meta_decode(out, out_len, rank, &m, err, err_len);
    if (st == KVS_OK) kvs_meta_free(m);
    return st;
}

START_TEST(key_ranks_that_do_not_add_up_are_refused) {
    two_rank_blob b;
    two_rank_meta(&b);
    void *out = NULL;
    uint64_t len = 0;
    /* the encoder refuses what no decoder could use */
    b.meta.key_ranks = 0;
    ck_assert_int_eq(kvs_meta_encode(&b.meta, &out, &len), KVS_EINVAL);
    b.meta.key_ranks = KVS_KEYS_MAX_RANKS + 1;
    ck_assert_int_eq(kvs_meta_encode(&b.meta, &out, &len), KVS_EINVAL);
    b.meta.key_ranks = 2;
    b.saves[0].keys = NULL; /* two ranks, one key */
    ck_assert_int_eq(kvs_meta_encode(&b.meta, &out, &len), KVS_EINVAL);
    b.saves[0].keys = b.keys[3];
    ck_assert_int_eq(kvs_meta_encode(&b.meta, &out, &len), KVS_OK);
    const uint8_t *blob = out;
    /* body: 0x98, version 8, step 7, bin8 of 16 (2 + 16 bytes), then key_ranks at 21 */
    const uint64_t ranks_at = KVS_META_HEADER_BYTES + 21;
    ck_assert_uint_eq(blob[KVS_META_HEADER_BYTES], 0x98);
    ck_assert_uint_eq(blob[KVS_META_HEADER_BYTES + 1], KVS_META_VERSION);
    ck_assert_uint_eq(blob[ranks_at], 2);
    char err[256];
    const uint8_t zero = 0, three = 3, one = 1, two = 2, over[] = {0xcd, 0x04, 0x01}; /* 1025 */
    ck_assert_int_eq(decode_spliced(blob, len, ranks_at, 1, &zero, 1, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "key_ranks is zero"));
    ck_assert_int_eq(decode_spliced(blob, len, ranks_at, 1, over, 3, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "key_ranks 1025 is over 1024"));
    /* counts that do not match the keys each load carries */
    ck_assert_int_eq(decode_spliced(blob, len, ranks_at, 1, &three, 1, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "a load's keys are 32 bytes, 48 expected"));
    ck_assert_int_eq(decode_spliced(blob, len, ranks_at, 1, &one, 1, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "a load's keys of 32 bytes is over the limit of 16"));
    /* load_async comes before derived_from (64) and the request's last field, block_first (1):
     * 0 or 1; then the step's flags (0) and the finished list (v8, empty: 0x90) */
    ck_assert_uint_eq(blob[len - 1], 0x90);
    ck_assert_uint_eq(blob[len - 2], 0);
    ck_assert_uint_eq(blob[len - 3], 1);
    ck_assert_uint_eq(blob[len - 4], 64);
    ck_assert_uint_eq(blob[len - 5], 1);
    ck_assert_int_eq(decode_spliced(blob, len, len - 5, 1, &two, 1, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "load_async 2 is over 1"));
    /* a request without derived_from (a v5 request) or without block_first (v7) is refused */
    ck_assert_int_eq(decode_spliced(blob, len, len - 4, 1, &zero, 0, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_str_ne(err, "");
    ck_assert_int_eq(decode_spliced(blob, len, len - 3, 1, &zero, 0, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_str_ne(err, "");
    /* block_first is a block table index: 2^32 is refused, 2^32 - 1 read */
    const uint8_t past[] = {0xcf, 0, 0, 0, 1, 0, 0, 0, 0}, last[] = {0xce, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(decode_spliced(blob, len, len - 3, 1, past, sizeof past, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "block_first"));
    ck_assert_int_eq(decode_spliced(blob, len, len - 3, 1, last, sizeof last, 0, err, sizeof err),
                     KVS_OK);
    /* a step without flags, or without the finished list (a v7 root: seven fields), is refused,
     * and so is an unknown flag; the known one is read */
    ck_assert_int_eq(decode_spliced(blob, len, len - 2, 1, &zero, 0, 0, err, sizeof err),
                     KVS_EINVAL);
    static uint8_t seven[4096];
    memcpy(seven, blob, len - 1);
    seven[KVS_META_HEADER_BYTES] = 0x97;
    reseal(seven, len - 1);
    kvs_meta *old = NULL;
    ck_assert_int_eq(kvs_meta_decode(seven, len - 1, 0, &old, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "root"));
    ck_assert_int_eq(decode_spliced(blob, len, len - 2, 1, &two, 1, 0, err, sizeof err),
                     KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "flags"));
    ck_assert_int_eq(decode_spliced(blob, len, len - 2, 1, &one, 1, 0, err, sizeof err), KVS_OK);
    free(out);
    b.meta.flags = KVS_META_MASKS_DROPPED;
    ck_assert_int_eq(kvs_meta_encode(&b.meta, &out, &len), KVS_OK);
    kvs_meta *m = NULL;
    ck_assert_int_eq(kvs_meta_decode(out, len, 1, &m, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(m->flags, KVS_META_MASKS_DROPPED);
    kvs_meta_free(m);
    free(out);
}
END_TEST

/* Every flip, cut and random body of a two-rank blob is refused with a sentence or decodes to
 * something whose counts fit the blob, for either rank (ASan checks nothing leaks or overruns). */
START_TEST(garbage_two_rank_metadata_is_refused_without_harm) {
    two_rank_blob b;
    two_rank_meta(&b);
    void *out = NULL;
    uint64_t len = 0;
    ck_assert_int_eq(kvs_meta_encode(&b.meta, &out, &len), KVS_OK);
    const uint8_t *blob = out;
    uint8_t bad[4096];
    ck_assert(len <= sizeof bad);
    unsigned seed = 4242;
    int refused = 0;
    for (int i = 0; i < 6000; i++) {
        uint64_t blen = len;
        memcpy(bad, blob, len);
        if (i % 3 == 0) {
            for (uint64_t k = KVS_META_HEADER_BYTES; k < len; k++) bad[k] = (uint8_t)rand_r(&seed);
        } else if (i % 3 == 1) {
            blen = (uint64_t)rand_r(&seed) % len;
        } else {
            bad[KVS_META_HEADER_BYTES + (uint64_t)rand_r(&seed) % (len - KVS_META_HEADER_BYTES)] ^=
                (uint8_t)(1u << (rand_r(&seed) % 8));
        }
        if (blen > KVS_META_HEADER_BYTES) reseal(bad, blen); /* the decoder sees each of them */
        kvs_meta *m = NULL;
        char err[256] = "";
        kvs_status st = kvs_meta_decode(bad, blen, (uint32_t)i & 1, &m, err, sizeof err);
        if (st != KVS_OK) {
            refused++;
            ck_assert_ptr_null(m);
            ck_assert_str_ne(err, "");
            continue;
        }
        ck_assert_uint_ge(m->key_ranks, 1);
        ck_assert_uint_lt((uint32_t)i & 1, m->key_ranks);
        uint64_t entries = m->n_reqs;
        for (uint64_t r = 0; r < m->n_reqs; r++) {
            ck_assert_uint_le(m->reqs[r].load_async, 1);
            entries += m->reqs[r].n_loads + m->reqs[r].n_saves + m->reqs[r].n_block_ids;
        }
        ck_assert_uint_le(entries, blen);
        kvs_meta_free(m);
    }
    ck_assert_int_gt(refused, 4000);
    free(out);
}
END_TEST

static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* A finished list of many short ids: what the decoder allocates stays within a few times the
 * blob's size (an id of one character once cost a whole KVS_REQ_ID_MAX slot). */
START_TEST(a_long_finished_list_costs_the_decoder_little_more_than_its_blob) {
    enum { N = 1 << 18 };
    char(*ids)[8] = malloc(N * sizeof *ids);
    const char **finished = malloc(N * sizeof *finished);
    ck_assert_ptr_nonnull(ids);
    ck_assert_ptr_nonnull(finished);
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "%x", i);
        finished[i] = ids[i];
    }
    kvs_meta meta = {
        .step = 3, .key_ranks = 1, .chunk_tokens = 16, .finished = finished, .n_finished = N};
    void *blob = NULL;
    uint64_t len = 0;
    ck_assert_int_eq(kvs_meta_encode(&meta, &blob, &len), KVS_OK);
    size_t before = heap_in_use();
    kvs_meta *m = NULL;
    char err[256] = "";
    ck_assert_int_eq(kvs_meta_decode(blob, len, 0, &m, err, sizeof err), KVS_OK);
    size_t used = heap_in_use() - before;
    ck_assert_uint_eq(m->n_finished, N);
    ck_assert_str_eq(m->finished[0], "0");
    ck_assert_str_eq(m->finished[N - 1], "3ffff");
    /* under a sanitizer mallinfo2 counts nothing: the bound then holds trivially */
    ck_assert_msg(used < 8 * len, "decoding a %llu-byte blob took %zu bytes of heap",
                  (unsigned long long)len, used);
    kvs_meta_free(m);
    free(blob);
    free(finished);
    free(ids);
}
END_TEST

static Suite *meta_suite(void) {
    Suite *s = suite_create("meta");
    TCase *tc = tcase_create("meta");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, garbage_metadata_is_refused_without_harm);
    tcase_add_test(tc, metadata_crosses_a_process_boundary);
    suite_add_tcase(s, tc);
    TCase *contract = tcase_create("contract");
    tcase_add_checked_fixture(contract, setup, teardown);
    tcase_set_timeout(contract, 60);
    tcase_add_test(contract, every_flipped_bit_of_step_metadata_is_refused);
    tcase_add_test(contract, each_rank_decodes_its_own_keys_from_one_blob);
    tcase_add_test(contract, key_ranks_that_do_not_add_up_are_refused);
    tcase_add_test(contract, garbage_two_rank_metadata_is_refused_without_harm);
    tcase_add_test(contract, a_long_finished_list_costs_the_decoder_little_more_than_its_blob);
    suite_add_tcase(s, contract);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(meta_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
