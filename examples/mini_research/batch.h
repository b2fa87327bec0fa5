/* batch.h - several requests in flight, stepped together the way vLLM's scheduler steps them. Each
 * step decodes one token of every request that has its first token, gives up to --prefill-chunk
 * tokens to prefills (earliest arrival first; within a group that arrived together, in the order of
 * the restore plans' predicted finish; a prefill that ends its prompt closes the step, since a
 * forward on this CPU costs what its tokens cost and batching two prompts only delays the first) and
 * spends what the prefills leave on the parts of restores that the connector's plans leave to the
 * engine. A request whose KV the connector loads between steps (lookup's load_async) is not
 * scheduled until get_finished lists it as received: the others keep stepping meanwhile. */
#ifndef MINI_BATCH_H
#define MINI_BATCH_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_plans.h"
#include "examples/mini_engine/engine.h"
#include "plans.h"

#define BATCH_MAX 64 /* requests in flight at once */

/* One request in flight. The caller sets e, a (from engine_admit), r and tag, then batch_add. */
typedef struct batch_req {
    engine *e;      /* its slot: tokens, block table, scratch and logits of its own */
    admitted a;     /* from engine_admit; a.t0 is its arrival */
    turn_result *r; /* filled as it runs (prompt, hits, error blocks, ttft_ms, first_token) */
    int tag;        /* the caller's (which turn of the workload) */
    int done;       /* finished: its pages are back in the engine's prefix cache */
    /* the batch's state */
    uint64_t seq;
    int waiting_kv;        /* its asynchronous load has not been reported by get_finished yet */
    int load_issued;       /* a step carried its asynchronous load: its plan is known */
    int planned;           /* plan holds the plan of its restore */
    kvs_restore_plan plan; /* what of its restore the engine computes itself */
    uint64_t front_n;      /* tokens of the plan's range the engine computes (token, layer plans) */
    uint64_t front_done;   /* of them, computed so far */
    int front_layers;      /* through layers [0, front_layers) */
    int stages_left;       /* a stage plan, computed once its boundaries have landed */
    uint64_t computed;     /* tokens whose KV is in the pages */
    uint64_t n_known;      /* prompt, then the outputs so far */
    int produced, retries;
    int keep;             /* finished, its pages kept until get_finished lists it as sent */
    int n_sched;          /* this step: tokens scheduled */
    uint64_t front_piece; /* this step: tokens of its restore computed */
    int sync_restore;     /* this step carries its (synchronous) loads */
    int reported;         /* this step's get_finished listed it as received */
    uint64_t first_bad;   /* this step: first token of its first failed block, or UINT64_MAX */
    uint64_t bad_blocks;
} batch_req;

/* One decode-only step: it schedules one token of each request that has its first token and
 * computes nothing else. */
typedef struct batch_decode_step {
    double at_ms, step_ms; /* when it ended (CLOCK_MONOTONIC), how long it took */
    uint32_t n_decode;     /* requests decoding in it */
    uint32_t loading;      /* 1: an asynchronous load was in flight; 0: no restore was */
} batch_decode_step;

/* Step times of the requests decoding (benchmark figures): every decode-only step, and the steps
 * that carried a synchronous restore while other requests decoded. */
typedef struct batch_stats {
    batch_decode_step *decode; /* malloc'd, grown as needed (recording stops if it cannot grow) */
    uint64_t n_decode, cap_decode;
    uint64_t restore_steps;
    double restore_ms;
    uint64_t steps, polls; /* every step; of them, empty steps waiting for loads */
} batch_stats;

/* Called once a request's first token's logits are in its slot (--verify's check). Its time is kept
 * out of the TTFT of the requests still waiting for theirs and out of the step times. Non-zero stops
 * the run. */
typedef int (*batch_first_token_fn)(void *ctx, batch_req *q);

typedef struct batch {
    batch_req *q[BATCH_MAX];
    int n;
    batch_first_token_fn on_first; /* may be NULL */
    void *ctx;
    batch_stats stats;
    uint64_t seq;
} batch;

/* Put an admitted request in flight. 0, or -1 after printing why (the batch is full). */
int batch_add(batch *b, batch_req *q);
/* Free the recorded step times. */
void batch_stats_free(batch_stats *s);
/* One step over every request in flight; a request that finishes in it gets done = 1 and leaves the
 * batch (its pointer stays the caller's). Sleeps 1 ms when nothing could be computed and loads are
 * still in flight. 0, or -1 after printing why. */
int batch_step(batch *b);

#endif
