/* node_proc.h - a kvstrata-node daemon as a child process of a suite: its directory (config, key,
 * data), started with its stdout on a pipe and ready once it printed its readiness line, stopped with
 * SIGTERM (SIGKILL past a deadline). Failures are Check assertions. One owner thread per daemon. */
#ifndef KVS_TEST_NODE_PROC_H
#define KVS_TEST_NODE_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvs_test_node {
    pid_t pid;      /* 0 when not running */
    int out_fd;     /* its stdout; 0 when closed */
    uint16_t port;  /* the control port it listens on (127.0.0.1) */
    uint32_t tiers; /* tiers it reported ready */
    char id[64];    /* "127.0.0.1:<port>" */
    char dir[512];  /* its directory (removed by kvs_test_node_stop) */
    char config_path[700];
    char psk_path[600]; /* dir/node.key: the master key */
    uint8_t psk[32];    /* its bytes */
    char out[4096];     /* what it printed so far */
    size_t out_len;
} kvs_test_node;

/* Zero d and make its directory: node.yaml holding yaml_text, node.key (32 bytes i * 7 + 3, mode
 * 0600) and an empty ssd0/ for an ssd tier. */
void kvs_test_node_prepare(kvs_test_node *d, const char *yaml_text);
/* Fork and exec the daemon (KVS_TEST_BIN_DIR/kvstrata-node) with argv (argv[0] first, NULL last; it
 * dies with the test process), and wait for its readiness line: port, tiers and id are set. */
void kvs_test_node_start(kvs_test_node *d, char *const argv[]);
/* Configs of the node suites: 32 MiB of DRAM; and 2 MiB of DRAM over a 32 MiB SSD tier on ssd0/
 * (1 MiB objects spill to the SSD tier after two puts). */
#define KVS_TEST_NODE_DRAM_YAML \
    "version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n    capacity: 32MiB\n"
#define KVS_TEST_NODE_SSD_YAML                                                                   \
    "version: 1\nlog_level: error\ntiers:\n  - name: dram\n    type: dram\n    capacity: 2MiB\n" \
    "  - name: ssd\n    type: ssd\n    capacity: 32MiB\n    paths: [ssd0]\n"

/* The node suites' daemon on yaml_text with its key and limits as flags (--listen 127.0.0.1:0,
 * --max-clients 8, --max-handshakes 4, --timeout-ms 3000, --max-object-bytes 2MiB); with from_yaml
 * the same settings come from a node: section appended to the config and the command line is only
 * --config. Asserts that it reports want_tiers tiers. */
void kvs_test_node_start_suite(kvs_test_node *d, const char *yaml_text, uint32_t want_tiers,
                               int from_yaml);
/* Read its stdout until `want` appears, it closes, or deadline_ms (scaled) passes; 1 if it appeared. */
int kvs_test_node_read_until(kvs_test_node *d, const char *want, int deadline_ms);
/* SIGTERM; wait for the exit up to 5 s (scaled), else SIGKILL; read its last words (the stats line),
 * close the pipe and remove the directory. Returns the wait status, or -1 when it had to be killed. */
int kvs_test_node_stop(kvs_test_node *d);
/* The key of `tenant` (derived from the node's master key, as `kvstrata-node --tenant-key` does):
 * into key[32], and, when path is not NULL, into the file dir/<tenant>.key (mode 0600) whose path
 * goes to path. */
void kvs_test_node_tenant_key(const kvs_test_node *d, const char *tenant, uint8_t key[32],
                              char *path, size_t path_len);
/* When set, the next daemons started write their stderr to dir/stderr.log instead of the suite's
 * (kvs_test_node_log_lines counts its lines). */
extern int kvs_test_node_capture_stderr;
/* Lines of a capturing daemon's stderr.log so far that contain `what` ("" for every line). */
unsigned kvs_test_node_log_lines(const kvs_test_node *d, const char *what);
/* SIGKILL and reap at once (the directory stays for kvs_test_node_stop). */
void kvs_test_node_kill(kvs_test_node *d);
/* 1 while the daemon runs (a daemon that exited is reaped). */
int kvs_test_node_alive(const kvs_test_node *d);

#endif
