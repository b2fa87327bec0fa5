/* node_metrics.c - the node's tenant rows and its slots in the metrics segment (node_metrics.h). */
#include "node_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/metrics.h"
#include "node.h"

#define ROWS (KVS_NODE_TENANT_ROWS + 1u) /* the named rows, then the shared one */

typedef struct node_metrics {
    kvs_metrics_source *node_src;          /* the node's slot: tiers and whole counters */
    kvs_metrics_source *rows[ROWS];        /* a slot per tenant row, claimed at its first publish */
    uint8_t tried[ROWS];                   /* a claim failed: not tried again (the segment logs) */
    kvs_node_tenant_stats published[ROWS]; /* what each row's slot holds */
    uint64_t capacity[KVS_MSEG_TIERS];     /* the tiers' configured capacities */
    uint32_t n_tiers;
    char listen[128], name[KVS_MSEG_NAME_MAX]; /* the params' strings are the caller's */
    uint64_t next_ns;
    kvs_mseg_values v; /* scratch: too large for the loop's stack frame to carry comfortably */
} node_metrics;

uint32_t node_tenant_row(kvs_node *n, const char *tenant) {
    for (uint32_t i = 0; i < n->n_tenants; i++)
        if (strcmp(n->tenants[i].tenant, tenant) == 0) return i;
    if (n->n_tenants == KVS_NODE_TENANT_ROWS) {
        if (!n->tenants_overflowed)
            kvs_log(n->log_level, KVS_LOG_WARN,
                    "kvstrata-node: tenant \"%s\" and later ones past the first %u are counted "
                    "together as tenant \"%s\"",
                    tenant, KVS_NODE_TENANT_ROWS, KVS_NODE_OTHER_TENANT);
        n->tenants_overflowed = 1;
        return KVS_NODE_TENANT_ROWS;
    }
    kvs_node_tenant_stats *r = &n->tenants[n->n_tenants];
    memset(r, 0, sizeof *r);
    snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
    return n->n_tenants++;
}

uint32_t kvs_node_get_tenant_stats(const kvs_node *n, kvs_node_tenant_stats *out, uint32_t cap) {
    uint32_t count = n->n_tenants + (n->tenants_overflowed ? 1u : 0u);
    for (uint32_t i = 0; i < n->n_tenants && i < cap; i++) out[i] = n->tenants[i];
    if (n->tenants_overflowed && n->n_tenants < cap)
        out[n->n_tenants] = n->tenants[KVS_NODE_TENANT_ROWS];
    return count;
}

/* The identity of a slot: the node's (tenant "", its tiers) or a tenant row's (no tiers). */
static void identity(const kvs_node *n, const node_metrics *m, const char *tenant,
                     kvs_mseg_values *v) {
    memset(v, 0, sizeof *v);
    v->kind = KVS_MSEG_NODE;
    snprintf(v->tenant, sizeof v->tenant, "%s", tenant);
    if (tenant[0]) return;
    v->n_tiers = m->n_tiers;
    for (uint32_t t = 0; t < m->n_tiers; t++)
        snprintf(v->tiers[t].name, sizeof v->tiers[t].name, "%s",
                 kvs_server_tiers_name(n->chain, t));
}

static kvs_metrics_source *attach(const kvs_node *n, const node_metrics *m,
                                  const kvs_mseg_values *v) {
    return kvs_metrics_attach(m->listen, m->name, n->log_level, v, NULL, NULL);
}

void node_metrics_open(kvs_node *n, const kvs_node_params *p, const kvs_server_settings *set) {
    if (!p->metrics_listen || !p->metrics_name) return;
    node_metrics *m = calloc(1, sizeof *m);
    if (!m) {
        kvs_log(n->log_level, KVS_LOG_WARN,
                "kvstrata-node: no memory for metrics; serving without");
        return;
    }
    uint32_t tiers = kvs_server_tiers_count(n->chain);
    m->n_tiers = tiers < KVS_MSEG_TIERS ? tiers : KVS_MSEG_TIERS;
    for (uint32_t t = 0; t < m->n_tiers && t < set->n_tiers; t++)
        m->capacity[t] = set->tiers[t].capacity_bytes;
    snprintf(m->listen, sizeof m->listen, "%s", p->metrics_listen);
    snprintf(m->name, sizeof m->name, "%s", p->metrics_name);
    identity(n, m, "", &m->v);
    m->node_src = attach(n, m, &m->v);
    if (!m->node_src) { /* logged by the instance */
        free(m);
        return;
    }
    n->metrics = m;
}

uint64_t node_metrics_due(const kvs_node *n) {
    return n->metrics ? n->metrics->next_ns : UINT64_MAX;
}

static void publish_node(kvs_node *n, node_metrics *m) {
    kvs_mseg_values *v = &m->v;
    identity(n, m, "", v);
    const kvs_node_stats *s = &n->stats;
    v->c[KVS_MC_NODE_CONNECTIONS] = s->connections;
    v->c[KVS_MC_NODE_REJECTED] = s->rejected;
    v->c[KVS_MC_NODE_AUTH_OK] = s->auth_ok;
    v->c[KVS_MC_NODE_AUTH_FAILURES] = s->auth_failures;
    v->c[KVS_MC_NODE_REFUSALS] = s->refusals;
    v->c[KVS_MC_NODE_LATE_PUTS] = s->late_puts;
    v->c[KVS_MC_NODE_QUOTA_EVICTIONS] = s->quota_evictions;
    /* the traffic counters go per tenant only, so that summing a family over its series gives
     * the node's total */
    for (uint32_t t = 0; t < m->n_tiers; t++) {
        kvs_mseg_tier *x = &v->tiers[t];
        x->capacity = m->capacity[t];
        const kvs_backend_ops *ops = kvs_server_tiers_ops(n->chain, t);
        if (ops && ops->usage) {
            ops->usage(kvs_server_tiers_state(n->chain, t), &x->objects, &x->bytes);
            x->usage_known = 1;
        }
    }
    kvs_metrics_publish(m->node_src, v);
}

static void publish_row(kvs_node *n, node_metrics *m, uint32_t i) {
    const kvs_node_tenant_stats *r = &n->tenants[i];
    if (m->rows[i] && memcmp(r, &m->published[i], sizeof *r) == 0) return;
    kvs_mseg_values *v = &m->v;
    identity(n, m, r->tenant, v);
    if (!m->rows[i]) {
        if (m->tried[i]) return;
        m->tried[i] = 1;
        if (!(m->rows[i] = attach(n, m, v))) return;
    }
    v->c[KVS_MC_NODE_LOOKUPS] = r->lookups;
    v->c[KVS_MC_NODE_HITS] = r->hits;
    v->c[KVS_MC_NODE_MISSES] = r->misses;
    v->c[KVS_MC_NODE_GETS] = r->gets;
    v->c[KVS_MC_NODE_PUTS] = r->puts;
    v->c[KVS_MC_NODE_DELETES] = r->deletes;
    v->c[KVS_MC_NODE_BYTES_IN] = r->bytes_in;
    v->c[KVS_MC_NODE_BYTES_OUT] = r->bytes_out;
    kvs_metrics_publish(m->rows[i], v);
    m->published[i] = *r;
}

static void publish_all(kvs_node *n, node_metrics *m) {
    publish_node(n, m);
    for (uint32_t i = 0; i < n->n_tenants; i++) publish_row(n, m, i);
    if (n->tenants_overflowed) publish_row(n, m, KVS_NODE_TENANT_ROWS);
}

void node_metrics_tick(kvs_node *n, uint64_t now) {
    node_metrics *m = n->metrics;
    if (!m || now < m->next_ns) return;
    m->next_ns = now + NODE_METRICS_PUBLISH_MS * 1000000ull;
    publish_all(n, m);
}

void node_metrics_close(kvs_node *n) {
    node_metrics *m = n->metrics;
    if (!m) return;
    publish_all(n, m);
    for (uint32_t i = 0; i < ROWS; i++) kvs_metrics_detach(m->rows[i]);
    kvs_metrics_detach(m->node_src);
    free(m);
    n->metrics = NULL;
}
