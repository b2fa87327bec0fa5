/* elastic.h - SwiftCache's sizing and elastic lending 
 * (docs/peer_gpu.md) as pure functions: model geometry and byte
 * counts in, block counts out, no I/O and no clock (a window of demand takes the time as an
 * argument).
 *
 * A master model borrows KV memory that co-located worker models lend it. Its layer stream cache
 * (LSC) holds, one layer at a time, the slice of every master block that lives on a worker; its
 * regular cache (RC) holds whole blocks in its own memory. Eq. 1-5 size both and give the longest
 * context; Eq. 6-9 give the unit memory changes hands in (the least common multiple of a master
 * block and a worker block, taken in bytes here so models of different dtypes can share a pool: the
 * paper's element count breaks there); Alg. 1 says how many blocks a worker takes back (ScaleUp,
 * rounded up) or lends (ScaleDown, rounded down), here sized for the concurrent batch rather than one
 * request. */
#ifndef KVS_ELASTIC_H
#define KVS_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One model's paged KV geometry. */
typedef struct kvs_el_model {
    uint32_t n_layers;     /* L */
    uint32_t block_tokens; /* B */
    uint32_t kv_heads;     /* H_kv */
    uint32_t head_dim;     /* D_kv */
    uint32_t elem_bytes;   /* d: 2 for fp16/bf16, 1 for fp8 */
    uint32_t kv_planes;    /* 2 (K and V); 1 for a latent cache (MLA) */
} kvs_el_model;

/* Eq. 1: bytes of one block of one layer, kv_planes * B * H_kv * D_kv * d; 0 if it overflows or a
 * field is 0. */
uint64_t kvs_el_layer_block_bytes(const kvs_el_model *m);

/* Bytes of one block of every layer (L * Eq. 1); 0 on overflow or a 0 field. */
uint64_t kvs_el_block_bytes(const kvs_el_model *m);

/* What the master can hold (Eq. 2-5). */
typedef struct kvs_el_capacity {
    uint64_t k_master;   /* Eq. 3: single-layer blocks in the master's own KV space */
    uint64_t k_workers;  /* sum of Eq. 2 over the workers: whole master blocks lent */
    uint64_t n_lsc;      /* Eq. 4: lent blocks the LSC streams (a slot per buffer for each) */
    uint64_t n_rc;       /* Eq. 5: whole blocks in the master's own memory beside the LSC */
    uint64_t max_tokens; /* (n_lsc + n_rc) * B */
    uint64_t max_tokens_without_lsc; /* floor(k_master / L) * B: every block whole and local */
} kvs_el_capacity;

/* Size the LSC and the RC of `master` with master_bytes of its own KV space and worker_bytes[i] lent
 * by worker i (bytes; K_i = floor(worker_bytes[i] / block bytes), Eq. 2, into k_out[i] when k_out is
 * not NULL). lsc_buffers is 1 (the paper: a load waits for the previous layer's store) or 2 (a
 * second buffer, so a load does not wait: every lent block then takes two single-layer slots, and
 * n_lsc = min(sum K_i, floor(K_master / 2))). KVS_EINVAL for a zero geometry field, lsc_buffers
 * outside 1..2 or n_workers with worker_bytes NULL; KVS_EOVERFLOW if a count does not fit 64 bits. */
kvs_status kvs_el_plan_capacity(const kvs_el_model *master, uint64_t master_bytes,
                                const uint64_t *worker_bytes, uint32_t n_workers,
                                uint32_t lsc_buffers, uint64_t *k_out, kvs_el_capacity *out);

/* The unit memory changes hands in between a master and a worker (Eq. 6-9, in bytes). */
typedef struct kvs_el_unit {
    uint64_t lcm_bytes;  /* lcm(master block bytes, worker block bytes) */
    uint64_t meu_master; /* master blocks in one unit: lcm / master block bytes */
    uint64_t meu_worker; /* worker blocks in one unit */
} kvs_el_unit;

/* KVS_EINVAL for a zero geometry; KVS_EOVERFLOW if the LCM does not fit 64 bits. */
kvs_status kvs_el_exchange_unit(const kvs_el_model *master, const kvs_el_model *worker,
                                kvs_el_unit *out);

/* A move of memory between a worker and the master: worker_blocks and master_blocks are k units'
 * worth (k * meu_worker, k * meu_master), the one side gaining what the other loses. */
typedef struct kvs_el_delta {
    uint64_t units;
    uint64_t worker_blocks;
    uint64_t master_blocks;
    int short_of_demand; /* ScaleUp: even every lent unit back leaves the demand unmet */
} kvs_el_delta;

/* Worker blocks a batch needs: each request's tokens rounded up to whole blocks, summed (the
 * concurrent batch, not its longest request). UINT64_MAX on overflow. */
uint64_t kvs_el_batch_blocks(const uint64_t *tokens, size_t n, uint32_t block_tokens);

/* Alg. 1 ScaleUp: the worker owns `owned` blocks and needs `need`; it takes back the fewest whole
 * units that cover the shortfall (rounded up), at most the lent_master master blocks it lent (then
 * short_of_demand). Nothing when need <= owned. */
kvs_el_delta kvs_el_scale_up(uint64_t owned, uint64_t need, uint64_t lent_master,
                             const kvs_el_unit *u);

/* Alg. 1 ScaleDown: the worker owns `owned` blocks and needed at most window_need over the window;
 * it lends the most whole units that leave that much (rounded down). Nothing when window_need >=
 * owned. */
kvs_el_delta kvs_el_scale_down(uint64_t owned, uint64_t window_need, const kvs_el_unit *u);

/* The largest batch demand seen over the last window_ms (ScaleDown's input): a ring of samples. */
#define KVS_EL_WINDOW_SAMPLES 256
typedef struct kvs_el_window {
    uint64_t window_ms;
    uint64_t at_ms[KVS_EL_WINDOW_SAMPLES];
    uint64_t blocks[KVS_EL_WINDOW_SAMPLES];
    uint32_t head, count;
} kvs_el_window;

void kvs_el_window_init(kvs_el_window *w, uint64_t window_ms);
/* A sample: the batch needed `blocks` at now_ms (times never decrease). Samples within
 * window_ms / KVS_EL_WINDOW_SAMPLES (a slot's span) of a slot's first share that slot (its peak), so
 * the ring spans the whole window however often they come; when it is full the oldest slot is
 * folded into the next. A peak is never forgotten early, and kept at most a slot's span late. */
void kvs_el_window_note(kvs_el_window *w, uint64_t now_ms, uint64_t blocks);
/* The largest demand among slots begun less than window_ms plus a slot's span before now_ms, or
 * dated after it (0 if none). */
uint64_t kvs_el_window_max(const kvs_el_window *w, uint64_t now_ms);

#ifdef __cplusplus
}
#endif

#endif
