/* copy.h - copies of long runs of bytes: with non-temporal stores (memory far larger than the cache
 * is written without reading each line first), and copies that hash what they copy while it is in
 * L1, so a checksum costs no second pass over memory. */
#ifndef KVS_COMMON_COPY_H
#define KVS_COMMON_COPY_H

#include <stddef.h>
#include <stdint.h>

/* XXH3_state_t on the stack of the callers (no allocation). Where libxxhash was built with its x86
 * dispatcher (it installs this header then), the streaming update picks AVX2/AVX-512 at run time
 * instead of the SSE2 baseline: about twice the hash throughput, which is what lets a hashed copy
 * run near memcpy speed. Every includer's XXH3 calls dispatch the same way. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if !defined(KVS_NO_XXH_DISPATCH) && (defined(__x86_64__) || defined(__i386__)) && \
    defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

/* Runs at least this long are worth non-temporal stores. */
#define KVS_COPY_STREAM_MIN ((size_t)4096)

/* memcpy with non-temporal stores where the CPU has them (memcpy elsewhere, and for n < 80). The
 * stores are ordered only by kvs_copy_fence. */
void kvs_copy_streaming(void *dst, const void *src, size_t n);
/* Orders the non-temporal stores made before it (before anyone else may read them). */
void kvs_copy_fence(void);
/* Copy n bytes from src to dst and feed them to st, 4 KiB at a time: each step is copied (with
 * non-temporal stores when `stream` and the step is long enough), then hashed from L1 while the next
 * step's lines are fetched. Equal to the copy followed by XXH3_64bits_update(st, src, n). */
void kvs_copy_hash_update(XXH3_state_t *st, void *dst, const void *src, size_t n, int stream);
/* XXH3-64 (seed 0) of src's n bytes, copied to dst in the same pass, fenced when `stream`. */
uint64_t kvs_copy_hash64(void *dst, const void *src, size_t n, int stream);

#endif
