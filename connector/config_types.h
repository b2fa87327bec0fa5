/* config_types.h - the deployment's configuration as values: kvs_config and its tiers, options and
 * restore profile, as config.h's loader fills them (positions kept for later refusals). Plain data: a
 * config is read by any thread once loaded; kvs_config_free releases it. */
#ifndef KVS_CONFIG_TYPES_H
#define KVS_CONFIG_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

#define KVS_NAME_MAX           64
#define KVS_PATH_MAX           4096
#define KVS_CONFIG_MAX_BYTES   (1024 * 1024) /* a larger file is refused before parsing */
#define KVS_CONFIG_MAX_TIERS   64
#define KVS_CONFIG_MAX_OPTIONS 256 /* entries in one tier's `options:` */
#define KVS_CONFIG_MAX_TENANTS 256 /* entries of `node.tenants` */
#define KVS_CONFIG_TENANT_MAX  64  /* bytes of a tenant name (the wire's limit) */

typedef enum kvs_write_policy {
    KVS_WRITE_BACK = 0,   /* objects move down the chain when this tier evicts them */
    KVS_WRITE_THROUGH = 1 /* objects are copied to the next tier as soon as they are saved here */
} kvs_write_policy;

/* Where a value stands in the file (1-based); 0 for one the file did not give. */
typedef struct kvs_config_at {
    int line, column;
} kvs_config_at;

typedef struct kvs_config_option {
    char *key;
    char *value;
    kvs_config_at at; /* the option's name under `options:`, or the entry of `paths:`/`nodes:` */
    int list_index;   /* k for the entry paths[k] or nodes[k]; -1 for an entry of `options:` */
} kvs_config_option;

/* Tier keys whose position is kept for refusals found when the connector opens. */
/* name, type, capacity, write, plugin, options, paths, nodes, required, integrity,
 * integrity_key_file */
#define KVS_TIER_KEYS 11

typedef struct kvs_tier_config {
    char name[KVS_NAME_MAX]; /* unique within the file */
    char type[KVS_NAME_MAX]; /* "dram" or "plugin" */
    uint64_t capacity_bytes; /* required for dram; optional (0) for plugin */
    kvs_write_policy write;  /* default back */
    int required; /* 1: the connector refuses to open when this tier cannot; 0 (default): a tier
                   * that fails to open for a reason other than its configuration serves empty */
    char plugin[KVS_PATH_MAX]; /* path of the .so, required iff type is plugin */
    int keyed; /* `integrity: keyed`: every load from it checks the objects' tags (object_mac.h) */
    char integrity_key_file[KVS_PATH_MAX]; /* the key a keyed tier's tags are under */
    int integrity_from_psk;                /* that file is the remote tier's tenant key */
    kvs_config_option *options;            /* the `options:` map, scalars only, in file order */
    size_t n_options;
    int line, column;                     /* where the tier's entry starts, for later messages */
    kvs_config_at keys_at[KVS_TIER_KEYS]; /* each key's value, in the order of KVS_TIER_KEYS */
} kvs_tier_config;

/* Profiled read cost of one tier: latency + bytes / bandwidth per transfer. */
typedef struct kvs_restore_tier {
    char name[KVS_NAME_MAX];
    double latency_s, bytes_per_s;
} kvs_restore_tier;

typedef struct kvs_config {
    char source[KVS_PATH_MAX]; /* file path, or "<defaults>" / the name given to parse_string */
    uint32_t version;          /* must be 1 */
    uint32_t chunk_tokens; /* default 256; multiple of the engine block size (checked at open) */
    kvs_config_at chunk_tokens_at; /* its value, for that check's message */
    uint64_t lease_timeout_ms;     /* default 30000; > 0 */
    int save_decode;               /* default 0: decode-phase tokens are not saved */
    int log_level;                 /* KVS_LOG_*; default KVS_LOG_WARN */
    uint64_t
        staging_bytes; /* pinned staging pool; default 256MiB; >= one object (checked at open) */
    int copy_method;   /* device.copy_method: KVS_DEV_COPY_* (auto, kernel, dma); default auto */
    uint32_t hash_threads; /* device.hash_threads: checksum threads of a CUDA device; default 4 */
    uint32_t
        max_chunks_per_step; /* device.max_chunks_per_step: loads (and saves) per step; default 1024 */
    int host_deferred;       /* device.host_copies: deferred makes the host device behave like an
                                * asynchronous one (tests of the CUDA ordering without a GPU) */
    uint32_t host_threads;  /* device.host_threads: threads moving a layer's copies on the host
                                device; default 1 (the calling thread) */
    kvs_tier_config *tiers; /* at least one */
    size_t n_tiers;
    struct {              /* `node:`, read by kvstrata-node only; 0 or "" where not given */
        char listen[128]; /* HOST:PORT */
        char psk_file[KVS_PATH_MAX]; /* resolved against the file's directory */
        uint32_t max_clients;
        uint32_t timeout_ms;
        uint64_t max_object_bytes;
        uint32_t max_handshakes;          /* control connections not yet authenticated, at once */
        uint32_t busy_poll_us;            /* the value + 1 (0 is a value): 0 where not given */
        int shared_memory_payloads;       /* 2 true, 1 false, 0 not given */
        int encrypt;                      /* 2 true, 1 false, 0 not given */
        uint32_t max_sessions_per_tenant; /* 0: not given (no cap but max_clients) */
        uint64_t tenant_capacity;         /* every tenant's share of the tiers (0: none) */
        struct {
            char name[KVS_CONFIG_TENANT_MAX + 1];
            uint64_t capacity;
        } tenants[KVS_CONFIG_MAX_TENANTS]; /* `node.tenants`: shares of tenants by name */
        uint32_t n_tenants;
    } node;
    struct {           /* `restore:` (docs/cacheflow.md); scheduler 0 leaves every hit loaded */
        int scheduler; /* KVS_RESTORE_NONE or KVS_RESTORE_CACHEFLOW */
        int priority;  /* cf_priority: lrf, srf (default), mean */
        char profile
            [KVS_PATH_MAX]; /* resolved against the file's directory; required by cacheflow */
        /* read from the profile */
        double fixed_s, per_token_s, attention_s_per_token2;
        uint32_t n_tiers;
        kvs_restore_tier tiers[KVS_CONFIG_MAX_TIERS];
    } restore;
    struct {       /* `loads:`: whether a lookup answers load_async (the load runs between steps) */
        int async; /* KVS_LOADS_ASYNC_* (default never) */
        uint64_t async_below;   /* slow: bytes/s; a hit on a tier the profile says reads slower */
        kvs_config_at async_at; /* the `async:` value, for messages */
        int remote_lookups;     /* KVS_REMOTE_LOOKUPS_* (default wait) */
        int accept_lossy;       /* 1: lossy objects are decoded and loaded; 0 (default): refused */
    } loads;
    struct {       /* `saves:` */
        int async; /* 1: wait_save hands the step's stores to a saver thread (default 0) */
        uint64_t timeout_ms; /* close waits this long for the saver's queue (then drops the rest);
                              * a save waits this long for a staging slab the queue holds (5000) */
    } saves;
    struct { /* `placement:` (docs/compress.md): how a compress tier places and encodes objects */
        int policy;             /* KVS_PLACEMENT_ADAPTCACHE (the only one) */
        double alpha;           /* seconds of delay one unit of quality is worth (default 0.1) */
        double min_quality;     /* encodings estimated below it are never chosen (default 0) */
        double freq_prior;      /* reads per second assumed for a new object (default 0.1) */
        uint64_t reevaluate_ms; /* how often a compress tier re-places what it holds (1000) */
        uint64_t decode_bytes_per_s; /* how fast a lossy object decodes (raw bytes; 1GB/s) */
        uint32_t codecs; /* KVS_PLACEMENT_CODEC_* bits offered (default the three quantisers) */
    } placement;
    struct {                     /* `metrics:` (docs/operations.md); absent: no metrics */
        int enabled;             /* the section is there */
        char listen[128];        /* HOST:PORT of the HTTP endpoint */
        char name[KVS_NAME_MAX]; /* the instance's shared counter segment */
        kvs_config_at at;        /* the section, for messages */
    } metrics;
} kvs_config;

#define KVS_PLACEMENT_ADAPTCACHE   0
#define KVS_PLACEMENT_CODEC_INT8   (1u << 0)
#define KVS_PLACEMENT_CODEC_KIVI4  (1u << 1)
#define KVS_PLACEMENT_CODEC_KIVI2  (1u << 2)
#define KVS_PLACEMENT_CODEC_DROP50 (1u << 3) /* keep half of each chunk's tokens */
#define KVS_PLACEMENT_CODEC_DROP25 (1u << 4) /* keep a quarter */
/* The default: the quantisers. Token dropping is opt-in: only engines that mask take it. */
#define KVS_PLACEMENT_CODECS_ALL   7u

#define KVS_LOADS_ASYNC_NEVER  0
#define KVS_LOADS_ASYNC_ALWAYS 1
#define KVS_LOADS_ASYNC_SLOW   2

#define KVS_REMOTE_LOOKUPS_WAIT  0 /* a lookup asks remote tiers itself, waiting for the nodes */
#define KVS_REMOTE_LOOKUPS_ASYNC 1 /* a thread asks them; unknown_yet until it has the answer */

#define KVS_RESTORE_NONE      0
#define KVS_RESTORE_CACHEFLOW 1

#endif
