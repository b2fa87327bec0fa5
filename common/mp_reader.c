/* mp_reader.c - the strict msgpack reader (contract in mp_reader.h). */
#include "mp_reader.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void kvs_mp_reader_init(kvs_mp_reader *r, const void *buf, size_t len, const char *prefix,
                        char *err, size_t err_len) {
    *r = (kvs_mp_reader){.p = buf,
                         .left = buf ? len : 0,
                         .prefix = prefix ? prefix : "msgpack",
                         .err = err,
                         .err_len = err_len};
    if (err && err_len) err[0] = '\0';
}

int kvs_mp_refuse(kvs_mp_reader *r, kvs_mp_refusal why, const char *fmt, ...) {
    if (r->refusal != KVS_MP_OK) return -1; /* keep the first sentence */
    r->refusal = why;
    if (r->err && r->err_len) {
        int n = snprintf(r->err, r->err_len, "%s: ", r->prefix);
        if (n >= 0 && (size_t)n < r->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + n, r->err_len - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

static int take(kvs_mp_reader *r, size_t n, const uint8_t **out, const char *what) {
    if (r->refusal != KVS_MP_OK) return -1;
    if (n > r->left)
        return kvs_mp_refuse(r, KVS_MP_TRUNCATED, "ends inside %s (%zu bytes needed, %zu left)",
                             what, n, r->left);
    *out = r->p;
    r->p += n;
    r->left -= n;
    return 0;
}

/* A big-endian number of n bytes. */
static int take_be(kvs_mp_reader *r, size_t n, uint64_t *v, const char *what) {
    const uint8_t *p = NULL;
    if (take(r, n, &p, what) != 0) return -1;
    *v = 0;
    for (size_t i = 0; i < n; i++) *v = *v << 8 | p[i];
    return 0;
}

static int wrong_type(kvs_mp_reader *r, uint8_t tag, const char *what, const char *wanted) {
    return kvs_mp_refuse(r, KVS_MP_TYPE, "%s should be %s, found msgpack tag 0x%02x", what, wanted,
                         tag);
}

int kvs_mp_read_uint(kvs_mp_reader *r, uint64_t max, uint64_t *out, const char *what) {
    const uint8_t *p = NULL;
    if (take(r, 1, &p, what) != 0) return -1;
    uint8_t tag = *p;
    uint64_t v;
    if (tag <= 0x7f)
        v = tag;
    else if (tag >= 0xcc && tag <= 0xcf) { /* uint 8/16/32/64 */
        if (take_be(r, (size_t)1 << (tag - 0xcc), &v, what) != 0) return -1;
    } else if (tag >= 0xd0 && tag <= 0xd3) { /* int 8/16/32/64: only a value >= 0 is accepted */
        size_t n = (size_t)1 << (tag - 0xd0);
        if (take_be(r, n, &v, what) != 0) return -1;
        if (v >> (n * 8 - 1) & 1) return kvs_mp_refuse(r, KVS_MP_VALUE, "%s is negative", what);
    } else if (tag >= 0xe0)
        return kvs_mp_refuse(r, KVS_MP_VALUE, "%s is negative", what);
    else
        return wrong_type(r, tag, what, "an integer");
    if (v > max)
        return kvs_mp_refuse(r, KVS_MP_VALUE, "%s %llu is over %llu", what, (unsigned long long)v,
                             (unsigned long long)max);
    *out = v;
    return 0;
}

int kvs_mp_read_int(kvs_mp_reader *r, int64_t *out, const char *what) {
    if (r->refusal == KVS_MP_OK && r->left &&
        ((r->p[0] >= 0xd0 && r->p[0] <= 0xd3) || r->p[0] >= 0xe0)) {
        const uint8_t *p = NULL;
        uint8_t tag = r->p[0];
        uint64_t u;
        if (take(r, 1, &p, what) != 0) return -1;
        if (tag >= 0xe0) {
            *out = (int64_t)tag - 256;
            return 0;
        }
        size_t n = (size_t)1 << (tag - 0xd0); /* int 8/16/32/64: sign-extend */
        if (take_be(r, n, &u, what) != 0) return -1;
        if (n < 8 && (u >> (n * 8 - 1)) & 1) u |= ~(uint64_t)0 << (n * 8);
        memcpy(out, &u, sizeof *out);
        return 0;
    }
    uint64_t v = 0; /* set on success; GCC -O3 cannot tell (a Release build failed on -Werror) */
    if (kvs_mp_read_uint(r, INT64_MAX, &v, what) != 0) return -1;
    *out = (int64_t)v;
    return 0;
}

static int read_array(kvs_mp_reader *r, uint32_t min, uint32_t max, int need_bytes, uint32_t *n,
                      const char *what) {
    const uint8_t *p = NULL;
    if (take(r, 1, &p, what) != 0) return -1;
    uint8_t tag = *p;
    uint64_t count;
    if (tag >= 0x90 && tag <= 0x9f)
        count = tag & 0x0fu;
    else if (tag == 0xdc || tag == 0xdd) {
        if (take_be(r, tag == 0xdc ? 2 : 4, &count, what) != 0) return -1;
    } else
        return wrong_type(r, tag, what, "an array");
    if (count > max)
        return kvs_mp_refuse(r, min == max ? KVS_MP_TYPE : KVS_MP_LIMIT,
                             "%s has %llu elements, %s %u", what, (unsigned long long)count,
                             min == max ? "expected" : "over the limit of", max);
    if (count < min)
        return kvs_mp_refuse(r, KVS_MP_TYPE, "%s has %llu elements, %u..%u expected", what,
                             (unsigned long long)count, min, max);
    if (need_bytes && count > r->left) /* every element takes at least one byte */
        return kvs_mp_refuse(r, KVS_MP_TRUNCATED,
                             "%s declares %llu elements but %zu bytes are left", what,
                             (unsigned long long)count, r->left);
    *n = (uint32_t)count;
    return 0;
}

int kvs_mp_read_array(kvs_mp_reader *r, uint32_t min, uint32_t max, uint32_t *n, const char *what) {
    return read_array(r, min, max, 1, n, what);
}

int kvs_mp_read_array_header(kvs_mp_reader *r, uint32_t min, uint32_t max, uint32_t *n,
                             const char *what) {
    return read_array(r, min, max, 0, n, what);
}

int kvs_mp_read_bytes(kvs_mp_reader *r, int want_str, uint32_t max, const uint8_t **out,
                      uint32_t *n, const char *what) {
    const uint8_t *p = NULL;
    if (take(r, 1, &p, what) != 0) return -1;
    uint8_t tag = *p;
    uint64_t len;
    if (want_str && tag >= 0xa0 && tag <= 0xbf)
        len = tag & 0x1fu;
    else if ((want_str && tag >= 0xd9 && tag <= 0xdb) ||
             (!want_str && tag >= 0xc4 && tag <= 0xc6)) {
        if (take_be(r, (size_t)1 << (tag - (want_str ? 0xd9 : 0xc4)), &len, what) != 0) return -1;
    } else
        return wrong_type(r, tag, what, want_str ? "a string" : "binary");
    if (len > max)
        return kvs_mp_refuse(r, KVS_MP_LIMIT, "%s of %llu bytes is over the limit of %u", what,
                             (unsigned long long)len, max);
    if (take(r, (size_t)len, out, what) != 0) return -1;
    *n = (uint32_t)len;
    return 0;
}

int kvs_mp_read_end(kvs_mp_reader *r) {
    if (r->refusal != KVS_MP_OK) return -1;
    if (r->left) return kvs_mp_refuse(r, KVS_MP_VALUE, "%zu trailing bytes", r->left);
    return 0;
}
