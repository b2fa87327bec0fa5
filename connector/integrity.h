/* integrity.h - what `integrity: keyed` means for a handle: the key its tiers' tags are under, the
 * seal every save gets, and the check every load from a keyed tier makes (object_mac.h). A handle
 * with no keyed tier seals and checks as before (XXH3 only). */
#ifndef KVS_INTEGRITY_H
#define KVS_INTEGRITY_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata_backend.h"

struct kvs_handle;
struct kvs_object_mac;

/* Load the keyed tiers' key (every keyed tier of a chain names the same one) into h->mac. A worker
 * only: a scheduler never reads an object. KVS_ECONFIG or KVS_EIO with a sentence. */
kvs_status kvs_integrity_setup(struct kvs_handle *h, char *err, size_t err_len);
void kvs_integrity_close(struct kvs_handle *h);

/* 1 when loads from tier t must check tags. */
int kvs_integrity_keyed(const struct kvs_handle *h, int tier);

/* Seal a saved object whose layer hashes are set: keyed when the handle has a key. */
void kvs_integrity_seal(const struct kvs_handle *h, void *object);
/* Seal a saved object whose nonce and layer tags its copies wrote (kvs_object_mac_draw_nonce):
 * keyed, or whole by kvs_integrity_seal when that fails. */
void kvs_integrity_seal_tagged(const struct kvs_handle *h, void *object);
/* The same for objects[0..n), one per item on h->mac_workers beside the caller. */
void kvs_integrity_seal_objects(struct kvs_handle *h, void *const *objects, uint64_t n);

/* For an object read from tier t into memory only this process writes: nothing for an unkeyed
 * tier; for a keyed one its header tag, and every layer's when all_layers. KVS_ECORRUPT with a
 * sentence (counted in integrity_rejects). */
kvs_status kvs_integrity_check(struct kvs_handle *h, int tier, const void *object, uint64_t len,
                               int all_layers, char *err, size_t err_len);
/* Every layer tag of objects[0..n) (each read from a keyed tier into this process's memory, its
 * header checked by kvs_integrity_check), on h->mac_workers beside the caller: bad[i] set for each
 * object with a wrong tag (counted in integrity_rejects). */
void kvs_integrity_check_objects(struct kvs_handle *h, const void *const *objects, uint64_t n,
                                 uint8_t *bad);
/* Layer l of an object whose header check_passed. */
kvs_status kvs_integrity_check_layer(struct kvs_handle *h, int tier, const void *object,
                                     uint32_t layer, char *err, size_t err_len);

#endif
