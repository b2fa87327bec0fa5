/* peer_gpu_slots.h - the tier's slots (peer_gpu_slots.c): objects in lent units, their index and
 * LRU, pins, and the copies counted in flight on their units. */
#ifndef KVS_PEER_GPU_SLOTS_H
#define KVS_PEER_GPU_SLOTS_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "peer_gpu_state.h"

/* With the tier's lock held unless said. */
uint32_t pg_unit_of(const pg_state *st, uint32_t slot);
uint8_t *pg_slot_data(const pg_state *st, uint32_t slot);
/* 1 when I/O may start on the unit (the lender lives and it is ours). */
int pg_unit_usable(const pg_state *st, uint32_t unit);
uint32_t *pg_bucket_of(pg_state *st, const kvs_key *key);
/* The stored slot of key, or PG_NIL. */
uint32_t pg_find(pg_state *st, const kvs_key *key);
void pg_lru_unlink(pg_state *st, uint32_t slot);
void pg_lru_push_head(pg_state *st, uint32_t slot);
/* Make a slot (its key and length set) visible; take it out of the index and the LRU (freed now,
 * or doomed while copies out of it run); free it. */
void pg_publish(pg_state *st, uint32_t slot);
void pg_unpublish(pg_state *st, uint32_t slot);
void pg_free_slot(pg_state *st, uint32_t slot);
/* A unit became usable (an offer accepted): its free slots go on the free stack, lowest on top. */
void pg_unit_lent(pg_state *st, uint32_t unit);
/* 1 while a pin holds (an expired one is cleared). */
int pg_pinned(pg_slot *e, uint64_t now_ns);
/* Start a copy on a slot: counted in flight on its unit; 0 when the unit is no longer usable. */
int pg_begin_copy(pg_state *st, uint32_t slot, int reading);
/* The copy ended: the unit's count, a doomed slot freed, a RELEASED the end makes possible. */
void pg_end_copy(pg_state *st, uint32_t slot, int reading);
/* A free slot in a usable unit, or the least recently used unpinned object's after passing it
 * down; PG_NIL when everything is pinned, busy or not ours. */
uint32_t pg_take_slot(pg_state *st);
int pg_unit_empty(const pg_state *st, uint32_t unit);
/* Move every object of the unit down the chain (down != 0: host->on_evict with its bytes, the lock
 * let go meanwhile; only the link thread, which alone unmaps the region) or report it gone (down ==
 * 0, lock held); slots with copies out of them in flight are doomed, freed when they end. Returns
 * with the lock held. */
void pg_empty_unit(pg_state *st, uint32_t unit, int down);
/* Send RELEASED for the unit and let it go; a failed send shuts the channel (the link thread then
 * finds it lost). */
void pg_send_released(pg_state *st, uint32_t unit);

#endif /* KVS_PEER_GPU_SLOTS_H */
