/*
 * ssd_options.h - the ssd tier's backend options, parsed strictly (names and defaults in ssd.h and
 * docs/ssd.md).
 */
#ifndef KVS_SSD_OPTIONS_H
#define KVS_SSD_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"

#define SSD_MAX_PATHS        64
#define SSD_MAX_REPLICAS     8
#define SSD_MAX_STRIPE_BYTES (1ull << 30)
#define SSD_MAX_QUEUE_DEPTH  4096u

typedef struct ssd_options {
    const char *paths[SSD_MAX_PATHS]; /* borrowed from the option array: valid during create only */
    uint32_t n_paths;
    uint64_t stripe_bytes;
    uint32_t replicas;
    uint32_t queue_depth;
    uint32_t write_inflight;
    uint32_t pread_threads;
    uint64_t write_buffer_bytes;
    int engine; /* SSD_ENGINE_* */
    uint64_t io_timeout_ms;
    uint64_t sim_bandwidth; /* bytes per second, 0 = off */
    uint64_t sim_iops;      /* 0 = off */
    int64_t enospc_after;   /* -1 = off */
    int64_t device_bytes;   /* -1 = off: writes past this byte of a data file fail with ENOSPC */
    int32_t device_path;    /* -1: device_bytes models every path's device, else only this one's */
    int32_t eio_path;       /* -1 = off */
    uint64_t eio_after;
} ssd_options;

/* Defaults, then the options in order. On failure returns KVS_ECONFIG, writes a sentence (without
 * the tier prefix) into why and what it refuses into refused (an option's name, `path[k]` for the k-th
 * path; see kvs_backend_init.error_option). Paths are not checked against the file system here. */
kvs_status ssd_options_parse(const kvs_backend_option *options, uint64_t n_options,
                             ssd_options *out, char *why, size_t why_len, char *refused,
                             size_t refused_len);

#endif /* KVS_SSD_OPTIONS_H */
