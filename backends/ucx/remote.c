/*
 * remote.c - the remote tier's ops table and strict option parsing (contract in remote.h). The I/O
 * lives in ucx_remote.c, built only with UCX; without it create refuses with KVS_ENOTSUP.
 */
#include "remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "common/options.h"
#include "wire.h"

static int parse_node_option(const char *value, void *out, uint64_t nth, char *why,
                             size_t why_len) {
    kvs_remote_options *o = out;
    (void)nth;
    const char *colon = strrchr(value, ':');
    uint64_t port = 0;
    if (!colon || colon == value || kvs_option_count(colon + 1, 1, 65535, &port) != 0) {
        snprintf(why, why_len, "node \"%.80s\" is not HOST:PORT (port 1..65535)", value);
        return -1;
    }
    size_t host_len = (size_t)(colon - value);
    if (host_len >= KVS_REMOTE_HOST_BYTES || strlen(value) > KVS_REMOTE_RING_MAX_ID_BYTES) {
        snprintf(why, why_len, "node \"%.80s\" is too long", value);
        return -1;
    }
    if (o->n_nodes == KVS_REMOTE_RING_MAX_NODES) {
        snprintf(why, why_len, "more than %u nodes", KVS_REMOTE_RING_MAX_NODES);
        return -1;
    }
    for (uint32_t i = 0; i < o->n_nodes; i++) {
        if (strcmp(o->ids[i], value) == 0) {
            snprintf(why, why_len, "node \"%.80s\" is listed twice", value);
            return -1;
        }
    }
    memcpy(o->hosts[o->n_nodes], value, host_len);
    o->hosts[o->n_nodes][host_len] = '\0';
    o->ports[o->n_nodes] = (uint16_t)port;
    o->ids[o->n_nodes] = value;
    o->n_nodes++;
    return 0;
}

static int parse_tenant(const char *value, void *out, uint64_t nth, char *why, size_t why_len) {
    kvs_remote_options *o = out;
    (void)nth;
    if (strlen(value) > KVS_WIRE_MAX_TENANT_BYTES ||
        !kvs_wire_tenant_ok(value, (uint32_t)strlen(value))) {
        snprintf(why, why_len, "tenant \"%.80s\" is not 1 to %u of A-Z a-z 0-9 . _ -", value,
                 KVS_WIRE_MAX_TENANT_BYTES);
        return -1;
    }
    o->tenant = value;
    return 0;
}

/* The options, by name (YAML `nodes:` arrive as repeated `node`), and where each goes. */
static const kvs_option_desc OPTIONS[] = {
    {.name = "node", .kind = KVS_OPTION_CUSTOM, .repeated = 1, .parse = parse_node_option},
    {.name = "psk_file", .kind = KVS_OPTION_STRING, KVS_OPTION_FIELD(kvs_remote_options, psk_file)},
    {.name = "tenant", .kind = KVS_OPTION_CUSTOM, .parse = parse_tenant},
    {.name = "replicas",
     .kind = KVS_OPTION_COUNT,
     KVS_OPTION_FIELD(kvs_remote_options, replicas),
     .min = 1,
     .max = KVS_REMOTE_RING_MAX_REPLICAS},
    {.name = "timeout_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(kvs_remote_options, timeout_ms),
     .min = 1,
     .max = 600000},
    {.name = "connect_backoff_ms",
     .kind = KVS_OPTION_MILLISECONDS,
     KVS_OPTION_FIELD(kvs_remote_options, connect_backoff_ms),
     .min = 1,
     .max = KVS_REMOTE_MAX_BACKOFF_MS},
    {.name = "shared_memory", /* its index is the flag: off 0, auto 1 */
     .kind = KVS_OPTION_CHOICE,
     KVS_OPTION_FIELD(kvs_remote_options, shared_memory),
     .choices = "off|auto"},
    {.name = "payloads", /* its index is the KVS_REMOTE_PAYLOADS_ value */
     .kind = KVS_OPTION_CHOICE,
     KVS_OPTION_FIELD(kvs_remote_options, payloads),
     .choices = "auto|rma|messages|stream"},
    {.name = "busy_poll_us",
     .kind = KVS_OPTION_COUNT,
     KVS_OPTION_FIELD(kvs_remote_options, busy_poll_us),
     .min = 0,
     .max = 100000},
    {.name = "encrypt", .kind = KVS_OPTION_BOOL, KVS_OPTION_FIELD(kvs_remote_options, encrypt)},
    {.name = "put_queue_mb",
     .kind = KVS_OPTION_COUNT,
     KVS_OPTION_FIELD(kvs_remote_options, put_queue_mb),
     .min = 1,
     .max = 65536},
};

kvs_status kvs_remote_options_parse(const kvs_backend_option *options, uint64_t n_options,
                                    kvs_remote_options *o, char *why, size_t why_len) {
    return kvs_remote_options_parse_named(options, n_options, o, why, why_len, NULL, 0);
}

kvs_status kvs_remote_options_parse_named(const kvs_backend_option *options, uint64_t n_options,
                                          kvs_remote_options *o, char *why, size_t why_len,
                                          char *refused, size_t refused_len) {
    memset(o, 0, sizeof *o);
    o->replicas = 1;
    o->timeout_ms = KVS_REMOTE_DEFAULT_TIMEOUT_MS;
    o->connect_backoff_ms = KVS_REMOTE_DEFAULT_BACKOFF_MS;
    o->put_queue_mb = KVS_REMOTE_DEFAULT_PUT_QUEUE_MB;
    o->busy_poll_us = KVS_REMOTE_DEFAULT_BUSY_POLL_US;
    o->shared_memory = 1; /* auto: docs/remote.md, "Shared memory on one host" */
    kvs_status rc = kvs_options_parse(OPTIONS, sizeof OPTIONS / sizeof OPTIONS[0], options,
                                      n_options, o, NULL, why, why_len, refused, refused_len);
    if (rc != KVS_OK) return rc;
    if (o->n_nodes == 0) {
        snprintf(why, why_len, "needs at least one node (YAML `nodes: [10.0.0.7:13337, ...]`)");
        return kvs_options_refuse(refused, refused_len, "node", -1);
    }
    if (!o->psk_file) {
        snprintf(why, why_len, "needs option psk_file (the pre-shared key file of the nodes)");
        return kvs_options_refuse(refused, refused_len, "psk_file", -1);
    }
    if (!o->tenant) {
        snprintf(why, why_len, "needs option tenant (this client's namespace on the nodes)");
        return kvs_options_refuse(refused, refused_len, "tenant", -1);
    }
    if (o->encrypt &&
        (o->payloads == KVS_REMOTE_PAYLOADS_RMA || o->payloads == KVS_REMOTE_PAYLOADS_MESSAGES)) {
        snprintf(why, why_len,
                 "payloads %s carries objects over UCX in the clear; with encrypt: true objects "
                 "go on the TLS stream only (payloads: stream or auto)",
                 o->payloads == KVS_REMOTE_PAYLOADS_RMA ? "rma" : "messages");
        return kvs_options_refuse(refused, refused_len, "payloads", -1);
    }
    if (o->replicas > o->n_nodes) {
        snprintf(why, why_len, "replicas %u needs at least %u nodes; %u given", o->replicas,
                 o->replicas, o->n_nodes);
        return kvs_options_refuse(refused, refused_len, "replicas", -1);
    }
    return KVS_OK;
}

/* The key file is part of the configuration: one that is missing, unreadable or open to others is
 * refused here, as KVS_ECONFIG naming psk_file, before any connection is made. */
static kvs_status check_psk_file(const kvs_remote_options *o, char *why, size_t why_len) {
    kvs_remote_psk psk;
    kvs_status st = kvs_remote_psk_load(o->psk_file, &psk, why, why_len);
    kvs_remote_psk_clear(&psk);
    return st == KVS_OK ? KVS_OK : KVS_ECONFIG;
}

static kvs_status remote_create(const kvs_backend_init *init, void **state) {
    char why[512] = "", refused[80] = "";
    kvs_remote_options *o = calloc(1, sizeof *o);
    *state = NULL;
    if (!o) {
        if (init->error && init->error_len)
            snprintf(init->error, init->error_len, "remote tier \"%s\": out of memory",
                     init->tier_name);
        return KVS_ENOMEM;
    }
    kvs_status st = kvs_remote_options_parse_named(init->options, init->n_options, o, why,
                                                   sizeof why, refused, sizeof refused);
    if (st == KVS_OK && (st = check_psk_file(o, why, sizeof why)) != KVS_OK)
        snprintf(refused, sizeof refused, "psk_file");
    if (st != KVS_OK) {
        if (init->error && init->error_len)
            snprintf(init->error, init->error_len, "remote tier \"%s\": %s", init->tier_name, why);
        kvs_option_refused(init, refused, -1);
        free(o);
        return st;
    }
    st = kvs_remote_create(init, o, state);
    free(o);
    return st;
}

static kvs_status remote_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                             uint64_t *n_pinned) {
    (void)timeout_ms; /* remote objects are not leased: a pin only reports what is present now */
    return kvs_remote_contains(state, keys, n, n_pinned);
}

static kvs_status remote_unpin(void *state, const kvs_key *keys, uint64_t n) {
    (void)state;
    (void)keys;
    (void)n;
    return KVS_OK;
}

static kvs_status remote_get(void *state, const kvs_key *key, void *dst, uint64_t cap,
                             uint64_t *len) {
    void *dsts[1] = {dst};
    kvs_status st = KVS_EIO;
    *len = 0;
    kvs_status call = kvs_remote_get_many(state, key, dsts, &cap, 1, len, &st);
    return call != KVS_OK ? call : st;
}

static kvs_status remote_get_ref(void *state, const kvs_key *key, const void **object,
                                 uint64_t *len) {
    (void)state;
    (void)key;
    (void)object;
    (void)len;
    return KVS_ENOTSUP;
}

static const kvs_backend_ops REMOTE_OPS = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_GET_MANY | KVS_BACKEND_CAP_REMOTE |
            KVS_BACKEND_CAP_SHARED,
    .type_name = "remote",
    .create = remote_create,
    .destroy = kvs_remote_destroy,
    .last_error = kvs_remote_last_error,
    .contains = kvs_remote_contains,
    .pin = remote_pin,
    .unpin = remote_unpin,
    .get = remote_get,
    .get_ref = remote_get_ref,
    .put = kvs_remote_put,
    .remove = kvs_remote_remove,
    .usage = kvs_remote_usage,
    .get_many = kvs_remote_get_many,
};

const kvs_backend_ops *kvs_remote_backend(void) {
    return &REMOTE_OPS;
}

#ifndef KVS_HAVE_UCX
/* A build without UCX keeps the type known so a configuration names the real problem. */
kvs_status kvs_remote_create(const kvs_backend_init *init, const kvs_remote_options *o,
                             void **state) {
    (void)o;
    *state = NULL;
    if (init->error && init->error_len)
        snprintf(init->error, init->error_len,
                 "remote tier \"%s\": this build of kvstrata has no UCX (install UCX and rebuild "
                 "to use type remote)",
                 init->tier_name);
    return KVS_ENOTSUP;
}
void kvs_remote_destroy(void *state) {
    (void)state;
}
const char *kvs_remote_last_error(void *state) {
    (void)state;
    return "this build has no UCX";
}
kvs_status kvs_remote_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    (void)state, (void)keys, (void)n;
    *n_present = 0;
    return KVS_ENOTSUP;
}
kvs_status kvs_remote_get_many(void *state, const kvs_key *keys, void *const *dsts,
                               const uint64_t *caps, uint64_t n, uint64_t *lens,
                               kvs_status *statuses) {
    (void)state, (void)keys, (void)dsts, (void)caps, (void)n, (void)lens, (void)statuses;
    return KVS_ENOTSUP;
}
kvs_status kvs_remote_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    (void)state, (void)key, (void)object, (void)len;
    return KVS_ENOTSUP;
}
kvs_status kvs_remote_remove(void *state, const kvs_key *key) {
    (void)state, (void)key;
    return KVS_ENOTSUP;
}
kvs_status kvs_remote_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    (void)state;
    *n_objects = *bytes = 0;
    return KVS_ENOTSUP;
}
kvs_status kvs_remote_stats(void *state, kvs_remote_stats_t *out) {
    (void)state;
    memset(out, 0, sizeof *out);
    return KVS_ENOTSUP;
}
kvs_status kvs_remote_flush(void *state) {
    (void)state;
    return KVS_ENOTSUP;
}
#endif
