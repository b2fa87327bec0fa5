/* flags.h - a command line as a table: each flag a row {name, type, field, help}, parsed by one loop
 * and printed by --help from the same rows. A program may parse several tables at once (each with
 * the struct its fields lie in): kvs-mini-research parses the reference engine's table and its own. */
#ifndef MINI_FLAGS_H
#define MINI_FLAGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum flag_type {
    FLAG_SECTION, /* no flag: a heading of the usage text (help) */
    FLAG_BOOL,    /* int = 1 */
    FLAG_INT,     /* int >= min */
    FLAG_U64,     /* uint64_t, any base strtoull reads */
    FLAG_DOUBLE,  /* double in [0, max] (max 0: no upper bound) */
    FLAG_STRING,  /* const char * */
    FLAG_CHOICE   /* int: the value of the name given, from choices */
} flag_type;

typedef struct flag_choice {
    const char *name;
    int value;
} flag_choice;

typedef struct flag {
    const char *name; /* "--dim" */
    flag_type type;
    size_t field;     /* offsetof the value in the table's struct */
    const char *arg;  /* the value's placeholder in the usage ("N", "PATH", ...); NULL: none */
    const char *help; /* may hold "\n" for further lines, indented under it */
    int min;          /* FLAG_INT */
    double max;       /* FLAG_DOUBLE */
    const flag_choice *choices; /* FLAG_CHOICE: {NULL, 0}-terminated */
    int group;                  /* non-zero: OR-ed into flags_parse's *groups when given */
} flag;

/* One table and the struct its rows' fields lie in. */
typedef struct flag_table {
    const flag *rows;
    size_t n_rows;
    void *base;
} flag_table;

/* Parse argv against the tables (a flag is looked up in each in turn). --help / -h prints the usage
 * on stdout and exits 0. *groups (may be NULL) gets the groups of the flags given. Returns 0, or -1
 * after printing why on stderr (prefixed with prog). */
int flags_parse(const char *prog, const flag_table *tables, int n_tables, int argc, char **argv,
                unsigned *groups);
/* The usage text: "usage: PROG [options]", then every row of every table. */
void flags_usage(const char *prog, const flag_table *tables, int n_tables, FILE *f);

#endif
