/* server_objects.c - abi/kvstrata_server.h's reading of stored objects for tools: what a KV object
 * (object.h) is, from its bytes, and whether its own checksums hold. */
#include <stdio.h>
#include <string.h>

#include "abi/kvstrata_server.h"
#include "common/xxh3.h"
#include "object.h"

uint64_t kvs_server_object_head_bytes(void) {
    return sizeof(kvs_object_header);
}

int kvs_server_object_describe(const void *head, uint64_t head_len, kvs_server_object_info *out) {
    kvs_object_header h;
    if (head_len < sizeof h) return 0;
    memcpy(&h, head, sizeof h);
    if (h.magic != KVS_OBJECT_MAGIC ||
        (h.version != KVS_OBJECT_VERSION && h.version != KVS_OBJECT_VERSION_KEYED))
        return 0;
    out->fingerprint = h.fingerprint;
    out->n_layers = h.n_layers;
    out->n_tokens = h.n_tokens;
    out->codec = h.codec;
    return 1;
}

int kvs_server_object_check(const void *object, uint64_t len, char *what, size_t what_len) {
    const uint8_t *obj = object;
    kvs_object_header h;
    if (len < sizeof h) {
        snprintf(what, what_len, "KV object of %llu bytes is shorter than its header",
                 (unsigned long long)len);
        return 1;
    }
    memcpy(&h, obj, sizeof h);
    uint64_t table = sizeof h + (uint64_t)h.n_layers * sizeof(uint64_t) +
                     (kvs_codec_is_lossy(h.codec) ? sizeof(kvs_object_codec) : 0);
    if (h.n_layers > (1u << 20) || table > h.payload_offset || h.payload_offset > len ||
        (h.layer_bytes && h.n_layers > (len - h.payload_offset) / h.layer_bytes)) {
        snprintf(what, what_len,
                 "KV object header: %u layers of %llu bytes at offset %u do not fit its %llu "
                 "bytes",
                 h.n_layers, (unsigned long long)h.layer_bytes, h.payload_offset,
                 (unsigned long long)len);
        return 1;
    }
    if (kvs_object_header_digest(obj) != h.header_hash) {
        snprintf(what, what_len, "KV object header checksum mismatch");
        return 1;
    }
    const uint8_t *hashes = obj + sizeof h;
    for (uint32_t l = 0; l < h.n_layers; l++) {
        uint64_t want;
        memcpy(&want, hashes + (uint64_t)l * sizeof want, sizeof want);
        uint64_t got = kvs_xxh3_64(obj + h.payload_offset + (uint64_t)l * h.layer_bytes,
                                   (size_t)h.layer_bytes);
        if (got != want) {
            snprintf(what, what_len,
                     "KV object layer %u checksum mismatch (header records %016llx, data hashes "
                     "to %016llx)",
                     l, (unsigned long long)want, (unsigned long long)got);
            return 1;
        }
    }
    return 0;
}
