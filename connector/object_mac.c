#include "object_mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/nh.h"
#include "common/nhpoly.h"
#include "keys.h"

#define MAC_LABEL    "kvstrata-object-mac-v1"
#define NH_KEY_LABEL "kvstrata-nh-key-v1"
#define KEY_BYTES    32u

struct kvs_object_mac {
    uint8_t key[KEY_BYTES];
    uint32_t nh_key[KVS_NH_KEY_WORDS]; /* ChaCha20 keystream under HMAC(key, NH_KEY_LABEL) */
    EVP_MAC *poly1305;
    EVP_CIPHER *chacha20;
};

/* The record after the layer hash table of a keyed object. */
typedef struct keyed_record {
    uint8_t nonce[KVS_OBJECT_NONCE_BYTES];
    uint32_t zero;
    uint8_t header_tag[KVS_OBJECT_TAG_BYTES];
    /* followed by uint8_t layer_tag[n_layers][KVS_OBJECT_TAG_BYTES] */
} keyed_record;
_Static_assert(sizeof(keyed_record) == 32, "the keyed record's fixed part is 32 bytes");

uint64_t kvs_object_mac_record_bytes(uint32_t n_layers) {
    return sizeof(keyed_record) + (uint64_t)n_layers * KVS_OBJECT_TAG_BYTES;
}

uint64_t kvs_object_mac_record_offset(uint32_t n_layers) {
    return sizeof(kvs_object_header) + (uint64_t)n_layers * sizeof(uint64_t);
}

int kvs_object_mac_fits(uint32_t n_layers) {
    return kvs_object_mac_record_offset(n_layers) + kvs_object_mac_record_bytes(n_layers) <=
           kvs_object_payload_offset(n_layers);
}

/* The NH key: ChaCha20 keystream (block 0 on, zero nonce) under HMAC-SHA256(key, NH_KEY_LABEL), a
 * key of its own so that no object's one-time keys (under `key`) ever meet it. */
static int nh_key_of(kvs_object_mac *m) {
    uint8_t k[KEY_BYTES], iv[16] = {0}, zero[KVS_NH_KEY_WORDS * 4] = {0},
                          stream[KVS_NH_KEY_WORDS * 4];
    unsigned int got = 0;
    int n = 0;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int ok = HMAC(EVP_sha256(), m->key, sizeof m->key, (const uint8_t *)NH_KEY_LABEL,
                  sizeof NH_KEY_LABEL - 1, k, &got) &&
             got == KEY_BYTES && c && EVP_EncryptInit_ex2(c, m->chacha20, k, iv, NULL) &&
             EVP_EncryptUpdate(c, stream, &n, zero, sizeof zero) && n == (int)sizeof stream;
    EVP_CIPHER_CTX_free(c);
    for (uint32_t i = 0; ok && i < KVS_NH_KEY_WORDS; i++)
        m->nh_key[i] = (uint32_t)stream[4 * i] | (uint32_t)stream[4 * i + 1] << 8 |
                       (uint32_t)stream[4 * i + 2] << 16 | (uint32_t)stream[4 * i + 3] << 24;
    OPENSSL_cleanse(k, sizeof k);
    OPENSSL_cleanse(stream, sizeof stream);
    return ok;
}

kvs_status kvs_object_mac_open(const uint8_t *key, size_t len, kvs_object_mac **out, char *error,
                               size_t error_len) {
    *out = NULL;
    kvs_object_mac *m = calloc(1, sizeof *m);
    if (!m) {
        kvs_fmt(error, error_len, "integrity: out of memory");
        return KVS_ENOMEM;
    }
    unsigned int got = 0;
    m->poly1305 = EVP_MAC_fetch(NULL, "POLY1305", NULL);
    m->chacha20 = EVP_CIPHER_fetch(NULL, "ChaCha20", NULL);
    if (!m->poly1305 || !m->chacha20 ||
        !HMAC(EVP_sha256(), key, (int)len, (const uint8_t *)MAC_LABEL, sizeof MAC_LABEL - 1, m->key,
              &got) ||
        got != KEY_BYTES || !nh_key_of(m)) {
        kvs_fmt(error, error_len, "integrity: libcrypto has no Poly1305, ChaCha20 or HMAC-SHA256");
        kvs_object_mac_close(m);
        return KVS_EIO;
    }
    *out = m;
    return KVS_OK;
}

void kvs_object_mac_close(kvs_object_mac *m) {
    if (!m) return;
    OPENSSL_cleanse(m->key, sizeof m->key);
    OPENSSL_cleanse(m->nh_key, sizeof m->nh_key);
    EVP_MAC_free(m->poly1305);
    EVP_CIPHER_free(m->chacha20);
    free(m);
}

int kvs_object_mac_same(const kvs_object_mac *a, const kvs_object_mac *b) {
    return a && b && CRYPTO_memcmp(a->key, b->key, sizeof a->key) == 0;
}

static keyed_record *record_of(const void *object) {
    const kvs_object_header *h = object;
    return (keyed_record *)((uint8_t *)(uintptr_t)object +
                            kvs_object_mac_record_offset(h->n_layers));
}

static uint8_t *layer_tag(keyed_record *r, uint32_t layer) {
    return (uint8_t *)(r + 1) + (uint64_t)layer * KVS_OBJECT_TAG_BYTES;
}

/* The one-time Poly1305 key of tag `index` (0: the header, 1 + l: layer l) under the object's nonce:
 * the first half of ChaCha20 keystream block `index`. */
static int one_time_key(const kvs_object_mac *m, const uint8_t nonce[KVS_OBJECT_NONCE_BYTES],
                        uint32_t index, uint8_t out[32]) {
    uint8_t iv[16], zero[64] = {0}, block[64] = {0};
    iv[0] = (uint8_t)index;
    iv[1] = (uint8_t)(index >> 8);
    iv[2] = (uint8_t)(index >> 16);
    iv[3] = (uint8_t)(index >> 24);
    memcpy(iv + 4, nonce, KVS_OBJECT_NONCE_BYTES);
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int n = 0, ok = c && EVP_EncryptInit_ex2(c, m->chacha20, m->key, iv, NULL) &&
                    EVP_EncryptUpdate(c, block, &n, zero, sizeof zero) && n == (int)sizeof block;
    EVP_CIPHER_CTX_free(c);
    memcpy(out, block, 32);
    OPENSSL_cleanse(block, sizeof block);
    return ok;
}

typedef struct span {
    const void *bytes;
    size_t len;
} span;

/* Poly1305 under tag `index`'s one-time key over parts (the header tag). */
static int tag_of(const kvs_object_mac *m, const uint8_t nonce[KVS_OBJECT_NONCE_BYTES],
                  uint32_t index, const span *parts, int n_parts,
                  uint8_t out[KVS_OBJECT_TAG_BYTES]) {
    uint8_t otk[32];
    if (!one_time_key(m, nonce, index, otk)) return 0;
    EVP_MAC_CTX *c = EVP_MAC_CTX_new(m->poly1305);
    size_t got = 0;
    int ok = c && EVP_MAC_init(c, otk, sizeof otk, NULL);
    for (int i = 0; ok && i < n_parts; i++) ok = EVP_MAC_update(c, parts[i].bytes, parts[i].len);
    ok = ok && EVP_MAC_final(c, out, &got, KVS_OBJECT_TAG_BYTES) && got == KVS_OBJECT_TAG_BYTES;
    EVP_MAC_CTX_free(c);
    OPENSSL_cleanse(otk, sizeof otk);
    return ok;
}

int kvs_object_mac_layer_begin(const kvs_object_mac *m, const uint8_t nonce[KVS_OBJECT_NONCE_BYTES],
                               uint32_t layer, kvs_nhpoly *s) {
    uint8_t otk[32];
    int ok = one_time_key(m, nonce, 1 + layer, otk);
    ok = kvs_nhpoly_init(s, m->poly1305, m->nh_key, otk) && ok;
    OPENSSL_cleanse(otk, sizeof otk);
    return ok;
}

/* The header tag: the header with header_hash as zero, the layer table, the record's nonce. */
static int header_tag(const kvs_object_mac *m, const void *object,
                      uint8_t out[KVS_OBJECT_TAG_BYTES]) {
    const kvs_object_header *h = object;
    kvs_object_header copy = *h;
    copy.header_hash = 0;
    keyed_record *r = record_of(object);
    span parts[] = {{&copy, sizeof copy},
                    {kvs_object_layer_hashes((void *)(uintptr_t)object),
                     (size_t)h->n_layers * sizeof(uint64_t)},
                    {r->nonce, sizeof r->nonce + sizeof r->zero},
                    {layer_tag(r, 0), (size_t)h->n_layers * KVS_OBJECT_TAG_BYTES}};
    return tag_of(m, r->nonce, 0, parts, 4, out);
}

static int layer_tag_of(const kvs_object_mac *m, const void *object, uint32_t layer,
                        uint8_t out[KVS_OBJECT_TAG_BYTES]) {
    const kvs_object_header *h = object;
    kvs_nhpoly s;
    int ok = kvs_object_mac_layer_begin(m, record_of(object)->nonce, layer, &s);
    kvs_nhpoly_update(&s, kvs_object_layer((void *)(uintptr_t)object, layer), h->layer_bytes);
    return kvs_nhpoly_final(&s, out) && ok;
}

const uint8_t *kvs_object_mac_nonce(const void *object) {
    return record_of(object)->nonce;
}

const uint8_t *kvs_object_mac_layer_tag(const void *object, uint32_t layer) {
    return layer_tag(record_of(object), layer);
}

static int has_room(const kvs_object_header *h) {
    return h->payload_offset >=
           kvs_object_mac_record_offset(h->n_layers) + kvs_object_mac_record_bytes(h->n_layers);
}

int kvs_object_mac_draw_nonce(void *object) {
    keyed_record *r = record_of(object);
    r->zero = 0;
    return has_room(object) && RAND_bytes(r->nonce, sizeof r->nonce) == 1;
}

uint8_t *kvs_object_mac_layer_tag_slot(void *object, uint32_t layer) {
    return layer_tag(record_of(object), layer);
}

kvs_status kvs_object_seal_keyed_tagged(const kvs_object_mac *m, void *object) {
    kvs_object_header *h = object;
    keyed_record *r = record_of(object);
    int ok = has_room(h);
    h->version = KVS_OBJECT_VERSION_KEYED;
    r->zero = 0;
    ok = ok && header_tag(m, object, r->header_tag);
    if (!ok) h->version = KVS_OBJECT_VERSION;
    kvs_object_seal(object);
    return ok ? KVS_OK : KVS_EIO;
}

kvs_status kvs_object_seal_keyed(const kvs_object_mac *m, void *object) {
    kvs_object_header *h = object;
    keyed_record *r = record_of(object);
    int ok = kvs_object_mac_draw_nonce(object);
    for (uint32_t l = 0; ok && l < h->n_layers; l++)
        ok = layer_tag_of(m, object, l, layer_tag(r, l));
    if (ok) return kvs_object_seal_keyed_tagged(m, object);
    h->version = KVS_OBJECT_VERSION;
    kvs_object_seal(object);
    return KVS_EIO;
}

kvs_status kvs_object_check_keyed_header(const kvs_object_mac *m, const void *object, uint64_t len,
                                         char *error, size_t error_len) {
    const kvs_object_header *h = object;
    if (len < sizeof *h) {
        kvs_fmt(error, error_len, "a keyed object of %llu bytes is shorter than a header",
                (unsigned long long)len);
        return KVS_ECORRUPT;
    }
    char hex[33];
    kvs_key_hex(&h->key, hex);
    if (h->magic != KVS_OBJECT_MAGIC || h->version != KVS_OBJECT_VERSION_KEYED ||
        kvs_codec_is_lossy(h->codec)) {
        kvs_fmt(error, error_len,
                "object %s carries no integrity tags (version %u, codec %u), and its tier is keyed",
                hex, h->version, h->codec);
        return KVS_ECORRUPT;
    }
    uint64_t end =
        kvs_object_mac_record_offset(h->n_layers) + kvs_object_mac_record_bytes(h->n_layers);
    if (h->n_layers > UINT32_MAX / KVS_OBJECT_TAG_BYTES || h->payload_offset < end ||
        len < h->payload_offset) {
        kvs_fmt(error, error_len, "keyed object %s: its tags do not fit its header (len %llu)", hex,
                (unsigned long long)len);
        return KVS_ECORRUPT;
    }
    uint8_t want[KVS_OBJECT_TAG_BYTES];
    if (!header_tag(m, object, want)) {
        kvs_fmt(error, error_len, "keyed object %s: libcrypto failed", hex);
        return KVS_EIO;
    }
    if (CRYPTO_memcmp(want, record_of(object)->header_tag, sizeof want) != 0) {
        kvs_fmt(
            error, error_len,
            "keyed object %s: header tag mismatch (written without this tenant's integrity key, "
            "or changed)",
            hex);
        return KVS_ECORRUPT;
    }
    return KVS_OK;
}

kvs_status kvs_object_check_keyed_layer(const kvs_object_mac *m, const void *object, uint32_t layer,
                                        char *error, size_t error_len) {
    const kvs_object_header *h = object;
    uint8_t want[KVS_OBJECT_TAG_BYTES];
    if (layer >= h->n_layers || !layer_tag_of(m, object, layer, want)) {
        kvs_fmt(error, error_len, "keyed object: layer %u cannot be checked", layer);
        return KVS_EIO;
    }
    if (CRYPTO_memcmp(want, layer_tag(record_of(object), layer), sizeof want) != 0) {
        kvs_fmt(error, error_len, "layer %u tag mismatch (changed without the integrity key)",
                layer);
        return KVS_ECORRUPT;
    }
    return KVS_OK;
}
