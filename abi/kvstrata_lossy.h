/*
 * kvstrata_lossy.h - lossy loads and token dropping, an extension of the engine-facing ABI.
 *
 * A compress tier (docs/compress.md) may store a chunk in a lossy encoding (a quantising codec, or
 * with some tokens dropped). Such a chunk loads only for an engine that accepts it:
 *
 *  - Lossy chunks (since 1.6): without the config's `loads.accept_lossy: true` a lookup's hit ends
 *    before the first lossy chunk and the engine recomputes from there. With it, the hit goes on
 *    and kvs_lookup_result.n_lossy_tokens says how many of n_hit_tokens load lossy (chunks a
 *    compress tier stored compressed, and chunks computed over such chunks, stored as derived);
 *    they land as their codec decodes them, and kvs_stats.lossy_chunks_loaded counts them. KV the
 *    engine computes over lossy tokens is not exact either: an engine that keeps its own prefix
 *    cache should not serve later prompts from those pages.
 *  - Chunks stored with tokens dropped (since 1.7) count as hits only for an engine that also
 *    declared KVS_PLAN_CAP_MASK through set_plan_caps (kvstrata_plans.h): its attention leaves out
 *    the positions load_dropped reports. A stock engine, which would attend to whatever the dropped
 *    slots hold, never gets them.
 *
 * Hook (kvs_api, worker role):
 *
 * load_dropped(h, req_id, first_token, n_tokens, mask, n_dropped): the positions of req_id in
 *   [first_token, first_token + n_tokens) whose KV the bound step's loads left out: mask[i] is set
 *   to 1 for position first_token + i if it was dropped and left as it is otherwise; *n_dropped
 *   gets how many were. The engine leaves them out of attention for the rest of the request (their
 *   slots hold zeros). Call it between start_load and wait_save. Only a step whose scheduler
 *   declared KVS_PLAN_CAP_MASK loads such chunks (any other step's loads refuse them), and only
 *   synchronous loads do (load_async ones refuse them: the engine recomputes). A request with no
 *   such load gets KVS_OK and 0. The mask holds for every layer, and per worker: under tensor
 *   parallelism each rank's chunks keep tokens chosen from its own heads, and each rank masks its
 *   own. Pages with dropped slots must never serve a later request's prefix (an engine's own prefix
 *   cache), and a position whose block is recomputed (load_error_blocks) is no longer dropped.
 */
#ifndef KVSTRATA_LOSSY_H
#define KVSTRATA_LOSSY_H

#include "kvstrata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A set_plan_caps bit (since 1.7), not a plan: attention leaves out the positions load_dropped
 * reports, so hits may include chunks a compress tier stored with tokens dropped (with
 * loads.accept_lossy). It combines with any KVS_PLAN_CAP_* of kvstrata_plans.h. */
#define KVS_PLAN_CAP_MASK 8u

#ifdef __cplusplus
}
#endif
#endif /* KVSTRATA_LOSSY_H */
