/* copy.h - copies of long runs of bytes with non-temporal stores: memory far larger than the cache
 * is written without reading each line first. Copies that hash what they copy: common/xxh3.h. */
#ifndef KVS_COMMON_COPY_H
#define KVS_COMMON_COPY_H

#include <stddef.h>
#include <stdint.h>

/* Runs at least this long are worth non-temporal stores. */
#define KVS_COPY_STREAM_MIN ((size_t)4096)

/* memcpy with non-temporal stores where the CPU has them (memcpy elsewhere, and for n < 80). The
 * stores are ordered only by kvs_copy_fence. */
void kvs_copy_streaming(void *dst, const void *src, size_t n);
/* Orders the non-temporal stores made before it (before anyone else may read them). */
void kvs_copy_fence(void);

#endif
