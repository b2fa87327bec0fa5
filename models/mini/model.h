/* model.h - a small Llama-style transformer in fp32: RMSNorm, RoPE, grouped-query attention (or an
 * MLA-like latent attention), SwiGLU. Weights are generated from a seed or trained (weights.h). Attention always reads K/V
 * back from the paged cache, and every token is computed by the same per-token loops in the same
 * order, so how a prompt is split into steps never changes a single bit of the KV or the logits. */
#ifndef MINI_MODEL_H
#define MINI_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"

typedef struct model_config {
    int dim; /* model width */
    int n_layers;
    int n_heads;    /* query heads; head_dim = dim / n_heads */
    int n_kv_heads; /* K/V heads (grouped-query attention); ignored for MLA */
    int ffn;        /* SwiGLU hidden width */
    int vocab;
    int is_mla; /* 1: cache a latent of width `latent`, up-project K and V per head */
    int latent;
    uint64_t seed;
    uint64_t weights_id; /* trained weights: their file's checksum (weights.h); 0: seeded */
} model_config;

typedef struct model model;
typedef struct model_scratch model_scratch;

/* 0 if the sizes are consistent, else -1 and a sentence naming the flag. */
int model_config_check(const model_config *c, char *err, size_t err_len);
model *model_create(const model_config *c);
/* Floats a trained GQA model of this shape holds, in the order model_create_trained reads them:
 * embed [vocab][dim], final_norm [dim], wcls [dim][vocab], then per layer attn_norm [dim],
 * ffn_norm [dim], wq [dim][heads*hd], wk [dim][kv_heads*hd], wv [dim][kv_heads*hd],
 * wo [heads*hd][dim], w1 [dim][ffn], w3 [dim][ffn], w2 [ffn][dim] (input-major: w[in][out]). */
uint64_t model_weights_floats(const model_config *c);
/* A GQA model with these weights (copied) instead of seeded ones; NULL for MLA or no memory. */
model *model_create_trained(const model_config *c, const float *trained);
void model_free(model *m);
const model_config *model_config_of(const model *m);
int model_head_dim(const model *m);
/* Shape of what one token stores per layer in the paged cache: heads x width. */
uint32_t model_cache_heads(const model *m);
uint32_t model_cache_width(const model *m);

/* Activations for steps of up to max_step_tokens tokens over contexts up to max_context tokens. */
model_scratch *model_scratch_create(const model *m, int max_step_tokens, int max_context);
void model_scratch_free(model_scratch *s);
/* The hidden states of the step: max_step_tokens x dim floats. */
float *model_scratch_hidden(model_scratch *s);
/* Attention of this scratch's steps leaves out every position p with dropped[p] != 0 (a mask the
 * engine keeps for KV a lossy tier dropped, as after StreamingLLM): their pages are not read at all,
 * so whatever they hold has no influence. NULL: none (the default). The array must cover
 * every position attended over, and stays the caller's. */
void model_scratch_drop(model_scratch *s, const uint8_t *dropped);

/* Look up the embeddings of tokens[0..n) into the step's hidden states. */
void model_embed(const model *m, model_scratch *s, const int32_t *tokens, int n);
/* Run layer `layer` for the n tokens at positions pos0.. whose hidden states are in the scratch:
 * write their K/V (or latent) into the pages through block_table, then attend over positions
 * [0, pos] read back from the pages. */
void model_layer(const model *m, model_scratch *s, const kvcache *kv, uint32_t layer,
                 const uint32_t *block_table, uint64_t pos0, int n);
/* Final norm and output head for the hidden state of step token `index`: vocab logits. */
void model_logits(const model *m, model_scratch *s, int index, float *logits);
/* One token with the attention left to the caller (sparse_decode.c; model_layer's first half).
 * model_token_qkv (K and V: GQA only; k NULL: the query alone, any model; s->xn keeps the normed
 * input):
 * from the token's hidden state x (dim floats) at position pos, its query (heads * head_dim, RoPE'd
 * and scaled by 1/sqrt(head_dim), as model_layer attends with) and, when k is not NULL, its K
 * (RoPE'd) and V (kv_heads * head_dim each). model_token_finish: x += the output projection of
 * att (heads * head_dim), then the feed-forward, as model_layer does. model_logits_of: the logits
 * of hidden state x. model_embedding: token's embedding (dim floats). */
void model_token_qkv(const model *m, model_scratch *s, uint32_t layer, const float *x, uint64_t pos,
                     float *q, float *k, float *v);
void model_token_finish(const model *m, model_scratch *s, uint32_t layer, float *x,
                        const float *att);
void model_logits_of(const model *m, model_scratch *s, const float *x, float *logits);
const float *model_embedding(const model *m, int32_t token);
/* Index of the largest logit (the lowest one on ties). */
int32_t model_argmax(const float *logits, int vocab);

#endif
