/* hashpool.c - parallel checksums (see hashpool.h). Workers take jobs by index from the batch under
 * one mutex; a job is a whole layer payload (hundreds of KiB), so the lock is taken rarely. */
#include "hashpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <xxhash.h>

struct kvs_hashpool {
    pthread_mutex_t lock;
    pthread_cond_t work; /* a batch was submitted, or stop */
    pthread_cond_t done; /* the last job of a batch finished */
    kvs_hash_job *jobs;
    uint64_t n_jobs, next, finished;
    int stop;
    uint32_t n_threads;
    pthread_t threads[];
};

static void *worker_main(void *arg) {
    kvs_hashpool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stop && p->next >= p->n_jobs) pthread_cond_wait(&p->work, &p->lock);
        if (p->stop) break;
        kvs_hash_job *job = &p->jobs[p->next++];
        pthread_mutex_unlock(&p->lock);
        *job->out = XXH3_64bits(job->data, job->len);
        pthread_mutex_lock(&p->lock);
        if (++p->finished == p->n_jobs) pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

kvs_status kvs_hashpool_create(uint32_t n_threads, kvs_hashpool **out) {
    *out = NULL;
    if (n_threads == 0) return KVS_EINVAL;
    kvs_hashpool *p = calloc(1, sizeof *p + n_threads * sizeof(pthread_t));
    if (!p) return KVS_ENOMEM;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    for (uint32_t i = 0; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            kvs_hashpool_destroy(p);
            return KVS_EIO;
        }
        p->n_threads = i + 1;
    }
    *out = p;
    return KVS_OK;
}

void kvs_hashpool_wait(kvs_hashpool *p) {
    pthread_mutex_lock(&p->lock);
    while (p->finished < p->n_jobs) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

void kvs_hashpool_submit(kvs_hashpool *p, kvs_hash_job *jobs, uint64_t n) {
    kvs_hashpool_wait(p);
    pthread_mutex_lock(&p->lock);
    p->jobs = jobs;
    p->n_jobs = n;
    p->next = p->finished = 0;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
}

void kvs_hashpool_destroy(kvs_hashpool *p) {
    if (!p) return;
    if (p->n_threads) kvs_hashpool_wait(p);
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (uint32_t i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
