/*
 * compress.h - the built-in compress tier (docs/compress.md): a tier in host memory that keeps each
 * object as compressed as its value allows. Every put that finds it full, and every reevaluate_ms,
 * the host's placement (kvs_backend_host.plan: AdaptCache, schedulers/adaptcache/) decides for
 * every object this tier knows whether it stays here, goes to the next tier (written back through
 * on_evict) or is stored nowhere, and in which encoding; the host's encode makes the lossy objects
 * (a put with room asks about its object alone first: kept as it came, nothing else moves). Encodings only go downward (raw to
 * lossy, lossy to a smaller one of no better quality; never back), and only with allow_lossy.
 *
 * Options (YAML `options:` of a `type: compress` tier):
 *   allow_lossy        true lets the tier store objects lossy (default false: raw only, a tier that
 *                      places by utility between itself and the next tier)
 *   bandwidth          how fast a read from this tier reaches the engine (default 20GB/s)
 *   latency_us         the fixed cost of one read from it (default 5)
 *   next_capacity      bytes of the next tier this tier's placement may fill (default 4 x capacity)
 *   next_bandwidth     the next tier's read rate (default 1GB/s)
 *   next_latency_us    its fixed cost (default 100)
 *   recompute_ms       what a chunk costs the engine to recompute when stored nowhere (default 20)
 *
 * It needs the host's encodings, encode and plan (backend ABI 1.5): create refuses without them.
 * Capabilities: THREAD_SAFE (one mutex; host->on_evict and the host's encode run under it) and
 * CODECS. It holds the objects it passed down as records (key, encoding, length), so its placement
 * counts the next tier's bytes and its codecs op answers for them; a record is forgotten when the
 * placement drops it or the object is put here again. The next tier evicts in its own order, so a
 * record can outlive its object.
 */
#ifndef KVS_COMPRESS_H
#define KVS_COMPRESS_H

#include "abi/kvstrata_backend.h"
#include "common/clock.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The compress backend's ops table (static storage). */
const kvs_backend_ops *kvs_compress_backend(void);

/* Run the tier's pins, hit rates and re-evaluation on clock (NULL: the monotonic clock), for tests.
 * tier is the state create returned. */
kvs_status kvs_compress_set_clock(void *tier, const kvs_clock *clock);

/* What the tier holds, for tests and tools: objects here (raw and lossy), records of objects it
 * passed down, and placements run since create. */
typedef struct kvs_compress_counts {
    uint64_t here_raw, here_lossy, bytes_here;
    uint64_t passed_down, bytes_down;
    uint64_t plans, encoded, dropped;
    uint64_t encode_failures; /* encodings asked for that `encode` refused (never asked again) */
} kvs_compress_counts;
kvs_status kvs_compress_counts_of(void *tier, kvs_compress_counts *out);

#ifdef __cplusplus
}
#endif

#endif
