/* config.h - the deployment's YAML configuration, parsed and validated strictly (libyaml). */
#ifndef KVS_CONFIG_H
#define KVS_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"
#include "config_types.h"

/* Parse and validate a YAML file. On error returns KVS_ECONFIG (KVS_EIO if unreadable) and writes
 * "file:line:column: key 'a.b[1].c': what is wrong" into err. *out is NULL on error. */
kvs_status kvs_config_load(const char *path, kvs_config **out, char *err, size_t err_len);
/* Same from memory; `name` stands for the file in messages (NULL: "<string>"). When `name` has a
 * '/', relative plugin paths resolve against its directory; otherwise they are kept as written. */
kvs_status kvs_config_parse_string(const char *yaml, size_t len, const char *name, kvs_config **out,
                                   char *err, size_t err_len);
/* The built-in defaults: chunk 256, one 1GiB dram tier named "dram". */
kvs_status kvs_config_defaults(kvs_config **out);
/* Frees a config from load, parse_string or defaults, with its tiers and option strings. NULL is a
 * no-op. Not thread-safe on one config; parsing different configs concurrently is. */
void kvs_config_free(kvs_config *cfg);

/* A refusal found after parsing (when the connector opens), in the loader's format:
 * "file:line:column: key 'KEY': sentence" into err, or "file: key 'KEY': sentence" when the value
 * has no position (a default). Returns KVS_ECONFIG. */
kvs_status kvs_config_refuse(const kvs_config *cfg, kvs_config_at at, const char *key, char *err,
                             size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* The same for tier `tier`, pointing at what `name` names (kvs_backend_init.error_option): an option
 * given (`shm_name`), the k-th of a repeated one (`path[1]` is that entry of `paths:`), a tier key
 * (`capacity`), or an option not given (at the tier's `options:`, or the tier). NULL or "": the
 * tier's entry. */
kvs_status kvs_config_refuse_tier(const kvs_config *cfg, size_t tier, const char *name, char *err,
                                  size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#endif
