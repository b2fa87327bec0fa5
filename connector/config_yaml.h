/* config_yaml.h - the strict YAML reader under the configuration (internal to connector/config*.c):
 * a checked node tree of one document, typed values read from it, and refusals that name
 * "file:line:column: key 'a.b[1].c'". Nodes belong to the tree; kvs_yaml_node_free frees it. */
#ifndef KVS_CONFIG_YAML_H
#define KVS_CONFIG_YAML_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "config_types.h"

#define KEY_PATH_MAX 256 /* 'tiers[3].options.shm_name' and the like; longer paths are cut */
#define SHOWN_MAX    40  /* characters of a bad value quoted back in a message */
#define COUNT_OF(a)  (sizeof(a) / sizeof((a)[0]))

typedef enum kvs_yaml_kind {
    KVS_YAML_SCALAR,
    KVS_YAML_SEQUENCE,
    KVS_YAML_MAPPING,
    KVS_YAML_ALIAS
} kvs_yaml_kind;

typedef struct kvs_yaml_node {
    kvs_yaml_kind kind;
    char *text; /* scalar: its value, NUL-terminated copy; alias: the anchor name */
    size_t len;
    int plain; /* scalar written without quotes */
    int has_anchor, has_tag;
    int line, column;             /* 1-based */
    struct kvs_yaml_node **items; /* sequence: entries; mapping: key, value, key, value, ... */
    size_t n_items, cap_items;
} kvs_yaml_node;

typedef struct kvs_yaml_ctx {
    const char *name;     /* the file, as messages name it */
    const char *base_dir; /* relative plugin paths resolve against it; NULL keeps them as written */
    const char *input;    /* the raw text, to place reader errors that libyaml gives as offsets */
    size_t input_len;
    char *err;
    size_t err_len;
} kvs_yaml_ctx;

/* --- messages: each writes "file:line:column: key 'KEY': sentence" into ctx->err, returns KVS_ECONFIG */
kvs_status kvs_yaml_fail_at(const kvs_yaml_ctx *ctx, int line, int column, const char *key,
                            const char *fmt, ...) __attribute__((format(printf, 5, 6)));
kvs_status kvs_yaml_fail(const kvs_yaml_ctx *ctx, const kvs_yaml_node *at, const char *key,
                         const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The same for a kept position of cfg's file (kvs_config_refuse); "file: key 'KEY': " without one. */
kvs_status kvs_yaml_vrefuse(const kvs_config *cfg, kvs_config_at at, const char *key, char *err,
                            size_t err_len, const char *fmt, va_list ap);
/* "file: out of memory"; returns KVS_ENOMEM. */
kvs_status kvs_yaml_out_of_memory(const kvs_yaml_ctx *ctx);
/* n's value for a message: at most SHOWN_MAX characters, control characters as '?'. */
const char *kvs_yaml_shown(const kvs_yaml_node *n, char buf[SHOWN_MAX + 4]);
/* "a mapping", "a scalar", "an empty value", ... */
const char *kvs_yaml_describe(const kvs_yaml_node *n);
/* parent.key (key alone at the top) into out. */
void kvs_yaml_key_path(char out[KEY_PATH_MAX], const char *parent, const char *key);

/* --- the tree */
/* The checked node tree of ctx's text (size limit, YAML syntax, no anchors or tags); *root is NULL
 * when the text holds no document. */
kvs_status kvs_yaml_read_tree(const kvs_yaml_ctx *ctx, kvs_yaml_node **root);
void kvs_yaml_node_free(kvs_yaml_node *n);
/* At most KVS_CONFIG_MAX_BYTES + 1 bytes of path into a malloc'd *text; KVS_EIO with the system's
 * reason in err when it cannot be read. */
kvs_status kvs_yaml_read_file(const char *path, char **text, size_t *len, char *err,
                              size_t err_len);

/* --- typed values (path: the key path for messages) */
kvs_status kvs_yaml_map_fields(const kvs_yaml_ctx *ctx, const kvs_yaml_node *map, const char *path,
                               const char *const *names, size_t n_names, const kvs_yaml_node **keys,
                               const kvs_yaml_node **values);
kvs_status kvs_yaml_mapping_fields(const kvs_yaml_ctx *ctx, const kvs_yaml_node *v,
                                   const char *path, const char *const *names, size_t n_names,
                                   const kvs_yaml_node **keys, const kvs_yaml_node **values,
                                   int required);
kvs_status kvs_yaml_missing_key(const kvs_yaml_ctx *ctx, const kvs_yaml_node *map,
                                const char *parent, const char *key, const char *hint);
kvs_status kvs_yaml_expect_scalar(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                                  const char *what);
kvs_status kvs_yaml_get_uint(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                             uint64_t min, uint64_t max, uint64_t *out);
kvs_status kvs_yaml_get_bool(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                             int *out);
kvs_status kvs_yaml_get_double(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                               double min, double max, double *out);
kvs_status kvs_yaml_get_choice(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                               const char *const *names, size_t n_names, size_t *out);
kvs_status kvs_yaml_get_text(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *path,
                             char *out, size_t cap);
kvs_status kvs_yaml_resolve_path(const kvs_yaml_ctx *ctx, const kvs_yaml_node *at, const char *kp,
                                 const char *given, char *out, size_t len);
kvs_status kvs_yaml_get_path(const kvs_yaml_ctx *ctx, const kvs_yaml_node *n, const char *kp,
                             char *out, size_t cap);

#endif
