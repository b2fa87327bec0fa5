/* worker_device.c - the worker's device: register_kv picks the host device or dlopens the CUDA
 * module (kernels/device.h), opens it over the engine's layer views and registers the staging pool and
 * every tier that exposes its memory; close waits for its copies and releases all of it. */
#include "worker_device.h"

/* dlclose of the CUDA module */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "connector/ext/lsc/lsc.h"
#include "connector/ext/sparse/sparse.h"
#include "handle.h"
#include "last_error.h"
#include "role.h"
#include "worker.h"
#include "worker_async.h"
#include "worker_saver.h"

static kvs_status select_device(kvs_handle *h, const kvs_layer_view *views) {
    if (views[0].device_kind == KVS_DEVICE_HOST) {
        h->device.dev = kvs_host_device();
        return KVS_OK;
    }
    char why[512];
    h->device.dev = kvs_device_cuda_load(&h->device.dev_module, why, sizeof why);
    if (!h->device.dev_module)
        return kvs_set_error(
            h, KVS_ENOTSUP,
            "register_kv: CUDA views need the module %s, which could not be loaded (%s); "
            "this library may have been built without CUDA",
            KVS_DEVICE_CUDA_MODULE, why);
    if (!h->device.dev) return kvs_set_error(h, KVS_EVERSION, "register_kv: %s", why);
    return KVS_OK;
}

/* Make the pool and every tier that exposes its memory reachable by the device's copies. */
static kvs_status register_memory(kvs_handle *h) {
    char why[512] = "";
    void *base;
    uint64_t len;
    kvs_pool_region(h->pool, &base, &len);
    if (h->device.dev->register_host(h->device.dev_state, base, len, why, sizeof why) != KVS_OK)
        return kvs_set_error(h, KVS_EIO, "register_kv: staging pool: %s", why);
    for (uint32_t t = 0; t < kvs_tiers_count(h->tiers); t++) {
        if (kvs_tiers_memory(h->tiers, t, &base, &len) != KVS_OK) continue;
        if (h->device.dev->register_host(h->device.dev_state, base, len, why, sizeof why) != KVS_OK)
            return kvs_set_error(h, KVS_EIO, "register_kv: tier \"%s\": %s",
                                 kvs_tiers_name(h->tiers, t), why);
    }
    return KVS_OK;
}

static kvs_status open_device(kvs_handle *h, const kvs_layer_view *views, uint32_t n_layers) {
    kvs_status st = select_device(h, views);
    if (st != KVS_OK) return st;
    uint32_t max_chunks = h->cfg->max_chunks_per_step;
    kvs_device_init init = {.struct_size = sizeof init,
                            .views = views,
                            .n_layers = n_layers,
                            .shape = h->shape,
                            .max_copies_per_layer = max_chunks,
                            .max_tokens_per_layer = max_chunks * h->chunk_tokens,
                            .method = (kvs_dev_copy_method)h->cfg->copy_method,
                            .log_level = h->cfg->log_level,
                            .host_deferred = h->cfg->host_deferred,
                            .host_threads = h->cfg->host_threads};
    char why[512] = "";
    if ((st = h->device.dev->open(&init, &h->device.dev_state, &h->device.dev_info, why,
                                  sizeof why)) != KVS_OK) {
        h->device.dev_state = NULL;
        return kvs_set_error(h, st, "register_kv: device %s: %s", h->device.dev->name, why);
    }
    if ((st = register_memory(h)) != KVS_OK) return st;
    h->device.copy_owner = calloc(max_chunks, sizeof *h->device.copy_owner);
    if (!(h->device.copies = calloc(max_chunks, sizeof *h->device.copies)) || !h->device.copy_owner)
        return kvs_set_error(h, KVS_ENOMEM, "register_kv: out of memory");
    if (!h->device.dev_info.hashes_inline) {
        if (!(h->device.hash_jobs =
                  calloc((uint64_t)n_layers * max_chunks, sizeof *h->device.hash_jobs)))
            return kvs_set_error(h, KVS_ENOMEM, "register_kv: out of memory");
        if ((st = kvs_hashpool_create(h->cfg->hash_threads, &h->device.hashpool)) != KVS_OK)
            return kvs_set_error(h, st, "register_kv: cannot start %u checksum threads",
                                 h->cfg->hash_threads);
    }
    kvs_log(h->cfg->log_level, KVS_LOG_INFO, "device %s: loads by %s, saves by %s",
            h->device.dev_info.name, h->device.dev_info.load_uses_dma ? "DMA" : "kernel",
            h->device.dev_info.save_uses_dma ? "DMA" : "kernel");
    return KVS_OK;
}

/* Everything register_kv made, in reverse; the device first waits for its copies. */
static void close_device(kvs_handle *h) {
    kvs_lsc_close(h);    /* its stream blocks are in the old geometry */
    kvs_sparse_close(h); /* its head caches too */
    if (h->device.dev && h->device.dev_state) h->device.dev->close(h->device.dev_state);
    kvs_hashpool_destroy(h->device.hashpool);
    if (h->device.dev_module) dlclose(h->device.dev_module);
    free(h->device.copies);
    free(h->tag_states);
    h->tag_states = NULL;
    free(h->device.copy_owner);
    h->device.copy_owner = NULL;
    free(h->device.hash_jobs);
    free(h->worker.views);
    free(h->worker.layer_saved);
    free(h->worker.layer_loaded);
    h->device.dev = NULL;
    h->device.dev_state = h->device.dev_module = NULL;
    h->device.hashpool = NULL;
    h->device.copies = NULL;
    h->device.hash_jobs = NULL;
    h->worker.views = NULL;
    h->worker.layer_saved = NULL;
    h->worker.layer_loaded = NULL;
    h->worker.n_views = 0;
}

/* The engine's views, whatever their struct_size, as this library's structs in *out (the array steps
 * by views[0].struct_size; fields past it read as zero). */
static kvs_status copy_views(kvs_handle *h, const kvs_layer_view *views, uint32_t n_layers,
                             kvs_layer_view **out) {
    uint32_t stride = views[0].struct_size;
    if (stride < KVS_LAYER_VIEW_SIZE_1_0 || stride > 4096)
        return kvs_set_error(h, KVS_EINVAL,
                             "register_kv: layer 0: struct_size %u is not a layer view size "
                             "(%u..4096)",
                             stride, KVS_LAYER_VIEW_SIZE_1_0);
    kvs_layer_view *copy = calloc(n_layers, sizeof *copy);
    if (!copy) return kvs_set_error(h, KVS_ENOMEM, "register_kv: out of memory");
    for (uint32_t l = 0; l < n_layers; l++) {
        const kvs_layer_view *v = (const void *)((const char *)views + (size_t)l * stride);
        if (v->struct_size != stride) {
            free(copy);
            return kvs_set_error(h, KVS_EINVAL,
                                 "register_kv: layer %u: struct_size %u differs from layer 0's %u "
                                 "(the array steps by layer 0's)",
                                 l, v->struct_size, stride);
        }
        kvs_struct_in(&copy[l], sizeof copy[l], v, KVS_LAYER_VIEW_SIZE_1_0);
    }
    *out = copy;
    return KVS_OK;
}

kvs_status kvs_worker_register(kvs_handle *h, const kvs_layer_view *engine_views,
                               uint32_t n_layers) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "register_kv");
    if (st != KVS_OK) return st;
    if (h->worker.views)
        return kvs_set_error(h, KVS_ESTATE, "register_kv: the KV cache is already registered");
    if (!engine_views) return kvs_set_error(h, KVS_EINVAL, "register_kv: views is NULL");
    if (n_layers != h->model.n_layers)
        return kvs_set_error(h, KVS_EINVAL, "register_kv: %u views for a model of %u layers",
                             n_layers, h->model.n_layers);
    kvs_layer_view *views = NULL;
    if ((st = copy_views(h, engine_views, n_layers, &views)) != KVS_OK) return st;
    for (uint32_t l = 0; l < n_layers; l++) {
        char why[256];
        st = KVS_EINVAL;
        if (views[l].device_kind != KVS_DEVICE_HOST && views[l].device_kind != KVS_DEVICE_CUDA)
            kvs_set_error(h, st, "register_kv: layer %u: unknown device kind %u", l,
                          views[l].device_kind);
        else if (views[l].device_kind != views[0].device_kind ||
                 views[l].device_index != views[0].device_index)
            kvs_set_error(h, st, "register_kv: layer %u is on another device than layer 0", l);
        else if (kvs_kernel_check_view(&views[l], &h->shape, why, sizeof why) != KVS_OK)
            kvs_set_error(h, st, "register_kv: layer %u: %s", l, why);
        else
            st = KVS_OK;
        if (st != KVS_OK) {
            free(views);
            return st;
        }
    }
    h->worker.views = views;
    h->worker.layer_saved = calloc(n_layers, 1);
    h->worker.layer_loaded = calloc(n_layers, 1);
    if (!h->worker.layer_saved || !h->worker.layer_loaded) {
        close_device(h);
        return kvs_set_error(h, KVS_ENOMEM, "register_kv: out of memory");
    }
    h->worker.n_views = n_layers;
    h->worker.fewest_blocks_layer =
        0; /* block ids are checked against the layer with the fewest pages */
    for (uint32_t l = 1; l < n_layers; l++)
        if (views[l].n_blocks < views[h->worker.fewest_blocks_layer].n_blocks)
            h->worker.fewest_blocks_layer = l;
    if ((st = open_device(h, views, n_layers)) != KVS_OK) {
        char keep[KVS_ERROR_MAX];
        memcpy(keep, h->last_error, sizeof keep);
        close_device(h);
        memcpy(h->last_error, keep, sizeof keep);
        return st;
    }
    return KVS_OK;
}

kvs_status kvs_worker_set_stream(kvs_handle *h, void *stream) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "set_stream");
    if (st != KVS_OK) return st;
    if (!h->device.dev)
        return kvs_set_error(h, KVS_ESTATE, "set_stream: register_kv has not been called");
    char why[512] = "";
    if ((st = h->device.dev->set_stream(h->device.dev_state, stream, why, sizeof why)) != KVS_OK)
        return kvs_set_error(h, st, "set_stream: %s", why);
    return KVS_OK;
}

void kvs_worker_close(kvs_handle *h) {
    kvs_saver_close(h); /* queued saves land (bounded wait) or are dropped before the pool goes */
    kvs_async_close(h); /* its pins and slabs go before the device and the pool */
    if (h->worker.wstate != WORKER_IDLE && h->device.dev) {
        char why[512];
        h->device.dev->sync(h->device.dev_state, why,
                            sizeof why); /* no copy may still touch a slab or a pin */
        if (h->device.hashpool) kvs_hashpool_wait(h->device.hashpool);
    }
    kvs_worker_reset(h);
    close_device(h);
}
