/* test_store.c - the store API (abi/kvstrata_store.h, connector/store/) through its table: values
 * round trip byte for byte through scatter-gather lists, exists answers the leading run, keys fail
 * alone in their results, bad arguments are KVS_EINVAL and start nothing, tickets are collected
 * once (wait with a timeout, the event fd and drain, oldest submitted first), close waits for batches in flight, pins keep
 * keys through evictions, events carry the engine's keys, and eight threads at once stay
 * byte-exact. Every value is a function of its key (value_of), so any successful get is checked. */
#include <check.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "abi/kvstrata_store.h"
#include "tests/support/test_support.h"

static const kvs_store_api *sapi;
static char tmpdir[256];

static void setup(void) {
    const kvs_api *api = kvs_get_api(KVS_ABI_MAJOR);
    ck_assert_ptr_nonnull(api);
    ck_assert_uint_ge(api->struct_size, offsetof(kvs_api, store_api) + sizeof api->store_api);
    sapi = api->store_api(KVS_STORE_ABI_MAJOR);
    ck_assert_ptr_nonnull(sapi);
    ck_assert_ptr_null(api->store_api(KVS_STORE_ABI_MAJOR + 1));
    ck_assert_uint_eq(sapi->abi_major, KVS_STORE_ABI_MAJOR);
    ck_assert_uint_ge(sapi->struct_size, sizeof(kvs_store_api));
    ck_assert_int_eq(kvs_test_tmpdir(tmpdir, sizeof tmpdir), 0);
}

static void teardown(void) {
    kvs_test_rmtree(tmpdir);
}

/* --- helpers ------------------------------------------------------------------------------------ */

/* A store on cfg (NULL: the default DRAM tier) under namespace ns, or a failed check. */
static kvs_store *open_store(const char *ns, const char *tenant, const char *cfg, uint32_t threads,
                             uint64_t max_value, uint32_t events) {
    kvs_store_open_params p = {.struct_size = sizeof p,
                               .threads = threads,
                               .config_path = cfg,
                               .namespace_bytes = ns,
                               .namespace_len = strlen(ns),
                               .tenant = tenant,
                               .max_value_bytes = max_value,
                               .event_capacity = events};
    kvs_store *s = NULL;
    char err[512] = "";
    kvs_status st = sapi->open(&p, &s, err, sizeof err);
    ck_assert_msg(st == KVS_OK, "open: %d %s", st, err);
    ck_assert_ptr_nonnull(s);
    return s;
}

static const char *write_config(const char *name, const char *text) {
    static char path[512];
    ck_assert_int_eq(kvs_test_write_file(tmpdir, name, text, path, sizeof path), 0);
    return path;
}

/* Up to 64 keys packed as kvs_store_keys wants them. */
typedef struct keyset {
    char data[64 * 32];
    uint64_t offsets[65];
    kvs_store_keys k;
} keyset;

static void keys_init(keyset *ks, const char *fmt, const int *ids, int n) {
    ks->offsets[0] = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(ks->data + ks->offsets[i], 32, fmt, ids[i]);
        ks->offsets[i + 1] = ks->offsets[i] + (uint64_t)w;
    }
    ks->k = (kvs_store_keys){.data = ks->data, .offsets = ks->offsets, .n = (uint64_t)n};
}

static void keys_range(keyset *ks, const char *fmt, int from, int n) {
    int ids[64];
    for (int i = 0; i < n; i++) ids[i] = from + i;
    keys_init(ks, fmt, ids, n);
}

/* n bytes determined by the key's bytes (and n). */
static void value_of(const void *key, uint64_t key_len, uint8_t *out, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < key_len; i++) h = (h ^ ((const uint8_t *)key)[i]) * 1099511628211ull;
    h ^= n * 0x9E3779B97F4A7C15ull;
    for (uint64_t i = 0; i < n; i++) {
        h ^= h << 13, h ^= h >> 7, h ^= h << 17;
        out[i] = (uint8_t)(h >> 24);
    }
}

static const void *key_at(const keyset *ks, int i) {
    return ks->data + ks->offsets[i];
}
static uint64_t key_len(const keyset *ks, int i) {
    return ks->offsets[i + 1] - ks->offsets[i];
}

/* One contiguous buffer per key: bufs[i] of lens[i] bytes. */
static void one_piece_each(uint8_t **bufs, const uint64_t *lens, int n, kvs_store_iov *iov,
                           uint64_t *seg, kvs_store_sg *sg) {
    seg[0] = 0;
    for (int i = 0; i < n; i++) {
        iov[i] = (kvs_store_iov){bufs[i], lens[i]};
        seg[i + 1] = (uint64_t)i + 1;
    }
    *sg = (kvs_store_sg){iov, seg};
}

/* Submit and wait without bound; n_failed back. */
static uint64_t run(kvs_store *s, uint32_t op, const keyset *ks, const kvs_store_sg *sg,
                    uint32_t flags, kvs_store_result *res) {
    uint64_t t = 0, failed = 0;
    ck_assert_int_eq(sapi->submit(s, op, &ks->k, sg, flags, &t), KVS_OK);
    ck_assert_uint_gt(t, 0);
    ck_assert_int_eq(sapi->wait(s, t, UINT64_MAX, res, ks->k.n, &failed), KVS_OK);
    return failed;
}

/* Put each key's value_of(key, lens[i]) as one piece. */
static void put_values(kvs_store *s, const keyset *ks, const uint64_t *lens, uint32_t flags,
                       kvs_store_result *res) {
    int n = (int)ks->k.n;
    uint8_t *bufs[64];
    kvs_store_iov iov[64];
    uint64_t seg[65];
    kvs_store_sg sg;
    for (int i = 0; i < n; i++) {
        bufs[i] = malloc(lens[i] ? lens[i] : 1);
        value_of(key_at(ks, i), key_len(ks, i), bufs[i], lens[i]);
    }
    one_piece_each(bufs, lens, n, iov, seg, &sg);
    run(s, KVS_STORE_OP_PUT, ks, &sg, flags, res);
    for (int i = 0; i < n; i++) free(bufs[i]);
}

static kvs_store_stats stats_of(kvs_store *s) {
    kvs_store_stats st = {.struct_size = sizeof st};
    ck_assert_int_eq(sapi->stats(s, &st), KVS_OK);
    return st;
}

/* --- round trips --------------------------------------------------------------------------------- */

START_TEST(values_round_trip_through_scatter_gather_lists) {
    kvs_store *s = open_store("test_store/rt", NULL, NULL, 0, 1 << 20, 0);
    enum { N = 8 };
    keyset ks;
    keys_range(&ks, "rt-%d", 0, N);
    uint64_t lens[N];
    uint8_t *vals[N], *outs[N];
    kvs_store_iov iov[3 * N];
    uint64_t seg[N + 1] = {0};
    for (int i = 0; i < N; i++) {
        lens[i] = 1 + (uint64_t)i * 7919; /* 1 byte .. 54 KiB */
        vals[i] = malloc(lens[i]);
        outs[i] = malloc(lens[i] + 16);
        value_of(key_at(&ks, i), key_len(&ks, i), vals[i], lens[i]);
        /* put: two pieces, cut at a third (the first empty for a 1-byte value) */
        uint64_t cut = lens[i] / 3;
        iov[2 * i] = (kvs_store_iov){vals[i], cut};
        iov[2 * i + 1] = (kvs_store_iov){vals[i] + cut, lens[i] - cut};
        seg[i + 1] = 2 * (uint64_t)(i + 1);
    }
    kvs_store_sg sg = {iov, seg};
    kvs_store_result res[N];
    ck_assert_uint_eq(run(s, KVS_STORE_OP_PUT, &ks, &sg, 0, res), 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(res[i].status, KVS_OK);
        ck_assert_uint_eq(res[i].flags & KVS_STORE_SKIPPED, 0);
        ck_assert_uint_eq(res[i].tier, 0);
    }
    /* get: three pieces, cut elsewhere, the last one 16 bytes longer than needed */
    for (int i = 0; i < N; i++) {
        memset(outs[i], 0xEE, lens[i] + 16);
        uint64_t a = lens[i] / 2, b = (lens[i] - a) / 2;
        iov[3 * i] = (kvs_store_iov){outs[i], a};
        iov[3 * i + 1] = (kvs_store_iov){outs[i] + a, b};
        iov[3 * i + 2] = (kvs_store_iov){outs[i] + a + b, lens[i] - a - b + 16};
        seg[i + 1] = 3 * (uint64_t)(i + 1);
    }
    ck_assert_uint_eq(run(s, KVS_STORE_OP_GET, &ks, &sg, 0, res), 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(res[i].status, KVS_OK);
        ck_assert_uint_eq(res[i].bytes, lens[i]);
        ck_assert_uint_eq(res[i].tier, 0);
        ck_assert_int_eq(memcmp(outs[i], vals[i], lens[i]), 0);
        free(vals[i]);
        free(outs[i]);
    }
    kvs_store_stats st = stats_of(s);
    ck_assert_uint_eq(st.puts_stored, N);
    ck_assert_uint_eq(st.get_hits, N);
    ck_assert_uint_eq(st.get_misses, 0);
    ck_assert_uint_eq(st.batches_in_flight, 0);
    ck_assert_uint_eq(st.n_tiers, 1);
    kvs_store_tier_usage u[4];
    for (int i = 0; i < 4; i++) u[i].struct_size = sizeof u[i];
    uint32_t nu = 0;
    ck_assert_int_eq(sapi->usage(s, u, 4, &nu), KVS_OK);
    ck_assert_uint_eq(nu, 1);
    ck_assert_str_eq(u[0].name, "dram");
    ck_assert_uint_eq(u[0].puts, N);
    ck_assert_uint_eq(u[0].hits, N);
    ck_assert_uint_eq(u[0].capacity, 1ull << 30);
    sapi->close(s);
}
END_TEST

START_TEST(exists_answers_the_leading_run) {
    kvs_store *s = open_store("test_store/exists", NULL, NULL, 0, 1 << 20, 0);
    keyset all, some;
    keys_range(&all, "ex-%d", 0, 5);
    int present[] = {0, 1, 3};
    keys_init(&some, "ex-%d", present, 3);
    uint64_t lens[3] = {100, 200, 300};
    kvs_store_result res[5];
    put_values(s, &some, lens, 0, res);

    uint64_t n_leading = 99;
    ck_assert_int_eq(sapi->exists(s, &all.k, 0, 0, NULL, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 2);
    uint8_t states[5];
    memset(states, 0xFF, sizeof states);
    ck_assert_int_eq(sapi->exists(s, &all.k, 0, 0, states, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 2);
    ck_assert_uint_eq(states[0], KVS_STORE_PRESENT);
    ck_assert_uint_eq(states[1], KVS_STORE_PRESENT);
    ck_assert_msg(states[2] == KVS_STORE_ABSENT || states[2] == 0xFF, "states[2] %u", states[2]);
    memset(states, 0xFF, sizeof states);
    ck_assert_int_eq(sapi->exists(s, &all.k, KVS_STORE_ALL, 0, states, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 2);
    const uint8_t want[5] = {KVS_STORE_PRESENT, KVS_STORE_PRESENT, KVS_STORE_ABSENT,
                             KVS_STORE_PRESENT, KVS_STORE_ABSENT};
    ck_assert_mem_eq(states, want, 5);
    /* a local-only question of a chain without a remote tier answers the same */
    ck_assert_int_eq(
        sapi->exists(s, &all.k, KVS_STORE_ALL | KVS_STORE_LOCAL, 0, states, &n_leading), KVS_OK);
    ck_assert_mem_eq(states, want, 5);
    /* no keys: an empty run */
    keyset none;
    keys_range(&none, "ex-%d", 0, 0);
    ck_assert_int_eq(sapi->exists(s, &none.k, 0, 0, NULL, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 0);

    /* the batch form: OK present, ENOTFOUND absent */
    ck_assert_uint_eq(run(s, KVS_STORE_OP_EXISTS, &all, NULL, 0, res), 2);
    const int32_t st[5] = {KVS_OK, KVS_OK, KVS_ENOTFOUND, KVS_OK, KVS_ENOTFOUND};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(res[i].status, st[i]);
    kvs_store_stats stats = stats_of(s);
    ck_assert_uint_ge(stats.exists_keys, 5);
    sapi->close(s);
}
END_TEST

START_TEST(keys_fail_alone_in_their_results) {
    kvs_store *s = open_store("test_store/errors", NULL, NULL, 0, 1 << 20, 0);
    keyset two;
    keys_range(&two, "err-%d", 0, 2);
    uint64_t lens[2] = {5000, 10};
    kvs_store_result res[3];
    put_values(s, &two, lens, 0, res);

    /* a miss, a value larger than its buffers, a hit */
    keyset three;
    int ids[3] = {7, 0, 1};
    keys_init(&three, "err-%d", ids, 3);
    uint8_t miss[16], small[4096], fits[10];
    uint8_t *bufs[3] = {miss, small, fits};
    uint64_t caps[3] = {16, 4096, 10};
    kvs_store_iov iov[3];
    uint64_t seg[4];
    kvs_store_sg sg;
    one_piece_each(bufs, caps, 3, iov, seg, &sg);
    ck_assert_uint_eq(run(s, KVS_STORE_OP_GET, &three, &sg, 0, res), 2);
    ck_assert_int_eq(res[0].status, KVS_ENOTFOUND);
    ck_assert_uint_eq(res[0].tier, KVS_STORE_NO_TIER);
    ck_assert_int_eq(res[1].status, KVS_EOVERFLOW);
    ck_assert_uint_eq(res[1].bytes, 5000);
    ck_assert_int_eq(res[2].status, KVS_OK);
    uint8_t want[10];
    value_of("err-1", 5, want, 10);
    ck_assert_mem_eq(fits, want, 10);

    /* a present key is skipped; with OVERWRITE it is replaced (another length, other bytes) */
    uint64_t other[2] = {5000, 77};
    put_values(s, &two, other, 0, res);
    ck_assert_int_eq(res[1].status, KVS_OK);
    ck_assert_uint_eq(res[1].flags & KVS_STORE_SKIPPED, KVS_STORE_SKIPPED);
    ck_assert_uint_eq(stats_of(s).puts_skipped, 2);
    uint8_t back[128];
    uint8_t *bb[1] = {back};
    uint64_t cap1[1] = {sizeof back};
    keyset one;
    int id1[1] = {1};
    keys_init(&one, "err-%d", id1, 1);
    one_piece_each(bb, cap1, 1, iov, seg, &sg);
    ck_assert_uint_eq(run(s, KVS_STORE_OP_GET, &one, &sg, 0, res), 0);
    ck_assert_uint_eq(res[0].bytes, 10); /* still the first value */
    put_values(s, &two, other, KVS_STORE_OVERWRITE, res);
    ck_assert_int_eq(res[1].status, KVS_OK);
    ck_assert_uint_eq(res[1].flags & KVS_STORE_SKIPPED, 0);
    ck_assert_uint_eq(run(s, KVS_STORE_OP_GET, &one, &sg, 0, res), 0);
    ck_assert_uint_eq(res[0].bytes, 77);
    uint8_t want77[77];
    value_of("err-1", 5, want77, 77);
    ck_assert_mem_eq(back, want77, 77);

    /* remove: then a miss */
    ck_assert_uint_eq(run(s, KVS_STORE_OP_REMOVE, &one, NULL, 0, res), 0);
    ck_assert_uint_eq(run(s, KVS_STORE_OP_GET, &one, &sg, 0, res), 1);
    ck_assert_int_eq(res[0].status, KVS_ENOTFOUND);
    ck_assert_uint_ge(stats_of(s).removes, 1);
    sapi->close(s);
}
END_TEST

/* --- bad arguments ---------------------------------------------------------------------------------- */

START_TEST(bad_arguments_are_einval_and_start_nothing) {
    /* open: no namespace, an empty one, one too long, a tenant too long */
    kvs_store_open_params p = {
        .struct_size = sizeof p, .namespace_bytes = "ns", .namespace_len = 0};
    kvs_store *s = (kvs_store *)&p;
    char err[256] = "";
    ck_assert_int_eq(sapi->open(&p, &s, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_str_ne(err, "");
    p.namespace_len = 2;
    p.namespace_bytes = NULL;
    ck_assert_int_eq(sapi->open(&p, &s, err, sizeof err), KVS_EINVAL);
    static char big[KVS_STORE_NAMESPACE_MAX + 1];
    p.namespace_bytes = big;
    p.namespace_len = sizeof big;
    ck_assert_int_eq(sapi->open(&p, &s, err, sizeof err), KVS_EINVAL);
    p.namespace_len = 2;
    static char tenant[KVS_STORE_TENANT_MAX + 2];
    memset(tenant, 't', KVS_STORE_TENANT_MAX + 1);
    p.tenant = tenant;
    ck_assert_int_eq(sapi->open(&p, &s, err, sizeof err), KVS_EINVAL);
    ck_assert_ptr_null(s);

    s = open_store("test_store/einval", NULL, NULL, 0, 1 << 20, 0);
    uint8_t buf[16] = {0};
    kvs_store_iov iov[2] = {{buf, 8}, {buf + 8, 8}};
    uint64_t seg[2] = {0, 2};
    kvs_store_sg sg = {iov, seg};
    keyset ok;
    keys_range(&ok, "ok-%d", 0, 1);
    uint64_t t = 0;
    /* NULL keys; keys with NULL data or offsets */
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, NULL, &sg, 0, &t), KVS_EINVAL);
    ck_assert_str_ne(sapi->last_error(s), "");
    kvs_store_keys k = {.data = NULL, .offsets = ok.offsets, .n = 1};
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, &k, &sg, 0, &t), KVS_EINVAL);
    /* a key of 0 bytes, one of KEY_MAX + 1 */
    static char long_key[KVS_STORE_KEY_MAX + 1];
    uint64_t off0[2] = {0, 0}, off_long[2] = {0, KVS_STORE_KEY_MAX + 1};
    k = (kvs_store_keys){.data = long_key, .offsets = off0, .n = 1};
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, &k, &sg, 0, &t), KVS_EINVAL);
    k.offsets = off_long;
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, &k, &sg, 0, &t), KVS_EINVAL);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_EXISTS, &k, NULL, 0, &t), KVS_EINVAL);
    /* seg not starting at 0; a get or put without buffers */
    uint64_t seg1[2] = {1, 2};
    kvs_store_sg bad_sg = {iov, seg1};
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, &ok.k, &bad_sg, 0, &t), KVS_EINVAL);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_GET, &ok.k, &bad_sg, 0, &t), KVS_EINVAL);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_GET, &ok.k, NULL, 0, &t), KVS_EINVAL);
    /* unknown ops */
    ck_assert_int_eq(sapi->submit(s, 0, &ok.k, &sg, 0, &t), KVS_EINVAL);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_REMOVE + 1, &ok.k, &sg, 0, &t), KVS_EINVAL);
    /* exists: NULL keys, a bad key */
    uint64_t n_leading = 0;
    ck_assert_int_eq(sapi->exists(s, NULL, 0, 0, NULL, &n_leading), KVS_EINVAL);
    ck_assert_int_eq(sapi->exists(s, &k, 0, 0, NULL, &n_leading), KVS_EINVAL);

    /* nothing started: no batch, no completion on the event fd, nothing to drain, nothing put */
    kvs_store_stats st = stats_of(s);
    ck_assert_uint_eq(st.batches_in_flight, 0);
    ck_assert_uint_eq(st.puts + st.gets + st.exists_keys + st.removes, 0);
    struct pollfd pfd = {.fd = sapi->event_fd(s), .events = POLLIN};
    ck_assert_int_ge(pfd.fd, 0);
    ck_assert_int_eq(poll(&pfd, 1, 0), 0);
    uint64_t tickets[4], n = 9;
    ck_assert_int_eq(sapi->drain(s, tickets, 4, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(sapi->exists(s, &ok.k, 0, 0, NULL, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 0);
    /* and the store still works */
    kvs_store_result r;
    ck_assert_uint_eq(run(s, KVS_STORE_OP_PUT, &ok, &sg, 0, &r), 0);
    sapi->close(s);
}
END_TEST

/* --- tickets ---------------------------------------------------------------------------------------- */

START_TEST(wait_on_an_unknown_or_collected_ticket_is_enotfound) {
    kvs_store *s = open_store("test_store/tickets", NULL, NULL, 0, 1 << 20, 0);
    kvs_store_result r;
    ck_assert_int_eq(sapi->wait(s, 123456789, 0, &r, 1, NULL), KVS_ENOTFOUND);
    ck_assert_int_eq(sapi->wait(s, 0, UINT64_MAX, &r, 1, NULL), KVS_ENOTFOUND);
    keyset ks;
    keys_range(&ks, "t-%d", 0, 1);
    uint64_t t = 0;
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_EXISTS, &ks.k, NULL, 0, &t), KVS_OK);
    uint64_t failed = 0;
    ck_assert_int_eq(sapi->wait(s, t, UINT64_MAX, &r, 1, &failed), KVS_OK);
    ck_assert_uint_eq(failed, 1); /* absent */
    ck_assert_int_eq(sapi->wait(s, t, UINT64_MAX, &r, 1, NULL), KVS_ENOTFOUND);
    /* a batch of no keys completes at once */
    keyset none;
    keys_range(&none, "t-%d", 0, 0);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_EXISTS, &none.k, NULL, 0, &t), KVS_OK);
    ck_assert_int_eq(sapi->wait(s, t, 10000, NULL, 0, &failed), KVS_OK);
    ck_assert_uint_eq(failed, 0);
    sapi->close(s);
}
END_TEST

enum { BIG = 48 << 20 };

START_TEST(a_running_batch_times_out_and_is_kept) {
    kvs_store *s = open_store("test_store/timeout", NULL, NULL, 2, BIG, 0);
    uint8_t *big = malloc(BIG), *out = malloc(BIG);
    ck_assert_ptr_nonnull(big);
    ck_assert_ptr_nonnull(out);
    keyset ks;
    keys_range(&ks, "big-%d", 0, 1);
    value_of(key_at(&ks, 0), key_len(&ks, 0), big, BIG);
    kvs_store_iov iov = {big, BIG};
    uint64_t seg[2] = {0, 1};
    kvs_store_sg sg = {&iov, seg};
    kvs_store_result r;
    ck_assert_uint_eq(run(s, KVS_STORE_OP_PUT, &ks, &sg, 0, &r), 0);
    /* a get of 48 MiB (a copy and a checksum of every byte) is not done the instant it starts */
    iov.base = out;
    uint64_t t = 0;
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_GET, &ks.k, &sg, 0, &t), KVS_OK);
    ck_assert_int_eq(sapi->wait(s, t, 0, &r, 1, NULL), KVS_ETIMEDOUT);
    kvs_store_stats st = stats_of(s);
    ck_assert_uint_eq(st.batches_in_flight, 1);
    ck_assert_int_eq(sapi->wait(s, t, UINT64_MAX, &r, 1, NULL), KVS_OK); /* kept */
    ck_assert_int_eq(r.status, KVS_OK);
    ck_assert_uint_eq(r.bytes, BIG);
    ck_assert_int_eq(memcmp(out, big, BIG), 0);
    ck_assert_uint_eq(stats_of(s).batches_in_flight, 0);
    free(big);
    free(out);
    sapi->close(s);
}
END_TEST

START_TEST(the_event_fd_wakes_a_poller_and_drain_hands_out_each_ticket_once) {
    kvs_store *s = open_store("test_store/eventfd", NULL, NULL, 0, 1 << 20, 0);
    int fd = sapi->event_fd(s);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(sapi->event_fd(s), fd);
    keyset ks;
    keys_range(&ks, "ev-%d", 0, 4);
    uint64_t lens[4] = {10, 20, 30, 40};
    uint8_t *bufs[4];
    kvs_store_iov iov[4];
    uint64_t seg[5];
    kvs_store_sg sg;
    for (int i = 0; i < 4; i++) {
        bufs[i] = malloc(lens[i]);
        value_of(key_at(&ks, i), key_len(&ks, i), bufs[i], lens[i]);
    }
    one_piece_each(bufs, lens, 4, iov, seg, &sg);
    uint64_t t1 = 0, t2 = 0;
    keyset others; /* batches in flight at once are not ordered: the second one puts other keys */
    keys_range(&others, "ev-other-%d", 0, 4);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, &ks.k, &sg, 0, &t1), KVS_OK);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, &others.k, &sg, 0, &t2), KVS_OK);
    ck_assert_uint_ne(t1, t2);
    uint64_t got[8];
    uint64_t n_got = 0;
    for (int rounds = 0; n_got < 2 && rounds < 100; rounds++) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ck_assert_int_eq(poll(&pfd, 1, 10000), 1); /* readable: a batch completed */
        uint64_t n = 0;
        ck_assert_int_eq(sapi->drain(s, got + n_got, 8 - n_got, &n), KVS_OK);
        n_got += n;
    }
    ck_assert_uint_eq(n_got, 2);
    ck_assert_msg((got[0] == t1 && got[1] == t2) || (got[0] == t2 && got[1] == t1),
                  "drained %llu %llu", (unsigned long long)got[0], (unsigned long long)got[1]);
    /* drained once: the fd is reset and a second drain is empty */
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&pfd, 1, 0), 0);
    uint64_t n = 9;
    ck_assert_int_eq(sapi->drain(s, got, 8, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    kvs_store_result r[4];
    ck_assert_int_eq(sapi->wait(s, t1, 0, r, 4, NULL), KVS_OK);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(r[i].status, KVS_OK);
    ck_assert_int_eq(sapi->wait(s, t2, 0, r, 4, NULL), KVS_OK);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(r[i].status, KVS_OK);

    /* more completed tickets than drain's cap: the rest on the next call, the fd readable again */
    uint64_t ts[3];
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_EXISTS, &ks.k, NULL, 0, &ts[i]), KVS_OK);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(sapi->wait(s, ts[i], UINT64_MAX, r, 0, NULL), KVS_OK);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_EXISTS, &ks.k, NULL, 0, &ts[i]), KVS_OK);
    for (int rounds = 0; rounds < 1000 && stats_of(s).batches_in_flight; rounds++) usleep(1000);
    ck_assert_int_eq(sapi->drain(s, got, 2, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(poll(&pfd, 1, 0), 1);
    ck_assert_int_eq(sapi->drain(s, got + 2, 2, &n), KVS_OK);
    ck_assert_uint_eq(n, 1);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(sapi->wait(s, got[i], 0, r, 4, NULL), KVS_OK);
    for (int i = 0; i < 4; i++) free(bufs[i]);
    sapi->close(s);
}
END_TEST

/* drain lists the completed tickets oldest submitted first, whichever completed first: here a
 * small batch submitted after a large one (and done before it, with two threads). */
START_TEST(drain_lists_completed_tickets_oldest_submitted_first) {
    kvs_store *s = open_store("test_store/order", NULL, NULL, 2, BIG, 0);
    uint8_t *big = malloc(BIG), *out = malloc(BIG);
    keyset kbig, ksmall;
    keys_range(&kbig, "big-%d", 0, 1);
    keys_range(&ksmall, "small-%d", 0, 1);
    value_of(key_at(&kbig, 0), key_len(&kbig, 0), big, BIG);
    kvs_store_iov iov = {big, BIG};
    uint64_t seg[2] = {0, 1};
    kvs_store_sg sg = {&iov, seg};
    kvs_store_result r;
    ck_assert_uint_eq(run(s, KVS_STORE_OP_PUT, &kbig, &sg, 0, &r), 0);
    uint64_t drained[4], n = 0;
    ck_assert_int_eq(sapi->drain(s, drained, 4, &n), KVS_OK);
    ck_assert_uint_eq(n, 0); /* collected by wait: never drained */
    iov.base = out;
    uint64_t t_big = 0, t_small = 0;
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_GET, &kbig.k, &sg, 0, &t_big), KVS_OK);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_EXISTS, &ksmall.k, NULL, 0, &t_small), KVS_OK);
    for (int rounds = 0; rounds < 10000 && stats_of(s).batches_in_flight; rounds++) usleep(1000);
    ck_assert_int_eq(sapi->drain(s, drained, 4, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(drained[0], t_big);
    ck_assert_uint_eq(drained[1], t_small);
    ck_assert_int_eq(sapi->wait(s, t_big, 0, &r, 1, NULL), KVS_OK);
    ck_assert_int_eq(r.status, KVS_OK);
    ck_assert_int_eq(memcmp(out, big, BIG), 0);
    ck_assert_int_eq(sapi->wait(s, t_small, 0, &r, 1, NULL), KVS_OK);
    free(big);
    free(out);
    sapi->close(s);
}
END_TEST

START_TEST(close_waits_for_batches_in_flight) {
    kvs_store *s = open_store("test_store/close", NULL, NULL, 2, 8 << 20, 0);
    enum { N = 8, LEN = 4 << 20 };
    keyset ks;
    keys_range(&ks, "cl-%d", 0, N);
    uint8_t *src = malloc((size_t)N * LEN), *dst = malloc((size_t)N * LEN);
    uint8_t *bufs[N], *outs[N];
    uint64_t lens[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = src + (size_t)i * LEN;
        outs[i] = dst + (size_t)i * LEN;
        lens[i] = LEN;
        value_of(key_at(&ks, i), key_len(&ks, i), bufs[i], LEN);
    }
    kvs_store_iov iov[N], oiov[N];
    uint64_t seg[N + 1], oseg[N + 1];
    kvs_store_sg sg, osg;
    one_piece_each(bufs, lens, N, iov, seg, &sg);
    one_piece_each(outs, lens, N, oiov, oseg, &osg);
    uint64_t t[4];
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, &ks.k, &sg, 0, &t[0]), KVS_OK);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_GET, &ks.k, &osg, 0, &t[1]), KVS_OK);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_EXISTS, &ks.k, NULL, 0, &t[2]), KVS_OK);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_REMOVE, &ks.k, NULL, 0, &t[3]), KVS_OK);
    sapi->close(s); /* none collected: close waits for them and drops them (ASAN: no leak) */
    /* the buffers are ours again: nothing writes into them any more */
    memset(dst, 0xAB, (size_t)N * LEN);
    usleep(20000);
    for (size_t i = 0; i < (size_t)N * LEN; i += 4096) ck_assert_uint_eq(dst[i], 0xAB);
    free(src);
    free(dst);
}
END_TEST

/* --- pins and events -------------------------------------------------------------------------------- */

/* Put `count` values of 1 MiB under keys fmt(from..), in batches of 8. */
static void fill(kvs_store *s, const char *fmt, int from, int count) {
    static uint8_t mib[1 << 20];
    for (int b = 0; b < count; b += 8) {
        int n = count - b < 8 ? count - b : 8;
        keyset ks;
        keys_range(&ks, fmt, from + b, n);
        uint8_t *bufs[8];
        uint64_t lens[8];
        kvs_store_iov iov[8];
        uint64_t seg[9];
        kvs_store_sg sg;
        for (int i = 0; i < n; i++) bufs[i] = mib, lens[i] = sizeof mib;
        one_piece_each(bufs, lens, n, iov, seg, &sg);
        kvs_store_result res[8];
        run(s, KVS_STORE_OP_PUT, &ks, &sg, 0, res);
    }
}

START_TEST(pinned_keys_stay_through_evictions_until_unpinned) {
    const char *cfg = write_config(
        "small.yaml", "version: 1\ntiers:\n  - name: dram\n    type: dram\n    capacity: 64MiB\n");
    kvs_store *s = open_store("test_store/pins", NULL, cfg, 0, 1 << 20, 0);
    keyset pinned, control;
    keys_range(&pinned, "pin-%d", 0, 4);
    keys_range(&control, "ctl-%d", 0, 4);
    uint64_t lens[4] = {1000, 2000, 3000, 4000};
    kvs_store_result res[4];
    put_values(s, &control, lens, 0, res);
    put_values(s, &pinned, lens, 0, res);
    uint64_t n_leading = 0;
    ck_assert_int_eq(sapi->exists(s, &pinned.k, 0, 60000, NULL, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 4);
    fill(s, "filler-a-%d", 0, 160); /* 160 MiB through a 64 MiB tier */
    /* the control keys (not pinned, older) are gone; the pinned ones stayed */
    uint8_t states[4];
    ck_assert_int_eq(sapi->exists(s, &control.k, KVS_STORE_ALL, 0, states, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 0);
    uint8_t *outs[4];
    kvs_store_iov iov[4];
    uint64_t seg[5];
    kvs_store_sg sg;
    for (int i = 0; i < 4; i++) outs[i] = malloc(lens[i]);
    one_piece_each(outs, lens, 4, iov, seg, &sg);
    ck_assert_uint_eq(run(s, KVS_STORE_OP_GET, &pinned, &sg, 0, res), 0);
    for (int i = 0; i < 4; i++) {
        uint8_t want[4000];
        value_of(key_at(&pinned, i), key_len(&pinned, i), want, lens[i]);
        ck_assert_int_eq(memcmp(outs[i], want, lens[i]), 0);
        free(outs[i]);
    }
    /* unpinned, they go the way of the others */
    ck_assert_int_eq(sapi->unpin(s, &pinned.k), KVS_OK);
    fill(s, "filler-b-%d", 0, 160);
    ck_assert_int_eq(sapi->exists(s, &pinned.k, KVS_STORE_ALL, 0, states, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 0);
    sapi->close(s);
}
END_TEST

START_TEST(a_put_is_an_event_carrying_the_engine_key) {
    kvs_store *s = open_store("test_store/events", NULL, NULL, 0, 1 << 20, 16);
    keyset ks;
    int ids[2] = {5, 123456};
    keys_init(&ks, "event-key-%d", ids, 2);
    uint64_t lens[2] = {10, 20};
    kvs_store_result res[2];
    put_values(s, &ks, lens, 0, res);
    uint64_t len = 0, n = 0;
    uint8_t tiny[8];
    ck_assert_int_eq(sapi->take_events(s, tiny, sizeof tiny, &len, &n), KVS_EOVERFLOW);
    ck_assert_uint_eq(n, 0);
    _Alignas(8) uint8_t buf[512];
    ck_assert_int_eq(sapi->take_events(s, buf, sizeof buf, &len, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);
    /* the two keys are put by the store's threads at once: their events come in either order */
    uint64_t off = 0;
    int seen[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        ck_assert_uint_le(off + KVS_STORE_EVENT_BYTES, len);
        kvs_store_event e;
        memcpy(&e, buf + off, sizeof e);
        ck_assert_uint_eq(e.kind, KVS_EVENT_STORED);
        ck_assert_uint_eq(e.tier, 0);
        int k = e.key_len == key_len(&ks, 0) ? 0 : 1;
        ck_assert_uint_eq(e.key_len, key_len(&ks, k));
        ck_assert_mem_eq(buf + off + KVS_STORE_EVENT_BYTES, key_at(&ks, k), e.key_len);
        seen[k]++;
        off = (off + KVS_STORE_EVENT_BYTES + e.key_len + 7) & ~7ull;
    }
    ck_assert_int_eq(seen[0], 1);
    ck_assert_int_eq(seen[1], 1);
    ck_assert_uint_ge(len, off - 7);
    ck_assert_int_eq(sapi->take_events(s, buf, sizeof buf, &len, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    sapi->close(s);
}
END_TEST

/* --- threads ---------------------------------------------------------------------------------------- */

enum { STRESS_THREADS = 8, STRESS_BATCHES = 200, STRESS_KEYS = 64 };

typedef struct stress_arg {
    kvs_store *s;
    unsigned seed;
    uint64_t gets_ok, bad_bytes, bad_status;
    char first_error[160];
} stress_arg;

static uint64_t stress_len(int key) {
    return 64 + (uint64_t)key * 211; /* 64 B .. 13 KiB */
}

static void stress_error(stress_arg *a, const char *what, int key, int32_t status) {
    if (!a->first_error[0])
        snprintf(a->first_error, sizeof a->first_error, "%s: key %d status %d", what, key, status);
}

static void *stress_thread(void *p) {
    stress_arg *a = p;
    uint8_t *bufs[8];
    for (int i = 0; i < 8; i++) bufs[i] = malloc(stress_len(STRESS_KEYS - 1));
    for (int b = 0; b < STRESS_BATCHES; b++) {
        int n = 1 + (int)(rand_r(&a->seed) % 8), ids[8];
        for (int i = 0; i < n; i++) ids[i] = (int)(rand_r(&a->seed) % STRESS_KEYS);
        keyset ks;
        keys_init(&ks, "shared-%d", ids, n);
        uint32_t op = KVS_STORE_OP_GET + rand_r(&a->seed) % 4;
        uint32_t flags = op == KVS_STORE_OP_PUT && rand_r(&a->seed) % 2 ? KVS_STORE_OVERWRITE : 0;
        uint64_t lens[8];
        kvs_store_iov iov[8];
        uint64_t seg[9];
        kvs_store_sg sg;
        for (int i = 0; i < n; i++) {
            lens[i] = stress_len(ids[i]);
            if (op == KVS_STORE_OP_PUT)
                value_of(key_at(&ks, i), key_len(&ks, i), bufs[i], lens[i]);
            else
                memset(bufs[i], 0, lens[i]);
        }
        one_piece_each(bufs, lens, n, iov, seg, &sg);
        uint64_t t = 0;
        kvs_store_result res[8];
        if (sapi->submit(a->s, op, &ks.k, op <= KVS_STORE_OP_PUT ? &sg : NULL, flags, &t) !=
                KVS_OK ||
            sapi->wait(a->s, t, UINT64_MAX, res, 8, NULL) != KVS_OK) {
            a->bad_status++;
            stress_error(a, "submit or wait failed", -1, 0);
            continue;
        }
        for (int i = 0; i < n; i++) {
            int32_t st = res[i].status;
            int fine = st == KVS_OK || (op != KVS_STORE_OP_PUT && st == KVS_ENOTFOUND);
            if (!fine) {
                a->bad_status++;
                stress_error(a, "unexpected status", ids[i], st);
                continue;
            }
            if (op == KVS_STORE_OP_GET && st == KVS_OK) {
                uint8_t want[STRESS_KEYS * 211 + 64];
                value_of(key_at(&ks, i), key_len(&ks, i), want, lens[i]);
                a->gets_ok++;
                if (res[i].bytes != lens[i] || memcmp(bufs[i], want, lens[i]) != 0) {
                    a->bad_bytes++;
                    stress_error(a, "bytes differ", ids[i], st);
                }
            }
        }
        if (b % 16 == 0) {
            uint64_t n_leading = 0;
            if (sapi->exists(a->s, &ks.k, 0, 0, NULL, &n_leading) != KVS_OK) a->bad_status++;
        }
    }
    for (int i = 0; i < 8; i++) free(bufs[i]);
    return NULL;
}

START_TEST(eight_threads_of_random_batches_stay_byte_exact) {
    kvs_store *s = open_store("test_store/stress", NULL, NULL, 4, 64 << 10, 0);
    pthread_t th[STRESS_THREADS];
    stress_arg args[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++) {
        args[i] = (stress_arg){.s = s, .seed = 1234u + (unsigned)i * 7919u};
        ck_assert_int_eq(pthread_create(&th[i], NULL, stress_thread, &args[i]), 0);
    }
    uint64_t gets_ok = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(args[i].bad_status == 0 && args[i].bad_bytes == 0,
                      "thread %d: %llu bad statuses, %llu gets with wrong bytes; first: %s", i,
                      (unsigned long long)args[i].bad_status, (unsigned long long)args[i].bad_bytes,
                      args[i].first_error);
        gets_ok += args[i].gets_ok;
    }
    ck_assert_uint_gt(gets_ok, 100); /* the check ran on many hits */
    kvs_store_stats st = stats_of(s);
    ck_assert_uint_eq(st.batches_in_flight, 0);
    ck_assert_uint_eq(st.get_hits, gets_ok);
    sapi->close(s);
}
END_TEST

START_TEST(buffers_whose_lengths_wrap_are_refused_at_submit) {
    kvs_store *s = open_store("test_store/wrap", NULL, NULL, 0, 1 << 20, 0);
    keyset ks;
    keys_range(&ks, "wrap-%d", 0, 1);
    /* 2^64 - 4096 + 4196 wraps to 100 bytes: a put that passed as 100 bytes would copy the first
     * piece's 2^64 - 4096 */
    uint8_t a[8192], b[8192];
    kvs_store_iov iov[2] = {{a, UINT64_MAX - 4095}, {b, 4196}};
    uint64_t seg[2] = {0, 2};
    kvs_store_sg sg = {iov, seg};
    uint64_t t = 0;
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_PUT, &ks.k, &sg, 0, &t), KVS_EINVAL);
    ck_assert_int_eq(sapi->submit(s, KVS_STORE_OP_GET, &ks.k, &sg, 0, &t), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(sapi->last_error(s), "2^64"));
    ck_assert_uint_eq(stats_of(s).puts, 0);
    sapi->close(s);
}
END_TEST

/* Writers overwrite keys with the same bytes while readers read them: DRAM drops an overwritten
 * key's object under a reader's pin and reuses its memory, which a read in place sees change. */
typedef struct race_arg {
    kvs_store *s;
    int writer;
    volatile int *stop;
    uint64_t gets_ok, bad_status, bad_bytes;
} race_arg;

#define RACE_KEYS  8
#define RACE_BYTES (64u << 10)

static void *race_thread(void *p) {
    race_arg *a = p;
    keyset ks;
    keys_range(&ks, "race-%d", 0, RACE_KEYS);
    uint64_t lens[RACE_KEYS];
    uint8_t *bufs[RACE_KEYS];
    for (int i = 0; i < RACE_KEYS; i++) {
        lens[i] = RACE_BYTES;
        bufs[i] = malloc(RACE_BYTES);
        if (a->writer) value_of(key_at(&ks, i), key_len(&ks, i), bufs[i], RACE_BYTES);
    }
    uint8_t *want = malloc(RACE_BYTES);
    kvs_store_iov iov[RACE_KEYS];
    uint64_t seg[RACE_KEYS + 1];
    kvs_store_sg sg;
    one_piece_each(bufs, lens, RACE_KEYS, iov, seg, &sg);
    kvs_store_result res[RACE_KEYS];
    for (int round = 0; round < 1500 && (a->writer || !*a->stop); round++) {
        uint64_t t = 0;
        if (sapi->submit(a->s, a->writer ? KVS_STORE_OP_PUT : KVS_STORE_OP_GET, &ks.k, &sg,
                         a->writer ? KVS_STORE_OVERWRITE : 0, &t) != KVS_OK ||
            sapi->wait(a->s, t, UINT64_MAX, res, RACE_KEYS, NULL) != KVS_OK) {
            a->bad_status++;
            break;
        }
        for (int i = 0; i < RACE_KEYS && !a->writer; i++) {
            if (res[i].status == KVS_ENOTFOUND) continue; /* between an overwrite's two steps */
            if (res[i].status != KVS_OK) {
                a->bad_status++;
                continue;
            }
            value_of(key_at(&ks, i), key_len(&ks, i), want, RACE_BYTES);
            a->bad_bytes += memcmp(bufs[i], want, RACE_BYTES) != 0;
            a->gets_ok++;
        }
        if (a->writer)
            for (int i = 0; i < RACE_KEYS; i++) a->bad_status += res[i].status != KVS_OK;
    }
    for (int i = 0; i < RACE_KEYS; i++) free(bufs[i]);
    free(want);
    return NULL;
}

START_TEST(gets_racing_overwrites_see_whole_values_never_false_damage) {
    kvs_store *s = open_store("test_store/race", NULL, NULL, 4, RACE_BYTES, 0);
    volatile int stop = 0;
    race_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (race_arg){.s = s, .writer = i < 2, .stop = &stop};
        ck_assert_int_eq(pthread_create(&th[i], NULL, race_thread, &args[i]), 0);
    }
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    stop = 1;
    pthread_join(th[2], NULL);
    pthread_join(th[3], NULL);
    uint64_t ok = 0;
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(args[i].bad_status == 0 && args[i].bad_bytes == 0,
                      "thread %d: %llu failed keys (a false KVS_ECORRUPT), %llu wrong values", i,
                      (unsigned long long)args[i].bad_status,
                      (unsigned long long)args[i].bad_bytes);
        ok += args[i].gets_ok;
    }
    ck_assert_uint_gt(ok, 0);
    ck_assert_uint_eq(stats_of(s).corrupt, 0);
    sapi->close(s);
}
END_TEST

START_TEST(puts_the_top_tier_has_no_room_for_go_to_the_next) {
    char cfg_text[1024];
    snprintf(cfg_text, sizeof cfg_text,
             "version: 1\ntiers:\n  - name: dram\n    type: dram\n    capacity: 1MiB\n"
             "  - name: ssd\n    type: ssd\n    capacity: 64MiB\n    paths: [%s/ssd]\n",
             tmpdir);
    const char *cfg = write_config("spill.yaml", cfg_text);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ssd", tmpdir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    /* 60 KiB values: slabs of 64 KiB, 16 in the DRAM tier */
    kvs_store *s = open_store("test_store/spill", NULL, cfg, 0, 60 << 10, 0);
    keyset held, more;
    keys_range(&held, "held-%d", 0, 16);
    keys_range(&more, "more-%d", 0, 8);
    uint64_t lens[16];
    for (int i = 0; i < 16; i++) lens[i] = 60 << 10;
    kvs_store_result res[16];
    put_values(s, &held, lens, 0, res);
    uint64_t n_leading = 0;
    ck_assert_int_eq(sapi->exists(s, &held.k, 0, 60000, NULL, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 16); /* every slab pinned: DRAM can make no room */
    put_values(s, &more, lens, 0, res);
    for (int i = 0; i < 8; i++) {
        ck_assert_msg(res[i].status == KVS_OK, "key %d: %d (%s)", i, res[i].status,
                      sapi->last_error(s));
        ck_assert_uint_eq(res[i].tier, 1);
    }
    /* the SSD tier shows a value once its write is on the device */
    n_leading = 0;
    for (int tries = 0; tries < 200 && n_leading < 8; tries++) {
        ck_assert_int_eq(sapi->exists(s, &more.k, 0, 0, NULL, &n_leading), KVS_OK);
        if (n_leading < 8) usleep(20000);
    }
    ck_assert_uint_eq(n_leading, 8);
    kvs_store_tier_usage u[2];
    u[0].struct_size = u[1].struct_size = sizeof u[0];
    uint32_t n_tiers = 0;
    ck_assert_int_eq(sapi->usage(s, u, 2, &n_tiers), KVS_OK);
    ck_assert_uint_eq(u[1].puts, 8);
    sapi->close(s);
}
END_TEST

START_TEST(a_key_pinned_twice_is_released_by_one_unpin) {
    const char *cfg = write_config(
        "small.yaml", "version: 1\ntiers:\n  - name: dram\n    type: dram\n    capacity: 64MiB\n");
    kvs_store *s = open_store("test_store/pin2", NULL, cfg, 0, 1 << 20, 0);
    keyset pinned;
    keys_range(&pinned, "pin2-%d", 0, 4);
    uint64_t lens[4] = {1000, 2000, 3000, 4000};
    kvs_store_result res[4];
    put_values(s, &pinned, lens, 0, res);
    uint64_t n_leading = 0;
    for (int twice = 0; twice < 2; twice++) {
        ck_assert_int_eq(sapi->exists(s, &pinned.k, 0, 60000, NULL, &n_leading), KVS_OK);
        ck_assert_uint_eq(n_leading, 4);
    }
    ck_assert_int_eq(sapi->unpin(s, &pinned.k), KVS_OK);
    fill(s, "filler-c-%d", 0, 160);
    ck_assert_int_eq(sapi->exists(s, &pinned.k, 0, 0, NULL, &n_leading), KVS_OK);
    ck_assert_uint_eq(n_leading, 0);
    sapi->close(s);
}
END_TEST

START_TEST(a_value_over_this_stores_limit_stays_for_the_stores_that_can_read_it) {
    char cfg_text[1024];
    snprintf(cfg_text, sizeof cfg_text,
             "version: 1\ntiers:\n  - name: ssd\n    type: ssd\n    capacity: 64MiB\n"
             "    paths: [%s/ssd]\n    options:\n      stripe_bytes: 64KiB\n",
             tmpdir);
    const char *cfg = write_config("limits.yaml", cfg_text);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ssd", tmpdir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    keyset ks;
    keys_range(&ks, "big-%d", 0, 1);
    uint64_t len = 300 << 10;
    kvs_store_result res[1];
    kvs_store *a = open_store("test_store/limits", NULL, cfg, 0, 512 << 10, 0);
    put_values(a, &ks, &len, 0, res);
    ck_assert_int_eq(res[0].status, KVS_OK);
    sapi->close(a);
    /* a store with a smaller limit (its SSD tier takes no object over it): the value is not its to
     * read, and not damaged: it stays for the stores that can */
    kvs_store *b = open_store("test_store/limits", NULL, cfg, 0, 64 << 10, 0);
    uint8_t *out = malloc(len);
    kvs_store_iov iov = {out, len};
    uint64_t seg[2] = {0, 1};
    kvs_store_sg sg = {&iov, seg};
    ck_assert_uint_eq(run(b, KVS_STORE_OP_GET, &ks, &sg, 0, res), 1);
    ck_assert_msg(res[0].status == KVS_EOVERFLOW || res[0].status == KVS_ENOTFOUND, "%d",
                  res[0].status);
    ck_assert_uint_eq(stats_of(b).corrupt, 0);
    sapi->close(b);
    a = open_store("test_store/limits", NULL, cfg, 0, 512 << 10, 0);
    ck_assert_uint_eq(run(a, KVS_STORE_OP_GET, &ks, &sg, 0, res), 0);
    uint8_t *want = malloc(len);
    value_of(key_at(&ks, 0), key_len(&ks, 0), want, len);
    ck_assert_int_eq(memcmp(out, want, len), 0);
    free(want);
    free(out);
    sapi->close(a);
}
END_TEST

static Suite *store_suite(void) {
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, values_round_trip_through_scatter_gather_lists);
    tcase_add_test(tc, exists_answers_the_leading_run);
    tcase_add_test(tc, keys_fail_alone_in_their_results);
    tcase_add_test(tc, bad_arguments_are_einval_and_start_nothing);
    tcase_add_test(tc, wait_on_an_unknown_or_collected_ticket_is_enotfound);
    tcase_add_test(tc, a_running_batch_times_out_and_is_kept);
    tcase_add_test(tc, the_event_fd_wakes_a_poller_and_drain_hands_out_each_ticket_once);
    tcase_add_test(tc, close_waits_for_batches_in_flight);
    tcase_add_test(tc, pinned_keys_stay_through_evictions_until_unpinned);
    tcase_add_test(tc, a_put_is_an_event_carrying_the_engine_key);
    tcase_add_test(tc, drain_lists_completed_tickets_oldest_submitted_first);
    tcase_add_test(tc, eight_threads_of_random_batches_stay_byte_exact);
    tcase_add_test(tc, buffers_whose_lengths_wrap_are_refused_at_submit);
    tcase_add_test(tc, gets_racing_overwrites_see_whole_values_never_false_damage);
    tcase_add_test(tc, puts_the_top_tier_has_no_room_for_go_to_the_next);
    tcase_add_test(tc, a_key_pinned_twice_is_released_by_one_unpin);
    tcase_add_test(tc, a_value_over_this_stores_limit_stays_for_the_stores_that_can_read_it);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(store_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
