/* mp_reader.h - a strict, allocation-free msgpack reader for bytes from another process or a peer.
 *
 * It reads one value at a time from a caller-owned buffer and never allocates. Every length and
 * count is checked against its limit and against the bytes left before it is used, and an array's
 * count is refused when the bytes left could not hold that many elements (each takes at least one
 * byte), so a caller may size an allocation from a count it was given. A refusal leaves a sentence
 * ("<prefix>: <what> ...") and a class; after the first refusal every read fails. */
#ifndef KVS_MP_READER_H
#define KVS_MP_READER_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvs_mp_refusal {
    KVS_MP_OK = 0,
    KVS_MP_TRUNCATED, /* the buffer ends inside a value */
    KVS_MP_TYPE,      /* another msgpack type, or an array of the wrong size */
    KVS_MP_LIMIT,     /* a count or length over the caller's limit */
    KVS_MP_VALUE,     /* a number out of range, or trailing bytes */
} kvs_mp_refusal;

typedef struct kvs_mp_reader {
    const uint8_t *p;
    size_t left;
    const char *prefix; /* starts every sentence ("step metadata") */
    char *err;          /* the sentence of the first refusal; may be NULL */
    size_t err_len;
    kvs_mp_refusal refusal;
} kvs_mp_reader;

void kvs_mp_reader_init(kvs_mp_reader *r, const void *buf, size_t len, const char *prefix,
                        char *err, size_t err_len);
/* An unsigned integer (any msgpack integer encoding with a value >= 0) in [0, max]. 0, or -1. */
int kvs_mp_read_uint(kvs_mp_reader *r, uint64_t max, uint64_t *out, const char *what);
/* A signed integer (any msgpack integer encoding that fits int64_t). 0, or -1. */
int kvs_mp_read_int(kvs_mp_reader *r, int64_t *out, const char *what);
/* An array header whose count is in [min, max] and could fit in the bytes left. 0, or -1. */
int kvs_mp_read_array(kvs_mp_reader *r, uint32_t min, uint32_t max, uint32_t *n, const char *what);
/* The same without the bytes-left check, for a count nothing is sized from (a header that names
 * the version before the rest of a newer, possibly cut, message is judged). 0, or -1. */
int kvs_mp_read_array_header(kvs_mp_reader *r, uint32_t min, uint32_t max, uint32_t *n,
                             const char *what);
/* A bin (want_str 0) or str (want_str 1) of at most max bytes: *out points into the buffer. 0, or -1. */
int kvs_mp_read_bytes(kvs_mp_reader *r, int want_str, uint32_t max, const uint8_t **out,
                      uint32_t *n, const char *what);
/* 0 when every byte was read; -1 (KVS_MP_VALUE) when some are left. */
int kvs_mp_read_end(kvs_mp_reader *r);
/* Refuse with the caller's own sentence (a value the reader cannot judge). Returns -1. */
int kvs_mp_refuse(kvs_mp_reader *r, kvs_mp_refusal why, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* KVS_MP_READER_H */
