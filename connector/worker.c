/* worker.c - the worker's step: bind_meta checks a step's metadata against the registered pages and
 * turns it into load and save work; reset drops that work (unpinning, freeing slabs, aborting
 * reservations) once the step is done. The loads are worker_load.c's, the saves worker_save.c's. */
#include "worker.h"

#include <stdlib.h>
#include <string.h>

#include "handle.h"
#include "last_error.h"
#include "role.h"
#include "worker_async.h"
#include "worker_load.h"
#include "worker_saver.h"

static kvs_status check_req_spans(kvs_handle *h, const kvs_meta_req *r) {
    char why[256];
    const kvs_layer_view *fewest =
        &h->worker.views[h->worker.fewest_blocks_layer]; /* a block id fits every layer */
    /* the spans run over the carried block ids, which start at the request's block_first */
    uint64_t base = kvs_meta_token_base(r, h->model.block_tokens);
    for (uint64_t i = 0; i < r->n_loads; i++)
        if (r->loads[i].first_token < base)
            return kvs_set_error(h, KVS_EINVAL,
                                 "bind_meta: request '%s': a load at token %llu lies before its "
                                 "block ids (from block %llu)",
                                 r->id, (unsigned long long)r->loads[i].first_token,
                                 (unsigned long long)r->block_first);
    for (uint64_t i = 0; i < r->n_saves; i++)
        if (r->saves[i].chunk_first < base)
            return kvs_set_error(h, KVS_EINVAL,
                                 "bind_meta: request '%s': a save at token %llu lies before its "
                                 "block ids (from block %llu)",
                                 r->id, (unsigned long long)r->saves[i].chunk_first,
                                 (unsigned long long)r->block_first);
    for (uint64_t i = 0; i < r->n_loads; i++) {
        kvs_token_span span = {r->block_ids, r->n_block_ids, r->loads[i].first_token - base,
                               r->loads[i].n_tokens};
        if (kvs_kernel_check_span(fewest, &h->shape, &span, why, sizeof why) != KVS_OK)
            return kvs_set_error(h, KVS_EINVAL, "bind_meta: request '%s': load: layer %u: %s",
                                 r->id, h->worker.fewest_blocks_layer, why);
    }
    if (r->n_layer_bytes) { /* the layer mask: one bit per layer, none past the last */
        uint32_t nl = h->model.n_layers, bits = r->n_layer_bytes * 8;
        int stray = r->n_layer_bytes != (nl + 7) / 8;
        for (uint32_t l = nl; !stray && l < bits; l++) stray = r->layers[l / 8] >> (l % 8) & 1;
        if (stray)
            return kvs_set_error(
                h, KVS_EINVAL,
                "bind_meta: request '%s': its layer mask (%u bytes) does not fit a "
                "%u-layer model",
                r->id, r->n_layer_bytes, nl);
    }
    for (uint64_t i = 0; i < r->n_saves; i++) {
        kvs_token_span span = {r->block_ids, r->n_block_ids, r->saves[i].chunk_first - base,
                               h->chunk_tokens};
        if (kvs_kernel_check_span(fewest, &h->shape, &span, why, sizeof why) != KVS_OK)
            return kvs_set_error(h, KVS_EINVAL, "bind_meta: request '%s': save: layer %u: %s",
                                 r->id, h->worker.fewest_blocks_layer, why);
    }
    return KVS_OK;
}

void kvs_worker_reset(kvs_handle *h) {
    for (uint64_t i = 0; i < h->worker.n_loads; i++) {
        kvs_load_work *w = &h->worker.loads[i];
        if (w->pinned) kvs_tiers_unpin(h->tiers, (uint32_t)w->tier, &w->load->key);
        if (w->slab) kvs_pool_free(h->pool, w->slab);
        free(w->layer_hash);
        free(w->kept);
    }
    for (uint64_t i = 0; i < h->worker.n_saves; i++) {
        kvs_save_work *w = &h->worker.saves[i];
        if (w->slab)
            kvs_pool_free(h->pool, w->slab);
        else if (w->object)
            kvs_tiers_abort(h->tiers, w->ticket);
    }
    free(h->worker.loads);
    free(h->worker.saves);
    h->worker.loads = NULL;
    h->worker.saves = NULL;
    h->worker.n_loads = h->worker.n_saves = 0;
    kvs_meta_free(h->worker.bound);
    h->worker.bound = NULL;
    h->worker.wstate = WORKER_IDLE;
    h->worker.layers_loaded = 0;
    h->device.loads_pending = 0;
    if (h->worker.layer_saved) memset(h->worker.layer_saved, 0, h->worker.n_views);
    if (h->worker.layer_loaded) memset(h->worker.layer_loaded, 0, h->worker.n_views);
}

/* The error blocks a load_error_blocks call returned are done with; the others stay reported. */
static void drop_taken_errors(kvs_handle *h) {
    uint64_t taken = h->worker.error_blocks_taken < h->worker.n_error_blocks
                         ? h->worker.error_blocks_taken
                         : h->worker.n_error_blocks;
    if (taken && taken < h->worker.n_error_blocks)
        memmove(h->worker.error_blocks, h->worker.error_blocks + taken,
                (h->worker.n_error_blocks - taken) * sizeof *h->worker.error_blocks);
    h->worker.n_error_blocks -= taken;
    h->worker.error_blocks_taken = 0;
}

/* A step still bound when the next one binds ran no forward pass: its loads land (or fail: start_load
 * never ran) so their failures are reported, its saves are dropped (no layer was gathered). */
static void close_step(kvs_handle *h) {
    if (h->worker.wstate != WORKER_IDLE) {
        kvs_worker_land_step_loads(h);
        if (!h->device.dev_info.synchronous && h->device.dev) {
            char why[512];
            h->device.dev->sync(h->device.dev_state, why,
                                sizeof why); /* no copy may still touch a slab */
        }
        h->stats.saves_skipped += h->worker.n_saves;
        kvs_worker_reset(h);
        h->stats.steps_closed++;
    }
    drop_taken_errors(h);
}

/* The metadata decoded, and built for this worker's model, key ranks, layout and chunk size. */
static kvs_status decode_meta(kvs_handle *h, const void *meta, uint64_t len, kvs_meta **out) {
    char why[256];
    kvs_meta *m = NULL;
    kvs_status st = kvs_meta_decode(meta, len, h->key_rank, &m, why, sizeof why);
    if (st != KVS_OK) return kvs_set_error(h, st, "bind_meta: %s", why);
    if (m->key_ranks != h->key_ranks) { /* the group fingerprint differs too: say why */
        uint32_t theirs = m->key_ranks;
        kvs_meta_free(m);
        return kvs_set_error(h, KVS_EINVAL,
                             "bind_meta: metadata carries the keys of %u tensor-parallel ranks, "
                             "this worker's model has %u (tp_size %u%s): a scheduler of another "
                             "tensor-parallel size built it",
                             theirs, h->key_ranks, h->model.tp_size,
                             h->model.is_mla ? ", MLA: one rank-agnostic key" : "");
    }
    if (memcmp(&m->group_fingerprint, &h->group_fingerprint, sizeof m->group_fingerprint) != 0 ||
        m->chunk_tokens != h->chunk_tokens) {
        kvs_meta_free(m);
        return kvs_set_error(
            h, KVS_EINVAL, "bind_meta: metadata was built for another model, layout or chunk size");
    }
    *out = m;
    return KVS_OK;
}

/* What a bind allocates before it changes any state: the step's load and save work and the
 * async requests' jobs. */
typedef struct bind_work {
    uint64_t n_loads, n_saves, n_async;
    kvs_load_work *loads;
    kvs_save_work *saves;
    kvs_async_job **jobs;
} bind_work;

/* Every request's spans checked; the step's loads (async ones aside) and saves counted. */
static kvs_status count_work(kvs_handle *h, const kvs_meta *m, bind_work *w) {
    for (uint64_t i = 0; i < m->n_reqs; i++) {
        kvs_status st = check_req_spans(h, &m->reqs[i]);
        if (st != KVS_OK) return st;
        if (!m->reqs[i].load_async) w->n_loads += m->reqs[i].n_loads;
        w->n_saves += m->reqs[i].n_saves;
    }
    return KVS_OK;
}

/* Room for every error block the loads still to land may add (a step still bound, async requests
 * not landed, this step's), so that a failed load is never left off the list. */
static uint64_t error_room(kvs_handle *h, const kvs_meta *m) {
    uint64_t room = h->worker.error_blocks_async;
    for (uint64_t i = 0; h->worker.wstate != WORKER_IDLE && i < h->worker.n_loads; i++)
        room += kvs_load_error_span(h, h->worker.loads[i].load);
    for (uint64_t i = 0; i < m->n_reqs; i++)
        for (uint64_t j = 0; j < m->reqs[i].n_loads; j++)
            room += kvs_load_error_span(h, &m->reqs[i].loads[j]);
    return room;
}

/* Everything is allocated before any state changes, so a refusal leaves the handle as it was
 * (the step still bound stays bound); on one, what was allocated goes. */
static kvs_status prepare_work(kvs_handle *h, const kvs_meta *m, bind_work *w) {
    kvs_status st = KVS_OK;
    for (uint64_t i = 0; i < m->n_reqs; i++) w->n_async += m->reqs[i].load_async;
    w->loads = w->n_loads ? calloc(w->n_loads, sizeof *w->loads) : NULL;
    w->saves = w->n_saves ? calloc(w->n_saves, sizeof *w->saves) : NULL;
    w->jobs = w->n_async ? calloc(w->n_async, sizeof *w->jobs) : NULL;
    if ((w->n_loads && !w->loads) || (w->n_saves && !w->saves) || (w->n_async && !w->jobs))
        st = kvs_set_error(h, KVS_ENOMEM, "bind_meta: out of memory");
    uint64_t room = error_room(h, m);
    if (st == KVS_OK && kvs_worker_reserve_error_blocks(h, room) != KVS_OK)
        st = kvs_set_error(h, KVS_ENOMEM,
                           "bind_meta: out of memory for the list of error blocks (%llu more); "
                           "the step is not bound",
                           (unsigned long long)room);
    for (uint64_t i = 0, k = 0; i < m->n_reqs && st == KVS_OK; i++)
        if (m->reqs[i].load_async) /* even with nothing to load (a plan recomputes it all) */
            st = kvs_async_prepare(h, &m->reqs[i], &w->jobs[k++]);
    if (st != KVS_OK) {
        for (uint64_t k = 0; w->jobs && k < w->n_async; k++) kvs_async_discard(w->jobs[k]);
        free(w->jobs);
        free(w->loads);
        free(w->saves);
    }
    return st;
}

/* The step binds m: the previous one (if still bound) ends, its loads and saves become the
 * worker's, async loads read by now land, and the async requests' jobs are submitted. */
static void bind_step(kvs_handle *h, kvs_meta *m, const bind_work *w) {
    close_step(h);
    h->worker.loads = w->loads;
    h->worker.saves = w->saves;
    for (uint64_t i = 0; i < m->n_reqs; i++) {
        const kvs_meta_req *r = &m->reqs[i];
        for (uint64_t j = 0; j < r->n_loads && !r->load_async; j++)
            h->worker.loads[h->worker.n_loads++] =
                (kvs_load_work){.req = r, .load = &r->loads[j], .tier = -1};
        for (uint64_t j = 0; j < r->n_saves; j++)
            h->worker.saves[h->worker.n_saves++] = (kvs_save_work){.req = r, .save = &r->saves[j]};
    }
    kvs_async_land(h); /* between steps: async loads read by now land before this step binds */
    h->worker.bound = m;
    h->worker.wstate = WORKER_BOUND;
    for (uint64_t k = 0; k < w->n_async; k++) kvs_async_submit(h, w->jobs[k]);
    free(w->jobs);
}

kvs_status kvs_worker_bind(kvs_handle *h, const void *meta, uint64_t len) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "bind_meta");
    if (st != KVS_OK) return st;
    if (!h->worker.views)
        return kvs_set_error(h, KVS_ESTATE, "bind_meta: register_kv has not been called");
    kvs_meta *m = NULL;
    if ((st = decode_meta(h, meta, len, &m)) != KVS_OK) return st;
    bind_work w = {0};
    if ((st = count_work(h, m, &w)) != KVS_OK) {
        kvs_meta_free(m);
        return st;
    }
    /* The requests finished with their pages kept are remembered even if this bind fails below
     * (out of memory): the scheduler finished them, and get_finished must report them. */
    if ((st = kvs_saver_note_finished(h, m)) != KVS_OK) {
        kvs_meta_free(m);
        return kvs_set_error(h, st, "bind_meta: out of memory for the finished requests");
    }
    if ((st = prepare_work(h, m, &w)) != KVS_OK) {
        kvs_meta_free(m);
        return st;
    }
    bind_step(h, m, &w); /* the metadata is good: the previous step, if still bound, ends here */
    return KVS_OK;
}
