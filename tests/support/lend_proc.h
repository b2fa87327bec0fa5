/* lend_proc.h - kvstrata-lend as a child process of a suite: started with its standard input and
 * output on pipes, driven by command lines, followed through its event lines (docs/peer_gpu.md).
 * Failures are Check assertions. One owner thread per lender. */
#ifndef KVS_TEST_LEND_PROC_H
#define KVS_TEST_LEND_PROC_H

#include <stddef.h>
#include <sys/types.h>

typedef struct kvs_test_lender {
    pid_t pid;       /* 0 when not running */
    int in_fd;       /* its stdin */
    int out_fd;      /* its stdout */
    char out[65536]; /* what it printed so far (the oldest half dropped when full) */
    size_t out_len;
    size_t seen; /* kvs_test_lender_next has returned the lines before this offset */
} kvs_test_lender;

/* Fork and exec KVS_TEST_BIN_DIR/kvstrata-lend --socket socket_path --units units --unit-size
 * unit_size plus extra (NULL-terminated, may be NULL); waits for its `ready` line. */
void kvs_test_lender_start(kvs_test_lender *l, const char *socket_path, unsigned units,
                           const char *unit_size, const char *const *extra);
/* Send one command line. */
void kvs_test_lender_say(kvs_test_lender *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The next event line (without its newline) into line, within deadline_ms (scaled): 1, or 0 when
 * none came. */
int kvs_test_lender_next(kvs_test_lender *l, char *line, size_t len, int deadline_ms);
/* Read event lines until n of them start with prefix (counting from the last line read); 1, or 0 at
 * the deadline. Lines that do not match are skipped. */
int kvs_test_lender_expect(kvs_test_lender *l, const char *prefix, int n, int deadline_ms);
/* SIGKILL and reap. */
void kvs_test_lender_kill(kvs_test_lender *l);
/* `quit`, then wait for the exit (SIGKILL past 5 s). Returns its exit status. */
int kvs_test_lender_stop(kvs_test_lender *l);

#endif
