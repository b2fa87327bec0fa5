/* flipper.c - a thread rewriting a buffer (flipper.h). */
#include "flipper.h"

#include <check.h>
#include <pthread.h>
#include <stdlib.h>

struct kvs_test_flipper {
    uint8_t *bytes;
    size_t n, stride;
    int stop;
    pthread_t thread;
};

static void *flip(void *arg) {
    kvs_test_flipper *f = arg;
    for (uint32_t v = 0; !__atomic_load_n(&f->stop, __ATOMIC_RELAXED); v++)
        for (size_t i = 0; i < f->n; i += f->stride)
            __atomic_store_n(&f->bytes[i], (uint8_t)v, __ATOMIC_RELAXED);
    return NULL;
}

kvs_test_flipper *kvs_test_flipper_start(uint8_t *bytes, size_t n, size_t stride) {
    kvs_test_flipper *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    f->bytes = bytes;
    f->n = n;
    f->stride = stride;
    ck_assert_int_eq(pthread_create(&f->thread, NULL, flip, f), 0);
    return f;
}

void kvs_test_flipper_stop(kvs_test_flipper *f) {
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELAXED);
    pthread_join(f->thread, NULL);
    free(f);
}
