/*
 * ssd.h - the built-in SSD tier: objects striped in fixed units over one data file per path (one
 * path per device), O_DIRECT, one io_uring ring and thread per path (a pread/pwrite thread pool
 * where io_uring is missing), an index rebuilt from the unit headers after a restart.
 * docs/ssd.md describes the on-disk format, the crash model and every option.
 *
 * Options (backend options of a `type: ssd` tier; YAML `paths:` arrive first as repeated `path`):
 *   path                one directory per device, at least one (must exist and be writable)
 *   stripe_bytes        unit size, a multiple of 4KiB (default 1MiB; capped at the object size)
 *   replicas            copies of every unit, each on another path when it can (default 1)
 *   queue_depth         ring entries per path (default 128)
 *   write_inflight      unit writes in flight per path (default 8)
 *   write_buffer_bytes  bytes of accepted, unwritten objects before put refuses (default 64MiB)
 *   io_engine           uring (default) or pread
 *   pread_threads       threads per path of the pread engine (default 2)
 *   io_timeout_ms       a path whose I/O takes longer is isolated (default 30000)
 *   sim_bandwidth       pace every path like a device of this many bytes/s ("250MB/s"; default off)
 *   sim_iops            pace every path to this many I/Os per second (default off)
 *   fault_inject        tests only: "enospc_after:N", "eio_path:K", "eio_after:N", "device_bytes:N", comma-separated
 *
 * Capabilities: THREAD_SAFE and GET_MANY. Every op may be called from any thread at any time; ops
 * never wait for I/O while holding the tier's lock. put returns once the object is copied into the
 * write buffer; the object becomes visible to contains/get after all of its unit writes completed.
 * An eviction calls host->on_evict(ctx, key, NULL, 0) under the tier's lock: the bytes are on disk,
 * not at hand, so nothing can be written further down.
 */
#ifndef KVS_SSD_H
#define KVS_SSD_H

#include "abi/kvstrata_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_SSD_STATS_MAX_PATHS 16 /* per-path figures are reported for the first 16 paths */

typedef struct kvs_ssd_path_stats {
    uint64_t units;  /* unit copies stored on this path now (visible objects only) */
    uint64_t reads;  /* read I/Os completed */
    uint64_t writes; /* write I/Os completed (unit writes and tombstones) */
    uint32_t failed; /* 1 once the path is isolated */
    uint32_t uring;  /* 1 when the path runs on io_uring, 0 on the pread engine */
} kvs_ssd_path_stats;

/* Counters since create. I/O figures count device operations: one unit read or write is one. */
typedef struct kvs_ssd_stats_t {
    uint64_t reads, writes;             /* I/Os completed without error */
    uint64_t read_bytes, written_bytes; /* bytes moved by them (4KiB-rounded, headers included) */
    uint64_t submits; /* system calls that issued I/O: io_uring_enter with SQEs, pread, pwrite */
    uint64_t fixed_reads;  /* reads into the registered staging pool (io_uring read_fixed) */
    uint64_t bounce_reads; /* unit reads through a bounce buffer (dst not 4KiB aligned or short) */
    uint64_t enospc_skips; /* objects not stored because a device was full */
    uint64_t queue_full_skips;    /* puts refused: the write buffer was full */
    uint64_t fresh_write_buffers; /* puts whose buffer was allocated, not taken from the write
                                   * arena (an object under half the largest, or the arena all in
                                   * flight) */
    uint64_t path_errors; /* I/O errors other than ENOSPC; the first on a path isolates it */
    uint64_t fallbacks;   /* paths that run the pread engine because io_uring could not start */
    uint64_t evictions;   /* objects dropped to make room */
    uint64_t
        corrupt_drops;  /* recovered objects whose unit data failed its checksum on first read */
    uint64_t recovered; /* objects found by the scan at create */
    uint64_t writes_pending; /* objects accepted by put and not yet visible or skipped (now) */
    uint64_t buffered_bytes; /* write buffer bytes held by them (now) */
    uint32_t n_paths;
    uint32_t failed_paths;
    kvs_ssd_path_stats paths[KVS_SSD_STATS_MAX_PATHS];
} kvs_ssd_stats_t;

/* The ssd backend's ops table (static storage; never freed). */
const kvs_backend_ops *kvs_ssd_backend(void);

/* Counters of a tier made by kvs_ssd_backend()->create. Thread-safe; a snapshot, not atomic as a
 * whole. Returns KVS_EINVAL on NULL arguments. */
kvs_status kvs_ssd_stats(void *state, kvs_ssd_stats_t *out);

/* Wait until every object accepted by put so far is visible or skipped, at most timeout_ms.
 * KVS_ETIMEDOUT when writes are still pending then. For tests and benchmarks. */
kvs_status kvs_ssd_flush(void *state, uint64_t timeout_ms);

/* Read pin deadlines from clock (NULL: CLOCK_MONOTONIC) from now on, so tests expire a pin by
 * advancing a manual clock instead of sleeping. Call before other threads use the tier; the clock
 * must outlive it. KVS_EINVAL on a NULL tier. */
struct kvs_clock;
kvs_status kvs_ssd_set_clock(void *state, const struct kvs_clock *clock);

#ifdef __cplusplus
}
#endif
#endif /* KVS_SSD_H */
