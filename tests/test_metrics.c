/* test_metrics.c - the metrics segment and endpoint (common/metrics*.c): two processes' counters
 * add up, a killed process's counts stay, the `metrics:` keys and their refusals, the HTTP server
 * moving to another process when the serving one exits, and bad clients (too large, garbage, silent)
 * never stopping it from answering the next one. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/metrics_render.h"
#include "common/metrics_seg.h"
#include "connector/config.h"

static char g_name[64];

static void unique_name(void) {
    snprintf(g_name, sizeof g_name, "test-%d-%llx", (int)getpid(),
             (unsigned long long)kvs_now_ns());
}

static void teardown(void) {
    if (g_name[0]) kvs_mseg_unlink(g_name);
}

static uint16_t free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static kvs_mseg_values identity(const char *tenant) {
    kvs_mseg_values v;
    memset(&v, 0, sizeof v);
    v.kind = KVS_MSEG_STORE;
    snprintf(v.tenant, sizeof v.tenant, "%s", tenant);
    v.n_tiers = 1;
    snprintf(v.tiers[0].name, sizeof v.tiers[0].name, "ram");
    return v;
}

/* The sum of counter k over the segment's slots of tenant. */
static uint64_t summed(const char *tenant, int k) {
    kvs_mseg seg;
    char err[256];
    ck_assert_int_eq(kvs_mseg_open(g_name, 0, &seg, err, sizeof err), KVS_OK);
    kvs_mseg_slot *slots = calloc(KVS_MSEG_SLOTS, sizeof *slots);
    uint32_t procs = 0;
    ck_assert_int_eq(kvs_mseg_snapshot(&seg, slots, &procs), 0);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++)
        if (slots[i].state != KVS_MSEG_FREE && strcmp(slots[i].v.tenant, tenant) == 0)
            sum += slots[i].v.c[k];
    free(slots);
    kvs_mseg_close(&seg);
    return sum;
}

/* A child that publishes `gets` under tenant, then releases (clean) or waits to be killed. */
static pid_t publisher(const char *tenant, uint64_t gets, int clean, int ready_fd) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid) return pid;
    kvs_mseg seg;
    char err[256];
    if (kvs_mseg_open(g_name, 1, &seg, err, sizeof err) != KVS_OK) _exit(2);
    kvs_mseg_values v = identity(tenant);
    int slot = kvs_mseg_claim(&seg, &v);
    if (slot < 0) _exit(3);
    v.c[KVS_MC_GETS] = gets;
    v.tiers[0].hits = gets / 2;
    kvs_mseg_publish(&seg, slot, &v);
    if (clean) kvs_mseg_release(&seg, slot);
    char b = 1;
    if (write(ready_fd, &b, 1) != 1) _exit(4);
    if (clean) _exit(0);
    for (;;) pause();
}

START_TEST(two_processes_add_up_and_a_killed_ones_counts_stay) {
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t a = publisher("t", 10, 1, p[1]);
    pid_t b = publisher("t", 5, 0, p[1]);
    char buf[2];
    ck_assert_int_eq(read(p[0], buf, 1), 1);
    ck_assert_int_eq(read(p[0], buf, 1), 1);
    int status;
    ck_assert_int_eq(waitpid(a, &status, 0), a);
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    ck_assert_uint_eq(summed("t", KVS_MC_GETS), 15);
    kill(b, SIGKILL);
    ck_assert_int_eq(waitpid(b, &status, 0), b);
    ck_assert_uint_eq(summed("t", KVS_MC_GETS), 15); /* b's slot reads retired */
    kvs_mseg seg;
    char err[256];
    ck_assert_int_eq(kvs_mseg_open(g_name, 1, &seg, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_mseg_sweep(&seg), 1); /* b's slot folds into a's retired row */
    ck_assert_uint_eq(summed("t", KVS_MC_GETS), 15);
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kvs_metrics_render_seg(&seg, &text, &len), KVS_OK);
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_gets_total{tenant=\"t\"} 15\n"));
    ck_assert_ptr_nonnull(
        strstr(text, "\nkvstrata_tier_hits_total{tier=\"ram\",tenant=\"t\"} 7\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_processes 0\n"));
    /* no live process knows the tier's usage: no sample rather than a 0 */
    ck_assert_ptr_null(strstr(text, "kvstrata_tier_objects{"));
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_tier_capacity_bytes{tier=\"ram\"} 0\n"));
    free(text);
    kvs_mseg_close(&seg);
    close(p[0]);
    close(p[1]);
}
END_TEST

START_TEST(label_values_are_escaped) {
    kvs_mseg_slot slot;
    memset(&slot, 0, sizeof slot);
    slot.state = KVS_MSEG_LIVE;
    slot.v = identity("a\"b\\c\nd");
    slot.v.c[KVS_MC_GETS] = 3;
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kvs_metrics_render_slots(&slot, 1, 1, &text, &len), KVS_OK);
    ck_assert_ptr_nonnull(strstr(text, "kvstrata_gets_total{tenant=\"a\\\"b\\\\c\\nd\"} 3\n"));
    free(text);
}
END_TEST

START_TEST(config_keys_and_refusals) {
    char err[512];
    kvs_config *cfg = NULL;
    static const char OK_YAML[] = "version: 1\ntiers:\n  - name: d\n    type: dram\n"
                                  "    capacity: 1MiB\nmetrics:\n  listen: 127.0.0.1:9400\n";
    ck_assert_int_eq(
        kvs_config_parse_string(OK_YAML, strlen(OK_YAML), "m.yaml", &cfg, err, sizeof err), KVS_OK);
    ck_assert_int_eq(cfg->metrics.enabled, 1);
    ck_assert_str_eq(cfg->metrics.listen, "127.0.0.1:9400");
    ck_assert_int_gt((int)strlen(cfg->metrics.name), 0);
    kvs_config_free(cfg);
    static const char *const BAD[][2] = {
        {"metrics:\n  listen: 127.0.0.1:9400\n  port: 3\n", "m.yaml:8:3: key 'metrics.port'"},
        {"metrics:\n  listen: nowhere\n", "m.yaml:7:11: key 'metrics.listen'"},
        {"metrics:\n  listen: 127.0.0.1:0\n", "m.yaml:7:11: key 'metrics.listen'"},
        {"metrics:\n  name: x\n", "m.yaml:7:3: key 'metrics.listen'"},
        {"metrics:\n  listen: 127.0.0.1:1\n  name: a/b\n", "m.yaml:8:9: key 'metrics.name'"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml,
                 "version: 1\ntiers:\n  - name: d\n    type: dram\n"
                 "    capacity: 1MiB\n%s",
                 BAD[i][0]);
        cfg = NULL;
        ck_assert_int_eq(
            kvs_config_parse_string(yaml, strlen(yaml), "m.yaml", &cfg, err, sizeof err),
            KVS_ECONFIG);
        ck_assert_msg(strstr(err, BAD[i][1]) != NULL, "case %zu: %s", i, err);
        ck_assert_ptr_null(cfg);
    }
}
END_TEST

/* ---- HTTP ------------------------------------------------------------------------------------ */

static int connect_to(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends req (len bytes) and returns the status code of the answer (-1: none). */
static int ask(uint16_t port, const char *req, size_t len, char *body, size_t cap) {
    int fd = connect_to(port);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += (size_t)n;
    }
    char buf[65536];
    size_t got = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    int code = -1;
    if (sscanf(buf, "HTTP/1.1 %d", &code) != 1) return -1;
    if (body) snprintf(body, cap, "%s", buf);
    return code;
}

static int get_metrics(uint16_t port) {
    static const char GET[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    return ask(port, GET, sizeof GET - 1, NULL, 0);
}

/* Polls for a 200 on /metrics for up to 10 s. */
static int wait_served(uint16_t port) {
    for (int i = 0; i < 100; i++) {
        if (get_metrics(port) == 200) return 1;
        usleep(100000);
    }
    return 0;
}

static pid_t server_child(const char *listen_at) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid) return pid;
    kvs_mseg_values v = identity("child");
    kvs_metrics_source *src = kvs_metrics_attach(listen_at, g_name, 0, &v, NULL, NULL);
    if (!src) _exit(2);
    for (;;) pause();
}

START_TEST(another_process_takes_over_the_endpoint) {
    char listen_at[64];
    uint16_t port = free_port();
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%u", port);
    pid_t a = server_child(listen_at);
    ck_assert(wait_served(port));
    pid_t b = server_child(listen_at); /* its bind fails while a serves */
    usleep(300000);
    int status;
    ck_assert_int_eq(waitpid(b, &status, WNOHANG), 0);
    kill(a, SIGKILL);
    ck_assert_int_eq(waitpid(a, &status, 0), a);
    int served = wait_served(port); /* b's retry binds */
    kill(b, SIGKILL);
    waitpid(b, &status, 0);
    ck_assert_msg(served, "no process took over the endpoint");
}
END_TEST

/* A process of the instance forks a child that lives on, then exits: the child holds no copy of its
 * parent's listening socket, so a third process binds and serves. */
START_TEST(a_forked_child_never_keeps_the_port) {
    char listen_at[64];
    uint16_t port = free_port();
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%u", port);
    int to_child[2], from_a[2];
    ck_assert_int_eq(pipe(to_child), 0);
    ck_assert_int_eq(pipe(from_a), 0);
    pid_t a = fork();
    ck_assert_int_ge(a, 0);
    if (a == 0) {
        kvs_mseg_values v = identity("a");
        kvs_metrics_source *src = kvs_metrics_attach(listen_at, g_name, 0, &v, NULL, NULL);
        if (!src) _exit(2);
        for (int i = 0; i < 1000 && !kvs_metrics_serving(g_name); i++) usleep(10000);
        if (!kvs_metrics_serving(g_name)) _exit(3);
        pid_t c = fork();
        if (c < 0) _exit(4);
        if (c == 0) { /* lives until the test closes its end of the pipe (or dies) */
            close(to_child[1]);
            char b;
            ssize_t ignored = read(to_child[0], &b, 1);
            (void)ignored;
            _exit(0);
        }
        if (write(from_a[1], &c, sizeof c) != sizeof c) _exit(5);
        kvs_metrics_detach(src); /* a stops serving and exits */
        _exit(0);
    }
    close(to_child[0]);
    pid_t c = -1;
    ck_assert_int_eq(read(from_a[0], &c, sizeof c), sizeof c);
    int status;
    ck_assert_int_eq(waitpid(a, &status, 0), a);
    kvs_mseg_values v = identity("third");
    kvs_metrics_source *src = kvs_metrics_attach(listen_at, g_name, 0, &v, NULL, NULL);
    int served = 0;
    for (int i = 0; src && i < 100 && !served; i++) {
        served = kvs_metrics_serving(g_name);
        if (!served) usleep(100000);
    }
    int code = served ? get_metrics(port) : -1;
    int child_alive = kill(c, 0) == 0;
    close(to_child[1]); /* c exits */
    kvs_metrics_detach(src);
    close(from_a[0]);
    close(from_a[1]);
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    ck_assert_msg(child_alive, "the forked child was gone before the takeover");
    ck_assert_msg(served, "no process took over the endpoint while the forked child lived");
    ck_assert_int_eq(code, 200);
}
END_TEST

START_TEST(bad_clients_never_stop_the_server) {
    char listen_at[64];
    uint16_t port = free_port();
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%u", port);
    kvs_mseg_values v = identity("me");
    kvs_metrics_source *src = kvs_metrics_attach(listen_at, g_name, 0, &v, NULL, NULL);
    ck_assert_ptr_nonnull(src);
    ck_assert(wait_served(port));
    int silent = connect_to(port); /* sends nothing and stays */
    ck_assert_int_ge(silent, 0);
    char *huge = malloc(64 * 1024);
    memset(huge, 'A', 64 * 1024);
    ck_assert_int_eq(ask(port, huge, 64 * 1024, NULL, 0), 431);
    free(huge);
    static const char GARBAGE[] = "\x01\x02\x03 garbage\r\n\r\n";
    ck_assert_int_eq(ask(port, GARBAGE, sizeof GARBAGE - 1, NULL, 0), 400);
    static const char POST[] = "POST /metrics HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(ask(port, POST, sizeof POST - 1, NULL, 0), 405);
    static const char OTHER[] = "GET /other HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(ask(port, OTHER, sizeof OTHER - 1, NULL, 0), 404);
    /* the publisher's write does not wait on any client */
    v.c[KVS_MC_GETS] = 42;
    kvs_metrics_publish(src, &v);
    char body[65536];
    static const char GET[] = "GET /metrics HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(ask(port, GET, sizeof GET - 1, body, sizeof body), 200);
    ck_assert_ptr_nonnull(strstr(body, "\nkvstrata_gets_total{tenant=\"me\"} 42\n"));
    close(silent);
    kvs_metrics_detach(src);
    ck_assert_int_eq(get_metrics(port), -1); /* the last source closed the server */
}
END_TEST

/* ---- processes gone, forks, other namespaces ------------------------------------------------- */

/* The segment's slots now, and the sum of counter k over those of tenant. */
static int find_slot(kvs_mseg *seg, const char *tenant, kvs_mseg_slot *out) {
    kvs_mseg_slot *slots = calloc(KVS_MSEG_SLOTS, sizeof *slots);
    uint32_t procs = 0;
    ck_assert_int_eq(kvs_mseg_snapshot(seg, slots, &procs), 0);
    int at = -1;
    for (uint32_t i = 0; i < KVS_MSEG_SLOTS && at < 0; i++)
        if (slots[i].state != KVS_MSEG_FREE && strcmp(slots[i].v.tenant, tenant) == 0) {
            at = (int)i;
            *out = slots[i];
        }
    free(slots);
    return at;
}

START_TEST(a_forked_child_never_touches_its_parents_slot_or_thread) {
    char listen_at[64];
    uint16_t port = free_port();
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%u", port);
    kvs_mseg_values v = identity("parent");
    kvs_metrics_source *src = kvs_metrics_attach(listen_at, g_name, 0, &v, NULL, NULL);
    ck_assert_ptr_nonnull(src);
    v.c[KVS_MC_GETS] = 100;
    kvs_metrics_publish(src, &v);
    ck_assert(wait_served(port));
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* the child writes, then closes, the handle it inherited; then attaches one of its own */
        kvs_mseg_values w = v;
        w.c[KVS_MC_GETS] = 1;
        kvs_metrics_publish(src, &w);
        kvs_metrics_detach(src);
        kvs_mseg_values k = identity("kid");
        kvs_metrics_source *mine = kvs_metrics_attach(listen_at, g_name, 0, &k, NULL, NULL);
        if (!mine) _exit(2);
        k.c[KVS_MC_GETS] = 7;
        kvs_metrics_publish(mine, &k);
        kvs_metrics_detach(mine);
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    kvs_mseg seg;
    char err[256];
    ck_assert_int_eq(kvs_mseg_open(g_name, 0, &seg, err, sizeof err), KVS_OK);
    kvs_mseg_slot s;
    ck_assert_int_ge(find_slot(&seg, "parent", &s), 0);
    ck_assert_uint_eq(s.state, KVS_MSEG_LIVE); /* not released by the child */
    ck_assert_int_eq(s.pid, (int)getpid());
    ck_assert_uint_eq(s.v.c[KVS_MC_GETS], 100); /* nor written by it */
    ck_assert_int_ge(find_slot(&seg, "kid", &s), 0);
    ck_assert_uint_eq(s.state, KVS_MSEG_RETIRED); /* the child's own slot, released */
    ck_assert_uint_eq(s.v.c[KVS_MC_GETS], 7);
    v.c[KVS_MC_GETS] = 200;
    kvs_metrics_publish(src, &v);
    ck_assert_int_ge(find_slot(&seg, "parent", &s), 0);
    ck_assert_uint_eq(s.v.c[KVS_MC_GETS], 200);
    kvs_mseg_close(&seg);
    /* the parent's thread still serves (the child wrote no byte on its wake pipe) */
    ck_assert_int_eq(kvs_metrics_serving(g_name), 1);
    char body[65536];
    static const char GET[] = "GET /metrics HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(ask(port, GET, sizeof GET - 1, body, sizeof body), 200);
    ck_assert_ptr_nonnull(strstr(body, "\nkvstrata_gets_total{tenant=\"parent\"} 200\n"));
    kvs_metrics_detach(src);
}
END_TEST

START_TEST(a_zombie_is_dead_and_another_namespace_alive) {
    kvs_mseg seg;
    char err[256];
    ck_assert_int_eq(kvs_mseg_open(g_name, 1, &seg, err, sizeof err), KVS_OK);
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t z = publisher("zombie", 3, 0, p[1]);
    char b;
    ck_assert_int_eq(read(p[0], &b, 1), 1);
    kill(z, SIGKILL);
    /* not reaped yet: a zombie, whose pid still answers kill(pid, 0) */
    for (int i = 0; i < 1000 && kvs_mseg_alive(z, kvs_mseg_start_time(z), 0); i++) usleep(1000);
    ck_assert_int_eq(kvs_mseg_alive(z, 0, 0), 0);
    ck_assert_int_eq(kvs_mseg_sweep(&seg), 1);
    int status;
    ck_assert_int_eq(waitpid(z, &status, 0), z);
    /* a slot of another pid namespace: its pid means nothing here, so it stays live */
    kvs_mseg_values v = identity("container");
    int slot = kvs_mseg_claim(&seg, &v);
    ck_assert_int_ge(slot, 0);
    seg.slots[slot].pid = z; /* gone here, and maybe reused: it is not looked up */
    seg.slots[slot].pidns = kvs_mseg_own_pidns() + 1;
    ck_assert_int_eq(kvs_mseg_sweep(&seg), 0);
    kvs_mseg_slot s;
    ck_assert_int_ge(find_slot(&seg, "container", &s), 0);
    ck_assert_uint_eq(s.state, KVS_MSEG_LIVE);
    /* and it is not this process's: a publish through its index writes nothing */
    v.c[KVS_MC_GETS] = 9;
    kvs_mseg_publish(&seg, slot, &v);
    ck_assert_int_ge(find_slot(&seg, "container", &s), 0);
    ck_assert_uint_eq(s.v.c[KVS_MC_GETS], 0);
    kvs_mseg_close(&seg);
    close(p[0]);
    close(p[1]);
}
END_TEST

/* Another namespace's slot whose owner stopped beating its heartbeat (a container gone) is folded;
 * a slot of this namespace is judged by its pid whatever its heartbeat. */
START_TEST(another_namespaces_slot_with_a_stale_heartbeat_is_dead) {
    kvs_mseg seg;
    char err[256];
    ck_assert_int_eq(kvs_mseg_open(g_name, 1, &seg, err, sizeof err), KVS_OK);
    kvs_mseg_values v = identity("gone");
    int slot = kvs_mseg_claim(&seg, &v);
    ck_assert_int_ge(slot, 0);
    v.c[KVS_MC_GETS] = 6;
    kvs_mseg_publish(&seg, slot, &v);
    kvs_mseg_values w = identity("here");
    int mine = kvs_mseg_claim(&seg, &w);
    ck_assert_int_ge(mine, 0);
    uint64_t stale = kvs_mseg_boottime_ns() - (KVS_MSEG_HEARTBEAT_STALE_MS + 1000ull) * 1000000ull;
    seg.slots[mine].heartbeat = stale; /* alive by its pid */
    seg.slots[slot].pidns = kvs_mseg_own_pidns() + 1;
    seg.slots[slot].heartbeat = kvs_mseg_boottime_ns();
    ck_assert_int_eq(kvs_mseg_sweep(&seg), 0); /* beating: alive */
    seg.slots[slot].heartbeat = stale;
    kvs_mseg_slot s;
    ck_assert_int_ge(find_slot(&seg, "gone", &s), 0);
    ck_assert_uint_eq(s.state, KVS_MSEG_RETIRED); /* readers see it gone already */
    ck_assert_int_eq(kvs_mseg_sweep(&seg), 1);
    ck_assert_int_ge(find_slot(&seg, "gone", &s), 0);
    ck_assert_uint_eq(s.state, KVS_MSEG_RETIRED);
    ck_assert_uint_eq(s.v.c[KVS_MC_GETS], 6); /* its counts stay */
    ck_assert_int_ge(find_slot(&seg, "here", &s), 0);
    ck_assert_uint_eq(s.state, KVS_MSEG_LIVE);
    /* the owner's heartbeat write */
    kvs_mseg_heartbeat(&seg, mine);
    ck_assert_uint_gt(seg.slots[mine].heartbeat, stale);
    kvs_mseg_close(&seg);
}
END_TEST

START_TEST(tenant_churn_never_fills_the_segment) {
    kvs_mseg seg;
    char err[256];
    ck_assert_int_eq(kvs_mseg_open(g_name, 1, &seg, err, sizeof err), KVS_OK);
    uint64_t total = 0;
    for (int i = 0; i < (int)KVS_MSEG_SLOTS + 100; i++) {
        char tenant[32];
        snprintf(tenant, sizeof tenant, "t%d", i);
        kvs_mseg_values v = identity(tenant);
        int slot = kvs_mseg_claim(&seg, &v);
        ck_assert_msg(slot >= 0, "claim %d failed", i);
        v.c[KVS_MC_GETS] = (uint64_t)i + 1;
        v.tiers[0].hits = 1;
        total += (uint64_t)i + 1;
        kvs_mseg_publish(&seg, slot, &v);
        kvs_mseg_release(&seg, slot);
    }
    kvs_mseg_slot *slots = calloc(KVS_MSEG_SLOTS, sizeof *slots);
    uint32_t procs = 0;
    ck_assert_int_eq(kvs_mseg_snapshot(&seg, slots, &procs), 0);
    uint64_t sum = 0, hits = 0;
    uint32_t used = 0;
    for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++)
        if (slots[i].state != KVS_MSEG_FREE) {
            used++;
            sum += slots[i].v.c[KVS_MC_GETS];
            hits += slots[i].v.tiers[0].hits;
        }
    ck_assert_uint_eq(sum, total); /* nothing lost in the merge */
    ck_assert_uint_eq(hits, KVS_MSEG_SLOTS + 100);
    ck_assert_uint_le(used, KVS_MSEG_RETIRED_MAX + 1);
    free(slots);
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kvs_metrics_render_seg(&seg, &text, &len), KVS_OK);
    ck_assert_ptr_nonnull(strstr(text, "kvstrata_gets_total{tenant=\"(other)\"} "));
    free(text);
    kvs_mseg_close(&seg);
}
END_TEST

static int cmp_lines(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The text's lines, sorted, joined by '\n' (the order of series is not part of what they say). */
static char *sorted_lines(char *text) {
    size_t n = 0, cap = 4096;
    char **lines = malloc(cap * sizeof *lines);
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        ck_assert_uint_lt(n, cap);
        lines[n++] = l;
    }
    qsort(lines, n, sizeof *lines, cmp_lines);
    size_t len = 1;
    for (size_t i = 0; i < n; i++) len += strlen(lines[i]) + 1;
    char *out = calloc(1, len);
    for (size_t i = 0; i < n; i++) strcat(strcat(out, lines[i]), "\n");
    free(lines);
    return out;
}

/* More identities than KVS_MSEG_RETIRED_MAX retire (few tenants, many tier sets, a node's whole
 * counters): the merges change no series, the text is what every slot kept apart would give. */
START_TEST(merging_retired_rows_changes_no_series) {
    kvs_mseg seg;
    char err[256];
    ck_assert_int_eq(kvs_mseg_open(g_name, 1, &seg, err, sizeof err), KVS_OK);
    enum { N = 300 };
    kvs_mseg_slot *kept = calloc(N, sizeof *kept);
    uint64_t connections = 0;
    for (int i = 0; i < N; i++) {
        kvs_mseg_values v;
        memset(&v, 0, sizeof v);
        int node = i % 5 == 0;
        v.kind = node ? KVS_MSEG_NODE : i % 2 ? KVS_MSEG_STORE : KVS_MSEG_CONNECTOR;
        if (!node || i % 10 == 0) snprintf(v.tenant, sizeof v.tenant, "t%d", i % 3);
        v.n_tiers = 2;
        snprintf(v.tiers[0].name, sizeof v.tiers[0].name, "ram");
        snprintf(v.tiers[1].name, sizeof v.tiers[1].name, "n%d", (i / 6) % 12);
        int slot = kvs_mseg_claim(&seg, &v);
        ck_assert_msg(slot >= 0, "claim %d failed", i);
        for (int k = 0; k < KVS_MC_COUNT; k++) v.c[k] = (uint64_t)(i + k + 1);
        if (node && !v.tenant[0]) connections += v.c[KVS_MC_NODE_CONNECTIONS];
        v.c[KVS_MC_GET_MISSES] = v.c[KVS_MC_GETS] / 2;
        for (int t = 0; t < 2; t++) {
            v.tiers[t].hits = (uint64_t)(i + t);
            v.tiers[t].hit_tokens = (uint64_t)(2 * i + t);
            v.tiers[t].loaded_bytes = (uint64_t)(3 * i + t);
            v.tiers[t].load_ns = (uint64_t)(1000 * i + t);
        }
        kvs_mseg_publish(&seg, slot, &v);
        kvs_mseg_release(&seg, slot);
        kept[i].state = KVS_MSEG_RETIRED;
        kept[i].v = v;
    }
    char *text = NULL, *want = NULL;
    size_t len = 0;
    ck_assert_int_eq(kvs_metrics_render_seg(&seg, &text, &len), KVS_OK);
    ck_assert_int_eq(kvs_metrics_render_slots(kept, N, 0, &want, &len), KVS_OK);
    char line[128];
    snprintf(line, sizeof line, "\nkvstrata_node_connections_total %llu\n",
             (unsigned long long)connections);
    ck_assert_ptr_nonnull(strstr(text, line)); /* the node's whole counters */
    ck_assert_ptr_null(strstr(text, KVS_MSEG_OTHER));
    char *a = sorted_lines(text), *b = sorted_lines(want);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    free(text);
    free(want);
    free(kept);
    kvs_mseg_slot *slots = calloc(KVS_MSEG_SLOTS, sizeof *slots);
    uint32_t procs = 0, used = 0;
    ck_assert_int_eq(kvs_mseg_snapshot(&seg, slots, &procs), 0);
    for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++) used += slots[i].state != KVS_MSEG_FREE;
    ck_assert_uint_le(used, KVS_MSEG_RETIRED_MAX + 1);
    free(slots);
    kvs_mseg_close(&seg);
}
END_TEST

/* A child that dies in the middle of folding its slot into tenant's retired row, holding the lock. */
static void die_in_fold(const char *tenant, uint64_t gets) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        kvs_mseg seg;
        char err[256];
        if (kvs_mseg_open(g_name, 1, &seg, err, sizeof err) != KVS_OK) _exit(2);
        kvs_mseg_values v = identity(tenant);
        int slot = kvs_mseg_claim(&seg, &v);
        if (slot < 0) _exit(3);
        v.c[KVS_MC_GETS] = gets;
        kvs_mseg_publish(&seg, slot, &v);
        kvs_mseg_test_exit_in_fold = 1;
        kvs_mseg_release(&seg, slot);
        _exit(4);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_int_eq(WEXITSTATUS(status), 9);
}

START_TEST(a_fold_cut_short_counts_once_and_readers_recover) {
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    int status;
    pid_t a = publisher("f", 5, 1, p[1]); /* leaves a retired row of 5 */
    ck_assert_int_eq(waitpid(a, &status, 0), a);
    die_in_fold("f", 10);
    /* a reader that cannot take the lock: its copy, with the fold undone, after a short wait */
    ck_assert_uint_eq(summed("f", KVS_MC_GETS), 15);
    kvs_mseg seg;
    char err[256];
    ck_assert_int_eq(kvs_mseg_open(g_name, 1, &seg, err, sizeof err), KVS_OK);
    ck_assert_uint_eq(seg.hdr->generation & 1, 1); /* the dead holder left it odd */
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kvs_metrics_render_seg(&seg, &text, &len), KVS_OK); /* takes the lock */
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_gets_total{tenant=\"f\"} 15\n"));
    free(text);
    ck_assert_uint_eq(seg.hdr->generation & 1, 0);
    ck_assert_int_eq(kvs_mseg_sweep(&seg), 1);
    ck_assert_uint_eq(summed("f", KVS_MC_GETS), 15);
    kvs_mseg_close(&seg);
    close(p[0]);
    close(p[1]);
}
END_TEST

/* ---- rendering ------------------------------------------------------------------------------- */

START_TEST(store_misses_above_gets_never_make_a_rate_above_one) {
    kvs_mseg_slot slot;
    memset(&slot, 0, sizeof slot);
    slot.state = KVS_MSEG_LIVE;
    slot.v = identity("s");
    slot.v.c[KVS_MC_GETS] = 5;
    slot.v.c[KVS_MC_GET_MISSES] = 7; /* read a moment apart */
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kvs_metrics_render_slots(&slot, 1, 1, &text, &len), KVS_OK);
    const char *at = strstr(text, "\nkvstrata_hit_rate ");
    ck_assert_ptr_nonnull(at);
    double rate = strtod(at + strlen("\nkvstrata_hit_rate "), NULL);
    ck_assert_msg(rate >= 0.0 && rate <= 1.0, "hit rate %g", rate);
    free(text);
}
END_TEST

START_TEST(a_nodes_tier_gauges_stay_apart_from_the_engines) {
    kvs_mseg_slot slots[2];
    memset(slots, 0, sizeof slots);
    slots[0].state = slots[1].state = KVS_MSEG_LIVE;
    slots[0].v = identity("");
    slots[0].v.tiers[0].objects = 5;
    slots[0].v.tiers[0].usage_known = 1;
    slots[1].v = identity("");
    slots[1].v.kind = KVS_MSEG_NODE;
    slots[1].v.tiers[0].objects = 7;
    slots[1].v.tiers[0].usage_known = 1;
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kvs_metrics_render_slots(slots, 2, 2, &text, &len), KVS_OK);
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_tier_objects{tier=\"ram\"} 5\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_tier_objects{tier=\"ram\",role=\"node\"} 7\n"));
    free(text);
}
END_TEST

/* A tier whose usage no live slot asked (a network tier, tiers not thread-safe) has no objects or
 * bytes sample; one live slot that knows it is enough. */
START_TEST(a_tier_usage_nobody_asked_has_no_sample) {
    kvs_mseg_slot slots[2];
    memset(slots, 0, sizeof slots);
    slots[0].state = slots[1].state = KVS_MSEG_LIVE;
    for (int i = 0; i < 2; i++) {
        slots[i].v = identity("");
        slots[i].v.n_tiers = 2;
        snprintf(slots[i].v.tiers[1].name, sizeof slots[i].v.tiers[1].name, "net");
        slots[i].v.tiers[1].capacity = 100;
    }
    slots[0].v.tiers[0].objects = 4;
    slots[0].v.tiers[0].bytes = 40;
    slots[0].v.tiers[0].usage_known = 1;
    slots[1].v.tiers[0].objects = 99; /* not asked: means nothing */
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(kvs_metrics_render_slots(slots, 2, 2, &text, &len), KVS_OK);
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_tier_objects{tier=\"ram\"} 4\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_tier_bytes{tier=\"ram\"} 40\n"));
    ck_assert_ptr_null(strstr(text, "kvstrata_tier_objects{tier=\"net\"}"));
    ck_assert_ptr_null(strstr(text, "kvstrata_tier_bytes{tier=\"net\"}"));
    ck_assert_ptr_nonnull(strstr(text, "\nkvstrata_tier_capacity_bytes{tier=\"net\"} 200\n"));
    free(text);
}
END_TEST

/* ---- HTTP, more ------------------------------------------------------------------------------ */

START_TEST(head_answers_the_length_get_sends) {
    char listen_at[64];
    uint16_t port = free_port();
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%u", port);
    kvs_mseg_values v = identity("h");
    kvs_metrics_source *src = kvs_metrics_attach(listen_at, g_name, 0, &v, NULL, NULL);
    ck_assert_ptr_nonnull(src);
    ck_assert(wait_served(port));
    char head[65536], get[65536];
    static const char HEAD[] = "HEAD /metrics HTTP/1.1\r\n\r\n";
    static const char GET[] = "GET /metrics HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(ask(port, HEAD, sizeof HEAD - 1, head, sizeof head), 200);
    ck_assert_int_eq(ask(port, GET, sizeof GET - 1, get, sizeof get), 200);
    const char *hl = strstr(head, "Content-Length: ");
    const char *body = strstr(get, "\r\n\r\n");
    ck_assert_ptr_nonnull(hl);
    ck_assert_ptr_nonnull(body);
    const char *head_end = strstr(head, "\r\n\r\n");
    ck_assert_ptr_nonnull(head_end);
    ck_assert_str_eq(head_end + 4, ""); /* no body */
    ck_assert_uint_eq(strtoull(hl + 16, NULL, 10), strlen(body + 4));
    kvs_metrics_detach(src);
}
END_TEST

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Out of descriptors with a connection pending: the server neither spins on the listener nor stops
 * serving once descriptors are back. */
START_TEST(no_descriptors_left_costs_no_cpu) {
    char listen_at[64];
    uint16_t port = free_port();
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%u", port);
    int to_child[2], from_child[2];
    ck_assert_int_eq(pipe(to_child), 0);
    ck_assert_int_eq(pipe(from_child), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        kvs_mseg_values v = identity("fds");
        kvs_metrics_source *src = kvs_metrics_attach(listen_at, g_name, 0, &v, NULL, NULL);
        if (!src) _exit(2);
        while (!kvs_metrics_serving(g_name)) usleep(10000);
        struct rlimit old, low = {.rlim_cur = 256, .rlim_max = 0};
        getrlimit(RLIMIT_NOFILE, &old);
        low.rlim_max = old.rlim_max;
        setrlimit(RLIMIT_NOFILE, &low);
        int fds[256], n = 0;
        while (n < 256 && (fds[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) n++;
        char b = 1;
        if (write(from_child[1], &b, 1) != 1) _exit(3); /* full: the parent connects now */
        if (read(to_child[0], &b, 1) != 1) _exit(3);    /* connected: measure */
        double c0 = cpu_seconds();
        sleep(2);
        double used = cpu_seconds() - c0;
        for (int i = 0; i < n; i++) close(fds[i]);
        setrlimit(RLIMIT_NOFILE, &old);
        if (write(from_child[1], &used, sizeof used) != sizeof used) _exit(3);
        if (read(to_child[0], &b, 1) != 1) _exit(3); /* the parent has asked again */
        kvs_metrics_detach(src);
        _exit(0);
    }
    char b = 0;
    ck_assert_int_eq(read(from_child[0], &b, 1), 1);
    int pending = connect_to(port); /* accepted by the kernel, not by the server: no fd left */
    ck_assert_int_ge(pending, 0);
    ck_assert_int_eq(write(to_child[1], &b, 1), 1);
    double used = -1;
    ck_assert_int_eq(read(from_child[0], &used, sizeof used), sizeof used);
    int served = wait_served(port);
    ck_assert_int_eq(write(to_child[1], &b, 1), 1);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    close(pending);
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    ck_assert_msg(used < 0.3, "the server used %.2f s of CPU in 2 s without descriptors", used);
    ck_assert_msg(served, "the server did not serve once descriptors were back");
}
END_TEST

int main(void) {
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("metrics");
    tcase_add_checked_fixture(tc, unique_name, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, two_processes_add_up_and_a_killed_ones_counts_stay);
    tcase_add_test(tc, label_values_are_escaped);
    tcase_add_test(tc, config_keys_and_refusals);
    tcase_add_test(tc, another_process_takes_over_the_endpoint);
    tcase_add_test(tc, a_forked_child_never_keeps_the_port);
    tcase_add_test(tc, bad_clients_never_stop_the_server);
    tcase_add_test(tc, a_forked_child_never_touches_its_parents_slot_or_thread);
    tcase_add_test(tc, a_zombie_is_dead_and_another_namespace_alive);
    tcase_add_test(tc, another_namespaces_slot_with_a_stale_heartbeat_is_dead);
    tcase_add_test(tc, tenant_churn_never_fills_the_segment);
    tcase_add_test(tc, merging_retired_rows_changes_no_series);
    tcase_add_test(tc, a_fold_cut_short_counts_once_and_readers_recover);
    tcase_add_test(tc, store_misses_above_gets_never_make_a_rate_above_one);
    tcase_add_test(tc, a_nodes_tier_gauges_stay_apart_from_the_engines);
    tcase_add_test(tc, a_tier_usage_nobody_asked_has_no_sample);
    tcase_add_test(tc, head_answers_the_length_get_sends);
    suite_add_tcase(s, tc);
    /* CPU time over a window: left out of the suite's own run, in test_metrics_timing */
    TCase *timing = tcase_create("timing");
    tcase_add_checked_fixture(timing, unique_name, teardown);
    tcase_set_timeout(timing, 60);
    tcase_set_tags(timing, "timing");
    tcase_add_test(timing, no_descriptors_left_costs_no_cpu);
    suite_add_tcase(s, timing);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
