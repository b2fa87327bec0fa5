/* test_dram.c - the DRAM tier through its backend ops table: one process (test_dram_shared.c has the
 * tiers processes share). */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "tests/support/dram_tier.h"
#include "tests/support/objects.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static const kvs_backend_ops *ops;

/* What on_evict saw. */
typedef struct evict_log {
    int n;
    kvs_key keys[16];
    uint64_t lens[16];
    uint8_t bytes[16][256];
} evict_log;

static void record_evict(void *ctx, const kvs_key *key, const void *object, uint64_t len) {
    evict_log *log = ctx;
    if (log->n >= 16) return;
    log->keys[log->n] = *key;
    log->lens[log->n] = len;
    memcpy(log->bytes[log->n], object, len < 256 ? len : 256);
    log->n++;
}

/* A private tier of n_slabs slabs of 4KiB that records evictions in log. */
static void *open_small(uint64_t n_slabs, evict_log *log, kvs_backend_host *host) {
    memset(host, 0, sizeof *host);
    host->struct_size = sizeof *host;
    host->ctx = log;
    host->on_evict = record_evict;
    void *st = NULL;
    kvs_status rc = kvs_test_dram_open("t0", n_slabs * 4 * KIB, 4 * KIB, NULL, 0, host, &st);
    ck_assert_msg(rc == KVS_OK, "create: %s", kvs_test_dram_error);
    return st;
}

static void setup(void) {
    kvs_test_dram_setup();
    ops = kvs_test_dram_ops;
}

START_TEST(ops_table_declares_its_version_and_capabilities) {
    ck_assert_uint_eq(ops->abi_major, KVS_BACKEND_ABI_MAJOR);
    ck_assert_uint_eq(ops->struct_size, sizeof(kvs_backend_ops));
    ck_assert_str_eq(ops->type_name, "dram");
    ck_assert_uint_eq(ops->caps, KVS_BACKEND_CAP_ZERO_COPY | KVS_BACKEND_CAP_THREAD_SAFE |
                                     KVS_BACKEND_CAP_RESERVE | KVS_BACKEND_CAP_MEMORY |
                                     KVS_BACKEND_CAP_GET_RANGE);
}
END_TEST

START_TEST(get_range_copies_the_bytes_asked_for_and_stops_at_the_end) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(4, &log, &host);
    uint8_t buf[3000], out[4096];
    kvs_test_fill(buf, sizeof buf, 7);
    kvs_key k = kvs_test_key(7);
    ck_assert_int_eq(ops->put(st, &k, buf, sizeof buf), KVS_OK);
    uint64_t got = 0, len = 0;
    memset(out, 0xAB, sizeof out);
    ck_assert_int_eq(ops->get_range(st, &k, 1000, 500, out, &got, &len), KVS_OK);
    ck_assert_uint_eq(got, 500);
    ck_assert_uint_eq(len, sizeof buf);
    ck_assert_mem_eq(out, buf + 1000, 500);
    ck_assert_uint_eq(out[500], 0xAB);
    ck_assert_int_eq(ops->get_range(st, &k, 2900, 4096, out, &got, &len), KVS_OK);
    ck_assert_uint_eq(got, 100);
    ck_assert_mem_eq(out, buf + 2900, 100);
    ck_assert_int_eq(ops->get_range(st, &k, 5000, 10, out, &got, &len), KVS_OK);
    ck_assert_uint_eq(got, 0);
    kvs_key missing = kvs_test_key(8);
    ck_assert_int_eq(ops->get_range(st, &missing, 0, 10, out, &got, &len), KVS_ENOTFOUND);
    ops->destroy(st);
}
END_TEST

START_TEST(put_then_get_returns_the_same_bytes) {
    void *st = NULL;
    ck_assert_int_eq(kvs_test_dram_open("t0", 8 * MIB, MIB + 5, NULL, 0, NULL, &st), KVS_OK);
    uint64_t len = MIB + 5;
    uint8_t *in = malloc(len), *out = malloc(len);
    ck_assert_ptr_nonnull(in);
    ck_assert_ptr_nonnull(out);
    kvs_test_fill(in, len, 42);
    kvs_key k = kvs_test_key(42);
    ck_assert_int_eq(ops->put(st, &k, in, len), KVS_OK);
    memset(out, 0, len);
    uint64_t got = 0;
    ck_assert_int_eq(ops->get(st, &k, out, len, &got), KVS_OK);
    ck_assert_uint_eq(got, len);
    ck_assert(memcmp(in, out, len) == 0);
    uint64_t n_objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 1);
    ck_assert_uint_eq(bytes, len);
    kvs_key missing = kvs_test_key(43);
    ck_assert_int_eq(ops->get(st, &missing, out, len, &got), KVS_ENOTFOUND);
    free(in);
    free(out);
    ops->destroy(st);
}
END_TEST

START_TEST(get_with_a_short_buffer_reports_overflow_and_the_needed_length) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    kvs_test_dram_put(st, 1, 300);
    uint8_t out[100];
    uint64_t got = 0;
    kvs_key k = kvs_test_key(1);
    ck_assert_int_eq(ops->get(st, &k, out, sizeof out, &got), KVS_EOVERFLOW);
    ck_assert_uint_eq(got, 300);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "\"t0\""));
    ops->destroy(st);
}
END_TEST

START_TEST(get_ref_points_at_the_stored_bytes) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(4, &log, &host);
    kvs_test_dram_put(st, 7, 4096);
    kvs_key k = kvs_test_key(7);
    uint64_t n_pinned = 0;
    ck_assert_int_eq(ops->pin(st, &k, 1, 10000, &n_pinned), KVS_OK);
    ck_assert_uint_eq(n_pinned, 1);
    const void *ref = NULL;
    uint64_t len = 0;
    ck_assert_int_eq(ops->get_ref(st, &k, &ref, &len), KVS_OK);
    ck_assert_uint_eq(len, 4096);
    ck_assert(kvs_test_bytes_match(ref, len, 7));
    /* Pinned: filling the tier many times over must not touch these bytes. */
    for (uint32_t i = 100; i < 120; i++) kvs_test_dram_put(st, i, 4096);
    ck_assert(kvs_test_bytes_match(ref, len, 7));
    const void *again = NULL;
    ck_assert_int_eq(ops->get_ref(st, &k, &again, &len), KVS_OK);
    ck_assert_ptr_eq(again, ref);
    ck_assert_int_eq(ops->unpin(st, &k, 1), KVS_OK);
    ops->destroy(st);
}
END_TEST

START_TEST(contains_stops_at_the_first_missing_key) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(8, &log, &host);
    kvs_test_dram_put(st, 0, 10);
    kvs_test_dram_put(st, 1, 10);
    kvs_test_dram_put(st, 3, 10);
    kvs_key keys[4] = {kvs_test_key(0), kvs_test_key(1), kvs_test_key(2), kvs_test_key(3)};
    uint64_t n = 99;
    ck_assert_int_eq(ops->contains(st, keys, 4, &n), KVS_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(ops->contains(st, keys + 2, 2, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(ops->contains(st, keys + 3, 1, &n), KVS_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ops->contains(st, keys, 0, &n), KVS_OK);
    ck_assert_uint_eq(n, 0);
    ops->destroy(st);
}
END_TEST

START_TEST(eviction_drops_the_least_recently_used_and_hands_each_victim_to_on_evict) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(4, &log, &host);
    for (uint32_t i = 0; i < 4; i++) kvs_test_dram_put(st, i, 100 + i);
    ck_assert_int_eq(log.n, 0);
    uint8_t out[4096];
    uint64_t len = 0;
    kvs_key k0 = kvs_test_key(0);
    ck_assert_int_eq(ops->get(st, &k0, out, sizeof out, &len), KVS_OK); /* 0 is now newest */
    uint64_t present = 0;
    kvs_key k1 = kvs_test_key(1);
    ck_assert_int_eq(ops->contains(st, &k1, 1, &present), KVS_OK); /* contains is no use */
    kvs_test_dram_put(st, 4, 50);
    kvs_test_dram_put(st, 5, 60);
    ck_assert_int_eq(log.n, 2);
    kvs_key want1 = kvs_test_key(1), want2 = kvs_test_key(2);
    ck_assert(memcmp(&log.keys[0], &want1, sizeof want1) == 0);
    ck_assert(memcmp(&log.keys[1], &want2, sizeof want2) == 0);
    ck_assert_uint_eq(log.lens[0], 101);
    ck_assert_uint_eq(log.lens[1], 102);
    ck_assert(kvs_test_bytes_match(log.bytes[0], 101, 1));
    ck_assert(kvs_test_bytes_match(log.bytes[1], 102, 2));
    kvs_key order[6] = {kvs_test_key(0), kvs_test_key(3), kvs_test_key(4),
                        kvs_test_key(5), kvs_test_key(1), kvs_test_key(2)};
    ck_assert_int_eq(ops->contains(st, order, 6, &present), KVS_OK);
    ck_assert_uint_eq(present, 4);
    uint64_t n_objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 4);
    ck_assert_uint_eq(bytes, 100 + 103 + 50 + 60);
    ops->destroy(st);
}
END_TEST

START_TEST(pinned_object_is_never_evicted_and_put_fails_when_all_are_pinned) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    kvs_test_dram_put(st, 0, 10);
    kvs_test_dram_put(st, 1, 10);
    kvs_key both[2] = {kvs_test_key(0), kvs_test_key(1)};
    uint64_t n_pinned = 0;
    ck_assert_int_eq(ops->pin(st, both, 2, 60000, &n_pinned), KVS_OK);
    ck_assert_uint_eq(n_pinned, 2);
    uint8_t buf[10] = {0};
    kvs_key k2 = kvs_test_key(2);
    ck_assert_int_eq(ops->put(st, &k2, buf, sizeof buf), KVS_ENOMEM);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "pinned"));
    ck_assert_int_eq(log.n, 0);
    ck_assert_int_eq(ops->unpin(st, &both[0], 1), KVS_OK);
    kvs_test_dram_put(st, 2, 10);
    ck_assert_int_eq(log.n, 1);
    ck_assert(memcmp(&log.keys[0], &both[0], sizeof both[0]) == 0);
    kvs_test_dram_put(st, 3, 10); /* evicts 2, never the pinned 1 */
    uint64_t present = 0;
    ck_assert_int_eq(ops->contains(st, &both[1], 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 1);
    ck_assert_int_eq(log.n, 2);
    ck_assert(memcmp(&log.keys[1], &k2, sizeof k2) == 0);
    ops->destroy(st);
}
END_TEST

START_TEST(pin_stops_at_the_first_missing_key) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(4, &log, &host);
    kvs_test_dram_put(st, 0, 10);
    kvs_test_dram_put(st, 2, 10);
    kvs_key keys[3] = {kvs_test_key(0), kvs_test_key(1), kvs_test_key(2)};
    uint64_t n_pinned = 9;
    ck_assert_int_eq(ops->pin(st, keys, 3, 60000, &n_pinned), KVS_OK);
    ck_assert_uint_eq(n_pinned, 1);
    /* Four more objects in a four-slot tier: only the pinned key 0 survives; 2 was not pinned. */
    for (int i = 3; i < 7; i++) kvs_test_dram_put(st, i, 10);
    uint64_t present = 9;
    ck_assert_int_eq(ops->contains(st, &keys[0], 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 1);
    ck_assert_int_eq(ops->contains(st, &keys[2], 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 0);
    ops->destroy(st);
}
END_TEST

START_TEST(a_pin_expires_when_the_clock_passes_its_timeout_and_the_object_becomes_evictable) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(1, &log, &host);
    kvs_clock clock;
    kvs_clock_init_manual(&clock, kvs_now_ns());
    ck_assert_int_eq(kvs_test_dram_set_clock(st, &clock), KVS_OK);
    kvs_test_dram_put(st, 0, 10);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1);
    uint64_t n_pinned = 0;
    ck_assert_int_eq(ops->pin(st, &k0, 1, 50, &n_pinned), KVS_OK);
    ck_assert_uint_eq(n_pinned, 1);
    uint8_t buf[10] = {0};
    kvs_clock_advance(&clock, 49 * 1000000ull);
    ck_assert_int_eq(ops->put(st, &k1, buf, sizeof buf), KVS_ENOMEM); /* 1 ms left */
    ck_assert_int_eq(log.n, 0);
    kvs_clock_advance(&clock, 1000000ull);
    ck_assert_int_eq(ops->put(st, &k1, buf, sizeof buf), KVS_OK); /* the deadline has passed */
    ck_assert_int_eq(log.n, 1);
    ck_assert(memcmp(&log.keys[0], &k0, sizeof k0) == 0);
    ck_assert_int_eq(ops->unpin(st, &k0, 1), KVS_OK); /* the expired pin's unpin is a no-op */
    ops->destroy(st);
}
END_TEST

/* A reservation its process never committed (the process died) is reclaimed once it is 120 s old,
 * and only when the tier has no other room. */
START_TEST(an_uncommitted_reservation_is_reclaimed_after_120_s_when_nothing_else_is_free) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    kvs_clock clock;
    kvs_clock_init_manual(&clock, kvs_now_ns());
    ck_assert_int_eq(kvs_test_dram_set_clock(st, &clock), KVS_OK);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1), k2 = kvs_test_key(2);
    void *dst = NULL;
    uint64_t stale = 0, ticket = 0, n_pinned = 0;
    ck_assert_int_eq(ops->reserve(st, &k0, 100, &dst, &stale), KVS_OK);
    kvs_test_dram_put(st, 1, 10);
    ck_assert_int_eq(ops->pin(st, &k1, 1, 3600 * 1000, &n_pinned), KVS_OK);
    ck_assert_uint_eq(n_pinned, 1);
    kvs_clock_advance(&clock, 119 * 1000000000ull);
    ck_assert_int_eq(ops->reserve(st, &k2, 100, &dst, &ticket), KVS_ENOMEM);
    kvs_clock_advance(&clock, 1000000000ull + 1);
    ck_assert_int_eq(ops->reserve(st, &k2, 100, &dst, &ticket), KVS_OK);
    ck_assert_int_eq(ops->commit(st, stale), KVS_ENOTFOUND); /* its slab went to k2 */
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "names no reservation"));
    ck_assert_int_eq(ops->commit(st, ticket), KVS_OK);
    uint64_t present = 0;
    ck_assert_int_eq(ops->contains(st, &k2, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 1);
    ck_assert_int_eq(log.n, 0); /* nothing stored was evicted for it */
    ck_assert_int_eq(ops->unpin(st, &k1, 1), KVS_OK);
    ops->destroy(st);
}
END_TEST

START_TEST(nested_pins_need_as_many_unpins) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(1, &log, &host);
    kvs_test_dram_put(st, 0, 10);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1);
    uint64_t n_pinned = 0;
    ck_assert_int_eq(ops->pin(st, &k0, 1, 60000, &n_pinned), KVS_OK);
    ck_assert_int_eq(ops->pin(st, &k0, 1, 60000, &n_pinned), KVS_OK);
    ck_assert_int_eq(ops->unpin(st, &k0, 1), KVS_OK);
    uint8_t buf[10] = {0};
    ck_assert_int_eq(ops->put(st, &k1, buf, sizeof buf), KVS_ENOMEM);
    ck_assert_int_eq(ops->unpin(st, &k0, 1), KVS_OK);
    ck_assert_int_eq(ops->put(st, &k1, buf, sizeof buf), KVS_OK);
    ops->destroy(st);
}
END_TEST

START_TEST(double_unpin_is_harmless_and_the_next_pin_still_pairs_with_its_unpin) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(1, &log, &host);
    kvs_test_dram_put(st, 0, 10);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1), absent = kvs_test_key(77);
    uint64_t n_pinned = 0;
    ck_assert_int_eq(ops->pin(st, &k0, 1, 60000, &n_pinned), KVS_OK);
    ck_assert_int_eq(ops->unpin(st, &k0, 1), KVS_OK);
    ck_assert_int_eq(ops->unpin(st, &k0, 1), KVS_OK);
    ck_assert_int_eq(ops->unpin(st, &absent, 1), KVS_OK);
    ck_assert_int_eq(ops->pin(st, &k0, 1, 60000, &n_pinned), KVS_OK);
    ck_assert_uint_eq(n_pinned, 1);
    uint8_t buf[10] = {0};
    ck_assert_int_eq(ops->put(st, &k1, buf, sizeof buf), KVS_ENOMEM); /* the pin holds */
    ck_assert_int_eq(ops->unpin(st, &k0, 1), KVS_OK);
    ck_assert_int_eq(ops->put(st, &k1, buf, sizeof buf), KVS_OK); /* and one unpin releases */
    ops->destroy(st);
}
END_TEST

START_TEST(put_of_an_existing_key_replaces_its_bytes) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    kvs_key k = kvs_test_key(5);
    uint8_t a[300], b[200], out[4096];
    kvs_test_fill(a, sizeof a, 1);
    kvs_test_fill(b, sizeof b, 2);
    ck_assert_int_eq(ops->put(st, &k, a, sizeof a), KVS_OK);
    ck_assert_int_eq(ops->put(st, &k, b, sizeof b), KVS_OK);
    uint64_t len = 0;
    ck_assert_int_eq(ops->get(st, &k, out, sizeof out, &len), KVS_OK);
    ck_assert_uint_eq(len, sizeof b);
    ck_assert(kvs_test_bytes_match(out, len, 2));
    uint64_t n_objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 1);
    ck_assert_uint_eq(bytes, sizeof b);
    ck_assert_int_eq(log.n, 0); /* a replace is not an eviction */
    ops->destroy(st);
}
END_TEST

START_TEST(put_over_a_pinned_key_keeps_the_stored_bytes) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    kvs_test_dram_put(st, 5, 300);
    kvs_key k = kvs_test_key(5);
    uint64_t n_pinned = 0;
    ck_assert_int_eq(ops->pin(st, &k, 1, 60000, &n_pinned), KVS_OK);
    uint8_t other[20] = {0}, out[4096];
    ck_assert_int_eq(ops->put(st, &k, other, sizeof other), KVS_OK);
    uint64_t len = 0;
    ck_assert_int_eq(ops->get(st, &k, out, sizeof out, &len), KVS_OK);
    ck_assert_uint_eq(len, 300);
    ck_assert(kvs_test_bytes_match(out, len, 5));
    ops->destroy(st);
}
END_TEST

/* In-place writes: invisible until commit, never evicted while reserved, gone on abort; a ticket
 * is good for one commit or abort only. */
START_TEST(reserved_room_is_invisible_until_commit_and_survives_eviction) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    kvs_key k0 = kvs_test_key(0);
    void *dst = NULL;
    uint64_t ticket = 0, present = 1;
    ck_assert_int_eq(ops->reserve(st, &k0, 100, &dst, &ticket), KVS_OK);
    kvs_test_fill(dst, 100, 0);
    ck_assert_int_eq(ops->contains(st, &k0, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 0);
    kvs_test_dram_put(st, 1, 10);
    kvs_test_dram_put(st, 2, 10); /* evicts 1: the reservation holds the other slab */
    kvs_test_dram_put(st, 3, 10);
    ck_assert_int_eq(log.n, 2);
    kvs_key k1 = kvs_test_key(1);
    ck_assert(memcmp(&log.keys[0], &k1, sizeof k1) == 0);
    ck_assert(kvs_test_bytes_match(dst, 100, 0));
    ck_assert_int_eq(ops->commit(st, ticket), KVS_OK);
    ck_assert_int_eq(ops->contains(st, &k0, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 1);
    uint8_t buf[4096];
    uint64_t len = 0;
    ck_assert_int_eq(ops->get(st, &k0, buf, sizeof buf, &len), KVS_OK);
    ck_assert_uint_eq(len, 100);
    ck_assert(kvs_test_bytes_match(buf, 100, 0));
    ck_assert_int_eq(ops->commit(st, ticket), KVS_ENOTFOUND); /* used up */
    ck_assert_int_eq(ops->abort(st, ticket), KVS_OK);         /* and harmless */
    ck_assert_int_eq(ops->contains(st, &k0, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 1);

    kvs_key k9 = kvs_test_key(9);
    ck_assert_int_eq(ops->reserve(st, &k9, 100, &dst, &ticket), KVS_OK);
    ck_assert_int_eq(ops->abort(st, ticket), KVS_OK);
    ck_assert_int_eq(ops->contains(st, &k9, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 0);
    ck_assert_int_eq(ops->commit(st, ticket), KVS_ENOTFOUND);
    uint64_t n_objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 1); /* the reservation for 9 evicted 3, the LRU object */
    ck_assert_int_eq(log.n, 3);

    void *base = NULL;
    uint64_t span = 0;
    ck_assert_int_eq(ops->memory(st, &base, &span), KVS_OK);
    ck_assert_uint_ge(span, 2 * 4 * KIB);
    ops->destroy(st);
}
END_TEST

/* When every slab is pinned or reserved, reserve fails like put, and nothing leaks. */
START_TEST(reserve_fails_cleanly_when_everything_is_pinned) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    kvs_test_dram_put(st, 0, 10);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1);
    uint64_t n_pinned = 0, ticket = 0;
    ck_assert_int_eq(ops->pin(st, &k0, 1, 60000, &n_pinned), KVS_OK);
    void *dst = NULL;
    ck_assert_int_eq(ops->reserve(st, &k1, 10, &dst, &ticket), KVS_OK);
    kvs_key k2 = kvs_test_key(2);
    uint64_t t2 = 0;
    ck_assert_int_eq(ops->reserve(st, &k2, 10, &dst, &t2), KVS_ENOMEM);
    ck_assert_int_eq(ops->reserve(st, &k2, 8 * KIB, &dst, &t2),
                     KVS_EINVAL); /* over max object size */
    ck_assert_int_eq(ops->abort(st, ticket), KVS_OK);
    ck_assert_int_eq(ops->reserve(st, &k2, 10, &dst, &t2), KVS_OK);
    ck_assert_int_eq(ops->commit(st, t2), KVS_OK);
    ck_assert_int_eq(log.n, 0);
    ops->destroy(st);
}
END_TEST

START_TEST(remove_frees_the_object_even_while_it_is_pinned) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    kvs_test_dram_put(st, 0, 10);
    kvs_test_dram_put(st, 1, 20);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1), absent = kvs_test_key(9);
    ck_assert_int_eq(ops->remove(st, &k0), KVS_OK);
    ck_assert_int_eq(ops->remove(st, &absent), KVS_OK);
    uint64_t present = 9, n_objects = 0, bytes = 0, n_pinned = 0;
    ck_assert_int_eq(ops->contains(st, &k0, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 0);
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 1);
    ck_assert_uint_eq(bytes, 20);
    kvs_test_dram_put(st, 2, 10); /* the freed slab is used without evicting 1 */
    ck_assert_int_eq(log.n, 0);
    ck_assert_int_eq(ops->pin(st, &k1, 1, 60000, &n_pinned), KVS_OK);
    ck_assert_int_eq(ops->remove(st, &k1), KVS_OK); /* forced: a corrupt object must go */
    ck_assert_int_eq(ops->contains(st, &k1, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 0);
    ck_assert_int_eq(ops->unpin(st, &k1, 1), KVS_OK); /* the stale pin is a harmless no-op */
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 1);
    ops->destroy(st);
}
END_TEST

START_TEST(put_larger_than_the_max_object_size_is_refused) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(2, &log, &host);
    uint8_t *big = calloc(1, 4097);
    ck_assert_ptr_nonnull(big);
    kvs_key k = kvs_test_key(1);
    ck_assert_int_eq(ops->put(st, &k, big, 4097), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "larger than"));
    ck_assert_int_eq(ops->put(st, &k, big, 4096), KVS_OK);
    free(big);
    ops->destroy(st);
}
END_TEST

START_TEST(capacity_too_small_for_one_object_is_refused_with_a_sentence) {
    void *st = (void *)1;
    ck_assert_int_eq(kvs_test_dram_open("x", MIB, 4 * MIB, NULL, 0, NULL, &st), KVS_ECONFIG);
    ck_assert_ptr_null(st);
    ck_assert_str_eq(kvs_test_dram_error, "dram tier \"x\": capacity 1MiB holds no object of 4MiB");
    ck_assert_int_ne(kvs_test_dram_open("x", MIB, 0, NULL, 0, NULL, &st), KVS_OK);
    ck_assert_ptr_nonnull(strstr(kvs_test_dram_error, "dram tier \"x\""));
    ck_assert_int_ne(kvs_test_dram_open("x", 0, 4096, NULL, 0, NULL, &st), KVS_OK);
    ck_assert_ptr_nonnull(strstr(kvs_test_dram_error, "capacity"));
}
END_TEST

START_TEST(unknown_option_is_refused_with_the_valid_ones_listed) {
    kvs_backend_option opt = {"shm_nmae", "abc"};
    void *st = NULL;
    ck_assert_int_eq(kvs_test_dram_open("x", MIB, 4096, &opt, 1, NULL, &st), KVS_ECONFIG);
    ck_assert_ptr_null(st);
    ck_assert_ptr_nonnull(strstr(kvs_test_dram_error, "\"shm_nmae\""));
    ck_assert_ptr_nonnull(strstr(kvs_test_dram_error, "valid options: shm_name"));
}
END_TEST

/* read_bandwidth and read_latency_us pace reads back to back (a slower device for benchmarks). */
START_TEST(paced_reads_take_at_least_their_modelled_time) {
    kvs_backend_option opts[] = {{"read_bandwidth", "1MiB"}, {"read_latency_us", "10000"}};
    void *st = NULL;
    ck_assert_msg(kvs_test_dram_open("slow", MIB, 64 * KIB, opts, 2, NULL, &st) == KVS_OK, "%s",
                  kvs_test_dram_error);
    static uint8_t buf[64 * KIB], out[64 * KIB];
    kvs_test_fill(buf, sizeof buf, 5);
    kvs_key k = kvs_test_key(5);
    ck_assert_int_eq(ops->put(st, &k, buf, sizeof buf), KVS_OK);
    uint64_t t0 = kvs_now_ns();
    for (int i = 0; i < 3; i++) {
        uint64_t len = 0;
        ck_assert_int_eq(ops->get(st, &k, out, sizeof out, &len), KVS_OK);
        ck_assert_mem_eq(out, buf, sizeof buf);
    }
    double ms = (double)(kvs_now_ns() - t0) / 1e6;
    ck_assert_msg(ms >= 3 * (10.0 + 62.5) - 1, "3 paced reads of 64 KiB took %.1f ms",
                  ms); /* 64 KiB at 1 MiB/s */
    ops->destroy(st);
    /* a rate is a size per second, and a bare size is one too */
    static const char *const rates[] = {"1MiB/s", "1MiB", "1.5 GB/s", "4096"};
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        kvs_backend_option opt = {"read_bandwidth", rates[i]};
        st = NULL;
        ck_assert_msg(kvs_test_dram_open("x", MIB, 4096, &opt, 1, NULL, &st) == KVS_OK, "%s: %s",
                      rates[i], kvs_test_dram_error);
        ops->destroy(st);
    }
    const char *bad[][3] = {
        {"read_bandwidth", "fast", "read_bandwidth \"fast\" is not a rate such as 200MiB/s"},
        {"read_bandwidth", "0", "read_bandwidth \"0\" is not a rate such as 200MiB/s"},
        {"read_bandwidth", "4Mb/s", "unknown unit 'Mb'"},
        {"read_latency_us", "-1", "read_latency_us \"-1\" is not a whole number of microseconds"},
        {"read_latency_us", "1e3", "read_latency_us \"1e3\" is not a whole number"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvs_backend_option opt = {bad[i][0], bad[i][1]};
        st = NULL;
        ck_assert_int_eq(kvs_test_dram_open("x", MIB, 4096, &opt, 1, NULL, &st), KVS_ECONFIG);
        ck_assert_ptr_null(st);
        ck_assert_msg(strstr(kvs_test_dram_error, bad[i][2]) != NULL, "%s", kvs_test_dram_error);
        ck_assert_msg(strncmp(kvs_test_dram_error, "dram tier \"x\": ", 15) == 0, "%s",
                      kvs_test_dram_error);
    }
}
END_TEST

START_TEST(invalid_shm_names_are_refused) {
    char long_name[260];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    const char *bad[] = {"", "a/b", "..", "sp ace", long_name};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvs_backend_option opt = {"shm_name", bad[i]};
        void *st = NULL;
        ck_assert_int_eq(kvs_test_dram_open("x", MIB, 4096, &opt, 1, NULL, &st), KVS_ECONFIG);
        ck_assert_ptr_nonnull(strstr(kvs_test_dram_error, "not a valid name"));
    }
}
END_TEST

/* Random puts and removes (no eviction) against a plain array: exercises probing and backward-shift
 * deletion through every collision pattern a 64-bucket index produces. */
START_TEST(index_agrees_with_a_model_under_random_puts_and_removes) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(32, &log, &host);
    enum { KEYS = 100 };
    uint64_t model_len[KEYS] = {0};
    int present[KEYS] = {0};
    int live = 0;
    uint32_t rng = 12345;
    uint8_t out[4096];
    for (int step = 0; step < 20000; step++) {
        rng = rng * 1103515245u + 12345u;
        uint32_t i = (rng >> 8) % KEYS;
        kvs_key k = kvs_test_key(i);
        if ((rng >> 20) % 3 != 0) {
            if (!present[i] && live == 32) continue;
            uint64_t len = 1 + (rng >> 4) % 4000;
            kvs_test_dram_put(st, i, len);
            if (!present[i]) live++;
            present[i] = 1;
            model_len[i] = len;
        } else {
            ck_assert_int_eq(ops->remove(st, &k), KVS_OK);
            if (present[i]) live--;
            present[i] = 0;
        }
        if (step % 97 == 0) {
            for (uint32_t j = 0; j < KEYS; j++) {
                kvs_key kj = kvs_test_key(j);
                uint64_t len = 0;
                kvs_status rc = ops->get(st, &kj, out, sizeof out, &len);
                ck_assert_int_eq(rc, present[j] ? KVS_OK : KVS_ENOTFOUND);
                if (present[j]) {
                    ck_assert_uint_eq(len, model_len[j]);
                    ck_assert(kvs_test_bytes_match(out, len, j));
                }
            }
        }
    }
    ck_assert_int_eq(log.n, 0);
    uint64_t n_objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, (uint64_t)live);
    ops->destroy(st);
}
END_TEST

typedef struct worker_arg {
    void *st;
    uint32_t seed;
    int bad;
} worker_arg;

/* Objects of key i always carry the bytes of seed i, so any read of other bytes is corruption.
 * remove is forced even under pins, so pinned zero-copy reads use even keys, removals odd ones. */
static void *hammer(void *p) {
    worker_arg *w = p;
    uint8_t buf[4096];
    uint32_t rng = w->seed;
    for (int step = 0; step < 3000; step++) {
        rng = rng * 1103515245u + 12345u;
        uint32_t i = (rng >> 8) % 64;
        kvs_key k = kvs_test_key(i);
        uint64_t len = 1000 + i * 10;
        switch ((rng >> 20) % 4) {
            case 0:
                kvs_test_fill(buf, len, i);
                if (ops->put(w->st, &k, buf, len) != KVS_OK) w->bad++;
                break;
            case 1: {
                uint64_t got = 0;
                kvs_status rc = ops->get(w->st, &k, buf, sizeof buf, &got);
                if (rc == KVS_OK && (got != len || !kvs_test_bytes_match(buf, got, i))) w->bad++;
                break;
            }
            case 2: {
                uint64_t n_pinned = 0, got = 0;
                const void *ref = NULL;
                k = kvs_test_key(i & ~1u);
                len = 1000 + (i & ~1u) * 10;
                if (ops->pin(w->st, &k, 1, 60000, &n_pinned) != KVS_OK) w->bad++;
                if (n_pinned == 1) {
                    if (ops->get_ref(w->st, &k, &ref, &got) != KVS_OK)
                        w->bad++;
                    else if (got != len || !kvs_test_bytes_match(ref, got, i & ~1u))
                        w->bad++;
                    if (ops->unpin(w->st, &k, 1) != KVS_OK) w->bad++;
                }
                break;
            }
            default:
                k = kvs_test_key(i | 1u);
                if (ops->remove(w->st, &k) != KVS_OK) w->bad++;
                break;
        }
    }
    return NULL;
}

START_TEST(threads_sharing_one_tier_never_see_torn_or_foreign_bytes) {
    evict_log log = {0};
    kvs_backend_host host;
    void *st = open_small(16, &log, &host); /* on_evict runs under the tier lock: log is safe */
    pthread_t threads[4];
    worker_arg args[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (worker_arg){st, (uint32_t)(t * 7919 + 1), 0};
        ck_assert_int_eq(pthread_create(&threads[t], NULL, hammer, &args[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        ck_assert_int_eq(pthread_join(threads[t], NULL), 0);
        ck_assert_int_eq(args[t].bad, 0);
    }
    ops->destroy(st);
}
END_TEST

static Suite *dram_suite(void) {
    Suite *s = suite_create("dram");
    TCase *local = tcase_create("private");
    tcase_add_checked_fixture(local, setup, kvs_test_dram_teardown);
    tcase_add_test(local, ops_table_declares_its_version_and_capabilities);
    tcase_add_test(local, get_range_copies_the_bytes_asked_for_and_stops_at_the_end);
    tcase_add_test(local, put_then_get_returns_the_same_bytes);
    tcase_add_test(local, get_with_a_short_buffer_reports_overflow_and_the_needed_length);
    tcase_add_test(local, get_ref_points_at_the_stored_bytes);
    tcase_add_test(local, contains_stops_at_the_first_missing_key);
    tcase_add_test(local, eviction_drops_the_least_recently_used_and_hands_each_victim_to_on_evict);
    tcase_add_test(local, pinned_object_is_never_evicted_and_put_fails_when_all_are_pinned);
    tcase_add_test(local, pin_stops_at_the_first_missing_key);
    tcase_add_test(
        local, a_pin_expires_when_the_clock_passes_its_timeout_and_the_object_becomes_evictable);
    tcase_add_test(local,
                   an_uncommitted_reservation_is_reclaimed_after_120_s_when_nothing_else_is_free);
    tcase_add_test(local, nested_pins_need_as_many_unpins);
    tcase_add_test(local, double_unpin_is_harmless_and_the_next_pin_still_pairs_with_its_unpin);
    tcase_add_test(local, put_of_an_existing_key_replaces_its_bytes);
    tcase_add_test(local, put_over_a_pinned_key_keeps_the_stored_bytes);
    tcase_add_test(local, reserved_room_is_invisible_until_commit_and_survives_eviction);
    tcase_add_test(local, reserve_fails_cleanly_when_everything_is_pinned);
    tcase_add_test(local, remove_frees_the_object_even_while_it_is_pinned);
    tcase_add_test(local, put_larger_than_the_max_object_size_is_refused);
    tcase_add_test(local, capacity_too_small_for_one_object_is_refused_with_a_sentence);
    tcase_add_test(local, unknown_option_is_refused_with_the_valid_ones_listed);
    tcase_add_test(local, invalid_shm_names_are_refused);
    tcase_add_test(local, paced_reads_take_at_least_their_modelled_time);
    tcase_add_test(local, index_agrees_with_a_model_under_random_puts_and_removes);
    tcase_add_test(local, threads_sharing_one_tier_never_see_torn_or_foreign_bytes);
    suite_add_tcase(s, local);

    return s;
}

int main(void) {
    SRunner *runner = srunner_create(dram_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
