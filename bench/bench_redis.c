/* bench_redis.c - the redis tier (backends/redis/redis.h) against a plain TCP stream and against
 * redis-benchmark, on the same servers, in the same run. bench/redis.sh starts the servers (one
 * standalone redis-server and a cluster of three masters on 127.0.0.1) and runs this program with
 * --standalone and --cluster; without either it exits 77.
 *
 * The tier is made through its ops table (kvs_redis_backend()->create) with the options a YAML tier
 * gives it (node, mode, tenant, timeout_ms), and driven as the connector drives it: per object size
 * a round puts --round-mib of objects one put at a time (each returns once written; the keys are removed
 * first, untimed, so every put stores a new key), then gets them back with get_many in batches of
 * --batch keys into their own buffers. Round 0 is untimed and checks every byte of every get.
 *
 * References, measured in every round between the tier's runs:
 * 1. tcp_stream: the round's bytes over as many plain TCP streams at once as the tier has
 *    connections (masters x connections_per_node), each between this process and a peer process
 *    (this program with --tcp-peer), 127.0.0.1 to 127.0.0.1 as the tier and its servers; each
 *    direction, the faster is the reference (tcp_stream.h). The tier's target is >= 0.8 of it.
 * 2. redis_benchmark: redis-benchmark (SET or GET of the same value size, --cluster for the
 *    cluster) with the pipeline depth, clients and threads that gave it the most in a sweep before
 *    the rounds (-P 1/4/16, -c 1/4/16/50 and --threads 2 with -c 4/16; cluster: -c 3/12/48;
 *    settings that would hold more than 256 MiB in flight are left out); its requests per second
 *    times the value size. The tier's target is >= 1.0 of it. A GET figure comes from a
 *    `-t set,get` run, so the GETs read values that the same clients' SETs stored (a GET of a
 *    missing key would return nil, not the value). With threads (--threads, and --cluster, a thread
 *    per master) redis-benchmark stops its clock only at its 250 ms progress timer: those runs last
 *    about 3 s (1.5 s in the sweep), so the rounding costs them at most 8% (ref_250ms_timer).
 *
 * Figures are medians of the rounds, ratios medians of the per-round ratios. The client, the
 * servers, the TCP peer and redis-benchmark share this machine's CPUs (the header line says how
 * many). */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include "abi/kvstrata_backend.h"
#include "backends/redis/redis.h"
#include "bench_common.h"
#include "tcp_stream.h"

#define KIB             1024ull
#define MIB             (1024ull * 1024ull)
#define MAX_SIZES       4u
#define MAX_NODES       16u
#define RB_MAX_INFLIGHT (256ull * MIB) /* a redis-benchmark setting holds at most this in flight */
#define CHILD_WAIT_S    300            /* the most a redis-benchmark run may take */

extern char **environ;

typedef struct options {
    uint32_t rounds;
    uint64_t round_bytes;
    uint32_t batch;
    uint32_t n_sizes;
    uint64_t sizes[MAX_SIZES];
    const char *standalone;
    char cluster[1024];
    const char *connections; /* the tier's connections_per_node (NULL: its default) */
    const char *inflight;    /* the tier's inflight_bytes (NULL: its default) */
    const char *timeout_ms;  /* the tier's timeout_ms */
    const char *rb_setting;  /* "P,c,threads": no sweep */
} options;

static char self_bin[4096];
static pid_t child_pid; /* a TCP peer or redis-benchmark run now: stopped if we fail */

static void die(const char *what, const char *why) {
    fprintf(stderr, "kvs-bench-redis: %s: %s\n", what, why);
    if (child_pid > 0) {
        kill(child_pid, SIGKILL);
        waitpid(child_pid, NULL, 0);
    }
    exit(1);
}

static void usage(int status) {
    fprintf(
        status ? stderr : stdout,
        "usage: kvs-bench-redis [--standalone HOST:PORT] [--cluster HOST:PORT[,HOST:PORT...]]\n"
        "                       [--rounds N] [--round-mib N] [--sizes KiB,KiB,...] [--batch N]\n"
        "                       [--timeout-ms N] [--connections N] [--inflight-bytes N]\n"
        "                       [--rb-setting P,C,THREADS]\n"
        "  (bench/redis.sh starts the servers and passes --standalone and --cluster)\n"
        "  --standalone      a standalone redis-server to measure on\n"
        "  --cluster         seeds of a Redis Cluster to measure on\n"
        "  --rounds          timed rounds per object size (default 5)\n"
        "  --round-mib       bytes of objects a round puts and gets (default 128)\n"
        "  --sizes           object sizes in KiB (default 1024,64)\n"
        "  --batch           keys per get_many (default 32)\n"
        "  --timeout-ms      the tier's timeout_ms (default 2000: the servers share the CPUs)\n"
        "  --connections     the tier's connections_per_node (default: the tier's, 2)\n"
        "  --inflight-bytes  the tier's inflight_bytes (default: the tier's, 2 MiB)\n"
        "  --rb-setting      redis-benchmark's -P, -c and threads (1: none), no sweep\n");
    exit(status);
}

static options parse_options(int argc, char **argv) {
    options o = {.rounds = 5,
                 .round_bytes = 128 * MIB,
                 .batch = 32,
                 .n_sizes = 2,
                 .sizes = {MIB, 64 * KIB},
                 .timeout_ms = "2000"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) usage(0);
        if (!v) usage(2);
        if (!strcmp(a, "--rounds"))
            o.rounds = (uint32_t)bench_parse_u64(a, v, 1, 100);
        else if (!strcmp(a, "--round-mib"))
            o.round_bytes = bench_parse_u64(a, v, 1, 256) * MIB;
        else if (!strcmp(a, "--batch"))
            o.batch = (uint32_t)bench_parse_u64(a, v, 1, 4096);
        else if (!strcmp(a, "--standalone"))
            o.standalone = v;
        else if (!strcmp(a, "--cluster"))
            snprintf(o.cluster, sizeof o.cluster, "%s", v);
        else if (!strcmp(a, "--timeout-ms")) {
            bench_parse_u64(a, v, 1, 600000);
            o.timeout_ms = v;
        } else if (!strcmp(a, "--connections")) {
            bench_parse_u64(a, v, 1, 16);
            o.connections = v;
        } else if (!strcmp(a, "--inflight-bytes")) {
            bench_parse_u64(a, v, 1, 1ull << 40);
            o.inflight = v;
        } else if (!strcmp(a, "--rb-setting"))
            o.rb_setting = v;
        else if (!strcmp(a, "--sizes")) {
            char text[256], *save = NULL;
            snprintf(text, sizeof text, "%s", v);
            o.n_sizes = 0;
            for (char *t = strtok_r(text, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o.n_sizes == MAX_SIZES) usage(2);
                o.sizes[o.n_sizes++] = bench_parse_u64(a, t, 1, 64 * 1024) * KIB;
            }
            if (!o.n_sizes) usage(2);
        } else
            usage(2);
        i++;
    }
    for (uint32_t i = 0; i < o.n_sizes; i++)
        if (o.sizes[i] > o.round_bytes) die("--sizes", "an object is larger than --round-mib");
    return o;
}

/* --- children: the TCP peer and redis-benchmark ----------------------------------------------- */

/* Start argv (PATH searched) with stdout and stderr into a pipe whose read end is *out. */
static pid_t spawn_piped(char *const argv[], int *out) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) die("pipe", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    pid_t pid = 0;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) die(argv[0], strerror(rc));
    child_pid = pid;
    *out = p[0];
    return pid;
}

/* Read fd until EOF (or until `until` is in what was read, when given) into out[0..cap), for at
 * most wait_s seconds. 0, or -1 when the time ran out. */
static int read_until(int fd, char *out, size_t cap, const char *until, int wait_s) {
    size_t got = 0;
    uint64_t end = bench_now_ns() + (uint64_t)wait_s * 1000000000ull;
    out[0] = '\0';
    for (;;) {
        if (until && strstr(out, until) && strchr(strstr(out, until), '\n')) return 0;
        uint64_t now = bench_now_ns();
        if (now >= end) return -1;
        struct pollfd p = {fd, POLLIN, 0};
        int k = poll(&p, 1, (int)((end - now) / 1000000 + 1));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        char scratch[4096];
        ssize_t n = got + 1 < cap ? read(fd, out + got, cap - 1 - got)
                                  : read(fd, scratch, sizeof scratch); /* keep the head, drain */
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return until ? -1 : 0;
        if (got + 1 < cap) got += (size_t)n;
        out[got] = '\0';
    }
}

/* The exit status of the child (-1: it did not exit normally). */
static int reap(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    child_pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* One stream of a parallel reference: its peer's port, its share of the bytes, its seconds. */
typedef struct stream_job {
    const char *addr;
    unsigned port;
    uint64_t bytes;
    int upload;
    pthread_barrier_t *start;
    double seconds;
    const char *why;
} stream_job;

static void *stream_thread(void *arg) {
    stream_job *j = arg;
    pthread_barrier_wait(j->start);
    j->seconds = kvs_tcp_stream(j->addr, j->port, j->bytes, j->bytes, j->upload, &j->why);
    return NULL;
}

/* `bytes` over n plain TCP streams at once (each to its own peer process, as the tier spreads its
 * requests over n connections): bytes per second, from the first start to the last byte. */
static double tcp_stream(const char *addr, uint64_t bytes, int upload, uint32_t n) {
    enum { MAX_STREAMS = 16 };
    if (n < 1) n = 1;
    if (n > MAX_STREAMS) n = MAX_STREAMS;
    pid_t peers[MAX_STREAMS];
    stream_job jobs[MAX_STREAMS];
    pthread_t threads[MAX_STREAMS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, n);
    for (uint32_t i = 0; i < n; i++) {
        char *argv[] = {self_bin, "--tcp-peer", (char *)addr, NULL};
        int out = -1;
        peers[i] = spawn_piped(argv, &out);
        char line[256];
        unsigned port = 0;
        if (read_until(out, line, sizeof line, "port ", 5) != 0 ||
            sscanf(strstr(line, "port "), "port %u", &port) != 1)
            die("the TCP stream reference", "the peer named no port within 5 s");
        close(out);
        jobs[i] = (stream_job){addr, port, bytes / n, upload, &start, -1, ""};
    }
    for (uint32_t i = 0; i < n; i++) pthread_create(&threads[i], NULL, stream_thread, &jobs[i]);
    double longest = 0;
    const char *why = NULL;
    for (uint32_t i = 0; i < n; i++) {
        pthread_join(threads[i], NULL);
        if (jobs[i].seconds <= 0) why = jobs[i].why;
        if (jobs[i].seconds > longest) longest = jobs[i].seconds;
    }
    pthread_barrier_destroy(&start);
    int failed = why != NULL;
    for (uint32_t i = 0; i < n; i++) {
        if (failed) kill(peers[i], SIGKILL);
        failed |= reap(peers[i]) != 0 && !why;
    }
    if (failed) die("the TCP stream reference", why ? why : "a peer failed");
    return (double)(bytes / n * n) / longest;
}

typedef struct rb_setting {
    uint32_t pipeline, clients, threads; /* threads 1: redis-benchmark's default (no --threads) */
} rb_setting;

static void rb_name(rb_setting s, char *out, size_t len) {
    if (s.threads > 1)
        snprintf(out, len, "-P %u -c %u --threads %u", s.pipeline, s.clients, s.threads);
    else
        snprintf(out, len, "-P %u -c %u", s.pipeline, s.clients);
}

/* redis-benchmark ends a run with threads (--threads, and --cluster, which runs a thread per
 * master) only at its 250 ms progress timer, so the time it divides by is rounded up to a multiple
 * of 250 ms: such a run is made long enough that this costs it little. */
static int rb_quantized(rb_setting s, int cluster) {
    return cluster || s.threads > 1;
}

/* The requests of a run expected to last `seconds` at `bps` (the TCP stream's rate: no more than
 * the reference can move), and at least 4 per request in flight. */
static uint64_t rb_requests(rb_setting s, uint64_t size, double bps, double seconds) {
    uint64_t n = (uint64_t)(bps * seconds / (double)size), floor = 4ull * s.pipeline * s.clients;
    return n > floor ? n : floor;
}

/* redis-benchmark -t tests (set, get or set,get) on the server at endpoint (cluster: a seed):
 * bytes per second of SET into *set and of GET into *get (those asked for). */
static void redis_benchmark(const char *endpoint, int cluster, const char *tests, uint64_t size,
                            rb_setting s, uint64_t requests, double *set, double *get) {
    char host[256], port[16], d[24], n[24], p[16], c[16], th[16];
    const char *colon = strrchr(endpoint, ':');
    if (!colon || (size_t)(colon - endpoint) >= sizeof host) die(endpoint, "not host:port");
    memcpy(host, endpoint, (size_t)(colon - endpoint));
    host[colon - endpoint] = '\0';
    snprintf(port, sizeof port, "%s", colon + 1);
    snprintf(d, sizeof d, "%llu", (unsigned long long)size);
    snprintf(n, sizeof n, "%llu", (unsigned long long)requests);
    snprintf(p, sizeof p, "%u", s.pipeline);
    snprintf(c, sizeof c, "%u", s.clients);
    snprintf(th, sizeof th, "%u", s.threads);
    char *argv[24] = {"redis-benchmark",
                      "-h",
                      host,
                      "-p",
                      port,
                      "-t",
                      (char *)tests,
                      "-d",
                      d,
                      "-n",
                      n,
                      "-P",
                      p,
                      "-c",
                      c,
                      "--csv"};
    int k = 16;
    if (cluster) argv[k++] = "--cluster";
    if (s.threads > 1) argv[k++] = "--threads", argv[k++] = th;
    argv[k] = NULL;
    int out = -1;
    pid_t pid = spawn_piped(argv, &out);
    static char text[1 << 16];
    int timed_out = read_until(out, text, sizeof text, NULL, CHILD_WAIT_S);
    close(out);
    if (timed_out) kill(pid, SIGKILL);
    int rc = reap(pid);
    double rps_set = 0, rps_get = 0;
    for (const char *line = text; *line;) {
        if (!strncmp(line, "\"SET\",\"", 7)) rps_set = strtod(line + 7, NULL);
        if (!strncmp(line, "\"GET\",\"", 7)) rps_get = strtod(line + 7, NULL);
        const char *eol = strchr(line, '\n');
        line = eol ? eol + 1 : line + strlen(line);
    }
    int want_set = strstr(tests, "set") != NULL, want_get = strstr(tests, "get") != NULL;
    if (timed_out || rc != 0 || (want_set && rps_set <= 0) || (want_get && rps_get <= 0)) {
        fprintf(stderr, "kvs-bench-redis: redis-benchmark %s %s %s -d %s -n %s -P %s -c %s: %s\n%s",
                cluster ? "--cluster" : "", endpoint, tests, d, n, p, c,
                timed_out ? "did not finish" : "failed", text);
        die("redis-benchmark", "the reference run failed");
    }
    if (set) *set = rps_set * (double)size;
    if (get) *get = rps_get * (double)size;
}

/* --- the tier ----------------------------------------------------------------------------------- */

typedef struct tier {
    const kvs_backend_ops *ops;
    void *state;
    const char *mode;
    const char *endpoint; /* the first node: where redis-benchmark goes */
    int cluster;
    uint32_t connections; /* masters x connections_per_node: the connections its requests use */
} tier;

static void host_log(void *ctx, int level, const char *message) {
    (void)ctx;
    if (level <= KVS_LOG_WARN) fprintf(stderr, "kvs-bench-redis: tier: %s\n", message);
}

static const kvs_backend_host HOST = {.struct_size = sizeof HOST, .log = host_log};

static void tier_open(tier *t, const options *o, int cluster, uint64_t max_object) {
    static char nodes[MAX_NODES][256];
    kvs_backend_option opts[MAX_NODES + 8];
    uint64_t n = 0;
    t->ops = kvs_redis_backend();
    t->cluster = cluster;
    t->mode = cluster ? "cluster" : "standalone";
    if (!(t->ops->caps & KVS_BACKEND_CAP_GET_MANY)) die("redis tier", "no get_many");
    if (cluster) {
        char text[sizeof o->cluster], *save = NULL;
        snprintf(text, sizeof text, "%s", o->cluster);
        uint32_t k = 0;
        for (char *s = strtok_r(text, ",", &save); s && k < MAX_NODES;
             s = strtok_r(NULL, ",", &save), k++) {
            snprintf(nodes[k], sizeof nodes[k], "%s", s);
            opts[n++] = (kvs_backend_option){"node", nodes[k]};
        }
        if (k == 0) die("--cluster", "no seed");
    } else {
        snprintf(nodes[0], sizeof nodes[0], "%s", o->standalone);
        opts[n++] = (kvs_backend_option){"node", nodes[0]};
    }
    t->endpoint = opts[0].value;
    opts[n++] = (kvs_backend_option){"mode", t->mode};
    opts[n++] = (kvs_backend_option){"tenant", "bench"};
    opts[n++] = (kvs_backend_option){"timeout_ms", o->timeout_ms};
    if (o->connections) opts[n++] = (kvs_backend_option){"connections_per_node", o->connections};
    if (o->inflight) opts[n++] = (kvs_backend_option){"inflight_bytes", o->inflight};
    char err[700] = "", refused[80] = "";
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = "redis",
                             .max_object_bytes = max_object,
                             .options = opts,
                             .n_options = n,
                             .host = &HOST,
                             .error = err,
                             .error_len = sizeof err,
                             .error_option = refused,
                             .error_option_len = sizeof refused};
    kvs_status st = t->ops->create(&init, &t->state);
    if (st != KVS_OK) die("the redis tier's create", err[0] ? err : kvs_strerror(st));
    kvs_redis_stats_t s;
    memset(&s, 0, sizeof s);
    kvs_redis_stats(t->state, &s);
    t->connections = (s.n_masters ? s.n_masters : 1) *
                     (uint32_t)(o->connections ? strtoul(o->connections, NULL, 10) : 2);
}

static kvs_redis_stats_t tier_stats(const tier *t) {
    kvs_redis_stats_t s;
    memset(&s, 0, sizeof s);
    kvs_redis_stats(t->state, &s);
    return s;
}

typedef struct objects {
    uint64_t size, n;
    kvs_key *keys;
    uint8_t *src, *dst;
    void **dsts;
    uint64_t *caps, *lens;
    kvs_status *statuses;
} objects;

static void objects_init(objects *b, uint64_t size, uint64_t round_bytes) {
    memset(b, 0, sizeof *b);
    b->size = size;
    b->n = round_bytes / size;
    b->keys = calloc(b->n, sizeof *b->keys);
    b->dsts = calloc(b->n, sizeof *b->dsts);
    b->caps = calloc(b->n, sizeof *b->caps);
    b->lens = calloc(b->n, sizeof *b->lens);
    b->statuses = calloc(b->n, sizeof *b->statuses);
    if (!b->keys || !b->dsts || !b->caps || !b->lens || !b->statuses) die("objects", "no memory");
    b->src = bench_map(b->n * size, 1, 0, "the objects put");
    b->dst = bench_map(b->n * size, 1, 0, "the objects got");
    for (uint64_t i = 0; i < b->n; i++) {
        uint64_t x = bench_mix64((size << 24) ^ i), y = bench_mix64(x);
        memcpy(b->keys[i].bytes, &x, 8);
        memcpy(b->keys[i].bytes + 8, &y, 8);
        uint64_t *w = (uint64_t *)(void *)(b->src + i * size);
        for (uint64_t k = 0; k < size / 8; k++) w[k] = bench_mix64(x + k);
        b->dsts[i] = b->dst + i * size;
        b->caps[i] = size;
    }
}

static void objects_free(objects *b) {
    munmap(b->src, b->n * b->size);
    munmap(b->dst, b->n * b->size);
    free(b->keys);
    free(b->dsts);
    free(b->caps);
    free(b->lens);
    free(b->statuses);
}

static void tier_fail(const tier *t, const char *what, kvs_status st) {
    char why[700];
    snprintf(why, sizeof why, "%s (%d): %s", kvs_strerror(st), (int)st,
             t->ops->last_error(t->state));
    die(what, why);
}

static void tier_remove(const tier *t, const objects *b) {
    for (uint64_t i = 0; i < b->n; i++) {
        kvs_status st = t->ops->remove(t->state, &b->keys[i]);
        if (st != KVS_OK) tier_fail(t, "remove", st);
    }
}

/* Every object put, one put each, as the connector saves: seconds. */
static double tier_put(const tier *t, const objects *b) {
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < b->n; i++) {
        kvs_status st = t->ops->put(t->state, &b->keys[i], b->src + i * b->size, b->size);
        if (st != KVS_OK) tier_fail(t, "put", st);
    }
    return (double)(bench_now_ns() - t0) / 1e9;
}

/* Every object got back, with get_many of `batch` keys a call, as the connector loads: seconds.
 * Every object must be found whole. */
static double tier_get(const tier *t, const objects *b, uint32_t batch) {
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < b->n; i += batch) {
        uint64_t k = b->n - i < batch ? b->n - i : batch;
        kvs_status st = t->ops->get_many(t->state, b->keys + i, b->dsts + i, b->caps + i, k,
                                         b->lens + i, b->statuses + i);
        if (st != KVS_OK) tier_fail(t, "get_many", st);
    }
    double s = (double)(bench_now_ns() - t0) / 1e9;
    for (uint64_t i = 0; i < b->n; i++)
        if (b->statuses[i] != KVS_OK || b->lens[i] != b->size) {
            fprintf(stderr, "kvs-bench-redis: get of object %llu: %s, %llu bytes: %s\n",
                    (unsigned long long)i, kvs_strerror(b->statuses[i]),
                    (unsigned long long)b->lens[i], t->ops->last_error(t->state));
            die("get_many", "an object put was not got back whole");
        }
    return s;
}

/* --- one mode, one size ------------------------------------------------------------------------- */

/* The settings tried: without threads (a run stops as its last reply lands), with --threads 2 (a
 * second core for the client), and for the cluster clients in multiples of its three masters
 * (redis-benchmark spreads them over the masters). */
static const rb_setting SWEEP_PLAIN[] = {
    {1, 1, 1},  {1, 4, 1},  {1, 16, 1}, {1, 50, 1}, {4, 1, 1},   {4, 4, 1},
    {4, 16, 1}, {4, 50, 1}, {16, 1, 1}, {16, 4, 1}, {16, 16, 1}, {16, 50, 1},
    {1, 4, 2},  {1, 16, 2}, {4, 4, 2},  {4, 16, 2}, {16, 4, 2},  {16, 16, 2}};
static const rb_setting SWEEP_CLUSTER[] = {{1, 3, 1},  {1, 12, 1},  {1, 48, 1},
                                           {4, 3, 1},  {4, 12, 1},  {4, 48, 1},
                                           {16, 3, 1}, {16, 12, 1}, {16, 48, 1}};
#define SWEEP_S           0.6 /* the expected length of a sweep run */
#define SWEEP_QUANTIZED_S 1.5
#define ROUND_S           1.0 /* ... of a round's run */
#define ROUND_QUANTIZED_S 3.0

typedef struct best {
    rb_setting set, get;
    double set_bps, get_bps;
    uint32_t tried;
} best;

/* Every setting of the sweep, `-t set,get` each (settings that would hold more than
 * RB_MAX_INFLIGHT in flight are left out): the best for SET and for GET. */
static best rb_sweep(const tier *t, uint64_t size, double bps) {
    best b = {.tried = 0};
    const rb_setting *list = t->cluster ? SWEEP_CLUSTER : SWEEP_PLAIN;
    size_t n = t->cluster ? sizeof SWEEP_CLUSTER / sizeof *list : sizeof SWEEP_PLAIN / sizeof *list;
    for (size_t i = 0; i < n; i++) {
        rb_setting s = list[i];
        if ((uint64_t)s.pipeline * s.clients * size > RB_MAX_INFLIGHT) continue;
        double set = 0, get = 0, secs = rb_quantized(s, t->cluster) ? SWEEP_QUANTIZED_S : SWEEP_S;
        redis_benchmark(t->endpoint, t->cluster, "set,get", size, s,
                        rb_requests(s, size, bps, secs), &set, &get);
        b.tried++;
        if (set > b.set_bps) b.set_bps = set, b.set = s;
        if (get > b.get_bps) b.get_bps = get, b.get = s;
    }
    return b;
}

static void size_text(uint64_t size, char *out, size_t len) {
    if (size % MIB == 0)
        snprintf(out, len, "%llu MiB", (unsigned long long)(size / MIB));
    else
        snprintf(out, len, "%llu KiB", (unsigned long long)(size / KIB));
}

typedef struct figure {
    double med, ref_med, ratio, ratio_min, ratio_max;
} figure;

static figure against(const double *v, const double *ref, uint32_t n) {
    double r[100];
    for (uint32_t i = 0; i < n; i++) r[i] = v[i] / ref[i];
    return (figure){bench_median(v, n), bench_median(ref, n), bench_median(r, n), bench_min(r, n),
                    bench_max(r, n)};
}

static void print_pair(const tier *t, const options *o, const objects *b, int put,
                       const double *tier_bps, const double *tcp_best, const double *tcp_down,
                       const double *tcp_up, const double *rb, rb_setting rs, double sweep_bps,
                       uint32_t tried, const kvs_redis_stats_t *st) {
    const char *op = put ? "put" : "get";
    char size[32], setting[64], how[64];
    size_text(b->size, size, sizeof size);
    rb_name(rs, setting, sizeof setting);
    if (put)
        snprintf(how, sizeof how, "one put each");
    else
        snprintf(how, sizeof how, "get_many of %u", o->batch);
    figure f = against(tier_bps, tcp_best, o->rounds);
    double down = bench_median(tcp_down, o->rounds) / 1e9,
           up = bench_median(tcp_up, o->rounds) / 1e9;
    uint64_t errors = st->failures + st->timeouts + st->reconnects + st->protocol_errors;
    printf("{\"bench\":\"redis_%s\",\"mode\":\"%s\",\"object_bytes\":%llu,\"objects\":%llu,"
           "\"batch\":%u,\"gbps\":%.3f,\"ref\":\"tcp_stream\",\"ref_variant\":\"faster direction\","
           "\"ref_streams\":%u,\"ref_gbps\":%.3f,\"ratio\":%.3f,\"rounds\":%u,\"ratio_min\":%.3f,"
           "\"ratio_max\":%.3f,"
           "\"tcp_download_gbps\":%.3f,\"tcp_upload_gbps\":%.3f,\"masters\":%u,"
           "\"tier_errors\":%llu,\"cpus\":%ld}\n",
           op, t->mode, (unsigned long long)b->size, (unsigned long long)b->n, put ? 1 : o->batch,
           f.med / 1e9, t->connections, f.ref_med / 1e9, f.ratio, o->rounds, f.ratio_min,
           f.ratio_max, down, up, st->n_masters, (unsigned long long)errors,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("redis %s, %s, %llu x %s (%s): %.2f GB/s; %u TCP streams %.2f GB/s (faster of down "
           "%.2f, up %.2f): ratio %.3f (%.3f to %.3f)%s\n",
           op, t->mode, (unsigned long long)b->n, size, how, f.med / 1e9, t->connections,
           f.ref_med / 1e9, down, up, f.ratio, f.ratio_min, f.ratio_max,
           f.ratio > 1.0 ? " - the stream was slower than the tier: not a limit in this run" : "");
    figure g = against(tier_bps, rb, o->rounds);
    int below = g.ratio > 1.0;
    printf("{\"bench\":\"redis_%s\",\"mode\":\"%s\",\"object_bytes\":%llu,\"objects\":%llu,"
           "\"batch\":%u,\"gbps\":%.3f,\"ref\":\"redis_benchmark\",\"ref_setting\":\"%s%s\","
           "\"ref_gbps\":%.3f,\"ratio\":%.3f,\"rounds\":%u,\"ratio_min\":%.3f,\"ratio_max\":%.3f,"
           "\"ref_sweep_gbps\":%.3f,\"ref_settings_tried\":%u,\"ref_below_tier\":%s,"
           "\"ref_250ms_timer\":%s,\"cpus\":%ld}\n",
           op, t->mode, (unsigned long long)b->size, (unsigned long long)b->n, put ? 1 : o->batch,
           g.med / 1e9, setting, t->cluster ? " --cluster" : "", g.ref_med / 1e9, g.ratio,
           o->rounds, g.ratio_min, g.ratio_max, sweep_bps / 1e9, tried, below ? "true" : "false",
           rb_quantized(rs, t->cluster) ? "true" : "false", sysconf(_SC_NPROCESSORS_ONLN));
    printf("redis %s, %s, %llu x %s (%s): %.2f GB/s; redis-benchmark %s %.2f GB/s (%s%s, best of "
           "%u settings, %.2f GB/s in the sweep): ratio %.3f (%.3f to %.3f)%s\n",
           op, t->mode, (unsigned long long)b->n, size, how, g.med / 1e9, put ? "SET" : "GET",
           g.ref_med / 1e9, setting, t->cluster ? " --cluster" : "", tried, sweep_bps / 1e9,
           g.ratio, g.ratio_min, g.ratio_max,
           below ? " - redis-benchmark was slower than the tier: not a limit" : "");
    fflush(stdout);
}

static void bench_size(const tier *t, const options *o, uint64_t size) {
    objects b;
    objects_init(&b, size, o->round_bytes);
    uint64_t bytes = b.n * size;
    const char *addr = "127.0.0.1";

    /* round 0, untimed: the keys stored, got back, every byte checked; the references warmed */
    tier_remove(t, &b);
    tier_put(t, &b);
    tier_get(t, &b, o->batch);
    if (memcmp(b.dst, b.src, bytes) != 0) die("get_many", "an object differs from what was put");
    uint32_t streams = t->connections; /* the reference uses as many connections as the tier */
    double tcp0 = tcp_stream(addr, bytes, 0, streams);
    best rb;
    if (o->rb_setting) {
        rb_setting s = {1, 1, 1};
        if (sscanf(o->rb_setting, "%u,%u,%u", &s.pipeline, &s.clients, &s.threads) != 3 ||
            !s.pipeline || !s.clients || !s.threads)
            die("--rb-setting", "expected P,C,THREADS");
        rb = (best){s, s, 0, 0, 1};
        redis_benchmark(t->endpoint, t->cluster, "set,get", size, s,
                        rb_requests(s, size, tcp0, SWEEP_S), &rb.set_bps, &rb.get_bps);
    } else {
        rb = rb_sweep(t, size, tcp0);
    }
    double set_s = rb_quantized(rb.set, t->cluster) ? ROUND_QUANTIZED_S : ROUND_S,
           get_s = rb_quantized(rb.get, t->cluster) ? ROUND_QUANTIZED_S : ROUND_S;
    int same = !memcmp(&rb.set, &rb.get, sizeof rb.set);

    double *all = calloc(8 * (size_t)o->rounds, sizeof *all);
    if (!all) die("rounds", "no memory");
    double *put = all, *get = all + o->rounds, *down = all + 2 * o->rounds,
           *up = all + 3 * o->rounds, *tcp = all + 4 * o->rounds, *rb_set = all + 5 * o->rounds,
           *rb_get = all + 6 * o->rounds;
    kvs_redis_stats_t s0 = tier_stats(t);
    for (uint32_t r = 0; r < o->rounds; r++) {
        tier_remove(t, &b); /* untimed: every put stores a new key */
        put[r] = (double)bytes / tier_put(t, &b);
        get[r] = (double)bytes / tier_get(t, &b, o->batch);
        down[r] = tcp_stream(addr, bytes, 0, streams);
        up[r] = tcp_stream(addr, bytes, 1, streams);
        tcp[r] = down[r] > up[r] ? down[r] : up[r];
        /* GET's run also SETs, so its clients read values stored (one run when both are best
         * with the same setting) */
        if (!same)
            redis_benchmark(t->endpoint, t->cluster, "set", size, rb.set,
                            rb_requests(rb.set, size, tcp0, set_s), &rb_set[r], NULL);
        redis_benchmark(t->endpoint, t->cluster, "set,get", size, rb.get,
                        rb_requests(rb.get, size, tcp0, get_s), same ? &rb_set[r] : NULL,
                        &rb_get[r]);
    }
    kvs_redis_stats_t s1 = tier_stats(t);
    if (s1.puts_stored - s0.puts_stored != (uint64_t)o->rounds * b.n ||
        s1.hits - s0.hits != (uint64_t)o->rounds * b.n)
        die("the tier's counters", "puts stored or hits differ from the objects of the rounds");
    kvs_redis_stats_t d = s1;
    d.failures -= s0.failures, d.timeouts -= s0.timeouts, d.reconnects -= s0.reconnects;
    d.protocol_errors -= s0.protocol_errors;
    print_pair(t, o, &b, 0, get, tcp, down, up, rb_get, rb.get, rb.get_bps, rb.tried, &d);
    print_pair(t, o, &b, 1, put, tcp, down, up, rb_set, rb.set, rb.set_bps, rb.tried, &d);
    tier_remove(t, &b);
    free(all);
    objects_free(&b);
}

static void bench_mode(const options *o, int cluster) {
    uint64_t largest = 0;
    for (uint32_t i = 0; i < o->n_sizes; i++)
        largest = o->sizes[i] > largest ? o->sizes[i] : largest;
    tier t;
    tier_open(&t, o, cluster, largest);
    for (uint32_t i = 0; i < o->n_sizes; i++) bench_size(&t, o, o->sizes[i]);
    t.ops->destroy(t.state);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--tcp-peer")) return kvs_tcp_peer_main(argv[2]);
    options o = parse_options(argc, argv);
    if (!o.standalone && !o.cluster[0]) {
        printf("kvs-bench-redis: skipped, no servers given: bench/redis.sh starts them and runs "
               "this program\n");
        return 77;
    }
    ssize_t len = readlink("/proc/self/exe", self_bin, sizeof self_bin - 1);
    if (len <= 0) die("/proc/self/exe", strerror(errno));
    self_bin[len] = '\0';
    printf("# kvs-bench-redis: %u rounds of %llu MiB per object size, get_many of %u keys, "
           "timeout_ms %s; this client, the redis-server processes, the TCP peer and "
           "redis-benchmark share %ld CPUs\n",
           o.rounds, (unsigned long long)(o.round_bytes / MIB), o.batch, o.timeout_ms,
           sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
    if (o.standalone) bench_mode(&o, 0);
    if (o.cluster[0]) bench_mode(&o, 1);
    return 0;
}
