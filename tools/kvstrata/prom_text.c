#include "prom_text.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int name_char(char c, int first) {
    return isalpha((unsigned char)c) || c == '_' || c == ':' ||
           (!first && isdigit((unsigned char)c));
}

/* One sample line (no newline) into s. 0 or -1 with why set. */
static int parse_line(const char *p, const char *end, prom_sample *s, const char **why) {
    memset(s, 0, sizeof *s);
    size_t n = 0;
    if (p == end || !name_char(*p, 1)) return *why = "a metric name must start the line", -1;
    while (p < end && name_char(*p, 0)) {
        if (n + 1 >= sizeof s->name) return *why = "metric name too long", -1;
        s->name[n++] = *p++;
    }
    if (p < end && *p == '{') {
        p++;
        for (;;) {
            while (p < end && *p == ' ') p++;
            if (p < end && *p == '}') {
                p++;
                break;
            }
            if (s->n_labels == PROM_LABELS_MAX) return *why = "too many labels", -1;
            char *lname = s->label[s->n_labels], *lval = s->label_value[s->n_labels];
            n = 0;
            if (p == end || !name_char(*p, 1)) return *why = "bad label name", -1;
            while (p < end && name_char(*p, 0)) {
                if (n + 1 >= PROM_NAME_MAX) return *why = "label name too long", -1;
                lname[n++] = *p++;
            }
            if (p + 1 >= end || p[0] != '=' || p[1] != '"') return *why = "expected =\"", -1;
            p += 2;
            n = 0;
            while (p < end && *p != '"') {
                char c = *p++;
                if (c == '\\') {
                    if (p == end) return *why = "unfinished escape", -1;
                    c = *p++;
                    if (c == 'n')
                        c = '\n';
                    else if (c != '\\' && c != '"')
                        return *why = "unknown escape in a label value", -1;
                }
                if (n + 1 >= PROM_VALUE_MAX) return *why = "label value too long", -1;
                lval[n++] = c;
            }
            if (p == end) return *why = "unterminated label value", -1;
            p++;
            s->n_labels++;
            while (p < end && *p == ' ') p++;
            if (p < end && *p == ',') {
                p++;
                continue;
            }
            if (p < end && *p == '}') {
                p++;
                break;
            }
            return *why = "expected , or } after a label", -1;
        }
    }
    if (p == end || (*p != ' ' && *p != '\t'))
        return *why = "expected a space before the value", -1;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    char num[64];
    n = 0;
    while (p < end && *p != ' ' && *p != '\t') {
        if (n + 1 >= sizeof num) return *why = "value too long", -1;
        num[n++] = *p++;
    }
    num[n] = '\0';
    char *stop = NULL;
    if (!strcmp(num, "+Inf"))
        s->value = INFINITY;
    else if (!strcmp(num, "-Inf"))
        s->value = -INFINITY;
    else if (!strcmp(num, "NaN"))
        s->value = NAN;
    else {
        s->value = strtod(num, &stop);
        if (n == 0 || *stop) return *why = "value is not a number", -1;
    }
    /* an optional timestamp follows; it is not used */
    return 0;
}

int prom_parse(const char *text, size_t len, void (*fn)(void *ctx, const prom_sample *s), void *ctx,
               char *err, size_t err_len) {
    const char *p = text, *end = text + len;
    unsigned line = 0;
    prom_sample s;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        line++;
        const char *q = p;
        while (q < eol && (*q == ' ' || *q == '\t')) q++;
        const char *e = eol;
        if (e > q && e[-1] == '\r') e--;
        if (q < e && *q != '#') {
            const char *why = "";
            if (parse_line(q, e, &s, &why) != 0) {
                snprintf(err, err_len, "line %u: %s", line, why);
                return -1;
            }
            fn(ctx, &s);
        }
        p = eol < end ? eol + 1 : end;
    }
    return 0;
}

const char *prom_label(const prom_sample *s, const char *name) {
    for (int i = 0; i < s->n_labels; i++)
        if (!strcmp(s->label[i], name)) return s->label_value[i];
    return NULL;
}
