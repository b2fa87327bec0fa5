/* node_proc.c - see node_proc.h. */
#include "node_proc.h"

#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/ucx/auth.h"
#include "test_support.h"
#include "wait.h"

void kvs_test_node_prepare(kvs_test_node *d, const char *yaml_text) {
    memset(d, 0, sizeof *d);
    ck_assert_int_eq(kvs_test_tmpdir(d->dir, sizeof d->dir), 0);
    char ssd_dir[600];
    snprintf(ssd_dir, sizeof ssd_dir, "%s/ssd0", d->dir);
    ck_assert_int_eq(mkdir(ssd_dir, 0700), 0);
    for (size_t i = 0; i < sizeof d->psk; i++) d->psk[i] = (uint8_t)(i * 7 + 3);
    snprintf(d->psk_path, sizeof d->psk_path, "%s/node.key", d->dir);
    int fd = open(d->psk_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, d->psk, sizeof d->psk), (ssize_t)sizeof d->psk);
    ck_assert_int_eq(close(fd), 0);
    ck_assert_int_eq(
        kvs_test_write_file(d->dir, "node.yaml", yaml_text, d->config_path, sizeof d->config_path),
        0);
}

void kvs_test_node_tenant_key(const kvs_test_node *d, const char *tenant, uint8_t key[32],
                              char *path, size_t path_len) {
    kvs_remote_psk master, k;
    char err[128];
    ck_assert_int_eq(kvs_remote_psk_set(&master, d->psk, sizeof d->psk, err, sizeof err), KVS_OK);
    ck_assert_int_eq(kvs_remote_tenant_psk(&master, tenant, strlen(tenant), &k), KVS_OK);
    ck_assert_uint_eq(k.len, 32);
    memcpy(key, k.bytes, 32);
    kvs_remote_psk_clear(&master);
    kvs_remote_psk_clear(&k);
    if (!path) return;
    snprintf(path, path_len, "%s/%s.key", d->dir, tenant);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, key, 32), 32);
    ck_assert_int_eq(close(fd), 0);
}

int kvs_test_node_read_until(kvs_test_node *d, const char *want, int deadline_ms) {
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(deadline_ms);
    while (!strstr(d->out, want)) {
        int left = (int)(until - kvs_test_now_ms());
        if (left <= 0) return 0;
        struct pollfd p = {.fd = d->out_fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0) return 0;
        ssize_t k = read(d->out_fd, d->out + d->out_len, sizeof d->out - 1 - d->out_len);
        if (k <= 0) return strstr(d->out, want) != NULL;
        d->out_len += (size_t)k;
        d->out[d->out_len] = '\0';
    }
    return 1;
}

int kvs_test_node_capture_stderr;

unsigned kvs_test_node_log_lines(const kvs_test_node *d, const char *what) {
    char path[600], line[1024];
    snprintf(path, sizeof path, "%s/stderr.log", d->dir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    unsigned n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, what)) n++;
    fclose(f);
    return n;
}

void kvs_test_node_start(kvs_test_node *d, char *const argv[]) {
    ck_assert_int_eq(access(KVS_TEST_BIN_DIR "/kvstrata-node", X_OK), 0);
    char err_path[600];
    snprintf(err_path, sizeof err_path, "%s/stderr.log", d->dir);
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        /* a failed test never leaves a daemon behind */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || dup2(pipefd[1], 1) != 1 ||
            close(pipefd[0]) != 0 || close(pipefd[1]) != 0)
            _exit(126);
        if (kvs_test_node_capture_stderr) {
            int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd < 0 || dup2(fd, 2) != 2) _exit(126);
        }
        execv(KVS_TEST_BIN_DIR "/kvstrata-node", argv);
        _exit(127);
    }
    ck_assert_int_eq(close(pipefd[1]), 0);
    d->out_fd = pipefd[0];
    ck_assert_msg(kvs_test_node_read_until(d, "\n", 10000), "no readiness line; got \"%s\"",
                  d->out);
    unsigned port = 0, tiers = 0;
    ck_assert_msg(
        sscanf(d->out, "kvstrata-node ready listen=127.0.0.1:%u tiers=%u", &port, &tiers) == 2,
        "readiness line: \"%s\"", d->out);
    ck_assert_uint_gt(port, 0);
    d->port = (uint16_t)port;
    d->tiers = tiers;
    snprintf(d->id, sizeof d->id, "127.0.0.1:%u", port);
}

/* Settings from the `node:` section instead of flags (the key path relative to the config). */
#define NODE_SECTION                                                         \
    "node:\n  listen: 127.0.0.1:0\n  psk_file: node.key\n  max_clients: 8\n" \
    "  timeout_ms: 3000\n  max_object_bytes: 2MiB\n"

void kvs_test_node_start_suite(kvs_test_node *d, const char *yaml_text, uint32_t want_tiers,
                               int from_yaml) {
    char text[2048];
    snprintf(text, sizeof text, "%s%s", yaml_text, from_yaml ? NODE_SECTION : "");
    kvs_test_node_prepare(d, text);
    char *const from_config[] = {"kvstrata-node", "--config", d->config_path, NULL};
    char *const with_flags[] = {"kvstrata-node",
                                "--config",
                                d->config_path,
                                "--psk-file",
                                d->psk_path,
                                "--listen",
                                "127.0.0.1:0",
                                "--max-clients",
                                "8",
                                "--max-handshakes",
                                "4",
                                "--timeout-ms",
                                "3000",
                                "--max-object-bytes",
                                "2MiB",
                                NULL};
    kvs_test_node_start(d, from_yaml ? from_config : with_flags);
    ck_assert_uint_eq(d->tiers, want_tiers);
}

typedef struct exit_wait {
    pid_t pid;
    int status;
} exit_wait;

static int exited(void *arg) {
    exit_wait *w = arg;
    return waitpid(w->pid, &w->status, WNOHANG) == w->pid;
}

int kvs_test_node_stop(kvs_test_node *d) {
    int status = -1;
    if (d->pid > 0) {
        ck_assert_int_eq(kill(d->pid, SIGTERM), 0);
        exit_wait w = {d->pid, -1};
        if (kvs_test_wait_for(exited, &w, 5000)) {
            status = w.status;
        } else {
            ck_assert_int_eq(kill(d->pid, SIGKILL), 0);
            ck_assert_int_eq(waitpid(d->pid, NULL, 0), d->pid);
        }
        d->pid = 0;
    }
    if (d->out_fd > 0) {
        (void)kvs_test_node_read_until(d,
                                       "bytes_out=", 1000); /* its stats line, when it wrote one */
        ck_assert_int_eq(close(d->out_fd), 0);
        d->out_fd = 0;
    }
    if (d->dir[0]) kvs_test_rmtree(d->dir);
    return status;
}

void kvs_test_node_kill(kvs_test_node *d) {
    if (d->pid > 0) {
        ck_assert_int_eq(kill(d->pid, SIGKILL), 0);
        ck_assert_int_eq(waitpid(d->pid, NULL, 0), d->pid);
        d->pid = 0;
    }
}

int kvs_test_node_alive(const kvs_test_node *d) {
    int status;
    return d->pid > 0 && waitpid(d->pid, &status, WNOHANG) == 0;
}
