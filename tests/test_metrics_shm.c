/* test_metrics_shm.c - the metrics segment on a full /dev/shm (common/metrics_seg.c): opening it
 * turns metrics off with an error (no SIGBUS inside the caller, nothing left behind), and a segment
 * a creator left sized without its header is created again rather than refused for good.
 *
 * It needs a small tmpfs of its own on /dev/shm: a child enters a new mount namespace (and, when not
 * root, a user namespace) and mounts one there. Where that is impossible the test exits 77
 * (skipped); nothing outside the child's namespace is touched. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/metrics.h"
#include "common/metrics_seg.h"

#define SKIP 77

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* A mount namespace of this process's own, with a 2 MiB tmpfs on /dev/shm. */
static int private_shm(void) {
    uid_t uid = getuid();
    gid_t gid = getgid();
    if (geteuid() != 0 || unshare(CLONE_NEWNS) != 0) {
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return -1;
        char map[64];
        write_file("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "0 %u 1", (unsigned)uid);
        if (write_file("/proc/self/uid_map", map) != 0) return -1;
        snprintf(map, sizeof map, "0 %u 1", (unsigned)gid);
        if (write_file("/proc/self/gid_map", map) != 0) return -1;
    }
    /* private first, so the mount below never shows outside this namespace */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return -1;
    if (mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=2M,mode=1777") != 0) return -1;
    return 0;
}

/* Runs fn in a child: its exit status, or 128 + the signal that killed it. */
static int in_child(int (*fn)(const char *), const char *name) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) _exit(fn(name));
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int attach_is_refused(const char *name) {
    kvs_mseg_values v;
    memset(&v, 0, sizeof v);
    v.kind = KVS_MSEG_STORE;
    kvs_metrics_source *src = kvs_metrics_attach("127.0.0.1:1", name, 0, &v, NULL, NULL);
    if (src) return 1; /* it found room: the filler did not fill the tmpfs */
    return 0;
}

static int open_and_claim(const char *name) {
    kvs_mseg seg;
    char err[300];
    if (kvs_mseg_open(name, 1, &seg, err, sizeof err) != KVS_OK) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }
    kvs_mseg_values v;
    memset(&v, 0, sizeof v);
    v.kind = KVS_MSEG_STORE;
    int slot = kvs_mseg_claim(&seg, &v);
    kvs_mseg_close(&seg);
    return slot >= 0 ? 0 : 2;
}

static int fail(const char *what) {
    fprintf(stderr, "FAIL: %s\n", what);
    return 1;
}

static int run(void) {
    if (private_shm() != 0) {
        fprintf(stderr, "SKIP: cannot mount a tmpfs of this test's own on /dev/shm (%s)\n",
                strerror(errno));
        return SKIP;
    }
    /* something else (a DRAM tier's objects) takes every page */
    struct statvfs vs;
    if (statvfs("/dev/shm", &vs) != 0) return fail("statvfs");
    off_t room = (off_t)(vs.f_bavail * vs.f_frsize);
    int filler = open("/dev/shm/filler", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (filler < 0 || posix_fallocate(filler, 0, room) != 0) return fail("filler");

    int rc = in_child(attach_is_refused, "full");
    if (rc != 0) {
        fprintf(stderr, "attach on a full /dev/shm: %s %d\n", rc >= 128 ? "signal" : "status",
                rc >= 128 ? rc - 128 : rc);
        return fail("attach on a full /dev/shm must return NULL, not crash or succeed");
    }
    struct stat sb;
    if (stat("/dev/shm/kvstrata-full", &sb) == 0) return fail("the failed segment was left behind");

    /* a creator that died after sizing it: no header; once there is room it is created again */
    if (ftruncate(filler, 0) != 0) return fail("truncate filler");
    int stale = open("/dev/shm/kvstrata-stale", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (stale < 0 || ftruncate(stale, 1 << 20) != 0) return fail("stale segment");
    close(stale);
    if (in_child(open_and_claim, "stale") != 0)
        return fail("a segment sized without a header must be created again");
    if (in_child(open_and_claim, "stale") != 0) return fail("and then opened as it is");
    return 0;
}

int main(void) {
    pid_t pid = fork(); /* the namespaces are the child's only */
    if (pid < 0) return 1;
    if (pid == 0) _exit(run());
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return 1;
    if (!WIFEXITED(st)) {
        fprintf(stderr, "FAIL: the test's child died of signal %d\n", WTERMSIG(st));
        return 1;
    }
    if (WEXITSTATUS(st) == 0) printf("metrics segment on a full /dev/shm: ok\n");
    return WEXITSTATUS(st);
}
