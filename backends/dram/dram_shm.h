/*
 * dram_shm.h - the dram tier's mapping and how a process comes to hold it: POSIX shared memory with
 * `shm_name`, where each attacher is tracked by pid, start time and pid namespace, or an anonymous
 * private mapping. What the mapping holds is dram_layout.h's. Internal to backends/dram/.
 */
#ifndef KVS_DRAM_SHM_H
#define KVS_DRAM_SHM_H

#include "abi/kvstrata_backend.h"
#include "dram_layout.h"

/* 1 when name is a usable shm_name: 1 to DRAM_SHM_NAME_MAX of [A-Za-z0-9_.-], not "." or "..". */
int dram_shm_valid_name(const char *name);
/* Where everything goes for capacity_bytes of slabs of max_object_bytes (rounded up to a page).
 * KVS_ECONFIG (or KVS_EINVAL for a bad max object size) with the error set. */
kvs_status dram_shm_plan(dram_state *st, uint64_t capacity_bytes, geometry *g);
/* Create or attach st->shm_path ("": a private mapping) with geometry g and bind st's views.
 * KVS_ECONFIG when a shared tier of that name has another geometry; the error is set on failure. */
kvs_status dram_shm_map(dram_state *st, const geometry *g);
/* Detach (the last live attacher unlinks the name) and unmap. */
void dram_shm_unmap(dram_state *st);

#endif /* KVS_DRAM_SHM_H */
