/* encoder.c - the encodings, encoding and placement the connector lends a compress tier
 * (encoder.h). */
#include "encoder.h"

#include <stdlib.h>
#include <string.h>

#include "connector/object.h"
#include "kernels/cpu/dtype.h"
#include "schedulers/adaptcache/adaptcache.h"

#define MAX_CODECS 5

struct kvs_encoder {
    kvs_encoder_model model;
    kvs_codec codecs[MAX_CODECS]; /* id k + 1 is codecs[k]; id 0 is raw */
    uint32_t n_codecs;
    kvs_ac_curve curve;      /* quantisers */
    kvs_ac_curve drop_curve; /* token dropping */
    kvs_ac_params params;
    uint64_t reevaluate_ms;
};

/* Top-1 agreement of the trained mini model's next-byte predictions against the mean relative
 * reconstruction error of K and V, one point per codec (docs/benchmarks.md,
 * kvs-bench-codec-quality --prompts 32): INT8; KIVI-4 with K groups of 32 and of 128; KIVI-2
 * with groups of 16, 32 and K groups of 128. Measured once on that model; a deployment's model would
 * measure its own. */
static const kvs_ac_curve QUALITY_CURVE = {
    .n = 7,
    .error = {0, 0.00575, 0.0625, 0.0695, 0.2625, 0.315, 0.35},
    .quality = {1, 0.988, 0.920, 0.888, 0.709, 0.648, 0.595}};

/* The same for token dropping (kvs-bench-codec-quality --prompts 32 --chunk 256, docs/benchmarks.md):
 * keeping 3/4, 1/2 and 1/4 of each chunk. Dropping moves quality much less per unit of error than
 * quantising (the error of a dropped row is the whole row, yet attention over the rest adapts), so
 * it has a curve of its own. */
static const kvs_ac_curve DROP_QUALITY_CURVE = {
    .n = 4, .error = {0, 0.4837, 0.6893, 0.8544}, .quality = {1, 0.702, 0.526, 0.405}};

kvs_status kvs_encoder_create(const kvs_encoder_model *model, const kvs_config *cfg,
                              kvs_encoder **out) {
    *out = NULL;
    kvs_encoder *e = calloc(1, sizeof *e);
    if (!e) return KVS_ENOMEM;
    e->model = *model;
    uint32_t elem = kvs_dtype_bytes(model->dtype);
    uint32_t dim = elem ? model->shape.head_bytes / elem : 0;
    uint16_t k_group = (uint16_t)(model->chunk_tokens < 32 ? model->chunk_tokens : 32);
    uint16_t v_group = (uint16_t)(dim < 32 ? dim : 32);
    uint16_t half = (uint16_t)(model->chunk_tokens / 2),
             quarter = (uint16_t)(model->chunk_tokens / 4);
    const kvs_codec offered[MAX_CODECS] = {
        {.kind = KVS_CODEC_INT8, .bits = 8},
        {.kind = KVS_CODEC_KIVI, .bits = 4, .k_group = k_group, .v_group = v_group},
        {.kind = KVS_CODEC_KIVI, .bits = 2, .k_group = k_group, .v_group = v_group},
        {.kind = KVS_CODEC_DROP, .k_group = half ? half : 1},
        {.kind = KVS_CODEC_DROP, .k_group = quarter ? quarter : 1}};
    for (uint32_t k = 0; k < MAX_CODECS; k++) {
        char why[160];
        if ((cfg->placement.codecs >> k & 1) &&
            kvs_codec_check(&offered[k], &model->shape, model->dtype, why, sizeof why) == KVS_OK)
            e->codecs[e->n_codecs++] = offered[k];
    }
    e->curve = QUALITY_CURVE;
    e->drop_curve = DROP_QUALITY_CURVE;
    e->reevaluate_ms = cfg->placement.reevaluate_ms;
    kvs_ac_params *p = &e->params;
    p->alpha = cfg->placement.alpha;
    p->freq_prior = cfg->placement.freq_prior;
    p->min_quality = cfg->placement.min_quality;
    p->n_codecs = 1 + e->n_codecs;
    for (uint32_t k = 1; k < p->n_codecs; k++)
        p->codecs[k] = (kvs_ac_codec_cost){
            .fixed_s = 20e-6, .s_per_raw_byte = 1.0 / (double)cfg->placement.decode_bytes_per_s};
    *out = e;
    return KVS_OK;
}

void kvs_encoder_destroy(kvs_encoder *e) {
    free(e);
}

uint64_t kvs_encoder_reevaluate_ms(const kvs_encoder *e) {
    return e->reevaluate_ms;
}

kvs_status kvs_encoder_encodings(const kvs_encoder *e, const void *object, uint64_t len,
                                 kvs_backend_encoding *out, uint32_t cap, uint32_t *n) {
    const kvs_encoder_model *m = &e->model;
    char why[256];
    *n = 0;
    if (cap == 0 || !object || len < sizeof(kvs_object_header)) return KVS_EINVAL;
    const kvs_object_header *h = object;
    /* lossy objects stay as they are; a derived one (raw layout over lossy KV) is raw to encode */
    if (h->codec != KVS_CODEC_RAW && h->codec != KVS_CODEC_DERIVED) return KVS_ENOTSUP;
    if (kvs_object_check_raw_layout(object, len, &m->fingerprint, &h->key, m->n_layers,
                                    m->chunk_tokens, m->layer_bytes, why, sizeof why) != KVS_OK)
        return KVS_ECORRUPT;
    out[(*n)++] = (kvs_backend_encoding){.id = 0, .codec = h->codec, .bytes = len, .quality = 1};
    /* One layer, the middle one, stands for the object: its error through the curve */
    const uint8_t *layer = kvs_object_layer((void *)(uintptr_t)object, m->n_layers / 2);
    const uint8_t *v = m->shape.has_v ? layer + m->layer_bytes / 2 : NULL;
    for (uint32_t k = 0; k < e->n_codecs && *n < cap; k++) {
        const kvs_codec *c = &e->codecs[k];
        double rk = 0, rv = 0;
        if (kvs_codec_layer_error(c, &m->shape, m->dtype, m->chunk_tokens, layer, v, &rk, &rv) !=
            KVS_OK)
            continue; /* values this codec cannot take (not finite, out of range): not offered */
        double err = m->shape.has_v ? (rk + rv) / 2 : rk;
        out[(*n)++] = (kvs_backend_encoding){
            .id = k + 1,
            .codec = c->kind,
            .bits = c->bits,
            .flags = c->kind == KVS_CODEC_DROP ? KVS_BACKEND_ENC_FROM_PUT_ONLY : 0,
            .bytes = kvs_object_lossy_bytes(c, &m->shape, m->dtype, m->n_layers, m->chunk_tokens),
            .quality = kvs_ac_quality_from_error(
                c->kind == KVS_CODEC_DROP ? &e->drop_curve : &e->curve, err)};
    }
    return KVS_OK;
}

kvs_status kvs_encoder_encode(const kvs_encoder *e, const void *object, uint64_t len, uint32_t id,
                              void *dst, uint64_t cap, uint64_t *out_len) {
    const kvs_encoder_model *m = &e->model;
    char why[256];
    if (id == 0 || id > e->n_codecs || !object || len < sizeof(kvs_object_header))
        return KVS_EINVAL;
    uint16_t codec = ((const kvs_object_header *)object)->codec;
    /* tokens dropped stay dropped: decoded, they are zeros no other codec could tell from KV; and
     * a chunk keeps exact rows only when dropped from its raw form */
    if (codec == KVS_CODEC_DROP || (e->codecs[id - 1].kind == KVS_CODEC_DROP &&
                                    codec != KVS_CODEC_RAW && codec != KVS_CODEC_DERIVED))
        return KVS_EINVAL;
    if (codec == KVS_CODEC_RAW || codec == KVS_CODEC_DERIVED)
        return kvs_object_encode(object, len, &e->codecs[id - 1], &m->shape, m->dtype, dst, cap,
                                 out_len, why, sizeof why);
    /* lossy to lossier: decoded whole, then encoded (the errors of both add up at most) */
    uint64_t raw_len = kvs_object_bytes(m->n_layers, m->layer_bytes);
    void *raw = malloc(raw_len);
    if (!raw) return KVS_ENOMEM;
    kvs_status st = kvs_object_decode(object, len, &m->fingerprint, m->n_layers, m->chunk_tokens,
                                      &m->shape, m->dtype, raw, raw_len, why, sizeof why);
    if (st == KVS_OK)
        st = kvs_object_encode(raw, raw_len, &e->codecs[id - 1], &m->shape, m->dtype, dst, cap,
                               out_len, why, sizeof why);
    free(raw);
    return st;
}

kvs_status kvs_encoder_plan(const kvs_encoder *e, const kvs_backend_place_entry *entries,
                            uint64_t n, const kvs_backend_devices *devices,
                            kvs_backend_place_choice *out) {
    kvs_ac_params p = e->params;
    for (int d = 0; d < 2; d++)
        p.devices[d] = (kvs_ac_device){.latency_s = devices->latency_s[d],
                                       .bytes_per_s = devices->bytes_per_s[d],
                                       .capacity = devices->capacity[d]};
    kvs_ac_entry *in = calloc(n ? n : 1, sizeof *in);
    kvs_ac_choice *chosen = calloc(n ? n : 1, sizeof *chosen);
    kvs_status st = in && chosen ? KVS_OK : KVS_ENOMEM;
    for (uint64_t i = 0; st == KVS_OK && i < n; i++) {
        const kvs_backend_place_entry *b = &entries[i];
        kvs_ac_entry *a = &in[i];
        a->raw_bytes = b->raw_bytes;
        a->freq = b->hits_per_s;
        a->recompute_s = devices->recompute_s;
        a->devices = b->devices & 3u;
        for (uint32_t k = 0; k < b->n_encodings && k < KVS_BACKEND_MAX_ENCODINGS; k++) {
            uint32_t id = b->encodings[k].id;
            if (id >= p.n_codecs) continue; /* not one of this encoder's */
            a->bytes[id] = b->encodings[k].bytes;
            a->quality[id] = b->encodings[k].quality;
            if (b->allowed >> k & 1) a->allowed |= 1u << id;
        }
        if (!a->allowed) a->devices = 0; /* nothing it may be stored as: stored nowhere */
    }
    if (st == KVS_OK) st = kvs_ac_place(&p, in, n, chosen, NULL);
    for (uint64_t i = 0; st == KVS_OK && i < n; i++) {
        out[i] = (kvs_backend_place_choice){.device = chosen[i].device, .encoding = 0};
        const kvs_backend_place_entry *b = &entries[i];
        for (uint32_t k = 0; k < b->n_encodings && k < KVS_BACKEND_MAX_ENCODINGS; k++)
            if (b->encodings[k].id == chosen[i].codec) out[i].encoding = (uint8_t)k;
    }
    free(in);
    free(chosen);
    return st;
}

static kvs_status tier_encodings(const void *ctx, const void *object, uint64_t len,
                                 kvs_backend_encoding *out, uint32_t cap, uint32_t *n) {
    return kvs_encoder_encodings(ctx, object, len, out, cap, n);
}

static kvs_status tier_encode(const void *ctx, const void *object, uint64_t len, uint32_t id,
                              void *dst, uint64_t cap, uint64_t *out_len) {
    return kvs_encoder_encode(ctx, object, len, id, dst, cap, out_len);
}

static kvs_status tier_plan(const void *ctx, const kvs_backend_place_entry *entries, uint64_t n,
                            const kvs_backend_devices *devices, kvs_backend_place_choice *out) {
    return kvs_encoder_plan(ctx, entries, n, devices, out);
}

void kvs_encoder_for_tiers(const kvs_encoder *e, kvs_tier_encoder *out) {
    *out = (kvs_tier_encoder){.ctx = e,
                              .encodings = tier_encodings,
                              .encode = tier_encode,
                              .plan = tier_plan,
                              .reevaluate_ms = kvs_encoder_reevaluate_ms(e)};
}
