/* config_metrics.c - `metrics:` (docs/configuration.md): where the instance's Prometheus endpoint
 * listens and the name of the shared segment its processes publish their counters into. */
#include "config_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const METRICS_KEYS[] = {"listen", "name"};
enum { MK_LISTEN, MK_NAME, MK_COUNT };

int kvs_metrics_check_listen(const char *listen, char *why, size_t why_len) {
    const char *colon = strrchr(listen, ':');
    char *end = NULL;
    unsigned long port = colon && colon[1] ? strtoul(colon + 1, &end, 10) : 0;
    if (!colon || colon == listen || !colon[1] || *end || port == 0 || port > 65535) {
        snprintf(why, why_len, "expected HOST:PORT (port 1..65535), found '%s'", listen);
        return -1;
    }
    return 0;
}

static int name_char_ok(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
}

void kvs_metrics_default_name(const char *listen, char *out, size_t cap) {
    char host_port[128];
    size_t n = 0;
    for (const char *p = listen; *p && n + 1 < sizeof host_port; p++)
        host_port[n++] = name_char_ok(*p) ? *p : '_';
    host_port[n] = '\0';
    snprintf(out, cap, "kvs%u-%s", (unsigned)getuid(), host_port);
}

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
            if (!name_char_ok(*p))
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
