/* compare_json.c - the JSON reader of kvstrata compare (compare_json.h): recursive descent, depth
 * bounded so that no input can exhaust the stack. */
#include "compare_json.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CJ_MAX_DEPTH 64

typedef struct cursor {
    const char *p, *start, *end;
    char *err;
    size_t err_len;
    int failed;
} cursor;

static void fail(cursor *c, const char *what) {
    if (c->failed) return;
    c->failed = 1;
    if (c->err && c->err_len)
        snprintf(c->err, c->err_len, "offset %zu: %s", (size_t)(c->p - c->start), what);
}

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int literal(cursor *c, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

static int hex4(cursor *c, unsigned *out) {
    if (c->end - c->p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char h = c->p[i];
        v <<= 4;
        if (h >= '0' && h <= '9')
            v |= (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f')
            v |= (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F')
            v |= (unsigned)(h - 'A' + 10);
        else
            return -1;
    }
    c->p += 4;
    *out = v;
    return 0;
}

/* Append code point u as UTF-8 (a lone surrogate is kept as is: the text is only shown). */
static size_t put_utf8(char *o, unsigned u) {
    if (u < 0x80) {
        o[0] = (char)u;
        return 1;
    }
    if (u < 0x800) {
        o[0] = (char)(0xc0 | (u >> 6));
        o[1] = (char)(0x80 | (u & 0x3f));
        return 2;
    }
    if (u < 0x10000) {
        o[0] = (char)(0xe0 | (u >> 12));
        o[1] = (char)(0x80 | ((u >> 6) & 0x3f));
        o[2] = (char)(0x80 | (u & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (u >> 18));
    o[1] = (char)(0x80 | ((u >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((u >> 6) & 0x3f));
    o[3] = (char)(0x80 | (u & 0x3f));
    return 4;
}

/* A string at c->p (its opening quote) into a new buffer; NULL on error. The decoded text is never
 * longer than the quoted one, so one buffer of that length holds it. */
static char *parse_string(cursor *c) {
    c->p++; /* the quote */
    const char *q = c->p;
    while (q < c->end && *q != '"') q += *q == '\\' && q + 1 < c->end ? 2 : 1;
    if (q >= c->end) {
        fail(c, "a string without its closing quote");
        return NULL;
    }
    char *out = malloc((size_t)(q - c->p) + 1), *o = out;
    if (!out) {
        fail(c, "out of memory");
        return NULL;
    }
    while (*c->p != '"') {
        unsigned char ch = (unsigned char)*c->p++;
        if (ch < 0x20) {
            fail(c, "a control character inside a string");
            free(out);
            return NULL;
        }
        if (ch != '\\') {
            *o++ = (char)ch;
            continue;
        }
        char e = *c->p++;
        unsigned u;
        switch (e) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '/': *o++ = '/'; break;
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            case 'u':
                if (hex4(c, &u) != 0) {
                    fail(c, "\\u without four hex digits");
                    free(out);
                    return NULL;
                }
                /* "\uXXXX" is 6 bytes and becomes at most 3; a pair (12 bytes) at most 4 */
                if (u >= 0xd800 && u < 0xdc00 && c->end - c->p >= 6 && c->p[0] == '\\' &&
                    c->p[1] == 'u') {
                    cursor look = *c;
                    unsigned lo;
                    look.p += 2;
                    if (hex4(&look, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
                        u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                        c->p = look.p;
                    }
                }
                o += put_utf8(o, u);
                break;
            default:
                fail(c, "an unknown escape in a string");
                free(out);
                return NULL;
        }
    }
    c->p++;
    *o = '\0';
    return out;
}

static int parse_number(cursor *c, double *out) {
    char buf[64];
    size_t n = 0;
    while (c->p + n < c->end && n < sizeof buf - 1 && c->p[n] && strchr("+-0123456789.eE", c->p[n]))
        n++;
    if (n == 0 || n == sizeof buf - 1) {
        fail(c, "a value (number, string, array, object, true, false or null)");
        return -1;
    }
    memcpy(buf, c->p, n);
    buf[n] = '\0';
    char *endp;
    errno = 0;
    double v = strtod(buf, &endp);
    if (endp != buf + n || errno == ERANGE) {
        fail(c, "a malformed number");
        return -1;
    }
    c->p += n;
    *out = v;
    return 0;
}

static int parse_value(cursor *c, cj_value *v, int depth);

/* Grow a list of items (and keys) to hold one more. */
static int grow(cursor *c, cj_value *v, size_t *cap, int with_keys) {
    if (v->n < *cap) return 0;
    size_t ncap = *cap ? *cap * 2 : 8;
    cj_value *items = realloc(v->items, ncap * sizeof *items);
    if (items) v->items = items;
    char **keys = NULL;
    if (items && with_keys) {
        keys = realloc(v->keys, ncap * sizeof *keys);
        if (keys) v->keys = keys;
    }
    if (!items || (with_keys && !keys)) {
        fail(c, "out of memory");
        return -1;
    }
    *cap = ncap;
    return 0;
}

static int parse_container(cursor *c, cj_value *v, int depth, int is_object) {
    char close = is_object ? '}' : ']';
    size_t cap = 0;
    v->type = is_object ? CJ_OBJECT : CJ_ARRAY;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        if (grow(c, v, &cap, is_object) != 0) return -1;
        if (is_object) {
            if (c->p >= c->end || *c->p != '"') {
                fail(c, "a key (a string)");
                return -1;
            }
            char *key = parse_string(c);
            if (!key) return -1;
            v->keys[v->n] = key;
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':') {
                free(key);
                fail(c, "':' after a key");
                return -1;
            }
            c->p++;
        }
        memset(&v->items[v->n], 0, sizeof v->items[v->n]);
        v->n++; /* counted before parsing, so that cj_free releases what a failure left */
        if (parse_value(c, &v->items[v->n - 1], depth + 1) != 0) return -1;
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return 0;
        }
        fail(c, is_object ? "',' or '}'" : "',' or ']'");
        return -1;
    }
}

static int parse_value(cursor *c, cj_value *v, int depth) {
    if (depth > CJ_MAX_DEPTH) {
        fail(c, "nesting deeper than 64");
        return -1;
    }
    skip_ws(c);
    if (c->p >= c->end) {
        fail(c, "a value, found the end");
        return -1;
    }
    switch (*c->p) {
        case '{': return parse_container(c, v, depth, 1);
        case '[': return parse_container(c, v, depth, 0);
        case '"':
            v->type = CJ_STRING;
            v->str = parse_string(c);
            return v->str ? 0 : -1;
        default: break;
    }
    if (literal(c, "true")) {
        v->type = CJ_BOOL;
        v->num = 1;
        return 0;
    }
    if (literal(c, "false")) {
        v->type = CJ_BOOL;
        return 0;
    }
    if (literal(c, "null")) {
        v->type = CJ_NULL;
        return 0;
    }
    v->type = CJ_NUMBER;
    return parse_number(c, &v->num);
}

static void free_inner(cj_value *v) {
    for (size_t i = 0; i < v->n; i++) {
        free_inner(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

void cj_free(cj_value *v) {
    if (!v) return;
    free_inner(v);
    free(v);
}

cj_value *cj_parse(const char *text, size_t len, char *err, size_t err_len) {
    cursor c = {.p = text, .start = text, .end = text + len, .err = err, .err_len = err_len};
    cj_value *v = calloc(1, sizeof *v);
    if (!v) {
        fail(&c, "out of memory");
        return NULL;
    }
    if (parse_value(&c, v, 0) == 0) {
        skip_ws(&c);
        if (c.p == c.end) return v;
        fail(&c, "the end after the value");
    }
    cj_free(v);
    return NULL;
}

const cj_value *cj_get(const cj_value *v, const char *key) {
    if (!v || v->type != CJ_OBJECT) return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0) return &v->items[i];
    return NULL;
}

const cj_value *cj_path(const cj_value *v, const char *path) {
    char key[128];
    while (v && *path) {
        size_t n = strcspn(path, ".");
        if (n >= sizeof key) return NULL;
        memcpy(key, path, n);
        key[n] = '\0';
        v = cj_get(v, key);
        path += n;
        if (*path == '.') path++;
    }
    return v;
}

double cj_num(const cj_value *v, double dflt) {
    return v && (v->type == CJ_NUMBER || v->type == CJ_BOOL) ? v->num : dflt;
}

double cj_item_num(const cj_value *v, size_t i, double dflt) {
    if (!v || v->type != CJ_ARRAY || i >= v->n) return dflt;
    return cj_num(&v->items[i], dflt);
}

const char *cj_str(const cj_value *v) {
    return v && v->type == CJ_STRING ? v->str : NULL;
}
