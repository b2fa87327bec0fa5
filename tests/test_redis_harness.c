/* test_redis_harness.c - the redis servers the redis tier's suites start (tests/support/
 * redis_servers.h): a unix socket server that keeps nothing across a restart, a TCP server on a
 * picked port with its memory limit and password, ACL users confined to their tenant's keys, a TLS
 * server that wants the fixture's CA and a client certificate, a cluster of three masters and three
 * replicas that fails over a killed master, and a slot migration that answers ASK, then MOVED.
 * Every test ends with none of its servers or helpers running. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/redis_servers.h"
#include "tests/support/wait.h"

#define OUT        4096
/* redis-cli --cluster create gives each of three masters a third of the slots: a slot and the one
 * a third further are on different masters */
#define SLOT_THIRD 5461u

static void assert_gone(pid_t pid) {
    ck_assert_int_gt(pid, 0);
    errno = 0;
    ck_assert_int_eq(kill(pid, 0), -1);
    ck_assert_int_eq(errno, ESRCH);
}

/* No server of the harness is running, and no child of this process is left at all (servers,
 * redis-cli, openssl). */
static void assert_nothing_left(void) {
    ck_assert_uint_eq(kvs_test_redis_live(), 0);
    errno = 0;
    ck_assert_int_eq(waitpid(-1, NULL, WNOHANG), -1);
    ck_assert_int_eq(errno, ECHILD);
}

static void assert_dir_gone(const char *dir) {
    errno = 0;
    ck_assert_int_eq(access(dir, F_OK), -1);
    ck_assert_int_eq(errno, ENOENT);
}

/* The reply of a one-line command, without its line break. */
static const char *line1(char *out) {
    out[strcspn(out, "\r\n")] = '\0';
    return out;
}

START_TEST(a_unix_socket_server_serves_a_key_and_keeps_nothing_across_a_restart) {
    kvs_test_redis r;
    const kvs_test_redis_opts o = {.unix_socket = 1};
    kvs_test_redis_start(&r, &o);
    ck_assert_uint_eq(r.port, 0);
    struct stat st;
    ck_assert_int_eq(stat(r.sock, &st), 0);
    ck_assert(S_ISSOCK(st.st_mode));
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    char out[OUT];
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "CONFIG", "GET", "port"), 0);
    ck_assert_str_eq(out, "port\n0\n");
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "CONFIG", "GET", "appendonly"), 0);
    ck_assert_str_eq(out, "appendonly\nno\n");
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "SET", "kvs1:t:x", "hello"), 0);
    ck_assert_str_eq(line1(out), "OK");
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "GET", "kvs1:t:x"), 0);
    ck_assert_str_eq(line1(out), "hello");

    pid_t first = r.pid;
    kvs_test_redis_restart(&r);
    ck_assert_int_ne(r.pid, first);
    assert_gone(first);
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "GET", "kvs1:t:x"), 0);
    ck_assert_str_eq(line1(out), ""); /* nil: nothing was saved */
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "DBSIZE"), 0);
    ck_assert_str_eq(line1(out), "0");

    pid_t pid = r.pid;
    char dir[sizeof r.dir];
    snprintf(dir, sizeof dir, "%s", r.dir);
    ck_assert_int_eq(kvs_test_redis_stop(&r), 0);
    assert_gone(pid);
    assert_dir_gone(dir);
    assert_nothing_left();
}
END_TEST

START_TEST(a_tcp_server_on_a_picked_port_applies_its_memory_limit_and_password) {
    kvs_test_redis r;
    const kvs_test_redis_opts o = {
        .maxmemory = "64mb", .maxmemory_policy = "allkeys-lru", .requirepass = "s3cret-pw"};
    kvs_test_redis_start(&r, &o);
    ck_assert_uint_ne(r.port, 0);
    ck_assert_uint_ne(r.port, 6379);
    char out[OUT], want[64];
    snprintf(want, sizeof want, "127.0.0.1:%u", (unsigned)r.port);
    ck_assert_str_eq(r.addr, want);
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "PING"), 0);
    ck_assert_str_eq(line1(out), "PONG");
    ck_assert_int_eq(kvs_test_redis_cli_as(&r, NULL, NULL, out, sizeof out, "PING"), 0);
    ck_assert_msg(strncmp(out, "NOAUTH", 6) == 0, "without the password: %s", out);
    ck_assert_int_eq(kvs_test_redis_cli_as(&r, NULL, "wrong", out, sizeof out, "PING"), 0);
    ck_assert_msg(strstr(out, "WRONGPASS") && !strstr(out, "PONG"), "a wrong password: %s", out);
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "CONFIG", "GET", "maxmemory"), 0);
    ck_assert_str_eq(out, "maxmemory\n67108864\n");
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "CONFIG", "GET", "maxmemory-policy"),
                     0);
    ck_assert_str_eq(out, "maxmemory-policy\nallkeys-lru\n");
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "CONFIG", "GET", "bind"), 0);
    ck_assert_str_eq(out, "bind\n127.0.0.1\n");

    /* a killed server is reaped at once and its port refuses */
    pid_t pid = r.pid;
    kvs_test_redis_kill(&r, SIGKILL);
    ck_assert_int_eq(r.pid, 0);
    ck_assert(!kvs_test_redis_alive(&r));
    assert_gone(pid);
    ck_assert_uint_eq(kvs_test_redis_live(), 0);
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "PING"), 1);
    ck_assert_msg(strstr(out, "Connection refused"), "a killed server: %s", out);
    ck_assert_int_eq(kvs_test_redis_stop(&r), 0);
    assert_nothing_left();
}
END_TEST

START_TEST(a_tenant_user_reads_and_writes_its_own_prefix_only) {
    char team_a[1024], team_b[1024];
    kvs_test_redis_tenant_acl(team_a, sizeof team_a, "team-a", "pw-a", "team-a");
    kvs_test_redis_tenant_acl(team_b, sizeof team_b, "team-b", "pw-b", "team-b");
    const char *acl[] = {"user default off", team_a, team_b, NULL};
    const kvs_test_redis_opts o = {.acl_lines = acl, .cli_user = "team-a", .cli_password = "pw-a"};
    kvs_test_redis r;
    kvs_test_redis_start(&r, &o);
    char out[OUT];
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "SET", "kvs1:team-a:x", "a1"), 0);
    ck_assert_str_eq(line1(out), "OK");
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "SET", "kvs1:team-b:x", "a2"), 0);
    ck_assert_msg(strncmp(out, "NOPERM", 6) == 0, "team-a writing team-b's key: %s", out);
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "FLUSHALL"), 0);
    ck_assert_msg(strncmp(out, "NOPERM", 6) == 0, "team-a flushing: %s", out);

    ck_assert_int_eq(
        kvs_test_redis_cli_as(&r, "team-b", "pw-b", out, sizeof out, "GET", "kvs1:team-a:x"), 0);
    ck_assert_msg(strncmp(out, "NOPERM", 6) == 0, "team-b reading team-a's key: %s", out);
    ck_assert_int_eq(
        kvs_test_redis_cli_as(&r, "team-b", "pw-b", out, sizeof out, "GET", "kvs1:team-b:x"), 0);
    ck_assert_str_eq(line1(out), ""); /* team-a's write was refused */
    ck_assert_int_eq(
        kvs_test_redis_cli_as(&r, "team-b", "pw-b", out, sizeof out, "SET", "kvs1:team-b:x", "b1"),
        0);
    ck_assert_str_eq(line1(out), "OK");
    ck_assert_int_eq(
        kvs_test_redis_cli_as(&r, "team-b", "pw-a", out, sizeof out, "GET", "kvs1:team-b:x"), 0);
    ck_assert_msg(strstr(out, "WRONGPASS") && !strstr(out, "b1"), "team-b, wrong password: %s",
                  out);
    ck_assert_int_eq(kvs_test_redis_cli_as(&r, NULL, NULL, out, sizeof out, "GET", "kvs1:team-a:x"),
                     0);
    ck_assert_msg(strncmp(out, "NOAUTH", 6) == 0, "the default user is off: %s", out);
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "GET", "kvs1:team-a:x"), 0);
    ck_assert_str_eq(line1(out), "a1");
    kvs_test_redis_stop(&r);
    assert_nothing_left();
}
END_TEST

static void assert_mode_0600(const char *path) {
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
}

START_TEST(a_tls_server_answers_only_clients_that_trust_its_ca_and_show_a_certificate) {
    kvs_test_tls t;
    kvs_test_tls_make(&t);
    assert_mode_0600(t.ca_key);
    assert_mode_0600(t.server_key);
    assert_mode_0600(t.client_key);
    char out[OUT];
    const char *san[] = {"openssl",        "x509", "-noout",      "-ext",
                         "subjectAltName", "-in",  t.server_cert, NULL};
    ck_assert_int_eq(kvs_test_run(san, out, sizeof out, 10000), 0);
    ck_assert_msg(strstr(out, "DNS:localhost") && strstr(out, "IP Address:127.0.0.1"), "SAN: %s",
                  out);
    const char *verify[] = {"openssl", "verify", "-CAfile", t.ca_cert, t.client_cert, NULL};
    ck_assert_int_eq(kvs_test_run(verify, out, sizeof out, 10000), 0);

    const kvs_test_redis_opts o = {.tls = &t, .tls_auth_clients = "yes"};
    kvs_test_redis r;
    kvs_test_redis_start(&r, &o);
    ck_assert_int_eq(r.tls, 1);
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "PING"), 0);
    ck_assert_str_eq(line1(out), "PONG");
    ck_assert_int_eq(kvs_test_redis_cli(&r, out, sizeof out, "CONFIG", "GET", "port"), 0);
    ck_assert_str_eq(out, "port\n0\n"); /* no plain TCP port besides */

    char port[16];
    snprintf(port, sizeof port, "%u", (unsigned)r.port);
    const char *plain[] = {"redis-cli", "-h", "127.0.0.1", "-p", port, "PING", NULL};
    (void)kvs_test_run(plain, out, sizeof out, 10000);
    ck_assert_msg(!strstr(out, "PONG"), "a plain client got: %s", out);
    const char *no_cert[] = {"redis-cli", "--tls", "--cacert", t.ca_cert, "-h",
                             "127.0.0.1", "-p",    port,       "PING",    NULL};
    (void)kvs_test_run(no_cert, out, sizeof out, 10000);
    ck_assert_msg(!strstr(out, "PONG"), "a client without a certificate got: %s", out);
    const char *with_cert[] = {"redis-cli",   "--tls", "--cacert",   t.ca_cert, "--cert",
                               t.client_cert, "--key", t.client_key, "-h",      "localhost",
                               "-p",          port,    "PING",       NULL};
    ck_assert_int_eq(kvs_test_run(with_cert, out, sizeof out, 10000), 0);
    ck_assert_str_eq(line1(out), "PONG");

    ck_assert_int_eq(kvs_test_redis_stop(&r), 0);
    char dir[sizeof t.dir];
    snprintf(dir, sizeof dir, "%s", t.dir);
    kvs_test_tls_free(&t);
    assert_dir_gone(dir);
    assert_nothing_left();
}
END_TEST

/* ---- cluster --------------------------------------------------------------------------------- */

static kvs_test_redis_cluster cluster;

static void assert_cluster_gone(void) {
    pid_t pids[KVS_TEST_REDIS_CLUSTER_MAX];
    unsigned n = cluster.n_nodes;
    for (unsigned i = 0; i < n; i++) pids[i] = cluster.node[i].pid;
    kvs_test_redis_cluster_stop(&cluster);
    for (unsigned i = 0; i < n; i++)
        if (pids[i] > 0) assert_gone(pids[i]);
    assert_nothing_left();
}

static void role_of(kvs_test_redis *r, char *role, size_t len) {
    char out[OUT];
    ck_assert_int_eq(kvs_test_redis_cli(r, out, sizeof out, "ROLE"), 0);
    snprintf(role, len, "%s", line1(out));
}

START_TEST(a_cluster_of_three_masters_and_three_replicas_fails_over_a_killed_master) {
    kvs_test_redis_cluster *c = &cluster;
    kvs_test_redis_cluster_start(c, 3, 1, 1000);
    printf("redis_harness: a 3+3 cluster formed in %.0f ms\n", c->form_ms);
    ck_assert_uint_eq(c->n_nodes, 6);
    char role[32];
    unsigned masters = 0;
    for (unsigned i = 0; i < c->n_nodes; i++) {
        role_of(&c->node[i], role, sizeof role);
        masters += strcmp(role, "master") == 0;
    }
    ck_assert_uint_eq(masters, 3);

    const unsigned slot = 777;
    char key[128], out[OUT];
    kvs_test_redis_key_in_slot(&c->node[0], "team-a", slot, key, sizeof key);
    ck_assert_int_eq(kvs_test_redis_cli(&c->node[0], out, sizeof out, "CLUSTER", "KEYSLOT", key),
                     0);
    ck_assert_str_eq(line1(out), "777");
    int old = kvs_test_redis_cluster_master_of(c, slot);
    ck_assert_int_eq(kvs_test_redis_cli(&c->node[old], out, sizeof out, "SET", key, "survives"), 0);
    ck_assert_str_eq(line1(out), "OK");
    kvs_test_redis_cluster_wait_synced(c);

    pid_t old_pid = c->node[old].pid;
    ck_assert_int_eq(kvs_test_redis_cluster_kill_master(c, slot), old);
    assert_gone(old_pid);
    double ms = kvs_test_redis_cluster_wait_failover(c, slot, 30000);
    printf("redis_harness: slot %u failed over from %s in %.0f ms (cluster-node-timeout 1000)\n",
           slot, c->node[old].addr, ms);
    int now = kvs_test_redis_cluster_master_of(c, slot);
    ck_assert_int_ne(now, old);
    ck_assert_int_eq(kvs_test_redis_cli(&c->node[now], out, sizeof out, "GET", key), 0);
    ck_assert_str_eq(line1(out), "survives");
    ck_assert_int_eq(kvs_test_redis_cli(&c->node[now], out, sizeof out, "CLUSTER", "INFO"), 0);
    ck_assert_msg(strstr(out, "cluster_state:ok"), "%s", out);

    /* the old master comes back, from its nodes.conf, as the new master's replica */
    kvs_test_redis_restart(&c->node[old]);
    double rejoin = kvs_test_redis_cluster_wait_ready(c, 30000);
    printf("redis_harness: %s rejoined as a replica in %.0f ms\n", c->node[old].addr, rejoin);
    role_of(&c->node[old], role, sizeof role);
    ck_assert_str_eq(role, "slave");
    ck_assert_int_eq(kvs_test_redis_cluster_master_of(c, slot), now);
    assert_cluster_gone();
}
END_TEST

START_TEST(a_slot_being_migrated_answers_ask_then_moved) {
    kvs_test_redis_cluster *c = &cluster;
    kvs_test_redis_cluster_start(c, 3, 1, 1000);
    printf("redis_harness: a 3+3 cluster formed in %.0f ms\n", c->form_ms);
    const unsigned slot = 4242;
    int from = kvs_test_redis_cluster_master_of(c, slot);
    int to = kvs_test_redis_cluster_master_of(c, (slot + SLOT_THIRD) % 16384);
    ck_assert_int_ne(from, to);
    kvs_test_redis *src = &c->node[from], *dst = &c->node[to];
    char k1[128], k2[128], out[OUT], want[128];
    kvs_test_redis_key_in_slot(src, "team-a", slot, k1, sizeof k1);
    kvs_test_redis_key_in_slot(src, "team-b", slot, k2, sizeof k2);
    ck_assert_uint_eq(strlen(k1), strlen("kvs1:team-a:") + 32);
    ck_assert_int_eq(strncmp(k1, "kvs1:team-a:", 12), 0);
    ck_assert_uint_eq(strspn(k1 + 12, "0123456789abcdef"), 32);
    ck_assert_int_eq(strncmp(k2, "kvs1:team-b:", 12), 0);
    ck_assert_int_eq(kvs_test_redis_cli(src, out, sizeof out, "CLUSTER", "KEYSLOT", k2), 0);
    ck_assert_str_eq(line1(out), "4242");
    ck_assert_int_eq(kvs_test_redis_cli(src, out, sizeof out, "SET", k1, "v1"), 0);
    ck_assert_str_eq(line1(out), "OK");
    snprintf(want, sizeof want, "MOVED %u %s", slot, src->addr);
    ck_assert_int_eq(kvs_test_redis_cli(dst, out, sizeof out, "GET", k1), 0);
    ck_assert_str_eq(line1(out), want);

    kvs_test_redis_cluster_slot_migrating(c, slot, (unsigned)to);
    ck_assert_int_eq(kvs_test_redis_cli(src, out, sizeof out, "GET", k1), 0);
    ck_assert_str_eq(line1(out), "v1"); /* still here: served */
    snprintf(want, sizeof want, "ASK %u %s", slot, dst->addr);
    ck_assert_int_eq(kvs_test_redis_cli(src, out, sizeof out, "GET", k2), 0);
    ck_assert_str_eq(line1(out), want); /* not here: ask the target */

    ck_assert_uint_eq(kvs_test_redis_cluster_migrate_keys(c, slot), 1);
    ck_assert_int_eq(kvs_test_redis_cli(src, out, sizeof out, "GET", k1), 0);
    ck_assert_str_eq(line1(out), want);
    snprintf(want, sizeof want, "MOVED %u %s", slot, src->addr);
    ck_assert_int_eq(kvs_test_redis_cli(dst, out, sizeof out, "GET", k1), 0);
    ck_assert_str_eq(line1(out), want); /* importing: served only after ASKING */

    kvs_test_redis_cluster_slot_finish(c, slot, (unsigned)to);
    snprintf(want, sizeof want, "MOVED %u %s", slot, dst->addr);
    ck_assert_int_eq(kvs_test_redis_cli(src, out, sizeof out, "GET", k1), 0);
    ck_assert_str_eq(line1(out), want);
    ck_assert_int_eq(kvs_test_redis_cli(dst, out, sizeof out, "GET", k1), 0);
    ck_assert_str_eq(line1(out), "v1");
    ck_assert_int_eq(kvs_test_redis_cluster_master_of(c, slot), to);
    assert_cluster_gone();
}
END_TEST

int main(void) {
    char why[256];
    if (!kvs_test_redis_setup(why, sizeof why)) {
        printf("test_redis_harness: skipped, %s\n", why);
        return 77;
    }
    Suite *suite = suite_create("redis_harness");
    TCase *one = tcase_create("standalone");
    tcase_set_timeout(one, 60);
    tcase_add_test(one, a_unix_socket_server_serves_a_key_and_keeps_nothing_across_a_restart);
    tcase_add_test(one, a_tcp_server_on_a_picked_port_applies_its_memory_limit_and_password);
    tcase_add_test(one, a_tenant_user_reads_and_writes_its_own_prefix_only);
    tcase_add_test(one, a_tls_server_answers_only_clients_that_trust_its_ca_and_show_a_certificate);
    suite_add_tcase(suite, one);
    TCase *many = tcase_create("cluster");
    tcase_set_timeout(many, 120);
    tcase_add_test(many, a_cluster_of_three_masters_and_three_replicas_fails_over_a_killed_master);
    tcase_add_test(many, a_slot_being_migrated_answers_ask_then_moved);
    suite_add_tcase(suite, many);
    SRunner *runner = srunner_create(suite);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
