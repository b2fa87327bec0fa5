/* plans.c - the restore plans and pipeline stages of kvs-mini-research's engines (plans.h): where
 * the connector's plan leaves part of a restored range to the engine, it is computed while a loader
 * thread lands the loads, a stage at a time on threads of their own for stage plans. */
#include "plans.h"

#include "abi/kvstrata_plans.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static int restore(engine **es, admitted *as, const int *idx, int m) {
    return plans_restore(es, as, idx, m);
}

static void before_layer(engine *e, model_scratch *s, int l, uint64_t pos0, int n) {
    plans_capture_boundary(e, s, l, pos0, n);
}

void plan_state_init(plan_state *ps, stage_layout *sl, int plans) {
    *ps = (plan_state){
        .ext = {.restore = restore, .before_layer = before_layer}, .sl = sl, .plans = plans};
}

plan_state *plan_state_of(const engine *e) {
    return (plan_state *)(void *)e->ext; /* ext is a plan_state's first member */
}

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
void plans_capture_boundary(engine *e, model_scratch *s, int l, uint64_t pos0, int n) {
    const stage_layout *sl = plan_state_of(e)->sl;
    int stage = sl && sl->n_stages > 1 ? stage_starting_at(sl, l) : 0;
    if (stage)
        stage_boundary_write(sl, e->kv, stage, model_config_of(e->m)->dim, e->table, pos0, n,
                             model_scratch_hidden(s));
}

/* Compute tokens [first, first + n) through layers [from, to), in prefill-sized pieces, with the
 * activations in scr: from the embeddings when from is 0, else from the boundary of the stage that
 * starts at `from`. capture: store the boundaries the pieces cross (a restore that computes only some
 * layers leaves them to the loads). */
void plans_compute_layers(engine *e, model_scratch *scr, uint64_t first, uint64_t n, int from,
                          int to, int capture) {
    const stage_layout *sl = plan_state_of(e)->sl;
    int stage = from ? stage_starting_at(sl, from) : 0, dim = model_config_of(e->m)->dim;
    for (uint64_t done = 0; done < n;) {
        int piece = n - done < (uint64_t)e->prefill_chunk ? (int)(n - done) : e->prefill_chunk;
        uint64_t pos = first + done;
        if (stage)
            stage_boundary_read(sl, e->kv, stage, dim, e->table, pos, piece,
                                model_scratch_hidden(scr));
        else
            model_embed(e->m, scr, e->tokens + pos, piece);
        for (int l = from; l < to; l++) {
            if (capture) plans_capture_boundary(e, scr, l, pos, piece);
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
    const stage_layout *sl = plan_state_of(w->es[0])->sl;
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
        plans_compute_layers(w->es[w->idx[j]], scr, p->first_token, p->recompute_tokens,
                             sl->first[s], sl->first[s] + (int)p->stage_recompute_layers[s], 0);
    }
    return NULL;
}

/* Start the step's loads. Where a restore plan leaves part of a request's range to the engine (the
 * connector left the front of the range, or its lower layers, out of the loads), recompute that part
 * here while a second thread runs the loads: the only connector calls in that window are the
 * loader's, so calls on the handle stay serialised. Positions before the front are already in the
 * pages and the front never attends to the loaded back; layer j's K/V of a token depends only on
 * layers below j, so the loaded upper layers are never an input to what is recomputed. Either way the
 * two touch different bytes and the result is the same bits as loading everything. es[idx[j]] is the
 * engine (pages, tokens) of the j-th of m requests, as[idx[j]] its admission. */
int plans_restore(engine **es, admitted *as, const int *idx, int m) {
    connector *c = es[0]->conn;
    plan_state *ps = plan_state_of(es[0]);
    kvs_restore_plan *plans = calloc((size_t)m, sizeof *plans);
    if (!plans) {
        mini_err("out of memory\n");
        return -1;
    }
    int any = 0;
    for (int j = 0; j < m; j++) {
        plans[j].struct_size = sizeof plans[j];
        kvs_status got =
            ps->plans ? c->api->plan(c->h, as[idx[j]].req_id, &plans[j]) : KVS_ENOTFOUND;
        if (got != KVS_OK &&
            got != KVS_ENOTFOUND) { /* the loads may lack what the plan gives us: never guess */
            free(plans);
            return connector_hook_failed(c, "plan", got);
        }
        if (got != KVS_OK) plans[j].recompute_tokens = 0;
        any |= plans[j].recompute_tokens > 0;
    }
    if (!any) {
        free(plans);
        HOOK(c, c->api->start_load(c->h), "start_load");
        return engine_note_dropped(es, as, idx, m);
    }
    stage_layout *sl = ps->sl && ps->sl->n_stages > 1 ? ps->sl : NULL;
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
        ps->plan_recomputed_tokens += p->recompute_tokens;
        if (p->mode == KVS_PLAN_STAGE) {
            ps->plans_stage++;
            for (uint32_t st = 1; st < p->n_stages && st < KVS_MAX_STAGES; st++)
                ps->stage_boundary_restores += p->stage_recompute_layers[st] > 0;
            continue; /* below, and on the stage threads */
        }
        if (p->mode == KVS_PLAN_RECOMPUTE)
            ps->plans_recompute++;
        else if (p->mode == KVS_PLAN_LAYER)
            ps->plans_layer++, layers = (int)p->recompute_layers;
        else
            ps->plans_token++;
        plans_compute_layers(es[idx[j]], es[idx[j]]->s, p->first_token, p->recompute_tokens, 0,
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
    return engine_note_dropped(es, as, idx, m);
}
