/* ssd_tier.h - ssd tiers for test_ssd and test_ssd_recovery: directories that stand for devices,
 * opening a tier over them, storing and checking objects, and what the tier logged. Not thread-safe
 * except kvs_test_ssd_log_contains and the log the tiers write into. */
#ifndef KVS_TEST_SSD_TIER_H
#define KVS_TEST_SSD_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "backends/ssd/ssd.h"

#define KVS_TEST_SSD_MAX_PATHS 4

/* Directories dir[0..KVS_TEST_SSD_MAX_PATHS) under one temporary root. */
typedef struct kvs_test_dirs {
    char root[256];
    char dir[KVS_TEST_SSD_MAX_PATHS][320];
} kvs_test_dirs;

/* A tier over the first n_paths directories, named "ssd0" unless name is set, with the host
 * kvs_test_ssd_host (its log captured) unless host is set. */
typedef struct kvs_test_ssd_args {
    uint32_t n_paths;
    uint64_t capacity, max_object;
    const char *options[12][2]; /* extra name/value pairs, NULL-terminated */
    const kvs_backend_host *host;
    void *staging;
    uint64_t staging_len;
    const char *name;
} kvs_test_ssd_args;

/* Object lengths at and around 4KiB-block and 16KiB-stripe boundaries, 0 included. */
#define KVS_TEST_SSD_N_LENGTHS 9
extern const uint64_t kvs_test_ssd_lengths[KVS_TEST_SSD_N_LENGTHS];

/* A host whose log lines kvs_test_ssd_log_contains searches. */
extern kvs_backend_host kvs_test_ssd_host;
/* The sentence the last kvs_test_ssd_try_open wrote when create failed ("" otherwise). */
extern char kvs_test_ssd_error[512];

/* Check fixture: forget what was logged. */
void kvs_test_ssd_setup(void);
/* 1 when a line the tier logged through kvs_test_ssd_host holds needle. */
int kvs_test_ssd_log_contains(const char *needle);

/* Make the directories (asserting). */
void kvs_test_ssd_dirs(kvs_test_dirs *d);
/* create a tier of a over d; *st is NULL on failure. */
kvs_status kvs_test_ssd_try_open(const kvs_test_dirs *d, const kvs_test_ssd_args *a, void **st);
/* The same, asserting that it opens. */
void *kvs_test_ssd_open(const kvs_test_dirs *d, const kvs_test_ssd_args *a);
/* put object i (len bytes of kvs_test_fill's seed i under kvs_test_key(i)), asserting it is taken. */
void kvs_test_ssd_put(void *st, uint32_t i, uint64_t len);
/* Wait (20 s at most, asserting) until every put so far is stored or dropped. */
void kvs_test_ssd_flush(void *st);
/* get object i into an aligned buffer; when KVS_OK, assert its length is want_len and its bytes
 * object i's. Returns the status. */
kvs_status kvs_test_ssd_get(void *st, uint32_t i, uint64_t want_len);
/* 1 when object i is stored, else 0 (asserting contains succeeds). */
uint64_t kvs_test_ssd_present(void *st, uint32_t i);
/* The tier's counters (asserting). */
kvs_ssd_stats_t kvs_test_ssd_stats(void *st);
/* len bytes (at least 4096) aligned to 4096, for free() (asserting). */
uint8_t *kvs_test_aligned_buffer(uint64_t len);

#endif
