/* step_meta.c - a step's metadata: build_meta (every scheduled request's whole token list and block
 * table) and build_meta_update (what changed since the last step; the rest is held in the request
 * table) share one planner: the loads on_alloc armed, the saves of the chunks the step completes,
 * the restore planner over them, and the blob the workers bind, which carries only requests with a
 * load or a save and, of each, the block ids of what it moves. */
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_lossy.h"
#include "common/abi_struct.h"
#include "connector/ext/plans/plan_state.h"
#include "connector/ext/plans/restore.h"
#include "handle.h"
#include "keys.h"
#include "last_error.h"
#include "request_tokens.h"
#include "requests.h"
#include "role.h"

/* One request of the step: its tokens are its first tokens_from held ones followed by
 * tokens[0..n_new_tokens), its block table likewise (build_meta passes whole lists: from 0). */
typedef struct step_req {
    const char *req_id;
    kvs_request *r; /* NULL: not known yet */
    int delta;      /* keys of new chunks only; the held state is appended to, not replaced */
    uint64_t tokens_from, n_new_tokens, n_tokens;
    const int32_t *tokens;
    uint64_t blocks_from, n_new_blocks, n_blocks;
    const uint32_t *block_ids;
    uint64_t n_computed, n_scheduled;
} step_req;

/* What this step does for one request, computed without changing any state the caller sees (a
 * known request's buffers may grow). */
typedef struct req_plan {
    kvs_key *keys;     /* keys of chunks [key_base, n_keys), computed for this step */
    uint64_t key_base; /* the chunks before it keep the request's held keys */
    uint64_t n_keys;
    uint64_t saved_upto;
    uint64_t lossy_loaded; /* becomes the request's lossy_loaded */
    uint64_t span_from; /* the tokens [span_from, span_end) it loads or saves (UINT64_MAX: none) */
    uint64_t span_end;
    int emits_load;
} req_plan;

static kvs_status check_counts(kvs_handle *h, const char *hook, const step_req *s) {
    uint64_t done = s->n_computed + s->n_scheduled;
    if (done > s->n_tokens || done < s->n_computed)
        return kvs_set_error(
            h, KVS_EINVAL,
            "%s: request '%s': n_computed %llu + n_scheduled %llu exceeds n_tokens %llu", hook,
            s->req_id, (unsigned long long)s->n_computed, (unsigned long long)s->n_scheduled,
            (unsigned long long)s->n_tokens);
    if (s->n_new_blocks && !s->block_ids)
        return kvs_set_error(h, KVS_EINVAL, "%s: request '%s': block_ids is NULL", hook, s->req_id);
    if (s->n_blocks > UINT64_MAX / h->model.block_tokens ||
        s->n_blocks * h->model.block_tokens < done)
        return kvs_set_error(
            h, KVS_EINVAL, "%s: request '%s': block table of %llu blocks cannot hold %llu tokens",
            hook, s->req_id, (unsigned long long)s->n_blocks, (unsigned long long)done);
    return KVS_OK;
}

static kvs_status check_step_request(kvs_handle *h, const kvs_step_request *in, step_req *s) {
    kvs_status st = kvs_reqs_check_id(h, "build_meta", in->req_id);
    if (st == KVS_OK)
        st = kvs_request_check_tokens(h, "build_meta", in->req_id, in->tokens, in->n_tokens);
    if (st != KVS_OK) return st;
    *s = (step_req){.req_id = in->req_id,
                    .r = kvs_reqs_find(h, in->req_id),
                    .n_new_tokens = in->n_tokens,
                    .n_tokens = in->n_tokens,
                    .tokens = in->tokens,
                    .n_new_blocks = in->n_block_ids,
                    .n_blocks = in->n_block_ids,
                    .block_ids = in->block_ids,
                    .n_computed = in->n_computed,
                    .n_scheduled = in->n_scheduled};
    if (s->r) s->r->step_mark = h->reqs.step_marks;
    return check_counts(h, "build_meta", s);
}

static kvs_status check_update(kvs_handle *h, const kvs_step_update *u, step_req *s) {
    static const char hook[] = "build_meta_update";
    kvs_status st = kvs_reqs_check_id(h, hook, u->req_id);
    if (st != KVS_OK) return st;
    kvs_request *r = kvs_reqs_find(h, u->req_id);
    uint64_t held_tokens = r ? r->n_tokens : 0, held_blocks = r ? r->n_table : 0;
    if (u->tokens_from > held_tokens || u->blocks_from > held_blocks)
        return kvs_set_error(h, KVS_EINVAL,
                             "%s: request '%s': tokens_from %llu and blocks_from %llu, but the "
                             "library holds %llu of its tokens and %llu of its blocks",
                             hook, u->req_id, (unsigned long long)u->tokens_from,
                             (unsigned long long)u->blocks_from, (unsigned long long)held_tokens,
                             (unsigned long long)held_blocks);
    if (u->n_tokens > UINT64_MAX / 8 || u->n_block_ids > UINT64_MAX / 8)
        return kvs_set_error(h, KVS_EINVAL, "%s: request '%s': %llu tokens and %llu block ids",
                             hook, u->req_id, (unsigned long long)u->n_tokens,
                             (unsigned long long)u->n_block_ids);
    /* the held tokens were checked when they were stored: only the new ones are */
    if ((st = kvs_request_check_tokens(h, hook, u->req_id, u->tokens, u->n_tokens)) != KVS_OK)
        return st;
    if (r && r->step_mark == h->reqs.step_marks)
        return kvs_set_error(h, KVS_EINVAL, "%s: request '%s' is named twice in one step", hook,
                             u->req_id);
    if (r) r->step_mark = h->reqs.step_marks;
    *s = (step_req){.req_id = u->req_id,
                    .r = r,
                    .delta = 1,
                    .tokens_from = u->tokens_from,
                    .n_new_tokens = u->n_tokens,
                    .n_tokens = u->tokens_from + u->n_tokens,
                    .tokens = u->tokens,
                    .blocks_from = u->blocks_from,
                    .n_new_blocks = u->n_block_ids,
                    .n_blocks = u->blocks_from + u->n_block_ids,
                    .block_ids = u->block_ids,
                    .n_computed = u->n_computed,
                    .n_scheduled = u->n_scheduled};
    return check_counts(h, hook, s);
}

/* Block b of s's table in this step: held below blocks_from, passed from there. */
static uint32_t step_block(const step_req *s, uint64_t b) {
    return b < s->blocks_from ? s->r->table[b] : s->block_ids[b - s->blocks_from];
}

/* Whether a block of tokens [from, end) of s's table is KVS_BLOCK_NONE (a page the engine freed). */
static int span_has_no_page(const kvs_handle *h, const step_req *s, uint64_t from, uint64_t end) {
    uint64_t bt = h->model.block_tokens, last = (end + bt - 1) / bt;
    if (last > s->n_blocks) last = s->n_blocks;
    for (uint64_t b = from / bt; b < last; b++)
        if (step_block(s, b) == KVS_BLOCK_NONE) return 1;
    return 0;
}

static const kvs_key *plan_key(const kvs_handle *h, const kvs_request *r, const req_plan *p,
                               uint64_t c) {
    return c < p->key_base ? kvs_chunk_keys(h, r->keys, c)
                           : kvs_chunk_keys(h, p->keys, c - p->key_base);
}

/* The step's keys of s: the held ones up to the chunk its new tokens start in, then the new ones
 * (build_meta_update); or those of its whole list, reusing a prefix it holds (build_meta). */
static kvs_status plan_keys(kvs_handle *h, const step_req *s, req_plan *plan) {
    uint64_t C = h->chunk_tokens;
    kvs_request *r = s->r;
    int oom = 0;
    plan->n_keys = s->n_tokens / C;
    if (!s->delta) {
        plan->keys = kvs_request_keys_for(h, r, s->tokens, s->n_tokens, plan->n_keys, &oom);
    } else {
        uint64_t held = r ? r->n_keys : 0, same = s->tokens_from / C;
        plan->key_base = held < same ? held : same;
        if (plan->key_base > plan->n_keys) plan->key_base = plan->n_keys;
        /* room first: the loads below point into the request's keys */
        if (r && !kvs_request_reserve(h, r, s->n_tokens, plan->n_keys, s->n_blocks)) oom = 1;
        if (!oom)
            plan->keys = kvs_request_keys_delta(h, r, plan->key_base, s->tokens_from, s->tokens,
                                                plan->n_keys, &oom);
    }
    return oom ? kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory") : KVS_OK;
}

/* The load on_alloc armed for s's request (if any): its chunks' loads, the restore step for the
 * planner, and where the loaded tokens end (*load_end; 0 without a load). */
static kvs_status plan_load(kvs_handle *h, const step_req *s, kvs_meta_req *out, req_plan *plan,
                            kvs_restore_step *restore, uint64_t *load_end) {
    uint64_t C = h->chunk_tokens;
    const kvs_request *r = s->r;
    if (!r || !r->load_pending || !r->external) return KVS_OK;
    uint64_t start = r->n_local, end = r->n_local + r->external;
    uint64_t c0 = start / C, c1 = (end - 1) / C;
    if (c1 >= r->n_keys)
        return kvs_set_error(h, KVS_ESTATE, "build_meta: request '%s': load past its keys", r->id);
    if (span_has_no_page(h, s, start, end))
        return kvs_set_error(h, KVS_EINVAL,
                             "build_meta: request '%s': its load of tokens %llu..%llu lands in "
                             "a block given as KVS_BLOCK_NONE",
                             r->id, (unsigned long long)start, (unsigned long long)end);
    out->loads = calloc(c1 - c0 + 1, sizeof *out->loads);
    if (!out->loads) return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
    for (uint64_t c = c0; c <= c1; c++) {
        uint64_t lo = c * C > start ? c * C : start, hi = c * C + C < end ? c * C + C : end;
        const kvs_key *k = kvs_chunk_keys(h, r->keys, c);
        out->loads[out->n_loads++] = (kvs_meta_load){k[0], c * C, lo, (uint32_t)(hi - lo), k};
    }
    *load_end = end;
    plan->span_from = start;
    plan->emits_load = 1;
    int tier = r->n_pins ? (int)kvs_reqs_chunk_tier(h, r->pins)
                         : kvs_tiers_find(h->tiers, kvs_chunk_keys(h, r->keys, c0));
    *restore = (kvs_restore_step){.loading = 1,
                                  .tier = tier > 0 ? (uint32_t)tier : 0,
                                  .first_token = start,
                                  .end_token = end};
    /* loaded between steps; planned with the step's other loads (per-request completion) */
    if (r->load_async) out->load_async = 1;
    /* a lossy chunk among these loads (or, when the plan recomputes the front, any chunk from
     * the first it loads: which later ones are lossy is not kept) */
    if (r->lossy_from < end) {
        uint64_t from = r->lossy_from > start ? r->lossy_from : start / C * C;
        if (from < plan->lossy_loaded) plan->lossy_loaded = from;
    }
    return KVS_OK;
}

/* The saves of the chunks the step completes, from where the request's saving stands. */
static kvs_status plan_saves(kvs_handle *h, const step_req *s, kvs_meta_req *out, req_plan *plan) {
    uint64_t C = h->chunk_tokens;
    const kvs_request *r = s->r;
    uint64_t prompt = r && r->keys_fixed ? r->prompt_tokens : s->n_tokens;
    uint64_t limit = s->n_computed + s->n_scheduled;
    if (!h->cfg->save_decode && limit > prompt) limit = prompt;
    plan->saved_upto = r ? r->saved_upto : 0;
    /* The engine recomputes from n_computed (a failed load, a preemption): what it recomputes was
     * never stored by this request, so saving resumes there. Chunks already stored are skipped by
     * the workers. */
    if (r && s->n_computed < r->step_end && s->n_computed < plan->saved_upto)
        plan->saved_upto = s->n_computed / C * C;
    uint64_t from = plan->saved_upto / C, to = limit / C;
    if (h->transfer_role == KVS_TRANSFER_CONSUMER) to = from; /* a decode instance only loads */
    if (to <= from) return KVS_OK;
    out->saves = calloc(to - from, sizeof *out->saves);
    if (!out->saves) return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
    for (uint64_t c = from; c < to; c++) {
        /* a chunk with a freed page (out of a sliding window) cannot be read whole: not saved,
         * and the chunks after it still are */
        if (span_has_no_page(h, s, c * C, c * C + C)) continue;
        const kvs_key *k = plan_key(h, r, plan, c);
        out->saves[out->n_saves++] = (kvs_meta_save){k[0], c * C, k};
    }
    plan->saved_upto = to * C;
    if (out->n_saves && out->saves[0].chunk_first < plan->span_from)
        plan->span_from = out->saves[0].chunk_first;
    return KVS_OK;
}

static kvs_status plan_request(kvs_handle *h, const step_req *s, kvs_meta_req *out, req_plan *plan,
                               kvs_restore_step *restore) {
    uint64_t C = h->chunk_tokens;
    const kvs_request *r = s->r;
    memset(plan, 0, sizeof *plan);
    plan->lossy_loaded = r ? r->lossy_loaded : UINT64_MAX;
    plan->span_from = UINT64_MAX;
    kvs_status st = plan_keys(h, s, plan);
    if (st != KVS_OK) return st;
    uint64_t load_end = 0;
    if ((st = plan_load(h, s, out, plan, restore, &load_end)) != KVS_OK) return st;
    out->derived = plan->lossy_loaded != UINT64_MAX;
    out->derived_from = out->derived ? plan->lossy_loaded : 0;
    if ((st = plan_saves(h, s, out, plan)) != KVS_OK) return st;
    uint64_t save_end = out->n_saves ? out->saves[out->n_saves - 1].chunk_first + C : 0;
    plan->span_end = load_end > save_end ? load_end : save_end;
    memcpy(out->id, s->req_id, strlen(s->req_id) + 1);
    return KVS_OK;
}

/* The block ids of what s loads and saves: from the block of the first token it moves, or, when the
 * step can have failed loads and s saves, from its first block (a save is dropped when a failed
 * block lies anywhere before its end: worker_save.c). Nothing for a request that moves nothing. */
static kvs_status plan_blocks(kvs_handle *h, const step_req *s, const req_plan *plan,
                              kvs_meta_req *out, int loads_may_fail) {
    if (plan->span_from == UINT64_MAX || plan->span_end == 0) return KVS_OK;
    uint64_t bt = h->model.block_tokens;
    uint64_t first = loads_may_fail && out->n_saves ? 0 : plan->span_from / bt;
    uint64_t end = (plan->span_end + bt - 1) / bt;
    if (end <= first) return KVS_OK;
    out->block_first = first;
    out->n_block_ids = end - first;
    out->block_ids = malloc(out->n_block_ids * sizeof *out->block_ids);
    if (!out->block_ids) return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
    uint64_t held_end = s->blocks_from < end ? s->blocks_from : end; /* [first, held_end) held */
    uint64_t k = 0;
    if (first < held_end) {
        memcpy(out->block_ids, s->r->table + first, (held_end - first) * sizeof *out->block_ids);
        k = held_end - first;
    }
    if (k < out->n_block_ids)
        memcpy(out->block_ids + k, s->block_ids + (first + k - s->blocks_from),
               (out->n_block_ids - k) * sizeof *out->block_ids);
    return KVS_OK;
}

/* The request's state becomes the step's: its tokens, keys and block table (appended to by
 * build_meta_update, replaced by build_meta), what it saved, its load. */
static kvs_status apply_plan(kvs_handle *h, const step_req *s, req_plan *plan,
                             const kvs_restore_step *restore) {
    kvs_request *r = s->r ? s->r : kvs_reqs_find(h, s->req_id); /* named twice while new */
    if (!r && !(r = kvs_reqs_create(h, s->req_id)))
        return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
    if (!r->keys_fixed) r->prompt_tokens = s->n_tokens; /* its first sighting (inputs aside) */
    if (s->delta) {
        if (!kvs_request_reserve(h, r, s->n_tokens, plan->n_keys, s->n_blocks))
            return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
        if (s->n_new_tokens)
            memcpy(r->tokens + s->tokens_from, s->tokens, s->n_new_tokens * sizeof *s->tokens);
        r->n_tokens = s->n_tokens;
        if (plan->n_keys > plan->key_base)
            memcpy(kvs_chunk_keys(h, r->keys, plan->key_base), plan->keys,
                   (plan->n_keys - plan->key_base) * h->key_ranks * sizeof *plan->keys);
        r->n_keys = plan->n_keys;
        if (s->n_new_blocks)
            memcpy(r->table + s->blocks_from, s->block_ids, s->n_new_blocks * sizeof *s->block_ids);
        r->n_table = s->n_blocks;
    } else {
        if (!kvs_request_store_tokens(h, r, s->tokens, s->n_tokens) ||
            !kvs_request_store_table(h, r, s->block_ids, s->n_blocks))
            return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
        free(r->keys);
        r->keys = plan->keys;
        r->n_keys = r->keys_cap = plan->n_keys;
        plan->keys = NULL;
    }
    r->keys_fixed = 1;
    r->saved_upto = plan->saved_upto;
    r->lossy_loaded = plan->lossy_loaded;
    r->step_end = s->n_computed + s->n_scheduled;
    if (plan->emits_load && r->load_async) {
        /* the engine counts the loaded tokens as computed: coming back below them is a rollback */
        r->step_end = r->n_local + r->external;
        free(r->block_ids);
        r->block_ids = NULL;
        r->n_block_ids = 0;
    }
    if (r->async_waiting && s->n_scheduled > 0) {
        /* the engine computes it again: its async load has landed on every worker */
        kvs_reqs_set_async_waiting(h, r, 0);
        kvs_reqs_release_lease(h, r);
    }
    if (plan->emits_load) {
        r->load_pending = 0;
        /* The workers load during this step; an async load later, on their loader threads, which
         * pin only when they reach it: its lease stays until the request computes again (or it
         * expires, or the request finishes). */
        kvs_reqs_set_async_waiting(h, r, r->load_async);
        r->lease_release_step = r->load_async ? 0 : h->reqs.step;
        if (r->lease_release_step) h->reqs.leases_to_release++;
        r->plan = restore->plan;
        r->plan_step = h->reqs.step;
    }
    return KVS_OK;
}

static void release_finished_leases(kvs_handle *h) {
    if (!h->reqs.leases_to_release) return;
    uint64_t left = 0;
    for (int b = 0; b < KVS_REQ_BUCKETS; b++)
        for (kvs_request *r = h->reqs.buckets[b]; r; r = r->next)
            if (r->lease_release_step && r->lease_release_step < h->reqs.step)
                kvs_reqs_release_lease(h, r);
            else
                left += r->lease_release_step != 0;
    h->reqs.leases_to_release = left;
}

/* One save per key per step: requests sharing a prefix in one step would each save every chunk of
 * it. The first request to save a key keeps the save; later ones drop it (their saved_upto still
 * moves on, as the chunk is being stored). Keys are hashes, so their first bytes index the set. A
 * save's `key` is rank 0's: two saves with the same rank-0 key have the same tokens, so the same key
 * for every rank. */
static kvs_status drop_duplicate_saves(kvs_handle *h, kvs_meta *meta) {
    uint64_t total = 0, cap = 1;
    for (uint64_t i = 0; i < meta->n_reqs; i++) total += meta->reqs[i].n_saves;
    if (total < 2) return KVS_OK;
    while (cap < 2 * total) cap <<= 1;
    const kvs_key **set = calloc(cap, sizeof *set);
    if (!set) return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
    for (uint64_t i = 0; i < meta->n_reqs; i++) {
        kvs_meta_req *r = &meta->reqs[i];
        uint64_t kept = 0;
        for (uint64_t j = 0; j < r->n_saves; j++) {
            uint64_t slot;
            memcpy(&slot, r->saves[j].key.bytes, sizeof slot);
            slot &= cap - 1;
            while (set[slot] && memcmp(set[slot], &r->saves[j].key, sizeof(kvs_key)) != 0)
                slot = (slot + 1) & (cap - 1);
            if (set[slot]) continue; /* an earlier request of this step saves it */
            r->saves[kept] = r->saves[j];
            set[slot] = &r->saves[kept].key;
            kept++;
        }
        r->n_saves = kept;
    }
    free(set);
    return KVS_OK;
}

static int waits_for_load(const kvs_handle *h, const kvs_request *r) {
    return r->load_pending && r->load_async && r->block_ids && r->step_mark != h->reqs.step_marks;
}

/* Async loads on_alloc armed for requests the engine did not schedule (it waits for their KV) join
 * the step as requests that compute nothing, their state as held: *reqs grows by them. */
static kvs_status add_waiting_loads(kvs_handle *h, step_req **reqs, uint64_t *n_reqs) {
    if (!h->reqs.async_armed) return KVS_OK;
    uint64_t n = 0, armed = 0;
    for (int b = 0; b < KVS_REQ_BUCKETS; b++)
        for (kvs_request *r = h->reqs.buckets[b]; r; r = r->next) {
            n += (uint64_t)waits_for_load(h, r);
            armed += r->load_pending && r->load_async;
        }
    h->reqs.async_armed = armed;
    if (n == 0) return KVS_OK;
    step_req *grown = realloc(*reqs, (*n_reqs + n) * sizeof *grown);
    if (!grown) return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
    *reqs = grown;
    for (int b = 0; b < KVS_REQ_BUCKETS; b++)
        for (kvs_request *r = h->reqs.buckets[b]; r; r = r->next)
            if (waits_for_load(h, r))
                grown[(*n_reqs)++] = (step_req){.req_id = r->id,
                                                .r = r,
                                                .delta = 1,
                                                .tokens_from = r->n_tokens,
                                                .n_tokens = r->n_tokens,
                                                .blocks_from = r->n_table,
                                                .n_blocks = r->n_table,
                                                .n_computed = r->n_local};
    return KVS_OK;
}

/* The requests the workers need: those with a load or a save, and every asynchronous load (its
 * worker reports it in get_finished even when the plan left it nothing to load). Shallow copies. */
static kvs_meta_req *wire_requests(const kvs_meta_req *reqs, uint64_t n, uint64_t *kept) {
    kvs_meta_req *out = malloc((n ? n : 1) * sizeof *out);
    *kept = 0;
    if (!out) return NULL;
    for (uint64_t i = 0; i < n; i++)
        if (reqs[i].n_loads || reqs[i].n_saves || reqs[i].load_async) out[(*kept)++] = reqs[i];
    return out;
}

/* What build works on: the metadata being built, each request's plan and restore step, and the
 * encoded blob. */
typedef struct step_build {
    kvs_meta meta;
    const char **finished; /* meta.finished's array */
    req_plan *plans;
    kvs_restore_step *restores;
    void *blob;
    uint64_t blob_len;
} step_build;

/* The finished requests' ids and room for n_reqs requests' metadata, plans and restore steps. */
static kvs_status build_alloc(kvs_handle *h, const char *hook, step_build *b, uint64_t n_reqs) {
    if (b->meta.n_finished) {
        if (!(b->finished = malloc(b->meta.n_finished * sizeof *b->finished)))
            return kvs_set_error(h, KVS_ENOMEM, "%s: out of memory", hook);
        for (uint64_t i = 0; i < b->meta.n_finished; i++) b->finished[i] = h->reqs.kept_finished[i];
        b->meta.finished = b->finished;
    }
    b->meta.reqs = n_reqs ? calloc(n_reqs, sizeof *b->meta.reqs) : NULL;
    b->plans = n_reqs ? calloc(n_reqs, sizeof *b->plans) : NULL;
    b->restores = n_reqs ? calloc(n_reqs, sizeof *b->restores) : NULL;
    if (n_reqs && (!b->meta.reqs || !b->plans || !b->restores))
        return kvs_set_error(h, KVS_ENOMEM, "%s: out of memory", hook);
    return KVS_OK;
}

/* Each request's loads, saves and block ids, one save per key, then the restore planner over the
 * step's loads (it may drop loads the engine recomputes). */
static kvs_status plan_step(kvs_handle *h, const step_req *reqs, uint64_t n_reqs, step_build *b) {
    kvs_status st = KVS_OK;
    int loads_may_fail = h->reqs.async_waiting > 0 ||
                         (h->reqs.last_load_step && h->reqs.last_load_step >= h->reqs.step);
    for (uint64_t i = 0; i < n_reqs && st == KVS_OK; i++) {
        st = plan_request(h, &reqs[i], &b->meta.reqs[i], &b->plans[i], &b->restores[i]);
        b->meta.n_reqs = i + 1;
        loads_may_fail |= b->plans[i].emits_load;
    }
    for (uint64_t i = 0; i < n_reqs && st == KVS_OK; i++)
        st = plan_blocks(h, &reqs[i], &b->plans[i], &b->meta.reqs[i], loads_may_fail);
    if (st != KVS_OK || (st = drop_duplicate_saves(h, &b->meta)) != KVS_OK) return st;
    return kvs_restore_plan_step(h, b->meta.reqs, b->restores, b->meta.n_reqs);
}

/* The blob the workers bind, copied into buf (*len: its size, also when buf is too small);
 * *any_load when a request in it loads. */
static kvs_status emit_step(kvs_handle *h, const char *hook, step_build *b, void *buf, uint64_t cap,
                            uint64_t *len, int *any_load) {
    /* the loader thread reads asynchronous loads one request after another: in the planned order */
    kvs_meta wire = b->meta;
    kvs_meta_req *ordered = NULL;
    kvs_status st = kvs_restore_read_order(b->meta.reqs, b->restores, b->meta.n_reqs, &ordered);
    if (st != KVS_OK) {
        kvs_set_error(h, st, "%s: out of memory ordering the asynchronous loads", hook);
        return st;
    }
    wire.reqs = wire_requests(ordered ? ordered : b->meta.reqs, b->meta.n_reqs, &wire.n_reqs);
    free(ordered);
    st = wire.reqs ? kvs_meta_encode(&wire, &b->blob, &b->blob_len) : KVS_ENOMEM;
    for (uint64_t i = 0; wire.reqs && i < wire.n_reqs; i++) *any_load |= wire.reqs[i].n_loads > 0;
    free(wire.reqs);
    if (st != KVS_OK) {
        kvs_set_error(h, st, "%s: out of memory encoding metadata", hook);
        return st;
    }
    *len = b->blob_len;
    if (b->blob_len > cap)
        return kvs_set_error(h, KVS_EOVERFLOW, "%s: metadata needs %llu bytes, buffer has %llu",
                             hook, (unsigned long long)b->blob_len, (unsigned long long)cap);
    memcpy(buf, b->blob, b->blob_len);
    return KVS_OK;
}

/* The step is emitted: the request table takes it on (leases, the finished requests the workers
 * know now, each request's plan, the saves its pages wait for). */
static kvs_status commit_step(kvs_handle *h, const step_req *reqs, uint64_t n_reqs, step_build *b,
                              int any_load) {
    kvs_status st = KVS_OK;
    h->reqs.step++;
    if (any_load) h->reqs.last_load_step = h->reqs.step;
    release_finished_leases(h);
    h->reqs.n_kept_finished = 0; /* the workers know them now */
    for (uint64_t i = 0; i < n_reqs && st == KVS_OK; i++)
        st = apply_plan(h, &reqs[i], &b->plans[i], &b->restores[i]);
    /* a request finishing with saves emitted keeps its pages until they land (async saves) */
    for (uint64_t i = 0; i < b->meta.n_reqs; i++)
        if (b->meta.reqs[i].n_saves) {
            kvs_request *r = kvs_reqs_find(h, b->meta.reqs[i].id);
            if (r) r->saves_emitted = 1;
        }
    return st;
}

static void build_free(step_build *b) {
    for (uint64_t i = 0; i < b->meta.n_reqs; i++) {
        kvs_meta_req_clear(&b->meta.reqs[i]);
        free(b->plans[i].keys);
    }
    free(b->meta.reqs);
    free(b->plans);
    free(b->restores);
    free(b->blob);
    free(b->finished);
}

/* build_meta and build_meta_update from here: reqs (malloc'd, n_reqs of them, checked) is the
 * caller's array, freed here. */
static kvs_status build(kvs_handle *h, const char *hook, step_req *reqs, uint64_t n_reqs, void *buf,
                        uint64_t cap, uint64_t *len) {
    kvs_reqs_expire_leases(h);
    kvs_status st = add_waiting_loads(h, &reqs, &n_reqs);
    step_build b = {
        .meta = {.step = h->reqs.step + 1,
                 .group_fingerprint = h->group_fingerprint,
                 .key_ranks = h->key_ranks,
                 .chunk_tokens = h->chunk_tokens,
                 .flags = h->plans->plan_caps & KVS_PLAN_CAP_MASK ? KVS_META_MASKS_DROPPED : 0u,
                 .n_finished = h->reqs.n_kept_finished}};
    int any_load = 0;
    if (st == KVS_OK) st = build_alloc(h, hook, &b, n_reqs);
    if (st == KVS_OK) st = plan_step(h, reqs, n_reqs, &b);
    if (st == KVS_OK) st = emit_step(h, hook, &b, buf, cap, len, &any_load);
    if (st == KVS_OK) st = commit_step(h, reqs, n_reqs, &b, any_load);
    build_free(&b);
    free(reqs);
    return st;
}

kvs_status kvs_reqs_build_meta(kvs_handle *h, const kvs_step_request *reqs, uint64_t n_reqs,
                               void *buf, uint64_t cap, uint64_t *len) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "build_meta");
    if (st != KVS_OK) return st;
    if (!len || (n_reqs && !reqs) || (cap && !buf))
        return kvs_set_error(h, KVS_EINVAL, "build_meta: reqs, buf or len is NULL");
    step_req *steps = malloc((n_reqs ? n_reqs : 1) * sizeof *steps);
    if (!steps) return kvs_set_error(h, KVS_ENOMEM, "build_meta: out of memory");
    h->reqs.step_marks++;
    for (uint64_t i = 0; i < n_reqs; i++)
        if ((st = check_step_request(h, &reqs[i], &steps[i])) != KVS_OK) {
            free(steps);
            return st;
        }
    return build(h, "build_meta", steps, n_reqs, buf, cap, len);
}

kvs_status kvs_reqs_build_meta_update(kvs_handle *h, const kvs_step_update *reqs, uint64_t n_reqs,
                                      void *buf, uint64_t cap, uint64_t *len) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "build_meta_update");
    if (st != KVS_OK) return st;
    if (!len || (n_reqs && !reqs) || (cap && !buf))
        return kvs_set_error(h, KVS_EINVAL, "build_meta_update: reqs, buf or len is NULL");
    uint32_t size = n_reqs ? reqs[0].struct_size : (uint32_t)sizeof *reqs;
    if (size < KVS_STEP_UPDATE_SIZE_1_10)
        return kvs_set_error(h, KVS_EINVAL,
                             "build_meta_update: reqs[0].struct_size %u is below the 1.10 size %u",
                             size, KVS_STEP_UPDATE_SIZE_1_10);
    step_req *steps = malloc((n_reqs ? n_reqs : 1) * sizeof *steps);
    if (!steps) return kvs_set_error(h, KVS_ENOMEM, "build_meta_update: out of memory");
    h->reqs.step_marks++;
    const uint8_t *at = (const uint8_t *)reqs;
    for (uint64_t i = 0; i < n_reqs; i++, at += size) {
        kvs_step_update u;
        if (((const kvs_step_update *)(const void *)at)->struct_size != size)
            st = kvs_set_error(h, KVS_EINVAL,
                               "build_meta_update: reqs[%llu].struct_size %u differs from "
                               "reqs[0]'s %u",
                               (unsigned long long)i,
                               ((const kvs_step_update *)(const void *)at)->struct_size, size);
        else {
            kvs_struct_in(&u, sizeof u, at, KVS_STEP_UPDATE_SIZE_1_10);
            st = check_update(h, &u, &steps[i]);
        }
        if (st != KVS_OK) {
            free(steps);
            return st;
        }
    }
    return build(h, "build_meta_update", steps, n_reqs, buf, cap, len);
}
