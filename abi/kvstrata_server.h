/*
 * kvstrata_server.h - a configuration's tier chain hosted in a server process (kvstrata-node,
 * docs/node.md): load the YAML, read the settings a server takes from it (its tiers and the `node:`
 * section), open the tiers exactly as the connector opens them, and store, find and remove objects
 * in them. The connector implements it (connector/server.c) over its own config and tier chain, so
 * a server needs none of the connector's headers.
 *
 * For the project's own programs (tools/), which link the static library: it is not installed, not
 * exported from libkvstrata.so, and carries no ABI promise. Like kvstrata_backend.h it includes
 * nothing but abi/.
 *
 * Threading: a loaded config and its settings may be read by any thread; a chain belongs to one
 * thread at a time (the server's loop). Buffers passed in are borrowed for the call.
 */
#ifndef KVSTRATA_SERVER_H
#define KVSTRATA_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "kvstrata_backend.h"

#define KVS_SERVER_MAX_TIERS   64   /* tiers in one configuration */
#define KVS_SERVER_MAX_TENANTS 256  /* entries of `node.tenants` */
#define KVS_SERVER_TENANT_MAX  64   /* bytes of a tenant name (the wire's limit) */
#define KVS_SERVER_PATH_MAX    4096 /* bytes of a path, with its NUL */
#define KVS_SERVER_MAX_OPTIONS 256  /* entries in one tier's options (paths and nodes included) */

typedef struct kvs_server_config kvs_server_config; /* a loaded configuration file */
typedef struct kvs_tier_chain kvs_server_tiers;     /* its tiers, opened (the connector's chain) */

/* One option of a tier as written: an entry of `options:` (list_index -1), or the k-th entry of a
 * list key (`paths:` gives key "path", `nodes:` key "node", list_index k). */
typedef struct kvs_server_option {
    const char *key, *value;
    int list_index;
} kvs_server_option;

/* One tier of the configuration, as a server that hosts it sees it. The strings belong to the
 * config and live until kvs_server_config_free. */
typedef struct kvs_server_tier {
    const char *name;        /* unique within the file */
    const char *type;        /* "dram", "ssd", "plugin", ... as written */
    uint64_t capacity_bytes; /* 0 where the tier has none */
    int write_through;       /* 1: write-through (copies go down at once); 0: write-back */
    const char *shm_name;    /* options.shm_name (a dram tier shared by processes); NULL: none */
    const kvs_server_option *options; /* every option, in file order */
    uint32_t n_options;
} kvs_server_tier;

/* What a server reads from its configuration: the log level, the tiers, and the `node:` section
 * (kvstrata-node's own settings; 0 or "" where not given, a connector ignores them). */
typedef struct kvs_server_settings {
    char source[KVS_SERVER_PATH_MAX]; /* the file, as messages name it */
    uint32_t version, chunk_tokens;
    int log_level; /* KVS_LOG_* */
    uint32_t n_tiers;
    kvs_server_tier tiers[KVS_SERVER_MAX_TIERS];
    struct {
        char listen[128];                   /* HOST:PORT */
        char psk_file[KVS_SERVER_PATH_MAX]; /* resolved against the file's directory */
        uint32_t max_clients;               /* authenticated sessions at once */
        uint32_t timeout_ms;                /* each send, transfer and handshake */
        uint64_t max_object_bytes;          /* largest object stored or served */
        uint32_t max_handshakes;            /* control connections not yet authenticated */
        uint32_t busy_poll_us;              /* the value + 1 (0 is a value): 0 where not given */
        int shared_memory_payloads;         /* 2 true, 1 false, 0 not given */
        int encrypt;                        /* 2 true, 1 false, 0 not given */
        uint32_t max_sessions_per_tenant;   /* 0: not given (no cap but max_clients) */
        uint64_t tenant_capacity;           /* every tenant's share of the tiers (0: none) */
        struct {
            char name[KVS_SERVER_TENANT_MAX + 1];
            uint64_t capacity;
        } tenants[KVS_SERVER_MAX_TENANTS]; /* `node.tenants`: shares of tenants by name */
        uint32_t n_tenants;
    } node;
    struct {              /* `metrics:` (docs/configuration.md) */
        char listen[128]; /* HOST:PORT of the Prometheus endpoint; "": no section */
        char name[64];    /* the shared segment's name; "": not given (derived from listen) */
    } metrics;
} kvs_server_settings;

/* Parse and validate a YAML file as the connector does (docs/configuration.md). On error returns
 * KVS_ECONFIG (KVS_EIO if unreadable, KVS_ENOMEM) with "file:line:column: key 'a.b': what is wrong"
 * in err; *out is NULL then. */
kvs_status kvs_server_config_load(const char *path, kvs_server_config **out, char *err,
                                  size_t err_len);
/* Its settings; they live as long as the config. */
const kvs_server_settings *kvs_server_config_settings(const kvs_server_config *cfg);
/* NULL is a no-op. */
void kvs_server_config_free(kvs_server_config *cfg);

/* Open the config's tiers as the connector opens its chain (kvs_server_tiers_open reads the config
 * only during the call): staging_base/len is a buffer every backend may use (NULL/0: none),
 * borrowed until close; max_object_bytes the largest object. On failure *out is NULL and err says
 * why. */
kvs_status kvs_server_tiers_open(const kvs_server_config *cfg, uint64_t max_object_bytes,
                                 void *staging_base, uint64_t staging_len, kvs_server_tiers **out,
                                 char *err, uint64_t err_len);
/* Close every tier. NULL is a no-op. */
void kvs_server_tiers_close(kvs_server_tiers *tiers);

uint32_t kvs_server_tiers_count(const kvs_server_tiers *tiers);
const char *kvs_server_tiers_name(const kvs_server_tiers *tiers, uint32_t tier);
/* A tier's backend table and state, to pin, unpin, read in place and count (kvstrata_backend.h). */
const kvs_backend_ops *kvs_server_tiers_ops(const kvs_server_tiers *tiers, uint32_t tier);
void *kvs_server_tiers_state(const kvs_server_tiers *tiers, uint32_t tier);
/* The memory range a tier keeps its objects in (backend CAP_MEMORY), else KVS_ENOTSUP. */
kvs_status kvs_server_tiers_memory(const kvs_server_tiers *tiers, uint32_t tier, void **base,
                                   uint64_t *len);

/* Index of the first tier holding key, or -1. */
int kvs_server_tiers_find(kvs_server_tiers *tiers, const kvs_key *key);
/* Store an object in the top tier (and, for write-through tiers, in the next ones). */
kvs_status kvs_server_tiers_put(kvs_server_tiers *tiers, const kvs_key *key, const void *object,
                                uint64_t len, char *err, uint64_t err_len);
/* Remove a key from every tier. */
void kvs_server_tiers_remove(kvs_server_tiers *tiers, const kvs_key *key);
/* In-place puts into the top tier: 1 if it supports them. */
int kvs_server_tiers_can_reserve(const kvs_server_tiers *tiers);
/* Room for an object of len bytes in the top tier; *dst is where to write it, *ticket names the
 * reservation. KVS_ENOTSUP if the top tier cannot. */
kvs_status kvs_server_tiers_reserve(kvs_server_tiers *tiers, const kvs_key *key, uint64_t len,
                                    void **dst, uint64_t *ticket, char *err, uint64_t err_len);
/* Publish the object written at a reservation (object/len: its bytes, for write-through copies). */
kvs_status kvs_server_tiers_commit(kvs_server_tiers *tiers, const kvs_key *key, uint64_t ticket,
                                   const void *object, uint64_t len, char *err, uint64_t err_len);
void kvs_server_tiers_abort(kvs_server_tiers *tiers, uint64_t ticket);
/* Objects dropped from the last tier since open. */
uint64_t kvs_server_tiers_evictions(const kvs_server_tiers *tiers);

/* --- for operators' tools (tools/kvstrata) --- */

/* A problem found later at tier `tier` of cfg, in the loader's form: "file:line:column: key
 * 'tiers[i].KEY': sentence" into err, pointing at what key names (an option, `path[k]`, a tier key
 * such as `capacity`; "" or NULL: the tier's entry). Returns KVS_ECONFIG. */
kvs_status kvs_server_config_refuse(const kvs_server_config *cfg, uint32_t tier, const char *key,
                                    char *err, size_t err_len, const char *sentence);
/* Open tier `tier` of cfg alone, as the connector opens it (rank: what {rank} in an option stands
 * for), logging nothing (what went wrong is in err, the degraded reason or the tier's last error).
 * The chain has one tier, index 0. */
kvs_status kvs_server_tier_open(const kvs_server_config *cfg, uint32_t tier,
                                uint64_t max_object_bytes, int32_t rank, kvs_server_tiers **out,
                                char *err, uint64_t err_len);
/* Why a tier could not open and serves empty (not `required`); "" for a tier that opened. */
const char *kvs_server_tiers_degraded(const kvs_server_tiers *tiers, uint32_t tier);
/* The sentence of a tier's last failure, "" if none. */
const char *kvs_server_tiers_last_error(const kvs_server_tiers *tiers, uint32_t tier);
/* The Prometheus text of the instance cfg's `metrics:` section names, read from its shared
 * segment (malloc'd; free() it). KVS_ENOTFOUND with a sentence when there is no section or no
 * segment yet. */
kvs_status kvs_server_metrics_render(const kvs_server_config *cfg, char **text, size_t *len,
                                     char *err, size_t err_len);

/* What a stored object is to the connector, read from its bytes (a tier stores bytes): a KV
 * object's model fingerprint (its namespace), layers, tokens and codec. */
typedef struct kvs_server_object_info {
    kvs_key fingerprint;
    uint32_t n_layers, n_tokens, codec;
} kvs_server_object_info;
/* How many of an object's first bytes kvs_server_object_describe reads. */
uint64_t kvs_server_object_head_bytes(void);
/* 1 when head[0..head_len) starts a KV object, with *out filled; 0 when it is some other bytes. */
int kvs_server_object_describe(const void *head, uint64_t head_len, kvs_server_object_info *out);
/* A whole KV object's own checks (its header's geometry and checksum, each layer's checksum): 0
 * when sound, 1 with a sentence in what at the first that fails. */
int kvs_server_object_check(const void *object, uint64_t len, char *what, size_t what_len);

#endif
