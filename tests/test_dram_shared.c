/* test_dram_shared.c - the DRAM tier shared between processes (shm_name): attaching, detaching,
 * unlinking after the last user, and processes that die holding it. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/dram/dram_table.h"
#include "common/clock.h"
#include "tests/support/dram_tier.h"
#include "tests/support/objects.h"
#include "tests/support/wait.h"

#define KIB 1024ull

static const kvs_backend_ops *ops;

static void setup(void) {
    kvs_test_dram_setup();
    ops = kvs_test_dram_ops;
}

static pid_t runner_pid; /* set in main, inherited by the test processes Check forks */

static void unique_shm_name(char *buf, size_t len) {
    static unsigned counter;
    snprintf(buf, len, "kvs-test-dram-%d-%d-%u", (int)runner_pid, (int)getpid(), counter++);
}

/* Names left by a test that was killed (timeout, crash) are removed when the run ends. */
static void remove_leftover_shm(void) {
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "kvs-test-dram-%d-", (int)runner_pid);
    DIR *dir = opendir("/dev/shm");
    if (!dir) return;
    for (struct dirent *e = readdir(dir); e; e = readdir(dir)) {
        char path[300];
        if (strncmp(e->d_name, prefix, (size_t)n) != 0) continue;
        snprintf(path, sizeof path, "/%s", e->d_name);
        if (shm_unlink(path) != 0) fprintf(stderr, "test_dram: cannot remove /dev/shm%s\n", path);
    }
    if (closedir(dir) != 0) fprintf(stderr, "test_dram: cannot close /dev/shm\n");
}

static int shm_exists(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/%s", name);
    int fd = shm_open(path, O_RDONLY, 0);
    if (fd < 0) return 0;
    ck_assert_int_eq(close(fd), 0);
    return 1;
}

static void *open_shared(const char *shm, uint64_t n_slabs, const kvs_backend_host *host) {
    kvs_backend_option opt = {"shm_name", shm};
    void *st = NULL;
    kvs_status rc = kvs_test_dram_open("shared", n_slabs * 4 * KIB, 4 * KIB, &opt, 1, host, &st);
    return rc == KVS_OK ? st : NULL;
}

/* The shared tier shm with one more option (key: value), asserted to open. */
static void *open_shared_with(const char *shm, uint64_t n_slabs, const char *key,
                              const char *value) {
    kvs_backend_option opts[2] = {{"shm_name", shm}, {key, value}};
    void *st = NULL;
    ck_assert_int_eq(kvs_test_dram_open("shared", n_slabs * 4 * KIB, 4 * KIB, opts, 2, NULL, &st),
                     KVS_OK);
    return st;
}

START_TEST(object_put_by_a_child_process_is_seen_by_the_parent) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_msg(st != NULL, "create: %s", kvs_test_dram_error);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        void *child = open_shared(shm, 4, NULL);
        if (!child) _exit(1);
        uint8_t buf[1000];
        kvs_test_fill(buf, sizeof buf, 3);
        kvs_key k = kvs_test_key(3);
        int rc = ops->put(child, &k, buf, sizeof buf) == KVS_OK ? 0 : 2;
        ops->destroy(child);
        _exit(rc);
    }
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    kvs_test_dram_expect(st, 3, 1000);
    ck_assert(shm_exists(shm)); /* the parent still holds it */
    ops->destroy(st);
}
END_TEST

START_TEST(shm_open_attach_attaches_an_existing_tier_and_never_creates_one) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    kvs_backend_option attach[2] = {{"shm_name", shm}, {"shm_open", "attach"}};
    void *st = NULL;
    /* nothing to attach: refused, and no object left behind */
    ck_assert_int_eq(kvs_test_dram_open("shared", 4 * 4 * KIB, 4 * KIB, attach, 2, NULL, &st),
                     KVS_ENOTFOUND);
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(kvs_test_dram_error, "to attach") != NULL, "error: %s",
                  kvs_test_dram_error);
    ck_assert(!shm_exists(shm));
    /* made by another opener: attached, the same objects */
    void *owner = open_shared(shm, 4, NULL);
    ck_assert_msg(owner != NULL, "create: %s", kvs_test_dram_error);
    kvs_test_dram_put(owner, 5, 1500);
    ck_assert_int_eq(kvs_test_dram_open("shared", 4 * 4 * KIB, 4 * KIB, attach, 2, NULL, &st),
                     KVS_OK);
    kvs_test_dram_expect(st, 5, 1500);
    ops->destroy(st);
    ops->destroy(owner);
    ck_assert(!shm_exists(shm));
    /* attach without a name to attach is a configuration error */
    kvs_backend_option no_name = {"shm_open", "attach"};
    ck_assert_int_eq(kvs_test_dram_open("private", 4 * 4 * KIB, 4 * KIB, &no_name, 1, NULL, &st),
                     KVS_ECONFIG);
    ck_assert_msg(strstr(kvs_test_dram_error, "shm_open") != NULL, "error: %s",
                  kvs_test_dram_error);
}
END_TEST

/* A process stopped while it holds the tier's lock (SIGSTOP, a debugger) holds up an attacher with
 * lock_timeout_ms only that long: its op fails with KVS_ETIMEDOUT and a sentence. Once the holder
 * dies the lock is taken again (robust) and the objects are there. */
START_TEST(lock_timeout_ms_bounds_the_wait_for_a_lock_another_process_holds) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *owner = open_shared(shm, 4, NULL);
    ck_assert_msg(owner != NULL, "create: %s", kvs_test_dram_error);
    kvs_test_dram_put(owner, 5, 1500);
    void *st = open_shared_with(shm, 4, "lock_timeout_ms", "200");
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) { /* takes the lock through its own attachment and keeps it */
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, should it fail */
        void *holder = open_shared(shm, 4, NULL);
        if (!holder || dram_lock(holder) != KVS_OK || write(ready[1], "l", 1) != 1) _exit(2);
        for (;;) pause();
    }
    char c = 0;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    kvs_key k = kvs_test_key(5);
    uint8_t buf[1500];
    uint64_t got = 0;
    uint64_t t0 = kvs_now_ns();
    ck_assert_int_eq(ops->get(st, &k, buf, sizeof buf, &got), KVS_ETIMEDOUT);
    uint64_t waited_ms = (kvs_now_ns() - t0) / 1000000u;
    ck_assert_msg(waited_ms >= 150 && waited_ms < 5000, "waited %llu ms",
                  (unsigned long long)waited_ms);
    ck_assert_msg(strstr(ops->last_error(st), "lock_timeout_ms") != NULL, "error: %s",
                  ops->last_error(st));
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    kvs_test_dram_expect(st, 5, 1500); /* the dead holder's lock is recovered */
    close(ready[0]);
    close(ready[1]);
    ops->destroy(st);
    ops->destroy(owner);
}
END_TEST

/* evict: never takes free room only: a full tier refuses its put and reservation (KVS_ENOMEM) and
 * keeps every object; with room freed by another process it stores. */
START_TEST(evict_never_takes_free_room_only) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *owner = open_shared(shm, 2, NULL);
    ck_assert_msg(owner != NULL, "create: %s", kvs_test_dram_error);
    void *st = open_shared_with(shm, 2, "evict", "never");
    kvs_test_dram_put(st, 1, 1000); /* free room: stored */
    kvs_test_dram_put(owner, 2, 1000);
    uint8_t buf[1000];
    kvs_test_fill(buf, sizeof buf, 3);
    kvs_key k3 = kvs_test_key(3);
    ck_assert_int_eq(ops->put(st, &k3, buf, sizeof buf), KVS_ENOMEM);
    void *dst = NULL;
    uint64_t ticket = 0;
    ck_assert_int_eq(ops->reserve(st, &k3, sizeof buf, &dst, &ticket), KVS_ENOMEM);
    kvs_test_dram_expect(owner, 1, 1000);
    kvs_test_dram_expect(owner, 2, 1000);
    kvs_key k1 = kvs_test_key(1);
    ck_assert_int_eq(ops->remove(owner, &k1), KVS_OK);
    ck_assert_int_eq(ops->put(st, &k3, buf, sizeof buf), KVS_OK);
    kvs_test_dram_expect(owner, 3, 1000);
    kvs_test_dram_expect(owner, 2, 1000);
    ops->destroy(st);
    ops->destroy(owner);
}
END_TEST

START_TEST(object_put_by_the_parent_is_seen_by_a_child_process) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_msg(st != NULL, "create: %s", kvs_test_dram_error);
    kvs_test_dram_put(st, 8, 2000);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        void *child = open_shared(shm, 4, NULL);
        if (!child) _exit(1);
        uint8_t out[4096];
        uint64_t len = 0;
        kvs_key k = kvs_test_key(8);
        int rc = ops->get(child, &k, out, sizeof out, &len) == KVS_OK ? 0 : 2;
        if (rc == 0 && (len != 2000 || !kvs_test_bytes_match(out, len, 8))) rc = 3;
        kvs_key gone = kvs_test_key(9);
        if (rc == 0 && ops->get(child, &gone, out, sizeof out, &len) != KVS_ENOTFOUND) rc = 4;
        ops->destroy(child);
        _exit(rc);
    }
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    ops->destroy(st);
}
END_TEST

START_TEST(attach_with_another_geometry_is_refused_naming_both) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_msg(st != NULL, "create: %s", kvs_test_dram_error);
    ck_assert_ptr_null(open_shared(shm, 8, NULL));
    ck_assert_ptr_nonnull(strstr(kvs_test_dram_error, "holds 4 slabs of 4KiB"));
    ck_assert_ptr_nonnull(strstr(kvs_test_dram_error, "asks for 8 slabs of 4KiB"));
    kvs_backend_option opt = {"shm_name", shm};
    void *other = NULL;
    ck_assert_int_eq(kvs_test_dram_open("shared", 4 * 8 * KIB, 8 * KIB, &opt, 1, NULL, &other),
                     KVS_ECONFIG);
    ck_assert_ptr_nonnull(strstr(kvs_test_dram_error, "4 slabs of 8KiB"));
    void *same = open_shared(shm, 4, NULL); /* the matching geometry still attaches */
    ck_assert_ptr_nonnull(same);
    ops->destroy(same);
    ops->destroy(st);
}
END_TEST

START_TEST(shared_memory_is_unlinked_after_the_last_destroy) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *a = open_shared(shm, 4, NULL);
    void *b = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ops->destroy(a);
    ck_assert(shm_exists(shm));
    kvs_test_dram_put(b, 1, 10); /* the survivor keeps working */
    ops->destroy(b);
    ck_assert(!shm_exists(shm));
    /* The name can be created afresh, empty. */
    void *c = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(c);
    uint64_t n_objects = 9, bytes = 9;
    ck_assert_int_eq(ops->usage(c, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 0);
    ops->destroy(c);
    ck_assert(!shm_exists(shm));
}
END_TEST

/* Each child opens, puts its own key, reads it back and closes, over and over, so creates, attaches
 * and last-destroy unlinks of one name race with each other. */
START_TEST(concurrent_opens_and_closes_of_one_name_never_fail_or_leak) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    pid_t pids[6];
    for (int p = 0; p < 6; p++) {
        pids[p] = fork();
        ck_assert_int_ge(pids[p], 0);
        if (pids[p] > 0) continue;
        int bad = 0;
        for (uint32_t it = 0; it < 100 && !bad; it++) {
            void *st = open_shared(shm, 64, NULL);
            if (!st) {
                bad = 1;
                break;
            }
            uint32_t id = (uint32_t)p * 1000u + it;
            uint8_t buf[100], out[4096];
            uint64_t len = 0;
            kvs_key k = kvs_test_key(id);
            kvs_test_fill(buf, sizeof buf, id);
            if (ops->put(st, &k, buf, sizeof buf) != KVS_OK)
                bad = 2;
            else if (ops->get(st, &k, out, sizeof out, &len) != KVS_OK)
                bad = 3;
            else if (len != sizeof buf || !kvs_test_bytes_match(out, len, id))
                bad = 4;
            if (ops->remove(st, &k) != KVS_OK) bad = 5; /* keeps the tier free of evictions */
            ops->destroy(st);
        }
        _exit(bad);
    }
    for (int p = 0; p < 6; p++) ck_assert_int_eq(kvs_test_wait_child(pids[p]), 0);
    ck_assert(!shm_exists(shm));
}
END_TEST

static void die_in_evict(void *ctx, const kvs_key *key, const void *object, uint64_t len) {
    (void)ctx, (void)key, (void)object, (void)len;
    _exit(0);
}

START_TEST(a_process_dying_inside_the_tier_lock_does_not_wedge_the_tier) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 2, NULL);
    ck_assert_ptr_nonnull(st);
    kvs_test_dram_put(st, 0, 10);
    kvs_test_dram_put(st, 1, 20);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        kvs_backend_host host = {.struct_size = sizeof host, .on_evict = die_in_evict};
        void *child = open_shared(shm, 2, &host);
        if (!child) _exit(1);
        kvs_test_dram_put(child, 2, 10); /* evicts, and on_evict exits with the lock held */
        _exit(2);
    }
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    uint64_t present = 0, n_objects = 0, bytes = 0;
    kvs_key keys[2] = {kvs_test_key(0), kvs_test_key(1)};
    ck_assert_int_eq(ops->contains(st, keys, 2, &present), KVS_OK);
    ck_assert_uint_eq(present, 2); /* the victim was never dropped */
    ck_assert_int_eq(ops->usage(st, &n_objects, &bytes), KVS_OK);
    ck_assert_uint_eq(n_objects, 2);
    ck_assert_uint_eq(bytes, 30);
    kvs_test_dram_put(st, 2, 10);
    kvs_key k2 = kvs_test_key(2);
    ck_assert_int_eq(ops->contains(st, &k2, 1, &present), KVS_OK);
    ck_assert_uint_eq(present, 1);
    ops->destroy(st);
    ck_assert(!shm_exists(shm)); /* the dead child never detached, and does not count */
}
END_TEST

/* In a child: attach, say so through ready ('y', or 'n' when it could not), leave when go says. */
static void attach_signal_wait(const char *shm, int ready_w, int go_r) {
    void *child = open_shared(shm, 4, NULL);
    char c = child ? 'y' : 'n';
    if (write(ready_w, &c, 1) != 1) _exit(3);
    if (read(go_r, &c, 1) != 1) _exit(4); /* the parent says when to leave (or is killed first) */
    ops->destroy(child);
    _exit(0);
}

/* In a child: move to a new pid namespace (as containers sharing /dev/shm are) and attach from a
 * process whose pid there names no process in ours, so looking it up from here finds nothing. */
static void attach_from_another_pid_namespace(const char *shm, int ready_w, int go_r) {
    char c = 'u';
    if (unshare(CLONE_NEWPID) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) {
        if (write(ready_w, &c, 1) != 1) _exit(3);
        _exit(5);
    }
    /* the namespace's first process (its init) stays while it forks children until one's pid there
     * is free in ours (in /proc) */
    pid_t init = fork();
    if (init < 0) _exit(6);
    if (init > 0) {
        int code = kvs_test_wait_child(init);
        _exit(code >= 0 && code != 128 ? code : 7);
    }
    for (;;) {
        pid_t inner = fork();
        if (inner < 0) _exit(6);
        if (inner > 0) {
            int code = kvs_test_wait_child(inner);
            if (code == 42) continue; /* taken: try the next pid */
            _exit(code >= 0 && code != 128 ? code : 7);
        }
        char path[64];
        snprintf(path, sizeof path, "/proc/%d", (int)getpid());
        if (access(path, F_OK) == 0) _exit(42);
        attach_signal_wait(shm, ready_w, go_r);
    }
}

/* A child attaches (from another pid namespace with other_pid_ns), says so through the pipe, and
 * waits for go or to be killed. */
static pid_t attach_in_child_and_wait(const char *shm, int other_pid_ns, int *ready_fd,
                                      int *go_fd) {
    int ready[2], go[2];
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_int_eq(pipe(go), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (close(ready[0]) != 0 || close(go[1]) != 0) _exit(9);
        if (other_pid_ns) attach_from_another_pid_namespace(shm, ready[1], go[0]);
        attach_signal_wait(shm, ready[1], go[0]);
    }
    ck_assert_int_eq(close(ready[1]), 0);
    ck_assert_int_eq(close(go[0]), 0);
    char c = 0;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    ck_assert_msg(c != 'u',
                  "cannot make a pid namespace (unshare): this test needs root or user namespaces");
    ck_assert_int_eq(c, 'y');
    *ready_fd = ready[0];
    *go_fd = go[1];
    return pid;
}

START_TEST(an_attacher_in_another_pid_namespace_keeps_the_shared_memory) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(st);
    int ready, go;
    pid_t pid = attach_in_child_and_wait(shm, 1, &ready, &go);
    ops->destroy(st);
    ck_assert_msg(shm_exists(shm),
                  "/dev/shm/%s was unlinked under an attacher in another pid namespace", shm);
    char c = 'x';
    ck_assert_int_eq(write(go, &c, 1), 1);
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    ck_assert_int_eq(close(ready), 0);
    ck_assert_int_eq(close(go), 0);
    ck_assert(!shm_exists(shm)); /* its detach was the last */
}
END_TEST

START_TEST(a_killed_attacher_does_not_keep_the_shared_memory_alive) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(st);
    int ready, go;
    pid_t pid = attach_in_child_and_wait(shm, 0, &ready, &go);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(kvs_test_wait_child(pid), 128);
    ck_assert_int_eq(close(ready), 0);
    ck_assert_int_eq(close(go), 0);
    kvs_test_dram_put(st, 1, 10); /* the survivor keeps working */
    ops->destroy(st);
    ck_assert_msg(!shm_exists(shm), "/dev/shm/%s outlived its last live attacher", shm);
}
END_TEST

START_TEST(a_live_second_attacher_keeps_the_shared_memory) {
    char shm[64];
    unique_shm_name(shm, sizeof shm);
    void *st = open_shared(shm, 4, NULL);
    ck_assert_ptr_nonnull(st);
    int ready, go;
    pid_t pid = attach_in_child_and_wait(shm, 0, &ready, &go);
    ops->destroy(st);
    ck_assert(shm_exists(shm)); /* the child is alive and attached */
    char c = 'x';
    ck_assert_int_eq(write(go, &c, 1), 1);
    ck_assert_int_eq(kvs_test_wait_child(pid), 0);
    ck_assert_int_eq(close(ready), 0);
    ck_assert_int_eq(close(go), 0);
    ck_assert(!shm_exists(shm)); /* its detach was the last */
}
END_TEST

static Suite *dram_shared_suite(void) {
    Suite *s = suite_create("dram_shared");
    TCase *shared = tcase_create("shared");
    tcase_set_timeout(shared, 60); /* process churn is slow under sanitizers on a loaded machine */
    tcase_add_checked_fixture(shared, setup, kvs_test_dram_teardown);
    tcase_add_test(shared, object_put_by_a_child_process_is_seen_by_the_parent);
    tcase_add_test(shared, shm_open_attach_attaches_an_existing_tier_and_never_creates_one);
    tcase_add_test(shared, lock_timeout_ms_bounds_the_wait_for_a_lock_another_process_holds);
    tcase_add_test(shared, evict_never_takes_free_room_only);
    tcase_add_test(shared, object_put_by_the_parent_is_seen_by_a_child_process);
    tcase_add_test(shared, attach_with_another_geometry_is_refused_naming_both);
    tcase_add_test(shared, shared_memory_is_unlinked_after_the_last_destroy);
    tcase_add_test(shared, concurrent_opens_and_closes_of_one_name_never_fail_or_leak);
    tcase_add_test(shared, a_process_dying_inside_the_tier_lock_does_not_wedge_the_tier);
    tcase_add_test(shared, a_killed_attacher_does_not_keep_the_shared_memory_alive);
    tcase_add_test(shared, a_live_second_attacher_keeps_the_shared_memory);
    tcase_add_test(shared, an_attacher_in_another_pid_namespace_keeps_the_shared_memory);
    suite_add_tcase(s, shared);
    return s;
}

int main(void) {
    runner_pid = getpid();
    SRunner *runner = srunner_create(dram_shared_suite());
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    remove_leftover_shm();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
