/*
 * kvstrata_store.h - the store API: batches of exists, get, put and remove by the engine's own
 * keys, into and out of the engine's own buffers, for engines that are not shaped like vLLM
 * (SGLang's HiCache, LMCache, any C engine). docs/store.md is the contract in prose.
 *
 * Reached from the one exported entry point: kvs_get_api(1)->store_api(KVS_STORE_ABI_MAJOR)
 * (kvs_api since 1.12). The table has its own version: a minor appends fields and calls only
 * (check struct_size), and a struct passed in is read up to its struct_size.
 *
 * Keys are the engine's bytes (1..KVS_STORE_KEY_MAX each). Each is hashed with the store's
 * namespace (the engine's model and layout, its own bytes) and tenant into a 128-bit kvstrata key,
 * so every tier of the YAML's chain serves the store unchanged, and two namespaces or two tenants
 * never meet. A value is stored as a checksummed object: a get checks its header before copying
 * and its checksum as it copies; a damaged one is that key's KVS_ECORRUPT (its buffers then hold
 * undefined bytes, never reported as loaded) and is removed from every tier.
 *
 * Threading: every call may come from any thread at once on one store. Gets, puts, exists and
 * removes submitted as batches run on the store's threads; each ends with a ticket the caller
 * collects (wait, or the event fd and drain). Ownership: keys are copied at the call; the buffers
 * of a get or put are the library's until its ticket completes.
 */
#ifndef KVSTRATA_STORE_H
#define KVSTRATA_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_STORE_ABI_MAJOR 1
#define KVS_STORE_ABI_MINOR 0

#define KVS_STORE_KEY_MAX       1024u  /* bytes of one engine key */
#define KVS_STORE_NAMESPACE_MAX 4096u  /* bytes of a namespace */
#define KVS_STORE_TENANT_MAX    64u    /* bytes of a tenant name */
#define KVS_STORE_BATCH_MAX     65536u /* keys in one call */

typedef struct kvs_store kvs_store; /* opaque */

typedef struct kvs_store_open_params {
    uint32_t struct_size;    /* sizeof(kvs_store_open_params) */
    uint32_t threads;        /* threads running batches; 0: 2 */
    const char *config_path; /* YAML file (docs/configuration.md); NULL: one 1 GiB DRAM tier */
    /* The engine's model and KV layout (model name, dtype, page size, layout, TP rank where the
     * values differ by rank): values put under one namespace are never found under another */
    const void *namespace_bytes;
    uint64_t namespace_len; /* 1..KVS_STORE_NAMESPACE_MAX */
    const char *tenant;     /* NULL or "": no tenant; else up to KVS_STORE_TENANT_MAX bytes */
    /* The largest value put (0: 4 MiB). Set it to the engine's page: a DRAM tier gives every
     * object a slab of this size and a 4 KiB header, an SSD tier a slot */
    uint64_t max_value_bytes;
    uint32_t event_capacity; /* events kept for take_events (oldest dropped first); 0: none */
    uint32_t reserved;
} kvs_store_open_params;
#define KVS_STORE_OPEN_PARAMS_SIZE_1_0 56u

/* A batch of keys: key i is data[offsets[i] .. offsets[i + 1]), offsets has n + 1 entries. */
typedef struct kvs_store_keys {
    const void *data;
    const uint64_t *offsets;
    uint64_t n;
} kvs_store_keys;

/* One piece of a value in the caller's memory. */
typedef struct kvs_store_iov {
    void *base;
    uint64_t len;
} kvs_store_iov;

/* The buffers of a batch: key i's value is iov[seg[i] .. seg[i + 1]) in order (seg has n + 1
 * entries, seg[0] = 0). A put stores their concatenation; a get fills them from the start. */
typedef struct kvs_store_sg {
    const kvs_store_iov *iov;
    const uint64_t *seg;
} kvs_store_sg;

/* What exists answers for one key. */
#define KVS_STORE_ABSENT  0
#define KVS_STORE_PRESENT 1
#define KVS_STORE_UNKNOWN 2 /* only a tier across the network could tell (KVS_STORE_LOCAL) */

/* flags of exists and submit */
#define KVS_STORE_LOCAL     (1u << 0) /* exists: ask no tier across the network (type remote) */
#define KVS_STORE_ALL       (1u << 1) /* exists: answer every key, not only the leading run */
#define KVS_STORE_OVERWRITE (1u << 2) /* put: replace the value when the key is present */

/* What became of one key of a submitted batch. Frozen for major 1 (wait fills an array). */
typedef struct kvs_store_result {
    int32_t status; /* kvs_status: KVS_OK, or this key's failure */
    /* get and exists: the tier that held it; put: the tier it went to (a tier whose room is all
     * pinned passes a put down); KVS_STORE_NO_TIER when none can say */
    uint16_t tier;
    uint16_t flags; /* KVS_STORE_SKIPPED ... */
    uint64_t bytes; /* get: the value's length (also on KVS_EOVERFLOW: what was needed) */
} kvs_store_result;
#define KVS_STORE_SKIPPED 1u /* put: the key was present, nothing was written */
#define KVS_STORE_NO_TIER UINT16_MAX

/* The kinds of submitted batches. */
#define KVS_STORE_OP_GET    1
#define KVS_STORE_OP_PUT    2
#define KVS_STORE_OP_EXISTS 3 /* each key's result: KVS_OK present, KVS_ENOTFOUND absent */
#define KVS_STORE_OP_REMOVE 4

/* Registered memory: where a batch's buffers lie. */
#define KVS_STORE_MEM_HOST 0
#define KVS_STORE_MEM_CUDA 1

/* One tier as this store sees it (usage). */
typedef struct kvs_store_tier_usage {
    uint32_t struct_size;
    uint32_t tier;
    char name[64];
    uint64_t objects, bytes; /* what the tier holds, every tenant's (its backend's count) */
    uint64_t capacity;       /* 0 where the tier has none */
    /* this store's own traffic (its tenant, its namespace, this process) */
    uint64_t hits, hit_bytes, puts, put_bytes;
} kvs_store_tier_usage;
#define KVS_STORE_TIER_USAGE_SIZE_1_0 128u

typedef struct kvs_store_stats {
    uint32_t struct_size;
    uint32_t n_tiers;
    uint64_t gets, get_hits, get_misses, get_bytes, get_ns;
    uint64_t puts, puts_stored, puts_skipped, puts_failed, put_bytes, put_ns;
    uint64_t exists_keys, exists_present;
    uint64_t removes;
    uint64_t corrupt;           /* objects that failed their check (each then removed) */
    uint64_t batches_in_flight; /* a gauge */
    uint64_t events_dropped;    /* events the ring had no room for */
} kvs_store_stats;
#define KVS_STORE_STATS_SIZE_1_0 144u

/* A cache event (take_events): a record of KVS_STORE_EVENT_BYTES + key_len bytes; the next starts
 * at the following multiple of 8. */
typedef struct kvs_store_event {
    uint8_t kind; /* KVS_EVENT_STORED, KVS_EVENT_REMOVED (kvstrata.h) */
    uint8_t reserved;
    uint16_t tier;
    uint32_t key_len;  /* 0: the key was not put by this store (only key16 names it) */
    uint8_t key16[16]; /* kvstrata's key */
    /* followed by key_len bytes: the engine's key */
} kvs_store_event;
#define KVS_STORE_EVENT_BYTES 24u

typedef struct kvs_store_api {
    uint32_t abi_major, abi_minor, struct_size, reserved;

    /* Open a store on a configuration's tiers. On failure *out is NULL and error says why. */
    kvs_status (*open)(const kvs_store_open_params *params, kvs_store **out, char *error,
                       size_t error_len);
    /* Waits for the batches in flight (uncollected tickets are dropped), closes the tiers. The
     * last call on s: no other thread may be inside a call on it. NULL is a no-op. */
    void (*close)(kvs_store *s);
    /* The calling thread's last error on s, "" if none. Valid until that thread's next call. */
    const char *(*last_error)(const kvs_store *s);

    /* Memory the engine will pass buffers in, once: a host pool (device: KVS_STORE_MEM_CUDA and its
     * ordinal). Buffers outside registered memory are accepted too; a registered range lets a tier
     * move bytes without staging where it can. *region names it for unregister_memory. */
    kvs_status (*register_memory)(kvs_store *s, void *base, uint64_t len, uint32_t mem_kind,
                                  int32_t device_index, uint64_t *region);
    kvs_status (*unregister_memory)(kvs_store *s, uint64_t region);

    /* Which keys are stored, at once. *n_leading gets the length of the leading run of present
     * keys. states (NULL: not wanted) gets KVS_STORE_* for each key up to the first absent one, or
     * for every key with KVS_STORE_ALL. pin_ms > 0 pins the leading run where it is for that long
     * (at most an hour; a lease: unpin or the time ends it), so a get that follows finds it. */
    kvs_status (*exists)(kvs_store *s, const kvs_store_keys *keys, uint32_t flags, uint64_t pin_ms,
                         uint8_t *states, uint64_t *n_leading);
    kvs_status (*unpin)(kvs_store *s, const kvs_store_keys *keys);

    /* Start a batch: op KVS_STORE_OP_*; sg for gets and puts (NULL otherwise); flags as above.
     * *ticket names it. Failing keys fail alone, in their results (a failed get leaves that key's
     * buffers undefined: the checksum is checked as the bytes are copied); the call itself fails
     * only for wrong arguments (KVS_EINVAL, nothing started) or a closing store (KVS_ESTATE). */
    kvs_status (*submit)(kvs_store *s, uint32_t op, const kvs_store_keys *keys,
                         const kvs_store_sg *sg, uint32_t flags, uint64_t *ticket);
    /* Wait at most timeout_ms (UINT64_MAX: no bound) for ticket; then copy its n results into
     * results (cap entries, NULL: not wanted) and release it. KVS_ETIMEDOUT: not done yet (ticket
     * kept); KVS_ENOTFOUND: no such ticket (or collected). *n_failed (NULL: not wanted) gets how
     * many keys did not succeed (a get's miss counts). */
    kvs_status (*wait)(kvs_store *s, uint64_t ticket, uint64_t timeout_ms,
                       kvs_store_result *results, uint64_t cap, uint64_t *n_failed);
    /* A file descriptor that becomes readable when a batch completes (an eventfd: reading it
     * resets it). Owned by the store. */
    int (*event_fd)(kvs_store *s);
    /* Tickets completed and not drained before, oldest submitted first, up to cap; collect each
     * with wait (timeout 0). A ticket collected by wait before is never drained. */
    kvs_status (*drain)(kvs_store *s, uint64_t *tickets, uint64_t cap, uint64_t *n);

    /* Tiers of the chain (the first `cap`), with this store's traffic in each. */
    kvs_status (*usage)(kvs_store *s, kvs_store_tier_usage *out, uint32_t cap, uint32_t *n);
    kvs_status (*stats)(kvs_store *s, kvs_store_stats *out);
    /* Events in order into buf[0..cap) (kvs_store_event records); *n events, *len bytes. An event
     * that does not fit stays for the next call (KVS_EOVERFLOW when not even the first fits). */
    kvs_status (*take_events)(kvs_store *s, void *buf, uint64_t cap, uint64_t *len, uint64_t *n);
} kvs_store_api;

#ifdef __cplusplus
}
#endif
#endif /* KVSTRATA_STORE_H */
