/* config.c - strict YAML configuration: libyaml events -> a node tree -> a validated kvs_config.
 *
 * The tree is built from the event stream (not libyaml's document API) because the document API
 * resolves aliases silently; here every anchor, alias and tag is seen and refused. Validation walks
 * the tree with the key path in hand so each message names file, line, column and key. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "abi/kvstrata_backend.h"
#include "common/units.h"

#define MAX_DEPTH    32  /* the schema needs 4; deeper input is refused before it can cost stack */
#define KEY_PATH_MAX 256 /* 'tiers[3].options.shm_name' and the like; longer paths are cut */
#define SHOWN_MAX    40  /* characters of a bad value quoted back in a message */

typedef enum node_kind { NODE_SCALAR, NODE_SEQUENCE, NODE_MAPPING, NODE_ALIAS } node_kind;

typedef struct node {
    node_kind kind;
    char *text; /* scalar: its value, NUL-terminated copy; alias: the anchor name */
    size_t len;
    int plain; /* scalar written without quotes */
    int has_anchor, has_tag;
    int line, column;    /* 1-based */
    struct node **items; /* sequence: entries; mapping: key, value, key, value, ... */
    size_t n_items, cap_items;
} node;

typedef struct parse_ctx {
    const char *name;     /* the file, as messages name it */
    const char *base_dir; /* relative plugin paths resolve against it; NULL keeps them as written */
    const char *input;    /* the raw text, to place reader errors that libyaml gives as offsets */
    size_t input_len;
    char *err;
    size_t err_len;
} parse_ctx;

typedef struct builder {
    node *root;
    node *stack[MAX_DEPTH]; /* open sequences and mappings */
    int depth;
    int documents;
    int done;
} builder;

static const char *const ROOT_KEYS[] = {
    "version", "chunk_tokens", "lease_timeout_ms", "save_decode", "log_level",
    "pool",    "tiers",        "device",           "node",        "restore"};
enum {
    RK_VERSION,
    RK_CHUNK,
    RK_LEASE,
    RK_SAVE_DECODE,
    RK_LOG_LEVEL,
    RK_POOL,
    RK_TIERS,
    RK_DEVICE,
    RK_NODE,
    RK_RESTORE,
    RK_COUNT
};

static const char *const RESTORE_KEYS[] = {"scheduler", "priority", "profile"};
enum { RSK_SCHEDULER, RSK_PRIORITY, RSK_PROFILE, RSK_COUNT };
static const char *const RESTORE_SCHEDULERS[] = {"none", "cacheflow"};  /* KVS_RESTORE_* order */
static const char *const RESTORE_PRIORITIES[] = {"lrf", "srf", "mean"}; /* cf_priority order */
/* The restore profile (kvs-mini-engine --profile writes one). */
static const char *const PROFILE_KEYS[] = {"compute", "tiers"};
enum { PFK_COMPUTE, PFK_TIERS, PFK_COUNT };
static const char *const PROFILE_COMPUTE_KEYS[] = {"fixed_us", "per_token_us",
                                                   "attention_ns_per_token2"};
enum { PCK_FIXED, PCK_TOKEN, PCK_ATT, PCK_COUNT };
/* bandwidth is a rate (250MB/s); bandwidth_mb_s, a plain number of 10^6 bytes per second, is the
 * older spelling (kvs-mini-engine --profile writes it): a tier gives one of the two. */
static const char *const PROFILE_TIER_KEYS[] = {"name", "latency_us", "bandwidth",
                                                "bandwidth_mb_s"};
enum { PTK_NAME, PTK_LATENCY, PTK_BANDWIDTH, PTK_BANDWIDTH_MB_S, PTK_COUNT };

/* Read by kvstrata-node only (its command-line flags override them); a connector ignores them. */
static const char *const NODE_KEYS[] = {"listen",     "psk_file",         "max_clients",
                                        "timeout_ms", "max_object_bytes", "max_handshakes"};
enum { NK_LISTEN, NK_PSK, NK_MAX_CLIENTS, NK_TIMEOUT, NK_MAX_OBJECT, NK_MAX_HANDSHAKES, NK_COUNT };

static const char *const DEVICE_KEYS[] = {"copy_method", "hash_threads", "max_chunks_per_step",
                                          "host_copies"};
enum { DK_METHOD, DK_HASH_THREADS, DK_MAX_CHUNKS, DK_HOST_COPIES, DK_COUNT };
static const char *const HOST_COPIES[] = {"immediate", "deferred"};
static const char *const COPY_METHODS[] = {"auto", "kernel", "dma"}; /* KVS_DEV_COPY_* order */

static const char *const POOL_KEYS[] = {"staging_bytes"};
enum { PK_STAGING, PK_COUNT };

static const char *const TIER_KEYS[] = {"name",   "type",    "capacity", "write",
                                        "plugin", "options", "paths",    "nodes"};
enum {
    TK_NAME,
    TK_TYPE,
    TK_CAPACITY,
    TK_WRITE,
    TK_PLUGIN,
    TK_OPTIONS,
    TK_PATHS,
    TK_NODES,
    TK_COUNT
};
_Static_assert(TK_COUNT == KVS_TIER_KEYS,
               "kvs_tier_config.keys_at holds one position per tier key");

static const char *const LOG_LEVELS[] = {"error", "warn", "info", "debug"};
static const char *const TIER_TYPES[] = {"dram", "plugin", "remote", "ssd"};
enum { TYPE_DRAM, TYPE_PLUGIN, TYPE_REMOTE, TYPE_SSD };
static const char *const WRITE_POLICIES[] = {"back", "through"};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- messages -------------------------------------------------------------------------------- */

static kvs_status vfail_at(const parse_ctx *ctx, int line, int column, const char *key,
                           const char *fmt, va_list ap) {
    if (!ctx->err || ctx->err_len == 0) return KVS_ECONFIG;
    int n;
    if (key && *key)
        n = snprintf(ctx->err, ctx->err_len, "%s:%d:%d: key '%s': ", ctx->name, line, column, key);
    else
        n = snprintf(ctx->err, ctx->err_len, "%s:%d:%d: ", ctx->name, line, column);
    if (n < 0 || (size_t)n >= ctx->err_len) return KVS_ECONFIG;
    vsnprintf(ctx->err + n, ctx->err_len - (size_t)n, fmt, ap);
    return KVS_ECONFIG;
}

static kvs_status fail_at(const parse_ctx *ctx, int line, int column, const char *key,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static kvs_status fail_at(const parse_ctx *ctx, int line, int column, const char *key,
                          const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_status st = vfail_at(ctx, line, column, key, fmt, ap);
    va_end(ap);
    return st;
}

static kvs_status fail(const parse_ctx *ctx, const node *at, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static kvs_status fail(const parse_ctx *ctx, const node *at, const char *key, const char *fmt,
                       ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_status st = vfail_at(ctx, at->line, at->column, key, fmt, ap);
    va_end(ap);
    return st;
}

/* Refusals found when the connector opens, after parsing: same format, from the kept positions. */
static kvs_status vrefuse(const kvs_config *cfg, kvs_config_at at, const char *key, char *err,
                          size_t err_len, const char *fmt, va_list ap) {
    if (at.line > 0) {
        parse_ctx ctx = {.name = cfg->source, .err = err, .err_len = err_len};
        return vfail_at(&ctx, at.line, at.column, key, fmt, ap);
    }
    if (!err || err_len == 0) return KVS_ECONFIG;
    int n = snprintf(err, err_len, "%s: key '%s': ", cfg->source, key);
    if (n >= 0 && (size_t)n < err_len) vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
    return KVS_ECONFIG;
}

kvs_status kvs_config_refuse(const kvs_config *cfg, kvs_config_at at, const char *key, char *err,
                             size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_status st = vrefuse(cfg, at, key, err, err_len, fmt, ap);
    va_end(ap);
    return st;
}

/* The YAML list a repeated option comes from (`path` from `paths:`), or NULL. */
static const char *list_of_option(const char *option) {
    return strcmp(option, "path") == 0 ? "paths" : strcmp(option, "node") == 0 ? "nodes" : NULL;
}

/* Where name (see kvs_config_refuse_tier) stands in tier t (number index): its key path and position. */
static kvs_config_at tier_position(const kvs_tier_config *t, size_t index, const char *name,
                                   char *key, size_t key_len) {
    char option[KVS_NAME_MAX];
    long nth = 0;
    const char *bracket = name ? strchr(name, '[') : NULL;
    size_t n = !name ? 0 : bracket ? (size_t)(bracket - name) : strlen(name);
    if (n == 0 || n >= sizeof option) {
        snprintf(key, key_len, "tiers[%zu]", index);
        return (kvs_config_at){t->line, t->column};
    }
    memcpy(option, name, n);
    option[n] = '\0';
    if (bracket) nth = strtol(bracket + 1, NULL, 10);
    for (size_t i = 0; i < t->n_options; i++) {
        const kvs_config_option *o = &t->options[i];
        if (strcmp(o->key, option) != 0 || nth-- > 0) continue;
        const char *list = list_of_option(option);
        if (o->list_index >= 0 && list)
            snprintf(key, key_len, "tiers[%zu].%s[%d]", index, list, o->list_index);
        else
            snprintf(key, key_len, "tiers[%zu].options.%s", index, option);
        return o->at;
    }
    for (size_t k = 0; k < TK_COUNT; k++) {
        if (strcmp(TIER_KEYS[k], option) != 0) continue;
        snprintf(key, key_len, "tiers[%zu].%s", index, option);
        return t->keys_at[k].line > 0 ? t->keys_at[k] : (kvs_config_at){t->line, t->column};
    }
    const char *list = list_of_option(option);
    if (list) { /* a list entry the file does not have: the list, else the tier */
        size_t k = strcmp(list, "paths") == 0 ? TK_PATHS : TK_NODES;
        snprintf(key, key_len, "tiers[%zu].%s", index, list);
        return t->keys_at[k].line > 0 ? t->keys_at[k] : (kvs_config_at){t->line, t->column};
    }
    /* an option the backend needs and the file lacks: at the tier's `options:`, else the tier */
    snprintf(key, key_len, "tiers[%zu].options.%s", index, option);
    return t->keys_at[TK_OPTIONS].line > 0 ? t->keys_at[TK_OPTIONS]
                                           : (kvs_config_at){t->line, t->column};
}

kvs_status kvs_config_refuse_tier(const kvs_config *cfg, size_t tier, const char *name, char *err,
                                  size_t err_len, const char *fmt, ...) {
    char key[KEY_PATH_MAX];
    kvs_config_at at = tier_position(&cfg->tiers[tier], tier, name, key, sizeof key);
    va_list ap;
    va_start(ap, fmt);
    kvs_status st = vrefuse(cfg, at, key, err, err_len, fmt, ap);
    va_end(ap);
    return st;
}

static kvs_status out_of_memory(const parse_ctx *ctx) {
    if (ctx->err && ctx->err_len) snprintf(ctx->err, ctx->err_len, "%s: out of memory", ctx->name);
    return KVS_ENOMEM;
}

/* A value quoted back in a message: cut to SHOWN_MAX characters, control characters as '?'. */
static const char *shown(const node *n, char buf[SHOWN_MAX + 4]) {
    size_t i = 0;
    for (; i < n->len && i < SHOWN_MAX; i++) {
        unsigned char c = (unsigned char)n->text[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (n->len > SHOWN_MAX) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}

static int is_empty_scalar(const node *n) {
    return n->kind == NODE_SCALAR && n->plain && n->len == 0;
}

static const char *describe(const node *n) {
    switch (n->kind) {
        case NODE_MAPPING: return "a mapping";
        case NODE_SEQUENCE: return "a sequence";
        case NODE_ALIAS: return "an alias";
        case NODE_SCALAR: break;
    }
    return is_empty_scalar(n) ? "an empty value" : "a scalar";
}

static void join_names(const char *const *names, size_t n, char *out, size_t out_len) {
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        int w = snprintf(out + used, out_len - used, "%s%s", i ? ", " : "", names[i]);
        if (w < 0 || (size_t)w >= out_len - used) return;
        used += (size_t)w;
    }
}

static void key_path(char out[KEY_PATH_MAX], const char *parent, const char *key) {
    if (parent && *parent)
        snprintf(out, KEY_PATH_MAX, "%s.%s", parent, key);
    else
        snprintf(out, KEY_PATH_MAX, "%s", key);
}

/* ---- the node tree --------------------------------------------------------------------------- */

static void node_free(node *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_items; i++) node_free(n->items[i]);
    free(n->items);
    free(n->text);
    free(n);
}

static int node_append(node *parent, node *child) {
    if (parent->n_items == parent->cap_items) {
        size_t cap = parent->cap_items ? parent->cap_items * 2 : 8;
        node **items = realloc(parent->items, cap * sizeof *items);
        if (!items) return -1;
        parent->items = items;
        parent->cap_items = cap;
    }
    parent->items[parent->n_items++] = child;
    return 0;
}

static char *copy_text(const unsigned char *text, size_t len) {
    char *copy = malloc(len + 1);
    if (!copy) return NULL;
    if (len) memcpy(copy, text, len);
    copy[len] = '\0';
    return copy;
}

/* A node for a scalar, alias, sequence-start or mapping-start event; NULL when out of memory. */
static node *node_from_event(const yaml_event_t *ev) {
    node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->line = (int)ev->start_mark.line + 1;
    n->column = (int)ev->start_mark.column + 1;
    if (ev->type == YAML_SCALAR_EVENT) {
        n->kind = NODE_SCALAR;
        n->len = ev->data.scalar.length;
        n->text = copy_text(ev->data.scalar.value, n->len);
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        n->has_anchor = ev->data.scalar.anchor != NULL;
        n->has_tag = ev->data.scalar.tag != NULL;
    } else if (ev->type == YAML_ALIAS_EVENT) {
        n->kind = NODE_ALIAS;
        n->len = strlen((const char *)ev->data.alias.anchor);
        n->text = copy_text(ev->data.alias.anchor, n->len);
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        n->kind = NODE_SEQUENCE;
        n->has_anchor = ev->data.sequence_start.anchor != NULL;
        n->has_tag = ev->data.sequence_start.tag != NULL;
    } else {
        n->kind = NODE_MAPPING;
        n->has_anchor = ev->data.mapping_start.anchor != NULL;
        n->has_tag = ev->data.mapping_start.tag != NULL;
    }
    if ((n->kind == NODE_SCALAR || n->kind == NODE_ALIAS) && !n->text) {
        free(n);
        return NULL;
    }
    return n;
}

static kvs_status builder_add(const parse_ctx *ctx, builder *b, const yaml_event_t *ev) {
    node *n = node_from_event(ev);
    if (!n) return out_of_memory(ctx);
    int container = n->kind == NODE_SEQUENCE || n->kind == NODE_MAPPING;
    if (container && b->depth == MAX_DEPTH) {
        kvs_status st = fail(ctx, n, NULL, "nesting is deeper than %d levels", MAX_DEPTH);
        node_free(n);
        return st;
    }
    if (b->depth == 0) {
        b->root = n; /* one document, hence one root: a second document is refused earlier */
    } else if (node_append(b->stack[b->depth - 1], n) != 0) {
        node_free(n);
        return out_of_memory(ctx);
    }
    if (container) b->stack[b->depth++] = n;
    return KVS_OK;
}

static kvs_status builder_event(const parse_ctx *ctx, builder *b, const yaml_event_t *ev) {
    switch (ev->type) {
        case YAML_STREAM_END_EVENT: b->done = 1; return KVS_OK;
        case YAML_DOCUMENT_START_EVENT:
            if (b->documents++ == 0) return KVS_OK;
            return fail_at(ctx, (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1, NULL,
                           "a second YAML document: the file must hold exactly one");
        case YAML_SCALAR_EVENT:
        case YAML_ALIAS_EVENT:
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: return builder_add(ctx, b, ev);
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            if (b->depth > 0) b->depth--;
            return KVS_OK;
        default: return KVS_OK;
    }
}

static void offset_to_line_column(const parse_ctx *ctx, size_t offset, int *line, int *column) {
    *line = 1;
    *column = 1;
    for (size_t i = 0; i < offset && i < ctx->input_len; i++) {
        if (ctx->input[i] == '\n') {
            (*line)++;
            *column = 1;
        } else {
            (*column)++;
        }
    }
}

static kvs_status syntax_error(const parse_ctx *ctx, const yaml_parser_t *parser) {
    if (parser->error == YAML_MEMORY_ERROR) return out_of_memory(ctx);
    const char *problem = parser->problem ? parser->problem : "unreadable YAML";
    int line = (int)parser->problem_mark.line + 1, column = (int)parser->problem_mark.column + 1;
    if (parser->error == YAML_READER_ERROR) {
        offset_to_line_column(ctx, parser->problem_offset, &line, &column);
        return fail_at(ctx, line, column, NULL, "YAML syntax error: %s", problem);
    }
    if (parser->context)
        return fail_at(ctx, line, column, NULL, "YAML syntax error: %s (%s at line %d column %d)",
                       problem, parser->context, (int)parser->context_mark.line + 1,
                       (int)parser->context_mark.column + 1);
    return fail_at(ctx, line, column, NULL, "YAML syntax error: %s", problem);
}

/* *root is NULL when the stream holds no document at all. */
static kvs_status build_tree(const parse_ctx *ctx, node **root) {
    yaml_parser_t parser;
    builder b;
    kvs_status st = KVS_OK;
    memset(&b, 0, sizeof b);
    if (!yaml_parser_initialize(&parser)) return out_of_memory(ctx);
    yaml_parser_set_input_string(&parser, (const unsigned char *)ctx->input, ctx->input_len);
    while (!b.done && st == KVS_OK) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            st = syntax_error(ctx, &parser);
            break;
        }
        st = builder_event(ctx, &b, &ev);
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    if (st != KVS_OK) {
        node_free(b.root);
        return st;
    }
    *root = b.root;
    return KVS_OK;
}

/* Anchors, aliases and tags anywhere in the file are refused before the schema is looked at. */
static kvs_status check_plain_yaml(const parse_ctx *ctx, const node *n, const char *path) {
    if (n->kind == NODE_ALIAS || n->has_anchor)
        return fail(ctx, n, path, "anchors and aliases are not supported");
    if (n->has_tag) return fail(ctx, n, path, "tags are not supported");
    if (n->kind == NODE_SCALAR && strlen(n->text) != n->len)
        return fail(ctx, n, path, "a NUL character is not allowed in a value");
    char child[KEY_PATH_MAX];
    for (size_t i = 0; i < n->n_items; i++) {
        if (n->kind == NODE_SEQUENCE) {
            snprintf(child, sizeof child, "%s[%zu]", path, i);
        } else {
            const node *key = n->items[i & ~(size_t)1];
            key_path(child, path, key->kind == NODE_SCALAR ? key->text : "?");
        }
        kvs_status st = check_plain_yaml(ctx, n->items[i], child);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* ---- typed values ---------------------------------------------------------------------------- */

/* Splits a mapping into the known keys: keys[i]/values[i] for names[i], NULL when absent. Refuses
 * non-scalar keys, unknown keys (listing the valid ones) and a key given twice. */
static kvs_status map_fields(const parse_ctx *ctx, const node *map, const char *path,
                             const char *const *names, size_t n_names, const node **keys,
                             const node **values) {
    char kp[KEY_PATH_MAX];
    for (size_t i = 0; i + 1 < map->n_items; i += 2) {
        const node *k = map->items[i];
        if (k->kind != NODE_SCALAR)
            return fail(ctx, k, path, "a key must be a scalar, found %s", describe(k));
        key_path(kp, path, k->text);
        size_t idx = 0;
        while (idx < n_names && strcmp(names[idx], k->text) != 0) idx++;
        if (idx == n_names) {
            char valid[256];
            join_names(names, n_names, valid, sizeof valid);
            return fail(ctx, k, kp, "unknown key (valid keys: %s)", valid);
        }
        if (keys[idx])
            return fail(ctx, k, kp, "duplicate key (first given at line %d column %d)",
                        keys[idx]->line, keys[idx]->column);
        keys[idx] = k;
        values[idx] = map->items[i + 1];
    }
    return KVS_OK;
}

static kvs_status expect_scalar(const parse_ctx *ctx, const node *n, const char *path,
                                const char *what) {
    if (n->kind == NODE_SCALAR && !is_empty_scalar(n)) return KVS_OK;
    return fail(ctx, n, path, "expected %s, found %s", what, describe(n));
}

static kvs_status range_error(const parse_ctx *ctx, const node *n, const char *path, uint64_t min,
                              uint64_t max) {
    char buf[SHOWN_MAX + 4];
    if (min == max)
        return fail(ctx, n, path, "%s is out of range (must be %llu)", shown(n, buf),
                    (unsigned long long)min);
    if (max == UINT64_MAX)
        return fail(ctx, n, path, "%s is out of range (must be at least %llu)", shown(n, buf),
                    (unsigned long long)min);
    return fail(ctx, n, path, "%s is out of range (must be between %llu and %llu)", shown(n, buf),
                (unsigned long long)min, (unsigned long long)max);
}

/* A plain decimal integer in [min, max]. Quoted text is a string, not an integer. */
static kvs_status get_uint(const parse_ctx *ctx, const node *n, const char *path, uint64_t min,
                           uint64_t max, uint64_t *out) {
    char buf[SHOWN_MAX + 4];
    kvs_status st = expect_scalar(ctx, n, path, "an integer");
    if (st != KVS_OK) return st;
    if (!n->plain)
        return fail(ctx, n, path, "expected an integer, found the quoted string '%s'",
                    shown(n, buf));
    const char *s = n->text;
    int negative = *s == '-';
    if (negative) s++;
    if (!*s || strspn(s, "0123456789") != strlen(s))
        return fail(ctx, n, path, "expected an integer, found '%s'", shown(n, buf));
    uint64_t value = 0;
    int overflow = 0;
    for (; *s; s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (value > (UINT64_MAX - d) / 10)
            overflow = 1;
        else
            value = value * 10 + d;
    }
    if (overflow || (negative && value != 0) || value < min || value > max)
        return range_error(ctx, n, path, min, max);
    *out = value;
    return KVS_OK;
}

static kvs_status get_bool(const parse_ctx *ctx, const node *n, const char *path, int *out) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    char buf[SHOWN_MAX + 4];
    kvs_status st = expect_scalar(ctx, n, path, "a boolean");
    if (st != KVS_OK) return st;
    for (size_t i = 0; n->plain && i < COUNT_OF(yes); i++) {
        int is_yes = strcasecmp(n->text, yes[i]) == 0;
        if (is_yes || strcasecmp(n->text, no[i]) == 0) {
            *out = is_yes;
            return KVS_OK;
        }
    }
    return fail(ctx, n, path, "expected a boolean (true/false, yes/no, on/off), found %s'%s'",
                n->plain ? "" : "the quoted string ", shown(n, buf));
}

/* A plain finite decimal number in [min, max]. */
static kvs_status get_double(const parse_ctx *ctx, const node *n, const char *path, double min,
                             double max, double *out) {
    char buf[SHOWN_MAX + 4];
    kvs_status st = expect_scalar(ctx, n, path, "a number");
    if (st != KVS_OK) return st;
    char *end = NULL;
    errno = 0;
    double v = n->plain ? strtod(n->text, &end) : 0;
    if (!n->plain || end == n->text || *end || errno == ERANGE || !isfinite(v))
        return fail(ctx, n, path, "expected a number, found %s'%s'",
                    n->plain ? "" : "the quoted string ", shown(n, buf));
    if (v < min || v > max)
        return fail(ctx, n, path, "%s is out of range (must be between %g and %g)", shown(n, buf),
                    min, max);
    *out = v;
    return KVS_OK;
}

static kvs_status get_choice(const parse_ctx *ctx, const node *n, const char *path,
                             const char *const *names, size_t n_names, size_t *out) {
    char valid[128], buf[SHOWN_MAX + 4];
    join_names(names, n_names, valid, sizeof valid);
    if (n->kind != NODE_SCALAR || is_empty_scalar(n))
        return fail(ctx, n, path, "expected one of %s, found %s", valid, describe(n));
    for (size_t i = 0; i < n_names; i++) {
        if (strcmp(n->text, names[i]) == 0) {
            *out = i;
            return KVS_OK;
        }
    }
    return fail(ctx, n, path, "bad value '%s' (expected one of %s)", shown(n, buf), valid);
}

/* A size with unit (common/units.h), > 0. */
static kvs_status get_size(const parse_ctx *ctx, const node *n, const char *path, uint64_t *out) {
    char why[160];
    kvs_status st = expect_scalar(ctx, n, path, "a size such as 4GiB");
    if (st != KVS_OK) return st;
    if (kvs_units_parse_size(n->text, out, why, sizeof why) != KVS_OK) {
        char buf[SHOWN_MAX + 4];
        return fail(ctx, n, path, "bad size '%s': %s", shown(n, buf), why);
    }
    if (*out == 0) return fail(ctx, n, path, "the size must be greater than 0");
    return KVS_OK;
}

/* A rate (common/units.h: a size per second such as 250MB/s), > 0. */
static kvs_status get_rate(const parse_ctx *ctx, const node *n, const char *path, uint64_t *out) {
    char why[160];
    kvs_status st = expect_scalar(ctx, n, path, "a rate such as 250MB/s");
    if (st != KVS_OK) return st;
    if (kvs_units_parse_rate(n->text, out, why, sizeof why) != KVS_OK) {
        char buf[SHOWN_MAX + 4];
        return fail(ctx, n, path, "bad rate '%s' (a size per second such as 250MB/s): %s",
                    shown(n, buf), why);
    }
    if (*out == 0) return fail(ctx, n, path, "the rate must be greater than 0");
    return KVS_OK;
}

static kvs_status get_text(const parse_ctx *ctx, const node *n, const char *path, char *out,
                           size_t cap) {
    kvs_status st = expect_scalar(ctx, n, path, "a string");
    if (st != KVS_OK) return st;
    if (n->len >= cap) return fail(ctx, n, path, "too long (at most %zu characters)", cap - 1);
    memcpy(out, n->text, n->len + 1);
    return KVS_OK;
}

/* ---- tiers ----------------------------------------------------------------------------------- */

typedef struct tier_fields {
    const node *map;
    const node *keys[TK_COUNT];
    const node *values[TK_COUNT];
    char path[KEY_PATH_MAX];
    size_t type;
} tier_fields;

static kvs_status missing_key(const parse_ctx *ctx, const node *map, const char *parent,
                              const char *key, const char *hint) {
    char kp[KEY_PATH_MAX];
    key_path(kp, parent, key);
    return fail(ctx, map, kp, "missing required key%s", hint);
}

/* v as a mapping of the keys in names (map_fields); with `required` every one of them must be there. */
static kvs_status mapping_fields(const parse_ctx *ctx, const node *v, const char *path,
                                 const char *const *names, size_t n_names, const node **keys,
                                 const node **values, int required) {
    if (v->kind != NODE_MAPPING)
        return fail(ctx, v, path, "expected a mapping, found %s", describe(v));
    kvs_status st = map_fields(ctx, v, path, names, n_names, keys, values);
    for (size_t k = 0; required && st == KVS_OK && k < n_names; k++)
        if (!values[k]) st = missing_key(ctx, v, path, names[k], "");
    return st;
}

static uint64_t physical_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_size <= 0) return UINT64_MAX; /* unknown: do not refuse */
    return (uint64_t)pages * (uint64_t)page_size;
}

static int valid_tier_name(const char *name) {
    size_t len = strlen(name);
    if (len == 0 || len >= KVS_NAME_MAX) return 0;
    return strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") == len;
}

static kvs_status tier_name(const parse_ctx *ctx, const tier_fields *f, kvs_config *cfg,
                            size_t index) {
    char kp[KEY_PATH_MAX];
    const node *v = f->values[TK_NAME];
    if (!v) return missing_key(ctx, f->map, f->path, "name", "");
    key_path(kp, f->path, "name");
    kvs_status st = expect_scalar(ctx, v, kp, "a tier name");
    if (st != KVS_OK) return st;
    if (!valid_tier_name(v->text)) {
        char buf[SHOWN_MAX + 4];
        return fail(ctx, v, kp, "bad tier name '%s' (1 to %d of A-Z a-z 0-9 _ . -)", shown(v, buf),
                    KVS_NAME_MAX - 1);
    }
    for (size_t j = 0; j < index; j++) {
        if (strcmp(cfg->tiers[j].name, v->text) == 0)
            return fail(ctx, v, kp, "duplicate tier name '%s' (tiers[%zu] at line %d has it)",
                        v->text, j, cfg->tiers[j].line);
    }
    memcpy(cfg->tiers[index].name, v->text, v->len + 1);
    return KVS_OK;
}

static kvs_status tier_type(const parse_ctx *ctx, tier_fields *f, kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    if (!f->values[TK_TYPE])
        return missing_key(ctx, f->map, f->path, "type", " (dram, ssd, remote or plugin)");
    key_path(kp, f->path, "type");
    kvs_status st =
        get_choice(ctx, f->values[TK_TYPE], kp, TIER_TYPES, COUNT_OF(TIER_TYPES), &f->type);
    if (st != KVS_OK) return st;
    snprintf(t->type, sizeof t->type, "%s", TIER_TYPES[f->type]);
    return KVS_OK;
}

static kvs_status tier_capacity(const parse_ctx *ctx, const tier_fields *f, kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    const node *v = f->values[TK_CAPACITY];
    if (!v) {
        if (f->type == TYPE_DRAM)
            return missing_key(ctx, f->map, f->path, "capacity", " (a dram tier needs a size)");
        if (f->type == TYPE_SSD)
            return missing_key(ctx, f->map, f->path, "capacity",
                               " (an ssd tier needs a size, over all paths)");
        return KVS_OK;
    }
    key_path(kp, f->path, "capacity");
    kvs_status st = get_size(ctx, v, kp, &t->capacity_bytes);
    if (st != KVS_OK) return st;
    uint64_t physical = physical_memory_bytes();
    if (f->type != TYPE_DRAM || t->capacity_bytes <= physical) return KVS_OK;
    char buf[SHOWN_MAX + 4];
    return fail(ctx, v, kp,
                "%s (%llu bytes) is more than this machine's physical memory "
                "(%llu bytes)",
                shown(v, buf), (unsigned long long)t->capacity_bytes, (unsigned long long)physical);
}

/* A path from the file: relative ones resolve against the file's directory (kept as written when
 * the text has no file). */
static kvs_status resolve_path(const parse_ctx *ctx, const node *at, const char *kp,
                               const char *given, char *out, size_t len) {
    int n = given[0] == '/' || !ctx->base_dir ? snprintf(out, len, "%s", given)
                                              : snprintf(out, len, "%s/%s", ctx->base_dir, given);
    if (n < 0 || (size_t)n >= len)
        return fail(ctx, at, kp, "the resolved path is longer than %d characters",
                    KVS_PATH_MAX - 1);
    return KVS_OK;
}

/* A path given as text at n, resolved against the file's directory into out. */
static kvs_status get_path(const parse_ctx *ctx, const node *n, const char *kp, char *out,
                           size_t cap) {
    char given[KVS_PATH_MAX];
    kvs_status st = get_text(ctx, n, kp, given, sizeof given);
    return st == KVS_OK ? resolve_path(ctx, n, kp, given, out, cap) : st;
}

static kvs_status tier_plugin(const parse_ctx *ctx, const tier_fields *f, kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    const node *v = f->values[TK_PLUGIN];
    key_path(kp, f->path, "plugin");
    if (f->type != TYPE_PLUGIN) {
        if (!v) return KVS_OK;
        return fail(ctx, f->keys[TK_PLUGIN], kp,
                    "only a tier of type plugin takes a plugin path (this tier is type %s)",
                    TIER_TYPES[f->type]);
    }
    if (!v) return missing_key(ctx, f->map, f->path, "plugin", " (path of the backend .so)");
    return get_path(ctx, v, kp, t->plugin, sizeof t->plugin);
}

/* Copies key and value into the next free entry of t->options (allocated by the caller). */
static kvs_status append_option(const parse_ctx *ctx, kvs_tier_config *t, const char *key,
                                const char *value, const node *at, int list_index) {
    kvs_config_option *o = &t->options[t->n_options];
    o->at = (kvs_config_at){at->line, at->column};
    o->list_index = list_index;
    o->key = strdup(key);
    o->value = strdup(value);
    if (!o->key || !o->value) {
        free(o->key);
        free(o->value);
        o->key = o->value = NULL;
        return out_of_memory(ctx);
    }
    t->n_options++;
    return KVS_OK;
}

/* Options whose value is a path: relative ones resolve against the file's directory. */
static const struct {
    int type;
    const char *option;
} PATH_OPTIONS[] = {{TYPE_REMOTE, "psk_file"}};

static kvs_status tier_option(const parse_ctx *ctx, const tier_fields *f, const node *k,
                              const node *v, const char *path, kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    if (k->kind != NODE_SCALAR || k->len == 0)
        return fail(ctx, k, path, "an option name must be a non-empty scalar, found %s",
                    describe(k));
    key_path(kp, path, k->text);
    for (size_t j = 0; j < t->n_options; j++) {
        if (strcmp(t->options[j].key, k->text) == 0)
            return fail(ctx, k, kp, "duplicate key (given twice in options)");
    }
    if (v->kind != NODE_SCALAR)
        return fail(ctx, v, kp, "an option value must be a scalar, found %s", describe(v));
    for (size_t i = 0; i < COUNT_OF(PATH_OPTIONS); i++) {
        if ((size_t)PATH_OPTIONS[i].type != f->type ||
            strcmp(PATH_OPTIONS[i].option, k->text) != 0 || v->len == 0)
            continue;
        char full[KVS_PATH_MAX];
        kvs_status st = resolve_path(ctx, v, kp, v->text, full, sizeof full);
        return st == KVS_OK ? append_option(ctx, t, k->text, full, k, -1) : st;
    }
    return append_option(ctx, t, k->text, v->text, k, -1);
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
};

static kvs_status tier_list(const parse_ctx *ctx, const tier_fields *f, const struct tier_list *l,
                            kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    const node *v = f->values[l->field];
    key_path(kp, f->path, l->name);
    if (f->type != (size_t)l->type) {
        if (!v) return KVS_OK;
        return fail(ctx, f->keys[l->field], kp,
                    "only a tier of type %s takes %s (this tier is type %s)", TIER_TYPES[l->type],
                    l->name, TIER_TYPES[f->type]);
    }
    if (!v) return missing_key(ctx, f->map, f->path, l->name, l->hint);
    if (v->kind != NODE_SEQUENCE || v->n_items == 0)
        return fail(ctx, v, kp, "expected a non-empty sequence of %s, found %s", l->items,
                    describe(v));
    for (size_t i = 0; i < v->n_items; i++) {
        const node *p = v->items[i];
        char ip[KEY_PATH_MAX], given[KVS_PATH_MAX], full[KVS_PATH_MAX];
        snprintf(ip, sizeof ip, "%s[%zu]", kp, i);
        kvs_status st = get_text(ctx, p, ip, given, sizeof given);
        if (st != KVS_OK) return st;
        if (given[0] == '\0') return fail(ctx, p, ip, "an empty %s", l->option);
        if (l->is_path) {
            if ((st = resolve_path(ctx, p, ip, given, full, sizeof full)) != KVS_OK) return st;
        } else {
            snprintf(full, sizeof full, "%s", given);
        }
        for (size_t j = 0; j < t->n_options; j++)
            if (strcmp(t->options[j].value, full) == 0)
                return fail(ctx, p, ip, "%s '%s' is listed twice", l->option, full);
        if ((st = append_option(ctx, t, l->option, full, p, (int)i)) != KVS_OK) return st;
    }
    return KVS_OK;
}

static kvs_status tier_lists(const parse_ctx *ctx, const tier_fields *f, kvs_tier_config *t) {
    kvs_status st = KVS_OK;
    for (size_t i = 0; st == KVS_OK && i < COUNT_OF(TIER_LISTS); i++)
        st = tier_list(ctx, f, &TIER_LISTS[i], t);
    return st;
}

static kvs_status tier_options(const parse_ctx *ctx, const tier_fields *f, kvs_tier_config *t) {
    char kp[KEY_PATH_MAX];
    const node *v = f->values[TK_OPTIONS];
    const struct tier_list *list = NULL;
    for (size_t i = 0; i < COUNT_OF(TIER_LISTS); i++)
        if ((size_t)TIER_LISTS[i].type == f->type) list = &TIER_LISTS[i];
    const node *paths = list ? f->values[list->field] : NULL;
    size_t n_paths = paths && paths->kind == NODE_SEQUENCE ? paths->n_items : 0;
    key_path(kp, f->path, "options");
    if (v && v->kind != NODE_MAPPING)
        return fail(ctx, v, kp, "expected a mapping of option names to values, found %s",
                    describe(v));
    size_t n = v ? v->n_items / 2 : 0;
    if (n + n_paths > KVS_CONFIG_MAX_OPTIONS)
        return fail(ctx, v ? v : paths, kp, "%zu options and paths, at most %d are allowed",
                    n + n_paths, KVS_CONFIG_MAX_OPTIONS);
    if (n + n_paths == 0) return tier_lists(ctx, f, t);
    t->options = calloc(n + n_paths, sizeof *t->options);
    if (!t->options) return out_of_memory(ctx);
    kvs_status st = tier_lists(ctx, f, t);
    for (size_t i = 0; st == KVS_OK && i < n; i++) {
        const node *k = v->items[2 * i];
        if (list && k->kind == NODE_SCALAR && strcmp(k->text, list->option) == 0) {
            char op[KEY_PATH_MAX];
            key_path(op, kp, list->option);
            return fail(ctx, k, op, "list %s under `%s:`, not as an option", list->owner,
                        list->name);
        }
        const node *val = v->items[2 * i + 1];
        st = tier_option(ctx, f, k, val, kp, t);
    }
    return st;
}

static kvs_status parse_tier(const parse_ctx *ctx, const node *n, kvs_config *cfg, size_t index) {
    kvs_tier_config *t = &cfg->tiers[index];
    tier_fields f;
    memset(&f, 0, sizeof f);
    f.map = n;
    snprintf(f.path, sizeof f.path, "tiers[%zu]", index);
    if (n->kind != NODE_MAPPING)
        return fail(ctx, n, f.path, "expected a mapping (one tier), found %s", describe(n));
    t->line = n->line;
    t->column = n->column;
    kvs_status st = map_fields(ctx, n, f.path, TIER_KEYS, TK_COUNT, f.keys, f.values);
    for (size_t k = 0; st == KVS_OK && k < TK_COUNT; k++)
        if (f.values[k]) t->keys_at[k] = (kvs_config_at){f.values[k]->line, f.values[k]->column};
    if (st == KVS_OK) st = tier_name(ctx, &f, cfg, index);
    if (st == KVS_OK) st = tier_type(ctx, &f, t);
    if (st == KVS_OK) st = tier_capacity(ctx, &f, t);
    if (st == KVS_OK && f.values[TK_WRITE]) {
        char kp[KEY_PATH_MAX];
        size_t policy = 0;
        key_path(kp, f.path, "write");
        st = get_choice(ctx, f.values[TK_WRITE], kp, WRITE_POLICIES, COUNT_OF(WRITE_POLICIES),
                        &policy);
        t->write = policy == 1 ? KVS_WRITE_THROUGH : KVS_WRITE_BACK;
    }
    if (st == KVS_OK) st = tier_plugin(ctx, &f, t);
    if (st == KVS_OK) st = tier_options(ctx, &f, t);
    return st;
}

static kvs_status parse_tiers(const parse_ctx *ctx, const node *root, const node *v,
                              kvs_config *cfg) {
    if (!v) return missing_key(ctx, root, NULL, "tiers", " (a sequence of at least one tier)");
    if (v->kind != NODE_SEQUENCE)
        return fail(ctx, v, "tiers", "expected a sequence of tiers, found %s", describe(v));
    if (v->n_items == 0) return fail(ctx, v, "tiers", "at least one tier is required");
    if (v->n_items > KVS_CONFIG_MAX_TIERS)
        return fail(ctx, v, "tiers", "%zu tiers, at most %d are allowed", v->n_items,
                    KVS_CONFIG_MAX_TIERS);
    cfg->tiers = calloc(v->n_items, sizeof *cfg->tiers);
    if (!cfg->tiers) return out_of_memory(ctx);
    cfg->n_tiers = v->n_items; /* zeroed entries: kvs_config_free copes with a partial fill */
    for (size_t i = 0; i < v->n_items; i++) {
        kvs_status st = parse_tier(ctx, v->items[i], cfg, i);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* ---- the top level --------------------------------------------------------------------------- */

static void set_defaults(kvs_config *cfg) {
    cfg->version = 1;
    cfg->chunk_tokens = 256;
    cfg->lease_timeout_ms = 30000;
    cfg->save_decode = 0;
    cfg->log_level = KVS_LOG_WARN;
    cfg->staging_bytes = 256ull << 20;
    cfg->copy_method = 0;
    cfg->hash_threads = 4;
    cfg->max_chunks_per_step = 1024;
    cfg->restore.priority =
        1; /* srf: docs/cacheflow.md shows the paper's lrf losing on mean TTFT */
}

static kvs_status parse_device(const parse_ctx *ctx, const node *v, kvs_config *cfg) {
    const node *keys[DK_COUNT] = {NULL}, *values[DK_COUNT] = {NULL};
    kvs_status st = mapping_fields(ctx, v, "device", DEVICE_KEYS, DK_COUNT, keys, values, 0);
    uint64_t value;
    size_t choice;
    if (st == KVS_OK && values[DK_METHOD]) {
        st = get_choice(ctx, values[DK_METHOD], "device.copy_method", COPY_METHODS,
                        COUNT_OF(COPY_METHODS), &choice);
        if (st == KVS_OK) cfg->copy_method = (int)choice;
    }
    if (st == KVS_OK && values[DK_HASH_THREADS]) {
        st = get_uint(ctx, values[DK_HASH_THREADS], "device.hash_threads", 1, 64, &value);
        if (st == KVS_OK) cfg->hash_threads = (uint32_t)value;
    }
    if (st == KVS_OK && values[DK_MAX_CHUNKS]) {
        st =
            get_uint(ctx, values[DK_MAX_CHUNKS], "device.max_chunks_per_step", 1, 1u << 20, &value);
        if (st == KVS_OK) cfg->max_chunks_per_step = (uint32_t)value;
    }
    if (st == KVS_OK && values[DK_HOST_COPIES]) {
        st = get_choice(ctx, values[DK_HOST_COPIES], "device.host_copies", HOST_COPIES,
                        COUNT_OF(HOST_COPIES), &choice);
        if (st == KVS_OK) cfg->host_deferred = choice == 1;
    }
    return st;
}

static kvs_status parse_node(const parse_ctx *ctx, const node *v, kvs_config *cfg) {
    const node *keys[NK_COUNT] = {NULL}, *values[NK_COUNT] = {NULL};
    kvs_status st = mapping_fields(ctx, v, "node", NODE_KEYS, NK_COUNT, keys, values, 0);
    uint64_t value;
    if (st == KVS_OK && values[NK_LISTEN]) {
        st = get_text(ctx, values[NK_LISTEN], "node.listen", cfg->node.listen,
                      sizeof cfg->node.listen);
        const char *colon = st == KVS_OK ? strrchr(cfg->node.listen, ':') : NULL;
        char *end = NULL;
        unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
        if (st == KVS_OK &&
            (!colon || colon == cfg->node.listen || !colon[1] || *end || port > 65535))
            st = fail(ctx, values[NK_LISTEN], "node.listen",
                      "expected HOST:PORT (port 0..65535; 0 picks one), found "
                      "'%s'",
                      cfg->node.listen);
    }
    if (st == KVS_OK && values[NK_PSK])
        st = get_path(ctx, values[NK_PSK], "node.psk_file", cfg->node.psk_file,
                      sizeof cfg->node.psk_file);
    if (st == KVS_OK && values[NK_MAX_CLIENTS]) {
        st = get_uint(ctx, values[NK_MAX_CLIENTS], "node.max_clients", 1, 1u << 20, &value);
        if (st == KVS_OK) cfg->node.max_clients = (uint32_t)value;
    }
    if (st == KVS_OK && values[NK_TIMEOUT]) {
        st = get_uint(ctx, values[NK_TIMEOUT], "node.timeout_ms", 1, 3600000, &value);
        if (st == KVS_OK) cfg->node.timeout_ms = (uint32_t)value;
    }
    if (st == KVS_OK && values[NK_MAX_OBJECT]) {
        st = get_size(ctx, values[NK_MAX_OBJECT], "node.max_object_bytes", &value);
        if (st == KVS_OK && (value == 0 || value > (1ull << 32)))
            st = fail(ctx, values[NK_MAX_OBJECT], "node.max_object_bytes",
                      "must be from 1 byte to 4GiB");
        if (st == KVS_OK) cfg->node.max_object_bytes = value;
    }
    if (st == KVS_OK && values[NK_MAX_HANDSHAKES]) {
        st = get_uint(ctx, values[NK_MAX_HANDSHAKES], "node.max_handshakes", 1, 1u << 16, &value);
        if (st == KVS_OK) cfg->node.max_handshakes = (uint32_t)value;
    }
    return st;
}

static kvs_status parse_profile_file(const parse_ctx *outer, const node *at, kvs_config *cfg);

static kvs_status parse_restore(const parse_ctx *ctx, const node *v, kvs_config *cfg) {
    const node *keys[RSK_COUNT] = {NULL}, *values[RSK_COUNT] = {NULL};
    kvs_status st = mapping_fields(ctx, v, "restore", RESTORE_KEYS, RSK_COUNT, keys, values, 0);
    size_t choice;
    if (st == KVS_OK && values[RSK_SCHEDULER]) {
        st = get_choice(ctx, values[RSK_SCHEDULER], "restore.scheduler", RESTORE_SCHEDULERS,
                        COUNT_OF(RESTORE_SCHEDULERS), &choice);
        if (st == KVS_OK) cfg->restore.scheduler = (int)choice;
    }
    if (st == KVS_OK && values[RSK_PRIORITY]) {
        st = get_choice(ctx, values[RSK_PRIORITY], "restore.priority", RESTORE_PRIORITIES,
                        COUNT_OF(RESTORE_PRIORITIES), &choice);
        if (st == KVS_OK) cfg->restore.priority = (int)choice;
    }
    if (st == KVS_OK && values[RSK_PROFILE]) {
        st = get_path(ctx, values[RSK_PROFILE], "restore.profile", cfg->restore.profile,
                      sizeof cfg->restore.profile);
        if (st == KVS_OK) st = parse_profile_file(ctx, values[RSK_PROFILE], cfg);
    }
    if (st == KVS_OK && cfg->restore.scheduler == KVS_RESTORE_CACHEFLOW && !cfg->restore.profile[0])
        st = fail(ctx, v, "restore",
                  "scheduler cacheflow needs `profile:` (the compute and tier coefficients; "
                  "kvs-mini-engine --profile writes one)");
    return st;
}

static kvs_status parse_pool(const parse_ctx *ctx, const node *v, kvs_config *cfg) {
    const node *keys[PK_COUNT] = {NULL}, *values[PK_COUNT] = {NULL};
    kvs_status st = mapping_fields(ctx, v, "pool", POOL_KEYS, PK_COUNT, keys, values, 0);
    if (st == KVS_OK && values[PK_STAGING])
        st = get_size(ctx, values[PK_STAGING], "pool.staging_bytes", &cfg->staging_bytes);
    return st;
}

static kvs_status parse_scalars(const parse_ctx *ctx, const node *const *values, kvs_config *cfg) {
    uint64_t value;
    size_t level;
    kvs_status st = KVS_OK;
    if (values[RK_VERSION]) {
        st = get_uint(ctx, values[RK_VERSION], "version", 1, 1, &value);
        if (st != KVS_OK) return st;
        cfg->version = (uint32_t)value;
    }
    if (values[RK_CHUNK]) {
        st = get_uint(ctx, values[RK_CHUNK], "chunk_tokens", 1, 65536, &value);
        if (st != KVS_OK) return st;
        cfg->chunk_tokens = (uint32_t)value;
        cfg->chunk_tokens_at = (kvs_config_at){values[RK_CHUNK]->line, values[RK_CHUNK]->column};
    }
    if (values[RK_LEASE]) {
        st = get_uint(ctx, values[RK_LEASE], "lease_timeout_ms", 1, UINT64_MAX,
                      &cfg->lease_timeout_ms);
        if (st != KVS_OK) return st;
    }
    if (values[RK_SAVE_DECODE]) {
        st = get_bool(ctx, values[RK_SAVE_DECODE], "save_decode", &cfg->save_decode);
        if (st != KVS_OK) return st;
    }
    if (values[RK_LOG_LEVEL]) {
        st = get_choice(ctx, values[RK_LOG_LEVEL], "log_level", LOG_LEVELS, COUNT_OF(LOG_LEVELS),
                        &level);
        if (st != KVS_OK) return st;
        cfg->log_level = KVS_LOG_ERROR + (int)level; /* LOG_LEVELS follows the KVS_LOG_* order */
    }
    return st;
}

static int is_null_scalar(const node *n) {
    if (n->kind != NODE_SCALAR || !n->plain) return 0;
    return n->len == 0 || strcmp(n->text, "~") == 0 || strcasecmp(n->text, "null") == 0;
}

static kvs_status parse_root(const parse_ctx *ctx, const node *root, kvs_config *cfg) {
    const node *keys[RK_COUNT] = {NULL}, *values[RK_COUNT] = {NULL};
    if (!root || is_null_scalar(root)) {
        int line = root ? root->line : 1, column = root ? root->column : 1;
        return fail_at(ctx, line, column, NULL,
                       "the document is empty (a mapping with at least "
                       "`tiers:` is required)");
    }
    if (root->kind != NODE_MAPPING)
        return fail(ctx, root, NULL, "expected a mapping at the top level, found %s",
                    describe(root));
    kvs_status st = map_fields(ctx, root, NULL, ROOT_KEYS, RK_COUNT, keys, values);
    if (st == KVS_OK) st = parse_scalars(ctx, values, cfg);
    if (st == KVS_OK && values[RK_POOL]) st = parse_pool(ctx, values[RK_POOL], cfg);
    if (st == KVS_OK && values[RK_DEVICE]) st = parse_device(ctx, values[RK_DEVICE], cfg);
    if (st == KVS_OK && values[RK_NODE]) st = parse_node(ctx, values[RK_NODE], cfg);
    if (st == KVS_OK) st = parse_tiers(ctx, root, values[RK_TIERS], cfg);
    if (st == KVS_OK && values[RK_RESTORE]) st = parse_restore(ctx, values[RK_RESTORE], cfg);
    return st;
}

/* ---- the restore profile --------------------------------------------------------------------- */

static kvs_status parse_profile_tier(const parse_ctx *ctx, const node *v, size_t i,
                                     kvs_config *cfg) {
    const node *keys[PTK_COUNT] = {NULL}, *values[PTK_COUNT] = {NULL};
    char kp[KEY_PATH_MAX];
    snprintf(kp, sizeof kp, "tiers[%zu]", i);
    kvs_status st = mapping_fields(ctx, v, kp, PROFILE_TIER_KEYS, PTK_COUNT, keys, values, 0);
    if (st == KVS_OK && !values[PTK_NAME]) st = missing_key(ctx, v, kp, "name", "");
    if (st == KVS_OK && !values[PTK_LATENCY]) st = missing_key(ctx, v, kp, "latency_us", "");
    if (st == KVS_OK && !values[PTK_BANDWIDTH] && !values[PTK_BANDWIDTH_MB_S])
        st = missing_key(ctx, v, kp, "bandwidth", " (a rate such as 250MB/s)");
    if (st == KVS_OK && values[PTK_BANDWIDTH] && values[PTK_BANDWIDTH_MB_S])
        st = fail(ctx, keys[PTK_BANDWIDTH_MB_S], kp,
                  "give bandwidth or bandwidth_mb_s (its older spelling), not both");
    if (st != KVS_OK) return st;
    kvs_restore_tier *t = &cfg->restore.tiers[i];
    double lat_us, mb_s = 0;
    uint64_t bytes_per_s = 0;
    snprintf(kp, sizeof kp, "tiers[%zu].name", i);
    st = get_text(ctx, values[PTK_NAME], kp, t->name, sizeof t->name);
    for (size_t j = 0; st == KVS_OK && j < i; j++)
        if (strcmp(cfg->restore.tiers[j].name, t->name) == 0)
            st = fail(ctx, values[PTK_NAME], kp, "tier '%s' is profiled twice", t->name);
    snprintf(kp, sizeof kp, "tiers[%zu].latency_us", i);
    if (st == KVS_OK) st = get_double(ctx, values[PTK_LATENCY], kp, 0, 1e9, &lat_us);
    snprintf(kp, sizeof kp, "tiers[%zu].%s", i,
             values[PTK_BANDWIDTH] ? "bandwidth" : "bandwidth_mb_s");
    if (st == KVS_OK && values[PTK_BANDWIDTH])
        st = get_rate(ctx, values[PTK_BANDWIDTH], kp, &bytes_per_s);
    else if (st == KVS_OK)
        st = get_double(ctx, values[PTK_BANDWIDTH_MB_S], kp, 1e-3, 1e9, &mb_s);
    if (st != KVS_OK) return st;
    t->latency_s = lat_us * 1e-6;
    t->bytes_per_s = values[PTK_BANDWIDTH] ? (double)bytes_per_s : mb_s * 1e6;
    return KVS_OK;
}

static kvs_status parse_profile_root(const parse_ctx *ctx, const node *root, kvs_config *cfg) {
    const node *keys[PFK_COUNT] = {NULL}, *values[PFK_COUNT] = {NULL};
    const node *ck[PCK_COUNT] = {NULL}, *cv[PCK_COUNT] = {NULL};
    if (!root || root->kind != NODE_MAPPING)
        return fail_at(ctx, root ? root->line : 1, root ? root->column : 1, NULL,
                       "a restore profile is a mapping with `compute:` and `tiers:`");
    kvs_status st = map_fields(ctx, root, NULL, PROFILE_KEYS, PFK_COUNT, keys, values);
    if (st == KVS_OK && !values[PFK_COMPUTE]) st = missing_key(ctx, root, NULL, "compute", "");
    if (st == KVS_OK && !values[PFK_TIERS])
        st = missing_key(ctx, root, NULL, "tiers", " (a sequence)");
    if (st != KVS_OK) return st;
    const node *c = values[PFK_COMPUTE], *t = values[PFK_TIERS];
    st = mapping_fields(ctx, c, "compute", PROFILE_COMPUTE_KEYS, PCK_COUNT, ck, cv, 1);
    double fixed_us = 0, token_us = 0, att_ns = 0;
    if (st == KVS_OK) st = get_double(ctx, cv[PCK_FIXED], "compute.fixed_us", 0, 1e9, &fixed_us);
    if (st == KVS_OK)
        st = get_double(ctx, cv[PCK_TOKEN], "compute.per_token_us", 0, 1e9, &token_us);
    if (st == KVS_OK)
        st = get_double(ctx, cv[PCK_ATT], "compute.attention_ns_per_token2", 0, 1e9, &att_ns);
    if (st == KVS_OK && fixed_us + token_us + att_ns <= 0)
        st = fail(ctx, c, "compute", "every coefficient is 0: recomputing would look free");
    if (st != KVS_OK) return st;
    if (t->kind != NODE_SEQUENCE || t->n_items == 0)
        return fail(ctx, t, "tiers", "expected a sequence of at least one tier, found %s",
                    describe(t));
    if (t->n_items > KVS_CONFIG_MAX_TIERS)
        return fail(ctx, t, "tiers", "%zu tiers, at most %d are allowed", t->n_items,
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

static kvs_status read_whole_file(const char *path, char **text, size_t *len, char *err,
                                  size_t err_len);
static kvs_status read_tree(const parse_ctx *ctx, node **root);

/* Read and check the file cfg->restore.profile names; errors name that file (and `at` in the
 * config when it cannot be read). */
static kvs_status parse_profile_file(const parse_ctx *outer, const node *at, kvs_config *cfg) {
    char *text = NULL;
    size_t len = 0;
    char why[512];
    if (read_whole_file(cfg->restore.profile, &text, &len, why, sizeof why) != KVS_OK)
        return fail(outer, at, "restore.profile", "%s", why);
    parse_ctx ctx = {cfg->restore.profile, NULL, text, len, outer->err, outer->err_len};
    node *root = NULL;
    kvs_status st = read_tree(&ctx, &root);
    if (st == KVS_OK) st = parse_profile_root(&ctx, root, cfg);
    node_free(root);
    free(text);
    return st;
}

/* The checked node tree of ctx's text (size limit, YAML syntax, no anchors or tags). */
static kvs_status read_tree(const parse_ctx *ctx, node **root) {
    if (ctx->input_len > KVS_CONFIG_MAX_BYTES)
        return fail_at(ctx, 1, 1, NULL, "the file is %zu bytes, more than the %d allowed",
                       ctx->input_len, KVS_CONFIG_MAX_BYTES);
    kvs_status st = build_tree(ctx, root);
    if (st == KVS_OK && *root) st = check_plain_yaml(ctx, *root, "");
    return st;
}

static kvs_status parse_buffer(const parse_ctx *ctx, kvs_config **out) {
    node *root = NULL;
    kvs_config *cfg = NULL;
    kvs_status st;
    st = read_tree(ctx, &root);
    if (st != KVS_OK) goto fail;
    cfg = calloc(1, sizeof *cfg);
    if (!cfg) {
        st = out_of_memory(ctx);
        goto fail;
    }
    set_defaults(cfg);
    snprintf(cfg->source, sizeof cfg->source, "%s", ctx->name);
    st = parse_root(ctx, root, cfg);
    if (st != KVS_OK) goto fail;
    node_free(root);
    *out = cfg;
    return KVS_OK;
fail:
    kvs_config_free(cfg);
    node_free(root);
    return st;
}

/* ---- files and entry points ------------------------------------------------------------------ */

static kvs_status io_error(const char *path, const char *what, int err_no, char *err,
                           size_t err_len) {
    if (err && err_len) snprintf(err, err_len, "%s: %s: %s", path, what, strerror(err_no));
    return KVS_EIO;
}

/* Reads at most KVS_CONFIG_MAX_BYTES + 1 bytes, enough for parse_buffer to refuse a bigger file. */
static kvs_status read_whole_file(const char *path, char **text, size_t *len, char *err,
                                  size_t err_len) {
    size_t cap = 4096, used = 0;
    kvs_status st = KVS_OK;
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_error(path, "cannot open", errno, err, err_len);
    if (!(buf = malloc(cap))) goto no_memory;
    for (;;) {
        if (used == cap && cap > KVS_CONFIG_MAX_BYTES) break;
        if (used == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) goto no_memory;
            buf = bigger;
            cap *= 2;
        }
        ssize_t got = read(fd, buf + used, cap - used);
        if (got == 0) break;
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            st = io_error(path, "cannot read", errno, err, err_len);
            goto fail;
        }
        used += (size_t)got;
    }
    close(fd);
    *text = buf;
    *len = used;
    return KVS_OK;
no_memory:
    if (err && err_len) snprintf(err, err_len, "%s: out of memory", path);
    st = KVS_ENOMEM;
fail:
    free(buf);
    close(fd);
    return st;
}

/* The absolute directory of `file` in out (or as written when it cannot be resolved). */
static void directory_of(const char *file, char *out, size_t out_len) {
    char *copy = strdup(file);
    if (!copy) {
        snprintf(out, out_len, ".");
        return;
    }
    const char *dir = dirname(copy);
    char *absolute = realpath(dir, NULL);
    snprintf(out, out_len, "%s", absolute ? absolute : dir);
    free(absolute);
    free(copy);
}

kvs_status kvs_config_load(const char *path, kvs_config **out, char *err, size_t err_len) {
    char base_dir[KVS_PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    if (out) *out = NULL;
    if (!path || !out) {
        if (err && err_len) snprintf(err, err_len, "kvs_config_load: path and out are required");
        return KVS_EINVAL;
    }
    kvs_status st = read_whole_file(path, &text, &len, err, err_len);
    if (st != KVS_OK) return st;
    directory_of(path, base_dir, sizeof base_dir);
    parse_ctx ctx = {path, base_dir, text, len, err, err_len};
    st = parse_buffer(&ctx, out);
    free(text);
    return st;
}

kvs_status kvs_config_parse_string(const char *yaml, size_t len, const char *name, kvs_config **out,
                                   char *err, size_t err_len) {
    char base_dir[KVS_PATH_MAX];
    if (out) *out = NULL;
    if (!out || (!yaml && len)) {
        if (err && err_len) snprintf(err, err_len, "kvs_config_parse_string: out is required");
        return KVS_EINVAL;
    }
    if (!name) name = "<string>";
    parse_ctx ctx = {name, NULL, yaml ? yaml : "", len, err, err_len};
    if (strchr(name, '/')) {
        directory_of(name, base_dir, sizeof base_dir);
        ctx.base_dir = base_dir;
    }
    return parse_buffer(&ctx, out);
}

kvs_status kvs_config_defaults(kvs_config **out) {
    if (!out) return KVS_EINVAL;
    *out = NULL;
    kvs_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return KVS_ENOMEM;
    cfg->tiers = calloc(1, sizeof *cfg->tiers);
    if (!cfg->tiers) {
        free(cfg);
        return KVS_ENOMEM;
    }
    set_defaults(cfg);
    snprintf(cfg->source, sizeof cfg->source, "<defaults>");
    cfg->n_tiers = 1;
    snprintf(cfg->tiers[0].name, sizeof cfg->tiers[0].name, "dram");
    snprintf(cfg->tiers[0].type, sizeof cfg->tiers[0].type, "dram");
    cfg->tiers[0].capacity_bytes = 1ull << 30;
    cfg->tiers[0].write = KVS_WRITE_BACK;
    *out = cfg;
    return KVS_OK;
}

void kvs_config_free(kvs_config *cfg) {
    if (!cfg) return;
    for (size_t i = 0; i < cfg->n_tiers; i++) {
        kvs_tier_config *t = &cfg->tiers[i];
        for (size_t j = 0; j < t->n_options; j++) {
            free(t->options[j].key);
            free(t->options[j].value);
        }
        free(t->options);
    }
    free(cfg->tiers);
    free(cfg);
}
