/* mode.c - one way of serving the workload, with its own engine (mode.h). */
#include "mode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_lossy.h"

kvcache *make_cache(const options *o, const model *m, uint32_t layers, uint32_t blocks,
                    uint32_t budget) {
    kvcache_params p = {.layout = (kv_layout)o->layout,
                        .dtype = (kvs_dtype)o->dtype,
                        .n_layers = layers ? layers : (uint32_t)model_config_of(m)->n_layers,
                        .n_heads = model_cache_heads(m),
                        .head_dim = model_cache_width(m),
                        .n_blocks = blocks,
                        .block_budget = budget};
    char err[256];
    kvcache *kv = kvcache_create(&p, err, sizeof err);
    if (!kv) mini_err("%s\n", err);
    return kv;
}

/* Every session starts with the shared system prompt and its document. */
static int begin_sessions(mode_run *run, const workload *w, const sizing *z) {
    for (int s = 0; s < w->n_sessions; s++) {
        int32_t *h = malloc((size_t)z->max_request * sizeof *h);
        if (!h) {
            mini_err("out of memory\n");
            return -1;
        }
        run->history[s] = h;
        memcpy(h, w->system, (size_t)w->n_system * sizeof(int32_t));
        if (w->n_docs[s])
            memcpy(h + w->n_system, w->docs[s], (size_t)w->n_docs[s] * sizeof(int32_t));
        run->n_history[s] = (uint64_t)w->n_system + (uint64_t)w->n_docs[s];
    }
    return 0;
}

int mode_begin(mode_run *run, const options *o, const model *m, const workload *w, const sizing *z,
               reference *ref, const mode_setup *x) {
    engine *e = &run->e;
    *e = (engine){.m = m, .prefill_chunk = o->prefill_chunk, .ext = x ? x->ext : NULL};
    run->w = w;
    run->ref = run->use_connector ? ref : NULL;
    run->turns = calloc((size_t)w->n_turns, sizeof *run->turns);
    run->history = calloc((size_t)w->n_sessions, sizeof *run->history);
    run->n_history = calloc((size_t)w->n_sessions, sizeof *run->n_history);
    e->kv = make_cache(o, m, x ? x->cache_layers : 0, z->blocks, z->budget);
    e->s = model_scratch_create(m, o->prefill_chunk, (int)z->max_request);
    e->logits = malloc((size_t)model_config_of(m)->vocab * sizeof *e->logits);
    e->table = calloc(z->blocks, sizeof *e->table);
    e->tokens = malloc((size_t)z->max_request * sizeof *e->tokens);
    e->dropped = calloc(z->max_request, 1);
    e->dropped_cap = z->max_request;
    if (!run->turns || !run->history || !run->n_history || !e->kv || !e->s || !e->logits ||
        !e->table || !e->tokens || !e->dropped) {
        mini_err("out of memory\n");
        return -1;
    }
    if (begin_sessions(run, w, z) != 0) return -1;
    if (!run->use_connector) return 0;
    /* the engine masks dropped tokens unless told to act as a stock engine (--no-mask) */
    int mask = o->no_mask || (x && x->no_mask) ? 0 : KVS_PLAN_CAP_MASK;
    if (connector_open(&run->conn, o->lib_path, o->config_path, (kvs_dtype)o->dtype, m, e->kv,
                       (x ? x->plan_caps : 0) | mask, x ? x->stages : NULL) != 0)
        return -1;
    e->conn = &run->conn;
    return 0;
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

int mode_admit(mode_run *run, const workload *w, int i, engine *e, char *id, double t0,
               admitted *a) {
    const workload_turn *t = &w->turns[i];
    const int s = t->session;
    const uint64_t n_prompt = run->n_history[s] + (uint64_t)t->n_user;
    memcpy(e->tokens, run->history[s], run->n_history[s] * sizeof(int32_t));
    memcpy(e->tokens + run->n_history[s], t->user, (size_t)t->n_user * sizeof(int32_t));
    snprintf(id, 256, "%.200s/turn%d", w->session_names[s], t->turn);
    run->turns[i].session = s;
    run->turns[i].turn = t->turn;
    return engine_admit(e, id, n_prompt, t->output_tokens, t0, a);
}

void mode_turn_done(mode_run *run, const options *o, const workload *w, const engine *e,
                    const admitted *a, const turn_result *r) {
    const int s = r->session;
    run->n_history[s] = a->n_prompt + (uint64_t)a->n_out;
    memcpy(run->history[s], e->tokens, run->n_history[s] * sizeof(int32_t));
    print_turn(run, o, w, r);
}

int mode_turn(mode_run *run, const options *o, const workload *w, int i) {
    if (run->ref) {
        run->ref->session = w->session_names[w->turns[i].session];
        run->ref->turn = w->turns[i].turn;
    }
    admitted a;
    if (mode_admit(run, w, i, &run->e, run->req_id, engine_now_ms(), &a) != 0) return -1;
    if (a.async) { /* its load runs between steps, while others step: a batch's work */
        mini_err("'%s': the connector loads it asynchronously (loads.async): kvs-mini-research "
                 "serves such requests\n",
                 a.req_id);
        kvcache_release(run->e.kv, run->e.table, a.n_blocks, run->e.tokens, 0);
        return -1;
    }
    turn_result *r = &run->turns[i];
    if (engine_run(&run->e, &a, r, run->ref ? reference_check : NULL, run->ref) != 0) return -1;
    mode_turn_done(run, o, w, &run->e, &a, r);
    return 0;
}

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
    for (int s = 0; run->history && s < w->n_sessions; s++) free(run->history[s]);
    free(run->history);
    free(run->n_history);
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
