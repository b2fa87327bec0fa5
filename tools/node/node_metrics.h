/* node_metrics.h - kvstrata-node's tenant rows and what it publishes into its metrics instance
 * (common/metrics.h; docs/node.md, Metrics): one slot for the node (its tiers' gauges and its
 * whole counters, kvs_node_stats) and one per tenant row (that tenant's traffic). The node's loop
 * publishes them itself, at most every NODE_METRICS_PUBLISH_MS and once more at exit: its counters
 * are plain fields of that thread, so nothing on the request path changes. Private to tools/node;
 * nothing here is thread-safe. */
#ifndef KVS_NODE_METRICS_H
#define KVS_NODE_METRICS_H

#include <stdint.h>

#include "abi/kvstrata_server.h"
#include "node_state.h"

#define NODE_METRICS_PUBLISH_MS 500

/* The row of tenant's traffic in n->tenants: its own, made at its first session while there is
 * room, else the shared row of tenants past KVS_NODE_TENANT_ROWS. */
uint32_t node_tenant_row(kvs_node *n, const char *tenant);
/* Attaches the node to the instance of (p->metrics_listen, p->metrics_name) when they are set
 * (failures only log: the node serves without metrics). Called at create, once the tiers are open
 * (set: the config's settings, for the tiers' capacities). */
void node_metrics_open(kvs_node *n, const kvs_node_params *p, const kvs_server_settings *set);
/* When the next publish is due (UINT64_MAX: metrics are off), for the loop's poll timeout. */
uint64_t node_metrics_due(const kvs_node *n);
/* Publishes when due at now (every row whose counters moved, and the node's slot). */
void node_metrics_tick(kvs_node *n, uint64_t now);
/* Publishes a last time and retires the slots. NULL metrics: no-op. */
void node_metrics_close(kvs_node *n);

#endif
