/* config_tiers.h - one entry of the configuration's `tiers:` (internal to connector/config*.c). A tier
 * is read in two halves around its capacity, which config.c reads with the other sizes. */
#ifndef KVS_CONFIG_TIERS_H
#define KVS_CONFIG_TIERS_H

#include <stddef.h>

#include "config_types.h"
#include "config_yaml.h"

enum { TYPE_COMPRESS, TYPE_DRAM, TYPE_PEER_GPU, TYPE_PLUGIN, TYPE_REDIS, TYPE_REMOTE, TYPE_SSD };

/* The tier keys, in the order of kvs_tier_config.keys_at. */
enum {
    TK_NAME,
    TK_TYPE,
    TK_CAPACITY,
    TK_WRITE,
    TK_PLUGIN,
    TK_OPTIONS,
    TK_PATHS,
    TK_NODES,
    TK_REQUIRED,
    TK_INTEGRITY,
    TK_INTEGRITY_KEY_FILE,
    TK_COUNT
};

/* One tier entry being read: its keys and values (NULL when absent), key path and type (TYPE_*). */
typedef struct kvs_tier_fields {
    const kvs_yaml_node *map;
    const kvs_yaml_node *keys[TK_COUNT];
    const kvs_yaml_node *values[TK_COUNT];
    char path[KEY_PATH_MAX];
    size_t type;
} kvs_tier_fields;

/* The TK_* index of tier key `name`, TK_COUNT when it is none. */
size_t kvs_config_tier_key(const char *name);
/* Tier `index` (cfg->tiers[index], zeroed) from n: its keys, name and type, into *f and the tier. */
kvs_status kvs_config_tier_begin(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, kvs_config *cfg,
                                 size_t index, kvs_tier_fields *f);
/* The rest of the tier after its capacity: write policy, required, plugin path, `paths:`/`nodes:`,
 * options. */
kvs_status kvs_config_tier_end(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                               kvs_tier_config *t);

#endif
