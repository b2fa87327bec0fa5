/* options.h - the strict option parser every built-in backend shares: a backend declares its options
 * as a table of descriptors (name, kind, range, where the value goes in its options struct), and
 * kvs_options_parse looks each given option up by name, parses it with the one grammar of its kind
 * (sizes and rates: common/units.h) and refuses with a sentence that names the option. Pure: nothing
 * kept between calls, thread-safe on distinct outputs. */
#ifndef KVS_OPTIONS_H
#define KVS_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"

typedef enum kvs_option_kind {
    KVS_OPTION_COUNT,        /* a whole decimal number in [min, max] (digits only) */
    KVS_OPTION_MILLISECONDS, /* the same, read as milliseconds (the refusal says so) */
    KVS_OPTION_MICROSECONDS, /* the same, read as microseconds */
    KVS_OPTION_SIZE,   /* a size (units.h) in [min, max] bytes, a multiple of `multiple` if set */
    KVS_OPTION_RATE,   /* a rate (units.h) in [min, max] bytes per second */
    KVS_OPTION_CHOICE, /* one of the words in `choices` ("uring|pread"); stores its index */
    KVS_OPTION_STRING, /* non-empty text; stores the pointer (borrowed from the option array) */
    KVS_OPTION_BOOL,   /* true/false, yes/no, on/off; stores 1 or 0 */
    KVS_OPTION_CUSTOM, /* parse() does it all */
} kvs_option_kind;

/* One option. Numbers and choices go into an unsigned integer field of `width` bytes (1, 2, 4 or
 * 8) at `offset` in the caller's struct (KVS_OPTION_FIELD fills both), booleans and choices into
 * such a field too, strings into a `const char *` field. */
typedef struct kvs_option_desc {
    const char *name;
    kvs_option_kind kind;
    size_t offset, width;
    uint64_t min, max;   /* numbers, sizes and rates; max 0 means no upper bound */
    uint64_t multiple;   /* sizes: the value must be a multiple of this (0: any) */
    const char *example; /* sizes and rates: a value the refusal shows ("64MiB", "250MB/s") */
    const char *choices; /* choices: the words, separated by '|' */
    int repeated;        /* may be given several times (`path`, `node`): never "given twice" */
    /* KVS_OPTION_CUSTOM: parse value into the caller's struct `out` (its nth occurrence, from 0);
     * 0, or -1 with a sentence in why. */
    int (*parse)(const char *value, void *out, uint64_t nth, char *why, size_t why_len);
} kvs_option_desc;

/* The designators .offset and .width of a field of struct type `type`, for a descriptor. */
#define KVS_OPTION_FIELD(type, field) \
    .offset = offsetof(type, field), .width = sizeof(((type *)0)->field)

/* Parse options[0..n_options) against table[0..n_table) into out, in order. given (may be NULL)
 * receives how often each table entry was given. KVS_OK, or KVS_ECONFIG with a sentence (no tier
 * prefix) in why and what is refused in refused (the option's name as given, `name[k]` for the k-th
 * of a repeated one; may be NULL): an unknown name (the sentence lists the table's names), one given
 * twice, or a value its kind refuses. Options not given keep what out held. */
kvs_status kvs_options_parse(const kvs_option_desc *table, size_t n_table,
                             const kvs_backend_option *options, uint64_t n_options, void *out,
                             uint32_t *given, char *why, size_t why_len, char *refused,
                             size_t refused_len);

/* Name what a refusal is about in refused (NULL: nowhere): `name`, or `name[nth]` when nth >= 0.
 * Returns KVS_ECONFIG, for `return kvs_options_refuse(...)` after a sentence is written. */
kvs_status kvs_options_refuse(char *refused, size_t refused_len, const char *name, int64_t nth);

/* Backend ABI 1.3: tell the connector which option create refuses (see kvs_backend_init.error_option):
 * `name`, or `name[nth]` when nth >= 0 (the nth of a repeated option). A no-op for a 1.2 connector. */
void kvs_option_refused(const kvs_backend_init *init, const char *name, int64_t nth);

/* Copy create's failure sentence into init->error, when the connector gave room for one. */
void kvs_create_error(const kvs_backend_init *init, const char *message);

/* A whole decimal number (digits only, no sign or unit) in [min, max] into *out. 0, or -1. */
int kvs_option_count(const char *text, uint64_t min, uint64_t max, uint64_t *out);

#endif /* KVS_OPTIONS_H */
