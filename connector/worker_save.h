/* worker_save.h - the worker's saves of the bound step: save_layer gathers one layer of every chunk
 * to save, wait_save seals and stores them. Calls on one handle are not thread-safe. */
#ifndef KVS_WORKER_SAVE_H
#define KVS_WORKER_SAVE_H

#include <stdint.h>

#include "abi/kvstrata.h"

kvs_status kvs_worker_save_layer(kvs_handle *h, uint32_t layer);
kvs_status kvs_worker_wait_save(kvs_handle *h);

#endif
