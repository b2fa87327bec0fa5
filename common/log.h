/* log.h - diagnostics every layer shares: leveled lines on stderr and bounded message formatting (the
 * per-handle last error lives in connector/guard). C and CUDA (C++) callers. */
#ifndef KVS_LOG_H
#define KVS_LOG_H

#include <stdarg.h>
#include <stddef.h>

#include "abi/kvstrata_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Print "kvstrata[level]: message" to stderr when level <= threshold. */
void kvs_log(int threshold, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* snprintf that never fails the caller: truncates, always NUL-terminates (len > 0). */
void kvs_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The sentence a backend keeps as its last error or logs: `<backend> tier "<tier>": ` then fmt
 * (`ssd tier "nvme0": path "/mnt/a" is not writable (EACCES)`). Truncates, always NUL-terminates. */
void kvs_vfmt_tier(char *buf, size_t len, const char *backend, const char *tier, const char *fmt,
                   va_list ap) __attribute__((format(printf, 5, 0)));
/* A byte count for messages: "4MiB" for an exact multiple of a unit, else "1.5GiB". Returns buf. */
const char *kvs_fmt_bytes(char *buf, size_t len, unsigned long long bytes);

#ifdef __cplusplus
}
#endif

#endif
