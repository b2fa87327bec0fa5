/* workers.c - threads running batches of numbered items (workers.h). */
#include "workers.h"

#include <pthread.h>
#include <stdlib.h>

struct kvs_workers {
    pthread_mutex_t lock;
    pthread_cond_t work; /* a batch was submitted, or stop */
    pthread_cond_t done; /* the last item of a batch finished */
    kvs_workers_fn fn;
    void *ctx;
    uint64_t n, next, finished;
    int stop;
    uint32_t n_threads;
    pthread_t threads[];
};

/* Take and run the batch's items until none is left; called and returns with w->lock held. */
static void take_items(kvs_workers *w) {
    while (w->next < w->n) {
        uint64_t item = w->next++;
        pthread_mutex_unlock(&w->lock);
        w->fn(w->ctx, item);
        pthread_mutex_lock(&w->lock);
        if (++w->finished == w->n) pthread_cond_broadcast(&w->done);
    }
}

static void *thread_main(void *arg) {
    kvs_workers *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->stop && w->next >= w->n) pthread_cond_wait(&w->work, &w->lock);
        if (w->stop) break;
        take_items(w);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

kvs_status kvs_workers_create(uint32_t n_threads, kvs_workers **out) {
    *out = NULL;
    if (n_threads == 0) return KVS_EINVAL;
    kvs_workers *w = calloc(1, sizeof *w + n_threads * sizeof(pthread_t));
    if (!w) return KVS_ENOMEM;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->done, NULL);
    for (uint32_t i = 0; i < n_threads; i++) {
        if (pthread_create(&w->threads[i], NULL, thread_main, w) != 0) {
            kvs_workers_destroy(w);
            return KVS_EIO;
        }
        w->n_threads = i + 1;
    }
    *out = w;
    return KVS_OK;
}

void kvs_workers_wait(kvs_workers *w) {
    pthread_mutex_lock(&w->lock);
    while (w->finished < w->n) pthread_cond_wait(&w->done, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

void kvs_workers_submit(kvs_workers *w, kvs_workers_fn fn, void *ctx, uint64_t n) {
    kvs_workers_wait(w);
    pthread_mutex_lock(&w->lock);
    w->fn = fn;
    w->ctx = ctx;
    w->n = n;
    w->next = w->finished = 0;
    pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->lock);
}

void kvs_workers_help(kvs_workers *w) {
    pthread_mutex_lock(&w->lock);
    take_items(w);
    pthread_mutex_unlock(&w->lock);
}

void kvs_workers_destroy(kvs_workers *w) {
    if (!w) return;
    if (w->n_threads) kvs_workers_wait(w);
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->lock);
    for (uint32_t i = 0; i < w->n_threads; i++) pthread_join(w->threads[i], NULL);
    pthread_cond_destroy(&w->work);
    pthread_cond_destroy(&w->done);
    pthread_mutex_destroy(&w->lock);
    free(w);
}
