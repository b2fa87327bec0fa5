/* kvstrata check CONFIG: the YAML validated as the connector validates it, then each tier looked at
 * on this machine as an engine would open it - without creating what the engine would create at its
 * first start (a shared memory object, an SSD data file): tiers that exist or live elsewhere (Redis,
 * kvstrata-nodes, plugins, peers) are opened; for the others the room they will need is checked. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/dram/dram.h"
#include "backends/ssd/ssd_inspect.h"
#include "cli_util.h"
#include "common/errno_name.h"
#include "common/log.h"
#include "common/units.h"
#include "kvstrata_cmd.h"

#define MAX_PROBLEMS 64

typedef struct tier_report {
    char state[16];   /* "ok", "in use", "problem", "not opened" */
    char detail[768]; /* what was found */
} tier_report;

typedef struct check_run {
    const kvs_server_config *config;
    const kvs_server_settings *cfg; /* its settings: tiers, options */
    uint64_t max_object_bytes;
    int32_t rank;
    tier_report *tiers;
    char problems[MAX_PROBLEMS][1024];
    uint32_t n_problems;
} check_run;

static void problem(check_run *r, size_t tier, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A problem of tier `tier` at what `key` names, in the loader's "file:line:column: key" form. */
static void problem(check_run *r, size_t tier, const char *key, const char *fmt, ...) {
    char sentence[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sentence, sizeof sentence, fmt, ap);
    va_end(ap);
    if (r->n_problems < MAX_PROBLEMS)
        kvs_server_config_refuse(r->config, (uint32_t)tier, key, r->problems[r->n_problems++], 1024,
                                 sentence);
    snprintf(r->tiers[tier].state, sizeof r->tiers[tier].state, "problem");
}

static void detail(tier_report *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void detail(tier_report *t, const char *fmt, ...) {
    size_t n = strlen(t->detail);
    if (n + 3 >= sizeof t->detail) return;
    if (n) {
        memcpy(t->detail + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->detail + n, sizeof t->detail - n, fmt, ap);
    va_end(ap);
}

static const char *bytes(char *buf, size_t len, uint64_t v) {
    return kvs_fmt_bytes(buf, len, v);
}

/* A dram tier: a shared one that exists is read in place (and its geometry compared with the
 * file's); otherwise the memory it will take is compared with what the machine has. */
static void check_dram(check_run *r, size_t i) {
    const kvs_server_tier *tc = &r->cfg->tiers[i];
    tier_report *t = &r->tiers[i];
    char a[32], b[32], c[32];
    const char *shm = cli_tier_option(tc, "shm_name", -1);
    if (shm) {
        kvs_dram_peek_info info;
        char err[512];
        kvs_status st = kvs_dram_peek(shm, &info, err, sizeof err);
        if (st == KVS_OK) {
            detail(t, "shared \"/%s\" exists: %llu objects, %s of %s, attached by %u process(es)",
                   shm, (unsigned long long)info.objects, bytes(a, sizeof a, info.bytes),
                   bytes(b, sizeof b, info.capacity_bytes), info.attached_alive);
            /* The file's capacity must give the same number of slabs of the size in use. */
            if (tc->capacity_bytes / info.slab_bytes != info.slabs)
                problem(r, i, "capacity",
                        "shared memory \"/%s\" holds %llu slabs of %s (%s); this capacity makes "
                        "%llu of them: every process must give the same capacity",
                        shm, (unsigned long long)info.slabs, bytes(a, sizeof a, info.slab_bytes),
                        bytes(b, sizeof b, info.capacity_bytes),
                        (unsigned long long)(tc->capacity_bytes / info.slab_bytes));
            snprintf(t->state, sizeof t->state, "%s",
                     r->tiers[i].state[0] ? r->tiers[i].state : "in use");
            return;
        }
        if (st != KVS_ENOTFOUND) {
            problem(r, i, "shm_name", "%s", err);
            return;
        }
        uint64_t free_shm = 0;
        if (cli_free_bytes("/dev/shm", &free_shm) == 0) {
            detail(t, "shared \"/%s\" not created yet; /dev/shm has %s free", shm,
                   bytes(a, sizeof a, free_shm));
            if (free_shm < tc->capacity_bytes)
                problem(r, i, "capacity",
                        "/dev/shm has %s free: the first process to open this tier cannot "
                        "reserve its %s (mount /dev/shm larger or lower the capacity)",
                        bytes(a, sizeof a, free_shm), bytes(b, sizeof b, tc->capacity_bytes));
        }
    } else {
        detail(t, "private to each process that opens it");
    }
    uint64_t avail = cli_mem_available();
    if (avail) {
        detail(t, "%s of memory available", bytes(c, sizeof c, avail));
        if (avail < tc->capacity_bytes)
            problem(r, i, "capacity",
                    "the machine has %s of memory available; this tier asks for %s%s",
                    bytes(a, sizeof a, avail), bytes(b, sizeof b, tc->capacity_bytes),
                    shm ? "" : " in each process that opens it");
    }
    if (!r->tiers[i].state[0]) snprintf(t->state, sizeof t->state, "ok");
}

/* Path k of ssd tier i, dir ({rank} already replaced), whose share of the capacity is share: a
 * writable directory with room for it; a data file there is probed for a running owner. */
static void check_ssd_path(check_run *r, size_t i, uint32_t k, const char *dir, uint64_t share,
                           uint32_t *in_use) {
    const kvs_server_tier *tc = &r->cfg->tiers[i];
    tier_report *t = &r->tiers[i];
    char a[32], b[32], key[32], name[256];
    snprintf(key, sizeof key, "path[%u]", k);
    struct stat sb;
    char file[KVS_SERVER_PATH_MAX + 300];
    kvs_ssd_data_file_name(tc->name, name, sizeof name);
    snprintf(file, sizeof file, "%s/%s", dir, name);
    uint64_t existing = 0;
    if (stat(dir, &sb) != 0) {
        problem(r, i, key, "%s cannot be used (%s): the tier does not create its directories", dir,
                kvs_errno_name(errno));
        return;
    } else if (!S_ISDIR(sb.st_mode)) {
        problem(r, i, key, "%s is not a directory", dir);
        return;
    } else if (access(dir, W_OK | X_OK) != 0) {
        problem(r, i, key, "%s is not writable by this user (%s)", dir, kvs_errno_name(errno));
        return;
    } else if (stat(file, &sb) == 0) {
        existing = (uint64_t)sb.st_size;
        int used = cli_file_locked(file);
        *in_use += used == 1;
        detail(t, "%s: data file of %s%s", dir, bytes(a, sizeof a, existing),
               used == 1 ? ", open in a running process" : "");
    }
    uint64_t free_bytes = 0;
    if (cli_free_bytes(dir, &free_bytes) != 0) {
        problem(r, i, key, "cannot tell the free space of %s (%s)", dir, kvs_errno_name(errno));
        return;
    }
    if (free_bytes + existing < share)
        problem(r, i, key,
                "%s has %s free; this path's share of the capacity is %s (the tier marks "
                "the path full at its first ENOSPC and serves less)",
                dir, bytes(a, sizeof a, free_bytes + existing), bytes(b, sizeof b, share));
    else
        detail(t, "%s: %s free for a share of %s", dir, bytes(a, sizeof a, free_bytes),
               bytes(b, sizeof b, share));
}

/* An ssd tier: each path a writable directory (or one that can be made) with room for its share;
 * data files that exist are probed for a running owner, never opened for writing. Paths are read
 * as the tier of --rank reads them ({rank} replaced). */
static void check_ssd(check_run *r, size_t i) {
    const kvs_server_tier *tc = &r->cfg->tiers[i];
    tier_report *t = &r->tiers[i];
    uint32_t n = cli_tier_list_count(tc, "path");
    uint64_t share = n ? tc->capacity_bytes / n : 0;
    uint32_t in_use = 0;
    for (uint32_t k = 0; k < n; k++) {
        char *dir = cli_with_rank(cli_tier_option(tc, "path", (int)k), r->rank);
        if (!dir) {
            problem(r, i, "path", "out of memory");
            break;
        }
        check_ssd_path(r, i, k, dir, share, &in_use);
        free(dir);
    }
    if (!t->state[0]) snprintf(t->state, sizeof t->state, in_use ? "in use" : "ok");
}

/* A tier that opens with its servers down (redis, remote) serves misses until they come back: at
 * check time that is a problem. */
static void unreachable(check_run *r, size_t i, kvs_server_tiers *chain) {
    uint32_t all = 0, down = cli_servers_down(&r->cfg->tiers[i], chain, &all);
    if (down)
        problem(r, i, "nodes", "%u of %u servers cannot be reached now (their keys are misses): %s",
                down, all, kvs_server_tiers_last_error(chain, 0));
}

/* Any other tier is opened alone, through the chain the connector uses, and closed again. */
static void check_open(check_run *r, size_t i) {
    tier_report *t = &r->tiers[i];
    kvs_server_tiers *chain = NULL;
    char err[1024] = "";
    kvs_status st =
        cli_open_tier(r->config, i, r->max_object_bytes, r->rank, &chain, err, sizeof err);
    if (st != KVS_OK) {
        /* The loader's position is the one-tier copy's: the same entry, the same lines. */
        if (r->n_problems < MAX_PROBLEMS) snprintf(r->problems[r->n_problems++], 1024, "%s", err);
        snprintf(t->state, sizeof t->state, "problem");
        return;
    }
    if (kvs_server_tiers_degraded(chain, 0)[0]) {
        problem(r, i, "", "cannot open here (an engine would serve it empty): %s",
                kvs_server_tiers_degraded(chain, 0));
    } else {
        const kvs_backend_ops *ops = kvs_server_tiers_ops(chain, 0);
        uint64_t objects = 0, used = 0;
        char a[32];
        unreachable(r, i, chain);
        if (t->state[0])
            detail(t, "opened, servers down");
        else if (KVS_HAS_OP(ops, usage) &&
                 ops->usage(kvs_server_tiers_state(chain, 0), &objects, &used) == KVS_OK)
            detail(t, "opened: %llu objects, %s", (unsigned long long)objects,
                   bytes(a, sizeof a, used));
        else
            detail(t, "opened");
        if (!t->state[0]) snprintf(t->state, sizeof t->state, "ok");
    }
    kvs_server_tiers_close(chain);
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: kvstrata check CONFIG [--json] [--max-object-bytes SIZE] [--rank N]\n"
            "  Validates CONFIG as the connector does, then looks at each tier on this machine:\n"
            "  shared DRAM tiers and SSD data files that exist are read in place (never created,\n"
            "  never opened for writing); Redis, kvstrata-node, peer and plugin tiers are opened\n"
            "  and closed; the room each tier will need (memory, /dev/shm, disk) is compared\n"
            "  with what the machine has. Every problem is printed with its file:line:column.\n"
            "  --json                one JSON document\n"
            "  --max-object-bytes S  the largest object the engine saves (default 16MiB): the\n"
            "                        size tiers that are opened are opened for\n"
            "  --rank N              the tensor-parallel rank {rank} stands for (default 0)\n"
            "Exit status: 0 nothing to fix, 1 problems found, 2 usage.\n");
}

static void print_text(const check_run *r) {
    const kvs_server_settings *cfg = r->cfg;
    printf("%s: version %u, chunks of %u tokens, %u tier%s\n", cfg->source, cfg->version,
           cfg->chunk_tokens, cfg->n_tiers, cfg->n_tiers == 1 ? "" : "s");
    for (size_t i = 0; i < cfg->n_tiers; i++) {
        const kvs_server_tier *tc = &cfg->tiers[i];
        char cap[32] = "-";
        if (tc->capacity_bytes) kvs_fmt_bytes(cap, sizeof cap, tc->capacity_bytes);
        printf("  %zu %-12s %-8s %-8s %-10s %s\n", i, tc->name, tc->type, cap, r->tiers[i].state,
               r->tiers[i].detail);
    }
    if (r->n_problems == 0) {
        printf("no problems\n");
        return;
    }
    printf("%u problem%s:\n", r->n_problems, r->n_problems == 1 ? "" : "s");
    for (uint32_t k = 0; k < r->n_problems; k++) printf("  %s\n", r->problems[k]);
}

static void print_json(const check_run *r) {
    const kvs_server_settings *cfg = r->cfg;
    printf("{\"config\":");
    cli_json_string(stdout, cfg->source);
    printf(",\"chunk_tokens\":%u,\"tiers\":[", cfg->chunk_tokens);
    for (size_t i = 0; i < cfg->n_tiers; i++) {
        const kvs_server_tier *tc = &cfg->tiers[i];
        printf("%s{\"name\":", i ? "," : "");
        cli_json_string(stdout, tc->name);
        printf(",\"type\":");
        cli_json_string(stdout, tc->type);
        printf(",\"capacity_bytes\":%llu,\"state\":", (unsigned long long)tc->capacity_bytes);
        cli_json_string(stdout, r->tiers[i].state);
        printf(",\"detail\":");
        cli_json_string(stdout, r->tiers[i].detail);
        printf("}");
    }
    printf("],\"problems\":[");
    for (uint32_t k = 0; k < r->n_problems; k++) {
        if (k) printf(",");
        cli_json_string(stdout, r->problems[k]);
    }
    printf("]}\n");
}

int kvs_cmd_check(int argc, char **argv) {
    static const struct option longs[] = {{"json", no_argument, NULL, 'j'},
                                          {"max-object-bytes", required_argument, NULL, 'm'},
                                          {"rank", required_argument, NULL, 'r'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    int json = 0, opt;
    check_run r = {.max_object_bytes = 16ull << 20, .rank = 0};
    char why[256];
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (opt) {
            case 'j': json = 1; break;
            case 'm':
                if (kvs_units_parse_size(optarg, &r.max_object_bytes, why, sizeof why) != KVS_OK ||
                    r.max_object_bytes == 0) {
                    fprintf(stderr, "kvstrata check: --max-object-bytes %s: %s\n", optarg, why);
                    return 2;
                }
                break;
            case 'r': r.rank = atoi(optarg); break;
            case 'h': usage(stdout); return 0;
            default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    kvs_server_config *config = NULL;
    char err[1024];
    if (kvs_server_config_load(argv[optind], &config, err, sizeof err) != KVS_OK) {
        if (json) {
            printf("{\"config\":");
            cli_json_string(stdout, argv[optind]);
            printf(",\"tiers\":[],\"problems\":[");
            cli_json_string(stdout, err);
            printf("]}\n");
        } else {
            printf("1 problem:\n  %s\n", err);
        }
        return 1;
    }
    const kvs_server_settings *cfg = kvs_server_config_settings(config);
    r.config = config;
    r.cfg = cfg;
    r.tiers = calloc(cfg->n_tiers, sizeof *r.tiers);
    if (!r.tiers) {
        kvs_server_config_free(config);
        fprintf(stderr, "kvstrata check: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < cfg->n_tiers; i++) {
        const char *type = cfg->tiers[i].type;
        if (!strcmp(type, "dram"))
            check_dram(&r, i);
        else if (!strcmp(type, "ssd"))
            check_ssd(&r, i);
        else if (!strcmp(type, "compress")) {
            snprintf(r.tiers[i].state, sizeof r.tiers[i].state, "not opened");
            detail(&r.tiers[i], "its codecs are set up from the engine's KV layout when it opens");
        } else
            check_open(&r, i);
    }
    if (json)
        print_json(&r);
    else
        print_text(&r);
    int rc = r.n_problems ? 1 : 0;
    free(r.tiers);
    kvs_server_config_free(config);
    return rc;
}
