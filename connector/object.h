/* object.h - the stored form of one chunk: a fixed header, a per-layer checksum table, then the
 * payload laid out layer by layer (see kernels.h for one layer's layout), so one layer can be read and
 * verified alone. Every tier stores objects; every reader verifies them. */
#ifndef KVS_OBJECT_H
#define KVS_OBJECT_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "kernels/cpu/codec.h"

#define KVS_OBJECT_MAGIC         0x4f53564bu /* "KVSO" little-endian */
#define KVS_OBJECT_VERSION       1
/* A raw object sealed with integrity tags (object_mac.h): the same layout, its record in the header
 * page; readers of checksums take it as version 1. (2 was the same with Poly1305 over each whole
 * layer: no longer read, a miss.) */
#define KVS_OBJECT_VERSION_KEYED 3
#define KVS_CODEC_RAW            0
/* A raw payload whose values were computed over KV that was loaded lossy (docs/compress.md): the
 * layout and checksums of a raw object, refused by readers of raw objects unless they accept lossy
 * KV (loads.accept_lossy). */
#define KVS_CODEC_DERIVED        3
#define KVS_OBJECT_ALIGN         4096 /* payload offset alignment, so O_DIRECT tiers can read layers */

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

/* A lossy object (codec KVS_CODEC_KIVI, KVS_CODEC_INT8 or KVS_CODEC_DROP, kernels/cpu/codec.h) carries its codec's
 * parameters right after the layer hash table, covered by header_hash; its layer_bytes is one
 * encoded layer's size and each layer hash is the XXH3-64 of the encoded bytes. Raw objects have no
 * such record and are byte for byte what they always were; a reader that knows only raw objects
 * refuses lossy ones by their codec field. */
typedef struct kvs_object_codec {
    uint8_t kind; /* = the header's codec */
    uint8_t bits;
    uint16_t k_group;
    uint16_t v_group;
    uint16_t dtype;           /* the pages' element type it was encoded from */
    uint64_t raw_layer_bytes; /* one layer of the raw payload: what decoding writes */
} kvs_object_codec;

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
/* XXH3-64 of the header (header_hash as zero), the layer table and, for a lossy object, its codec
 * record: what header_hash holds. The caller has checked the object is long enough. */
uint64_t kvs_object_header_digest(const void *object);
/* Compute header_hash once every layer hash is set. */
void kvs_object_seal(void *object);
/* The same for a lossy object: header, table and codec record. */
uint32_t kvs_object_lossy_payload_offset(uint32_t n_layers);
/* The codec record of a lossy object (its header's codec is not KVS_CODEC_RAW). */
static inline const kvs_object_codec *kvs_object_codec_of(const void *object) {
    const kvs_object_header *h = (const kvs_object_header *)object;
    return (const kvs_object_codec *)((const uint8_t *)object + sizeof *h +
                                      (uint64_t)h->n_layers * sizeof(uint64_t));
}
/* Bytes of the lossy object that kvs_object_encode makes of a raw one of this geometry. */
uint64_t kvs_object_lossy_bytes(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                uint32_t n_layers, uint32_t n_tokens);

/* Encode a raw object (checked whole: header, header hash, every layer's checksum, so no damaged
 * byte is ever sealed under a valid lossy checksum) into a lossy one at out (cap bytes): same key,
 * fingerprint and geometry, each layer encoded by c and hashed, the codec record written, sealed.
 * *out_len gets its size. KVS_ECORRUPT for a damaged raw object or one whose layers are not of
 * `shape` (its geometry is checked against shape before the header sizes any read), KVS_EINVAL for
 * a codec that cannot encode this shape or data (the object then stays raw), KVS_EOVERFLOW if cap
 * is short; a sentence in err. */
kvs_status kvs_object_encode(const void *raw, uint64_t raw_len, const kvs_codec *c,
                             const kvs_kv_shape *shape, uint32_t dtype, void *out, uint64_t cap,
                             uint64_t *out_len, char *err, uint64_t err_len);

/* Check a lossy object as kvs_object_check_header checks a raw one, for a model whose raw layers
 * are raw_layer_bytes of shape and dtype: a known codec that can encode them, its record consistent
 * with the header (layer_bytes the codec's encoded size). *codec gets the record. */
kvs_status kvs_object_check_lossy(const void *object, uint64_t len, const kvs_key *fingerprint,
                                  const kvs_key *key, uint32_t n_layers, uint32_t n_tokens,
                                  const kvs_kv_shape *shape, uint32_t dtype, kvs_codec *codec,
                                  char *err, uint64_t err_len);

/* Every encoded layer of a lossy object checked (kvs_object_check_lossy first) against its checksum:
 * KVS_ECORRUPT with a sentence naming the first that fails. */
kvs_status kvs_object_check_lossy_layers(const void *object, char *err, uint64_t err_len);

/* The kept mask of a DROP object checked by kvs_object_check_lossy_layers (bit t set: token t of the
 * chunk was kept, kernels/cpu/codec.h); NULL for any other codec. */
const uint8_t *kvs_object_kept_mask(const void *object);

/* Decode a lossy object whole (checked as kvs_object_check_lossy checks it, under its own key, and
 * each layer against its checksum before it is decoded) into a sealed raw object at raw (cap bytes:
 * kvs_object_bytes of the raw geometry). KVS_ECORRUPT, KVS_EOVERFLOW or KVS_ENOMEM with a sentence. */
kvs_status kvs_object_decode(const void *object, uint64_t len, const kvs_key *fingerprint,
                             uint32_t n_layers, uint32_t n_tokens, const kvs_kv_shape *shape,
                             uint32_t dtype, void *raw, uint64_t cap, char *err, uint64_t err_len);

/* Check magic, version, codec, header hash, fingerprint, key, geometry and the length; on failure
 * KVS_ECORRUPT with a sentence in err. Payload hashes are checked by the reader per layer. */
kvs_status kvs_object_check_header(const void *object, uint64_t len, const kvs_key *fingerprint,
                                   const kvs_key *key, uint32_t n_layers, uint32_t n_tokens,
                                   uint64_t layer_bytes, char *err, uint64_t err_len);
/* The same, also taking a derived object (KVS_CODEC_DERIVED: raw layout) as intact. */
kvs_status kvs_object_check_raw_layout(const void *object, uint64_t len, const kvs_key *fingerprint,
                                       const kvs_key *key, uint32_t n_layers, uint32_t n_tokens,
                                       uint64_t layer_bytes, char *err, uint64_t err_len);

#endif
