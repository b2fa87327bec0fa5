/* verify.c - --verify (verify.h): recompute a restored prompt from scratch and compare. */
#include "verify.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kvcache.h"
#include "model.h"

#define PROG "kvs-mini-engine"

static int reference_check_timed(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r);

int reference_check(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r) {
    reference *ref = ctx;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = reference_check_timed(ctx, e, n_prompt, r);
    clock_gettime(CLOCK_MONOTONIC, &b);
    ref->check_ms += (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
    return rc;
}

static int reference_check_timed(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r) {
    reference *ref = ctx;
    if (r->ext_hit == 0) return 0;
    engine *re = &ref->e;
    const model_config *mc = model_config_of(e->m);
    /* The whole prompt in one step: also proves the result does not depend on chunking. */
    memcpy(re->tokens, e->tokens, n_prompt * sizeof *re->tokens);
    model_embed(re->m, re->s, re->tokens, (int)n_prompt);
    for (int l = 0; l < mc->n_layers; l++)
        model_layer(re->m, re->s, re->kv, (uint32_t)l, ref->identity, 0, (int)n_prompt);
    model_logits(re->m, re->s, (int)n_prompt - 1, re->logits);
    ref->turns_checked++;

    const kvcache_params *p = kvcache_params_of(e->kv);
    const size_t head_bytes = p->head_dim * kv_dtype_size(p->dtype);
    const int parts = p->layout == KV_LAYOUT_MLA ? 1 : 2;
    for (int l = 0; l < mc->n_layers; l++) {
        for (uint64_t t = 0; t < n_prompt; t++) {
            for (int part = 0; part < parts; part++) {
                for (uint32_t h = 0; h < p->n_heads; h++) {
                    const uint32_t blk = (uint32_t)(t / KV_BLOCK_TOKENS),
                                   slot = (uint32_t)(t % KV_BLOCK_TOKENS);
                    const uint8_t *got =
                        kvcache_head_ptr(e->kv, (uint32_t)l, (kv_part)part, e->table[blk], slot, h);
                    const uint8_t *want =
                        kvcache_head_ptr(re->kv, (uint32_t)l, (kv_part)part, blk, slot, h);
                    if (memcmp(got, want, head_bytes) != 0) {
                        fprintf(
                            stderr,
                            PROG
                            ": verify: MISMATCH session %s turn %d: layer %d token %llu %s head %u "
                            "(local hit %llu, connector hit %llu)\n",
                            ref->session, ref->turn, l, (unsigned long long)t,
                            part == 0 ? "K" : "V", h, (unsigned long long)r->local_hit,
                            (unsigned long long)r->ext_hit);
                        ref->mismatches++;
                        return 0; /* one line per turn; keep running to count the turns */
                    }
                }
            }
        }
    }
    if (memcmp(e->logits, re->logits, (size_t)mc->vocab * sizeof(float)) != 0) {
        int i = 0;
        while (i < mc->vocab - 1 && memcmp(&e->logits[i], &re->logits[i], sizeof(float)) == 0) i++;
        fprintf(stderr,
                PROG ": verify: MISMATCH session %s turn %d: logits differ at %d (%.9g vs %.9g)\n",
                ref->session, ref->turn, i, (double)e->logits[i], (double)re->logits[i]);
        ref->mismatches++;
    }
    return 0;
}
