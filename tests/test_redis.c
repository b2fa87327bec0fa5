/* test_redis.c - the redis tier against real redis-servers this suite starts (tests/support/
 * redis_servers.h): objects of 64 KiB to 4 MiB byte for byte, misses and oversize, ACL users that keep
 * tenants apart, a wrong password, TLS with the fixture's CA, the in-flight cap under pipelined gets,
 * and a 3+3 cluster: keys over every master, a master killed (misses, then hits once its replica is
 * promoted), a slot migrated during gets (ASK, then MOVED). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/redis/redis.h"
#include "backends/redis/slots.h"
#include "common/clock.h"
#include "tests/support/redis_servers.h"
#include "tests/support/test_support.h"

#define MiB (1u << 20)

static const kvs_backend_ops *ops(void) {
    return kvs_redis_backend();
}

/* Create a tier over opts; *err gets the refusal. */
static kvs_status tier_create(const kvs_backend_option *opts, uint64_t n, void **state, char *err,
                              size_t err_len) {
    err[0] = '\0';
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "shared",
                             .max_object_bytes = 5 * MiB,
                             .options = opts,
                             .n_options = n,
                             .error = err,
                             .error_len = err_len};
    *state = NULL;
    return ops()->create(&init, state);
}

static void *tier_ok(const kvs_backend_option *opts, uint64_t n) {
    char err[600];
    void *t = NULL;
    kvs_status st = tier_create(opts, n, &t, err, sizeof err);
    ck_assert_msg(st == KVS_OK, "create: %d %s", st, err);
    return t;
}

static kvs_key key_of(uint32_t i) {
    kvs_key k;
    uint64_t x = 0x9E3779B97F4A7C15ull * (i + 1);
    for (int b = 0; b < 16; b++) {
        x ^= x >> 29;
        x *= 0xBF58476D1CE4E5B9ull;
        k.bytes[b] = (uint8_t)(x >> 56);
    }
    return k;
}

static void fill(uint8_t *p, uint64_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (uint64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static void write_secret(const char *dir, const char *name, const char *text, char *path,
                         size_t len) {
    ck_assert_int_eq(kvs_test_write_file(dir, name, text, path, len), 0);
    ck_assert_int_eq(chmod(path, 0600), 0);
}

/* The server's INFO field as a number (via redis-cli). */
static long long info_number(const kvs_test_redis *r, const char *section, const char *field) {
    char out[8192];
    kvs_test_redis_cli(r, out, sizeof out, "INFO", section);
    const char *p = strstr(out, field);
    ck_assert_msg(p != NULL, "no %s in INFO %s: %s", field, section, out);
    return atoll(p + strlen(field) + 1);
}

START_TEST(objects_of_64KiB_to_4MiB_round_trip_byte_for_byte) {
    kvs_test_redis r;
    const kvs_test_redis_opts o = {.unix_socket = 1};
    kvs_test_redis_start(&r, &o);
    kvs_backend_option opts[] = {{"node", r.sock}, {"tenant", "team-a"}};
    void *t = tier_ok(opts, 2);
    static const uint64_t sizes[] = {64 << 10, 256 << 10, 1 * MiB, 4 * MiB, 4 * MiB - 4096};
    enum { N = sizeof sizes / sizeof *sizes };
    uint8_t *src[N], *dst[N + 1];
    kvs_key keys[N + 1];
    uint64_t caps[N + 1], lens[N + 1];
    kvs_status sts[N + 1];
    for (uint32_t i = 0; i < N; i++) {
        src[i] = malloc(sizes[i]);
        fill(src[i], sizes[i], i);
        keys[i] = key_of(i);
        ck_assert_int_eq(ops()->put(t, &keys[i], src[i], sizes[i]), KVS_OK);
    }
    keys[N] = key_of(1000); /* never put */
    /* puts return before Redis answers them: a lookup right after sees them all */
    uint64_t seen = 0;
    ck_assert_int_eq(ops()->contains(t, keys, N, &seen), KVS_OK);
    ck_assert_uint_eq(seen, N);
    for (uint32_t i = 0; i <= N; i++) {
        caps[i] = 5 * MiB;
        dst[i] = malloc(caps[i]);
    }
    ck_assert_int_eq(ops()->get_many(t, keys, (void *const *)dst, caps, N + 1, lens, sts), KVS_OK);
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_int_eq(sts[i], KVS_OK);
        ck_assert_uint_eq(lens[i], sizes[i]);
        ck_assert_int_eq(memcmp(src[i], dst[i], sizes[i]), 0);
    }
    ck_assert_int_eq(sts[N], KVS_ENOTFOUND);
    uint64_t present = 0;
    ck_assert_int_eq(ops()->contains(t, keys, N + 1, &present), KVS_OK);
    ck_assert_uint_eq(present, N);
    /* a buffer too small: overflow with the length, and the key is still there */
    uint64_t len = 0;
    ck_assert_int_eq(ops()->get(t, &keys[2], dst[0], 1000, &len), KVS_EOVERFLOW);
    ck_assert_uint_eq(len, sizes[2]);
    ck_assert_int_eq(ops()->get(t, &keys[0], dst[0], caps[0], &len), KVS_OK);
    /* the key is text the operator can find: kvs1:<tenant>:<hex> */
    char out[256];
    kvs_test_redis_cli(&r, out, sizeof out, "DBSIZE");
    ck_assert_int_eq(atoi(out), N);
    kvs_test_redis_cli(&r, out, sizeof out, "KEYS", "kvs1:team-a:*");
    ck_assert_uint_eq(strlen(out) >= 45, 1);
    ck_assert_int_eq(ops()->remove(t, &keys[0]), KVS_OK);
    ck_assert_int_eq(ops()->get(t, &keys[0], dst[0], caps[0], &len), KVS_ENOTFOUND);
    uint64_t objects = 0, bytes = 0;
    ck_assert_int_eq(ops()->usage(t, &objects, &bytes), KVS_OK);
    ck_assert_uint_eq(objects, N - 1);
    ck_assert_uint_gt(bytes, 13 * MiB);
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    ck_assert_uint_eq(s.puts_stored, N);
    ck_assert_uint_eq(s.failures, 0);
    ops()->destroy(t);
    for (uint32_t i = 0; i <= N; i++) {
        if (i < N) free(src[i]);
        free(dst[i]);
    }
    kvs_test_redis_stop(&r);
}
END_TEST

START_TEST(acl_users_keep_tenants_apart_and_a_wrong_password_is_refused) {
    char a_line[512], b_line[512];
    kvs_test_redis_tenant_acl(a_line, sizeof a_line, "team-a", "pw-a", "team-a");
    kvs_test_redis_tenant_acl(b_line, sizeof b_line, "team-b", "pw-b", "team-b");
    const char *acl[] = {"user default off", a_line, b_line, NULL};
    kvs_test_redis r;
    const kvs_test_redis_opts o = {
        .unix_socket = 1, .acl_lines = acl, .cli_user = "team-a", .cli_password = "pw-a"};
    kvs_test_redis_start(&r, &o);
    char dir[256], pa[512], pb[512], wrong[512], open_file[512];
    ck_assert_int_eq(kvs_test_tmpdir(dir, sizeof dir), 0);
    write_secret(dir, "a.pass", "pw-a\n", pa, sizeof pa);
    write_secret(dir, "b.pass", "pw-b\n", pb, sizeof pb);
    write_secret(dir, "wrong.pass", "nope\n", wrong, sizeof wrong);
    ck_assert_int_eq(kvs_test_write_file(dir, "open.pass", "pw-a\n", open_file, sizeof open_file),
                     0);
    ck_assert_int_eq(chmod(open_file, 0644), 0);
    kvs_backend_option a_opts[] = {
        {"node", r.sock}, {"tenant", "team-a"}, {"user", "team-a"}, {"password_file", pa}};
    kvs_backend_option b_opts[] = {
        {"node", r.sock}, {"tenant", "team-b"}, {"user", "team-b"}, {"password_file", pb}};
    void *ta = tier_ok(a_opts, 4), *tb = tier_ok(b_opts, 4);
    kvs_key k = key_of(7);
    uint8_t v[4096], got[4096];
    fill(v, sizeof v, 7);
    ck_assert_int_eq(ops()->put(ta, &k, v, sizeof v), KVS_OK);
    uint64_t len = 0;
    ck_assert_int_eq(ops()->get(ta, &k, got, sizeof got, &len), KVS_OK);
    ck_assert_int_eq(memcmp(v, got, sizeof v), 0);
    ck_assert_int_eq(ops()->get(tb, &k, got, sizeof got, &len), KVS_ENOTFOUND); /* its own keys */
    char err[600];
    void *t = NULL;
    /* team-a's user naming team-b's keys: refused at open, with the key pattern it lacks */
    kvs_backend_option cross[] = {
        {"node", r.sock}, {"tenant", "team-b"}, {"user", "team-a"}, {"password_file", pa}};
    ck_assert_int_eq(tier_create(cross, 4, &t, err, sizeof err), KVS_ECONFIG);
    ck_assert_msg(strstr(err, "NOPERM") && strstr(err, "kvs1:team-b:"), "%s", err);
    kvs_backend_option bad[] = {
        {"node", r.sock}, {"tenant", "team-a"}, {"user", "team-a"}, {"password_file", wrong}};
    ck_assert_int_eq(tier_create(bad, 4, &t, err, sizeof err), KVS_ECONFIG);
    ck_assert_msg(strstr(err, "WRONGPASS"), "%s", err);
    kvs_backend_option loose[] = {
        {"node", r.sock}, {"tenant", "team-a"}, {"user", "team-a"}, {"password_file", open_file}};
    ck_assert_int_eq(tier_create(loose, 4, &t, err, sizeof err), KVS_ECONFIG);
    ck_assert_msg(strstr(err, "password_file"), "%s", err);
    kvs_backend_option none[] = {{"node", r.sock}, {"tenant", "team-a"}};
    ck_assert_int_eq(tier_create(none, 2, &t, err, sizeof err), KVS_ECONFIG); /* NOAUTH */
    ops()->destroy(ta);
    ops()->destroy(tb);
    kvs_test_rmtree(dir);
    kvs_test_redis_stop(&r);
}
END_TEST

START_TEST(tls_with_the_fixture_ca_round_trips_and_a_wrong_ca_is_a_miss) {
    kvs_test_tls tls;
    kvs_test_tls_make(&tls);
    kvs_test_redis r;
    const kvs_test_redis_opts o = {.tls = &tls, .tls_auth_clients = "yes"};
    kvs_test_redis_start(&r, &o);
    kvs_backend_option opts[] = {{"node", r.addr},
                                 {"tls.ca_file", tls.ca_cert},
                                 {"tls.cert_file", tls.client_cert},
                                 {"tls.key_file", tls.client_key}};
    void *t = tier_ok(opts, 4);
    uint8_t *v = malloc(MiB), *got = malloc(MiB);
    fill(v, MiB, 3);
    kvs_key k = key_of(3);
    ck_assert_int_eq(ops()->put(t, &k, v, MiB), KVS_OK);
    uint64_t len = 0;
    kvs_status got_st = ops()->get(t, &k, got, MiB, &len);
    ck_assert_msg(got_st == KVS_OK, "get: %d %s", got_st, ops()->last_error(t));
    ck_assert_int_eq(memcmp(v, got, MiB), 0);
    ops()->destroy(t);
    /* the client certificate is no CA of the server's: every call is a miss, with a sentence */
    kvs_backend_option wrong[] = {{"node", r.addr},
                                  {"tls.ca_file", tls.client_cert},
                                  {"tls.cert_file", tls.client_cert},
                                  {"tls.key_file", tls.client_key}};
    t = tier_ok(wrong, 4);
    ck_assert_int_eq(ops()->get(t, &k, got, MiB, &len), KVS_ENOTFOUND);
    ck_assert_msg(strstr(ops()->last_error(t), "certificate"), "%s", ops()->last_error(t));
    ops()->destroy(t);
    /* a server name the certificate does not carry is refused the same way */
    kvs_backend_option name[] = {{"node", r.addr},
                                 {"tls.ca_file", tls.ca_cert},
                                 {"tls.cert_file", tls.client_cert},
                                 {"tls.key_file", tls.client_key},
                                 {"tls.server_name", "cache.example"}};
    t = tier_ok(name, 5);
    ck_assert_int_eq(ops()->get(t, &k, got, MiB, &len), KVS_ENOTFOUND);
    ops()->destroy(t);
    free(v);
    free(got);
    kvs_test_redis_stop(&r);
    kvs_test_tls_free(&tls);
}
END_TEST

/* 48 objects of 1 MiB in a server of 100 MB (allkeys-lru) hold about 60 MB; their replies to one
 * batch of pipelined GETs count toward maxmemory until read, so a client that asks for all of them at
 * once makes the server evict. The tier's in-flight cap keeps that from happening. */
static long long evictions_after_one_batch(const char *inflight_bytes, uint32_t *hits) {
    kvs_test_redis r;
    const kvs_test_redis_opts o = {
        .unix_socket = 1, .maxmemory = "100mb", .maxmemory_policy = "allkeys-lru"};
    kvs_test_redis_start(&r, &o);
    kvs_backend_option opts[] = {{"node", r.sock}, {"inflight_bytes", inflight_bytes}};
    void *t = tier_ok(opts, 2);
    enum { N = 48 };
    kvs_key keys[N];
    uint8_t *bufs[N];
    uint64_t caps[N], lens[N];
    kvs_status sts[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = key_of(100 + i);
        bufs[i] = malloc(MiB);
        caps[i] = MiB;
        fill(bufs[i], MiB, i);
        ck_assert_int_eq(ops()->put(t, &keys[i], bufs[i], MiB), KVS_OK);
    }
    ck_assert_int_eq(info_number(&r, "stats", "evicted_keys"), 0);
    ck_assert_int_eq(ops()->get_many(t, keys, (void *const *)bufs, caps, N, lens, sts), KVS_OK);
    *hits = 0;
    for (uint32_t i = 0; i < N; i++) *hits += sts[i] == KVS_OK;
    long long evicted = info_number(&r, "stats", "evicted_keys");
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    uint64_t cap = 0;
    if (strcmp(inflight_bytes, "8MiB") == 0) cap = 8 * MiB;
    if (cap) ck_assert_uint_le(s.max_inflight_bytes, cap);
    ops()->destroy(t);
    for (uint32_t i = 0; i < N; i++) free(bufs[i]);
    kvs_test_redis_stop(&r);
    return evicted;
}

START_TEST(the_inflight_cap_keeps_pipelined_gets_from_making_the_server_evict) {
    uint32_t hits = 0;
    ck_assert_int_eq(evictions_after_one_batch("8MiB", &hits), 0);
    ck_assert_uint_eq(hits, 48);
    /* the same batch without a cap: the server evicts (what the cap is for) */
    long long uncapped = evictions_after_one_batch("4GiB", &hits);
    ck_assert_int_gt(uncapped, 0);
}
END_TEST

/* Two of the tier's keys whose slots are on different masters, or in one given slot. */
static uint16_t tier_slot(const char *tenant, const kvs_key *k) {
    char text[128];
    int n = snprintf(text, sizeof text, "kvs1:%s:", tenant);
    for (int b = 0; b < 16; b++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%02x", k->bytes[b]);
    return kvs_redis_key_slot(text, (size_t)n);
}

static void *cluster_tier(kvs_test_redis_cluster *c) {
    kvs_backend_option opts[] = {{"node", c->node[0].addr}, {"node", c->node[1].addr},
                                 {"mode", "cluster"},       {"tenant", "t"},
                                 {"timeout_ms", "300"},     {"connect_backoff_ms", "20"}};
    return tier_ok(opts, 6);
}

START_TEST(a_cluster_spreads_keys_and_serves_again_after_a_master_is_killed) {
    kvs_test_redis_cluster c;
    kvs_test_redis_cluster_start(&c, 3, 1, 1000);
    void *t = cluster_tier(&c);
    enum { N = 60 };
    kvs_key keys[N];
    uint8_t *v[N];
    uint64_t caps[N], lens[N];
    kvs_status sts[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = key_of(500 + i);
        v[i] = malloc(64 << 10);
        caps[i] = 64 << 10;
        fill(v[i], caps[i], i);
        ck_assert_int_eq(ops()->put(t, &keys[i], v[i], caps[i]), KVS_OK);
    }
    unsigned masters_with_keys = 0;
    for (unsigned n = 0; n < c.n_nodes; n++) {
        char out[64];
        kvs_test_redis_cli(&c.node[n], out, sizeof out, "ROLE");
        if (strncmp(out, "master", 6) != 0) continue;
        kvs_test_redis_cli(&c.node[n], out, sizeof out, "DBSIZE");
        masters_with_keys += atoi(out) > 0;
    }
    ck_assert_uint_eq(masters_with_keys, 3); /* no hash tags: every master holds some */
    uint8_t *got[N];
    for (uint32_t i = 0; i < N; i++) got[i] = malloc(64 << 10);
    ck_assert_int_eq(ops()->get_many(t, keys, (void *const *)got, caps, N, lens, sts), KVS_OK);
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_int_eq(sts[i], KVS_OK);
        ck_assert_int_eq(memcmp(got[i], v[i], caps[i]), 0);
    }
    kvs_test_redis_cluster_wait_synced(&c);
    uint16_t slot = tier_slot("t", &keys[0]);
    kvs_test_redis_cluster_kill_master(&c, slot);
    uint64_t killed_ns = kvs_now_ns();
    /* its keys are misses now, and the other masters' keys are still hits */
    ck_assert_int_eq(ops()->get_many(t, keys, (void *const *)got, caps, N, lens, sts), KVS_OK);
    ck_assert_int_eq(sts[0], KVS_ENOTFOUND);
    uint32_t hits = 0;
    for (uint32_t i = 0; i < N; i++) hits += sts[i] == KVS_OK;
    ck_assert_uint_gt(hits, 0);
    ck_assert_uint_lt(hits, N);
    double failover_ms = kvs_test_redis_cluster_wait_failover(&c, slot, 30000);
    /* the replica took the slots: every key is a hit again once the tier has asked the map */
    for (int tries = 0; tries < 100; tries++) {
        ops()->get_many(t, keys, (void *const *)got, caps, N, lens, sts);
        hits = 0;
        for (uint32_t i = 0; i < N; i++) hits += sts[i] == KVS_OK;
        if (hits == N) break;
        usleep(50 * 1000);
    }
    double hit_ms = (double)(kvs_now_ns() - killed_ns) / 1e6;
    ck_assert_uint_eq(hits, N);
    for (uint32_t i = 0; i < N; i++) ck_assert_int_eq(memcmp(got[i], v[i], caps[i]), 0);
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    ck_assert_uint_gt(s.slot_map_refreshes, 1);
    ck_assert_uint_gt(s.failures, 0);
    printf("redis cluster: failover seen by the cluster %.0f ms after SIGKILL, every key a hit "
           "again at %.0f ms\n",
           failover_ms, hit_ms);
    ops()->destroy(t);
    for (uint32_t i = 0; i < N; i++) {
        free(v[i]);
        free(got[i]);
    }
    kvs_test_redis_cluster_stop(&c);
}
END_TEST

START_TEST(a_slot_migrated_during_gets_is_followed_by_ask_then_moved) {
    kvs_test_redis_cluster c;
    kvs_test_redis_cluster_start(&c, 3, 0, 1000);
    void *t = cluster_tier(&c);
    kvs_key k1 = key_of(9000), k2;
    uint16_t slot = tier_slot("t", &k1);
    uint32_t i = 9001;
    do { /* a second key of the same slot */
        k2 = key_of(i++);
    } while (tier_slot("t", &k2) != slot);
    uint8_t v1[8192], v2[8192], got[8192];
    fill(v1, sizeof v1, 1);
    fill(v2, sizeof v2, 2);
    ck_assert_int_eq(ops()->put(t, &k1, v1, sizeof v1), KVS_OK);
    ck_assert_int_eq(ops()->put(t, &k2, v2, sizeof v2), KVS_OK);
    int from = kvs_test_redis_cluster_master_of(&c, slot);
    unsigned to = 0;
    while ((int)to == from || strncmp(c.node[to].addr, "127.0.0.1", 9) != 0) to++;
    kvs_test_redis_cluster_slot_migrating(&c, slot, to);
    ck_assert_uint_eq(kvs_test_redis_cluster_migrate_keys(&c, slot), 2);
    uint64_t len = 0;
    ck_assert_int_eq(ops()->get(t, &k1, got, sizeof got, &len), KVS_OK); /* source: ASK */
    ck_assert_int_eq(memcmp(got, v1, sizeof v1), 0);
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    ck_assert_uint_eq(s.asked, 1);
    kvs_test_redis_cluster_slot_finish(&c, slot, to);
    ck_assert_int_eq(ops()->get(t, &k2, got, sizeof got, &len), KVS_OK); /* source: MOVED */
    ck_assert_int_eq(memcmp(got, v2, sizeof v2), 0);
    kvs_redis_stats(t, &s);
    ck_assert_uint_eq(s.moved, 1);
    ck_assert_int_eq(ops()->get(t, &k1, got, sizeof got, &len), KVS_OK); /* straight to `to` */
    kvs_redis_stats(t, &s);
    ck_assert_uint_eq(s.moved, 1);
    ops()->destroy(t);
    kvs_test_redis_cluster_stop(&c);
}
END_TEST

START_TEST(a_standalone_mode_on_a_cluster_node_is_refused) {
    kvs_test_redis_cluster c;
    kvs_test_redis_cluster_start(&c, 3, 0, 1000);
    char err[600];
    void *t = NULL;
    int moved_somewhere = 0;
    for (unsigned n = 0; n < c.n_nodes && !moved_somewhere; n++) {
        kvs_backend_option opts[] = {{"node", c.node[n].addr}};
        kvs_status st = tier_create(opts, 1, &t, err, sizeof err);
        if (st == KVS_OK) {
            ops()->destroy(t); /* the probe key's slot happened to be on this node */
            continue;
        }
        ck_assert_int_eq(st, KVS_ECONFIG);
        ck_assert_msg(strstr(err, "mode: cluster"), "%s", err);
        moved_somewhere = 1;
    }
    ck_assert(moved_somewhere);
    kvs_test_redis_cluster_stop(&c);
    kvs_test_redis r;
    const kvs_test_redis_opts o = {.unix_socket = 1};
    kvs_test_redis_start(&r, &o);
    kvs_backend_option cl[] = {{"node", r.sock}, {"mode", "cluster"}};
    ck_assert_int_eq(tier_create(cl, 2, &t, err, sizeof err), KVS_ECONFIG);
    ck_assert_msg(strstr(err, "cluster support disabled"), "%s", err);
    kvs_test_redis_stop(&r);
}
END_TEST

int main(void) {
    char why[256];
    if (!kvs_test_redis_setup(why, sizeof why)) {
        printf("test_redis: skipped, %s\n", why);
        return 77;
    }
    Suite *suite = suite_create("redis");
    TCase *one = tcase_create("standalone");
    tcase_set_timeout(one, 60);
    tcase_add_test(one, objects_of_64KiB_to_4MiB_round_trip_byte_for_byte);
    tcase_add_test(one, acl_users_keep_tenants_apart_and_a_wrong_password_is_refused);
    tcase_add_test(one, tls_with_the_fixture_ca_round_trips_and_a_wrong_ca_is_a_miss);
    tcase_add_test(one, the_inflight_cap_keeps_pipelined_gets_from_making_the_server_evict);
    suite_add_tcase(suite, one);
    TCase *many = tcase_create("cluster");
    tcase_set_timeout(many, 120);
    tcase_add_test(many, a_cluster_spreads_keys_and_serves_again_after_a_master_is_killed);
    tcase_add_test(many, a_slot_migrated_during_gets_is_followed_by_ask_then_moved);
    tcase_add_test(many, a_standalone_mode_on_a_cluster_node_is_refused);
    suite_add_tcase(suite, many);
    SRunner *runner = srunner_create(suite);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
