/* compare_child.h - the child processes of kvstrata compare (the mini engine, gnuplot): started
 * with fork and exec, never through a shell, in a process group of their own so that a timeout
 * stops whatever they started too; every wait is bounded. */
#ifndef KVS_COMPARE_CHILD_H
#define KVS_COMPARE_CHILD_H

#include <stddef.h>
#include <sys/types.h>

/* Start path with argv (argv[0] first, NULL-terminated); its stdin, stdout and stderr are in_fd,
 * out_fd and err_fd (-1: /dev/null). Returns the pid, or -1 with a sentence in err. An exec that
 * fails is reported by the child on err_fd and exit status 127. */
pid_t cmp_spawn(const char *path, char *const argv[], int in_fd, int out_fd, int err_fd, char *err,
                size_t err_len);

/* How a child ended. */
typedef struct cmp_exit {
    int exited, code; /* exited normally with code */
    int signal;       /* killed by this signal (0: none) */
    int timed_out;    /* it ran past the timeout and was stopped (TERM, then KILL after 2 s) */
} cmp_exit;

/* Wait for pid, at most timeout_s seconds; tick(ctx) runs about every 100 ms meanwhile (may be
 * NULL). 0, or -1 if waitpid failed (the child is then killed). */
int cmp_wait(pid_t pid, double timeout_s, void (*tick)(void *ctx), void *ctx, cmp_exit *out);

/* "exit status 3", "killed by signal 11 (Segmentation fault)", "no result within 60 s (stopped)". */
void cmp_exit_describe(const cmp_exit *e, double timeout_s, char *buf, size_t len);

/* The first executable `name` on PATH into buf (name itself when it holds a '/'). 0, or -1. */
int cmp_find_program(const char *name, char *buf, size_t len);

#endif
