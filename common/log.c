#include "log.h"

#include <stdarg.h>
#include <stdio.h>

static const char *level_name(int level) {
    switch (level) {
        case KVS_LOG_ERROR: return "error";
        case KVS_LOG_WARN: return "warn";
        case KVS_LOG_INFO: return "info";
        default: return "debug";
    }
}

void kvs_log(int threshold, int level, const char *fmt, ...) {
    if (level > threshold) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvstrata[%s]: %s\n", level_name(level), line);
}

void kvs_fmt(char *buf, size_t len, const char *fmt, ...) {
    if (!buf || len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (n < 0) buf[0] = '\0';
}

void kvs_vfmt_tier(char *buf, size_t len, const char *backend, const char *tier, const char *fmt,
                   va_list ap) {
    if (!buf || len == 0) return;
    int n = snprintf(buf, len, "%s tier \"%s\": ", backend, tier);
    if (n < 0) n = 0;
    if ((size_t)n >= len) return; /* the prefix alone fills it */
    if (vsnprintf(buf + n, len - (size_t)n, fmt, ap) < 0) buf[n] = '\0';
}

const char *kvs_fmt_bytes(char *buf, size_t len, unsigned long long bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned u = 0;
    unsigned long long scale = 1;
    while (u + 1 < sizeof units / sizeof units[0] && bytes / scale >= 1024) {
        scale *= 1024;
        u++;
    }
    if (bytes % scale == 0)
        kvs_fmt(buf, len, "%llu%s", bytes / scale, units[u]);
    else
        kvs_fmt(buf, len, "%.1f%s", (double)bytes / (double)scale, units[u]);
    return buf;
}
