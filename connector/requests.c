/* requests.c - the scheduler-role hooks over the handle's request table (requests.h): lookup with
 * leases, on_alloc, request_finished, plan caps and stages; build_meta is step_meta.c's. Per-request
 * state lives in a small hash table keyed by request id. */
#include "requests.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "abi/kvstrata_lossy.h"
#include "abi/kvstrata_plans.h"
#include "common/clock.h"
#include "common/log.h"
#include "connector/ext/plans/plan_state.h"
#include "connector/ext/plans/restore.h"
#include "handle.h"
#include "keys.h"
#include "last_error.h"
#include "lookup_remote.h"
#include "request_tokens.h"
#include "role.h"

/* --- request table ------------------------------------------------------------------------------- */

static kvs_request **bucket_of(kvs_handle *h, const char *id) {
    return &h->reqs.buckets[XXH3_64bits(id, strlen(id)) % KVS_REQ_BUCKETS];
}

kvs_request *kvs_reqs_find(kvs_handle *h, const char *id) {
    for (kvs_request *r = *bucket_of(h, id); r; r = r->next)
        if (strcmp(r->id, id) == 0) return r;
    return NULL;
}

const kvs_restore_plan *kvs_reqs_last_plan(kvs_handle *h, const char *req_id) {
    const kvs_request *r = kvs_reqs_find(h, req_id);
    return r && r->plan_step == h->reqs.step && h->reqs.step != 0 ? &r->plan : NULL;
}

kvs_status kvs_reqs_set_plan_caps(kvs_handle *h, uint32_t caps) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "set_plan_caps");
    if (st != KVS_OK) return st;
    const uint32_t known =
        KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER | KVS_PLAN_CAP_STAGE | KVS_PLAN_CAP_MASK;
    if (caps & ~known)
        return kvs_set_error(
            h, KVS_ENOTSUP, "set_plan_caps: unknown capability bits 0x%x (this library knows 0x%x)",
            caps & ~known, known);
    if (h->reqs.n_requests)
        return kvs_set_error(h, KVS_ESTATE,
                             "set_plan_caps: call it before the first lookup (%llu requests known)",
                             (unsigned long long)h->reqs.n_requests);
    if ((caps & KVS_PLAN_CAP_STAGE) && h->plans->stages.n_stages < 2)
        return kvs_set_error(h, KVS_ESTATE,
                             "set_plan_caps: KVS_PLAN_CAP_STAGE needs the stages described first "
                             "(set_stages)");
    h->plans->plan_caps = caps;
    /* token mode only, layer mode only, or each request's faster one */
    caps &= KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER;
    h->plans->restore_params.l_delta = caps == KVS_PLAN_CAP_LAYER   ? UINT32_MAX
                                       : caps == KVS_PLAN_CAP_TOKEN ? 1
                                                                    : 0;
    return KVS_OK;
}

kvs_status kvs_reqs_set_stages(kvs_handle *h, const kvs_stage_desc *d) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "set_stages");
    if (st != KVS_OK) return st;
    kvs_stage_desc copy;
    if (!d || kvs_struct_in(&copy, sizeof copy, d, KVS_STAGE_DESC_SIZE_1_4) != 0)
        return kvs_set_error(h, KVS_EINVAL,
                             "set_stages: stages is NULL or its struct_size %u is below %u",
                             d ? d->struct_size : 0, KVS_STAGE_DESC_SIZE_1_4);
    d = &copy;
    if (h->reqs.n_requests || h->plans->plan_caps)
        return kvs_set_error(h, KVS_ESTATE,
                             "set_stages: call it before set_plan_caps and the first lookup");
    if (d->n_stages < 2 || d->n_stages > KVS_MAX_STAGES || d->boundary_layers == 0 ||
        d->n_kv_layers < d->n_stages)
        return kvs_set_error(h, KVS_EINVAL,
                             "set_stages: %u stages over %u KV layers with %u layers per boundary "
                             "(want 2..%u stages, at most one per layer, >= 1 layer per boundary)",
                             d->n_stages, d->n_kv_layers, d->boundary_layers, KVS_MAX_STAGES);
    uint64_t want = d->n_kv_layers + (uint64_t)(d->n_stages - 1) * d->boundary_layers;
    if (want != h->model.n_layers)
        return kvs_set_error(h, KVS_EINVAL,
                             "set_stages: %u KV layers and %u boundaries of %u layers make %llu "
                             "registered layers, but the model has %u",
                             d->n_kv_layers, d->n_stages - 1, d->boundary_layers,
                             (unsigned long long)want, h->model.n_layers);
    for (uint32_t s = 0; s < d->n_stages; s++)
        if ((s == 0 && d->first_layer[0] != 0) ||
            (s > 0 && d->first_layer[s] <= d->first_layer[s - 1]) ||
            d->first_layer[s] >= d->n_kv_layers)
            return kvs_set_error(
                h, KVS_EINVAL,
                "set_stages: first_layer[%u] = %u: stages must start at layer 0 and "
                "at increasing layers below %u",
                s, d->first_layer[s], d->n_kv_layers);
    h->plans->stages = (cf_stages){.n_stages = d->n_stages,
                                   .boundary_bytes_per_token =
                                       d->boundary_layers * (h->layer_bytes / h->chunk_tokens),
                                   .read_all_boundaries = 1}; /* restore.c loads every boundary */
    memcpy(h->plans->stages.first_layer, d->first_layer, d->n_stages * sizeof d->first_layer[0]);
    h->plans->restore_params.n_layers = d->n_kv_layers; /* plans price the KV layers only */
    return KVS_OK;
}

kvs_request *kvs_reqs_create(kvs_handle *h, const char *id) {
    kvs_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    memcpy(r->id, id, strlen(id) + 1);
    r->lossy_from = r->lossy_loaded = UINT64_MAX;
    kvs_request **b = bucket_of(h, id);
    r->next = *b;
    *b = r;
    h->reqs.n_requests++;
    return r;
}

/* The tier a chunk loads from, given its pins: the lowest (slowest) of its ranks' shards. */
uint32_t kvs_reqs_chunk_tier(const kvs_handle *h, const kvs_pin *pins) {
    uint32_t t = pins[0].tier;
    for (uint32_t q = 1; q < h->key_ranks; q++)
        if (pins[q].tier > t) t = pins[q].tier;
    return t;
}

/* The slowest (lowest) tier holding any pinned chunk of r: what `loads.async: slow` judges by. */
static uint32_t slowest_tier(const kvs_request *r) {
    uint32_t t = 0;
    for (uint64_t i = 0; i < r->n_pins; i++)
        if (r->pins[i].tier > t) t = r->pins[i].tier;
    return t;
}

/* Unpin r's pins from index `from` on and keep only those before it: one call into a tier per run
 * of pins in that tier (64 at most). */
static void unpin_from(kvs_handle *h, kvs_request *r, uint64_t from) {
    kvs_key batch[64];
    for (uint64_t i = from; i < r->n_pins;) {
        uint32_t tier = r->pins[i].tier;
        uint64_t n = 0;
        while (i < r->n_pins && r->pins[i].tier == tier && n < 64) batch[n++] = r->pins[i++].key;
        kvs_tiers_unpin_many(h->tiers, tier, batch, n);
    }
    if (from < r->n_pins) r->n_pins = from;
}

/* Count r's pins as an active lease (once). */
static void count_lease(kvs_handle *h, kvs_request *r) {
    if (r->n_pins && !r->lease_counted) {
        r->lease_counted = 1;
        h->stats.leases_active++;
    }
}

void kvs_reqs_release_lease(kvs_handle *h, kvs_request *r) {
    unpin_from(h, r, 0);
    if (r->lease_counted) h->stats.leases_active--;
    r->lease_counted = 0;
    free(r->pins);
    r->pins = NULL;
    r->n_pins = 0;
    r->lease_release_step = 0;
}

void kvs_reqs_set_async_waiting(kvs_handle *h, kvs_request *r, uint8_t waiting) {
    if (r->async_waiting == waiting) return;
    r->async_waiting = waiting;
    if (waiting)
        h->reqs.async_waiting++;
    else
        h->reqs.async_waiting--;
}

static void destroy_request(kvs_handle *h, kvs_request *r) {
    kvs_request **p = bucket_of(h, r->id);
    while (*p != r) p = &(*p)->next;
    *p = r->next;
    kvs_reqs_set_async_waiting(h, r, 0);
    kvs_reqs_release_lease(h, r);
    if (r->rlookup) kvs_rlookup_drop(h->rlookups, r->rlookup);
    kvs_tokens_give(h, r->tokens, r->tokens_cap); /* the larger buffer stays for the next request */
    kvs_request_free_held(r);
    free(r->keys);
    free(r->block_ids);
    free(r);
    h->reqs.n_requests--;
}

void kvs_reqs_release_all(kvs_handle *h) {
    for (int b = 0; b < KVS_REQ_BUCKETS; b++)
        while (h->reqs.buckets[b]) destroy_request(h, h->reqs.buckets[b]);
    free(h->spare_tokens);
    h->spare_tokens = NULL;
    h->spare_cap = 0;
    free(h->reqs.kept_finished);
    h->reqs.kept_finished = NULL;
    h->reqs.n_kept_finished = h->reqs.cap_kept_finished = 0;
}

/* The clock leases run on: the handle's (CLOCK_MONOTONIC unless a test set a manual one). */
static uint64_t lease_now_ns(const kvs_handle *h) {
    return kvs_clock_now_ns(h->reqs.clock);
}

/* The one expiry rule, whichever hook notices it first: a lease past its deadline releases its pins
 * and is counted once. A load on_alloc accepted stays armed: the engine already counts those tokens
 * as loaded, so build_meta still emits it, and a chunk evicted meanwhile fails its load and comes
 * back through load_error_blocks (the engine recomputes it) instead of being silently dropped. */
static void expire_lease(kvs_handle *h, kvs_request *r, uint64_t now) {
    if (!r->n_pins || now <= r->lease_deadline_ns) return;
    kvs_log(h->cfg->log_level, KVS_LOG_WARN, "request '%s': lease of %llu chunks expired%s", r->id,
            (unsigned long long)(r->n_pins / h->key_ranks),
            r->load_pending ? " (its load stays armed)" : "");
    kvs_reqs_release_lease(h, r);
    h->stats.leases_expired++;
}

/* r's lease runs until deadline; the sweep looks again by then. */
static void set_lease_deadline(kvs_handle *h, kvs_request *r, uint64_t deadline) {
    r->lease_deadline_ns = deadline;
    if (deadline < h->reqs.lease_sweep_ns) h->reqs.lease_sweep_ns = deadline;
}

/* Every lookup and build_meta sweeps: the walk over the request table runs only once the earliest
 * deadline set since the last walk has passed (a lease released or renewed since leaves that time
 * early, which costs a walk that expires nothing, never a missed expiry). */
void kvs_reqs_expire_leases(kvs_handle *h) {
    uint64_t now = lease_now_ns(h);
    if (now <= h->reqs.lease_sweep_ns) return;
    uint64_t next = UINT64_MAX;
    for (int b = 0; b < KVS_REQ_BUCKETS; b++)
        for (kvs_request *r = h->reqs.buckets[b]; r; r = r->next) {
            expire_lease(h, r, now);
            if (r->n_pins && r->lease_deadline_ns < next) next = r->lease_deadline_ns;
        }
    h->reqs.lease_sweep_ns = next;
}

/* --- argument checks ------------------------------------------------------------------------------ */

kvs_status kvs_reqs_check_id(kvs_handle *h, const char *hook, const char *id) {
    if (!id) return kvs_set_error(h, KVS_EINVAL, "%s: request id is NULL", hook);
    size_t n = strnlen(id, KVS_REQ_ID_MAX);
    if (n == 0 || n >= KVS_REQ_ID_MAX)
        return kvs_set_error(h, KVS_EINVAL, "%s: request id must be 1..%d bytes", hook,
                             KVS_REQ_ID_MAX - 1);
    return KVS_OK;
}

/* --- key inputs ---------------------------------------------------------------------------------- */

kvs_status kvs_reqs_request_key_input(kvs_handle *h, const char *req_id, uint64_t from_token,
                                      const void *bytes, uint64_t len) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "request_key_input");
    if (st == KVS_OK) st = kvs_reqs_check_id(h, "request_key_input", req_id);
    if (st != KVS_OK) return st;
    if (!bytes || len == 0)
        return kvs_set_error(h, KVS_EINVAL,
                             "request_key_input: request '%s': the input is %s (1..%u bytes)",
                             req_id, bytes ? "empty" : "NULL", KVS_KEY_INPUT_BYTES_MAX);
    kvs_request *r = kvs_reqs_find(h, req_id);
    int created = 0;
    if (!r) {
        if (!(r = kvs_reqs_create(h, req_id)))
            return kvs_set_error(h, KVS_ENOMEM, "request_key_input: out of memory for request '%s'",
                                 req_id);
        created = 1;
    }
    st = kvs_request_add_key_input(h, r, from_token, bytes, len);
    if (st != KVS_OK && created) destroy_request(h, r);
    return st;
}

/* --- lookup and on_alloc -------------------------------------------------------------------------- */

/* The tier holding key for a lookup, or -1. With remote lookups asynchronous (h->rlookups), remote
 * tiers are never asked here: chunk c is in one when the request's answered query says so. */
static int holding_tier(kvs_handle *h, const kvs_request *r, const kvs_key *key, uint64_t c) {
    if (!h->rlookups) return kvs_tiers_find(h->tiers, key);
    int t = kvs_tiers_find_local(h->tiers, key);
    if (t < 0 && r->rlookup && kvs_rlookup_done(h->rlookups, r->rlookup))
        t = kvs_rlookup_tier(r->rlookup, c);
    return t;
}

/* Pin the whole chunks from c on that the top tier holds, in one call: returns how many (a chunk
 * some of whose ranks' keys it lacks is not pinned). */
static uint64_t pin_top_run(kvs_handle *h, kvs_request *r, uint64_t c, uint64_t end) {
    if (h->rlookups && kvs_tiers_is_remote(h->tiers, 0)) return 0; /* asked on the thread */
    uint32_t ranks = h->key_ranks;
    const kvs_key *k = kvs_chunk_keys(h, r->keys, c);
    uint64_t pinned =
        kvs_tiers_pin_many(h->tiers, 0, k, (end - c) * ranks, h->cfg->lease_timeout_ms);
    uint64_t whole = pinned / ranks * ranks;
    kvs_tiers_unpin_many(h->tiers, 0, k + whole, pinned - whole);
    for (uint64_t i = 0; i < whole; i++) r->pins[r->n_pins++] = (kvs_pin){k[i], 0};
    return whole / ranks;
}

/* Pin chunk c wherever each rank's key of it is (the first tier holding it): 0 if one is missing. */
static int pin_chunk(kvs_handle *h, kvs_request *r, uint64_t c) {
    const kvs_key *k = kvs_chunk_keys(h, r->keys, c);
    for (uint32_t q = 0; q < h->key_ranks; q++) {
        int t = holding_tier(h, r, &k[q], c);
        /* Remote objects are not leased (their pin only asks again); with asynchronous lookups the
         * query's answer stands for it. */
        int asked = t >= 0 && h->rlookups && kvs_tiers_is_remote(h->tiers, (uint32_t)t);
        if (t < 0 ||
            (!asked && !kvs_tiers_pin(h->tiers, (uint32_t)t, &k[q], h->cfg->lease_timeout_ms))) {
            unpin_from(h, r, r->n_pins - q); /* the ranks of this chunk pinned before the gap */
            return 0;                        /* missing, or evicted between find and pin */
        }
        r->pins[r->n_pins++] = (kvs_pin){k[q], (uint32_t)t};
    }
    return 1;
}

/* Pin the stored run of chunks [first, end) (end clipped to the request's keys); returns how many are
 * pinned. A chunk is stored when every key rank's shard of it is: all of them are pinned, or none.
 * Runs the top tier holds are pinned in one call each, a chunk it lacks in the first tier holding
 * it; the run ends at the first chunk no tier holds. */
static uint64_t pin_run(kvs_handle *h, kvs_request *r, uint64_t first, uint64_t end) {
    if (end > r->n_keys) end = r->n_keys;
    free(r->pins); /* called with no pins held */
    r->n_pins = 0;
    r->pins = end > first ? calloc((end - first) * h->key_ranks, sizeof *r->pins) : NULL;
    if (!r->pins) return 0;
    uint64_t c = first;
    while (c < end) {
        c += pin_top_run(h, r, c, end);
        if (c == end || !pin_chunk(h, r, c)) break;
        c++;
    }
    return c - first;
}

/* 1 if every rank's key of chunk c is in a tier that is not remote. */
static int chunk_local(kvs_handle *h, const kvs_request *r, uint64_t c) {
    const kvs_key *k = kvs_chunk_keys(h, r->keys, c);
    for (uint32_t q = 0; q < h->key_ranks; q++)
        if (kvs_tiers_find_local(h->tiers, &k[q]) < 0) return 0;
    return 1;
}

/* loads.remote_lookups async: 1 when r's chunks [first, n_keys) can be looked up now (the other
 * tiers hold them all, or the remote tiers' answer for exactly these chunks is in and no older than
 * a lease), 0 while a query runs (one is submitted if none matches). Without a thread (none could
 * start, out of memory) it answers 1 and the remote tiers say nothing: their chunks are misses. */
static int remote_answer(kvs_handle *h, kvs_request *r, uint64_t first) {
    if (!h->rlookups || first >= r->n_keys) return 1;
    uint64_t n = r->n_keys - first, now = lease_now_ns(h);
    const kvs_key *keys = kvs_chunk_keys(h, r->keys, first);
    kvs_rlookup *l = r->rlookup;
    if (l && (!kvs_rlookup_matches(l, keys, first, n, h->key_ranks) ||
              now - kvs_rlookup_submitted_ns(l) > h->cfg->lease_timeout_ms * 1000000ull)) {
        kvs_rlookup_drop(h->rlookups, l);
        l = r->rlookup = NULL;
    }
    if (!l) {
        uint8_t *local = malloc(n);
        if (!local) return 1;
        uint64_t held = 0;
        for (uint64_t i = 0; i < n; i++) held += local[i] = (uint8_t)chunk_local(h, r, first + i);
        if (held < n)
            l = r->rlookup =
                kvs_rlookup_submit(h->rlookups, keys, first, n, h->key_ranks, local, now);
        free(local);
        /* A new query is unknown even when its thread answers before this returns: the engine
         * always sees the same answer for the same state, whatever the threads' timing. */
        return l == NULL;
    }
    return kvs_rlookup_done(h->rlookups, l);
}

/* Which chunks of the pinned run [first, first + run) load lossy (a compress tier stored some key
 * rank's object of it with a lossy codec): lossy[i] for chunk first + i, LOSSY_ANY, plus
 * LOSSY_DROPPED when that codec drops tokens. NULL when no tier knows codecs, or out of memory
 * (every chunk then counts as raw: a load still checks the object). */
#define LOSSY_ANY     1u
#define LOSSY_DROPPED 2u
static uint8_t *lossy_chunks(kvs_handle *h, const kvs_request *r, uint64_t run) {
    /* Lossy and derived objects come from compress tiers; another process's, through a shared tier,
     * only matter to an engine that takes them (without accept_lossy its loads refuse them). */
    if (!run || (!kvs_tiers_know_codecs(h->tiers) && !h->cfg->loads.accept_lossy)) return NULL;
    uint64_t n = run * h->key_ranks;
    kvs_key *keys = malloc(n * sizeof *keys);
    uint32_t *tiers = malloc(n * sizeof *tiers);
    uint16_t *codecs = malloc(n * sizeof *codecs);
    uint8_t *lossy = calloc(run, 1);
    if (keys && tiers && codecs && lossy) {
        for (uint64_t i = 0; i < n; i++) keys[i] = r->pins[i].key, tiers[i] = r->pins[i].tier;
        kvs_tiers_codecs(h->tiers, keys, tiers, n, codecs);
        for (uint64_t i = 0; i < n; i++)
            lossy[i / h->key_ranks] |= (uint8_t)((codecs[i] != 0 ? LOSSY_ANY : 0) |
                                                 (codecs[i] == KVS_CODEC_DROP ? LOSSY_DROPPED : 0));
    } else {
        free(lossy);
        lossy = NULL;
    }
    free(keys);
    free(tiers);
    free(codecs);
    return lossy;
}

/* The lookup's arguments: the role, the id, the result's size (into *out_size), n_computed. */
static kvs_status lookup_args(kvs_handle *h, const char *req_id, uint64_t n_tokens,
                              uint64_t n_computed, const kvs_lookup_result *out,
                              uint32_t *out_size) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "lookup");
    if (st == KVS_OK) st = kvs_reqs_check_id(h, "lookup", req_id);
    if (st != KVS_OK) return st; /* the tokens are checked as they are hashed */
    *out_size = out ? kvs_struct_out_size(out, sizeof *out, KVS_LOOKUP_RESULT_SIZE_1_0) : 0;
    if (!*out_size)
        return kvs_set_error(
            h, KVS_EINVAL,
            "lookup: the result is NULL or its struct_size %u is below the 1.0 size %u",
            out ? out->struct_size : 0, KVS_LOOKUP_RESULT_SIZE_1_0);
    if (n_computed > n_tokens)
        return kvs_set_error(h, KVS_EINVAL,
                             "lookup: request '%s': n_computed %llu exceeds n_tokens %llu", req_id,
                             (unsigned long long)n_computed, (unsigned long long)n_tokens);
    return KVS_OK;
}

/* The request looked up (created at its first sighting) with its tokens hashed into its keys; a
 * request created here goes again when its tokens are refused. */
static kvs_status lookup_request(kvs_handle *h, const char *req_id, const int32_t *tokens,
                                 uint64_t n_tokens, kvs_request **out) {
    kvs_request *r = kvs_reqs_find(h, req_id);
    int created = 0;
    if (!r) {
        if (!(r = kvs_reqs_create(h, req_id)))
            return kvs_set_error(h, KVS_ENOMEM, "lookup: out of memory for request '%s'", req_id);
        created = 1;
    }
    if (!r->keys_fixed) r->prompt_tokens = n_tokens; /* its first sighting (inputs aside) */
    kvs_status st = kvs_request_set_tokens(h, r, "lookup", tokens, n_tokens);
    if (st != KVS_OK) {
        if (created) destroy_request(h, r);
        return st;
    }
    *out = r;
    return KVS_OK;
}

/* Nothing offered: the engine computes from n_computed on. */
static void offer_nothing(kvs_handle *h, kvs_request *r, uint64_t n_computed) {
    r->n_local = n_computed;
    r->hit_tokens = r->offered = r->external = 0;
    r->load_pending = r->load_async = 0;
    kvs_reqs_set_async_waiting(h, r, 0);
    r->lossy_from = UINT64_MAX;
}

/* The pinned run cut before the first chunk the engine refuses: lossy chunks without
 * accept_lossy, and chunks with tokens dropped unless it also masks them (KVS_PLAN_CAP_MASK);
 * returns the run left. */
static uint64_t cut_refused(kvs_handle *h, kvs_request *r, const uint8_t *lossy, uint64_t run) {
    uint8_t refused = !h->cfg->loads.accept_lossy                  ? LOSSY_ANY
                      : !(h->plans->plan_caps & KVS_PLAN_CAP_MASK) ? LOSSY_DROPPED
                                                                   : 0;
    /* an asynchronous load refuses them too (it lands between steps, where load_dropped cannot
     * tell the engine what to mask): judged on the whole run, before any cut */
    if (!refused && kvs_restore_load_async(h, slowest_tier(r))) refused = LOSSY_DROPPED;
    uint64_t clean = 0;
    while (clean < run && !(lossy[clean] & refused)) clean++;
    if (clean < run) unpin_from(h, r, clean * h->key_ranks);
    return clean;
}

/* Of the offered tokens [n_computed, end), those in lossy chunks of the run from chunk first;
 * r->lossy_from set to the first such chunk's first token (UINT64_MAX: none). */
static uint64_t lossy_offered(const kvs_handle *h, kvs_request *r, const uint8_t *lossy,
                              uint64_t first, uint64_t run, uint64_t n_computed, uint64_t end) {
    uint64_t C = h->chunk_tokens, lossy_tokens = 0;
    r->lossy_from = UINT64_MAX;
    for (uint64_t i = 0; lossy && i < run && (first + i) * C < end; i++) {
        uint64_t lo = (first + i) * C, hi = lo + C;
        if (lo < n_computed) lo = n_computed;
        if (hi > end) hi = end;
        if (lossy[i] && hi > lo) {
            lossy_tokens += hi - lo;
            if (r->lossy_from == UINT64_MAX) r->lossy_from = (first + i) * C;
        }
    }
    return lossy_tokens;
}

/* The request holds the offer: ext tokens past n_computed (leased while there are any) out of a
 * hit of `hit` tokens. */
static void hold_offer(kvs_handle *h, kvs_request *r, uint64_t n_computed, uint64_t hit,
                       uint64_t ext) {
    if (ext == 0)
        kvs_reqs_release_lease(h, r);
    else {
        set_lease_deadline(h, r, lease_now_ns(h) + h->cfg->lease_timeout_ms * 1000000ull);
        count_lease(h, r);
    }
    r->n_local = n_computed;
    r->hit_tokens = hit;
    r->offered = ext;
    r->external = 0;
    r->load_pending = 0;
    kvs_reqs_set_async_waiting(h, r, 0);
    r->load_async = ext && kvs_restore_load_async(h, slowest_tier(r));
}

kvs_status kvs_reqs_lookup(kvs_handle *h, const char *req_id, const int32_t *tokens,
                           uint64_t n_tokens, uint64_t n_computed, kvs_lookup_result *out) {
    uint32_t out_size = 0;
    kvs_status st = lookup_args(h, req_id, n_tokens, n_computed, out, &out_size);
    if (st != KVS_OK) return st;
    kvs_reqs_expire_leases(h);
    kvs_request *r = NULL;
    if ((st = lookup_request(h, req_id, tokens, n_tokens, &r)) != KVS_OK) return st;
    kvs_reqs_release_lease(h, r); /* a repeated lookup replaces the earlier lease */
    uint64_t C = h->chunk_tokens;
    if (h->transfer_role == KVS_TRANSFER_PRODUCER) { /* a prefill instance computes everything */
        offer_nothing(h, r, n_computed);
        h->stats.lookups++;
        h->stats.lookup_miss_tokens += n_tokens - n_computed;
        kvs_lookup_result res = {.struct_size = out_size, .chunk_tokens = h->chunk_tokens};
        memcpy(out, &res, out_size);
        return KVS_OK;
    }
    uint64_t first = n_computed / C;   /* chunks the engine already holds need not be stored */
    if (!remote_answer(h, r, first)) { /* a thread asks the nodes: the engine asks again later */
        offer_nothing(h, r, n_computed);
        h->stats.lookups_unknown++;
        kvs_lookup_result res = {
            .struct_size = out_size, .unknown_yet = 1, .chunk_tokens = h->chunk_tokens};
        memcpy(out, &res, out_size);
        return KVS_OK;
    }
    uint64_t run = pin_run(h, r, first, r->n_keys);
    uint8_t *lossy = lossy_chunks(h, r, run);
    if (lossy) run = cut_refused(h, r, lossy, run);
    uint64_t hit = (first + run) * C;
    uint64_t stored_end = hit; /* what is stored, whatever part of it is offered */
    if (run) { /* prefix plans: offer only the leading chunks worth loading; the pins after them go */
        uint64_t keep = kvs_restore_prefix_chunks(h, kvs_reqs_chunk_tier(h, r->pins), first, run);
        if (keep < run) {
            unpin_from(h, r, keep * h->key_ranks);
            hit = (first + keep) * C;
        }
    }
    uint64_t end = hit;
    if (end == n_tokens && end > 0) end--; /* the engine must compute the last token for logits */
    uint64_t ext = end > n_computed ? end - n_computed : 0;
    uint64_t lossy_tokens = lossy_offered(h, r, lossy, first, run, n_computed, end);
    free(lossy);
    hold_offer(h, r, n_computed, hit, ext);
    if (first == 0 && r->saved_upto < stored_end) r->saved_upto = stored_end;
    h->stats.lookups++;
    h->stats.lookup_hit_tokens += ext;
    h->stats.lookup_miss_tokens += n_tokens - n_computed - ext;
    kvs_lookup_result res = {.struct_size = out_size,
                             .n_hit_tokens = ext,
                             .unknown_yet = 0,
                             .load_async = r->load_async,
                             .n_lossy_tokens = lossy_tokens,
                             .chunk_tokens = h->chunk_tokens};
    memcpy(out, &res, out_size);
    return KVS_OK;
}

kvs_status kvs_reqs_on_alloc(kvs_handle *h, const char *req_id, const uint32_t *block_ids,
                             uint64_t n_block_ids, uint64_t n_external_tokens) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "on_alloc");
    if (st == KVS_OK) st = kvs_reqs_check_id(h, "on_alloc", req_id);
    if (st != KVS_OK) return st;
    kvs_request *r = kvs_reqs_find(h, req_id);
    if (!r)
        return kvs_set_error(h, KVS_ENOTFOUND, "on_alloc: request '%s' was never looked up",
                             req_id);
    if (n_block_ids && !block_ids)
        return kvs_set_error(h, KVS_EINVAL, "on_alloc: request '%s': block_ids is NULL", req_id);
    if (!kvs_request_store_table(h, r, block_ids, n_block_ids)) /* what blocks_from counts from */
        return kvs_set_error(h, KVS_ENOMEM, "on_alloc: request '%s': out of memory", req_id);
    if (n_external_tokens == 0) {
        kvs_reqs_release_lease(h, r);
        r->load_pending = 0;
        return KVS_OK;
    }
    if (n_external_tokens > r->offered)
        return kvs_set_error(
            h, KVS_EINVAL,
            "on_alloc: request '%s': n_external_tokens %llu exceeds the %llu lookup offered",
            req_id, (unsigned long long)n_external_tokens, (unsigned long long)r->offered);
    uint64_t need = r->n_local + n_external_tokens;
    if (n_block_ids * h->model.block_tokens < need)
        return kvs_set_error(
            h, KVS_EINVAL,
            "on_alloc: request '%s': %llu blocks of %u tokens cannot hold %llu tokens", req_id,
            (unsigned long long)n_block_ids, h->model.block_tokens, (unsigned long long)need);
    for (uint64_t b = r->n_local / h->model.block_tokens; b * h->model.block_tokens < need; b++)
        if (block_ids[b] == KVS_BLOCK_NONE)
            return kvs_set_error(h, KVS_EINVAL,
                                 "on_alloc: request '%s': block %llu of its load is KVS_BLOCK_NONE",
                                 req_id, (unsigned long long)b);
    uint64_t now = lease_now_ns(h);
    expire_lease(h, r, now);
    if (r->n_pins == 0) {
        /* The lease ran out before the pages came (a stalled scheduler). The engine has allocated
         * them, so the load goes ahead: pin again what is still stored; what is gone by the load
         * becomes error blocks. */
        uint64_t C = h->chunk_tokens;
        pin_run(h, r, r->n_local / C, (need - 1) / C + 1);
        count_lease(h, r);
    }
    /* before anything can fail: pins held past their deadline would wait for a sweep that the
     * earliest deadline no longer calls */
    set_lease_deadline(h, r, now + h->cfg->lease_timeout_ms * 1000000ull);
    if (r->load_async) { /* build_meta emits the load even if the engine does not schedule it */
        uint32_t *copy = malloc(n_block_ids * sizeof *copy);
        if (!copy)
            return kvs_set_error(h, KVS_ENOMEM, "on_alloc: request '%s': out of memory", req_id);
        memcpy(copy, block_ids, n_block_ids * sizeof *copy);
        free(r->block_ids);
        r->block_ids = copy;
        r->n_block_ids = n_block_ids;
    }
    r->external = n_external_tokens;
    r->load_pending = 1;
    if (r->load_async) h->reqs.async_armed++;
    return KVS_OK;
}

/* Add req_id to the finished requests the next build_meta names: 0 when out of memory (the pages
 * are then not kept: nothing would report them). */
static int remember_kept(kvs_handle *h, const char *req_id) {
    if (h->reqs.n_kept_finished == h->reqs.cap_kept_finished) {
        uint64_t cap = h->reqs.cap_kept_finished ? 2 * h->reqs.cap_kept_finished : 16;
        void *grown = realloc(h->reqs.kept_finished, cap * sizeof *h->reqs.kept_finished);
        if (!grown) return 0;
        h->reqs.kept_finished = grown;
        h->reqs.cap_kept_finished = cap;
    }
    char *slot = h->reqs.kept_finished[h->reqs.n_kept_finished++];
    memset(slot, 0, KVS_REQ_ID_MAX);
    memcpy(slot, req_id, strlen(req_id));
    return 1;
}

kvs_status kvs_reqs_request_finished(kvs_handle *h, const char *req_id, int *keep_blocks) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_SCHEDULER, "request_finished");
    if (st == KVS_OK) st = kvs_reqs_check_id(h, "request_finished", req_id);
    if (st != KVS_OK) return st;
    if (keep_blocks) *keep_blocks = 0; /* synchronous saves complete inside the step */
    kvs_request *r = kvs_reqs_find(h, req_id);
    uint64_t id_hash = XXH3_64bits(req_id, strlen(req_id));
    if (!r) {
        for (uint32_t i = 0; i < KVS_FINISHED_IDS; i++)
            if (h->reqs.finished_ids[i] == id_hash && id_hash)
                return kvs_set_error(h, KVS_ENOTFOUND,
                                     "request_finished: request '%s' already finished", req_id);
        return kvs_set_error(h, KVS_ENOTFOUND, "request_finished: request '%s' was never seen",
                             req_id);
    }
    /* Async saves: its saves may still be on their way to the tiers. The pages are not read again
     * (wait_save completed the gathers), but the engine keeps them until the workers report the
     * saves landed: a producer's hand-off is then in the tiers, and vLLM ties delivery to it. */
    if (h->cfg->saves.async && r->saves_emitted && keep_blocks && remember_kept(h, req_id))
        *keep_blocks = 1;
    destroy_request(h, r);
    h->reqs.finished_ids[h->reqs.finished_next++ % KVS_FINISHED_IDS] = id_hash;
    return KVS_OK;
}
