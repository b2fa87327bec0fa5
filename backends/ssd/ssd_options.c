/*
 * ssd_options.c - strict parsing of the ssd tier's backend options (contract in ssd_options.h).
 */
#include "ssd_options.h"

#include <stdio.h>
#include <string.h>

#include "common/options.h"
#include "common/units.h"
#include "ssd_format.h"
#include "ssd_io.h"

#define VALID_OPTIONS                                                                            \
    "path, stripe_bytes, replicas, queue_depth, write_inflight, write_buffer_bytes, io_engine, " \
    "pread_threads, io_timeout_ms, sim_bandwidth, sim_iops, fault_inject"

/* "enospc_after:N,eio_path:K,eio_after:N,device_bytes:N" */
static int parse_faults(const char *text, ssd_options *o, char *why, size_t why_len) {
    char buf[256];
    if (strlen(text) >= sizeof buf) {
        snprintf(why, why_len, "fault_inject \"%.60s...\" is too long", text);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ') item++;
        char *colon = strchr(item, ':');
        uint64_t v = 0;
        if (!colon || kvs_option_count(colon + 1, 0, INT32_MAX, &v) != 0) {
            snprintf(why, why_len,
                     "fault_inject item \"%.60s\" is not NAME:NUMBER (enospc_after, eio_path, "
                     "eio_after, device_bytes)",
                     item);
            return -1;
        }
        *colon = '\0';
        if (strcmp(item, "enospc_after") == 0)
            o->enospc_after = (int64_t)v;
        else if (strcmp(item, "eio_path") == 0)
            o->eio_path = (int32_t)v;
        else if (strcmp(item, "eio_after") == 0)
            o->eio_after = v;
        else if (strcmp(item, "device_bytes") == 0)
            o->device_bytes = (int64_t)v;
        else {
            snprintf(why, why_len,
                     "fault_inject has no fault \"%.40s\" (enospc_after, eio_path, eio_after, "
                     "device_bytes)",
                     item);
            return -1;
        }
    }
    return 0;
}

/* The options, looked up by name; the parser below goes by these names, never by a position. */
enum {
    OPT_STRIPE_BYTES,
    OPT_REPLICAS,
    OPT_QUEUE_DEPTH,
    OPT_WRITE_INFLIGHT,
    OPT_WRITE_BUFFER_BYTES,
    OPT_IO_ENGINE,
    OPT_PREAD_THREADS,
    OPT_IO_TIMEOUT_MS,
    OPT_SIM_BANDWIDTH,
    OPT_SIM_IOPS,
    OPT_FAULT_INJECT,
    OPT_COUNT
};
static const char *const NAMES[OPT_COUNT] = {[OPT_STRIPE_BYTES] = "stripe_bytes",
                                             [OPT_REPLICAS] = "replicas",
                                             [OPT_QUEUE_DEPTH] = "queue_depth",
                                             [OPT_WRITE_INFLIGHT] = "write_inflight",
                                             [OPT_WRITE_BUFFER_BYTES] = "write_buffer_bytes",
                                             [OPT_IO_ENGINE] = "io_engine",
                                             [OPT_PREAD_THREADS] = "pread_threads",
                                             [OPT_IO_TIMEOUT_MS] = "io_timeout_ms",
                                             [OPT_SIM_BANDWIDTH] = "sim_bandwidth",
                                             [OPT_SIM_IOPS] = "sim_iops",
                                             [OPT_FAULT_INJECT] = "fault_inject"};

static int parse_one(unsigned which, const char *value, ssd_options *o, char *why, size_t why_len) {
    uint64_t v = 0;
    switch (which) {
        case OPT_STRIPE_BYTES:
            if (kvs_units_parse_size(value, &v, NULL, 0) != KVS_OK || v == 0 ||
                v % SSD_BLOCK != 0 || v > SSD_MAX_STRIPE_BYTES) {
                snprintf(why, why_len,
                         "stripe_bytes \"%.40s\" is not a multiple of 4KiB between 4KiB and 1GiB",
                         value);
                return -1;
            }
            o->stripe_bytes = v;
            return 0;
        case OPT_REPLICAS:
            if (kvs_option_count(value, 1, SSD_MAX_REPLICAS, &v) != 0) {
                snprintf(why, why_len, "replicas \"%.40s\" is not a whole number from 1 to %d",
                         value, SSD_MAX_REPLICAS);
                return -1;
            }
            o->replicas = (uint32_t)v;
            return 0;
        case OPT_QUEUE_DEPTH:
            if (kvs_option_count(value, 2, SSD_MAX_QUEUE_DEPTH, &v) != 0) {
                snprintf(why, why_len, "queue_depth \"%.40s\" is not a whole number from 2 to %u",
                         value, SSD_MAX_QUEUE_DEPTH);
                return -1;
            }
            o->queue_depth = (uint32_t)v;
            return 0;
        case OPT_WRITE_INFLIGHT:
            if (kvs_option_count(value, 1, SSD_MAX_QUEUE_DEPTH, &v) != 0) {
                snprintf(why, why_len,
                         "write_inflight \"%.40s\" is not a whole number from 1 to %u", value,
                         SSD_MAX_QUEUE_DEPTH);
                return -1;
            }
            o->write_inflight = (uint32_t)v;
            return 0;
        case OPT_WRITE_BUFFER_BYTES:
            if (kvs_units_parse_size(value, &v, NULL, 0) != KVS_OK || v == 0) {
                snprintf(why, why_len, "write_buffer_bytes \"%.40s\" is not a size such as 64MiB",
                         value);
                return -1;
            }
            o->write_buffer_bytes = v;
            return 0;
        case OPT_IO_ENGINE:
            if (strcmp(value, "uring") == 0)
                o->engine = SSD_ENGINE_URING;
            else if (strcmp(value, "pread") == 0)
                o->engine = SSD_ENGINE_PREAD;
            else {
                snprintf(why, why_len, "io_engine \"%.40s\" is not uring or pread", value);
                return -1;
            }
            return 0;
        case OPT_PREAD_THREADS:
            if (kvs_option_count(value, 1, 64, &v) != 0) {
                snprintf(why, why_len, "pread_threads \"%.40s\" is not a whole number from 1 to 64",
                         value);
                return -1;
            }
            o->pread_threads = (uint32_t)v;
            return 0;
        case OPT_IO_TIMEOUT_MS:
            if (kvs_option_count(value, 1, 24ull * 3600 * 1000, &v) != 0) {
                snprintf(why, why_len,
                         "io_timeout_ms \"%.40s\" is not a whole number of milliseconds from 1 to "
                         "86400000",
                         value);
                return -1;
            }
            o->io_timeout_ms = v;
            return 0;
        case OPT_SIM_BANDWIDTH:
            if (kvs_units_parse_rate(value, &v, NULL, 0) != KVS_OK || v == 0) {
                snprintf(why, why_len, "sim_bandwidth \"%.40s\" is not a rate such as 250MB/s",
                         value);
                return -1;
            }
            o->sim_bandwidth = v;
            return 0;
        case OPT_SIM_IOPS:
            if (kvs_option_count(value, 1, 1000000000ull, &v) != 0) {
                snprintf(why, why_len,
                         "sim_iops \"%.40s\" is not a whole number from 1 to 1000000000", value);
                return -1;
            }
            o->sim_iops = v;
            return 0;
        case OPT_FAULT_INJECT: return parse_faults(value, o, why, why_len);
    }
    snprintf(why, why_len, "an option in the table has no parser");
    return -1;
}

/* Names what a refusal is about, for kvs_backend_init.error_option; returns KVS_ECONFIG. */
static kvs_status refuse(char *refused, size_t refused_len, const char *name, int64_t nth) {
    if (nth >= 0)
        snprintf(refused, refused_len, "%s[%lld]", name, (long long)nth);
    else
        snprintf(refused, refused_len, "%s", name);
    return KVS_ECONFIG;
}

kvs_status ssd_options_parse(const kvs_backend_option *options, uint64_t n_options, ssd_options *o,
                             char *why, size_t why_len, char *refused, size_t refused_len) {
    memset(o, 0, sizeof *o);
    o->stripe_bytes = 1ull << 20;
    o->replicas = 1;
    o->queue_depth = 128;
    o->write_inflight = 8;
    o->pread_threads = 2;
    o->write_buffer_bytes = 64ull << 20;
    o->engine = SSD_ENGINE_URING;
    o->io_timeout_ms = 30000;
    o->enospc_after = -1;
    o->device_bytes = -1;
    o->eio_path = -1;
    int seen[OPT_COUNT] = {0};
    for (uint64_t i = 0; i < n_options; i++) {
        const char *key = options[i].key ? options[i].key : "";
        const char *value = options[i].value ? options[i].value : "";
        if (strcmp(key, "path") == 0) {
            if (!*value) {
                snprintf(why, why_len, "a path is empty");
                return refuse(refused, refused_len, "path", o->n_paths);
            }
            if (o->n_paths == SSD_MAX_PATHS) {
                snprintf(why, why_len, "more than %d paths", SSD_MAX_PATHS);
                return refuse(refused, refused_len, "path", o->n_paths);
            }
            o->paths[o->n_paths++] = value;
            continue;
        }
        int which = kvs_option_index(NAMES, OPT_COUNT, seen, key, VALID_OPTIONS, why, why_len);
        if (which < 0 || parse_one((unsigned)which, value, o, why, why_len) != 0)
            return refuse(refused, refused_len, key, -1);
    }
    if (o->n_paths == 0) {
        snprintf(why, why_len, "needs at least one path (YAML `paths: [/mnt/nvme0/kvs, ...]`)");
        return refuse(refused, refused_len, "path", -1);
    }
    if (o->replicas > o->n_paths) {
        snprintf(why, why_len, "replicas %u needs at least %u paths; %u given", o->replicas,
                 o->replicas, o->n_paths);
        return refuse(refused, refused_len, "replicas", -1);
    }
    if (!seen[OPT_WRITE_INFLIGHT] && o->write_inflight >= o->queue_depth)
        o->write_inflight = o->queue_depth - 1;
    if (o->write_inflight >= o->queue_depth) {
        snprintf(why, why_len,
                 "write_inflight %u must be below queue_depth %u (reads need room in the ring)",
                 o->write_inflight, o->queue_depth);
        return refuse(refused, refused_len, "write_inflight", -1);
    }
    if (o->eio_path >= 0 && (uint32_t)o->eio_path >= o->n_paths) {
        snprintf(why, why_len, "fault_inject eio_path:%d names no path (there are %u)", o->eio_path,
                 o->n_paths);
        return refuse(refused, refused_len, "fault_inject", -1);
    }
    return KVS_OK;
}
