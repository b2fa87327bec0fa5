/* xxh3.h - XXH3-64 (seed 0, the default secret) fed by a copy: the bytes are hashed from the
 * registers they are copied through, so a checksum costs no second read of the bytes, not even from
 * L1. The digest equals libxxhash's XXH3_64bits of the same bytes however they were split into
 * updates (test_xxh3 checks it against the library). */
#ifndef KVS_COMMON_XXH3_H
#define KVS_COMMON_XXH3_H

#include <stddef.h>
#include <stdint.h>

/* The state lives on its user's stack (no allocation). Bytes are accumulated a 64-byte stripe at a
 * time, and a stripe only once a later byte has been seen: XXH3 treats the input's last 64 bytes
 * apart, and an update cannot know it is the last. */
typedef struct kvs_xxh3 {
    _Alignas(32) uint64_t acc[8];
    uint64_t total;   /* bytes fed so far */
    uint32_t stripes; /* stripes accumulated in the current 1 KiB block */
    uint32_t pending; /* bytes in pend not yet accumulated (1..64 once total > 0) */
    uint8_t pend[64]; /* the bytes after the last accumulated stripe */
    uint8_t last[64]; /* the last accumulated stripe: the input's last 64 bytes may reach into it */
    uint8_t start[240]; /* the first bytes, while total <= 240 (XXH3 hashes short inputs apart) */
} kvs_xxh3;

void kvs_xxh3_reset(kvs_xxh3 *st);
/* Feed n bytes at src. */
void kvs_xxh3_update(kvs_xxh3 *st, const void *src, size_t n);
/* Copy n bytes from src to dst (they may not overlap) and feed them, in one pass: with
 * non-temporal stores when `stream` (ordered by kvs_copy_fence, common/copy.h). */
void kvs_xxh3_copy_update(kvs_xxh3 *st, void *dst, const void *src, size_t n, int stream);
/* XXH3-64 of every byte fed since the reset; the state is left as it was. */
uint64_t kvs_xxh3_digest(const kvs_xxh3 *st);
/* XXH3-64 of n bytes in one call. */
uint64_t kvs_xxh3_64(const void *src, size_t n);
/* XXH3-64 of src's n bytes, copied to dst in the same pass (fenced when `stream`). */
uint64_t kvs_xxh3_copy64(void *dst, const void *src, size_t n, int stream);

/* For tests: the widest vectors later updates may use where the CPU has them: 0 the portable loop,
 * 1 AVX2, 2 AVX-512 (the default). Not thread-safe. */
void kvs_xxh3_allow_simd(int allow);

#endif
