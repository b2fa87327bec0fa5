#include "pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "common/log.h"

struct kvs_pool {
    pthread_mutex_t lock;
    uint8_t *base;
    uint64_t map_bytes;
    uint64_t slab_bytes;
    uint64_t n_slabs;
    uint64_t n_free;
    uint32_t *free_stack; /* slab indices */
};

kvs_status kvs_pool_create(uint64_t total_bytes, uint64_t slab_bytes, kvs_pool **out, char *err,
                           uint64_t err_len) {
    *out = NULL;
    char a[32], b[32];
    if (slab_bytes == 0) {
        kvs_fmt(err, err_len, "pool: slab size is zero");
        return KVS_EINVAL;
    }
    slab_bytes = (slab_bytes + 4095) / 4096 * 4096;
    uint64_t n = total_bytes / slab_bytes;
    if (n == 0) {
        kvs_fmt(err, err_len, "pool.staging_bytes %s holds no object of %s",
                kvs_fmt_bytes(a, sizeof a, total_bytes), kvs_fmt_bytes(b, sizeof b, slab_bytes));
        return KVS_ENOMEM;
    }
    if (n > UINT32_MAX) n = UINT32_MAX;
    kvs_pool *p = calloc(1, sizeof *p);
    if (!p) goto fail_nomem;
    p->free_stack = malloc(n * sizeof *p->free_stack);
    if (!p->free_stack) goto fail_free;
    p->map_bytes = n * slab_bytes;
    void *m = mmap(NULL, p->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) goto fail_stack;
    madvise(m, p->map_bytes, MADV_HUGEPAGE);
    p->base = m;
    p->slab_bytes = slab_bytes;
    p->n_slabs = n;
    p->n_free = n;
    for (uint64_t i = 0; i < n; i++) p->free_stack[i] = (uint32_t)(n - 1 - i);
    pthread_mutex_init(&p->lock, NULL);
    *out = p;
    return KVS_OK;
fail_stack:
    free(p->free_stack);
fail_free:
    free(p);
fail_nomem:
    kvs_fmt(err, err_len, "pool: cannot map %s of staging memory",
            kvs_fmt_bytes(a, sizeof a, n * slab_bytes));
    return KVS_ENOMEM;
}

void kvs_pool_destroy(kvs_pool *pool) {
    if (!pool) return;
    munmap(pool->base, pool->map_bytes);
    pthread_mutex_destroy(&pool->lock);
    free(pool->free_stack);
    free(pool);
}

void *kvs_pool_alloc(kvs_pool *pool) {
    void *slab = NULL;
    pthread_mutex_lock(&pool->lock);
    if (pool->n_free > 0) {
        uint32_t idx = pool->free_stack[--pool->n_free];
        slab = pool->base + (uint64_t)idx * pool->slab_bytes;
    }
    pthread_mutex_unlock(&pool->lock);
    return slab;
}

void kvs_pool_free(kvs_pool *pool, void *slab) {
    if (!slab) return;
    uint64_t off = (uint64_t)((uint8_t *)slab - pool->base);
    pthread_mutex_lock(&pool->lock);
    pool->free_stack[pool->n_free++] = (uint32_t)(off / pool->slab_bytes);
    pthread_mutex_unlock(&pool->lock);
}

uint64_t kvs_pool_slab_bytes(const kvs_pool *pool) {
    return pool->slab_bytes;
}
uint64_t kvs_pool_n_slabs(const kvs_pool *pool) {
    return pool->n_slabs;
}

uint64_t kvs_pool_n_free(kvs_pool *pool) {
    pthread_mutex_lock(&pool->lock);
    uint64_t n = pool->n_free;
    pthread_mutex_unlock(&pool->lock);
    return n;
}

void kvs_pool_region(const kvs_pool *pool, void **base, uint64_t *len) {
    *base = pool->base;
    *len = pool->map_bytes;
}
