/* encoder.h - what the connector lends a tier that re-encodes its objects (backend ABI 1.5,
 * kvs_backend_host.encodings/encode/plan; the compress tier, docs/compress.md): the model's lossy
 * codecs offered by `placement.codecs`, each object's estimated quality per codec (its reconstruction
 * error on one layer through the model's quality curve), encoding, and the AdaptCache placement
 * (schedulers/adaptcache/) with `placement:`'s parameters. Immutable after create: thread-safe. */
#ifndef KVS_ENCODER_H
#define KVS_ENCODER_H

#include <stdint.h>

#include "abi/kvstrata_backend.h"
#include "connector/config_types.h"
#include "connector/tiers.h"
#include "kernels/cpu/codec.h"

typedef struct kvs_encoder kvs_encoder;

/* The model whose objects it encodes. */
typedef struct kvs_encoder_model {
    kvs_key fingerprint;
    uint32_t n_layers, chunk_tokens, dtype;
    kvs_kv_shape shape;
    uint64_t layer_bytes;
} kvs_encoder_model;

/* The codecs of placement->codecs this model can take (groups of 32 tokens and 32 channels, fewer
 * when a chunk or a head is smaller). KVS_ENOMEM, or KVS_OK. */
kvs_status kvs_encoder_create(const kvs_encoder_model *model, const kvs_config *cfg,
                              kvs_encoder **out);
void kvs_encoder_destroy(kvs_encoder *e);

/* kvs_backend_host.encodings, .encode and .plan over e (see abi/kvstrata_backend.h). */
kvs_status kvs_encoder_encodings(const kvs_encoder *e, const void *object, uint64_t len,
                                 kvs_backend_encoding *out, uint32_t cap, uint32_t *n);
kvs_status kvs_encoder_encode(const kvs_encoder *e, const void *object, uint64_t len, uint32_t id,
                              void *dst, uint64_t cap, uint64_t *out_len);
kvs_status kvs_encoder_plan(const kvs_encoder *e, const kvs_backend_place_entry *entries,
                            uint64_t n, const kvs_backend_devices *devices,
                            kvs_backend_place_choice *out);
/* placement.reevaluate_ms. */
uint64_t kvs_encoder_reevaluate_ms(const kvs_encoder *e);
/* The calls above over e, as the tier chain takes them (kvs_tiers_open). */
void kvs_encoder_for_tiers(const kvs_encoder *e, kvs_tier_encoder *out);

#endif
