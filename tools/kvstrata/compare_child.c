/* compare_child.c - child processes of kvstrata compare (compare_child.h). */
#include "compare_child.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

pid_t cmp_spawn(const char *path, char *const argv[], int in_fd, int out_fd, int err_fd, char *err,
                size_t err_len) {
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0) {
        snprintf(err, err_len, "cannot open /dev/null: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, err_len, "cannot start %s: fork: %s", path, strerror(errno));
        close(null_fd);
        return -1;
    }
    if (pid == 0) {
        /* its own group: a timeout stops the child and whatever it started */
        setpgid(0, 0);
        signal(SIGPIPE, SIG_DFL);
        int fds[3] = {in_fd, out_fd, err_fd};
        for (int i = 0; i < 3; i++)
            if (dup2(fds[i] >= 0 ? fds[i] : null_fd, i) < 0) _exit(127);
        execv(path, argv);
        dprintf(2, "cannot run %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* also here, so a kill right after fork finds the group */
    close(null_fd);
    return pid;
}

/* 1 once pid has ended (not reaped yet: its pid, and so its group's id, stays reserved until
 * reap() runs, which makes the kill of the group safe), 0 while it runs, -1 on error. */
static int ended(pid_t pid) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0)
        return errno == EINTR ? 0 : -1;
    return info.si_pid == pid ? 1 : 0;
}

/* Stop what the child left in its group, then reap the child into *out. */
static void reap(pid_t pid, cmp_exit *out) {
    int status = 0;
    kill(-pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status)) {
        out->exited = 1;
        out->code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        out->signal = WTERMSIG(status);
    }
}

/* TERM to the group, KILL after 2 s; the wait after SIGKILL, which cannot be caught, is bounded
 * too (a process in uninterruptible sleep is left to finish on its own). */
static void stop_group(pid_t pid, cmp_exit *out) {
    kill(-pid, SIGTERM);
    for (int i = 0; i < 20; i++) {
        if (ended(pid) == 1) {
            reap(pid, out);
            return;
        }
        sleep_ms(100);
    }
    kill(-pid, SIGKILL);
    for (int i = 0; i < 50; i++) {
        if (ended(pid) == 1) {
            reap(pid, out);
            return;
        }
        sleep_ms(100);
    }
    out->signal = SIGKILL;
}

int cmp_wait(pid_t pid, double timeout_s, void (*tick)(void *ctx), void *ctx, cmp_exit *out) {
    memset(out, 0, sizeof *out);
    double deadline = now_s() + timeout_s;
    for (;;) {
        int e = ended(pid);
        if (e == 1) {
            reap(pid, out);
            return 0;
        }
        if (e < 0) {
            stop_group(pid, out);
            return -1;
        }
        if (tick) tick(ctx);
        if (now_s() >= deadline) {
            out->timed_out = 1;
            stop_group(pid, out);
            return 0;
        }
        sleep_ms(100);
    }
}

void cmp_exit_describe(const cmp_exit *e, double timeout_s, char *buf, size_t len) {
    if (e->timed_out)
        snprintf(buf, len, "no result within %.0f s (stopped)", timeout_s);
    else if (e->exited)
        snprintf(buf, len, "exit status %d", e->code);
    else if (e->signal)
        snprintf(buf, len, "killed by signal %d (%s)", e->signal, strsignal(e->signal));
    else
        snprintf(buf, len, "ended in a way waitpid did not say");
}

int cmp_find_program(const char *name, char *buf, size_t len) {
    if (strchr(name, '/')) {
        snprintf(buf, len, "%s", name);
        return access(buf, X_OK) == 0 ? 0 : -1;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        int w = n ? snprintf(buf, len, "%.*s/%s", (int)n, path, name)
                  : snprintf(buf, len, "./%s", name);
        if (w > 0 && (size_t)w < len && access(buf, X_OK) == 0) return 0;
        path += n;
        if (*path == ':') path++;
    }
    return -1;
}
