/* worker_save.c - the worker's saves: at the first save_layer of a step each chunk to save gets a
 * place (a reservation in the top tier or a staging slab); every save_layer gathers its layer there;
 * wait_save checksums, seals and stores the whole ones and drops any a failed load tainted. With
 * `saves: {async: true}` wait_save only completes the gathers and hands the rest to the saver thread
 * (worker_saver.c). */
#include "worker_save.h"
#include "integrity.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "handle.h"
#include "last_error.h"
#include "object.h"
#include "object_mac.h"
#include "role.h"
#include "worker.h"
#include "worker_load.h"
#include "worker_saver.h"

/* A chunk's KV depends on every token before it, so a failed load taints every chunk that ends after
 * a failed block begins: the engine computed it on top of garbage. This covers the request's own
 * failed loads and pages it shares with a request whose load failed. */
static int tainted_by_error(kvs_handle *h, const kvs_save_work *w) {
    if (!h->worker.n_error_blocks) return 0;
    /* the carried blocks: from the request's first when the step could have failed loads */
    uint64_t last = (w->save->chunk_first + h->chunk_tokens - 1) / h->model.block_tokens;
    for (uint64_t i = 0; w->req->block_first + i <= last && i < w->req->n_block_ids; i++)
        for (uint64_t e = 0; e < h->worker.n_error_blocks; e++)
            if (w->req->block_ids[i] == h->worker.error_blocks[e]) return 1;
    return 0;
}

/* Where a save's object is built: a reservation in the top tier when it can be written in place
 * (the gather lands in the tier: one copy in all), else a staging slab put into the tiers later.
 * *wait_until_ns: how long the step may still wait for the saver to give slabs back (the forward
 * pass waits meanwhile): one saves.timeout_ms for the whole step, 0 once a wait came back empty. */
static int place_save(kvs_handle *h, kvs_save_work *w, uint64_t *wait_until_ns) {
    /* A keyed handle never seals in memory other processes can write (a shared top tier): its tags
     * would cover whatever they wrote there before the seal. */
    if (kvs_tiers_can_reserve(h->tiers) && !(h->mac && kvs_tiers_shared(h->tiers, 0))) {
        char why[256];
        void *dst = NULL;
        if (kvs_tiers_reserve(h->tiers, &w->save->key, h->object_bytes, &dst, &w->ticket, why,
                              sizeof why) == KVS_OK) {
            w->object = dst;
            return 1;
        }
        kvs_log(h->cfg->log_level, KVS_LOG_DEBUG, "request '%s': no room in place, staging: %s",
                w->req->id, why);
    }
    /* Slabs the saver thread holds come back as their saves land: wait for them, bounded for the
     * step (saves that land without freeing a slab, reservations in the top tier, must not keep
     * the forward pass waiting for the whole queue). */
    while (!(w->slab = kvs_pool_alloc(h->pool))) {
        if (kvs_now_ns() >= *wait_until_ns || !kvs_saver_wait_landed(h)) {
            *wait_until_ns = 0;
            return 0;
        }
    }
    w->object = w->slab;
    return 1;
}

static void release_save(kvs_handle *h, kvs_save_work *w) {
    if (w->slab)
        kvs_pool_free(h->pool, w->slab);
    else if (w->object)
        kvs_tiers_abort(h->tiers, w->ticket);
    w->slab = w->object = NULL;
}

/* The first chunk of request r this step's loads landed lossy (its own view: a tier that cannot tell
 * codecs before the load hid it from the lookup), or UINT64_MAX. */
static uint64_t lossy_load_from(const kvs_handle *h, const kvs_meta_req *r) {
    uint64_t from = UINT64_MAX;
    for (uint64_t i = 0; i < h->worker.n_loads; i++)
        if (h->worker.loads[i].req == r && h->worker.loads[i].lossy &&
            h->worker.loads[i].load->chunk_first < from)
            from = h->worker.loads[i].load->chunk_first;
    return from;
}

/* At the first save_layer of a step: decide which saves happen and where they are built. */
static void open_saves(kvs_handle *h) {
    uint64_t placed = 0;
    uint64_t wait_until_ns = kvs_now_ns() + h->cfg->saves.timeout_ms * 1000000ull;
    /* A top tier that could not open stores nothing: no save is gathered (warned once, at open). */
    int nowhere = kvs_tiers_degraded(h->tiers, 0);
    for (uint64_t i = 0; i < h->worker.n_saves; i++) {
        kvs_save_work *w = &h->worker.saves[i];
        if (nowhere || tainted_by_error(h, w) || kvs_tiers_find(h->tiers, &w->save->key) >= 0) {
            h->stats
                .saves_skipped++; /* garbage pages are never saved; stored chunks need no copy */
            continue;
        }
        if (placed == h->cfg->max_chunks_per_step || !place_save(h, w, &wait_until_ns)) {
            h->stats.saves_skipped++;
            continue;
        }
        placed++;
        kvs_object_init(w->object, &h->fingerprint, &w->save->key, h->model.n_layers,
                        h->chunk_tokens, h->layer_bytes);
        /* computed over chunks the request loaded lossy: exact for no reader that refuses them */
        if ((w->req->derived && w->save->chunk_first >= w->req->derived_from) ||
            w->save->chunk_first >= lossy_load_from(h, w->req))
            ((kvs_object_header *)w->object)->codec = KVS_CODEC_DERIVED;
        /* a keyed handle on a device that hashes as it copies: the layer tags come from the
         * copies out of the pages, in the pass that computes the checksums */
        w->tagged =
            h->mac && h->device.dev_info.hashes_inline && kvs_object_mac_draw_nonce(w->object);
    }
}

kvs_status kvs_worker_save_layer(kvs_handle *h, uint32_t layer) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "save_layer");
    if (st != KVS_OK) return st;
    if (h->worker.wstate == WORKER_IDLE)
        return kvs_set_error(h, KVS_ESTATE, "save_layer: no metadata bound (call bind_meta first)");
    if (layer >= h->worker.n_views)
        return kvs_set_error(h, KVS_EINVAL, "save_layer: layer %u of a %u-layer model", layer,
                             h->worker.n_views);
    if (h->worker.layer_saved[layer])
        return kvs_set_error(h, KVS_ESTATE, "save_layer: layer %u was already saved in this step",
                             layer);
    int first = 1;
    for (uint32_t l = 0; l < h->worker.n_views; l++) first &= !h->worker.layer_saved[l];
    /* The engine computed this layer, so its loads must have landed (and failed ones be known). */
    if (h->worker.wstate == WORKER_LOADING) kvs_worker_load_layers(h, layer, layer);
    uint64_t t0 = kvs_now_ns();
    if (first) open_saves(h);
    h->worker.layer_saved[layer] = 1;
    uint64_t n = 0, part = (uint64_t)h->chunk_tokens * h->shape.n_heads * h->shape.head_bytes;
    kvs_save_work **owner = (kvs_save_work **)h->device.copy_owner;
    for (uint64_t i = 0; i < h->worker.n_saves; i++) {
        kvs_save_work *w = &h->worker.saves[i];
        if (!w->object) continue;
        uint8_t *payload = kvs_object_layer(w->object, layer);
        h->device.copies[n] = (kvs_dev_copy){
            .block_ids = w->req->block_ids,
            .n_block_ids = w->req->n_block_ids,
            .first_token =
                w->save->chunk_first - kvs_meta_token_base(w->req, h->model.block_tokens),
            .n_tokens = h->chunk_tokens,
            .k_payload = payload,
            .v_payload = h->shape.has_v ? payload + part : NULL,
            .hash = h->device.dev_info.hashes_inline ? &kvs_object_layer_hashes(w->object)[layer]
                                                     : NULL};
        if (w->tagged && !h->tag_states &&
            !(h->tag_states = calloc(h->cfg->max_chunks_per_step, sizeof *h->tag_states)))
            w->tagged = 0; /* sealed whole at the end */
        if (w->tagged) {
            w->tagged = kvs_object_mac_layer_begin(h->mac, kvs_object_mac_nonce(w->object), layer,
                                                   &h->tag_states[n]);
            h->device.copies[n].tag = &h->tag_states[n];
        }
        owner[n++] = w;
    }
    char why[512] = "";
    if (n && (st = h->device.dev->save_layer(h->device.dev_state, layer, h->device.copies, n, why,
                                             sizeof why)) != KVS_OK) {
        for (uint64_t i = 0; i < n; i++)
            if (h->device.copies[i].tag) kvs_nhpoly_abort(h->device.copies[i].tag);
        h->stats.save_ns += kvs_now_ns() - t0;
        /* These objects will miss a layer, so wait_save drops them. */
        return kvs_set_error(h, st, "save_layer: layer %u: %s", layer, why);
    }
    for (uint64_t i = 0; i < n; i++) {
        kvs_save_work *w = owner[i];
        w->layers_done++;
        if (h->device.copies[i].tag &&
            !kvs_nhpoly_final(h->device.copies[i].tag,
                              kvs_object_mac_layer_tag_slot(w->object, layer)))
            w->tagged = 0;
    }
    h->stats.save_ns += kvs_now_ns() - t0;
    return KVS_OK;
}

/* CUDA device (or the deferred host device): wait for the gathers out of the pages to land. */
static kvs_status sync_saves(kvs_handle *h) {
    char why[512] = "";
    kvs_status st = h->device.dev->sync(h->device.dev_state, why, sizeof why);
    if (st != KVS_OK) {
        kvs_log(h->cfg->log_level, KVS_LOG_ERROR, "device %s: saves: %s", h->device.dev_info.name,
                why);
        for (uint64_t i = 0; i < h->worker.n_saves; i++) release_save(h, &h->worker.saves[i]);
        return kvs_set_error(h, st, "wait_save: %s", why);
    }
    return KVS_OK;
}

/* CUDA device: the gathers have landed; checksum every layer of every save on the hash pool. */
static kvs_status hash_saves(kvs_handle *h) {
    kvs_status st = sync_saves(h);
    if (st != KVS_OK) return st;
    uint64_t n_jobs = 0;
    for (uint64_t i = 0; i < h->worker.n_saves; i++) {
        kvs_save_work *w = &h->worker.saves[i];
        if (!w->object || w->layers_done != h->worker.n_views) continue;
        for (uint32_t l = 0; l < h->worker.n_views; l++)
            h->device.hash_jobs[n_jobs++] =
                (kvs_hash_job){kvs_object_layer(w->object, l), h->layer_bytes,
                               &kvs_object_layer_hashes(w->object)[l]};
    }
    if (n_jobs) {
        kvs_hashpool_submit(h->device.hashpool, h->device.hash_jobs, n_jobs);
        kvs_hashpool_wait(h->device.hashpool);
    }
    return KVS_OK;
}

static void store_save(kvs_handle *h, kvs_save_work *w) {
    if (w->tagged && !w->sealed)
        kvs_integrity_seal_tagged(h, w->object);
    else if (!w->sealed)
        kvs_integrity_seal(h, w->object);
    w->sealed = w->tagged = 0;
    char why[256];
    kvs_status st = w->slab ? kvs_tiers_put(h->tiers, &w->save->key, w->object, h->object_bytes,
                                            why, sizeof why)
                            : kvs_tiers_commit(h->tiers, &w->save->key, w->ticket, w->object,
                                               h->object_bytes, why, sizeof why);
    if (st == KVS_OK) {
        h->stats.chunks_saved++;
        h->stats.bytes_saved += (uint64_t)h->worker.n_views * h->layer_bytes;
    } else {
        kvs_log(h->cfg->log_level, KVS_LOG_WARN, "request '%s': save not stored: %s", w->req->id,
                why);
        h->stats.saves_skipped++;
    }
    if (w->slab) kvs_pool_free(h->pool, w->slab);
    w->slab = w->object = NULL; /* a committed reservation belongs to the tier now */
}

/* A keyed handle's whole saves of the step sealed together, their tags computed on the host
 * device's threads (store_save then only stores them). */
static void seal_step(kvs_handle *h) {
    uint64_t n = 0;
    for (uint64_t i = 0; i < h->worker.n_saves; i++)
        n += h->worker.saves[i].object && h->worker.saves[i].layers_done == h->worker.n_views;
    void **objects = n > 1 ? malloc(n * sizeof *objects) : NULL;
    if (!objects) return; /* one save, or no memory: store_save seals each */
    uint64_t k = 0;
    for (uint64_t i = 0; i < h->worker.n_saves; i++) {
        kvs_save_work *w = &h->worker.saves[i];
        if (!w->object || w->layers_done != h->worker.n_views) continue;
        if (w->tagged) { /* only its header tag left: store_save adds it */
            n--;
            continue;
        }
        objects[k++] = w->object;
        w->sealed = 1;
    }
    kvs_integrity_seal_objects(h, objects, n);
    free(objects);
}

kvs_status kvs_worker_wait_save(kvs_handle *h) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "wait_save");
    if (st != KVS_OK) return st;
    if (h->worker.wstate == WORKER_IDLE)
        return kvs_set_error(h, KVS_ESTATE, "wait_save: no metadata bound (call bind_meta first)");
    if (h->worker.wstate == WORKER_LOADING) kvs_worker_load_layers(h, 0, h->worker.n_views - 1);
    uint64_t t0 = kvs_now_ns();
    kvs_worker_complete_async_loads(h); /* errors found here taint the saves below */
    kvs_status result = KVS_OK;
    /* Asynchronous saves: once the gathers have landed the pages are not read again; hashing,
     * sealing and storing go to the saver thread. */
    int async = h->worker.n_saves && kvs_saver_async(h);
    if (!h->device.dev_info.synchronous) result = async ? sync_saves(h) : hash_saves(h);
    if (!async && h->mac) seal_step(h);
    for (uint64_t i = 0; i < h->worker.n_saves; i++) {
        kvs_save_work *w = &h->worker.saves[i];
        if (!w->object) continue;
        /* A chunk whose load failed after its save began holds garbage: drop it. */
        if (w->layers_done != h->worker.n_views || tainted_by_error(h, w)) {
            w->sealed = w->tagged = 0;
            if (w->layers_done != h->worker.n_views)
                kvs_log(h->cfg->log_level, KVS_LOG_WARN,
                        "request '%s': save dropped: %u of %u layers were gathered", w->req->id,
                        w->layers_done, h->worker.n_views);
            h->stats.saves_skipped++;
            release_save(h, w);
            continue;
        }
        if (!async) store_save(h, w);
    }
    if (async)
        kvs_saver_submit(h, h->worker.saves, h->worker.n_saves, !h->device.dev_info.synchronous);
    h->stats.save_ns += kvs_now_ns() - t0;
    kvs_worker_reset(h);
    return result;
}
