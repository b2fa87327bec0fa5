/* connector.h - the mini engine's side of libkvstrata: the library loaded with dlopen, one handle of
 * role KVS_ROLE_BOTH, and the calls the engine makes around a step. Every call returns 0, or -1 after
 * printing the failed hook and the library's sentence on stderr. One thread at a time per connector. */
#ifndef MINI_CONNECTOR_H
#define MINI_CONNECTOR_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_lossy.h"
#include "abi/kvstrata_plans.h"
#include "models/mini/kvcache.h"
#include "models/mini/model.h"

/* libkvstrata, loaded with dlopen, and one handle of role KVS_ROLE_BOTH. */
typedef struct connector {
    void *dl;
    const kvs_api *api;
    kvs_handle *h;
    uint8_t *meta; /* build_meta output, grown on KVS_EOVERFLOW */
    uint64_t meta_cap;
    uint32_t *errors; /* load_error_blocks output */
    uint64_t errors_cap;
    uint64_t events_stored, events_removed; /* from take_events */
    uint64_t dropped_tokens; /* positions loads left out (load_dropped), masked in attention */
    char model_id[160];
} connector;

/* Load the library (lib_path, or <exe dir>/../lib/libkvstrata.so.1, then libkvstrata.so), open a
 * handle with config_path ("none": built-in defaults) and register every layer view of the cache.
 * caps (KVS_PLAN_CAP_* bits, 0 for none) declares what the engine does with a restore:
 * KVS_PLAN_CAP_MASK (ABI 1.7) that its attention skips the positions load_dropped reports; the
 * restore plans it executes (ABI 1.3, kvs-mini-research --restore-plans). stages (NULL: none) splits
 * the model into pipeline stages whose boundaries are cache layers past the model's (set_stages,
 * kvs-mini-research --stages). Returns 0, or -1 after printing why. */
int connector_open(connector *c, const char *lib_path, const char *config_path, kvs_dtype dtype,
                   const model *m, const kvcache *kv, int caps, const kvs_stage_desc *stages);
void connector_close(connector *c);
/* build_meta for the step's requests (growing c->meta as needed) and bind_meta. 0, or -1 after
 * printing why. */
int connector_step_meta(connector *c, const kvs_step_request *reqs, uint64_t n);
/* The handle's counters (stats) into *out. */
int connector_stats(connector *c, kvs_stats *out);

/* Print the failed hook with the library's sentence; returns -1 for the caller to pass up. HOOK(c,
 * call, name) returns that from the calling function when call does not return KVS_OK. */
int connector_hook_failed(const connector *c, const char *hook, kvs_status st);
#define HOOK(c, call, name)                                                \
    do {                                                                   \
        kvs_status st_ = (call);                                           \
        if (st_ != KVS_OK) return connector_hook_failed((c), (name), st_); \
    } while (0)

/* Drain the stored/removed events into c->events_stored and c->events_removed. */
int connector_take_events(connector *c);
/* get_finished: whether req_id finished sending (async save) or receiving (async load). */
int connector_poll_finished(connector *c, const char *req_id, int *sending, int *receiving);
/* get_finished for several requests: on_id(ctx, id, receiving) for every id listed (receiving 0: it
 * finished sending, 1: receiving); a non-zero return stops and is passed up. 0, or -1 after printing
 * why. */
int connector_finished(connector *c, int (*on_id)(void *ctx, const char *id, int receiving),
                       void *ctx);

#endif
