/* node_quota.h - each tenant's share of the node's tiers: what it stored, oldest first, so that a
 * tenant that would pass its share removes its own oldest objects first, and another tenant's
 * objects go only to the tiers' own eviction when the tiers as a whole are full (shares that add
 * up to no more than the tiers' capacity keep that from happening).
 *
 * The records follow the node's puts and deletes, not the tiers: an object the tiers evicted on
 * their own keeps its record (and its bytes counted against its tenant) until the tenant's next
 * over-share put takes it first, being among its oldest. Single-threaded: the node's loop. */
#ifndef KVS_NODE_QUOTA_H
#define KVS_NODE_QUOTA_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "abi/kvstrata_server.h"

typedef struct node_quota node_quota;

/* Shares from the node's configuration: node.tenants by name, node.tenant_capacity for every
 * other tenant. NULL when none is set (no tenant has a share) or out of memory (*oom set). */
node_quota *node_quota_create(const kvs_server_settings *cfg, int *oom);
void node_quota_destroy(node_quota *q);

/* Whether len bytes may be stored for tenant: KVS_ENOMEM when len alone is over its share (or no
 * memory for the tenant's entry); KVS_OK otherwise, or when the tenant has no share. */
kvs_status node_quota_admit(node_quota *q, const char *tenant, uint64_t len);
/* len bytes under key were stored for tenant: recorded as its newest (a key stored before counts
 * once, at its new length; each record counts at least 4 KiB), then the tenant's oldest records
 * are removed from the tiers with remove(ctx, key) (*evicted counts them) until it is within its
 * share. Puts still landing are not counted until they land: one request can take a tenant past
 * its share by its own objects until they do. */
void node_quota_stored(node_quota *q, const char *tenant, const kvs_key *key, uint64_t len,
                       void (*remove)(void *ctx, const kvs_key *key), void *ctx, uint64_t *evicted);
/* The object under key was deleted: its bytes no longer count. */
void node_quota_forget(node_quota *q, const kvs_key *key);
/* Bytes tenant holds by the records (0 for a tenant never seen). */
uint64_t node_quota_used(const node_quota *q, const char *tenant);

#endif
