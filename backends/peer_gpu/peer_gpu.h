/*
 * peer_gpu.h - the peer_gpu tier (docs/peer_gpu.md): objects in memory another process
 * lends, a unit at a time, under the two-step protocol of lending.h. The lender (kvstrata-lend)
 * passes its region once, in the HELLO of the control channel (lend_wire.h); units of it then come
 * and go. On the host device the region is a sealed memfd both processes map; every copy is a
 * memcpy into or out of it.
 *
 * Options (YAML `options:` of a `type: peer_gpu` tier):
 *   socket              the lender's Unix socket (required; relative to the YAML file's directory)
 *   connect_timeout_ms  how long create waits for the lender's HELLO (default 2000). A lender that
 *                       is not there yet is no error: the tier opens empty (every get a miss,
 *                       every put KVS_ENOMEM) and keeps trying in the background.
 *   retry_ms            how often it tries again after losing its lender or not finding one
 *                       (default 1000)
 *   send_timeout_ms     how long an answer to the lender may wait for room (default 1000); a
 *                       lender that reads nothing for that long is taken for lost
 *
 * How the tier keeps the protocol's rule (a unit the lender took back is never touched):
 *   - objects live in slots of max_object_bytes inside units; a read or write counts as I/O in
 *     flight on its unit from before its copy starts until after it ends (lending.h);
 *   - RECLAIM stops new I/O on the unit at once, moves its objects down the chain (host->on_evict
 *     with their bytes, from the tier's control thread), and answers RELEASED only when the unit is
 *     empty and its last copy has ended;
 *   - a put it has no room for (nothing lent, everything pinned or busy, or its unit taken back
 *     while it copied) gets KVS_ENOMEM, and the chain puts it into the next tier
 *     (KVS_BACKEND_CAP_SPILLS);
 *   - a lost lender (its socket closed, a BYE, a packet that is not a message) makes every unit
 *     unusable at once; what they held is reported gone (host->on_evict without bytes), and the
 *     mapping is dropped only after the copies in flight end.
 * Pins keep objects from this tier's eviction only: a reclaim moves a pinned object down too.
 *
 * Capabilities: THREAD_SAFE, GET_RANGE, PUT_RANGE and SPILLS. No zero copy: a pointer into lent memory would outlive
 * a reclaim. host->on_evict runs on the tier's own thread as well as the caller's (built-in tiers
 * below are thread-safe; a plugin below it must be too).
 */
#ifndef KVS_PEER_GPU_H
#define KVS_PEER_GPU_H

#include "abi/kvstrata_backend.h"
#include "peer_gpu_stats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The peer_gpu backend's ops table (static storage; never freed). */
const kvs_backend_ops *kvs_peer_gpu_backend(void);

/* The figures of a tier made by kvs_peer_gpu_backend()->create (peer_gpu_stats.h). */
__attribute__((visibility("default"))) kvs_status kvs_peer_gpu_stats_get(void *tier,
                                                                         kvs_peer_gpu_stats *out);

/* Tests only: call hook(ctx, unit) in the middle of every copy into or out of lent memory by get,
 * get_range, put and put_range, with I/O on that unit in flight and no lock held, so a test can
 * hold a copy open while the lender reclaims the unit; a hook that returns nonzero fails that copy
 * as a GPU error would. NULL removes it. Call before other threads use the tier. */
__attribute__((visibility("default"))) kvs_status kvs_peer_gpu_set_copy_hook(
    void *tier, int (*hook)(void *ctx, uint32_t unit), void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* KVS_PEER_GPU_H */
