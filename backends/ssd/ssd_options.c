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

/* "enospc_after:N,eio_path:K,eio_after:N,device_bytes:N,device_path:K" */
static int parse_faults(const char *text, void *out, uint64_t nth, char *why, size_t why_len) {
    ssd_options *o = out;
    char buf[256];
    (void)nth;
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
                     "eio_after, device_bytes, device_path)",
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
        else if (strcmp(item, "device_path") == 0)
            o->device_path = (int32_t)v;
        else {
            snprintf(why, why_len,
                     "fault_inject has no fault \"%.40s\" (enospc_after, eio_path, eio_after, "
                     "device_bytes, device_path)",
                     item);
            return -1;
        }
    }
    return 0;
}

static int parse_path(const char *value, void *out, uint64_t nth, char *why, size_t why_len) {
    ssd_options *o = out;
    (void)nth;
    if (!*value) {
        snprintf(why, why_len, "a path is empty");
        return -1;
    }
    if (o->n_paths == SSD_MAX_PATHS) {
        snprintf(why, why_len, "more than %d paths", SSD_MAX_PATHS);
        return -1;
    }
    o->paths[o->n_paths++] = value;
    return 0;
}

/* The options, by name (YAML `paths:` arrive as repeated `path`), and where each goes. */
enum {
    OPT_PATH,
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
static const kvs_option_desc OPTIONS[OPT_COUNT] = {
    [OPT_PATH] = {.name = "path", .kind = KVS_OPTION_CUSTOM, .repeated = 1, .parse = parse_path},
    [OPT_STRIPE_BYTES] = {.name = "stripe_bytes",
                          .kind = KVS_OPTION_SIZE,
                          KVS_OPTION_FIELD(ssd_options, stripe_bytes),
                          .min = SSD_BLOCK,
                          .max = SSD_MAX_STRIPE_BYTES,
                          .multiple = SSD_BLOCK,
                          .example = "1MiB"},
    [OPT_REPLICAS] = {.name = "replicas",
                      .kind = KVS_OPTION_COUNT,
                      KVS_OPTION_FIELD(ssd_options, replicas),
                      .min = 1,
                      .max = SSD_MAX_REPLICAS},
    [OPT_QUEUE_DEPTH] = {.name = "queue_depth",
                         .kind = KVS_OPTION_COUNT,
                         KVS_OPTION_FIELD(ssd_options, queue_depth),
                         .min = 2,
                         .max = SSD_MAX_QUEUE_DEPTH},
    [OPT_WRITE_INFLIGHT] = {.name = "write_inflight",
                            .kind = KVS_OPTION_COUNT,
                            KVS_OPTION_FIELD(ssd_options, write_inflight),
                            .min = 1,
                            .max = SSD_MAX_QUEUE_DEPTH},
    [OPT_WRITE_BUFFER_BYTES] = {.name = "write_buffer_bytes",
                                .kind = KVS_OPTION_SIZE,
                                KVS_OPTION_FIELD(ssd_options, write_buffer_bytes),
                                .min = 1,
                                .example = "64MiB"},
    [OPT_IO_ENGINE] = {.name = "io_engine", /* SSD_ENGINE_URING 0, SSD_ENGINE_PREAD 1 */
                       .kind = KVS_OPTION_CHOICE,
                       KVS_OPTION_FIELD(ssd_options, engine),
                       .choices = "uring|pread"},
    [OPT_PREAD_THREADS] = {.name = "pread_threads",
                           .kind = KVS_OPTION_COUNT,
                           KVS_OPTION_FIELD(ssd_options, pread_threads),
                           .min = 1,
                           .max = 64},
    [OPT_IO_TIMEOUT_MS] = {.name = "io_timeout_ms",
                           .kind = KVS_OPTION_MILLISECONDS,
                           KVS_OPTION_FIELD(ssd_options, io_timeout_ms),
                           .min = 1,
                           .max = 24ull * 3600 * 1000},
    [OPT_SIM_BANDWIDTH] = {.name = "sim_bandwidth",
                           .kind = KVS_OPTION_RATE,
                           KVS_OPTION_FIELD(ssd_options, sim_bandwidth),
                           .min = 1,
                           .example = "250MB/s"},
    [OPT_SIM_IOPS] = {.name = "sim_iops",
                      .kind = KVS_OPTION_COUNT,
                      KVS_OPTION_FIELD(ssd_options, sim_iops),
                      .min = 1,
                      .max = 1000000000ull},
    [OPT_FAULT_INJECT] = {.name = "fault_inject", .kind = KVS_OPTION_CUSTOM, .parse = parse_faults},
};
_Static_assert(SSD_ENGINE_URING == 0 && SSD_ENGINE_PREAD == 1, "io_engine's choices are in order");

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
    o->device_path = -1;
    uint32_t given[OPT_COUNT] = {0};
    kvs_status rc = kvs_options_parse(OPTIONS, OPT_COUNT, options, n_options, o, given, why,
                                      why_len, refused, refused_len);
    if (rc != KVS_OK) return rc;
    if (o->n_paths == 0) {
        snprintf(why, why_len, "needs at least one path (YAML `paths: [/mnt/nvme0/kvs, ...]`)");
        return kvs_options_refuse(refused, refused_len, "path", -1);
    }
    if (o->replicas > o->n_paths) {
        snprintf(why, why_len, "replicas %u needs at least %u paths; %u given", o->replicas,
                 o->replicas, o->n_paths);
        return kvs_options_refuse(refused, refused_len, "replicas", -1);
    }
    if (!given[OPT_WRITE_INFLIGHT] && o->write_inflight >= o->queue_depth)
        o->write_inflight = o->queue_depth - 1;
    if (o->write_inflight >= o->queue_depth) {
        snprintf(why, why_len,
                 "write_inflight %u must be below queue_depth %u (reads need room in the ring)",
                 o->write_inflight, o->queue_depth);
        return kvs_options_refuse(refused, refused_len, "write_inflight", -1);
    }
    if (o->eio_path >= 0 && (uint32_t)o->eio_path >= o->n_paths) {
        snprintf(why, why_len, "fault_inject eio_path:%d names no path (there are %u)", o->eio_path,
                 o->n_paths);
        return kvs_options_refuse(refused, refused_len, "fault_inject", -1);
    }
    if (o->device_path >= 0 && ((uint32_t)o->device_path >= o->n_paths || o->device_bytes < 0)) {
        snprintf(why, why_len,
                 "fault_inject device_path:%d needs device_bytes and a path (there are %u)",
                 o->device_path, o->n_paths);
        return kvs_options_refuse(refused, refused_len, "fault_inject", -1);
    }
    return KVS_OK;
}
