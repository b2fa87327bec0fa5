/* config_metrics.h - the configuration's `metrics:` section (internal to connector/config*.c), and
 * the text of the instance a config names. */
#ifndef KVS_CONFIG_METRICS_H
#define KVS_CONFIG_METRICS_H

#include <stddef.h>

#include "config_types.h"
#include "config_yaml.h"

/* `metrics:` at v into cfg->metrics. */
kvs_status kvs_config_parse_metrics(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                    kvs_config *cfg);

/* The text the endpoint serves, from the segment cfg's `metrics:` names (kvs_metrics_render_named).
 * KVS_ENOTFOUND with a sentence in err when cfg has no `metrics:` section or no process has created
 * the segment yet. */
kvs_status kvs_metrics_render_config(const kvs_config *cfg, char **text, size_t *len, char *err,
                                     size_t err_len);

#endif
