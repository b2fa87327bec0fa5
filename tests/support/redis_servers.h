/* redis_servers.h - redis-server processes for the suites of the redis tier: a standalone server (a
 * unix socket or 127.0.0.1 on a port picked free; memory limit, passwords, ACL users, TLS), a
 * cluster of masters and replicas with failover and slot migration, a TLS fixture made with the
 * openssl command line, and redis-cli to drive them. Every server lives in its own temp directory,
 * keeps nothing on disk (save "", appendonly no) and is SIGKILLed when the thread that started it
 * ends: start it from the test's own thread, which owns it to the end. A failed test ends its
 * process at once: its servers die with it and their directories go when the suite's process exits
 * (kvs_test_redis_setup). Never port 6379 nor the default socket. Failures are Check assertions. */
#ifndef KVS_TEST_REDIS_SERVERS_H
#define KVS_TEST_REDIS_SERVERS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Call once from main before running the suite: 1 when redis-server, redis-cli and openssl are on
 * PATH, else 0 and a sentence in why (the suite exits 77 with it). It makes the directory every
 * server's and fixture's directory is made in, removed when this process exits; without it each
 * has a temp directory of its own and a failed test leaves it behind. */
int kvs_test_redis_setup(char *why, size_t why_len);

/* ---- TLS fixture ----------------------------------------------------------------------------- */

/* A CA, a server certificate for CN localhost with SAN DNS:localhost and IP:127.0.0.1, and a client
 * certificate (CN kvs-test-client), EC P-256, valid two days, in a temp directory of their own;
 * keys mode 0600. */
typedef struct kvs_test_tls {
    char dir[512];
    char ca_cert[600], ca_key[600];
    char server_cert[600], server_key[600];
    char client_cert[600], client_key[600];
} kvs_test_tls;

/* Make the directory and the files (openssl run without a shell). */
void kvs_test_tls_make(kvs_test_tls *t);
/* Remove the directory; a zeroed or freed fixture is a no-op. */
void kvs_test_tls_free(kvs_test_tls *t);

/* ---- one server ------------------------------------------------------------------------------ */

typedef struct kvs_test_redis_opts {
    int unix_socket;              /* listen on dir/redis.sock (mode 700), no TCP port */
    const char *maxmemory;        /* "64mb"; NULL: no limit */
    const char *maxmemory_policy; /* "allkeys-lru"; NULL: the server's (noeviction) */
    const char *requirepass;      /* the default user's password; NULL: none */
    const char *const *acl_lines; /* NULL-terminated lines of an aclfile (dir/users.acl); a file
                                     without a `user default` line leaves default on, no password */
    const kvs_test_tls *tls;      /* serve TLS only: tls-port on 127.0.0.1, port 0 */
    const char *tls_auth_clients; /* "no", "optional" or "yes"; NULL: the server's (yes) */
    int cluster;                  /* cluster-enabled, nodes.conf in the directory, cluster bus on a
                                     port picked free (TCP only) */
    int cluster_node_timeout_ms;  /* 0: 1000 */
    const char *const *extra_config; /* NULL-terminated config lines ("hz 50") */
    /* What the harness's redis-cli authenticates with (the readiness PING, kvs_test_redis_cli):
     * user NULL is the default user; password NULL takes requirepass. */
    const char *cli_user, *cli_password;
} kvs_test_redis_opts;

typedef struct kvs_test_redis {
    pid_t pid;             /* 0 when not running */
    uint16_t port;         /* its TCP (with tls: TLS) port on 127.0.0.1; 0 on a unix socket */
    uint16_t cluster_port; /* its cluster bus port; 0 unless cluster */
    int tls;               /* 1 when it serves TLS only */
    char dir[512];         /* its directory (removed by kvs_test_redis_stop) */
    char sock[600];        /* dir/redis.sock, or "" on TCP */
    char addr[640];        /* "127.0.0.1:<port>" or the socket's path */
    char conf[600];        /* dir/redis.conf: everything it was started with */
    char log[600];         /* dir/redis.log */
    char cli_user[64], cli_password[128];
    char tls_ca[600], tls_cert[600], tls_key[600]; /* what redis-cli trusts and presents */
} kvs_test_redis;

/* Make a directory, write redis.conf from o (NULL: defaults, 127.0.0.1 on a free port), start
 * redis-server and wait until it answers PING (10 s, scaled); a port taken meanwhile is picked
 * again. Fails with its log when it does not come up. */
void kvs_test_redis_start(kvs_test_redis *r, const kvs_test_redis_opts *o);
/* SIGTERM (and SIGCONT, should it be stopped), SIGKILL past 5 s (scaled), reap, remove the
 * directory, zero r. Returns -1 when it had to be killed or did not exit with status 0, else 0
 * (also when it was not running: killed before, or a zeroed r). */
int kvs_test_redis_stop(kvs_test_redis *r);
/* Send sig. SIGKILL reaps it at once (pid 0 after, the directory stays for restart or stop); other
 * signals (SIGSTOP, SIGCONT) are only sent. */
void kvs_test_redis_kill(kvs_test_redis *r, int sig);
/* Start it again from its redis.conf: the same port, directory and (cluster) nodes.conf; killed
 * first (SIGKILL) when it runs. Waits for PING like start. */
void kvs_test_redis_restart(kvs_test_redis *r);
/* 1 while it runs (one that exited is reaped: pid 0). */
int kvs_test_redis_alive(kvs_test_redis *r);
/* Servers this process started and did not stop or kill. */
unsigned kvs_test_redis_live(void);
/* Kill every server and remove every directory this process made (also run at its exit). */
void kvs_test_redis_stop_all(void);

/* ---- redis-cli ------------------------------------------------------------------------------- */

/* Run redis-cli against r with the harness's credentials and TLS files, the words after out_len as
 * the command (kvs_test_redis_cli(r, out, sizeof out, "GET", key)), and capture what it prints
 * (stdout and stderr) into out (NUL terminated, cut at out_len - 1). Replies come raw: one line per
 * element, error replies as their text ("NOPERM ...", "ASK 42 127.0.0.1:7001"), nil as an empty
 * line. Returns its exit status: 0 when it got a reply (an error reply too), 1 when it could not
 * connect; -1 when it was killed at the 10 s (scaled) deadline. */
#define kvs_test_redis_cli(r, out, out_len, ...) \
    kvs_test_redis_cli_list(r, out, out_len, __VA_ARGS__, (const char *)NULL)
/* The same as user (NULL: the default user) with password (NULL with user NULL: no AUTH). */
#define kvs_test_redis_cli_as(r, user, password, out, out_len, ...) \
    kvs_test_redis_cli_as_list(r, user, password, out, out_len, __VA_ARGS__, (const char *)NULL)
/* What the two macros call: the words end with a null pointer. */
int kvs_test_redis_cli_list(const kvs_test_redis *r, char *out, size_t out_len, ...);
int kvs_test_redis_cli_as_list(const kvs_test_redis *r, const char *user, const char *password,
                               char *out, size_t out_len, ...);
/* The same with the command as an array (NULL last). */
int kvs_test_redis_cliv(const kvs_test_redis *r, const char *const *args, char *out,
                        size_t out_len);
/* Run any program found on PATH (argv[0] its name, NULL last), no shell, stdin from /dev/null,
 * capturing stdout and stderr like kvs_test_redis_cli; deadline_ms is scaled. Returns its exit
 * status, 128 + the signal when one ended it, -1 when killed at the deadline. */
int kvs_test_run(const char *const *argv, char *out, size_t out_len, int deadline_ms);

/* A key of the tier's form kvs1:<tenant>:<32 hex digits> whose hash slot is slot, as the server
 * says (CLUSTER KEYSLOT, any server r); the same tenant and slot give the same key. */
void kvs_test_redis_key_in_slot(const kvs_test_redis *r, const char *tenant, unsigned slot,
                                char *key, size_t key_len);
/* An aclfile line for user: on, password, keys ~kvs1:<tenant>:* only, no channels, and the
 * commands a client of the tier sends (connection, string reads and writes, deletes, expiry,
 * MULTI/EXEC, CLUSTER SLOTS/SHARDS/NODES, ASKING, READONLY, INFO); nothing dangerous. */
void kvs_test_redis_tenant_acl(char *line, size_t line_len, const char *user, const char *password,
                               const char *tenant);

/* ---- cluster --------------------------------------------------------------------------------- */

#define KVS_TEST_REDIS_CLUSTER_MAX 8

typedef struct kvs_test_redis_cluster {
    unsigned n_nodes, n_masters, replicas;
    kvs_test_redis node[KVS_TEST_REDIS_CLUSTER_MAX];
    char id[KVS_TEST_REDIS_CLUSTER_MAX][48]; /* each node's cluster id */
    double form_ms;                 /* first spawn to ready (kvs_test_redis_cluster_start) */
    double killed_at_ms;            /* when kill_master sent SIGKILL */
    int killed;                     /* its node, or -1 */
    int mig_slot, mig_from, mig_to; /* the slot being migrated, or -1 */
} kvs_test_redis_cluster;

/* n_masters (at least 3) times 1 + replicas cluster-enabled servers on free ports (node_timeout_ms
 * their cluster-node-timeout; replicas fail over whatever their data's age), joined with
 * `redis-cli --cluster create`, then waits for kvs_test_redis_cluster_wait_ready (30 s). */
void kvs_test_redis_cluster_start(kvs_test_redis_cluster *c, unsigned n_masters, unsigned replicas,
                                  int node_timeout_ms);
/* Stop every node (kvs_test_redis_stop). */
void kvs_test_redis_cluster_stop(kvs_test_redis_cluster *c);
/* Wait until every running node knows every other, says cluster_state:ok, and every master that
 * serves slots has `replicas` replicas with their link up. Returns the ms it took; fails past
 * timeout_ms (scaled). */
double kvs_test_redis_cluster_wait_ready(kvs_test_redis_cluster *c, int timeout_ms);
/* Wait until each master's replicas have acknowledged all of its writes (5 s, scaled). */
void kvs_test_redis_cluster_wait_synced(kvs_test_redis_cluster *c);
/* The node that serves slot, as the first running node sees it (CLUSTER NODES). */
int kvs_test_redis_cluster_master_of(kvs_test_redis_cluster *c, unsigned slot);
/* SIGKILL the master of slot; returns its node. */
int kvs_test_redis_cluster_kill_master(kvs_test_redis_cluster *c, unsigned slot);
/* After kill_master: wait until every running node says cluster_state:ok and names the same
 * running node, another than the killed one, the master of slot. Returns the ms since the kill;
 * fails past timeout_ms (scaled). */
double kvs_test_redis_cluster_wait_failover(kvs_test_redis_cluster *c, unsigned slot,
                                            int timeout_ms);
/* Begin moving slot to master `to`: SETSLOT IMPORTING on to, then MIGRATING on its master. A key
 * of the slot still on the source is served there; one that is not gets -ASK <slot> <to>. */
void kvs_test_redis_cluster_slot_migrating(kvs_test_redis_cluster *c, unsigned slot, unsigned to);
/* Move the slot's keys from the source to the target (GETKEYSINSLOT, MIGRATE ... KEYS); after it
 * the source answers -ASK for every key of the slot. Returns how many keys moved. */
unsigned kvs_test_redis_cluster_migrate_keys(kvs_test_redis_cluster *c, unsigned slot);
/* End the move (after migrate_keys): SETSLOT NODE on to, the source and every other master, then
 * wait until every running node names `to` the slot's master; the source answers -MOVED. */
void kvs_test_redis_cluster_slot_finish(kvs_test_redis_cluster *c, unsigned slot, unsigned to);

#endif
