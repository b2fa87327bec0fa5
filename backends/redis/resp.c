/* resp.c - RESP2 encoding and the strict, bounded reply parser (contract in resp.h). */
#include "resp.h"

#include <stdio.h>
#include <string.h>

/* The CRLF-terminated line at buf[0..len): its length without CRLF in *n, or INCOMPLETE. */
static kvs_resp_result find_line(const char *buf, size_t len, size_t *n, const char **why) {
    size_t limit = len < KVS_RESP_MAX_LINE ? len : KVS_RESP_MAX_LINE;
    for (size_t i = 1; i < limit; i++) {
        if (buf[i] == '\n') {
            if (buf[i - 1] != '\r') {
                *why = "a line ends in LF without CR";
                return KVS_RESP_MALFORMED;
            }
            *n = i - 1;
            return KVS_RESP_DONE;
        }
    }
    if (len >= KVS_RESP_MAX_LINE) {
        *why = "a line longer than 4096 bytes";
        return KVS_RESP_MALFORMED;
    }
    return KVS_RESP_INCOMPLETE;
}

/* A decimal in text[0..n): digits only, or "-1" when nil_ok; at most 18 digits (no overflow). */
static int parse_decimal(const char *text, size_t n, int signed_ok, int64_t *out) {
    int neg = 0;
    if (n > 0 && text[0] == '-' && signed_ok) {
        neg = 1;
        text++;
        n--;
    }
    if (n == 0 || n > 18) return -1;
    if (n > 1 && text[0] == '0') return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] < '0' || text[i] > '9') return -1;
        v = v * 10 + (text[i] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

kvs_resp_result kvs_resp_header(const char *buf, size_t len, kvs_resp_node *out, size_t *line_len,
                                const char **why) {
    static const char *unused;
    if (!why) why = &unused;
    if (len == 0) return KVS_RESP_INCOMPLETE;
    size_t n = 0;
    kvs_resp_result r = find_line(buf, len, &n, why);
    if (r != KVS_RESP_DONE) return r;
    memset(out, 0, sizeof *out);
    const char *body = buf + 1;
    size_t body_len = n - 1;
    *line_len = n + 2;
    switch (buf[0]) {
        case '+':
        case '-':
            if (memchr(body, '\r', body_len)) {
                *why = "a CR inside a status or error line";
                return KVS_RESP_MALFORMED;
            }
            out->kind = buf[0] == '+' ? KVS_RESP_STATUS : KVS_RESP_ERROR;
            out->text = body;
            out->len = body_len;
            return KVS_RESP_DONE;
        case ':':
            /* integers may be negative (any value fits 18 digits here: the server's counts) */
            if (parse_decimal(body, body_len, 1, &out->integer) != 0) {
                *why = "a bad integer";
                return KVS_RESP_MALFORMED;
            }
            out->kind = KVS_RESP_INTEGER;
            return KVS_RESP_DONE;
        case '$':
        case '*': {
            int64_t v = 0;
            if (parse_decimal(body, body_len, 1, &v) != 0 || v < -1) {
                *why = buf[0] == '$' ? "a bad bulk length" : "a bad array count";
                return KVS_RESP_MALFORMED;
            }
            out->kind = v == -1 ? KVS_RESP_NIL : buf[0] == '$' ? KVS_RESP_BULK : KVS_RESP_ARRAY;
            out->integer = v == -1 ? 0 : v;
            out->len = 0;
            return KVS_RESP_DONE;
        }
        default: *why = "a reply that starts with an unknown type byte"; return KVS_RESP_MALFORMED;
    }
}

kvs_resp_result kvs_resp_parse(const char *buf, size_t len, uint64_t max_bulk, kvs_resp_node *nodes,
                               uint32_t cap, uint32_t *n_nodes, size_t *used, const char **why) {
    static const char *unused;
    if (!why) why = &unused;
    /* open arrays: the node index and how many elements are still to come */
    uint32_t stack_node[KVS_RESP_MAX_DEPTH];
    int64_t stack_left[KVS_RESP_MAX_DEPTH];
    int depth = 0;
    size_t at = 0;
    uint32_t n = 0;
    *n_nodes = 0;
    *used = 0;
    for (;;) {
        if (n == cap) {
            *why = "a reply with more elements than this client accepts";
            return KVS_RESP_MALFORMED;
        }
        size_t line = 0;
        kvs_resp_node *node = &nodes[n];
        kvs_resp_result r = kvs_resp_header(buf + at, len - at, node, &line, why);
        if (r != KVS_RESP_DONE) return r;
        at += line;
        if (node->kind == KVS_RESP_BULK) {
            uint64_t blen = (uint64_t)node->integer;
            if (blen > max_bulk) {
                *why = "a bulk string longer than this client accepts";
                return KVS_RESP_MALFORMED;
            }
            if (len - at < blen + 2) return KVS_RESP_INCOMPLETE;
            if (buf[at + blen] != '\r' || buf[at + blen + 1] != '\n') {
                *why = "a bulk string not followed by CRLF";
                return KVS_RESP_MALFORMED;
            }
            node->text = buf + at;
            node->len = blen;
            at += blen + 2;
        }
        node->next = ++n;
        if (node->kind == KVS_RESP_ARRAY && node->integer > 0) {
            if (depth == KVS_RESP_MAX_DEPTH) {
                *why = "arrays nested deeper than this client accepts";
                return KVS_RESP_MALFORMED;
            }
            if ((uint64_t)node->integer > (uint64_t)(cap - n)) {
                *why = "a reply with more elements than this client accepts";
                return KVS_RESP_MALFORMED;
            }
            stack_node[depth] = n - 1;
            stack_left[depth] = node->integer;
            depth++;
            continue;
        }
        /* close every array this element completes */
        while (depth > 0 && --stack_left[depth - 1] == 0) {
            nodes[stack_node[depth - 1]].next = n;
            depth--;
        }
        if (depth == 0) break;
    }
    *n_nodes = n;
    *used = at;
    return KVS_RESP_DONE;
}

size_t kvs_resp_command(char *out, size_t cap, uint32_t argc, const char *const *argv,
                        const size_t *lens, uint64_t tail_len) {
    int has_tail = tail_len != UINT64_MAX;
    size_t at = 0;
    int w = snprintf(out, cap, "*%u\r\n", argc + (has_tail ? 1u : 0u));
    if (w < 0 || (size_t)w >= cap) return 0;
    at = (size_t)w;
    for (uint32_t i = 0; i < argc; i++) {
        w = snprintf(out + at, cap - at, "$%zu\r\n", lens[i]);
        if (w < 0 || (size_t)w >= cap - at || cap - at - (size_t)w < lens[i] + 2) return 0;
        at += (size_t)w;
        memcpy(out + at, argv[i], lens[i]);
        at += lens[i];
        out[at++] = '\r';
        out[at++] = '\n';
    }
    if (has_tail) {
        w = snprintf(out + at, cap - at, "$%llu\r\n", (unsigned long long)tail_len);
        if (w < 0 || (size_t)w >= cap - at) return 0;
        at += (size_t)w;
    }
    return at;
}

int kvs_resp_text_is(const kvs_resp_node *node, const char *word, int prefix) {
    if (node->kind != KVS_RESP_STATUS && node->kind != KVS_RESP_ERROR &&
        node->kind != KVS_RESP_BULK)
        return 0;
    size_t wl = strlen(word);
    if (node->len < wl || memcmp(node->text, word, wl) != 0) return 0;
    if (node->len == wl) return 1;
    return prefix && node->text[wl] == ' ';
}
