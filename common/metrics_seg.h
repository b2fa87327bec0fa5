/* metrics_seg.h - the shared counter segment of one metrics instance (docs/operations.md, Metrics):
 * a POSIX shared memory object every process of the instance maps, with a slot per publishing
 * handle, store or node, so one process can serve every process's counters.
 *
 * Layout: a header (magic, version, sizes, a robust process-shared mutex, a generation counter)
 * then KVS_MSEG_SLOTS slots. A slot is FREE, LIVE (pid and start time of its process) or RETIRED
 * (what the slots of processes gone left: counters only, so the instance's sums never go
 * backwards). Only the owning process writes a LIVE slot's values, under the slot's sequence
 * counter (odd while writing), never waiting; claiming a slot, folding a dead one into a retired row
 * and releasing one take the mutex (with a timeout) and bump the generation, so a reader that sees
 * the same even generation before and after its copy has a consistent picture.
 *
 * Processes gone: a slot's process is dead when its pid no longer runs, runs with another start
 * time, or is a zombie; a slot of another pid namespace (a container sharing /dev/shm) cannot be
 * looked up from here: it is alive while its heartbeat (written by its owner's instance thread at
 * every poll, on CLOCK_BOOTTIME, which every pid namespace of the host reads alike) is younger than
 * KVS_MSEG_HEARTBEAT_STALE_MS, so a dead container's slots are folded too. A fold journals the row it adds into (an undo copy in the
 * header), so a process killed in the middle of one never gets its counters added twice. Retired
 * rows are bounded: past KVS_MSEG_RETIRED_MAX, and whenever a newcomer finds no free slot, rows of
 * one kind and tenant merge (tiers gathered by name, so no series changes; a tier with no place left
 * counts under a catch-all tier KVS_MSEG_OTHER); only when that frees nothing do named tenants'
 * rows merge into their kind's row with tenant KVS_MSEG_OTHER. Tenant-less rows (a node's whole
 * counters) never do. */
#ifndef KVS_METRICS_SEG_H
#define KVS_METRICS_SEG_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

#define KVS_MSEG_MAGIC              0x3174656d2d73766bull /* "kvs-met1" */
#define KVS_MSEG_VERSION            3u
#define KVS_MSEG_SLOTS              256u
#define KVS_MSEG_TIERS              16u
#define KVS_MSEG_NAME_MAX           64u
#define KVS_MSEG_TENANT             72u /* a tenant name (64 bytes) and its NUL, rounded up */
#define KVS_MSEG_RETIRED_MAX        64u /* retired rows of distinct identities before they merge */
#define KVS_MSEG_OTHER              "(other)"
#define KVS_MSEG_HEARTBEAT_STALE_MS 30000u /* another namespace's slot this quiet is dead */

enum { KVS_MSEG_FREE = 0, KVS_MSEG_LIVE = 1, KVS_MSEG_RETIRED = 2 };
/* What published a slot. */
enum { KVS_MSEG_CONNECTOR = 1, KVS_MSEG_STORE = 2, KVS_MSEG_NODE = 3 };

/* Counters of a slot (monotonic while the slot lives). */
enum {
    KVS_MC_LOOKUPS,
    KVS_MC_LOOKUP_TOKENS, /* tokens asked beyond what the engine had */
    KVS_MC_HIT_TOKENS,
    KVS_MC_GETS, /* store API keys asked */
    KVS_MC_GET_MISSES,
    KVS_MC_SAVES,
    KVS_MC_SAVED_BYTES,
    KVS_MC_SAVE_NS,
    KVS_MC_SAVES_SKIPPED,
    KVS_MC_EVICTIONS,
    KVS_MC_ERR_LOAD,
    KVS_MC_ERR_INTEGRITY,
    KVS_MC_ERR_CORRUPT,
    KVS_MC_ERR_PUT_FAILED,
    /* a node's (KVS_MSEG_NODE): the first its whole counters, the rest per tenant where known */
    KVS_MC_NODE_CONNECTIONS,
    KVS_MC_NODE_REJECTED,
    KVS_MC_NODE_AUTH_OK,
    KVS_MC_NODE_AUTH_FAILURES,
    KVS_MC_NODE_REFUSALS,
    KVS_MC_NODE_LATE_PUTS,
    KVS_MC_NODE_QUOTA_EVICTIONS,
    KVS_MC_NODE_LOOKUPS,
    KVS_MC_NODE_HITS,
    KVS_MC_NODE_MISSES,
    KVS_MC_NODE_GETS,
    KVS_MC_NODE_PUTS,
    KVS_MC_NODE_DELETES,
    KVS_MC_NODE_BYTES_IN,
    KVS_MC_NODE_BYTES_OUT,
    KVS_MC_COUNT
};

typedef struct kvs_mseg_tier {
    char name[KVS_MSEG_NAME_MAX];
    uint64_t objects, bytes, capacity; /* gauges: a live process's only */
    uint64_t shared;                   /* every process sees the same objects (not summed) */
    uint64_t usage_known; /* objects and bytes were asked of the tier (else they mean nothing) */
    uint64_t hits, hit_tokens, loaded_bytes, load_ns; /* counters */
} kvs_mseg_tier;

/* What a publisher writes: identity (kind, tenant, tier names) and values. A multiple of 8 bytes. */
typedef struct kvs_mseg_values {
    uint32_t kind, n_tiers;
    char tenant[KVS_MSEG_TENANT]; /* "" where none */
    uint64_t c[KVS_MC_COUNT];
    kvs_mseg_tier tiers[KVS_MSEG_TIERS];
} kvs_mseg_values;

typedef struct kvs_mseg_slot {
    uint32_t state;
    int32_t pid;
    uint64_t start; /* the process's start time (/proc/PID/stat), so a reused pid is not alive */
    uint64_t pidns; /* the inode of the process's pid namespace (0: unknown) */
    uint64_t heartbeat; /* CLOCK_BOOTTIME ns of the owner's last poll (kvs_mseg_heartbeat) */
    uint64_t seq;       /* odd while the owner writes values */
    kvs_mseg_values v;
} kvs_mseg_slot;

typedef struct kvs_mseg_header {
    uint64_t magic;
    uint32_t version, header_bytes, slot_bytes, n_slots;
    uint64_t generation; /* odd while a slot is claimed, folded or released */
    uint64_t full_logged;
    pthread_mutex_t lock; /* robust, process-shared */
    /* the fold in progress (under the lock): 1 while fold_dst's values are being added to; a lock
     * holder that finds it set (its predecessor died) puts fold_undo back unless fold_src is FREE */
    uint32_t fold_state, fold_src, fold_dst, fold_pad;
    kvs_mseg_values fold_undo;
} kvs_mseg_header;

typedef struct kvs_mseg {
    kvs_mseg_header *hdr;
    kvs_mseg_slot *slots;
    size_t map_bytes;
    int writable;
    char name[KVS_MSEG_NAME_MAX + 8]; /* "/kvstrata-<name>" */
} kvs_mseg;

/* Opens (create: creating it if absent, mode 0600) the segment of `name`. KVS_ENOTFOUND when it does
 * not exist and create is 0; KVS_ECORRUPT when it is not a segment of this version. */
kvs_status kvs_mseg_open(const char *name, int create, kvs_mseg *out, char *err, size_t err_len);
void kvs_mseg_close(kvs_mseg *seg);
/* Removes the named segment (tests). */
void kvs_mseg_unlink(const char *name);

/* Claims a LIVE slot for this process with v's identity; -1 when every slot is taken (logged once
 * per segment) or the lock could not be had. */
int kvs_mseg_claim(kvs_mseg *seg, const kvs_mseg_values *v);
/* The owner's write of its slot's values (never waits). */
void kvs_mseg_publish(kvs_mseg *seg, int slot, const kvs_mseg_values *v);
/* The owner is done with its slot: its counters go to the retired row of its identity. */
void kvs_mseg_release(kvs_mseg *seg, int slot);
/* The owner says its slot's process still runs (the instance thread, at every poll). */
void kvs_mseg_heartbeat(kvs_mseg *seg, int slot);
/* CLOCK_BOOTTIME in ns, the clock of the heartbeats. */
uint64_t kvs_mseg_boottime_ns(void);
/* Folds the LIVE slots of processes gone into retired rows; returns the slots folded. */
int kvs_mseg_sweep(kvs_mseg *seg);

/* A consistent copy of every slot into out[KVS_MSEG_SLOTS] (a slot of a process gone reads
 * RETIRED); the number of live processes in *processes. 0, or -1 when no consistent copy came in a
 * bounded number of tries (the last copy is left in out). */
int kvs_mseg_snapshot(kvs_mseg *seg, kvs_mseg_slot *out, uint32_t *processes);

/* 1 when pid with that start time runs and is no zombie, or when it is of another pid namespace
 * than this process's (pidns 0: unknown, taken as this one). */
int kvs_mseg_alive(int32_t pid, uint64_t start, uint64_t pidns);
/* That process's start time (0 where unknown). */
uint64_t kvs_mseg_start_time(int32_t pid);
/* The inode of this process's pid namespace (0 where /proc cannot say). */
uint64_t kvs_mseg_own_pidns(void);

/* Tests: a process that sets it exits in the middle of its next fold (after adding its counters to a
 * retired row, before freeing its slot), as a process killed there would. */
extern int kvs_mseg_test_exit_in_fold;

#endif
