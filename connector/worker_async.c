/* worker_async.c - loads that run between steps. bind_meta queues each load_async request here; a
 * loader thread (started at the first one) pins and reads its chunks into staging slabs or takes
 * zero-copy references while the engine keeps stepping other requests; the worker's thread lands a
 * read request in the pages when the device may copy (between steps, or any time on the synchronous
 * host device), with the same checksums as a step's loads, and get_finished reports it once. A
 * request's failed chunks become error blocks of the step in which it is reported. */
#include "worker_async.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "handle.h"
#include "last_error.h"
#include "role.h"
#include "worker_load.h"
#include "worker_saver.h"

struct kvs_async_job {
    kvs_meta_req req; /* a copy: the bound metadata goes away with its step */
    kvs_load_set set;
    uint64_t slabs;      /* staging slabs it holds once read, until it lands */
    uint64_t error_span; /* error blocks its loads may add (reserved by bind_meta) */
    struct kvs_async_job *next;
};

typedef struct job_list {
    kvs_async_job *head, *tail;
} job_list;

struct kvs_async_loader {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* a job was queued, or stop */
    pthread_cond_t room; /* read jobs landed (their slabs are free again), or stop */
    pthread_t thread;
    int thread_started;
    int thread_failed; /* pthread_create failed once: reads happen in bind_meta from then on */
    int stop;
    job_list queued;      /* waiting for the loader thread */
    job_list read;        /* chunks read (or failed): waiting to land */
    job_list landed;      /* in the pages: waiting for get_finished */
    uint64_t slabs_held;  /* by read jobs not landed yet */
    uint64_t slab_budget; /* at most this many (half the pool): the step's own loads and saves keep
                           * the rest, and a request read ahead waits instead of failing */
};

static void push(job_list *l, kvs_async_job *j) {
    j->next = NULL;
    if (l->tail)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
}

static kvs_async_job *take_all(job_list *l) {
    kvs_async_job *j = l->head;
    l->head = l->tail = NULL;
    return j;
}

static void free_job(kvs_async_job *j) {
    free(j->set.w);
    kvs_meta_req_clear(&j->req);
    free(j);
}

static void *loader_main(void *arg) {
    kvs_handle *h = arg;
    struct kvs_async_loader *L = h->worker.async;
    pthread_mutex_lock(&L->lock);
    for (;;) {
        while (!L->stop && !L->queued.head) pthread_cond_wait(&L->wake, &L->lock);
        if (L->stop) break;
        kvs_async_job *j = L->queued.head;
        /* Room for its slabs: wait while read jobs hold the budget (they free it when they land,
         * between steps); with none waiting to land, go ahead and fail what does not fit. */
        while (!L->stop && L->read.head && L->slabs_held + j->set.n > L->slab_budget)
            pthread_cond_wait(&L->room, &L->lock);
        if (L->stop) break;
        L->queued.head = j->next;
        if (!L->queued.head) L->queued.tail = NULL;
        pthread_mutex_unlock(&L->lock);
        kvs_loads_open(h, &j->set); /* tiers and pool are thread-safe; no handle state is touched */
        for (uint64_t i = 0; i < j->set.n; i++) j->slabs += j->set.w[i].slab != NULL;
        pthread_mutex_lock(&L->lock);
        L->slabs_held += j->slabs;
        push(&L->read, j);
    }
    pthread_mutex_unlock(&L->lock);
    return NULL;
}

static kvs_status loader(kvs_handle *h, struct kvs_async_loader **out) {
    if (!h->worker.async) {
        struct kvs_async_loader *L = calloc(1, sizeof *L);
        if (!L) return kvs_set_error(h, KVS_ENOMEM, "bind_meta: out of memory for async loads");
        pthread_mutex_init(&L->lock, NULL);
        pthread_cond_init(&L->wake, NULL);
        pthread_cond_init(&L->room, NULL);
        uint64_t slabs = kvs_pool_n_slabs(h->pool);
        L->slab_budget = slabs / 2 ? slabs / 2 : 1;
        h->worker.async = L;
    }
    struct kvs_async_loader *L = h->worker.async;
    if (!L->thread_started && !L->thread_failed && kvs_tiers_thread_safe(h->tiers)) {
        if (pthread_create(&L->thread, NULL, loader_main, h) == 0)
            L->thread_started = 1;
        else { /* reads then happen on the caller's thread: slower steps, same results */
            L->thread_failed = 1;
            kvs_log(h->cfg->log_level, KVS_LOG_WARN,
                    "async loads: no loader thread could be started; reading in bind_meta");
        }
    }
    *out = L;
    return KVS_OK;
}

static kvs_status copy_req(kvs_meta_req *dst, const kvs_meta_req *r) {
    memset(dst, 0, sizeof *dst);
    memcpy(dst->id, r->id, sizeof dst->id);
    dst->load_async = 1;
    dst->block_ids = malloc(r->n_block_ids * sizeof *dst->block_ids + 1);
    dst->loads = malloc(r->n_loads * sizeof *dst->loads + 1);
    dst->layers = r->n_layer_bytes ? malloc(r->n_layer_bytes) : NULL;
    if (!dst->block_ids || !dst->loads || (r->n_layer_bytes && !dst->layers)) return KVS_ENOMEM;
    if (r->n_block_ids) memcpy(dst->block_ids, r->block_ids, r->n_block_ids * sizeof *r->block_ids);
    if (r->n_loads) memcpy(dst->loads, r->loads, r->n_loads * sizeof *r->loads);
    if (r->n_layer_bytes) memcpy(dst->layers, r->layers, r->n_layer_bytes);
    dst->n_block_ids = r->n_block_ids;
    dst->block_first = r->block_first;
    dst->n_loads = r->n_loads;
    dst->n_layer_bytes = r->n_layer_bytes;
    return KVS_OK;
}

kvs_status kvs_async_prepare(kvs_handle *h, const kvs_meta_req *r, kvs_async_job **out) {
    struct kvs_async_loader *L = NULL;
    kvs_status st = loader(h, &L);
    if (st != KVS_OK) return st;
    kvs_async_job *j = calloc(1, sizeof *j);
    if (!j || copy_req(&j->req, r) != KVS_OK ||
        !(j->set.w = calloc(r->n_loads + 1, sizeof *j->set.w))) {
        if (j) free_job(j);
        return kvs_set_error(h, KVS_ENOMEM, "bind_meta: request '%s': out of memory for its load",
                             r->id);
    }
    j->set.n = r->n_loads;
    for (uint64_t i = 0; i < r->n_loads; i++) {
        j->set.w[i] =
            (kvs_load_work){.req = &j->req, .load = &j->req.loads[i], .tier = -1, .async = 1};
        j->error_span += kvs_load_error_span(h, &j->req.loads[i]);
    }
    *out = j;
    return KVS_OK;
}

void kvs_async_discard(kvs_async_job *j) {
    if (j) free_job(j);
}

void kvs_async_submit(kvs_handle *h, kvs_async_job *j) {
    struct kvs_async_loader *L = h->worker.async; /* made by kvs_async_prepare */
    h->stats.async_loads_started++;
    h->worker.error_blocks_async += j->error_span; /* until it lands */
    pthread_mutex_lock(&L->lock);
    if (L->thread_started &&
        j->set.n) { /* nothing to read (a plan recomputes it): reported at once */
        push(&L->queued, j);
        pthread_cond_signal(&L->wake);
        pthread_mutex_unlock(&L->lock);
        return;
    }
    pthread_mutex_unlock(&L->lock);
    kvs_loads_open(h, &j->set); /* no thread-safe chain (or nothing to read): read it here */
    pthread_mutex_lock(&L->lock);
    push(&L->read, j);
    pthread_mutex_unlock(&L->lock);
}

void kvs_async_land(kvs_handle *h) {
    struct kvs_async_loader *L = h->worker.async;
    if (!L || (h->worker.wstate != WORKER_IDLE && !h->device.dev_info.synchronous)) return;
    pthread_mutex_lock(&L->lock);
    kvs_async_job *j = take_all(&L->read);
    pthread_mutex_unlock(&L->lock);
    while (j) {
        kvs_async_job *next = j->next;
        uint64_t errors = h->stats.load_errors;
        kvs_loads_land(h, &j->set);
        h->worker.error_blocks_async -= j->error_span; /* its failures are listed now */
        if (h->stats.load_errors != errors) h->stats.async_loads_failed++;
        pthread_mutex_lock(&L->lock);
        L->slabs_held -= j->slabs;
        j->slabs = 0;
        push(&L->landed, j);
        pthread_cond_signal(&L->room);
        pthread_mutex_unlock(&L->lock);
        j = next;
    }
}

kvs_status kvs_worker_get_finished(kvs_handle *h, char *sending, uint64_t sending_cap,
                                   uint64_t *n_sending, char *receiving, uint64_t receiving_cap,
                                   uint64_t *n_receiving) {
    kvs_status st = kvs_require_role(h, KVS_ROLE_WORKER, "get_finished");
    if (st != KVS_OK) return st;
    if (!n_sending || !n_receiving)
        return kvs_set_error(h, KVS_EINVAL, "get_finished: count pointer is NULL");
    if ((sending_cap && !sending) || (receiving_cap && !receiving))
        return kvs_set_error(h, KVS_EINVAL, "get_finished: a buffer is NULL but its cap is not 0");
    *n_sending = *n_receiving = 0;
    if (sending_cap) sending[0] = '\0';
    if (receiving_cap) receiving[0] = '\0';
    kvs_saver_collect(h);
    /* Finished requests whose saves have all landed (async saves): more may land before they are
     * taken below; those that do not fit then wait for the next call. */
    uint64_t send_need = 0, n_send = 0;
    kvs_saver_sending_need(h, &send_need, &n_send);
    if (send_need > sending_cap) {
        *n_sending = n_send;
        return kvs_set_error(h, KVS_EOVERFLOW,
                             "get_finished: %llu finished saves need %llu bytes, sending holds "
                             "%llu (nothing was reported)",
                             (unsigned long long)n_send, (unsigned long long)send_need,
                             (unsigned long long)sending_cap);
    }
    struct kvs_async_loader *L = h->worker.async;
    if (!L) {
        kvs_saver_take_sending(h, sending, sending_cap, n_sending);
        return KVS_OK;
    }
    kvs_async_land(h);
    pthread_mutex_lock(&L->lock);
    uint64_t need = 0, n = 0;
    for (const kvs_async_job *j = L->landed.head; j; j = j->next, n++)
        need += strlen(j->req.id) + 1;
    if (need > receiving_cap) {
        pthread_mutex_unlock(&L->lock);
        *n_receiving = n;
        return kvs_set_error(h, KVS_EOVERFLOW,
                             "get_finished: %llu finished loads need %llu bytes, receiving holds "
                             "%llu (nothing was reported)",
                             (unsigned long long)n, (unsigned long long)need,
                             (unsigned long long)receiving_cap);
    }
    kvs_async_job *j = take_all(&L->landed);
    pthread_mutex_unlock(&L->lock);
    kvs_saver_take_sending(h, sending, sending_cap, n_sending);
    uint64_t at = 0;
    while (j) {
        kvs_async_job *next = j->next;
        size_t len = strlen(j->req.id) + 1;
        memcpy(receiving + at, j->req.id, len);
        at += len;
        h->stats.async_loads_done++;
        free_job(j);
        j = next;
    }
    *n_receiving = n;
    return KVS_OK;
}

void kvs_async_close(kvs_handle *h) {
    struct kvs_async_loader *L = h->worker.async;
    if (!L) return;
    if (L->thread_started) {
        pthread_mutex_lock(&L->lock);
        L->stop = 1;
        pthread_cond_signal(&L->wake);
        pthread_cond_signal(&L->room);
        pthread_mutex_unlock(&L->lock);
        pthread_join(L->thread, NULL); /* a read in progress finishes first */
    }
    job_list *lists[] = {&L->queued, &L->read, &L->landed};
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        kvs_async_job *j = take_all(lists[i]);
        while (j) {
            kvs_async_job *next = j->next;
            kvs_loads_release(h, &j->set);
            free_job(j);
            j = next;
        }
    }
    pthread_cond_destroy(&L->wake);
    pthread_cond_destroy(&L->room);
    pthread_mutex_destroy(&L->lock);
    free(L);
    h->worker.async = NULL;
    h->worker.error_blocks_async = 0;
}
