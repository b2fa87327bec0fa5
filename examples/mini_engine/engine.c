/* engine.c - serving one request at a time: the engine prefix cache, the block table, prefill and
 * decode steps, and around them every KV-connector hook of libkvstrata in the order vLLM calls it. */
#include "engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "abi/kvstrata_lossy.h"
#include "abi/kvstrata_plans.h"

#define PROG                "kvs-mini-engine"
#define MAX_STEP_RETRIES    8     /* load-error recomputes per request before giving up */
#define LOOKUP_POLL_LIMIT   5000  /* "unknown yet" lookups (1 ms apart) before treating as a miss */
#define FINISHED_POLL_LIMIT 60000 /* get_finished polls (1 ms apart) for async saves */

double engine_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct step_io {
    const char *req_id;
    uint64_t n_tokens;   /* tokens known so far */
    uint64_t n_blocks;   /* the request's whole block table */
    uint64_t n_computed; /* tokens whose KV is in the pages before this step */
    int n_scheduled;
    uint64_t first_bad; /* out: first token of the first block whose load failed */
} step_io;

/* The connector's side of a restore: issue the step's loads and land every layer, the stage
 * boundaries first (each stage's thread starts once its boundary has landed: `ready` counts the
 * boundaries landed, in stage order). */
typedef struct load_job {
    connector *c;
    const stage_layout *sl; /* NULL: no boundaries to land first */
    int n_layers;           /* registered layers */
    const char *failed_hook;
    kvs_status st;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready;
} load_job;

static void job_ready(load_job *j, int ready) {
    pthread_mutex_lock(&j->mu);
    j->ready = ready;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void *load_all_layers(void *arg) {
    load_job *j = arg;
    j->st = j->c->api->start_load(j->c->h);
    j->failed_hook = "start_load";
    int stages = j->sl ? j->sl->n_stages : 1;
    for (int s = 1; j->st == KVS_OK && s < stages; s++) {
        for (int b = 0; j->st == KVS_OK && b < j->sl->boundary_layers; b++)
            j->st = j->c->api->wait_layer_load(
                j->c->h, (uint32_t)(j->sl->model_layers + (s - 1) * j->sl->boundary_layers + b));
        j->failed_hook = "wait_layer_load";
        job_ready(j, s);
    }
    for (int l = 0; j->st == KVS_OK && l < j->n_layers; l++) {
        j->st = j->c->api->wait_layer_load(j->c->h, (uint32_t)l);
        j->failed_hook = "wait_layer_load";
    }
    job_ready(j, stages); /* on failure too: no stage thread waits for ever */
    return NULL;
}

/* Before the forward runs model layer l over n tokens at pos0: if a stage starts there, keep the
 * tokens' hidden states as its boundary. */
void engine_capture_boundary(engine *e, model_scratch *s, int l, uint64_t pos0, int n) {
    int stage = e->stages && e->stages->n_stages > 1 ? stage_starting_at(e->stages, l) : 0;
    if (stage)
        stage_boundary_write(e->stages, e->kv, stage, model_config_of(e->m)->dim, e->table, pos0, n,
                             model_scratch_hidden(s));
}

/* Compute tokens [first, first + n) through layers [from, to), in prefill-sized pieces, with the
 * activations in scr: from the embeddings when from is 0, else from the boundary of the stage that
 * starts at `from`. capture: store the boundaries the pieces cross (a restore that computes only some
 * layers leaves them to the loads). */
void engine_compute_layers(engine *e, model_scratch *scr, uint64_t first, uint64_t n, int from,
                           int to, int capture) {
    int stage = from ? stage_starting_at(e->stages, from) : 0, dim = model_config_of(e->m)->dim;
    for (uint64_t done = 0; done < n;) {
        int piece = n - done < (uint64_t)e->prefill_chunk ? (int)(n - done) : e->prefill_chunk;
        uint64_t pos = first + done;
        if (stage)
            stage_boundary_read(e->stages, e->kv, stage, dim, e->table, pos, piece,
                                model_scratch_hidden(scr));
        else
            model_embed(e->m, scr, e->tokens + pos, piece);
        for (int l = from; l < to; l++) {
            if (capture) engine_capture_boundary(e, scr, l, pos, piece);
            model_layer(e->m, scr, e->kv, (uint32_t)l, e->table, pos, piece);
        }
        done += (uint64_t)piece;
    }
}

/* Stage s's part of the stage plans of a restore: for every request whose plan gives stage s layers,
 * wait for its boundary (stage 0: the embeddings), then compute those layers over the request's range,
 * with the stage's own activations. */
typedef struct stage_work {
    int stage;
    engine **es;
    const int *idx;
    const kvs_restore_plan *plans;
    int m;
    load_job *job;
} stage_work;

static void *run_stage(void *arg) {
    stage_work *w = arg;
    const stage_layout *sl = w->es[0]->stages;
    int s = w->stage;
    model_scratch *scr = s == 0 ? w->es[0]->s : sl->scratch[s];
    if (s > 0) {
        pthread_mutex_lock(&w->job->mu);
        while (w->job->ready < s) pthread_cond_wait(&w->job->cv, &w->job->mu);
        pthread_mutex_unlock(&w->job->mu);
        if (w->job->st != KVS_OK) return NULL; /* the restore failed: the step reports it */
    }
    for (int j = 0; j < w->m; j++) {
        const kvs_restore_plan *p = &w->plans[j];
        if (p->mode != KVS_PLAN_STAGE || p->stage_recompute_layers[s] == 0) continue;
        engine_compute_layers(w->es[w->idx[j]], scr, p->first_token, p->recompute_tokens,
                              sl->first[s], sl->first[s] + (int)p->stage_recompute_layers[s], 0);
    }
    return NULL;
}

/* The positions of request j's range that its loads of this step left out (chunks stored with
 * tokens dropped): marked in its engine's mask, which its scratch's attention then skips for the
 * rest of the request. Called once the loads are issued and no other thread calls the handle. */
static int note_dropped(engine **es, admitted *as, const int *idx, int m) {
    connector *c = es[0]->conn;
    for (int j = 0; j < m; j++) {
        engine *e = es[idx[j]];
        const admitted *a = &as[idx[j]];
        if (!e->dropped) continue; /* an engine without a mask never says it masks */
        uint64_t n = 0;
        HOOK(c, c->api->load_dropped(c->h, a->req_id, 0, e->dropped_cap, e->dropped, &n),
             "load_dropped");
        c->dropped_tokens += n;
        if (n) model_scratch_drop(e->s, e->dropped);
    }
    return 0;
}

/* Start the step's loads. Where a restore plan leaves part of a request's range to the engine (the
 * connector left the front of the range, or its lower layers, out of the loads), recompute that part
 * here while a second thread runs the loads: the only connector calls in that window are the
 * loader's, so calls on the handle stay serialised. Positions before the front are already in the
 * pages and the front never attends to the loaded back; layer j's K/V of a token depends only on
 * layers below j, so the loaded upper layers are never an input to what is recomputed. Either way the
 * two touch different bytes and the result is the same bits as loading everything. es[idx[j]] is the
 * engine (pages, tokens) of the j-th of m requests, as[idx[j]] its admission. */
int engine_restore_plans(engine **es, admitted *as, const int *idx, int m) {
    connector *c = es[0]->conn;
    kvs_restore_plan *plans = calloc((size_t)m, sizeof *plans);
    if (!plans) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    int any = 0;
    for (int j = 0; j < m; j++) {
        plans[j].struct_size = sizeof plans[j];
        kvs_status ps = c->plans ? c->api->plan(c->h, as[idx[j]].req_id, &plans[j]) : KVS_ENOTFOUND;
        if (ps != KVS_OK &&
            ps != KVS_ENOTFOUND) { /* the loads may lack what the plan gives us: never guess */
            free(plans);
            return connector_hook_failed(c, "plan", ps);
        }
        if (ps != KVS_OK) plans[j].recompute_tokens = 0;
        any |= plans[j].recompute_tokens > 0;
    }
    if (!any) {
        free(plans);
        HOOK(c, c->api->start_load(c->h), "start_load");
        return note_dropped(es, as, idx, m);
    }
    stage_layout *sl = es[0]->stages && es[0]->stages->n_stages > 1 ? es[0]->stages : NULL;
    const int model_layers = model_config_of(es[0]->m)->n_layers;
    load_job job = {.c = c, .sl = sl, .n_layers = sl ? (int)stage_cache_layers(sl) : model_layers};
    pthread_mutex_init(&job.mu, NULL);
    pthread_cond_init(&job.cv, NULL);
    pthread_t loader, stage_threads[KVS_MAX_STAGES];
    int stage_rc[KVS_MAX_STAGES];
    stage_work works[KVS_MAX_STAGES];
    int rc = pthread_create(&loader, NULL, load_all_layers, &job);
    if (rc != 0) /* no thread: load first, then recompute */
        load_all_layers(&job);
    for (int s = 1; sl && s < sl->n_stages;
         s++) { /* stages 1..: a thread each; stage 0: this one */
        works[s] =
            (stage_work){.stage = s, .es = es, .idx = idx, .plans = plans, .m = m, .job = &job};
        stage_rc[s] = pthread_create(&stage_threads[s], NULL, run_stage, &works[s]);
    }
    for (int j = 0; j < m; j++) {
        const kvs_restore_plan *p = &plans[j];
        if (p->recompute_tokens == 0) continue;
        int layers = model_layers;
        c->plan_recomputed_tokens += p->recompute_tokens;
        if (p->mode == KVS_PLAN_STAGE) {
            c->plans_stage++;
            for (uint32_t st = 1; st < p->n_stages && st < KVS_MAX_STAGES; st++)
                c->stage_boundary_restores += p->stage_recompute_layers[st] > 0;
            continue; /* below, and on the stage threads */
        }
        if (p->mode == KVS_PLAN_RECOMPUTE)
            c->plans_recompute++;
        else if (p->mode == KVS_PLAN_LAYER)
            c->plans_layer++, layers = (int)p->recompute_layers;
        else
            c->plans_token++;
        engine_compute_layers(es[idx[j]], es[idx[j]]->s, p->first_token, p->recompute_tokens, 0,
                              layers, layers == model_layers);
    }
    if (sl) {
        works[0] =
            (stage_work){.stage = 0, .es = es, .idx = idx, .plans = plans, .m = m, .job = &job};
        run_stage(&works[0]);
        for (int s = 1; s < sl->n_stages; s++)
            if (stage_rc[s] == 0)
                pthread_join(stage_threads[s], NULL);
            else /* no thread: this one runs the stage once its boundary has landed */
                run_stage(&works[s]);
    }
    if (rc == 0) pthread_join(loader, NULL);
    pthread_mutex_destroy(&job.mu);
    pthread_cond_destroy(&job.cv);
    free(plans);
    if (job.st != KVS_OK) return connector_hook_failed(c, job.failed_hook, job.st);
    return note_dropped(es, as, idx, m);
}

void engine_undrop_from(engine *e, uint64_t first) {
    if (e->dropped && first < e->dropped_cap) memset(e->dropped + first, 0, e->dropped_cap - first);
}

static int restore_step(engine *e, const char *req_id) {
    admitted a = {.req_id = req_id};
    int zero = 0;
    return engine_restore_plans(&e, &a, &zero, 1);
}

/* One engine step for one request: the connector's per-step hooks around a forward pass of
 * n_scheduled tokens. Returns 0; the number of blocks whose load failed (the step's results are
 * void and io->first_bad says where to recompute from); or -1 on error. */
static int engine_step(engine *e, step_io *io) {
    connector *c = e->conn;
    const int n_layers = model_config_of(e->m)->n_layers;
    if (c) {
        kvs_step_request r = {.req_id = io->req_id,
                              .tokens = e->tokens,
                              .n_tokens = io->n_tokens,
                              .block_ids = e->table,
                              .n_block_ids = io->n_blocks,
                              .n_computed = io->n_computed,
                              .n_scheduled = (uint64_t)io->n_scheduled};
        if (connector_step_meta(c, &r, 1) != 0 || restore_step(e, io->req_id) != 0) return -1;
    }
    model_embed(e->m, e->s, e->tokens + io->n_computed, io->n_scheduled);
    for (int l = 0; l < n_layers; l++) {
        if (c) HOOK(c, c->api->wait_layer_load(c->h, (uint32_t)l), "wait_layer_load");
        engine_capture_boundary(e, e->s, l, io->n_computed, io->n_scheduled);
        model_layer(e->m, e->s, e->kv, (uint32_t)l, e->table, io->n_computed, io->n_scheduled);
        if (c) HOOK(c, c->api->save_layer(c->h, (uint32_t)l), "save_layer");
    }
    if (!c) return 0;
    /* the boundaries were written before their stage's first layer: save them with the KV */
    for (uint32_t l = (uint32_t)n_layers; e->stages && l < stage_cache_layers(e->stages); l++)
        HOOK(c, c->api->save_layer(c->h, l), "save_layer");
    HOOK(c, c->api->wait_save(c->h), "wait_save");
    /* vLLM's order: get_finished, then load_error_blocks (which also lists the failed blocks of
     * asynchronous loads get_finished reported). One request at a time: nothing waits on either. */
    int sending, receiving;
    if (connector_poll_finished(c, io->req_id, &sending, &receiving) != 0) return -1;
    uint64_t n_bad = 0;
    HOOK(c, c->api->load_error_blocks(c->h, c->errors, c->errors_cap, &n_bad), "load_error_blocks");
    if (n_bad == 0) return 0;
    /* Recompute from the first failed block: everything computed after it read garbage. */
    uint64_t first = UINT64_MAX;
    for (uint64_t i = 0; i < n_bad; i++) {
        uint64_t b = 0;
        while (b < io->n_blocks && e->table[b] != c->errors[i]) b++;
        if (b == io->n_blocks) {
            fprintf(stderr,
                    PROG
                    ": load_error_blocks reported block %u, which request '%s' does not hold\n",
                    c->errors[i], io->req_id);
            return -1;
        }
        if (b * KV_BLOCK_TOKENS < first) first = b * KV_BLOCK_TOKENS;
    }
    io->first_bad = first;
    return (int)n_bad;
}

/* Ask the connector how much of the prompt it can load beyond the n_local tokens the engine has. */
static int connector_lookup(connector *c, const char *req_id, const int32_t *tokens, uint64_t n,
                            uint64_t n_local, kvs_lookup_result *res) {
    for (int tries = 0;; tries++) {
        memset(res, 0, sizeof *res);
        res->struct_size = sizeof *res;
        HOOK(c, c->api->lookup(c->h, req_id, tokens, n, n_local, res), "lookup");
        if (!res->unknown_yet) break;
        if (tries == LOOKUP_POLL_LIMIT) { /* still unknown: schedule it as a miss */
            res->n_hit_tokens = 0;
            res->load_async = 0;
            break;
        }
        sleep_ms(1); /* stands for the next scheduler step */
    }
    if (n_local + res->n_hit_tokens >= n) {
        fprintf(stderr,
                PROG ": lookup for '%s' offered %llu tokens beyond %llu of a %llu-token prompt: "
                     "the last token "
                     "must be left to compute\n",
                req_id, (unsigned long long)res->n_hit_tokens, (unsigned long long)n_local,
                (unsigned long long)n);
        return -1;
    }
    return 0;
}

/* Admit one turn: prefix-cache match, lookup, allocation. e->tokens holds the prompt. A load the
 * connector runs asynchronously is only armed here (a->async): batch.c serves such requests. */
int engine_admit(engine *e, const char *req_id, uint64_t n_prompt, int n_out, double t0,
                 admitted *a) {
    connector *c = e->conn;
    *a = (admitted){.req_id = req_id, .n_prompt = n_prompt, .n_out = n_out, .t0 = t0};

    /* A new request: no position is dropped yet. */
    if (e->dropped) memset(e->dropped, 0, e->dropped_cap);
    model_scratch_drop(e->s, NULL);

    /* 1. Local hits: full blocks from the engine's own prefix cache. */
    uint32_t n_local_blocks = kvcache_match_prefix(e->kv, e->tokens, n_prompt, e->table);
    a->n_local = (uint64_t)n_local_blocks * KV_BLOCK_TOKENS;

    /* 2. External hits from the connector. */
    kvs_lookup_result lr = {.struct_size = sizeof lr};
    if (c && connector_lookup(c, req_id, e->tokens, n_prompt, a->n_local, &lr) != 0) return -1;
    a->n_ext = lr.n_hit_tokens;
    a->n_lossy = lr.n_lossy_tokens;

    /* 3. Pages for the whole request: the prompt and every output but the last get KV. */
    a->kv_tokens = n_prompt + (uint64_t)n_out - 1;
    a->n_blocks = (uint32_t)((a->kv_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    if (kvcache_alloc(e->kv, a->n_blocks - n_local_blocks, e->table + n_local_blocks) != 0) {
        fprintf(stderr,
                PROG ": '%s' needs %u pages but the block budget leaves %u: raise --block-budget\n",
                req_id, a->n_blocks - n_local_blocks, kvcache_available(e->kv));
        kvcache_release(e->kv, e->table, n_local_blocks, e->tokens, 0);
        return -1;
    }
    if (c) HOOK(c, c->api->on_alloc(c->h, req_id, e->table, a->n_blocks, a->n_ext), "on_alloc");

    a->computed = a->n_local + a->n_ext;
    a->async = c && a->n_ext && lr.load_async;
    return 0;
}

/* Restore the external ranges of n admitted requests in one step of their own (nothing scheduled
 * besides): one build_meta over all of them, so the connector plans the batch, then the loads on a
 * loader thread while this thread recomputes what each request's plan leaves to the engine. */
int engine_restore_batch(engine **es, admitted *as, int n) {
    connector *c = es[0]->conn;
    kvs_step_request *rs = calloc((size_t)n, sizeof *rs);
    int *idx = calloc((size_t)n, sizeof *idx);
    int m = 0, rc = -1;
    if (!rs || !idx) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (as[i].restored || as[i].n_ext == 0) continue;
        rs[m] = (kvs_step_request){.req_id = as[i].req_id,
                                   .tokens = es[i]->tokens,
                                   .n_tokens = as[i].n_prompt,
                                   .block_ids = es[i]->table,
                                   .n_block_ids = as[i].n_blocks,
                                   .n_computed = as[i].computed,
                                   .n_scheduled = 0};
        idx[m++] = i;
    }
    if (m == 0) {
        rc = 0;
        goto out;
    }
    if (connector_step_meta(c, rs, (uint64_t)m) != 0 || engine_restore_plans(es, as, idx, m) != 0)
        goto out;
    kvs_status st;
    uint64_t n_bad = 0;
    int sending, receiving; /* vLLM's order: get_finished, then load_error_blocks */
    if ((st = c->api->wait_save(c->h)) != KVS_OK) {
        connector_hook_failed(c, "wait_save", st);
        goto out;
    }
    if (connector_poll_finished(c, as[idx[0]].req_id, &sending, &receiving) != 0) goto out;
    if ((st = c->api->load_error_blocks(c->h, c->errors, c->errors_cap, &n_bad)) != KVS_OK) {
        connector_hook_failed(c, "load_error_blocks", st);
        goto out;
    }
    for (uint64_t k = 0; k < n_bad; k++) /* recompute each owner from its first failed block */
        for (int j = 0; j < m; j++) {
            admitted *a = &as[idx[j]];
            for (uint32_t b = 0; b < a->n_blocks; b++) {
                uint64_t first = (uint64_t)b * KV_BLOCK_TOKENS;
                if (es[idx[j]]->table[b] == c->errors[k] && first < a->computed) {
                    a->computed = first < a->n_local ? a->n_local : first;
                    engine_undrop_from(es[idx[j]], a->computed);
                    a->error_blocks++;
                }
            }
        }
    for (int j = 0; j < m; j++) as[idx[j]].restored = 1;
    rc = 0;
out:
    free(rs);
    free(idx);
    return rc;
}

/* Steps until n_out tokens exist (prefill chunks, then one token per step), then finish. TTFT counts
 * from a->t0. on_prefill (may be NULL) runs once the first token's logits exist, outside the TTFT. */
int engine_run(engine *e, admitted *a, turn_result *r, prefill_done_fn on_prefill, void *ctx) {
    connector *c = e->conn;
    const char *req_id = a->req_id;
    uint64_t computed = a->computed;

    /* 4./5. */
    r->prompt = a->n_prompt;
    r->local_hit = a->n_local;
    r->ext_hit = a->n_ext;
    r->lossy_hit = a->n_lossy;
    r->error_blocks = a->error_blocks;
    uint64_t n_known = a->n_prompt;
    int produced = 0, retries = 0;
    while (produced < a->n_out) {
        uint64_t left = n_known - computed;
        int n = left < (uint64_t)e->prefill_chunk ? (int)left : e->prefill_chunk;
        step_io io = {.req_id = req_id,
                      .n_tokens = n_known,
                      .n_blocks = a->n_blocks,
                      .n_computed = computed,
                      .n_scheduled = n};
        int rc = engine_step(e, &io);
        if (rc < 0) return -1;
        if (rc > 0) {
            r->error_blocks += (uint64_t)rc;
            if (++retries > MAX_STEP_RETRIES) {
                fprintf(stderr, PROG ": '%s': loads kept failing after %d recomputes\n", req_id,
                        retries - 1);
                return -1;
            }
            if (io.first_bad < computed) computed = io.first_bad;
            engine_undrop_from(e, computed);
            continue; /* discard this step: nothing it computed is used */
        }
        computed += (uint64_t)n;
        if (computed < n_known) continue;
        model_logits(e->m, e->s, n - 1, e->logits);
        int32_t next = model_argmax(e->logits, model_config_of(e->m)->vocab);
        if (produced == 0) {
            r->ttft_ms = engine_now_ms() - a->t0;
            r->first_token = next;
            if (on_prefill && on_prefill(ctx, e, a->n_prompt, r) != 0) return -1;
        }
        produced++;
        e->tokens[n_known++] = next;
    }

    /* 6. Finished: the connector may keep the pages for an async save; then they go back to the
     * engine's prefix cache. */
    if (c) {
        int keep = 0;
        HOOK(c, c->api->request_finished(c->h, req_id, &keep), "request_finished");
        for (int polls = 0; keep; polls++) {
            int sending, receiving;
            if (connector_poll_finished(c, req_id, &sending, &receiving) != 0) return -1;
            if (sending) break;
            if (polls == FINISHED_POLL_LIMIT) {
                fprintf(stderr, PROG ": the asynchronous save of '%s' never finished\n", req_id);
                return -1;
            }
            sleep_ms(1);
        }
        if (connector_take_events(c) != 0) return -1;
    }
    /* pages over lossy hits hold approximate KV: they never serve a later prompt from the prefix
     * cache (the connector keeps what it stored, marked) */
    kvcache_release(e->kv, e->table, a->n_blocks, e->tokens,
                    a->n_lossy ? a->n_local : a->kv_tokens);
    return 0;
}

int engine_serve(engine *e, const char *req_id, uint64_t n_prompt, int n_out, turn_result *r,
                 prefill_done_fn on_prefill, void *ctx) {
    admitted a;
    if (engine_admit(e, req_id, n_prompt, n_out, engine_now_ms(), &a) != 0) return -1;
    if (a.async) {
        fprintf(stderr,
                PROG ": '%s': the connector loads it asynchronously; serve it with batch_run\n",
                req_id);
        kvcache_release(e->kv, e->table, a.n_blocks, e->tokens, 0);
        return -1;
    }
    return engine_run(e, &a, r, on_prefill, ctx);
}
