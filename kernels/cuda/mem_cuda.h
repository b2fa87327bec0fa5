/* mem_cuda.h - the CUDA module's device memory table (kernels/device.h, kvs_device_mem_ops). */
#ifndef KVS_MEM_CUDA_H
#define KVS_MEM_CUDA_H

#include "kernels/device.h"

extern const kvs_device_mem_ops kvs_cuda_mem_table;

#endif
