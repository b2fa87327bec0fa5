#include "object.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "common/log.h"
#include "keys.h"

uint32_t kvs_object_payload_offset(uint32_t n_layers) {
    uint64_t raw = sizeof(kvs_object_header) + (uint64_t)n_layers * sizeof(uint64_t);
    return (uint32_t)((raw + KVS_OBJECT_ALIGN - 1) / KVS_OBJECT_ALIGN * KVS_OBJECT_ALIGN);
}

uint64_t kvs_object_bytes(uint32_t n_layers, uint64_t layer_bytes) {
    return kvs_object_payload_offset(n_layers) + (uint64_t)n_layers * layer_bytes;
}

void kvs_object_init(void *object, const kvs_key *fingerprint, const kvs_key *key,
                     uint32_t n_layers, uint32_t n_tokens, uint64_t layer_bytes) {
    kvs_object_header *h = object;
    memset(h, 0, sizeof *h);
    h->magic = KVS_OBJECT_MAGIC;
    h->version = KVS_OBJECT_VERSION;
    h->codec = KVS_CODEC_RAW;
    h->fingerprint = *fingerprint;
    h->key = *key;
    h->layer_first = 0;
    h->n_layers = n_layers;
    h->n_tokens = n_tokens;
    h->payload_offset = kvs_object_payload_offset(n_layers);
    h->layer_bytes = layer_bytes;
    memset(kvs_object_layer_hashes(object), 0, n_layers * sizeof(uint64_t));
}

uint64_t kvs_object_header_digest(const void *object) {
    const kvs_object_header *h = object;
    kvs_object_header copy = *h;
    copy.header_hash = 0;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, &copy, sizeof copy);
    /* the layer table, and for a lossy object the codec record after it */
    size_t table = (size_t)h->n_layers * sizeof(uint64_t) +
                   (kvs_codec_is_lossy(h->codec) ? sizeof(kvs_object_codec)
                                                 : 0); /* raw and derived objects have none */
    XXH3_64bits_update(&st, (const uint8_t *)object + sizeof *h, table);
    return XXH3_64bits_digest(&st);
}

void kvs_object_seal(void *object) {
    ((kvs_object_header *)object)->header_hash = kvs_object_header_digest(object);
}

static kvs_status check_header(const void *object, uint64_t len, const kvs_key *fingerprint,
                               const kvs_key *key, uint32_t n_layers, uint32_t n_tokens,
                               uint64_t layer_bytes, int allow_derived, char *err,
                               uint64_t err_len) {
    char hex[33];
    kvs_key_hex(key, hex);
    if (len < sizeof(kvs_object_header)) {
        kvs_fmt(err, err_len, "object %s: %llu bytes is shorter than a header", hex,
                (unsigned long long)len);
        return KVS_ECORRUPT;
    }
    const kvs_object_header *h = object;
    if (h->magic != KVS_OBJECT_MAGIC ||
        (h->version != KVS_OBJECT_VERSION && h->version != KVS_OBJECT_VERSION_KEYED) ||
        (h->codec != KVS_CODEC_RAW && !(allow_derived && h->codec == KVS_CODEC_DERIVED))) {
        kvs_fmt(err, err_len, "object %s: bad magic/version/codec (%08x/%u/%u)", hex, h->magic,
                h->version, h->codec);
        return KVS_ECORRUPT;
    }
    if (h->n_layers != n_layers || h->n_tokens != n_tokens || h->layer_bytes != layer_bytes ||
        h->payload_offset != kvs_object_payload_offset(n_layers) ||
        len < kvs_object_bytes(n_layers, layer_bytes)) {
        kvs_fmt(err, err_len,
                "object %s: geometry %u layers x %u tokens x %llu bytes (len %llu) does not match "
                "%u x %u x %llu",
                hex, h->n_layers, h->n_tokens, (unsigned long long)h->layer_bytes,
                (unsigned long long)len, n_layers, n_tokens, (unsigned long long)layer_bytes);
        return KVS_ECORRUPT;
    }
    if (kvs_object_header_digest(object) != h->header_hash) {
        kvs_fmt(err, err_len, "object %s: header checksum mismatch", hex);
        return KVS_ECORRUPT;
    }
    if (memcmp(&h->fingerprint, fingerprint, sizeof *fingerprint) != 0 ||
        memcmp(&h->key, key, sizeof *key) != 0) {
        kvs_fmt(err, err_len, "object %s: stored under another key or model fingerprint", hex);
        return KVS_ECORRUPT;
    }
    return KVS_OK;
}

kvs_status kvs_object_check_header(const void *object, uint64_t len, const kvs_key *fingerprint,
                                   const kvs_key *key, uint32_t n_layers, uint32_t n_tokens,
                                   uint64_t layer_bytes, char *err, uint64_t err_len) {
    return check_header(object, len, fingerprint, key, n_layers, n_tokens, layer_bytes, 0, err,
                        err_len);
}

kvs_status kvs_object_check_raw_layout(const void *object, uint64_t len, const kvs_key *fingerprint,
                                       const kvs_key *key, uint32_t n_layers, uint32_t n_tokens,
                                       uint64_t layer_bytes, char *err, uint64_t err_len) {
    return check_header(object, len, fingerprint, key, n_layers, n_tokens, layer_bytes, 1, err,
                        err_len);
}
