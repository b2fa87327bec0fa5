/* worker_saver.c - the saver thread of asynchronous saves and the per-request count of saves in
 * flight behind get_finished's sending list. By the time a save is queued its object holds every
 * layer (wait_save completed the gathers out of the engine's pages), so the thread never reads a page:
 * it only hashes (when the device did not), seals and puts or commits, then frees the slab. A failed
 * store is a later miss, counted in saves_skipped; its request is reported all the same. */
#include "worker_saver.h"
#include "integrity.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/clock.h"
#include "common/log.h"
#include "handle.h"
#include "object.h"

#define SAVER_BUCKETS 256

/* A request with saves in flight, or finished and not reported yet. */
typedef struct saver_req {
    char id[KVS_REQ_ID_MAX];
    uint64_t in_flight; /* saves queued or being stored */
    int finished;       /* step metadata named it: report once in_flight is 0 */
    struct saver_req *next;
} saver_req;

typedef struct saver_job {
    kvs_key key;
    uint8_t *object; /* a reservation in the top tier, or `slab` */
    uint8_t *slab;
    uint64_t ticket;
    int hash;   /* the device left the layer hashes to be computed */
    int tagged; /* the copies wrote its nonce and layer tags: only the header tag is left */
    saver_req *req;
    struct saver_job *next;
} saver_job;

struct kvs_saver {
    pthread_mutex_t lock;
    pthread_cond_t wake;   /* a job queued, hold lifted, or stop */
    pthread_cond_t landed; /* a job landed (CLOCK_MONOTONIC) */
    pthread_t thread;
    int thread_started;
    int thread_failed; /* pthread_create failed once: wait_save stores itself from then on */
    int stop, hold;
    saver_job *head, *tail;
    uint64_t queued; /* jobs queued or being stored */
    uint64_t landed_count;
    saver_req *buckets[SAVER_BUCKETS];
    /* counters not yet folded into the handle's stats (the thread never touches those) */
    uint64_t chunks_saved, bytes_saved, saves_skipped, save_ns;
};

static saver_req **bucket(struct kvs_saver *S, const char *id) {
    return &S->buckets[XXH3_64bits(id, strlen(id)) % SAVER_BUCKETS];
}

static saver_req *find_req(struct kvs_saver *S, const char *id, int add) {
    saver_req **b = bucket(S, id);
    for (saver_req *r = *b; r; r = r->next)
        if (strcmp(r->id, id) == 0) return r;
    if (!add) return NULL;
    saver_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    memcpy(r->id, id, strnlen(id, KVS_REQ_ID_MAX - 1));
    r->next = *b;
    *b = r;
    return r;
}

static void remove_req(struct kvs_saver *S, saver_req *r) {
    saver_req **p = bucket(S, r->id);
    while (*p != r) p = &(*p)->next;
    *p = r->next;
    free(r);
}

static struct kvs_saver *saver_of(kvs_handle *h) {
    if (h->worker.saver) return h->worker.saver;
    struct kvs_saver *S = calloc(1, sizeof *S);
    if (!S) return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&S->lock, NULL);
    pthread_cond_init(&S->wake, NULL);
    pthread_cond_init(&S->landed, &ca);
    pthread_condattr_destroy(&ca);
    h->worker.saver = S;
    return S;
}

/* Hash (if the device did not), seal and store one object; frees its slab. Any thread. The
 * counters go to S under its lock. */
static void store_job(kvs_handle *h, struct kvs_saver *S, saver_job *j) {
    uint64_t t0 = kvs_now_ns();
    if (j->hash)
        for (uint32_t l = 0; l < h->worker.n_views; l++)
            kvs_object_layer_hashes(j->object)[l] =
                XXH3_64bits(kvs_object_layer(j->object, l), h->layer_bytes);
    if (j->tagged)
        kvs_integrity_seal_tagged(h, j->object);
    else
        kvs_integrity_seal(h, j->object);
    char why[256] = "";
    kvs_status st =
        j->slab ? kvs_tiers_put(h->tiers, &j->key, j->object, h->object_bytes, why, sizeof why)
                : kvs_tiers_commit(h->tiers, &j->key, j->ticket, j->object, h->object_bytes, why,
                                   sizeof why);
    if (st != KVS_OK)
        kvs_log(h->cfg->log_level, KVS_LOG_WARN, "request '%s': save not stored: %s", j->req->id,
                why);
    if (j->slab) kvs_pool_free(h->pool, j->slab);
    uint64_t dt = kvs_now_ns() - t0;
    pthread_mutex_lock(&S->lock);
    if (st == KVS_OK) {
        S->chunks_saved++;
        S->bytes_saved += (uint64_t)h->worker.n_views * h->layer_bytes;
    } else {
        S->saves_skipped++;
    }
    S->save_ns += dt;
    pthread_mutex_unlock(&S->lock);
}

/* Under S->lock: the job is done (stored, failed or dropped); its request may go. */
static void finish_job(struct kvs_saver *S, saver_job *j) {
    saver_req *r = j->req;
    if (--r->in_flight == 0 && !r->finished) remove_req(S, r);
    free(j);
    S->queued--;
    S->landed_count++;
    pthread_cond_broadcast(&S->landed);
}

static void *saver_main(void *arg) {
    kvs_handle *h = arg;
    struct kvs_saver *S = h->worker.saver;
    pthread_mutex_lock(&S->lock);
    for (;;) {
        while (!S->stop && (S->hold || !S->head)) pthread_cond_wait(&S->wake, &S->lock);
        if (S->stop) break;
        saver_job *j = S->head;
        S->head = j->next;
        if (!S->head) S->tail = NULL;
        pthread_mutex_unlock(&S->lock);
        store_job(h, S, j); /* tiers and pool are thread-safe; no handle state is written */
        pthread_mutex_lock(&S->lock);
        finish_job(S, j);
    }
    pthread_mutex_unlock(&S->lock);
    return NULL;
}

int kvs_saver_async(kvs_handle *h) {
    if (!h->cfg->saves.async || !kvs_tiers_thread_safe(h->tiers)) return 0;
    struct kvs_saver *S = saver_of(h);
    if (!S || S->thread_failed) return 0;
    if (!S->thread_started) {
        if (pthread_create(&S->thread, NULL, saver_main, h) != 0) {
            S->thread_failed = 1;
            kvs_log(h->cfg->log_level, KVS_LOG_WARN,
                    "async saves: no saver thread could be started; storing in wait_save");
            return 0;
        }
        S->thread_started = 1;
    }
    return 1;
}

void kvs_saver_submit(kvs_handle *h, kvs_save_work *works, uint64_t n, int hash) {
    struct kvs_saver *S = h->worker.saver; /* made by kvs_saver_async */
    for (uint64_t i = 0; i < n; i++) {
        kvs_save_work *w = &works[i];
        if (!w->object) continue;
        saver_job *j = calloc(1, sizeof *j);
        pthread_mutex_lock(&S->lock);
        saver_req *r = j ? find_req(S, w->req->id, 1) : NULL;
        if (r) {
            *j = (saver_job){.key = w->save->key,
                             .object = w->object,
                             .slab = w->slab,
                             .ticket = w->ticket,
                             .hash = hash,
                             .tagged = w->tagged,
                             .req = r};
            r->in_flight++;
            S->queued++;
            if (S->tail)
                S->tail->next = j;
            else
                S->head = j;
            S->tail = j;
            pthread_cond_signal(&S->wake);
            h->stats.saves_async++;
        }
        pthread_mutex_unlock(&S->lock);
        if (!r) { /* out of memory: stored here, on the caller's thread */
            saver_req lone = {.in_flight = 1};
            memcpy(lone.id, w->req->id, strnlen(w->req->id, KVS_REQ_ID_MAX - 1));
            saver_job now = {.key = w->save->key,
                             .object = w->object,
                             .slab = w->slab,
                             .ticket = w->ticket,
                             .hash = hash,
                             .tagged = w->tagged,
                             .req = &lone};
            free(j);
            store_job(h, S, &now);
        }
        w->object = w->slab = NULL; /* the saver's now */
    }
}

kvs_status kvs_saver_note_finished(kvs_handle *h, const kvs_meta *m) {
    if (!m->n_finished) return KVS_OK;
    struct kvs_saver *S = saver_of(h);
    if (!S) return KVS_ENOMEM;
    kvs_status st = KVS_OK;
    pthread_mutex_lock(&S->lock);
    for (uint64_t i = 0; i < m->n_finished && st == KVS_OK; i++) {
        saver_req *r = find_req(S, m->finished[i], 1);
        if (r)
            r->finished = 1;
        else
            st = KVS_ENOMEM;
    }
    pthread_mutex_unlock(&S->lock);
    return st;
}

void kvs_saver_sending_need(kvs_handle *h, uint64_t *bytes, uint64_t *n) {
    struct kvs_saver *S = h->worker.saver;
    *bytes = *n = 0;
    if (!S) return;
    pthread_mutex_lock(&S->lock);
    for (int b = 0; b < SAVER_BUCKETS; b++)
        for (const saver_req *r = S->buckets[b]; r; r = r->next)
            if (r->finished && !r->in_flight) {
                *bytes += strlen(r->id) + 1;
                (*n)++;
            }
    pthread_mutex_unlock(&S->lock);
}

void kvs_saver_take_sending(kvs_handle *h, char *buf, uint64_t cap, uint64_t *n) {
    struct kvs_saver *S = h->worker.saver;
    *n = 0;
    if (!S) return;
    uint64_t at = 0;
    pthread_mutex_lock(&S->lock);
    for (int b = 0; b < SAVER_BUCKETS; b++)
        for (saver_req *r = S->buckets[b], *next; r; r = next) {
            next = r->next;
            size_t len = strlen(r->id) + 1;
            if (!r->finished || r->in_flight || at + len > cap) continue;
            memcpy(buf + at, r->id, len);
            at += len;
            (*n)++;
            remove_req(S, r);
        }
    pthread_mutex_unlock(&S->lock);
    h->stats.sends_reported += *n;
}

int kvs_saver_wait_landed(kvs_handle *h) {
    struct kvs_saver *S = h->worker.saver;
    if (!S || !S->thread_started) return 0;
    struct timespec deadline = kvs_timespec_after_ms(CLOCK_MONOTONIC, h->cfg->saves.timeout_ms);
    pthread_mutex_lock(&S->lock);
    uint64_t seen = S->landed_count;
    int rc = 0;
    while (S->queued && S->landed_count == seen && rc == 0)
        rc = pthread_cond_timedwait(&S->landed, &S->lock, &deadline);
    int landed = S->landed_count != seen;
    pthread_mutex_unlock(&S->lock);
    return landed;
}

void kvs_saver_collect(kvs_handle *h) {
    struct kvs_saver *S = h->worker.saver;
    if (!S) return;
    pthread_mutex_lock(&S->lock);
    h->stats.chunks_saved += S->chunks_saved;
    h->stats.bytes_saved += S->bytes_saved;
    h->stats.saves_skipped += S->saves_skipped;
    h->stats.save_ns += S->save_ns;
    h->stats.saves_in_flight = S->queued;
    S->chunks_saved = S->bytes_saved = S->saves_skipped = S->save_ns = 0;
    pthread_mutex_unlock(&S->lock);
}

void kvs_saver_hold(kvs_handle *h, int hold) {
    struct kvs_saver *S = saver_of(h);
    if (!S) return;
    pthread_mutex_lock(&S->lock);
    S->hold = hold;
    pthread_cond_broadcast(&S->wake);
    pthread_mutex_unlock(&S->lock);
}

void kvs_saver_close(kvs_handle *h) {
    struct kvs_saver *S = h->worker.saver;
    if (!S) return;
    if (S->thread_started) {
        struct timespec deadline = kvs_timespec_after_ms(CLOCK_MONOTONIC, h->cfg->saves.timeout_ms);
        pthread_mutex_lock(&S->lock);
        int rc = 0;
        while (S->queued && rc == 0) rc = pthread_cond_timedwait(&S->landed, &S->lock, &deadline);
        if (S->queued)
            kvs_log(h->cfg->log_level, KVS_LOG_WARN,
                    "close: %llu saves not stored after %llu ms: dropped",
                    (unsigned long long)S->queued, (unsigned long long)h->cfg->saves.timeout_ms);
        S->stop = 1;
        pthread_cond_broadcast(&S->wake);
        pthread_mutex_unlock(&S->lock);
        pthread_join(S->thread, NULL); /* a store in progress finishes first */
    }
    for (saver_job *j = S->head, *next; j; j = next) { /* what the timeout left */
        next = j->next;
        if (j->slab)
            kvs_pool_free(h->pool, j->slab);
        else
            kvs_tiers_abort(h->tiers, j->ticket);
        S->saves_skipped++;
        finish_job(S, j);
    }
    S->head = S->tail = NULL;
    kvs_saver_collect(h);
    for (int b = 0; b < SAVER_BUCKETS; b++)
        while (S->buckets[b]) remove_req(S, S->buckets[b]);
    pthread_cond_destroy(&S->wake);
    pthread_cond_destroy(&S->landed);
    pthread_mutex_destroy(&S->lock);
    free(S);
    h->worker.saver = NULL;
}
