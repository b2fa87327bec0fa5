/* options.c - shared pieces of the built-in backends' option parsers (contract in options.h). */
#include "options.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

int kvs_option_index(const char *const *names, unsigned n, int *seen, const char *key,
                     const char *valid, char *why, size_t why_len) {
    unsigned which = 0;
    while (which < n && strcmp(key, names[which]) != 0) which++;
    if (which == n) {
        snprintf(why, why_len, "unknown option \"%.60s\" (valid options: %s)", key, valid);
        return -1;
    }
    if (seen[which]++) {
        snprintf(why, why_len, "option %s is given twice", key);
        return -1;
    }
    return (int)which;
}

int kvs_option_count(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    if (!text || *text < '0' || *text > '9') return -1;
    uint64_t v = 0;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v < min || v > max) return -1;
    *out = v;
    return 0;
}

void kvs_option_refused(const kvs_backend_init *init, const char *name, int64_t nth) {
    if (!init ||
        init->struct_size <
            offsetof(kvs_backend_init, error_option_len) + sizeof init->error_option_len ||
        !init->error_option || init->error_option_len == 0)
        return;
    if (nth >= 0)
        snprintf(init->error_option, (size_t)init->error_option_len, "%s[%lld]", name,
                 (long long)nth);
    else
        snprintf(init->error_option, (size_t)init->error_option_len, "%s", name);
}
