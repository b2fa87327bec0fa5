/* store_batch.h - submitted batches (store_batch.c): the store's threads, tickets, wait and drain. */
#ifndef KVS_STORE_BATCH_H
#define KVS_STORE_BATCH_H

#include "store_state.h"

kvs_status kvs_store_threads_start(kvs_store *s, uint32_t n_threads, char *err, size_t err_len);
/* Waits for every batch in flight, stops the threads, drops what was not collected. */
void kvs_store_threads_stop(kvs_store *s);
kvs_status kvs_store_submit(kvs_store *s, uint32_t op, const kvs_store_keys *keys,
                            const kvs_store_sg *sg, uint32_t flags, uint64_t *ticket);
kvs_status kvs_store_wait(kvs_store *s, uint64_t ticket, uint64_t timeout_ms,
                          kvs_store_result *results, uint64_t cap, uint64_t *n_failed);
kvs_status kvs_store_drain(kvs_store *s, uint64_t *tickets, uint64_t cap, uint64_t *n);

#endif
