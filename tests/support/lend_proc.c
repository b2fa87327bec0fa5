/* lend_proc.c - kvstrata-lend as a child process of a suite (lend_proc.h). */
#include "lend_proc.h"

#include <check.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wait.h"

void kvs_test_lender_start(kvs_test_lender *l, const char *socket_path, unsigned units,
                           const char *unit_size, const char *const *extra) {
    memset(l, 0, sizeof *l);
    int in[2], out[2];
    ck_assert(pipe(in) == 0 && pipe(out) == 0);
    char bin[600], n[16];
    snprintf(bin, sizeof bin, "%s/kvstrata-lend", KVS_TEST_BIN_DIR);
    snprintf(n, sizeof n, "%u", units);
    const char *argv[32] = {bin, "--socket", socket_path, "--units", n, "--unit-size", unit_size};
    int k = 7;
    for (int i = 0; extra && extra[i] && k < 31; i++) argv[k++] = extra[i];
    argv[k] = NULL;
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || dup2(in[0], 0) != 0 || dup2(out[1], 1) != 1)
            _exit(127);
        close(in[1]);
        close(out[0]);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    l->pid = pid;
    l->in_fd = in[1];
    l->out_fd = out[0];
    ck_assert_msg(kvs_test_lender_expect(l, "ready", 1, 10000), "kvstrata-lend is not ready: %s",
                  l->out);
}

void kvs_test_lender_say(kvs_test_lender *l, const char *fmt, ...) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    line[n++] = '\n';
    ck_assert(write(l->in_fd, line, (size_t)n) == n);
}

int kvs_test_lender_next(kvs_test_lender *l, char *line, size_t len, int deadline_ms) {
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(deadline_ms);
    for (;;) {
        char *nl = memchr(l->out + l->seen, '\n', l->out_len - l->seen);
        if (nl) {
            size_t n = (size_t)(nl - (l->out + l->seen));
            snprintf(line, len, "%.*s", (int)n, l->out + l->seen);
            l->seen += n + 1;
            return 1;
        }
        int left = (int)(until - kvs_test_now_ms());
        if (left <= 0) return 0;
        struct pollfd p = {.fd = l->out_fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0) return 0;
        if (l->out_len + 1 >= sizeof l->out) { /* drop what was read already */
            memmove(l->out, l->out + l->seen, l->out_len - l->seen);
            l->out_len -= l->seen;
            l->seen = 0;
        }
        ssize_t got = read(l->out_fd, l->out + l->out_len, sizeof l->out - 1 - l->out_len);
        if (got <= 0) return 0;
        l->out_len += (size_t)got;
        l->out[l->out_len] = '\0';
    }
}

int kvs_test_lender_expect(kvs_test_lender *l, const char *prefix, int n, int deadline_ms) {
    char line[256];
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(deadline_ms);
    while (n > 0) {
        int left = (int)(until - kvs_test_now_ms());
        if (left <= 0 || !kvs_test_lender_next(l, line, sizeof line, left)) return 0;
        if (strncmp(line, prefix, strlen(prefix)) == 0) n--;
    }
    return 1;
}

void kvs_test_lender_kill(kvs_test_lender *l) {
    if (!l->pid) return;
    kill(l->pid, SIGKILL);
    kvs_test_wait_child(l->pid);
    l->pid = 0;
    close(l->in_fd);
    close(l->out_fd);
}

int kvs_test_lender_stop(kvs_test_lender *l) {
    if (!l->pid) return -1;
    kvs_test_lender_say(l, "quit");
    (void)kvs_test_lender_expect(l, "bye", 1, 5000);
    close(l->in_fd);
    close(l->out_fd);
    int status = kvs_test_wait_child(l->pid);
    l->pid = 0;
    return status;
}
