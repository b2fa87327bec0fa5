/* errno_name.c - errno values by name (contract in errno_name.h). */
#include "errno_name.h"

#include <string.h>

const char *kvs_errno_name(int err) {
    const char *name = strerrorname_np(err);
    return name ? name : "unknown error";
}
