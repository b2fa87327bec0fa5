/* units.c - sizes and rates (grammar in units.h). */
#include "units.h"

#include <stdio.h>
#include <string.h>

typedef struct unit_def {
    const char *name;
    uint64_t bytes;
} unit_def;

static const unit_def UNITS[] = {
    {"B", 1ull},
    {"K", 1ull << 10},
    {"KiB", 1ull << 10},
    {"M", 1ull << 20},
    {"MiB", 1ull << 20},
    {"G", 1ull << 30},
    {"GiB", 1ull << 30},
    {"T", 1ull << 40},
    {"TiB", 1ull << 40},
    {"KB", 1000ull},
    {"MB", 1000ull * 1000},
    {"GB", 1000ull * 1000 * 1000},
    {"TB", 1000ull * 1000 * 1000 * 1000},
};
#define FRACTION_DIGITS_MAX 18 /* 10^18 * 2^40 still fits in 128 bits */

static int is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* The unit spelled by [name, end): "" is bytes. */
static int unit_bytes(const char *name, const char *end, uint64_t *bytes) {
    size_t len = (size_t)(end - name);
    if (len == 0) {
        *bytes = 1;
        return 0;
    }
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++) {
        if (strlen(UNITS[i].name) == len && memcmp(name, UNITS[i].name, len) == 0) {
            *bytes = UNITS[i].bytes;
            return 0;
        }
    }
    return -1;
}

/* "digits[.digits]": the fraction keeps FRACTION_DIGITS_MAX digits and flags any non-zero digit
 * beyond them (such a value is refused for its digits, even where a binary unit would make it whole:
 * 0.0000019073486328125GiB is 2048 bytes, written 2KiB). */
typedef struct number {
    uint64_t whole, fraction, fraction_scale;
    int whole_overflow, fraction_lost, bad_point;
} number;

static void read_number(const char **p, const char *end, number *num) {
    const char *s = *p;
    memset(num, 0, sizeof *num);
    num->fraction_scale = 1;
    for (; s < end && is_digit(*s); s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (num->whole > (UINT64_MAX - d) / 10)
            num->whole_overflow = 1;
        else
            num->whole = num->whole * 10 + d;
    }
    if (s < end && *s == '.') {
        s++;
        if (s == end || !is_digit(*s)) num->bad_point = 1;
        int digits = 0;
        for (; s < end && is_digit(*s); s++) {
            if (digits < FRACTION_DIGITS_MAX) {
                num->fraction = num->fraction * 10 + (uint64_t)(*s - '0');
                num->fraction_scale *= 10;
                digits++;
            } else if (*s != '0') {
                num->fraction_lost = 1;
            }
        }
    }
    *p = s;
}

static kvs_status refuse(char *why, size_t why_len, const char *reason) {
    if (why && why_len) snprintf(why, why_len, "%s", reason);
    return KVS_EINVAL;
}

/* The size spelled by [text, end). */
static kvs_status parse_size(const char *text, const char *end, uint64_t *bytes, char *why,
                             size_t why_len) {
    const char *p = text;
    if (p == end) return refuse(why, why_len, "the size is empty");
    if (*p == '-') return refuse(why, why_len, "a size cannot be negative");
    if (!is_digit(*p)) return refuse(why, why_len, "a size starts with a number");
    number num;
    read_number(&p, end, &num);
    if (num.bad_point) return refuse(why, why_len, "a digit must follow the decimal point");
    const char *number_end = p;
    while (p < end && *p == ' ') p++;
    if (p != number_end && p == end)
        return refuse(why, why_len, "spaces must be followed by a unit");
    uint64_t unit = 1;
    if (unit_bytes(p, end, &unit) != 0) {
        if (why && why_len)
            snprintf(why, why_len, "unknown unit '%.*s' (units: " KVS_UNITS_LIST ")",
                     (int)(end - p < 16 ? end - p : 16), p);
        return KVS_EINVAL;
    }
    unsigned __int128 fraction_bytes = (unsigned __int128)num.fraction * unit;
    if (num.fraction_lost)
        return refuse(why, why_len, "at most 18 digits after the decimal point are read");
    if (fraction_bytes % num.fraction_scale != 0)
        return refuse(why, why_len, "the size is not a whole number of bytes");
    unsigned __int128 total =
        (unsigned __int128)num.whole * unit + fraction_bytes / num.fraction_scale;
    if (num.whole_overflow || total > UINT64_MAX)
        return refuse(why, why_len, "the size is larger than 2^64-1 bytes");
    *bytes = (uint64_t)total;
    return KVS_OK;
}

kvs_status kvs_units_parse_size(const char *text, uint64_t *bytes, char *why, size_t why_len) {
    if (!text || !bytes) return refuse(why, why_len, "no size given");
    return parse_size(text, text + strlen(text), bytes, why, why_len);
}

kvs_status kvs_units_parse_rate(const char *text, uint64_t *bytes_per_s, char *why,
                                size_t why_len) {
    if (!text || !bytes_per_s) return refuse(why, why_len, "no rate given");
    size_t n = strlen(text);
    if (n >= 2 && strcmp(text + n - 2, "/s") == 0) n -= 2;
    return parse_size(text, text + n, bytes_per_s, why, why_len);
}
