/* dram_index.c - a published index (dram_index.h) over a dram tier in shared memory: one small
 * entry per key, held keys under the key itself, records of keys passed down under a key derived
 * from it (so a lookup's contains and pin see only what the owner holds). */
#include "dram_index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dram.h"

#define ENTRY_MAGIC 0x49535653u /* "KVSI" */
#define HELD_BYTES  8u
#define PASSED_BYTES \
    16u /* a record is longer than a held entry, so usage tells the two apart by bytes */

typedef struct entry {
    uint32_t magic;
    uint16_t codec;
    uint16_t reserved;
    uint64_t pad; /* a record's length only */
} entry;

struct kvs_dram_index {
    const kvs_backend_ops *ops;
    void *tier;
    kvs_backend_host host;
    const kvs_backend_host *owner_host;
};

static void index_log(void *ctx, int level, const char *message) {
    const kvs_dram_index *ix = ctx;
    if (ix->owner_host && ix->owner_host->log)
        ix->owner_host->log(ix->owner_host->ctx, level, message);
}

/* A full index drops its least recent entry: nothing to write back. */
static void index_evicted(void *ctx, const kvs_key *key, const void *object, uint64_t len) {
    (void)ctx, (void)key, (void)object, (void)len;
}

/* The key a record of `key` is published under: one bit pattern no chunk key is expected to share
 * (keys are 128-bit hashes). */
static kvs_key record_key(const kvs_key *key) {
    kvs_key r = *key;
    for (int i = 0; i < 16; i++) r.bytes[i] ^= (uint8_t)(0xa5 + 17 * i);
    return r;
}

kvs_status kvs_dram_index_open(const char *shm_name, uint64_t entries, const char *tier_name,
                               const kvs_backend_host *host, kvs_dram_index **out, char *error,
                               size_t error_len) {
    if (!shm_name || !out) return KVS_EINVAL;
    *out = NULL;
    if (entries < KVS_DRAM_INDEX_MIN_ENTRIES) entries = KVS_DRAM_INDEX_MIN_ENTRIES;
    kvs_dram_index *ix = calloc(1, sizeof *ix);
    if (!ix) {
        snprintf(error, error_len, "out of memory for a published index");
        return KVS_ENOMEM;
    }
    ix->ops = kvs_dram_backend();
    ix->owner_host = host;
    ix->host = (kvs_backend_host){
        .struct_size = sizeof ix->host, .ctx = ix, .log = index_log, .on_evict = index_evicted};
    char name[128], why[512] = "";
    snprintf(name, sizeof name, "%s index", tier_name ? tier_name : "tier");
    /* a process stopped while it holds the index's lock (SIGSTOP, a debugger) costs the others a
     * second per call, never a hang: a publish then fails (a later miss), a pin check says no */
    kvs_backend_option opt[] = {{"shm_name", shm_name}, {"lock_timeout_ms", "1000"}};
    kvs_backend_init init = {.struct_size = sizeof init,
                             .tier_name = name,
                             .capacity_bytes = entries * 64u, /* a cache line per entry */
                             .max_object_bytes = PASSED_BYTES,
                             .options = opt,
                             .n_options = 2,
                             .host = &ix->host,
                             .error = why,
                             .error_len = sizeof why};
    kvs_status rc = ix->ops->create(&init, &ix->tier);
    if (rc != KVS_OK) {
        snprintf(error, error_len, "its index in shared memory \"%s\": %s", shm_name, why);
        free(ix);
        return rc;
    }
    *out = ix;
    return KVS_OK;
}

void kvs_dram_index_close(kvs_dram_index *ix) {
    if (!ix) return;
    ix->ops->destroy(ix->tier);
    free(ix);
}

void kvs_dram_index_held(kvs_dram_index *ix, const kvs_key *key, uint16_t codec) {
    if (!ix) return;
    entry e = {.magic = ENTRY_MAGIC, .codec = codec};
    kvs_key r = record_key(key);
    (void)ix->ops->remove(ix->tier, &r);
    /* A failure (every entry pinned) leaves the key unpublished: a lookup misses it. */
    (void)ix->ops->put(ix->tier, key, &e, HELD_BYTES);
}

void kvs_dram_index_passed(kvs_dram_index *ix, const kvs_key *key, uint16_t codec) {
    if (!ix) return;
    entry e = {.magic = ENTRY_MAGIC, .codec = codec};
    kvs_key r = record_key(key);
    (void)ix->ops->remove(ix->tier, key);
    (void)ix->ops->put(ix->tier, &r, &e, PASSED_BYTES);
}

void kvs_dram_index_forget(kvs_dram_index *ix, const kvs_key *key) {
    if (!ix) return;
    kvs_key r = record_key(key);
    (void)ix->ops->remove(ix->tier, key);
    (void)ix->ops->remove(ix->tier, &r);
}

int kvs_dram_index_pinned(kvs_dram_index *ix, const kvs_key *key) {
    int pinned = 0;
    /* An index it cannot lock (a holder died mid-repair) pins nothing: the owner's own pins stand */
    if (ix && kvs_dram_pinned(ix->tier, key, &pinned) != KVS_OK) return 0;
    return pinned;
}

kvs_status kvs_dram_index_contains(kvs_dram_index *ix, const kvs_key *keys, uint64_t n,
                                   uint64_t *n_present) {
    return ix->ops->contains(ix->tier, keys, n, n_present);
}

kvs_status kvs_dram_index_pin(kvs_dram_index *ix, const kvs_key *keys, uint64_t n,
                              uint64_t timeout_ms, uint64_t *n_pinned) {
    return ix->ops->pin(ix->tier, keys, n, timeout_ms, n_pinned);
}

kvs_status kvs_dram_index_unpin(kvs_dram_index *ix, const kvs_key *keys, uint64_t n) {
    return ix->ops->unpin(ix->tier, keys, n);
}

static uint16_t codec_under(kvs_dram_index *ix, const kvs_key *key, int *found) {
    entry e;
    uint64_t len = 0;
    *found = ix->ops->get(ix->tier, key, &e, sizeof e, &len) == KVS_OK && len >= HELD_BYTES &&
             e.magic == ENTRY_MAGIC;
    return *found ? e.codec : 0;
}

kvs_status kvs_dram_index_codecs(kvs_dram_index *ix, const kvs_key *keys, uint64_t n,
                                 uint16_t *codecs) {
    if (!ix || ((!keys || !codecs) && n)) return KVS_EINVAL;
    for (uint64_t i = 0; i < n; i++) {
        int found = 0;
        codecs[i] = codec_under(ix, &keys[i], &found);
        if (!found) {
            kvs_key r = record_key(&keys[i]);
            codecs[i] = codec_under(ix, &r, &found);
        }
    }
    return KVS_OK;
}

uint32_t kvs_dram_index_caps(const kvs_dram_index *ix) {
    return ix ? KVS_BACKEND_CAP_SHARED | KVS_BACKEND_CAP_PUBLISHED : 0;
}

kvs_status kvs_dram_index_usage(kvs_dram_index *ix, uint64_t *n_held) {
    uint64_t n = 0, bytes = 0;
    if (!ix || !n_held) return KVS_EINVAL;
    kvs_status rc = ix->ops->usage(ix->tier, &n, &bytes);
    if (rc != KVS_OK) return rc;
    /* held * 8 + passed * 16 = bytes, held + passed = n */
    uint64_t passed = bytes / HELD_BYTES > n ? bytes / HELD_BYTES - n : 0;
    *n_held = n > passed ? n - passed : 0;
    return KVS_OK;
}
