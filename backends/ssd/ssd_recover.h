/*
 * ssd_recover.h - rebuilding the ssd tier's index after a restart: read every slot's unit header
 * (batched, all paths at once) and pick, per key, the newest sequence whose units are all present.
 */
#ifndef KVS_SSD_RECOVER_H
#define KVS_SSD_RECOVER_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "common/progress.h"
#include "ssd_io.h"

typedef struct ssd_found_unit {
    kvs_key key;
    uint64_t object_len, sequence, data_checksum;
    uint32_t unit_index, unit_count, replica_index, replica_count;
    uint32_t path, slot;
} ssd_found_unit;

typedef struct ssd_scan_result {
    ssd_found_unit *units; /* valid headers found on paths that did not fail; free() it */
    uint64_t n, cap;
    uint64_t max_sequence; /* over every valid header seen */
    uint64_t headers_read;
} ssd_scan_result;

/* Read the headers of slots [0, scan_slots[p]) of every path p with io[p] != NULL, at most batch
 * per path at a time, keeping those valid for stripe_bytes. A path whose reads fail is isolated
 * by its engine and contributes nothing. progress (NULL: none) is told the headers read so far
 * after each batch. Returns 0 or ENOMEM. */
int ssd_recover_scan(ssd_io_path *const *io, uint32_t n_paths, const uint64_t *scan_slots,
                     uint64_t slot_bytes, uint64_t stripe_bytes, uint32_t batch,
                     uint64_t timeout_ms, kvs_progress *progress, ssd_scan_result *out);

/* Sort the result and call emit once per live object: copies[0..n) hold one sequence of one key,
 * consistent in length and unit count, and cover every unit. Older sequences of an emitted key,
 * incomplete objects and stray units are not emitted (their slots are free). */
void ssd_recover_select(ssd_scan_result *r,
                        void (*emit)(void *ctx, const ssd_found_unit *copies, uint64_t n),
                        void *ctx);

#endif /* KVS_SSD_RECOVER_H */
