/* cli_stored.h - what a configuration's tiers already hold where they keep it across processes (an
 * SSD tier's data files, a shared DRAM tier's memory), read in place: a run that starts with them
 * is a warm start (kvstrata compare says so). */
#ifndef KVS_CLI_STORED_H
#define KVS_CLI_STORED_H

#include <stddef.h>
#include <stdint.h>

/* Objects held now by config_path's ssd tiers and shared dram tiers (rank 0's paths); note gets
 * where ("nvme: 118 objects") or what was not counted (redis, remote: their servers' contents).
 * 0, or -1 when the file cannot be read (note says why). */
int cli_stored_objects(const char *config_path, uint64_t *objects, char *note, size_t note_len);

#endif
