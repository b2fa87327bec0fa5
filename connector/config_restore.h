/* config_restore.h - the configuration's `restore:`, `loads:` and `placement:` sections and the
 * profile file `restore:` names (internal to connector/config*.c). */
#ifndef KVS_CONFIG_RESTORE_H
#define KVS_CONFIG_RESTORE_H

#include "config_types.h"
#include "config_yaml.h"

/* `restore:` at v into cfg->restore; reads and checks the profile it names. */
kvs_status kvs_config_parse_restore(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                    kvs_config *cfg);

/* `loads:` at v into cfg->loads (after `restore:`: `async: slow` reads the profile's bandwidths). */
kvs_status kvs_config_parse_loads(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v, kvs_config *cfg);

/* `placement:` at v into cfg->placement (docs/compress.md). */
kvs_status kvs_config_parse_placement(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                      kvs_config *cfg);

#endif
