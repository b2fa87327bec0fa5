/* nh.h - NH, the universal hash of UMAC (Black et al., 1999) in the form Adiantum's NHPoly1305 uses
 * it (Crowley and Biggers, 2018): a message is taken 1 KiB unit at a time, and each unit becomes 32
 * bytes, four NH passes whose keys are the same key words shifted by 16 bytes (Toeplitz):
 *
 *   pass p of a unit of words m[0..4s):  sum over strides i < s of
 *       (m[4i]   + k[4i+4p])   * (m[4i+2] + k[4i+4p+2])
 *     + (m[4i+1] + k[4i+4p+1]) * (m[4i+3] + k[4i+4p+3])          (32-bit sums, 64-bit products and
 *                                                                 sum, little-endian words)
 *
 * Two different units of the same length collide under a random key with probability at most
 * 2^-32 per pass, about 2^-128 over the four. NH is not a MAC: its outputs go into a one-time
 * Poly1305 (connector/object_mac.c), which with the length makes a tag. It runs at memory speed
 * with AVX2 (the scalar loop elsewhere), where Poly1305 alone does not: what makes keyed integrity
 * about as cheap as a checksum. */
#ifndef KVS_COMMON_NH_H
#define KVS_COMMON_NH_H

#include <stddef.h>
#include <stdint.h>

#define KVS_NH_UNIT_BYTES   1024u
#define KVS_NH_STRIDE_BYTES 16u
#define KVS_NH_PASSES       4u
#define KVS_NH_OUT_BYTES    (8u * KVS_NH_PASSES) /* per unit */
/* key words: a unit's 256 and the 12 the last three passes reach past it */
#define KVS_NH_KEY_WORDS    (KVS_NH_UNIT_BYTES / 4u + 4u * (KVS_NH_PASSES - 1u))

/* NH of one unit of len bytes (a multiple of KVS_NH_STRIDE_BYTES, 16 to KVS_NH_UNIT_BYTES) into
 * out: the four pass sums, little-endian. */
void kvs_nh_unit(const uint32_t key[KVS_NH_KEY_WORDS], const uint8_t *m, size_t len,
                 uint8_t out[KVS_NH_OUT_BYTES]);
/* NH of n whole units at m into out (n * KVS_NH_OUT_BYTES bytes). */
void kvs_nh_units(const uint32_t key[KVS_NH_KEY_WORDS], const uint8_t *m, size_t n, uint8_t *out);

/* The same, also copying the n units to dst (not overlapping m) in the same pass; dst NULL: none.
 * With `stream`, an aligned dst is written with non-temporal stores, ordered by kvs_copy_fence
 * (common/copy.h). */
void kvs_nh_units_copy(const uint32_t key[KVS_NH_KEY_WORDS], uint8_t *dst, const uint8_t *m,
                       size_t n, uint8_t *out, int stream);

/* For tests: the widest vectors later calls may use where the CPU has them: 0 the portable loop, 1
 * AVX2, 2 AVX-512 (the default). Not thread-safe. */
void kvs_nh_allow_simd(int allow);

#endif
