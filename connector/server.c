/* server.c - abi/kvstrata_server.h over the connector's config (config.h) and tier chain (tiers.h):
 * a server process opens the same chain the connector does, with no encoder (no compress tier) and
 * no cache events. Each call is the chain's own; only the settings are a copy. */
#include "abi/kvstrata_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"
#include "config.h"
#include "config_metrics.h"
#include "tiers.h"

struct kvs_server_config {
    kvs_config *cfg;
    kvs_server_settings settings;
    kvs_server_option *options; /* every tier's, the tiers' views point into it */
};

/* The settings mirror the config's limits: a config the loader accepts always fits. */
_Static_assert(KVS_SERVER_MAX_TIERS == KVS_CONFIG_MAX_TIERS, "tiers");
_Static_assert(KVS_SERVER_MAX_TENANTS == KVS_CONFIG_MAX_TENANTS, "tenants");
_Static_assert(KVS_SERVER_TENANT_MAX == KVS_CONFIG_TENANT_MAX, "tenant name");
_Static_assert(KVS_SERVER_PATH_MAX == KVS_PATH_MAX, "path");
_Static_assert(KVS_SERVER_MAX_OPTIONS == KVS_CONFIG_MAX_OPTIONS, "options");
_Static_assert(sizeof(((kvs_server_settings *)0)->node.listen) ==
                   sizeof(((kvs_config *)0)->node.listen),
               "listen");
_Static_assert(sizeof(((kvs_server_settings *)0)->metrics.listen) ==
                   sizeof(((kvs_config *)0)->metrics.listen),
               "metrics listen");
_Static_assert(sizeof(((kvs_server_settings *)0)->metrics.name) ==
                   sizeof(((kvs_config *)0)->metrics.name),
               "metrics name");

static void settings_of(const kvs_config *c, kvs_server_settings *s, kvs_server_option *options) {
    snprintf(s->source, sizeof s->source, "%s", c->source);
    s->version = c->version;
    s->chunk_tokens = c->chunk_tokens;
    s->log_level = c->log_level;
    s->n_tiers = (uint32_t)c->n_tiers;
    for (size_t i = 0; i < c->n_tiers; i++) {
        const kvs_tier_config *tc = &c->tiers[i];
        kvs_server_tier *t = &s->tiers[i];
        t->name = tc->name;
        t->type = tc->type;
        t->capacity_bytes = tc->capacity_bytes;
        t->write_through = tc->write == KVS_WRITE_THROUGH;
        t->shm_name = NULL; /* options are unique by key (the loader refuses a repeated one) */
        for (size_t k = 0; k < tc->n_options && !t->shm_name; k++)
            if (strcmp(tc->options[k].key, "shm_name") == 0) t->shm_name = tc->options[k].value;
        t->options = options;
        t->n_options = (uint32_t)tc->n_options;
        for (size_t k = 0; k < tc->n_options; k++)
            *options++ = (kvs_server_option){tc->options[k].key, tc->options[k].value,
                                             tc->options[k].list_index};
    }
    memcpy(s->node.listen, c->node.listen, sizeof s->node.listen);
    memcpy(s->node.psk_file, c->node.psk_file, sizeof s->node.psk_file);
    s->node.max_clients = c->node.max_clients;
    s->node.timeout_ms = c->node.timeout_ms;
    s->node.max_object_bytes = c->node.max_object_bytes;
    s->node.max_handshakes = c->node.max_handshakes;
    s->node.busy_poll_us = c->node.busy_poll_us;
    s->node.shared_memory_payloads = c->node.shared_memory_payloads;
    s->node.encrypt = c->node.encrypt;
    s->node.max_sessions_per_tenant = c->node.max_sessions_per_tenant;
    s->node.tenant_capacity = c->node.tenant_capacity;
    s->node.n_tenants = c->node.n_tenants;
    for (uint32_t i = 0; i < c->node.n_tenants; i++) {
        memcpy(s->node.tenants[i].name, c->node.tenants[i].name, sizeof s->node.tenants[i].name);
        s->node.tenants[i].capacity = c->node.tenants[i].capacity;
    }
    if (c->metrics.enabled) {
        memcpy(s->metrics.listen, c->metrics.listen, sizeof s->metrics.listen);
        /* the parser fills in the name derived from listen when none is given: a server whose
         * command line moves the endpoint derives it again from the address it listens on */
        char derived[sizeof c->metrics.name];
        kvs_metrics_default_name(c->metrics.listen, derived, sizeof derived);
        if (strcmp(derived, c->metrics.name) != 0)
            snprintf(s->metrics.name, sizeof s->metrics.name, "%s", c->metrics.name);
    }
}

kvs_status kvs_server_config_load(const char *path, kvs_server_config **out, char *err,
                                  size_t err_len) {
    *out = NULL;
    kvs_config *cfg = NULL;
    kvs_status st = kvs_config_load(path, &cfg, err, err_len);
    if (st != KVS_OK) return st;
    kvs_server_config *sc = calloc(1, sizeof *sc);
    if (!sc) {
        kvs_config_free(cfg);
        kvs_fmt(err, err_len, "%s: no memory for its settings", path);
        return KVS_ENOMEM;
    }
    size_t n_options = 0;
    for (size_t i = 0; i < cfg->n_tiers; i++) n_options += cfg->tiers[i].n_options;
    sc->options = calloc(n_options ? n_options : 1, sizeof *sc->options);
    if (!sc->options) {
        free(sc);
        kvs_config_free(cfg);
        kvs_fmt(err, err_len, "%s: no memory for its settings", path);
        return KVS_ENOMEM;
    }
    sc->cfg = cfg;
    settings_of(cfg, &sc->settings, sc->options);
    *out = sc;
    return KVS_OK;
}

const kvs_server_settings *kvs_server_config_settings(const kvs_server_config *cfg) {
    return &cfg->settings;
}

void kvs_server_config_free(kvs_server_config *cfg) {
    if (!cfg) return;
    kvs_config_free(cfg->cfg);
    free(cfg->options);
    free(cfg);
}

kvs_status kvs_server_tiers_open(const kvs_server_config *cfg, uint64_t max_object_bytes,
                                 void *staging_base, uint64_t staging_len, kvs_server_tiers **out,
                                 char *err, uint64_t err_len) {
    return kvs_tiers_open(cfg->cfg, max_object_bytes, NULL, staging_base, staging_len, NULL, NULL,
                          out, err, err_len);
}

void kvs_server_tiers_close(kvs_server_tiers *tiers) {
    kvs_tiers_close(tiers);
}

uint32_t kvs_server_tiers_count(const kvs_server_tiers *tiers) {
    return kvs_tiers_count(tiers);
}

const char *kvs_server_tiers_name(const kvs_server_tiers *tiers, uint32_t tier) {
    return kvs_tiers_name(tiers, tier);
}

const kvs_backend_ops *kvs_server_tiers_ops(const kvs_server_tiers *tiers, uint32_t tier) {
    return kvs_tiers_ops(tiers, tier);
}

void *kvs_server_tiers_state(const kvs_server_tiers *tiers, uint32_t tier) {
    return kvs_tiers_state(tiers, tier);
}

kvs_status kvs_server_tiers_memory(const kvs_server_tiers *tiers, uint32_t tier, void **base,
                                   uint64_t *len) {
    return kvs_tiers_memory(tiers, tier, base, len);
}

int kvs_server_tiers_find(kvs_server_tiers *tiers, const kvs_key *key) {
    return kvs_tiers_find(tiers, key);
}

kvs_status kvs_server_tiers_put(kvs_server_tiers *tiers, const kvs_key *key, const void *object,
                                uint64_t len, char *err, uint64_t err_len) {
    return kvs_tiers_put(tiers, key, object, len, err, err_len);
}

void kvs_server_tiers_remove(kvs_server_tiers *tiers, const kvs_key *key) {
    kvs_tiers_remove(tiers, key);
}

int kvs_server_tiers_can_reserve(const kvs_server_tiers *tiers) {
    return kvs_tiers_can_reserve(tiers);
}

kvs_status kvs_server_tiers_reserve(kvs_server_tiers *tiers, const kvs_key *key, uint64_t len,
                                    void **dst, uint64_t *ticket, char *err, uint64_t err_len) {
    return kvs_tiers_reserve(tiers, key, len, dst, ticket, err, err_len);
}

kvs_status kvs_server_tiers_commit(kvs_server_tiers *tiers, const kvs_key *key, uint64_t ticket,
                                   const void *object, uint64_t len, char *err, uint64_t err_len) {
    return kvs_tiers_commit(tiers, key, ticket, object, len, err, err_len);
}

void kvs_server_tiers_abort(kvs_server_tiers *tiers, uint64_t ticket) {
    kvs_tiers_abort(tiers, ticket);
}

uint64_t kvs_server_tiers_evictions(const kvs_server_tiers *tiers) {
    return kvs_tiers_evictions(tiers);
}

kvs_status kvs_server_config_refuse(const kvs_server_config *cfg, uint32_t tier, const char *key,
                                    char *err, size_t err_len, const char *sentence) {
    return kvs_config_refuse_tier(cfg->cfg, tier, key ? key : "", err, err_len, "%s", sentence);
}

kvs_status kvs_server_tier_open(const kvs_server_config *cfg, uint32_t tier,
                                uint64_t max_object_bytes, int32_t rank, kvs_server_tiers **out,
                                char *err, uint64_t err_len) {
    *out = NULL;
    if (tier >= cfg->cfg->n_tiers) {
        kvs_fmt(err, err_len, "%s has no tier %u", cfg->cfg->source, tier);
        return KVS_EINVAL;
    }
    kvs_config one = *cfg->cfg;
    one.tiers = &cfg->cfg->tiers[tier]; /* the same entry: refusals point at the same lines */
    one.n_tiers = 1;
    one.log_level = KVS_LOG_ERROR; /* the caller reports what went wrong, once */
    return kvs_tiers_open_ranked(&one, max_object_bytes, NULL, NULL, 0, rank, NULL, NULL, out, err,
                                 err_len);
}

const char *kvs_server_tiers_degraded(const kvs_server_tiers *tiers, uint32_t tier) {
    return kvs_tiers_degraded_reason(tiers, tier);
}

const char *kvs_server_tiers_last_error(const kvs_server_tiers *tiers, uint32_t tier) {
    return kvs_tiers_last_error(tiers, tier);
}

kvs_status kvs_server_metrics_render(const kvs_server_config *cfg, char **text, size_t *len,
                                     char *err, size_t err_len) {
    return kvs_metrics_render_config(cfg->cfg, text, len, err, err_len);
}
