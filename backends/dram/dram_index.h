/*
 * dram_index.h - a published index: which keys a tier private to one process holds, kept in POSIX
 * shared memory so that the other processes of the same engine instance find and pin them.
 *
 * A tier whose bytes cannot be shared (a compress tier's heap, a peer_gpu tier's lent region) is
 * owned by each process that stores into it (vLLM's workers, one per tensor-parallel rank, each
 * saving and loading its own rank's keys), and a process that only looks up (vLLM's scheduler)
 * opens the index alone. The owner publishes each object it holds (with its codec) and each record
 * of one it passed to the next tier, withdraws what it drops, and keeps what a lookup pinned here.
 * The index is a dram tier of small entries (dram.h): a process-shared robust lock, pins with
 * deadlines, attachers tracked by pid. It is as good as its owners: an owner killed leaves entries
 * whose loads miss (its successor's store is empty), and the connector turns those into error
 * blocks and a recompute, which the owner's get then withdraws.
 */
#ifndef KVS_DRAM_INDEX_H
#define KVS_DRAM_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"

typedef struct kvs_dram_index kvs_dram_index;

/* Entries one index holds when the tier does not say (index_entries). */
#define KVS_DRAM_INDEX_MIN_ENTRIES 256u

/* Open (create or attach) the index in shared memory `shm_name` for up to `entries` keys; every
 * process of the instance must give the same entries. host->log (may be NULL) hears of it.
 * KVS_ECONFIG for a bad name or geometry, with a sentence in error. */
kvs_status kvs_dram_index_open(const char *shm_name, uint64_t entries, const char *tier_name,
                               const kvs_backend_host *host, kvs_dram_index **out, char *error,
                               size_t error_len);
void kvs_dram_index_close(kvs_dram_index *ix);

/* The owner holds key as codec (0 raw); replaces a record of it. A full index forgets its least
 * recently published entries (a later miss, never a wrong hit). */
void kvs_dram_index_held(kvs_dram_index *ix, const kvs_key *key, uint16_t codec);
/* The owner passed key down to the next tier as codec and keeps a record of it. */
void kvs_dram_index_passed(kvs_dram_index *ix, const kvs_key *key, uint16_t codec);
/* The owner no longer holds key nor a record of it. */
void kvs_dram_index_forget(kvs_dram_index *ix, const kvs_key *key);
/* 1 while a lookup's pin on key (held) has not expired. */
int kvs_dram_index_pinned(kvs_dram_index *ix, const kvs_key *key);

/* The backend operations a lookup-only process answers from the index (held keys only). */
kvs_status kvs_dram_index_contains(kvs_dram_index *ix, const kvs_key *keys, uint64_t n,
                                   uint64_t *n_present);
kvs_status kvs_dram_index_pin(kvs_dram_index *ix, const kvs_key *keys, uint64_t n,
                              uint64_t timeout_ms, uint64_t *n_pinned);
kvs_status kvs_dram_index_unpin(kvs_dram_index *ix, const kvs_key *keys, uint64_t n);
/* codecs[i]: the codec key i is held or was passed down with, 0 when the index knows nothing. */
kvs_status kvs_dram_index_codecs(kvs_dram_index *ix, const kvs_key *keys, uint64_t n,
                                 uint16_t *codecs);
/* What a tier opened with index ix (NULL: none) adds to its capabilities (its instance_caps):
 * KVS_BACKEND_CAP_SHARED | KVS_BACKEND_CAP_PUBLISHED, or 0. */
uint32_t kvs_dram_index_caps(const kvs_dram_index *ix);
/* Held keys published now. */
kvs_status kvs_dram_index_usage(kvs_dram_index *ix, uint64_t *n_held);

#endif /* KVS_DRAM_INDEX_H */
