/* node.h - the kvstrata-node server: serves a tier chain (kvs_server_tiers_open,
 * abi/kvstrata_server.h) to remote-tier clients over UCX, speaking the wire protocol of
 * backends/ucx/wire.h after the PSK handshake of auth.h, which runs over a plain TCP control
 * connection (backends/ucx/control.h) before any UCX endpoint exists.
 *
 * Threading: a node and its transport belong to the thread that created it; no call is thread-safe.
 * kvs_node_run is the event loop: it returns when stop_fd (a signalfd or pipe) becomes readable. */
#ifndef KVS_NODE_H
#define KVS_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"
#include "node_params.h"

/* Open the tiers, register the staging buffer, start listening. On failure *out is NULL and err
 * holds a sentence naming what failed. */
kvs_status kvs_node_create(const kvs_node_params *params, kvs_node **out, char *err,
                           size_t err_len);
/* The bound listener port. */
uint16_t kvs_node_port(const kvs_node *node);
uint32_t kvs_node_tier_count(const kvs_node *node);
/* Serve until stop_fd is readable (the caller drains it). Returns KVS_OK then. */
kvs_status kvs_node_run(kvs_node *node, int stop_fd);
/* Use master as the key tenants' keys derive from from now on (a rotation: SIGHUP re-reads the key
 * file); handshakes under way finish under the key they began with. Copied. */
void kvs_node_set_psk(kvs_node *node, const kvs_remote_psk *master);
void kvs_node_get_stats(const kvs_node *node, kvs_node_stats *out);
/* The tenants' rows (at most KVS_NODE_TENANT_ROWS + 1) into out[cap]; returns how many there are. */
uint32_t kvs_node_get_tenant_stats(const kvs_node *node, kvs_node_tenant_stats *out, uint32_t cap);
/* Close every connection, the transport and the tiers; wipe the key. NULL is a no-op. */
void kvs_node_destroy(kvs_node *node);

#endif
