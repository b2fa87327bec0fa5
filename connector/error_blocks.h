/* error_blocks.h - the worker's load-error list: the blocks of failed loads, which
 * load_error_blocks hands the engine to recompute. Room is reserved at bind_meta for every block
 * the loads still to land may add, so adding one never allocates and is never lost. */
#ifndef KVS_ERROR_BLOCKS_H
#define KVS_ERROR_BLOCKS_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "meta.h"

struct kvs_load_work;

/* Blocks a failure of load would add to the error list (those its tokens cover). */
uint64_t kvs_load_error_span(const kvs_handle *h, const kvs_meta_load *load);
/* Room in the error list for `more` blocks beyond those listed, so that adding them never allocates.
 * KVS_ENOMEM, the list unchanged, when the room cannot be had. */
kvs_status kvs_worker_reserve_error_blocks(kvs_handle *h, uint64_t more);
/* Add block to the list (once); never allocates: the room was reserved. */
void kvs_worker_add_error_block(kvs_handle *h, uint32_t block);

/* A failed load's blocks go to the error list and its count to the stats (the caller's thread). */
void kvs_worker_account_failure(kvs_handle *h, const struct kvs_load_work *w);

#endif
