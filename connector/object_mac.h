/* object_mac.h - keyed objects: a Poly1305 tag per layer and one over the header, under a tenant's
 * integrity key, so that a writer without the key (another tenant of a shared node, a man in the
 * middle, anyone who can write a shared tier's memory or files) can cause misses, never wrong KV.
 * XXH3 (object.h) catches accidents; these tags are what a tier marked `integrity: keyed` demands.
 *
 * A keyed object is a raw (or derived) object of version KVS_OBJECT_VERSION_KEYED whose header area
 * holds, after the layer hash table, a record: a 12-byte nonce drawn at random when it is sealed, 4
 * bytes of zero, the header tag, then one tag per layer. Each tag is Poly1305 under a one-time key:
 * ChaCha20 keystream block i (the first 32 bytes) under a key derived from the integrity key, with the
 * object's nonce; block 0 keys the header tag, block 1 + l layer l's. A layer tag's Poly1305 runs
 * over the layer's NH (common/nh.h: 32 bytes per KiB, the last unit zero-padded to 16 bytes, under
 * an NH key derived from the same key) and the layer's length as 8 little-endian bytes, Adiantum's
 * NHPoly1305: NH runs at memory speed where Poly1305 alone does not. The header tag covers the
 * header (header_hash as zero), the layer hash table and the record up to the layer tags, so the
 * geometry, key, fingerprint and every layer tag are bound together; a layer tag covers that layer's
 * bytes only, so one layer can be read and checked alone. A fresh nonce per seal keeps two different
 * objects saved under one chunk key from ever sharing a one-time key.
 *
 * Every call is thread-safe on one kvs_object_mac (it holds only the key). */
#ifndef KVS_OBJECT_MAC_H
#define KVS_OBJECT_MAC_H

#include <stddef.h>
#include <stdint.h>

#include "common/nhpoly.h"
#include "object.h"

#define KVS_OBJECT_TAG_BYTES   16u
#define KVS_OBJECT_NONCE_BYTES 12u
#define KVS_INTEGRITY_KEY_MIN  32u /* an integrity key file holds 32..1024 bytes */
#define KVS_INTEGRITY_KEY_MAX  1024u

typedef struct kvs_object_mac kvs_object_mac;

/* A MAC under the key bytes (an integrity key file's, or a tenant key's): the key it uses is
 * HMAC-SHA256(bytes, "kvstrata-object-mac-v1"). KVS_ENOMEM or KVS_EIO (libcrypto) with a sentence. */
kvs_status kvs_object_mac_open(const uint8_t *key, size_t len, kvs_object_mac **out, char *error,
                               size_t error_len);
void kvs_object_mac_close(kvs_object_mac *m);
/* 1 when both were opened from the same key bytes. */
int kvs_object_mac_same(const kvs_object_mac *a, const kvs_object_mac *b);

/* Bytes of the keyed record of an object of n_layers, and where it starts in a raw object. */
uint64_t kvs_object_mac_record_bytes(uint32_t n_layers);
uint64_t kvs_object_mac_record_offset(uint32_t n_layers);
/* 1 when a raw object of n_layers has room for the record before its payload (up to 166 layers:
 * the header page's room; a keyed object is laid out as an unkeyed one). */
int kvs_object_mac_fits(uint32_t n_layers);

/* Seal a raw or derived object whose layer hashes are set: version KVS_OBJECT_VERSION_KEYED, a fresh
 * nonce, every layer's tag and the header tag, then header_hash (kvs_object_seal). KVS_EIO when
 * libcrypto fails (the object is then sealed unkeyed: a keyed tier will refuse it). */
kvs_status kvs_object_seal_keyed(const kvs_object_mac *m, void *object);

/* Check that the object (len bytes, all readable) is keyed and that its header tag is right; then
 * its header, table and layer tags can be trusted. The header's sizes are the writer's: a reader
 * checks them against the geometry it expects first (kvs_integrity_check does). KVS_ECORRUPT with a
 * sentence for an object that is not keyed, too short, or whose tag is wrong. */
kvs_status kvs_object_check_keyed_header(const kvs_object_mac *m, const void *object, uint64_t len,
                                         char *error, size_t error_len);
/* Check layer l's bytes against its tag (the header checked first). KVS_ECORRUPT with a sentence. */
kvs_status kvs_object_check_keyed_layer(const kvs_object_mac *m, const void *object, uint32_t layer,
                                        char *error, size_t error_len);

/* Layer tags computed as the bytes stream by (a copy into the pages: kernels/device.h): begin layer
 * `layer`'s tag of an object with this nonce in s, feed it the layer's bytes, compare
 * kvs_nhpoly_final's tag with the object's (copied out of it once its header tag held). 0 when
 * libcrypto fails. */
int kvs_object_mac_layer_begin(const kvs_object_mac *m, const uint8_t nonce[KVS_OBJECT_NONCE_BYTES],
                               uint32_t layer, kvs_nhpoly *s);
/* Layer tags computed as a save's copies write the object: draw the object's nonce first (0: no
 * room or no randomness; seal it whole then), finish each layer's tag into its slot, and seal with
 * kvs_object_seal_keyed_tagged, which adds the version and the header tag. */
int kvs_object_mac_draw_nonce(void *object);
uint8_t *kvs_object_mac_layer_tag_slot(void *object, uint32_t layer);
kvs_status kvs_object_seal_keyed_tagged(const kvs_object_mac *m, void *object);
/* A keyed object's nonce and layer l's tag (the object's header checked first). */
const uint8_t *kvs_object_mac_nonce(const void *object);
const uint8_t *kvs_object_mac_layer_tag(const void *object, uint32_t layer);

#endif
