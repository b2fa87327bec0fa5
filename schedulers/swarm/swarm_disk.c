/* swarm_disk.c - virtual-time multi-path SSD model (see swarm_disk.h). */
#include "swarm_disk.h"

#include <stddef.h>

kvs_swarm_disk kvs_swarm_disk_pm9a3(void) {
    return (kvs_swarm_disk){"pm9a3", 1.1e6, 6.9e9};
}

kvs_swarm_disk kvs_swarm_disk_optane_900p(void) {
    return (kvs_swarm_disk){"optane-900p", 0.55e6, 2.5e9};
}

double kvs_swarm_disk_time(const kvs_swarm_disk *disk, kvs_swarm_time_model model, uint64_t n_ios,
                           uint64_t bytes) {
    if (!disk || !(disk->iops > 0.0) || !(disk->bytes_per_s > 0.0)) return 0.0;
    double t_io = (double)n_ios / disk->iops, t_bytes = (double)bytes / disk->bytes_per_s;
    if (model == KVS_SWARM_TIME_MAX) return t_io > t_bytes ? t_io : t_bytes;
    return t_io + t_bytes;
}

double kvs_swarm_step_time(const kvs_swarm_disk *disks, uint32_t n_paths,
                           kvs_swarm_time_model model, const uint64_t *n_ios, const uint64_t *bytes,
                           double *per_path_s) {
    if (!disks || !n_ios || !bytes) return 0.0;
    double worst = 0.0;
    for (uint32_t d = 0; d < n_paths; d++) {
        double t = kvs_swarm_disk_time(&disks[d], model, n_ios[d], bytes[d]);
        if (per_path_s) per_path_s[d] = t;
        if (t > worst) worst = t;
    }
    return worst;
}

void kvs_swarm_tally(uint32_t n_paths, uint64_t n, const uint32_t *chosen, const uint64_t *bytes,
                     uint64_t read_bytes, uint64_t *n_ios, uint64_t *bytes_out) {
    if (!n_ios || !bytes_out) return;
    for (uint32_t d = 0; d < n_paths; d++) n_ios[d] = bytes_out[d] = 0;
    if (!chosen) return;
    for (uint64_t r = 0; r < n; r++) {
        if (chosen[r] >= n_paths) continue;
        n_ios[chosen[r]]++;
        bytes_out[chosen[r]] += bytes ? bytes[r] : read_bytes;
    }
}

uint64_t kvs_swarm_coalesced_ios(const uint64_t *slots, uint64_t n, uint64_t slot_bytes,
                                 uint64_t max_io_bytes) {
    if (!slots || n == 0) return 0;
    uint64_t per_io = slot_bytes && max_io_bytes >= slot_bytes ? max_io_bytes / slot_bytes : 1;
    uint64_t ios = 1, run = 1;
    for (uint64_t k = 1; k < n; k++) {
        if (slots[k] == slots[k - 1]) continue;
        if (slots[k] == slots[k - 1] + 1 && run < per_io) {
            run++;
            continue;
        }
        ios++;
        run = 1;
    }
    return ios;
}
