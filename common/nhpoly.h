/* nhpoly.h - a layer tag as bytes stream by: Poly1305 (libcrypto) under a one-time key over the
 * bytes' NH (nh.h; the last unit zero-padded to a stride) and their length as 8 little-endian bytes,
 * Adiantum's NHPoly1305. Fed by a copy it costs no second read of the bytes: what the host device
 * does while it moves a keyed object's layer into the pages, so that the pages get exactly the bytes
 * the tag was computed over (connector/object_mac.h has the object format).
 *
 * A state belongs to one thread at a time; the NH key is borrowed. */
#ifndef KVS_COMMON_NHPOLY_H
#define KVS_COMMON_NHPOLY_H

#include <stddef.h>
#include <stdint.h>

#include "nh.h"

#define KVS_NHPOLY_TAG_BYTES 16u
#define KVS_NHPOLY_KEY_BYTES 32u /* the one-time Poly1305 key */
#define KVS_NHPOLY_BATCH     32u /* units whose NH outputs are handed to Poly1305 together */

typedef struct kvs_nhpoly {
    const uint32_t *nh_key;
    void *poly; /* an EVP_MAC_CTX; NULL once final (or when init failed) */
    uint64_t total;
    uint32_t part_len, out_len;
    int failed;
    uint8_t part[KVS_NH_UNIT_BYTES]; /* bytes of an unfinished unit */
    uint8_t out[KVS_NHPOLY_BATCH * KVS_NH_OUT_BYTES];
} kvs_nhpoly;

/* libcrypto's Poly1305 (an EVP_MAC), fetched by the state's owner and freed once no tag uses it:
 * NULL when libcrypto has none. */
void *kvs_nhpoly_mac_new(void);
void kvs_nhpoly_mac_free(void *poly1305);
/* Begin a tag with poly1305 (kvs_nhpoly_mac_new's) under nh_key (KVS_NH_KEY_WORDS words) and the
 * one-time Poly1305 key otk. 0 when libcrypto fails (final then fails too). */
int kvs_nhpoly_init(kvs_nhpoly *s, void *poly1305, const uint32_t *nh_key,
                    const uint8_t otk[KVS_NHPOLY_KEY_BYTES]);
/* Feed n bytes at src. */
void kvs_nhpoly_update(kvs_nhpoly *s, const void *src, size_t n);
/* Copy n bytes from src to dst (not overlapping) and feed them, in one pass; with `stream` the
 * copy's aligned stores are non-temporal (kvs_copy_fence orders them, common/copy.h). */
void kvs_nhpoly_copy_update(kvs_nhpoly *s, void *dst, const void *src, size_t n, int stream);
/* The tag of every byte fed; frees the state's context. 0 when libcrypto failed at any point. */
int kvs_nhpoly_final(kvs_nhpoly *s, uint8_t tag[KVS_NHPOLY_TAG_BYTES]);
/* Free the state's context without a tag (a copy given up). NULL-safe on a final state. */
void kvs_nhpoly_abort(kvs_nhpoly *s);

#endif
