/* swarm_disk.h - a virtual-time model of several independent SSD paths (notes §6.1), so placement and
 * scheduling can be compared deterministically on a machine whose files share one device. Times are in
 * seconds, sizes in bytes. Pure functions; thread-safe. */
#ifndef KVS_SWARM_DISK_H
#define KVS_SWARM_DISK_H

#include <stdint.h>

/* One device: random-read IOPS and sequential bandwidth. */
typedef struct kvs_swarm_disk {
    const char *name; /* static string */
    double iops;
    double bytes_per_s;
} kvs_swarm_disk;

/* Samsung PM9A3-like: 1.1 M IOPS, 6.9 GB/s. */
kvs_swarm_disk kvs_swarm_disk_pm9a3(void);
/* Intel Optane 900P-like: 0.55 M IOPS, 2.5 GB/s. */
kvs_swarm_disk kvs_swarm_disk_optane_900p(void);

typedef enum kvs_swarm_time_model {
    KVS_SWARM_TIME_SUM = 0, /* T = n_ios / iops + bytes / bandwidth: per-I/O cost then transfer */
    KVS_SWARM_TIME_MAX = 1  /* T = max(n_ios / iops, bytes / bandwidth): throughput-bound device */
} kvs_swarm_time_model;

/* Time one path needs for n_ios reads moving `bytes` bytes. 0 for a NULL disk or a rate <= 0. */
double kvs_swarm_disk_time(const kvs_swarm_disk *disk, kvs_swarm_time_model model, uint64_t n_ios,
                           uint64_t bytes);

/* Step time = max over paths d < n_paths of the path time of (n_ios[d], bytes[d]) on disks[d]; the
 * paths work in parallel. per_path_s (may be NULL) gets each path's time. */
double kvs_swarm_step_time(const kvs_swarm_disk *disks, uint32_t n_paths,
                           kvs_swarm_time_model model, const uint64_t *n_ios, const uint64_t *bytes,
                           double *per_path_s);

/* Per-path totals of a schedule: reads r < n with chosen[r] < n_paths add one I/O and bytes[r] (or
 * read_bytes each when bytes is NULL) to their path. n_ios and bytes_out are zeroed first. */
void kvs_swarm_tally(uint32_t n_paths, uint64_t n, const uint32_t *chosen, const uint64_t *bytes,
                     uint64_t read_bytes, uint64_t *n_ios, uint64_t *bytes_out);

/* I/Os left after merging reads of adjacent slots (slots[0..n) sorted ascending, duplicates count
 * once) into requests of at most max_io_bytes (>= slot_bytes; 0 = no merging). */
uint64_t kvs_swarm_coalesced_ios(const uint64_t *slots, uint64_t n, uint64_t slot_bytes,
                                 uint64_t max_io_bytes);

#endif
