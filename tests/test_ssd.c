/* test_ssd.c - the built-in SSD tier through its backend ops table, on files in temporary
 * directories (each directory stands for one device): round trips, placement, engines, pacing,
 * eviction, pins, options, threads (test_ssd_recovery.c has restarts and failures). */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backends/ssd/ssd.h"
#include "backends/ssd/ssd_place.h"
#include "common/clock.h"
#include "tests/support/objects.h"
#include "tests/support/ssd_tier.h"
#include "tests/support/test_support.h"
#include "tests/support/wait.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static const kvs_backend_ops *ops;

static double seconds_since(uint64_t t0_ns) {
    return (double)(kvs_now_ns() - t0_ns) / 1e9;
}

static void setup(void) {
    kvs_test_ssd_setup();
    ops = kvs_ssd_backend();
}

/* ---- the table and basic round trips --------------------------------------------------------- */

START_TEST(ops_table_declares_its_version_and_capabilities) {
    ck_assert_uint_eq(ops->abi_major, KVS_BACKEND_ABI_MAJOR);
    ck_assert_uint_eq(ops->struct_size, sizeof(kvs_backend_ops));
    ck_assert_str_eq(ops->type_name, "ssd");
    ck_assert_uint_eq(ops->caps, KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_GET_MANY |
                                     KVS_BACKEND_CAP_GET_RANGE | KVS_BACKEND_CAP_GET_MANY_ASYNC |
                                     KVS_BACKEND_CAP_STRIPED);
    ck_assert_ptr_nonnull(ops->get_many);
    ck_assert_ptr_nonnull(ops->get_many_start);
    ck_assert_ptr_nonnull(ops->get_many_finish);
    ck_assert_ptr_nonnull(ops->get_range);
    ck_assert_ptr_null(ops->get_ref);
}
END_TEST

/* Lengths around every boundary (kvs_test_ssd_lengths): empty, sub-block, block, stripe, stripe + 1,
 * the maximum. */
START_TEST(put_then_get_is_byte_exact_over_1_2_and_4_paths) {
    static const uint32_t path_counts[] = {1, 2, 4};
    for (int c = 0; c < 3; c++) {
        kvs_test_dirs d;
        kvs_test_ssd_dirs(&d);
        kvs_test_ssd_args a = {.n_paths = path_counts[c],
                               .capacity = 8 * MIB,
                               .max_object = 64 * KIB,
                               .options = {{"stripe_bytes", "16KiB"}}};
        void *st = kvs_test_ssd_open(&d, &a);
        for (uint32_t i = 0; i < KVS_TEST_SSD_N_LENGTHS; i++)
            kvs_test_ssd_put(st, i, kvs_test_ssd_lengths[i]);
        kvs_test_ssd_flush(st);
        for (uint32_t i = 0; i < KVS_TEST_SSD_N_LENGTHS; i++)
            ck_assert_msg(kvs_test_ssd_get(st, i, kvs_test_ssd_lengths[i]) == KVS_OK,
                          "%u paths, object %u: %s", path_counts[c], i, ops->last_error(st));
        uint64_t n_objects = 0, bytes = 0, want_bytes = 0;
        for (uint32_t i = 0; i < KVS_TEST_SSD_N_LENGTHS; i++) want_bytes += kvs_test_ssd_lengths[i];
        ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
        ck_assert_uint_eq(n_objects, KVS_TEST_SSD_N_LENGTHS);
        ck_assert_uint_eq(bytes, want_bytes);
        kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
        ck_assert_uint_eq(s.n_paths, path_counts[c]);
        ck_assert_uint_eq(s.failed_paths, 0);
        ops->destroy(st);
        kvs_test_rmtree(d.root);
    }
}
END_TEST

START_TEST(an_object_is_invisible_until_its_writes_complete) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    /* 64KiB at 2MB/s: the write takes about 35 ms, long enough to look before it lands */
    kvs_test_ssd_args a = {.n_paths = 1,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"sim_bandwidth", "2MB/s"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    kvs_test_ssd_put(st, 1, 64 * KIB);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1), 0);
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 64 * KIB), KVS_ENOTFOUND);
    ck_assert_uint_ge(kvs_test_ssd_stats(st).writes_pending, 1);
    kvs_test_ssd_flush(st);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1), 1);
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(units_are_striped_over_every_path) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 4,
                           .capacity = 16 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    uint64_t superblocks = kvs_test_ssd_stats(st).writes;
    ck_assert_uint_eq(superblocks, 4);
    for (uint32_t i = 0; i < 10; i++) kvs_test_ssd_put(st, i, 64 * KIB); /* 4 units each */
    kvs_test_ssd_put(st, 10, 20 * KIB);                                  /* 2 units */
    kvs_test_ssd_flush(st);
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    uint64_t total = 0;
    for (uint32_t p = 0; p < 4; p++) {
        total += s.paths[p].units;
        ck_assert_uint_ge(s.paths[p].units, 10); /* every 4-unit object put one unit on each path */
        ck_assert_uint_le(s.paths[p].units, 11);
        ck_assert_uint_ge(s.paths[p].writes, 11);
    }
    ck_assert_uint_eq(total, 42);
    ck_assert_uint_eq(s.writes - superblocks, 42);
    for (uint32_t i = 0; i < 11; i++)
        ck_assert_int_eq(kvs_test_ssd_get(st, i, i < 10 ? 64 * KIB : 20 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(get_reports_overflow_and_absence_with_sentences) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 2, .capacity = 4 * MIB, .max_object = 64 * KIB};
    void *st = kvs_test_ssd_open(&d, &a);
    kvs_test_ssd_put(st, 1, 10000);
    kvs_test_ssd_flush(st);
    uint8_t *buf = kvs_test_aligned_buffer(8192);
    uint64_t len = 0;
    kvs_key k = kvs_test_key(1), missing = kvs_test_key(99);
    ck_assert_int_eq(ops->get(st, &k, buf, 8192, &len), KVS_EOVERFLOW);
    ck_assert_uint_eq(len, 10000);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "does not fit"));
    ck_assert_int_eq(ops->get(st, &missing, buf, 8192, &len), KVS_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "ssd tier \"ssd0\": object not stored"));
    uint8_t too_big[1];
    ck_assert_int_eq(ops->put(st, &k, too_big, 64 * KIB + 1), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "larger than the tier's max object size"));
    free(buf);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(unaligned_buffers_read_through_a_bounce_buffer) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    kvs_test_ssd_put(st, 3, 50000);
    kvs_test_ssd_flush(st);
    uint8_t *raw = kvs_test_aligned_buffer(64 * KIB + 4096);
    uint64_t len = 0;
    kvs_key k = kvs_test_key(3);
    ck_assert_int_eq(ops->get(st, &k, raw + 1, 50000, &len),
                     KVS_OK); /* misaligned and exactly len */
    ck_assert_uint_eq(len, 50000);
    ck_assert(kvs_test_bytes_match(raw + 1, len, 3));
    ck_assert_uint_eq(kvs_test_ssd_stats(st).bounce_reads, 4);
    /* aligned, but cap is the length: only the last unit, whose read is rounded up, bounces */
    ck_assert_int_eq(ops->get(st, &k, raw, 50000, &len), KVS_OK);
    ck_assert(kvs_test_bytes_match(raw, len, 3));
    ck_assert_uint_eq(kvs_test_ssd_stats(st).bounce_reads, 5);
    free(raw);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(reads_into_the_staging_pool_use_registered_buffers) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    uint64_t pool_len = 2 * MIB;
    uint8_t *pool =
        mmap(NULL, pool_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(pool, MAP_FAILED);
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .staging = pool,
                           .staging_len = pool_len,
                           .options = {{"stripe_bytes", "16KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 4; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
    kvs_key keys[4];
    void *dsts[4];
    uint64_t caps[4], lens[4];
    kvs_status statuses[4];
    for (uint32_t i = 0; i < 4; i++) {
        keys[i] = kvs_test_key(i);
        dsts[i] = pool + i * 64 * KIB;
        caps[i] = 64 * KIB;
    }
    ck_assert_int_eq(ops->get_many(st, keys, dsts, caps, 4, lens, statuses), KVS_OK);
    for (uint32_t i = 0; i < 4; i++) {
        ck_assert_int_eq(statuses[i], KVS_OK);
        ck_assert(kvs_test_bytes_match(dsts[i], lens[i], i));
    }
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    if (s.paths[0].uring) ck_assert_uint_eq(s.fixed_reads, 16);
    ck_assert_uint_eq(s.bounce_reads, 0);
    ops->destroy(st);
    ck_assert_int_eq(munmap(pool, pool_len), 0);
    kvs_test_rmtree(d.root);
}
END_TEST

/* ---- get_many, placement and scheduling policies --------------------------------------------- */

START_TEST(get_many_merges_equal_keys_and_reports_each_object) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 4,
                           .capacity = 16 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 16; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
    enum { N = 20 };
    kvs_key keys[N];
    void *dsts[N];
    uint64_t caps[N], lens[N];
    kvs_status statuses[N];
    for (uint32_t i = 0; i < N; i++) {
        uint32_t id = i < 16 ? i : i == 16 ? 3 : i == 17 ? 5 : i == 18 ? 999 : 7;
        keys[i] = kvs_test_key(id);
        dsts[i] = kvs_test_aligned_buffer(64 * KIB);
        caps[i] = i == 19 ? 1000 : 64 * KIB;
    }
    kvs_ssd_stats_t before = kvs_test_ssd_stats(st);
    ck_assert_int_eq(ops->get_many(st, keys, dsts, caps, N, lens, statuses), KVS_OK);
    kvs_ssd_stats_t after = kvs_test_ssd_stats(st);
    for (uint32_t i = 0; i < 18; i++) {
        uint32_t id = i < 16 ? i : i == 16 ? 3 : 5;
        ck_assert_int_eq(statuses[i], KVS_OK);
        ck_assert_uint_eq(lens[i], 64 * KIB);
        ck_assert_msg(kvs_test_bytes_match(dsts[i], lens[i], id), "item %u", i);
    }
    ck_assert_int_eq(statuses[18], KVS_ENOTFOUND);
    ck_assert_int_eq(statuses[19], KVS_EOVERFLOW);
    ck_assert_uint_eq(lens[19], 64 * KIB);
    /* 16 distinct objects of 4 units: the duplicates cost no I/O */
    ck_assert_uint_eq(after.reads - before.reads, 64);
    if (after.paths[0]
            .uring) /* each ring got its share as one batch: one io_uring_enter per path */
        ck_assert_uint_le(after.submits - before.submits, 4);
    else
        ck_assert_uint_eq(after.submits - before.submits, 64);
    for (uint32_t i = 0; i < N; i++) free(dsts[i]);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

typedef struct policy_log {
    int place_calls, schedule_calls;
    uint64_t last_n;
    uint32_t last_max_copies;
    int bad_copy;
} policy_log;

/* Every copy of every unit on the last path, replicas on the ones before it. */
static void place_on_last(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                          uint32_t replicas, uint32_t *paths_out) {
    policy_log *log = ctx;
    log->place_calls++;
    for (uint32_t u = 0; u < n_units; u++)
        for (uint32_t r = 0; r < replicas; r++) paths_out[u * replicas + r] = n_paths - 1 - r;
    *pointer += n_units;
}

/* Always read the last offered copy; submit in reverse. */
static void schedule_last_copy(void *ctx, uint32_t n_paths, uint64_t n, uint32_t max_copies,
                               const uint32_t *n_copies, const uint32_t *paths, uint32_t *chosen,
                               uint64_t *order) {
    policy_log *log = ctx;
    log->schedule_calls++;
    log->last_n = n;
    log->last_max_copies = max_copies;
    for (uint64_t r = 0; r < n; r++) {
        if (n_copies[r] == 0 || n_copies[r] > max_copies) log->bad_copy = 1;
        chosen[r] = paths[r * max_copies + n_copies[r] - 1];
        if (chosen[r] >= n_paths) log->bad_copy = 1;
        order[r] = n - 1 - r;
    }
}

/* get_many_start and get_many_finish: two calls in flight at once, finished in the other order;
 * each gets its own objects and statuses, an object removed meanwhile still reads whole (the hold
 * itself is what a_call_in_flight_holds_the_room_of_its_objects shows), and a ticket that is not in
 * flight is refused with a sentence. */
START_TEST(get_many_in_two_halves_keeps_two_calls_apart) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 16 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 16; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
    enum { N = 10 };
    kvs_key keys[2][N];
    void *dsts[2][N];
    uint64_t caps[2][N], lens[2][N], tickets[2];
    kvs_status sts[2][N];
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t i = 0; i < N; i++) {
            /* call 0: objects 0-7, a missing one, a short buffer; call 1: objects 8-15, 0 and 3 */
            uint32_t id = i < 8 ? 8 * c + i : c == 0 ? (i == 8 ? 999 : 7) : (i == 8 ? 0 : 3);
            keys[c][i] = kvs_test_key(id);
            dsts[c][i] = kvs_test_aligned_buffer(64 * KIB);
            memset(dsts[c][i], 0xEE, 64 * KIB);
            caps[c][i] = c == 0 && i == 9 ? 1000 : 64 * KIB;
        }
    kvs_ssd_stats_t before = kvs_test_ssd_stats(st);
    for (uint32_t c = 0; c < 2; c++)
        ck_assert_int_eq(
            ops->get_many_start(st, keys[c], dsts[c], caps[c], N, lens[c], sts[c], &tickets[c]),
            KVS_OK);
    ck_assert_uint_ne(tickets[0], tickets[1]);
    kvs_key gone = kvs_test_key(0); /* both calls hold it: its bytes still come back */
    ck_assert_int_eq(ops->remove(st, &gone), KVS_OK);
    memset(keys, 0, sizeof keys); /* the keys are the caller's again once start returned */
    ck_assert_int_eq(ops->get_many_finish(st, tickets[1]), KVS_OK);
    ck_assert_int_eq(ops->get_many_finish(st, tickets[0]), KVS_OK);
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t i = 0; i < N; i++) {
            if (c == 0 && i >= 8) continue;
            uint32_t id = i < 8 ? 8 * c + i : i == 8 ? 0 : 3;
            ck_assert_msg(sts[c][i] == KVS_OK, "call %u item %u: status %d", c, i, sts[c][i]);
            ck_assert_uint_eq(lens[c][i], 64 * KIB);
            ck_assert_msg(kvs_test_bytes_match(dsts[c][i], lens[c][i], id), "call %u item %u", c,
                          i);
        }
    ck_assert_int_eq(sts[0][8], KVS_ENOTFOUND);
    ck_assert_int_eq(sts[0][9], KVS_EOVERFLOW);
    /* object 0 read once per call (each call merges only its own duplicates); 3 twice */
    kvs_ssd_stats_t after = kvs_test_ssd_stats(st);
    ck_assert_uint_eq(after.reads - before.reads, 4 * (8 + 8 + 2));
    /* the removed object is gone once no call holds it */
    uint64_t present = 1;
    ck_assert_int_eq(ops->contains(st, &gone, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 0);
    ck_assert_int_eq(ops->get_many_finish(st, tickets[0]), KVS_EINVAL);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "not in flight"));
    ck_assert_int_eq(ops->get_many_finish(st, 0), KVS_EINVAL);
    ck_assert_int_eq(ops->get_many_start(st, keys[0], dsts[0], caps[0], N, lens[0], sts[0], NULL),
                     KVS_EINVAL);
    /* an empty call is a call */
    uint64_t t0 = 0;
    ck_assert_int_eq(ops->get_many_start(st, NULL, NULL, NULL, 0, NULL, NULL, &t0), KVS_OK);
    ck_assert_int_eq(ops->get_many_finish(st, t0), KVS_OK);
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t i = 0; i < N; i++) free(dsts[c][i]);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

typedef struct writes_probe {
    void *st;
    uint64_t want;
} writes_probe;

static int writes_reached(void *arg) {
    writes_probe *p = arg;
    return kvs_test_ssd_stats(p->st).writes >= p->want;
}

/* A call in flight holds its objects' room: an object removed meanwhile keeps its slot until the
 * call is finished, so a put that needs room evicts another object instead of taking that slot
 * (without the hold it would take it, and nothing would be evicted). */
START_TEST(a_call_in_flight_holds_the_room_of_its_objects) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    /* one path of 8 slots of 16KiB + 4KiB, read at 2 MB/s: a 16 KiB read takes 8 ms */
    kvs_test_ssd_args a = {.n_paths = 1,
                           .capacity = 4096 + 8 * 20 * KIB,
                           .max_object = 16 * KIB,
                           .options = {{"sim_bandwidth", "2MB/s"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 8; i++) { /* one at a time: the LRU order is the put order */
        kvs_test_ssd_put(st, i, 16 * KIB);
        kvs_test_ssd_flush(st);
    }
    kvs_key key = kvs_test_key(0);
    void *dst = kvs_test_aligned_buffer(16 * KIB);
    uint64_t cap = 16 * KIB, len = 0, ticket = 0;
    kvs_status status = KVS_EIO;
    uint64_t writes = kvs_test_ssd_stats(st).writes;
    ck_assert_int_eq(ops->get_many_start(st, &key, &dst, &cap, 1, &len, &status, &ticket), KVS_OK);
    ck_assert_int_eq(ops->remove(st, &key), KVS_OK);
    /* the tombstone (queued behind the read) holds the slot too until it is written: wait for it */
    writes_probe wp = {st, writes + 1};
    ck_assert(kvs_test_wait_for(writes_reached, &wp, 10000));
    kvs_test_pause_ms(
        50); /* and for its completion to let go of the slot, were nothing else holding it */
    uint64_t evictions = kvs_test_ssd_stats(st).evictions;
    kvs_test_ssd_put(st, 8, 16 * KIB);
    kvs_test_ssd_flush(st);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).evictions - evictions, 1);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1), 0); /* the least recently used went */
    ck_assert_uint_eq(kvs_test_ssd_present(st, 8), 1);
    ck_assert_int_eq(ops->get_many_finish(st, ticket), KVS_OK);
    ck_assert_int_eq(status, KVS_OK);
    ck_assert(kvs_test_bytes_match(dst, len, 0));
    /* finished: the removed object's slot is free, so the next put evicts nothing */
    evictions = kvs_test_ssd_stats(st).evictions;
    kvs_test_ssd_put(st, 9, 16 * KIB);
    kvs_test_ssd_flush(st);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).evictions, evictions);
    free(dst);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* A call still in flight at destroy is finished there: its reads land in the buffers, which the
 * caller keeps until then, and nothing of it is left behind (LeakSanitizer in the asan build). */
START_TEST(destroy_finishes_a_call_still_in_flight) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}, {"sim_bandwidth", "8MB/s"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    enum { N = 4 };
    for (uint32_t i = 0; i < N; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
    kvs_key keys[N];
    void *dsts[N];
    uint64_t caps[N], lens[N], ticket = 0;
    kvs_status sts[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = kvs_test_key(i);
        dsts[i] = kvs_test_aligned_buffer(64 * KIB);
        memset(dsts[i], 0xEE, 64 * KIB);
        caps[i] = 64 * KIB;
    }
    ck_assert_int_eq(ops->get_many_start(st, keys, dsts, caps, N, lens, sts, &ticket), KVS_OK);
    ops->destroy(st);
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_int_eq(sts[i], KVS_OK);
        ck_assert(kvs_test_bytes_match(dsts[i], lens[i], i));
        free(dsts[i]);
    }
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(host_policies_choose_the_paths_and_the_read_order) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    policy_log plog = {0};
    kvs_backend_host host = {.struct_size = sizeof host,
                             .ctx = &plog,
                             .log = kvs_test_ssd_host.log,
                             .place = place_on_last,
                             .schedule = schedule_last_copy};
    kvs_test_ssd_args a = {.n_paths = 3,
                           .capacity = 12 * MIB,
                           .max_object = 64 * KIB,
                           .host = &host,
                           .options = {{"stripe_bytes", "16KiB"}, {"replicas", "2"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 5; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
    ck_assert_int_eq(plog.place_calls, 5);
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    ck_assert_uint_eq(s.paths[0].units, 0);
    ck_assert_uint_eq(s.paths[1].units, 20);
    ck_assert_uint_eq(s.paths[2].units, 20);
    kvs_key keys[6];
    void *dsts[6];
    uint64_t caps[6], lens[6];
    kvs_status statuses[6];
    for (uint32_t i = 0; i < 6; i++) {
        keys[i] = kvs_test_key(i % 5); /* key 0 twice */
        dsts[i] = kvs_test_aligned_buffer(64 * KIB);
        caps[i] = 64 * KIB;
    }
    uint64_t reads_before = s.paths[1].reads, reads_before_2 = s.paths[2].reads;
    ck_assert_int_eq(ops->get_many(st, keys, dsts, caps, 6, lens, statuses), KVS_OK);
    ck_assert_int_eq(plog.schedule_calls, 1);
    ck_assert_uint_eq(plog.last_n, 20); /* 5 distinct objects x 4 units, duplicates merged */
    ck_assert_uint_eq(plog.last_max_copies, 2);
    ck_assert_int_eq(plog.bad_copy, 0);
    for (uint32_t i = 0; i < 6; i++) {
        ck_assert_int_eq(statuses[i], KVS_OK);
        ck_assert(kvs_test_bytes_match(dsts[i], lens[i], i % 5));
        free(dsts[i]);
    }
    s = kvs_test_ssd_stats(st);
    /* copies were offered in replica order (path 2, then path 1): the policy took path 1 each time */
    ck_assert_uint_eq(s.paths[1].reads - reads_before, 20);
    ck_assert_uint_eq(s.paths[2].reads - reads_before_2, 0);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(built_in_schedule_balances_reads_and_interleaves_paths) {
    /* 6 reads: two forced to path 0, four that may go to 0 or 1 */
    uint32_t n_copies[6] = {1, 1, 2, 2, 2, 2};
    uint32_t paths[12] = {0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0};
    uint32_t chosen[6];
    uint64_t order[6];
    ck_assert_int_eq(ssd_place_schedule(2, 6, 2, n_copies, paths, chosen, order), 0);
    uint32_t load[2] = {0, 0};
    for (int r = 0; r < 6; r++) load[chosen[r]]++;
    ck_assert_uint_eq(load[0], 3); /* the optimum: max(forced 2, ceil(6/2)) = 3 */
    ck_assert_uint_eq(load[1], 3);
    ck_assert_uint_eq(chosen[0], 0);
    ck_assert_uint_eq(chosen[1], 0);
    int seen[6] = {0};
    for (int k = 0; k < 6; k++) {
        ck_assert_uint_lt(order[k], 6);
        seen[order[k]]++;
        if (k % 2 == 1)
            ck_assert_uint_ne(chosen[order[k]], chosen[order[k - 1]]); /* alternating paths */
    }
    for (int r = 0; r < 6; r++) ck_assert_int_eq(seen[r], 1);
    /* built-in striping: copies of one unit on distinct paths, the pointer advances by units */
    uint64_t pointer = 5;
    uint32_t out[6];
    ssd_place_stripe(&pointer, 3, 3, 2, out);
    ck_assert_uint_eq(pointer, 8);
    for (int u = 0; u < 3; u++) {
        ck_assert_uint_eq(out[u * 2], (5u + (uint32_t)u) % 3);
        ck_assert_uint_ne(out[u * 2], out[u * 2 + 1]);
    }
}
END_TEST

/* ---- engines, pacing, priorities, room --------------------------------------------------------- */

START_TEST(pread_engine_reads_what_uring_wrote_and_the_other_way_round) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args uring = {.n_paths = 2,
                               .capacity = 8 * MIB,
                               .max_object = 64 * KIB,
                               .options = {{"stripe_bytes", "16KiB"}, {"io_engine", "uring"}}};
    kvs_test_ssd_args pread_engine = uring;
    pread_engine.options[1][1] = "pread";
    void *st = kvs_test_ssd_open(&d, &uring);
    for (uint32_t i = 0; i < KVS_TEST_SSD_N_LENGTHS; i++)
        kvs_test_ssd_put(st, i, kvs_test_ssd_lengths[i]);
    kvs_test_ssd_flush(st);
    ops->destroy(st);
    kvs_test_ssd_setup(); /* forget the first open's lines */
    st = kvs_test_ssd_open(&d, &pread_engine);
    ck_assert(kvs_test_ssd_log_contains("2 of 2 paths usable"));
    ck_assert(kvs_test_ssd_log_contains("pread engine"));
    ck_assert(kvs_test_ssd_log_contains(" objects recovered"));
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    ck_assert_uint_eq(s.paths[0].uring, 0);
    ck_assert_uint_eq(s.fallbacks, 0); /* chosen, not fallen back to */
    for (uint32_t i = 0; i < KVS_TEST_SSD_N_LENGTHS; i++)
        ck_assert_int_eq(kvs_test_ssd_get(st, i, kvs_test_ssd_lengths[i]), KVS_OK);
    for (uint32_t i = 50; i < 60; i++) kvs_test_ssd_put(st, i, 40 * KIB);
    kvs_test_ssd_flush(st);
    ops->destroy(st);
    st = kvs_test_ssd_open(&d, &uring);
    for (uint32_t i = 0; i < KVS_TEST_SSD_N_LENGTHS; i++)
        ck_assert_int_eq(kvs_test_ssd_get(st, i, kvs_test_ssd_lengths[i]), KVS_OK);
    for (uint32_t i = 50; i < 60; i++) ck_assert_int_eq(kvs_test_ssd_get(st, i, 40 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(paced_reads_of_n_bytes_over_p_paths_take_at_least_n_over_p_times_bandwidth) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    const double bandwidth = 25e6;
    kvs_test_ssd_args a = {.n_paths = 4,
                           .capacity = 16 * MIB,
                           .max_object = 256 * KIB,
                           .options = {{"stripe_bytes", "64KiB"}, {"sim_bandwidth", "25MB/s"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    enum { N = 8 };
    for (uint32_t i = 0; i < N; i++) kvs_test_ssd_put(st, i, 256 * KIB);
    kvs_test_ssd_flush(st);
    kvs_key keys[N];
    void *dsts[N];
    uint64_t caps[N], lens[N];
    kvs_status statuses[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = kvs_test_key(i);
        dsts[i] = kvs_test_aligned_buffer(256 * KIB);
        caps[i] = 256 * KIB;
    }
    kvs_ssd_stats_t before = kvs_test_ssd_stats(st);
    uint64_t t0 = kvs_now_ns();
    ck_assert_int_eq(ops->get_many(st, keys, dsts, caps, N, lens, statuses), KVS_OK);
    double took = seconds_since(t0);
    kvs_ssd_stats_t after = kvs_test_ssd_stats(st);
    double bytes = (double)(after.read_bytes - before.read_bytes);
    double bound = bytes / (4 * bandwidth);
    printf(
        "paced: %.0f bytes over 4 paths at 25MB/s in %.1f ms (bound %.1f ms, one path %.1f ms)\n",
        bytes, took * 1e3, bound * 1e3, bytes / bandwidth * 1e3);
    ck_assert_uint_eq((uint64_t)bytes, N * 256 * KIB);
    ck_assert_msg(took >= bound * 0.999, "took %.4f s, less than the bound %.4f s", took, bound);
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_int_eq(statuses[i], KVS_OK);
        ck_assert(kvs_test_bytes_match(dsts[i], lens[i], i));
        free(dsts[i]);
    }
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(restore_reads_overtake_queued_writes) {
    static const char *const engines[] = {"uring", "pread"};
    for (int e = 0; e < 2; e++) {
        kvs_test_dirs d;
        kvs_test_ssd_dirs(&d);
        /* 64KiB units at 4MB/s: each write holds the device for about 17 ms */
        kvs_test_ssd_args a = {.n_paths = 1,
                               .capacity = 8 * MIB,
                               .max_object = 64 * KIB,
                               .options = {{"sim_bandwidth", "4MB/s"},
                                           {"write_inflight", "1"},
                                           {"io_engine", engines[e]},
                                           {"pread_threads", "1"}}};
        void *st = kvs_test_ssd_open(&d, &a);
        kvs_test_ssd_put(st, 0, 64 * KIB);
        kvs_test_ssd_flush(st);
        for (uint32_t i = 1; i <= 12; i++) kvs_test_ssd_put(st, i, 64 * KIB);
        kvs_key k = kvs_test_key(0);
        void *dst = kvs_test_aligned_buffer(64 * KIB);
        kvs_key keys[1] = {k};
        void *dsts[1] = {dst};
        uint64_t caps[1] = {64 * KIB}, lens[1];
        kvs_status statuses[1];
        ck_assert_int_eq(ops->get_many(st, keys, dsts, caps, 1, lens, statuses), KVS_OK);
        ck_assert_int_eq(statuses[0], KVS_OK);
        ck_assert(kvs_test_bytes_match(dst, lens[0], 0));
        uint64_t pending = kvs_test_ssd_stats(st).writes_pending;
        ck_assert_msg(pending >= 6, "%s: only %llu of 12 writes were still queued behind the read",
                      engines[e], (unsigned long long)pending);
        kvs_test_ssd_flush(st);
        free(dst);
        ops->destroy(st);
        kvs_test_rmtree(d.root);
    }
}
END_TEST

/* One slow path (2 MB/s) and a write buffer of 256 KiB for objects of up to 64 KiB: puts stay in
 * flight long enough to fill it. */
static void *open_slow_write_buffer(kvs_test_dirs *d) {
    kvs_test_ssd_dirs(d);
    kvs_test_ssd_args a = {
        .n_paths = 1,
        .capacity = 8 * MIB,
        .max_object = 64 * KIB,
        .options = {{"write_buffer_bytes", "256KiB"}, {"sim_bandwidth", "2MB/s"}}};
    return kvs_test_ssd_open(d, &a);
}

/* Large objects are copied into the write arena mapped at create; a buffer goes back to it when its
 * write completes, and a fresh one is allocated only while every buffer of the arena is in flight. */
START_TEST(large_puts_take_the_write_arena_and_give_it_back) {
    kvs_test_dirs d;
    void *st = open_slow_write_buffer(&d);
    /* the arena holds 3 buffers of 4KiB + 64KiB: three puts in flight take them all */
    for (uint32_t i = 0; i < 3; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).fresh_write_buffers, 0);
    ck_assert_uint_ge(kvs_test_ssd_stats(st).writes_pending, 1);
    /* 40KiB is over half the largest object: it wants an arena buffer, finds none free (the
     * budget still has room for it) and gets a fresh one */
    kvs_test_ssd_put(st, 3, 40 * KIB);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).fresh_write_buffers, 1);
    kvs_test_ssd_flush(st);
    for (uint32_t i = 0; i < 3; i++) ck_assert_int_eq(kvs_test_ssd_get(st, i, 64 * KIB), KVS_OK);
    ck_assert_int_eq(kvs_test_ssd_get(st, 3, 40 * KIB), KVS_OK);
    /* every arena buffer came back: three more puts reuse them */
    for (uint32_t i = 4; i < 7; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).fresh_write_buffers, 1);
    kvs_test_ssd_flush(st);
    for (uint32_t i = 4; i < 7; i++) ck_assert_int_eq(kvs_test_ssd_get(st, i, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_full_write_buffer_refuses_puts_with_a_sentence) {
    kvs_test_dirs d;
    void *st = open_slow_write_buffer(&d);
    uint8_t *buf = malloc(64 * KIB);
    ck_assert_ptr_nonnull(buf);
    int refused = 0;
    for (uint32_t i = 0; i < 6; i++) {
        kvs_test_fill(buf, 64 * KIB, i);
        kvs_key k = kvs_test_key(i);
        kvs_status rc = ops->put(st, &k, buf, 64 * KIB);
        if (i < 3)
            ck_assert_int_eq(rc, KVS_OK); /* 3 x (4KiB + 64KiB) fit in 256KiB */
        else if (rc == KVS_ENOMEM)
            refused++;
    }
    ck_assert_int_ge(refused, 1);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "write queue full"));
    ck_assert_uint_eq(kvs_test_ssd_stats(st).queue_full_skips, (uint64_t)refused);
    kvs_test_ssd_flush(st);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).buffered_bytes, 0);
    for (uint32_t i = 0; i < 3; i++) ck_assert_int_eq(kvs_test_ssd_get(st, i, 64 * KIB), KVS_OK);
    free(buf);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* on_evict records: the keys it was given and whether any came with bytes. */
static struct {
    kvs_key keys[16];
    int n, with_bytes;
} evicted;

static void record_evict(void *ctx, const kvs_key *key, const void *object, uint64_t len) {
    (void)ctx;
    if (evicted.n < 16) evicted.keys[evicted.n] = *key;
    evicted.n++;
    if (object || len) evicted.with_bytes++;
}

START_TEST(eviction_tells_the_host_without_bytes) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    memset(&evicted, 0, sizeof evicted);
    kvs_backend_host host = {
        .struct_size = sizeof host, .log = kvs_test_ssd_host.log, .on_evict = record_evict};
    /* one path of 4 slots: the 5th and 6th objects evict the two least recently used */
    kvs_test_ssd_args a = {
        .n_paths = 1, .capacity = 4096 + 4 * 20 * KIB, .max_object = 16 * KIB, .host = &host};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 4; i++) {
        kvs_test_ssd_put(st, i, 16 * KIB);
        kvs_test_ssd_flush(
            st); /* visible one by one, so the LRU order is 0, 1, 2, 3 whatever order writes finish in */
    }
    ck_assert_int_eq(evicted.n, 0);
    kvs_test_ssd_put(st, 4, 16 * KIB);
    kvs_test_ssd_put(st, 5, 16 * KIB);
    kvs_test_ssd_flush(st);
    ck_assert_int_eq(evicted.n, 2);
    ck_assert_int_eq(evicted.with_bytes, 0);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1);
    ck_assert_mem_eq(evicted.keys[0].bytes, k0.bytes, 16);
    ck_assert_mem_eq(evicted.keys[1].bytes, k1.bytes, 16);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).evictions, 2);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(eviction_drops_the_least_recently_used_unpinned_object) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    /* one path of 8 slots of 16KiB + 4KiB */
    kvs_test_ssd_args a = {.n_paths = 1, .capacity = 4096 + 8 * 20 * KIB, .max_object = 16 * KIB};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 8;
         i++) { /* one at a time: an object enters the LRU when its write completes,
                                        * and writes in flight together may complete in any order */
        kvs_test_ssd_put(st, i, 16 * KIB);
        kvs_test_ssd_flush(st);
    }
    ck_assert_int_eq(kvs_test_ssd_get(st, 0, 16 * KIB),
                     KVS_OK); /* 1 is now the least recently used */
    kvs_key k2 = kvs_test_key(2);
    uint64_t pinned = 0;
    ck_assert_int_eq(ops->pin(st, &k2, 1, 60000, &pinned), KVS_OK);
    ck_assert_uint_eq(pinned, 1);
    kvs_test_ssd_put(st, 8, 16 * KIB);
    kvs_test_ssd_put(st, 9, 16 * KIB);
    kvs_test_ssd_flush(st);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1), 0);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 2), 1); /* pinned: skipped */
    ck_assert_uint_eq(kvs_test_ssd_present(st, 3), 0);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 0), 1);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).evictions, 2);
    /* everything pinned: put fails at once and changes nothing */
    kvs_key all[8];
    uint32_t ids[8] = {0, 2, 4, 5, 6, 7, 8, 9};
    for (int i = 0; i < 8; i++) all[i] = kvs_test_key(ids[i]);
    ck_assert_int_eq(ops->pin(st, all, 8, 60000, &pinned), KVS_OK);
    ck_assert_uint_eq(pinned, 8);
    uint8_t buf[100];
    kvs_key k10 = kvs_test_key(10);
    ck_assert_int_eq(ops->put(st, &k10, buf, sizeof buf), KVS_ENOMEM);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "pinned"));
    ck_assert_uint_eq(kvs_test_ssd_stats(st).buffered_bytes, 0);
    ck_assert_int_eq(ops->unpin(st, all, 8), KVS_OK);
    ck_assert_int_eq(ops->unpin(st, all, 8), KVS_OK); /* key 2 held two pins */
    ck_assert_int_eq(ops->unpin(st, all, 8), KVS_OK); /* no pins left: a no-op */
    kvs_test_ssd_put(st, 10, 100);
    kvs_test_ssd_flush(st);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 10), 1);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_pin_expires_after_its_timeout) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 1, .capacity = 4096 + 2 * 20 * KIB, .max_object = 16 * KIB};
    void *st = kvs_test_ssd_open(&d, &a);
    kvs_clock clock;
    kvs_clock_init_manual(&clock, kvs_now_ns());
    ck_assert_int_eq(kvs_ssd_set_clock(st, &clock), KVS_OK);
    kvs_test_ssd_put(st, 0, 16 * KIB);
    kvs_test_ssd_put(st, 1, 16 * KIB);
    kvs_test_ssd_flush(st);
    kvs_key both[2] = {kvs_test_key(0), kvs_test_key(1)};
    uint64_t pinned = 0;
    ck_assert_int_eq(ops->pin(st, both, 2, 300, &pinned), KVS_OK);
    ck_assert_uint_eq(pinned, 2);
    kvs_key k2 = kvs_test_key(2);
    uint8_t buf[16] = {0};
    kvs_clock_advance(&clock, 299 * 1000000ull);
    ck_assert_int_eq(ops->put(st, &k2, buf, sizeof buf), KVS_ENOMEM); /* 1 ms left */
    kvs_clock_advance(&clock, 1000000ull);
    ck_assert_int_eq(ops->put(st, &k2, buf, sizeof buf), KVS_OK);
    kvs_test_ssd_flush(st);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 2), 1);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* ---- options --------------------------------------------------------------------------------- */

static void expect_refused(const kvs_test_dirs *d, const kvs_test_ssd_args *a, kvs_status want,
                           const char *phrase) {
    void *st = NULL;
    kvs_status rc = kvs_test_ssd_try_open(d, a, &st);
    ck_assert_msg(rc == want, "expected %d, got %d (%s)", want, rc, kvs_test_ssd_error);
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(kvs_test_ssd_error, phrase) != NULL, "\"%s\" does not say \"%s\"",
                  kvs_test_ssd_error, phrase);
    ck_assert_msg(strncmp(kvs_test_ssd_error, "ssd tier \"ssd0\": ", 17) == 0,
                  "\"%s\" does not name the tier", kvs_test_ssd_error);
}

START_TEST(bad_options_are_refused_with_a_sentence) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 1, .capacity = 4 * MIB, .max_object = 64 * KIB};
    a.options[0][0] = "colour";
    a.options[0][1] = "red";
    expect_refused(&d, &a, KVS_ECONFIG,
                   "unknown option \"colour\" (valid options: path, stripe_bytes, replicas");
    a.options[0][0] = "stripe_bytes";
    a.options[0][1] = "5000";
    expect_refused(&d, &a, KVS_ECONFIG, "stripe_bytes \"5000\" is not a multiple of 4KiB");
    a.options[0][0] = "replicas";
    a.options[0][1] = "2";
    expect_refused(&d, &a, KVS_ECONFIG, "replicas 2 needs at least 2 paths; 1 given");
    a.options[0][0] = "sim_bandwidth";
    a.options[0][1] = "fast";
    expect_refused(&d, &a, KVS_ECONFIG, "is not a rate such as 250MB/s");
    a.options[0][0] = "io_engine";
    a.options[0][1] = "aio";
    expect_refused(&d, &a, KVS_ECONFIG, "io_engine \"aio\" is not uring or pread");
    a.options[0][0] = "fault_inject";
    a.options[0][1] = "eio_path:3";
    expect_refused(&d, &a, KVS_ECONFIG, "eio_path:3 names no path");
    a.options[0][0] = "write_buffer_bytes";
    a.options[0][1] = "16KiB";
    expect_refused(&d, &a, KVS_ECONFIG, "cannot hold one object");
    a.options[0][0] = NULL;

    kvs_test_ssd_args none = {.n_paths = 0, .capacity = 4 * MIB, .max_object = 64 * KIB};
    expect_refused(&d, &none, KVS_ECONFIG, "needs at least one path");
    kvs_test_ssd_args small = {.n_paths = 2, .capacity = 128 * KIB, .max_object = 64 * KIB};
    expect_refused(&d, &small, KVS_ECONFIG, "capacity 128KiB over 2 paths gives 0 slots");
    kvs_test_ssd_args no_capacity = {.n_paths = 1, .max_object = 64 * KIB};
    expect_refused(&d, &no_capacity, KVS_ECONFIG, "needs a capacity");

    kvs_test_dirs bad = d;
    snprintf(bad.dir[0], sizeof bad.dir[0], "%s/missing", d.root);
    expect_refused(&bad, &a, KVS_ECONFIG, "/missing\" cannot be used (ENOENT)");
    char file[400];
    ck_assert_int_eq(kvs_test_write_file(d.root, "plain", "x", file, sizeof file), 0);
    snprintf(bad.dir[0], sizeof bad.dir[0], "%.300s", file);
    expect_refused(&bad, &a, KVS_ECONFIG, "is not a directory");
    kvs_test_ssd_args two = {.n_paths = 2, .capacity = 4 * MIB, .max_object = 64 * KIB};
    bad = d;
    snprintf(bad.dir[1], sizeof bad.dir[1], "%s/.", d.dir[0]);
    expect_refused(&bad, &two, KVS_ECONFIG, "are the same directory");

    /* one tier per data file: a second opener is refused while the first holds it */
    void *st = kvs_test_ssd_open(&d, &a);
    expect_refused(&d, &a, KVS_ECONFIG, "is in use by another tier or process");
    /* and says how several processes share one (an engine's scheduler and workers) */
    ck_assert_ptr_nonnull(strstr(kvs_test_ssd_error, "share it through a kvstrata-node"));
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(sizes_and_rates_take_units) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 1,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "0.5 MiB"},
                                       {"write_buffer_bytes", "1GB"},
                                       {"sim_bandwidth", "1.5GiB/s"},
                                       {"sim_iops", "1000000"},
                                       {"queue_depth", "4"},
                                       {"io_timeout_ms", "1000"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    kvs_test_ssd_put(st, 1, 64 * KIB);
    kvs_test_ssd_flush(st);
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* ---- threads --------------------------------------------------------------------------------- */

typedef struct worker_arg {
    void *st;
    uint32_t base;
    int bad;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    uint8_t *buf = kvs_test_aligned_buffer(32 * KIB);
    for (uint32_t round = 0; round < 40; round++) {
        uint32_t id = w->base + round % 10;
        uint64_t len = 1000 + (uint64_t)(id % 7) * 4000;
        kvs_test_fill(buf, len, id);
        kvs_key k = kvs_test_key(id);
        kvs_status rc = ops->put(w->st, &k, buf, len);
        if (rc != KVS_OK && rc != KVS_ENOMEM) w->bad = 1;
        uint32_t other = (id * 7 + round) % 40; /* any thread's key */
        uint64_t got = 0, want = 1000 + (uint64_t)(other % 7) * 4000;
        kvs_key ko = kvs_test_key(other);
        rc = ops->get(w->st, &ko, buf, 32 * KIB, &got);
        if (rc == KVS_OK && (got != want || !kvs_test_bytes_match(buf, got, other))) w->bad = 1;
        if (rc != KVS_OK && rc != KVS_ENOTFOUND) w->bad = 1;
        if (round % 9 == 0) ops->remove(w->st, &ko);
    }
    free(buf);
    return NULL;
}

START_TEST(threads_sharing_one_tier_never_see_torn_or_foreign_bytes) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    /* small enough that eviction runs all the time */
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 2 * (4096 + 12 * 12 * KIB),
                           .max_object = 32 * KIB,
                           .options = {{"stripe_bytes", "8KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    pthread_t threads[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){.st = st, .base = (uint32_t)i * 10};
        ck_assert_int_eq(pthread_create(&threads[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(pthread_join(threads[i], NULL), 0);
        ck_assert_int_eq(args[i].bad, 0);
    }
    kvs_test_ssd_flush(st);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

static Suite *ssd_suite(void) {
    Suite *s = suite_create("ssd");
    TCase *basic = tcase_create("basic");
    tcase_add_checked_fixture(basic, setup, NULL);
    tcase_add_test(basic, ops_table_declares_its_version_and_capabilities);
    tcase_add_test(basic, put_then_get_is_byte_exact_over_1_2_and_4_paths);
    tcase_add_test(basic, an_object_is_invisible_until_its_writes_complete);
    tcase_add_test(basic, units_are_striped_over_every_path);
    tcase_add_test(basic, get_reports_overflow_and_absence_with_sentences);
    tcase_add_test(basic, unaligned_buffers_read_through_a_bounce_buffer);
    tcase_add_test(basic, reads_into_the_staging_pool_use_registered_buffers);
    tcase_add_test(basic, get_many_merges_equal_keys_and_reports_each_object);
    tcase_add_test(basic, get_many_in_two_halves_keeps_two_calls_apart);
    tcase_add_test(basic, destroy_finishes_a_call_still_in_flight);
    tcase_add_test(basic, a_call_in_flight_holds_the_room_of_its_objects);
    tcase_add_test(basic, host_policies_choose_the_paths_and_the_read_order);
    tcase_add_test(basic, built_in_schedule_balances_reads_and_interleaves_paths);
    tcase_add_test(basic, bad_options_are_refused_with_a_sentence);
    tcase_add_test(basic, sizes_and_rates_take_units);
    suite_add_tcase(s, basic);

    TCase *io = tcase_create("io");
    tcase_add_checked_fixture(io, setup, NULL);
    tcase_set_timeout(io, 60);
    tcase_add_test(io, pread_engine_reads_what_uring_wrote_and_the_other_way_round);
    tcase_add_test(io, paced_reads_of_n_bytes_over_p_paths_take_at_least_n_over_p_times_bandwidth);
    tcase_add_test(io, restore_reads_overtake_queued_writes);
    tcase_add_test(io, large_puts_take_the_write_arena_and_give_it_back);
    tcase_add_test(io, a_full_write_buffer_refuses_puts_with_a_sentence);
    tcase_add_test(io, eviction_drops_the_least_recently_used_unpinned_object);
    tcase_add_test(io, eviction_tells_the_host_without_bytes);
    tcase_add_test(io, a_pin_expires_after_its_timeout);
    tcase_add_test(io, threads_sharing_one_tier_never_see_torn_or_foreign_bytes);
    suite_add_tcase(s, io);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(ssd_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
