/* test_redis_fake.c - the redis tier against a fake server this suite runs on a unix socket: garbage,
 * huge lengths, truncated replies, a server that stops in the middle of a value. The engine's view:
 * every such get is a miss within timeout_ms, the tier stays usable, and the caller's buffer is never
 * written after the get returned. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "backends/redis/redis.h"
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
    int requests; /* requests seen */
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
            const answer *a = next < f->n_answers && f->requests > 1 ? &f->answers[next++] : &none;
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

static void *tier_open(const fake *f, const char *timeout_ms, const char *conns) {
    kvs_backend_option opts[] = {{"node", f->path},
                                 {"timeout_ms", timeout_ms},
                                 {"connections_per_node", conns},
                                 {"connect_backoff_ms", "1"}};
    char err[512] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "fake",
                             .max_object_bytes = 1 << 20,
                             .options = opts,
                             .n_options = 4,
                             .error = err,
                             .error_len = sizeof err};
    void *state = NULL;
    kvs_status st = kvs_redis_backend()->create(&init, &state);
    ck_assert_msg(st == KVS_OK, "create: %s", err);
    return state;
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

/* An error answer the tier does not know is a miss with the server's words in last_error. */
START_TEST(an_error_answer_is_a_miss_with_a_sentence) {
    static const answer script[] = {{.first = "-ERR something odd\r\n"},
                                    {.first = "-OOM command not allowed\r\n"}};
    fake f;
    fake_start(&f, script, 2);
    void *t = tier_open(&f, "500", "1");
    char buf[16];
    uint64_t len = 0;
    kvs_key k = key_of(3);
    ck_assert_int_eq(kvs_redis_backend()->get(t, &k, buf, sizeof buf, &len), KVS_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(kvs_redis_backend()->last_error(t), "something odd"));
    ck_assert_int_eq(kvs_redis_backend()->put(t, &k, "abc", 3), KVS_ENOMEM);
    kvs_redis_stats_t s;
    kvs_redis_stats(t, &s);
    ck_assert_uint_eq(s.puts_refused_oom, 1);
    kvs_redis_backend()->destroy(t);
    fake_stop(&f);
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
