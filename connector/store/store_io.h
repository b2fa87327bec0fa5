/* store_io.h - one key's work for the store (store_io.c): its kvstrata key, its value moved between
 * the caller's buffers and the tiers, the leading-run exists and the pins it takes. */
#ifndef KVS_STORE_IO_H
#define KVS_STORE_IO_H

#include "store_state.h"

/* The kvstrata key of an engine key under s's namespace and tenant. */
void kvs_store_key_of(const kvs_store *s, const void *bytes, uint64_t len, kvs_key *out);
/* One key of a batch, on a store thread (scratch: that thread's object buffer). */
void kvs_store_get_one(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov, uint64_t n_iov,
                       void *scratch, kvs_store_result *r);
/* Keys[0..n) of a get batch (n <= KVS_STORE_READ_DEPTH; key i's buffers iov[seg[i] .. seg[i + 1]))
 * with n scratch slots of `slot` bytes: keys a tier reads in batches are read together. */
void kvs_store_get_batch(kvs_store *s, const kvs_key *keys, const kvs_store_iov *iov,
                         const uint64_t *seg, uint32_t n, uint8_t *scratch, uint64_t slot,
                         kvs_store_result *r);
void kvs_store_put_one(kvs_store *s, const kvs_key *key, const kvs_store_iov *iov, uint64_t n_iov,
                       uint32_t flags, void *scratch, kvs_store_result *r);
void kvs_store_exists_one(kvs_store *s, const kvs_key *key, kvs_store_result *r);
void kvs_store_remove_one(kvs_store *s, const kvs_key *key, kvs_store_result *r);
/* The table's exists and unpin over derived keys[n]. */
kvs_status kvs_store_exists_keys(kvs_store *s, const kvs_key *keys, uint64_t n, uint32_t flags,
                                 uint64_t pin_ms, uint8_t *states, uint64_t *n_leading);
void kvs_store_unpin_keys(kvs_store *s, const kvs_key *keys, uint64_t n);
/* At close: every pin still live is dropped. */
void kvs_store_unpin_all(kvs_store *s);
/* A batch of keys checked (sizes, offsets) and hashed into out[keys->n] (malloc'd). */
kvs_status kvs_store_derive_keys(kvs_store *s, const kvs_store_keys *keys, kvs_key **out);

#endif
