/* abi_struct.c - the caller's versioned structs (contract in abi_struct.h). */
#include "abi_struct.h"

#include <string.h>

int kvs_struct_in(void *dst, size_t dst_size, const void *src, size_t min_size) {
    uint32_t size;
    memcpy(&size, src, sizeof size);
    if (size < min_size) return -1;
    memset(dst, 0, dst_size);
    memcpy(dst, src, size < dst_size ? size : dst_size);
    return 0;
}

uint32_t kvs_struct_out_size(const void *dst, size_t own_size, size_t min_size) {
    uint32_t size;
    memcpy(&size, dst, sizeof size);
    if (size < min_size) return 0;
    return size < own_size ? size : (uint32_t)own_size;
}
