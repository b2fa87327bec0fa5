/* redis_servers.c - see redis_servers.h. */
#include "redis_servers.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_support.h"
#include "wait.h"

#define UP_DEADLINE_MS   10000
#define CLI_DEADLINE_MS  10000
#define STOP_DEADLINE_MS 5000
#define PORT_ATTEMPTS    5
#define CLI_MAX_ARGS     160
#define SLOTS            16384u

static void copy_text(char *dst, size_t len, const char *src) {
    int n = snprintf(dst, len, "%s", src ? src : "");
    ck_assert_msg(n >= 0 && (size_t)n < len, "\"%s\" does not fit in %zu bytes", src, len);
}

/* Values go into redis.conf between double quotes and into argv: nothing that needs escaping. */
static void check_plain(const char *what, const char *s) {
    if (!s) return;
    ck_assert_msg(!strpbrk(s, "\"\\\r\n'"), "%s \"%s\": no quotes, backslashes or line breaks",
                  what, s);
}

/* ---- every server and directory, for the exit handler ---------------------------------------- */

#define LIVE_MAX 64

typedef struct live_entry {
    pid_t owner; /* the process that made it: a forked test inherits its runner's entries */
    pid_t pid;   /* 0: a directory only */
    char dir[512];
} live_entry;

static live_entry live[LIVE_MAX];
static int exit_handler_set;
static char root[512]; /* kvs_test_redis_setup's directory, or "" */
static pid_t root_owner;

static void cleanup_at_exit(void) {
    kvs_test_redis_stop_all();
    if (root[0] && root_owner == getpid()) kvs_test_rmtree(root);
}

static int set_exit_handler(void) {
    if (!exit_handler_set && atexit(cleanup_at_exit) != 0) return -1;
    exit_handler_set = 1;
    return 0;
}

static live_entry *live_find(const char *dir) {
    for (unsigned i = 0; i < LIVE_MAX; i++)
        if (live[i].dir[0] && live[i].owner == getpid() && strcmp(live[i].dir, dir) == 0)
            return &live[i];
    return NULL;
}

static void live_note(const char *dir, pid_t pid) {
    ck_assert_int_eq(set_exit_handler(), 0);
    live_entry *e = live_find(dir);
    for (unsigned i = 0; !e && i < LIVE_MAX; i++)
        if (!live[i].dir[0] || live[i].owner != getpid()) e = &live[i];
    ck_assert_msg(e, "more than %u redis servers and directories at once", LIVE_MAX);
    copy_text(e->dir, sizeof e->dir, dir);
    e->owner = getpid();
    e->pid = pid;
}

static void live_forget(const char *dir) {
    live_entry *e = live_find(dir);
    if (e) memset(e, 0, sizeof *e);
}

static void reap(pid_t pid) {
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

void kvs_test_redis_stop_all(void) {
    for (unsigned i = 0; i < LIVE_MAX; i++) {
        if (live[i].owner != getpid()) continue;
        if (live[i].pid > 0 && kill(live[i].pid, SIGKILL) == 0) reap(live[i].pid);
        if (live[i].dir[0]) kvs_test_rmtree(live[i].dir);
        memset(&live[i], 0, sizeof live[i]);
    }
}

unsigned kvs_test_redis_live(void) {
    unsigned n = 0;
    for (unsigned i = 0; i < LIVE_MAX; i++) n += live[i].owner == getpid() && live[i].pid > 0;
    return n;
}

/* A fresh directory for a server or a TLS fixture: under the setup's directory, if there is one. */
static void make_dir(char *dir, size_t len) {
    if (!root[0]) {
        ck_assert_int_eq(kvs_test_tmpdir(dir, len), 0);
        return;
    }
    int n = snprintf(dir, len, "%s/r-XXXXXX", root);
    ck_assert(n > 0 && (size_t)n < len);
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp under %s: %s", root, strerror(errno));
}

/* ---- programs -------------------------------------------------------------------------------- */

static int find_program(const char *name, char *path, size_t len) {
    if (strchr(name, '/')) {
        snprintf(path, len, "%s", name);
        return access(path, X_OK) == 0 ? 0 : -1;
    }
    const char *p = getenv("PATH");
    if (!p || !*p) p = "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        size_t n = strcspn(p, ":");
        int k = snprintf(path, len, "%.*s/%s", (int)n, p, name);
        if (n > 0 && k > 0 && (size_t)k < len && access(path, X_OK) == 0) return 0;
        p += n;
        if (*p == ':') p++;
    }
    return -1;
}

int kvs_test_redis_setup(char *why, size_t why_len) {
    const char *need[] = {"redis-server", "redis-cli", "openssl"};
    char path[600];
    for (unsigned i = 0; i < sizeof need / sizeof need[0]; i++) {
        if (find_program(need[i], path, sizeof path) != 0) {
            snprintf(why, why_len, "%s is not on PATH (scripts/install-deps.sh installs it)",
                     need[i]);
            return 0;
        }
    }
    if (!root[0]) {
        if (kvs_test_tmpdir(root, sizeof root) != 0 || set_exit_handler() != 0) {
            snprintf(why, why_len, "no temp directory for the servers: %s", strerror(errno));
            root[0] = '\0';
            return 0;
        }
        root_owner = getpid();
    }
    if (why_len) why[0] = '\0';
    return 1;
}

/* Fork and exec path; stdin from in_fd (-1: /dev/null), stdout and stderr to out_fd. The child gets
 * SIGKILL when the thread that forked it ends (a failed test ends its process at once, without exit
 * handlers), so no server outlives its test, stopped (SIGSTOP) or not. */
static pid_t spawn(const char *path, const char *const *argv, int in_fd, int out_fd) {
    pid_t parent = getpid();
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(devnull, 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(126);
        if (sigprocmask(SIG_SETMASK, &none, NULL) != 0) _exit(126);
        if (dup2(in_fd >= 0 ? in_fd : devnull, 0) != 0 || dup2(out_fd, 1) != 1 ||
            dup2(out_fd, 2) != 2)
            _exit(126);
        execv(path, (char *const *)argv);
        _exit(127);
    }
    close(devnull);
    return pid;
}

typedef struct exit_wait {
    pid_t pid;
    int status;
} exit_wait;

static int exited(void *arg) {
    exit_wait *w = arg;
    pid_t got = waitpid(w->pid, &w->status, WNOHANG);
    return got == w->pid || (got < 0 && errno == ECHILD);
}

static int run_capture(const char *const *argv, const char *stdin_path, char *out, size_t out_len,
                       int deadline_ms) {
    ck_assert_uint_gt(out_len, 0);
    out[0] = '\0';
    char path[600];
    if (find_program(argv[0], path, sizeof path) != 0) {
        snprintf(out, out_len, "%s: not found on PATH", argv[0]);
        return 127;
    }
    int in_fd = -1;
    if (stdin_path) {
        in_fd = open(stdin_path, O_RDONLY | O_CLOEXEC);
        ck_assert_msg(in_fd >= 0, "open %s: %s", stdin_path, strerror(errno));
    }
    int p[2];
    ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = spawn(path, argv, in_fd, p[1]);
    close(p[1]);
    if (in_fd >= 0) close(in_fd);
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(deadline_ms);
    size_t len = 0;
    int late = 0;
    for (;;) {
        int left = (int)(until - kvs_test_now_ms());
        if (left <= 0) {
            late = 1;
            break;
        }
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        int k = poll(&pf, 1, left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            late = 1;
            break;
        }
        char buf[4096];
        ssize_t got = read(p[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        size_t keep = (size_t)got;
        if (keep > out_len - 1 - len) keep = out_len - 1 - len;
        memcpy(out + len, buf, keep);
        len += keep;
    }
    out[len] = '\0';
    close(p[0]);
    exit_wait w = {pid, 0};
    if (!late) {
        int left = (int)(until - kvs_test_now_ms());
        late = !kvs_test_wait_for(exited, &w, left > 0 ? left : 1);
    }
    if (late) {
        kill(pid, SIGKILL);
        reap(pid);
        return -1;
    }
    if (WIFEXITED(w.status)) return WEXITSTATUS(w.status);
    return WIFSIGNALED(w.status) ? 128 + WTERMSIG(w.status) : -1;
}

int kvs_test_run(const char *const *argv, char *out, size_t out_len, int deadline_ms) {
    return run_capture(argv, NULL, out, out_len, deadline_ms);
}

/* ---- TLS fixture ----------------------------------------------------------------------------- */

static void openssl_run(const char *const *argv) {
    char out[4096];
    int rc = run_capture(argv, NULL, out, sizeof out, 30000);
    ck_assert_msg(rc == 0, "openssl %s failed (%d): %s", argv[1], rc, out);
}

/* A key and a certificate named `name`, signed by the fixture's CA with the extensions in ext. */
static void tls_issue(kvs_test_tls *t, const char *name, const char *cn, const char *ext,
                      const char *serial, char *cert, size_t cert_len, char *key, size_t key_len) {
    char csr[600], ext_path[600], subj[128];
    snprintf(cert, cert_len, "%s/%s.crt", t->dir, name);
    snprintf(key, key_len, "%s/%s.key", t->dir, name);
    snprintf(csr, sizeof csr, "%s/%s.csr", t->dir, name);
    snprintf(subj, sizeof subj, "/CN=%s", cn);
    char ext_name[64];
    snprintf(ext_name, sizeof ext_name, "%s.ext", name);
    ck_assert_int_eq(kvs_test_write_file(t->dir, ext_name, ext, ext_path, sizeof ext_path), 0);
    const char *req[] = {
        "openssl", "req",     "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-noenc",  "-keyout", key,    "-out",    csr,  "-subj",    subj,
        NULL};
    openssl_run(req);
    const char *sign[] = {"openssl",  "x509",     "-req",    "-in",         csr,    "-CA",
                          t->ca_cert, "-CAkey",   t->ca_key, "-set_serial", serial, "-days",
                          "2",        "-extfile", ext_path,  "-out",        cert,   NULL};
    openssl_run(sign);
    ck_assert_int_eq(chmod(key, 0600), 0);
}

void kvs_test_tls_make(kvs_test_tls *t) {
    memset(t, 0, sizeof *t);
    make_dir(t->dir, sizeof t->dir);
    live_note(t->dir, 0);
    snprintf(t->ca_cert, sizeof t->ca_cert, "%s/ca.crt", t->dir);
    snprintf(t->ca_key, sizeof t->ca_key, "%s/ca.key", t->dir);
    const char *ca[] = {"openssl",
                        "req",
                        "-x509",
                        "-new",
                        "-newkey",
                        "ec",
                        "-pkeyopt",
                        "ec_paramgen_curve:prime256v1",
                        "-noenc",
                        "-keyout",
                        t->ca_key,
                        "-out",
                        t->ca_cert,
                        "-days",
                        "2",
                        "-subj",
                        "/CN=kvs-test-ca",
                        "-addext",
                        "basicConstraints=critical,CA:TRUE",
                        "-addext",
                        "keyUsage=critical,keyCertSign,cRLSign",
                        NULL};
    openssl_run(ca);
    ck_assert_int_eq(chmod(t->ca_key, 0600), 0);
    tls_issue(t, "server", "localhost",
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n",
              "2", t->server_cert, sizeof t->server_cert, t->server_key, sizeof t->server_key);
    tls_issue(t, "client", "kvs-test-client",
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
              "extendedKeyUsage=clientAuth\n",
              "3", t->client_cert, sizeof t->client_cert, t->client_key, sizeof t->client_key);
}

void kvs_test_tls_free(kvs_test_tls *t) {
    if (t->dir[0]) {
        kvs_test_rmtree(t->dir);
        live_forget(t->dir);
    }
    memset(t, 0, sizeof *t);
}

/* ---- one server ------------------------------------------------------------------------------ */

/* A port on 127.0.0.1 that nothing listens on now (the kernel's pick); *fd keeps it bound until the
 * caller closes it, so two picks in a row differ. */
static uint16_t pick_port(int *fd) {
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(*fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(*fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t alen = sizeof a;
    ck_assert_int_eq(getsockname(*fd, (struct sockaddr *)&a, &alen), 0);
    return ntohs(a.sin_port);
}

static void pick_ports(kvs_test_redis *r, int cluster) {
    int fd1, fd2 = -1;
    do {
        r->port = pick_port(&fd1);
        if (r->port == 6379) close(fd1);
    } while (r->port == 6379);
    if (cluster) r->cluster_port = pick_port(&fd2);
    close(fd1);
    if (fd2 >= 0) close(fd2);
    snprintf(r->addr, sizeof r->addr, "127.0.0.1:%u", (unsigned)r->port);
}

static void write_conf(kvs_test_redis *r, const kvs_test_redis_opts *o) {
    FILE *f = fopen(r->conf, "w");
    ck_assert_msg(f != NULL, "%s: %s", r->conf, strerror(errno));
    /* nothing persists, and a replica syncs at once instead of waiting for others to join */
    fprintf(f,
            "daemonize no\ndir \"%s\"\nlogfile \"%s\"\nsave \"\"\nappendonly no\n"
            "repl-diskless-sync-delay 0\n",
            r->dir, r->log);
    if (r->sock[0]) {
        fprintf(f, "port 0\nunixsocket \"%s\"\nunixsocketperm 700\n", r->sock);
    } else if (o->tls) {
        fprintf(f, "bind 127.0.0.1\nport 0\ntls-port %u\n", (unsigned)r->port);
        fprintf(f, "tls-cert-file \"%s\"\ntls-key-file \"%s\"\ntls-ca-cert-file \"%s\"\n",
                o->tls->server_cert, o->tls->server_key, o->tls->ca_cert);
        if (o->tls_auth_clients) fprintf(f, "tls-auth-clients %s\n", o->tls_auth_clients);
    } else {
        fprintf(f, "bind 127.0.0.1\nport %u\n", (unsigned)r->port);
    }
    if (o->maxmemory) fprintf(f, "maxmemory %s\n", o->maxmemory);
    if (o->maxmemory_policy) fprintf(f, "maxmemory-policy %s\n", o->maxmemory_policy);
    if (o->requirepass) fprintf(f, "requirepass \"%s\"\n", o->requirepass);
    if (o->acl_lines) fprintf(f, "aclfile \"%s/users.acl\"\n", r->dir);
    if (o->cluster) {
        /* a replica takes over however long its master was gone: failover tests kill masters */
        fprintf(f,
                "cluster-enabled yes\ncluster-config-file \"%s/nodes.conf\"\n"
                "cluster-node-timeout %d\ncluster-port %u\ncluster-replica-validity-factor 0\n",
                r->dir, o->cluster_node_timeout_ms > 0 ? o->cluster_node_timeout_ms : 1000,
                (unsigned)r->cluster_port);
    }
    for (const char *const *l = o->extra_config; l && *l; l++) fprintf(f, "%s\n", *l);
    ck_assert_int_eq(fclose(f), 0);
}

/* The directory, paths, credentials, TLS files and aclfile of a server about to start. */
static void prepare(kvs_test_redis *r, const kvs_test_redis_opts *o) {
    memset(r, 0, sizeof *r);
    ck_assert_msg(!(o->unix_socket && (o->tls || o->cluster)),
                  "a unix socket server serves neither TLS nor a cluster");
    check_plain("requirepass", o->requirepass);
    check_plain("cli_user", o->cli_user);
    check_plain("cli_password", o->cli_password);
    make_dir(r->dir, sizeof r->dir);
    check_plain("directory", r->dir);
    live_note(r->dir, 0);
    snprintf(r->conf, sizeof r->conf, "%s/redis.conf", r->dir);
    snprintf(r->log, sizeof r->log, "%s/redis.log", r->dir);
    if (o->unix_socket) {
        snprintf(r->sock, sizeof r->sock, "%s/redis.sock", r->dir);
        ck_assert_msg(strlen(r->sock) < sizeof(((struct sockaddr_un *)0)->sun_path),
                      "socket path %s is too long (set TMPDIR shorter)", r->sock);
        copy_text(r->addr, sizeof r->addr, r->sock);
    }
    copy_text(r->cli_user, sizeof r->cli_user, o->cli_user);
    copy_text(r->cli_password, sizeof r->cli_password,
              o->cli_password ? o->cli_password : o->requirepass);
    if (o->tls) {
        r->tls = 1;
        copy_text(r->tls_ca, sizeof r->tls_ca, o->tls->ca_cert);
        copy_text(r->tls_cert, sizeof r->tls_cert, o->tls->client_cert);
        copy_text(r->tls_key, sizeof r->tls_key, o->tls->client_key);
    }
    if (o->acl_lines) {
        char path[600];
        snprintf(path, sizeof path, "%s/users.acl", r->dir);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        for (const char *const *l = o->acl_lines; *l; l++) fprintf(f, "%s\n", *l);
        ck_assert_int_eq(fclose(f), 0);
        ck_assert_int_eq(chmod(path, 0600), 0);
    }
}

static void launch(kvs_test_redis *r) {
    char path[600], out_path[600];
    ck_assert_msg(find_program("redis-server", path, sizeof path) == 0,
                  "redis-server is not on PATH");
    snprintf(out_path, sizeof out_path, "%s/stdout.log", r->dir);
    unlink(r->log);
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    const char *argv[] = {"redis-server", r->conf, NULL};
    r->pid = spawn(path, argv, -1, fd);
    close(fd);
    live_note(r->dir, r->pid);
}

/* Pick its ports (TCP), write redis.conf and start it. */
static void configure_and_launch(kvs_test_redis *r, const kvs_test_redis_opts *o) {
    if (!r->sock[0]) pick_ports(r, o->cluster);
    write_conf(r, o);
    launch(r);
}

/* The last bytes of its log and of what it printed, for a failure message. */
static void log_tail(const kvs_test_redis *r, char *text, size_t len) {
    const char *names[] = {"redis.log", "stdout.log"};
    size_t used = 0;
    text[0] = '\0';
    for (unsigned i = 0; i < 2 && used + 1 < len; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", r->dir, names[i]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t room = (len - used - 1) / 2;
        if (fseek(f, 0, SEEK_END) == 0) {
            long size = ftell(f);
            if (size > (long)room)
                (void)fseek(f, size - (long)room, SEEK_SET);
            else
                rewind(f);
        }
        used += fread(text + used, 1, room, f);
        text[used] = '\0';
        fclose(f);
    }
}

static int log_says(const kvs_test_redis *r, const char *what) {
    char text[8192];
    log_tail(r, text, sizeof text);
    return strstr(text, what) != NULL;
}

static const char *cred(const char *s) {
    return s && *s ? s : NULL;
}

static int cli_run(const kvs_test_redis *r, const char *user, const char *password,
                   const char *const *cmd, const char *stdin_path, char *out, size_t out_len,
                   int deadline_ms);

/* 1 once it answers PING (a refusal for want of credentials is an answer), 0 when it exited, -1 at
 * the deadline. */
static int wait_answering(kvs_test_redis *r, int deadline_ms) {
    double until = kvs_test_now_ms() + kvs_test_scaled_ms(deadline_ms);
    const char *ping[] = {"PING", NULL};
    for (;;) {
        if (!kvs_test_redis_alive(r)) return 0;
        char out[512];
        int rc =
            cli_run(r, cred(r->cli_user), cred(r->cli_password), ping, NULL, out, sizeof out, 2000);
        if (rc == 0 && (strstr(out, "PONG") || strstr(out, "NOAUTH") || strstr(out, "NOPERM")))
            return 1;
        if (kvs_test_now_ms() >= until) return -1;
        kvs_test_pause_ms(10);
    }
}

/* Wait until r answers; with o (a fresh start) a port taken meanwhile is picked again. */
static void await_up(kvs_test_redis *r, const kvs_test_redis_opts *o) {
    char tail[4096];
    for (int attempt = 1;; attempt++) {
        int up = wait_answering(r, UP_DEADLINE_MS);
        if (up == 1) return;
        if (up == 0 && o && !r->sock[0] && attempt < PORT_ATTEMPTS &&
            log_says(r, "Address already in use")) {
            configure_and_launch(r, o);
            continue;
        }
        if (up < 0) kvs_test_redis_kill(r, SIGKILL);
        log_tail(r, tail, sizeof tail);
        ck_abort_msg("redis-server on %s %s; its log:\n%s", r->addr,
                     up == 0 ? "exited" : "did not answer PING in time", tail);
    }
}

void kvs_test_redis_start(kvs_test_redis *r, const kvs_test_redis_opts *o) {
    const kvs_test_redis_opts defaults = {0};
    if (!o) o = &defaults;
    prepare(r, o);
    configure_and_launch(r, o);
    await_up(r, o);
}

int kvs_test_redis_alive(kvs_test_redis *r) {
    if (r->pid <= 0) return 0;
    int status;
    pid_t got = waitpid(r->pid, &status, WNOHANG);
    if (got == 0) return 1;
    if (got == r->pid || (got < 0 && errno == ECHILD)) {
        r->pid = 0;
        if (r->dir[0] && live_find(r->dir)) live_note(r->dir, 0);
        return 0;
    }
    return 1;
}

void kvs_test_redis_kill(kvs_test_redis *r, int sig) {
    ck_assert_msg(r->pid > 0, "redis-server on %s is not running", r->addr);
    ck_assert_int_eq(kill(r->pid, sig), 0);
    if (sig != SIGKILL) return;
    reap(r->pid);
    r->pid = 0;
    live_note(r->dir, 0);
}

int kvs_test_redis_stop(kvs_test_redis *r) {
    int how = 0;
    /* a server stop_all already ended is no longer ours to signal */
    if (r->dir[0] && !live_find(r->dir)) r->pid = 0;
    if (r->pid > 0) {
        how = -1;
        if (kill(r->pid, SIGTERM) == 0) {
            (void)kill(r->pid, SIGCONT);
            exit_wait w = {r->pid, 0};
            if (kvs_test_wait_for(exited, &w, STOP_DEADLINE_MS)) {
                how = WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0 ? 0 : -1;
            } else {
                (void)kill(r->pid, SIGKILL);
                reap(r->pid);
            }
        } else {
            reap(r->pid);
        }
        r->pid = 0;
    }
    if (r->dir[0]) {
        kvs_test_rmtree(r->dir);
        live_forget(r->dir);
    }
    memset(r, 0, sizeof *r);
    return how;
}

void kvs_test_redis_restart(kvs_test_redis *r) {
    ck_assert_msg(r->dir[0], "restart: no server");
    if (r->pid > 0) kvs_test_redis_kill(r, SIGKILL);
    launch(r);
    await_up(r, NULL);
}

/* ---- redis-cli ------------------------------------------------------------------------------- */

static int cli_run(const kvs_test_redis *r, const char *user, const char *password,
                   const char *const *cmd, const char *stdin_path, char *out, size_t out_len,
                   int deadline_ms) {
    const char *argv[CLI_MAX_ARGS];
    char port[16];
    unsigned n = 0;
    argv[n++] = "redis-cli";
    if (r->sock[0]) {
        argv[n++] = "-s";
        argv[n++] = r->sock;
    } else {
        snprintf(port, sizeof port, "%u", (unsigned)r->port);
        argv[n++] = "-h";
        argv[n++] = "127.0.0.1";
        argv[n++] = "-p";
        argv[n++] = port;
    }
    if (r->tls) {
        argv[n++] = "--tls";
        argv[n++] = "--cacert";
        argv[n++] = r->tls_ca;
        argv[n++] = "--cert";
        argv[n++] = r->tls_cert;
        argv[n++] = "--key";
        argv[n++] = r->tls_key;
    }
    if (user) {
        argv[n++] = "--user";
        argv[n++] = user;
    }
    if (user || password) {
        argv[n++] = "--pass";
        argv[n++] = password ? password : "";
    }
    argv[n++] = "--no-auth-warning";
    for (const char *const *a = cmd; a && *a; a++) {
        ck_assert_msg(n + 1 < CLI_MAX_ARGS, "more than %u redis-cli arguments", CLI_MAX_ARGS);
        argv[n++] = *a;
    }
    argv[n] = NULL;
    return run_capture(argv, stdin_path, out, out_len, deadline_ms);
}

static void collect_args(va_list ap, const char **args, unsigned max) {
    unsigned n = 0;
    for (const char *a = va_arg(ap, const char *); a; a = va_arg(ap, const char *)) {
        ck_assert_msg(n + 1 < max, "more than %u redis-cli arguments", max);
        args[n++] = a;
    }
    args[n] = NULL;
}

int kvs_test_redis_cli_list(const kvs_test_redis *r, char *out, size_t out_len, ...) {
    const char *args[CLI_MAX_ARGS];
    va_list ap;
    va_start(ap, out_len);
    collect_args(ap, args, CLI_MAX_ARGS);
    va_end(ap);
    return cli_run(r, cred(r->cli_user), cred(r->cli_password), args, NULL, out, out_len,
                   CLI_DEADLINE_MS);
}

int kvs_test_redis_cli_as_list(const kvs_test_redis *r, const char *user, const char *password,
                               char *out, size_t out_len, ...) {
    const char *args[CLI_MAX_ARGS];
    va_list ap;
    va_start(ap, out_len);
    collect_args(ap, args, CLI_MAX_ARGS);
    va_end(ap);
    return cli_run(r, user, password, args, NULL, out, out_len, CLI_DEADLINE_MS);
}

int kvs_test_redis_cliv(const kvs_test_redis *r, const char *const *args, char *out,
                        size_t out_len) {
    return cli_run(r, cred(r->cli_user), cred(r->cli_password), args, NULL, out, out_len,
                   CLI_DEADLINE_MS);
}

/* ---- keys and users -------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kvs_test_redis_key_in_slot(const kvs_test_redis *r, const char *tenant, unsigned slot,
                                char *key, size_t key_len) {
    enum { BATCH = 16384, BATCHES = 8 }; /* a given slot is missed with odds e^-8 */
    ck_assert_uint_lt(slot, SLOTS);
    ck_assert_msg(tenant[0] && strspn(tenant, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_.-") == strlen(tenant),
                  "tenant \"%s\": letters, digits, _ . - only", tenant);
    char in_path[600];
    snprintf(in_path, sizeof in_path, "%s/keyslot.in", r->dir);
    uint64_t *names = malloc(sizeof(uint64_t) * 2 * BATCH);
    size_t out_len = (size_t)BATCH * 8 + 4096;
    char *out = malloc(out_len);
    ck_assert(names && out);
    uint64_t state = 0x6b76733153ull + slot;
    for (unsigned b = 0; b < BATCHES; b++) {
        FILE *f = fopen(in_path, "w");
        ck_assert_ptr_nonnull(f);
        for (unsigned i = 0; i < BATCH; i++) {
            names[2 * i] = splitmix64(&state);
            names[2 * i + 1] = splitmix64(&state);
            fprintf(f, "CLUSTER KEYSLOT kvs1:%s:%016llx%016llx\n", tenant,
                    (unsigned long long)names[2 * i], (unsigned long long)names[2 * i + 1]);
        }
        ck_assert_int_eq(fclose(f), 0);
        int rc = cli_run(r, cred(r->cli_user), cred(r->cli_password), NULL, in_path, out, out_len,
                         60000);
        ck_assert_msg(rc == 0, "CLUSTER KEYSLOT through redis-cli: %d: %.300s", rc, out);
        char *line = out;
        for (unsigned i = 0; i < BATCH && *line; i++) {
            char *end;
            unsigned long got = strtoul(line, &end, 10);
            ck_assert_msg(end != line,
                          "CLUSTER KEYSLOT answered \"%.200s\" (a cluster-enabled "
                          "server, and a user allowed it?)",
                          line);
            if (got == slot) {
                int n = snprintf(key, key_len, "kvs1:%s:%016llx%016llx", tenant,
                                 (unsigned long long)names[2 * i],
                                 (unsigned long long)names[2 * i + 1]);
                ck_assert(n > 0 && (size_t)n < key_len);
                free(names);
                free(out);
                unlink(in_path);
                return;
            }
            line = strchr(end, '\n');
            if (!line) break;
            line++;
        }
    }
    free(names);
    free(out);
    ck_abort_msg("no key of tenant %s found in slot %u", tenant, slot);
}

void kvs_test_redis_tenant_acl(char *line, size_t line_len, const char *user, const char *password,
                               const char *tenant) {
    check_plain("user", user);
    check_plain("password", password);
    check_plain("tenant", tenant);
    int n = snprintf(line, line_len,
                     "user %s on resetpass >%s resetkeys ~kvs1:%s:* resetchannels -@all "
                     "+ping +hello +auth +client|setname +client|id +reset +quit "
                     "+get +set +getex +getdel +getrange +setrange +strlen +append +mget +mset "
                     "+del +unlink +exists +touch +expire +pexpire +ttl +pttl +persist "
                     "+multi +exec +discard +watch +unwatch "
                     "+cluster|slots +cluster|shards +cluster|nodes +cluster|keyslot "
                     "+asking +readonly +readwrite +info",
                     user, password, tenant);
    ck_assert(n > 0 && (size_t)n < line_len);
}

/* ---- cluster --------------------------------------------------------------------------------- */

static int node_of_port(const kvs_test_redis_cluster *c, unsigned port) {
    for (unsigned i = 0; i < c->n_nodes; i++)
        if (c->node[i].port == port) return (int)i;
    return -1;
}

static int first_alive(kvs_test_redis_cluster *c) {
    for (unsigned i = 0; i < c->n_nodes; i++)
        if (kvs_test_redis_alive(&c->node[i])) return (int)i;
    return -1;
}

/* The value of `name:` in INFO-style text (lines of name:value), or 0 when absent. */
static int info_field(const char *text, const char *name, char *value, size_t value_len) {
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, n) == 0 && p[n] == ':') {
            size_t v = strcspn(p + n + 1, "\r\n");
            if (v >= value_len) v = value_len - 1;
            memcpy(value, p + n + 1, v);
            value[v] = '\0';
            return 1;
        }
    }
    return 0;
}

static long long info_number(const char *text, const char *name) {
    char value[64];
    return info_field(text, name, value, sizeof value) ? strtoll(value, NULL, 10) : -1;
}

/* The node serving slot in node i's CLUSTER NODES, -1 when none does, -2 when i did not answer. */
static int owner_in_view(kvs_test_redis_cluster *c, unsigned i, unsigned slot) {
    char out[16384];
    if (kvs_test_redis_cli(&c->node[i], out, sizeof out, "CLUSTER", "NODES") != 0) return -2;
    char *save_line = NULL;
    for (char *line = strtok_r(out, "\n", &save_line); line;
         line = strtok_r(NULL, "\n", &save_line)) {
        char *save_field = NULL, *field[4] = {0};
        char *f = strtok_r(line, " \r", &save_field);
        for (unsigned k = 0; f && k < 4; k++) {
            field[k] = f;
            if (k < 3) f = strtok_r(NULL, " \r", &save_field);
        }
        if (!field[2] || !strstr(field[2], "master")) continue;
        /* fields 3..7: master id, ping, pong, epoch, link; then the slot ranges */
        for (unsigned k = 3; k < 8 && f; k++) f = strtok_r(NULL, " \r", &save_field);
        for (; f; f = strtok_r(NULL, " \r", &save_field)) {
            if (f[0] == '[') continue; /* a slot being migrated or imported */
            char *end;
            unsigned long lo = strtoul(f, &end, 10), hi = lo;
            if (*end == '-') hi = strtoul(end + 1, NULL, 10);
            if (slot >= lo && slot <= hi) {
                const char *colon = strchr(field[1], ':');
                return colon ? node_of_port(c, (unsigned)strtoul(colon + 1, NULL, 10)) : -1;
            }
        }
    }
    return -1;
}

int kvs_test_redis_cluster_master_of(kvs_test_redis_cluster *c, unsigned slot) {
    ck_assert_uint_lt(slot, SLOTS);
    int i = first_alive(c);
    ck_assert_msg(i >= 0, "no cluster node runs");
    int owner = owner_in_view(c, (unsigned)i, slot);
    ck_assert_msg(owner >= 0, "node %s names no master of slot %u", c->node[i].addr, slot);
    return owner;
}

static int cluster_ready(void *arg) {
    kvs_test_redis_cluster *c = arg;
    unsigned masters = 0;
    for (unsigned i = 0; i < c->n_nodes; i++) {
        kvs_test_redis *r = &c->node[i];
        if (!kvs_test_redis_alive(r)) return 0;
        char out[4096];
        if (kvs_test_redis_cli(r, out, sizeof out, "CLUSTER", "INFO") != 0) return 0;
        char state[32];
        if (!info_field(out, "cluster_state", state, sizeof state) || strcmp(state, "ok") != 0)
            return 0;
        if (info_number(out, "cluster_known_nodes") != (long long)c->n_nodes) return 0;
        if (kvs_test_redis_cli(r, out, sizeof out, "INFO", "replication") != 0) return 0;
        char role[32], link[32];
        if (!info_field(out, "role", role, sizeof role)) return 0;
        if (strcmp(role, "master") == 0) {
            masters++;
            unsigned online = 0;
            for (const char *p = strstr(out, "state=online"); p; p = strstr(p + 1, "state=online"))
                online++;
            if (online != c->replicas) return 0;
        } else if (!info_field(out, "master_link_status", link, sizeof link) ||
                   strcmp(link, "up") != 0) {
            return 0;
        }
    }
    return masters == c->n_masters;
}

double kvs_test_redis_cluster_wait_ready(kvs_test_redis_cluster *c, int timeout_ms) {
    double t0 = kvs_test_now_ms();
    ck_assert_msg(kvs_test_wait_for(cluster_ready, c, timeout_ms),
                  "the cluster was not ready (cluster_state:ok everywhere, %u masters with %u "
                  "replicas each) within %d ms",
                  c->n_masters, c->replicas, kvs_test_scaled_ms(timeout_ms));
    return kvs_test_now_ms() - t0;
}

static int cluster_synced(void *arg) {
    kvs_test_redis_cluster *c = arg;
    for (unsigned i = 0; i < c->n_nodes; i++) {
        kvs_test_redis *r = &c->node[i];
        if (!kvs_test_redis_alive(r)) continue;
        char out[4096], role[32];
        if (kvs_test_redis_cli(r, out, sizeof out, "INFO", "replication") != 0) return 0;
        if (!info_field(out, "role", role, sizeof role)) return 0;
        if (strcmp(role, "master") == 0) continue;
        long long master_port = info_number(out, "master_port");
        long long seen = info_number(out, "slave_repl_offset");
        int m = node_of_port(c, (unsigned)master_port);
        if (m < 0 || !kvs_test_redis_alive(&c->node[m])) continue;
        char mout[4096];
        if (kvs_test_redis_cli(&c->node[m], mout, sizeof mout, "INFO", "replication") != 0)
            return 0;
        if (seen < info_number(mout, "master_repl_offset")) return 0;
    }
    return 1;
}

void kvs_test_redis_cluster_wait_synced(kvs_test_redis_cluster *c) {
    ck_assert_msg(kvs_test_wait_for(cluster_synced, c, 5000),
                  "replicas did not catch up with their masters");
}

void kvs_test_redis_cluster_start(kvs_test_redis_cluster *c, unsigned n_masters, unsigned replicas,
                                  int node_timeout_ms) {
    memset(c, 0, sizeof *c);
    ck_assert_msg(n_masters >= 3, "a cluster needs 3 masters at least");
    ck_assert_msg(n_masters * (1 + replicas) <= KVS_TEST_REDIS_CLUSTER_MAX,
                  "at most %d nodes in a test cluster", KVS_TEST_REDIS_CLUSTER_MAX);
    c->n_masters = n_masters;
    c->replicas = replicas;
    c->n_nodes = n_masters * (1 + replicas);
    c->killed = c->mig_slot = c->mig_from = c->mig_to = -1;
    double t0 = kvs_test_now_ms();
    const kvs_test_redis_opts o = {.cluster = 1, .cluster_node_timeout_ms = node_timeout_ms};
    /* all started before any is waited for: they come up side by side */
    for (unsigned i = 0; i < c->n_nodes; i++) {
        prepare(&c->node[i], &o);
        configure_and_launch(&c->node[i], &o);
    }
    for (unsigned i = 0; i < c->n_nodes; i++) await_up(&c->node[i], &o);
    for (unsigned i = 0; i < c->n_nodes; i++) {
        char out[128];
        ck_assert_int_eq(kvs_test_redis_cli(&c->node[i], out, sizeof out, "CLUSTER", "MYID"), 0);
        out[strcspn(out, "\r\n")] = '\0';
        ck_assert_msg(strlen(out) == 40, "CLUSTER MYID of %s: \"%s\"", c->node[i].addr, out);
        copy_text(c->id[i], sizeof c->id[i], out);
    }
    const char *argv[KVS_TEST_REDIS_CLUSTER_MAX + 8];
    char replicas_text[16];
    snprintf(replicas_text, sizeof replicas_text, "%u", replicas);
    unsigned n = 0;
    argv[n++] = "redis-cli";
    argv[n++] = "--cluster";
    argv[n++] = "create";
    for (unsigned i = 0; i < c->n_nodes; i++) argv[n++] = c->node[i].addr;
    argv[n++] = "--cluster-replicas";
    argv[n++] = replicas_text;
    argv[n++] = "--cluster-yes";
    argv[n] = NULL;
    static char out[65536];
    int rc = run_capture(argv, NULL, out, sizeof out, 60000);
    ck_assert_msg(rc == 0 && strstr(out, "All 16384 slots covered"),
                  "redis-cli --cluster create: %d:\n%s", rc, out);
    kvs_test_redis_cluster_wait_ready(c, 30000);
    c->form_ms = kvs_test_now_ms() - t0;
}

void kvs_test_redis_cluster_stop(kvs_test_redis_cluster *c) {
    for (unsigned i = 0; i < c->n_nodes; i++) (void)kvs_test_redis_stop(&c->node[i]);
    c->n_nodes = 0;
}

int kvs_test_redis_cluster_kill_master(kvs_test_redis_cluster *c, unsigned slot) {
    int m = kvs_test_redis_cluster_master_of(c, slot);
    c->killed_at_ms = kvs_test_now_ms();
    kvs_test_redis_kill(&c->node[m], SIGKILL);
    c->killed = m;
    return m;
}

typedef struct slot_wait {
    kvs_test_redis_cluster *c;
    unsigned slot;
    int want;     /* the owner every node must name, or -1: any running node but c->killed */
    int owner;    /* the owner seen */
    int state_ok; /* also cluster_state:ok everywhere */
} slot_wait;

static int slot_settled(void *arg) {
    slot_wait *w = arg;
    kvs_test_redis_cluster *c = w->c;
    int agreed = -1;
    for (unsigned i = 0; i < c->n_nodes; i++) {
        if (!kvs_test_redis_alive(&c->node[i])) continue;
        if (w->state_ok) {
            char out[4096], state[32];
            if (kvs_test_redis_cli(&c->node[i], out, sizeof out, "CLUSTER", "INFO") != 0 ||
                !info_field(out, "cluster_state", state, sizeof state) || strcmp(state, "ok") != 0)
                return 0;
        }
        int owner = owner_in_view(c, i, w->slot);
        if (owner < 0 || (agreed >= 0 && owner != agreed)) return 0;
        agreed = owner;
    }
    if (agreed < 0 || !kvs_test_redis_alive(&c->node[agreed])) return 0;
    if (w->want >= 0 ? agreed != w->want : agreed == c->killed) return 0;
    w->owner = agreed;
    return 1;
}

double kvs_test_redis_cluster_wait_failover(kvs_test_redis_cluster *c, unsigned slot,
                                            int timeout_ms) {
    ck_assert_msg(c->killed >= 0, "wait_failover: no master was killed");
    slot_wait w = {c, slot, -1, -1, 1};
    ck_assert_msg(kvs_test_wait_for(slot_settled, &w, timeout_ms),
                  "no replica took over slot %u from %s within %d ms", slot,
                  c->node[c->killed].addr, kvs_test_scaled_ms(timeout_ms));
    return kvs_test_now_ms() - c->killed_at_ms;
}

static void setslot(kvs_test_redis_cluster *c, unsigned node, unsigned slot, const char *how,
                    const char *id) {
    char out[512], slot_text[16];
    snprintf(slot_text, sizeof slot_text, "%u", slot);
    int rc = kvs_test_redis_cli(&c->node[node], out, sizeof out, "CLUSTER", "SETSLOT", slot_text,
                                how, id);
    ck_assert_msg(rc == 0 && strncmp(out, "OK", 2) == 0, "CLUSTER SETSLOT %u %s on %s: %s", slot,
                  how, c->node[node].addr, out);
}

void kvs_test_redis_cluster_slot_migrating(kvs_test_redis_cluster *c, unsigned slot, unsigned to) {
    ck_assert_uint_lt(to, c->n_nodes);
    int from = kvs_test_redis_cluster_master_of(c, slot);
    ck_assert_msg(from != (int)to, "slot %u is already on %s", slot, c->node[to].addr);
    setslot(c, to, slot, "IMPORTING", c->id[from]);
    setslot(c, (unsigned)from, slot, "MIGRATING", c->id[to]);
    c->mig_slot = (int)slot;
    c->mig_from = from;
    c->mig_to = (int)to;
}

unsigned kvs_test_redis_cluster_migrate_keys(kvs_test_redis_cluster *c, unsigned slot) {
    enum { PER_ROUND = 100 };
    ck_assert_msg(c->mig_slot == (int)slot, "slot %u is not being migrated", slot);
    kvs_test_redis *from = &c->node[c->mig_from];
    char slot_text[16], port_text[16], count_text[16];
    snprintf(slot_text, sizeof slot_text, "%u", slot);
    snprintf(port_text, sizeof port_text, "%u", (unsigned)c->node[c->mig_to].port);
    snprintf(count_text, sizeof count_text, "%d", PER_ROUND);
    static char keys[65536];
    char out[4096];
    unsigned moved = 0;
    for (unsigned round = 0; round < 1000; round++) {
        int rc = kvs_test_redis_cli(from, keys, sizeof keys, "CLUSTER", "GETKEYSINSLOT", slot_text,
                                    count_text);
        ck_assert_msg(rc == 0, "CLUSTER GETKEYSINSLOT on %s: %s", from->addr, keys);
        const char *args[PER_ROUND + 16];
        unsigned n = 0, n_keys = 0;
        const char *head[] = {"MIGRATE", "127.0.0.1", port_text, "", "0", "5000", "KEYS"};
        for (unsigned k = 0; k < sizeof head / sizeof head[0]; k++) args[n++] = head[k];
        char *save = NULL;
        for (char *key = strtok_r(keys, "\n", &save); key && n_keys < PER_ROUND;
             key = strtok_r(NULL, "\n", &save)) {
            args[n++] = key;
            n_keys++;
        }
        args[n] = NULL;
        if (n_keys == 0) return moved;
        rc = kvs_test_redis_cliv(from, args, out, sizeof out);
        ck_assert_msg(rc == 0 && strncmp(out, "OK", 2) == 0, "MIGRATE from %s: %s", from->addr,
                      out);
        moved += n_keys;
    }
    ck_abort_msg("slot %u still had keys on %s after 1000 rounds", slot, from->addr);
    return moved;
}

void kvs_test_redis_cluster_slot_finish(kvs_test_redis_cluster *c, unsigned slot, unsigned to) {
    ck_assert_uint_lt(to, c->n_nodes);
    int from = c->mig_slot == (int)slot ? c->mig_from : kvs_test_redis_cluster_master_of(c, slot);
    setslot(c, to, slot, "NODE", c->id[to]);
    if (from != (int)to) setslot(c, (unsigned)from, slot, "NODE", c->id[to]);
    for (unsigned i = 0; i < c->n_nodes; i++) {
        if (i == to || (int)i == from || !kvs_test_redis_alive(&c->node[i])) continue;
        char out[4096], role[32];
        if (kvs_test_redis_cli(&c->node[i], out, sizeof out, "INFO", "replication") == 0 &&
            info_field(out, "role", role, sizeof role) && strcmp(role, "master") == 0)
            setslot(c, i, slot, "NODE", c->id[to]);
    }
    c->mig_slot = c->mig_from = c->mig_to = -1;
    slot_wait w = {c, slot, (int)to, -1, 0};
    ck_assert_msg(kvs_test_wait_for(slot_settled, &w, 10000),
                  "not every node names %s the master of slot %u", c->node[to].addr, slot);
}
