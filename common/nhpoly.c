/* nhpoly.c - NH then Poly1305 as bytes stream by (nhpoly.h). */
#include "nhpoly.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <string.h>

void *kvs_nhpoly_mac_new(void) {
    return EVP_MAC_fetch(NULL, "POLY1305", NULL);
}

void kvs_nhpoly_mac_free(void *poly1305) {
    EVP_MAC_free(poly1305);
}

/* Hand the NH outputs gathered so far to Poly1305. */
static void flush(kvs_nhpoly *s) {
    if (s->out_len && s->poly && !EVP_MAC_update(s->poly, s->out, s->out_len)) s->failed = 1;
    s->out_len = 0;
}

static void emit_units(kvs_nhpoly *s, uint8_t *dst, const uint8_t *src, size_t units, int stream) {
    while (units) {
        size_t room = KVS_NHPOLY_BATCH - s->out_len / KVS_NH_OUT_BYTES;
        size_t k = units < room ? units : room;
        kvs_nh_units_copy(s->nh_key, dst, src, k, s->out + s->out_len, stream);
        s->out_len += (uint32_t)(k * KVS_NH_OUT_BYTES);
        if (s->out_len == sizeof s->out) flush(s);
        src += k * KVS_NH_UNIT_BYTES;
        if (dst) dst += k * KVS_NH_UNIT_BYTES;
        units -= k;
    }
}

int kvs_nhpoly_init(kvs_nhpoly *s, void *poly1305, const uint32_t *nh_key,
                    const uint8_t otk[KVS_NHPOLY_KEY_BYTES]) {
    s->nh_key = nh_key;
    s->total = 0;
    s->part_len = s->out_len = 0;
    s->poly = poly1305 ? EVP_MAC_CTX_new(poly1305) : NULL;
    s->failed = !s->poly || !EVP_MAC_init(s->poly, otk, KVS_NHPOLY_KEY_BYTES, NULL);
    return !s->failed;
}

static void feed(kvs_nhpoly *s, uint8_t *dst, const uint8_t *src, size_t n, int stream) {
    s->total += n;
    if (s->part_len) { /* finish the unit under way first */
        size_t k = KVS_NH_UNIT_BYTES - s->part_len < n ? KVS_NH_UNIT_BYTES - s->part_len : n;
        /* src is read once: what the tag covers is what dst got, even if src changes meanwhile */
        if (dst) memcpy(dst, src, k);
        memcpy(s->part + s->part_len, dst ? dst : src, k);
        s->part_len += (uint32_t)k;
        src += k;
        if (dst) dst += k;
        n -= k;
        if (s->part_len < KVS_NH_UNIT_BYTES) return;
        emit_units(s, NULL, s->part, 1, 0);
        s->part_len = 0;
    }
    size_t units = n / KVS_NH_UNIT_BYTES;
    emit_units(s, dst, src, units, stream);
    size_t rest = n - units * KVS_NH_UNIT_BYTES;
    if (rest) {
        const uint8_t *from = src + units * KVS_NH_UNIT_BYTES;
        if (dst) {
            memcpy(dst + units * KVS_NH_UNIT_BYTES, from, rest);
            from = dst + units * KVS_NH_UNIT_BYTES;
        }
        memcpy(s->part, from, rest);
        s->part_len = (uint32_t)rest;
    }
}

void kvs_nhpoly_update(kvs_nhpoly *s, const void *src, size_t n) {
    feed(s, NULL, src, n, 0);
}

void kvs_nhpoly_copy_update(kvs_nhpoly *s, void *dst, const void *src, size_t n, int stream) {
    feed(s, dst, src, n, stream);
}

int kvs_nhpoly_final(kvs_nhpoly *s, uint8_t tag[KVS_NHPOLY_TAG_BYTES]) {
    if (s->part_len) { /* the last unit, zero-padded to a whole stride */
        size_t padded =
            (s->part_len + KVS_NH_STRIDE_BYTES - 1) / KVS_NH_STRIDE_BYTES * KVS_NH_STRIDE_BYTES;
        memset(s->part + s->part_len, 0, padded - s->part_len);
        kvs_nh_unit(s->nh_key, s->part, padded, s->out + s->out_len);
        s->out_len += KVS_NH_OUT_BYTES;
    }
    flush(s);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(s->total >> (8 * i));
    size_t got = 0;
    int ok = !s->failed && s->poly && EVP_MAC_update(s->poly, le, sizeof le) &&
             EVP_MAC_final(s->poly, tag, &got, KVS_NHPOLY_TAG_BYTES) && got == KVS_NHPOLY_TAG_BYTES;
    kvs_nhpoly_abort(s);
    return ok;
}

void kvs_nhpoly_abort(kvs_nhpoly *s) {
    EVP_MAC_CTX_free(s->poly);
    s->poly = NULL;
    OPENSSL_cleanse(s->part, sizeof s->part);
    s->part_len = 0;
}
