/* store.h - the store API's table (store.c), for the hook table's store_api (connector/api.c). */
#ifndef KVS_STORE_H
#define KVS_STORE_H

#include "abi/kvstrata_store.h"

const kvs_store_api *kvs_store_api_table(uint32_t major);

#endif
