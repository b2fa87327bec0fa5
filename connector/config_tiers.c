/* config_tiers.c - one entry of `tiers:` in the configuration (name, type, write policy, `required`,
 * plugin path, `paths:`/`nodes:` and `options:`). The capacity, a size, is read by config.c. */
#include "config_tiers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const TIER_KEYS[] = {
    "name",     "type",      "capacity",          "write", "plugin", "options", "paths", "nodes",
    "required", "integrity", "integrity_key_file"};
_Static_assert(TK_COUNT == KVS_TIER_KEYS,
               "kvs_tier_config.keys_at holds one position per tier key");

static const char *const TIER_TYPES[] = {"compress", "dram",   "peer_gpu", "plugin",
                                         "redis",    "remote", "ssd"};
static const char *const WRITE_POLICIES[] = {"back", "through"};
static const char *const INTEGRITY[] = {"checksum", "keyed"};

size_t kvs_config_tier_key(const char *name) {
    size_t k = 0;
    while (k < TK_COUNT && strcmp(TIER_KEYS[k], name) != 0) k++;
    return k;
}

static int valid_tier_name(const char *name) {
    size_t len = strlen(name);
    if (len == 0 || len >= KVS_NAME_MAX) return 0;
    return strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") == len;
}

static kvs_status tier_name(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f, kvs_config *cfg,
                            size_t index) {
    char kp[KEY_PATH_MAX];
    const kvs_yaml_node *v = f->values[TK_NAME];
    if (!v) return kvs_yaml_missing_key(ctx, f->map, f->path, "name", "");
    kvs_yaml_key_path(kp, f->path, "name");
    kvs_status st = kvs_yaml_expect_scalar(ctx, v, kp, "a tier name");
    if (st != KVS_OK) return st;
    if (!valid_tier_name(v->text)) {
        char buf[SHOWN_MAX + 4];
        return kvs_yaml_fail(ctx, v, kp, "bad tier name '%s' (1 to %d of A-Z a-z 0-9 _ . -)",
                             kvs_yaml_shown(v, buf), KVS_NAME_MAX - 1);
    }
    for (size_t j = 0; j < index; j++) {
        if (strcmp(cfg->tiers[j].name, v->text) == 0)
            return kvs_yaml_fail(ctx, v, kp,
                                 "duplicate tier name '%s' (tiers[%zu] at line %d has it)", v->text,
                                 j, cfg->tiers[j].line);
    }
    memcpy(cfg->tiers[index].name, v->text, v->len + 1);
    return KVS_OK;
}

static kvs_status tier_type(const kvs_yaml_ctx *ctx, kvs_tier_fields *f, kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    if (!f->values[TK_TYPE])
        return kvs_yaml_missing_key(ctx, f->map, f->path, "type",
                                    " (dram, compress, ssd, remote, redis, peer_gpu or plugin)");
    kvs_yaml_key_path(kp, f->path, "type");
    kvs_status st = kvs_yaml_get_choice(ctx, f->values[TK_TYPE], kp, TIER_TYPES,
                                        COUNT_OF(TIER_TYPES), &f->type);
    if (st != KVS_OK) return st;
    snprintf(t->type, sizeof t->type, "%s", TIER_TYPES[f->type]);
    return KVS_OK;
}

static kvs_status tier_plugin(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                              kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    const kvs_yaml_node *v = f->values[TK_PLUGIN];
    kvs_yaml_key_path(kp, f->path, "plugin");
    if (f->type != TYPE_PLUGIN) {
        if (!v) return KVS_OK;
        return kvs_yaml_fail(
            ctx, f->keys[TK_PLUGIN], kp,
            "only a tier of type plugin takes a plugin path (this tier is type %s)",
            TIER_TYPES[f->type]);
    }
    if (!v)
        return kvs_yaml_missing_key(ctx, f->map, f->path, "plugin", " (path of the backend .so)");
    return kvs_yaml_get_path(ctx, v, kp, t->plugin, sizeof t->plugin);
}

/* Copies key and value into the next free entry of t->options (allocated by the caller). */
static kvs_status append_option(const kvs_yaml_ctx *ctx, kvs_tier_config *t, const char *key,
                                const char *value, const kvs_yaml_node *at, int list_index) {
    kvs_config_option *o = &t->options[t->n_options];
    o->at = (kvs_config_at){at->line, at->column};
    o->list_index = list_index;
    o->key = strdup(key);
    o->value = strdup(value);
    if (!o->key || !o->value) {
        free(o->key);
        free(o->value);
        o->key = o->value = NULL;
        return kvs_yaml_out_of_memory(ctx);
    }
    t->n_options++;
    return KVS_OK;
}

/* Options whose value is a path: relative ones resolve against the file's directory. */
static const struct {
    int type;
    const char *option;
} PATH_OPTIONS[] = {{TYPE_REMOTE, "psk_file"},     {TYPE_PEER_GPU, "socket"},
                    {TYPE_REDIS, "password_file"}, {TYPE_REDIS, "tls.ca_file"},
                    {TYPE_REDIS, "tls.cert_file"}, {TYPE_REDIS, "tls.key_file"}};

/* One option name = scalar value (name is `group.key` for an entry of a group's mapping). */
static kvs_status scalar_option(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                                const kvs_yaml_node *k, const char *name, const kvs_yaml_node *v,
                                const char *kp, kvs_tier_config *t) {
    for (size_t j = 0; j < t->n_options; j++) {
        if (strcmp(t->options[j].key, name) == 0)
            return kvs_yaml_fail(ctx, k, kp, "duplicate key (given twice in options)");
    }
    if (v->kind != KVS_YAML_SCALAR)
        return kvs_yaml_fail(ctx, v, kp, "an option value must be a scalar, found %s",
                             kvs_yaml_describe(v));
    for (size_t i = 0; i < COUNT_OF(PATH_OPTIONS); i++) {
        if ((size_t)PATH_OPTIONS[i].type != f->type || strcmp(PATH_OPTIONS[i].option, name) != 0 ||
            v->len == 0)
            continue;
        char full[KVS_PATH_MAX];
        kvs_status st = kvs_yaml_resolve_path(ctx, v, kp, v->text, full, sizeof full);
        return st == KVS_OK ? append_option(ctx, t, name, full, k, -1) : st;
    }
    return append_option(ctx, t, name, v->text, k, -1);
}

static kvs_status tier_option(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                              const kvs_yaml_node *k, const kvs_yaml_node *v, const char *path,
                              kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    if (k->kind != KVS_YAML_SCALAR || k->len == 0)
        return kvs_yaml_fail(ctx, k, path, "an option name must be a non-empty scalar, found %s",
                             kvs_yaml_describe(k));
    kvs_yaml_key_path(kp, path, k->text);
    if (v->kind != KVS_YAML_MAPPING) return scalar_option(ctx, f, k, k->text, v, kp, t);
    /* a group of options (`tls: {ca_file: ...}`) reaches the backend as `tls.ca_file` */
    if (v->n_items == 0) return kvs_yaml_fail(ctx, v, kp, "an empty group of options");
    for (size_t i = 0; i + 1 < v->n_items; i += 2) {
        const kvs_yaml_node *sk = v->items[i];
        char name[KVS_NAME_MAX * 2], skp[KEY_PATH_MAX];
        if (sk->kind != KVS_YAML_SCALAR || sk->len == 0 ||
            (size_t)snprintf(name, sizeof name, "%s.%s", k->text, sk->text) >= sizeof name)
            return kvs_yaml_fail(ctx, sk, kp, "an option name must be a short non-empty scalar");
        kvs_yaml_key_path(skp, kp, sk->text);
        kvs_status st = scalar_option(ctx, f, sk, name, v->items[i + 1], skp, t);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* Sequences of a tier type handed to the backend as repeated options (in file order, before the
 * tier's own options): `paths:` of an ssd tier, one directory per device, resolved like plugin
 * paths; `nodes:` of a remote tier, host:port of each kvstrata-node. */
static const struct tier_list {
    int type;           /* the only tier type that takes it, and must */
    int field;          /* TK_* */
    const char *name;   /* the YAML key */
    const char *option; /* the option each entry becomes; refused under options: */
    int is_path;
    const char *hint;  /* for a missing key */
    const char *items; /* what the sequence holds, for messages */
    const char *owner; /* "an ssd tier's directories", for the refusal under options: */
} TIER_LISTS[] = {
    {TYPE_SSD, TK_PATHS, "paths", "path", 1, " (one directory per SSD)", "directories",
     "an ssd tier's directories"},
    {TYPE_REMOTE, TK_NODES, "nodes", "node", 0, " (host:port of each kvstrata-node)", "host:port",
     "a remote tier's nodes"},
    {TYPE_REDIS, TK_NODES, "nodes", "node", 0, " (host:port or unix socket path of each server)",
     "host:port or socket paths", "a redis tier's servers"},
};

static kvs_status tier_list(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                            const struct tier_list *l, kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    const kvs_yaml_node *v = f->values[l->field];
    kvs_yaml_key_path(kp, f->path, l->name);
    if (f->type != (size_t)l->type) {
        char types[64] = "";
        for (size_t i = 0; i < COUNT_OF(TIER_LISTS); i++) {
            if (TIER_LISTS[i].field != l->field) continue;
            if ((size_t)TIER_LISTS[i].type == f->type) return KVS_OK; /* that entry reads it */
            size_t at = strlen(types);
            snprintf(types + at, sizeof types - at, "%s%s", at ? " or " : "",
                     TIER_TYPES[TIER_LISTS[i].type]);
        }
        if (!v) return KVS_OK;
        return kvs_yaml_fail(ctx, f->keys[l->field], kp,
                             "only a tier of type %s takes %s (this tier is type %s)", types,
                             l->name, TIER_TYPES[f->type]);
    }
    if (!v) return kvs_yaml_missing_key(ctx, f->map, f->path, l->name, l->hint);
    if (v->kind != KVS_YAML_SEQUENCE || v->n_items == 0)
        return kvs_yaml_fail(ctx, v, kp, "expected a non-empty sequence of %s, found %s", l->items,
                             kvs_yaml_describe(v));
    for (size_t i = 0; i < v->n_items; i++) {
        const kvs_yaml_node *p = v->items[i];
        char ip[KEY_PATH_MAX], given[KVS_PATH_MAX], full[KVS_PATH_MAX];
        snprintf(ip, sizeof ip, "%s[%zu]", kp, i);
        kvs_status st = kvs_yaml_get_text(ctx, p, ip, given, sizeof given);
        if (st != KVS_OK) return st;
        if (given[0] == '\0') return kvs_yaml_fail(ctx, p, ip, "an empty %s", l->option);
        if (l->is_path) {
            if ((st = kvs_yaml_resolve_path(ctx, p, ip, given, full, sizeof full)) != KVS_OK)
                return st;
        } else {
            snprintf(full, sizeof full, "%s", given);
        }
        for (size_t j = 0; j < t->n_options; j++)
            if (strcmp(t->options[j].value, full) == 0)
                return kvs_yaml_fail(ctx, p, ip, "%s '%s' is listed twice", l->option, full);
        if ((st = append_option(ctx, t, l->option, full, p, (int)i)) != KVS_OK) return st;
    }
    return KVS_OK;
}

static kvs_status tier_lists(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                             kvs_tier_config *t) {
    kvs_status st = KVS_OK;
    for (size_t i = 0; st == KVS_OK && i < COUNT_OF(TIER_LISTS); i++)
        st = tier_list(ctx, f, &TIER_LISTS[i], t);
    return st;
}

static kvs_status tier_options(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                               kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    const kvs_yaml_node *v = f->values[TK_OPTIONS];
    const struct tier_list *list = NULL;
    for (size_t i = 0; i < COUNT_OF(TIER_LISTS); i++)
        if ((size_t)TIER_LISTS[i].type == f->type) list = &TIER_LISTS[i];
    const kvs_yaml_node *paths = list ? f->values[list->field] : NULL;
    size_t n_paths = paths && paths->kind == KVS_YAML_SEQUENCE ? paths->n_items : 0;
    kvs_yaml_key_path(kp, f->path, "options");
    if (v && v->kind != KVS_YAML_MAPPING)
        return kvs_yaml_fail(ctx, v, kp, "expected a mapping of option names to values, found %s",
                             kvs_yaml_describe(v));
    size_t n = v ? v->n_items / 2 : 0;
    for (size_t i = 0; v && i < v->n_items / 2; i++) /* a group's entries are options each */
        if (v->items[2 * i + 1]->kind == KVS_YAML_MAPPING && v->items[2 * i + 1]->n_items >= 2)
            n += v->items[2 * i + 1]->n_items / 2 - 1;
    if (n + n_paths > KVS_CONFIG_MAX_OPTIONS)
        return kvs_yaml_fail(ctx, v ? v : paths, kp,
                             "%zu options and paths, at most %d are allowed", n + n_paths,
                             KVS_CONFIG_MAX_OPTIONS);
    if (n + n_paths == 0) return tier_lists(ctx, f, t);
    t->options = calloc(n + n_paths, sizeof *t->options);
    if (!t->options) return kvs_yaml_out_of_memory(ctx);
    kvs_status st = tier_lists(ctx, f, t);
    for (size_t i = 0; st == KVS_OK && v && i < v->n_items / 2; i++) {
        const kvs_yaml_node *k = v->items[2 * i];
        if (list && k->kind == KVS_YAML_SCALAR && strcmp(k->text, list->option) == 0) {
            char op[KEY_PATH_MAX];
            kvs_yaml_key_path(op, kp, list->option);
            return kvs_yaml_fail(ctx, k, op, "list %s under `%s:`, not as an option", list->owner,
                                 list->name);
        }
        const kvs_yaml_node *val = v->items[2 * i + 1];
        st = tier_option(ctx, f, k, val, kp, t);
    }
    return st;
}

static const char *option_value(const kvs_tier_config *t, const char *key) {
    for (size_t i = 0; i < t->n_options; i++)
        if (strcmp(t->options[i].key, key) == 0) return t->options[i].value;
    return NULL;
}

/* `integrity:` and its key. Keyed is the default where a tier's bytes cross a trust boundary by
 * design (a remote node other tenants share); a remote tier's key defaults to its tenant key. The
 * tiers that re-encode objects or hold them in device memory cannot check tags on every load. */
static kvs_status tier_integrity(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                                 kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    size_t choice = f->type == TYPE_REMOTE ? 1 : 0;
    const kvs_yaml_node *v = f->values[TK_INTEGRITY], *kf = f->values[TK_INTEGRITY_KEY_FILE];
    kvs_yaml_key_path(kp, f->path, "integrity");
    kvs_status st =
        v ? kvs_yaml_get_choice(ctx, v, kp, INTEGRITY, COUNT_OF(INTEGRITY), &choice) : KVS_OK;
    if (st != KVS_OK) return st;
    t->keyed = choice == 1;
    if (t->keyed && (f->type == TYPE_COMPRESS || f->type == TYPE_PEER_GPU))
        return kvs_yaml_fail(ctx, v, kp,
                             "a %s tier cannot be keyed (it re-encodes objects or holds them in "
                             "device memory, where no load could check their tags)",
                             TIER_TYPES[f->type]);
    kvs_yaml_key_path(kp, f->path, "integrity_key_file");
    if (kf && !t->keyed)
        return kvs_yaml_fail(ctx, f->keys[TK_INTEGRITY_KEY_FILE], kp,
                             "an integrity key is for a tier with `integrity: keyed`");
    if (kf)
        return kvs_yaml_get_path(ctx, kf, kp, t->integrity_key_file, sizeof t->integrity_key_file);
    if (!t->keyed) return KVS_OK;
    const char *psk = f->type == TYPE_REMOTE ? option_value(t, "psk_file") : NULL;
    if (psk && psk[0]) {
        snprintf(t->integrity_key_file, sizeof t->integrity_key_file, "%s", psk);
        t->integrity_from_psk = 1;
        return KVS_OK;
    }
    if (f->type == TYPE_REMOTE &&
        !v) { /* the default, on a node without keys: nothing to key with */
        t->keyed = 0;
        return KVS_OK;
    }
    return kvs_yaml_missing_key(
        ctx, f->map, f->path, "integrity_key_file",
        " (a key file of 32..1024 bytes, mode 0600, for `integrity: keyed`)");
}

kvs_status kvs_config_tier_begin(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, kvs_config *cfg,
                                 size_t index, kvs_tier_fields *f) {
    kvs_tier_config *t = &cfg->tiers[index];
    memset(f, 0, sizeof *f);
    f->map = n;
    snprintf(f->path, sizeof f->path, "tiers[%zu]", index);
    if (n->kind != KVS_YAML_MAPPING)
        return kvs_yaml_fail(ctx, n, f->path, "expected a mapping (one tier), found %s",
                             kvs_yaml_describe(n));
    t->line = n->line;
    t->column = n->column;
    kvs_status st = kvs_yaml_map_fields(ctx, n, f->path, TIER_KEYS, TK_COUNT, f->keys, f->values);
    for (size_t k = 0; st == KVS_OK && k < TK_COUNT; k++)
        if (f->values[k]) t->keys_at[k] = (kvs_config_at){f->values[k]->line, f->values[k]->column};
    if (st == KVS_OK) st = tier_name(ctx, f, cfg, index);
    if (st == KVS_OK) st = tier_type(ctx, f, t);
    return st;
}

kvs_status kvs_config_tier_end(const kvs_yaml_ctx *ctx, const kvs_tier_fields *f,
                               kvs_tier_config *t) {
    kvs_status st = KVS_OK;
    if (f->values[TK_WRITE]) {
        char kp[KEY_PATH_MAX];
        size_t policy = 0;
        kvs_yaml_key_path(kp, f->path, "write");
        st = kvs_yaml_get_choice(ctx, f->values[TK_WRITE], kp, WRITE_POLICIES,
                                 COUNT_OF(WRITE_POLICIES), &policy);
        t->write = policy == 1 ? KVS_WRITE_THROUGH : KVS_WRITE_BACK;
    }
    if (st == KVS_OK && f->values[TK_REQUIRED]) {
        char kp[KEY_PATH_MAX];
        kvs_yaml_key_path(kp, f->path, "required");
        st = kvs_yaml_get_bool(ctx, f->values[TK_REQUIRED], kp, &t->required);
    }
    if (st == KVS_OK) st = tier_plugin(ctx, f, t);
    if (st == KVS_OK) st = tier_options(ctx, f, t);
    if (st == KVS_OK) st = tier_integrity(ctx, f, t);
    return st;
}
