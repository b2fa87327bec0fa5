/* metrics_render.c - Prometheus text from the segment's slots. Counters are summed over every slot
 * of a label set, live or retired, so they never go backwards while processes come and go; tier
 * gauges come from live processes only: summed for tiers private to each process, the largest
 * answer for tiers every process shares (the same objects seen from each). A kvstrata-node's tier
 * gauges are a series of their own (role="node"), even where the node shares the instance with
 * engines whose tiers have the same names. */
#include "metrics_render.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct text {
    char *p;
    size_t len, cap;
    int oom;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    for (int pass = 0; pass < 2 && !t->oom; pass++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (t->p && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap : 16384;
        while (cap < t->len + (size_t)n + 1) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

/* A label value escaped per the format: backslash, double quote and newline. */
static const char *esc(const char *s, char *buf, size_t cap) {
    size_t o = 0;
    for (; *s && o + 3 < cap; s++) {
        if (*s == '\\' || *s == '"')
            buf[o++] = '\\', buf[o++] = *s;
        else if (*s == '\n')
            buf[o++] = '\\', buf[o++] = 'n';
        else
            buf[o++] = *s;
    }
    buf[o] = '\0';
    return buf;
}

static void family(text *t, const char *name, const char *type, const char *help) {
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* `{tier="x",tenant="y"}`, `{tenant="y"}`, `{tier="x"}` or "". */
static void labels(char *out, size_t cap, const char *tier, const char *tenant, const char *extra) {
    char a[200] = "", b[200] = "";
    size_t o = 0;
    out[0] = '\0';
    const char *parts[3] = {tier ? "tier" : NULL, tenant && *tenant ? "tenant" : NULL,
                            extra ? "kind" : NULL};
    const char *vals[3] = {tier, tenant, extra};
    for (int i = 0; i < 3; i++) {
        if (!parts[i]) continue;
        int n = snprintf(out + o, cap - o, "%s%s=\"%s\"", o ? "," : "{", parts[i],
                         esc(vals[i], i ? b : a, sizeof a));
        if (n < 0 || (size_t)n >= cap - o) break;
        o += (size_t)n;
    }
    if (o && o + 2 < cap) out[o++] = '}', out[o] = '\0';
}

/* ---- aggregation ----------------------------------------------------------------------------- */

#define MAX_ROWS (KVS_MSEG_SLOTS * 2)

typedef struct row { /* per (node or not, tenant) */
    uint32_t kind;
    char tenant[KVS_MSEG_TENANT];
    uint64_t c[KVS_MC_COUNT];
} row;
typedef struct tier_row { /* per (tier, tenant) */
    char tier[KVS_MSEG_NAME_MAX], tenant[KVS_MSEG_TENANT];
    uint64_t hits, hit_tokens, loaded_bytes, load_ns;
} tier_row;
typedef struct gauge_row { /* per (tier, node or not) */
    char tier[KVS_MSEG_NAME_MAX];
    int node; /* a kvstrata-node's tier: its own series (role="node"), never merged with engines' */
    uint64_t objects, bytes, capacity;
    int known;       /* a live slot asked the tier its objects and bytes */
    uint64_t served; /* hit tokens (connectors) plus hits (stores) over every tenant */
} gauge_row;

typedef struct agg {
    row rows[MAX_ROWS];
    uint32_t n_rows;
    tier_row tiers[MAX_ROWS];
    uint32_t n_tiers;
    gauge_row gauges[MAX_ROWS];
    uint32_t n_gauges;
} agg;

static row *row_of(agg *a, uint32_t kind, const char *tenant) {
    for (uint32_t i = 0; i < a->n_rows; i++)
        if (a->rows[i].kind == kind && strcmp(a->rows[i].tenant, tenant) == 0) return &a->rows[i];
    if (a->n_rows == MAX_ROWS) return NULL;
    row *r = &a->rows[a->n_rows++];
    r->kind = kind;
    snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    return r;
}

static tier_row *tier_of(agg *a, const char *tier, const char *tenant) {
    for (uint32_t i = 0; i < a->n_tiers; i++)
        if (strcmp(a->tiers[i].tier, tier) == 0 && strcmp(a->tiers[i].tenant, tenant) == 0)
            return &a->tiers[i];
    if (a->n_tiers == MAX_ROWS) return NULL;
    tier_row *r = &a->tiers[a->n_tiers++];
    snprintf(r->tier, sizeof r->tier, "%s", tier);
    snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    return r;
}

static gauge_row *gauge_of(agg *a, const char *tier, int node) {
    for (uint32_t i = 0; i < a->n_gauges; i++)
        if (a->gauges[i].node == node && strcmp(a->gauges[i].tier, tier) == 0) return &a->gauges[i];
    if (a->n_gauges == MAX_ROWS) return NULL;
    gauge_row *r = &a->gauges[a->n_gauges++];
    snprintf(r->tier, sizeof r->tier, "%s", tier);
    r->node = node;
    return r;
}

static uint64_t max_u64(uint64_t a, uint64_t b) {
    return a > b ? a : b;
}

static void add_slot(agg *a, const kvs_mseg_slot *s) {
    const kvs_mseg_values *v = &s->v;
    char tenant[KVS_MSEG_TENANT];
    memcpy(tenant, v->tenant, sizeof tenant);
    tenant[sizeof tenant - 1] = '\0';
    /* handles and stores of one tenant share its series: one row, or two samples of one series */
    row *r = row_of(a, v->kind == KVS_MSEG_NODE ? KVS_MSEG_NODE : KVS_MSEG_CONNECTOR, tenant);
    if (r) {
        for (int k = 0; k < KVS_MC_COUNT; k++) r->c[k] += v->c[k];
        /* a store's misses are read before its gets (store_metrics.c); a slot that says otherwise
         * must not make the gets' hits negative */
        if (v->c[KVS_MC_GET_MISSES] > v->c[KVS_MC_GETS])
            r->c[KVS_MC_GET_MISSES] -= v->c[KVS_MC_GET_MISSES] - v->c[KVS_MC_GETS];
    }
    for (uint32_t t = 0; t < v->n_tiers && t < KVS_MSEG_TIERS; t++) {
        const kvs_mseg_tier *x = &v->tiers[t];
        char name[KVS_MSEG_NAME_MAX];
        memcpy(name, x->name, sizeof name);
        name[sizeof name - 1] = '\0';
        tier_row *tr = v->kind == KVS_MSEG_NODE ? NULL : tier_of(a, name, tenant);
        if (tr) {
            tr->hits += x->hits;
            tr->hit_tokens += x->hit_tokens;
            tr->loaded_bytes += x->loaded_bytes;
            tr->load_ns += x->load_ns;
        }
        gauge_row *g = gauge_of(a, name, v->kind == KVS_MSEG_NODE);
        if (!g) continue;
        g->served += v->kind == KVS_MSEG_STORE ? x->hits : x->hit_tokens;
        if (s->state != KVS_MSEG_LIVE) continue;
        uint64_t objects = x->usage_known ? x->objects : 0, bytes = x->usage_known ? x->bytes : 0;
        g->known |= x->usage_known != 0;
        if (x->shared) {
            g->objects = max_u64(g->objects, objects);
            g->bytes = max_u64(g->bytes, bytes);
            g->capacity = max_u64(g->capacity, x->capacity);
        } else {
            g->objects += objects;
            g->bytes += bytes;
            g->capacity += x->capacity;
        }
    }
}

/* ---- families -------------------------------------------------------------------------------- */

static const struct counter {
    int k;
    const char *name, *help;
    double scale;     /* 0: an integer count; else a multiplier (ns -> s) */
    const char *kind; /* the kind="" label of kvstrata_errors_total */
} COUNTERS[] = {
    {KVS_MC_LOOKUPS, "kvstrata_lookups_total", "Lookups the engine asked (connector handles).", 0,
     NULL},
    {KVS_MC_LOOKUP_TOKENS, "kvstrata_lookup_tokens_total",
     "Tokens lookups asked for beyond what the engine had computed.", 0, NULL},
    {KVS_MC_HIT_TOKENS, "kvstrata_hit_tokens_total",
     "Tokens lookups found stored (offered to the engine to load).", 0, NULL},
    {KVS_MC_GETS, "kvstrata_gets_total", "Keys asked by store API gets.", 0, NULL},
    {KVS_MC_GET_MISSES, "kvstrata_get_misses_total", "Keys store API gets found in no tier.", 0,
     NULL},
    {KVS_MC_SAVES, "kvstrata_saves_total", "Objects saved into the tiers.", 0, NULL},
    {KVS_MC_SAVED_BYTES, "kvstrata_saved_bytes_total", "Bytes of the objects saved.", 0, NULL},
    {KVS_MC_SAVE_NS, "kvstrata_save_seconds_total", "Time spent saving objects.", 1e-9, NULL},
    {KVS_MC_SAVES_SKIPPED, "kvstrata_saves_skipped_total",
     "Saves skipped: already stored, no memory, or dropped by the tier.", 0, NULL},
    {KVS_MC_EVICTIONS, "kvstrata_evictions_total", "Objects dropped from the last tier.", 0, NULL},
};

static const struct counter ERRORS[] = {
    {KVS_MC_ERR_LOAD, "kvstrata_errors_total", NULL, 0, "load"},
    {KVS_MC_ERR_INTEGRITY, "kvstrata_errors_total", NULL, 0, "integrity"},
    {KVS_MC_ERR_CORRUPT, "kvstrata_errors_total", NULL, 0, "corrupt"},
    {KVS_MC_ERR_PUT_FAILED, "kvstrata_errors_total", NULL, 0, "put_failed"},
};

static const struct counter NODE_COUNTERS[] = {
    {KVS_MC_NODE_CONNECTIONS, "kvstrata_node_connections_total", "Connections accepted.", 0, NULL},
    {KVS_MC_NODE_REJECTED, "kvstrata_node_rejected_total",
     "Connections closed at accept (over max_clients or max_handshakes).", 0, NULL},
    {KVS_MC_NODE_AUTH_OK, "kvstrata_node_auth_ok_total", "Sessions authenticated.", 0, NULL},
    {KVS_MC_NODE_AUTH_FAILURES, "kvstrata_node_auth_failures_total",
     "Handshakes refused for a wrong key or tenant.", 0, NULL},
    {KVS_MC_NODE_REFUSALS, "kvstrata_node_refusals_total",
     "Malformed or out-of-state messages answered with an error.", 0, NULL},
    {KVS_MC_NODE_LATE_PUTS, "kvstrata_node_late_puts_total",
     "Objects not stored because they arrived after their deadline.", 0, NULL},
    {KVS_MC_NODE_QUOTA_EVICTIONS, "kvstrata_node_quota_evictions_total",
     "Objects removed to keep a tenant within its share.", 0, NULL},
    {KVS_MC_NODE_LOOKUPS, "kvstrata_node_lookups_total", "Keys asked by lookups.", 0, NULL},
    {KVS_MC_NODE_HITS, "kvstrata_node_hits_total", "Keys lookups and gets found.", 0, NULL},
    {KVS_MC_NODE_MISSES, "kvstrata_node_misses_total", "Keys lookups and gets did not find.", 0,
     NULL},
    {KVS_MC_NODE_GETS, "kvstrata_node_gets_total", "Keys asked by gets.", 0, NULL},
    {KVS_MC_NODE_PUTS, "kvstrata_node_puts_total", "Objects stored.", 0, NULL},
    {KVS_MC_NODE_DELETES, "kvstrata_node_deletes_total", "Keys removed.", 0, NULL},
    {KVS_MC_NODE_BYTES_IN, "kvstrata_node_bytes_in_total", "Object bytes stored.", 0, NULL},
    {KVS_MC_NODE_BYTES_OUT, "kvstrata_node_bytes_out_total", "Object bytes sent to clients.", 0,
     NULL},
};

static void value(text *t, const char *name, const char *lab, const struct counter *c, uint64_t v) {
    if (c && c->scale != 0)
        put(t, "%s%s %.9f\n", name, lab, (double)v * c->scale);
    else
        put(t, "%s%s %llu\n", name, lab, (unsigned long long)v);
}

static void render_counters(text *t, const agg *a, const struct counter *list, size_t n, int node) {
    char lab[512];
    for (size_t i = 0; i < n; i++) {
        const struct counter *c = &list[i];
        int any = 0;
        for (uint32_t r = 0; r < a->n_rows; r++) any |= (a->rows[r].kind == KVS_MSEG_NODE) == node;
        if (!any) continue;
        if (c->help) family(t, c->name, "counter", c->help);
        for (uint32_t r = 0; r < a->n_rows; r++) {
            const row *x = &a->rows[r];
            if ((x->kind == KVS_MSEG_NODE) != node) continue;
            /* a node's whole counters come from its tenant-less row, its traffic per tenant only
             * (so that a family's series add up to the node's total) */
            if (node && (x->tenant[0] != '\0') != (c->k >= KVS_MC_NODE_LOOKUPS)) continue;
            labels(lab, sizeof lab, NULL, x->tenant, c->kind);
            value(t, c->name, lab, c, x->c[c->k]);
        }
    }
}

static double ratio(uint64_t a, uint64_t b) {
    if (a > b) a = b; /* counters of slots copied a moment apart: a rate is never above 1 */
    return b ? (double)a / (double)b : 0.0;
}

/* `{tier="x"}`, or `{tier="x",role="node"}` for a kvstrata-node's tier. */
static void gauge_labels(char *out, size_t cap, const gauge_row *x) {
    char e[200];
    snprintf(out, cap, "{tier=\"%s\"%s}", esc(x->tier, e, sizeof e),
             x->node ? ",role=\"node\"" : "");
}

static void render(text *t, const agg *a, uint32_t processes) {
    char lab[512];
    family(t, "kvstrata_processes", "gauge", "Processes of the instance publishing now.");
    put(t, "kvstrata_processes %u\n", processes);
    static const char *const GAUGES[3][2] = {
        {"kvstrata_tier_objects", "Objects the tier holds."},
        {"kvstrata_tier_bytes", "Bytes the tier holds."},
        {"kvstrata_tier_capacity_bytes", "The tier's configured capacity (0 where none)."}};
    for (int g = 0; g < 3 && a->n_gauges; g++) {
        /* objects and bytes only where a live process asked the tier: a tier nobody can ask from
         * here (a network tier, an engine whose tiers are not thread-safe) has no sample, not 0 */
        int any = g == 2;
        for (uint32_t i = 0; i < a->n_gauges && !any; i++) any = a->gauges[i].known;
        if (!any) continue;
        family(t, GAUGES[g][0], "gauge", GAUGES[g][1]);
        for (uint32_t i = 0; i < a->n_gauges; i++) {
            const gauge_row *x = &a->gauges[i];
            if (g < 2 && !x->known) continue;
            gauge_labels(lab, sizeof lab, x);
            uint64_t v = g == 0 ? x->objects : g == 1 ? x->bytes : x->capacity;
            put(t, "%s%s %llu\n", GAUGES[g][0], lab, (unsigned long long)v);
        }
    }
    static const char *const TIER_COUNTERS[4][2] = {
        {"kvstrata_tier_hits_total", "Objects served from the tier."},
        {"kvstrata_tier_hit_tokens_total", "Tokens whose KV came from the tier (connectors)."},
        {"kvstrata_tier_loaded_bytes_total", "Bytes loaded from the tier."},
        {"kvstrata_tier_load_seconds_total", "Time spent loading from the tier."}};
    for (int c = 0; c < 4 && a->n_tiers; c++) {
        family(t, TIER_COUNTERS[c][0], "counter", TIER_COUNTERS[c][1]);
        for (uint32_t i = 0; i < a->n_tiers; i++) {
            const tier_row *x = &a->tiers[i];
            labels(lab, sizeof lab, x->tier, x->tenant, NULL);
            if (c == 3)
                put(t, "%s%s %.9f\n", TIER_COUNTERS[c][0], lab, (double)x->load_ns * 1e-9);
            else
                put(t, "%s%s %llu\n", TIER_COUNTERS[c][0], lab,
                    (unsigned long long)(c == 0   ? x->hits
                                         : c == 1 ? x->hit_tokens
                                                  : x->loaded_bytes));
        }
    }
    render_counters(t, a, COUNTERS, sizeof COUNTERS / sizeof COUNTERS[0], 0);
    int any_engine = 0;
    uint64_t asked = 0, hits = 0;
    for (uint32_t r = 0; r < a->n_rows; r++) {
        const row *x = &a->rows[r];
        if (x->kind == KVS_MSEG_NODE) continue;
        any_engine = 1;
        asked += x->c[KVS_MC_LOOKUP_TOKENS] + x->c[KVS_MC_GETS];
        hits += x->c[KVS_MC_HIT_TOKENS] + x->c[KVS_MC_GETS] - x->c[KVS_MC_GET_MISSES];
    }
    if (any_engine) {
        family(t, "kvstrata_errors_total", "counter",
               "Failures by kind: load (a chunk's load failed), integrity (a keyed tier's tag was "
               "wrong), corrupt (an object failed its checksum), put_failed (a store put failed).");
        render_counters(t, a, ERRORS, sizeof ERRORS / sizeof ERRORS[0], 0);
        family(t, "kvstrata_hit_rate", "gauge",
               "Hit tokens (and store get hits) over tokens (and keys) asked, since start.");
        put(t, "kvstrata_hit_rate %.6f\n", ratio(hits, asked));
        family(t, "kvstrata_tier_hit_rate", "gauge",
               "The tier's hit tokens (and store hits) over tokens (and keys) asked: which tier "
               "serves the hits.");
        for (uint32_t i = 0; i < a->n_gauges; i++) {
            if (a->gauges[i].node) continue; /* a node's tiers serve no lookup of the engines' */
            labels(lab, sizeof lab, a->gauges[i].tier, NULL, NULL);
            put(t, "kvstrata_tier_hit_rate%s %.6f\n", lab, ratio(a->gauges[i].served, asked));
        }
    }
    render_counters(t, a, NODE_COUNTERS, sizeof NODE_COUNTERS / sizeof NODE_COUNTERS[0], 1);
}

kvs_status kvs_metrics_render_slots(const kvs_mseg_slot *slots, uint32_t n, uint32_t processes,
                                    char **out, size_t *len) {
    agg *a = calloc(1, sizeof *a);
    if (!a) return KVS_ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        if (slots[i].state != KVS_MSEG_FREE) add_slot(a, &slots[i]);
    text t = {0};
    render(&t, a, processes);
    free(a);
    if (t.oom || !t.p) {
        free(t.p);
        return KVS_ENOMEM;
    }
    *out = t.p;
    *len = t.len;
    return KVS_OK;
}

kvs_status kvs_metrics_render_seg(kvs_mseg *seg, char **out, size_t *len) {
    kvs_mseg_slot *slots = malloc(sizeof *slots * KVS_MSEG_SLOTS);
    if (!slots) return KVS_ENOMEM;
    uint32_t processes = 0;
    kvs_status st = KVS_EAGAIN;
    if (kvs_mseg_snapshot(seg, slots, &processes) == 0)
        st = kvs_metrics_render_slots(slots, KVS_MSEG_SLOTS, processes, out, len);
    free(slots);
    return st;
}
