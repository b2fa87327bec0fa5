/* http_get.h - one HTTP/1.0 GET of a metrics endpoint ("HOST:PORT", "[V6]:PORT" or
 * "http://HOST:PORT/PATH"; the path defaults to /metrics), bounded in time and size. */
#ifndef KVS_HTTP_GET_H
#define KVS_HTTP_GET_H

#include <stddef.h>

#define HTTP_GET_MAX_BODY (32u << 20)

/* 1 when target looks like an endpoint rather than a file name (a scheme, or HOST:PORT). */
int http_is_endpoint(const char *target);
/* The body of a 200 answer into *body (malloc'd, NUL-terminated; the caller frees), *len its
 * length. 0, or -1 with err set (unreachable, timeout, not 200, too large). */
int http_get(const char *target, int timeout_ms, char **body, size_t *len, char *err,
             size_t err_len);

#endif
