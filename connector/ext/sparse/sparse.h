/* sparse.h - the sparse decode hooks (engine ABI 1.9, docs/sparse.md): per request, the rows of its
 * stored chunks (sparse_store.h), a QSAC state per layer and KV head, and the rows each step
 * selects read from the tiers into the engine's head cache, on the request's own thread when every
 * tier may be read from one. */
#ifndef KVS_SPARSE_H
#define KVS_SPARSE_H

#include "abi/kvstrata.h"
#include "abi/kvstrata_sparse.h"

struct kvs_handle;

kvs_status kvs_sparse_begin(struct kvs_handle *h, const char *req_id, const int32_t *tokens,
                            uint64_t n_tokens, const kvs_sparse_cache *cache,
                            const kvs_sparse_params *params, uint64_t *stored_tokens);
kvs_status kvs_sparse_select(struct kvs_handle *h, const char *req_id, uint32_t layer,
                             const float *q, uint64_t n_rows, uint32_t flags);
kvs_status kvs_sparse_wait(struct kvs_handle *h, const char *req_id, uint32_t layer);
kvs_status kvs_sparse_get_stats(struct kvs_handle *h, const char *req_id, kvs_sparse_stats *out);
kvs_status kvs_sparse_end(struct kvs_handle *h, const char *req_id);
/* End every request, dropping the steps only queued (close). */
void kvs_sparse_close(struct kvs_handle *h);

#endif
