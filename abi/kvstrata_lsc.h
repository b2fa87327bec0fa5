/*
 * kvstrata_lsc.h - the layer stream cache, an extension of the engine-facing ABI (since 1.8).
 *
 * The engine keeps KV of its own in memory another process lends (the handle's first tier of type
 * peer_gpu, docs/peer_gpu.md), a stream block at a time: chunk_tokens tokens of every layer
 * together (block-major), fetched into and stored from a small buffer of its own one layer at a
 * time, so its context can outgrow its own memory (SwiftCache's layer stream cache). The extension
 * adds no types: the buffer is a kvs_layer_view of kvstrata.h.
 *
 * Hooks (kvs_api; worker role, after register_kv; host device only: KVS_ENOTSUP elsewhere and
 * without a peer_gpu tier). The calls of one handle must not overlap.
 *
 * lsc_reserve(h, buffer, n_blocks, granted, stream_tokens): `buffer` describes the engine's buffer
 *   as one layer of pages in the registered caches' geometry (heads, head size, block tokens; its
 *   own n_blocks); every stream block takes chunk_tokens / block_tokens of its pages while it is in
 *   the buffer. Reserve n_blocks stream blocks (zeroed), keeping those reserved already; *granted
 *   gets how many the handle holds (fewer than asked when the lent memory has no room for more:
 *   call again later, the lender's offers arrive after the tier connects), *stream_tokens (may be
 *   NULL) the tokens of a stream block (the config's chunk_tokens). n_blocks 0 gives every block
 *   back (buffer may then be NULL): a first call so learns stream_tokens.
 *
 * lsc_fetch(h, layer, blocks, pages, n): copy layer `layer` of stream blocks blocks[0..n) into the
 *   buffer: block i's tokens go to the buffer pages pages[i * P .. (i + 1) * P), P = chunk_tokens /
 *   block_tokens, in token order.
 *
 * lsc_store(h, layer, blocks, pages, n): the reverse: layer `layer` of the buffer pages into stream
 *   blocks blocks[0..n).
 *
 * A stream block whose memory the lender takes back is gone: fetch and store fail with KVS_EIO and
 * the engine recomputes what it held. KVS_ESTATE before a reservation; KVS_EINVAL for a layer,
 * block or page out of range or a buffer view that does not fit the registered geometry.
 */
#ifndef KVSTRATA_LSC_H
#define KVSTRATA_LSC_H

#include "kvstrata.h"

#endif /* KVSTRATA_LSC_H */
