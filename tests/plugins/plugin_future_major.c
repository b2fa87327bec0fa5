/* A plugin built against a future backend ABI major: the connector must refuse it. */
#include "abi/kvstrata_backend.h"

static const kvs_backend_ops ops = {.abi_major = KVS_BACKEND_ABI_MAJOR + 1,
                                    .abi_minor = 0,
                                    .struct_size = sizeof(kvs_backend_ops),
                                    .type_name = "future"};

const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major);
const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major) {
    (void)abi_major;
    return &ops; /* ignores the asked version, as a careless plugin would */
}
