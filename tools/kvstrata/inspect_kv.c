#include "inspect_kv.h"

#include <stdio.h>
#include <string.h>

#include "common/xxh3.h"
#include "connector/object.h"

static int describe(void *ctx, const uint8_t *head, uint64_t head_len, uint64_t object_len,
                    kvs_ssd_inspect_object *o) {
    (void)ctx;
    (void)object_len;
    kvs_object_header h;
    if (head_len < sizeof h) return 0;
    memcpy(&h, head, sizeof h);
    if (h.magic != KVS_OBJECT_MAGIC ||
        (h.version != KVS_OBJECT_VERSION && h.version != KVS_OBJECT_VERSION_KEYED))
        return 0;
    o->fingerprint = h.fingerprint;
    o->n_layers = h.n_layers;
    o->n_tokens = h.n_tokens;
    o->codec = h.codec;
    return 1;
}

/* The header's geometry, its checksum, then each layer's: 1 and a sentence at the first that
 * fails. */
static int check(void *ctx, const uint8_t *obj, uint64_t len, char *what, size_t what_len) {
    (void)ctx;
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

const kvs_ssd_inspect_content *cli_inspect_kv_content(void) {
    static const kvs_ssd_inspect_content content = {
        .head_bytes = sizeof(kvs_object_header), .describe = describe, .check = check};
    return &content;
}
