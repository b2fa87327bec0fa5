/* cli_util.h - what several subcommands of `kvstrata` share: a tier's option values, the room a
 * machine has (free disk, /dev/shm, memory), JSON strings. */
#ifndef KVS_CLI_UTIL_H
#define KVS_CLI_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include "abi/kvstrata_server.h"

/* The value of option key of tier tc (the first; for list keys such as "path", the nth with
 * list_index nth), NULL when not given. */
const char *cli_tier_option(const kvs_server_tier *tc, const char *key, int nth);
/* How many entries list key ("path", "node") has. */
uint32_t cli_tier_list_count(const kvs_server_tier *tc, const char *key);
/* Bytes free to an unprivileged writer on the file system holding path (or its nearest existing
 * parent); -1 with errno when none can be examined. */
int cli_free_bytes(const char *path, uint64_t *free_bytes);
/* MemAvailable from /proc/meminfo; 0 when unknown. */
uint64_t cli_mem_available(void);
/* s as a JSON string, quotes included. */
void cli_json_string(FILE *out, const char *s);
/* value with each {rank} replaced by rank, as the connector reads a tier's options for a worker of
 * that tensor-parallel rank; malloc'd (free it), NULL when out of memory. */
char *cli_with_rank(const char *value, int32_t rank);
/* The `paths:` of tier tc, {rank} replaced by rank, into paths[0..*n) (each malloc'd: free them
 * with cli_free_paths). 0, or -1 when out of memory (nothing left to free). */
int cli_tier_paths(const kvs_server_tier *tc, int32_t rank, char **paths, uint32_t cap,
                   uint32_t *n);
void cli_free_paths(char **paths, uint32_t n);
/* --rank's value: a number from 0 to 65535 into *rank; -1 (said on stderr as cmd's) when not. */
int cli_parse_rank(const char *cmd, const char *text, int32_t *rank);
/* Is file held by a running tier (which keeps LOCK_EX on its data files)? A lock probe released at
 * once (the tier retries its lock for a while). 1 in use, 0 free, -1 cannot tell (errno). */
int cli_file_locked(const char *file);
/* 1 when s names an existing regular file. */
int cli_is_file(const char *s);

/* Open tier i of cfg alone, through the chain the connector uses (what the tier prints goes to its
 * last error, not to stderr). KVS_OK with *chain (kvs_server_tiers_close it), else err says why in the
 * loader's file:line:column form. */
kvs_status cli_open_tier(const kvs_server_config *cfg, size_t i, uint64_t max_object_bytes,
                         int32_t rank, kvs_server_tiers **chain, char *err, size_t err_len);
/* For a redis or remote tier opened by cli_open_tier: how many of its servers are down now (*all:
 * how many it has); 0 for other tiers. */
uint32_t cli_servers_down(const kvs_server_tier *tc, kvs_server_tiers *chain, uint32_t *all);

#endif
