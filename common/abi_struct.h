/* abi_struct.h - reading and writing the caller's versioned structs (those that start with a uint32_t
 * struct_size), as abi/kvstrata.h promises: inbound ones from their first size up with the rest zero,
 * outbound ones no further than the caller's struct_size. */
#ifndef KVS_ABI_STRUCT_H
#define KVS_ABI_STRUCT_H

#include <stddef.h>
#include <stdint.h>

/* A caller's inbound struct into dst, this library's struct of dst_size bytes: min(struct_size,
 * dst_size) bytes copied, the rest zero. 0, or -1 (dst untouched) when struct_size is below min_size
 * (the struct's first size). */
int kvs_struct_in(void *dst, size_t dst_size, const void *src, size_t min_size);
/* How many bytes to write into a caller's outbound struct: min(its struct_size, own_size), or 0 when
 * its struct_size is below min_size. */
uint32_t kvs_struct_out_size(const void *dst, size_t own_size, size_t min_size);

#endif /* KVS_ABI_STRUCT_H */
