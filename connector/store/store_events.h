/* store_events.h - the store's cache events with the engine's keys (store_events.c). */
#ifndef KVS_STORE_EVENTS_H
#define KVS_STORE_EVENTS_H

#include "store_state.h"

kvs_status kvs_store_events_create(uint32_t capacity, kvs_store_events **out);
void kvs_store_events_destroy(kvs_store_events *ev);
/* The engine's key behind a kvstrata key, for the events that name it. */
void kvs_store_events_name(kvs_store_events *ev, const kvs_key *key, const void *bytes,
                           uint32_t len);
/* The tier chain's callback (kvs_tier_event_fn): ctx is the store. */
void kvs_store_on_tier_event(void *ctx, uint8_t kind, const kvs_key *key, uint32_t tier);
kvs_status kvs_store_events_take(kvs_store_events *ev, void *buf, uint64_t cap, uint64_t *len,
                                 uint64_t *n);
uint64_t kvs_store_events_dropped(const kvs_store_events *ev);

#endif
