/* mode.c - one way of serving the workload, with its own engine (mode.h). */
#include "mode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "abi/kvstrata_lossy.h"
#include "abi/kvstrata_plans.h"

#define PROG "kvs-mini-engine"

/* --stages: the layout every engine of the run shares (set once the model exists), with the stage
 * threads' activations. */
stage_layout run_stages;

kvcache *make_cache(const options *o, const model *m, uint32_t blocks, uint32_t budget) {
    return make_cache_layers(o, m, stage_cache_layers(&run_stages), blocks, budget);
}

kvcache *make_cache_layers(const options *o, const model *m, uint32_t layers, uint32_t blocks,
                           uint32_t budget) {
    kvcache_params p = {.layout = o->layout,
                        .dtype = o->dtype,
                        .n_layers = layers,
                        .n_heads = model_cache_heads(m),
                        .head_dim = model_cache_width(m),
                        .n_blocks = blocks,
                        .block_budget = budget};
    char err[256];
    kvcache *kv = kvcache_create(&p, err, sizeof err);
    if (!kv) fprintf(stderr, PROG ": %s\n", err);
    return kv;
}

/* A fresh engine: pages, prefix cache, sessions and (with the connector) a new handle. */
int mode_begin(mode_run *run, const options *o, const model *m, const workload *w, const sizing *z,
               reference *ref) {
    engine *e = &run->e;
    *e = (engine){.m = m, .prefill_chunk = o->prefill_chunk, .stages = &run_stages};
    run->w = w;
    run->ref = run->use_connector ? ref : NULL;
    run->turns = calloc((size_t)w->n_turns, sizeof *run->turns);
    run->history = calloc((size_t)w->n_sessions, sizeof *run->history);
    run->n_history = calloc((size_t)w->n_sessions, sizeof *run->n_history);
    e->kv = make_cache(o, m, z->blocks, z->budget);
    e->s = model_scratch_create(m, o->prefill_chunk, (int)z->max_request);
    e->logits = malloc((size_t)model_config_of(m)->vocab * sizeof *e->logits);
    e->table = calloc(z->blocks, sizeof *e->table);
    e->tokens = malloc((size_t)z->max_request * sizeof *e->tokens);
    e->dropped = calloc(z->max_request, 1);
    e->dropped_cap = z->max_request;
    if (!run->turns || !run->history || !run->n_history || !e->kv || !e->s || !e->logits ||
        !e->table || !e->tokens || !e->dropped) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    for (int s = 0; s < w->n_sessions; s++) {
        int32_t *h = malloc((size_t)z->max_request * sizeof *h);
        if (!h) {
            fprintf(stderr, PROG ": out of memory\n");
            return -1;
        }
        run->history[s] = h;
        memcpy(h, w->system, (size_t)w->n_system * sizeof(int32_t));
        if (w->n_docs[s])
            memcpy(h + w->n_system, w->docs[s], (size_t)w->n_docs[s] * sizeof(int32_t));
        run->n_history[s] = (uint64_t)w->n_system + (uint64_t)w->n_docs[s];
    }
    if (run->use_connector) {
        /* the engine masks dropped tokens unless told to act as a stock engine (--no-mask), or
         * unless it restores pipeline stages: a stage recomputes its layers on a scratch of its own,
         * while the loads run, before load_dropped could tell it what to mask */
        int caps = o->restore_plans |
                   (o->no_mask || (o->restore_plans & KVS_PLAN_CAP_STAGE) ? 0 : KVS_PLAN_CAP_MASK);
        if (connector_open(&run->conn, o->lib_path, o->config_path, o->dtype, m, e->kv, caps,
                           &run_stages) != 0)
            return -1;
        e->conn = &run->conn;
    }
    int slots = o->batch > o->continuous ? o->batch : o->continuous;
    run->reqs = calloc((size_t)slots, sizeof *run->reqs);
    run->ids = calloc((size_t)slots, sizeof *run->ids);
    run->more = slots > 1 ? calloc((size_t)slots - 1, sizeof *run->more) : NULL;
    if (!run->reqs || !run->ids || (slots > 1 && !run->more)) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    run->n_more = slots - 1;
    for (int k = 0; k < run->n_more; k++) {
        engine *x = &run->more[k];
        /* a scratch of its own: requests in flight together keep their activations apart */
        *x = (engine){.m = m,
                      .kv = e->kv,
                      .conn = e->conn,
                      .prefill_chunk = e->prefill_chunk,
                      .stages = e->stages};
        x->s = model_scratch_create(m, o->prefill_chunk, (int)z->max_request);
        x->logits = malloc((size_t)model_config_of(m)->vocab * sizeof *x->logits);
        x->table = calloc(z->blocks, sizeof *x->table);
        x->tokens = malloc((size_t)z->max_request * sizeof *x->tokens);
        x->dropped = calloc(z->max_request, 1);
        x->dropped_cap = z->max_request;
        if (!x->s || !x->logits || !x->table || !x->tokens || !x->dropped) {
            fprintf(stderr, PROG ": out of memory\n");
            return -1;
        }
    }
    return 0;
}

static engine *slot_engine(mode_run *run, int slot) {
    return slot == 0 ? &run->e : &run->more[slot - 1];
}

static void print_turn(const mode_run *run, const options *o, const workload *w,
                       const turn_result *r) {
    if (o->quiet) return;
    printf("[%-12s] %-8s turn %-2d prompt %6llu  local %6llu  connector %6llu  ttft %8.2f ms%s\n",
           run->name, w->session_names[r->session], r->turn, (unsigned long long)r->prompt,
           (unsigned long long)r->local_hit, (unsigned long long)r->ext_hit, r->ttft_ms,
           r->error_blocks ? "  (load errors: recomputed)" : "");
    fflush(stdout);
}

/* Turn i arrives at t0 in slot `slot`: its prompt (the session's history plus the new user tokens)
 * into the slot's tokens, then admitted (prefix-cache match, lookup, allocation) into run->reqs[slot]. */
static int start_turn(mode_run *run, const workload *w, int i, int slot, double t0) {
    engine *e = slot_engine(run, slot);
    batch_req *q = &run->reqs[slot];
    const workload_turn *t = &w->turns[i];
    const int s = t->session;
    const uint64_t n_prompt = run->n_history[s] + (uint64_t)t->n_user;
    memcpy(e->tokens, run->history[s], run->n_history[s] * sizeof(int32_t));
    memcpy(e->tokens + run->n_history[s], t->user, (size_t)t->n_user * sizeof(int32_t));
    snprintf(run->ids[slot], sizeof run->ids[slot], "%.200s/turn%d", w->session_names[s], t->turn);
    *q = (batch_req){.e = e, .r = &run->turns[i], .tag = i};
    q->r->session = s;
    q->r->turn = t->turn;
    return engine_admit(e, run->ids[slot], n_prompt, t->output_tokens, t0, &q->a);
}

/* A turn is done: the session's history is now its prompt plus what was generated. */
static void end_turn(mode_run *run, const options *o, const workload *w, int slot) {
    const batch_req *q = &run->reqs[slot];
    const int s = q->r->session;
    run->n_history[s] = q->a.n_prompt + (uint64_t)q->a.n_out;
    memcpy(run->history[s], q->e->tokens, run->n_history[s] * sizeof(int32_t));
    print_turn(run, o, w, q->r);
}

/* --verify in the batch (ctx: the mode_run): the reference checks a request's prompt once its first
 * token exists. */
static int check_first_token(void *ctx, batch_req *q) {
    const mode_run *run = ctx;
    reference *ref = run->ref;
    ref->session = run->w->session_names[q->r->session];
    ref->turn = q->r->turn;
    return reference_check(ref, q->e, q->a.n_prompt, q->r);
}

/* Step the slots [0, n) (admitted, in flight) until every one of them has finished. */
static int drain(mode_run *run, const options *o, const workload *w, int n) {
    batch *b = &run->flight;
    b->on_first = run->ref ? check_first_token : NULL;
    b->ctx = run;
    for (int j = 0; j < n; j++)
        if (batch_add(b, &run->reqs[j]) != 0) return -1;
    int left = n;
    while (left) {
        if (batch_step(b) != 0) return -1;
        for (int j = 0; j < n; j++)
            if (run->reqs[j].done == 1) {
                run->reqs[j].done = 2; /* reported */
                end_turn(run, o, w, j);
                left--;
            }
    }
    return 0;
}

/* Serve turn i of the workload. */
int mode_turn(mode_run *run, const options *o, const workload *w, int i) {
    if (run->ref) {
        run->ref->session = w->session_names[w->turns[i].session];
        run->ref->turn = w->turns[i].turn;
    }
    if (start_turn(run, w, i, 0, engine_now_ms()) != 0) return -1;
    batch_req *q = &run->reqs[0];
    if (q->a.async) return drain(run, o, w, 1); /* its load runs between steps */
    if (engine_run(q->e, &q->a, q->r, run->ref ? reference_check : NULL, run->ref) != 0) return -1;
    end_turn(run, o, w, 0);
    return 0;
}

/* --batch: serve turns [i, i + n) (different sessions) together: admit each, restore their
 * prefixes in one step planned as a batch, then run each. TTFT counts from the group's arrival. When
 * the connector loads them asynchronously, each is scheduled as soon as its own load has landed
 * instead (batch.c): per-request completion. */
int mode_group(mode_run *run, const options *o, const workload *w, int i, int n) {
    engine *es[64];
    admitted as[64];
    const double t0 = engine_now_ms();
    int any_async = 0;
    for (int j = 0; j < n; j++) {
        if (start_turn(run, w, i + j, j, t0) != 0) return -1;
        es[j] = run->reqs[j].e;
        as[j] = run->reqs[j].a;
        any_async |= as[j].async;
    }
    if (any_async) return drain(run, o, w, n);
    if (run->e.conn && engine_restore_batch(es, as, n) != 0) return -1;
    for (int j = 0; j < n; j++) {
        batch_req *q = &run->reqs[j];
        if (run->ref) {
            run->ref->session = w->session_names[q->r->session];
            run->ref->turn = q->r->turn;
        }
        double checking = run->ref ? run->ref->check_ms : 0;
        if (engine_run(es[j], &as[j], q->r, run->ref ? reference_check : NULL, run->ref) != 0)
            return -1;
        /* --verify's reference runs inside the group: it is no one's waiting time */
        if (run->ref)
            for (int k = j + 1; k < n; k++) as[k].t0 += run->ref->check_ms - checking;
        q->a = as[j];
        end_turn(run, o, w, j);
    }
    return 0;
}

static void sleep_until(double due_ms) {
    double left = due_ms - engine_now_ms();
    if (left <= 0) return;
    struct timespec ts = {(time_t)(left / 1e3), (long)(fmod(left, 1e3) * 1e6)};
    nanosleep(&ts, NULL);
}

int mode_continuous(mode_run *run, const options *o, const workload *w) {
    batch *b = &run->flight;
    b->on_first = run->ref ? check_first_token : NULL;
    b->ctx = run;
    const int slots = o->continuous;
    int *busy = calloc((size_t)slots, sizeof *busy);
    if (!busy) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    int next = 0, rc = -1;
    const double begin = engine_now_ms();
    while (next < w->n_turns || b->n) {
        /* arrivals: the next turn, once it is due, a slot is free and its session has no turn in
         * flight; with --arrival-ms it counts as arrived when it was due */
        while (next < w->n_turns && b->n < slots) {
            int slot = 0, taken = 0;
            double due = begin + (double)next * o->arrival_ms, now = engine_now_ms();
            if (o->arrival_ms && now < due) {
                if (b->n) break;
                sleep_until(due); /* nothing in flight: the engine idles until it arrives */
                now = engine_now_ms();
            }
            for (int k = 0; k < slots; k++)
                taken |= busy[k] && run->reqs[k].r->session == w->turns[next].session;
            if (taken) break;
            while (busy[slot]) slot++;
            if (start_turn(run, w, next, slot, o->arrival_ms ? due : now) != 0 ||
                batch_add(b, &run->reqs[slot]) != 0)
                goto out;
            busy[slot] = 1;
            next++;
        }
        if (b->n && batch_step(b) != 0) goto out;
        for (int k = 0; k < slots; k++)
            if (busy[k] && run->reqs[k].done) {
                busy[k] = 0;
                end_turn(run, o, w, k);
            }
    }
    rc = 0;
out:
    free(busy);
    return rc;
}

/* How many turns from i on form the next group: at most --batch, all of different sessions. */
int group_size(const options *o, const workload *w, int i) {
    int n = 1;
    while (n < o->batch && n < 64 && i + n < w->n_turns) {
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= w->turns[i + j].session == w->turns[i + n].session;
        if (dup) break;
        n++;
    }
    return n;
}

/* Collect the counters. */
int mode_collect(mode_run *run) {
    if (run->e.conn) {
        if (connector_stats(&run->conn, &run->stats) != 0) return -1;
        run->have_stats = 1;
        run->events_stored = run->conn.events_stored;
        run->events_removed = run->conn.events_removed;
    }
    if (run->e.kv) run->cache = kvcache_get_stats(run->e.kv);
    return 0;
}

void mode_end(mode_run *run, const workload *w) {
    connector_close(&run->conn);
    batch_stats_free(&run->flight.stats);
    for (int s = 0; run->history && s < w->n_sessions; s++) free(run->history[s]);
    free(run->history);
    free(run->n_history);
    for (int k = 0; k < run->n_more; k++) {
        model_scratch_free(run->more[k].s);
        free(run->more[k].logits);
        free(run->more[k].table);
        free(run->more[k].tokens);
        free(run->more[k].dropped);
    }
    free(run->more);
    free(run->reqs);
    free(run->ids);
    run->reqs = NULL;
    run->ids = NULL;
    run->more = NULL;
    run->n_more = 0;
    kvcache_destroy(run->e.kv);
    model_scratch_free(run->e.s);
    free(run->e.dropped);
    free(run->e.logits);
    free(run->e.table);
    free(run->e.tokens);
    free(run->turns);
    run->history = NULL;
    run->n_history = NULL;
    run->turns = NULL;
    memset(&run->e, 0, sizeof run->e);
}
