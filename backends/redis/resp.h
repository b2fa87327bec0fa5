/*
 * resp.h - RESP2, the Redis protocol: encoding commands and parsing replies. A server's replies are
 * untrusted input: the parser is strict (CRLF-terminated lines, decimal lengths without sign or
 * padding except the nil -1, nesting and element counts bounded) and never reads past the bytes it
 * is given. Pure functions, no allocation; thread-safe on distinct buffers.
 */
#ifndef KVS_REDIS_RESP_H
#define KVS_REDIS_RESP_H

#include <stddef.h>
#include <stdint.h>

#define KVS_RESP_MAX_LINE  4096 /* longest status, error or length line, CRLF included */
#define KVS_RESP_MAX_DEPTH 8    /* arrays nested deeper are refused */

typedef enum kvs_resp_kind {
    KVS_RESP_STATUS = 1, /* +text */
    KVS_RESP_ERROR,      /* -text */
    KVS_RESP_INTEGER,    /* :n */
    KVS_RESP_BULK,       /* $len then len bytes */
    KVS_RESP_NIL,        /* $-1 or *-1 */
    KVS_RESP_ARRAY,      /* *count then count replies */
} kvs_resp_kind;

/* One reply, or one element of an array reply. Nodes of a parse are in pre-order: an array's
 * elements follow it, and `next` is the index just past its whole subtree. */
typedef struct kvs_resp_node {
    kvs_resp_kind kind;
    int64_t integer;  /* INTEGER: the value; ARRAY: its element count; BULK: its length */
    const char *text; /* STATUS, ERROR, BULK: the bytes, inside the parsed buffer (no NUL) */
    uint64_t len;     /* of text */
    uint32_t next;
} kvs_resp_node;

typedef enum kvs_resp_result {
    KVS_RESP_DONE = 0,       /* a whole reply was parsed */
    KVS_RESP_INCOMPLETE = 1, /* more bytes are needed; nothing is consumed */
    KVS_RESP_MALFORMED = 2,  /* not RESP2, or over a bound: the connection must be closed */
} kvs_resp_result;

/* The first line of a reply at buf[0..len): its kind and value (STATUS/ERROR text; BULK length in
 * integer; ARRAY count; INTEGER value) in *out; *line_len gets its bytes, CRLF included. For BULK
 * and ARRAY the body is not looked at. *why gets a static phrase on MALFORMED. */
kvs_resp_result kvs_resp_header(const char *buf, size_t len, kvs_resp_node *out, size_t *line_len,
                                const char **why);

/* One whole reply at buf[0..len) into nodes[0..cap) (pre-order); *n_nodes and *used get the nodes
 * written and bytes consumed. Bulk strings longer than max_bulk, and replies of more than cap
 * nodes, are MALFORMED (the caller's bound on what it accepts). */
kvs_resp_result kvs_resp_parse(const char *buf, size_t len, uint64_t max_bulk, kvs_resp_node *nodes,
                               uint32_t cap, uint32_t *n_nodes, size_t *used, const char **why);

/* Encode a command of argc arguments into out[0..cap) as RESP2 (an array of bulk strings). When
 * tail_len is not UINT64_MAX, one more argument of tail_len bytes follows that the caller sends
 * itself (from its own buffer, then "\r\n"): only its length line is written. Returns the bytes
 * written, or 0 when cap is short. */
size_t kvs_resp_command(char *out, size_t cap, uint32_t argc, const char *const *argv,
                        const size_t *lens, uint64_t tail_len);

/* 1 when node is STATUS/ERROR/BULK text equal to word (case-sensitive), or starting with word
 * followed by a space or the end (prefix is 1). */
int kvs_resp_text_is(const kvs_resp_node *node, const char *word, int prefix);

#endif
