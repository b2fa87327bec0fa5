/* swarm.h - Swarm I/O planning for a tier striped over several SSD paths (Wang et al., arXiv 2603.17803):
 * Eq. 7 placement with a global pointer, the replica-aware entry-bucket scheduler (notes §3.3) and the
 * Eq. 8 merge that drops duplicate and DRAM-resident units. Decisions only: every call is a pure,
 * deterministic function of its arguments (no I/O, no globals, no allocation, no threads), so calls on
 * distinct arguments may run concurrently. Arrays are caller-owned and only used during the call.
 *
 * The offline clustering, cluster maintenance, the DRAM cache policy and the virtual-time disk model
 * live in the headers included at the end; docs/swarm.md explains every decision taken here. */
#ifndef KVS_SWARM_H
#define KVS_SWARM_H

#include <stdint.h>

#include "abi/kvstrata.h"

/* The scheduler keeps per-path state on the stack; a tier with more paths must refuse its config. */
#define KVS_SWARM_MAX_PATHS 64u
/* chosen[] value of a read that no valid path holds. */
#define KVS_SWARM_NO_PATH   UINT32_MAX

/* ---- placement (Eq. 7) -------------------------------------------------------------------------- */

/* Where copy r of a unit goes relative to its copy 0, and what the global pointer counts. */
typedef enum kvs_swarm_stride {
    /* Eq. 7 over copies: copy r of the object continues the stripe r * n_units copies further on
     * (moved by the fewest paths that keep it off the paths of copies 0..r-1); the pointer counts
     * copies (advances by n_units * replicas). kvs_swarm_place, the connector's policy. */
    KVS_SWARM_STRIDE_COPIES = 0,
    /* Copy r of unit k on the r-th path after its copy 0, (start + k + r) mod n_paths; the pointer
     * counts units (advances by n_units). The ssd tier's built-in placement (docs/ssd.md). */
    KVS_SWARM_STRIDE_UNITS = 1,
} kvs_swarm_stride;

/* Stripe n_units units, each stored `replicas` times, over n_paths paths (n_paths >= 1), continuing
 * a global stripe whose position is *pointer (start a tier at 0 and keep it). Copy r of unit u goes
 * to paths_out[u * replicas + r] (n_units * replicas entries). Copy 0 of unit k is on (start + k)
 * mod n_paths, start = *pointer mod n_paths, under either stride; `stride` says where the other
 * copies go and how far *pointer advances. The copies of one unit are on distinct paths whenever
 * replicas <= n_paths (with more replicas than paths they repeat paths). With replicas == 1 the two
 * strides are the same rule, Eq. 7 exactly. Nothing is placed and *pointer is kept when n_units or
 * replicas is 0.
 *
 * Why two strides: each is the documented contract of a caller that has stored data with it. The
 * connector's Swarm policy (docs/swarm.md) keeps the copy layers of an object apart, so a reader of
 * primaries alone still spreads over every path; the ssd tier's built-in rule (docs/ssd.md, pinned
 * by tests/test_ssd.c) puts a unit's copies on neighbouring paths. The ssd tier finds stored
 * objects by their unit headers, not by this rule, but one stride for both would move where one of
 * them puts new copies and change the figures measured with it. The two agree wherever one copy is
 * stored. */
void kvs_swarm_place_stride(uint64_t *pointer, uint32_t n_paths, uint32_t n_units,
                            uint32_t replicas, kvs_swarm_stride stride, uint32_t *paths_out);

/* kvs_swarm_place_stride with KVS_SWARM_STRIDE_COPIES: with replicas == 1 this is Eq. 7 exactly;
 * *pointer advances by n_units * replicas. */
void kvs_swarm_place(uint64_t *pointer, uint32_t n_paths, uint32_t n_units, uint32_t replicas,
                     uint32_t *paths_out);

/* ---- scheduler (notes §3.3) --------------------------------------------------------------------- */

/* Assign each of n reads to one path holding it and order the batch for submission.
 * Read r is held by paths[r * max_copies + c] for c < min(n_copies[r], max_copies); entries equal to or
 * above n_paths are ignored and a path listed twice counts once. Reads are taken least flexible first
 * (fewest distinct paths; a counting sort, stable in read index) and each goes to its least-loaded path,
 * ties to the lowest index; load counts reads. chosen[r] gets the path, or KVS_SWARM_NO_PATH when no
 * valid path holds the read (also for every read when n_paths is 0 or above KVS_SWARM_MAX_PATHS).
 * order[0..n) gets the read indices round-robin over the paths' buckets (path 0's first read, path 1's
 * first, ..., then every path's second, ...), each bucket in ascending read index, unassigned reads
 * last. Time O(n * (n_paths + max_copies)), no memory beyond the outputs. */
void kvs_swarm_schedule(uint32_t n_paths, uint64_t n, uint32_t max_copies, const uint32_t *n_copies,
                        const uint32_t *paths, uint32_t *chosen, uint64_t *order);

/* kvs_swarm_schedule for paths of unequal speed: read r moves bytes[r] bytes and path d serves
 * path_bytes_per_s[d] bytes per second; a read goes to the holder that would finish it first
 * (load[d] + bytes[r] / path_bytes_per_s[d], in seconds; ties to the lowest index) and that path's load
 * grows by the same amount. With equal speeds and sizes it chooses exactly what kvs_swarm_schedule does.
 * Every path_bytes_per_s[d] must be > 0; a path with a rate <= 0 is treated as not holding anything. */
void kvs_swarm_schedule_weighted(uint32_t n_paths, uint64_t n, uint32_t max_copies,
                                 const uint32_t *n_copies, const uint32_t *paths,
                                 const uint64_t *bytes, const double *path_bytes_per_s,
                                 uint32_t *chosen, uint64_t *order);

/* ---- merge and dedup (Eq. 8) -------------------------------------------------------------------- */

/* One unit of one stored object: the tier's read granule (for Swarm clusters: object = layer, unit =
 * entry). Ordered by object, then unit. */
typedef struct kvs_swarm_unit {
    uint64_t object;
    uint64_t unit;
} kvs_swarm_unit;

/* Sort units[0..n) ascending by (object, unit), in place (heap sort: no memory, O(n log n)). Use it to
 * prepare the `resident` list of kvs_swarm_dedup. */
void kvs_swarm_units_sort(kvs_swarm_unit *units, uint64_t n);

/* E_IO = (union of the requested units) \ E_DRAM. keep[0..*n_keep) gets, in ascending order, the index
 * of the first occurrence of every distinct unit in units[0..n) that is not in resident[0..n_resident)
 * (ascending, duplicates allowed: the units already in DRAM). keep must hold n indices. The inputs are
 * not modified. Returns KVS_EINVAL (and *n_keep = 0) when a pointer is NULL with a non-zero count or
 * `resident` is not sorted. Time O(n log n + n_resident). */
kvs_status kvs_swarm_dedup(const kvs_swarm_unit *units, uint64_t n, const kvs_swarm_unit *resident,
                           uint64_t n_resident, uint64_t *keep, uint64_t *n_keep);

/* Epoch-stamped membership for dense entry ids (one layer's entries), the O(1) form of the merge used
 * with clusters: begin a step, mark the DRAM-resident entries, then keep each member for which
 * kvs_swarm_seen_mark returns 1. `stamp` is caller storage for n_entries words that must outlive the
 * struct; one owner thread. */
typedef struct kvs_swarm_seen {
    uint32_t *stamp;
    uint32_t n_entries;
    uint32_t epoch;
} kvs_swarm_seen;

/* Attach stamp[0..n_entries) (zeroed here) and start at epoch 0 (call kvs_swarm_seen_begin next). */
void kvs_swarm_seen_init(kvs_swarm_seen *seen, uint32_t *stamp, uint32_t n_entries);
/* Start a new step: everything becomes unseen. O(1), except every 2^32 - 1 steps (the stamps are
 * cleared when the epoch wraps). */
void kvs_swarm_seen_begin(kvs_swarm_seen *seen);
/* Mark entry id seen; returns 1 if it was not seen yet this step, 0 if it was or id >= n_entries. */
int kvs_swarm_seen_mark(kvs_swarm_seen *seen, uint32_t id);

#include "swarm_cache.h"
#include "swarm_cluster.h"
#include "swarm_disk.h"
#include "swarm_graph.h"
#include "swarm_maint.h"

#endif
