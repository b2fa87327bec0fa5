/* kvstrata stats CONFIG|ENDPOINT: per tier what it holds and what it served. Two sources, merged
 * by tier name: the counters the deployment's processes publish (the Prometheus text its metrics
 * endpoint serves, read from its shared segment for a CONFIG or over HTTP for an ENDPOINT), and,
 * for a CONFIG, each tier's contents read in place (a shared DRAM tier's header, an SSD tier's unit
 * headers, a Redis or kvstrata-node tier's usage). */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/dram/dram.h"
#include "backends/ssd/ssd_inspect.h"
#include "cli_util.h"
#include "common/log.h"
#include "http_get.h"
#include "kvstrata_cmd.h"
#include "prom_text.h"

#define MAX_ROWS    64
#define MAX_TENANTS 32
#define MAX_NODE    2048 /* a node's samples: its own, and ~10 per tenant row (64 + other) */

typedef struct tier_row {
    char name[96]; /* the tier's name; "<name> (node)" for a kvstrata-node's */
    char type[64];
    int have_contents;               /* objects/bytes known */
    double objects, bytes, capacity; /* gauges */
    double hits, hit_tokens, loaded_bytes, load_seconds;
    double hit_rate; /* kvstrata_tier_hit_rate as published; NAN when not */
    char note[256];  /* where the contents came from, or why they are not known */
} tier_row;

/* A tenant's counters, by index (TC_*); the metric each comes from and its JSON key below. */
enum {
    TC_LOOKUP_TOKENS,
    TC_HIT_TOKENS,
    TC_GETS,
    TC_GET_MISSES,
    TC_SAVES,
    TC_SAVED_BYTES,
    TC_SAVE_SECONDS,
    TC_SAVES_SKIPPED,
    TC_EVICTIONS,
    TC_ERR_LOAD,
    TC_ERR_INTEGRITY,
    TC_ERR_CORRUPT,
    TC_ERR_PUT_FAILED,
    TC_COUNT
};
static const struct {
    const char *metric; /* the sample's name (kvstrata_errors_total: with kind) */
    const char *kind;
    const char *json;
} tenant_fields[TC_COUNT] = {
    [TC_LOOKUP_TOKENS] = {"kvstrata_lookup_tokens_total", NULL, "lookup_tokens"},
    [TC_HIT_TOKENS] = {"kvstrata_hit_tokens_total", NULL, "hit_tokens"},
    [TC_GETS] = {"kvstrata_gets_total", NULL, "gets"},
    [TC_GET_MISSES] = {"kvstrata_get_misses_total", NULL, "get_misses"},
    [TC_SAVES] = {"kvstrata_saves_total", NULL, "saves"},
    [TC_SAVED_BYTES] = {"kvstrata_saved_bytes_total", NULL, "saved_bytes"},
    [TC_SAVE_SECONDS] = {"kvstrata_save_seconds_total", NULL, "save_seconds"},
    [TC_SAVES_SKIPPED] = {"kvstrata_saves_skipped_total", NULL, "saves_skipped"},
    [TC_EVICTIONS] = {"kvstrata_evictions_total", NULL, "evictions"},
    [TC_ERR_LOAD] = {"kvstrata_errors_total", "load", "load_errors"},
    [TC_ERR_INTEGRITY] = {"kvstrata_errors_total", "integrity", "integrity_errors"},
    [TC_ERR_CORRUPT] = {"kvstrata_errors_total", "corrupt", "corrupt"},
    [TC_ERR_PUT_FAILED] = {"kvstrata_errors_total", "put_failed", "failed_puts"},
};

typedef struct tenant_row {
    char name[KVS_SERVER_TENANT_MAX + 1]; /* "" : no tenant */
    double c[TC_COUNT];
} tenant_row;

typedef struct node_value {
    char name[PROM_NAME_MAX];
    char tenant[KVS_SERVER_TENANT_MAX + 1];
    double value;
} node_value;

typedef struct view {
    tier_row tiers[MAX_ROWS];
    uint32_t n_tiers;
    tenant_row tenants[MAX_TENANTS];
    uint32_t n_tenants;
    node_value node[MAX_NODE];
    uint32_t n_node, node_dropped; /* samples past MAX_NODE: counted, said */
    double processes;
    int have_counters; /* some process published counters */
    char counters_note[512];
    double when; /* seconds, CLOCK_MONOTONIC */
} view;

static tier_row *tier_of(view *v, const char *name) {
    for (uint32_t i = 0; i < v->n_tiers; i++)
        if (!strcmp(v->tiers[i].name, name)) return &v->tiers[i];
    if (v->n_tiers == MAX_ROWS) return NULL;
    tier_row *t = &v->tiers[v->n_tiers++];
    memset(t, 0, sizeof *t);
    t->hit_rate = NAN;
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

static tenant_row *tenant_of(view *v, const char *name) {
    name = name ? name : "";
    for (uint32_t i = 0; i < v->n_tenants; i++)
        if (!strcmp(v->tenants[i].name, name)) return &v->tenants[i];
    if (v->n_tenants == MAX_TENANTS) return NULL;
    tenant_row *t = &v->tenants[v->n_tenants++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

/* One sample of the metrics text into the view; names as docs/operations.md lists them. */
static void take_sample(void *ctx, const prom_sample *s) {
    view *v = ctx;
    const char *tier = prom_label(s, "tier"), *tenant = prom_label(s, "tenant");
    double x = isfinite(s->value) ? s->value : 0.0;
    if (!strncmp(s->name, "kvstrata_tier_", 14) && tier) {
        /* a kvstrata-node's tiers (role="node") are rows of their own, never merged with an
         * engine's tier of the same name */
        const char *role = prom_label(s, "role");
        char row[96];
        if (role && !strcmp(role, "node"))
            snprintf(row, sizeof row, "%s (node)", tier);
        else
            snprintf(row, sizeof row, "%s", tier);
        tier_row *t = tier_of(v, row);
        if (!t) return;
        const char *m = s->name + 14;
        v->have_counters = 1;
        if (!strcmp(m, "objects")) {
            t->objects = x;
            t->have_contents = 1;
        } else if (!strcmp(m, "bytes")) {
            t->bytes = x;
        } else if (!strcmp(m, "capacity_bytes")) {
            t->capacity = x;
        } else if (!strcmp(m, "hits_total")) {
            t->hits += x;
        } else if (!strcmp(m, "hit_tokens_total")) {
            t->hit_tokens += x;
        } else if (!strcmp(m, "loaded_bytes_total")) {
            t->loaded_bytes += x;
        } else if (!strcmp(m, "load_seconds_total")) {
            t->load_seconds += x;
        } else if (!strcmp(m, "hit_rate")) {
            t->hit_rate = s->value;
        }
        return;
    }
    if (!strncmp(s->name, "kvstrata_node_", 14)) {
        if (v->n_node == MAX_NODE) {
            v->node_dropped++;
            return;
        }
        node_value *n = &v->node[v->n_node++];
        snprintf(n->name, sizeof n->name, "%s", s->name + 14);
        snprintf(n->tenant, sizeof n->tenant, "%s", tenant ? tenant : "");
        n->value = x;
        v->have_counters = 1;
        return;
    }
    if (!strcmp(s->name, "kvstrata_processes")) {
        v->processes = x;
        return;
    }
    const char *kind = prom_label(s, "kind");
    for (int i = 0; i < TC_COUNT; i++) {
        if (strcmp(s->name, tenant_fields[i].metric) != 0) continue;
        if (tenant_fields[i].kind && (!kind || strcmp(kind, tenant_fields[i].kind) != 0)) continue;
        tenant_row *t = tenant_of(v, tenant);
        if (!t) return;
        t->c[i] += x;
        v->have_counters = 1;
        return;
    }
}

static int take_text(view *v, const char *text, size_t len, const char *source) {
    char err[256];
    if (prom_parse(text, len, take_sample, v, err, sizeof err) != 0) {
        snprintf(v->counters_note, sizeof v->counters_note, "%s is not Prometheus text (%s)",
                 source, err);
        return -1;
    }
    return 0;
}

/* The figures of the last scan of each ssd tier, kept while its data files are unchanged (size and
 * mtime), so --watch reads the headers of a tier nobody writes once. */
static struct ssd_scan_cache {
    uint64_t stamp;
    int valid;
    double objects, bytes, capacity, damaged;
} ssd_cache[MAX_ROWS];

/* An ssd tier's files as they stand: 1 when a running tier holds one (*in_use), the sum of their
 * sizes and mtimes in *stamp. */
static void ssd_files(const kvs_server_tier *tc, char *const *paths, uint32_t n, int *in_use,
                      uint64_t *stamp) {
    char base[300], file[KVS_SERVER_PATH_MAX + 320];
    kvs_ssd_data_file_name(tc->name, base, sizeof base);
    *in_use = 0;
    *stamp = 0;
    for (uint32_t k = 0; k < n; k++) {
        snprintf(file, sizeof file, "%s/%s", paths[k], base);
        struct stat sb;
        if (stat(file, &sb) != 0) continue;
        *stamp += (uint64_t)sb.st_size + (uint64_t)sb.st_mtim.tv_sec * 1000000000ull +
                  (uint64_t)sb.st_mtim.tv_nsec;
        *in_use |= cli_file_locked(file) == 1;
    }
}

/* An ssd tier's contents. A tier a running process holds is described by the figures that process
 * publishes: reading every unit header (one read per slot, through the page cache) competes with
 * its loads, so it is done only on request (--scan). */
static void ssd_contents(tier_row *t, const kvs_server_tier *tc, char *const *paths, uint32_t n,
                         int paths_ok, int scan, size_t row) {
    int in_use = 0;
    uint64_t stamp = 0;
    char err[512] = "";
    if (!paths_ok) {
        snprintf(t->note, sizeof t->note, "out of memory");
        return;
    }
    ssd_files(tc, paths, n, &in_use, &stamp);
    if (in_use && !scan) {
        snprintf(t->note, sizeof t->note, "%s",
                 t->have_contents ? "open in a running process: the figures it publishes"
                                  : "open in a running process that publishes no metrics; --scan "
                                    "reads its unit headers (one read per slot)");
        return;
    }
    struct ssd_scan_cache *c = row < MAX_ROWS ? &ssd_cache[row] : NULL;
    if (c && c->valid && !in_use && c->stamp == stamp) {
        t->objects = c->objects;
        t->bytes = c->bytes;
        if (c->capacity > 0) t->capacity = c->capacity;
        t->have_contents = 1;
        snprintf(t->note, sizeof t->note, "read from %u path(s), unchanged since%s", n,
                 c->damaged > 0 ? "; damage seen: run kvstrata inspect ssd --verify" : "");
        return;
    }
    /* this tier's files only (other tiers may share the directories) */
    kvs_ssd_inspect_options opt = {.mode = KVS_SSD_INSPECT_QUICK, .tier = tc->name};
    kvs_ssd_inspect_report *rep = calloc(1, sizeof *rep);
    kvs_status st =
        rep ? kvs_ssd_inspect_run((const char *const *)paths, n, &opt, rep, err, sizeof err)
            : KVS_ENOMEM;
    if (st == KVS_OK) {
        t->objects = (double)rep->objects;
        t->bytes = (double)rep->bytes;
        if (rep->capacity) t->capacity = (double)rep->capacity;
        t->have_contents = 1;
        snprintf(t->note, sizeof t->note, "read from %u path(s)%s%s", n,
                 rep->in_use ? ", open in a running process" : "",
                 rep->damaged ? "; damage seen: run kvstrata inspect ssd --verify" : "");
        if (c)
            *c = (struct ssd_scan_cache){stamp,    1,           t->objects,
                                         t->bytes, t->capacity, (double)rep->damaged};
    } else if (st == KVS_ENOTFOUND) {
        t->objects = t->bytes = 0; /* the tier writes its data files at its first open */
        t->have_contents = 1;
        snprintf(t->note, sizeof t->note, "no data file yet: %s", err);
    } else {
        snprintf(t->note, sizeof t->note, "%s", err);
    }
    free(rep);
}

/* Tier i's contents read in place, its paths as the tier of rank reads them ({rank} replaced). */
static void contents_of(view *v, const kvs_server_config *config, size_t i, int32_t rank,
                        int scan) {
    const kvs_server_tier *tc = &kvs_server_config_settings(config)->tiers[i];
    tier_row *t = tier_of(v, tc->name);
    if (!t) return;
    snprintf(t->type, sizeof t->type, "%s", tc->type);
    if (tc->capacity_bytes) t->capacity = (double)tc->capacity_bytes;
    char err[512] = "";
    if (!strcmp(tc->type, "dram")) {
        const char *shm = cli_tier_option(tc, "shm_name", -1);
        kvs_dram_peek_info info;
        kvs_status st;
        if (!shm) {
            snprintf(t->note, sizeof t->note, "private to each process%s",
                     t->have_contents ? " (figures: the processes' own)" : "");
        } else if ((st = kvs_dram_peek(shm, &info, err, sizeof err)) == KVS_OK) {
            t->objects = (double)info.objects;
            t->bytes = (double)info.bytes;
            t->capacity = (double)info.capacity_bytes;
            t->have_contents = 1;
            snprintf(t->note, sizeof t->note, "shared \"/%s\", %u process(es) attached", shm,
                     info.attached_alive);
        } else if (st == KVS_ENOTFOUND) {
            /* the last process to detach unlinks it: it holds nothing now */
            t->objects = t->bytes = 0;
            t->have_contents = 1;
            snprintf(t->note, sizeof t->note, "%s", err);
        } else {
            snprintf(t->note, sizeof t->note, "%s", err);
        }
    } else if (!strcmp(tc->type, "ssd")) {
        char *paths[KVS_SERVER_MAX_OPTIONS];
        uint32_t n = 0;
        int ok = cli_tier_paths(tc, rank, paths, KVS_SERVER_MAX_OPTIONS, &n) == 0;
        ssd_contents(t, tc, paths, n, ok, scan, i);
        cli_free_paths(paths, n);
    } else if (!strcmp(tc->type, "redis") || !strcmp(tc->type, "remote")) {
        kvs_server_tiers *chain = NULL;
        if (cli_open_tier(config, i, 16ull << 20, rank, &chain, err, sizeof err) != KVS_OK) {
            snprintf(t->note, sizeof t->note, "%s", err);
            return;
        }
        const kvs_backend_ops *ops = kvs_server_tiers_ops(chain, 0);
        uint64_t objects = 0, used = 0;
        uint32_t all = 0, down = cli_servers_down(tc, chain, &all);
        if (down)
            snprintf(t->note, sizeof t->note, "%u of %u servers cannot be reached: %s", down, all,
                     kvs_server_tiers_last_error(chain, 0));
        else if (!kvs_server_tiers_degraded(chain, 0)[0] && KVS_HAS_OP(ops, usage) &&
                 ops->usage(kvs_server_tiers_state(chain, 0), &objects, &used) == KVS_OK) {
            t->objects = (double)objects;
            t->bytes = (double)used;
            t->have_contents = 1;
            snprintf(t->note, sizeof t->note, "asked its servers (every tenant's objects)");
        } else {
            snprintf(t->note, sizeof t->note, "its servers cannot say: %s",
                     kvs_server_tiers_degraded(chain, 0)[0]
                         ? kvs_server_tiers_degraded(chain, 0)
                         : kvs_server_tiers_last_error(chain, 0));
        }
        kvs_server_tiers_close(chain);
    } else if (!t->have_contents) {
        snprintf(t->note, sizeof t->note, "held inside the processes that open it");
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Fill v from target (a config file or an endpoint). 0, or -1 when nothing could be read. */
static int gather(view *v, const char *target, const kvs_server_config *config, int timeout_ms,
                  int32_t rank, int scan) {
    memset(v, 0, sizeof *v);
    v->when = now_s();
    char err[1024] = "";
    char *text = NULL;
    size_t len = 0;
    if (!config) {
        if (http_get(target, timeout_ms, &text, &len, err, sizeof err) != 0) {
            fprintf(stderr, "kvstrata stats: %s\n", err);
            return -1;
        }
        int rc = take_text(v, text, len, target);
        free(text);
        if (rc != 0) fprintf(stderr, "kvstrata stats: %s\n", v->counters_note);
        return rc;
    }
    /* Tiers in the file's order first, so the table reads top to bottom like the chain. */
    const kvs_server_settings *cfg = kvs_server_config_settings(config);
    for (size_t i = 0; i < cfg->n_tiers; i++) tier_of(v, cfg->tiers[i].name);
    kvs_status st = kvs_server_metrics_render(config, &text, &len, err, sizeof err);
    if (st == KVS_OK) {
        take_text(v, text, len, "the metrics segment");
        free(text);
    } else {
        snprintf(v->counters_note, sizeof v->counters_note, "no counters: %s", err);
    }
    for (size_t i = 0; i < cfg->n_tiers; i++) contents_of(v, config, i, rank, scan);
    return 0;
}

/* counter TC_* summed over the tenants */
static double sum_of(const view *v, int field) {
    double s = 0;
    for (uint32_t i = 0; i < v->n_tenants; i++) s += v->tenants[i].c[field];
    return s;
}

static double ratio(double a, double b) {
    return b > 0 ? a / b : NAN;
}

/* A tier's hit rate: as the instance computes it (its tokens and store hits over tokens and gets
 * asked), else from the counters: tokens it served over tokens asked (connector users), or
 * objects it served over gets (store users). */
static double tier_hit_rate(const view *v, const tier_row *t) {
    if (!isnan(t->hit_rate)) return t->hit_rate;
    double asked = sum_of(v, TC_LOOKUP_TOKENS);
    if (asked > 0) return t->hit_tokens / asked;
    return ratio(t->hits, sum_of(v, TC_GETS));
}

static const char *num(char *buf, size_t len, double x) {
    if (isnan(x))
        snprintf(buf, len, "-");
    else if (x >= 1e12)
        snprintf(buf, len, "%.2fT", x / 1e12);
    else if (x >= 1e9)
        snprintf(buf, len, "%.2fG", x / 1e9);
    else if (x >= 1e6)
        snprintf(buf, len, "%.2fM", x / 1e6);
    else
        snprintf(buf, len, "%.0f", x);
    return buf;
}

static const char *size_of(char *buf, size_t len, double x, int known) {
    if (!known || isnan(x)) return snprintf(buf, len, "-"), buf;
    return kvs_fmt_bytes(buf, len, (unsigned long long)x);
}

static const char *pct(char *buf, size_t len, double x) {
    if (isnan(x)) return snprintf(buf, len, "-"), buf;
    snprintf(buf, len, "%.1f%%", 100.0 * x);
    return buf;
}

/* A node's own counters on one line; its per-tenant ones as a table (a column per counter). */
static void print_node(const view *v) {
    char a[32];
    int shown = 0;
    printf("node:");
    for (uint32_t i = 0; i < v->n_node; i++) {
        const node_value *n = &v->node[i];
        if (n->tenant[0]) continue;
        printf("%s %s=%s", shown && shown % 6 == 0 ? "\n     " : "", n->name,
               num(a, sizeof a, n->value));
        shown++;
    }
    printf("\n");
    const char *cols[12];
    int n_cols = 0;
    for (uint32_t i = 0; i < v->n_node && n_cols < 12; i++) {
        const node_value *n = &v->node[i];
        int known = !n->tenant[0];
        for (int c = 0; c < n_cols && !known; c++) known = !strcmp(cols[c], n->name);
        if (!known) cols[n_cols++] = n->name;
    }
    if (n_cols) {
        printf("%-16s", "node tenant");
        for (int c = 0; c < n_cols; c++) {
            size_t len = strlen(cols[c]);
            /* "hits_total" -> "hits" */
            printf(" %12.*s",
                   (int)(len > 6 && !strcmp(cols[c] + len - 6, "_total") ? len - 6 : len), cols[c]);
        }
        printf("\n");
        for (uint32_t i = 0; i < v->n_node; i++) {
            const char *tenant = v->node[i].tenant;
            int first = tenant[0] != '\0';
            for (uint32_t j = 0; j < i && first; j++)
                first = strcmp(v->node[j].tenant, tenant) != 0;
            if (!first) continue;
            printf("%-16s", tenant);
            for (int c = 0; c < n_cols; c++) {
                double x = NAN;
                for (uint32_t j = i; j < v->n_node; j++)
                    if (!strcmp(v->node[j].tenant, tenant) && !strcmp(v->node[j].name, cols[c]))
                        x = v->node[j].value;
                printf(" %12s", num(a, sizeof a, x));
            }
            printf("\n");
        }
    }
    if (v->node_dropped) printf("(%u more node samples not shown)\n", v->node_dropped);
}

static void print_text(const view *v, const view *prev, const char *target) {
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32];
    printf("%s", target);
    if (v->processes > 0) printf(" - %.0f process(es) publishing", v->processes);
    printf("\n%-14s %9s %10s %10s %9s %11s %8s %10s %9s %s\n", "tier", "objects", "bytes",
           "capacity", "hits", "hit tokens", "hit rate", "loaded", "load GB/s",
           prev ? "now GB/s" : "");
    for (uint32_t i = 0; i < v->n_tiers; i++) {
        const tier_row *t = &v->tiers[i];
        double gbps = t->load_seconds > 0 ? t->loaded_bytes / t->load_seconds / 1e9 : NAN;
        printf("%-14s %9s %10s %10s %9s %11s %8s %10s %9s", t->name,
               t->have_contents ? num(a, sizeof a, t->objects) : "-",
               size_of(b, sizeof b, t->bytes, t->have_contents),
               size_of(c, sizeof c, t->capacity, t->capacity > 0), num(d, sizeof d, t->hits),
               num(e, sizeof e, t->hit_tokens), pct(f, sizeof f, tier_hit_rate(v, t)),
               size_of(g, sizeof g, t->loaded_bytes, 1),
               isnan(gbps) ? "-" : (snprintf(h, sizeof h, "%.2f", gbps), h));
        if (prev && i < prev->n_tiers && v->when > prev->when)
            printf(" %.2f",
                   (t->loaded_bytes - prev->tiers[i].loaded_bytes) / (v->when - prev->when) / 1e9);
        if (t->note[0]) printf("   (%s)", t->note);
        printf("\n");
    }
    if (!v->have_counters) {
        printf("%s\n", v->counters_note[0] ? v->counters_note : "no counters published");
        return;
    }
    double asked = sum_of(v, TC_LOOKUP_TOKENS), hit = sum_of(v, TC_HIT_TOKENS);
    double gets = sum_of(v, TC_GETS), misses = sum_of(v, TC_GET_MISSES);
    if (asked > 0)
        printf("lookups: %s tokens asked, %s hit (%s)\n", num(a, sizeof a, asked),
               num(b, sizeof b, hit), pct(c, sizeof c, ratio(hit, asked)));
    if (gets > 0)
        printf("gets: %s, %s missed (hit rate %s)\n", num(a, sizeof a, gets),
               num(b, sizeof b, misses), pct(c, sizeof c, ratio(gets - misses, gets)));
    double saved = sum_of(v, TC_SAVED_BYTES), save_s = sum_of(v, TC_SAVE_SECONDS);
    printf("saves: %s (%s, %s GB/s), skipped %s; evictions %s\n",
           num(a, sizeof a, sum_of(v, TC_SAVES)), size_of(b, sizeof b, saved, 1),
           save_s > 0 ? (snprintf(c, sizeof c, "%.2f", saved / save_s / 1e9), c) : "-",
           num(d, sizeof d, sum_of(v, TC_SAVES_SKIPPED)),
           num(e, sizeof e, sum_of(v, TC_EVICTIONS)));
    printf("errors: load %s, integrity %s, corrupt %s, failed puts %s\n",
           num(a, sizeof a, sum_of(v, TC_ERR_LOAD)), num(b, sizeof b, sum_of(v, TC_ERR_INTEGRITY)),
           num(c, sizeof c, sum_of(v, TC_ERR_CORRUPT)),
           num(d, sizeof d, sum_of(v, TC_ERR_PUT_FAILED)));
    int named = 0;
    for (uint32_t i = 0; i < v->n_tenants; i++) named |= v->tenants[i].name[0] != '\0';
    if (named) {
        printf("%-16s %12s %12s %8s %10s %10s %8s\n", "tenant", "asked", "hit tokens", "rate",
               "gets", "misses", "saves");
        for (uint32_t i = 0; i < v->n_tenants; i++) {
            const tenant_row *t = &v->tenants[i];
            printf("%-16s %12s %12s %8s %10s %10s %8s\n", t->name[0] ? t->name : "(none)",
                   num(a, sizeof a, t->c[TC_LOOKUP_TOKENS]), num(b, sizeof b, t->c[TC_HIT_TOKENS]),
                   pct(c, sizeof c, ratio(t->c[TC_HIT_TOKENS], t->c[TC_LOOKUP_TOKENS])),
                   num(d, sizeof d, t->c[TC_GETS]), num(e, sizeof e, t->c[TC_GET_MISSES]),
                   num(f, sizeof f, t->c[TC_SAVES]));
        }
    }
    if (v->n_node) {
        print_node(v);
    }
}

static void json_number(double x) {
    if (isfinite(x))
        printf("%.17g", x);
    else
        printf("null");
}

static void print_json(const view *v, const char *target) {
    printf("{\"source\":");
    cli_json_string(stdout, target);
    printf(",\"processes\":");
    json_number(v->processes);
    printf(",\"counters\":%s,\"counters_note\":", v->have_counters ? "true" : "false");
    cli_json_string(stdout, v->counters_note);
    printf(",\"tiers\":[");
    for (uint32_t i = 0; i < v->n_tiers; i++) {
        const tier_row *t = &v->tiers[i];
        printf("%s{\"tier\":", i ? "," : "");
        cli_json_string(stdout, t->name);
        printf(",\"type\":");
        cli_json_string(stdout, t->type);
        printf(",\"objects\":");
        json_number(t->have_contents ? t->objects : NAN);
        printf(",\"bytes\":");
        json_number(t->have_contents ? t->bytes : NAN);
        printf(",\"capacity_bytes\":");
        json_number(t->capacity);
        printf(",\"hits\":");
        json_number(t->hits);
        printf(",\"hit_tokens\":");
        json_number(t->hit_tokens);
        printf(",\"hit_rate\":");
        json_number(tier_hit_rate(v, t));
        printf(",\"loaded_bytes\":");
        json_number(t->loaded_bytes);
        printf(",\"load_gbps\":");
        json_number(t->load_seconds > 0 ? t->loaded_bytes / t->load_seconds / 1e9 : NAN);
        printf(",\"note\":");
        cli_json_string(stdout, t->note);
        printf("}");
    }
    printf("],\"tenants\":[");
    for (uint32_t i = 0; i < v->n_tenants; i++) {
        const tenant_row *t = &v->tenants[i];
        printf("%s{\"tenant\":", i ? "," : "");
        cli_json_string(stdout, t->name);
        for (int k = 0; k < TC_COUNT; k++) {
            printf(",\"%s\":", tenant_fields[k].json);
            json_number(t->c[k]);
        }
        printf("}");
    }
    printf("],\"node\":[");
    for (uint32_t i = 0; i < v->n_node; i++) {
        printf("%s{\"name\":", i ? "," : "");
        cli_json_string(stdout, v->node[i].name);
        printf(",\"tenant\":");
        cli_json_string(stdout, v->node[i].tenant);
        printf(",\"value\":");
        json_number(v->node[i].value);
        printf("}");
    }
    printf("]}\n");
}

static volatile sig_atomic_t stop_watch;
static void on_interrupt(int sig) {
    (void)sig;
    stop_watch = 1;
}

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: kvstrata stats CONFIG|ENDPOINT [--json] [--watch [SECONDS]] [--count N]\n"
        "                      [--rank N] [--scan]\n"
        "  CONFIG    a deployment's YAML: its processes' counters from the metrics segment\n"
        "            its `metrics:` section names, and each tier's contents read in place\n"
        "            (a shared DRAM tier, an SSD tier's directory, Redis, kvstrata-nodes)\n"
        "  ENDPOINT  HOST:PORT or http://HOST:PORT/PATH of a metrics endpoint (an engine's,\n"
        "            a kvstrata-node's --metrics): what it serves\n"
        "  --json           one JSON document per refresh\n"
        "  --watch [S]      refresh every S seconds (default 2) until interrupted\n"
        "  --count N        with --watch: stop after N refreshes\n"
        "  --timeout-ms N   bound on reaching an endpoint (default 2000)\n"
        "  --rank N         the tensor-parallel rank {rank} in a tier's options stands for\n"
        "                   (default 0)\n"
        "  --scan           read the unit headers of an SSD tier a running process holds\n"
        "                   (one read per slot; without it, the figures that process publishes)\n"
        "Exit status: 0 read, 1 nothing could be read, 2 usage.\n");
}

int kvs_cmd_stats(int argc, char **argv) {
    static const struct option longs[] = {
        {"json", no_argument, NULL, 'j'},        {"watch", optional_argument, NULL, 'w'},
        {"count", required_argument, NULL, 'c'}, {"timeout-ms", required_argument, NULL, 't'},
        {"rank", required_argument, NULL, 'r'},  {"scan", no_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0}};
    int json = 0, opt, timeout_ms = 2000, scan = 0;
    int32_t rank = 0;
    double interval = 0;
    long count = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (opt) {
            case 'j': json = 1; break;
            case 'w':
                interval = 2.0;
                if (!optarg && optind < argc && argv[optind][0] >= '0' && argv[optind][0] <= '9' &&
                    strspn(argv[optind], "0123456789.") == strlen(argv[optind]))
                    optarg = argv[optind++];
                if (optarg) interval = atof(optarg);
                if (interval <= 0) {
                    fprintf(stderr, "kvstrata stats: --watch needs a positive interval\n");
                    return 2;
                }
                break;
            case 'c': count = atol(optarg); break;
            case 's': scan = 1; break;
            case 't': timeout_ms = atoi(optarg); break;
            case 'r':
                if (cli_parse_rank("stats", optarg, &rank) != 0) return 2;
                break;
            case 'h': usage(stdout); return 0;
            default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || timeout_ms <= 0) {
        usage(stderr);
        return 2;
    }
    const char *target = argv[optind];
    kvs_server_config *cfg = NULL;
    if (cli_is_file(target) || !http_is_endpoint(target)) {
        char err[1024];
        if (kvs_server_config_load(target, &cfg, err, sizeof err) != KVS_OK) {
            fprintf(stderr, "kvstrata stats: %s\n", err);
            return 1;
        }
    }
    view *v = calloc(2, sizeof *v);
    if (!v) {
        kvs_server_config_free(cfg);
        fprintf(stderr, "kvstrata stats: out of memory\n");
        return 1;
    }
    signal(SIGINT, on_interrupt);
    int tty = isatty(STDOUT_FILENO), rc = 0;
    for (long round = 0;; round++) {
        view *cur = &v[round % 2], *prev = round ? &v[(round + 1) % 2] : NULL;
        if (gather(cur, target, cfg, timeout_ms, rank, scan) != 0) {
            rc = 1;
            if (!interval) break;
        } else if (json) {
            print_json(cur, target);
        } else {
            if (interval && tty) printf("\033[H\033[2J");
            print_text(cur, prev, target);
        }
        fflush(stdout);
        if (!interval || stop_watch || (count > 0 && round + 1 >= count)) break;
        struct timespec pause = {(time_t)interval,
                                 (long)((interval - (double)(time_t)interval) * 1e9)};
        while (nanosleep(&pause, &pause) != 0 && !stop_watch) {
        }
        if (stop_watch) break;
        if (!json && !tty) printf("\n");
    }
    free(v);
    kvs_server_config_free(cfg);
    return rc;
}
