/* config_yaml.c - the YAML reader under the configuration: libyaml events -> a node tree, strict
 * checks (no anchors, aliases or tags; known keys only, each once) and typed values, every refusal
 * "file:line:column: key 'a.b[1].c': sentence". */
#include "config_yaml.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <yaml.h>

#define MAX_DEPTH 32 /* the schema needs 4; deeper input is refused before it can cost stack */

typedef struct builder {
    kvs_yaml_node *root;
    kvs_yaml_node *stack[MAX_DEPTH]; /* open sequences and mappings */
    int depth;
    int documents;
    int done;
} builder;

static kvs_status vfail_at(const kvs_yaml_ctx *ctx, int line, int column, const char *key,
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

kvs_status kvs_yaml_fail_at(const kvs_yaml_ctx *ctx, int line, int column, const char *key,
                            const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_status st = vfail_at(ctx, line, column, key, fmt, ap);
    va_end(ap);
    return st;
}

kvs_status kvs_yaml_fail(const kvs_yaml_ctx *ctx, const kvs_yaml_node *at, const char *key,
                         const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_status st = vfail_at(ctx, at->line, at->column, key, fmt, ap);
    va_end(ap);
    return st;
}

/* Refusals found when the connector opens, after parsing: same format, from the kept positions. */
kvs_status kvs_yaml_vrefuse(const kvs_config *cfg, kvs_config_at at, const char *key, char *err,
                            size_t err_len, const char *fmt, va_list ap) {
    if (at.line > 0) {
        kvs_yaml_ctx ctx = {.name = cfg->source, .err = err, .err_len = err_len};
        return vfail_at(&ctx, at.line, at.column, key, fmt, ap);
    }
    if (!err || err_len == 0) return KVS_ECONFIG;
    int n = snprintf(err, err_len, "%s: key '%s': ", cfg->source, key);
    if (n >= 0 && (size_t)n < err_len) vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
    return KVS_ECONFIG;
}

kvs_status kvs_yaml_out_of_memory(const kvs_yaml_ctx *ctx) {
    if (ctx->err && ctx->err_len) snprintf(ctx->err, ctx->err_len, "%s: out of memory", ctx->name);
    return KVS_ENOMEM;
}

/* A value quoted back in a message: cut to SHOWN_MAX characters, control characters as '?'. */
const char *kvs_yaml_shown(const kvs_yaml_node *n, char buf[SHOWN_MAX + 4]) {
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

static int is_empty_scalar(const kvs_yaml_node *n) {
    return n->kind == KVS_YAML_SCALAR && n->plain && n->len == 0;
}

const char *kvs_yaml_describe(const kvs_yaml_node *n) {
    switch (n->kind) {
        case KVS_YAML_MAPPING: return "a mapping";
        case KVS_YAML_SEQUENCE: return "a sequence";
        case KVS_YAML_ALIAS: return "an alias";
        case KVS_YAML_SCALAR: break;
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

void kvs_yaml_key_path(char out[KEY_PATH_MAX], const char *parent, const char *key) {
    if (parent && *parent)
        snprintf(out, KEY_PATH_MAX, "%s.%s", parent, key);
    else
        snprintf(out, KEY_PATH_MAX, "%s", key);
}

void kvs_yaml_node_free(kvs_yaml_node *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_items; i++) kvs_yaml_node_free(n->items[i]);
    free(n->items);
    free(n->text);
    free(n);
}

static int node_append(kvs_yaml_node *parent, kvs_yaml_node *child) {
    if (parent->n_items == parent->cap_items) {
        size_t cap = parent->cap_items ? parent->cap_items * 2 : 8;
        kvs_yaml_node **items = realloc(parent->items, cap * sizeof *items);
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
static kvs_yaml_node *node_from_event(const yaml_event_t *ev) {
    kvs_yaml_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->line = (int)ev->start_mark.line + 1;
    n->column = (int)ev->start_mark.column + 1;
    if (ev->type == YAML_SCALAR_EVENT) {
        n->kind = KVS_YAML_SCALAR;
        n->len = ev->data.scalar.length;
        n->text = copy_text(ev->data.scalar.value, n->len);
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        n->has_anchor = ev->data.scalar.anchor != NULL;
        n->has_tag = ev->data.scalar.tag != NULL;
    } else if (ev->type == YAML_ALIAS_EVENT) {
        n->kind = KVS_YAML_ALIAS;
        n->len = strlen((const char *)ev->data.alias.anchor);
        n->text = copy_text(ev->data.alias.anchor, n->len);
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        n->kind = KVS_YAML_SEQUENCE;
        n->has_anchor = ev->data.sequence_start.anchor != NULL;
        n->has_tag = ev->data.sequence_start.tag != NULL;
    } else {
        n->kind = KVS_YAML_MAPPING;
        n->has_anchor = ev->data.mapping_start.anchor != NULL;
        n->has_tag = ev->data.mapping_start.tag != NULL;
    }
    if ((n->kind == KVS_YAML_SCALAR || n->kind == KVS_YAML_ALIAS) && !n->text) {
        free(n);
        return NULL;
    }
    return n;
}

static kvs_status builder_add(const kvs_yaml_ctx *ctx, builder *b, const yaml_event_t *ev) {
    kvs_yaml_node *n = node_from_event(ev);
    if (!n) return kvs_yaml_out_of_memory(ctx);
    int container = n->kind == KVS_YAML_SEQUENCE || n->kind == KVS_YAML_MAPPING;
    if (container && b->depth == MAX_DEPTH) {
        kvs_status st = kvs_yaml_fail(ctx, n, NULL, "nesting is deeper than %d levels", MAX_DEPTH);
        kvs_yaml_node_free(n);
        return st;
    }
    if (b->depth == 0) {
        b->root = n; /* one document, hence one root: a second document is refused earlier */
    } else if (node_append(b->stack[b->depth - 1], n) != 0) {
        kvs_yaml_node_free(n);
        return kvs_yaml_out_of_memory(ctx);
    }
    if (container) b->stack[b->depth++] = n;
    return KVS_OK;
}

static kvs_status builder_event(const kvs_yaml_ctx *ctx, builder *b, const yaml_event_t *ev) {
    switch (ev->type) {
        case YAML_STREAM_END_EVENT: b->done = 1; return KVS_OK;
        case YAML_DOCUMENT_START_EVENT:
            if (b->documents++ == 0) return KVS_OK;
            return kvs_yaml_fail_at(ctx, (int)ev->start_mark.line + 1,
                                    (int)ev->start_mark.column + 1, NULL,
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

static void offset_to_line_column(const kvs_yaml_ctx *ctx, size_t offset, int *line, int *column) {
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

static kvs_status syntax_error(const kvs_yaml_ctx *ctx, const yaml_parser_t *parser) {
    if (parser->error == YAML_MEMORY_ERROR) return kvs_yaml_out_of_memory(ctx);
    const char *problem = parser->problem ? parser->problem : "unreadable YAML";
    int line = (int)parser->problem_mark.line + 1, column = (int)parser->problem_mark.column + 1;
    if (parser->error == YAML_READER_ERROR) {
        offset_to_line_column(ctx, parser->problem_offset, &line, &column);
        return kvs_yaml_fail_at(ctx, line, column, NULL, "YAML syntax error: %s", problem);
    }
    if (parser->context)
        return kvs_yaml_fail_at(ctx, line, column, NULL,
                                "YAML syntax error: %s (%s at line %d column %d)", problem,
                                parser->context, (int)parser->context_mark.line + 1,
                                (int)parser->context_mark.column + 1);
    return kvs_yaml_fail_at(ctx, line, column, NULL, "YAML syntax error: %s", problem);
}

/* *root is NULL when the stream holds no document at all. */
static kvs_status build_tree(const kvs_yaml_ctx *ctx, kvs_yaml_node **root) {
    yaml_parser_t parser;
    builder b;
    kvs_status st = KVS_OK;
    memset(&b, 0, sizeof b);
    if (!yaml_parser_initialize(&parser)) return kvs_yaml_out_of_memory(ctx);
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
        kvs_yaml_node_free(b.root);
        return st;
    }
    *root = b.root;
    return KVS_OK;
}

/* Anchors, aliases and tags anywhere in the file are refused before the schema is looked at. */
static kvs_status check_plain_yaml(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n,
                                   const char *path) {
    if (n->kind == KVS_YAML_ALIAS || n->has_anchor)
        return kvs_yaml_fail(ctx, n, path, "anchors and aliases are not supported");
    if (n->has_tag) return kvs_yaml_fail(ctx, n, path, "tags are not supported");
    if (n->kind == KVS_YAML_SCALAR && strlen(n->text) != n->len)
        return kvs_yaml_fail(ctx, n, path, "a NUL character is not allowed in a value");
    char child[KEY_PATH_MAX];
    for (size_t i = 0; i < n->n_items; i++) {
        if (n->kind == KVS_YAML_SEQUENCE) {
            snprintf(child, sizeof child, "%s[%zu]", path, i);
        } else {
            const kvs_yaml_node *key = n->items[i & ~(size_t)1];
            kvs_yaml_key_path(child, path, key->kind == KVS_YAML_SCALAR ? key->text : "?");
        }
        kvs_status st = check_plain_yaml(ctx, n->items[i], child);
        if (st != KVS_OK) return st;
    }
    return KVS_OK;
}

/* The checked node tree of ctx's text (size limit, YAML syntax, no anchors or tags). */
kvs_status kvs_yaml_read_tree(const kvs_yaml_ctx *ctx, kvs_yaml_node **root) {
    if (ctx->input_len > KVS_CONFIG_MAX_BYTES)
        return kvs_yaml_fail_at(ctx, 1, 1, NULL, "the file is %zu bytes, more than the %d allowed",
                                ctx->input_len, KVS_CONFIG_MAX_BYTES);
    kvs_status st = build_tree(ctx, root);
    if (st == KVS_OK && *root) st = check_plain_yaml(ctx, *root, "");
    return st;
}

/* Splits a mapping into the known keys: keys[i]/values[i] for names[i], NULL when absent. Refuses
 * non-scalar keys, unknown keys (listing the valid ones) and a key given twice. */
kvs_status kvs_yaml_map_fields(const kvs_yaml_ctx *ctx, const kvs_yaml_node *map, const char *path,
                               const char *const *names, size_t n_names, const kvs_yaml_node **keys,
                               const kvs_yaml_node **values) {
    char kp[KEY_PATH_MAX];
    for (size_t i = 0; i + 1 < map->n_items; i += 2) {
        const kvs_yaml_node *k = map->items[i];
        if (k->kind != KVS_YAML_SCALAR)
            return kvs_yaml_fail(ctx, k, path, "a key must be a scalar, found %s",
                                 kvs_yaml_describe(k));
        kvs_yaml_key_path(kp, path, k->text);
        size_t idx = 0;
        while (idx < n_names && strcmp(names[idx], k->text) != 0) idx++;
        if (idx == n_names) {
            char valid[256];
            join_names(names, n_names, valid, sizeof valid);
            return kvs_yaml_fail(ctx, k, kp, "unknown key (valid keys: %s)", valid);
        }
        if (keys[idx])
            return kvs_yaml_fail(ctx, k, kp, "duplicate key (first given at line %d column %d)",
                                 keys[idx]->line, keys[idx]->column);
        keys[idx] = k;
        values[idx] = map->items[i + 1];
    }
    return KVS_OK;
}

kvs_status kvs_yaml_expect_scalar(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                                  const char *what) {
    if (n->kind == KVS_YAML_SCALAR && !is_empty_scalar(n)) return KVS_OK;
    return kvs_yaml_fail(ctx, n, path, "expected %s, found %s", what, kvs_yaml_describe(n));
}

static kvs_status range_error(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                              uint64_t min, uint64_t max) {
    char buf[SHOWN_MAX + 4];
    if (min == max)
        return kvs_yaml_fail(ctx, n, path, "%s is out of range (must be %llu)",
                             kvs_yaml_shown(n, buf), (unsigned long long)min);
    if (max == UINT64_MAX)
        return kvs_yaml_fail(ctx, n, path, "%s is out of range (must be at least %llu)",
                             kvs_yaml_shown(n, buf), (unsigned long long)min);
    return kvs_yaml_fail(ctx, n, path, "%s is out of range (must be between %llu and %llu)",
                         kvs_yaml_shown(n, buf), (unsigned long long)min, (unsigned long long)max);
}

/* A plain decimal integer in [min, max]. Quoted text is a string, not an integer. */
kvs_status kvs_yaml_get_uint(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                             uint64_t min, uint64_t max, uint64_t *out) {
    char buf[SHOWN_MAX + 4];
    kvs_status st = kvs_yaml_expect_scalar(ctx, n, path, "an integer");
    if (st != KVS_OK) return st;
    if (!n->plain)
        return kvs_yaml_fail(ctx, n, path, "expected an integer, found the quoted string '%s'",
                             kvs_yaml_shown(n, buf));
    const char *s = n->text;
    int negative = *s == '-';
    if (negative) s++;
    if (!*s || strspn(s, "0123456789") != strlen(s))
        return kvs_yaml_fail(ctx, n, path, "expected an integer, found '%s'",
                             kvs_yaml_shown(n, buf));
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

kvs_status kvs_yaml_get_bool(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                             int *out) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    char buf[SHOWN_MAX + 4];
    kvs_status st = kvs_yaml_expect_scalar(ctx, n, path, "a boolean");
    if (st != KVS_OK) return st;
    for (size_t i = 0; n->plain && i < COUNT_OF(yes); i++) {
        int is_yes = strcasecmp(n->text, yes[i]) == 0;
        if (is_yes || strcasecmp(n->text, no[i]) == 0) {
            *out = is_yes;
            return KVS_OK;
        }
    }
    return kvs_yaml_fail(ctx, n, path,
                         "expected a boolean (true/false, yes/no, on/off), found %s'%s'",
                         n->plain ? "" : "the quoted string ", kvs_yaml_shown(n, buf));
}

/* A plain finite decimal number in [min, max]. */
kvs_status kvs_yaml_get_double(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                               double min, double max, double *out) {
    char buf[SHOWN_MAX + 4];
    kvs_status st = kvs_yaml_expect_scalar(ctx, n, path, "a number");
    if (st != KVS_OK) return st;
    char *end = NULL;
    errno = 0;
    double v = n->plain ? strtod(n->text, &end) : 0;
    if (!n->plain || end == n->text || *end || errno == ERANGE || !isfinite(v))
        return kvs_yaml_fail(ctx, n, path, "expected a number, found %s'%s'",
                             n->plain ? "" : "the quoted string ", kvs_yaml_shown(n, buf));
    if (v < min || v > max)
        return kvs_yaml_fail(ctx, n, path, "%s is out of range (must be between %g and %g)",
                             kvs_yaml_shown(n, buf), min, max);
    *out = v;
    return KVS_OK;
}

kvs_status kvs_yaml_get_choice(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                               const char *const *names, size_t n_names, size_t *out) {
    char valid[128], buf[SHOWN_MAX + 4];
    join_names(names, n_names, valid, sizeof valid);
    if (n->kind != KVS_YAML_SCALAR || is_empty_scalar(n))
        return kvs_yaml_fail(ctx, n, path, "expected one of %s, found %s", valid,
                             kvs_yaml_describe(n));
    for (size_t i = 0; i < n_names; i++) {
        if (strcmp(n->text, names[i]) == 0) {
            *out = i;
            return KVS_OK;
        }
    }
    return kvs_yaml_fail(ctx, n, path, "bad value '%s' (expected one of %s)",
                         kvs_yaml_shown(n, buf), valid);
}

kvs_status kvs_yaml_get_text(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                             char *out, size_t cap) {
    kvs_status st = kvs_yaml_expect_scalar(ctx, n, path, "a string");
    if (st != KVS_OK) return st;
    if (n->len >= cap)
        return kvs_yaml_fail(ctx, n, path, "too long (at most %zu characters)", cap - 1);
    memcpy(out, n->text, n->len + 1);
    return KVS_OK;
}

kvs_status kvs_yaml_missing_key(const kvs_yaml_ctx *ctx, const kvs_yaml_node *map,
                                const char *parent, const char *key, const char *hint) {
    char kp[KEY_PATH_MAX];
    kvs_yaml_key_path(kp, parent, key);
    return kvs_yaml_fail(ctx, map, kp, "missing required key%s", hint);
}

/* v as a mapping of the keys in names (map_fields); with `required` every one of them must be there. */
kvs_status kvs_yaml_mapping_fields(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                   const char *path, const char *const *names, size_t n_names,
                                   const kvs_yaml_node **keys, const kvs_yaml_node **values,
                                   int required) {
    if (v->kind != KVS_YAML_MAPPING)
        return kvs_yaml_fail(ctx, v, path, "expected a mapping, found %s", kvs_yaml_describe(v));
    kvs_status st = kvs_yaml_map_fields(ctx, v, path, names, n_names, keys, values);
    for (size_t k = 0; required && st == KVS_OK && k < n_names; k++)
        if (!values[k]) st = kvs_yaml_missing_key(ctx, v, path, names[k], "");
    return st;
}

/* A path from the file: relative ones resolve against the file's directory (kept as written when
 * the text has no file). */
kvs_status kvs_yaml_resolve_path(const kvs_yaml_ctx *ctx, const kvs_yaml_node *at, const char *kp,
                                 const char *given, char *out, size_t len) {
    int n = given[0] == '/' || !ctx->base_dir ? snprintf(out, len, "%s", given)
                                              : snprintf(out, len, "%s/%s", ctx->base_dir, given);
    if (n < 0 || (size_t)n >= len)
        return kvs_yaml_fail(ctx, at, kp, "the resolved path is longer than %d characters",
                             KVS_PATH_MAX - 1);
    return KVS_OK;
}

/* A path given as text at n, resolved against the file's directory into out. */
kvs_status kvs_yaml_get_path(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *kp,
                             char *out, size_t cap) {
    char given[KVS_PATH_MAX];
    kvs_status st = kvs_yaml_get_text(ctx, n, kp, given, sizeof given);
    return st == KVS_OK ? kvs_yaml_resolve_path(ctx, n, kp, given, out, cap) : st;
}

static kvs_status io_error(const char *path, const char *what, int err_no, char *err,
                           size_t err_len) {
    if (err && err_len) snprintf(err, err_len, "%s: %s: %s", path, what, strerror(err_no));
    return KVS_EIO;
}

/* Reads at most KVS_CONFIG_MAX_BYTES + 1 bytes, enough for parse_buffer to refuse a bigger file. */
kvs_status kvs_yaml_read_file(const char *path, char **text, size_t *len, char *err,
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
