#include "integrity.h"

#include <string.h>

#include "common/key_file.h"
#include "common/log.h"
#include "common/workers.h"
#include "handle.h"
#include "object_mac.h"

static kvs_status open_tier_key(const kvs_tier_config *t, kvs_object_mac **out, char *err,
                                size_t err_len) {
    uint8_t bytes[KVS_INTEGRITY_KEY_MAX];
    size_t len = 0;
    char what[KVS_NAME_MAX + 32];
    kvs_fmt(what, sizeof what, "tier \"%s\" integrity", t->name);
    kvs_status st = kvs_key_file_load(what, t->integrity_key_file, bytes, sizeof bytes,
                                      KVS_INTEGRITY_KEY_MIN, &len, err, err_len);
    if (st == KVS_OK) st = kvs_object_mac_open(bytes, len, out, err, err_len);
    explicit_bzero(bytes, sizeof bytes);
    return st == KVS_OK || st == KVS_ENOMEM || st == KVS_EIO ? st : KVS_ECONFIG;
}

kvs_status kvs_integrity_setup(kvs_handle *h, char *err, size_t err_len) {
    if (!(h->role & KVS_ROLE_WORKER)) return KVS_OK;
    const kvs_tier_config *first = NULL;
    for (size_t i = 0; i < h->cfg->n_tiers; i++) {
        const kvs_tier_config *t = &h->cfg->tiers[i];
        if (!t->keyed) continue;
        if (!kvs_object_mac_fits(h->model.n_layers))
            return kvs_fmt(err, err_len,
                           "open: tier \"%s\" is keyed, and an object of this model's %u layers "
                           "has no room for its tags (at most 166 layers)",
                           t->name, h->model.n_layers),
                   KVS_ECONFIG;
        if (kvs_tiers_ops(h->tiers, (uint32_t)i)->caps & KVS_BACKEND_CAP_LENT_MEMORY)
            return kvs_fmt(err, err_len,
                           "open: tier \"%s\" is keyed, and it holds lent memory the layer stream "
                           "reads in parts no tag covers",
                           t->name),
                   KVS_ECONFIG;
        kvs_object_mac *m = NULL;
        kvs_status st = open_tier_key(t, &m, err, err_len);
        if (st != KVS_OK) return st;
        if (!h->mac) {
            h->mac = m;
            first = t;
            continue;
        }
        int same = kvs_object_mac_same(h->mac, m);
        kvs_object_mac_close(m);
        if (!same)
            return kvs_fmt(err, err_len,
                           "open: keyed tiers \"%s\" and \"%s\" have different integrity keys; an "
                           "object is sealed once for every tier it moves through, so they must "
                           "share one (integrity_key_file)",
                           first->name, t->name),
                   KVS_ECONFIG;
    }
    /* the layer tags of a step's loads are checked on as many threads as its copies run on */
    if (h->mac && h->cfg->host_threads > 1 &&
        kvs_workers_create(h->cfg->host_threads - 1, &h->mac_workers) != KVS_OK)
        return kvs_fmt(err, err_len, "open: cannot start the integrity checks' threads"), KVS_EIO;
    return KVS_OK;
}

void kvs_integrity_close(kvs_handle *h) {
    kvs_workers_destroy(h->mac_workers);
    h->mac_workers = NULL;
    kvs_object_mac_close(h->mac);
    h->mac = NULL;
}

/* fn(ctx, 0..n) on h->mac_workers beside the caller, or on the caller alone without them. */
static void run_items(kvs_handle *h, kvs_workers_fn fn, void *ctx, uint64_t n) {
    if (!h->mac_workers) {
        for (uint64_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    kvs_workers_submit(h->mac_workers, fn, ctx, n);
    kvs_workers_help(h->mac_workers);
    kvs_workers_wait(h->mac_workers);
}

typedef struct seal_batch {
    const kvs_handle *h;
    void *const *objects;
} seal_batch;

static void seal_one(void *ctx, uint64_t item) {
    seal_batch *b = ctx;
    kvs_integrity_seal(b->h, b->objects[item]);
}

void kvs_integrity_seal_objects(kvs_handle *h, void *const *objects, uint64_t n) {
    seal_batch b = {h, objects};
    run_items(h, seal_one, &b, n);
}

typedef struct layer_batch {
    const kvs_handle *h;
    const void *const *objects;
    uint32_t n_layers;
    uint8_t *bad;
} layer_batch;

static void check_one_layer(void *ctx, uint64_t item) {
    layer_batch *b = ctx;
    uint64_t o = item / b->n_layers;
    char why[128];
    if (kvs_object_check_keyed_layer(b->h->mac, b->objects[o], (uint32_t)(item % b->n_layers), why,
                                     sizeof why) != KVS_OK)
        __atomic_store_n(&b->bad[o], 1, __ATOMIC_RELAXED);
}

void kvs_integrity_check_objects(kvs_handle *h, const void *const *objects, uint64_t n,
                                 uint8_t *bad) {
    layer_batch b = {h, objects, h->model.n_layers, bad};
    run_items(h, check_one_layer, &b, n * b.n_layers);
    for (uint64_t i = 0; i < n; i++)
        if (bad[i]) __atomic_add_fetch(&h->stats.integrity_rejects, 1, __ATOMIC_RELAXED);
}

int kvs_integrity_keyed(const kvs_handle *h, int tier) {
    return h->mac && tier >= 0 && (size_t)tier < h->cfg->n_tiers && h->cfg->tiers[tier].keyed;
}

void kvs_integrity_seal(const kvs_handle *h, void *object) {
    if (!h->mac || kvs_object_seal_keyed(h->mac, object) != KVS_OK) kvs_object_seal(object);
}

void kvs_integrity_seal_tagged(const kvs_handle *h, void *object) {
    if (!h->mac || kvs_object_seal_keyed_tagged(h->mac, object) != KVS_OK)
        kvs_integrity_seal(h, object);
}

static kvs_status rejected(kvs_handle *h, kvs_status st) {
    if (st != KVS_OK) __atomic_add_fetch(&h->stats.integrity_rejects, 1, __ATOMIC_RELAXED);
    return st;
}

kvs_status kvs_integrity_check(kvs_handle *h, int tier, const void *object, uint64_t len,
                               int all_layers, char *err, size_t err_len) {
    if (!kvs_integrity_keyed(h, tier)) return KVS_OK;
    /* the sizes first, against this model's: nothing the unchecked header says sizes a read, which
     * stays within the header page (all_layers: the object) the caller holds */
    const kvs_object_header *hd = object;
    uint32_t head = kvs_object_payload_offset(h->model.n_layers);
    if (len < (all_layers ? h->object_bytes : head) || hd->n_layers != h->model.n_layers ||
        hd->payload_offset != head || hd->layer_bytes != h->layer_bytes) {
        kvs_fmt(err, err_len, "a keyed object not of this model's geometry (%llu bytes)",
                (unsigned long long)len);
        return rejected(h, KVS_ECORRUPT);
    }
    kvs_status st = kvs_object_check_keyed_header(h->mac, object, head, err, err_len);
    uint32_t n = all_layers ? hd->n_layers : 0;
    for (uint32_t l = 0; st == KVS_OK && l < n; l++)
        st = kvs_object_check_keyed_layer(h->mac, object, l, err, err_len);
    return rejected(h, st);
}

kvs_status kvs_integrity_check_layer(kvs_handle *h, int tier, const void *object, uint32_t layer,
                                     char *err, size_t err_len) {
    if (!kvs_integrity_keyed(h, tier)) return KVS_OK;
    return rejected(h, kvs_object_check_keyed_layer(h->mac, object, layer, err, err_len));
}
