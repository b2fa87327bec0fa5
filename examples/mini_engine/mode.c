/* mode.c - one way of serving the workload, with its own engine (mode.h). */
#include "mode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "kvs-mini-engine"

/* --stages: the layout every engine of the run shares (set once the model exists), with the stage
 * threads' activations. */
stage_layout run_stages;

kvcache *make_cache(const options *o, const model *m, uint32_t blocks, uint32_t budget) {
    kvcache_params p = {.layout = o->layout,
                        .dtype = o->dtype,
                        .n_layers = stage_cache_layers(&run_stages),
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
    run->ref = run->use_connector ? ref : NULL;
    run->turns = calloc((size_t)w->n_turns, sizeof *run->turns);
    run->history = calloc((size_t)w->n_sessions, sizeof *run->history);
    run->n_history = calloc((size_t)w->n_sessions, sizeof *run->n_history);
    e->kv = make_cache(o, m, z->blocks, z->budget);
    e->s = model_scratch_create(m, o->prefill_chunk, (int)z->max_request);
    e->logits = malloc((size_t)model_config_of(m)->vocab * sizeof *e->logits);
    e->table = calloc(z->blocks, sizeof *e->table);
    e->tokens = malloc((size_t)z->max_request * sizeof *e->tokens);
    if (!run->turns || !run->history || !run->n_history || !e->kv || !e->s || !e->logits ||
        !e->table || !e->tokens) {
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
        if (connector_open(&run->conn, o->lib_path, o->config_path, o->dtype, m, e->kv,
                           o->restore_plans, &run_stages) != 0)
            return -1;
        e->conn = &run->conn;
    }
    if (o->batch > 1) {
        run->more = calloc((size_t)o->batch - 1, sizeof *run->more);
        if (!run->more) {
            fprintf(stderr, PROG ": out of memory\n");
            return -1;
        }
        run->n_more = o->batch - 1;
        for (int k = 0; k < run->n_more; k++) {
            engine *x = &run->more[k];
            *x = (engine){.m = m,
                          .s = e->s,
                          .kv = e->kv,
                          .conn = e->conn,
                          .prefill_chunk = e->prefill_chunk,
                          .stages = e->stages};
            x->logits = malloc((size_t)model_config_of(m)->vocab * sizeof *x->logits);
            x->table = calloc(z->blocks, sizeof *x->table);
            x->tokens = malloc((size_t)z->max_request * sizeof *x->tokens);
            if (!x->logits || !x->table || !x->tokens) {
                fprintf(stderr, PROG ": out of memory\n");
                return -1;
            }
        }
    }
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

/* Serve turn i of the workload: the prompt is the session's history plus the new user tokens. */
int mode_turn(mode_run *run, const options *o, const workload *w, int i) {
    engine *e = &run->e;
    const workload_turn *t = &w->turns[i];
    const int s = t->session;
    const uint64_t n_prompt = run->n_history[s] + (uint64_t)t->n_user;
    memcpy(e->tokens, run->history[s], run->n_history[s] * sizeof(int32_t));
    memcpy(e->tokens + run->n_history[s], t->user, (size_t)t->n_user * sizeof(int32_t));
    char req_id[256];
    snprintf(req_id, sizeof req_id, "%.200s/turn%d", w->session_names[s], t->turn);
    turn_result *r = &run->turns[i];
    r->session = s;
    r->turn = t->turn;
    if (run->ref) {
        run->ref->session = w->session_names[s];
        run->ref->turn = t->turn;
    }
    if (engine_serve(e, req_id, n_prompt, t->output_tokens, r, run->ref ? reference_check : NULL,
                     run->ref) != 0)
        return -1;
    /* The session's history is now the prompt plus what was generated. */
    run->n_history[s] = n_prompt + (uint64_t)t->output_tokens;
    memcpy(run->history[s], e->tokens, run->n_history[s] * sizeof(int32_t));
    print_turn(run, o, w, r);
    return 0;
}

/* --batch: serve turns [i, i + n) (different sessions) together: admit each, restore their
 * prefixes in one step planned as a batch, then run each. TTFT counts from the group's arrival. */
int mode_group(mode_run *run, const options *o, const workload *w, int i, int n) {
    engine *es[64];
    admitted as[64];
    char ids[64][256];
    const double t0 = engine_now_ms();
    for (int j = 0; j < n; j++) {
        engine *e = j == 0 ? &run->e : &run->more[j - 1];
        const workload_turn *t = &w->turns[i + j];
        const int s = t->session;
        const uint64_t n_prompt = run->n_history[s] + (uint64_t)t->n_user;
        memcpy(e->tokens, run->history[s], run->n_history[s] * sizeof(int32_t));
        memcpy(e->tokens + run->n_history[s], t->user, (size_t)t->n_user * sizeof(int32_t));
        snprintf(ids[j], sizeof ids[j], "%.200s/turn%d", w->session_names[s], t->turn);
        es[j] = e;
        if (engine_admit(e, ids[j], n_prompt, t->output_tokens, t0, &as[j]) != 0) return -1;
    }
    if (run->e.conn && engine_restore_batch(es, as, n) != 0) return -1;
    for (int j = 0; j < n; j++) {
        const workload_turn *t = &w->turns[i + j];
        const int s = t->session;
        turn_result *r = &run->turns[i + j];
        r->session = s;
        r->turn = t->turn;
        if (run->ref) {
            run->ref->session = w->session_names[s];
            run->ref->turn = t->turn;
        }
        double checking = run->ref ? run->ref->check_ms : 0;
        if (engine_run(es[j], &as[j], r, run->ref ? reference_check : NULL, run->ref) != 0)
            return -1;
        /* --verify's reference runs inside the group: it is no one's waiting time */
        if (run->ref)
            for (int k = j + 1; k < n; k++) as[k].t0 += run->ref->check_ms - checking;
        run->n_history[s] = as[j].n_prompt + (uint64_t)t->output_tokens;
        memcpy(run->history[s], es[j]->tokens, run->n_history[s] * sizeof(int32_t));
        print_turn(run, o, w, r);
    }
    return 0;
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
    for (int s = 0; run->history && s < w->n_sessions; s++) free(run->history[s]);
    free(run->history);
    free(run->n_history);
    for (int k = 0; k < run->n_more; k++) {
        free(run->more[k].logits);
        free(run->more[k].table);
        free(run->more[k].tokens);
    }
    free(run->more);
    run->more = NULL;
    run->n_more = 0;
    kvcache_destroy(run->e.kv);
    model_scratch_free(run->e.s);
    free(run->e.logits);
    free(run->e.table);
    free(run->e.tokens);
    free(run->turns);
    run->history = NULL;
    run->n_history = NULL;
    run->turns = NULL;
    memset(&run->e, 0, sizeof run->e);
}
