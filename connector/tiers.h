/* tiers.h - the ordered chain of tiers, fastest first: built-in backends and plugins behind one table,
 * write-back of evicted objects to the next tier, write-through copies, cache events. */
#ifndef KVS_TIERS_H
#define KVS_TIERS_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "config.h"

typedef struct kvs_tier_chain kvs_tier_chain;

/* What a compress tier's host calls (kvs_backend_host.encodings, .encode, .plan) reach: the
 * encodings and placement the connector lends (connector/ext/lossy/encoder.h fills one). With
 * encodings set, encode and plan must be set too. */
typedef struct kvs_tier_encoder {
    const void *ctx;
    kvs_status (*encodings)(const void *ctx, const void *object, uint64_t len,
                            kvs_backend_encoding *out, uint32_t cap, uint32_t *n);
    kvs_status (*encode)(const void *ctx, const void *object, uint64_t len, uint32_t id, void *dst,
                         uint64_t cap, uint64_t *out_len);
    kvs_status (*plan)(const void *ctx, const kvs_backend_place_entry *entries, uint64_t n,
                       const kvs_backend_devices *devices, kvs_backend_place_choice *out);
    uint64_t reevaluate_ms; /* placement.reevaluate_ms */
} kvs_tier_encoder;

/* Called for each stored/removed object (KVS_EVENT_*); tier is the chain index. */
typedef void (*kvs_tier_event_fn)(void *ctx, uint8_t kind, const kvs_key *key, uint32_t tier);
/* Or'ed into a REMOVED kind: a put the tier accepted and then dropped (not an eviction). */
#define KVS_TIER_EVENT_DROPPED 0x80u

/* staging_base/len: the worker's staging pool (NULL/0 without one), passed to every backend.
 * encoder: what a compress tier encodes and places with (copied; its ctx is borrowed until close;
 * NULL without a model: such a chain cannot hold a compress tier). */
kvs_status kvs_tiers_open(const kvs_config *cfg, uint64_t max_object_bytes,
                          const kvs_tier_encoder *encoder, void *staging_base, uint64_t staging_len,
                          kvs_tier_event_fn on_event, void *event_ctx, kvs_tier_chain **out,
                          char *err, uint64_t err_len);
/* The same for one tensor-parallel rank's process: "{rank}" in an option value becomes rank (each
 * worker's own lender socket, docs/peer_gpu.md). */
kvs_status kvs_tiers_open_ranked(const kvs_config *cfg, uint64_t max_object_bytes,
                                 const kvs_tier_encoder *encoder, void *staging_base,
                                 uint64_t staging_len, int32_t rank, kvs_tier_event_fn on_event,
                                 void *event_ctx, kvs_tier_chain **out, char *err,
                                 uint64_t err_len);
void kvs_tiers_close(kvs_tier_chain *chain);

uint32_t kvs_tiers_count(const kvs_tier_chain *chain);
const char *kvs_tiers_name(const kvs_tier_chain *chain, uint32_t tier);
/* 1 when tier could not open (a device, file system, memory or peer failed; not its configuration)
 * and, as it is not `required`, an empty tier stands in for it: every lookup in it misses, every
 * save to it is skipped. Its table is then the empty tier's (type "empty"). */
int kvs_tiers_degraded(const kvs_tier_chain *chain, uint32_t tier);
/* Why a degraded tier could not open (its backend's sentence); "" for a tier that opened. */
const char *kvs_tiers_degraded_reason(const kvs_tier_chain *chain, uint32_t tier);
/* 1 when every process that opens the same tier sees its objects (KVS_BACKEND_CAP_SHARED, from the
 * table or, backend ABI 1.8, from instance_caps). */
int kvs_tiers_shared(const kvs_tier_chain *chain, uint32_t tier);
/* The last tier that is not degraded (0 when none is): what it drops leaves the chain. */
uint32_t kvs_tiers_bottom(const kvs_tier_chain *chain);
/* A tier's table and state, for tools and tests that drive a backend directly. */
const kvs_backend_ops *kvs_tiers_ops(const kvs_tier_chain *chain, uint32_t tier);
void *kvs_tiers_state(const kvs_tier_chain *chain, uint32_t tier);

/* One tier's reads and pins (tier is a chain index); the connector reaches backends only through
 * these. Each returns the backend's status; kvs_tiers_last_error gives its sentence. */
/* 1 when key is pinned in tier for timeout_ms (0: not there, evicted meanwhile, or refused). */
int kvs_tiers_pin(kvs_tier_chain *chain, uint32_t tier, const kvs_key *key, uint64_t timeout_ms);
/* Drop one pin of key in tier (none held: no-op). */
void kvs_tiers_unpin(kvs_tier_chain *chain, uint32_t tier, const kvs_key *key);
/* The same for keys[0..n) in one call into the backend: pins the ones tier holds from the first on
 * (stopping at the first it lacks) and returns how many; unpins all n. */
uint64_t kvs_tiers_pin_many(kvs_tier_chain *chain, uint32_t tier, const kvs_key *keys, uint64_t n,
                            uint64_t timeout_ms);
void kvs_tiers_unpin_many(kvs_tier_chain *chain, uint32_t tier, const kvs_key *keys, uint64_t n);
/* 1 if tier hands out references to its objects (kvs_tiers_get_ref), reads byte ranges
 * (kvs_tiers_get_range) or reads many objects in one call (kvs_tiers_get_many). */
int kvs_tiers_zero_copy(const kvs_tier_chain *chain, uint32_t tier);
int kvs_tiers_can_get_range(const kvs_tier_chain *chain, uint32_t tier);
int kvs_tiers_can_get_many(const kvs_tier_chain *chain, uint32_t tier);
/* Keys whose first 8 bytes are this hold raw blocks the connector keeps for an engine (the layer
 * stream cache, lsc.c), not objects: an eviction or a reclaim drops them, never writes them down,
 * and no event names them. */
#define KVS_TIERS_RAW_MAGIC    "kvsLSC\x01\x00"
/* ... and so are these: sparse decode's clusters and manifests (sparse_swarm.c) */
#define KVS_TIERS_SPARSE_MAGIC "kvsSPR\x01\x00"
int kvs_tiers_raw_key(const kvs_key *key);
/* 1 when the tier overwrites parts of an object in place (backend 1.6 put_range). */
int kvs_tiers_can_put_range(const kvs_tier_chain *chain, uint32_t tier);
kvs_status kvs_tiers_put_range(kvs_tier_chain *chain, uint32_t tier, const kvs_key *key,
                               uint64_t offset, const void *src, uint64_t len);
/* 1 if tier's get_many also comes in two halves (kvs_tiers_get_many_start, _finish). */
int kvs_tiers_can_get_many_async(const kvs_tier_chain *chain, uint32_t tier);
/* 1 when every tier may be called from several threads at once (KVS_BACKEND_CAP_THREAD_SAFE). */
int kvs_tiers_thread_safe(const kvs_tier_chain *chain);
/* The stored object in place; valid while the caller holds a pin on it. */
kvs_status kvs_tiers_get_ref(kvs_tier_chain *chain, uint32_t tier, const kvs_key *key,
                             const void **object, uint64_t *len);
/* A copy of the object into dst[0..cap); *len gets its length. */
kvs_status kvs_tiers_get(kvs_tier_chain *chain, uint32_t tier, const kvs_key *key, void *dst,
                         uint64_t cap, uint64_t *len);
/* Bytes [offset, offset + len) of the object into dst; *got the bytes copied, *object_len its whole
 * length. */
kvs_status kvs_tiers_get_range(kvs_tier_chain *chain, uint32_t tier, const kvs_key *key,
                               uint64_t offset, uint64_t len, void *dst, uint64_t *got,
                               uint64_t *object_len);
/* n objects at once (backend get_many): per-object lengths and statuses in lens and statuses. */
kvs_status kvs_tiers_get_many(kvs_tier_chain *chain, uint32_t tier, const kvs_key *keys,
                              void *const *dsts, const uint64_t *caps, uint64_t n, uint64_t *lens,
                              kvs_status *statuses);
/* The same in two halves: start submits and returns (*ticket names the call; keys may be reused at
 * once, the other arrays are the call's until finish); finish waits and fills lens and statuses. */
kvs_status kvs_tiers_get_many_start(kvs_tier_chain *chain, uint32_t tier, const kvs_key *keys,
                                    void *const *dsts, const uint64_t *caps, uint64_t n,
                                    uint64_t *lens, kvs_status *statuses, uint64_t *ticket);
kvs_status kvs_tiers_get_many_finish(kvs_tier_chain *chain, uint32_t tier, uint64_t ticket);
/* The sentence of tier's last failure ("" if none). */
const char *kvs_tiers_last_error(const kvs_tier_chain *chain, uint32_t tier);

/* Index of the first tier holding key, or -1. */
int kvs_tiers_find(kvs_tier_chain *chain, const kvs_key *key);
/* The same among the tiers that are not remote (type remote: their answers cross the network). */
int kvs_tiers_find_local(kvs_tier_chain *chain, const kvs_key *key);
/* 1 if tier is of type remote. */
int kvs_tiers_is_remote(const kvs_tier_chain *chain, uint32_t tier);
/* The backend's contains: how many of keys[0..n), from the first, tier holds. */
kvs_status kvs_tiers_contains(kvs_tier_chain *chain, uint32_t tier, const kvs_key *keys, uint64_t n,
                              uint64_t *n_present);
/* Store a sealed object in the top tier (and, for write-through tiers, in the next ones). */
kvs_status kvs_tiers_put(kvs_tier_chain *chain, const kvs_key *key, const void *object,
                         uint64_t len, char *err, uint64_t err_len);
/* The same from tier `from` down (the tiers above it are left alone): a caller whose object the
 * tiers above refused for lack of room stores it below them. */
kvs_status kvs_tiers_put_from(kvs_tier_chain *chain, uint32_t from, const kvs_key *key,
                              const void *object, uint64_t len, char *err, uint64_t err_len);
/* Remove a key from every tier (a corrupt object is dropped everywhere). */
void kvs_tiers_remove(kvs_tier_chain *chain, const kvs_key *key);
/* A key a lookup found and a load then found in no tier: told to each tier that publishes for other
 * processes what it holds (index_shm), so an entry its process no longer backs (a worker restarted)
 * is withdrawn and the next lookup misses. */
void kvs_tiers_forget_missing(kvs_tier_chain *chain, const kvs_key *key);
/* 1 when the tier publishes what this process holds for the others (KVS_BACKEND_CAP_PUBLISHED). */
int kvs_tiers_published(const kvs_tier_chain *chain, uint32_t tier);
/* In-place saves into the top tier (backend ABI 1.1 reserve/commit/abort): 1 if it supports them. */
int kvs_tiers_can_reserve(const kvs_tier_chain *chain);
/* Room for an object in the top tier; *dst is where to build it. KVS_ENOTSUP if the top tier cannot. */
kvs_status kvs_tiers_reserve(kvs_tier_chain *chain, const kvs_key *key, uint64_t len, void **dst,
                             uint64_t *ticket, char *err, uint64_t err_len);
/* Publish the object built at a reservation (object/len: its bytes, for write-through copies). */
kvs_status kvs_tiers_commit(kvs_tier_chain *chain, const kvs_key *key, uint64_t ticket,
                            const void *object, uint64_t len, char *err, uint64_t err_len);
void kvs_tiers_abort(kvs_tier_chain *chain, uint64_t ticket);
/* The memory range a tier keeps its objects in (backend CAP_MEMORY), else KVS_ENOTSUP. */
kvs_status kvs_tiers_memory(const kvs_tier_chain *chain, uint32_t tier, void **base, uint64_t *len);
/* The codec each of keys[0..n) is stored with (0 raw or unknown), key i being held by tier
 * tiers[i] (and pinned there): that tier's answer when it knows codecs (backend CAP_CODECS: a
 * compress tier), the object's header when the tier hands out references (a dram tier), else the
 * answer of the nearest tier above it that knows (a compress tier's record of what it passed down,
 * through write-back), else 0. */
void kvs_tiers_codecs(kvs_tier_chain *chain, const kvs_key *keys, const uint32_t *tiers, uint64_t n,
                      uint16_t *codecs);
/* 1 if some tier answers kvs_tiers_codecs (CAP_CODECS). */
int kvs_tiers_know_codecs(const kvs_tier_chain *chain);
/* Objects dropped from the last tier since open. */
uint64_t kvs_tiers_evictions(const kvs_tier_chain *chain);
/* Saves the top tier accepted and then could not store (backend ABI 1.3 on_put_dropped) since open. */
uint64_t kvs_tiers_dropped_saves(const kvs_tier_chain *chain);

#endif
