/* verify.c - --verify (verify.h): recompute a restored prompt from scratch and compare. */
#include "verify.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "models/mini/kvcache.h"
#include "models/mini/model.h"

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

/* KL(p || q) of the softmaxes of logits a (reference) and b, in nats; *same: the argmaxes agree. */
static double kl_of_logits(const float *a, const float *b, int n, int *same) {
    double ma = a[0], mb = b[0];
    int ia = 0, ib = 0;
    for (int i = 1; i < n; i++) {
        if (a[i] > ma) ma = a[i], ia = i;
        if (b[i] > mb) mb = b[i], ib = i;
    }
    double za = 0, zb = 0;
    for (int i = 0; i < n; i++) za += exp(a[i] - ma), zb += exp(b[i] - mb);
    double kl = 0;
    for (int i = 0; i < n; i++) {
        double la = a[i] - ma - log(za), lb = b[i] - mb - log(zb);
        kl += exp(la) * (la - lb);
    }
    *same = ia == ib && isfinite(kl);
    if (!isfinite(kl)) return INFINITY; /* a logit that is not finite is no match */
    return kl > 0 ? kl : 0;
}

int reference_lossy_within(const reference *ref) {
    if (ref->lossy_turns == 0) return 1;
    return ref->lossy_kl_sum / ref->lossy_turns <= ref->max_kl &&
           (double)ref->lossy_top1 / ref->lossy_turns >= ref->min_top1;
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
    if (r->lossy_hit) { /* not bit for bit: how far the predictions moved */
        int same = 0;
        ref->lossy_kl_sum += kl_of_logits(re->logits, e->logits, mc->vocab, &same);
        ref->lossy_top1 += same;
        ref->lossy_turns++;
        return 0;
    }

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
                        mini_err(
                            "verify: MISMATCH session %s turn %d: layer %d token %llu %s head %u "
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
        mini_err("verify: MISMATCH session %s turn %d: logits differ at %d (%.9g vs %.9g)\n",
                 ref->session, ref->turn, i, (double)e->logits[i], (double)re->logits[i]);
        ref->mismatches++;
    }
    return 0;
}
