/* requests.h - the scheduler-role hooks (lookup with leases, on_alloc, build_meta, request_finished,
 * plan caps and stages) over the handle's request table. Calls on one handle are not thread-safe. */
#ifndef KVS_REQUESTS_H
#define KVS_REQUESTS_H

#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_plans.h"

kvs_status kvs_reqs_lookup(kvs_handle *h, const char *req_id, const int32_t *tokens,
                           uint64_t n_tokens, uint64_t n_computed, kvs_lookup_result *out);
kvs_status kvs_reqs_on_alloc(kvs_handle *h, const char *req_id, const uint32_t *block_ids,
                             uint64_t n_block_ids, uint64_t n_external_tokens);
/* build_meta and build_meta_update live in step_meta.c */
kvs_status kvs_reqs_build_meta(kvs_handle *h, const kvs_step_request *reqs, uint64_t n_reqs,
                               void *buf, uint64_t cap, uint64_t *len);
kvs_status kvs_reqs_build_meta_update(kvs_handle *h, const kvs_step_update *reqs, uint64_t n_reqs,
                                      void *buf, uint64_t cap, uint64_t *len);
/* Per-request key inputs (1.10), before the request's first lookup or build_meta. */
kvs_status kvs_reqs_request_key_input(kvs_handle *h, const char *req_id, uint64_t from_token,
                                      const void *bytes, uint64_t len);
kvs_status kvs_reqs_request_finished(kvs_handle *h, const char *req_id, int *keep_blocks);
/* Forget every request, releasing their leases (at close). */
void kvs_reqs_release_all(kvs_handle *h);
/* The restore plan of request req_id if it loads in the last step built, else NULL. The pointer is
 * the request's own: valid until the next hook on the handle. */
const kvs_restore_plan *kvs_reqs_last_plan(kvs_handle *h, const char *req_id);
kvs_status kvs_reqs_set_plan_caps(kvs_handle *h, uint32_t caps);
kvs_status kvs_reqs_set_stages(kvs_handle *h, const kvs_stage_desc *d);
/* The request table, for the step builder (step_meta.c): find, create (NULL without memory), a
 * request's lease released, the tier a chunk loads from given its key_ranks pins, the request id
 * check of every hook, and the async-wait flag kept counted in h->reqs.async_waiting. */
struct kvs_request;
struct kvs_pin;
struct kvs_request *kvs_reqs_find(kvs_handle *h, const char *id);
struct kvs_request *kvs_reqs_create(kvs_handle *h, const char *id);
void kvs_reqs_release_lease(kvs_handle *h, struct kvs_request *r);
uint32_t kvs_reqs_chunk_tier(const kvs_handle *h, const struct kvs_pin *pins);
kvs_status kvs_reqs_check_id(kvs_handle *h, const char *hook, const char *id);
void kvs_reqs_set_async_waiting(kvs_handle *h, struct kvs_request *r, uint8_t waiting);
/* Release every lease past its deadline on the handle's clock (each hook does it first). */
void kvs_reqs_expire_leases(kvs_handle *h);

#endif
