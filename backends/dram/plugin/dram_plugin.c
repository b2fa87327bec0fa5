/* dram_plugin.c - the dram backend as a plugin of its own (docs/plugins.md): the entry the plugin
 * loader looks up. Built only into the kvstrata-dram module, never into the library, which reaches
 * the same table through kvs_dram_backend(). */
#include "backends/dram/dram.h"

/* The module is built with hidden visibility; this is the one symbol it shows the loader. */
__attribute__((visibility("default"))) const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major);
const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major) {
    return abi_major == KVS_BACKEND_ABI_MAJOR ? kvs_dram_backend() : NULL;
}
