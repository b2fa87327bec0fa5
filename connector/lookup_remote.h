/* lookup_remote.h - which chunks the chain's remote tiers hold, asked on a thread of its own, so a
 * scheduler's lookup never waits for a node (`loads: {remote_lookups: async}`): the first lookup of
 * a request submits a query and answers unknown_yet (vLLM's None); a later lookup uses the answer,
 * for as long as a lease lasts. */
#ifndef KVS_LOOKUP_REMOTE_H
#define KVS_LOOKUP_REMOTE_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "tiers.h"

typedef struct kvs_rlookups kvs_rlookups;
typedef struct kvs_rlookup kvs_rlookup;

/* The queries of a chain; NULL when no tier of it is remote (lookups stay synchronous) or out of
 * memory. The thread starts with the first query. */
kvs_rlookups *kvs_rlookups_create(kvs_tier_chain *chain);
/* Stops the thread (after the query it is asking) and frees every query left. */
void kvs_rlookups_destroy(kvs_rlookups *q);

/* A query for n_chunks chunks from chunk `first` (keys: ranks per chunk, chunk-major, copied);
 * local[i] != 0 says the chain's other tiers hold chunk first + i, so it is not asked. NULL when out
 * of memory or no thread could start (the caller looks up synchronously). */
kvs_rlookup *kvs_rlookup_submit(kvs_rlookups *q, const kvs_key *keys, uint64_t first,
                                uint64_t n_chunks, uint32_t ranks, const uint8_t *local,
                                uint64_t now_ns);
/* 1 once the query is answered. */
int kvs_rlookup_done(kvs_rlookups *q, kvs_rlookup *l);
/* 1 if l asked about exactly these chunks (same first chunk, count and keys). */
int kvs_rlookup_matches(const kvs_rlookup *l, const kvs_key *keys, uint64_t first,
                        uint64_t n_chunks, uint32_t ranks);
uint64_t kvs_rlookup_submitted_ns(const kvs_rlookup *l);
/* Once answered: the remote tier holding every rank's key of chunk c, or -1 (not held, not asked,
 * or outside the query). */
int kvs_rlookup_tier(const kvs_rlookup *l, uint64_t chunk);
/* Forget l: freed now, or by the thread when it has asked. */
void kvs_rlookup_drop(kvs_rlookups *q, kvs_rlookup *l);

#endif
