/* test_ssd_recovery.c - the SSD tier across restarts and failures: what survives a destroy, a torn
 * write or kill -9, and how a full or failing device is handled (test_ssd.c has the rest). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/ssd/ssd.h"
#include "tests/support/objects.h"
#include "tests/support/ssd_tier.h"
#include "tests/support/test_support.h"
#include "tests/support/wait.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static const kvs_backend_ops *ops;

static void setup(void) {
    kvs_test_ssd_setup();
    ops = kvs_ssd_backend();
}

/* ---- restart and the crash model ------------------------------------------------------------- */

START_TEST(objects_survive_destroy_and_create_on_the_same_paths) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 4,
                           .capacity = 16 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}, {"replicas", "2"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 12; i++)
        kvs_test_ssd_put(st, i, kvs_test_ssd_lengths[i % KVS_TEST_SSD_N_LENGTHS]);
    kvs_test_ssd_flush(st);
    kvs_key gone = kvs_test_key(5);
    ck_assert_int_eq(ops->remove(st, &gone), KVS_OK);
    ops->destroy(st);

    st = kvs_test_ssd_open(&d, &a);
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    ck_assert_uint_eq(s.recovered, 11);
    for (uint32_t i = 0; i < 12; i++) {
        kvs_status rc = kvs_test_ssd_get(st, i, kvs_test_ssd_lengths[i % KVS_TEST_SSD_N_LENGTHS]);
        ck_assert_msg(rc == (i == 5 ? KVS_ENOTFOUND : KVS_OK), "object %u: %d %s", i, rc,
                      ops->last_error(st));
    }
    /* new writes after a restart do not land on recovered objects */
    for (uint32_t i = 100; i < 110; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
    for (uint32_t i = 0; i < 12; i++)
        if (i != 5)
            ck_assert_int_eq(
                kvs_test_ssd_get(st, i, kvs_test_ssd_lengths[i % KVS_TEST_SSD_N_LENGTHS]), KVS_OK);
    for (uint32_t i = 100; i < 110; i++)
        ck_assert_int_eq(kvs_test_ssd_get(st, i, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(the_newest_write_of_a_key_wins_after_a_restart) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 2, .capacity = 4 * MIB, .max_object = 64 * KIB};
    void *st = kvs_test_ssd_open(&d, &a);
    uint8_t *buf = malloc(30000);
    ck_assert_ptr_nonnull(buf);
    kvs_key k = kvs_test_key(1);
    kvs_test_fill(buf, 30000, 500);
    ck_assert_int_eq(ops->put(st, &k, buf, 30000), KVS_OK);
    kvs_test_ssd_flush(st);
    kvs_test_fill(buf, 20000, 1);
    ck_assert_int_eq(ops->put(st, &k, buf, 20000), KVS_OK);
    kvs_test_ssd_flush(st);
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 20000), KVS_OK);
    ops->destroy(st);
    st = kvs_test_ssd_open(&d, &a);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, 1);
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 20000), KVS_OK);
    free(buf);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

static void data_file(const kvs_test_dirs *d, int path, char *out, size_t len) {
    snprintf(out, len, "%s/kvstrata-ssd0.data", d->dir[path]);
}

/* One path, 16KiB stripes: objects 1..n of 64KiB each in slots 4(i-1)..4i-1 of a fresh file, then a
 * crash mid-write of unit 2 of object 1 (its header landed, its data did not). */
static const kvs_test_ssd_args torn_args = {.n_paths = 1,
                                            .capacity = 4 * MIB,
                                            .max_object = 64 * KIB,
                                            .options = {{"stripe_bytes", "16KiB"}}};
static void store_and_tear_unit2_of_object1(const kvs_test_dirs *d, uint32_t n) {
    void *st = kvs_test_ssd_open(d, &torn_args);
    for (uint32_t i = 1; i <= n; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
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
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = torn_args;
    store_and_tear_unit2_of_object1(&d, 2);
    void *st;

    st = kvs_test_ssd_open(&d, &a);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, 2);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1),
                      1); /* the headers are intact: found, not yet read */
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 64 * KIB), KVS_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(ops->last_error(st), "checksum"));
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1), 0);
    ck_assert_int_eq(kvs_test_ssd_get(st, 2, 64 * KIB), KVS_OK);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).corrupt_drops, 1);
    ops->destroy(st);
    st = kvs_test_ssd_open(&d, &a); /* the tombstone keeps it away */
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, 1);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1), 0);
    ck_assert_int_eq(kvs_test_ssd_get(st, 2, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* A payload checksum failure says what was found: data that differs from its header's checksum, or
 * data blocks that are all zero (the header landed and the data never did: a torn write). */
START_TEST(a_payload_checksum_failure_says_what_was_found) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    store_and_tear_unit2_of_object1(&d, 2);
    void *st = kvs_test_ssd_open(&d, &torn_args);
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 64 * KIB), KVS_ECORRUPT);
    const char *why = ops->last_error(st);
    ck_assert_msg(strstr(why, "unit 2 of ") &&
                      strstr(why, "payload checksum mismatch (header records ") &&
                      strstr(why, "partly written or changed on the device"),
                  "message: %s", why);
    ck_assert_msg(!strstr(why, "torn write"), "a changed unit is called a torn write: %s", why);
    ck_assert(kvs_test_ssd_log_contains("payload checksum mismatch"));
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
    st = kvs_test_ssd_open(&d, &torn_args);
    ck_assert_int_eq(kvs_test_ssd_get(st, 2, 64 * KIB), KVS_ECORRUPT);
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
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 8 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    kvs_test_ssd_put(st, 1, 64 * KIB);
    kvs_test_ssd_put(st, 2, 40 * KIB + 123);
    kvs_test_ssd_flush(st);
    kvs_ssd_stats_t s0 = kvs_test_ssd_stats(st);
    range_check(st, 1, 64 * KIB, 5000, 3000); /* inside one block */
    kvs_ssd_stats_t s1 = kvs_test_ssd_stats(st);
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
    st = kvs_test_ssd_open(&d, &a);
    s0 = kvs_test_ssd_stats(st);
    range_check(st, 2, 40 * KIB + 123, 17 * KIB, 100); /* unit 1 only, read whole */
    s1 = kvs_test_ssd_stats(st);
    ck_assert_uint_eq(s1.read_bytes - s0.read_bytes, 16 * KIB);
    ops->destroy(st);
    kvs_test_rmtree(d.root);

    /* unit 2 of object 1 torn */
    kvs_test_ssd_dirs(&d);
    store_and_tear_unit2_of_object1(&d, 1);
    st = kvs_test_ssd_open(&d, &torn_args);
    range_check(st, 1, 64 * KIB, 100, 1000); /* unit 0 is intact */
    uint8_t out[64];
    kvs_key k1 = kvs_test_key(1);
    ck_assert_int_eq(ops->get_range(st, &k1, 2 * 16 * KIB + 10, sizeof out, out, &got, &olen),
                     KVS_ECORRUPT);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1), 0);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_torn_header_drops_its_object_at_the_restart_scan) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 1,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    kvs_test_ssd_put(st, 1, 64 * KIB);
    kvs_test_ssd_put(st, 2, 64 * KIB);
    kvs_test_ssd_flush(st);
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
    st = kvs_test_ssd_open(&d, &a);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, 1);
    ck_assert_uint_eq(kvs_test_ssd_present(st, 1), 0);
    ck_assert_int_eq(kvs_test_ssd_get(st, 2, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_file_written_with_another_stripe_starts_empty_and_says_so) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 4; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
    ops->destroy(st);
    a.options[0][1] = "32KiB";
    st = kvs_test_ssd_open(&d, &a);
    ck_assert(kvs_test_ssd_log_contains(
        "was written with stripe 16KiB, now 32KiB: its objects are dropped"));
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, 0);
    for (uint32_t i = 0; i < 4; i++) ck_assert_uint_eq(kvs_test_ssd_present(st, i), 0);
    for (uint32_t i = 10; i < 14; i++) kvs_test_ssd_put(st, i, 64 * KIB);
    kvs_test_ssd_flush(st);
    ops->destroy(st);
    st = kvs_test_ssd_open(&d, &a);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).recovered, 4);
    for (uint32_t i = 10; i < 14; i++) ck_assert_int_eq(kvs_test_ssd_get(st, i, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

/* One put, retried while the write queue is full (KVS_ENOMEM), for kvs_test_wait_for. */
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
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    const uint32_t confirmed = 20, killed_after = 60, burst = 400;
    const uint64_t len = 256 * KIB;
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 256 * MIB,
                           .max_object = 256 * KIB,
                           .options = {{"stripe_bytes", "64KiB"}, {"write_buffer_bytes", "16MiB"}}};
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        void *st = NULL;
        if (kvs_test_ssd_try_open(&d, &a, &st) != KVS_OK) _exit(2);
        uint8_t *buf = malloc(len);
        if (!buf) _exit(6);
        for (uint32_t i = 0; i < burst; i++) {
            kvs_test_fill(buf, len, i);
            put_attempt put = {st, kvs_test_key(i), buf, len, KVS_EINVAL};
            if (!kvs_test_wait_for(put_taken, &put, 60000)) _exit(5); /* queue stays full */
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

    void *st = kvs_test_ssd_open(&d, &a);
    uint32_t survived = 0, corrupt = 0;
    for (uint32_t i = 0; i < burst; i++) {
        kvs_status rc = kvs_test_ssd_get(st, i, len); /* a served object must be byte-exact */
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
        kvs_test_ssd_put(st, i, 64 * KIB);
        kvs_test_ssd_flush(st); /* one at a time, so the file fills in order */
    }
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    ck_assert_uint_ge(s.enospc_skips, 1);
    ck_assert_uint_eq(s.failed_paths, 0);
    uint32_t stored = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvs_status rc = kvs_test_ssd_get(st, i, 64 * KIB);
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
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_backend_host host = {
        .struct_size = sizeof host, .log = kvs_test_ssd_host.log, .on_put_dropped = count_dropped};
    kvs_test_ssd_args a = {.n_paths = 1,
                           .capacity = 8 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"fault_inject", "enospc_after:5"}},
                           .host = &host};
    dropped_puts = 0;
    void *st = kvs_test_ssd_open(&d, &a);
    check_full_device(st, 12);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).enospc_skips, 7);
    ck_assert_uint_eq(dropped_puts, 7);
    ck_assert(kvs_test_ssd_log_contains("dropped"));
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
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    int mounted = mount_small_tmpfs(d.dir[0], "1m");
    kvs_test_ssd_args a = {.n_paths = 1,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{mounted ? "io_timeout_ms" : "fault_inject",
                                        mounted ? "30000" : "device_bytes:1048576"}}};
    printf("full device: %s\n",
           mounted ? "a 1MiB tmpfs" : "mount refused, a modelled 1MiB device instead");
    void *st = kvs_test_ssd_open(&d, &a);
    if (mounted) ck_assert(kvs_test_ssd_log_contains("cannot preallocate"));
    const uint32_t n = 40; /* 1MiB holds about 15 slots of 68KiB */
    for (uint32_t i = 0; i < n; i++) {
        kvs_test_ssd_put(st, i, 64 * KIB);
        kvs_test_ssd_flush(st); /* one at a time, so the file fills in order */
    }
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    ck_assert_uint_eq(s.enospc_skips, 0);
    ck_assert_uint_eq(s.failed_paths, 0);
    ck_assert_uint_ge(s.evictions, n - 16);
    ck_assert(kvs_test_ssd_log_contains("is full"));
    uint32_t stored = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvs_status rc = kvs_test_ssd_get(st, i, 64 * KIB);
        ck_assert_msg(rc == KVS_OK || rc == KVS_ENOTFOUND, "object %u: %d", i, rc);
        stored += rc == KVS_OK;
    }
    for (uint32_t i = n - 8; i < n; i++)
        ck_assert_int_eq(kvs_test_ssd_get(st, i, 64 * KIB), KVS_OK);
    ck_assert_uint_ge(stored, 8);
    /* what was stored is still there after a restart, and saving goes on */
    ops->destroy(st);
    st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < n; i++) {
        kvs_status rc = kvs_test_ssd_get(st, i, 64 * KIB);
        ck_assert(rc == KVS_OK || rc == KVS_ENOTFOUND);
    }
    for (uint32_t i = n; i < n + 20; i++) {
        kvs_test_ssd_put(st, i, 64 * KIB);
        kvs_test_ssd_flush(st);
    }
    ck_assert_uint_eq(kvs_test_ssd_stats(st).enospc_skips, 0);
    for (uint32_t i = n + 12; i < n + 20; i++)
        ck_assert_int_eq(kvs_test_ssd_get(st, i, 64 * KIB), KVS_OK);
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

/* A tier whose only path cannot take its superblock (a full file system; where mounting is not
 * allowed, the device_bytes model of a device that holds nothing) cannot open: create fails naming
 * the path and the errno (the connector then opens an empty tier in its place, or refuses when the
 * tier is `required`: test_tiers). */
START_TEST(a_path_whose_superblock_cannot_be_written_is_refused) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    int mounted = mount_small_tmpfs(d.dir[0], "64k");
    if (mounted) fill_file_system(d.dir[0]);
    printf("superblock: %s\n",
           mounted ? "a full 64KiB tmpfs" : "mount refused, a modelled empty device instead");
    kvs_test_ssd_args a = {.n_paths = 1,
                           .capacity = 4 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{mounted ? "io_timeout_ms" : "fault_inject",
                                        mounted ? "30000" : "device_bytes:0"}}};
    void *st = NULL;
    kvs_status rc = kvs_test_ssd_try_open(&d, &a, &st);
    if (rc == KVS_OK) ops->destroy(st);
    ck_assert_msg(rc != KVS_OK, "a tier without a superblock opened");
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(kvs_test_ssd_error, "superblock") &&
                      strstr(kvs_test_ssd_error, d.dir[0]) && strstr(kvs_test_ssd_error, "ENOSPC"),
                  "message: %s", kvs_test_ssd_error);
    if (mounted) ck_assert_int_eq(umount2(d.dir[0], MNT_DETACH), 0);
    kvs_test_rmtree(d.root);
}
END_TEST

/* One of two paths is full at start (a full 64KiB tmpfs; where mounting is not allowed, the
 * device_bytes model of an empty device under path 0 only): that path is taken out of service with a
 * sentence naming the tier, the path and ENOSPC, and the tier opens and serves from the other path,
 * before and after a restart. */
START_TEST(a_path_full_at_start_is_isolated_and_the_other_serves) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    int mounted = mount_small_tmpfs(d.dir[0], "64k");
    if (mounted) fill_file_system(d.dir[0]);
    printf("full path at start: %s\n",
           mounted ? "a full 64KiB tmpfs" : "mount refused, a modelled empty device instead");
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 4 * MIB,
                           .max_object = 16 * KIB,
                           .options = {{mounted ? "io_timeout_ms" : "fault_inject",
                                        mounted ? "30000" : "device_bytes:0,device_path:0"}}};
    for (int round = 0; round < 2; round++) { /* open, then open again over what was written */
        void *st = kvs_test_ssd_open(&d, &a);
        char want[600];
        snprintf(want, sizeof want, "path 0 (%s) is out of service from the start", d.dir[0]);
        ck_assert(kvs_test_ssd_log_contains(want));
        ck_assert(kvs_test_ssd_log_contains("superblock cannot be written (ENOSPC)"));
        ck_assert(kvs_test_ssd_log_contains("ssd tier \"ssd0\""));
        kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
        ck_assert_uint_eq(s.failed_paths, 1);
        ck_assert_uint_eq(s.paths[0].failed, 1);
        ck_assert_uint_eq(s.paths[1].failed, 0);
        if (round == 0) {
            for (uint32_t i = 0; i < 12; i++) kvs_test_ssd_put(st, i, 16 * KIB - 100 * i);
            kvs_test_ssd_flush(st);
        }
        for (uint32_t i = 0; i < 12; i++)
            ck_assert_msg(kvs_test_ssd_get(st, i, 16 * KIB - 100 * i) == KVS_OK, "object %u: %s", i,
                          ops->last_error(st));
        s = kvs_test_ssd_stats(st);
        ck_assert_uint_eq(s.paths[0].units, 0);
        ck_assert_uint_eq(s.paths[1].units, 12);
        ck_assert_uint_eq(s.enospc_skips, 0);
        ops->destroy(st);
        kvs_test_ssd_setup(); /* forget the log: the second open must say it again */
    }
    if (mounted) ck_assert_int_eq(umount2(d.dir[0], MNT_DETACH), 0);
    kvs_test_rmtree(d.root);
}
END_TEST

/* A path that cannot be written at all at start (a read-only file system, EROFS; for a user that is
 * not root, a directory without write permission, EACCES) is taken out of service, naming the errno,
 * and the other path serves. Root where mounting is refused has neither: the test says so and passes. */
START_TEST(a_read_only_path_at_start_is_isolated_and_the_other_serves) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    const char *errno_name = NULL;
    if (mount_small_tmpfs(d.dir[0], "1m")) {
        ck_assert_int_eq(mount(NULL, d.dir[0], NULL, MS_REMOUNT | MS_RDONLY, NULL), 0);
        errno_name = "EROFS";
    } else if (geteuid() != 0) {
        ck_assert_int_eq(chmod(d.dir[0], 0500), 0);
        errno_name = "EACCES";
    }
    printf("read-only path at start: %s\n",
           errno_name ? errno_name : "not testable here (root, no mount)");
    if (!errno_name) {
        kvs_test_rmtree(d.root);
        return;
    }
    kvs_test_ssd_args a = {.n_paths = 2, .capacity = 4 * MIB, .max_object = 16 * KIB};
    void *st = kvs_test_ssd_open(&d, &a);
    ck_assert(kvs_test_ssd_log_contains("path 0"));
    ck_assert(kvs_test_ssd_log_contains("out of service from the start"));
    ck_assert(kvs_test_ssd_log_contains(errno_name));
    kvs_test_ssd_put(st, 1, 16 * KIB);
    kvs_test_ssd_flush(st);
    ck_assert_int_eq(kvs_test_ssd_get(st, 1, 16 * KIB), KVS_OK);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).paths[1].units, 1);
    ops->destroy(st);
    if (strcmp(errno_name, "EROFS") == 0)
        ck_assert_int_eq(umount2(d.dir[0], MNT_DETACH), 0);
    else
        ck_assert_int_eq(chmod(d.dir[0], 0700), 0);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(a_failing_path_turns_its_objects_into_misses_while_the_others_serve) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    /* one-unit objects alternate between the two paths; path 1 fails after its 5 writes */
    kvs_test_ssd_args a = {.n_paths = 2,
                           .capacity = 4 * MIB,
                           .max_object = 16 * KIB,
                           .options = {{"fault_inject", "eio_path:1,eio_after:5"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 10; i++) kvs_test_ssd_put(st, i, 16 * KIB);
    kvs_test_ssd_flush(st);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).paths[1].units, 5);
    uint32_t ok = 0, failed = 0;
    for (uint32_t i = 0; i < 10; i++) {
        kvs_status rc = kvs_test_ssd_get(st, i, 16 * KIB);
        if (rc == KVS_OK)
            ok++;
        else {
            ck_assert_msg(rc == KVS_EIO || rc == KVS_ENOTFOUND, "object %u: %d", i, rc);
            failed++;
        }
    }
    ck_assert_uint_eq(ok, 5);
    ck_assert_uint_eq(failed, 5);
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    ck_assert_uint_eq(s.failed_paths, 1);
    ck_assert_uint_eq(s.paths[1].failed, 1);
    ck_assert_uint_ge(s.path_errors, 1);
    ck_assert(kvs_test_ssd_log_contains("is isolated"));
    /* afterwards: misses, and new objects go to the path that works */
    uint64_t n_objects = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 5);
    for (uint32_t i = 20; i < 24; i++) kvs_test_ssd_put(st, i, 16 * KIB);
    kvs_test_ssd_flush(st);
    for (uint32_t i = 20; i < 24; i++) ck_assert_int_eq(kvs_test_ssd_get(st, i, 16 * KIB), KVS_OK);
    ck_assert_uint_eq(kvs_test_ssd_stats(st).paths[0].units, 9);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

START_TEST(replicas_keep_every_object_readable_when_a_path_fails) {
    kvs_test_dirs d;
    kvs_test_ssd_dirs(&d);
    kvs_test_ssd_args a = {.n_paths = 3,
                           .capacity = 12 * MIB,
                           .max_object = 64 * KIB,
                           .options = {{"stripe_bytes", "16KiB"},
                                       {"replicas", "2"},
                                       {"fault_inject", "eio_path:2,eio_after:12"}}};
    void *st = kvs_test_ssd_open(&d, &a);
    for (uint32_t i = 0; i < 8; i++)
        kvs_test_ssd_put(st, i, 64 * KIB); /* 64 unit copies, 1/3 on path 2 */
    kvs_test_ssd_flush(st);
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_msg(kvs_test_ssd_get(st, i, 64 * KIB) == KVS_OK, "object %u: %s", i,
                      ops->last_error(st));
    kvs_ssd_stats_t s = kvs_test_ssd_stats(st);
    ck_assert_uint_eq(s.failed_paths, 1);
    for (uint32_t i = 0; i < 8; i++) ck_assert_uint_eq(kvs_test_ssd_present(st, i), 1);
    ops->destroy(st);
    /* after a restart the path works again; every object is still whole */
    kvs_test_ssd_args b = a;
    b.options[2][0] = NULL;
    st = kvs_test_ssd_open(&d, &b);
    for (uint32_t i = 0; i < 8; i++) ck_assert_int_eq(kvs_test_ssd_get(st, i, 64 * KIB), KVS_OK);
    ops->destroy(st);
    kvs_test_rmtree(d.root);
}
END_TEST

static Suite *ssd_recovery_suite(void) {
    Suite *s = suite_create("ssd_recovery");
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
    tcase_add_test(faults, a_path_full_at_start_is_isolated_and_the_other_serves);
    tcase_add_test(faults, a_read_only_path_at_start_is_isolated_and_the_other_serves);
    tcase_add_test(faults, a_failing_path_turns_its_objects_into_misses_while_the_others_serve);
    tcase_add_test(faults, replicas_keep_every_object_readable_when_a_path_fails);
    suite_add_tcase(s, faults);

    return s;
}

int main(void) {
    SRunner *runner = srunner_create(ssd_recovery_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
