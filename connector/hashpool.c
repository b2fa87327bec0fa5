/* hashpool.c - parallel checksums (see hashpool.h) on common/workers: one item per job. */
#include "hashpool.h"

#include <stdlib.h>

#include "common/workers.h"
#include "common/xxh3.h"

struct kvs_hashpool {
    kvs_workers *workers;
};

static void hash_job(void *ctx, uint64_t item) {
    kvs_hash_job *job = (kvs_hash_job *)ctx + item;
    *job->out = kvs_xxh3_64(job->data, job->len);
}

kvs_status kvs_hashpool_create(uint32_t n_threads, kvs_hashpool **out) {
    *out = NULL;
    kvs_hashpool *p = calloc(1, sizeof *p);
    if (!p) return KVS_ENOMEM;
    kvs_status st = kvs_workers_create(n_threads, &p->workers);
    if (st != KVS_OK) {
        free(p);
        return st;
    }
    *out = p;
    return KVS_OK;
}

void kvs_hashpool_wait(kvs_hashpool *p) {
    kvs_workers_wait(p->workers);
}

void kvs_hashpool_submit(kvs_hashpool *p, kvs_hash_job *jobs, uint64_t n) {
    kvs_workers_submit(p->workers, hash_job, jobs, n);
}

void kvs_hashpool_destroy(kvs_hashpool *p) {
    if (!p) return;
    kvs_workers_destroy(p->workers);
    free(p);
}
