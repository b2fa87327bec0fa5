/* worker.c - the worker-role hooks: register the engine's pages, bind a step's metadata, load chunks
 * layer by layer (verifying every layer's checksum while scattering it), gather and seal saves. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "handle.h"
#include "keys.h"
#include "log.h"
#include "object.h"

kvs_status kvs_worker_register(kvs_handle *h, const kvs_layer_view *views, uint32_t n_layers) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "register_kv");
    if (st != KVS_OK) return st;
    if (h->views) return kvs_set_error(h, KVS_ESTATE, "register_kv: the KV cache is already registered");
    if (!views) return kvs_set_error(h, KVS_EINVAL, "register_kv: views is NULL");
    if (n_layers != h->model.n_layers)
        return kvs_set_error(h, KVS_EINVAL, "register_kv: %u views for a model of %u layers", n_layers,
                             h->model.n_layers);
    for (uint32_t l = 0; l < n_layers; l++) {
        char why[256];
        if (views[l].struct_size < sizeof(kvs_layer_view))
            return kvs_set_error(h, KVS_EINVAL, "register_kv: layer %u: struct_size %u is smaller than %zu",
                                 l, views[l].struct_size, sizeof(kvs_layer_view));
        if (views[l].device_kind != KVS_DEVICE_HOST)
            return kvs_set_error(h, KVS_ENOTSUP,
                                 "register_kv: layer %u: device kind %d is not supported by this build "
                                 "(host device only)", l, (int)views[l].device_kind);
        if (kvs_kernel_check_view(&views[l], &h->shape, why, sizeof why) != KVS_OK)
            return kvs_set_error(h, KVS_EINVAL, "register_kv: layer %u: %s", l, why);
    }
    h->views = malloc(n_layers * sizeof *h->views);
    h->layer_saved = calloc(n_layers, 1);
    if (!h->views || !h->layer_saved) {
        free(h->views);
        free(h->layer_saved);
        h->views = NULL;
        h->layer_saved = NULL;
        return kvs_set_error(h, KVS_ENOMEM, "register_kv: out of memory");
    }
    memcpy(h->views, views, n_layers * sizeof *h->views);
    h->n_views = n_layers;
    return KVS_OK;
}

/* --- binding --------------------------------------------------------------------------------------- */

static kvs_status check_req_spans(kvs_handle *h, const kvs_meta_req *r) {
    char why[256];
    for (uint64_t i = 0; i < r->n_loads; i++) {
        kvs_token_span span = {r->block_ids, r->n_block_ids, r->loads[i].first_token, r->loads[i].n_tokens};
        if (kvs_kernel_check_span(&h->views[0], &h->shape, &span, why, sizeof why) != KVS_OK)
            return kvs_set_error(h, KVS_EINVAL, "bind_meta: request '%s': load: %s", r->id, why);
    }
    for (uint64_t i = 0; i < r->n_saves; i++) {
        kvs_token_span span = {r->block_ids, r->n_block_ids, r->saves[i].chunk_first, h->chunk_tokens};
        if (kvs_kernel_check_span(&h->views[0], &h->shape, &span, why, sizeof why) != KVS_OK)
            return kvs_set_error(h, KVS_EINVAL, "bind_meta: request '%s': save: %s", r->id, why);
    }
    return KVS_OK;
}

void kvs_worker_reset(kvs_handle *h) {
    for (uint64_t i = 0; i < h->n_loads; i++) {
        kvs_load_work *w = &h->loads[i];
        if (w->pinned) {
            const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, (uint32_t)w->tier);
            ops->unpin(kvs_tiers_state(h->tiers, (uint32_t)w->tier), &w->load->key, 1);
        }
        if (w->slab) kvs_pool_free(h->pool, w->slab);
        free(w->layer_hash);
    }
    for (uint64_t i = 0; i < h->n_saves; i++)
        if (h->saves[i].slab) kvs_pool_free(h->pool, h->saves[i].slab);
    free(h->loads);
    free(h->saves);
    h->loads = NULL;
    h->saves = NULL;
    h->n_loads = h->n_saves = 0;
    kvs_meta_free(h->bound);
    h->bound = NULL;
    h->wstate = WORKER_IDLE;
    h->layers_loaded = 0;
    if (h->layer_saved) memset(h->layer_saved, 0, h->n_views);
}

kvs_status kvs_worker_bind(kvs_handle *h, const void *meta, uint64_t len) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "bind_meta");
    if (st != KVS_OK) return st;
    if (!h->views) return kvs_set_error(h, KVS_ESTATE, "bind_meta: register_kv has not been called");
    if (h->wstate != WORKER_IDLE)
        return kvs_set_error(h, KVS_ESTATE, "bind_meta: step %llu is still bound; call wait_save first",
                             (unsigned long long)h->bound->step);
    char why[256];
    kvs_meta *m = NULL;
    if ((st = kvs_meta_decode(meta, len, &m, why, sizeof why)) != KVS_OK)
        return kvs_set_error(h, st, "bind_meta: %s", why);
    if (memcmp(&m->fingerprint, &h->fingerprint, sizeof m->fingerprint) != 0 ||
        m->chunk_tokens != h->chunk_tokens) {
        kvs_meta_free(m);
        return kvs_set_error(h, KVS_EINVAL,
                             "bind_meta: metadata was built for another model, layout or chunk size");
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
        if (!grown) return; /* the load is already marked failed; the engine still sees a short list */
        h->error_blocks = grown;
        h->cap_error_blocks = cap;
    }
    h->error_blocks[h->n_error_blocks++] = block;
}

static void fail_load(kvs_handle *h, kvs_load_work *w, const char *why) {
    char hex[33];
    kvs_key_hex(&w->load->key, hex);
    kvs_log(h->cfg->log_level, KVS_LOG_WARN, "request '%s': load of chunk %s failed: %s", w->req->id, hex,
            why);
    w->failed = 1;
    h->stats.load_errors++;
    uint64_t bt = h->model.block_tokens;
    uint64_t end = w->load->first_token + w->load->n_tokens;
    for (uint64_t b = w->load->first_token / bt; b <= (end - 1) / bt; b++)
        add_error_block(h, w->req->block_ids[b]);
}

/* Resolve one chunk: pin it where it lives and get a pointer to its verified header. */
static void open_load(kvs_handle *h, kvs_load_work *w) {
    char why[256];
    const kvs_key *key = &w->load->key;
    w->tier = kvs_tiers_find(h->tiers, key);
    if (w->tier < 0) return fail_load(h, w, "not in any tier (evicted after lookup)");
    const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, (uint32_t)w->tier);
    void *state = kvs_tiers_state(h->tiers, (uint32_t)w->tier);
    uint64_t pinned = 0, len = 0;
    if (ops->pin(state, key, 1, h->cfg->lease_timeout_ms, &pinned) != KVS_OK || pinned != 1)
        return fail_load(h, w, "evicted before it could be pinned");
    w->pinned = 1;
    const void *obj = NULL;
    if (ops->caps & KVS_BACKEND_CAP_ZERO_COPY) {
        if (ops->get_ref(state, key, &obj, &len) != KVS_OK) return fail_load(h, w, ops->last_error(state));
    } else {
        if (!(w->slab = kvs_pool_alloc(h->pool))) return fail_load(h, w, "no staging slab free");
        if (ops->get(state, key, w->slab, kvs_pool_slab_bytes(h->pool), &len) != KVS_OK)
            return fail_load(h, w, ops->last_error(state));
        obj = w->slab;
    }
    if (kvs_object_check_header(obj, len, &h->fingerprint, key, h->model.n_layers, h->chunk_tokens,
                                h->layer_bytes, why, sizeof why) != KVS_OK) {
        fail_load(h, w, why);
        w->drop = 1;
        return;
    }
    /* Keep the verified checksums: the payload is checked against these, never against a header
     * that could change under a zero-copy reference. */
    if (!(w->layer_hash = malloc(h->model.n_layers * sizeof *w->layer_hash)))
        return fail_load(h, w, "out of memory");
    memcpy(w->layer_hash, kvs_object_layer_hashes((void *)obj), h->model.n_layers * sizeof *w->layer_hash);
    w->object = obj;
}

kvs_status kvs_worker_start_load(kvs_handle *h) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "start_load");
    if (st != KVS_OK) return st;
    if (h->wstate != WORKER_BOUND)
        return kvs_set_error(h, KVS_ESTATE, "start_load: %s",
                             h->wstate == WORKER_IDLE ? "no metadata bound (call bind_meta first)"
                                                      : "already started for this step");
    uint64_t t0 = kvs_now_ns();
    for (uint64_t i = 0; i < h->n_loads; i++) open_load(h, &h->loads[i]);
    h->stats.load_ns += kvs_now_ns() - t0;
    h->wstate = WORKER_LOADING;
    h->layers_loaded = 0;
    return KVS_OK;
}

/* Scatter one layer of one chunk, verifying its checksum. A partial chunk (the range does not cover
 * the whole chunk) is verified first, then its rows are packed into scratch and scattered. */
static void load_one_layer(kvs_handle *h, kvs_load_work *w, uint32_t layer) {
    const kvs_meta_load *l = w->load;
    const uint8_t *payload = kvs_object_layer((void *)w->object, layer);
    uint64_t want = w->layer_hash[layer];
    kvs_token_span span = {w->req->block_ids, w->req->n_block_ids, l->first_token, l->n_tokens};
    uint64_t got;
    if (l->n_tokens == h->chunk_tokens) {
        got = kvs_kernel_scatter_layer_hash(&h->views[layer], &h->shape, &span, payload);
    } else {
        got = XXH3_64bits(payload, h->layer_bytes);
        if (got == want) {
            uint64_t row = (uint64_t)h->shape.n_heads * h->shape.head_bytes;
            uint64_t off = (l->first_token - l->chunk_first) * row, part = l->n_tokens * row;
            memcpy(h->scratch, payload + off, part);
            if (h->shape.has_v) memcpy(h->scratch + part, payload + h->chunk_tokens * row + off, part);
            kvs_kernel_scatter_layer(&h->views[layer], &h->shape, &span, h->scratch);
        }
    }
    if (got != want) {
        char why[64];
        kvs_fmt(why, sizeof why, "layer %u checksum mismatch", layer);
        fail_load(h, w, why);
        w->drop = 1;
        return;
    }
    h->stats.bytes_loaded += (uint64_t)l->n_tokens * h->layer_bytes / h->chunk_tokens;
}

static void finish_loads(kvs_handle *h) {
    for (uint64_t i = 0; i < h->n_loads; i++) {
        kvs_load_work *w = &h->loads[i];
        if (!w->failed && w->object) h->stats.chunks_loaded++;
        if (w->pinned) {
            const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, (uint32_t)w->tier);
            ops->unpin(kvs_tiers_state(h->tiers, (uint32_t)w->tier), &w->load->key, 1);
            w->pinned = 0;
        }
        if (w->drop) kvs_tiers_remove(h->tiers, &w->load->key); /* a bad object is a miss from now on */
        w->drop = 0;
        if (w->slab) kvs_pool_free(h->pool, w->slab);
        free(w->layer_hash);
        w->layer_hash = NULL;
        w->slab = NULL;
        w->object = NULL;
    }
}

/* Only time spent moving and verifying counts as load time: the engine computes between layers. */
static void load_layers_through(kvs_handle *h, uint32_t layer) {
    uint64_t t0 = kvs_now_ns();
    for (; h->layers_loaded <= layer && h->layers_loaded < h->n_views; h->layers_loaded++)
        for (uint64_t i = 0; i < h->n_loads; i++)
            if (!h->loads[i].failed && h->loads[i].object) load_one_layer(h, &h->loads[i], h->layers_loaded);
    if (h->layers_loaded == h->n_views) finish_loads(h);
    h->stats.load_ns += kvs_now_ns() - t0;
}

kvs_status kvs_worker_wait_layer(kvs_handle *h, uint32_t layer) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "wait_layer_load");
    if (st != KVS_OK) return st;
    if (h->wstate != WORKER_LOADING)
        return kvs_set_error(h, KVS_ESTATE, "wait_layer_load: start_load has not been called for this step");
    if (layer >= h->n_views)
        return kvs_set_error(h, KVS_EINVAL, "wait_layer_load: layer %u of a %u-layer model", layer, h->n_views);
    if (h->layers_loaded <= layer) load_layers_through(h, layer);
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

/* At the first save_layer of a step: decide which saves happen and take their slabs. */
static void open_saves(kvs_handle *h) {
    for (uint64_t i = 0; i < h->n_saves; i++) {
        kvs_save_work *w = &h->saves[i];
        if (tainted_by_error(h, w) || kvs_tiers_find(h->tiers, &w->save->key) >= 0) {
            h->stats.saves_skipped++; /* garbage pages are never saved; stored chunks need no copy */
            continue;
        }
        if (!(w->slab = kvs_pool_alloc(h->pool))) {
            h->stats.saves_skipped++;
            continue;
        }
        kvs_object_init(w->slab, &h->fingerprint, &w->save->key, h->model.n_layers, h->chunk_tokens,
                        h->layer_bytes);
    }
}

kvs_status kvs_worker_save_layer(kvs_handle *h, uint32_t layer) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "save_layer");
    if (st != KVS_OK) return st;
    if (h->wstate == WORKER_IDLE)
        return kvs_set_error(h, KVS_ESTATE, "save_layer: no metadata bound (call bind_meta first)");
    if (layer >= h->n_views)
        return kvs_set_error(h, KVS_EINVAL, "save_layer: layer %u of a %u-layer model", layer, h->n_views);
    if (h->layer_saved[layer])
        return kvs_set_error(h, KVS_ESTATE, "save_layer: layer %u was already saved in this step", layer);
    int first = 1;
    for (uint32_t l = 0; l < h->n_views; l++) first &= !h->layer_saved[l];
    /* The engine computed this layer, so its loads must have landed (and failed ones be known). */
    if (h->wstate == WORKER_LOADING && h->layers_loaded <= layer) load_layers_through(h, layer);
    uint64_t t0 = kvs_now_ns();
    if (first) open_saves(h);
    h->layer_saved[layer] = 1;
    for (uint64_t i = 0; i < h->n_saves; i++) {
        kvs_save_work *w = &h->saves[i];
        if (!w->slab) continue;
        kvs_token_span span = {w->req->block_ids, w->req->n_block_ids, w->save->chunk_first, h->chunk_tokens};
        kvs_object_layer_hashes(w->slab)[layer] = kvs_kernel_gather_layer_hash(
            &h->views[layer], &h->shape, &span, kvs_object_layer(w->slab, layer));
        w->layers_done++;
    }
    h->stats.save_ns += kvs_now_ns() - t0;
    return KVS_OK;
}

kvs_status kvs_worker_wait_save(kvs_handle *h) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "wait_save");
    if (st != KVS_OK) return st;
    if (h->wstate == WORKER_IDLE)
        return kvs_set_error(h, KVS_ESTATE, "wait_save: no metadata bound (call bind_meta first)");
    if (h->wstate == WORKER_LOADING) load_layers_through(h, h->n_views - 1);
    uint64_t t0 = kvs_now_ns();
    for (uint64_t i = 0; i < h->n_saves; i++) {
        kvs_save_work *w = &h->saves[i];
        if (!w->slab) continue;
        /* A chunk whose load failed after its save began holds garbage: drop it. */
        if (w->layers_done != h->n_views || tainted_by_error(h, w)) {
            if (w->layers_done != h->n_views)
                kvs_log(h->cfg->log_level, KVS_LOG_WARN,
                        "request '%s': save dropped: save_layer called for %u of %u layers", w->req->id,
                        w->layers_done, h->n_views);
            h->stats.saves_skipped++;
            continue;
        }
        kvs_object_seal(w->slab);
        char why[256];
        if (kvs_tiers_put(h->tiers, &w->save->key, w->slab, h->object_bytes, why, sizeof why) == KVS_OK) {
            h->stats.chunks_saved++;
            h->stats.bytes_saved += (uint64_t)h->n_views * h->layer_bytes;
        } else {
            kvs_log(h->cfg->log_level, KVS_LOG_WARN, "request '%s': save not stored: %s", w->req->id, why);
            h->stats.saves_skipped++;
        }
    }
    h->stats.save_ns += kvs_now_ns() - t0;
    kvs_worker_reset(h);
    return KVS_OK;
}

kvs_status kvs_worker_error_blocks(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "load_error_blocks");
    if (st != KVS_OK) return st;
    if (!n || (cap && !out)) return kvs_set_error(h, KVS_EINVAL, "load_error_blocks: out or n is NULL");
    *n = h->n_error_blocks;
    if (cap < h->n_error_blocks)
        return kvs_set_error(h, KVS_EOVERFLOW, "load_error_blocks: %llu blocks failed, buffer holds %llu",
                             (unsigned long long)h->n_error_blocks, (unsigned long long)cap);
    if (h->n_error_blocks) memcpy(out, h->error_blocks, h->n_error_blocks * sizeof *out);
    return KVS_OK;
}
