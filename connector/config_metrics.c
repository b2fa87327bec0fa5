/* config_metrics.c - `metrics:` (docs/configuration.md): where the instance's Prometheus endpoint
 * listens and the name of the shared segment its processes publish their counters into. */
#include "config_metrics.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/metrics.h"

static const char *const METRICS_KEYS[] = {"listen", "name"};
enum { MK_LISTEN, MK_NAME, MK_COUNT };

kvs_status kvs_config_parse_metrics(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                    kvs_config *cfg) {
    const kvs_yaml_node *keys[MK_COUNT] = {NULL}, *values[MK_COUNT] = {NULL};
    kvs_status st =
        kvs_yaml_mapping_fields(ctx, v, "metrics", METRICS_KEYS, MK_COUNT, keys, values, 0);
    if (st != KVS_OK) return st;
    if (!values[MK_LISTEN])
        return kvs_yaml_missing_key(ctx, v, "metrics", "listen",
                                    " (HOST:PORT the Prometheus endpoint listens on)");
    char why[200];
    st = kvs_yaml_get_text(ctx, values[MK_LISTEN], "metrics.listen", cfg->metrics.listen,
                           sizeof cfg->metrics.listen);
    if (st == KVS_OK && kvs_metrics_check_listen(cfg->metrics.listen, why, sizeof why) != 0)
        st = kvs_yaml_fail(ctx, values[MK_LISTEN], "metrics.listen", "%s", why);
    if (st == KVS_OK && values[MK_NAME]) {
        st = kvs_yaml_get_text(ctx, values[MK_NAME], "metrics.name", cfg->metrics.name,
                               sizeof cfg->metrics.name);
        for (const char *p = cfg->metrics.name; st == KVS_OK && *p; p++)
            if (!kvs_metrics_name_char_ok(*p))
                st = kvs_yaml_fail(ctx, values[MK_NAME], "metrics.name",
                                   "'%s' has a character other than letters, digits, '-', '_' "
                                   "and '.'",
                                   cfg->metrics.name);
        if (st == KVS_OK && !cfg->metrics.name[0])
            st = kvs_yaml_fail(ctx, values[MK_NAME], "metrics.name", "the name is empty");
    }
    if (st != KVS_OK) return st;
    if (!cfg->metrics.name[0])
        kvs_metrics_default_name(cfg->metrics.listen, cfg->metrics.name, sizeof cfg->metrics.name);
    cfg->metrics.enabled = 1;
    cfg->metrics.at = (kvs_config_at){v->line, v->column};
    return KVS_OK;
}

kvs_status kvs_metrics_render_config(const kvs_config *cfg, char **text, size_t *len, char *err,
                                     size_t err_len) {
    if (!cfg || !text || !len) return kvs_fmt(err, err_len, "metrics: NULL argument"), KVS_EINVAL;
    *text = NULL;
    *len = 0;
    if (!cfg->metrics.enabled)
        return kvs_fmt(err, err_len, "%s has no `metrics:` section (metrics are off)", cfg->source),
               KVS_ENOTFOUND;
    return kvs_metrics_render_named(cfg->metrics.name, text, len, err, err_len);
}
