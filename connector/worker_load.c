/* worker_load.c - the worker's loads: start_load pins and reads each chunk of the bound step from its
 * tier (zero-copy, whole or layer ranges), wait_layer_load lands layers through the device and verifies
 * every layer's checksum; failed chunks become error blocks the engine recomputes. */
#include "worker_load.h"
#include "integrity.h"

#include <assert.h>
#include <openssl/crypto.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/xxh3.h"
#include "handle.h"
#include "keys.h"
#include "last_error.h"
#include "object.h"
#include "object_mac.h"
#include "role.h"

/* An async load's work runs on the loader thread, which touches no handle state: its failure is
 * accounted when the main thread lands it. */
static void fail_load(kvs_handle *h, kvs_load_work *w, const char *why) {
    char hex[33];
    kvs_key_hex(&w->load->key, hex);
    kvs_log(h->cfg->log_level, KVS_LOG_WARN, "request '%s': load of chunk %s failed: %s",
            w->req->id, hex, why);
    w->failed = 1;
    if (!w->async) kvs_worker_account_failure(h, w);
}

/* A lossy object (docs/compress.md) made ready to load, in the load's own slab: a zero-copy tier's
 * object is copied there first, so nothing read after the check can change. Its header is checked
 * whatever loads.accept_lossy says: a damaged one (or a raw object whose codec field was flipped)
 * is dropped as a damaged raw one would be; an intact lossy object is refused without it and kept,
 * as it is by a load of some layers only (its layers lie elsewhere than a raw object's). Returns 0
 * after failing the load. Runs on the loader thread for async loads: no handle state but the pool
 * (locked). */
static int stage_lossy(kvs_handle *h, kvs_load_work *w, const void *obj, uint64_t *len,
                       kvs_codec *c) {
    char why[384];
    if (obj != w->slab) { /* too long for a slab, it is no lossy object of this model */
        if (*len > kvs_pool_slab_bytes(h->pool)) *len = kvs_pool_slab_bytes(h->pool);
        if (!(w->slab = kvs_pool_alloc(h->pool))) {
            fail_load(h, w, "no staging slab free to hold a lossy object");
            return 0;
        }
        memcpy(w->slab, obj, *len);
    }
    if (kvs_object_check_lossy(w->slab, *len, &h->fingerprint, &w->load->key, h->model.n_layers,
                               h->chunk_tokens, &h->shape, h->model.dtype, c, why,
                               sizeof why) != KVS_OK) {
        fail_load(h, w, why);
        w->drop = 1;
        return 0;
    }
    if (!h->cfg->loads.accept_lossy) {
        kvs_fmt(why, sizeof why, "a lossy object (codec %u), and loads.accept_lossy is false",
                c->kind);
        fail_load(h, w, why);
        return 0;
    }
    if (w->ranged) { /* only its header was read */
        fail_load(h, w, "a lossy object is loaded whole, and this load reads some layers only");
        return 0;
    }
    if (c->kind == KVS_CODEC_DROP) { /* only an engine that masks what it leaves out takes it */
        const char *no = w->async ? "its load runs between steps (load_async), which cannot report "
                                    "the tokens it leaves out"
                         : !(h->worker.bound->flags & KVS_META_MASKS_DROPPED)
                             ? "the engine does not mask dropped tokens (KVS_PLAN_CAP_MASK)"
                             : NULL;
        if (no) {
            kvs_fmt(why, sizeof why, "an object with tokens dropped, and %s", no);
            fail_load(h, w, why);
            return 0;
        }
    }
    return 1;
}

/* A DROP object's kept mask, checked (kvs_object_check_lossy_layers), kept for load_dropped. */
static int keep_mask(kvs_handle *h, kvs_load_work *w) {
    const uint8_t *mask = kvs_object_kept_mask(w->slab);
    if (!mask) return 1;
    uint64_t bytes = kvs_codec_mask_bytes(h->chunk_tokens);
    if (!(w->kept = malloc(bytes))) {
        fail_load(h, w, "out of memory");
        return 0;
    }
    memcpy(w->kept, mask, bytes);
    return 1;
}

/* A staged lossy chunk, checked layer by layer before any of it lands. A device that decodes codecs
 * (the host device) decodes it straight into the pages as the engine reaches each layer (one pass,
 * no full-precision object in between: w->fused). Another device gets the raw object it stands for,
 * decoded into a fresh slab, and the rest of the load is a raw load's. Returns the object to load
 * as raw, or NULL (fused, or the load failed). */
static const void *accept_lossy(kvs_handle *h, kvs_load_work *w, const void *obj, uint64_t len) {
    char why[384];
    kvs_codec c;
    if (!stage_lossy(h, w, obj, &len, &c)) return NULL;
    if (!h->device.dev_info.decodes_codecs) {
        void *raw = kvs_pool_alloc(h->pool);
        kvs_status st = raw ? kvs_object_decode(w->slab, len, &h->fingerprint, h->model.n_layers,
                                                h->chunk_tokens, &h->shape, h->model.dtype, raw,
                                                kvs_pool_slab_bytes(h->pool), why, sizeof why)
                            : KVS_ENOMEM;
        if (st != KVS_OK) {
            if (raw) kvs_pool_free(h->pool, raw);
            fail_load(h, w, raw ? why : "no staging slab free to decode a lossy object into");
            w->drop = st == KVS_ECORRUPT;
            return NULL;
        }
        if (!keep_mask(h, w)) { /* the decode checked every layer's mask */
            kvs_pool_free(h->pool, raw);
            return NULL;
        }
        kvs_pool_free(h->pool, w->slab); /* it held the lossy bytes */
        w->slab = raw;
        w->lossy = 1;
        return raw;
    }
    if (kvs_object_check_lossy_layers(w->slab, why, sizeof why) != KVS_OK) {
        fail_load(h, w, why);
        w->drop = 1;
        return NULL;
    }
    if (!keep_mask(h, w)) return NULL;
    if (!(w->layer_hash = calloc(2 * (uint64_t)h->model.n_layers, sizeof *w->layer_hash))) {
        fail_load(h, w, "out of memory");
        return NULL;
    }
    w->dcodec =
        (kvs_dev_codec){.codec = c,
                        .dtype = h->model.dtype,
                        .encoded_tokens = h->chunk_tokens,
                        .first_row = (uint32_t)(w->load->first_token - w->load->chunk_first)};
    w->fused = w->lossy = 1;
    w->object = w->slab;
    return NULL;
}

/* A keyed tier's whole chunk on a device that hashes as it copies (the host device): each layer's
 * tag is computed over the very bytes its copy moves into the pages (kvs_dev_copy.tag), so the
 * object may be read in place, and a layer whose tag fails is a failed load like a checksum
 * mismatch. Elsewhere a keyed tier's object is read into a slab and every tag checked before any
 * byte is copied (check_keyed_layers). */
static int keyed_inline(const kvs_handle *h, const kvs_load_work *w) {
    return kvs_integrity_keyed(h, w->tier) && h->device.dev_info.hashes_inline && !w->ranged &&
           w->load->n_tokens == h->chunk_tokens;
}

/* Bytes of a load's layer_hash allocation: expected and computed checksums, then with inline tags
 * the object's nonce and its layer tags, copied once its header tag held. */
static uint64_t layer_hash_bytes(const kvs_handle *h, int tags) {
    uint64_t n = h->model.n_layers;
    return 2 * n * sizeof(uint64_t) +
           (tags ? KVS_OBJECT_NONCE_BYTES + n * KVS_OBJECT_TAG_BYTES : 0);
}

static uint8_t *inline_nonce(const kvs_handle *h, const kvs_load_work *w) {
    return (uint8_t *)(w->layer_hash + 2 * (uint64_t)h->model.n_layers);
}

/* Check a chunk's header and keep its checksums: the payload is checked against these, never
 * against a header that could change under a zero-copy reference. A lossy chunk is decoded as it
 * lands on the host device, into a raw object first on a device that cannot (accept_lossy). */
static void accept_object(kvs_handle *h, kvs_load_work *w, const void *obj, uint64_t len) {
    char why[256] = "";
    /* a keyed tier's object: its header now (a copy of the header page when it is read in place:
     * from the check on, every header field is read from the copy, never from memory another
     * process may write), its layers' tags as they are copied (keyed_inline) or for the whole step
     * at once after the fetches, before any byte is copied */
    int tags = keyed_inline(h, w);
    uint32_t head = kvs_object_payload_offset(h->model.n_layers);
    uint8_t *copy = tags && len >= head ? malloc(head) : NULL;
    if (copy) memcpy(copy, obj, head);
    if (tags && !copy) {
        fail_load(h, w, len >= head ? "out of memory" : "shorter than its header");
        return;
    }
    const void *hdr = copy ? copy : obj;
    if (kvs_integrity_check(h, w->tier, hdr, len, 0, why, sizeof why) != KVS_OK) {
        w->drop = 1;
        goto refused;
    }
    w->keyed_layers = !w->ranged && kvs_integrity_keyed(h, w->tier) && !tags;
    uint16_t codec =
        len >= sizeof(kvs_object_header) ? ((const kvs_object_header *)hdr)->codec : KVS_CODEC_RAW;
    if (codec == KVS_CODEC_DERIVED) { /* raw layout, values computed over lossy KV */
        if (kvs_object_check_raw_layout(hdr, len, &h->fingerprint, &w->load->key, h->model.n_layers,
                                        h->chunk_tokens, h->layer_bytes, why,
                                        sizeof why) != KVS_OK) {
            w->drop = 1;
            goto refused;
        }
        if (!h->cfg->loads.accept_lossy) {
            kvs_fmt(why, sizeof why,
                    "KV computed over lossy chunks, and loads.accept_lossy is false");
            goto refused;
        }
        w->lossy = 1;
    } else if (codec != KVS_CODEC_RAW) { /* never a keyed one: its header check refused it */
        if (!(obj = accept_lossy(h, w, obj, len))) goto done; /* fused, or failed */
        hdr = obj;
        len = h->object_bytes;
    }
    if (kvs_object_check_raw_layout(hdr, len, &h->fingerprint, &w->load->key, h->model.n_layers,
                                    h->chunk_tokens, h->layer_bytes, why, sizeof why) != KVS_OK ||
        (((const kvs_object_header *)hdr)->codec == KVS_CODEC_DERIVED && !w->lossy)) {
        if (!why[0]) kvs_fmt(why, sizeof why, "its codec field changed while it was read");
        w->drop = 1;
        goto refused;
    }
    if (!(w->layer_hash = calloc(1, layer_hash_bytes(h, tags)))) {
        kvs_fmt(why, sizeof why, "out of memory");
        goto refused;
    }
    memcpy(w->layer_hash, kvs_object_layer_hashes((void *)(uintptr_t)hdr),
           h->model.n_layers * sizeof *w->layer_hash);
    if (tags) {
        uint8_t *at = inline_nonce(h, w);
        memcpy(at, kvs_object_mac_nonce(copy), KVS_OBJECT_NONCE_BYTES);
        memcpy(at + KVS_OBJECT_NONCE_BYTES, kvs_object_mac_layer_tag(copy, 0),
               (uint64_t)h->model.n_layers * KVS_OBJECT_TAG_BYTES);
    }
    w->keyed_inline = tags;
    w->object = obj;
    goto done;
refused:
    fail_load(h, w, why);
done:
    free(copy);
}

/* Resolve one chunk: pin it where it lives; a zero-copy tier hands out its bytes at once, any other
 * gets a staging slab to be filled by fetch_objects. */
static void open_load(kvs_handle *h, kvs_load_work *w) {
    const kvs_key *key = &w->load->key;
    w->tier = kvs_tiers_find(h->tiers, key);
    if (w->tier < 0) {
        kvs_tiers_forget_missing(h->tiers, key);
        return fail_load(h, w, "not in any tier (evicted after lookup)");
    }
    uint32_t tier = (uint32_t)w->tier;
    uint64_t len = 0;
    if (!kvs_tiers_pin(h->tiers, tier, key, h->cfg->lease_timeout_ms))
        return fail_load(h, w, "evicted before it could be pinned");
    w->pinned = 1;
    /* Some layers only (a layer or stage plan sets a mask): read just those where the tier can, into a
     * slab. */
    w->ranged = w->req->n_layer_bytes && kvs_tiers_can_get_range(h->tiers, tier);
    if (kvs_tiers_zero_copy(h->tiers, tier) && !w->ranged &&
        (!kvs_integrity_keyed(h, w->tier) || keyed_inline(h, w))) {
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
    if (got != h->layer_bytes)
        return fail_load(h, w, "the stored object is shorter than its layers");
    char why[256] = "";
    if (kvs_integrity_check_layer(h, w->tier, w->slab, layer, why, sizeof why) != KVS_OK) {
        fail_load(h, w, why);
        w->drop = 1;
    }
}

static void fetch_range(kvs_handle *h, kvs_load_work *w, int all_layers) {
    uint32_t tier = (uint32_t)w->tier;
    uint64_t head = kvs_object_payload_offset(h->model.n_layers);
    uint64_t got = 0, len = 0;
    if (kvs_tiers_get_range(h->tiers, tier, &w->load->key, 0, head, w->slab, &got, &len) != KVS_OK)
        return fail_load(h, w, kvs_tiers_last_error(h->tiers, tier));
    if (got != head) return fail_load(h, w, "the stored object is shorter than its header");
    accept_object(h, w, w->slab, len);
    for (uint32_t l = 0; all_layers && l < h->model.n_layers && load_live(w); l++)
        if (kvs_meta_wants_layer(w->req, l)) fetch_layer(h, w, l);
    w->layers_read = all_layers; /* landing copies them without reading again */
}

/* One tier's share of a step's copies: the arrays of its get_many, which a call started with
 * get_many_start owns until its finish. */
typedef struct tier_fetch {
    uint32_t tier;
    uint64_t n, ticket, t0;
    kvs_key *keys;
    void **dsts;
    uint64_t *caps, *lens;
    kvs_status *sts;
    kvs_load_work **ws;
} tier_fetch;

/* A load whose slab still waits for its object (a zero-copy tier's lossy object was decoded into a
 * slab already: that one is accepted, not fetched). */
static int fetch_wants(const kvs_load_work *w, uint32_t t) {
    return w->slab && !w->object && !w->failed && !w->ranged && w->tier == (int)t;
}

/* Time spent reading from tier t (since t0) counts for it. */
static void charge_tier(kvs_load_set *set, uint32_t t, uint64_t t0) {
    if (t < KVS_STATS_MAX_TIERS) set->tier_ns[t] += kvs_now_ns() - t0;
}

static void fetch_free(tier_fetch *f) {
    free(f->keys);
    free(f->dsts);
    free(f->caps);
    free(f->lens);
    free(f->sts);
    free(f->ws);
}

/* Tier t's n loads that need a copy, into f's arrays. 0 when out of memory (nothing held). */
static int fetch_collect(kvs_handle *h, kvs_load_set *set, uint32_t t, uint64_t n, tier_fetch *f) {
    uint64_t cap = kvs_pool_slab_bytes(h->pool);
    *f = (tier_fetch){.tier = t,
                      .n = n,
                      .keys = malloc(n * sizeof *f->keys),
                      .dsts = malloc(n * sizeof *f->dsts),
                      .caps = malloc(n * sizeof *f->caps),
                      .lens = calloc(n, sizeof *f->lens),
                      .sts = calloc(n, sizeof *f->sts),
                      .ws = malloc(n * sizeof *f->ws)};
    if (!f->keys || !f->dsts || !f->caps || !f->lens || !f->sts || !f->ws) {
        fetch_free(f);
        return 0;
    }
    uint64_t k = 0;
    for (uint64_t i = 0; i < set->n; i++) {
        kvs_load_work *w = &set->w[i];
        if (!fetch_wants(w, t)) continue;
        f->keys[k] = w->load->key;
        f->dsts[k] = w->slab;
        f->caps[k] = cap;
        f->ws[k++] = w;
    }
    return 1;
}

/* The objects of a finished get_many (call: the call's own status) are accepted or failed; the
 * time since f->t0 counts for its tier (for a two-halves call, the time in its finish: the time in
 * its start was counted then, and the other tiers' reads between the two are theirs). */
static void fetch_land(kvs_handle *h, kvs_load_set *set, tier_fetch *f, kvs_status call) {
    for (uint64_t k = 0; k < f->n; k++) {
        if (call == KVS_OK && f->sts[k] == KVS_OK)
            accept_object(h, f->ws[k], f->ws[k]->slab, f->lens[k]);
        else
            fail_load(h, f->ws[k], kvs_tiers_last_error(h->tiers, f->tier));
    }
    charge_tier(set, f->tier, f->t0);
    fetch_free(f);
}

/* Fill the staging slabs of every load that needs a copy: one get_many per tier that has it (so a
 * tier over several devices submits the step's reads together), else one get per chunk. Tiers whose
 * get_many comes in two halves are started first and finished last, so their reads run while the
 * other tiers are read (a step that spans an SSD and a remote tier waits for the slower, not the
 * sum). */
/* The layer tags of every whole object a keyed tier served this step, on the host device's threads
 * (device.host_threads); a load whose tags fail is an error, its object dropped. */
static void check_keyed_layers(kvs_handle *h, kvs_load_set *set) {
    uint64_t n = 0;
    for (uint64_t i = 0; i < set->n; i++) n += set->w[i].keyed_layers && load_live(&set->w[i]);
    if (!n) return;
    const void **objects = malloc(n * sizeof *objects);
    kvs_load_work **ws = malloc(n * sizeof *ws);
    uint8_t *bad = calloc(n, 1);
    if (!objects || !ws || !bad) {
        for (uint64_t i = 0; i < set->n; i++)
            if (set->w[i].keyed_layers && load_live(&set->w[i]))
                fail_load(h, &set->w[i], "out of memory checking its tags");
    } else {
        uint64_t k = 0;
        for (uint64_t i = 0; i < set->n; i++)
            if (set->w[i].keyed_layers && load_live(&set->w[i])) {
                ws[k] = &set->w[i];
                objects[k++] = set->w[i].object;
            }
        kvs_integrity_check_objects(h, objects, n, bad);
        for (uint64_t i = 0; i < n; i++)
            if (bad[i]) {
                fail_load(h, ws[i], "a layer tag mismatch (changed without the integrity key)");
                ws[i]->drop = 1;
            }
    }
    for (uint64_t i = 0; i < set->n; i++) set->w[i].keyed_layers = 0;
    free(objects);
    free(ws);
    free(bad);
}

static void fetch_objects(kvs_handle *h, kvs_load_set *set, int all_layers) {
    kvs_load_work *ws_all = set->w;
    uint64_t n_all = set->n;
    uint64_t cap = kvs_pool_slab_bytes(h->pool);
    for (uint64_t i = 0; i < n_all; i++)
        if (ws_all[i].slab && !ws_all[i].failed && ws_all[i].ranged)
            fetch_range(h, &ws_all[i], all_layers);
    uint32_t n_tiers = kvs_tiers_count(h->tiers);
    tier_fetch started[KVS_CONFIG_MAX_TIERS]; /* get_many_start calls in flight */
    uint32_t n_started = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t t = 0; t < n_tiers; t++) {
            int async =
                n_started < KVS_CONFIG_MAX_TIERS && kvs_tiers_can_get_many_async(h->tiers, t);
            if (async != (pass == 0)) continue; /* two-halves tiers first */
            uint64_t n = 0;
            for (uint64_t i = 0; i < n_all; i++) n += fetch_wants(&ws_all[i], t);
            if (n == 0) continue;
            uint64_t t0 = kvs_now_ns();
            tier_fetch f;
            if (kvs_tiers_can_get_many(h->tiers, t) && fetch_collect(h, set, t, n, &f)) {
                f.t0 = t0;
                if (!async) {
                    fetch_land(h, set, &f,
                               kvs_tiers_get_many(h->tiers, t, f.keys, (void *const *)f.dsts,
                                                  f.caps, n, f.lens, f.sts));
                    continue;
                }
                kvs_status st = kvs_tiers_get_many_start(h->tiers, t, f.keys, (void *const *)f.dsts,
                                                         f.caps, n, f.lens, f.sts, &f.ticket);
                if (st != KVS_OK) {
                    fetch_land(h, set, &f, st);
                    continue;
                }
                charge_tier(set, t, t0);
                started[n_started++] = f;
                continue;
            }
            for (uint64_t i = 0; i < n_all; i++) { /* one get per chunk (also without memory) */
                kvs_load_work *w = &ws_all[i];
                if (!fetch_wants(w, t)) continue;
                uint64_t len = 0;
                if (kvs_tiers_get(h->tiers, t, &w->load->key, w->slab, cap, &len) != KVS_OK)
                    fail_load(h, w, kvs_tiers_last_error(h->tiers, t));
                else
                    accept_object(h, w, w->slab, len);
            }
            charge_tier(set, t, t0);
        }
    }
    for (uint32_t i = 0; i < n_started; i++) {
        tier_fetch *f = &started[i];
        f->t0 = kvs_now_ns();
        fetch_land(h, set, f, kvs_tiers_get_many_finish(h->tiers, f->tier, f->ticket));
    }
    check_keyed_layers(h, set);
}

/* Where this model's layout puts layer `layer` of w's object (accept_object checked the header says
 * the same): a header that changes under a reference read in place moves no read or copy. */
static const uint8_t *layer_at(const kvs_handle *h, const kvs_load_work *w, uint32_t layer) {
    return w->object + kvs_object_payload_offset(h->model.n_layers) +
           (uint64_t)layer * h->layer_bytes;
}

/* The copy of one layer of one load: the rows of the loaded range within the chunk's payload. */
static void load_copy(const kvs_handle *h, kvs_load_work *w, uint32_t layer, kvs_dev_copy *c) {
    const kvs_meta_load *l = w->load;
    uint64_t base = kvs_meta_token_base(w->req, h->model.block_tokens); /* the copy's spans */
    if (w->fused) { /* the encoded layer; the device decodes its rows from dcodec.first_row on */
        const kvs_object_header *hd = (const kvs_object_header *)w->object;
        *c = (kvs_dev_copy){.block_ids = w->req->block_ids,
                            .n_block_ids = w->req->n_block_ids,
                            .first_token = l->first_token - base,
                            .n_tokens = l->n_tokens,
                            .k_payload = (uint8_t *)(uintptr_t)w->object + hd->payload_offset +
                                         (uint64_t)layer * hd->layer_bytes,
                            .codec = &w->dcodec};
        return;
    }
    uint8_t *payload = (uint8_t *)(uintptr_t)layer_at(h, w, layer);
    uint64_t row = (uint64_t)h->shape.n_heads * h->shape.head_bytes;
    uint64_t off = (l->first_token - l->chunk_first) * row;
    *c = (kvs_dev_copy){.block_ids = w->req->block_ids,
                        .n_block_ids = w->req->n_block_ids,
                        .first_token = l->first_token - base,
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

static void device_failed_loads(kvs_handle *h, kvs_load_set *set, const char *what,
                                const char *why) {
    for (uint64_t i = 0; i < set->n; i++)
        if (load_live(&set->w[i])) fail_load(h, &set->w[i], why);
    kvs_log(h->cfg->log_level, KVS_LOG_ERROR, "device %s: %s: %s", h->device.dev_info.name, what,
            why);
}

/* Bytes one layer of w puts in the pages; they count for the tier that served it. */
static void count_layer_bytes(kvs_handle *h, const kvs_load_work *w, uint64_t layers) {
    uint64_t bytes = (uint64_t)w->load->n_tokens * h->layer_bytes * layers / h->chunk_tokens;
    h->stats.bytes_loaded += bytes;
    if (w->tier >= 0 && w->tier < KVS_STATS_MAX_TIERS) h->stats.tier_bytes_loaded[w->tier] += bytes;
}

/* w's copy of layer into the pages as copy n of the call (its whole-chunk hash or layer tag
 * computed in the same pass): 0 when w has none to make, failed or skipped for this layer. */
static int queue_layer_copy(kvs_handle *h, kvs_load_work *w, uint32_t layer, uint64_t n) {
    uint64_t nl = h->model.n_layers;
    if (!load_live(w) || !kvs_meta_wants_layer(w->req, layer))
        return 0; /* the engine computes it */
    if (w->ranged && !w->layers_read) {
        fetch_layer(h, w, layer);
        if (!load_live(w)) return 0;
    }
    int whole = w->load->n_tokens == h->chunk_tokens && !w->fused; /* fused: checked whole */
    if (!whole && !w->fused) {
        const void *payload = layer_at(h, w, layer);
        if (kvs_xxh3_64(payload, h->layer_bytes) != w->layer_hash[layer]) {
            layer_mismatch(h, w, layer);
            return 0;
        }
    }
    load_copy(h, w, layer, &h->device.copies[n]);
    h->device.copies[n].hash = whole && !w->keyed_inline ? &w->layer_hash[nl + layer] : NULL;
    if (w->keyed_inline) {
        if (!h->tag_states &&
            !(h->tag_states = calloc(h->cfg->max_chunks_per_step, sizeof *h->tag_states))) {
            fail_load(h, w, "out of memory for its layer tags");
            return 0;
        }
        if (!kvs_object_mac_layer_begin(h->mac, inline_nonce(h, w), layer, &h->tag_states[n])) {
            kvs_nhpoly_abort(&h->tag_states[n]);
            fail_load(h, w, "its layer tag could not be begun (libcrypto)"); /* not its fault */
            return 0;
        }
        h->device.copies[n].tag = &h->tag_states[n];
    }
    return 1;
}

/* Copy i of layer landed for w: its tag or whole-chunk hash is checked, and its bytes counted
 * when they match. */
static void layer_copy_landed(kvs_handle *h, kvs_load_work *w, uint64_t i, uint32_t layer) {
    uint64_t nl = h->model.n_layers;
    if (h->device.copies[i].tag) {
        uint8_t tag[KVS_OBJECT_TAG_BYTES];
        const uint8_t *want =
            inline_nonce(h, w) + KVS_OBJECT_NONCE_BYTES + (uint64_t)layer * KVS_OBJECT_TAG_BYTES;
        if (!kvs_nhpoly_final(h->device.copies[i].tag, tag) ||
            CRYPTO_memcmp(tag, want, sizeof tag) != 0) {
            __atomic_add_fetch(&h->stats.integrity_rejects, 1, __ATOMIC_RELAXED);
            char what[96];
            kvs_fmt(what, sizeof what, "layer %u tag mismatch (changed without the integrity key)",
                    layer);
            fail_load(h, w, what);
            w->drop = 1;
            return;
        }
    }
    if (h->device.copies[i].hash && w->layer_hash[nl + layer] != w->layer_hash[layer])
        layer_mismatch(h, w, layer);
    else
        count_layer_bytes(h, w, 1);
}

/* Host device: one layer at a time, when the engine reaches it. A whole chunk is checksummed in
 * the same pass as its copy; a partial one is checked before its rows are copied. The copy's time
 * counts for the tiers its chunks came from, split by their share of the bytes. */
static void load_layer_sync(kvs_handle *h, kvs_load_set *set, uint32_t layer) {
    uint64_t n = 0;
    kvs_load_work **in_copy = (kvs_load_work **)h->device.copy_owner;
    for (uint64_t i = 0; i < set->n && n < h->cfg->max_chunks_per_step; i++)
        if (queue_layer_copy(h, &set->w[i], layer, n)) in_copy[n++] = &set->w[i];
    char why[512] = "";
    uint64_t t0 = kvs_now_ns();
    if (h->device.dev->load_layer(h->device.dev_state, layer, h->device.copies, n, why,
                                  sizeof why) != KVS_OK) {
        for (uint64_t i = 0; i < n; i++) {
            if (h->device.copies[i].tag) kvs_nhpoly_abort(h->device.copies[i].tag);
            fail_load(h, in_copy[i], why);
        }
        return;
    }
    uint64_t spent = kvs_now_ns() - t0, tokens = 0;
    for (uint64_t i = 0; i < n; i++) tokens += in_copy[i]->load->n_tokens;
    for (uint64_t i = 0; i < n; i++) {
        kvs_load_work *w = in_copy[i];
        if (w->tier >= 0 && w->tier < KVS_STATS_MAX_TIERS)
            h->stats.tier_load_ns[w->tier] += spent * w->load->n_tokens / tokens;
        layer_copy_landed(h, w, i, layer);
    }
}

/* Time the connector spent moving the set's live loads to the pages, shared among their tiers by
 * tokens (the per-tier load time of the stats). */
static void charge_tiers(kvs_handle *h, kvs_load_set *set, uint64_t ns) {
    uint64_t tokens = 0;
    for (uint64_t i = 0; i < set->n; i++)
        if (load_live(&set->w[i])) tokens += set->w[i].load->n_tokens;
    for (uint64_t i = 0; i < set->n && tokens; i++) {
        kvs_load_work *w = &set->w[i];
        if (load_live(w) && w->tier >= 0 && w->tier < KVS_STATS_MAX_TIERS)
            h->stats.tier_load_ns[w->tier] += ns * w->load->n_tokens / tokens;
    }
}

/* CUDA device: every layer is enqueued at once (events per layer let the engine wait on each), and
 * the hash pool checksums every layer payload on the host while the copies run. */
static void load_all_async(kvs_handle *h, kvs_load_set *set) {
    uint64_t nl = h->model.n_layers, n_jobs = 0, t0 = kvs_now_ns();
    for (uint32_t layer = 0; layer < h->worker.n_views; layer++) {
        uint64_t n = 0;
        for (uint64_t i = 0; i < set->n && n < h->cfg->max_chunks_per_step; i++)
            if (load_live(&set->w[i]) && kvs_meta_wants_layer(set->w[i].req, layer))
                load_copy(h, &set->w[i], layer, &h->device.copies[n++]);
        char why[512] = "";
        if (n && h->device.dev->load_layer(h->device.dev_state, layer, h->device.copies, n, why,
                                           sizeof why) != KVS_OK) {
            char what[64];
            kvs_fmt(what, sizeof what, "load of layer %u", layer);
            device_failed_loads(h, set, what, why);
            break;
        }
    }
    charge_tiers(h, set, kvs_now_ns() - t0);
    for (uint64_t i = 0; i < set->n; i++) {
        kvs_load_work *w = &set->w[i];
        if (!load_live(w)) continue;
        for (uint32_t layer = 0; layer < nl && !w->fused; layer++) /* fused: checked whole */
            if (kvs_meta_wants_layer(w->req, layer))
                h->device.hash_jobs[n_jobs++] = (kvs_hash_job){
                    layer_at(h, w, layer), h->layer_bytes, &w->layer_hash[nl + layer]};
    }
    if (n_jobs) kvs_hashpool_submit(h->device.hashpool, h->device.hash_jobs, n_jobs);
}

/* Unpin, drop corrupt objects, free the slabs; live loads count as loaded. */
static void finish_loads(kvs_handle *h, kvs_load_set *set) {
    for (uint64_t i = 0; i < set->n; i++) {
        kvs_load_work *w = &set->w[i];
        if (load_live(w)) {
            h->stats.chunks_loaded++;
            h->stats.lossy_chunks_loaded += (uint64_t)w->lossy;
            h->stats.tokens_loaded += w->load->n_tokens;
            if (w->tier >= 0 && w->tier < KVS_STATS_MAX_TIERS) {
                h->stats.tier_chunks_loaded[w->tier]++;
                h->tier_tokens_loaded[w->tier] += w->load->n_tokens;
            }
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
    for (uint32_t t = 0; t < KVS_STATS_MAX_TIERS; t++) {
        h->stats.tier_load_ns[t] += set->tier_ns[t];
        set->tier_ns[t] = 0;
    }
}

/* CUDA device: wait for the copies and the checksums, turn mismatches into error blocks, unpin. */
static void complete_set(kvs_handle *h, kvs_load_set *set) {
    char why[512] = "";
    uint64_t t0 = kvs_now_ns();
    kvs_status st = h->device.dev->sync(h->device.dev_state, why, sizeof why);
    kvs_hashpool_wait(h->device.hashpool);
    if (st != KVS_OK) device_failed_loads(h, set, "loads", why);
    charge_tiers(h, set, kvs_now_ns() - t0);
    uint64_t nl = h->model.n_layers;
    for (uint64_t i = 0; i < set->n; i++) {
        kvs_load_work *w = &set->w[i];
        uint32_t wanted = 0;
        for (uint32_t layer = 0; layer < nl && load_live(w); layer++)
            if (kvs_meta_wants_layer(w->req, layer)) {
                wanted++;
                if (!w->fused && w->layer_hash[nl + layer] != w->layer_hash[layer])
                    layer_mismatch(h, w, layer);
            }
        if (load_live(w)) count_layer_bytes(h, w, wanted);
    }
    finish_loads(h, set);
}

static kvs_load_set step_set(kvs_handle *h) {
    return (kvs_load_set){.w = h->worker.loads, .n = h->worker.n_loads};
}

void kvs_worker_complete_async_loads(kvs_handle *h) {
    if (!h->device.loads_pending) return;
    uint64_t t0 = kvs_now_ns();
    h->device.loads_pending = 0;
    kvs_load_set set = step_set(h);
    complete_set(h, &set);
    h->stats.load_ns += kvs_now_ns() - t0;
}

/* Host device: land layers [from, to] not landed yet (in any order the engine asks for them; the
 * loads finish, unpinning, once every layer has landed). Only time spent in the connector counts as
 * load time: the engine computes between layers. */
void kvs_worker_load_layers(kvs_handle *h, uint32_t from, uint32_t to) {
    if (!h->device.dev_info.synchronous) return; /* enqueued by start_load */
    uint64_t t0 = kvs_now_ns();
    kvs_load_set set = step_set(h);
    for (uint32_t l = from; l <= to && l < h->worker.n_views; l++) {
        if (h->worker.layer_loaded[l]) continue;
        load_layer_sync(h, &set, l);
        h->worker.layer_loaded[l] = 1;
        if (++h->worker.layers_loaded == h->worker.n_views) finish_loads(h, &set);
    }
    h->stats.load_ns += kvs_now_ns() - t0;
}

void kvs_worker_land_step_loads(kvs_handle *h) {
    if (h->worker.wstate == WORKER_BOUND) { /* start_load never ran: nothing reached the pages */
        for (uint64_t i = 0; i < h->worker.n_loads; i++)
            fail_load(h, &h->worker.loads[i], "the step ended before start_load");
        return;
    }
    if (h->worker.wstate != WORKER_LOADING) return;
    kvs_worker_load_layers(h, 0, h->worker.n_views - 1);
    kvs_worker_complete_async_loads(h);
}

void kvs_loads_open(kvs_handle *h, kvs_load_set *set) {
    for (uint64_t i = 0; i < set->n; i++) {
        if (i < h->cfg->max_chunks_per_step)
            open_load(h, &set->w[i]);
        else
            fail_load(h, &set->w[i],
                      "the request loads more chunks than device.max_chunks_per_step");
    }
    fetch_objects(h, set, 1);
}

void kvs_loads_land(kvs_handle *h, kvs_load_set *set) {
    uint64_t t0 = kvs_now_ns();
    for (uint64_t i = 0; i < set->n; i++) {
        kvs_load_work *w = &set->w[i];
        if (w->async && w->failed) kvs_worker_account_failure(h, w);
        w->async = 0; /* from here on, on this thread: failures are accounted at once */
    }
    if (h->device.dev_info.synchronous) {
        for (uint32_t l = 0; l < h->worker.n_views; l++) load_layer_sync(h, set, l);
        finish_loads(h, set);
    } else {
        load_all_async(h, set);
        complete_set(h, set);
    }
    h->stats.load_ns += kvs_now_ns() - t0;
}

void kvs_loads_release(kvs_handle *h, kvs_load_set *set) {
    for (uint64_t i = 0; i < set->n; i++) {
        kvs_load_work *w = &set->w[i];
        if (w->pinned) kvs_tiers_unpin(h->tiers, (uint32_t)w->tier, &w->load->key);
        if (w->slab) kvs_pool_free(h->pool, w->slab);
        free(w->layer_hash);
        free(w->kept);
        w->pinned = 0;
        w->slab = NULL;
        w->layer_hash = NULL;
        w->kept = NULL;
    }
}

kvs_status kvs_worker_start_load(kvs_handle *h) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "start_load");
    if (st != KVS_OK) return st;
    if (h->worker.wstate != WORKER_BOUND)
        return kvs_set_error(h, KVS_ESTATE, "start_load: %s",
                             h->worker.wstate == WORKER_IDLE
                                 ? "no metadata bound (call bind_meta first)"
                                 : "already started for this step");
    uint64_t t0 = kvs_now_ns();
    uint64_t max = h->cfg->max_chunks_per_step;
    for (uint64_t i = 0; i < h->worker.n_loads; i++) {
        if (i < max)
            open_load(h, &h->worker.loads[i]);
        else
            fail_load(h, &h->worker.loads[i],
                      "the step loads more chunks than device.max_chunks_per_step");
    }
    kvs_load_set set = step_set(h);
    fetch_objects(h, &set, !h->device.dev_info.synchronous);
    for (uint32_t t = 0; t < KVS_STATS_MAX_TIERS; t++) h->stats.tier_load_ns[t] += set.tier_ns[t];
    h->worker.wstate = WORKER_LOADING;
    h->worker.layers_loaded = 0;
    memset(h->worker.layer_loaded, 0, h->worker.n_views);
    if (!h->device.dev_info.synchronous) {
        load_all_async(h, &set);
        h->device.loads_pending = 1;
    }
    h->stats.load_ns += kvs_now_ns() - t0;
    return KVS_OK;
}

kvs_status kvs_worker_wait_layer(kvs_handle *h, uint32_t layer) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "wait_layer_load");
    if (st != KVS_OK) return st;
    if (h->worker.wstate != WORKER_LOADING)
        return kvs_set_error(h, KVS_ESTATE,
                             "wait_layer_load: start_load has not been called for this step");
    if (layer >= h->worker.n_views)
        return kvs_set_error(h, KVS_EINVAL, "wait_layer_load: layer %u of a %u-layer model", layer,
                             h->worker.n_views);
    if (h->device.dev_info.synchronous) {
        kvs_worker_load_layers(h, layer, layer);
        return KVS_OK;
    }
    char why[512] = "";
    if ((st = h->device.dev->wait_layer(h->device.dev_state, layer, why, sizeof why)) != KVS_OK)
        return kvs_set_error(h, st, "wait_layer_load: layer %u: %s", layer, why);
    return KVS_OK;
}

kvs_status kvs_worker_error_blocks(kvs_handle *h, uint32_t *out, uint64_t cap, uint64_t *n) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "load_error_blocks");
    if (st != KVS_OK) return st;
    if (!n || (cap && !out))
        return kvs_set_error(h, KVS_EINVAL, "load_error_blocks: out or n is NULL");
    /* A step with no forward pass: its loads land now, so the list is complete. */
    if (h->worker.wstate == WORKER_LOADING) kvs_worker_land_step_loads(h);
    *n = h->worker.n_error_blocks;
    if (cap < h->worker.n_error_blocks)
        return kvs_set_error(h, KVS_EOVERFLOW,
                             "load_error_blocks: %llu blocks failed, buffer holds %llu",
                             (unsigned long long)h->worker.n_error_blocks, (unsigned long long)cap);
    if (h->worker.n_error_blocks)
        memcpy(out, h->worker.error_blocks, h->worker.n_error_blocks * sizeof *out);
    h->worker.error_blocks_taken = h->worker.n_error_blocks;
    return KVS_OK;
}

kvs_status kvs_worker_load_dropped(kvs_handle *h, const char *req_id, uint64_t first_token,
                                   uint64_t n_tokens, uint8_t *mask, uint64_t *n_dropped) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "load_dropped");
    if (st != KVS_OK) return st;
    if (!req_id || !n_dropped || (n_tokens && !mask))
        return kvs_set_error(h, KVS_EINVAL, "load_dropped: req_id, mask or n_dropped is NULL");
    if (h->worker.wstate != WORKER_LOADING)
        return kvs_set_error(h, KVS_ESTATE,
                             "load_dropped: call it between start_load and wait_save");
    uint64_t n = 0,
             end = first_token + n_tokens < first_token ? UINT64_MAX : first_token + n_tokens;
    for (uint64_t i = 0; i < h->worker.n_loads; i++) {
        const kvs_load_work *w = &h->worker.loads[i];
        if (!w->kept || w->failed || strcmp(w->req->id, req_id) != 0) continue;
        uint64_t lo = w->load->first_token, hi = lo + w->load->n_tokens;
        if (lo < first_token) lo = first_token;
        if (hi > end) hi = end;
        for (uint64_t p = lo; p < hi; p++) {
            uint64_t row = p - w->load->chunk_first;
            if (kvs_codec_kept(w->kept, row)) continue;
            mask[p - first_token] = 1;
            n++;
        }
    }
    *n_dropped = n;
    return KVS_OK;
}
