/* worker.c - the worker-role hooks: register the engine's pages, bind a step's metadata, load chunks
 * layer by layer (verifying every layer's checksum), gather and seal saves. The copies go through
 * the device interface (kernels/device.h): the host device runs them at once and checksums in the
 * same pass; the CUDA device enqueues them on its streams and the hash pool checksums on the host
 * while they run. */
#include "worker.h"

/* dladdr needs _GNU_SOURCE, which the build defines */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/clock.h"
#include "common/log.h"
#include "guard.h"
#include "handle.h"
#include "keys.h"
#include "object.h"

/* The CUDA module lives beside libkvstrata.so; fall back to the loader's search path. */
static void *open_cuda_module(char *why, size_t why_len) {
    Dl_info self;
    char path[4096];
    void *dl = NULL;
    if (dladdr((void *)&kvs_worker_register, &self) && self.dli_fname) {
        const char *slash = strrchr(self.dli_fname, '/');
        if (slash &&
            (size_t)(slash - self.dli_fname) + sizeof(KVS_DEVICE_CUDA_MODULE) + 1 < sizeof path) {
            snprintf(path, sizeof path, "%.*s/%s", (int)(slash - self.dli_fname), self.dli_fname,
                     KVS_DEVICE_CUDA_MODULE);
            dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (!dl) dl = dlopen(KVS_DEVICE_CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        snprintf(why, why_len, "%s", e ? e : "not found");
    }
    return dl;
}

static kvs_status select_device(kvs_handle *h, const kvs_layer_view *views) {
    if (views[0].device_kind == KVS_DEVICE_HOST) {
        h->dev = kvs_host_device();
        return KVS_OK;
    }
    char why[512];
    if (!(h->dev_module = open_cuda_module(why, sizeof why)))
        return kvs_set_error(
            h, KVS_ENOTSUP,
            "register_kv: CUDA views need the module %s, which could not be loaded (%s); "
            "this library may have been built without CUDA",
            KVS_DEVICE_CUDA_MODULE, why);
    kvs_device_entry_fn entry;
    *(void **)&entry = dlsym(h->dev_module, KVS_DEVICE_ENTRY_SYMBOL);
    h->dev = entry ? entry(KVS_DEVICE_ABI_VERSION) : NULL;
    if (!h->dev)
        return kvs_set_error(h, KVS_EVERSION,
                             "register_kv: %s does not offer device interface version %d "
                             "(a module from another build?)",
                             KVS_DEVICE_CUDA_MODULE, KVS_DEVICE_ABI_VERSION);
    return KVS_OK;
}

/* Make the pool and every tier that exposes its memory reachable by the device's copies. */
static kvs_status register_memory(kvs_handle *h) {
    char why[512] = "";
    void *base;
    uint64_t len;
    kvs_pool_region(h->pool, &base, &len);
    if (h->dev->register_host(h->dev_state, base, len, why, sizeof why) != KVS_OK)
        return kvs_set_error(h, KVS_EIO, "register_kv: staging pool: %s", why);
    for (uint32_t t = 0; t < kvs_tiers_count(h->tiers); t++) {
        if (kvs_tiers_memory(h->tiers, t, &base, &len) != KVS_OK) continue;
        if (h->dev->register_host(h->dev_state, base, len, why, sizeof why) != KVS_OK)
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
                            .host_deferred = h->cfg->host_deferred};
    char why[512] = "";
    if ((st = h->dev->open(&init, &h->dev_state, &h->dev_info, why, sizeof why)) != KVS_OK) {
        h->dev_state = NULL;
        return kvs_set_error(h, st, "register_kv: device %s: %s", h->dev->name, why);
    }
    if ((st = register_memory(h)) != KVS_OK) return st;
    h->copy_owner = calloc(max_chunks, sizeof *h->copy_owner);
    if (!(h->copies = calloc(max_chunks, sizeof *h->copies)) || !h->copy_owner)
        return kvs_set_error(h, KVS_ENOMEM, "register_kv: out of memory");
    if (!h->dev_info.hashes_inline) {
        if (!(h->hash_jobs = calloc((uint64_t)n_layers * max_chunks, sizeof *h->hash_jobs)))
            return kvs_set_error(h, KVS_ENOMEM, "register_kv: out of memory");
        if ((st = kvs_hashpool_create(h->cfg->hash_threads, &h->hashpool)) != KVS_OK)
            return kvs_set_error(h, st, "register_kv: cannot start %u checksum threads",
                                 h->cfg->hash_threads);
    }
    kvs_log(h->cfg->log_level, KVS_LOG_INFO, "device %s: loads by %s, saves by %s",
            h->dev_info.name, h->dev_info.load_uses_dma ? "DMA" : "kernel",
            h->dev_info.save_uses_dma ? "DMA" : "kernel");
    return KVS_OK;
}

/* Everything register_kv made, in reverse; the device first waits for its copies. */
static void close_device(kvs_handle *h) {
    if (h->dev && h->dev_state) h->dev->close(h->dev_state);
    kvs_hashpool_destroy(h->hashpool);
    if (h->dev_module) dlclose(h->dev_module);
    free(h->copies);
    free(h->copy_owner);
    h->copy_owner = NULL;
    free(h->hash_jobs);
    free(h->views);
    free(h->layer_saved);
    free(h->layer_loaded);
    h->dev = NULL;
    h->dev_state = h->dev_module = NULL;
    h->hashpool = NULL;
    h->copies = NULL;
    h->hash_jobs = NULL;
    h->views = NULL;
    h->layer_saved = NULL;
    h->layer_loaded = NULL;
    h->n_views = 0;
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
    if (h->views)
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
    h->views = views;
    h->layer_saved = calloc(n_layers, 1);
    h->layer_loaded = calloc(n_layers, 1);
    if (!h->layer_saved || !h->layer_loaded) {
        close_device(h);
        return kvs_set_error(h, KVS_ENOMEM, "register_kv: out of memory");
    }
    h->n_views = n_layers;
    h->fewest_blocks_layer = 0; /* block ids are checked against the layer with the fewest pages */
    for (uint32_t l = 1; l < n_layers; l++)
        if (views[l].n_blocks < views[h->fewest_blocks_layer].n_blocks) h->fewest_blocks_layer = l;
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
    if (!h->dev) return kvs_set_error(h, KVS_ESTATE, "set_stream: register_kv has not been called");
    char why[512] = "";
    if ((st = h->dev->set_stream(h->dev_state, stream, why, sizeof why)) != KVS_OK)
        return kvs_set_error(h, st, "set_stream: %s", why);
    return KVS_OK;
}

/* --- binding --------------------------------------------------------------------------------------- */

static kvs_status check_req_spans(kvs_handle *h, const kvs_meta_req *r) {
    char why[256];
    const kvs_layer_view *fewest =
        &h->views[h->fewest_blocks_layer]; /* a block id fits every layer */
    for (uint64_t i = 0; i < r->n_loads; i++) {
        kvs_token_span span = {r->block_ids, r->n_block_ids, r->loads[i].first_token,
                               r->loads[i].n_tokens};
        if (kvs_kernel_check_span(fewest, &h->shape, &span, why, sizeof why) != KVS_OK)
            return kvs_set_error(h, KVS_EINVAL, "bind_meta: request '%s': load: layer %u: %s",
                                 r->id, h->fewest_blocks_layer, why);
    }
    if (r->n_layer_bytes) { /* the layer mask: one bit per layer, none past the last */
        uint32_t nl = h->model.n_layers, bits = r->n_layer_bytes * 8;
        int stray = r->n_layer_bytes != (nl + 7) / 8;
        for (uint32_t l = nl; !stray && l < bits; l++) stray = r->layers[l / 8] >> (l % 8) & 1;
        if (stray)
            return kvs_set_error(
                h, KVS_EINVAL,
                "bind_meta: request '%s': its layer mask (%u bytes) does not fit a "
                "%u-layer model",
                r->id, r->n_layer_bytes, nl);
    }
    for (uint64_t i = 0; i < r->n_saves; i++) {
        kvs_token_span span = {r->block_ids, r->n_block_ids, r->saves[i].chunk_first,
                               h->chunk_tokens};
        if (kvs_kernel_check_span(fewest, &h->shape, &span, why, sizeof why) != KVS_OK)
            return kvs_set_error(h, KVS_EINVAL, "bind_meta: request '%s': save: layer %u: %s",
                                 r->id, h->fewest_blocks_layer, why);
    }
    return KVS_OK;
}

void kvs_worker_reset(kvs_handle *h) {
    for (uint64_t i = 0; i < h->n_loads; i++) {
        kvs_load_work *w = &h->loads[i];
        if (w->pinned) kvs_tiers_unpin(h->tiers, (uint32_t)w->tier, &w->load->key);
        if (w->slab) kvs_pool_free(h->pool, w->slab);
        free(w->layer_hash);
    }
    for (uint64_t i = 0; i < h->n_saves; i++) {
        kvs_save_work *w = &h->saves[i];
        if (w->slab)
            kvs_pool_free(h->pool, w->slab);
        else if (w->object)
            kvs_tiers_abort(h->tiers, w->ticket);
    }
    free(h->loads);
    free(h->saves);
    h->loads = NULL;
    h->saves = NULL;
    h->n_loads = h->n_saves = 0;
    kvs_meta_free(h->bound);
    h->bound = NULL;
    h->wstate = WORKER_IDLE;
    h->layers_loaded = 0;
    h->loads_pending = 0;
    if (h->layer_saved) memset(h->layer_saved, 0, h->n_views);
    if (h->layer_loaded) memset(h->layer_loaded, 0, h->n_views);
}

void kvs_worker_close(kvs_handle *h) {
    if (h->wstate != WORKER_IDLE && h->dev) {
        char why[512];
        h->dev->sync(h->dev_state, why, sizeof why); /* no copy may still touch a slab or a pin */
        if (h->hashpool) kvs_hashpool_wait(h->hashpool);
    }
    kvs_worker_reset(h);
    close_device(h);
}

kvs_status kvs_worker_bind(kvs_handle *h, const void *meta, uint64_t len) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "bind_meta");
    if (st != KVS_OK) return st;
    if (!h->views)
        return kvs_set_error(h, KVS_ESTATE, "bind_meta: register_kv has not been called");
    if (h->wstate != WORKER_IDLE)
        return kvs_set_error(h, KVS_ESTATE,
                             "bind_meta: step %llu is still bound; call wait_save first",
                             (unsigned long long)h->bound->step);
    char why[256];
    kvs_meta *m = NULL;
    if ((st = kvs_meta_decode(meta, len, &m, why, sizeof why)) != KVS_OK)
        return kvs_set_error(h, st, "bind_meta: %s", why);
    if (memcmp(&m->fingerprint, &h->fingerprint, sizeof m->fingerprint) != 0 ||
        m->chunk_tokens != h->chunk_tokens) {
        kvs_meta_free(m);
        return kvs_set_error(
            h, KVS_EINVAL, "bind_meta: metadata was built for another model, layout or chunk size");
    }
    uint64_t n_loads = 0, n_saves = 0;
    for (uint64_t i = 0; i < m->n_reqs; i++) {
        if ((st = check_req_spans(h, &m->reqs[i])) != KVS_OK) {
            kvs_meta_free(m);
            return st;
        }
        n_loads += m->reqs[i].n_loads;
        n_saves += m->reqs[i].n_saves;
    }
    h->loads = n_loads ? calloc(n_loads, sizeof *h->loads) : NULL;
    h->saves = n_saves ? calloc(n_saves, sizeof *h->saves) : NULL;
    if ((n_loads && !h->loads) || (n_saves && !h->saves)) {
        free(h->loads);
        free(h->saves);
        h->loads = NULL;
        h->saves = NULL;
        kvs_meta_free(m);
        return kvs_set_error(h, KVS_ENOMEM, "bind_meta: out of memory");
    }
    for (uint64_t i = 0; i < m->n_reqs; i++) {
        const kvs_meta_req *r = &m->reqs[i];
        for (uint64_t j = 0; j < r->n_loads; j++)
            h->loads[h->n_loads++] = (kvs_load_work){.req = r, .load = &r->loads[j], .tier = -1};
        for (uint64_t j = 0; j < r->n_saves; j++)
            h->saves[h->n_saves++] = (kvs_save_work){.req = r, .save = &r->saves[j]};
    }
    h->bound = m;
    h->n_error_blocks = 0;
    h->wstate = WORKER_BOUND;
    return KVS_OK;
}

/* --- loading --------------------------------------------------------------------------------------- */

static void add_error_block(kvs_handle *h, uint32_t block) {
    for (uint64_t i = 0; i < h->n_error_blocks; i++)
        if (h->error_blocks[i] == block) return;
    if (h->n_error_blocks == h->cap_error_blocks) {
        uint64_t cap = h->cap_error_blocks ? h->cap_error_blocks * 2 : 64;
        uint32_t *grown = realloc(h->error_blocks, cap * sizeof *grown);
        if (!grown)
            return; /* the load is already marked failed; the engine still sees a short list */
        h->error_blocks = grown;
        h->cap_error_blocks = cap;
    }
    h->error_blocks[h->n_error_blocks++] = block;
}

static void fail_load(kvs_handle *h, kvs_load_work *w, const char *why) {
    char hex[33];
    kvs_key_hex(&w->load->key, hex);
    kvs_log(h->cfg->log_level, KVS_LOG_WARN, "request '%s': load of chunk %s failed: %s",
            w->req->id, hex, why);
    w->failed = 1;
    h->stats.load_errors++;
    uint64_t bt = h->model.block_tokens;
    uint64_t end = w->load->first_token + w->load->n_tokens;
    for (uint64_t b = w->load->first_token / bt; b <= (end - 1) / bt; b++)
        add_error_block(h, w->req->block_ids[b]);
}

/* Check a chunk's header and keep its checksums: the payload is checked against these, never
 * against a header that could change under a zero-copy reference. */
static void accept_object(kvs_handle *h, kvs_load_work *w, const void *obj, uint64_t len) {
    char why[256];
    if (kvs_object_check_header(obj, len, &h->fingerprint, &w->load->key, h->model.n_layers,
                                h->chunk_tokens, h->layer_bytes, why, sizeof why) != KVS_OK) {
        fail_load(h, w, why);
        w->drop = 1;
        return;
    }
    if (!(w->layer_hash = calloc(2 * (uint64_t)h->model.n_layers, sizeof *w->layer_hash)))
        return fail_load(h, w, "out of memory");
    memcpy(w->layer_hash, kvs_object_layer_hashes((void *)obj),
           h->model.n_layers * sizeof *w->layer_hash);
    w->object = obj;
}

/* Resolve one chunk: pin it where it lives; a zero-copy tier hands out its bytes at once, any other
 * gets a staging slab to be filled by fetch_objects. */
static void open_load(kvs_handle *h, kvs_load_work *w) {
    const kvs_key *key = &w->load->key;
    w->tier = kvs_tiers_find(h->tiers, key);
    if (w->tier < 0) return fail_load(h, w, "not in any tier (evicted after lookup)");
    uint32_t tier = (uint32_t)w->tier;
    uint64_t len = 0;
    if (!kvs_tiers_pin(h->tiers, tier, key, h->cfg->lease_timeout_ms))
        return fail_load(h, w, "evicted before it could be pinned");
    w->pinned = 1;
    /* Some layers only (a layer or stage plan sets a mask): read just those where the tier can, into a
     * slab. */
    w->ranged = w->req->n_layer_bytes && kvs_tiers_can_get_range(h->tiers, tier);
    if (kvs_tiers_zero_copy(h->tiers, tier) && !w->ranged) {
        const void *obj = NULL;
        if (kvs_tiers_get_ref(h->tiers, tier, key, &obj, &len) != KVS_OK)
            return fail_load(h, w, kvs_tiers_last_error(h->tiers, tier));
        return accept_object(h, w, obj, len);
    }
    if (!(w->slab = kvs_pool_alloc(h->pool))) return fail_load(h, w, "no staging slab free");
}

/* A load of some layers only reads the header and checksum table first (fetch_range), then each
 * wanted layer to its place in the slab when it is needed (fetch_layer): at start_load on a CUDA
 * device, when the engine waits for the layer on the host device, so the reads follow the order the
 * engine asks for layers in. Unwanted layers stay unread and are never used. */
static int load_live(const kvs_load_work *w);

static void fetch_layer(kvs_handle *h, kvs_load_work *w, uint32_t layer) {
    uint32_t tier = (uint32_t)w->tier;
    uint64_t from = kvs_object_payload_offset(h->model.n_layers) + (uint64_t)layer * h->layer_bytes;
    uint64_t got = 0, len = 0;
    if (kvs_tiers_get_range(h->tiers, tier, &w->load->key, from, h->layer_bytes,
                            (uint8_t *)w->slab + from, &got, &len) != KVS_OK)
        return fail_load(h, w, kvs_tiers_last_error(h->tiers, tier));
    if (got != h->layer_bytes) fail_load(h, w, "the stored object is shorter than its layers");
}

static void fetch_range(kvs_handle *h, kvs_load_work *w) {
    uint32_t tier = (uint32_t)w->tier;
    uint64_t head = kvs_object_payload_offset(h->model.n_layers);
    uint64_t got = 0, len = 0;
    if (kvs_tiers_get_range(h->tiers, tier, &w->load->key, 0, head, w->slab, &got, &len) != KVS_OK)
        return fail_load(h, w, kvs_tiers_last_error(h->tiers, tier));
    if (got != head) return fail_load(h, w, "the stored object is shorter than its header");
    accept_object(h, w, w->slab, len);
    for (uint32_t l = 0; !h->dev_info.synchronous && l < h->model.n_layers && load_live(w); l++)
        if (kvs_meta_wants_layer(w->req, l)) fetch_layer(h, w, l);
}

/* Fill the staging slabs of every load that needs a copy: one get_many per tier that has it (so a
 * tier over several devices submits the step's reads together), else one get per chunk. */
static void fetch_objects(kvs_handle *h) {
    uint64_t cap = kvs_pool_slab_bytes(h->pool);
    for (uint64_t i = 0; i < h->n_loads; i++)
        if (h->loads[i].slab && !h->loads[i].failed && h->loads[i].ranged)
            fetch_range(h, &h->loads[i]);
    for (uint32_t t = 0; t < kvs_tiers_count(h->tiers); t++) {
        uint64_t n = 0;
        for (uint64_t i = 0; i < h->n_loads; i++)
            if (h->loads[i].slab && !h->loads[i].failed && !h->loads[i].ranged &&
                h->loads[i].tier == (int)t)
                n++;
        if (n == 0) continue;
        int many = kvs_tiers_can_get_many(h->tiers, t);
        kvs_key *keys = many ? malloc(n * sizeof *keys) : NULL;
        void **dsts = many ? malloc(n * sizeof *dsts) : NULL;
        uint64_t *caps = many ? malloc(n * sizeof *caps) : NULL,
                 *lens = many ? calloc(n, sizeof *lens) : NULL;
        kvs_status *sts = many ? calloc(n, sizeof *sts) : NULL;
        kvs_load_work **ws = many ? malloc(n * sizeof *ws) : NULL;
        if (many && (!keys || !dsts || !caps || !lens || !sts || !ws))
            many = 0; /* fall back to single gets */
        if (many) {
            uint64_t k = 0;
            for (uint64_t i = 0; i < h->n_loads; i++) {
                kvs_load_work *w = &h->loads[i];
                if (!w->slab || w->failed || w->ranged || w->tier != (int)t) continue;
                keys[k] = w->load->key;
                dsts[k] = w->slab;
                caps[k] = cap;
                ws[k++] = w;
            }
            if (kvs_tiers_get_many(h->tiers, t, keys, dsts, caps, n, lens, sts) != KVS_OK)
                for (uint64_t k2 = 0; k2 < n; k2++) sts[k2] = KVS_EIO;
            for (uint64_t k2 = 0; k2 < n; k2++) {
                if (sts[k2] == KVS_OK)
                    accept_object(h, ws[k2], ws[k2]->slab, lens[k2]);
                else
                    fail_load(h, ws[k2], kvs_tiers_last_error(h->tiers, t));
            }
        } else {
            for (uint64_t i = 0; i < h->n_loads; i++) {
                kvs_load_work *w = &h->loads[i];
                if (!w->slab || w->failed || w->ranged || w->tier != (int)t) continue;
                uint64_t len = 0;
                if (kvs_tiers_get(h->tiers, t, &w->load->key, w->slab, cap, &len) != KVS_OK)
                    fail_load(h, w, kvs_tiers_last_error(h->tiers, t));
                else
                    accept_object(h, w, w->slab, len);
            }
        }
        free(keys);
        free(dsts);
        free(caps);
        free(lens);
        free(sts);
        free(ws);
    }
}

/* The copy of one layer of one load: the rows of the loaded range within the chunk's payload. */
static void load_copy(const kvs_handle *h, kvs_load_work *w, uint32_t layer, kvs_dev_copy *c) {
    const kvs_meta_load *l = w->load;
    uint8_t *payload = kvs_object_layer((void *)w->object, layer);
    uint64_t row = (uint64_t)h->shape.n_heads * h->shape.head_bytes;
    uint64_t off = (l->first_token - l->chunk_first) * row;
    *c = (kvs_dev_copy){.block_ids = w->req->block_ids,
                        .n_block_ids = w->req->n_block_ids,
                        .first_token = l->first_token,
                        .n_tokens = l->n_tokens,
                        .k_payload = payload + off,
                        .v_payload = h->shape.has_v ? payload + h->chunk_tokens * row + off : NULL};
}

static int load_live(const kvs_load_work *w) {
    return !w->failed && w->object;
}

static void layer_mismatch(kvs_handle *h, kvs_load_work *w, uint32_t layer) {
    char why[64];
    kvs_fmt(why, sizeof why, "layer %u checksum mismatch", layer);
    fail_load(h, w, why);
    w->drop = 1;
}

static void device_failed_loads(kvs_handle *h, const char *what, const char *why) {
    for (uint64_t i = 0; i < h->n_loads; i++)
        if (load_live(&h->loads[i])) fail_load(h, &h->loads[i], why);
    kvs_log(h->cfg->log_level, KVS_LOG_ERROR, "device %s: %s: %s", h->dev_info.name, what, why);
}

/* Host device: one layer at a time, when the engine reaches it. A whole chunk is checksummed in
 * the same pass as its copy; a partial one is checked before its rows are copied. */
static void load_layer_sync(kvs_handle *h, uint32_t layer) {
    uint64_t n = 0, nl = h->model.n_layers;
    kvs_load_work **in_copy = (kvs_load_work **)h->copy_owner;
    for (uint64_t i = 0; i < h->n_loads && n < h->cfg->max_chunks_per_step; i++) {
        kvs_load_work *w = &h->loads[i];
        if (!load_live(w) || !kvs_meta_wants_layer(w->req, layer))
            continue; /* the engine computes it */
        if (w->ranged) {
            fetch_layer(h, w, layer);
            if (!load_live(w)) continue;
        }
        int whole = w->load->n_tokens == h->chunk_tokens;
        if (!whole) {
            const void *payload = kvs_object_layer((void *)w->object, layer);
            if (XXH3_64bits(payload, h->layer_bytes) != w->layer_hash[layer]) {
                layer_mismatch(h, w, layer);
                continue;
            }
        }
        load_copy(h, w, layer, &h->copies[n]);
        h->copies[n].hash = whole ? &w->layer_hash[nl + layer] : NULL;
        in_copy[n++] = w;
    }
    char why[512] = "";
    if (h->dev->load_layer(h->dev_state, layer, h->copies, n, why, sizeof why) != KVS_OK) {
        for (uint64_t i = 0; i < n; i++) fail_load(h, in_copy[i], why);
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        kvs_load_work *w = in_copy[i];
        if (h->copies[i].hash && w->layer_hash[nl + layer] != w->layer_hash[layer])
            layer_mismatch(h, w, layer);
        else
            h->stats.bytes_loaded += (uint64_t)w->load->n_tokens * h->layer_bytes / h->chunk_tokens;
    }
}

/* CUDA device: every layer is enqueued at once (events per layer let the engine wait on each), and
 * the hash pool checksums every layer payload on the host while the copies run. */
static void load_all_async(kvs_handle *h) {
    uint64_t nl = h->model.n_layers, n_jobs = 0;
    for (uint32_t layer = 0; layer < h->n_views; layer++) {
        uint64_t n = 0;
        for (uint64_t i = 0; i < h->n_loads; i++)
            if (load_live(&h->loads[i]) && kvs_meta_wants_layer(h->loads[i].req, layer))
                load_copy(h, &h->loads[i], layer, &h->copies[n++]);
        char why[512] = "";
        if (n && h->dev->load_layer(h->dev_state, layer, h->copies, n, why, sizeof why) != KVS_OK) {
            char what[64];
            kvs_fmt(what, sizeof what, "load of layer %u", layer);
            device_failed_loads(h, what, why);
            break;
        }
    }
    for (uint64_t i = 0; i < h->n_loads; i++) {
        kvs_load_work *w = &h->loads[i];
        if (!load_live(w)) continue;
        for (uint32_t layer = 0; layer < nl; layer++)
            if (kvs_meta_wants_layer(w->req, layer))
                h->hash_jobs[n_jobs++] = (kvs_hash_job){kvs_object_layer((void *)w->object, layer),
                                                        h->layer_bytes, &w->layer_hash[nl + layer]};
    }
    if (n_jobs) kvs_hashpool_submit(h->hashpool, h->hash_jobs, n_jobs);
    h->loads_pending = 1;
}

static void finish_loads(kvs_handle *h) {
    for (uint64_t i = 0; i < h->n_loads; i++) {
        kvs_load_work *w = &h->loads[i];
        if (load_live(w)) {
            h->stats.chunks_loaded++;
            if (w->tier >= 0 && w->tier < KVS_STATS_MAX_TIERS)
                h->stats.tier_chunks_loaded[w->tier]++;
        }
        if (w->pinned) {
            kvs_tiers_unpin(h->tiers, (uint32_t)w->tier, &w->load->key);
            w->pinned = 0;
        }
        if (w->drop)
            kvs_tiers_remove(h->tiers, &w->load->key); /* a bad object is a miss from now on */
        w->drop = 0;
        if (w->slab) kvs_pool_free(h->pool, w->slab);
        free(w->layer_hash);
        w->layer_hash = NULL;
        w->slab = NULL;
        w->object = NULL;
    }
}

/* CUDA device: wait for the copies and the checksums, turn mismatches into error blocks, unpin. */
static void complete_async_loads(kvs_handle *h) {
    if (!h->loads_pending) return;
    h->loads_pending = 0;
    char why[512] = "";
    kvs_status st = h->dev->sync(h->dev_state, why, sizeof why);
    kvs_hashpool_wait(h->hashpool);
    if (st != KVS_OK) device_failed_loads(h, "loads", why);
    uint64_t nl = h->model.n_layers;
    for (uint64_t i = 0; i < h->n_loads; i++) {
        kvs_load_work *w = &h->loads[i];
        uint32_t wanted = 0;
        for (uint32_t layer = 0; layer < nl && load_live(w); layer++)
            if (kvs_meta_wants_layer(w->req, layer)) {
                wanted++;
                if (w->layer_hash[nl + layer] != w->layer_hash[layer]) layer_mismatch(h, w, layer);
            }
        if (load_live(w))
            h->stats.bytes_loaded +=
                (uint64_t)w->load->n_tokens * h->layer_bytes * wanted / h->chunk_tokens;
    }
    finish_loads(h);
}

/* Host device: land layers [from, to] not landed yet (in any order the engine asks for them; the
 * loads finish, unpinning, once every layer has landed). Only time spent in the connector counts as
 * load time: the engine computes between layers. */
static void load_layers(kvs_handle *h, uint32_t from, uint32_t to) {
    if (!h->dev_info.synchronous) return; /* enqueued by start_load */
    uint64_t t0 = kvs_now_ns();
    for (uint32_t l = from; l <= to && l < h->n_views; l++) {
        if (h->layer_loaded[l]) continue;
        load_layer_sync(h, l);
        h->layer_loaded[l] = 1;
        if (++h->layers_loaded == h->n_views) finish_loads(h);
    }
    h->stats.load_ns += kvs_now_ns() - t0;
}

kvs_status kvs_worker_start_load(kvs_handle *h) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "start_load");
    if (st != KVS_OK) return st;
    if (h->wstate != WORKER_BOUND)
        return kvs_set_error(h, KVS_ESTATE, "start_load: %s",
                             h->wstate == WORKER_IDLE ? "no metadata bound (call bind_meta first)"
                                                      : "already started for this step");
    uint64_t t0 = kvs_now_ns();
    uint64_t max = h->cfg->max_chunks_per_step;
    for (uint64_t i = 0; i < h->n_loads; i++) {
        if (i < max)
            open_load(h, &h->loads[i]);
        else
            fail_load(h, &h->loads[i],
                      "the step loads more chunks than device.max_chunks_per_step");
    }
    fetch_objects(h);
    h->wstate = WORKER_LOADING;
    h->layers_loaded = 0;
    memset(h->layer_loaded, 0, h->n_views);
    if (!h->dev_info.synchronous) load_all_async(h);
    h->stats.load_ns += kvs_now_ns() - t0;
    return KVS_OK;
}

kvs_status kvs_worker_wait_layer(kvs_handle *h, uint32_t layer) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "wait_layer_load");
    if (st != KVS_OK) return st;
    if (h->wstate != WORKER_LOADING)
        return kvs_set_error(h, KVS_ESTATE,
                             "wait_layer_load: start_load has not been called for this step");
    if (layer >= h->n_views)
        return kvs_set_error(h, KVS_EINVAL, "wait_layer_load: layer %u of a %u-layer model", layer,
                             h->n_views);
    if (h->dev_info.synchronous) {
        load_layers(h, layer, layer);
        return KVS_OK;
    }
    char why[512] = "";
    if ((st = h->dev->wait_layer(h->dev_state, layer, why, sizeof why)) != KVS_OK)
        return kvs_set_error(h, st, "wait_layer_load: layer %u: %s", layer, why);
    return KVS_OK;
}

/* --- saving ---------------------------------------------------------------------------------------- */

/* A chunk's KV depends on every token before it, so a failed load taints every chunk that ends after
 * a failed block begins: the engine computed it on top of garbage. This covers the request's own
 * failed loads and pages it shares with a request whose load failed. */
static int tainted_by_error(kvs_handle *h, const kvs_save_work *w) {
    if (!h->n_error_blocks) return 0;
    uint64_t last = (w->save->chunk_first + h->chunk_tokens - 1) / h->model.block_tokens;
    for (uint64_t b = 0; b <= last && b < w->req->n_block_ids; b++)
        for (uint64_t e = 0; e < h->n_error_blocks; e++)
            if (w->req->block_ids[b] == h->error_blocks[e]) return 1;
    return 0;
}

/* Where a save's object is built: a reservation in the top tier when it can be written in place
 * (the gather lands in the tier: one copy in all), else a staging slab put into the tiers later. */
static int place_save(kvs_handle *h, kvs_save_work *w) {
    if (kvs_tiers_can_reserve(h->tiers)) {
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
    if (!(w->slab = kvs_pool_alloc(h->pool))) return 0;
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

/* At the first save_layer of a step: decide which saves happen and where they are built. */
static void open_saves(kvs_handle *h) {
    uint64_t placed = 0;
    for (uint64_t i = 0; i < h->n_saves; i++) {
        kvs_save_work *w = &h->saves[i];
        if (tainted_by_error(h, w) || kvs_tiers_find(h->tiers, &w->save->key) >= 0) {
            h->stats
                .saves_skipped++; /* garbage pages are never saved; stored chunks need no copy */
            continue;
        }
        if (placed == h->cfg->max_chunks_per_step || !place_save(h, w)) {
            h->stats.saves_skipped++;
            continue;
        }
        placed++;
        kvs_object_init(w->object, &h->fingerprint, &w->save->key, h->model.n_layers,
                        h->chunk_tokens, h->layer_bytes);
    }
}

kvs_status kvs_worker_save_layer(kvs_handle *h, uint32_t layer) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "save_layer");
    if (st != KVS_OK) return st;
    if (h->wstate == WORKER_IDLE)
        return kvs_set_error(h, KVS_ESTATE, "save_layer: no metadata bound (call bind_meta first)");
    if (layer >= h->n_views)
        return kvs_set_error(h, KVS_EINVAL, "save_layer: layer %u of a %u-layer model", layer,
                             h->n_views);
    if (h->layer_saved[layer])
        return kvs_set_error(h, KVS_ESTATE, "save_layer: layer %u was already saved in this step",
                             layer);
    int first = 1;
    for (uint32_t l = 0; l < h->n_views; l++) first &= !h->layer_saved[l];
    /* The engine computed this layer, so its loads must have landed (and failed ones be known). */
    if (h->wstate == WORKER_LOADING) load_layers(h, layer, layer);
    uint64_t t0 = kvs_now_ns();
    if (first) open_saves(h);
    h->layer_saved[layer] = 1;
    uint64_t n = 0, part = (uint64_t)h->chunk_tokens * h->shape.n_heads * h->shape.head_bytes;
    kvs_save_work **owner = (kvs_save_work **)h->copy_owner;
    for (uint64_t i = 0; i < h->n_saves; i++) {
        kvs_save_work *w = &h->saves[i];
        if (!w->object) continue;
        uint8_t *payload = kvs_object_layer(w->object, layer);
        h->copies[n] = (kvs_dev_copy){
            .block_ids = w->req->block_ids,
            .n_block_ids = w->req->n_block_ids,
            .first_token = w->save->chunk_first,
            .n_tokens = h->chunk_tokens,
            .k_payload = payload,
            .v_payload = h->shape.has_v ? payload + part : NULL,
            .hash = h->dev_info.hashes_inline ? &kvs_object_layer_hashes(w->object)[layer] : NULL};
        owner[n++] = w;
    }
    char why[512] = "";
    if (n &&
        (st = h->dev->save_layer(h->dev_state, layer, h->copies, n, why, sizeof why)) != KVS_OK) {
        h->stats.save_ns += kvs_now_ns() - t0;
        /* These objects will miss a layer, so wait_save drops them. */
        return kvs_set_error(h, st, "save_layer: layer %u: %s", layer, why);
    }
    for (uint64_t i = 0; i < n; i++) owner[i]->layers_done++;
    h->stats.save_ns += kvs_now_ns() - t0;
    return KVS_OK;
}

/* CUDA device: the gathers have landed; checksum every layer of every save on the hash pool. */
static kvs_status hash_saves(kvs_handle *h) {
    char why[512] = "";
    kvs_status st = h->dev->sync(h->dev_state, why, sizeof why);
    if (st != KVS_OK) {
        kvs_log(h->cfg->log_level, KVS_LOG_ERROR, "device %s: saves: %s", h->dev_info.name, why);
        for (uint64_t i = 0; i < h->n_saves; i++) release_save(h, &h->saves[i]);
        return kvs_set_error(h, st, "wait_save: %s", why);
    }
    uint64_t n_jobs = 0;
    for (uint64_t i = 0; i < h->n_saves; i++) {
        kvs_save_work *w = &h->saves[i];
        if (!w->object || w->layers_done != h->n_views) continue;
        for (uint32_t l = 0; l < h->n_views; l++)
            h->hash_jobs[n_jobs++] = (kvs_hash_job){kvs_object_layer(w->object, l), h->layer_bytes,
                                                    &kvs_object_layer_hashes(w->object)[l]};
    }
    if (n_jobs) {
        kvs_hashpool_submit(h->hashpool, h->hash_jobs, n_jobs);
        kvs_hashpool_wait(h->hashpool);
    }
    return KVS_OK;
}

static void store_save(kvs_handle *h, kvs_save_work *w) {
    kvs_object_seal(w->object);
    char why[256];
    kvs_status st = w->slab ? kvs_tiers_put(h->tiers, &w->save->key, w->object, h->object_bytes,
                                            why, sizeof why)
                            : kvs_tiers_commit(h->tiers, &w->save->key, w->ticket, w->object,
                                               h->object_bytes, why, sizeof why);
    if (st == KVS_OK) {
        h->stats.chunks_saved++;
        h->stats.bytes_saved += (uint64_t)h->n_views * h->layer_bytes;
    } else {
        kvs_log(h->cfg->log_level, KVS_LOG_WARN, "request '%s': save not stored: %s", w->req->id,
                why);
        h->stats.saves_skipped++;
    }
    if (w->slab) kvs_pool_free(h->pool, w->slab);
    w->slab = w->object = NULL; /* a committed reservation belongs to the tier now */
}

kvs_status kvs_worker_wait_save(kvs_handle *h) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "wait_save");
    if (st != KVS_OK) return st;
    if (h->wstate == WORKER_IDLE)
        return kvs_set_error(h, KVS_ESTATE, "wait_save: no metadata bound (call bind_meta first)");
    if (h->wstate == WORKER_LOADING) load_layers(h, 0, h->n_views - 1);
    uint64_t t0 = kvs_now_ns();
    complete_async_loads(h); /* errors found here taint the saves below */
    kvs_status result = KVS_OK;
    if (!h->dev_info.synchronous) result = hash_saves(h);
    for (uint64_t i = 0; i < h->n_saves; i++) {
        kvs_save_work *w = &h->saves[i];
        if (!w->object) continue;
        /* A chunk whose load failed after its save began holds garbage: drop it. */
        if (w->layers_done != h->n_views || tainted_by_error(h, w)) {
            if (w->layers_done != h->n_views)
                kvs_log(h->cfg->log_level, KVS_LOG_WARN,
                        "request '%s': save dropped: %u of %u layers were gathered", w->req->id,
                        w->layers_done, h->n_views);
            h->stats.saves_skipped++;
            release_save(h, w);
            continue;
        }
        store_save(h, w);
    }
    h->stats.save_ns += kvs_now_ns() - t0;
    kvs_worker_reset(h);
    return result;
}

kvs_status kvs_worker_error_blocks(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "load_error_blocks");
    if (st != KVS_OK) return st;
    if (!n || (cap && !out))
        return kvs_set_error(h, KVS_EINVAL, "load_error_blocks: out or n is NULL");
    *n = h->n_error_blocks;
    if (cap < h->n_error_blocks)
        return kvs_set_error(h, KVS_EOVERFLOW,
                             "load_error_blocks: %llu blocks failed, buffer holds %llu",
                             (unsigned long long)h->n_error_blocks, (unsigned long long)cap);
    if (h->n_error_blocks) memcpy(out, h->error_blocks, h->n_error_blocks * sizeof *out);
    return KVS_OK;
}
