/* test_peer_gpu.c - the peer_gpu tier against a real kvstrata-lend (host device: a sealed memfd):
 * lending, reclaiming with and without copies in flight, a killed lender, a killed borrower, and
 * lenders that break the protocol. docs/peer_gpu.md.
 *
 * Built a second time as test_peer_gpu_cuda (KVS_TEST_PEER_CUDA, label gpu): the cases with a real
 * lender run against `kvstrata-lend --device cuda:0`, the region GPU memory opened over CUDA IPC;
 * it exits 77 (skipped) where no GPU is usable. */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/dram/dram_index.h"
#include "backends/peer_gpu/lend_wire.h"
#include "backends/peer_gpu/peer_gpu.h"
#include "kernels/device.h"
#include "tests/support/lend_proc.h"
#include "tests/support/objects.h"
#include "tests/support/test_support.h"
#include "tests/support/wait.h"

#define KIB     1024ull
#define OBJ     (64 * KIB) /* max_object_bytes: 4 objects a unit of 256KiB */
#define UNITS   4
#define PER     4
#define MAX_LOG 64

static const kvs_backend_ops *ops;

#ifdef KVS_TEST_PEER_CUDA
static const char *const lender_args[] = {"--device", "cuda:0", NULL};
#else
static const char *const *const lender_args = NULL; /* a sealed memfd */
#endif

/* What on_evict saw: keys, and whether the bytes came with them and matched the object's seed. */
typedef struct evict_log {
    pthread_mutex_t lock;
    int n, with_bytes, bytes_ok;
    kvs_key keys[MAX_LOG];
} evict_log;

static void record_evict(void *ctx, const kvs_key *key, const void *object, uint64_t len) {
    evict_log *log = ctx;
    pthread_mutex_lock(&log->lock);
    if (log->n < MAX_LOG) log->keys[log->n] = *key;
    log->n++;
    if (object) {
        log->with_bytes++;
        /* objects are filled from the seed in the key's first 4 bytes (put_object) */
        uint32_t seed;
        memcpy(&seed, key->bytes, 4);
        log->bytes_ok += len == OBJ && kvs_test_bytes_match(object, len, seed);
    }
    pthread_mutex_unlock(&log->lock);
}

typedef struct rig {
    char dir[256], sock[300];
    kvs_test_lender lender;
    evict_log log;
    kvs_backend_host host;
    void *tier;
} rig;

static kvs_status open_tier(rig *r, const char *retry_ms) {
    memset(&r->log, 0, sizeof r->log);
    pthread_mutex_init(&r->log.lock, NULL);
    r->host =
        (kvs_backend_host){.struct_size = sizeof r->host, .ctx = &r->log, .on_evict = record_evict};
    kvs_backend_option opts[] = {{"socket", r->sock}, {"retry_ms", retry_ms}};
    char err[512] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "peer",
                             .max_object_bytes = OBJ,
                             .options = opts,
                             .n_options = 2,
                             .host = &r->host,
                             .error = err,
                             .error_len = sizeof err};
    return ops->create(&init, &r->tier);
}

static void rig_dir(rig *r) {
    memset(r, 0, sizeof *r);
    ck_assert(kvs_test_tmpdir(r->dir, sizeof r->dir) == 0);
    snprintf(r->sock, sizeof r->sock, "%s/lend.sock", r->dir);
}

static kvs_peer_gpu_stats stats(rig *r);

/* A lender of UNITS units of 256KiB lending all, and a tier that took them. */
static void rig_up(rig *r) {
    rig_dir(r);
    kvs_test_lender_start(&r->lender, r->sock, UNITS, "256KiB", lender_args);
    ck_assert_int_eq(open_tier(r, "50"), KVS_OK);
    ck_assert_msg(kvs_test_lender_expect(&r->lender, "accepted", UNITS, 5000), "%s", r->lender.out);
    /* the region is the kind the lender was asked for (test_peer_gpu_cuda: GPU memory) */
    ck_assert_uint_eq(stats(r).on_gpu, lender_args != NULL);
}

static void rig_down(rig *r) {
    ops->destroy(r->tier);
    if (r->lender.pid) kvs_test_lender_stop(&r->lender);
    pthread_mutex_destroy(&r->log.lock);
    kvs_test_rmtree(r->dir);
}

static kvs_key seed_key(uint32_t seed) {
    kvs_key k = kvs_test_key(seed);
    memcpy(k.bytes, &seed, 4);
    return k;
}

static kvs_status put_object(rig *r, uint32_t seed) {
    static uint8_t buf[OBJ];
    kvs_test_fill(buf, OBJ, seed);
    kvs_key k = seed_key(seed);
    return ops->put(r->tier, &k, buf, OBJ);
}

/* KVS_OK only with the object's exact bytes. */
static kvs_status get_object(rig *r, uint32_t seed) {
    static __thread uint8_t buf[OBJ];
    uint64_t len = 0;
    kvs_key k = seed_key(seed);
    kvs_status rc = ops->get(r->tier, &k, buf, OBJ, &len);
    if (rc == KVS_OK && (len != OBJ || !kvs_test_bytes_match(buf, OBJ, seed))) return KVS_ECORRUPT;
    return rc;
}

static kvs_peer_gpu_stats stats(rig *r) {
    kvs_peer_gpu_stats s;
    ck_assert_int_eq(kvs_peer_gpu_stats_get(r->tier, &s), KVS_OK);
    return s;
}

static int usable_is(rig *r, uint32_t want) {
    return stats(r).usable_units == want;
}

static int all_usable(void *arg) {
    return usable_is(arg, UNITS);
}

static void expect_status(rig *r, const char *want) {
    char line[256];
    kvs_test_lender_say(&r->lender, "status");
    while (kvs_test_lender_next(&r->lender, line, sizeof line, 5000))
        if (strncmp(line, "status", 6) == 0) {
            ck_assert_str_eq(line, want);
            return;
        }
    ck_abort_msg("no status line");
}

static void expect_check_ok(rig *r) {
    kvs_test_lender_say(&r->lender, "check");
    char line[256];
    while (kvs_test_lender_next(&r->lender, line, sizeof line, 10000))
        if (strncmp(line, "check", 5) == 0) {
            ck_assert_str_eq(line, "check ok");
            return;
        }
    ck_abort_msg("no check line");
}

START_TEST(objects_live_in_lent_units_bit_for_bit) {
    rig r;
    rig_up(&r);
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    ck_assert_uint_eq(stats(&r).slots_per_unit, PER);
    for (uint32_t i = 0; i < UNITS * PER; i++) ck_assert_int_eq(put_object(&r, 100 + i), KVS_OK);
    for (uint32_t i = 0; i < UNITS * PER; i++) ck_assert_int_eq(get_object(&r, 100 + i), KVS_OK);
    uint64_t n = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(r.tier, &n, &bytes), KVS_OK);
    ck_assert_uint_eq(n, UNITS * PER);
    ck_assert_uint_eq(bytes, UNITS * PER * OBJ);
    /* a range of one */
    uint8_t part[100], whole[OBJ];
    uint64_t got = 0, olen = 0;
    kvs_key k = seed_key(105);
    ck_assert_int_eq(ops->get_range(r.tier, &k, 1000, sizeof part, part, &got, &olen), KVS_OK);
    ck_assert_uint_eq(got, sizeof part);
    ck_assert_uint_eq(olen, OBJ);
    kvs_test_fill(whole, OBJ, 105);
    ck_assert_mem_eq(part, whole + 1000, sizeof part);
    /* full: the least recently used unpinned object goes down the chain with its bytes */
    uint64_t pinned = 0;
    kvs_key first = seed_key(100), second = seed_key(101);
    ck_assert_int_eq(ops->pin(r.tier, &first, 1, 60000, &pinned), KVS_OK);
    ck_assert_uint_eq(pinned, 1);
    ck_assert_int_eq(put_object(&r, 999), KVS_OK);
    ck_assert_int_eq(r.log.n, 1);
    ck_assert_int_eq(r.log.bytes_ok, 1);
    ck_assert_mem_eq(&r.log.keys[0], &second, sizeof second);
    ck_assert_int_eq(get_object(&r, 101), KVS_ENOTFOUND);
    ck_assert_int_eq(get_object(&r, 100), KVS_OK);
    ck_assert_int_eq(get_object(&r, 999), KVS_OK);
    /* an object larger than a slot is refused, not cut */
    static uint8_t big[OBJ + 64];
    kvs_key bk = seed_key(7);
    ck_assert_int_eq(ops->put(r.tier, &bk, big, sizeof big), KVS_ENOMEM);
    ck_assert_int_eq(ops->remove(r.tier, &first), KVS_OK);
    ck_assert_int_eq(get_object(&r, 100), KVS_ENOTFOUND);
    rig_down(&r);
}
END_TEST

START_TEST(a_reclaim_moves_objects_down_and_the_units_stay_untouched) {
    rig r;
    rig_up(&r);
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    for (uint32_t i = 0; i < UNITS * PER; i++) ck_assert_int_eq(put_object(&r, 200 + i), KVS_OK);
    kvs_test_lender_say(&r.lender, "reclaim 2");
    ck_assert_msg(kvs_test_lender_expect(&r.lender, "released", 2, 5000), "%s", r.lender.out);
    /* the 8 objects of the two units went down with their bytes; the rest stay */
    ck_assert_int_eq(r.log.n, 2 * PER);
    ck_assert_int_eq(r.log.bytes_ok, 2 * PER);
    int hits = 0;
    for (uint32_t i = 0; i < UNITS * PER; i++) {
        kvs_status rc = get_object(&r, 200 + i);
        ck_assert(rc == KVS_OK || rc == KVS_ENOTFOUND);
        hits += rc == KVS_OK;
    }
    ck_assert_int_eq(hits, 2 * PER);
    ck_assert_uint_eq(stats(&r).usable_units, 2);
    ck_assert_uint_eq(stats(&r).moved_down, 2 * PER);
    expect_status(&r, "status owned 2 offered 0 lent 2 reclaiming 0 quarantined 0");
    /* the borrower goes on storing: only into what it still holds; the lender's units keep its
     * pattern through all of it */
    for (uint32_t i = 0; i < 3 * UNITS * PER; i++)
        ck_assert_int_eq(put_object(&r, 300 + i), KVS_OK);
    uint64_t n = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(r.tier, &n, &bytes), KVS_OK);
    ck_assert_uint_eq(n, 2 * PER);
    expect_check_ok(&r);
    /* lent again: usable again, and their free slots are taken before anything is evicted */
    kvs_test_lender_say(&r.lender, "lend 2");
    ck_assert(kvs_test_lender_expect(&r.lender, "accepted", 2, 5000));
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    int evicted = r.log.n;
    for (uint32_t i = 0; i < 2 * PER; i++) ck_assert_int_eq(put_object(&r, 500 + i), KVS_OK);
    ck_assert_int_eq(r.log.n, evicted);
    ck_assert_int_eq(ops->usage(r.tier, &n, &bytes), KVS_OK);
    ck_assert_uint_eq(n, UNITS * PER);
    /* full: one put evicts exactly one object; a removed one's slot is taken without evicting */
    ck_assert_int_eq(put_object(&r, 600), KVS_OK);
    ck_assert_int_eq(r.log.n, evicted + 1);
    kvs_key k = seed_key(500);
    ck_assert_int_eq(ops->remove(r.tier, &k), KVS_OK);
    ck_assert_int_eq(put_object(&r, 601), KVS_OK);
    ck_assert_int_eq(r.log.n, evicted + 1);
    rig_down(&r);
}
END_TEST

/* A copy held open by the hook until the test lets it go. */
typedef struct held {
    sem_t entered, go;
    uint32_t unit;
    int armed;
} held;

static int hold_copy(void *ctx, uint32_t unit) {
    held *h = ctx;
    if (!__atomic_exchange_n(&h->armed, 0, __ATOMIC_ACQ_REL)) return 0;
    h->unit = unit;
    sem_post(&h->entered);
    sem_wait(&h->go);
    return 0;
}

/* Fail every copy while *ctx is set, as a GPU error would. */
static int fail_copy(void *ctx, uint32_t unit) {
    (void)unit;
    return *(int *)ctx;
}

/* A copy that fails never leaves bytes a get could return as the object: a failed put is not
 * stored (and is refused for room, so the chain keeps it below), a failed get fails, and a
 * put_range that fails half way takes the object away. */
START_TEST(a_failed_copy_never_leaves_wrong_bytes_visible) {
    rig r;
    rig_up(&r);
    int failing = 1;
    kvs_peer_gpu_set_copy_hook(r.tier, fail_copy, &failing);
    ck_assert_int_eq(put_object(&r, 1), KVS_ENOMEM);
    ck_assert_msg(strstr(ops->last_error(r.tier), "the copy failed"), "%s",
                  ops->last_error(r.tier));
    failing = 0;
    ck_assert_int_eq(get_object(&r, 1), KVS_ENOTFOUND);
    ck_assert_int_eq(put_object(&r, 2), KVS_OK);
    failing = 1;
    ck_assert_int_eq(get_object(&r, 2), KVS_EIO);
    failing = 0;
    ck_assert_int_eq(get_object(&r, 2), KVS_OK); /* a failed read changes nothing */
    static uint8_t junk[OBJ / 2];
    memset(junk, 0x5a, sizeof junk);
    kvs_key k = seed_key(2);
    failing = 1;
    ck_assert_int_eq(ops->put_range(r.tier, &k, 0, junk, sizeof junk), KVS_EIO);
    failing = 0;
    ck_assert_int_eq(get_object(&r, 2), KVS_ENOTFOUND);
    kvs_peer_gpu_stats s = stats(&r);
    ck_assert_uint_eq(s.failed_copies, 3);
    ck_assert_uint_eq(s.objects, 0);
    ck_assert_uint_eq(s.on_gpu, lender_args != NULL);
    /* the slots are free again: every unit takes objects */
    for (uint32_t i = 0; i < UNITS * PER; i++) ck_assert_int_eq(put_object(&r, 10 + i), KVS_OK);
    kvs_peer_gpu_set_copy_hook(r.tier, NULL, NULL);
    rig_down(&r);
}
END_TEST

typedef struct reader {
    rig *r;
    uint32_t seed;
    kvs_status rc;
} reader;

static void *read_one(void *arg) {
    reader *rd = arg;
    rd->rc = get_object(rd->r, rd->seed);
    return NULL;
}

START_TEST(a_reclaim_waits_for_the_copies_in_flight) {
    rig r;
    rig_up(&r);
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    for (uint32_t i = 0; i < UNITS * PER; i++) ck_assert_int_eq(put_object(&r, 400 + i), KVS_OK);
    held h = {.armed = 1};
    sem_init(&h.entered, 0, 0);
    sem_init(&h.go, 0, 0);
    kvs_peer_gpu_set_copy_hook(r.tier, hold_copy, &h);
    reader rd = {.r = &r, .seed = 400 + 5};
    pthread_t t;
    pthread_create(&t, NULL, read_one, &rd);
    sem_wait(&h.entered); /* the read's copy is in flight on unit h.unit */
    kvs_test_lender_say(&r.lender, "reclaim %u", UNITS);
    /* every other unit comes back; the one under the copy does not while the copy runs */
    char line[256], want[32];
    snprintf(want, sizeof want, "released %u", h.unit);
    int others = 0;
    while (others < UNITS - 1 && kvs_test_lender_next(&r.lender, line, sizeof line, 5000)) {
        ck_assert_str_ne(line, want);
        others += strncmp(line, "released", 8) == 0;
    }
    ck_assert_int_eq(others, UNITS - 1);
    ck_assert(!kvs_test_lender_next(&r.lender, line, sizeof line, 300) ||
              strncmp(line, "released", 8) != 0);
    expect_status(&r, "status owned 3 offered 0 lent 0 reclaiming 1 quarantined 0");
    /* the copy ends with the object's bytes: the memory was still the borrower's */
    sem_post(&h.go);
    pthread_join(t, NULL);
    ck_assert_int_eq(rd.rc, KVS_OK);
    ck_assert(kvs_test_lender_expect(&r.lender, want, 1, 5000));
    /* nothing lent now: misses, and puts refused for room (a chain spills them below); no crash */
    ck_assert_int_eq(get_object(&r, 400), KVS_ENOTFOUND);
    ck_assert_int_eq(put_object(&r, 1), KVS_ENOMEM);
    ck_assert_int_eq(get_object(&r, 1), KVS_ENOTFOUND);
    ck_assert_uint_eq(stats(&r).refused_puts, 1);
    expect_check_ok(&r);
    kvs_peer_gpu_set_copy_hook(r.tier, NULL, NULL);
    rig_down(&r);
}
END_TEST

/* A reclaim passes its objects down without holding the tier: while the tier below takes them (a
 * write-back that blocks here), reads of other units go on. */
static sem_t evict_entered, evict_go;
static int evict_armed;

static void blocking_evict(void *ctx, const kvs_key *key, const void *object, uint64_t len) {
    if (__atomic_exchange_n(&evict_armed, 0, __ATOMIC_ACQ_REL)) {
        sem_post(&evict_entered);
        sem_wait(&evict_go);
    }
    record_evict(ctx, key, object, len);
}

START_TEST(a_reclaim_moving_objects_down_holds_up_no_read) {
    rig r;
    rig_up(&r);
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    for (uint32_t i = 0; i < UNITS * PER; i++) ck_assert_int_eq(put_object(&r, 800 + i), KVS_OK);
    sem_init(&evict_entered, 0, 0);
    sem_init(&evict_go, 0, 0);
    r.host.on_evict = blocking_evict;
    evict_armed = 1;
    kvs_test_lender_say(&r.lender, "reclaim 1");
    sem_wait(&evict_entered); /* the link thread is inside the tier below, for one unit */
    /* every object of the other units still reads, at once */
    int hits = 0;
    for (uint32_t i = 0; i < UNITS * PER; i++) hits += get_object(&r, 800 + i) == KVS_OK;
    ck_assert_int_eq(hits, (UNITS - 1) * PER);
    char line[256];
    ck_assert(!kvs_test_lender_next(&r.lender, line, sizeof line, 200) ||
              strncmp(line, "released", 8) != 0); /* not before its objects are down */
    sem_post(&evict_go);
    ck_assert(kvs_test_lender_expect(&r.lender, "released", 1, 5000));
    ck_assert_int_eq(r.log.bytes_ok, PER);
    rig_down(&r);
}
END_TEST

/* A put whose unit is taken back while it copies is never visible, and the unit waits for it. */
static void *write_one(void *arg) {
    reader *rd = arg;
    rd->rc = put_object(rd->r, rd->seed);
    return NULL;
}

START_TEST(a_put_under_a_reclaim_is_not_stored) {
    rig r;
    rig_up(&r);
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    held h = {.armed = 1};
    sem_init(&h.entered, 0, 0);
    sem_init(&h.go, 0, 0);
    kvs_peer_gpu_set_copy_hook(r.tier, hold_copy, &h);
    reader wr = {.r = &r, .seed = 77};
    pthread_t t;
    pthread_create(&t, NULL, write_one, &wr);
    sem_wait(&h.entered);
    kvs_test_lender_say(&r.lender, "reclaim %u", UNITS);
    ck_assert(kvs_test_lender_expect(&r.lender, "released", UNITS - 1, 5000));
    expect_status(&r, "status owned 3 offered 0 lent 0 reclaiming 1 quarantined 0");
    sem_post(&h.go);
    pthread_join(t, NULL);
    ck_assert_int_eq(wr.rc, KVS_ENOMEM); /* not stored: its unit went back (a chain spills it) */
    ck_assert_int_eq(get_object(&r, 77), KVS_ENOTFOUND);
    ck_assert_int_eq(r.log.n, 0);
    ck_assert_uint_eq(stats(&r).refused_puts, 1);
    ck_assert(kvs_test_lender_expect(&r.lender, "released", 1, 5000));
    uint64_t n = 9, bytes = 9;
    ck_assert_int_eq(ops->usage(r.tier, &n, &bytes), KVS_OK);
    ck_assert_uint_eq(n, 0);
    kvs_peer_gpu_set_copy_hook(r.tier, NULL, NULL);
    rig_down(&r);
}
END_TEST

static int all_1024_usable(void *arg) {
    return usable_is(arg, 1024);
}

/* More offers than a socket's queue holds: each side waiting to send while the other does would
 * end the link; the lender keeps its unanswered messages within a window. */
START_TEST(a_thousand_offers_at_once_are_all_taken) {
    rig r;
    rig_dir(&r);
    kvs_test_lender_start(&r.lender, r.sock, 1024, "64KiB", lender_args);
    ck_assert_int_eq(open_tier(&r, "50"), KVS_OK);
    /* deadlines for a loaded machine (without the window the link is lost at once) */
    ck_assert_msg(kvs_test_wait_for(all_1024_usable, &r, 15000), "usable %u, lost lenders %llu",
                  stats(&r).usable_units, (unsigned long long)stats(&r).lost_lenders);
    ck_assert_uint_eq(stats(&r).lost_lenders, 0);
    /* the tier counts a unit usable once it sent its ACCEPT; the lender counts it lent once it read
     * it, and `reclaim N` takes back only what is lent: wait for the lender's own count first */
    ck_assert_msg(kvs_test_lender_expect(&r.lender, "accepted", 1024, 15000), "lender: ...%s",
                  r.lender.out + (r.lender.out_len > 400 ? r.lender.out_len - 400 : 0));
    expect_status(&r, "status owned 0 offered 0 lent 1024 reclaiming 0 quarantined 0");
    kvs_test_lender_say(&r.lender, "reclaim 1024");
    ck_assert_msg(kvs_test_lender_expect(&r.lender, "released", 1024, 15000), "lender: ...%s",
                  r.lender.out + (r.lender.out_len > 400 ? r.lender.out_len - 400 : 0));
    expect_status(&r, "status owned 1024 offered 0 lent 0 reclaiming 0 quarantined 0");
    rig_down(&r);
}
END_TEST

static int disconnected(void *arg) {
    return stats(arg).connected == 0;
}
static int connected(void *arg) {
    return stats(arg).connected == 1 && usable_is(arg, UNITS);
}

START_TEST(a_killed_lender_turns_into_misses_and_a_new_one_is_taken) {
    rig r;
    rig_up(&r);
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    for (uint32_t i = 0; i < 6; i++) ck_assert_int_eq(put_object(&r, 500 + i), KVS_OK);
    kvs_test_lender_kill(&r.lender);
    ck_assert(kvs_test_wait_for(disconnected, &r, 5000));
    ck_assert_int_eq(r.log.n, 6); /* reported gone, without bytes */
    ck_assert_int_eq(r.log.with_bytes, 0);
    ck_assert_uint_eq(stats(&r).lost_objects, 6);
    uint64_t present = 9;
    kvs_key k = seed_key(500);
    ck_assert_int_eq(ops->contains(r.tier, &k, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 0);
    ck_assert_int_eq(get_object(&r, 500), KVS_ENOTFOUND);
    ck_assert_int_eq(put_object(&r, 1), KVS_ENOMEM);
    /* a new lender on the same socket: taken within retry_ms */
    kvs_test_lender_start(&r.lender, r.sock, UNITS, "256KiB", lender_args);
    ck_assert(kvs_test_lender_expect(&r.lender, "accepted", UNITS, 5000));
    ck_assert(kvs_test_wait_for(connected, &r, 5000));
    ck_assert_int_eq(put_object(&r, 600), KVS_OK);
    ck_assert_int_eq(get_object(&r, 600), KVS_OK);
    ck_assert_uint_eq(stats(&r).lenders, 2);
    rig_down(&r);
}
END_TEST

/* A raw borrower on the lender at path: connected, its HELLO read (its descriptor closed), `units`
 * offers accepted. The socket, or -2 (no connection), -3 (turned away: no HELLO), -4 (no offer),
 * -5 (an answer not sent). No Check assertion: child processes use it too. */
static int raw_take(const char *path, int units) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) return close(s), -2;
    kvs_lend_msg m;
    int fd = -1;
    char why[256];
    if (kvs_lend_recv(s, 5000, 0, &m, &fd, why, sizeof why) != KVS_OK || m.type != KVS_LEND_HELLO)
        return close(s), -3;
    close(fd);
    for (int taken = 0; taken < units; taken++) {
        if (kvs_lend_recv(s, 5000, (uint32_t)units, &m, &fd, why, sizeof why) != KVS_OK ||
            m.type != KVS_LEND_OFFER)
            return close(s), -4;
        kvs_lend_msg a = {.type = KVS_LEND_ACCEPT, .unit = m.unit, .epoch = m.epoch};
        if (kvs_lend_send(s, &a, -1, 1000, why, sizeof why) != KVS_OK) return close(s), -5;
    }
    return s;
}

/* A borrower in a child process: a raw one that takes every offer and then closes its socket but
 * lives on (close_only), or the tier itself, killed. */
static pid_t borrower_child(rig *r, int close_only, int ready_fd) {
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid) return pid;
    if (close_only) {
        int s = raw_take(r->sock, UNITS);
        if (s < 0) _exit(-s);
        close(s); /* the process lives on: it could still write */
    } else {
        if (open_tier(r, "50") != KVS_OK) _exit(5);
        while (stats(r).usable_units < UNITS) usleep(1000);
        for (uint32_t i = 0; i < 4; i++)
            if (put_object(r, 700 + i) != KVS_OK) _exit(6);
    }
    if (write(ready_fd, "x", 1) != 1) _exit(7);
    pause();
    _exit(0);
}

START_TEST(a_borrower_s_units_return_only_when_its_process_is_gone) {
    rig r;
    rig_dir(&r);
    kvs_test_lender_start(&r.lender, r.sock, UNITS, "256KiB", lender_args);
    for (int close_only = 1; close_only >= 0; close_only--) {
        int p[2];
        ck_assert(pipe(p) == 0);
        pid_t child = borrower_child(&r, close_only, p[1]);
        char c;
        ck_assert(read(p[0], &c, 1) == 1);
        close(p[0]), close(p[1]);
        ck_assert(kvs_test_lender_expect(&r.lender, "accepted", UNITS, 5000));
        if (close_only) {
            /* the connection is lost, the process lives: its units are nobody's */
            ck_assert(kvs_test_lender_expect(&r.lender, "borrower lost", 1, 5000));
            expect_status(&r, "status owned 0 offered 0 lent 0 reclaiming 0 quarantined 4");
            /* a new borrower is let in meanwhile, and gets nothing of them */
            ck_assert_int_eq(open_tier(&r, "50"), KVS_OK);
            ck_assert(kvs_test_lender_expect(&r.lender, "borrower ", 1, 5000));
            expect_status(&r, "status owned 0 offered 0 lent 0 reclaiming 0 quarantined 4");
            ck_assert_uint_eq(stats(&r).usable_units, 0);
        }
        kill(child, SIGKILL);
        kvs_test_wait_child(child);
        ck_assert_msg(kvs_test_lender_expect(&r.lender, "borrower gone", 1, 5000), "%s",
                      r.lender.out);
        expect_status(&r, "status owned 4 offered 0 lent 0 reclaiming 0 quarantined 0");
        expect_check_ok(&r);
        if (close_only) { /* the new borrower, still connected, can be lent them now */
            kvs_test_lender_say(&r.lender, "lend 4");
            ck_assert(kvs_test_lender_expect(&r.lender, "accepted", UNITS, 5000));
            ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
            ops->destroy(r.tier); /* says BYE: they come back at once */
            ck_assert(kvs_test_lender_expect(&r.lender, "borrower lost", 1, 5000));
            expect_status(&r, "status owned 4 offered 0 lent 0 reclaiming 0 quarantined 0");
            pthread_mutex_destroy(&r.log.lock);
        }
    }
    /* a new borrower gets them all */
    ck_assert_int_eq(open_tier(&r, "50"), KVS_OK);
    ck_assert(kvs_test_lender_expect(&r.lender, "accepted", UNITS, 5000));
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    rig_down(&r);
}
END_TEST

/* A raw borrower in this process (raw_take), the test failing when it is not one. */
static int raw_borrower(rig *r, int units) {
    int s = raw_take(r->sock, units);
    ck_assert_msg(s >= 0, "raw borrower: %d", s);
    return s;
}

START_TEST(one_borrower_at_a_time) {
    rig r;
    rig_dir(&r);
    kvs_test_lender_start(&r.lender, r.sock, UNITS, "256KiB", lender_args);
    int first = raw_borrower(&r, UNITS);
    ck_assert(kvs_test_lender_expect(&r.lender, "accepted", UNITS, 5000));
    int second = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", r.sock);
    ck_assert(connect(second, (struct sockaddr *)&sa, sizeof sa) == 0);
    kvs_lend_msg m;
    int fd = -1;
    char why[256];
    ck_assert_int_eq(kvs_lend_recv(second, 5000, 0, &m, &fd, why, sizeof why), KVS_OK);
    ck_assert_uint_eq(m.type, KVS_LEND_BYE); /* turned away, no HELLO */
    ck_assert_int_eq(fd, -1);
    ck_assert(kvs_test_lender_expect(&r.lender, "refused a second borrower", 1, 5000));
    close(second);
    close(first);
    kvs_test_lender_stop(&r.lender);
    kvs_test_rmtree(r.dir);
}
END_TEST

/* One process that loses its link again and again while it lives takes one quarantine entry, not
 * one each time (the lender has 8: the ninth borrower would be turned away). */
START_TEST(a_process_losing_its_link_often_is_watched_once) {
    rig r;
    rig_dir(&r);
    kvs_test_lender_start(&r.lender, r.sock, UNITS, "256KiB", lender_args);
    int p[2];
    ck_assert(pipe(p) == 0);
    pid_t child = fork();
    ck_assert(child >= 0);
    if (child == 0) {
        for (int i = 0; i < 12; i++) {
            int s = raw_take(r.sock, i == 0 ? UNITS : 0); /* -3: turned away */
            if (s < 0) _exit(-s);
            close(s); /* lost, not BYE: the process lives on */
            usleep(20000);
        }
        if (write(p[1], "x", 1) != 1) _exit(6);
        pause();
        _exit(0);
    }
    close(p[1]); /* a child turned away ends: read sees the end at once */
    char c;
    ck_assert_msg(read(p[0], &c, 1) == 1, "the child was turned away: %s", r.lender.out);
    close(p[0]);
    expect_status(&r, "status owned 0 offered 0 lent 0 reclaiming 0 quarantined 4");
    kill(child, SIGKILL);
    kvs_test_wait_child(child);
    ck_assert(kvs_test_lender_expect(&r.lender, "borrower gone", 1, 5000));
    expect_status(&r, "status owned 4 offered 0 lent 0 reclaiming 0 quarantined 0");
    kvs_test_lender_stop(&r.lender);
    kvs_test_rmtree(r.dir);
}
END_TEST

/* Alg. 1 over the lender's demand: samples that come before the units are back ask no more. */
START_TEST(demand_takes_back_what_covers_it_once) {
    rig r;
    rig_dir(&r);
    const char *extra[] = {"--unit-blocks", "1", NULL};
    kvs_test_lender_start(&r.lender, r.sock, 8, "256KiB", extra);
    int s = raw_borrower(&r, 8); /* takes everything and never releases */
    ck_assert(kvs_test_lender_expect(&r.lender, "accepted", 8, 5000));
    kvs_test_lender_say(&r.lender, "demand 3");
    kvs_test_lender_say(&r.lender, "demand 3");
    kvs_test_lender_say(&r.lender, "demand 3");
    expect_status(&r, "status owned 0 offered 0 lent 5 reclaiming 3 quarantined 0");
    int reclaims = 0;
    kvs_lend_msg m;
    int fd = -1;
    char why[256];
    while (kvs_lend_recv(s, 200, 8, &m, &fd, why, sizeof why) == KVS_OK)
        reclaims += m.type == KVS_LEND_RECLAIM;
    ck_assert_int_eq(reclaims, 3);
    close(s);
    kvs_test_lender_kill(&r.lender);
    kvs_test_rmtree(r.dir);
}
END_TEST

/* Commands: a count past 32 bits, a line longer than any, a last one without its newline. */
START_TEST(the_lender_reads_its_commands_strictly) {
    rig r;
    rig_dir(&r);
    kvs_test_lender_start(&r.lender, r.sock, UNITS, "256KiB", lender_args);
    kvs_test_lender_say(&r.lender, "lend 4294967297");
    ck_assert(kvs_test_lender_expect(&r.lender, "refused lend 4294967297: not a count", 1, 5000));
    kvs_test_lender_say(&r.lender, "reclaim -1");
    ck_assert(kvs_test_lender_expect(&r.lender, "refused reclaim -1: not a count", 1, 5000));
    char longline[600];
    memset(longline, 'x', sizeof longline);
    memcpy(longline + 300, "reclaim 4", 9);
    longline[sizeof longline - 1] = '\n';
    ck_assert(write(r.lender.in_fd, longline, sizeof longline) == (ssize_t)sizeof longline);
    ck_assert(kvs_test_lender_expect(&r.lender, "refused a line longer than any command", 1, 5000));
    expect_status(&r, "status owned 4 offered 0 lent 0 reclaiming 0 quarantined 0");
    ck_assert(write(r.lender.in_fd, "quit", 4) == 4);
    close(r.lender.in_fd);
    ck_assert(kvs_test_lender_expect(&r.lender, "bye", 1, 5000));
    ck_assert_int_eq(kvs_test_wait_child(r.lender.pid), 0);
    close(r.lender.out_fd);
    kvs_test_rmtree(r.dir);
}
END_TEST

/* A lender in a pid namespace of its own cannot watch a borrower outside it (SO_PEERCRED gives it
 * pid 0): it turns the borrower away rather than lend it units it could never quarantine. Needs
 * CAP_SYS_ADMIN for the namespace; added to the suite only when running as root. */
START_TEST(a_borrower_the_lender_cannot_watch_is_turned_away) {
    rig r;
    rig_dir(&r);
    int out[2];
    ck_assert(pipe(out) == 0);
    pid_t outer = fork();
    ck_assert(outer >= 0);
    if (outer == 0) {
        if (unshare(CLONE_NEWPID) != 0) _exit(3);
        pid_t inner = fork(); /* pid 1 of the new namespace */
        if (inner == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            dup2(out[1], 1);
            int null = open("/dev/null", O_RDONLY);
            dup2(null, 0);
            char bin[600];
            snprintf(bin, sizeof bin, "%s/kvstrata-lend", KVS_TEST_BIN_DIR);
            execl(bin, bin, "--socket", r.sock, "--units", "4", "--unit-size", "256KiB",
                  (char *)NULL);
            _exit(127);
        }
        _exit(kvs_test_wait_child(inner));
    }
    close(out[1]);
    kvs_test_lender lp = {.pid = outer, .in_fd = -1, .out_fd = out[0]};
    ck_assert_msg(kvs_test_lender_expect(&lp, "ready", 1, 10000), "%s", lp.out);
    ck_assert_int_eq(open_tier(&r, "60000"), KVS_OK);
    ck_assert_msg(
        kvs_test_lender_expect(&lp, "refused a borrower whose process cannot be watched", 1, 5000),
        "%s", lp.out);
    ck_assert_uint_eq(stats(&r).connected, 0);
    ops->destroy(r.tier);
    pthread_mutex_destroy(&r.log.lock);
    kill(outer, SIGKILL);
    kvs_test_wait_child(outer);
    close(out[0]);
    kvs_test_rmtree(r.dir);
}
END_TEST

/* ---- lenders that break the protocol -------------------------------------------------------- */

/* A fake lender: listens on r->sock, accepts one connection and sends what the test says. */
static int fake_listen(rig *r) {
    int l = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", r->sock);
    ck_assert(bind(l, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(l, 4) == 0);
    return l;
}

typedef struct fake {
    int listen_fd, conn, memfd;
    int seal;
    uint64_t unit_bytes;
    const void *after; /* a packet sent after the HELLO (NULL: none) */
    size_t after_len;
    int hello_again; /* send the HELLO twice */
    int cuda;        /* the HELLO names a CUDA region (a handle no GPU has) */
} fake;

static void *fake_serve(void *arg) {
    fake *f = arg;
    f->conn = accept(f->listen_fd, NULL, NULL);
    f->memfd = memfd_create("fake", MFD_ALLOW_SEALING);
    if (ftruncate(f->memfd, (off_t)(f->unit_bytes * 2)) != 0) return NULL;
    if (f->seal) fcntl(f->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    kvs_lend_msg m = {.type = KVS_LEND_HELLO,
                      .n_units = 2,
                      .unit_bytes = f->unit_bytes,
                      .region_bytes = f->unit_bytes * 2};
    if (f->cuda) {
        m.region_kind = KVS_LEND_REGION_CUDA;
        memset(m.ipc, 0x5a, sizeof m.ipc);
    }
    char why[256];
    kvs_lend_send(f->conn, &m, f->cuda ? -1 : f->memfd, 1000, why, sizeof why);
    if (f->hello_again) kvs_lend_send(f->conn, &m, f->memfd, 1000, why, sizeof why);
    if (f->after) send(f->conn, f->after, f->after_len, MSG_NOSIGNAL);
    return NULL;
}

/* Open a tier on the fake; its stats once the fake said its piece, and its last error in why. */
static kvs_peer_gpu_stats with_fake(rig *r, fake *f, char *why, size_t why_len) {
    f->listen_fd = fake_listen(r);
    pthread_t t;
    pthread_create(&t, NULL, fake_serve, f);
    char timeout[32];
    snprintf(timeout, sizeof timeout, "%d", kvs_test_scaled_ms(20000));
    memset(&r->log, 0, sizeof r->log);
    pthread_mutex_init(&r->log.lock, NULL);
    r->host =
        (kvs_backend_host){.struct_size = sizeof r->host, .ctx = &r->log, .on_evict = record_evict};
    kvs_backend_option opts[] = {
        {"socket", r->sock}, {"retry_ms", "60000"}, {"connect_timeout_ms", timeout}};
    char err[512] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "peer",
                             .max_object_bytes = OBJ,
                             .options = opts,
                             .n_options = 3,
                             .host = &r->host,
                             .error = err,
                             .error_len = sizeof err};
    ck_assert_int_eq(ops->create(&init, &r->tier), KVS_OK); /* a refused lender is no failure */
    pthread_join(t, NULL);
    if (f->after || f->hello_again) ck_assert(kvs_test_wait_for(disconnected, r, 10000));
    kvs_peer_gpu_stats s = stats(r);
    snprintf(why, why_len, "%s", ops->last_error(r->tier));
    ck_assert_int_eq(put_object(r, 1), KVS_ENOMEM); /* nothing lent */
    ck_assert_int_eq(get_object(r, 1), KVS_ENOTFOUND);
    ops->destroy(r->tier);
    close(f->conn), close(f->memfd), close(f->listen_fd);
    unlink(r->sock);
    pthread_mutex_destroy(&r->log.lock);
    return s;
}

START_TEST(lenders_that_break_the_protocol_are_refused) {
    rig r;
    rig_dir(&r);
    char why[512];
    /* a region the lender could shrink under the mapping */
    fake unsealed = {.seal = 0, .unit_bytes = 256 * KIB};
    kvs_peer_gpu_stats s = with_fake(&r, &unsealed, why, sizeof why);
    ck_assert_uint_eq(s.lenders, 0);
    ck_assert_msg(strstr(why, "not sealed"), "%s", why);
    /* units too small for one object */
    fake small = {.seal = 1, .unit_bytes = 32 * KIB};
    s = with_fake(&r, &small, why, sizeof why);
    ck_assert_uint_eq(s.lenders, 0);
    ck_assert_msg(strstr(why, "hold no object"), "%s", why);
    /* a good HELLO, then a packet that is no message: the link ends, nothing was usable */
    static const uint8_t junk[] = {0x94, 0x01, 0x02, 0xcc};
    fake bad = {.seal = 1, .unit_bytes = 256 * KIB, .after = junk, .after_len = sizeof junk};
    s = with_fake(&r, &bad, why, sizeof why);
    ck_assert_uint_eq(s.lenders, 1);
    ck_assert_uint_eq(s.lost_lenders, 1);
    /* an offer of a unit past the count: refused by the reader, the link ends */
    uint8_t offer[KVS_LEND_WIRE_MAX];
    kvs_lend_msg m = {.type = KVS_LEND_OFFER, .unit = 7, .epoch = 1};
    size_t n = kvs_lend_encode(&m, offer);
    fake past = {.seal = 1, .unit_bytes = 256 * KIB, .after = offer, .after_len = n};
    s = with_fake(&r, &past, why, sizeof why);
    ck_assert_uint_eq(s.lost_lenders, 1);
    ck_assert_uint_eq(s.accepted, 0);
    /* a second HELLO is out of place: the link ends */
    fake twice = {.seal = 1, .unit_bytes = 256 * KIB, .hello_again = 1};
    s = with_fake(&r, &twice, why, sizeof why);
    ck_assert_uint_eq(s.lenders, 1);
    ck_assert_uint_eq(s.lost_lenders, 1);
    /* a CUDA region where the CUDA module cannot be loaded: refused, with the reason */
    setenv("KVS_CUDA_MODULE", "/nonexistent/libkvstrata-cuda.so.1", 1);
    fake gpu = {.seal = 1, .unit_bytes = 256 * KIB, .cuda = 1};
    s = with_fake(&r, &gpu, why, sizeof why);
    ck_assert_uint_eq(s.lenders, 0);
    ck_assert_msg(strstr(why, "GPU memory and the CUDA module is not usable") &&
                      strstr(why, "KVS_CUDA_MODULE=/nonexistent"),
                  "%s", why);
    /* and with the module this build has: no GPU here, or (on a GPU) a handle no process
     * exported; either way refused, never mapped */
    unsetenv("KVS_CUDA_MODULE");
    fake gpu2 = {.seal = 1, .unit_bytes = 256 * KIB, .cuda = 1};
    s = with_fake(&r, &gpu2, why, sizeof why);
    ck_assert_uint_eq(s.lenders, 0);
    ck_assert_msg(strstr(why, "GPU memory") || strstr(why, "opening its region"), "%s", why);
    /* no lender at all: the tier opens empty, and says why */
    ck_assert_int_eq(open_tier(&r, "60000"), KVS_OK);
    ck_assert_uint_eq(stats(&r).connected, 0);
    ck_assert_msg(strstr(ops->last_error(r.tier), "no lender at"), "%s", ops->last_error(r.tier));
    ck_assert_int_eq(get_object(&r, 1), KVS_ENOTFOUND);
    ops->destroy(r.tier);
    kvs_test_rmtree(r.dir);
}
END_TEST

/* A lender that accepts nothing (its queue full) never holds the tier: destroy returns. */
START_TEST(a_lender_that_accepts_nothing_never_holds_the_tier) {
    rig r;
    rig_dir(&r);
    int l = fake_listen(&r); /* listens, never accepts: connections fill its queue */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(open_tier(&r, "10"), KVS_OK);
        ck_assert_uint_eq(stats(&r).connected, 0);
        kvs_test_pause_ms(50); /* retries pile up in the queue meanwhile */
        double t0 = kvs_test_now_ms();
        ops->destroy(r.tier);
        ck_assert(kvs_test_now_ms() - t0 < kvs_test_scaled_ms(5000));
    }
    close(l);
    kvs_test_rmtree(r.dir);
}
END_TEST

START_TEST(options_are_checked) {
    kvs_backend_host host = {.struct_size = sizeof host};
    char err[512] = "", refused[64] = "";
    kvs_backend_option bad[] = {{"retry_ms", "5"}};
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "peer",
                             .max_object_bytes = OBJ,
                             .options = bad,
                             .n_options = 0,
                             .host = &host,
                             .error = err,
                             .error_len = sizeof err,
                             .error_option = refused,
                             .error_option_len = sizeof refused};
    void *t = NULL;
    ck_assert_int_eq(ops->create(&init, &t), KVS_ECONFIG); /* no socket */
    ck_assert_str_eq(refused, "socket");
    ck_assert_ptr_nonnull(strstr(err, "required"));
    kvs_backend_option low[] = {{"socket", "/nonexistent/x.sock"}, {"retry_ms", "5"}};
    init.options = low;
    init.n_options = 2;
    ck_assert_int_eq(ops->create(&init, &t), KVS_ECONFIG);
    ck_assert_str_eq(refused, "retry_ms");
}
END_TEST

#ifndef KVS_TEST_PEER_CUDA
/* The lender's --device: a word it does not know, and a GPU region without the CUDA module. */
START_TEST(the_lender_checks_its_device) {
    char cmd[1024], out[512];
    snprintf(cmd, sizeof cmd,
             "%s/kvstrata-lend --socket /nonexistent/l.sock --units 1 --unit-size 4KiB "
             "--device gpu 2>&1 </dev/null",
             KVS_TEST_BIN_DIR);
    FILE *f = popen(cmd, "r");
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    ck_assert_int_eq(WEXITSTATUS(pclose(f)), 2);
    ck_assert_msg(strstr(out, "bad value for --device: host or cuda:N"), "%s", out);
    snprintf(cmd, sizeof cmd,
             "KVS_CUDA_MODULE=/nonexistent/libkvstrata-cuda.so.1 %s/kvstrata-lend --socket "
             "/nonexistent/l.sock --units 1 --unit-size 4KiB --device cuda:0 2>&1 </dev/null",
             KVS_TEST_BIN_DIR);
    f = popen(cmd, "r");
    n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    ck_assert_int_eq(WEXITSTATUS(pclose(f)), 1);
    ck_assert_msg(strstr(out, "--device cuda:0 needs the CUDA module: KVS_CUDA_MODULE="), "%s",
                  out);
}
END_TEST
#endif

/* A tier with index_shm: owner (a worker: it has staging, it borrows) or lookup-only (a scheduler:
 * no staging, it borrows nothing and answers from what the owners publish). */
static kvs_status open_indexed(rig *r, void **tier, int owner, const char *shm) {
    static uint8_t staging[4096] __attribute__((aligned(4096)));
    kvs_backend_option opts[] = {{"socket", r->sock}, {"retry_ms", "50"}, {"index_shm", shm}};
    char err[512] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "peer",
                             .max_object_bytes = OBJ,
                             .options = opts,
                             .n_options = 3,
                             .host = &r->host,
                             .error = err,
                             .error_len = sizeof err,
                             .staging_base = owner ? staging : NULL,
                             .staging_len = owner ? sizeof staging : 0};
    kvs_status rc = ops->create(&init, tier);
    ck_assert_msg(rc == KVS_OK, "%s", err);
    return rc;
}

static uint64_t present(void *tier, uint32_t seed) {
    kvs_key k = seed_key(seed);
    uint64_t n = 9;
    ck_assert_int_eq(ops->contains(tier, &k, 1, &n), KVS_OK);
    return n;
}

START_TEST(a_scheduler_finds_and_pins_what_a_worker_holds_in_lent_memory) {
    rig r;
    rig_dir(&r);
    memset(&r.log, 0, sizeof r.log);
    pthread_mutex_init(&r.log.lock, NULL);
    r.host =
        (kvs_backend_host){.struct_size = sizeof r.host, .ctx = &r.log, .on_evict = record_evict};
    char shm[64];
    snprintf(shm, sizeof shm, "kvs-test-peer-%d", (int)getpid());
    kvs_test_lender_start(&r.lender, r.sock, UNITS, "256KiB", lender_args);
    void *sched = NULL;
    ck_assert_int_eq(open_indexed(&r, &sched, 0, shm), KVS_OK);
    ck_assert_int_eq(open_indexed(&r, &r.tier, 1, shm), KVS_OK);
    /* only the owner borrowed: the lender serves one borrower, and it is the worker */
    ck_assert_msg(kvs_test_lender_expect(&r.lender, "accepted", UNITS, 5000), "%s", r.lender.out);
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    ck_assert(ops->instance_caps(sched) & KVS_BACKEND_CAP_SHARED);
    ck_assert(ops->instance_caps(r.tier) & KVS_BACKEND_CAP_SHARED);
    for (uint32_t i = 0; i < UNITS * PER; i++) ck_assert_int_eq(put_object(&r, 700 + i), KVS_OK);
    uint64_t n = 0, bytes = 0;
    ck_assert_int_eq(ops->usage(sched, &n, &bytes), KVS_OK);
    ck_assert_uint_eq(n, UNITS * PER);
    /* the scheduler pins the least recently used object: the next put evicts the one after it */
    kvs_key k700 = seed_key(700);
    uint64_t pinned = 0;
    ck_assert_int_eq(ops->pin(sched, &k700, 1, 60000, &pinned), KVS_OK);
    ck_assert_uint_eq(pinned, 1);
    ck_assert_int_eq(put_object(&r, 800), KVS_OK);
    ck_assert_int_eq(r.log.n, 1);
    kvs_key k701 = seed_key(701);
    ck_assert(memcmp(&r.log.keys[0], &k701, sizeof k701) == 0);
    ck_assert_int_eq(get_object(&r, 700), KVS_OK);
    ck_assert_uint_eq(present(sched, 700), 1);
    ck_assert_uint_eq(present(sched, 701), 0); /* withdrawn with the eviction */
    ck_assert_uint_eq(present(sched, 800), 1);
    ck_assert_int_eq(ops->unpin(sched, &k700, 1), KVS_OK);
    static uint8_t buf[OBJ];
    uint64_t len = 0;
    ck_assert_int_eq(ops->get(sched, &k700, buf, OBJ, &len), KVS_ENOTSUP);
    ck_assert_int_eq(ops->put(sched, &k700, buf, OBJ), KVS_ENOTSUP);
    /* a reclaim takes two units' objects away: the scheduler no longer finds them */
    kvs_test_lender_say(&r.lender, "reclaim 2");
    ck_assert_msg(kvs_test_lender_expect(&r.lender, "released", 2, 5000), "%s", r.lender.out);
    ck_assert_int_eq(ops->usage(sched, &n, &bytes), KVS_OK);
    ck_assert_uint_eq(n, 2 * PER);
    /* a worker that closes withdraws what it held */
    ops->destroy(r.tier);
    ck_assert_int_eq(ops->usage(sched, &n, &bytes), KVS_OK);
    ck_assert_uint_eq(n, 0);
    /* a worker killed leaves its entries (published here as it would have); the new one's miss on
     * each withdraws it */
    kvs_dram_index *ix = NULL;
    char why[256];
    ck_assert_int_eq(kvs_dram_index_open(shm, 1u << 18, "peer", NULL, &ix, why, sizeof why),
                     KVS_OK);
    kvs_key k900 = seed_key(900);
    kvs_dram_index_held(ix, &k900, 0);
    ck_assert_int_eq(open_indexed(&r, &r.tier, 1, shm), KVS_OK);
    ck_assert_uint_eq(present(sched, 900), 1);
    ck_assert_int_eq(get_object(&r, 900), KVS_ENOTFOUND);
    ck_assert_uint_eq(present(sched, 900), 0);
    /* a lookup's pin on a stored key survives the same key put again */
    ck_assert(kvs_test_wait_for(all_usable, &r, 5000));
    ck_assert_int_eq(put_object(&r, 901), KVS_OK);
    kvs_key k901 = seed_key(901);
    ck_assert_int_eq(ops->pin(sched, &k901, 1, 60000, &pinned), KVS_OK);
    ck_assert_uint_eq(pinned, 1);
    ck_assert_int_eq(put_object(&r, 901), KVS_OK);
    ck_assert(kvs_dram_index_pinned(ix, &k901));
    ck_assert_int_eq(get_object(&r, 901), KVS_OK);
    kvs_dram_index_close(ix);
    ops->destroy(sched);
    rig_down(&r);
}
END_TEST

static Suite *suite(void) {
    ops = kvs_peer_gpu_backend();
    Suite *s = suite_create("peer_gpu");
    TCase *tc = tcase_create("peer_gpu");
    tcase_set_timeout(tc,
                      60); /* x3 under ASan: a stuck case is named before ctest's 300 s end it */
    tcase_add_test(tc, objects_live_in_lent_units_bit_for_bit);
    tcase_add_test(tc, a_scheduler_finds_and_pins_what_a_worker_holds_in_lent_memory);
    tcase_add_test(tc, a_reclaim_moves_objects_down_and_the_units_stay_untouched);
    tcase_add_test(tc, a_reclaim_waits_for_the_copies_in_flight);
    tcase_add_test(tc, a_put_under_a_reclaim_is_not_stored);
    tcase_add_test(tc, a_reclaim_moving_objects_down_holds_up_no_read);
    tcase_add_test(tc, a_thousand_offers_at_once_are_all_taken);
    tcase_add_test(tc, a_killed_lender_turns_into_misses_and_a_new_one_is_taken);
    tcase_add_test(tc, a_failed_copy_never_leaves_wrong_bytes_visible);
#ifdef KVS_TEST_PEER_CUDA
    /* the rest fork borrowers without exec (CUDA does not survive that in a child) or test the
     * host region and the protocol, which the GPU does not change */
#else
    tcase_add_test(tc, a_borrower_s_units_return_only_when_its_process_is_gone);
    tcase_add_test(tc, lenders_that_break_the_protocol_are_refused);
    tcase_add_test(tc, a_lender_that_accepts_nothing_never_holds_the_tier);
    tcase_add_test(tc, one_borrower_at_a_time);
    tcase_add_test(tc, a_process_losing_its_link_often_is_watched_once);
    tcase_add_test(tc, demand_takes_back_what_covers_it_once);
    tcase_add_test(tc, the_lender_reads_its_commands_strictly);
    tcase_add_test(tc, the_lender_checks_its_device);
    tcase_add_test(tc, options_are_checked);
    if (geteuid() == 0)
        tcase_add_test(tc, a_borrower_the_lender_cannot_watch_is_turned_away);
    else
        printf("peer_gpu: a_borrower_the_lender_cannot_watch_is_turned_away not run (needs root "
               "for a pid namespace)\n");
#endif
    suite_add_tcase(s, tc);
    return s;
}

#ifdef KVS_TEST_PEER_CUDA
/* 1 when a GPU is usable. Asked in a child: this process must not start CUDA before it forks the
 * cases (a CUDA context does not survive fork). */
static int gpu_usable(char *why, size_t why_len) {
    int p[2];
    if (pipe(p) != 0) return 0;
    pid_t child = fork();
    if (child == 0) {
        close(p[0]);
        char err[512] = "";
        void *dl = NULL;
        const kvs_device_ops *dev = kvs_device_cuda_load(&dl, err, sizeof err);
        int n = 0;
        if (dev && dev->mem) dev->mem->count(&n, err, sizeof err);
        if (write(p[1], err, strlen(err)) < 0) _exit(2);
        _exit(n > 0 ? 0 : 1);
    }
    close(p[1]);
    ssize_t got = read(p[0], why, why_len - 1);
    why[got > 0 ? got : 0] = '\0';
    close(p[0]);
    return child > 0 && kvs_test_wait_child(child) == 0;
}
#endif

int main(void) {
#ifdef KVS_TEST_PEER_CUDA
    char why[512];
    if (!gpu_usable(why, sizeof why)) {
        printf("test_peer_gpu_cuda: skipped: no usable CUDA device (%s)\n", why);
        return 77;
    }
#endif
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
