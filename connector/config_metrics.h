/* config_metrics.h - the configuration's `metrics:` section (internal to connector/config*.c, and the
 * default segment name kvstrata-node's --metrics flag shares). */
#ifndef KVS_CONFIG_METRICS_H
#define KVS_CONFIG_METRICS_H

#include <stddef.h>

#include "config_types.h"
#include "config_yaml.h"

/* `metrics:` at v into cfg->metrics. */
kvs_status kvs_config_parse_metrics(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                    kvs_config *cfg);

/* Checks "HOST:PORT" (port 1..65535): 0, or -1 with a sentence in why. */
int kvs_metrics_check_listen(const char *listen, char *why, size_t why_len);

/* The segment name an instance without `metrics.name` uses: from the listen address and the uid,
 * so two users' or two ports' instances never share one. */
void kvs_metrics_default_name(const char *listen, char *out, size_t cap);

#endif
