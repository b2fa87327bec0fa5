/* object.h - the stored form of one chunk: a fixed header, a per-layer checksum table, then the
 * payload laid out layer by layer (see kernels.h for one layer's layout), so one layer can be read and
 * verified alone. Every tier stores objects; every reader verifies them. */
#ifndef KVS_OBJECT_H
#define KVS_OBJECT_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"

#define KVS_OBJECT_MAGIC   0x4f53564bu /* "KVSO" little-endian */
#define KVS_OBJECT_VERSION 1
#define KVS_CODEC_RAW      0
#define KVS_OBJECT_ALIGN   4096 /* payload offset alignment, so O_DIRECT tiers can read layers */

typedef struct kvs_object_header {
    uint32_t magic;
    uint16_t version;
    uint16_t codec;
    kvs_key fingerprint;
    kvs_key key;
    uint32_t layer_first;
    uint32_t n_layers;
    uint32_t n_tokens;
    uint32_t payload_offset; /* bytes from the object start to layer 0 of the payload */
    uint64_t layer_bytes;    /* payload bytes of one layer */
    uint64_t header_hash;    /* XXH3-64 of the header (this field zero) and the layer hash table */
    /* followed by uint64_t layer_hash[n_layers] */
} kvs_object_header;

/* Header-plus-table size rounded up to KVS_OBJECT_ALIGN. */
uint32_t kvs_object_payload_offset(uint32_t n_layers);
/* Whole object size. */
uint64_t kvs_object_bytes(uint32_t n_layers, uint64_t layer_bytes);

static inline uint64_t *kvs_object_layer_hashes(void *object) {
    return (uint64_t *)((uint8_t *)object + sizeof(kvs_object_header));
}
static inline uint8_t *kvs_object_layer(void *object, uint32_t layer) {
    kvs_object_header *h = (kvs_object_header *)object;
    return (uint8_t *)object + h->payload_offset + (uint64_t)layer * h->layer_bytes;
}

/* Fill the header fields (hashes zeroed) before layers are written. */
void kvs_object_init(void *object, const kvs_key *fingerprint, const kvs_key *key,
                     uint32_t n_layers, uint32_t n_tokens, uint64_t layer_bytes);
/* Compute header_hash once every layer hash is set. */
void kvs_object_seal(void *object);
/* Check magic, version, codec, header hash, fingerprint, key, geometry and the length; on failure
 * KVS_ECORRUPT with a sentence in err. Payload hashes are checked by the reader per layer. */
kvs_status kvs_object_check_header(const void *object, uint64_t len, const kvs_key *fingerprint,
                                   const kvs_key *key, uint32_t n_layers, uint32_t n_tokens,
                                   uint64_t layer_bytes, char *err, uint64_t err_len);

#endif
