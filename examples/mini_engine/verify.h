/* verify.h - --verify: a reference engine with no connector and no prefix cache recomputes every
 * prompt the connector restored into, and its KV and logits are compared bit for bit. */
#ifndef MINI_VERIFY_H
#define MINI_VERIFY_H

#include <stdint.h>

#include "engine.h"

typedef struct reference {
    engine e;
    uint32_t *identity; /* block table 0, 1, 2, ... */
    int turns_checked;
    int mismatches;
    /* Turns whose hit came back lossy (from a compress tier) are compared by their predictions:
     * the next-token distributions' KL divergence (reference || restored) and whether the top token
     * agrees. The run fails when the mean KL exceeds max_kl or the agreement falls below min_top1. */
    int lossy_turns, lossy_top1;
    double lossy_kl_sum;
    double max_kl, min_top1;
    const char *session;
    int turn;
    double check_ms; /* time spent checking, kept out of the TTFT of requests served after it */
} reference;

/* A prefill_done_fn (ctx: a reference): recompute the prompt of a turn with connector hits in ref->e
 * and compare; a difference is counted in mismatches and named in one line on stderr. The time it
 * takes is added to check_ms. Returns 0 (a mismatch does not stop the run). */
int reference_check(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r);

/* 1 when the lossy turns' mean KL and top-1 agreement are within ref's bounds (or there were none). */
int reference_lossy_within(const reference *ref);

#endif
