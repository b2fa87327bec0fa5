/*
 * kvstrata_backend.h - the ABI between the connector and a tier backend.
 *
 * A tier is one instance of a backend. Built-in backends (dram, ...) implement this table, and a
 * backend can live in its own shared object named in YAML (`type: plugin`, `plugin: /path/x.so`).
 * Such a .so exports one symbol:
 *
 *     const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major);
 *
 * returning its table for that major version, or NULL. The connector refuses a table whose
 * abi_major differs from KVS_BACKEND_ABI_MAJOR or whose struct_size is smaller than the 1.0 table.
 *
 * Objects are opaque byte strings to a backend (the connector builds and verifies them). A backend
 * stores, finds, pins and evicts; it never decides policy beyond its own eviction order.
 *
 * Threading: the connector calls one tier from one thread at a time unless caps has
 * KVS_BACKEND_CAP_THREAD_SAFE. Buffers passed in are borrowed for the call.
 */
#ifndef KVSTRATA_BACKEND_H
#define KVSTRATA_BACKEND_H

#include <stddef.h>

#include "kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_BACKEND_ABI_MAJOR 1
#define KVS_BACKEND_ABI_MINOR 9

/* 128-bit chunk key: prefix-chained hash of the chunk's tokens, seeded with the fingerprint. */
typedef struct kvs_key {
    uint8_t bytes[16];
} kvs_key;

/* --- 1.5: what a tier that re-encodes its objects (type compress, docs/compress.md) is told --- */

/* At most this many encodings of one object (raw and the connector's lossy codecs). */
#define KVS_BACKEND_MAX_ENCODINGS 8

/* One way an object can be stored. id names it to the host (0: raw; the host's own numbers for its
 * lossy codecs); codec is what the object's header will say (0 raw, 1 KIVI, 2 INT8). */
typedef struct kvs_backend_encoding {
    uint32_t id;
    uint16_t codec;
    uint8_t bits; /* KIVI 2 or 4, INT8 8, raw 0 */
    /* KVS_BACKEND_ENC_* (0 from hosts before token dropping: the field was reserved) */
    uint8_t flags;
    uint64_t bytes; /* the object's length in this encoding */
    double quality; /* the host's estimate in [0, 1]; 1 for raw */
} kvs_backend_encoding;

/* An encoding made only from the object as it was put (token dropping: its kept rows are exact), so
 * an object already re-encoded never takes it, and an object in it is never re-encoded. A tier that
 * ignores the flag asks for such an encoding in vain (`encode` refuses it). */
#define KVS_BACKEND_ENC_FROM_PUT_ONLY 1u

/* One stored object, as a tier asks the host to place it. */
typedef struct kvs_backend_place_entry {
    uint64_t raw_bytes; /* its length raw */
    double hits_per_s;  /* how often it is read; < 0 when not known yet (a new object) */
    uint32_t n_encodings;
    uint32_t allowed; /* bit e: it may be stored as encodings[e] */
    uint32_t devices; /* bit 0: this tier may hold it; bit 1: the next tier may */
    uint32_t reserved;
    kvs_backend_encoding encodings[KVS_BACKEND_MAX_ENCODINGS];
} kvs_backend_place_entry;

/* The two places a compressing tier chooses between: itself (0) and the next tier (1). */
typedef struct kvs_backend_devices {
    double latency_s[2];
    double bytes_per_s[2];
    uint64_t capacity[2];
    double recompute_s; /* what a hit costs when the object is stored nowhere */
} kvs_backend_devices;

/* Where the host puts one entry: device 0 or 1, or -1 (stored nowhere), as encodings[encoding]. */
typedef struct kvs_backend_place_choice {
    int8_t device;
    uint8_t encoding;
} kvs_backend_place_choice;

typedef struct kvs_backend_option {
    const char *key;   /* option name as written in YAML under `options:` */
    const char *value; /* its scalar value as written */
} kvs_backend_option;

#define KVS_LOG_ERROR 0
#define KVS_LOG_WARN  1
#define KVS_LOG_INFO  2
#define KVS_LOG_DEBUG 3

/* Services the connector offers a backend. Valid from create until destroy. */
typedef struct kvs_backend_host {
    uint32_t struct_size;
    void *ctx; /* pass back as the first argument */
    void (*log)(void *ctx, int level, const char *message);
    /* Called by the backend when it drops an object to make room, before the bytes are reused, so
     * the connector can write it back to the next tier. Must not call back into the backend.
     * object may be NULL (len 0) when the backend does not hold the bytes in memory (a device
     * tier): the eviction is then counted and reported, and nothing is written back. */
    void (*on_evict)(void *ctx, const kvs_key *key, const void *object, uint64_t len);

    /* --- 1.1: placement and retrieval policy for tiers over several devices (the connector takes
     * them from schedulers/, so backends and schedulers stay independent). NULL when absent. --- */

    /* Where the units of one object go: unit u's copy r is written to path
     * paths_out[u * replicas + r]. *pointer is the tier's global stripe pointer (start 0; keep it
     * or rebuild it as you like): the policy reads and advances it. */
    void (*place)(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                  uint32_t replicas, uint32_t *paths_out);
    /* One step's reads: each read r may be served by any of its n_copies paths
     * (paths[r * max_copies + c]). The policy writes the path it chose for read r into chosen[r]
     * and a submission order (a permutation of 0..n) into order, interleaved across paths so one
     * batched submission keeps every device busy. Duplicate (key, unit) reads must already be
     * merged by the caller. */
    void (*schedule)(void *ctx, uint32_t n_paths, uint64_t n, uint32_t max_copies,
                     const uint32_t *n_copies, const uint32_t *paths, uint32_t *chosen,
                     uint64_t *order);

    /* --- 1.3 --- */
    /* A backend that stores after put returned (a device tier writing in the background) calls this
     * when such an object could not be stored after all: why is KVS_ENOMEM when no room could be
     * made (the device is full and nothing could be evicted), KVS_EIO when the device failed. The
     * connector counts it as a skipped save. May run on a backend thread under the backend's lock:
     * must not call back into the backend. NULL when absent. */
    void (*on_put_dropped)(void *ctx, const kvs_key *key, kvs_status why);

    /* --- 1.5: for a tier that re-encodes its objects. NULL when the connector cannot (a chain
     * opened without a model, as kvstrata-node's): such a tier refuses to open. --- */
    /* The encodings a raw object (len bytes, as put gave it) can take: out[0] is the object as it
     * is, the others what the host could encode it into, with their lengths and estimated quality;
     * *n gets how many (at most cap). KVS_ENOTSUP for a lossy object (a tier keeps those raw-first
     * choices it made itself), KVS_ECORRUPT for an object the host cannot read (another model's
     * geometry, a bad header checksum). Thread-safe, pure. */
    kvs_status (*encodings)(void *ctx, const void *object, uint64_t len, kvs_backend_encoding *out,
                            uint32_t cap, uint32_t *n);
    /* Encode object (raw, or lossy into a smaller encoding: decoded whole first) into encoding id
     * at dst (cap bytes); *out_len gets its length. The result is a sealed object of the same key
     * that the connector's loads read. Thread-safe, pure. */
    kvs_status (*encode)(void *ctx, const void *object, uint64_t len, uint32_t id, void *dst,
                         uint64_t cap, uint64_t *out_len);
    /* Place entries[0..n) over devices: out[i] for entry i, under both capacities (the host's
     * policy: `placement:` in the YAML). Thread-safe, pure. */
    kvs_status (*plan)(void *ctx, const kvs_backend_place_entry *entries, uint64_t n,
                       const kvs_backend_devices *devices, kvs_backend_place_choice *out);
    /* How often the tier re-places what it holds (`placement.reevaluate_ms`). */
    uint64_t reevaluate_ms;
} kvs_backend_host;

typedef struct kvs_backend_init {
    uint32_t struct_size;
    const char *tier_name;             /* from YAML, for messages */
    uint64_t capacity_bytes;           /* from YAML `capacity`; 0 when the tier has none */
    uint64_t max_object_bytes;         /* no object put into this tier is larger */
    const kvs_backend_option *options; /* the tier's `options:` map, in file order */
    uint64_t n_options;
    const kvs_backend_host *host;
    char *error; /* create writes a sentence here on failure (NUL-terminated) */
    uint64_t error_len;

    /* --- 1.1 --- */
    /* The worker's staging pool: every dst given to get/get_many and every object given to put by
     * the connector lies in it, 4 KiB aligned. A backend may register it once (io_uring fixed
     * buffers, ucp_mem_map). NULL/0 on a scheduler-only handle. Valid until destroy. */
    void *staging_base;
    uint64_t staging_len;

    /* --- 1.3 --- */
    /* When create refuses its configuration (KVS_ECONFIG) it names here what it refused, so the
     * connector can point at that line of the YAML: an option's name as given (`read_latency_us`,
     * also one it does not know, or one it needs and did not get), the k-th entry of a repeated
     * option as `path[k]` (k from 0, in the order given), or a tier key (`capacity`). NUL-ended,
     * at most error_option_len bytes; left empty when no one option is at fault. NULL/0 from a 1.2
     * connector: a backend checks struct_size before writing it. */
    char *error_option;
    uint64_t error_option_len;
} kvs_backend_init;

#define KVS_BACKEND_CAP_ZERO_COPY            (1u << 0) /* get_ref is implemented */
#define KVS_BACKEND_CAP_THREAD_SAFE          (1u << 1)
/* Visible to every process that opens the same tier (a table's caps, or 1.8 instance_caps when
 * it depends on the options: a dram tier with shm_name) */
#define KVS_BACKEND_CAP_SHARED               (1u << 2)
#define KVS_BACKEND_CAP_RESERVE              (1u << 3) /* 1.1: reserve/commit/abort implemented */
#define KVS_BACKEND_CAP_MEMORY               (1u << 4) /* 1.1: memory is implemented */
#define KVS_BACKEND_CAP_GET_MANY             (1u << 5) /* 1.1: get_many is implemented */
#define KVS_BACKEND_CAP_GET_RANGE            (1u << 6) /* 1.2: get_range is implemented */
/* 1.4: get_many_start and get_many_finish are implemented */
#define KVS_BACKEND_CAP_GET_MANY_ASYNC       (1u << 7)
#define KVS_BACKEND_CAP_CODECS               (1u << 8) /* 1.5: codecs is implemented */
#define KVS_BACKEND_CAP_PUT_RANGE            (1u << 9) /* 1.6: put_range is implemented */
/* 1.6: a put this tier refuses for room (KVS_ENOMEM) is the next tier's: the connector puts the
 * object there instead (a save, or a write-back from above), as if the tier were not in the chain
 * for it. For a tier whose room comes and goes (memory another process lends). */
#define KVS_BACKEND_CAP_SPILLS               (1u << 10)
/* 1.6: calls host->on_evict from a thread of its own (not only inside the connector's calls): the
 * connector then refuses a chain with a tier below it that is not THREAD_SAFE. */
#define KVS_BACKEND_CAP_EVICTS_ON_ITS_THREAD (1u << 11)
/* Capabilities the connector's features choose a tier by (a flag, never the type name): */
/* 1.7: memory another process lends: it can host the layer stream cache (kvs_api.lsc_reserve) */
#define KVS_BACKEND_CAP_LENT_MEMORY          (1u << 12)
/* 1.7: objects striped over devices, so many small objects read in parallel: sparse decode's
 * cluster objects (kvs_sparse_params.layout SWARM and POSITIONS) are written there */
#define KVS_BACKEND_CAP_STRIPED              (1u << 13)
/* 1.7: objects on other machines: a lookup may wait for the network (loads.remote_lookups) */
#define KVS_BACKEND_CAP_REMOTE               (1u << 14)
/* 1.9 (instance_caps): the tier's bytes live in the process that opened it, and what it holds is
 * published for the engine's other processes (compress and peer_gpu with index_shm): the connector
 * tells it (remove) of a key a lookup found there and a load then found nowhere, so an entry its
 * process no longer backs (that process was restarted) is withdrawn. Keys must then be per process:
 * the connector refuses it for a model whose ranks share keys (MLA with tensor parallelism). */
#define KVS_BACKEND_CAP_PUBLISHED            (1u << 15)

typedef struct kvs_backend_ops {
    uint32_t abi_major;
    uint32_t abi_minor;
    uint32_t struct_size;
    uint32_t caps; /* KVS_BACKEND_CAP_* */
    const char *type_name;

    /* Create a tier. On failure returns a status, writes init->error and allocates nothing. */
    kvs_status (*create)(const kvs_backend_init *init, void **state);
    void (*destroy)(void *state);
    /* A sentence for the last failure on this state ("" if none). */
    const char *(*last_error)(void *state);

    /* *n_present = how many of keys[0..n), from the front, are stored (up to the first missing). */
    kvs_status (*contains)(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present);
    /* Pin keys[0..n) that are present, from the front, so eviction skips them for timeout_ms;
     * *n_pinned gets how many were pinned. Pins nest; each pin needs one unpin or expires. */
    kvs_status (*pin)(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                      uint64_t *n_pinned);
    /* Drop one pin from each key. Unpinning a key that holds none is a no-op (not an error). */
    kvs_status (*unpin)(void *state, const kvs_key *keys, uint64_t n);
    /* Copy the object into dst[0..cap). KVS_ENOTFOUND if absent; KVS_EOVERFLOW if cap is short. */
    kvs_status (*get)(void *state, const kvs_key *key, void *dst, uint64_t cap, uint64_t *len);
    /* CAP_ZERO_COPY: a pointer to the stored object, valid while the caller holds a pin on it. */
    kvs_status (*get_ref)(void *state, const kvs_key *key, const void **object, uint64_t *len);
    /* Store a copy of the object. Replaces an existing object of the same key. KVS_ENOMEM if it
     * cannot make room (everything pinned or the object exceeds capacity). */
    kvs_status (*put)(void *state, const kvs_key *key, const void *object, uint64_t len);
    /* Remove if present, pinned or not (the connector removes objects that failed verification);
     * absent is not an error. */
    kvs_status (*remove)(void *state, const kvs_key *key);
    /* Objects and bytes held now. */
    kvs_status (*usage)(void *state, uint64_t *n_objects, uint64_t *bytes);

    /* --- 1.1 (present when struct_size covers them and caps says so) --- */

    /* CAP_RESERVE: room for an object of len bytes that the connector writes in place (a device
     * gathers straight into it: no staging copy). *dst gets where to write, *ticket names the
     * reservation. The object is invisible (contains/get miss it) until commit; the room is never
     * evicted meanwhile. KVS_ENOMEM if no room can be made, as put. */
    kvs_status (*reserve)(void *state, const kvs_key *key, uint64_t len, void **dst,
                          uint64_t *ticket);
    /* Publish a reservation as the object for its key (replacing an unpinned one; when a pinned
     * object of the key exists the reservation is dropped instead, equal keys hold equal bytes). */
    kvs_status (*commit)(void *state, uint64_t ticket);
    /* Give a reservation's room back; nothing becomes visible. */
    kvs_status (*abort)(void *state, uint64_t ticket);
    /* CAP_MEMORY: the one range all objects live in, for registering with a device (CUDA pinned
     * host memory), io_uring or UCX. Valid from create until destroy. */
    kvs_status (*memory)(void *state, void **base, uint64_t *len);
    /* CAP_GET_MANY: get of n objects at once (one step's loads from this tier), so a backend over
     * several devices schedules and submits them together. dsts[i] has room for caps[i] bytes;
     * lens[i] and statuses[i] are filled per object as get would. Returns KVS_OK when the call
     * itself worked (per-object failures are in statuses). */
    kvs_status (*get_many)(void *state, const kvs_key *keys, void *const *dsts,
                           const uint64_t *caps, uint64_t n, uint64_t *lens, kvs_status *statuses);
    /* CAP_GET_RANGE (1.2): bytes [offset, offset + len) of the stored object into dst, so a reader
     * that needs some layers reads (and a device pays for) only those. *got gets the bytes copied
     * (fewer when the object ends first); *object_len the object's whole length. */
    kvs_status (*get_range)(void *state, const kvs_key *key, uint64_t offset, uint64_t len,
                            void *dst, uint64_t *got, uint64_t *object_len);

    /* --- 1.4 --- */
    /* CAP_GET_MANY_ASYNC: get_many in two halves, so that a caller keeps the next step's reads in
     * flight while this step's finish (a device's queue never drains between steps), or reads from
     * several tiers at once. get_many_start takes the objects (they cannot be evicted until the
     * finish), submits the reads and returns; *ticket names the call. keys may be reused as soon as
     * it returns; dsts, caps, lens and statuses belong to the call until get_many_finish(ticket)
     * returns, which waits for its reads and fills lens and statuses as get_many does. Calls may be
     * finished in any order, each exactly once: a ticket that is not in flight gets KVS_EINVAL.
     * destroy finishes the calls still in flight (their buffers must still be valid). On a failure
     * of the call itself, start returns it and no ticket is in flight. */
    kvs_status (*get_many_start)(void *state, const kvs_key *keys, void *const *dsts,
                                 const uint64_t *caps, uint64_t n, uint64_t *lens,
                                 kvs_status *statuses, uint64_t *ticket);
    kvs_status (*get_many_finish)(void *state, uint64_t ticket);

    /* --- 1.5 --- */
    /* CAP_CODECS: the codec (the object header's: 0 raw, 1 KIVI, 2 INT8) each of keys[0..n) is
     * stored with, as far as this tier knows (one it holds or passed to the next tier), into
     * codecs[i]; 0 for a key it knows nothing of. Lookups use it to say which chunks load lossy. */
    kvs_status (*codecs)(void *state, const kvs_key *keys, uint64_t n, uint16_t *codecs);

    /* --- 1.6 --- */
    /* CAP_PUT_RANGE: overwrite bytes [offset, offset + len) of an object the tier holds, in place
     * (its length stays). KVS_ENOTFOUND when it holds none of the key, KVS_EINVAL past its end.
     * Only for raw blocks the connector keeps for an engine (the layer stream cache,
     * docs/peer_gpu.md), never for the connector's sealed objects: their checksums would no longer
     * hold. */
    kvs_status (*put_range)(void *state, const kvs_key *key, uint64_t offset, const void *src,
                            uint64_t len);

    /* --- 1.8 --- */
    /* Optional: capabilities this tier has as it was opened, beyond the table's caps (what depends
     * on its options: KVS_BACKEND_CAP_SHARED for a dram tier with shm_name). */
    uint32_t (*instance_caps)(void *state);
} kvs_backend_ops;

/* 1 when a struct that starts with struct_size (a kvs_backend_init or kvs_backend_host from the
 * connector, which may be older or newer than the plugin) reaches `field`: read a field added in a
 * later minor version only when this says so. */
#define KVS_HAS_FIELD(ptr, type, field) \
    ((ptr)->struct_size >= offsetof(type, field) + sizeof((ptr)->field))
/* 1 when a backend's table (possibly older than the connector) reaches op `field` and sets it. */
#define KVS_HAS_OP(ops, field) (KVS_HAS_FIELD(ops, kvs_backend_ops, field) && (ops)->field != NULL)

/* The symbol a plugin .so exports. */
typedef const kvs_backend_ops *(*kvs_backend_entry_fn)(uint32_t abi_major);
#define KVS_BACKEND_ENTRY_SYMBOL "kvs_backend_entry"

#ifdef __cplusplus
}
#endif
#endif /* KVSTRATA_BACKEND_H */
