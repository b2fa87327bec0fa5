/* options.c - the built-in backends' table-driven option parser (contract in options.h). */
#include "options.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "units.h"

int kvs_option_count(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    if (!text || *text < '0' || *text > '9') return -1;
    uint64_t v = 0;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    if (v < min || v > max) return -1;
    *out = v;
    return 0;
}

kvs_status kvs_options_refuse(char *refused, size_t refused_len, const char *name, int64_t nth) {
    if (!refused || refused_len == 0) return KVS_ECONFIG;
    if (nth >= 0)
        snprintf(refused, refused_len, "%s[%lld]", name, (long long)nth);
    else
        snprintf(refused, refused_len, "%s", name);
    return KVS_ECONFIG;
}

void kvs_option_refused(const kvs_backend_init *init, const char *name, int64_t nth) {
    if (!init || init->struct_size <
                     offsetof(kvs_backend_init, error_option_len) + sizeof init->error_option_len)
        return;
    kvs_options_refuse(init->error_option, (size_t)init->error_option_len, name, nth);
}

void kvs_create_error(const kvs_backend_init *init, const char *message) {
    if (init && init->error && init->error_len > 0)
        snprintf(init->error, (size_t)init->error_len, "%s", message);
}

/* ---- storing ---------------------------------------------------------------------------------- */

static uint64_t width_max(size_t width) {
    return width >= 8 ? UINT64_MAX : (1ull << (8 * width)) - 1;
}

static void store(void *out, const kvs_option_desc *d, uint64_t v) {
    unsigned char *at = (unsigned char *)out + d->offset;
    switch (d->width) {
        case 1: *at = (unsigned char)v; return;
        case 2: {
            uint16_t x = (uint16_t)v;
            memcpy(at, &x, sizeof x);
            return;
        }
        case 4: {
            uint32_t x = (uint32_t)v;
            memcpy(at, &x, sizeof x);
            return;
        }
        case 8: memcpy(at, &v, sizeof v); return;
        default: return; /* refused by kvs_options_parse's table check */
    }
}

/* The upper bound of d: its max, bounded by what its field holds. */
static uint64_t upper(const kvs_option_desc *d) {
    uint64_t field = width_max(d->width);
    return d->max && d->max < field ? d->max : field;
}

/* ---- one value by kind ------------------------------------------------------------------------ */

/* "a, b or c" from "a|b|c". */
static void choice_list(const char *choices, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (const char *p = choices; *p && used + 1 < len;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        const char *sep = p == choices ? "" : (bar ? ", " : " or ");
        int w = snprintf(buf + used, len - used, "%s%.*s", sep, (int)n, p);
        if (w < 0) break;
        used += (size_t)w < len - used ? (size_t)w : len - used - 1;
        p = bar ? bar + 1 : p + n;
    }
}

static int parse_choice(const kvs_option_desc *d, const char *value, uint64_t *index) {
    uint64_t i = 0;
    for (const char *p = d->choices; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (strlen(value) == n && memcmp(value, p, n) == 0) {
            *index = i;
            return 0;
        }
        p = bar ? bar + 1 : p + n;
    }
    return -1;
}

static int parse_bool(const char *value, uint64_t *v) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (size_t i = 0; i < 3; i++) {
        if (strcmp(value, yes[i]) == 0 || strcmp(value, no[i]) == 0) {
            *v = strcmp(value, yes[i]) == 0;
            return 0;
        }
    }
    return -1;
}

/* Sizes and rates: the grammar's refusal, else the range's. */
static int parse_bytes(const kvs_option_desc *d, const char *value, uint64_t *v, char *why,
                       size_t why_len) {
    int rate = d->kind == KVS_OPTION_RATE;
    const char *noun = rate ? "a rate" : "a size";
    const char *example = d->example ? d->example : (rate ? "250MB/s" : "64MiB");
    char reason[160], lo[32], hi[32], step[32];
    kvs_status st = rate ? kvs_units_parse_rate(value, v, reason, sizeof reason)
                         : kvs_units_parse_size(value, v, reason, sizeof reason);
    if (st != KVS_OK) {
        snprintf(why, why_len, "%s \"%.40s\" is not %s such as %s: %s", d->name, value, noun,
                 example, reason);
        return -1;
    }
    uint64_t max = upper(d);
    if (d->multiple && (*v % d->multiple != 0 || *v < d->min || *v > max)) {
        snprintf(why, why_len, "%s \"%.40s\" is not a multiple of %s between %s and %s", d->name,
                 value, kvs_fmt_bytes(step, sizeof step, d->multiple),
                 kvs_fmt_bytes(lo, sizeof lo, d->min), kvs_fmt_bytes(hi, sizeof hi, max));
        return -1;
    }
    if (*v < d->min || *v > max) {
        if (max == UINT64_MAX)
            snprintf(why, why_len, "%s \"%.40s\" is not %s such as %s: it must be at least %s%s",
                     d->name, value, noun, example, kvs_fmt_bytes(lo, sizeof lo, d->min),
                     rate ? "/s" : "");
        else
            snprintf(why, why_len, "%s \"%.40s\" is not %s such as %s: it must be from %s to %s%s",
                     d->name, value, noun, example, kvs_fmt_bytes(lo, sizeof lo, d->min),
                     kvs_fmt_bytes(hi, sizeof hi, max), rate ? " per second" : "");
        return -1;
    }
    return 0;
}

static int parse_value(const kvs_option_desc *d, const char *value, void *out, uint64_t nth,
                       char *why, size_t why_len) {
    uint64_t v = 0, max = upper(d);
    char list[160];
    switch (d->kind) {
        case KVS_OPTION_COUNT:
        case KVS_OPTION_MILLISECONDS:
        case KVS_OPTION_MICROSECONDS:
            if (kvs_option_count(value, d->min, max, &v) != 0) {
                const char *unit = d->kind == KVS_OPTION_MILLISECONDS   ? " of milliseconds"
                                   : d->kind == KVS_OPTION_MICROSECONDS ? " of microseconds"
                                                                        : "";
                snprintf(why, why_len, "%s \"%.40s\" is not a whole number%s from %llu to %llu",
                         d->name, value, unit, (unsigned long long)d->min, (unsigned long long)max);
                return -1;
            }
            break;
        case KVS_OPTION_SIZE:
        case KVS_OPTION_RATE:
            if (parse_bytes(d, value, &v, why, why_len) != 0) return -1;
            break;
        case KVS_OPTION_CHOICE:
            if (parse_choice(d, value, &v) != 0) {
                choice_list(d->choices, list, sizeof list);
                snprintf(why, why_len, "%s \"%.40s\" is not %s", d->name, value, list);
                return -1;
            }
            break;
        case KVS_OPTION_BOOL:
            if (parse_bool(value, &v) != 0) {
                snprintf(why, why_len, "%s \"%.40s\" is not true or false (also yes/no, on/off)",
                         d->name, value);
                return -1;
            }
            break;
        case KVS_OPTION_STRING:
            if (!*value) {
                snprintf(why, why_len, "%s is empty", d->name);
                return -1;
            }
            memcpy((unsigned char *)out + d->offset, &value, sizeof value);
            return 0;
        case KVS_OPTION_CUSTOM:
            if (!d->parse) break;
            return d->parse(value, out, nth, why, why_len);
    }
    if (d->kind == KVS_OPTION_CUSTOM) {
        snprintf(why, why_len, "option %s has no parser", d->name);
        return -1;
    }
    store(out, d, v);
    return 0;
}

/* ---- the table -------------------------------------------------------------------------------- */

static void valid_names(const kvs_option_desc *table, size_t n_table, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n_table && used + 1 < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", table[i].name);
        if (w < 0) break;
        used += (size_t)w < len - used ? (size_t)w : len - used - 1;
    }
}

kvs_status kvs_options_parse(const kvs_option_desc *table, size_t n_table,
                             const kvs_backend_option *options, uint64_t n_options, void *out,
                             uint32_t *given, char *why, size_t why_len, char *refused,
                             size_t refused_len) {
    uint32_t counts[64] = {0};
    if (n_table > sizeof counts / sizeof counts[0] || (n_options && !options)) {
        snprintf(why, why_len, "the option table or the options are malformed");
        return kvs_options_refuse(refused, refused_len, "", -1);
    }
    for (size_t i = 0; i < n_table; i++) { /* a number, choice or bool needs a field it fits */
        kvs_option_kind k = table[i].kind;
        size_t w = table[i].width;
        if (k != KVS_OPTION_STRING && k != KVS_OPTION_CUSTOM && w != 1 && w != 2 && w != 4 &&
            w != 8) {
            snprintf(why, why_len, "option %s has no field of 1, 2, 4 or 8 bytes in the table",
                     table[i].name);
            return kvs_options_refuse(refused, refused_len, table[i].name, -1);
        }
    }
    for (uint64_t i = 0; i < n_options; i++) {
        const char *key = options[i].key ? options[i].key : "";
        const char *value = options[i].value ? options[i].value : "";
        size_t which = 0;
        while (which < n_table && strcmp(key, table[which].name) != 0) which++;
        if (which == n_table) {
            char valid[512];
            valid_names(table, n_table, valid, sizeof valid);
            snprintf(why, why_len, "unknown option \"%.60s\" (valid options: %s)", key, valid);
            return kvs_options_refuse(refused, refused_len, key, -1);
        }
        const kvs_option_desc *d = &table[which];
        uint64_t nth = counts[which]++;
        if (nth > 0 && !d->repeated) {
            snprintf(why, why_len, "option %s is given twice", key);
            return kvs_options_refuse(refused, refused_len, key, -1);
        }
        if (parse_value(d, value, out, nth, why, why_len) != 0)
            return kvs_options_refuse(refused, refused_len, key, d->repeated ? (int64_t)nth : -1);
    }
    if (given) memcpy(given, counts, n_table * sizeof *given);
    return KVS_OK;
}
