/* stages.h - pipeline stages of the mini engine (--stages S): the model's layers split into S
 * contiguous stages, and the activations entering every stage s > 0 kept in extra cache layers after
 * the model's own (its "boundary"), written by every forward and saved and loaded with the KV. A stage
 * can then restore its own layers from its boundary while the other stages restore theirs: the
 * connector's stage plans (ABI 1.4, KVS_PLAN_STAGE). */
#ifndef MINI_STAGES_H
#define MINI_STAGES_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_plans.h"
#include "models/mini/kvcache.h"
#include "models/mini/model.h"

typedef struct stage_layout {
    int n_stages;              /* 1: no stages, no boundary layers */
    int first[KVS_MAX_STAGES]; /* first model layer of each stage */
    int model_layers;          /* the model's layers: boundary layers follow them in the cache */
    int boundary_layers; /* cache layers holding one boundary (fp32 activations, bit for bit) */
    model_scratch
        *scratch[KVS_MAX_STAGES]; /* activations of the threads of stages 1.. in a restore */
} stage_layout;

/* Split the model's layers into n_stages stages (the first ones one layer more when it does not
 * divide) and size the boundaries for a cache of dtype. 0, or -1 with a sentence in err. */
int stage_layout_init(stage_layout *sl, const model *m, kvs_dtype dtype, int n_stages, char *err,
                      size_t err_len);
/* Cache layers the engine needs: the model's, then (n_stages - 1) * boundary_layers. */
uint32_t stage_cache_layers(const stage_layout *sl);
/* The stage description the connector gets (set_stages). */
kvs_stage_desc stage_desc(const stage_layout *sl);
/* Store the hidden states of n tokens at positions pos0.. (n x dim floats) as stage `stage`'s
 * boundary, or read them back into hidden. */
void stage_boundary_write(const stage_layout *sl, const kvcache *kv, int stage, int dim,
                          const uint32_t *table, uint64_t pos0, int n, const float *hidden);
void stage_boundary_read(const stage_layout *sl, const kvcache *kv, int stage, int dim,
                         const uint32_t *table, uint64_t pos0, int n, float *hidden);
/* The stage whose first layer is `layer` (> 0), or 0 when no stage starts there. */
int stage_starting_at(const stage_layout *sl, int layer);

#endif
