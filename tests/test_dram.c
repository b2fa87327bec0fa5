/* test_dram.c - the built-in DRAM tier through its backend ops table. */
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/dram/dram.h"
#include "common/clock.h"
#include "connector/config.h"
#include "connector/tiers.h"
#include "tests/support/objects.h"
#include "tests/support/test_support.h"
#include "tests/support/wait.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static const kvs_backend_ops *ops;
static char error_text[512];

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

static kvs_status open_tier_with(const char *name, uint64_t capacity, uint64_t max_object,
                                 const kvs_backend_option *opts, uint64_t n_opts,
                                 const kvs_backend_host *host, void **state) {
    error_text[0] = '\0';
    kvs_backend_init init = {
        .struct_size = sizeof init,
        .tier_name = name,
        .capacity_bytes = capacity,
        .max_object_bytes = max_object,
        .options = opts,
        .n_options = n_opts,
        .host = host,
        .error = error_text,
        .error_len = sizeof error_text,
    };
    return ops->create(&init, state);
}

/* A private tier of n_slabs slabs of 4KiB that records evictions in log. */
static void *open_small(uint64_t n_slabs, evict_log *log, kvs_backend_host *host) {
    memset(host, 0, sizeof *host);
    host->struct_size = sizeof *host;
    host->ctx = log;
    host->on_evict = record_evict;
    void *st = NULL;
    kvs_status rc = open_tier_with("t0", n_slabs * 4 * KIB, 4 * KIB, NULL, 0, host, &st);
    ck_assert_msg(rc == KVS_OK, "create: %s", error_text);
    return st;
}

static void put_small(void *st, uint32_t i, uint64_t len) {
    uint8_t buf[4096];
    kvs_test_fill(buf, len, i);
    kvs_key k = kvs_test_key(i);
    ck_assert_int_eq(ops->put(st, &k, buf, len), KVS_OK);
}

static pid_t runner_pid; /* set in main, inherited by the test processes Check forks */

static void unique_shm_name(char *buf, size_t len) {
    static unsigned counter;
    snprintf(buf, len, "kvs-test-dram-%d-%d-%u", (int)runner_pid, (int)getpid(), counter++);
}

/* Names left by a test that was killed (timeout, crash) are removed when the run ends. */
static void remove_leftover_shm(void) {
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "kvs-test-dram-%d-", (int)runner_pid);
    DIR *dir = opendir("/dev/shm");
    if (!dir) return;
    for (struct dirent *e = readdir(dir); e; e = readdir(dir)) {
        char path[300];
        if (strncmp(e->d_name, prefix, (size_t)n) != 0) continue;
        snprintf(path, sizeof path, "/%s", e->d_name);
        if (shm_unlink(path) != 0) fprintf(stderr, "test_dram: cannot remove /dev/shm%s\n", path);
    }
    if (closedir(dir) != 0) fprintf(stderr, "test_dram: cannot close /dev/shm\n");
}

static int shm_exists(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/%s", name);
    int fd = shm_open(path, O_RDONLY, 0);
    if (fd < 0) return 0;
    ck_assert_int_eq(close(fd), 0);
    return 1;
}

/* With KVS_TEST_DRAM_PLUGIN set (CTest test_dram_plugin) every test runs against the dram backend
 * built as its own module (libkvstrata-dram.so), loaded the way a deployment would: a `type: plugin`
 * tier opened by the connector's tier chain, whose table then serves the tests. */
static kvs_tier_chain *plugin_chain;

static const kvs_backend_ops *ops_from_plugin(const char *path) {
    char yaml[1024], err[512] = "";
    snprintf(
        yaml, sizeof yaml,
        "tiers:\n  - name: dram-plugin\n    type: plugin\n    plugin: %s\n    capacity: 1MiB\n",
        path);
    kvs_config *cfg = NULL;
    ck_assert_msg(kvs_config_parse_string(yaml, strlen(yaml), NULL, &cfg, err, sizeof err) ==
                      KVS_OK,
                  "%s", err);
    ck_assert_msg(
        kvs_tiers_open(cfg, 4 * KIB, NULL, 0, NULL, NULL, &plugin_chain, err, sizeof err) == KVS_OK,
        "%s", err);
    kvs_config_free(cfg);
    const kvs_backend_ops *table = kvs_tiers_ops(plugin_chain, 0);
    /* the table really is the module's, not the library's built-in one */
    Dl_info where;
    char want[4096], got[4096];
    ck_assert_ptr_ne(table, kvs_dram_backend());
    ck_assert_int_ne(dladdr(table, &where), 0);
    ck_assert_ptr_nonnull(realpath(path, want));
    ck_assert_ptr_nonnull(realpath(where.dli_fname, got));
    ck_assert_str_eq(got, want);
    return table;
}

/* kvs_dram_set_clock of the backend under test: the library's, or the module's own. */
static kvs_status (*set_clock)(void *tier, const struct kvs_clock *clock);

static void setup(void) {
    const char *plugin = getenv("KVS_TEST_DRAM_PLUGIN");
    ops = plugin ? ops_from_plugin(plugin) : kvs_dram_backend();
    set_clock = kvs_dram_set_clock;
    if (plugin) {
        void *module = dlopen(plugin, RTLD_NOW | RTLD_NOLOAD); /* the chain holds it open */
        ck_assert_ptr_nonnull(module);
        *(void **)&set_clock = dlsym(module, "kvs_dram_set_clock");
        ck_assert_ptr_nonnull(set_clock);
        ck_assert_ptr_ne(set_clock, kvs_dram_set_clock);
        ck_assert_int_eq(dlclose(module), 0);
    }
}

static void teardown(void) {
    if (plugin_chain) kvs_tiers_close(plugin_chain);
    plugin_chain = NULL;
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
    ck_assert_int_eq(open_tier_with("t0", 8 * MIB, MIB + 5, NULL, 0, NULL, &st), KVS_OK);
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
    put_small(st, 1, 300);
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
    put_small(st, 7, 4096);
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
    for (uint32_t i = 100; i < 120; i++) put_small(st, i, 4096);
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
    put_small(st, 0, 10);
    put_small(st, 1, 10);
    put_small(st, 3, 10);
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
    for (uint32_t i = 0; i < 4; i++) put_small(st, i, 100 + i);
    ck_assert_int_eq(log.n, 0);
    uint8_t out[4096];
    uint64_t len = 0;
    kvs_key k0 = kvs_test_key(0);
    ck_assert_int_eq(ops->get(st, &k0, out, sizeof out, &len), KVS_OK); /* 0 is now newest */
    uint64_t present = 0;
    kvs_key k1 = kvs_test_key(1);
    ck_assert_int_eq(ops->contains(st, &k1, 1, &present), KVS_OK); /* contains is no use */
    put_small(st, 4, 50);
    put_small(st, 5, 60);
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
    put_small(st, 0, 10);
    put_small(st, 1, 10);
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
    put_small(st, 2, 10);
    ck_assert_int_eq(log.n, 1);
    ck_assert(memcmp(&log.keys[0], &both[0], sizeof both[0]) == 0);
    put_small(st, 3, 10); /* evicts 2, never the pinned 1 */
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
    put_small(st, 0, 10);
    put_small(st, 2, 10);
    kvs_key keys[3] = {kvs_test_key(0), kvs_test_key(1), kvs_test_key(2)};
    uint64_t n_pinned = 9;
    ck_assert_int_eq(ops->pin(st, keys, 3, 60000, &n_pinned), KVS_OK);
    ck_assert_uint_eq(n_pinned, 1);
    /* Four more objects in a four-slot tier: only the pinned key 0 survives; 2 was not pinned. */
    for (int i = 3; i < 7; i++) put_small(st, i, 10);
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
    ck_assert_int_eq(set_clock(st, &clock), KVS_OK);
    put_small(st, 0, 10);
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
    ck_assert_int_eq(set_clock(st, &clock), KVS_OK);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1), k2 = kvs_test_key(2);
    void *dst = NULL;
    uint64_t stale = 0, ticket = 0, n_pinned = 0;
    ck_assert_int_eq(ops->reserve(st, &k0, 100, &dst, &stale), KVS_OK);
    put_small(st, 1, 10);
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
    put_small(st, 0, 10);
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
    put_small(st, 0, 10);
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
    put_small(st, 5, 300);
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
    put_small(st, 1, 10);
    put_small(st, 2, 10); /* evicts 1: the reservation holds the other slab */
    put_small(st, 3, 10);
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
    put_small(st, 0, 10);
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
    put_small(st, 0, 10);
    put_small(st, 1, 20);
    kvs_key k0 = kvs_test_key(0), k1 = kvs_test_key(1), absent = kvs_test_key(9);
    ck_assert_int_eq(ops->remove(st, &k0), KVS_OK);
    ck_assert_int_eq(ops->remove(st, &absent), KVS_OK);
    uint64_t present = 9, n_objects = 0, bytes = 0, n_pinned = 0;
    ck_assert_int_eq(ops->contains(st, &k0, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 0);
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 1);
    ck_assert_uint_eq(bytes, 20);
    put_small(st, 2, 10); /* the freed slab is used without evicting 1 */
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
    ck_assert_int_eq(open_tier_with("x", MIB, 4 * MIB, NULL, 0, NULL, &st), KVS_ECONFIG);
    ck_assert_ptr_null(st);
    ck_assert_str_eq(error_text, "dram tier \"x\": capacity 1MiB holds no object of 4MiB");
    ck_assert_int_ne(open_tier_with("x", MIB, 0, NULL, 0, NULL, &st), KVS_OK);
    ck_assert_ptr_nonnull(strstr(error_text, "dram tier \"x\""));
    ck_assert_int_ne(open_tier_with("x", 0, 4096, NULL, 0, NULL, &st), KVS_OK);
    ck_assert_ptr_nonnull(strstr(error_text, "capacity"));
}
END_TEST

START_TEST(unknown_option_is_refused_with_the_valid_ones_listed) {
    kvs_backend_option opt = {"shm_nmae", "abc"};
    void *st = NULL;
    ck_assert_int_eq(open_tier_with("x", MIB, 4096, &opt, 1, NULL, &st), KVS_ECONFIG);
    ck_assert_ptr_null(st);
    ck_assert_ptr_nonnull(strstr(error_text, "\"shm_nmae\""));
    ck_assert_ptr_nonnull(strstr(error_text, "valid options: shm_name"));
}
END_TEST

/* read_bandwidth and read_latency_us pace reads back to back (a slower device for benchmarks). */
START_TEST(paced_reads_take_at_least_their_modelled_time) {
    kvs_backend_option opts[] = {{"read_bandwidth", "1MiB"}, {"read_latency_us", "10000"}};
    void *st = NULL;
    ck_assert_msg(open_tier_with("slow", MIB, 64 * KIB, opts, 2, NULL, &st) == KVS_OK, "%s",
                  error_text);
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
        ck_assert_msg(open_tier_with("x", MIB, 4096, &opt, 1, NULL, &st) == KVS_OK, "%s: %s",
                      rates[i], error_text);
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
        ck_assert_int_eq(open_tier_with("x", MIB, 4096, &opt, 1, NULL, &st), KVS_ECONFIG);
        ck_assert_ptr_null(st);
        ck_assert_msg(strstr(error_text, bad[i][2]) != NULL, "%s", error_text);
        ck_assert_msg(strncmp(error_text, "dram tier \"x\": ", 15) == 0, "%s", error_text);
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
        ck_assert_int_eq(open_tier_with("x", MIB, 4096, &opt, 1, NULL, &st), KVS_ECONFIG);
        ck_assert_ptr_nonnull(strstr(error_text, "not a valid name"));
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
            put_small(st, i, len);
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

static void *open_shared(const char *shm, uint64_t n_slabs, const kvs_backend_host *host) {
    kvs_backend_option opt = {"shm_name", shm};
    void *st = NULL;
    kvs_status rc = open_tier_with("shared", n_slabs * 4 * KIB, 4 * KIB, &opt, 1, host, &st);
    return rc == KVS_OK ? st : NULL;
}

START_TEST(object_put_by_a_child_process_is_seen_by_the_parent) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_msg(st != NULL, "create: %s", error_text);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        void *child = open_shared(shm, 4, NULL);
        if (!child) _exit(1);
        uint8_t buf[1000];
        kvs_test_fill(buf, sizeof buf, 3);
        kvs_key k = kvs_test_key(3);
        int rc = ops->put(child, &k, buf, sizeof buf) == KVS_OK ? 0 : 2;
        ops->destroy(child);
        _exit(rc);
    }
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    uint8_t out[4096];
    uint64_t len = 0;
    kvs_key k = kvs_test_key(3);
    ck_assert_int_eq(ops->get(st, &k, out, sizeof out, &len), KVS_OK);
    ck_assert_uint_eq(len, 1000);
    ck_assert(kvs_test_bytes_match(out, len, 3));
    ck_assert(shm_exists(shm)); /* the parent still holds it */
    ops->destroy(st);
}
END_TEST

START_TEST(object_put_by_the_parent_is_seen_by_a_child_process) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_msg(st != NULL, "create: %s", error_text);
    put_small(st, 8, 2000);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        void *child = open_shared(shm, 4, NULL);
        if (!child) _exit(1);
        uint8_t out[4096];
        uint64_t len = 0;
        kvs_key k = kvs_test_key(8);
        int rc = ops->get(child, &k, out, sizeof out, &len) == KVS_OK ? 0 : 2;
        if (rc == 0 && (len != 2000 || !kvs_test_bytes_match(out, len, 8))) rc = 3;
        kvs_key gone = kvs_test_key(9);
        if (rc == 0 && ops->get(child, &gone, out, sizeof out, &len) != KVS_ENOTFOUND) rc = 4;
        ops->destroy(child);
        _exit(rc);
    }
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    ops->destroy(st);
}
END_TEST

START_TEST(attach_with_another_geometry_is_refused_naming_both) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_msg(st != NULL, "create: %s", error_text);
    ck_assert_ptr_null(open_shared(shm, 8, NULL));
    ck_assert_ptr_nonnull(strstr(error_text, "holds 4 slabs of 4KiB"));
    ck_assert_ptr_nonnull(strstr(error_text, "asks for 8 slabs of 4KiB"));
    kvs_backend_option opt = {"shm_name", shm};
    void *other = NULL;
    ck_assert_int_eq(open_tier_with("shared", 4 * 8 * KIB, 8 * KIB, &opt, 1, NULL, &other),
                     KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(error_text, "4 slabs of 8KiB"));
    void *same = open_shared(shm, 4, NULL); /* the matching geometry still attaches */
    ck_assert_ptr_nonnull(same);
    ops->destroy(same);
    ops->destroy(st);
}
END_TEST

START_TEST(shared_memory_is_unlinked_after_the_last_destroy) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *a = open_shared(shm, 4, NULL);
    void *b = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ops->destroy(a);
    ck_assert(shm_exists(shm));
    put_small(b, 1, 10); /* the survivor keeps working */
    ops->destroy(b);
    ck_assert(!shm_exists(shm));
    /* The name can be created afresh, empty. */
    void *c = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(c);
    uint64_t n_objects = 9, bytes = 9;
    ck_assert_int_eq(ops->usage(c, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 0);
    ops->destroy(c);
    ck_assert(!shm_exists(shm));
}
END_TEST

/* Each child opens, puts its own key, reads it back and closes, over and over, so creates, attaches
 * and last-destroy unlinks of one name race with each other. */
START_TEST(concurrent_opens_and_closes_of_one_name_never_fail_or_leak) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    pid_t pids[6];
    for (int p = 0; p < 6; p++) {
        pids[p] = fork();
        ck_assert_int_ge(pids[p], 0);
        if (pids[p] > 0) continue;
        int bad = 0;
        for (uint32_t it = 0; it < 100 && !bad; it++) {
            void *st = open_shared(shm, 64, NULL);
            if (!st) {
                bad = 1;
                break;
            }
            uint32_t id = (uint32_t)p * 1000u + it;
            uint8_t buf[100], out[4096];
            uint64_t len = 0;
            kvs_key k = kvs_test_key(id);
            kvs_test_fill(buf, sizeof buf, id);
            if (ops->put(st, &k, buf, sizeof buf) != KVS_OK)
                bad = 2;
            else if (ops->get(st, &k, out, sizeof out, &len) != KVS_OK)
                bad = 3;
            else if (len != sizeof buf || !kvs_test_bytes_match(out, len, id))
                bad = 4;
            if (ops->remove(st, &k) != KVS_OK) bad = 5; /* keeps the tier free of evictions */
            ops->destroy(st);
        }
        _exit(bad);
    }
    for (int p = 0; p < 6; p++) ck_assert_int_eq(kvs_test_wait_child(pids[p]), 0);
    ck_assert(!shm_exists(shm));
}
END_TEST

static void die_in_evict(void *ctx, const kvs_key *key, const void *object, uint64_t len) {
    (void)ctx, (void)key, (void)object, (void)len;
    _exit(0);
}

START_TEST(a_process_dying_inside_the_tier_lock_does_not_wedge_the_tier) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 2, NULL);
    ck_assert_ptr_nonnull(st);
    put_small(st, 0, 10);
    put_small(st, 1, 20);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        kvs_backend_host host = {.struct_size = sizeof host, .on_evict = die_in_evict};
        void *child = open_shared(shm, 2, &host);
        if (!child) _exit(1);
        put_small(child, 2, 10); /* evicts, and on_evict exits with the lock held */
        _exit(2);
    }
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    uint64_t present = 0, n_objects = 0, bytes = 0;
    kvs_key keys[2] = {kvs_test_key(0), kvs_test_key(1)};
    ck_assert_int_eq(ops->contains(st, keys, 2, &present), KVS_OK);
    ck_assert_uint_eq(present, 2); /* the victim was never dropped */
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 2);
    ck_assert_uint_eq(bytes, 30);
    put_small(st, 2, 10);
    kvs_key k2 = kvs_test_key(2);
    ck_assert_int_eq(ops->contains(st, &k2, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 1);
    ops->destroy(st);
    ck_assert(!shm_exists(shm)); /* the dead child never detached, and does not count */
}
END_TEST

/* In a child: attach, say so through ready ('y', or 'n' when it could not), leave when go says. */
static void attach_signal_wait(const char *shm, int ready_w, int go_r) {
    void *child = open_shared(shm, 4, NULL);
    char c = child ? 'y' : 'n';
    if (write(ready_w, &c, 1) != 1) _exit(3);
    if (read(go_r, &c, 1) != 1) _exit(4); /* the parent says when to leave (or is killed first) */
    ops->destroy(child);
    _exit(0);
}

/* In a child: move to a new pid namespace (as containers sharing /dev/shm are) and attach from a
 * process whose pid there names no process in ours, so looking it up from here finds nothing. */
static void attach_from_another_pid_namespace(const char *shm, int ready_w, int go_r) {
    char c = 'u';
    if (unshare(CLONE_NEWPID) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) {
        if (write(ready_w, &c, 1) != 1) _exit(3);
        _exit(5);
    }
    /* the namespace's first process (its init) stays while it forks children until one's pid there
     * is free in ours (in /proc) */
    pid_t init = fork();
    if (init < 0) _exit(6);
    if (init > 0) {
        int code = kvs_test_wait_child(init);
        _exit(code >= 0 && code != 128 ? code : 7);
    }
    for (;;) {
        pid_t inner = fork();
        if (inner < 0) _exit(6);
        if (inner > 0) {
            int code = kvs_test_wait_child(inner);
            if (code == 42) continue; /* taken: try the next pid */
            _exit(code >= 0 && code != 128 ? code : 7);
        }
        char path[64];
        snprintf(path, sizeof path, "/proc/%d", (int)getpid());
        if (access(path, F_OK) == 0) _exit(42);
        attach_signal_wait(shm, ready_w, go_r);
    }
}

/* A child attaches (from another pid namespace with other_pid_ns), says so through the pipe, and
 * waits for go or to be killed. */
static pid_t attach_in_child_and_wait(const char *shm, int other_pid_ns, int *ready_fd,
                                      int *go_fd) {
    int ready[2], go[2];
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_int_eq(pipe(go), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (close(ready[0]) != 0 || close(go[1]) != 0) _exit(9);
        if (other_pid_ns) attach_from_another_pid_namespace(shm, ready[1], go[0]);
        attach_signal_wait(shm, ready[1], go[0]);
    }
    ck_assert_int_eq(close(ready[1]), 0);
    ck_assert_int_eq(close(go[0]), 0);
    char c = 0;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    ck_assert_msg(c != 'u',
                  "cannot make a pid namespace (unshare): this test needs root or user namespaces");
    ck_assert_int_eq(c, 'y');
    *ready_fd = ready[0];
    *go_fd = go[1];
    return pid;
}

START_TEST(an_attacher_in_another_pid_namespace_keeps_the_shared_memory) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(st);
    int ready, go;
    pid_t pid = attach_in_child_and_wait(shm, 1, &ready, &go);
    ops->destroy(st);
    ck_assert_msg(shm_exists(shm),
                  "/dev/shm/%s was unlinked under an attacher in another pid namespace", shm);
    char c = 'x';
    ck_assert_int_eq(write(go, &c, 1), 1);
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    ck_assert_int_eq(close(ready), 0);
    ck_assert_int_eq(close(go), 0);
    ck_assert(!shm_exists(shm)); /* its detach was the last */
}
END_TEST

START_TEST(a_killed_attacher_does_not_keep_the_shared_memory_alive) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(st);
    int ready, go;
    pid_t pid = attach_in_child_and_wait(shm, 0, &ready, &go);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(kvs_test_wait_child(pid), 128);
    ck_assert_int_eq(close(ready), 0);
    ck_assert_int_eq(close(go), 0);
    put_small(st, 1, 10); /* the survivor keeps working */
    ops->destroy(st);
    ck_assert_msg(!shm_exists(shm), "/dev/shm/%s outlived its last live attacher", shm);
}
END_TEST

START_TEST(a_live_second_attacher_keeps_the_shared_memory) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(st);
    int ready, go;
    pid_t pid = attach_in_child_and_wait(shm, 0, &ready, &go);
    ops->destroy(st);
    ck_assert(shm_exists(shm)); /* the child is alive and attached */
    char c = 'x';
    ck_assert_int_eq(write(go, &c, 1), 1);
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    ck_assert_int_eq(close(ready), 0);
    ck_assert_int_eq(close(go), 0);
    ck_assert(!shm_exists(shm)); /* its detach was the last */
}
END_TEST

static Suite *dram_suite(void) {
    Suite *s = suite_create("dram");
    TCase *local = tcase_create("private");
    tcase_add_checked_fixture(local, setup, teardown);
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

    TCase *shared = tcase_create("shared");
    tcase_set_timeout(shared, 60); /* process churn is slow under sanitizers on a loaded machine */
    tcase_add_checked_fixture(shared, setup, teardown);
    tcase_add_test(shared, object_put_by_a_child_process_is_seen_by_the_parent);
    tcase_add_test(shared, object_put_by_the_parent_is_seen_by_a_child_process);
    tcase_add_test(shared, attach_with_another_geometry_is_refused_naming_both);
    tcase_add_test(shared, shared_memory_is_unlinked_after_the_last_destroy);
    tcase_add_test(shared, concurrent_opens_and_closes_of_one_name_never_fail_or_leak);
    tcase_add_test(shared, a_process_dying_inside_the_tier_lock_does_not_wedge_the_tier);
    tcase_add_test(shared, a_killed_attacher_does_not_keep_the_shared_memory_alive);
    tcase_add_test(shared, a_live_second_attacher_keeps_the_shared_memory);
    tcase_add_test(shared, an_attacher_in_another_pid_namespace_keeps_the_shared_memory);
    suite_add_tcase(s, shared);
    return s;
}

int main(void) {
    runner_pid = getpid();
    SRunner *runner = srunner_create(dram_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    remove_leftover_shm();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
