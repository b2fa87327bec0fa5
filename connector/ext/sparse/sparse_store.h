/* sparse_store.h - what a sparse decode step selects rows from (docs/sparse.md): for one
 * request, the key of every row of its stored chunks as floats, for scoring, and an XXH3-64 hash
 * of every row's K and V bytes. It is built once from the chunk objects, each checked whole (its
 * header, and every layer against the object's layer hash) as it is added, so a row fetched later
 * on its own from a tier is checked against its row hash instead of a whole layer's.
 *
 * A row is one token of one KV head of one layer. Context row r is token r % chunk_tokens of chunk
 * r / chunk_tokens. Then, per layer and KV head, kvs_sparse_store_select runs LiteCache's QSAC
 * step and the exact top-k over the rows stored (schedulers/qsac), and lists only the rows the
 * head cache lacks. One owner thread. */
#ifndef KVS_SPARSE_STORE_H
#define KVS_SPARSE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_backend.h" /* kvs_key */
#include "kernels/cpu/kernels.h"
#include "schedulers/qsac/qsac.h"

typedef struct kvs_sparse_store kvs_sparse_store;

/* A store for up to max_chunks chunks of chunk_tokens tokens, n_layers layers of KV heads of
 * `shape` whose elements are `dtype` (KVS_DTYPE_*; head_bytes a whole number of them). KVS_EINVAL
 * for a zero field, an unknown dtype, or an MLA shape (no V: not supported); KVS_ENOMEM. */
kvs_status kvs_sparse_store_create(const kvs_kv_shape *shape, uint32_t dtype, uint32_t n_layers,
                                   uint32_t chunk_tokens, uint32_t max_chunks,
                                   kvs_sparse_store **out);
void kvs_sparse_store_destroy(kvs_sparse_store *s);

/* Take chunk `chunk`'s rows from its raw object (len bytes, stored under key for fingerprint),
 * checked whole first: KVS_ECORRUPT with a sentence naming what failed, and nothing taken. A chunk
 * added twice is taken again. KVS_EINVAL for chunk >= max_chunks. */
kvs_status kvs_sparse_store_add(kvs_sparse_store *s, uint32_t chunk, const void *object,
                                uint64_t len, const kvs_key *fingerprint, const kvs_key *key,
                                char *err, size_t err_len);

/* 1 when the chunk holding context row `row` was added. */
int kvs_sparse_store_has_row(const kvs_sparse_store *s, uint32_t row);

/* Where row `row`'s K and V bytes of (layer, head) are within its chunk's object (from the
 * object's start; head_bytes each). */
void kvs_sparse_row_offsets(const kvs_sparse_store *s, uint32_t layer, uint32_t head, uint32_t row,
                            uint64_t *k_offset, uint64_t *v_offset);

/* KVS_OK when k and v (head_bytes each) are row `row`'s bytes of (layer, head) as added;
 * KVS_ECORRUPT otherwise (and for a row never added). */
kvs_status kvs_sparse_row_check(const kvs_sparse_store *s, uint32_t layer, uint32_t head,
                                uint32_t row, const void *k, const void *v);

/* The keys of (layer, head) as floats: head_dim of them per row, rows 0 .. the last added chunk's
 * end; a row of a chunk never added is zeros. */
const float *kvs_sparse_store_keys(const kvs_sparse_store *s, uint32_t layer, uint32_t head,
                                   uint32_t *n_rows);

/* One KV head's side of a request's sparse decode in one layer: its QSAC state (label m *
 * head_dim floats) and the rows its cache slots hold (KVS_QSAC_EMPTY: none). */
typedef struct kvs_sparse_head {
    kvs_qsac_head qsac;
    uint32_t *slot_rows; /* slots entries */
    uint32_t slots;
    uint32_t sel_end; /* the pool's end (at least sink) when the slots were selected: the rows
                       * from there on are the engine's to attend */
    /* an adaptive threshold (NULL: tau stays): every audit_every-th step is measured, a hit by
     * the attention error of its cached rows against the exact top-k (softmax logits q.k *
     * scale), a miss as error 0, and tau follows (kvs_qsac_adapt_observe) */
    kvs_qsac_adapt *adapt;
    uint32_t audit_every, audit_n;
    double scale;
} kvs_sparse_head;

/* A layer's step for every KV head: q holds n_heads * m query heads (m = head->qsac.m) of head_dim
 * floats, grouped by KV head. Every head is checked first (KVS_EINVAL, nothing changed). A head
 * whose QSAC step hits fetches nothing (hit[h] = 1). A miss takes the exact top-k of its group's
 * scores (kvs_topk_scores), k = min(topk, slots), over the pool: rows [sink, n_rows - recent) that
 * are stored (n_rows: the context this step attends over, which may run past the stored rows).
 * It lists the rows its cache lacks in fetch_rows/fetch_slots (every head has the same slots;
 * room for that many per head, head h's at h * slots); n_fetch[h] says how many. The slot tables
 * are updated as if the fetches succeeded (the caller checks each row and clears a slot whose row
 * fails). A selection shorter than k leaves the head's label invalid, so the next step selects
 * again. A head whose slots were selected from a longer pool than this step's (the context went
 * back) misses whatever its similarity: its rows may lie past this step's pool. After the call
 * head->sel_end says from which row on the engine attends its own rows: the pool's end at the
 * selection the slots hold (a hit keeps the one before; rows that entered the pool since are the
 * engine's, not dropped). KVS_ENOMEM when a head's selection ran out of memory: that head fetched nothing and its
 * label is invalid; the other heads' results stand. Uses the store's scratch: one thread. */
/* An approximate selection in place of the exact top-k (the medoid index): k rows at most of the
 * pool [sink, end) for (layer, head) and the query group q (m heads), ascending, into out (room for
 * the store's rows); *scored gets the keys it scored. UINT32_MAX: not now (the exact top-k runs). */
typedef uint32_t (*kvs_sparse_selector)(void *ctx, uint32_t layer, uint32_t head, const float *q,
                                        uint32_t m, uint32_t sink, uint32_t end, uint32_t k,
                                        uint32_t *out, uint64_t *scored);
void kvs_sparse_store_set_selector(kvs_sparse_store *s, kvs_sparse_selector fn, void *ctx);
/* Keys scored by selections so far, and selections the selector made; audits of an adaptive
 * threshold and the sum of the errors they measured. */
void kvs_sparse_store_counts(const kvs_sparse_store *s, uint64_t *scored, uint64_t *by_selector,
                             uint64_t *audits, double *audit_error);

kvs_status kvs_sparse_store_select(kvs_sparse_store *s, uint32_t layer, const float *q,
                                   kvs_sparse_head *heads, uint32_t n_rows, uint32_t sink,
                                   uint32_t recent, uint32_t topk, uint8_t *hit,
                                   uint32_t *fetch_rows, uint32_t *fetch_slots, uint32_t *n_fetch);

#endif
