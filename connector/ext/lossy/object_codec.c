/* object_codec.c - lossy objects (object.h): a raw object encoded layer by layer with a codec of
 * kernels/cpu/codec.h, and the check a reader makes before decoding one. */
#include <string.h>

#include "common/log.h"
#include "common/xxh3.h"
#include "connector/keys.h"
#include "connector/object.h"

uint32_t kvs_object_lossy_payload_offset(uint32_t n_layers) {
    uint64_t raw = sizeof(kvs_object_header) + (uint64_t)n_layers * sizeof(uint64_t) +
                   sizeof(kvs_object_codec);
    return (uint32_t)((raw + KVS_OBJECT_ALIGN - 1) / KVS_OBJECT_ALIGN * KVS_OBJECT_ALIGN);
}

uint64_t kvs_object_lossy_bytes(const kvs_codec *c, const kvs_kv_shape *shape, uint32_t dtype,
                                uint32_t n_layers, uint32_t n_tokens) {
    return kvs_object_lossy_payload_offset(n_layers) +
           (uint64_t)n_layers * kvs_codec_layer_bytes(c, shape, dtype, n_tokens);
}

/* A raw object of this shape, whole in raw_len: the geometry is checked against the caller's shape
 * first, so nothing the header says sizes a read before it is known to be this model's and to fit.
 * hex: the object's key, for the messages (left "?" when there is no header). */
static kvs_status check_raw(const void *raw, uint64_t raw_len, const kvs_kv_shape *shape,
                            char hex[33], char *err, uint64_t err_len) {
    const kvs_object_header *h = raw;
    if (raw_len < sizeof *h) {
        kvs_fmt(err, err_len, "a raw object of %llu bytes is shorter than a header",
                (unsigned long long)raw_len);
        return KVS_ECORRUPT;
    }
    kvs_key_hex(&h->key, hex);
    uint64_t total = 0;
    if (h->magic != KVS_OBJECT_MAGIC ||
        (h->version != KVS_OBJECT_VERSION && h->version != KVS_OBJECT_VERSION_KEYED) ||
        (h->codec != KVS_CODEC_RAW && h->codec != KVS_CODEC_DERIVED) || h->n_layers == 0 ||
        h->n_layers > 65536 || h->n_tokens == 0 || h->n_tokens > (1u << 24) ||
        h->layer_bytes != kvs_kernel_layer_bytes(shape, h->n_tokens) ||
        h->payload_offset != kvs_object_payload_offset(h->n_layers) ||
        __builtin_mul_overflow((uint64_t)h->n_layers, h->layer_bytes, &total) ||
        __builtin_add_overflow(total, (uint64_t)h->payload_offset, &total) || raw_len < total ||
        kvs_object_header_digest(raw) != h->header_hash) {
        kvs_fmt(err, err_len, "object %s: not an intact raw object of this shape", hex);
        return KVS_ECORRUPT;
    }
    return KVS_OK;
}

/* The lossy object's header and codec record, from the raw header h; layer_bytes enc. */
static void lossy_header(void *out, const kvs_object_header *h, const kvs_codec *c, uint32_t dtype,
                         uint64_t enc) {
    kvs_object_header *o = out;
    *o = *h;
    o->version = KVS_OBJECT_VERSION; /* a lossy object carries no integrity tags */
    o->codec = c->kind;
    o->payload_offset = kvs_object_lossy_payload_offset(h->n_layers);
    o->layer_bytes = enc;
    o->header_hash = 0;
    kvs_object_codec rec = {.kind = c->kind,
                            .bits = c->bits,
                            .k_group = c->k_group,
                            .v_group = c->v_group,
                            .dtype = (uint16_t)dtype,
                            .raw_layer_bytes = h->layer_bytes};
    memcpy((uint8_t *)out + sizeof *o + (uint64_t)h->n_layers * sizeof(uint64_t), &rec, sizeof rec);
}

/* Every layer of the raw object against its checksum: none is encoded from damaged bytes. */
static kvs_status check_raw_layers(const void *raw, const char *hex, char *err, uint64_t err_len) {
    const kvs_object_header *h = raw;
    const uint64_t *raw_hash = kvs_object_layer_hashes((void *)(uintptr_t)raw);
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const uint8_t *layer =
            (const uint8_t *)raw + h->payload_offset + (uint64_t)l * h->layer_bytes;
        if (kvs_xxh3_64(layer, h->layer_bytes) != raw_hash[l]) {
            kvs_fmt(err, err_len, "object %s: layer %u fails its checksum; not encoded", hex, l);
            return KVS_ECORRUPT;
        }
    }
    return KVS_OK;
}

/* Each layer encoded into out (its header written) with its hash. */
static kvs_status encode_layers(const void *raw, const kvs_codec *c, const kvs_kv_shape *shape,
                                uint32_t dtype, void *out, const char *hex, char *err,
                                uint64_t err_len) {
    const kvs_object_header *h = raw, *o = out;
    uint64_t enc = o->layer_bytes, *hash = kvs_object_layer_hashes(out);
    /* DROP keeps the same tokens in every layer (the engine masks positions, not layers): chosen
     * once, from the middle layer's keys, and written first there */
    const uint8_t *kept = NULL;
    if (c->kind == KVS_CODEC_DROP) {
        uint32_t mid = h->n_layers / 2;
        const uint8_t *layer =
            (const uint8_t *)raw + h->payload_offset + (uint64_t)mid * h->layer_bytes;
        uint8_t *dst = (uint8_t *)out + o->payload_offset + (uint64_t)mid * enc;
        kvs_codec_drop_select(shape, dtype, h->n_tokens, layer, c->k_group, dst);
        kept = dst;
    }
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const uint8_t *layer =
            (const uint8_t *)raw + h->payload_offset + (uint64_t)l * h->layer_bytes;
        uint8_t *dst = (uint8_t *)out + o->payload_offset + (uint64_t)l * enc;
        kvs_status st = kvs_codec_encode_layer_kept(
            c, shape, dtype, h->n_tokens, layer, shape->has_v ? layer + h->layer_bytes / 2 : NULL,
            kept, dst);
        if (st != KVS_OK) {
            kvs_fmt(err, err_len, "object %s: layer %u %s", hex, l,
                    st == KVS_ENOMEM ? "found no memory to encode in"
                                     : "holds values the codec cannot encode (kept raw)");
            return st;
        }
        hash[l] = kvs_xxh3_64(dst, enc);
    }
    return KVS_OK;
}

kvs_status kvs_object_encode(const void *raw, uint64_t raw_len, const kvs_codec *c,
                             const kvs_kv_shape *shape, uint32_t dtype, void *out, uint64_t cap,
                             uint64_t *out_len, char *err, uint64_t err_len) {
    const kvs_object_header *h = raw;
    char hex[33] = "?";
    kvs_status st = check_raw(raw, raw_len, shape, hex, err, err_len);
    if (st != KVS_OK) return st;
    if (kvs_codec_check(c, shape, dtype, err, err_len) != KVS_OK) return KVS_EINVAL;
    if (c->kind == KVS_CODEC_DROP && c->k_group > h->n_tokens) {
        kvs_fmt(err, err_len, "object %s: DROP keeps %u of %u tokens", hex, c->k_group,
                h->n_tokens);
        return KVS_EINVAL;
    }
    uint64_t enc = kvs_codec_layer_bytes(c, shape, dtype, h->n_tokens);
    uint64_t need = kvs_object_lossy_bytes(c, shape, dtype, h->n_layers, h->n_tokens);
    if (cap < need) {
        kvs_fmt(err, err_len, "object %s: %llu bytes of room for a lossy object of %llu", hex,
                (unsigned long long)cap, (unsigned long long)need);
        return KVS_EOVERFLOW;
    }
    lossy_header(out, h, c, dtype, enc);
    if ((st = check_raw_layers(raw, hex, err, err_len)) != KVS_OK) return st;
    if ((st = encode_layers(raw, c, shape, dtype, out, hex, err, err_len)) != KVS_OK) return st;
    kvs_object_seal(out);
    *out_len = need;
    return KVS_OK;
}

kvs_status kvs_object_check_lossy(const void *object, uint64_t len, const kvs_key *fingerprint,
                                  const kvs_key *key, uint32_t n_layers, uint32_t n_tokens,
                                  const kvs_kv_shape *shape, uint32_t dtype, kvs_codec *codec,
                                  char *err, uint64_t err_len) {
    char hex[33];
    kvs_key_hex(key, hex);
    const kvs_object_header *h = object;
    uint32_t head = kvs_object_lossy_payload_offset(n_layers);
    if (len < head) {
        kvs_fmt(err, err_len, "lossy object %s: %llu bytes is shorter than its header", hex,
                (unsigned long long)len);
        return KVS_ECORRUPT;
    }
    if (h->magic != KVS_OBJECT_MAGIC || h->version != KVS_OBJECT_VERSION ||
        !kvs_codec_is_lossy(h->codec) || h->n_layers != n_layers || h->n_tokens != n_tokens ||
        h->payload_offset != head) {
        kvs_fmt(err, err_len,
                "lossy object %s: bad magic/version/codec/geometry (%08x/%u/%u, %u x %u)", hex,
                h->magic, h->version, h->codec, h->n_layers, h->n_tokens);
        return KVS_ECORRUPT;
    }
    if (kvs_object_header_digest(object) != h->header_hash) {
        kvs_fmt(err, err_len, "lossy object %s: header checksum mismatch", hex);
        return KVS_ECORRUPT;
    }
    const kvs_object_codec *rec = kvs_object_codec_of(object);
    kvs_codec c = {
        .kind = rec->kind, .bits = rec->bits, .k_group = rec->k_group, .v_group = rec->v_group};
    char why[128] = "";
    if (rec->kind != h->codec || rec->dtype != dtype ||
        rec->raw_layer_bytes != kvs_kernel_layer_bytes(shape, n_tokens) ||
        kvs_codec_check(&c, shape, dtype, why, sizeof why) != KVS_OK ||
        (c.kind == KVS_CODEC_DROP && c.k_group > n_tokens) ||
        h->layer_bytes != kvs_codec_layer_bytes(&c, shape, dtype, n_tokens) ||
        len < (uint64_t)head + (uint64_t)n_layers * h->layer_bytes) {
        kvs_fmt(err, err_len,
                "lossy object %s: its codec record (%u/%u bits, dtype %u, %llu raw bytes a layer) "
                "does not fit this model or its length %s",
                hex, rec->kind, rec->bits, rec->dtype, (unsigned long long)rec->raw_layer_bytes,
                why);
        return KVS_ECORRUPT;
    }
    if (memcmp(&h->fingerprint, fingerprint, sizeof *fingerprint) != 0 ||
        memcmp(&h->key, key, sizeof *key) != 0) {
        kvs_fmt(err, err_len, "lossy object %s: stored under another key or model fingerprint",
                hex);
        return KVS_ECORRUPT;
    }
    *codec = c;
    return KVS_OK;
}

kvs_status kvs_object_check_lossy_layers(const void *object, char *err, uint64_t err_len) {
    const kvs_object_header *h = object;
    const uint64_t *hash = kvs_object_layer_hashes((void *)(uintptr_t)object);
    const kvs_object_codec *rec = kvs_object_codec_of(object);
    kvs_codec c = {
        .kind = rec->kind, .bits = rec->bits, .k_group = rec->k_group, .v_group = rec->v_group};
    const uint8_t *first = (const uint8_t *)object + h->payload_offset;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const uint8_t *src = first + (uint64_t)l * h->layer_bytes;
        if (kvs_xxh3_64(src, h->layer_bytes) != hash[l]) {
            kvs_fmt(err, err_len, "lossy layer %u checksum mismatch", l);
            return KVS_ECORRUPT;
        }
        /* a DROP layer keeps k_group tokens, the same in every layer */
        const uint8_t *mask = kvs_codec_kept_mask(&c, src);
        if (kvs_codec_check_layer(&c, h->n_tokens, src) != KVS_OK ||
            (mask && memcmp(mask, first, kvs_codec_mask_bytes(h->n_tokens)) != 0)) {
            kvs_fmt(err, err_len, "lossy layer %u keeps other tokens than its record or layer 0",
                    l);
            return KVS_ECORRUPT;
        }
    }
    return KVS_OK;
}

const uint8_t *kvs_object_kept_mask(const void *object) {
    const kvs_object_header *h = object;
    if (h->codec != KVS_CODEC_DROP) return NULL;
    return (const uint8_t *)object + h->payload_offset; /* layer 0's, the same in every layer */
}

kvs_status kvs_object_decode(const void *object, uint64_t len, const kvs_key *fingerprint,
                             uint32_t n_layers, uint32_t n_tokens, const kvs_kv_shape *shape,
                             uint32_t dtype, void *raw, uint64_t cap, char *err, uint64_t err_len) {
    const kvs_object_header *h = object;
    kvs_codec c;
    if (len < sizeof *h) {
        kvs_fmt(err, err_len, "a lossy object of %llu bytes is shorter than a header",
                (unsigned long long)len);
        return KVS_ECORRUPT;
    }
    kvs_status st = kvs_object_check_lossy(object, len, fingerprint, &h->key, n_layers, n_tokens,
                                           shape, dtype, &c, err, err_len);
    if (st != KVS_OK) return st;
    uint64_t raw_layer = kvs_kernel_layer_bytes(shape, n_tokens);
    if (cap < kvs_object_bytes(n_layers, raw_layer)) {
        kvs_fmt(err, err_len, "%llu bytes of room for a raw object of %llu",
                (unsigned long long)cap, (unsigned long long)kvs_object_bytes(n_layers, raw_layer));
        return KVS_EOVERFLOW;
    }
    if ((st = kvs_object_check_lossy_layers(object, err, err_len)) != KVS_OK) return st;
    kvs_object_init(raw, fingerprint, &h->key, n_layers, n_tokens, raw_layer);
    for (uint32_t l = 0; l < n_layers; l++) {
        const uint8_t *src =
            (const uint8_t *)object + h->payload_offset + (uint64_t)l * h->layer_bytes;
        uint8_t *dst = kvs_object_layer(raw, l);
        st = kvs_codec_decode_layer(&c, shape, dtype, n_tokens, src, dst,
                                    shape->has_v ? dst + raw_layer / 2 : NULL);
        if (st != KVS_OK) {
            kvs_fmt(err, err_len, "out of memory decoding a lossy object");
            return st;
        }
        kvs_object_layer_hashes(raw)[l] = kvs_xxh3_64(dst, raw_layer);
    }
    kvs_object_seal(raw);
    return KVS_OK;
}
