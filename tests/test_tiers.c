/* test_tiers.c - the chain of tiers (connector/tiers.c) under the connector: eviction, plugin
 * backends and the ones it refuses, a top tier that drops saves it accepted, and one shared tier under
 * several threads' handles. */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "abi/kvstrata.h"
#include "backends/ssd/ssd.h"
#include "connector/config.h"
#include "connector/handle.h"
#include "connector/tiers.h"
#include "tests/support/connector_rig.h"
#include "tests/support/wait.h"

static const kvs_api *api;

static void setup(void) {
    api = kvs_get_api(KVS_ABI_MAJOR);
    rig_setup();
}

static void teardown(void) {
    rig_teardown();
}

static const char *plugin_config(const char *so) {
    static char text[1024];
    snprintf(text, sizeof text,
             "%schunk_tokens: 32\ntiers:\n  - name: mem\n    type: plugin\n    plugin: %s/%s\n"
             "    options:\n      slots: \"16\"\n",
             rig_device_section(), KVS_TEST_LIB_DIR, so);
    return rig_config("plugin.yaml", text);
}

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
    rig_make_tokens(t, 128, 100 + a->index % 2);
    uint32_t own[8], other[8];
    rig_blocks_from(own, 8, 0);
    rig_blocks_from(other, 8, 32);
    int ok = 1;
    for (int round = 0; round < 20 && ok; round++) {
        char id[32];
        snprintf(id, sizeof id, "t%d-%d", a->index, round);
        uint64_t hit = rig_prefill(&r, id, t, 128, round % 2 ? other : own);
        ok = hit <= 127 && rig_kv_matches(&r, round % 2 ? other : own, t, 0, 128);
    }
    rig_close(&r);
    a->ok = ok;
    return NULL;
}

START_TEST(eviction_under_pressure_keeps_the_newest) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_dram_config(4, 30000)), KVS_OK);
    int32_t t1[128], t2[128];
    uint32_t a[8];
    rig_blocks_from(a, 8, 0);
    rig_make_tokens(t1, 128, 11);
    rig_make_tokens(t2, 128, 12);
    ck_assert_uint_eq(rig_prefill(&r, "one", t1, 128, a), 0);
    ck_assert_uint_eq(rig_prefill(&r, "two", t2, 128, a), 0);
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.chunks_saved, 8);
    ck_assert_uint_eq(s.evictions, 4);
    for (int c = 0; c < 4; c++) {
        ck_assert(!rig_stored(&r, t1, (uint64_t)c));
        ck_assert(rig_stored(&r, t2, (uint64_t)c));
    }
    kvs_event ev[64];
    uint64_t n = 0;
    ck_assert_int_eq(api->take_events(r.h, ev, 64, &n), KVS_OK);
    ck_assert_uint_eq(n, 12); /* 8 stored, 4 removed */
    rig_close(&r);
}
END_TEST

START_TEST(a_plugin_backend_round_trips_through_staging) {
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, plugin_config("plugin_memory.so")), KVS_OK);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 61);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 10);
    ck_assert_uint_eq(rig_prefill(&r, "one", t, 128, a), 0);
    ck_assert_uint_eq(rig_prefill(&r, "two", t, 128, b), 127);
    ck_assert(rig_kv_matches(&r, b, t, 0, 127));
    rig_close(&r);
}
END_TEST

typedef struct close_events {
    int stored_below; /* STORED events for tier 1 */
} close_events;

static void count_stored(void *ctx, uint8_t kind, const kvs_key *key, uint32_t tier) {
    (void)key;
    close_events *e = ctx;
    if ((kind & ~KVS_TIER_EVENT_DROPPED) == KVS_EVENT_STORED && tier == 1) e->stored_below++;
}

/* A tier that passes its objects down as it closes finds the tier below still open: the chain
 * closes top down (bottom up, the objects went into a destroyed tier). */
START_TEST(a_tier_closing_passes_its_objects_to_a_tier_still_open) {
    char text[1024], err[512];
    snprintf(text, sizeof text,
             "chunk_tokens: 32\ntiers:\n  - name: mem\n    type: plugin\n"
             "    plugin: %s/plugin_memory.so\n    options:\n      write_back_on_close: \"1\"\n"
             "  - name: dram\n    type: dram\n    capacity: 1MiB\n",
             KVS_TEST_LIB_DIR);
    kvs_config *cfg = NULL;
    ck_assert_int_eq(kvs_config_load(rig_config("close.yaml", text), &cfg, err, sizeof err),
                     KVS_OK);
    close_events ev = {0};
    kvs_tier_chain *chain = NULL;
    ck_assert_int_eq(
        kvs_tiers_open(cfg, 4096, NULL, NULL, 0, count_stored, &ev, &chain, err, sizeof err),
        KVS_OK);
    uint8_t obj[1000];
    memset(obj, 7, sizeof obj);
    for (uint32_t i = 0; i < 5; i++) {
        kvs_key k;
        memset(&k, 0, sizeof k);
        memcpy(k.bytes, &i, sizeof i);
        ck_assert_int_eq(kvs_tiers_put(chain, &k, obj, sizeof obj, err, sizeof err), KVS_OK);
    }
    kvs_tiers_close(chain);
    ck_assert_int_eq(ev.stored_below, 5);
    kvs_config_free(cfg);
}
END_TEST

/* A peer_gpu tier moves objects down from its own thread: a backend below it that takes one call
 * at a time is refused when the chain opens, at its tier. */
START_TEST(a_tier_below_a_peer_gpu_tier_must_be_thread_safe) {
    char text[1024];
    snprintf(text, sizeof text,
             "%schunk_tokens: 32\ntiers:\n  - name: peer\n    type: peer_gpu\n    options:\n"
             "      socket: nobody.sock\n      connect_timeout_ms: 1\n"
             "  - name: mem\n    type: plugin\n    plugin: %s/plugin_memory.so\n",
             rig_device_section(), KVS_TEST_LIB_DIR);
    rig r;
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_config("peer-plugin.yaml", text)),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(r.error, "tier \"mem\": a peer_gpu tier above it"), "%s", r.error);
    ck_assert_ptr_null(r.h);
}
END_TEST

typedef struct spill_events {
    int stored[3], removed[3];
} spill_events;

static void count_events(void *ctx, uint8_t kind, const kvs_key *key, uint32_t tier) {
    (void)key;
    spill_events *e = ctx;
    if (tier > 2) return;
    if ((kind & ~KVS_TIER_EVENT_DROPPED) == KVS_EVENT_STORED) e->stored[tier]++;
    if ((kind & ~KVS_TIER_EVENT_DROPPED) == KVS_EVENT_REMOVED) e->removed[tier]++;
}

/* A peer_gpu tier with nothing lent refuses puts for room: a save goes to the tier below instead,
 * and so does what a tier above it evicts; only the tier that stores it is named. */
START_TEST(a_tier_without_room_spills_saves_and_write_backs_to_the_next) {
    char text[1024], err[512];
    snprintf(text, sizeof text,
             "chunk_tokens: 32\ntiers:\n  - name: peer\n    type: peer_gpu\n    options:\n"
             "      socket: nobody.sock\n      connect_timeout_ms: 1\n"
             "  - name: dram\n    type: dram\n    capacity: 1MiB\n");
    kvs_config *cfg = NULL;
    ck_assert_int_eq(kvs_config_load(rig_config("spill.yaml", text), &cfg, err, sizeof err),
                     KVS_OK);
    spill_events ev = {0};
    kvs_tier_chain *chain = NULL;
    ck_assert_int_eq(
        kvs_tiers_open(cfg, 4096, NULL, NULL, 0, count_events, &ev, &chain, err, sizeof err),
        KVS_OK);
    uint8_t obj[1000];
    memset(obj, 7, sizeof obj);
    kvs_key k;
    memset(&k, 0, sizeof k);
    k.bytes[0] = 1;
    ck_assert_int_eq(kvs_tiers_put(chain, &k, obj, sizeof obj, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_tiers_find(chain, &k), 1);
    ck_assert_int_eq(ev.stored[0], 0);
    ck_assert_int_eq(ev.removed[0], 0);
    ck_assert_int_eq(ev.stored[1], 1);
    kvs_tiers_close(chain);
    kvs_config_free(cfg);
    /* under a small dram tier, over another: what dram evicts skips the peer tier */
    snprintf(text, sizeof text,
             "chunk_tokens: 32\ntiers:\n  - name: small\n    type: dram\n    capacity: 8KiB\n"
             "  - name: peer\n    type: peer_gpu\n    options:\n"
             "      socket: nobody.sock\n      connect_timeout_ms: 1\n"
             "  - name: big\n    type: dram\n    capacity: 1MiB\n");
    ck_assert_int_eq(kvs_config_load(rig_config("spill2.yaml", text), &cfg, err, sizeof err),
                     KVS_OK);
    memset(&ev, 0, sizeof ev);
    ck_assert_int_eq(
        kvs_tiers_open(cfg, 4096, NULL, NULL, 0, count_events, &ev, &chain, err, sizeof err),
        KVS_OK);
    for (uint8_t i = 0; i < 4; i++) {
        k.bytes[0] = (uint8_t)(10 + i);
        ck_assert_int_eq(kvs_tiers_put(chain, &k, obj, sizeof obj, err, sizeof err), KVS_OK);
    }
    ck_assert_int_gt(ev.stored[2], 0); /* evicted from small, into big */
    ck_assert_int_eq(ev.stored[1], 0);
    k.bytes[0] = 10;
    ck_assert_int_eq(kvs_tiers_find(chain, &k), 2);
    kvs_tiers_close(chain);
    kvs_config_free(cfg);
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
             "tiers:\n  - name: mem\n    type: plugin\n    plugin: %s/dram.yaml\n", rig_tmpdir);
    ck_assert_ptr_nonnull(rig_dram_config(4, 100)); /* a file that exists, not a shared object */
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_config("p.yaml", text)), KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(r.error, "p.yaml:4:13: key 'tiers[0].plugin'"));
    ck_assert_ptr_nonnull(strstr(r.error, "cannot load plugin"));
}
END_TEST

/* The stats of h in *s, until saves_skipped reaches `want` (the ssd tier writes in the background). */
typedef struct stats_wait {
    kvs_handle *h;
    kvs_stats *s;
    uint64_t want;
} stats_wait;

static int saves_skipped_reached(void *p) {
    stats_wait *w = p;
    ck_assert_int_eq(api->stats(w->h, w->s), KVS_OK);
    return w->s->saves_skipped == w->want;
}

/* An ssd top tier whose device refuses every write (ENOSPC, nothing to evict) accepts each put and
 * drops it in the background: the drops reach the stats as skipped saves, not as saved chunks. */
START_TEST(saves_a_full_device_drops_after_accepting_them_count_as_skipped) {
    rig r;
    char text[1024], disk[600];
    snprintf(disk, sizeof disk, "%s/disk", rig_tmpdir);
    ck_assert_int_eq(mkdir(disk, 0700), 0);
    snprintf(
        text, sizeof text,
        "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n  - name: nvme\n    type: ssd\n"
        "    capacity: 4MiB\n    paths: [%s]\n    options:\n      fault_inject: enospc_after:0\n",
        rig_device_section(), CHUNK, disk);
    ck_assert_int_eq(rig_open(&r, KVS_ROLE_BOTH, rig_config("ssd.yaml", text)), KVS_OK);
    int32_t tokens[128];
    uint32_t a[8];
    rig_make_tokens(tokens, 128, 5);
    rig_blocks_from(a, 8, 0);
    ck_assert_uint_eq(rig_prefill(&r, "a", tokens, 128, a), 0);
    kvs_stats s = {.struct_size = sizeof s};
    stats_wait w = {r.h, &s, 4};
    ck_assert_msg(
        kvs_test_wait_for(saves_skipped_reached, &w, 20000), /* written in the background */
        "%llu saves skipped", (unsigned long long)s.saves_skipped);
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

/* An ssd tier over `paths` ("[a]" or "[a, b]" under rig_tmpdir, made here) whose fault_inject is
 * `faults`, below `above` (a tier entry or ""), with `extra` added to its entry. */
static const char *ssd_config(const char *above, const char *paths, const char *faults,
                              const char *extra) {
    static char text[2048];
    char dirs[1400] = "", one[600];
    for (const char *c = paths; *c; c++) {
        if (*c < 'a' || *c > 'z') continue;
        snprintf(one, sizeof one, "%s/%c", rig_tmpdir, *c);
        ck_assert_int_eq(mkdir(one, 0700), 0);
        size_t at = strlen(dirs);
        snprintf(dirs + at, sizeof dirs - at, "%s%s", at ? ", " : "", one);
    }
    snprintf(text, sizeof text,
             "%schunk_tokens: %d\npool:\n  staging_bytes: 1MiB\ntiers:\n%s  - name: nvme\n"
             "    type: ssd\n    capacity: 4MiB\n    paths: [%s]\n%s    options:\n"
             "      fault_inject: %s\n",
             rig_device_section(), CHUNK, above, dirs, extra, faults);
    return rig_config("ssd.yaml", text);
}

/* What this process writes to stderr goes to a file until stderr_restore: the connector's log. */
static int stderr_to(const char *path) {
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(dup2(fd, 2), 2);
    close(fd);
    return saved;
}

static void stderr_restore(int saved) {
    fflush(stderr);
    ck_assert_int_eq(dup2(saved, 2), 2);
    close(saved);
}

/* Lines of file path that hold needle. */
static int lines_with(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* Warnings in log besides the ssd tier's own at create (a modelled device cannot be preallocated). */
static int warnings(const char *log) {
    return lines_with(log, "kvstrata[warn]") - lines_with(log, "cannot preallocate");
}

/* The only path of an ssd tier is full at start (the device_bytes model of a device that holds
 * nothing): the tier cannot open, and as it is not required an empty tier stands in for it. One
 * warning says so; every save is skipped and counted, every lookup misses, nothing else is logged. */
START_TEST(a_tier_whose_only_path_is_full_at_start_serves_empty_and_skips_saves) {
    rig r;
    char log[600];
    snprintf(log, sizeof log, "%s/stderr.txt", rig_tmpdir);
    const char *cfg = ssd_config("", "[a]", "device_bytes:0", "");
    int saved = stderr_to(log);
    kvs_status st = rig_open(&r, KVS_ROLE_BOTH, cfg);
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 21);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);
    uint64_t first = st == KVS_OK ? rig_prefill(&r, "a", t, 128, a) : 99;
    uint64_t again = st == KVS_OK ? rig_prefill(&r, "b", t, 128, b) : 99;
    stderr_restore(saved);
    ck_assert_msg(st == KVS_OK, "open: %s", r.error);
    ck_assert_uint_eq(first, 0);
    ck_assert_uint_eq(again, 0); /* nothing was stored: a miss */
    ck_assert(kvs_tiers_degraded(r.h->tiers, 0));
    ck_assert_int_eq(lines_with(log, "tier \"nvme\" (ssd) could not open and serves empty"), 1);
    ck_assert_int_eq(lines_with(log, "superblock cannot be written (ENOSPC)"), 1);
    ck_assert_int_eq(warnings(log), 1);
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.saves_skipped, 8);
    ck_assert_uint_eq(s.chunks_saved, 0);
    ck_assert_uint_eq(s.chunks_loaded, 0);
    rig_close(&r);
}
END_TEST

/* `required: true` turns the same failure into a refusal that names the tier and the reason; a
 * configuration error refuses whatever `required` says. */
START_TEST(a_required_tier_that_cannot_open_refuses_the_connector) {
    rig r;
    kvs_status st = rig_open(&r, KVS_ROLE_BOTH,
                             ssd_config("", "[a]", "device_bytes:0", "    required: true\n"));
    ck_assert_int_eq(st, KVS_EIO);
    ck_assert_msg(strstr(r.error, "tier \"nvme\" cannot open and is required (required: true)") &&
                      strstr(r.error, "superblock cannot be written (ENOSPC)"),
                  "message: %s", r.error);
    st = rig_open(&r, KVS_ROLE_BOTH,
                  ssd_config("", "[b]", "device_bytes:0,colour:blue", "    required: false\n"));
    ck_assert_int_eq(st, KVS_ECONFIG);
    ck_assert_msg(strstr(r.error, "colour"), "message: %s", r.error);
}
END_TEST

/* One of two paths is full at start: the tier opens on the other one (no empty tier), and what is
 * saved through the connector loads back byte for byte. */
START_TEST(a_tier_with_one_of_two_paths_full_at_start_opens_and_round_trips) {
    rig r;
    ck_assert_int_eq(
        rig_open(&r, KVS_ROLE_BOTH, ssd_config("", "[a, b]", "device_bytes:0,device_path:0", "")),
        KVS_OK);
    ck_assert(!kvs_tiers_degraded(r.h->tiers, 0));
    int32_t t[128];
    uint32_t a[8], b[8];
    rig_make_tokens(t, 128, 22);
    rig_blocks_from(a, 8, 0);
    rig_blocks_from(b, 8, 20);
    ck_assert_uint_eq(rig_prefill(&r, "a", t, 128, a), 0);
    ck_assert_int_eq(kvs_ssd_flush(kvs_tiers_state(r.h->tiers, 0), 20000), KVS_OK);
    ck_assert_uint_eq(rig_prefill(&r, "b", t, 128, b), 127);
    ck_assert(rig_kv_matches(&r, b, t, 0, 128));
    kvs_ssd_stats_t ss;
    ck_assert_int_eq(kvs_ssd_stats(kvs_tiers_state(r.h->tiers, 0), &ss), KVS_OK);
    ck_assert_uint_eq(ss.failed_paths, 1);
    ck_assert_uint_eq(ss.paths[0].units, 0);
    ck_assert_uint_eq(ss.paths[1].units, 4);
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.saves_skipped, 0);
    ck_assert_uint_eq(s.chunks_saved, 4);
    rig_close(&r);
}
END_TEST

/* Below a dram tier, a tier that could not open takes no write-back: what the dram tier evicts
 * leaves the chain, counted as an eviction, and nothing is logged per object. */
START_TEST(write_backs_into_a_tier_that_could_not_open_are_evictions) {
    rig r;
    char log[600];
    snprintf(log, sizeof log, "%s/stderr.txt", rig_tmpdir);
    const char *cfg = ssd_config("  - name: dram\n    type: dram\n    capacity: 24576\n", "[a]",
                                 "device_bytes:0", "");
    int saved = stderr_to(log);
    kvs_status st = rig_open(&r, KVS_ROLE_BOTH, cfg);
    int32_t t[128];
    uint32_t a[8];
    rig_make_tokens(t, 128, 23);
    rig_blocks_from(a, 8, 0);
    uint64_t hit = st == KVS_OK ? rig_prefill(&r, "a", t, 128, a) : 99;
    stderr_restore(saved);
    ck_assert_msg(st == KVS_OK, "open: %s", r.error);
    ck_assert_uint_eq(hit, 0);
    ck_assert(!kvs_tiers_degraded(r.h->tiers, 0));
    ck_assert(kvs_tiers_degraded(r.h->tiers, 1));
    kvs_stats s = {.struct_size = sizeof s};
    ck_assert_int_eq(api->stats(r.h, &s), KVS_OK);
    ck_assert_uint_eq(s.chunks_saved, 4);
    ck_assert_uint_eq(s.evictions, 2); /* the dram tier holds two */
    ck_assert_int_eq(warnings(log), 1);
    rig_close(&r);
}
END_TEST

START_TEST(threads_sharing_a_tier_restore_exact_kv) {
    const char *cfg = rig_shared_config();
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){cfg, i, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
        ck_assert_msg(args[i].ok, "thread %d restored wrong KV", i);
    }
}
END_TEST

/* A scheduler handle (vLLM's engine core: the workers store in processes of their own) warns once per
 * tier that no other process can see; a shared-memory tier, and a handle of role BOTH, say nothing. */
START_TEST(a_scheduler_handle_warns_of_each_tier_private_to_its_process) {
    const struct {
        kvs_role role;
        int shared, warned;
    } cases[] = {{KVS_ROLE_SCHEDULER, 0, 1},
                 {KVS_ROLE_SCHEDULER, 1, 0},
                 {KVS_ROLE_BOTH, 0, 0},
                 {KVS_ROLE_WORKER, 0, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char log[600];
        snprintf(log, sizeof log, "%s/private-%zu.txt", rig_tmpdir, k);
        rig r;
        int saved = stderr_to(log);
        /* (the rig's config paths live in one buffer: made right before each open) */
        kvs_status st = rig_open(&r, cases[k].role,
                                 cases[k].shared ? rig_shared_config() : rig_dram_config(8, 30000));
        stderr_restore(saved);
        ck_assert_msg(st == KVS_OK, "open: %s", r.error);
        ck_assert_int_eq(lines_with(log, "tier \"dram\" (dram) is private to this process"),
                         cases[k].warned);
        rig_close(&r);
    }
}
END_TEST

static Suite *tiers_suite(void) {
    Suite *s = suite_create("tiers");
    TCase *tc = tcase_create("tiers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, eviction_under_pressure_keeps_the_newest);
    tcase_add_test(tc, a_plugin_backend_round_trips_through_staging);
    tcase_add_test(tc, a_plugin_of_another_major_is_refused);
    tcase_add_test(tc, a_tier_closing_passes_its_objects_to_a_tier_still_open);
    tcase_add_test(tc, a_tier_below_a_peer_gpu_tier_must_be_thread_safe);
    tcase_add_test(tc, a_tier_without_room_spills_saves_and_write_backs_to_the_next);
    tcase_add_test(tc, a_shared_object_that_is_not_a_backend_is_refused);
    tcase_add_test(tc, saves_a_full_device_drops_after_accepting_them_count_as_skipped);
    tcase_add_test(tc, threads_sharing_a_tier_restore_exact_kv);
    tcase_add_test(tc, a_tier_whose_only_path_is_full_at_start_serves_empty_and_skips_saves);
    tcase_add_test(tc, a_required_tier_that_cannot_open_refuses_the_connector);
    tcase_add_test(tc, a_tier_with_one_of_two_paths_full_at_start_opens_and_round_trips);
    tcase_add_test(tc, write_backs_into_a_tier_that_could_not_open_are_evictions);
    tcase_add_test(tc, a_scheduler_handle_warns_of_each_tier_private_to_its_process);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(tiers_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
