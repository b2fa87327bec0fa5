/*
 * dram.h - the built-in DRAM tier: fixed-size slabs in one mapping, a hash index key -> slab and
 * LRU eviction that skips pinned objects.
 *
 * Options (YAML `options:` of a `type: dram` tier):
 *   shm_name  store the tier in the POSIX shared memory object "/<shm_name>" ([A-Za-z0-9_.-], at
 *             most 200 characters) so every process of one deployment that opens a tier with the
 *             same name and geometry sees the same objects. The first opener creates it; the last
 *             destroy unlinks it. Without it the tier is private to the process.
 *   shm_open  create (default: create the object, or attach it when it exists) or attach (only
 *             attach an existing one: KVS_ENOTFOUND when there is none; the remote tier attaches
 *             a node's tier so, never creating an empty one of its size)
 *
 * Capabilities: ZERO_COPY and THREAD_SAFE always. A tier opened with shm_name is also SHARED (in
 * the sense of KVS_BACKEND_CAP_SHARED); that is a property of the instance, not of the table.
 * Every op takes one process-shared robust mutex. host->on_evict runs with that mutex held, in the
 * process whose put made room; it must not call back into the tier.
 */
#ifndef KVS_DRAM_H
#define KVS_DRAM_H

#include "abi/kvstrata_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The dram backend's ops table (static storage; never freed). Thread-safe. */
const kvs_backend_ops *kvs_dram_backend(void);

struct kvs_clock;
/* Read pin and reservation deadlines of a tier made by kvs_dram_backend()->create from clock (NULL:
 * CLOCK_MONOTONIC) from now on, so tests expire them by advancing a manual clock instead of sleeping.
 * Call before other threads use the tier; the clock must outlive it. Meant for private tiers: the
 * processes sharing a tier must read one clock. KVS_EINVAL on a NULL tier. Exported by the plugin
 * module too (libkvstrata-dram.so), for the tests that run against it. */
__attribute__((visibility("default"))) kvs_status kvs_dram_set_clock(void *tier,
                                                                     const struct kvs_clock *clock);

/* *pinned = 1 when key is stored and holds a pin that has not expired, else 0 (a tier that another
 * process publishes into: its owner keeps what a lookup pinned, backends/dram/dram_index.h). */
__attribute__((visibility("default"))) kvs_status kvs_dram_pinned(void *tier, const kvs_key *key,
                                                                  int *pinned);

/* What a shared tier holds, read from its mapping without attaching or locking (operators' tools:
 * a snapshot, each figure exact at some instant of the read). */
typedef struct kvs_dram_peek_info {
    uint64_t objects, bytes;           /* stored objects and their bytes */
    uint64_t capacity_bytes;           /* slabs * slab size: what the tier can hold */
    uint64_t slab_bytes, slabs;        /* the geometry every attacher must share */
    uint32_t attached, attached_alive; /* attach entries; of those, processes still running */
    uint32_t layout_version;
} kvs_dram_peek_info;
/* Read the shared tier "/<shm_name>". KVS_ENOTFOUND: no such object; KVS_ECORRUPT: not a dram tier
 * of this layout (err says what was found); KVS_EIO: it cannot be opened or mapped. */
kvs_status kvs_dram_peek(const char *shm_name, kvs_dram_peek_info *out, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* KVS_DRAM_H */
