/* restore.h - the CacheFlow restore planner inside the connector: coefficients from the profile at
 * open, prefix plans for lookup, batch plans over a step's loads for build_meta, and the `plan` hook's
 * copy-out. It reads the handle's planner state and the inputs it is given; it keeps no request state. */
#ifndef KVS_RESTORE_H
#define KVS_RESTORE_H

#include <stddef.h>
#include <stdint.h>

#include "abi/kvstrata.h"
#include "abi/kvstrata_plans.h"
#include "connector/meta.h"

/* One request of a step, as the restore planner sees it. */
typedef struct kvs_restore_step {
    int loading;                     /* the step emits its load */
    uint32_t tier;                   /* where its first chunk is read from */
    uint64_t first_token, end_token; /* the external range */
    kvs_restore_plan plan;           /* out */
    uint32_t io_rank; /* out: its place in its tier's read order (batch plans; else UINT32_MAX) */
} kvs_restore_step;

kvs_status kvs_restore_setup(kvs_handle *h, char *err, size_t err_len);
/* Prefix plans (an engine with no plan caps): how many of the n_chunks stored chunks from chunk
 * first_chunk on, on `tier`, are worth loading; n_chunks when no planner is configured. */
uint64_t kvs_restore_prefix_chunks(kvs_handle *h, uint32_t tier, uint64_t first_chunk,
                                   uint64_t n_chunks);
/* Whether a hit whose slowest chunk is on `tier` loads between steps (`loads.async`). */
int kvs_restore_load_async(const kvs_handle *h, uint32_t tier);
/* Plans for every request of the step with loads (info[i].loading; reqs[i].load_async ones too: the
 * worker reports those in get_finished even when the plan leaves them nothing to load). */
kvs_status kvs_restore_plan_step(kvs_handle *h, kvs_meta_req *reqs, kvs_restore_step *info,
                                 uint64_t n);
/* The step's requests in the order the workers get them: those loading asynchronously (read one
 * after another on the loader thread) in the planned read order, the others where they are. *out is
 * NULL when that is reqs' own order, else a malloc'd array of shallow copies (free the array only). */
kvs_status kvs_restore_read_order(const kvs_meta_req *reqs, const kvs_restore_step *info,
                                  uint64_t n, kvs_meta_req **out);
/* The `plan` hook: copies `plan` (the plan of req_id in the last step, looked up by the caller; NULL
 * when it loads nothing there) into out, up to out->struct_size. */
kvs_status kvs_restore_plan_of(kvs_handle *h, const char *req_id, const kvs_restore_plan *plan,
                               kvs_restore_plan *out);

#endif
