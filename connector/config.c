/* config.c - strict YAML configuration: the top level of the file (scalars, `pool:`, `device:`,
 * `node:`, the tier list and each tier's capacity) read into a validated kvs_config, sizes, defaults,
 * the entry points, and refusals found after parsing that point back into the file. The reader is
 * config_yaml.c, a tier's other keys config_tiers.c, `restore:` config_restore.c. Validation walks
 * the tree with the key path in hand so each message names file, line, column and key. */
#include "config.h"

#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "abi/kvstrata_backend.h"
#include "common/units.h"
#include "config_metrics.h"
#include "config_restore.h"
#include "config_tiers.h"
#include "config_yaml.h"

static const char *const ROOT_KEYS[] = {
    "version", "chunk_tokens", "lease_timeout_ms", "save_decode", "log_level", "pool",  "tiers",
    "device",  "node",         "restore",          "loads",       "placement", "saves", "metrics"};
enum {
    RK_VERSION,
    RK_CHUNK,
    RK_LEASE,
    RK_SAVE_DECODE,
    RK_LOG_LEVEL,
    RK_POOL,
    RK_TIERS,
    RK_DEVICE,
    RK_NODE,
    RK_RESTORE,
    RK_LOADS,
    RK_PLACEMENT,
    RK_SAVES,
    RK_METRICS,
    RK_COUNT
};

/* Read by kvstrata-node only (its command-line flags override them); a connector ignores them. */
static const char *const NODE_KEYS[] = {"listen",
                                        "psk_file",
                                        "max_clients",
                                        "timeout_ms",
                                        "max_object_bytes",
                                        "max_handshakes",
                                        "busy_poll_us",
                                        "shared_memory_payloads",
                                        "max_sessions_per_tenant",
                                        "tenant_capacity",
                                        "tenants",
                                        "encrypt"};
enum {
    NK_LISTEN,
    NK_PSK,
    NK_MAX_CLIENTS,
    NK_TIMEOUT,
    NK_MAX_OBJECT,
    NK_MAX_HANDSHAKES,
    NK_BUSY_POLL,
    NK_SHM_PAYLOADS,
    NK_TENANT_SESSIONS,
    NK_TENANT_CAPACITY,
    NK_TENANTS,
    NK_ENCRYPT,
    NK_COUNT
};

static const char *const DEVICE_KEYS[] = {"copy_method", "hash_threads", "max_chunks_per_step",
                                          "host_copies", "host_threads"};
enum { DK_METHOD, DK_HASH_THREADS, DK_MAX_CHUNKS, DK_HOST_COPIES, DK_HOST_THREADS, DK_COUNT };
static const char *const HOST_COPIES[] = {"immediate", "deferred"};
static const char *const COPY_METHODS[] = {"auto", "kernel", "dma"}; /* KVS_DEV_COPY_* order */

static const char *const SAVES_KEYS[] = {"async", "timeout_ms"};
enum { SK_ASYNC, SK_TIMEOUT, SK_COUNT };

static const char *const POOL_KEYS[] = {"staging_bytes"};
enum { PK_STAGING, PK_COUNT };

static const char *const LOG_LEVELS[] = {"error", "warn", "info", "debug"};

/* ---- messages -------------------------------------------------------------------------------- */

kvs_status kvs_config_refuse(const kvs_config *cfg, kvs_config_at at, const char *key, char *err,
                             size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_status st = kvs_yaml_vrefuse(cfg, at, key, err, err_len, fmt, ap);
    va_end(ap);
    return st;
}

/* The YAML list a repeated option comes from (`path` from `paths:`), or NULL. */
static const char *list_of_option(const char *option) {
    return strcmp(option, "path") == 0 ? "paths" : strcmp(option, "node") == 0 ? "nodes" : NULL;
}

/* Where name (see kvs_config_refuse_tier) stands in tier t (number index): its key path and position. */
static kvs_config_at tier_position(const kvs_tier_config *t, size_t index, const char *name,
                                   char *key, size_t key_len) {
    char option[KVS_NAME_MAX];
    long nth = 0;
    const char *bracket = name ? strchr(name, '[') : NULL;
    size_t n = !name ? 0 : bracket ? (size_t)(bracket - name) : strlen(name);
    if (n == 0 || n >= sizeof option) {
        snprintf(key, key_len, "tiers[%zu]", index);
        return (kvs_config_at){t->line, t->column};
    }
    memcpy(option, name, n);
    option[n] = '\0';
    if (bracket) nth = strtol(bracket + 1, NULL, 10);
    for (size_t i = 0; i < t->n_options; i++) {
        const kvs_config_option *o = &t->options[i];
        if (strcmp(o->key, option) != 0 || nth-- > 0) continue;
        const char *list = list_of_option(option);
        if (o->list_index >= 0 && list)
            snprintf(key, key_len, "tiers[%zu].%s[%d]", index, list, o->list_index);
        else
            snprintf(key, key_len, "tiers[%zu].options.%s", index, option);
        return o->at;
    }
    size_t k = kvs_config_tier_key(option);
    if (k < TK_COUNT) {
        snprintf(key, key_len, "tiers[%zu].%s", index, option);
        return t->keys_at[k].line > 0 ? t->keys_at[k] : (kvs_config_at){t->line, t->column};
    }
    const char *list = list_of_option(option);
    if (list) { /* a list entry the file does not have: the list, else the tier */
        k = strcmp(list, "paths") == 0 ? TK_PATHS : TK_NODES;
        snprintf(key, key_len, "tiers[%zu].%s", index, list);
        return t->keys_at[k].line > 0 ? t->keys_at[k] : (kvs_config_at){t->line, t->column};
    }
    /* an option the backend needs and the file lacks: at the tier's `options:`, else the tier */
    snprintf(key, key_len, "tiers[%zu].options.%s", index, option);
    return t->keys_at[TK_OPTIONS].line > 0 ? t->keys_at[TK_OPTIONS]
                                           : (kvs_config_at){t->line, t->column};
}

kvs_status kvs_config_refuse_tier(const kvs_config *cfg, size_t tier, const char *name, char *err,
                                  size_t err_len, const char *fmt, ...) {
    char key[KEY_PATH_MAX];
    kvs_config_at at = tier_position(&cfg->tiers[tier], tier, name, key, sizeof key);
    va_list ap;
    va_start(ap, fmt);
    kvs_status st = kvs_yaml_vrefuse(cfg, at, key, err, err_len, fmt, ap);
    va_end(ap);
    return st;
}

/* A size with unit (common/units.h), > 0. */
static kvs_status get_size(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                           uint64_t *out) {
    char why[160];
    kvs_status st = kvs_yaml_expect_scalar(ctx, n, path, "a size such as 4GiB");
    if (st != KVS_OK) return st;
    if (kvs_units_parse_size(n->text, out, why, sizeof why) != KVS_OK) {
        char buf[SHOWN_MAX + 4];
        return kvs_yaml_fail(ctx, n, path, "bad size '%s': %s", kvs_yaml_shown(n, buf), why);
    }
    if (*out == 0) return kvs_yaml_fail(ctx, n, path, "the size must be greater than 0");
    return KVS_OK;
}

/* ---- tiers ----------------------------------------------------------------------------------- */

static uint64_t physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_size <= 0) return UINT64_MAX; /* unknown: do not refuse */
    return (uint64_t)pages * (uint64_t)page_size;
}

static kvs_status tier_capacity(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                                kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    const kvs_yaml_node *v = f->values[TK_CAPACITY];
    if (!v) {
        if (f->type == TYPE_DRAM)
            return kvs_yaml_missing_key(ctx, f->map, f->path, "capacity",
                                        " (a dram tier needs a size)");
        if (f->type == TYPE_SSD)
            return kvs_yaml_missing_key(ctx, f->map, f->path, "capacity",
                                        " (an ssd tier needs a size, over all paths)");
        return KVS_OK;
    }
    kvs_yaml_key_path(kp, f->path, "capacity");
    kvs_status st = get_size(ctx, v, kp, &t->capacity_bytes);
    if (st != KVS_OK) return st;
    uint64_t physical = physical_memory_bytes();
    if (f->type != TYPE_DRAM || t->capacity_bytes <= physical) return KVS_OK;
    char buf[SHOWN_MAX + 4];
    return kvs_yaml_fail(ctx, v, kp,
                         "%s (%llu bytes) is more than this machine's physical memory "
                         "(%llu bytes)",
                         kvs_yaml_shown(v, buf), (unsigned long long)t->capacity_bytes,
                         (unsigned long long)physical);
}

/* One tier entry: its capacity, a size, is read here beside the size parser; the rest of its keys by
 * config_tiers.c, in the order the refusals have always come in. */
static kvs_status parse_tier(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, kvs_config *cfg,
                             size_t index) {
    kvs_tier_fields f;
    kvs_status st = kvs_config_tier_begin(ctx, n, cfg, index, &f);
    if (st == KVS_OK) st = tier_capacity(ctx, &f, &cfg->tiers[index]);
    if (st == KVS_OK) st = kvs_config_tier_end(ctx, &f, &cfg->tiers[index]);
    return st;
}

static kvs_status parse_tiers(const kvs_yaml_ctx *ctx, const kvs_yaml_node *root,
                              const kvs_yaml_node *v, kvs_config *cfg) {
    if (!v)
        return kvs_yaml_missing_key(ctx, root, NULL, "tiers", " (a sequence of at least one tier)");
    if (v->kind != KVS_YAML_SEQUENCE)
        return kvs_yaml_fail(ctx, v, "tiers", "expected a sequence of tiers, found %s",
                             kvs_yaml_describe(v));
    if (v->n_items == 0) return kvs_yaml_fail(ctx, v, "tiers", "at least one tier is required");
    if (v->n_items > KVS_CONFIG_MAX_TIERS)
        return kvs_yaml_fail(ctx, v, "tiers", "%zu tiers, at most %d are allowed", v->n_items,
                             KVS_CONFIG_MAX_TIERS);
    cfg->tiers = calloc(v->n_items, sizeof *cfg->tiers);
    if (!cfg->tiers) return kvs_yaml_out_of_memory(ctx);
    cfg->n_tiers = v->n_items; /* zeroed entries: kvs_config_free copes with a partial fill */
    for (size_t i = 0; i < v->n_items; i++) {
        kvs_status st = parse_tier(ctx, v->items[i], cfg, i);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* ---- the top level --------------------------------------------------------------------------- */

static void set_defaults(kvs_config *cfg) {
    cfg->version = 1;
    cfg->chunk_tokens = 256;
    cfg->lease_timeout_ms = 30000;
    cfg->save_decode = 0;
    cfg->log_level = KVS_LOG_WARN;
    cfg->staging_bytes = 256ull << 20;
    cfg->copy_method = 0;
    cfg->hash_threads = 4;
    cfg->host_threads = 1;
    cfg->max_chunks_per_step = 1024;
    cfg->saves.timeout_ms = 5000;
    cfg->restore.priority =
        1; /* srf: docs/cacheflow.md shows the paper's lrf losing on mean TTFT */
    cfg->placement.alpha = 0.1;
    cfg->placement.freq_prior = 0.1;
    cfg->placement.reevaluate_ms = 1000;
    cfg->placement.decode_bytes_per_s = 1000000000ull;
    cfg->placement.codecs = KVS_PLACEMENT_CODECS_ALL;
}

static kvs_status parse_device(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v, kvs_config *cfg) {
    const kvs_yaml_node *keys[DK_COUNT] = {NULL}, *values[DK_COUNT] = {NULL};
    kvs_status st =
        kvs_yaml_mapping_fields(ctx, v, "device", DEVICE_KEYS, DK_COUNT, keys, values, 0);
    uint64_t value;
    size_t choice;
    if (st == KVS_OK && values[DK_METHOD]) {
        st = kvs_yaml_get_choice(ctx, values[DK_METHOD], "device.copy_method", COPY_METHODS,
                                 COUNT_OF(COPY_METHODS), &choice);
        if (st == KVS_OK) cfg->copy_method = (int)choice;
    }
    if (st == KVS_OK && values[DK_HASH_THREADS]) {
        st = kvs_yaml_get_uint(ctx, values[DK_HASH_THREADS], "device.hash_threads", 1, 64, &value);
        if (st == KVS_OK) cfg->hash_threads = (uint32_t)value;
    }
    if (st == KVS_OK && values[DK_MAX_CHUNKS]) {
        st = kvs_yaml_get_uint(ctx, values[DK_MAX_CHUNKS], "device.max_chunks_per_step", 1,
                               1u << 20, &value);
        if (st == KVS_OK) cfg->max_chunks_per_step = (uint32_t)value;
    }
    if (st == KVS_OK && values[DK_HOST_COPIES]) {
        st = kvs_yaml_get_choice(ctx, values[DK_HOST_COPIES], "device.host_copies", HOST_COPIES,
                                 COUNT_OF(HOST_COPIES), &choice);
        if (st == KVS_OK) cfg->host_deferred = choice == 1;
    }
    if (st == KVS_OK && values[DK_HOST_THREADS]) {
        st = kvs_yaml_get_uint(ctx, values[DK_HOST_THREADS], "device.host_threads", 1, 64, &value);
        if (st == KVS_OK) cfg->host_threads = (uint32_t)value;
    }
    return st;
}

/* `node.tenants`: a mapping of tenant names to the capacity each may hold on the node. */
static kvs_status parse_node_tenants(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                     kvs_config *cfg) {
    if (v->kind != KVS_YAML_MAPPING)
        return kvs_yaml_fail(ctx, v, "node.tenants",
                             "expected a mapping of tenant names to capacities, found %s",
                             kvs_yaml_describe(v));
    if (v->n_items / 2 > KVS_CONFIG_MAX_TENANTS)
        return kvs_yaml_fail(ctx, v, "node.tenants", "%zu tenants, at most %d are allowed",
                             v->n_items / 2, KVS_CONFIG_MAX_TENANTS);
    for (size_t i = 0; i < v->n_items / 2; i++) {
        const kvs_yaml_node *k = v->items[2 * i], *size = v->items[2 * i + 1];
        char kp[KEY_PATH_MAX];
        snprintf(kp, sizeof kp, "node.tenants.%.64s", k->kind == KVS_YAML_SCALAR ? k->text : "?");
        size_t len = k->kind == KVS_YAML_SCALAR ? k->len : 0;
        if (len == 0 || len > KVS_CONFIG_TENANT_MAX ||
            strspn(k->text, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
                len)
            return kvs_yaml_fail(ctx, k, kp, "a tenant name is 1 to %d of A-Z a-z 0-9 . _ -",
                                 KVS_CONFIG_TENANT_MAX);
        for (uint32_t j = 0; j < cfg->node.n_tenants; j++)
            if (strcmp(cfg->node.tenants[j].name, k->text) == 0)
                return kvs_yaml_fail(ctx, k, kp, "duplicate tenant");
        uint64_t bytes = 0;
        kvs_status st = get_size(ctx, size, kp, &bytes);
        if (st != KVS_OK) return st;
        memcpy(cfg->node.tenants[cfg->node.n_tenants].name, k->text, len + 1);
        cfg->node.tenants[cfg->node.n_tenants++].capacity = bytes;
    }
    return KVS_OK;
}

static kvs_status parse_node(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v, kvs_config *cfg) {
    const kvs_yaml_node *keys[NK_COUNT] = {NULL}, *values[NK_COUNT] = {NULL};
    kvs_status st = kvs_yaml_mapping_fields(ctx, v, "node", NODE_KEYS, NK_COUNT, keys, values, 0);
    uint64_t value;
    if (st == KVS_OK && values[NK_LISTEN]) {
        st = kvs_yaml_get_text(ctx, values[NK_LISTEN], "node.listen", cfg->node.listen,
                               sizeof cfg->node.listen);
        const char *colon = st == KVS_OK ? strrchr(cfg->node.listen, ':') : NULL;
        char *end = NULL;
        unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
        if (st == KVS_OK &&
            (!colon || colon == cfg->node.listen || !colon[1] || *end || port > 65535))
            st = kvs_yaml_fail(ctx, values[NK_LISTEN], "node.listen",
                               "expected HOST:PORT (port 0..65535; 0 picks one), found "
                               "'%s'",
                               cfg->node.listen);
    }
    if (st == KVS_OK && values[NK_PSK])
        st = kvs_yaml_get_path(ctx, values[NK_PSK], "node.psk_file", cfg->node.psk_file,
                               sizeof cfg->node.psk_file);
    if (st == KVS_OK && values[NK_MAX_CLIENTS]) {
        st =
            kvs_yaml_get_uint(ctx, values[NK_MAX_CLIENTS], "node.max_clients", 1, 1u << 20, &value);
        if (st == KVS_OK) cfg->node.max_clients = (uint32_t)value;
    }
    if (st == KVS_OK && values[NK_TIMEOUT]) {
        st = kvs_yaml_get_uint(ctx, values[NK_TIMEOUT], "node.timeout_ms", 1, 3600000, &value);
        if (st == KVS_OK) cfg->node.timeout_ms = (uint32_t)value;
    }
    if (st == KVS_OK && values[NK_MAX_OBJECT]) {
        st = get_size(ctx, values[NK_MAX_OBJECT], "node.max_object_bytes", &value);
        if (st == KVS_OK && (value == 0 || value > (1ull << 32)))
            st = kvs_yaml_fail(ctx, values[NK_MAX_OBJECT], "node.max_object_bytes",
                               "must be from 1 byte to 4GiB");
        if (st == KVS_OK) cfg->node.max_object_bytes = value;
    }
    if (st == KVS_OK && values[NK_MAX_HANDSHAKES]) {
        st = kvs_yaml_get_uint(ctx, values[NK_MAX_HANDSHAKES], "node.max_handshakes", 1, 1u << 16,
                               &value);
        if (st == KVS_OK) cfg->node.max_handshakes = (uint32_t)value;
    }
    if (st == KVS_OK && values[NK_BUSY_POLL]) {
        st = kvs_yaml_get_uint(ctx, values[NK_BUSY_POLL], "node.busy_poll_us", 0, 100000, &value);
        if (st == KVS_OK) cfg->node.busy_poll_us = (uint32_t)value + 1;
    }
    if (st == KVS_OK && values[NK_TENANT_SESSIONS]) {
        st = kvs_yaml_get_uint(ctx, values[NK_TENANT_SESSIONS], "node.max_sessions_per_tenant", 1,
                               1u << 20, &value);
        if (st == KVS_OK) cfg->node.max_sessions_per_tenant = (uint32_t)value;
    }
    if (st == KVS_OK && values[NK_TENANT_CAPACITY]) {
        st = get_size(ctx, values[NK_TENANT_CAPACITY], "node.tenant_capacity",
                      &cfg->node.tenant_capacity);
    }
    if (st == KVS_OK && values[NK_TENANTS]) st = parse_node_tenants(ctx, values[NK_TENANTS], cfg);
    if (st == KVS_OK && values[NK_SHM_PAYLOADS]) {
        int on = 0;
        st = kvs_yaml_get_bool(ctx, values[NK_SHM_PAYLOADS], "node.shared_memory_payloads", &on);
        if (st == KVS_OK) cfg->node.shared_memory_payloads = on + 1;
    }
    if (st == KVS_OK && values[NK_ENCRYPT]) {
        int on = 0;
        st = kvs_yaml_get_bool(ctx, values[NK_ENCRYPT], "node.encrypt", &on);
        if (st == KVS_OK) cfg->node.encrypt = on + 1;
    }
    return st;
}

static kvs_status parse_pool(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v, kvs_config *cfg) {
    const kvs_yaml_node *keys[PK_COUNT] = {NULL}, *values[PK_COUNT] = {NULL};
    kvs_status st = kvs_yaml_mapping_fields(ctx, v, "pool", POOL_KEYS, PK_COUNT, keys, values, 0);
    if (st == KVS_OK && values[PK_STAGING])
        st = get_size(ctx, values[PK_STAGING], "pool.staging_bytes", &cfg->staging_bytes);
    return st;
}

static kvs_status parse_saves(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v, kvs_config *cfg) {
    const kvs_yaml_node *keys[SK_COUNT] = {NULL}, *values[SK_COUNT] = {NULL};
    kvs_status st = kvs_yaml_mapping_fields(ctx, v, "saves", SAVES_KEYS, SK_COUNT, keys, values, 0);
    if (st == KVS_OK && values[SK_ASYNC])
        st = kvs_yaml_get_bool(ctx, values[SK_ASYNC], "saves.async", &cfg->saves.async);
    if (st == KVS_OK && values[SK_TIMEOUT])
        st = kvs_yaml_get_uint(ctx, values[SK_TIMEOUT], "saves.timeout_ms", 0, 3600000,
                               &cfg->saves.timeout_ms);
    return st;
}

static kvs_status parse_scalars(const kvs_yaml_ctx *ctx, const kvs_yaml_node *const *values,
                                kvs_config *cfg) {
    uint64_t value;
    size_t level;
    kvs_status st = KVS_OK;
    if (values[RK_VERSION]) {
        st = kvs_yaml_get_uint(ctx, values[RK_VERSION], "version", 1, 1, &value);
        if (st != KVS_OK) return st;
        cfg->version = (uint32_t)value;
    }
    if (values[RK_CHUNK]) {
        st = kvs_yaml_get_uint(ctx, values[RK_CHUNK], "chunk_tokens", 1, 65536, &value);
        if (st != KVS_OK) return st;
        cfg->chunk_tokens = (uint32_t)value;
        cfg->chunk_tokens_at = (kvs_config_at){values[RK_CHUNK]->line, values[RK_CHUNK]->column};
    }
    if (values[RK_LEASE]) {
        st = kvs_yaml_get_uint(ctx, values[RK_LEASE], "lease_timeout_ms", 1, UINT64_MAX,
                               &cfg->lease_timeout_ms);
        if (st != KVS_OK) return st;
    }
    if (values[RK_SAVE_DECODE]) {
        st = kvs_yaml_get_bool(ctx, values[RK_SAVE_DECODE], "save_decode", &cfg->save_decode);
        if (st != KVS_OK) return st;
    }
    if (values[RK_LOG_LEVEL]) {
        st = kvs_yaml_get_choice(ctx, values[RK_LOG_LEVEL], "log_level", LOG_LEVELS,
                                 COUNT_OF(LOG_LEVELS), &level);
        if (st != KVS_OK) return st;
        cfg->log_level = KVS_LOG_ERROR + (int)level; /* LOG_LEVELS follows the KVS_LOG_* order */
    }
    return st;
}

static int is_null_scalar(const kvs_yaml_node *n) {
    if (n->kind != KVS_YAML_SCALAR || !n->plain) return 0;
    return n->len == 0 || strcmp(n->text, "~") == 0 || strcasecmp(n->text, "null") == 0;
}

static kvs_status parse_root(const kvs_yaml_ctx *ctx, const kvs_yaml_node *root, kvs_config *cfg) {
    const kvs_yaml_node *keys[RK_COUNT] = {NULL}, *values[RK_COUNT] = {NULL};
    if (!root || is_null_scalar(root)) {
        int line = root ? root->line : 1, column = root ? root->column : 1;
        return kvs_yaml_fail_at(ctx, line, column, NULL,
                                "the document is empty (a mapping with at least "
                                "`tiers:` is required)");
    }
    if (root->kind != KVS_YAML_MAPPING)
        return kvs_yaml_fail(ctx, root, NULL, "expected a mapping at the top level, found %s",
                             kvs_yaml_describe(root));
    kvs_status st = kvs_yaml_map_fields(ctx, root, NULL, ROOT_KEYS, RK_COUNT, keys, values);
    if (st == KVS_OK) st = parse_scalars(ctx, values, cfg);
    if (st == KVS_OK && values[RK_POOL]) st = parse_pool(ctx, values[RK_POOL], cfg);
    if (st == KVS_OK && values[RK_DEVICE]) st = parse_device(ctx, values[RK_DEVICE], cfg);
    if (st == KVS_OK && values[RK_NODE]) st = parse_node(ctx, values[RK_NODE], cfg);
    if (st == KVS_OK) st = parse_tiers(ctx, root, values[RK_TIERS], cfg);
    if (st == KVS_OK && values[RK_RESTORE])
        st = kvs_config_parse_restore(ctx, values[RK_RESTORE], cfg);
    if (st == KVS_OK && values[RK_LOADS]) st = kvs_config_parse_loads(ctx, values[RK_LOADS], cfg);
    if (st == KVS_OK && values[RK_PLACEMENT])
        st = kvs_config_parse_placement(ctx, values[RK_PLACEMENT], cfg);
    if (st == KVS_OK && values[RK_SAVES]) st = parse_saves(ctx, values[RK_SAVES], cfg);
    if (st == KVS_OK && values[RK_METRICS])
        st = kvs_config_parse_metrics(ctx, values[RK_METRICS], cfg);
    return st;
}

static kvs_status parse_buffer(const kvs_yaml_ctx *ctx, kvs_config **out) {
    kvs_yaml_node *root = NULL;
    kvs_config *cfg = NULL;
    kvs_status st;
    st = kvs_yaml_read_tree(ctx, &root);
    if (st != KVS_OK) goto fail;
    cfg = calloc(1, sizeof *cfg);
    if (!cfg) {
        st = kvs_yaml_out_of_memory(ctx);
        goto fail;
    }
    set_defaults(cfg);
    snprintf(cfg->source, sizeof cfg->source, "%s", ctx->name);
    st = parse_root(ctx, root, cfg);
    if (st != KVS_OK) goto fail;
    kvs_yaml_node_free(root);
    *out = cfg;
    return KVS_OK;
fail:
    kvs_config_free(cfg);
    kvs_yaml_node_free(root);
    return st;
}

/* ---- entry points ---------------------------------------------------------------------------- */

/* The absolute directory of `file` in out (or as written when it cannot be resolved). */
static void directory_of(const char *file, char *out, size_t out_len) {
    char *copy = strdup(file);
    if (!copy) {
        snprintf(out, out_len, ".");
        return;
    }
    const char *dir = dirname(copy);
    char *absolute = realpath(dir, NULL);
    snprintf(out, out_len, "%s", absolute ? absolute : dir);
    free(absolute);
    free(copy);
}

kvs_status kvs_config_load(const char *path, kvs_config **out, char *err, size_t err_len) {
    char base_dir[KVS_PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    if (out) *out = NULL;
    if (!path || !out) {
        if (err && err_len) snprintf(err, err_len, "kvs_config_load: path and out are required");
        return KVS_EINVAL;
    }
    kvs_status st = kvs_yaml_read_file(path, &text, &len, err, err_len);
    if (st != KVS_OK) return st;
    directory_of(path, base_dir, sizeof base_dir);
    kvs_yaml_ctx ctx = {path, base_dir, text, len, err, err_len};
    st = parse_buffer(&ctx, out);
    free(text);
    return st;
}

kvs_status kvs_config_parse_string(const char *yaml, size_t len, const char *name, kvs_config **out,
                                   char *err, size_t err_len) {
    char base_dir[KVS_PATH_MAX];
    if (out) *out = NULL;
    if (!out || (!yaml && len)) {
        if (err && err_len) snprintf(err, err_len, "kvs_config_parse_string: out is required");
        return KVS_EINVAL;
    }
    if (!name) name = "<string>";
    kvs_yaml_ctx ctx = {name, NULL, yaml ? yaml : "", len, err, err_len};
    if (strchr(name, '/')) {
        directory_of(name, base_dir, sizeof base_dir);
        ctx.base_dir = base_dir;
    }
    return parse_buffer(&ctx, out);
}

kvs_status kvs_config_defaults(kvs_config **out) {
    if (!out) return KVS_EINVAL;
    *out = NULL;
    kvs_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return KVS_ENOMEM;
    cfg->tiers = calloc(1, sizeof *cfg->tiers);
    if (!cfg->tiers) {
        free(cfg);
        return KVS_ENOMEM;
    }
    set_defaults(cfg);
    snprintf(cfg->source, sizeof cfg->source, "<defaults>");
    cfg->n_tiers = 1;
    snprintf(cfg->tiers[0].name, sizeof cfg->tiers[0].name, "dram");
    snprintf(cfg->tiers[0].type, sizeof cfg->tiers[0].type, "dram");
    cfg->tiers[0].capacity_bytes = 1ull << 30;
    cfg->tiers[0].write = KVS_WRITE_BACK;
    *out = cfg;
    return KVS_OK;
}

void kvs_config_free(kvs_config *cfg) {
    if (!cfg) return;
    for (size_t i = 0; i < cfg->n_tiers; i++) {
        kvs_tier_config *t = &cfg->tiers[i];
        for (size_t j = 0; j < t->n_options; j++) {
            free(t->options[j].key);
            free(t->options[j].value);
        }
        free(t->options);
    }
    free(cfg->tiers);
    free(cfg);
}
