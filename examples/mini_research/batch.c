/* batch.c - several requests in flight, stepped together (batch.h): the step's schedule, its hooks
 * in vLLM's order around one forward over every scheduled request, asynchronous loads reported by
 * get_finished, and load errors traced to the request that owns each block. */
#include "batch.h"

#include "abi/kvstrata_plans.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STEP_RETRIES 8       /* load-error recomputes per request before giving up */
#define LOAD_WAIT_MS     60000.0 /* an asynchronous load not reported by then is an error */

static void sleep_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void record_decode_step(batch_stats *s, batch_decode_step d) {
    if (s->n_decode == s->cap_decode) {
        uint64_t cap = s->cap_decode ? 2 * s->cap_decode : 4096;
        batch_decode_step *grown = realloc(s->decode, cap * sizeof *grown);
        if (!grown) return; /* a figure with fewer samples, not a failed run */
        s->decode = grown;
        s->cap_decode = cap;
    }
    s->decode[s->n_decode++] = d;
}

void batch_stats_free(batch_stats *s) {
    free(s->decode);
    *s = (batch_stats){0};
}

int batch_add(batch *b, batch_req *q) {
    if (b->n == BATCH_MAX) {
        mini_err("more than %d requests in flight\n", BATCH_MAX);
        return -1;
    }
    q->seq = b->seq++;
    q->done = q->load_issued = q->planned = q->keep = 0;
    q->waiting_kv = q->a.async;
    q->front_n = q->front_done = 0;
    q->front_layers = q->stages_left = 0;
    q->computed = q->a.computed;
    q->n_known = q->a.n_prompt;
    q->produced = q->retries = 0;
    *q->r = (turn_result){.session = q->r->session,
                          .turn = q->r->turn,
                          .prompt = q->a.n_prompt,
                          .local_hit = q->a.n_local,
                          .ext_hit = q->a.n_ext,
                          .lossy_hit = q->a.n_lossy,
                          .error_blocks = q->a.error_blocks};
    b->q[b->n++] = q;
    return 0;
}

/* Prefill order: earliest arrival; then, for requests that arrived together, the plan predicted to
 * finish first (the planner ordered the loads so); then admission. */
static int before(const batch_req *x, const batch_req *y) {
    if (x->a.t0 != y->a.t0) return x->a.t0 < y->a.t0;
    double px = x->planned ? x->plan.predicted_ms : 0, py = y->planned ? y->plan.predicted_ms : 0;
    if (px != py) return px < py;
    return x->seq < y->seq;
}

static void sort_batch(batch *b) {
    for (int i = 1; i < b->n; i++)
        for (int j = i; j > 0 && before(b->q[j], b->q[j - 1]); j--) {
            batch_req *t = b->q[j];
            b->q[j] = b->q[j - 1];
            b->q[j - 1] = t;
        }
}

/* What of an asynchronous restore the engine computes, from its plan: the front of the range
 * (token plans) or its lower layers (layer plans) while the rest loads; a stage plan's layers once
 * the boundaries have landed. Counted like plans_restore counts the plans it follows. */
static void take_plan(batch_req *q, const kvs_restore_plan *p) {
    plan_state *c = plan_state_of(q->e);
    const int layers = model_config_of(q->e->m)->n_layers;
    q->plan = *p;
    q->planned = 1;
    if (p->recompute_tokens == 0) return;
    c->plan_recomputed_tokens += p->recompute_tokens;
    q->front_n = p->recompute_tokens;
    q->front_layers = layers;
    switch (p->mode) {
        case KVS_PLAN_LAYER:
            c->plans_layer++;
            q->front_layers = (int)p->recompute_layers;
            break;
        case KVS_PLAN_STAGE:
            c->plans_stage++;
            for (uint32_t s = 1; s < p->n_stages && s < KVS_MAX_STAGES; s++)
                c->stage_boundary_restores += p->stage_recompute_layers[s] > 0;
            q->front_n = 0;
            q->stages_left = 1;
            break;
        case KVS_PLAN_RECOMPUTE: c->plans_recompute++; break;
        default: c->plans_token++; break;
    }
}

/* A stage plan's layers, stage after stage on this thread (stage s > 0 from its landed boundary). */
static void compute_stages(batch_req *q) {
    const stage_layout *sl = plan_state_of(q->e)->sl;
    const kvs_restore_plan *p = &q->plan;
    for (uint32_t s = 0; s < p->n_stages && s < KVS_MAX_STAGES; s++)
        if (p->stage_recompute_layers[s])
            plans_compute_layers(q->e, q->e->s, p->first_token, p->recompute_tokens, sl->first[s],
                                 sl->first[s] + (int)p->stage_recompute_layers[s], 0);
    q->stages_left = 0;
}

static batch_req *find(batch *b, const char *id) {
    for (int i = 0; i < b->n; i++)
        if (strcmp(b->q[i]->a.req_id, id) == 0) return b->q[i];
    return NULL;
}

static void release(batch_req *q) {
    kvcache_release(q->e->kv, q->e->table, q->a.n_blocks, q->e->tokens,
                    q->a.n_lossy ? q->a.n_local : q->a.kv_tokens); /* as engine.c: lossy pages */
    q->done = 1;
}

static int on_finished(void *ctx, const char *id, int receiving) {
    batch_req *q = find(ctx, id);
    if (!q) return 0; /* not ours: a request of an earlier batch */
    if (receiving && q->waiting_kv) {
        q->waiting_kv = 0;
        q->reported = 1;
    } else if (!receiving && q->keep) {
        q->keep = 0;
        release(q);
    }
    return 0;
}

/* load_error_blocks: each failed block belongs to a request whose synchronous loads this step
 * carried, or whose asynchronous load get_finished reported in it. */
static int trace_errors(batch *b, connector *c) {
    uint64_t n_bad = 0;
    HOOK(c, c->api->load_error_blocks(c->h, c->errors, c->errors_cap, &n_bad), "load_error_blocks");
    for (uint64_t k = 0; k < n_bad; k++) {
        batch_req *owner = NULL;
        uint64_t first = 0;
        for (int i = 0; i < b->n && !owner; i++) {
            batch_req *q = b->q[i];
            if (!q->sync_restore && !q->reported) continue;
            for (uint32_t blk = 0; blk < q->a.n_blocks; blk++)
                if (q->e->table[blk] == c->errors[k]) {
                    owner = q;
                    first = (uint64_t)blk * KV_BLOCK_TOKENS;
                    break;
                }
        }
        if (!owner) {
            mini_err("load_error_blocks reported block %u, which no request whose load ended "
                     "in this step holds\n",
                     c->errors[k]);
            return -1;
        }
        owner->bad_blocks++;
        if (first < owner->first_bad) owner->first_bad = first;
    }
    return 0;
}

/* The request's n_sched tokens are computed: a first token (TTFT), a decoded token, or the end. */
static int advance(batch *b, batch_req *q, double *excluded_ms) {
    engine *e = q->e;
    q->computed += (uint64_t)q->n_sched;
    if (q->computed < q->n_known) return 0;
    model_logits(e->m, e->s, q->n_sched - 1, e->logits);
    int32_t next = model_argmax(e->logits, model_config_of(e->m)->vocab);
    if (q->produced == 0) {
        q->r->ttft_ms = engine_now_ms() - q->a.t0;
        q->r->first_token = next;
        if (b->on_first) {
            double t = engine_now_ms();
            if (b->on_first(b->ctx, q) != 0) return -1;
            t = engine_now_ms() - t; /* no one's waiting time */
            *excluded_ms += t;
            for (int i = 0; i < b->n; i++)
                if (b->q[i]->produced == 0 && b->q[i] != q) b->q[i]->a.t0 += t;
        }
    }
    q->produced++;
    e->tokens[q->n_known++] = next;
    if (q->produced < q->a.n_out) return 0;
    connector *c = e->conn;
    if (c) {
        int keep = 0;
        HOOK(c, c->api->request_finished(c->h, q->a.req_id, &keep), "request_finished");
        if (connector_take_events(c) != 0) return -1;
        q->keep = keep;
    }
    if (!q->keep) release(q);
    return 0;
}

/* What a step holds (batch_step's phases fill it in order). */
typedef struct step_plan {
    int n_decode, n_prefill, n_sync, n_front; /* requests decoding, prefilling, ... */
    int loading;                              /* an asynchronous load is in flight */
    int computed_any;                         /* the step computed something */
    double excluded_ms;                       /* --verify's checks: no one's waiting time */
} step_plan;

/* 1. The schedule: every decode; prefills in order within the budget; then restore work. */
static void schedule(batch *b, connector *c, step_plan *sp) {
    int budget = b->q[0]->e->prefill_chunk;
    for (int i = 0; i < b->n; i++) {
        batch_req *q = b->q[i];
        q->n_sched = 0;
        q->front_piece = 0;
        q->sync_restore = q->reported = 0;
        q->first_bad = UINT64_MAX;
        q->bad_blocks = 0;
        sp->loading |= q->waiting_kv;
        if (q->done || q->keep || q->waiting_kv || q->front_done < q->front_n || q->stages_left)
            continue;
        if (q->produced > 0) q->n_sched = (int)(q->n_known - q->computed), sp->n_decode++;
    }
    for (int i = 0; i < b->n; i++) {
        batch_req *q = b->q[i];
        if (q->done || q->keep || q->waiting_kv || q->front_done < q->front_n || q->stages_left ||
            q->produced > 0 || budget == 0)
            continue;
        uint64_t left = q->n_known - q->computed;
        q->n_sched = left < (uint64_t)budget ? (int)left : budget;
        /* a step that ends a prompt takes nothing more: its first token would wait for it (a
         * forward here costs what its tokens cost, batched or not) */
        budget = (uint64_t)q->n_sched == left ? 0 : budget - q->n_sched;
        sp->n_prefill++;
        if (c && q->a.n_ext && !q->a.async && !q->a.restored) q->sync_restore = 1, sp->n_sync++;
    }
    for (int i = 0; i < b->n && budget > 0; i++) {
        batch_req *q = b->q[i];
        if (q->done || q->front_done >= q->front_n) continue;
        uint64_t left = q->front_n - q->front_done;
        q->front_piece = left < (uint64_t)budget ? left : (uint64_t)budget;
        budget -= (int)q->front_piece;
        sp->n_front++;
    }
}

/* 2. The step's metadata: the scheduled requests (the connector adds the asynchronous loads that
 * on_alloc armed), then the plans of the asynchronous loads it carries. */
static int step_meta(batch *b, connector *c) {
    kvs_step_request rs[BATCH_MAX];
    int n_rs = 0;
    for (int i = 0; i < b->n; i++) {
        batch_req *q = b->q[i];
        if (q->n_sched == 0) continue;
        rs[n_rs++] = (kvs_step_request){.req_id = q->a.req_id,
                                        .tokens = q->e->tokens,
                                        .n_tokens = q->n_known,
                                        .block_ids = q->e->table,
                                        .n_block_ids = q->a.n_blocks,
                                        .n_computed = q->computed,
                                        .n_scheduled = (uint64_t)q->n_sched};
    }
    if (connector_step_meta(c, rs, (uint64_t)n_rs) != 0) return -1;
    for (int i = 0; i < b->n; i++) {
        batch_req *q = b->q[i];
        if (!q->waiting_kv || q->load_issued) continue;
        q->load_issued = 1;
        kvs_restore_plan p = {.struct_size = sizeof p};
        kvs_status ps =
            plan_state_of(q->e)->plans ? c->api->plan(c->h, q->a.req_id, &p) : KVS_ENOTFOUND;
        if (ps == KVS_OK)
            take_plan(q, &p);
        else if (ps != KVS_ENOTFOUND) /* the loads may lack what the plan gives us */
            return connector_hook_failed(c, "plan", ps);
    }
    return 0;
}

/* 3. start_load, recomputing beside the loads what the synchronous restores' plans leave. */
static int start_loads(batch *b, connector *c) {
    engine *es[BATCH_MAX];
    admitted *as[BATCH_MAX];
    admitted sync_as[BATCH_MAX];
    int idx[BATCH_MAX], n_s = 0;
    for (int i = 0; i < b->n; i++)
        if (b->q[i]->sync_restore) {
            es[n_s] = b->q[i]->e;
            sync_as[n_s] = b->q[i]->a;
            as[n_s] = &b->q[i]->a;
            idx[n_s] = n_s;
            n_s++;
        }
    if (n_s == 0)
        HOOK(c, c->api->start_load(c->h), "start_load");
    else if (plans_restore(es, sync_as, idx, n_s) != 0)
        return -1;
    for (int j = 0; j < n_s; j++) as[j]->restored = 1;
    return 0;
}

/* 4. The parts of asynchronous restores the engine computes (their pages are not being written:
 * the loads land in other blocks, or in other layers, and only between steps). */
static void compute_restores(batch *b, int n_layers, step_plan *sp) {
    for (int i = 0; i < b->n; i++) {
        batch_req *q = b->q[i];
        if (q->stages_left && !q->waiting_kv) compute_stages(q), sp->computed_any = 1;
        if (!q->front_piece) continue;
        plans_compute_layers(q->e, q->e->s, q->plan.first_token + q->front_done, q->front_piece, 0,
                             q->front_layers, q->front_layers == n_layers);
        q->front_done += q->front_piece;
        sp->computed_any = 1;
    }
}

/* 5. One forward over the scheduled requests, layer by layer, with the hooks around it; then, in
 * vLLM's order, get_finished and load_error_blocks (which then also lists the failed blocks of the
 * asynchronous loads get_finished reported). */
static int forward(batch *b, connector *c) {
    engine *e0 = b->q[0]->e;
    const model *m = e0->m;
    const int n_layers = model_config_of(m)->n_layers;
    for (int i = 0; i < b->n; i++) {
        batch_req *q = b->q[i];
        if (q->n_sched) model_embed(m, q->e->s, q->e->tokens + q->computed, q->n_sched);
    }
    for (int l = 0; l < n_layers; l++) {
        if (c) HOOK(c, c->api->wait_layer_load(c->h, (uint32_t)l), "wait_layer_load");
        for (int i = 0; i < b->n; i++) {
            batch_req *q = b->q[i];
            if (!q->n_sched) continue;
            plans_capture_boundary(q->e, q->e->s, l, q->computed, q->n_sched);
            model_layer(m, q->e->s, q->e->kv, (uint32_t)l, q->e->table, q->computed, q->n_sched);
        }
        if (c) HOOK(c, c->api->save_layer(c->h, (uint32_t)l), "save_layer");
    }
    if (!c) return 0;
    for (uint32_t l = (uint32_t)n_layers; l < kvcache_params_of(e0->kv)->n_layers; l++)
        HOOK(c, c->api->save_layer(c->h, l), "save_layer");
    HOOK(c, c->api->wait_save(c->h), "wait_save");
    if (connector_finished(c, on_finished, b) != 0 || trace_errors(b, c) != 0) return -1;
    return 0;
}

/* 6. Results. A request whose synchronous loads failed discards what the step computed for it and
 * recomputes from its first failed block; one whose asynchronous load failed recomputes from there
 * once it is scheduled. */
static int results(batch *b, step_plan *sp) {
    for (int i = 0; i < b->n; i++) {
        batch_req *q = b->q[i];
        if (q->bad_blocks) {
            q->r->error_blocks += q->bad_blocks;
            if (++q->retries > MAX_STEP_RETRIES) {
                mini_err("'%s': loads kept failing after %d recomputes\n", q->a.req_id,
                         q->retries - 1);
                return -1;
            }
            uint64_t first = q->first_bad < q->a.n_local ? q->a.n_local : q->first_bad;
            if (first < q->computed) q->computed = first;
            engine_undrop_from(q->e, q->computed);
            if (q->sync_restore) continue; /* the step's results for it are void */
        }
        if (q->n_sched) {
            sp->computed_any = 1;
            if (advance(b, q, &sp->excluded_ms) != 0) return -1;
        }
    }
    return 0;
}

/* 7. Step times (the benchmark's): decode-only steps, and steps that restored synchronously while
 * others decoded. Then the finished requests leave; with nothing computed, wait for a load. */
static int end_step(batch *b, const step_plan *sp, double t_start) {
    double step_ms = engine_now_ms() - t_start - sp->excluded_ms;
    b->stats.steps++;
    if (sp->n_decode && !sp->n_prefill && !sp->n_front)
        record_decode_step(&b->stats,
                           (batch_decode_step){engine_now_ms(), step_ms, (uint32_t)sp->n_decode,
                                               (uint32_t)sp->loading});
    else if (sp->n_sync && sp->n_decode) {
        b->stats.restore_steps++;
        b->stats.restore_ms += step_ms;
    }
    int k = 0;
    for (int i = 0; i < b->n; i++)
        if (!b->q[i]->done) b->q[k++] = b->q[i];
    b->n = k;
    if (sp->computed_any || !b->n) return 0;
    double now = engine_now_ms();
    for (int i = 0; i < b->n; i++)
        if (b->q[i]->waiting_kv && now - b->q[i]->a.t0 > LOAD_WAIT_MS) {
            mini_err("the asynchronous load of '%s' never finished\n", b->q[i]->a.req_id);
            return -1;
        }
    b->stats.polls++;
    sleep_ms(1); /* nothing to compute until a load lands: the next step polls again */
    return 0;
}

int batch_step(batch *b) {
    if (b->n == 0) return 0;
    connector *c = b->q[0]->e->conn;
    const int n_layers = model_config_of(b->q[0]->e->m)->n_layers;
    double t_start = engine_now_ms();
    step_plan sp = {0};
    sort_batch(b);
    schedule(b, c, &sp);
    if (c && (step_meta(b, c) != 0 || start_loads(b, c) != 0)) return -1;
    compute_restores(b, n_layers, &sp);
    if (forward(b, c) != 0 || results(b, &sp) != 0) return -1;
    return end_step(b, &sp, t_start);
}
