/* serve.c - kvs-mini-research serving the workload (serve.h). */
#include "serve.h"

#include "abi/kvstrata_plans.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static research_mode *research_of(const mode_run *run) {
    return run->ext;
}

/* The slots 1..N-1 for requests in flight together; slot 0 is the mode's own engine. */
static int begin_slots(mode_run *run, research_mode *rm, const options *o, int slots,
                       const sizing *z) {
    const engine *e = &run->e;
    rm->reqs = calloc((size_t)slots, sizeof *rm->reqs);
    rm->ids = calloc((size_t)slots, sizeof *rm->ids);
    rm->more = slots > 1 ? calloc((size_t)slots - 1, sizeof *rm->more) : NULL;
    if (!rm->reqs || !rm->ids || (slots > 1 && !rm->more)) {
        mini_err("out of memory\n");
        return -1;
    }
    rm->n_more = slots - 1;
    for (int k = 0; k < rm->n_more; k++) {
        engine *x = &rm->more[k];
        /* a scratch of its own: requests in flight together keep their activations apart */
        *x = (engine){.m = e->m,
                      .kv = e->kv,
                      .conn = e->conn,
                      .prefill_chunk = e->prefill_chunk,
                      .ext = e->ext};
        x->s = model_scratch_create(e->m, o->prefill_chunk, (int)z->max_request);
        x->logits = malloc((size_t)model_config_of(e->m)->vocab * sizeof *x->logits);
        x->table = calloc(z->blocks, sizeof *x->table);
        x->tokens = malloc((size_t)z->max_request * sizeof *x->tokens);
        x->dropped = calloc(z->max_request, 1);
        x->dropped_cap = z->max_request;
        if (!x->s || !x->logits || !x->table || !x->tokens || !x->dropped) {
            mini_err("out of memory\n");
            return -1;
        }
    }
    return 0;
}

int serve_begin(mode_run *run, research_mode *rm, const options *o, const research *x,
                stage_layout *sl, const model *m, const workload *w, const sizing *z,
                reference *ref) {
    *rm = (research_mode){.continuous = x->continuous != 0, .stages = x->stages};
    plan_state_init(&rm->ps, sl, x->restore_plans != 0);
    run->ext = rm;
    kvs_stage_desc sd = stage_desc(sl);
    /* a stage recomputes its layers on a scratch of its own, while the loads run, before
     * load_dropped could tell it what to mask: with stage plans the engine does not mask */
    mode_setup setup = {.cache_layers = stage_cache_layers(sl),
                        .plan_caps = x->restore_plans,
                        .no_mask = (x->restore_plans & KVS_PLAN_CAP_STAGE) != 0,
                        .stages = sl->n_stages > 1 ? &sd : NULL,
                        .ext = &rm->ps.ext};
    if (mode_begin(run, o, m, w, z, ref, &setup) != 0) return -1;
    int slots = x->batch > x->continuous ? x->batch : x->continuous;
    return begin_slots(run, rm, o, slots, z);
}

static engine *slot_engine(mode_run *run, int slot) {
    return slot == 0 ? &run->e : &research_of(run)->more[slot - 1];
}

/* Turn i arrives at t0 in slot `slot`: admitted into the slot's request. */
static int start_turn(mode_run *run, const workload *w, int i, int slot, double t0) {
    research_mode *rm = research_of(run);
    batch_req *q = &rm->reqs[slot];
    *q = (batch_req){.e = slot_engine(run, slot), .r = &run->turns[i], .tag = i};
    return mode_admit(run, w, i, q->e, rm->ids[slot], t0, &q->a);
}

static void end_turn(mode_run *run, const options *o, const workload *w, int slot) {
    const batch_req *q = &research_of(run)->reqs[slot];
    mode_turn_done(run, o, w, q->e, &q->a, q->r);
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
    research_mode *rm = research_of(run);
    batch *b = &rm->flight;
    b->on_first = run->ref ? check_first_token : NULL;
    b->ctx = run;
    for (int j = 0; j < n; j++)
        if (batch_add(b, &rm->reqs[j]) != 0) return -1;
    int left = n;
    while (left) {
        if (batch_step(b) != 0) return -1;
        for (int j = 0; j < n; j++)
            if (rm->reqs[j].done == 1) {
                rm->reqs[j].done = 2; /* reported */
                end_turn(run, o, w, j);
                left--;
            }
    }
    return 0;
}

int serve_turn(mode_run *run, const options *o, const workload *w, int i) {
    if (run->ref) {
        run->ref->session = w->session_names[w->turns[i].session];
        run->ref->turn = w->turns[i].turn;
    }
    if (start_turn(run, w, i, 0, engine_now_ms()) != 0) return -1;
    batch_req *q = &research_of(run)->reqs[0];
    if (q->a.async) return drain(run, o, w, 1); /* its load runs between steps */
    if (engine_run(q->e, &q->a, q->r, run->ref ? reference_check : NULL, run->ref) != 0) return -1;
    end_turn(run, o, w, 0);
    return 0;
}

/* Restore the external ranges of n admitted requests in one step of their own (nothing scheduled
 * besides): one build_meta over all of them, so the connector plans the batch, then the loads on a
 * loader thread while this thread recomputes what each request's plan leaves to the engine. */
static int restore_group(engine **es, admitted *as, int n) {
    if (n < 1 || n > BATCH_MAX) return 0; /* a group holds 1..BATCH_MAX turns (group_size) */
    connector *c = es[0]->conn;
    kvs_step_request *rs = calloc((size_t)n, sizeof *rs);
    int *idx = calloc((size_t)n, sizeof *idx);
    int m = 0, rc = -1;
    if (!rs || !idx) {
        mini_err("out of memory\n");
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
    if (connector_step_meta(c, rs, (uint64_t)m) != 0 || plans_restore(es, as, idx, m) != 0)
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

/* --batch: serve turns [i, i + n) (different sessions) together: admit each, restore their
 * prefixes in one step planned as a batch, then run each. TTFT counts from the group's arrival. When
 * the connector loads them asynchronously, each is scheduled as soon as its own load has landed
 * instead (batch.c): per-request completion. */
int serve_group(mode_run *run, const options *o, const workload *w, int i, int n) {
    research_mode *rm = research_of(run);
    engine *es[64];
    admitted as[64];
    const double t0 = engine_now_ms();
    int any_async = 0;
    for (int j = 0; j < n; j++) {
        if (start_turn(run, w, i + j, j, t0) != 0) return -1;
        es[j] = rm->reqs[j].e;
        as[j] = rm->reqs[j].a;
        any_async |= as[j].async;
    }
    if (any_async) return drain(run, o, w, n);
    if (run->e.conn && restore_group(es, as, n) != 0) return -1;
    for (int j = 0; j < n; j++) {
        batch_req *q = &rm->reqs[j];
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

/* --continuous: admit the turns that have arrived, from *next on, into free slots (busy[k]: slot k
 * is in flight). The next turn is admitted once it is due, a slot is free and its session has no turn
 * in flight; with --arrival-ms it counts as arrived when it was due. 0, or -1 after printing why. */
static int arrivals(mode_run *run, const research *x, const workload *w, int *busy, int *next,
                    double begin) {
    research_mode *rm = research_of(run);
    batch *b = &rm->flight;
    const int slots = x->continuous;
    while (*next < w->n_turns && b->n < slots) {
        int slot = 0, taken = 0;
        double due = begin + (double)*next * x->arrival_ms, now = engine_now_ms();
        if (x->arrival_ms && now < due) {
            if (b->n) break;
            sleep_until(due); /* nothing in flight: the engine idles until it arrives */
            now = engine_now_ms();
        }
        for (int k = 0; k < slots; k++)
            taken |= busy[k] && rm->reqs[k].r->session == w->turns[*next].session;
        if (taken) break;
        while (busy[slot]) slot++;
        if (start_turn(run, w, *next, slot, x->arrival_ms ? due : now) != 0 ||
            batch_add(b, &rm->reqs[slot]) != 0)
            return -1;
        busy[slot] = 1;
        (*next)++;
    }
    return 0;
}

int serve_continuous(mode_run *run, const options *o, const research *x, const workload *w) {
    research_mode *rm = research_of(run);
    batch *b = &rm->flight;
    b->on_first = run->ref ? check_first_token : NULL;
    b->ctx = run;
    const int slots = x->continuous;
    int *busy = calloc((size_t)slots, sizeof *busy);
    if (!busy) {
        mini_err("out of memory\n");
        return -1;
    }
    int next = 0, rc = -1;
    const double begin = engine_now_ms();
    while (next < w->n_turns || b->n) {
        if (arrivals(run, x, w, busy, &next, begin) != 0) goto out;
        if (b->n && batch_step(b) != 0) goto out;
        for (int k = 0; k < slots; k++)
            if (busy[k] && rm->reqs[k].done) {
                busy[k] = 0;
                end_turn(run, o, w, k);
            }
    }
    rc = 0;
out:
    free(busy);
    return rc;
}

int group_size(const research *x, const workload *w, int i) {
    int n = 1;
    while (n < x->batch && n < 64 && i + n < w->n_turns) {
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= w->turns[i + j].session == w->turns[i + n].session;
        if (dup) break;
        n++;
    }
    return n;
}

void serve_end(mode_run *run, const workload *w) {
    research_mode *rm = research_of(run);
    if (rm) {
        batch_stats_free(&rm->flight.stats);
        for (int k = 0; k < rm->n_more; k++) {
            model_scratch_free(rm->more[k].s);
            free(rm->more[k].logits);
            free(rm->more[k].table);
            free(rm->more[k].tokens);
            free(rm->more[k].dropped);
        }
        free(rm->more);
        free(rm->reqs);
        free(rm->ids);
        rm->reqs = NULL;
        rm->ids = NULL;
        rm->more = NULL;
        rm->n_more = 0;
    }
    mode_end(run, w);
}

/* The summary ------------------------------------------------------------------------------------ */

/* The decoding requests' step times (batch.c): decode-only steps with an asynchronous load in flight
 * and with no restore in flight, and the two matched in time and batch (contexts grow as requests
 * decode and steps cost more with more requests decoding, so unlike steps are not compared): the
 * steps with a load in flight of every window of MATCH_WINDOW_MS and number of requests decoding that
 * also has steps with none, against the mean of those in the same window and batch, weighed as the
 * former; steps that restored synchronously. */
#define MATCH_WINDOW_MS 1000.0

typedef struct step_summary {
    uint64_t loading, idle, restore;
    double loading_ms, idle_ms, restore_ms;     /* means */
    double matched_loading_ms, matched_idle_ms; /* means over the matched windows */
    double matched;                             /* their ratio; 0: no window had both kinds */
    uint64_t matched_steps;                     /* steps with a load in flight in those windows */
} step_summary;

static step_summary summarize_steps(const batch_stats *b) {
    step_summary s = {0};
    double lsum = 0, isum = 0, matched_l = 0, matched_i = 0;
    for (uint64_t i = 0; i < b->n_decode; i++) {
        if (b->decode[i].loading)
            s.loading++, lsum += b->decode[i].step_ms;
        else
            s.idle++, isum += b->decode[i].step_ms;
    }
    s.loading_ms = s.loading ? lsum / (double)s.loading : 0;
    s.idle_ms = s.idle ? isum / (double)s.idle : 0;
    s.restore = b->restore_steps;
    s.restore_ms = b->restore_steps ? b->restore_ms / (double)b->restore_steps : 0;
    for (uint64_t i = 0, j; i < b->n_decode; i = j) { /* recorded in time order */
        double end = b->decode[i].at_ms + MATCH_WINDOW_MS;
        for (j = i; j < b->n_decode && b->decode[j].at_ms < end;) j++;
        for (uint32_t k = 1; k <= BATCH_MAX; k++) {
            double l = 0, d = 0;
            uint64_t nl = 0, nd = 0;
            for (uint64_t x = i; x < j; x++) {
                if (b->decode[x].n_decode != k) continue;
                if (b->decode[x].loading)
                    nl++, l += b->decode[x].step_ms;
                else
                    nd++, d += b->decode[x].step_ms;
            }
            if (!nl || !nd || d <= 0) continue;
            matched_l += l;
            matched_i += d / (double)nd * (double)nl;
            s.matched_steps += nl;
        }
    }
    if (s.matched_steps) {
        s.matched_loading_ms = matched_l / (double)s.matched_steps;
        s.matched_idle_ms = matched_i / (double)s.matched_steps;
        s.matched = matched_l / matched_i;
    }
    return s;
}

static void plans_text(const research_mode *rm, report_at at) {
    const plan_state *ps = &rm->ps;
    if (at == REPORT_BEFORE_DROPPED && ps->plans)
        printf("; restore plans followed: token %llu, layer %llu, stage %llu, recompute %llu (%llu "
               "tokens recomputed)",
               (unsigned long long)ps->plans_token, (unsigned long long)ps->plans_layer,
               (unsigned long long)ps->plans_stage, (unsigned long long)ps->plans_recompute,
               (unsigned long long)ps->plan_recomputed_tokens);
    if (at == REPORT_AFTER_DROPPED && ps->plans && rm->stages > 1)
        printf("; stages restored from their boundary %llu",
               (unsigned long long)ps->stage_boundary_restores);
}

static void plans_json(const research_mode *rm, report_at at) {
    const plan_state *ps = &rm->ps;
    if (at == REPORT_BEFORE_DROPPED && ps->plans)
        printf(",\"plans_token\":%llu,\"plans_layer\":%llu,\"plans_stage\":%llu,\"plans_"
               "recompute\":%llu,"
               "\"plan_recomputed_tokens\":%llu,\"stage_boundary_restores\":%llu",
               (unsigned long long)ps->plans_token, (unsigned long long)ps->plans_layer,
               (unsigned long long)ps->plans_stage, (unsigned long long)ps->plans_recompute,
               (unsigned long long)ps->plan_recomputed_tokens,
               (unsigned long long)ps->stage_boundary_restores);
    if (at == REPORT_MODE_END && rm->continuous) {
        step_summary d = summarize_steps(&rm->flight.stats);
        printf(",\"decode_steps\":{\"loading\":{\"n\":%llu,\"mean_ms\":%.4f},\"idle\":{\"n\":%llu,"
               "\"mean_ms\":%.4f},\"matched\":{\"loading_mean_ms\":%.4f,\"idle_mean_ms\":%.4f,"
               "\"ratio\":%.4f,\"steps\":%llu},\"restore\":{\"n\":%llu,\"mean_ms\":%.4f}}",
               (unsigned long long)d.loading, d.loading_ms, (unsigned long long)d.idle, d.idle_ms,
               d.matched_loading_ms, d.matched_idle_ms, d.matched,
               (unsigned long long)d.matched_steps, (unsigned long long)d.restore, d.restore_ms);
    }
}

static void mode_extra(const mode_run *run, int json, report_at at) {
    const research_mode *rm = research_of(run);
    if (!rm) return;
    if (json)
        plans_json(rm, at);
    else
        plans_text(rm, at);
}

static void after_modes(const mode_run *runs, int n_runs) {
    for (int k = 0; k < n_runs; k++) {
        const research_mode *rm = research_of(&runs[k]);
        if (!rm || !rm->continuous) continue;
        step_summary d = summarize_steps(&rm->flight.stats);
        printf("%s: decode-only steps: %llu with an async load in flight (mean %.3f ms), %llu with "
               "no restore in flight (mean %.3f ms); matched in time and batch: %.3f ms against "
               "%.3f ms, %.3fx (over %llu); %llu steps restored synchronously while others "
               "decoded (mean %.3f ms)\n",
               runs[k].name, (unsigned long long)d.loading, d.loading_ms,
               (unsigned long long)d.idle, d.idle_ms, d.matched_loading_ms, d.matched_idle_ms,
               d.matched, (unsigned long long)d.matched_steps, (unsigned long long)d.restore,
               d.restore_ms);
    }
}

const report_ext serve_report = {.mode_extra = mode_extra, .after_modes = after_modes};
