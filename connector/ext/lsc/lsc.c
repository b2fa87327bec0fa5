/* lsc.c - the layer stream cache (lsc.h): each stream block is an object of the peer_gpu tier,
 * n_layers payloads of one chunk's layer back to back (block-major), pinned for as long as the
 * handle holds it; a fetch reads one layer of it with get_range and scatters it into the engine's
 * buffer pages, a store gathers them and writes the layer in place with put_range. */
#include "lsc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "connector/handle.h"
#include "connector/last_error.h"
#include "connector/role.h"
#include "connector/tiers.h"

#define LSC_PIN_MS (365ull * 24 * 3600 * 1000) /* as long as the handle holds the block */

typedef struct kvs_lsc {
    uint32_t tier; /* the peer_gpu tier */
    kvs_layer_view buffer;
    uint32_t n_blocks;
    uint64_t nonce; /* this handle's keys apart from any other's in the tier */
    uint8_t *layer; /* one layer of one stream block */
} kvs_lsc;

static kvs_key lsc_key(const kvs_lsc *c, uint32_t block) {
    kvs_key k;
    uint32_t nonce = (uint32_t)c->nonce;
    memcpy(k.bytes, KVS_TIERS_RAW_MAGIC, 8); /* raw: never written down, never announced */
    memcpy(k.bytes + 8, &nonce, 4);
    memcpy(k.bytes + 12, &block, 4);
    return k;
}

/* Straight from the peer_gpu tier: the blocks were never anywhere else (raw keys are dropped,
 * not written down, on eviction and reclaim), and no event names them. */
static void give_back(kvs_handle *h, uint32_t keep) {
    kvs_lsc *c = h->lsc;
    const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, c->tier);
    void *state = kvs_tiers_state(h->tiers, c->tier);
    while (c->n_blocks > keep) {
        kvs_key k = lsc_key(c, --c->n_blocks);
        ops->unpin(state, &k, 1);
        ops->remove(state, &k);
    }
}

void kvs_lsc_close(kvs_handle *h) {
    if (!h->lsc) return;
    give_back(h, 0);
    free(h->lsc->layer);
    free(h->lsc);
    h->lsc = NULL;
}

/* The handle's first peer_gpu tier that reads and writes in place, or UINT32_MAX. */
static uint32_t find_tier(kvs_handle *h) {
    for (uint32_t t = 0; h->tiers && t < kvs_tiers_count(h->tiers); t++) {
        const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, t);
        if ((ops->caps & KVS_BACKEND_CAP_LENT_MEMORY) && kvs_tiers_can_get_range(h->tiers, t) &&
            kvs_tiers_can_put_range(h->tiers, t))
            return t;
    }
    return UINT32_MAX;
}

kvs_status kvs_lsc_reserve(kvs_handle *h, const kvs_layer_view *buffer, uint32_t n_blocks,
                           uint32_t *granted, uint32_t *stream_tokens) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "lsc_reserve");
    if (st != KVS_OK) return st;
    if (stream_tokens) *stream_tokens = h->chunk_tokens;
    if (!granted || (n_blocks && !buffer))
        return kvs_set_error(h, KVS_EINVAL, "lsc_reserve: buffer or granted is NULL");
    *granted = h->lsc ? h->lsc->n_blocks : 0;
    if (!h->worker.views)
        return kvs_set_error(h, KVS_ESTATE, "lsc_reserve: call register_kv first");
    if (h->worker.views[0].device_kind != KVS_DEVICE_HOST)
        return kvs_set_error(h, KVS_ENOTSUP,
                             "lsc_reserve: the layer stream cache runs on the host device only");
    if (n_blocks == 0) {
        kvs_lsc_close(h);
        *granted = 0;
        return KVS_OK;
    }
    kvs_layer_view v = *buffer;
    char why[256];
    if (v.struct_size < KVS_LAYER_VIEW_SIZE_1_0 || v.device_kind != KVS_DEVICE_HOST ||
        kvs_kernel_check_view(&v, &h->shape, why, sizeof why) != KVS_OK) {
        if (v.struct_size < KVS_LAYER_VIEW_SIZE_1_0 || v.device_kind != KVS_DEVICE_HOST)
            snprintf(why, sizeof why, "a host view of struct_size %u at least is needed",
                     KVS_LAYER_VIEW_SIZE_1_0);
        return kvs_set_error(h, KVS_EINVAL, "lsc_reserve: the buffer's view: %s", why);
    }
    uint32_t pages = h->chunk_tokens / h->shape.block_tokens;
    if (v.n_blocks < pages)
        return kvs_set_error(h, KVS_EINVAL,
                             "lsc_reserve: the buffer has %u pages; one stream block takes %u",
                             v.n_blocks, pages);
    uint32_t tier = find_tier(h);
    if (tier == UINT32_MAX)
        return kvs_set_error(h, KVS_ENOTSUP, "lsc_reserve: no peer_gpu tier in the configuration");
    if (!h->lsc) {
        kvs_lsc *c = calloc(1, sizeof *c);
        uint8_t *layer = c ? calloc(1, h->layer_bytes * h->worker.n_views) : NULL;
        if (!layer) {
            free(c);
            return kvs_set_error(h, KVS_ENOMEM, "lsc_reserve: out of memory");
        }
        c->layer = layer;
        c->tier = tier;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        c->nonce = (uint64_t)(uintptr_t)h ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec;
        h->lsc = c;
    }
    kvs_lsc *c = h->lsc;
    c->buffer = v;
    give_back(h, n_blocks);
    /* new blocks start zeroed */
    uint64_t bytes = h->layer_bytes * h->worker.n_views;
    uint8_t *zeros = calloc(1, bytes);
    if (!zeros) return kvs_set_error(h, KVS_ENOMEM, "lsc_reserve: out of memory");
    const kvs_backend_ops *ops = kvs_tiers_ops(h->tiers, tier);
    void *state = kvs_tiers_state(h->tiers, tier);
    while (c->n_blocks < n_blocks) {
        kvs_key k = lsc_key(c, c->n_blocks);
        if (ops->put(state, &k, zeros, bytes) != KVS_OK) break; /* no room: fewer granted */
        if (!kvs_tiers_pin(h->tiers, tier, &k, LSC_PIN_MS)) {
            ops->remove(state, &k);
            break;
        }
        c->n_blocks++;
    }
    free(zeros);
    *granted = c->n_blocks;
    return KVS_OK;
}

/* Check a fetch's or store's arguments; the token span of stream block i's pages. */
static kvs_status check_call(kvs_handle *h, const char *hook, uint32_t layer,
                             const uint32_t *blocks, const uint32_t *pages, uint32_t n) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, hook);
    if (st != KVS_OK) return st;
    if (!h->lsc) return kvs_set_error(h, KVS_ESTATE, "%s: no stream block is reserved", hook);
    if (n && (!blocks || !pages))
        return kvs_set_error(h, KVS_EINVAL, "%s: blocks or pages is NULL", hook);
    if (layer >= h->worker.n_views)
        return kvs_set_error(h, KVS_EINVAL, "%s: layer %u of %u", hook, layer, h->worker.n_views);
    uint32_t per = h->chunk_tokens / h->shape.block_tokens;
    for (uint32_t i = 0; i < n; i++) {
        if (blocks[i] >= h->lsc->n_blocks)
            return kvs_set_error(h, KVS_EINVAL, "%s: stream block %u of %u reserved", hook,
                                 blocks[i], h->lsc->n_blocks);
        for (uint32_t p = 0; p < per; p++)
            if (pages[(uint64_t)i * per + p] >= h->lsc->buffer.n_blocks)
                return kvs_set_error(h, KVS_EINVAL, "%s: buffer page %u of %u", hook,
                                     pages[(uint64_t)i * per + p], h->lsc->buffer.n_blocks);
    }
    return KVS_OK;
}

static kvs_token_span span_of(const kvs_handle *h, const uint32_t *pages, uint32_t i) {
    uint32_t per = h->chunk_tokens / h->shape.block_tokens;
    return (kvs_token_span){.block_ids = pages + (uint64_t)i * per,
                            .n_block_ids = per,
                            .first_token = 0,
                            .n_tokens = h->chunk_tokens};
}

kvs_status kvs_lsc_fetch(kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                         const uint32_t *pages, uint32_t n) {
    kvs_status st = check_call(h, "lsc_fetch", layer, blocks, pages, n);
    if (st != KVS_OK) return st;
    kvs_lsc *c = h->lsc;
    for (uint32_t i = 0; i < n; i++) {
        kvs_key k = lsc_key(c, blocks[i]);
        uint64_t got = 0, len = 0;
        st = kvs_tiers_get_range(h->tiers, c->tier, &k, layer * h->layer_bytes, h->layer_bytes,
                                 c->layer, &got, &len);
        if (st != KVS_OK || got != h->layer_bytes)
            return kvs_set_error(h, KVS_EIO,
                                 "lsc_fetch: stream block %u is gone (its lent memory was taken "
                                 "back): recompute what it held",
                                 blocks[i]);
        kvs_token_span sp = span_of(h, pages, i);
        kvs_kernel_scatter_layer(&c->buffer, &h->shape, &sp, c->layer);
    }
    return KVS_OK;
}

kvs_status kvs_lsc_store(kvs_handle *h, uint32_t layer, const uint32_t *blocks,
                         const uint32_t *pages, uint32_t n) {
    kvs_status st = check_call(h, "lsc_store", layer, blocks, pages, n);
    if (st != KVS_OK) return st;
    kvs_lsc *c = h->lsc;
    for (uint32_t i = 0; i < n; i++) {
        kvs_token_span sp = span_of(h, pages, i);
        kvs_kernel_gather_layer(&c->buffer, &h->shape, &sp, c->layer);
        kvs_key k = lsc_key(c, blocks[i]);
        st = kvs_tiers_put_range(h->tiers, c->tier, &k, layer * h->layer_bytes, c->layer,
                                 h->layer_bytes);
        if (st != KVS_OK)
            return kvs_set_error(h, KVS_EIO,
                                 "lsc_store: stream block %u is gone (its lent memory was taken "
                                 "back): recompute what it held",
                                 blocks[i]);
    }
    return KVS_OK;
}
