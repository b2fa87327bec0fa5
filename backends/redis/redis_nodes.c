/*
 * redis_nodes.c - the redis tier's table of servers and its slot map: nodes named in the YAML,
 * learned from CLUSTER SLOTS or from a redirection, compared by address; and the tier's error
 * sentence. Used under the tier's lock by redis_batch.c and redis.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_internal.h"

#define MAX_RANGES 8192

void redis_error(kvs_redis *r, int level, const char *fmt, ...) {
    char msg[sizeof r->last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->last_error, sizeof r->last_error, "redis tier \"%s\": %s", r->tier_name, msg);
    if (r->host && r->host->log) r->host->log(r->host->ctx, level, r->last_error);
}

static int same_endpoint(const kvs_redis_endpoint *a, const kvs_redis_endpoint *b) {
    if (a->host[0] == '\0' || b->host[0] == '\0') return strcmp(a->name, b->name) == 0;
    return a->port == b->port && strcmp(a->host, b->host) == 0;
}

/* A slot of the table for a new node: the next free one, or one that serves no slot, was not
 * given in the YAML and has no connection open (a master that moved away long ago). */
static uint32_t free_node(kvs_redis *r) {
    if (r->n_nodes < REDIS_MAX_NODES) return r->n_nodes++;
    for (uint32_t i = 0; i < r->n_nodes; i++) {
        redis_node *n = &r->nodes[i];
        if (n->is_master || n->is_seed) continue;
        int open = 0;
        for (uint32_t c = 0; c < r->opt.connections_per_node; c++) open |= n->conns[c].io.fd >= 0;
        if (open) continue;
        for (uint32_t c = 0; c < r->opt.connections_per_node; c++) {
            free(n->conns[c].rbuf);
            free(n->conns[c].q);
        }
        free(n->conns);
        memset(n, 0, sizeof *n);
        return i;
    }
    return REDIS_NO_NODE;
}

uint32_t redis_node_find_or_add(kvs_redis *r, const char *endpoint, int from_config) {
    kvs_redis_endpoint ep;
    char why[200];
    if (kvs_redis_endpoint_parse(endpoint, &ep, why, sizeof why) != 0) return REDIS_NO_NODE;
    /* only the YAML names unix sockets: a server may not redirect the client to a local path */
    if (!ep.host[0] && !from_config) return REDIS_NO_NODE;
    for (uint32_t i = 0; i < r->n_nodes; i++)
        if (same_endpoint(&r->nodes[i].ep, &ep)) return i;
    uint32_t at = free_node(r);
    if (at == REDIS_NO_NODE) return REDIS_NO_NODE;
    redis_node *n = &r->nodes[at];
    n->conns = calloc(r->opt.connections_per_node, sizeof *n->conns);
    if (!n->conns) {
        if (at == r->n_nodes - 1) r->n_nodes--;
        return REDIS_NO_NODE;
    }
    n->ep = ep;
    n->is_seed = from_config;
    for (uint32_t c = 0; c < r->opt.connections_per_node; c++) {
        n->conns[c].io.fd = -1;
        n->conns[c].node = n;
    }
    return at;
}

void redis_apply_slots(kvs_redis *r, const kvs_resp_node *nodes, uint32_t n,
                       const redis_node *asked) {
    kvs_redis_slot_range *ranges = malloc(MAX_RANGES * sizeof *ranges);
    uint32_t n_ranges = 0;
    char why[200];
    if (!ranges || !r->slot_owner) {
        free(ranges);
        return;
    }
    if (kvs_redis_slots_parse(nodes, n, asked->ep.host, ranges, MAX_RANGES, &n_ranges, why,
                              sizeof why) != 0) {
        r->stats.protocol_errors++;
        redis_error(r, KVS_LOG_WARN, "%s: %s", asked->ep.name, why);
        free(ranges);
        return;
    }
    for (uint32_t i = 0; i < KVS_REDIS_SLOTS; i++) r->slot_owner[i] = REDIS_NO_NODE;
    for (uint32_t i = 0; i < r->n_nodes; i++) r->nodes[i].is_master = 0;
    for (uint32_t i = 0; i < n_ranges; i++) {
        char ep[KVS_REDIS_ENDPOINT_MAX];
        const char *fmt = strchr(ranges[i].host, ':') ? "[%s]:%u" : "%s:%u";
        snprintf(ep, sizeof ep, fmt, ranges[i].host, ranges[i].port);
        uint32_t node = redis_node_find_or_add(r, ep, 0);
        if (node == REDIS_NO_NODE) continue;
        r->nodes[node].is_master = 1;
        for (uint32_t s = ranges[i].first; s <= ranges[i].last; s++)
            r->slot_owner[s] = (uint16_t)node;
    }
    r->stats.slot_map_refreshes++;
    free(ranges);
}
