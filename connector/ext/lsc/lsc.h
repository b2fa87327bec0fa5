/* lsc.h - the layer stream cache's hooks (engine ABI 1.8, docs/peer_gpu.md): stream blocks of an
 * engine's own KV kept in a peer_gpu tier's lent memory, fetched and stored a layer at a time. */
#ifndef KVS_LSC_H
#define KVS_LSC_H

#include "abi/kvstrata.h"

struct kvs_handle;

kvs_status kvs_lsc_reserve(struct kvs_handle *h, const kvs_layer_view *buffer, uint32_t n_blocks,
                           uint32_t *granted, uint32_t *stream_tokens);
kvs_status kvs_lsc_fetch(struct kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                         const uint32_t *pages, uint32_t n);
kvs_status kvs_lsc_store(struct kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                         const uint32_t *pages, uint32_t n);
/* Give every stream block back and free the cache (register_kv again, close). */
void kvs_lsc_close(struct kvs_handle *h);

#endif
