/* peer_gpu_stats.h - what a peer_gpu tier holds and has done (tests, kvs-bench-peer), read with
 * kvs_peer_gpu_stats_get (peer_gpu.h). A header of its own so the tier's state (peer_gpu_state.h)
 * keeps these figures without including the tier's contract, which sits above it. */
#ifndef KVS_PEER_GPU_STATS_H
#define KVS_PEER_GPU_STATS_H

#include <stdint.h>

typedef struct kvs_peer_gpu_stats {
    uint32_t connected;      /* a lender's region is mapped */
    uint32_t on_gpu;         /* ... and it is GPU memory (CUDA IPC) */
    uint32_t usable_units;   /* units the tier may store into now */
    uint32_t slots_per_unit; /* objects a unit holds */
    uint64_t objects;
    uint64_t lenders;       /* HELLOs taken */
    uint64_t lost_lenders;  /* lenders lost (closed, BYE, or a bad packet) */
    uint64_t accepted;      /* OFFERs accepted */
    uint64_t declined;      /* OFFERs declined */
    uint64_t released;      /* RELEASED sent */
    uint64_t moved_down;    /* objects a reclaim passed down the chain */
    uint64_t lost_objects;  /* objects a lost lender took with it */
    uint64_t refused_reads; /* reads of an object whose unit was no longer usable */
    uint64_t refused_puts;  /* puts it had no room for (the chain spills them to the next tier) */
    uint64_t failed_copies; /* copies into or out of lent memory that failed (a GPU error) */
} kvs_peer_gpu_stats;

#endif /* KVS_PEER_GPU_STATS_H */
