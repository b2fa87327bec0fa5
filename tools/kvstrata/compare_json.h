/* compare_json.h - a small JSON reader for what kvs-mini-engine prints (its --json summary and its
 * --turns-out lines): a whole document into a tree, looked up by key. Numbers are doubles. */
#ifndef KVS_COMPARE_JSON_H
#define KVS_COMPARE_JSON_H

#include <stddef.h>

typedef enum cj_type { CJ_NULL, CJ_BOOL, CJ_NUMBER, CJ_STRING, CJ_ARRAY, CJ_OBJECT } cj_type;

typedef struct cj_value cj_value;
struct cj_value {
    cj_type type;
    double num;      /* CJ_NUMBER; CJ_BOOL: 0 or 1 */
    char *str;       /* CJ_STRING (decoded, NUL-terminated) */
    size_t n;        /* CJ_ARRAY, CJ_OBJECT: items */
    cj_value *items; /* [n] */
    char **keys;     /* CJ_OBJECT: [n] */
};

/* The document in text[0..len) (nothing but white space after it). NULL with a sentence in err
 * (the byte offset and what was expected) when it is not JSON or memory runs out. */
cj_value *cj_parse(const char *text, size_t len, char *err, size_t err_len);
void cj_free(cj_value *v);

/* The member `key` of an object, or NULL (v NULL, not an object, no such key). */
const cj_value *cj_get(const cj_value *v, const char *key);
/* Members by a dotted path: "connector.all_turns.mean_ms". */
const cj_value *cj_path(const cj_value *v, const char *path);
/* v's number, or dflt when v is NULL or no number. */
double cj_num(const cj_value *v, double dflt);
/* Item i of an array's number, or dflt. */
double cj_item_num(const cj_value *v, size_t i, double dflt);
/* v's string, or NULL. */
const char *cj_str(const cj_value *v);

#endif
