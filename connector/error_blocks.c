/* error_blocks.c - the worker's load-error list (error_blocks.h): the blocks of failed loads that
 * load_error_blocks hands the engine to recompute. */
#include "error_blocks.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/log.h"
#include "handle.h"

uint64_t kvs_load_error_span(const kvs_handle *h, const kvs_meta_load *load) {
    uint64_t bt = h->model.block_tokens;
    if (!load->n_tokens || !bt) return 0;
    uint64_t end = load->first_token + load->n_tokens;
    return (end - 1) / bt - load->first_token / bt + 1;
}

kvs_status kvs_worker_reserve_error_blocks(kvs_handle *h, uint64_t more) {
    uint64_t need = h->worker.n_error_blocks + more;
    if (need <= h->worker.cap_error_blocks) return KVS_OK;
    uint64_t cap = h->worker.cap_error_blocks ? h->worker.cap_error_blocks : 64;
    while (cap < need) cap *= 2;
    void *(*grow)(void *, size_t) =
        h->worker.error_blocks_realloc ? h->worker.error_blocks_realloc : realloc;
    uint32_t *grown =
        cap <= SIZE_MAX / sizeof *grown ? grow(h->worker.error_blocks, cap * sizeof *grown) : NULL;
    if (!grown) return KVS_ENOMEM; /* the list is as it was */
    h->worker.error_blocks = grown;
    h->worker.cap_error_blocks = cap;
    return KVS_OK;
}

/* Never allocates: bind_meta reserved room for every block a load of its step, or of an async
 * request not landed yet, covers (kvs_worker_reserve_error_blocks). */
void kvs_worker_add_error_block(kvs_handle *h, uint32_t block) {
    for (uint64_t i = 0; i < h->worker.n_error_blocks; i++)
        if (h->worker.error_blocks[i] == block) return;
    assert(h->worker.n_error_blocks < h->worker.cap_error_blocks);
    if (h->worker.n_error_blocks ==
        h->worker.cap_error_blocks) { /* a reservation missed a load: a bug */
        kvs_log(h->cfg->log_level, KVS_LOG_ERROR,
                "internal error: no room reserved for error block %u; the engine may use it",
                block);
        return;
    }
    h->worker.error_blocks[h->worker.n_error_blocks++] = block;
}

/* A failed load's blocks go to the error list and its count to the stats (the caller's thread). */
void kvs_worker_account_failure(kvs_handle *h, const kvs_load_work *w) {
    h->stats.load_errors++;
    uint64_t bt = h->model.block_tokens;
    uint64_t end = w->load->first_token + w->load->n_tokens;
    for (uint64_t b = w->load->first_token / bt; b <= (end - 1) / bt; b++)
        kvs_worker_add_error_block(h, w->req->block_ids[b - w->req->block_first]);
}
