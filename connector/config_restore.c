/* config_restore.c - the `restore:` section of the configuration and the restore profile it names
 * (compute and per-tier read coefficients, docs/cacheflow.md), read with the same strict reader. */
#include "config_restore.h"

#include "common/units.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const RESTORE_KEYS[] = {"scheduler", "priority", "profile"};
enum { RSK_SCHEDULER, RSK_PRIORITY, RSK_PROFILE, RSK_COUNT };
static const char *const RESTORE_SCHEDULERS[] = {"none", "cacheflow"};  /* KVS_RESTORE_* order */
static const char *const RESTORE_PRIORITIES[] = {"lrf", "srf", "mean"}; /* cf_priority order */
/* The restore profile (kvs-mini-research --profile writes one). */
static const char *const PROFILE_KEYS[] = {"compute", "tiers"};
enum { PFK_COMPUTE, PFK_TIERS, PFK_COUNT };
static const char *const PROFILE_COMPUTE_KEYS[] = {"fixed_us", "per_token_us",
                                                   "attention_ns_per_token2"};
enum { PCK_FIXED, PCK_TOKEN, PCK_ATT, PCK_COUNT };
/* bandwidth is a rate (250MB/s); bandwidth_mb_s, a plain number of 10^6 bytes per second, is the
 * older spelling (kvs-mini-research --profile writes it): a tier gives one of the two. */
static const char *const PROFILE_TIER_KEYS[] = {"name", "latency_us", "bandwidth",
                                                "bandwidth_mb_s"};
enum { PTK_NAME, PTK_LATENCY, PTK_BANDWIDTH, PTK_BANDWIDTH_MB_S, PTK_COUNT };

/* A rate (common/units.h: a size per second such as 250MB/s), > 0. */
static kvs_status get_rate(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                           uint64_t *out) {
    char why[160];
    kvs_status st = kvs_yaml_expect_scalar(ctx, n, path, "a rate such as 250MB/s");
    if (st != KVS_OK) return st;
    if (kvs_units_parse_rate(n->text, out, why, sizeof why) != KVS_OK) {
        char buf[SHOWN_MAX + 4];
        return kvs_yaml_fail(ctx, n, path, "bad rate '%s' (a size per second such as 250MB/s): %s",
                             kvs_yaml_shown(n, buf), why);
    }
    if (*out == 0) return kvs_yaml_fail(ctx, n, path, "the rate must be greater than 0");
    return KVS_OK;
}

static kvs_status parse_profile_tier(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v, size_t i,
                                     kvs_config *cfg) {
    const kvs_yaml_node *keys[PTK_COUNT] = {NULL}, *values[PTK_COUNT] = {NULL};
    char kp[KEY_PATH_MAX];
    snprintf(kp, sizeof kp, "tiers[%zu]", i);
    kvs_status st =
        kvs_yaml_mapping_fields(ctx, v, kp, PROFILE_TIER_KEYS, PTK_COUNT, keys, values, 0);
    if (st == KVS_OK && !values[PTK_NAME]) st = kvs_yaml_missing_key(ctx, v, kp, "name", "");
    if (st == KVS_OK && !values[PTK_LATENCY])
        st = kvs_yaml_missing_key(ctx, v, kp, "latency_us", "");
    if (st == KVS_OK && !values[PTK_BANDWIDTH] && !values[PTK_BANDWIDTH_MB_S])
        st = kvs_yaml_missing_key(ctx, v, kp, "bandwidth", " (a rate such as 250MB/s)");
    if (st == KVS_OK && values[PTK_BANDWIDTH] && values[PTK_BANDWIDTH_MB_S])
        st = kvs_yaml_fail(ctx, keys[PTK_BANDWIDTH_MB_S], kp,
                           "give bandwidth or bandwidth_mb_s (its older spelling), not both");
    if (st != KVS_OK) return st;
    kvs_restore_tier *t = &cfg->restore.tiers[i];
    double lat_us, mb_s = 0;
    uint64_t bytes_per_s = 0;
    snprintf(kp, sizeof kp, "tiers[%zu].name", i);
    st = kvs_yaml_get_text(ctx, values[PTK_NAME], kp, t->name, sizeof t->name);
    for (size_t j = 0; st == KVS_OK && j < i; j++)
        if (strcmp(cfg->restore.tiers[j].name, t->name) == 0)
            st = kvs_yaml_fail(ctx, values[PTK_NAME], kp, "tier '%s' is profiled twice", t->name);
    snprintf(kp, sizeof kp, "tiers[%zu].latency_us", i);
    if (st == KVS_OK) st = kvs_yaml_get_double(ctx, values[PTK_LATENCY], kp, 0, 1e9, &lat_us);
    snprintf(kp, sizeof kp, "tiers[%zu].%s", i,
             values[PTK_BANDWIDTH] ? "bandwidth" : "bandwidth_mb_s");
    if (st == KVS_OK && values[PTK_BANDWIDTH])
        st = get_rate(ctx, values[PTK_BANDWIDTH], kp, &bytes_per_s);
    else if (st == KVS_OK)
        st = kvs_yaml_get_double(ctx, values[PTK_BANDWIDTH_MB_S], kp, 1e-3, 1e9, &mb_s);
    if (st != KVS_OK) return st;
    t->latency_s = lat_us * 1e-6;
    t->bytes_per_s = values[PTK_BANDWIDTH] ? (double)bytes_per_s : mb_s * 1e6;
    return KVS_OK;
}

static kvs_status parse_profile_root(const kvs_yaml_ctx *ctx, const kvs_yaml_node *root,
                                     kvs_config *cfg) {
    const kvs_yaml_node *keys[PFK_COUNT] = {NULL}, *values[PFK_COUNT] = {NULL};
    const kvs_yaml_node *ck[PCK_COUNT] = {NULL}, *cv[PCK_COUNT] = {NULL};
    if (!root || root->kind != KVS_YAML_MAPPING)
        return kvs_yaml_fail_at(ctx, root ? root->line : 1, root ? root->column : 1, NULL,
                                "a restore profile is a mapping with `compute:` and `tiers:`");
    kvs_status st = kvs_yaml_map_fields(ctx, root, NULL, PROFILE_KEYS, PFK_COUNT, keys, values);
    if (st == KVS_OK && !values[PFK_COMPUTE])
        st = kvs_yaml_missing_key(ctx, root, NULL, "compute", "");
    if (st == KVS_OK && !values[PFK_TIERS])
        st = kvs_yaml_missing_key(ctx, root, NULL, "tiers", " (a sequence)");
    if (st != KVS_OK) return st;
    const kvs_yaml_node *c = values[PFK_COMPUTE], *t = values[PFK_TIERS];
    st = kvs_yaml_mapping_fields(ctx, c, "compute", PROFILE_COMPUTE_KEYS, PCK_COUNT, ck, cv, 1);
    double fixed_us = 0, token_us = 0, att_ns = 0;
    if (st == KVS_OK)
        st = kvs_yaml_get_double(ctx, cv[PCK_FIXED], "compute.fixed_us", 0, 1e9, &fixed_us);
    if (st == KVS_OK)
        st = kvs_yaml_get_double(ctx, cv[PCK_TOKEN], "compute.per_token_us", 0, 1e9, &token_us);
    if (st == KVS_OK)
        st = kvs_yaml_get_double(ctx, cv[PCK_ATT], "compute.attention_ns_per_token2", 0, 1e9,
                                 &att_ns);
    if (st == KVS_OK && fixed_us + token_us + att_ns <= 0)
        st =
            kvs_yaml_fail(ctx, c, "compute", "every coefficient is 0: recomputing would look free");
    if (st != KVS_OK) return st;
    if (t->kind != KVS_YAML_SEQUENCE || t->n_items == 0)
        return kvs_yaml_fail(ctx, t, "tiers", "expected a sequence of at least one tier, found %s",
                             kvs_yaml_describe(t));
    if (t->n_items > KVS_CONFIG_MAX_TIERS)
        return kvs_yaml_fail(ctx, t, "tiers", "%zu tiers, at most %d are allowed", t->n_items,
                             KVS_CONFIG_MAX_TIERS);
    for (size_t i = 0; st == KVS_OK && i < t->n_items; i++)
        st = parse_profile_tier(ctx, t->items[i], i, cfg);
    if (st != KVS_OK) return st;
    cfg->restore.n_tiers = (uint32_t)t->n_items;
    cfg->restore.fixed_s = fixed_us * 1e-6;
    cfg->restore.per_token_s = token_us * 1e-6;
    cfg->restore.attention_s_per_token2 = att_ns * 1e-9;
    return KVS_OK;
}

/* Read and check the file cfg->restore.profile names; errors name that file (and `at` in the
 * config when it cannot be read). */
static kvs_status parse_profile_file(const kvs_yaml_ctx *outer, const kvs_yaml_node *at,
                                     kvs_config *cfg) {
    char *text = NULL;
    size_t len = 0;
    char why[512];
    if (kvs_yaml_read_file(cfg->restore.profile, &text, &len, why, sizeof why) != KVS_OK)
        return kvs_yaml_fail(outer, at, "restore.profile", "%s", why);
    kvs_yaml_ctx ctx = {cfg->restore.profile, NULL, text, len, outer->err, outer->err_len};
    kvs_yaml_node *root = NULL;
    kvs_status st = kvs_yaml_read_tree(&ctx, &root);
    if (st == KVS_OK) st = parse_profile_root(&ctx, root, cfg);
    kvs_yaml_node_free(root);
    free(text);
    return st;
}

kvs_status kvs_config_parse_restore(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                    kvs_config *cfg) {
    const kvs_yaml_node *keys[RSK_COUNT] = {NULL}, *values[RSK_COUNT] = {NULL};
    kvs_status st =
        kvs_yaml_mapping_fields(ctx, v, "restore", RESTORE_KEYS, RSK_COUNT, keys, values, 0);
    size_t choice;
    if (st == KVS_OK && values[RSK_SCHEDULER]) {
        st = kvs_yaml_get_choice(ctx, values[RSK_SCHEDULER], "restore.scheduler",
                                 RESTORE_SCHEDULERS, COUNT_OF(RESTORE_SCHEDULERS), &choice);
        if (st == KVS_OK) cfg->restore.scheduler = (int)choice;
    }
    if (st == KVS_OK && values[RSK_PRIORITY]) {
        st = kvs_yaml_get_choice(ctx, values[RSK_PRIORITY], "restore.priority", RESTORE_PRIORITIES,
                                 COUNT_OF(RESTORE_PRIORITIES), &choice);
        if (st == KVS_OK) cfg->restore.priority = (int)choice;
    }
    if (st == KVS_OK && values[RSK_PROFILE]) {
        st = kvs_yaml_get_path(ctx, values[RSK_PROFILE], "restore.profile", cfg->restore.profile,
                               sizeof cfg->restore.profile);
        if (st == KVS_OK) st = parse_profile_file(ctx, values[RSK_PROFILE], cfg);
    }
    if (st == KVS_OK && cfg->restore.scheduler == KVS_RESTORE_CACHEFLOW && !cfg->restore.profile[0])
        st = kvs_yaml_fail(
            ctx, v, "restore",
            "scheduler cacheflow needs `profile:` (the compute and tier coefficients; "
            "kvs-mini-research --profile writes one)");
    return st;
}

static const char *const LOADS_KEYS[] = {"async", "async_below", "remote_lookups", "accept_lossy"};
enum { LK_ASYNC, LK_ASYNC_BELOW, LK_REMOTE_LOOKUPS, LK_ACCEPT_LOSSY, LK_COUNT };
static const char *const LOADS_ASYNC[] = {"never", "always", "slow"}; /* KVS_LOADS_ASYNC_* order */
static const char *const REMOTE_LOOKUPS[] = {"wait", "async"}; /* KVS_REMOTE_LOOKUPS_* order */

kvs_status kvs_config_parse_loads(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                  kvs_config *cfg) {
    const kvs_yaml_node *keys[LK_COUNT] = {NULL}, *values[LK_COUNT] = {NULL};
    kvs_status st = kvs_yaml_mapping_fields(ctx, v, "loads", LOADS_KEYS, LK_COUNT, keys, values, 0);
    size_t choice;
    if (st == KVS_OK && values[LK_ASYNC]) {
        st = kvs_yaml_get_choice(ctx, values[LK_ASYNC], "loads.async", LOADS_ASYNC,
                                 COUNT_OF(LOADS_ASYNC), &choice);
        if (st == KVS_OK) cfg->loads.async = (int)choice;
        cfg->loads.async_at = (kvs_config_at){values[LK_ASYNC]->line, values[LK_ASYNC]->column};
    }
    if (st == KVS_OK && values[LK_ASYNC_BELOW])
        st = get_rate(ctx, values[LK_ASYNC_BELOW], "loads.async_below", &cfg->loads.async_below);
    if (st == KVS_OK && values[LK_REMOTE_LOOKUPS]) {
        st = kvs_yaml_get_choice(ctx, values[LK_REMOTE_LOOKUPS], "loads.remote_lookups",
                                 REMOTE_LOOKUPS, COUNT_OF(REMOTE_LOOKUPS), &choice);
        if (st == KVS_OK) cfg->loads.remote_lookups = (int)choice;
    }
    if (st == KVS_OK && values[LK_ACCEPT_LOSSY])
        st = kvs_yaml_get_bool(ctx, values[LK_ACCEPT_LOSSY], "loads.accept_lossy",
                               &cfg->loads.accept_lossy);
    if (st != KVS_OK) return st;
    int slow = cfg->loads.async == KVS_LOADS_ASYNC_SLOW;
    if (slow && !values[LK_ASYNC_BELOW])
        return kvs_yaml_fail(ctx, values[LK_ASYNC], "loads.async",
                             "`slow` needs `async_below:` (a rate such as 2GB/s: hits on tiers "
                             "reading slower than it load between steps)");
    if (!slow && values[LK_ASYNC_BELOW])
        return kvs_yaml_fail(ctx, values[LK_ASYNC_BELOW], "loads.async_below",
                             "only meaningful with `async: slow`");
    if (slow && !cfg->restore.profile[0])
        return kvs_yaml_fail(ctx, values[LK_ASYNC], "loads.async",
                             "`slow` needs `restore.profile:` (each tier's read bandwidth)");
    return KVS_OK;
}

static const char *const PLACEMENT_KEYS[] = {"policy", "alpha",         "min_quality", "freq_prior",
                                             "codecs", "reevaluate_ms", "decode_rate"};
enum {
    PK_POLICY,
    PK_ALPHA,
    PK_MIN_QUALITY,
    PK_FREQ_PRIOR,
    PK_CODECS,
    PK_REEVALUATE,
    PK_DECODE,
    PK_COUNT
};
static const char *const PLACEMENT_POLICIES[] = {"adaptcache"}; /* KVS_PLACEMENT_* order */
static const char *const PLACEMENT_CODECS[] = {"int8", "kivi4", "kivi2", "drop50",
                                               "drop25"}; /* bit order */

/* `codecs:` is a sequence of codec names, each at most once. */
static kvs_status parse_codecs(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v, uint32_t *out) {
    if (v->kind != KVS_YAML_SEQUENCE)
        return kvs_yaml_fail(ctx, v, "placement.codecs",
                             "expected a sequence of codecs (int8, kivi4, kivi2, drop50, drop25), "
                             "found %s",
                             kvs_yaml_describe(v));
    uint32_t bits = 0;
    for (size_t i = 0; i < v->n_items; i++) {
        size_t c;
        kvs_status st = kvs_yaml_get_choice(ctx, v->items[i], "placement.codecs", PLACEMENT_CODECS,
                                            COUNT_OF(PLACEMENT_CODECS), &c);
        if (st != KVS_OK) return st;
        if (bits >> c & 1)
            return kvs_yaml_fail(ctx, v->items[i], "placement.codecs", "%s is given twice",
                                 PLACEMENT_CODECS[c]);
        bits |= 1u << c;
    }
    *out = bits;
    return KVS_OK;
}

kvs_status kvs_config_parse_placement(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                      kvs_config *cfg) {
    const kvs_yaml_node *keys[PK_COUNT] = {NULL}, *values[PK_COUNT] = {NULL};
    kvs_status st =
        kvs_yaml_mapping_fields(ctx, v, "placement", PLACEMENT_KEYS, PK_COUNT, keys, values, 0);
    size_t choice;
    if (st == KVS_OK && values[PK_POLICY]) {
        st = kvs_yaml_get_choice(ctx, values[PK_POLICY], "placement.policy", PLACEMENT_POLICIES,
                                 COUNT_OF(PLACEMENT_POLICIES), &choice);
        if (st == KVS_OK) cfg->placement.policy = (int)choice;
    }
    if (st == KVS_OK && values[PK_ALPHA])
        st = kvs_yaml_get_double(ctx, values[PK_ALPHA], "placement.alpha", 0, 1e6,
                                 &cfg->placement.alpha);
    if (st == KVS_OK && values[PK_MIN_QUALITY])
        st = kvs_yaml_get_double(ctx, values[PK_MIN_QUALITY], "placement.min_quality", 0, 1,
                                 &cfg->placement.min_quality);
    if (st == KVS_OK && values[PK_FREQ_PRIOR])
        st = kvs_yaml_get_double(ctx, values[PK_FREQ_PRIOR], "placement.freq_prior", 1e-9, 1e9,
                                 &cfg->placement.freq_prior);
    if (st == KVS_OK && values[PK_CODECS])
        st = parse_codecs(ctx, values[PK_CODECS], &cfg->placement.codecs);
    if (st == KVS_OK && values[PK_REEVALUATE])
        st = kvs_yaml_get_uint(ctx, values[PK_REEVALUATE], "placement.reevaluate_ms", 1,
                               86400000ull, &cfg->placement.reevaluate_ms);
    if (st == KVS_OK && values[PK_DECODE])
        st = get_rate(ctx, values[PK_DECODE], "placement.decode_rate",
                      &cfg->placement.decode_bytes_per_s);
    return st;
}
