/* redis_options.c - the redis tier's options (contract in redis.h). */
#include <stdio.h>
#include <string.h>

#include "common/options.h"
#include "redis.h"

static int parse_node(const char *value, void *out, uint64_t nth, char *why, size_t why_len) {
    kvs_redis_options *o = out;
    (void)nth;
    if (o->n_nodes == KVS_REDIS_MAX_SEEDS) {
        snprintf(why, why_len, "more than %d nodes", KVS_REDIS_MAX_SEEDS);
        return -1;
    }
    o->nodes[o->n_nodes++] = value;
    return 0;
}

static int parse_tenant(const char *value, void *out, uint64_t nth, char *why, size_t why_len) {
    kvs_redis_options *o = out;
    (void)nth;
    size_t len = strlen(value);
    if (len == 0 || len > KVS_REDIS_MAX_TENANT ||
        strspn(value, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != len) {
        snprintf(why, why_len, "tenant \"%.80s\" is not 1 to %d of A-Z a-z 0-9 . _ -", value,
                 KVS_REDIS_MAX_TENANT);
        return -1;
    }
    o->tenant = value;
    return 0;
}

static const kvs_option_desc OPTIONS[] = {
    {.name = "node", .kind = KVS_OPTION_CUSTOM, .repeated = 1, .parse = parse_node},
    {.name = "mode",
     .kind = KVS_OPTION_CHOICE,
     KVS_OPTION_FIELD(kvs_redis_options, cluster),
     .choices = "standalone|cluster"},
    {.name = "tenant", .kind = KVS_OPTION_CUSTOM, .parse = parse_tenant},
    {.name = "timeout_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(kvs_redis_options, timeout_ms),
     .min = 1,
     .max = 600000},
    {.name = "connections_per_node",
     .kind = KVS_OPTION_COUNT,
     KVS_OPTION_FIELD(kvs_redis_options, connections_per_node),
     .min = 1,
     .max = 16},
    {.name = "inflight_bytes",
     .kind = KVS_OPTION_SIZE,
     KVS_OPTION_FIELD(kvs_redis_options, inflight_bytes),
     .min = 64 << 10,
     .max = 1ull << 32,
     .example = "2MiB"},
    {.name = "connect_backoff_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(kvs_redis_options, connect_backoff_ms),
     .min = 1,
     .max = 5000},
    {.name = "user", .kind = KVS_OPTION_STRING, KVS_OPTION_FIELD(kvs_redis_options, user)},
    {.name = "password_file",
     .kind = KVS_OPTION_STRING,
     KVS_OPTION_FIELD(kvs_redis_options, password_file)},
    {.name = "tls.ca_file",
     .kind = KVS_OPTION_STRING,
     KVS_OPTION_FIELD(kvs_redis_options, tls_ca_file)},
    {.name = "tls.cert_file",
     .kind = KVS_OPTION_STRING,
     KVS_OPTION_FIELD(kvs_redis_options, tls_cert_file)},
    {.name = "tls.key_file",
     .kind = KVS_OPTION_STRING,
     KVS_OPTION_FIELD(kvs_redis_options, tls_key_file)},
    {.name = "tls.server_name",
     .kind = KVS_OPTION_STRING,
     KVS_OPTION_FIELD(kvs_redis_options, tls_server_name)},
};

kvs_status kvs_redis_options_parse(const kvs_backend_option *options, uint64_t n_options,
                                   kvs_redis_options *o, char *why, size_t why_len, char *refused,
                                   size_t refused_len) {
    memset(o, 0, sizeof *o);
    o->tenant = "default";
    o->timeout_ms = KVS_REDIS_DEFAULT_TIMEOUT;
    o->connections_per_node = 2;
    o->inflight_bytes = 2ull << 20;
    o->connect_backoff_ms = 100;
    kvs_status st = kvs_options_parse(OPTIONS, sizeof OPTIONS / sizeof OPTIONS[0], options,
                                      n_options, o, NULL, why, why_len, refused, refused_len);
    if (st != KVS_OK) return st;
    if (o->n_nodes == 0) {
        snprintf(why, why_len,
                 "needs at least one node (YAML `nodes: [10.0.0.7:6379]` or a unix socket path)");
        return kvs_options_refuse(refused, refused_len, "node", -1);
    }
    if (!o->cluster && o->n_nodes > 1) {
        snprintf(why, why_len,
                 "mode standalone takes exactly one node (%u given); for several masters use "
                 "mode: cluster",
                 o->n_nodes);
        return kvs_options_refuse(refused, refused_len, "node", 1);
    }
    if (o->user && !o->password_file) {
        snprintf(why, why_len, "user \"%.80s\" needs password_file", o->user);
        return kvs_options_refuse(refused, refused_len, "password_file", -1);
    }
    if (!o->tls_cert_file != !o->tls_key_file) {
        snprintf(why, why_len, "tls.cert_file and tls.key_file go together (a client certificate)");
        return kvs_options_refuse(refused, refused_len,
                                  o->tls_cert_file ? "tls.key_file" : "tls.cert_file", -1);
    }
    if ((o->tls_cert_file || o->tls_server_name) && !o->tls_ca_file) {
        snprintf(why, why_len, "TLS needs tls.ca_file (the CA the servers' certificates chain to)");
        return kvs_options_refuse(refused, refused_len, "tls.ca_file", -1);
    }
    return KVS_OK;
}
