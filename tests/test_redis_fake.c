/* test_redis_fake.c - the redis tier against a fake server this suite runs on a unix socket: garbage,
 * huge lengths, truncated replies, a server that stops in the middle of a value. The engine's view:
 * every such get is a miss within timeout_ms, the tier stays usable, and the caller's buffer is never
 * written after the get returned. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "backends/redis/redis.h"
#include "backends/redis/slots.h"
#include "tests/support/test_support.h"

/* One answer of the fake server: after a request arrives it sends `first`, waits pause_ms, sends
 * `then`, and closes the connection when close_after. */
typedef struct answer {
    const char *first;
    size_t first_len; /* 0: strlen(first) */
    unsigned pause_ms;
    const char *then;
    int close_after;
} answer;

typedef struct fake {
    char dir[256], path[300];
    int listen_fd;
    pthread_t thread;
    const answer *answers;
    size_t n_answers;
    volatile int stop;
    int requests;    /* requests seen */
    int script_from; /* the request the script answers first (from 1; 0: the second) */
} fake;

static void send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void *fake_main(void *arg) {
    fake *f = arg;
    size_t next = 0;
    while (!f->stop) {
        struct pollfd p = {.fd = f->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(f->listen_fd, NULL, NULL);
        if (c < 0) continue;
        char buf[65536];
        while (!f->stop) {
            struct pollfd q = {.fd = c, .events = POLLIN};
            if (poll(&q, 1, 50) <= 0) continue;
            ssize_t r = recv(c, buf, sizeof buf, 0);
            if (r <= 0) break;
            f->requests++;
            /* the tier's open probe, and anything past the script: "no such key" */
            const answer none = {.first = ":0\r\n"};
            int from = f->script_from ? f->script_from : 2;
            const answer *a =
                next < f->n_answers && f->requests >= from ? &f->answers[next++] : &none;
            send_all(c, a->first, a->first_len ? a->first_len : strlen(a->first));
            if (a->pause_ms) usleep(a->pause_ms * 1000u);
            if (a->then) send_all(c, a->then, strlen(a->then));
            if (a->close_after) break;
        }
        close(c);
    }
    return NULL;
}

static void fake_start(fake *f, const answer *answers, size_t n) {
    memset(f, 0, sizeof *f);
    ck_assert_int_eq(kvs_test_tmpdir(f->dir, sizeof f->dir), 0);
    snprintf(f->path, sizeof f->path, "%s/fake.sock", f->dir);
    f->answers = answers;
    f->n_answers = n;
    f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", f->path);
    ck_assert_int_eq(bind(f->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(f->listen_fd, 8), 0);
    ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_stop(fake *f) {
    f->stop = 1;
    pthread_join(f->thread, NULL);
    close(f->listen_fd);
    kvs_test_rmtree(f->dir);
}

/* The tier over opts[0..n) (objects up to 1 MiB); a refusal fails the test with its sentence. */
static void *create_ok(const kvs_backend_option *opts, uint64_t n) {
    char err[512] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "fake",
                             .max_object_bytes = 1 << 20,
                             .options = opts,
                             .n_options = n,
                             .error = err,
                             .error_len = sizeof err};
    void *state = NULL;
    kvs_status st = kvs_redis_backend()->create(&init, &state);
    ck_assert_msg(st == KVS_OK, "create: %s", err);
    return state;
}

static void *tier_open(const fake *f, const char *timeout_ms, const char *conns) {
    kvs_backend_option opts[] = {{"node", f->path},
                                 {"timeout_ms", timeout_ms},
                                 {"connections_per_node", conns},
                                 {"connect_backoff_ms", "1"}};
    return create_ok(opts, 4);
}

static kvs_key key_of(uint8_t i) {
    kvs_key k;
    memset(&k, i, sizeof k);
    return k;
}

/* Each answer a get can get that is not a value: a miss, the tier still up for the next one. */
START_TEST(broken_answers_are_misses_and_the_tier_stays_up) {
    static const answer script[] = {
        {.first = "?garbage\r\n"},                                /* unknown type */
        {.first = "$99999999999999999\r\nabc", .close_after = 1}, /* huge length, then EOF */
        {.first = "$100\r\nabc", .close_after = 1},               /* truncated */
        {.first = "*5\r\n:1\r\n"},                                /* an array to a GET */
        {.first = "$3\r\nabcXY"},                                 /* value without CRLF */
        {.first = "+OK\r\n+OK\r\n"},                              /* more replies than requests */
        {.first = "$5\r\nhello\r\n"},                             /* at last, a good value */
    };
    fake f;
    fake_start(&f, script, sizeof script / sizeof *script);
    void *t = tier_open(&f, "300", "1");
    const kvs_backend_ops *ops = kvs_redis_backend();
    char buf[64];
    for (size_t i = 0; i + 1 < sizeof script / sizeof *script; i++) {
        uint64_t len = 0;
        kvs_key k = key_of((uint8_t)i);
        kvs_status st = ops->get(t, &k, buf, sizeof buf, &len);
        ck_assert_msg(st == KVS_ENOTFOUND, "answer %zu: status %d", i, st);
        usleep(5000); /* past connect_backoff_ms: the next get reconnects */
    }
    uint64_t len = 0;
    kvs_key k = key_of(99);
    kvs_status st = KVS_ENOTFOUND;
    for (int tries = 0; tries < 20 && st != KVS_OK; tries++) {
        st = ops->get(t, &k, buf, sizeof buf, &len);
        if (st != KVS_OK) usleep(20000);
    }
    ck_assert_int_eq(st, KVS_OK);
    ck_assert_uint_eq(len, 5);
    ck_assert_int_eq(memcmp(buf, "hello", 5), 0);
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    ck_assert_uint_ge(s.protocol_errors, 4);
    ck_assert_uint_ge(s.failures, 6);
    ops->destroy(t);
    fake_stop(&f);
}
END_TEST

/* A value longer than the caller's buffer is reported as such, never written past the buffer. */
START_TEST(a_value_longer_than_the_buffer_is_overflow) {
    static const answer script[] = {{.first = "$10\r\n0123456789\r\n"}};
    fake f;
    fake_start(&f, script, 1);
    void *t = tier_open(&f, "500", "1");
    char buf[8];
    memset(buf, 'z', sizeof buf);
    uint64_t len = 0;
    kvs_key k = key_of(1);
    ck_assert_int_eq(kvs_redis_backend()->get(t, &k, buf, 4, &len), KVS_EOVERFLOW);
    ck_assert_uint_eq(len, 10);
    ck_assert_int_eq(memcmp(buf, "zzzzzzzz", 8), 0);
    kvs_redis_backend()->destroy(t);
    fake_stop(&f);
}
END_TEST

/* A server that stops in the middle of a value: the get is a miss by timeout_ms, and the rest of the
 * value, sent after the get returned, lands nowhere in the caller's buffer. */
START_TEST(a_server_stopping_mid_value_never_writes_after_return) {
    static char head[64 + 4096];
    static char rest[8192];
    snprintf(head, sizeof head, "$8192\r\n");
    size_t hl = strlen(head);
    memset(head + hl, 'a', 4096);
    memset(rest, 'b', 4096);
    rest[4096] = '\0';
    const answer script[] = {
        {.first = head, .first_len = hl + 4096, .pause_ms = 1500, .then = rest}};
    fake f;
    fake_start(&f, script, 1);
    void *t = tier_open(&f, "200", "1");
    char *buf = malloc(8192);
    memset(buf, 0, 8192);
    uint64_t len = 0;
    kvs_key k = key_of(2);
    /* a miss: the value is still incomplete when timeout_ms (200) runs out, 1.5 s before the rest */
    ck_assert_int_eq(kvs_redis_backend()->get(t, &k, buf, 8192, &len), KVS_ENOTFOUND);
    memset(buf, 'x', 8192);
    usleep(1800 * 1000); /* the server sends the rest now */
    for (int i = 0; i < 8192; i++) ck_assert_int_eq(buf[i], 'x');
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    ck_assert_uint_eq(s.timeouts, 1);
    free(buf);
    kvs_redis_backend()->destroy(t);
    fake_stop(&f);
}
END_TEST

/* An error answer the tier does not know is a miss with the server's words in last_error; a put
 * the server refuses for memory (answered after the put returned) is counted when its answer is
 * read, before the next call's own answers. */
START_TEST(an_error_answer_is_a_miss_with_a_sentence) {
    static const answer script[] = {{.first = "-ERR something odd\r\n"},
                                    {.first = "-OOM command not allowed\r\n"},
                                    {.first = "$-1\r\n"}};
    fake f;
    fake_start(&f, script, 3);
    void *t = tier_open(&f, "500", "1");
    char buf[16];
    uint64_t len = 0;
    kvs_key k = key_of(3);
    ck_assert_int_eq(kvs_redis_backend()->get(t, &k, buf, sizeof buf, &len), KVS_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(kvs_redis_backend()->last_error(t), "something odd"));
    ck_assert_int_eq(kvs_redis_backend()->put(t, &k, "abc", 3), KVS_OK);
    ck_assert_int_eq(kvs_redis_backend()->get(t, &k, buf, sizeof buf, &len), KVS_ENOTFOUND);
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    ck_assert_uint_eq(s.puts_refused_oom, 1);
    ck_assert_uint_eq(s.protocol_errors, 0); /* the OOM was the put's, the nil the get's */
    kvs_redis_backend()->destroy(t);
    fake_stop(&f);
}
END_TEST

/* ---- a fake cluster master over TCP that parses each command and answers it ---------------- */

typedef struct smart {
    int listen_fd;
    uint16_t port;
    pthread_t thread;
    volatile int stop;
    uint16_t other_port;     /* CLUSTER SLOTS: slots 8192.. are on 127.0.0.1:other_port */
    unsigned reply_delay_ms; /* before each GET's reply */
    size_t value_bytes;      /* each GET's value */
} smart;

static int tcp_listen(uint16_t *port, int backlog) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, backlog), 0);
    socklen_t len = sizeof a;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* The first argument of each whole command in buf[0..n) (its length in *used); 0 when none. */
static int next_command(const char *buf, size_t n, char *name, size_t name_cap, size_t *used) {
    size_t at = 0;
    long argc = 0;
    if (n < 4 || buf[0] != '*' || sscanf(buf + 1, "%ld", &argc) != 1) return 0;
    const char *eol = memchr(buf, '\n', n);
    if (!eol) return 0;
    at = (size_t)(eol - buf) + 1;
    for (long i = 0; i < argc; i++) {
        long len = 0;
        if (at >= n || buf[at] != '$' || sscanf(buf + at + 1, "%ld", &len) != 1) return 0;
        eol = memchr(buf + at, '\n', n - at);
        if (!eol) return 0;
        at = (size_t)(eol - buf) + 1;
        if (at + (size_t)len + 2 > n) return 0;
        if (i == 0) snprintf(name, name_cap, "%.*s", (int)(len < 31 ? len : 31), buf + at);
        at += (size_t)len + 2;
    }
    *used = at;
    return 1;
}

static void *smart_conn(void *arg) {
    smart *m = ((void **)arg)[0];
    int c = (int)(intptr_t)((void **)arg)[1];
    free(arg);
    char *buf = malloc(1 << 20), *value = malloc(m->value_bytes + 64);
    size_t have = 0;
    int vh = snprintf(value, 64, "$%zu\r\n", m->value_bytes);
    memset(value + vh, 'v', m->value_bytes);
    memcpy(value + vh + m->value_bytes, "\r\n", 2);
    while (!m->stop) {
        struct pollfd q = {.fd = c, .events = POLLIN};
        if (poll(&q, 1, 50) <= 0) continue;
        ssize_t r = recv(c, buf + have, (1 << 20) - have, 0);
        if (r <= 0) break;
        have += (size_t)r;
        char name[32];
        size_t used = 0;
        while (next_command(buf, have, name, sizeof name, &used)) {
            if (strcmp(name, "CLUSTER") == 0) {
                char map[256];
                int k = snprintf(map, sizeof map,
                                 "*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:%u\r\n"
                                 "*3\r\n:8192\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%u\r\n",
                                 m->port, m->other_port);
                send_all(c, map, (size_t)k);
            } else if (strcmp(name, "GET") == 0) {
                if (m->reply_delay_ms) usleep(m->reply_delay_ms * 1000u);
                send_all(c, value, (size_t)vh + m->value_bytes + 2);
            } else if (strcmp(name, "EXISTS") == 0) {
                send_all(c, ":0\r\n", 4);
            } else {
                send_all(c, "+OK\r\n", 5);
            }
            memmove(buf, buf + used, have - used);
            have -= used;
        }
    }
    free(buf);
    free(value);
    close(c);
    return NULL;
}

static void *smart_main(void *arg) {
    smart *m = arg;
    pthread_t threads[16];
    int n = 0;
    while (!m->stop) {
        struct pollfd p = {.fd = m->listen_fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(m->listen_fd, NULL, NULL);
        if (c < 0 || n == 16) {
            if (c >= 0) close(c);
            continue;
        }
        void **a = malloc(2 * sizeof *a);
        a[0] = m;
        a[1] = (void *)(intptr_t)c;
        pthread_create(&threads[n++], NULL, smart_conn, a);
    }
    for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
    return NULL;
}

static void smart_start(smart *m, uint16_t other_port, unsigned delay_ms, size_t value_bytes) {
    memset(m, 0, sizeof *m);
    m->other_port = other_port;
    m->reply_delay_ms = delay_ms;
    m->value_bytes = value_bytes;
    m->listen_fd = tcp_listen(&m->port, 16);
    ck_assert_int_eq(pthread_create(&m->thread, NULL, smart_main, m), 0);
}

static void smart_stop(smart *m) {
    m->stop = 1;
    pthread_join(m->thread, NULL);
    close(m->listen_fd);
}

/* A master whose listen queue is full: the kernel drops the SYNs of a new connection, as a host that
 * is gone does. */
typedef struct black_hole {
    int listen_fd, filler[4];
    uint16_t port;
} black_hole;

static void black_hole_start(black_hole *b) {
    b->listen_fd = tcp_listen(&b->port, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons(b->port)};
    for (int i = 0; i < 4; i++) { /* fill the queue (its length is backlog + 1) */
        b->filler[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        (void)connect(b->filler[i], (struct sockaddr *)&a, sizeof a);
    }
    usleep(100 * 1000);
}

static void black_hole_stop(black_hole *b) {
    for (int i = 0; i < 4; i++) close(b->filler[i]);
    close(b->listen_fd);
}

static void *cluster_tier(uint16_t port, const char *timeout_ms, const char *inflight) {
    char node[32];
    snprintf(node, sizeof node, "127.0.0.1:%u", port);
    kvs_backend_option opts[] = {{"node", node},
                                 {"mode", "cluster"},
                                 {"timeout_ms", timeout_ms},
                                 {"inflight_bytes", inflight}};
    return create_ok(opts, 4);
}

/* Keys whose slots are on the first half (the healthy master) and the second (the other). */
static uint32_t keys_by_half(kvs_key *keys, uint32_t n, int *on_first) {
    uint32_t first = 0;
    for (uint32_t i = 0; i < n; i++) {
        keys[i] = key_of((uint8_t)i);
        char text[64];
        int len = snprintf(text, sizeof text, "kvs1:default:");
        for (int b = 0; b < 16; b++)
            len += snprintf(text + len, sizeof text - (size_t)len, "%02x", keys[i].bytes[b]);
        on_first[i] = kvs_redis_key_slot(text, (size_t)len) < 8192;
        first += (uint32_t)on_first[i];
    }
    return first;
}

/* A master that does not even take connections costs its own keys, not the healthy master's: the
 * healthy one is never marked down for the time the other one took. */
START_TEST(a_black_holed_master_does_not_take_a_healthy_one_down) {
    black_hole b;
    black_hole_start(&b);
    smart m;
    smart_start(&m, b.port, 0, 100);
    void *t = cluster_tier(m.port, "400", "8MiB");
    enum { N = 24 };
    kvs_key keys[N];
    int on_first[N];
    uint32_t first = keys_by_half(keys, N, on_first);
    ck_assert_uint_gt(first, 0);
    ck_assert_uint_lt(first, N);
    char *bufs[N];
    uint64_t caps[N], lens[N];
    kvs_status sts[N];
    for (uint32_t i = 0; i < N; i++) {
        bufs[i] = malloc(128);
        caps[i] = 128;
    }
    for (int round = 0; round < 3; round++) {
        ck_assert_int_eq(
            kvs_redis_backend()->get_many(t, keys, (void *const *)bufs, caps, N, lens, sts),
            KVS_OK);
        for (uint32_t i = 0; i < N; i++)
            ck_assert_msg(sts[i] == (on_first[i] ? KVS_OK : KVS_ENOTFOUND),
                          "round %d key %u (on the healthy master: %d): status %d", round, i,
                          on_first[i], sts[i]);
        kvs_redis_stats_t s;
        kvs_redis_stats(t, &s);
        ck_assert_uint_le(s.masters_down, 1);
    }
    for (uint32_t i = 0; i < N; i++) free(bufs[i]);
    kvs_redis_backend()->destroy(t);
    smart_stop(&m);
    black_hole_stop(&b);
}
END_TEST

/* While the in-flight cap holds requests back, the call sleeps in poll until replies come: it does
 * not spin on a socket that is writable. */
START_TEST(waiting_under_the_inflight_cap_does_not_spin) {
    smart m;
    smart_start(&m, 1, 20, 100 << 10); /* slots 8192..: port 1, nothing there */
    void *t = cluster_tier(m.port, "5000", "64KiB");
    enum { N = 32 };
    kvs_key keys[N];
    int on_first[N];
    keys_by_half(keys, N, on_first);
    char *bufs[N];
    uint64_t caps[N], lens[N];
    kvs_status sts[N];
    uint32_t n = 0;
    for (uint32_t i = 0; i < N; i++) {
        if (!on_first[i]) continue;
        keys[n] = keys[i];
        bufs[n] = malloc(128 << 10);
        caps[n++] = 128 << 10;
    }
    ck_assert_int_eq(
        kvs_redis_backend()->get_many(t, keys, (void *const *)bufs, caps, n, lens, sts), KVS_OK);
    for (uint32_t i = 0; i < n; i++) ck_assert_int_eq(sts[i], KVS_OK);
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    /* n replies 20 ms apart, each of a few segments: a handful of waits per reply; a loop that
     * spun on the writable socket would count thousands */
    ck_assert_msg(s.polls < 20ull * n, "%llu polls for %u replies", (unsigned long long)s.polls, n);
    for (uint32_t i = 0; i < n; i++) free(bufs[i]);
    kvs_redis_backend()->destroy(t);
    smart_stop(&m);
}
END_TEST

/* A server that answers AUTH with a redirection (a broken or hostile one): the AUTH is not followed
 * elsewhere, the connection fails, every get is a miss, nothing is freed twice (ASAN's to see). */
START_TEST(a_redirected_auth_is_refused_not_followed) {
    static const answer script[] = {{.first = "-MOVED 0 127.0.0.1:1\r\n"},
                                    {.first = "-ASK 0 127.0.0.1:1\r\n"},
                                    {.first = "-MOVED 0 127.0.0.1:1\r\n"},
                                    {.first = "-MOVED 0 127.0.0.1:1\r\n"}};
    fake f;
    fake_start(&f, script, 4);
    f.script_from = 1;
    char pass[512];
    ck_assert_int_eq(kvs_test_write_file(f.dir, "p", "secret\n", pass, sizeof pass), 0);
    ck_assert_int_eq(chmod(pass, 0600), 0);
    kvs_backend_option opts[] = {{"node", f.path},
                                 {"password_file", pass},
                                 {"timeout_ms", "300"},
                                 {"connect_backoff_ms", "1"}};
    void *t = create_ok(opts, 4);
    char buf[16];
    uint64_t len = 0;
    kvs_key k = key_of(5);
    for (int i = 0; i < 3; i++) {
        usleep(5000);
        ck_assert_int_eq(kvs_redis_backend()->get(t, &k, buf, sizeof buf, &len), KVS_ENOTFOUND);
    }
    ck_assert_ptr_nonnull(strstr(kvs_redis_backend()->last_error(t), "AUTH"));
    kvs_redis_backend()->destroy(t);
    fake_stop(&f);
}
END_TEST

/* Log lines the tier writes (a host's log), kept for the test to read. */
typedef struct log_capture {
    char lines[16][512];
    int n;
} log_capture;

static void capture_log(void *ctx, int level, const char *message) {
    (void)level;
    log_capture *c = ctx;
    if (c->n < 16) snprintf(c->lines[c->n++], sizeof c->lines[0], "%s", message);
}

/* The first line from line `from` on that holds needle, or -1. */
static int logged_from(const log_capture *c, int from, const char *needle) {
    for (int i = from; i < c->n; i++)
        if (strstr(c->lines[i], needle)) return i;
    return -1;
}

/* An outage reads in a plain log: down, still down after how long and how many attempts, back
 * after how long - the reconnect's progress where no terminal shows one. */
START_TEST(an_outage_logs_how_long_it_lasted_and_when_the_server_is_back) {
    fake f;
    fake_start(&f, NULL, 0);
    log_capture logs = {.n = 0};
    kvs_backend_host host = {.struct_size = sizeof host, .ctx = &logs, .log = capture_log};
    kvs_backend_option opts[] = {
        {"node", f.path}, {"timeout_ms", "300"}, {"connect_backoff_ms", "1"}};
    char err[512] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "fake",
                             .max_object_bytes = 1 << 20,
                             .options = opts,
                             .n_options = 3,
                             .host = &host,
                             .error = err,
                             .error_len = sizeof err};
    void *t = NULL;
    ck_assert_msg(kvs_redis_backend()->create(&init, &t) == KVS_OK, "create: %s", err);
    const kvs_backend_ops *ops = kvs_redis_backend();
    char buf[64];
    uint64_t len = 0;
    kvs_key k = key_of(1);
    ops->get(t, &k, buf, sizeof buf, &len); /* connected */
    char path[sizeof f.path];
    memcpy(path, f.path, sizeof path);
    fake_stop(&f); /* the server goes away (its socket file with it) */
    int from = logs.n;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(ops->get(t, &k, buf, sizeof buf, &len), KVS_ENOTFOUND);
        usleep(20000); /* past the backoff (1, 2, 4 ms): each get tries again */
    }
    int down = logged_from(&logs, 0, "is down");
    int still = logged_from(&logs, from, "is still down after");
    ck_assert_msg(down >= 0 && still > down, "no outage lines (%d lines): %s / %s / %s", logs.n,
                  logs.lines[0], logs.lines[1], logs.lines[2]);
    ck_assert_ptr_nonnull(strstr(logs.lines[still], "1 attempt"));
    /* the server again, at the same path */
    fake g;
    fake_start(&g, NULL, 0);
    char dir[sizeof f.dir];
    memcpy(dir, f.dir, sizeof dir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(rename(g.path, path), 0);
    kvs_status st = KVS_ENOTFOUND;
    for (int tries = 0; tries < 50 && logged_from(&logs, from, "is back after") < 0; tries++) {
        st = ops->get(t, &k, buf, sizeof buf, &len);
        usleep(20000);
    }
    (void)st;
    int back = logged_from(&logs, from, "is back after");
    ck_assert_msg(back > still, "no line saying the server is back");
    ck_assert_ptr_nonnull(strstr(logs.lines[back], "s down ("));
    ops->destroy(t);
    fake_stop(&g);
    kvs_test_rmtree(dir);
}
END_TEST

static Suite *fake_suite(void) {
    Suite *s = suite_create("redis_fake");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, broken_answers_are_misses_and_the_tier_stays_up);
    tcase_add_test(tc, a_value_longer_than_the_buffer_is_overflow);
    tcase_add_test(tc, a_server_stopping_mid_value_never_writes_after_return);
    tcase_add_test(tc, an_error_answer_is_a_miss_with_a_sentence);
    tcase_add_test(tc, a_black_holed_master_does_not_take_a_healthy_one_down);
    tcase_add_test(tc, waiting_under_the_inflight_cap_does_not_spin);
    tcase_add_test(tc, a_redirected_auth_is_refused_not_followed);
    tcase_add_test(tc, an_outage_logs_how_long_it_lasted_and_when_the_server_is_back);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *runner = srunner_create(fake_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed ? 1 : 0;
}
