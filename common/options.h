/* options.h - the pieces every built-in backend's strict option parser shares: option names looked up
 * in a table (unknown and repeated names refused with a sentence) and whole numbers in a range. */
#ifndef KVS_OPTIONS_H
#define KVS_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"

/* The index of key in names[0..n), counted in seen[index]. -1 with a sentence in why when the name
 * is unknown (the sentence lists `valid`) or was given before. */
int kvs_option_index(const char *const *names, unsigned n, int *seen, const char *key,
                     const char *valid, char *why, size_t why_len);

/* Backend ABI 1.3: tell the connector which option create refuses (see kvs_backend_init.error_option):
 * `name`, or `name[nth]` when nth >= 0 (the nth of a repeated option). A no-op for a 1.2 connector. */
void kvs_option_refused(const kvs_backend_init *init, const char *name, int64_t nth);

/* A whole decimal number (digits only, no sign or unit) in [min, max] into *out. 0, or -1. */
int kvs_option_count(const char *text, uint64_t min, uint64_t max, uint64_t *out);

#endif /* KVS_OPTIONS_H */
