/* flags.c - the command line as a table (flags.h). */
#include "flags.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HELP_COLUMN 24 /* where a flag's help starts */

static void print_row(const flag *r, FILE *f) {
    if (r->type == FLAG_SECTION) {
        fprintf(f, "%s:\n", r->help);
        return;
    }
    char head[128];
    int n =
        snprintf(head, sizeof head, "  %s%s%s", r->name, r->arg ? " " : "", r->arg ? r->arg : "");
    fprintf(f, "%s%*s", head, n < HELP_COLUMN - 1 ? HELP_COLUMN - n : 2, "");
    for (const char *h = r->help; *h; h++) {
        fputc(*h, f);
        if (*h == '\n') fprintf(f, "%*s", HELP_COLUMN, "");
    }
    fputc('\n', f);
}

void flags_usage(const char *prog, const flag_table *tables, int n_tables, FILE *f) {
    fprintf(f, "usage: %s [options]\n", prog);
    for (int t = 0; t < n_tables; t++)
        for (size_t i = 0; i < tables[t].n_rows; i++) print_row(&tables[t].rows[i], f);
}

/* The row named `name` in the tables, and the struct it writes into. */
static const flag *find_row(const flag_table *tables, int n_tables, const char *name, void **base) {
    for (int t = 0; t < n_tables; t++)
        for (size_t i = 0; i < tables[t].n_rows; i++)
            if (tables[t].rows[i].type != FLAG_SECTION &&
                strcmp(tables[t].rows[i].name, name) == 0) {
                *base = tables[t].base;
                return &tables[t].rows[i];
            }
    return NULL;
}

/* The choices' names as "a, b or c". */
static void choice_names(const flag_choice *c, char *out, size_t len) {
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; c[i].name && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%s",
                              i == 0          ? ""
                              : c[i + 1].name ? ", "
                                              : " or ",
                              c[i].name);
}

/* Store the value v of row r into the struct at base. 0, or -1 after saying why. */
static int set_value(const char *prog, const flag *r, const char *v, void *base) {
    char *at = (char *)base + r->field, *end;
    errno = 0;
    switch (r->type) {
        case FLAG_INT: {
            long x = strtol(v, &end, 10);
            if (errno || *end || end == v || x < r->min || x > INT_MAX) {
                fprintf(stderr, "%s: %s needs an integer >= %d, got '%s'\n", prog, r->name, r->min,
                        v);
                return -1;
            }
            *(int *)(void *)at = (int)x;
            return 0;
        }
        case FLAG_U64: {
            unsigned long long x = strtoull(v, &end, 0);
            if (errno || *end || end == v) {
                fprintf(stderr, "%s: %s needs an unsigned integer, got '%s'\n", prog, r->name, v);
                return -1;
            }
            *(uint64_t *)(void *)at = x;
            return 0;
        }
        case FLAG_DOUBLE: {
            double x = strtod(v, &end);
            if (errno || *end || end == v || !(x >= 0) || (r->max > 0 && x > r->max)) {
                if (r->max > 0)
                    fprintf(stderr, "%s: %s needs a number in [0, %g], got '%s'\n", prog, r->name,
                            r->max, v);
                else
                    fprintf(stderr, "%s: %s needs a number >= 0, got '%s'\n", prog, r->name, v);
                return -1;
            }
            *(double *)(void *)at = x;
            return 0;
        }
        case FLAG_STRING: *(const char **)(void *)at = v; return 0;
        case FLAG_CHOICE:
            for (int i = 0; r->choices[i].name; i++)
                if (strcmp(v, r->choices[i].name) == 0) {
                    *(int *)(void *)at = r->choices[i].value;
                    return 0;
                }
            char names[256];
            choice_names(r->choices, names, sizeof names);
            fprintf(stderr, "%s: %s must be %s, got '%s'\n", prog, r->name, names, v);
            return -1;
        default: return -1;
    }
}

int flags_parse(const char *prog, const flag_table *tables, int n_tables, int argc, char **argv,
                unsigned *groups) {
    if (groups) *groups = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            flags_usage(prog, tables, n_tables, stdout);
            exit(0);
        }
        void *base = NULL;
        const flag *r = find_row(tables, n_tables, a, &base);
        if (!r) {
            /* the research modes' flags (plans, batches, profiles, lsc, sparse decode) moved out
             * of the reference engine: say where they went */
            fprintf(stderr, "%s: unknown option '%s' (--help lists them%s)\n", prog, a,
                    strcmp(prog, "kvs-mini-engine") == 0
                        ? "; the research modes' flags are kvs-mini-research's"
                        : "");
            return -1;
        }
        if (groups) *groups |= (unsigned)r->group;
        if (r->type == FLAG_BOOL) {
            *(int *)(void *)((char *)base + r->field) = 1;
            continue;
        }
        if (i + 1 == argc) {
            fprintf(stderr, "%s: %s needs a value\n", prog, a);
            return -1;
        }
        if (set_value(prog, r, argv[++i], base) != 0) return -1;
    }
    return 0;
}
