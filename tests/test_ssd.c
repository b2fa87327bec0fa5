/* test_ssd.c - the built-in SSD tier through its backend ops table, on files in temporary
 * directories (each directory stands for one device). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/ssd/ssd.h"
#include "backends/ssd/ssd_place.h"
#include "common/clock.h"
#include "tests/support/objects.h"
#include "tests/support/test_support.h"
#include "tests/support/wait.h"

#define KIB            1024ull
#define MIB            (1024ull * 1024ull)
#define MAX_TEST_PATHS 4

static const kvs_backend_ops *ops;
static char error_text[512];

/* ---- helpers --------------------------------------------------------------------------------- */

static uint8_t *aligned_buffer(uint64_t len) {
    void *p = NULL;
    ck_assert_int_eq(posix_memalign(&p, 4096, len ? len : 4096), 0);
    return p;
}

/* Log lines the tier wrote, for checks on what it told the operator. */
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

static void capture_log(void *ctx, int level, const char *message) {
    (void)ctx;
    (void)level;
    pthread_mutex_lock(&log_mutex);
    size_t used = strlen(log_text);
    snprintf(log_text + used, sizeof log_text - used, "%s\n", message);
    pthread_mutex_unlock(&log_mutex);
}

static int log_contains(const char *needle) {
    pthread_mutex_lock(&log_mutex);
    int found = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mutex);
    return found;
}

static kvs_backend_host plain_host = {.struct_size = sizeof(kvs_backend_host), .log = capture_log};

/* Directories dir[0..n) under one temporary root. */
typedef struct test_dirs {
    char root[256];
    char dir[MAX_TEST_PATHS][320];
} test_dirs;

static void make_dirs(test_dirs *d) {
    char root[256];
    ck_assert_int_eq(kvs_test_tmpdir(root, sizeof root), 0);
    memcpy(d->root, root, sizeof root);
    for (int i = 0; i < MAX_TEST_PATHS; i++) {
        snprintf(d->dir[i], sizeof d->dir[i], "%s/disk%d", root, i);
        ck_assert_int_eq(mkdir(d->dir[i], 0700), 0);
    }
}

typedef struct tier_args {
    uint32_t n_paths;
    uint64_t capacity, max_object;
    const char *options[12][2]; /* extra name/value pairs, NULL-terminated */
    const kvs_backend_host *host;
    void *staging;
    uint64_t staging_len;
    const char *name;
} tier_args;

static kvs_status try_open(const test_dirs *d, const tier_args *a, void **st) {
    kvs_backend_option opts[MAX_TEST_PATHS + 12];
    uint64_t n = 0;
    for (uint32_t i = 0; i < a->n_paths; i++) opts[n++] = (kvs_backend_option){"path", d->dir[i]};
    for (int i = 0; i < 12 && a->options[i][0]; i++)
        opts[n++] = (kvs_backend_option){a->options[i][0], a->options[i][1]};
    error_text[0] = '\0';
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = a->name ? a->name : "ssd0",
                             .capacity_bytes = a->capacity,
                             .max_object_bytes = a->max_object,
                             .options = opts,
                             .n_options = n,
                             .host = a->host ? a->host : &plain_host,
                             .error = error_text,
                             .error_len = sizeof error_text,
                             .staging_base = a->staging,
                             .staging_len = a->staging_len};
    *st = NULL;
    return ops->create(&init, st);
}

static void *open_ok(const test_dirs *d, const tier_args *a) {
    void *st = NULL;
    kvs_status rc = try_open(d, a, &st);
    ck_assert_msg(rc == KVS_OK, "create: %s", error_text);
    return st;
}

static void put_object(void *st, uint32_t i, uint64_t len) {
    uint8_t *buf = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(buf);
    kvs_test_fill(buf, len, i);
    kvs_key k = kvs_test_key(i);
    kvs_status rc = ops->put(st, &k, buf, len);
    ck_assert_msg(rc == KVS_OK, "put %u: %s", i, ops->last_error(st));
    free(buf);
}

static void flush(void *st) {
    ck_assert_int_eq(kvs_ssd_flush(st, 20000), KVS_OK);
}

/* get into an aligned buffer; returns the status and checks the bytes when it is KVS_OK. */
static kvs_status get_and_check(void *st, uint32_t i, uint64_t want_len) {
    uint64_t cap = want_len + 8192, len = 0;
    uint8_t *buf = aligned_buffer(cap);
    kvs_key k = kvs_test_key(i);
    kvs_status rc = ops->get(st, &k, buf, cap, &len);
    if (rc == KVS_OK) {
        ck_assert_uint_eq(len, want_len);
        ck_assert_msg(kvs_test_bytes_match(buf, len, i), "object %u came back with other bytes", i);
    }
    free(buf);
    return rc;
}

static uint64_t present(void *st, uint32_t i) {
    kvs_key k = kvs_test_key(i);
    uint64_t n = 0;
    ck_assert_int_eq(ops->contains(st, &k, 1, &n), KVS_OK);
    return n;
}

static kvs_ssd_stats_t stats_of(void *st) {
    kvs_ssd_stats_t s;
    ck_assert_int_eq(kvs_ssd_stats(st, &s), KVS_OK);
    return s;
}

static double seconds_since(uint64_t t0_ns) {
    return (double)(kvs_now_ns() - t0_ns) / 1e9;
}

static void setup(void) {
    ops = kvs_ssd_backend();
    log_text[0] = '\0';
}

/* ---- the table and basic round trips --------------------------------------------------------- */

START_TEST(ops_table_declares_its_version_and_capabilities) {
    ck_assert_uint_eq(ops->abi_major, KVS_BACKEND_ABI_MAJOR);
    ck_assert_uint_eq(ops->struct_size, sizeof(kvs_backend_ops));
    ck_assert_str_eq(ops->type_name, "ssd");
    ck_assert_uint_eq(ops->caps, KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_GET_MANY |
                                     KVS_BACKEND_CAP_GET_RANGE);
    ck_assert_ptr_nonnull(ops->get_many);
    ck_assert_ptr_nonnull(ops->get_range);
    ck_assert_ptr_null(ops->get_ref);
}
END_TEST

/* Lengths around every boundary: empty, sub-block, block, stripe, stripe + 1, the maximum. */
static const uint64_t LENGTHS[] = {
    0, 1, 4095, 4096, 5000, 16 * KIB, 16 * KIB + 1, 40 * KIB + 123, 64 * KIB};
#define N_LENGTHS (sizeof LENGTHS / sizeof LENGTHS[0])

START_TEST(put_then_get_is_byte_exact_over_1_2_and_4_paths) {
    static const uint32_t path_counts[] = {1, 2, 4};
    for (int c = 0; c < 3; c++) {
        test_dirs d;
        make_dirs(&d);
        tier_args a = {.n_paths = path_counts[c],
                       .capacity = 8 * MIB,
                       .max_object = 64 * KIB,
                       .options = {{"stripe_bytes", "16KiB"}}};
        void *st = open_ok(&d, &a);
        for (uint32_t i = 0; i < N_LENGTHS; i++) put_object(st, i, LENGTHS[i]);
        flush(st);
        for (uint32_t i = 0; i < N_LENGTHS; i++)
            ck_assert_msg(get_and_check(st, i, LENGTHS[i]) == KVS_OK, "%u paths, object %u: %s",
                          path_counts[c], i, ops->last_error(st));
        uint64_t n_objects = 0, bytes = 0, want_bytes = 0;
        for (uint32_t i = 0; i < N_LENGTHS; i++) want_bytes += LENGTHS[i];
        ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
        ck_assert_uint_eq(n_objects, N_LENGTHS);
        ck_assert_uint_eq(bytes, want_bytes);
        kvs_ssd_stats_t s = stats_of(st);
        ck_assert_uint_eq(s.n_paths, path_counts[c]);
        ck_assert_uint_eq(s.failed_paths, 0);
        ops->destroy(st);
        kvs_test_rmtree(d.root);
    }
}
END_TEST

START_TEST(an_object_is_invisible_until_its_writes_complete) {
    test_dirs d;
    make_dirs(&d);
    /* 64KiB at 2MB/s: the write takes about 35 ms, long enough to look before it lands */
    tier_args a = {.n_paths = 1,
                   .capacity = 4 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"sim_bandwidth", "2MB/s"}}};
    void *st = open_ok(&d, &a);
    put_object(st, 1, 64 * KIB);
    ck_assert_uint_eq(present(st, 1), 0);
    ck_assert_int_eq(get_and_check(st, 1, 64 * KIB), KVS_ENOTFOUND);
    ck_assert_uint_ge(stats_of(st).writes_pending, 1);
    flush(st);
    ck_assert_uint_eq(present(st, 1), 1);
    ck_assert_int_eq(get_and_check(st, 1, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(units_are_striped_over_every_path) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 4,
                   .capacity = 16 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "16KiB"}}};
    void *st = open_ok(&d, &a);
    uint64_t superblocks = stats_of(st).writes;
    ck_assert_uint_eq(superblocks, 4);
    for (uint32_t i = 0; i < 10; i++) put_object(st, i, 64 * KIB); /* 4 units each */
    put_object(st, 10, 20 * KIB);                                  /* 2 units */
    flush(st);
    kvs_ssd_stats_t s = stats_of(st);
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
        ck_assert_int_eq(get_and_check(st, i, i < 10 ? 64 * KIB : 20 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(get_reports_overflow_and_absence_with_sentences) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 2, .capacity = 4 * MIB, .max_object = 64 * KIB};
    void *st = open_ok(&d, &a);
    put_object(st, 1, 10000);
    flush(st);
    uint8_t *buf = aligned_buffer(8192);
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
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 2,
                   .capacity = 4 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "16KiB"}}};
    void *st = open_ok(&d, &a);
    put_object(st, 3, 50000);
    flush(st);
    uint8_t *raw = aligned_buffer(64 * KIB + 4096);
    uint64_t len = 0;
    kvs_key k = kvs_test_key(3);
    ck_assert_int_eq(ops->get(st, &k, raw + 1, 50000, &len),
                     KVS_OK); /* misaligned and exactly len */
    ck_assert_uint_eq(len, 50000);
    ck_assert(kvs_test_bytes_match(raw + 1, len, 3));
    ck_assert_uint_eq(stats_of(st).bounce_reads, 4);
    /* aligned, but cap is the length: only the last unit, whose read is rounded up, bounces */
    ck_assert_int_eq(ops->get(st, &k, raw, 50000, &len), KVS_OK);
    ck_assert(kvs_test_bytes_match(raw, len, 3));
    ck_assert_uint_eq(stats_of(st).bounce_reads, 5);
    free(raw);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(reads_into_the_staging_pool_use_registered_buffers) {
    test_dirs d;
    make_dirs(&d);
    uint64_t pool_len = 2 * MIB;
    uint8_t *pool =
        mmap(NULL, pool_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(pool, MAP_FAILED);
    tier_args a = {.n_paths = 2,
                   .capacity = 4 * MIB,
                   .max_object = 64 * KIB,
                   .staging = pool,
                   .staging_len = pool_len,
                   .options = {{"stripe_bytes", "16KiB"}}};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 4; i++) put_object(st, i, 64 * KIB);
    flush(st);
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
    kvs_ssd_stats_t s = stats_of(st);
    if (s.paths[0].uring) ck_assert_uint_eq(s.fixed_reads, 16);
    ck_assert_uint_eq(s.bounce_reads, 0);
    ops->destroy(st);
    ck_assert_int_eq(munmap(pool, pool_len), 0);
    kvs_test_rmtree(d.root);
}
END_TEST

/* ---- get_many, placement and scheduling policies --------------------------------------------- */

START_TEST(get_many_merges_equal_keys_and_reports_each_object) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 4,
                   .capacity = 16 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "16KiB"}}};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 16; i++) put_object(st, i, 64 * KIB);
    flush(st);
    enum { N = 20 };
    kvs_key keys[N];
    void *dsts[N];
    uint64_t caps[N], lens[N];
    kvs_status statuses[N];
    for (uint32_t i = 0; i < N; i++) {
        uint32_t id = i < 16 ? i : i == 16 ? 3 : i == 17 ? 5 : i == 18 ? 999 : 7;
        keys[i] = kvs_test_key(id);
        dsts[i] = aligned_buffer(64 * KIB);
        caps[i] = i == 19 ? 1000 : 64 * KIB;
    }
    kvs_ssd_stats_t before = stats_of(st);
    ck_assert_int_eq(ops->get_many(st, keys, dsts, caps, N, lens, statuses), KVS_OK);
    kvs_ssd_stats_t after = stats_of(st);
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

START_TEST(host_policies_choose_the_paths_and_the_read_order) {
    test_dirs d;
    make_dirs(&d);
    policy_log plog = {0};
    kvs_backend_host host = {.struct_size = sizeof host,
                             .ctx = &plog,
                             .log = capture_log,
                             .place = place_on_last,
                             .schedule = schedule_last_copy};
    tier_args a = {.n_paths = 3,
                   .capacity = 12 * MIB,
                   .max_object = 64 * KIB,
                   .host = &host,
                   .options = {{"stripe_bytes", "16KiB"}, {"replicas", "2"}}};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 5; i++) put_object(st, i, 64 * KIB);
    flush(st);
    ck_assert_int_eq(plog.place_calls, 5);
    kvs_ssd_stats_t s = stats_of(st);
    ck_assert_uint_eq(s.paths[0].units, 0);
    ck_assert_uint_eq(s.paths[1].units, 20);
    ck_assert_uint_eq(s.paths[2].units, 20);
    kvs_key keys[6];
    void *dsts[6];
    uint64_t caps[6], lens[6];
    kvs_status statuses[6];
    for (uint32_t i = 0; i < 6; i++) {
        keys[i] = kvs_test_key(i % 5); /* key 0 twice */
        dsts[i] = aligned_buffer(64 * KIB);
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
    s = stats_of(st);
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

/* ---- restart and the crash model ------------------------------------------------------------- */

START_TEST(objects_survive_destroy_and_create_on_the_same_paths) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 4,
                   .capacity = 16 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "16KiB"}, {"replicas", "2"}}};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 12; i++) put_object(st, i, LENGTHS[i % N_LENGTHS]);
    flush(st);
    kvs_key gone = kvs_test_key(5);
    ck_assert_int_eq(ops->remove(st, &gone), KVS_OK);
    ops->destroy(st);

    st = open_ok(&d, &a);
    kvs_ssd_stats_t s = stats_of(st);
    ck_assert_uint_eq(s.recovered, 11);
    for (uint32_t i = 0; i < 12; i++) {
        kvs_status rc = get_and_check(st, i, LENGTHS[i % N_LENGTHS]);
        ck_assert_msg(rc == (i == 5 ? KVS_ENOTFOUND : KVS_OK), "object %u: %d %s", i, rc,
                      ops->last_error(st));
    }
    /* new writes after a restart do not land on recovered objects */
    for (uint32_t i = 100; i < 110; i++) put_object(st, i, 64 * KIB);
    flush(st);
    for (uint32_t i = 0; i < 12; i++)
        if (i != 5) ck_assert_int_eq(get_and_check(st, i, LENGTHS[i % N_LENGTHS]), KVS_OK);
    for (uint32_t i = 100; i < 110; i++) ck_assert_int_eq(get_and_check(st, i, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(the_newest_write_of_a_key_wins_after_a_restart) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 2, .capacity = 4 * MIB, .max_object = 64 * KIB};
    void *st = open_ok(&d, &a);
    uint8_t *buf = malloc(30000);
    ck_assert_ptr_nonnull(buf);
    kvs_key k = kvs_test_key(1);
    kvs_test_fill(buf, 30000, 500);
    ck_assert_int_eq(ops->put(st, &k, buf, 30000), KVS_OK);
    flush(st);
    kvs_test_fill(buf, 20000, 1);
    ck_assert_int_eq(ops->put(st, &k, buf, 20000), KVS_OK);
    flush(st);
    ck_assert_int_eq(get_and_check(st, 1, 20000), KVS_OK);
    ops->destroy(st);
    st = open_ok(&d, &a);
    ck_assert_uint_eq(stats_of(st).recovered, 1);
    ck_assert_int_eq(get_and_check(st, 1, 20000), KVS_OK);
    free(buf);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

static void data_file(const test_dirs *d, int path, char *out, size_t len) {
    snprintf(out, len, "%s/kvstrata-ssd0.data", d->dir[path]);
}

/* One path, 16KiB stripes: objects 1..n of 64KiB each in slots 4(i-1)..4i-1 of a fresh file, then a
 * crash mid-write of unit 2 of object 1 (its header landed, its data did not). */
static const tier_args torn_args = {.n_paths = 1,
                                    .capacity = 4 * MIB,
                                    .max_object = 64 * KIB,
                                    .options = {{"stripe_bytes", "16KiB"}}};
static void store_and_tear_unit2_of_object1(const test_dirs *d, uint32_t n) {
    void *st = open_ok(d, &torn_args);
    for (uint32_t i = 1; i <= n; i++) put_object(st, i, 64 * KIB);
    flush(st);
    ops->destroy(st);
    char file[400];
    data_file(d, 0, file, sizeof file);
    int fd = open(file, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    uint8_t junk[512];
    memset(junk, 0x5a, sizeof junk);
    off_t unit2_data = 4096 + 2 * (4096 + 16 * 1024) + 4096 + 1000;
    ck_assert_int_eq(pwrite(fd, junk, sizeof junk, unit2_data), (ssize_t)sizeof junk);
    ck_assert_int_eq(close(fd), 0);
}

START_TEST(a_torn_unit_is_caught_on_first_read_and_removed_for_good) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = torn_args;
    store_and_tear_unit2_of_object1(&d, 2);
    void *st;

    st = open_ok(&d, &a);
    ck_assert_uint_eq(stats_of(st).recovered, 2);
    ck_assert_uint_eq(present(st, 1), 1); /* the headers are intact: found, not yet read */
    ck_assert_int_eq(get_and_check(st, 1, 64 * KIB), KVS_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "checksum"));
    ck_assert_uint_eq(present(st, 1), 0);
    ck_assert_int_eq(get_and_check(st, 2, 64 * KIB), KVS_OK);
    ck_assert_uint_eq(stats_of(st).corrupt_drops, 1);
    ops->destroy(st);
    st = open_ok(&d, &a); /* the tombstone keeps it away */
    ck_assert_uint_eq(stats_of(st).recovered, 1);
    ck_assert_uint_eq(present(st, 1), 0);
    ck_assert_int_eq(get_and_check(st, 2, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* A payload checksum failure says what was found: data that differs from its header's checksum, or
 * data blocks that are all zero (the header landed and the data never did: a torn write). */
START_TEST(a_payload_checksum_failure_says_what_was_found) {
    test_dirs d;
    make_dirs(&d);
    store_and_tear_unit2_of_object1(&d, 2);
    void *st = open_ok(&d, &torn_args);
    ck_assert_int_eq(get_and_check(st, 1, 64 * KIB), KVS_ECORRUPT);
    const char *why = ops->last_error(st);
    ck_assert_msg(strstr(why, "unit 2 of ") &&
                      strstr(why, "payload checksum mismatch (header records ") &&
                      strstr(why, "partly written or changed on the device"),
                  "message: %s", why);
    ck_assert_msg(!strstr(why, "torn write"), "a changed unit is called a torn write: %s", why);
    ck_assert(log_contains("payload checksum mismatch"));
    ops->destroy(st);
    /* object 2, unit 1: its data blocks zeroed, as if only the header had reached the disk */
    char file[400];
    data_file(&d, 0, file, sizeof file);
    int fd = open(file, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    uint8_t zeros[16 * 1024];
    memset(zeros, 0, sizeof zeros);
    off_t unit1_data = 4096 + 5 * (4096 + 16 * 1024) + 4096;
    ck_assert_int_eq(pwrite(fd, zeros, sizeof zeros, unit1_data), (ssize_t)sizeof zeros);
    ck_assert_int_eq(close(fd), 0);
    st = open_ok(&d, &torn_args);
    ck_assert_int_eq(get_and_check(st, 2, 64 * KIB), KVS_ECORRUPT);
    why = ops->last_error(st);
    ck_assert_msg(strstr(why, "unit 1 of ") && strstr(why, "all zero") &&
                      strstr(why, "a torn write"),
                  "message: %s", why);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* get_range of object i (of len bytes, filled with seed i): the bytes [off, off + n) and no more. */
static void range_check(void *st, uint32_t i, uint64_t len, uint64_t off, uint64_t n) {
    uint8_t *whole = malloc(len), *out = malloc(n + 16);
    ck_assert_ptr_nonnull(whole);
    ck_assert_ptr_nonnull(out);
    kvs_test_fill(whole, len, i);
    memset(out, 0xee, n + 16);
    kvs_key k = kvs_test_key(i);
    uint64_t got = 1, olen = 0;
    ck_assert_msg(ops->get_range(st, &k, off, n, out, &got, &olen) == KVS_OK, "range %llu+%llu: %s",
                  (unsigned long long)off, (unsigned long long)n, ops->last_error(st));
    uint64_t want = off >= len ? 0 : len - off < n ? len - off : n;
    ck_assert_uint_eq(olen, len);
    ck_assert_uint_eq(got, want);
    ck_assert_msg(want == 0 || memcmp(out, whole + off, want) == 0,
                  "range %llu+%llu of object %u differs", (unsigned long long)off,
                  (unsigned long long)n, i);
    for (uint64_t b = want; b < n + 16; b++)
        ck_assert_uint_eq(out[b], 0xee); /* nothing past the range */
    free(whole);
    free(out);
}

/* Ranges read only the 4KiB blocks they cover (layer and stage restore plans read some layers of an
 * object): byte-exact across stripe and path boundaries, clipped at the end; an object found by the
 * restart scan is read in whole units first so their checksums are checked, and a torn unit inside a
 * range is caught as in a whole read. */
START_TEST(get_range_reads_only_the_blocks_it_covers) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 2,
                   .capacity = 8 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "16KiB"}}};
    void *st = open_ok(&d, &a);
    put_object(st, 1, 64 * KIB);
    put_object(st, 2, 40 * KIB + 123);
    flush(st);
    kvs_ssd_stats_t s0 = stats_of(st);
    range_check(st, 1, 64 * KIB, 5000, 3000); /* inside one block */
    kvs_ssd_stats_t s1 = stats_of(st);
    ck_assert_uint_eq(s1.reads - s0.reads, 1);
    ck_assert_uint_eq(s1.read_bytes - s0.read_bytes, 4096); /* one block, not the object */
    range_check(st, 1, 64 * KIB, 16 * KIB - 100, 200); /* across a stripe (and path) boundary */
    range_check(st, 1, 64 * KIB, 1, 64 * KIB - 2);
    range_check(st, 2, 40 * KIB + 123, 40 * KIB, 4096); /* clipped at the end */
    range_check(st, 2, 40 * KIB + 123, 50 * KIB, 100);  /* wholly past it */
    kvs_key missing = kvs_test_key(77);
    uint64_t got = 0, olen = 0;
    uint8_t small[16];
    ck_assert_int_eq(ops->get_range(st, &missing, 0, sizeof small, small, &got, &olen),
                     KVS_ENOTFOUND);
    ops->destroy(st);

    /* recovered: whole units of the range, checked; a torn unit in the range is a corrupt object */
    st = open_ok(&d, &a);
    s0 = stats_of(st);
    range_check(st, 2, 40 * KIB + 123, 17 * KIB, 100); /* unit 1 only, read whole */
    s1 = stats_of(st);
    ck_assert_uint_eq(s1.read_bytes - s0.read_bytes, 16 * KIB);
    ops->destroy(st);
    kvs_test_rmtree(d.root);

    /* unit 2 of object 1 torn */
    make_dirs(&d);
    store_and_tear_unit2_of_object1(&d, 1);
    st = open_ok(&d, &torn_args);
    range_check(st, 1, 64 * KIB, 100, 1000); /* unit 0 is intact */
    uint8_t out[64];
    kvs_key k1 = kvs_test_key(1);
    ck_assert_int_eq(ops->get_range(st, &k1, 2 * 16 * KIB + 10, sizeof out, out, &got, &olen),
                     KVS_ECORRUPT);
    ck_assert_uint_eq(present(st, 1), 0);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_torn_header_drops_its_object_at_the_restart_scan) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 1,
                   .capacity = 4 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "16KiB"}}};
    void *st = open_ok(&d, &a);
    put_object(st, 1, 64 * KIB);
    put_object(st, 2, 64 * KIB);
    flush(st);
    ops->destroy(st);
    char file[400];
    data_file(&d, 0, file, sizeof file);
    int fd = open(file, O_RDWR);
    ck_assert_int_ge(fd, 0);
    uint8_t b = 0;
    off_t header3 = 4096 + 3 * (4096 + 16 * 1024) + 40; /* the sequence field of object 1, unit 3 */
    ck_assert_int_eq(pread(fd, &b, 1, header3), 1);
    b ^= 1;
    ck_assert_int_eq(pwrite(fd, &b, 1, header3), 1);
    ck_assert_int_eq(close(fd), 0);
    st = open_ok(&d, &a);
    ck_assert_uint_eq(stats_of(st).recovered, 1);
    ck_assert_uint_eq(present(st, 1), 0);
    ck_assert_int_eq(get_and_check(st, 2, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_file_written_with_another_stripe_starts_empty_and_says_so) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 2,
                   .capacity = 4 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "16KiB"}}};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 4; i++) put_object(st, i, 64 * KIB);
    flush(st);
    ops->destroy(st);
    a.options[0][1] = "32KiB";
    st = open_ok(&d, &a);
    ck_assert(log_contains("was written with stripe 16KiB, now 32KiB: its objects are dropped"));
    ck_assert_uint_eq(stats_of(st).recovered, 0);
    for (uint32_t i = 0; i < 4; i++) ck_assert_uint_eq(present(st, i), 0);
    for (uint32_t i = 10; i < 14; i++) put_object(st, i, 64 * KIB);
    flush(st);
    ops->destroy(st);
    st = open_ok(&d, &a);
    ck_assert_uint_eq(stats_of(st).recovered, 4);
    for (uint32_t i = 10; i < 14; i++) ck_assert_int_eq(get_and_check(st, i, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* One put, retried while the write queue is full (KVS_ENOMEM), for kvs_test_wait_until. */
typedef struct put_attempt {
    void *st;
    kvs_key key;
    const uint8_t *buf;
    uint64_t len;
    kvs_status rc;
} put_attempt;

static int put_taken(void *ctx) {
    put_attempt *p = ctx;
    p->rc = ops->put(p->st, &p->key, p->buf, p->len);
    return p->rc != KVS_ENOMEM;
}

START_TEST(kill_9_during_a_write_burst_never_serves_a_torn_object) {
    test_dirs d;
    make_dirs(&d);
    const uint32_t confirmed = 20, killed_after = 60, burst = 400;
    const uint64_t len = 256 * KIB;
    tier_args a = {.n_paths = 2,
                   .capacity = 256 * MIB,
                   .max_object = 256 * KIB,
                   .options = {{"stripe_bytes", "64KiB"}, {"write_buffer_bytes", "16MiB"}}};
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        void *st = NULL;
        if (try_open(&d, &a, &st) != KVS_OK) _exit(2);
        uint8_t *buf = malloc(len);
        if (!buf) _exit(6);
        for (uint32_t i = 0; i < burst; i++) {
            kvs_test_fill(buf, len, i);
            put_attempt put = {st, kvs_test_key(i), buf, len, KVS_EINVAL};
            if (kvs_test_wait_until(put_taken, &put, 60000) != 0) _exit(5); /* queue stays full */
            if (put.rc != KVS_OK) _exit(7);
            char c = 0;
            if (i + 1 == confirmed) {
                if (kvs_ssd_flush(st, 20000) != KVS_OK) _exit(3);
                c = 'R'; /* the first `confirmed` objects are on disk */
            } else if (i + 1 == killed_after) {
                c = 'M'; /* mid-burst: writes queued and in flight */
            }
            if (c && write(ready[1], &c, 1) != 1) _exit(4);
        }
        for (;;) pause();
    }
    ck_assert_int_eq(close(ready[1]), 0);
    char c[2] = {0, 0};
    ck_assert_int_eq(read(ready[0], &c[0], 1), 1);
    ck_assert_int_eq(c[0], 'R');
    ck_assert_int_eq(read(ready[0], &c[1], 1), 1);
    ck_assert_int_eq(c[1], 'M');
    ck_assert_int_eq(kill(child, SIGKILL), 0);
    ck_assert_int_eq(kvs_test_wait_child(child), 128);
    ck_assert_int_eq(close(ready[0]), 0);

    void *st = open_ok(&d, &a);
    uint32_t survived = 0, corrupt = 0;
    for (uint32_t i = 0; i < burst; i++) {
        kvs_status rc = get_and_check(st, i, len); /* a served object must be byte-exact */
        if (rc == KVS_OK)
            survived++;
        else if (rc == KVS_ECORRUPT)
            corrupt++;
        else
            ck_assert_int_eq(rc, KVS_ENOTFOUND);
        if (i < confirmed)
            ck_assert_msg(rc == KVS_OK, "confirmed object %u was lost: %s", i, ops->last_error(st));
    }
    printf("kill -9 mid-burst: %u of %u objects survived, %u torn ones caught\n", survived, burst,
           corrupt);
    ck_assert_uint_ge(survived, confirmed);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* ---- faults ---------------------------------------------------------------------------------- */

/* Puts until the device refuses: objects that made it stay byte-exact, the rest are counted. */
static void check_full_device(void *st, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        put_object(st, i, 64 * KIB);
        flush(st); /* one at a time, so the file fills in order */
    }
    kvs_ssd_stats_t s = stats_of(st);
    ck_assert_uint_ge(s.enospc_skips, 1);
    ck_assert_uint_eq(s.failed_paths, 0);
    uint32_t stored = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvs_status rc = get_and_check(st, i, 64 * KIB);
        ck_assert_msg(rc == KVS_OK || rc == KVS_ENOTFOUND, "object %u: %d", i, rc);
        stored += rc == KVS_OK;
    }
    ck_assert_uint_ge(stored, 1);
    ck_assert_uint_eq(stored + s.enospc_skips, n);
}

static _Atomic unsigned dropped_puts;
static void count_dropped(void *ctx, const kvs_key *key, kvs_status why) {
    (void)ctx, (void)key;
    if (why == KVS_ENOMEM) dropped_puts++;
}

/* Writes that keep failing with ENOSPC (nothing evicted makes room) drop their saves: counted, told
 * to the host (a skipped save for the connector) and logged. */
START_TEST(enospc_fault_skips_and_counts_writes_and_keeps_what_was_stored) {
    test_dirs d;
    make_dirs(&d);
    kvs_backend_host host = {
        .struct_size = sizeof host, .log = capture_log, .on_put_dropped = count_dropped};
    tier_args a = {.n_paths = 1,
                   .capacity = 8 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"fault_inject", "enospc_after:5"}},
                   .host = &host};
    dropped_puts = 0;
    void *st = open_ok(&d, &a);
    check_full_device(st, 12);
    ck_assert_uint_eq(stats_of(st).enospc_skips, 7);
    ck_assert_uint_eq(dropped_puts, 7);
    ck_assert(log_contains("dropped"));
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

static int write_small_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    int closed = close(fd);
    return n == (ssize_t)strlen(text) && closed == 0 ? 0 : -1;
}

/* A small file system on dir: a tmpfs of `size` in a mount namespace of this test's process (so it
 * goes away with the process, even if an assertion ends it early), as root or in a user namespace.
 * 0 where neither is allowed. */
static int mount_small_tmpfs(const char *dir, const char *size) {
    char options[64];
    snprintf(options, sizeof options, "size=%s", size);
    if (unshare(CLONE_NEWNS) != 0) {
        /* Unprivileged: a user namespace of our own, where this uid and gid stay themselves. */
        uid_t uid = getuid();
        gid_t gid = getgid();
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return 0;
        char map[64];
        snprintf(map, sizeof map, "%d %d 1", (int)uid, (int)uid);
        if (write_small_file("/proc/self/uid_map", map) != 0 ||
            write_small_file("/proc/self/setgroups", "deny") != 0)
            return 0;
        snprintf(map, sizeof map, "%d %d 1", (int)gid, (int)gid);
        if (write_small_file("/proc/self/gid_map", map) != 0) return 0;
    }
    return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
           mount("tmpfs", dir, "tmpfs", 0, options) == 0;
}

/* The tier's capacity is 4MiB, the device 1MiB: once the device is full the tier lowers that path's
 * capacity to what it holds and evicts to make room, so later saves are stored, none is dropped, and
 * nothing corrupt is ever served. On a real 1MiB tmpfs where mounting is allowed, else on the
 * device_bytes model of a 1MiB device (fault_inject). */
START_TEST(a_device_smaller_than_capacity_evicts_to_make_room_and_keeps_saving) {
    test_dirs d;
    make_dirs(&d);
    int mounted = mount_small_tmpfs(d.dir[0], "1m");
    tier_args a = {.n_paths = 1,
                   .capacity = 4 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{mounted ? "io_timeout_ms" : "fault_inject",
                                mounted ? "30000" : "device_bytes:1048576"}}};
    printf("full device: %s\n",
           mounted ? "a 1MiB tmpfs" : "mount refused, a modelled 1MiB device instead");
    void *st = open_ok(&d, &a);
    if (mounted) ck_assert(log_contains("cannot preallocate"));
    const uint32_t n = 40; /* 1MiB holds about 15 slots of 68KiB */
    for (uint32_t i = 0; i < n; i++) {
        put_object(st, i, 64 * KIB);
        flush(st); /* one at a time, so the file fills in order */
    }
    kvs_ssd_stats_t s = stats_of(st);
    ck_assert_uint_eq(s.enospc_skips, 0);
    ck_assert_uint_eq(s.failed_paths, 0);
    ck_assert_uint_ge(s.evictions, n - 16);
    ck_assert(log_contains("is full"));
    uint32_t stored = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvs_status rc = get_and_check(st, i, 64 * KIB);
        ck_assert_msg(rc == KVS_OK || rc == KVS_ENOTFOUND, "object %u: %d", i, rc);
        stored += rc == KVS_OK;
    }
    for (uint32_t i = n - 8; i < n; i++) ck_assert_int_eq(get_and_check(st, i, 64 * KIB), KVS_OK);
    ck_assert_uint_ge(stored, 8);
    /* what was stored is still there after a restart, and saving goes on */
    ops->destroy(st);
    st = open_ok(&d, &a);
    for (uint32_t i = 0; i < n; i++) {
        kvs_status rc = get_and_check(st, i, 64 * KIB);
        ck_assert(rc == KVS_OK || rc == KVS_ENOTFOUND);
    }
    for (uint32_t i = n; i < n + 20; i++) {
        put_object(st, i, 64 * KIB);
        flush(st);
    }
    ck_assert_uint_eq(stats_of(st).enospc_skips, 0);
    for (uint32_t i = n + 12; i < n + 20; i++)
        ck_assert_int_eq(get_and_check(st, i, 64 * KIB), KVS_OK);
    ops->destroy(st);
    if (mounted) ck_assert_int_eq(umount2(d.dir[0], MNT_DETACH), 0);
    kvs_test_rmtree(d.root);
}
END_TEST

/* Fill the file system holding dir until it refuses a write. */
static void fill_file_system(const char *dir) {
    char file[400];
    snprintf(file, sizeof file, "%s/filler", dir);
    int fd = open(file, O_WRONLY | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    static uint8_t block[4096];
    while (write(fd, block, sizeof block) == (ssize_t)sizeof block) {
    }
    ck_assert_int_eq(close(fd), 0);
}

/* A path whose superblock cannot be written (a full file system; where mounting is not allowed, the
 * device_bytes model of a device that holds nothing) is refused, naming it. */
START_TEST(a_path_whose_superblock_cannot_be_written_is_refused) {
    test_dirs d;
    make_dirs(&d);
    int mounted = mount_small_tmpfs(d.dir[0], "64k");
    if (mounted) fill_file_system(d.dir[0]);
    printf("superblock: %s\n",
           mounted ? "a full 64KiB tmpfs" : "mount refused, a modelled empty device instead");
    tier_args a = {.n_paths = 1,
                   .capacity = 4 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{mounted ? "io_timeout_ms" : "fault_inject",
                                mounted ? "30000" : "device_bytes:0"}}};
    void *st = NULL;
    kvs_status rc = try_open(&d, &a, &st);
    if (rc == KVS_OK) ops->destroy(st);
    ck_assert_msg(rc != KVS_OK, "a tier without a superblock opened");
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(error_text, "superblock") && strstr(error_text, d.dir[0]) &&
                      strstr(error_text, "ENOSPC"),
                  "message: %s", error_text);
    if (mounted) ck_assert_int_eq(umount2(d.dir[0], MNT_DETACH), 0);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_failing_path_turns_its_objects_into_misses_while_the_others_serve) {
    test_dirs d;
    make_dirs(&d);
    /* one-unit objects alternate between the two paths; path 1 fails after its 5 writes */
    tier_args a = {.n_paths = 2,
                   .capacity = 4 * MIB,
                   .max_object = 16 * KIB,
                   .options = {{"fault_inject", "eio_path:1,eio_after:5"}}};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 10; i++) put_object(st, i, 16 * KIB);
    flush(st);
    ck_assert_uint_eq(stats_of(st).paths[1].units, 5);
    uint32_t ok = 0, failed = 0;
    for (uint32_t i = 0; i < 10; i++) {
        kvs_status rc = get_and_check(st, i, 16 * KIB);
        if (rc == KVS_OK)
            ok++;
        else {
            ck_assert_msg(rc == KVS_EIO || rc == KVS_ENOTFOUND, "object %u: %d", i, rc);
            failed++;
        }
    }
    ck_assert_uint_eq(ok, 5);
    ck_assert_uint_eq(failed, 5);
    kvs_ssd_stats_t s = stats_of(st);
    ck_assert_uint_eq(s.failed_paths, 1);
    ck_assert_uint_eq(s.paths[1].failed, 1);
    ck_assert_uint_ge(s.path_errors, 1);
    ck_assert(log_contains("is isolated"));
    /* afterwards: misses, and new objects go to the path that works */
    uint64_t n_objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 5);
    for (uint32_t i = 20; i < 24; i++) put_object(st, i, 16 * KIB);
    flush(st);
    for (uint32_t i = 20; i < 24; i++) ck_assert_int_eq(get_and_check(st, i, 16 * KIB), KVS_OK);
    ck_assert_uint_eq(stats_of(st).paths[0].units, 9);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(replicas_keep_every_object_readable_when_a_path_fails) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 3,
                   .capacity = 12 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "16KiB"},
                               {"replicas", "2"},
                               {"fault_inject", "eio_path:2,eio_after:12"}}};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 8; i++)
        put_object(st, i, 64 * KIB); /* 64 unit copies, 1/3 on path 2 */
    flush(st);
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_msg(get_and_check(st, i, 64 * KIB) == KVS_OK, "object %u: %s", i,
                      ops->last_error(st));
    kvs_ssd_stats_t s = stats_of(st);
    ck_assert_uint_eq(s.failed_paths, 1);
    for (uint32_t i = 0; i < 8; i++) ck_assert_uint_eq(present(st, i), 1);
    ops->destroy(st);
    /* after a restart the path works again; every object is still whole */
    tier_args b = a;
    b.options[2][0] = NULL;
    st = open_ok(&d, &b);
    for (uint32_t i = 0; i < 8; i++) ck_assert_int_eq(get_and_check(st, i, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* ---- engines, pacing, priorities, room --------------------------------------------------------- */

START_TEST(pread_engine_reads_what_uring_wrote_and_the_other_way_round) {
    test_dirs d;
    make_dirs(&d);
    tier_args uring = {.n_paths = 2,
                       .capacity = 8 * MIB,
                       .max_object = 64 * KIB,
                       .options = {{"stripe_bytes", "16KiB"}, {"io_engine", "uring"}}};
    tier_args pread_engine = uring;
    pread_engine.options[1][1] = "pread";
    void *st = open_ok(&d, &uring);
    for (uint32_t i = 0; i < N_LENGTHS; i++) put_object(st, i, LENGTHS[i]);
    flush(st);
    ops->destroy(st);
    log_text[0] = '\0';
    st = open_ok(&d, &pread_engine);
    ck_assert(log_contains("2 of 2 paths usable"));
    ck_assert(log_contains("pread engine"));
    ck_assert(log_contains(" objects recovered"));
    kvs_ssd_stats_t s = stats_of(st);
    ck_assert_uint_eq(s.paths[0].uring, 0);
    ck_assert_uint_eq(s.fallbacks, 0); /* chosen, not fallen back to */
    for (uint32_t i = 0; i < N_LENGTHS; i++)
        ck_assert_int_eq(get_and_check(st, i, LENGTHS[i]), KVS_OK);
    for (uint32_t i = 50; i < 60; i++) put_object(st, i, 40 * KIB);
    flush(st);
    ops->destroy(st);
    st = open_ok(&d, &uring);
    for (uint32_t i = 0; i < N_LENGTHS; i++)
        ck_assert_int_eq(get_and_check(st, i, LENGTHS[i]), KVS_OK);
    for (uint32_t i = 50; i < 60; i++) ck_assert_int_eq(get_and_check(st, i, 40 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(paced_reads_of_n_bytes_over_p_paths_take_at_least_n_over_p_times_bandwidth) {
    test_dirs d;
    make_dirs(&d);
    const double bandwidth = 25e6;
    tier_args a = {.n_paths = 4,
                   .capacity = 16 * MIB,
                   .max_object = 256 * KIB,
                   .options = {{"stripe_bytes", "64KiB"}, {"sim_bandwidth", "25MB/s"}}};
    void *st = open_ok(&d, &a);
    enum { N = 8 };
    for (uint32_t i = 0; i < N; i++) put_object(st, i, 256 * KIB);
    flush(st);
    kvs_key keys[N];
    void *dsts[N];
    uint64_t caps[N], lens[N];
    kvs_status statuses[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = kvs_test_key(i);
        dsts[i] = aligned_buffer(256 * KIB);
        caps[i] = 256 * KIB;
    }
    kvs_ssd_stats_t before = stats_of(st);
    uint64_t t0 = kvs_now_ns();
    ck_assert_int_eq(ops->get_many(st, keys, dsts, caps, N, lens, statuses), KVS_OK);
    double took = seconds_since(t0);
    kvs_ssd_stats_t after = stats_of(st);
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
        test_dirs d;
        make_dirs(&d);
        /* 64KiB units at 4MB/s: each write holds the device for about 17 ms */
        tier_args a = {.n_paths = 1,
                       .capacity = 8 * MIB,
                       .max_object = 64 * KIB,
                       .options = {{"sim_bandwidth", "4MB/s"},
                                   {"write_inflight", "1"},
                                   {"io_engine", engines[e]},
                                   {"pread_threads", "1"}}};
        void *st = open_ok(&d, &a);
        put_object(st, 0, 64 * KIB);
        flush(st);
        for (uint32_t i = 1; i <= 12; i++) put_object(st, i, 64 * KIB);
        kvs_key k = kvs_test_key(0);
        void *dst = aligned_buffer(64 * KIB);
        kvs_key keys[1] = {k};
        void *dsts[1] = {dst};
        uint64_t caps[1] = {64 * KIB}, lens[1];
        kvs_status statuses[1];
        ck_assert_int_eq(ops->get_many(st, keys, dsts, caps, 1, lens, statuses), KVS_OK);
        ck_assert_int_eq(statuses[0], KVS_OK);
        ck_assert(kvs_test_bytes_match(dst, lens[0], 0));
        uint64_t pending = stats_of(st).writes_pending;
        ck_assert_msg(pending >= 6, "%s: only %llu of 12 writes were still queued behind the read",
                      engines[e], (unsigned long long)pending);
        flush(st);
        free(dst);
        ops->destroy(st);
        kvs_test_rmtree(d.root);
    }
}
END_TEST

START_TEST(a_full_write_buffer_refuses_puts_with_a_sentence) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 1,
                   .capacity = 8 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"write_buffer_bytes", "256KiB"}, {"sim_bandwidth", "2MB/s"}}};
    void *st = open_ok(&d, &a);
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
    ck_assert_uint_eq(stats_of(st).queue_full_skips, (uint64_t)refused);
    flush(st);
    ck_assert_uint_eq(stats_of(st).buffered_bytes, 0);
    for (uint32_t i = 0; i < 3; i++) ck_assert_int_eq(get_and_check(st, i, 64 * KIB), KVS_OK);
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
    test_dirs d;
    make_dirs(&d);
    memset(&evicted, 0, sizeof evicted);
    kvs_backend_host host = {
        .struct_size = sizeof host, .log = capture_log, .on_evict = record_evict};
    /* one path of 4 slots: the 5th and 6th objects evict the two least recently used */
    tier_args a = {
        .n_paths = 1, .capacity = 4096 + 4 * 20 * KIB, .max_object = 16 * KIB, .host = &host};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 4; i++) {
        put_object(st, i, 16 * KIB);
        flush(
            st); /* visible one by one, so the LRU order is 0, 1, 2, 3 whatever order writes finish in */
    }
    ck_assert_int_eq(evicted.n, 0);
    put_object(st, 4, 16 * KIB);
    put_object(st, 5, 16 * KIB);
    flush(st);
    ck_assert_int_eq(evicted.n, 2);
    ck_assert_int_eq(evicted.with_bytes, 0);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1);
    ck_assert_mem_eq(evicted.keys[0].bytes, k0.bytes, 16);
    ck_assert_mem_eq(evicted.keys[1].bytes, k1.bytes, 16);
    ck_assert_uint_eq(stats_of(st).evictions, 2);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(eviction_drops_the_least_recently_used_unpinned_object) {
    test_dirs d;
    make_dirs(&d);
    /* one path of 8 slots of 16KiB + 4KiB */
    tier_args a = {.n_paths = 1, .capacity = 4096 + 8 * 20 * KIB, .max_object = 16 * KIB};
    void *st = open_ok(&d, &a);
    for (uint32_t i = 0; i < 8;
         i++) { /* one at a time: an object enters the LRU when its write completes,
                                        * and writes in flight together may complete in any order */
        put_object(st, i, 16 * KIB);
        flush(st);
    }
    ck_assert_int_eq(get_and_check(st, 0, 16 * KIB), KVS_OK); /* 1 is now the least recently used */
    kvs_key k2 = kvs_test_key(2);
    uint64_t pinned = 0;
    ck_assert_int_eq(ops->pin(st, &k2, 1, 60000, &pinned), KVS_OK);
    ck_assert_uint_eq(pinned, 1);
    put_object(st, 8, 16 * KIB);
    put_object(st, 9, 16 * KIB);
    flush(st);
    ck_assert_uint_eq(present(st, 1), 0);
    ck_assert_uint_eq(present(st, 2), 1); /* pinned: skipped */
    ck_assert_uint_eq(present(st, 3), 0);
    ck_assert_uint_eq(present(st, 0), 1);
    ck_assert_uint_eq(stats_of(st).evictions, 2);
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
    ck_assert_uint_eq(stats_of(st).buffered_bytes, 0);
    ck_assert_int_eq(ops->unpin(st, all, 8), KVS_OK);
    ck_assert_int_eq(ops->unpin(st, all, 8), KVS_OK); /* key 2 held two pins */
    ck_assert_int_eq(ops->unpin(st, all, 8), KVS_OK); /* no pins left: a no-op */
    put_object(st, 10, 100);
    flush(st);
    ck_assert_uint_eq(present(st, 10), 1);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_pin_expires_after_its_timeout) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 1, .capacity = 4096 + 2 * 20 * KIB, .max_object = 16 * KIB};
    void *st = open_ok(&d, &a);
    kvs_clock clock;
    kvs_clock_init_manual(&clock, kvs_now_ns());
    ck_assert_int_eq(kvs_ssd_set_clock(st, &clock), KVS_OK);
    put_object(st, 0, 16 * KIB);
    put_object(st, 1, 16 * KIB);
    flush(st);
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
    flush(st);
    ck_assert_uint_eq(present(st, 2), 1);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* ---- options --------------------------------------------------------------------------------- */

static void expect_refused(const test_dirs *d, const tier_args *a, kvs_status want,
                           const char *phrase) {
    void *st = NULL;
    kvs_status rc = try_open(d, a, &st);
    ck_assert_msg(rc == want, "expected %d, got %d (%s)", want, rc, error_text);
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(error_text, phrase) != NULL, "\"%s\" does not say \"%s\"", error_text,
                  phrase);
    ck_assert_msg(strncmp(error_text, "ssd tier \"ssd0\": ", 17) == 0,
                  "\"%s\" does not name the tier", error_text);
}

START_TEST(bad_options_are_refused_with_a_sentence) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 1, .capacity = 4 * MIB, .max_object = 64 * KIB};
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

    tier_args none = {.n_paths = 0, .capacity = 4 * MIB, .max_object = 64 * KIB};
    expect_refused(&d, &none, KVS_ECONFIG, "needs at least one path");
    tier_args small = {.n_paths = 2, .capacity = 128 * KIB, .max_object = 64 * KIB};
    expect_refused(&d, &small, KVS_ECONFIG, "capacity 128KiB over 2 paths gives 0 slots");
    tier_args no_capacity = {.n_paths = 1, .max_object = 64 * KIB};
    expect_refused(&d, &no_capacity, KVS_ECONFIG, "needs a capacity");

    test_dirs bad = d;
    snprintf(bad.dir[0], sizeof bad.dir[0], "%s/missing", d.root);
    expect_refused(&bad, &a, KVS_ECONFIG, "/missing\" cannot be used (ENOENT)");
    char file[400];
    ck_assert_int_eq(kvs_test_write_file(d.root, "plain", "x", file, sizeof file), 0);
    snprintf(bad.dir[0], sizeof bad.dir[0], "%.300s", file);
    expect_refused(&bad, &a, KVS_ECONFIG, "is not a directory");
    tier_args two = {.n_paths = 2, .capacity = 4 * MIB, .max_object = 64 * KIB};
    bad = d;
    snprintf(bad.dir[1], sizeof bad.dir[1], "%s/.", d.dir[0]);
    expect_refused(&bad, &two, KVS_ECONFIG, "are the same directory");

    /* one tier per data file: a second opener is refused while the first holds it */
    void *st = open_ok(&d, &a);
    expect_refused(&d, &a, KVS_ECONFIG, "is in use by another tier or process");
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(sizes_and_rates_take_units) {
    test_dirs d;
    make_dirs(&d);
    tier_args a = {.n_paths = 1,
                   .capacity = 4 * MIB,
                   .max_object = 64 * KIB,
                   .options = {{"stripe_bytes", "0.5 MiB"},
                               {"write_buffer_bytes", "1GB"},
                               {"sim_bandwidth", "1.5GiB/s"},
                               {"sim_iops", "1000000"},
                               {"queue_depth", "4"},
                               {"io_timeout_ms", "1000"}}};
    void *st = open_ok(&d, &a);
    put_object(st, 1, 64 * KIB);
    flush(st);
    ck_assert_int_eq(get_and_check(st, 1, 64 * KIB), KVS_OK);
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
    uint8_t *buf = aligned_buffer(32 * KIB);
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
    test_dirs d;
    make_dirs(&d);
    /* small enough that eviction runs all the time */
    tier_args a = {.n_paths = 2,
                   .capacity = 2 * (4096 + 12 * 12 * KIB),
                   .max_object = 32 * KIB,
                   .options = {{"stripe_bytes", "8KiB"}}};
    void *st = open_ok(&d, &a);
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
    flush(st);
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
    tcase_add_test(basic, host_policies_choose_the_paths_and_the_read_order);
    tcase_add_test(basic, built_in_schedule_balances_reads_and_interleaves_paths);
    tcase_add_test(basic, bad_options_are_refused_with_a_sentence);
    tcase_add_test(basic, sizes_and_rates_take_units);
    suite_add_tcase(s, basic);

    TCase *crash = tcase_create("restart");
    tcase_add_checked_fixture(crash, setup, NULL);
    tcase_set_timeout(crash, 60);
    tcase_add_test(crash, objects_survive_destroy_and_create_on_the_same_paths);
    tcase_add_test(crash, the_newest_write_of_a_key_wins_after_a_restart);
    tcase_add_test(crash, a_torn_unit_is_caught_on_first_read_and_removed_for_good);
    tcase_add_test(crash, a_payload_checksum_failure_says_what_was_found);
    tcase_add_test(crash, get_range_reads_only_the_blocks_it_covers);
    tcase_add_test(crash, a_torn_header_drops_its_object_at_the_restart_scan);
    tcase_add_test(crash, a_file_written_with_another_stripe_starts_empty_and_says_so);
    tcase_add_test(crash, kill_9_during_a_write_burst_never_serves_a_torn_object);
    suite_add_tcase(s, crash);

    TCase *faults = tcase_create("faults");
    tcase_add_checked_fixture(faults, setup, NULL);
    tcase_add_test(faults, enospc_fault_skips_and_counts_writes_and_keeps_what_was_stored);
    tcase_add_test(faults, a_device_smaller_than_capacity_evicts_to_make_room_and_keeps_saving);
    tcase_add_test(faults, a_path_whose_superblock_cannot_be_written_is_refused);
    tcase_add_test(faults, a_failing_path_turns_its_objects_into_misses_while_the_others_serve);
    tcase_add_test(faults, replicas_keep_every_object_readable_when_a_path_fails);
    suite_add_tcase(s, faults);

    TCase *io = tcase_create("io");
    tcase_add_checked_fixture(io, setup, NULL);
    tcase_set_timeout(io, 60);
    tcase_add_test(io, pread_engine_reads_what_uring_wrote_and_the_other_way_round);
    tcase_add_test(io, paced_reads_of_n_bytes_over_p_paths_take_at_least_n_over_p_times_bandwidth);
    tcase_add_test(io, restore_reads_overtake_queued_writes);
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
