/* device_host.c - the host device: the engine's "GPU" pages are ordinary RAM and every copy runs
 * with kernels/cpu before the call returns, on the calling thread (and, with host_threads > 1, on
 * helper threads that take a layer's copies beside it). Events and streams are no-ops, so the
 * connector's ordering logic is the same as on CUDA and simply never waits. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device.h"

static void say(char *err, size_t err_len, const char *what) {
    if (err && err_len) snprintf(err, err_len, "host device: %s", what);
}

/* Deferred mode: a queued copy, run later on the calling thread. */
typedef struct queued_copy {
    kvs_dev_copy copy;
    uint32_t layer;
    int to_pages;
} queued_copy;

/* One batch of copies of one layer, taken one copy at a time by the calling thread and the helpers
 * (a copy is one chunk's layer: hundreds of KiB, so the lock is taken rarely). */
typedef struct host_batch {
    const kvs_layer_view *view;
    const kvs_dev_copy *copies;
    uint64_t n, next, finished;
    int to_pages;
} host_batch;

typedef struct host_device {
    kvs_layer_view *views;
    uint32_t n_layers;
    kvs_kv_shape shape;
    int deferred;
    queued_copy *queue;
    uint64_t n_queued, cap_queued;
    /* helpers (host_threads - 1 of them; none by default) */
    pthread_mutex_t lock;
    pthread_cond_t work; /* a batch was posted, or stop */
    pthread_cond_t done; /* the batch's last copy finished */
    host_batch batch;
    int stop;
    uint32_t n_helpers;
    pthread_t *helpers;
} host_device;

static void move_one(const host_device *d, const kvs_layer_view *view, const kvs_dev_copy *c,
                     int to_pages);

/* Take and run the batch's copies until none is left; called and returns with d->lock held. */
static void take_copies(host_device *d) {
    host_batch *b = &d->batch;
    while (b->next < b->n) {
        const kvs_dev_copy *c = &b->copies[b->next++];
        pthread_mutex_unlock(&d->lock);
        move_one(d, b->view, c, b->to_pages);
        pthread_mutex_lock(&d->lock);
        if (++b->finished == b->n) pthread_cond_broadcast(&d->done);
    }
}

static void *helper_main(void *arg) {
    host_device *d = arg;
    pthread_mutex_lock(&d->lock);
    for (;;) {
        while (!d->stop && d->batch.next >= d->batch.n) pthread_cond_wait(&d->work, &d->lock);
        if (d->stop) break;
        take_copies(d);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

static void stop_helpers(host_device *d) {
    if (!d->helpers) return;
    pthread_mutex_lock(&d->lock);
    d->stop = 1;
    pthread_cond_broadcast(&d->work);
    pthread_mutex_unlock(&d->lock);
    for (uint32_t i = 0; i < d->n_helpers; i++) pthread_join(d->helpers[i], NULL);
    free(d->helpers);
    d->helpers = NULL;
    d->n_helpers = 0;
}

/* Start n helpers, or none: open fails when the system refuses one. */
static kvs_status start_helpers(host_device *d, uint32_t n, char *err, size_t err_len) {
    if (n == 0) return KVS_OK;
    if (!(d->helpers = calloc(n, sizeof *d->helpers))) {
        say(err, err_len, "out of memory for the copy threads");
        return KVS_ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (pthread_create(&d->helpers[i], NULL, helper_main, d) != 0) {
            stop_helpers(d);
            say(err, err_len, "cannot start the copy threads (device.host_threads)");
            return KVS_ENOMEM;
        }
        d->n_helpers = i + 1;
    }
    return KVS_OK;
}

static void host_close(void *state);

static kvs_status host_open(const kvs_device_init *init, void **state, kvs_device_info *info,
                            char *err, size_t err_len) {
    if (!init || !state || !init->views || init->n_layers == 0) {
        say(err, err_len, "no layers to open");
        return KVS_EINVAL;
    }
    host_device *d = calloc(1, sizeof *d);
    if (d) d->views = malloc(init->n_layers * sizeof *d->views);
    if (!d || !d->views) {
        free(d);
        say(err, err_len, "out of memory");
        return KVS_ENOMEM;
    }
    memcpy(d->views, init->views, init->n_layers * sizeof *d->views);
    d->n_layers = init->n_layers;
    d->shape = init->shape;
    d->deferred =
        init->struct_size >= offsetof(kvs_device_init, host_threads) && init->host_deferred;
    uint32_t threads =
        init->struct_size >= sizeof *init && init->host_threads > 1 ? init->host_threads : 1;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->done, NULL);
    kvs_status st = d->deferred ? KVS_OK : start_helpers(d, threads - 1, err, err_len);
    if (st != KVS_OK) {
        host_close(d);
        return st;
    }
    if (info) {
        memset(info, 0, sizeof *info);
        strcpy(info->name, d->deferred ? "host (deferred)" : "host");
        info->hashes_inline = !d->deferred;
        info->synchronous = !d->deferred;
    }
    *state = d;
    return KVS_OK;
}

static void host_close(void *state) {
    host_device *d = state;
    if (!d) return;
    stop_helpers(d);
    pthread_cond_destroy(&d->done);
    pthread_cond_destroy(&d->work);
    pthread_mutex_destroy(&d->lock);
    free(d->queue);
    free(d->views);
    free(d);
}

static kvs_status host_register(void *state, void *base, uint64_t len, char *err, size_t err_len) {
    (void)state, (void)base, (void)len, (void)err, (void)err_len;
    return KVS_OK; /* any host memory is payload memory */
}

static kvs_status host_set_stream(void *state, void *stream, char *err, size_t err_len) {
    (void)state, (void)stream, (void)err, (void)err_len;
    return KVS_OK;
}

static int whole_payload(const kvs_kv_shape *shape, const kvs_dev_copy *c) {
    if (!shape->has_v) return 1;
    uint64_t part = (uint64_t)c->n_tokens * shape->n_heads * shape->head_bytes;
    return (char *)c->v_payload == (char *)c->k_payload + part;
}

static void move_one(const host_device *d, const kvs_layer_view *view, const kvs_dev_copy *c,
                     int to_pages) {
    kvs_token_span span = {c->block_ids, c->n_block_ids, c->first_token, c->n_tokens};
    if (c->hash && whole_payload(&d->shape, c)) {
        *c->hash = to_pages ? kvs_kernel_scatter_layer_hash(view, &d->shape, &span, c->k_payload)
                            : kvs_kernel_gather_layer_hash(view, &d->shape, &span, c->k_payload);
    } else {
        kvs_kernel_move_layer_kv(view, &d->shape, &span, c->k_payload, c->v_payload, to_pages);
    }
}

static kvs_status move(host_device *d, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                       int to_pages, char *err, size_t err_len) {
    if (layer >= d->n_layers) {
        say(err, err_len, "layer out of range");
        return KVS_EINVAL;
    }
    const kvs_layer_view *view = &d->views[layer];
    if (d->n_helpers == 0 || n < 2) {
        for (uint64_t i = 0; i < n; i++) move_one(d, view, &copies[i], to_pages);
        return KVS_OK;
    }
    pthread_mutex_lock(&d->lock);
    d->batch = (host_batch){.view = view, .copies = copies, .n = n, .to_pages = to_pages};
    pthread_cond_broadcast(&d->work);
    take_copies(d);
    while (d->batch.finished < n) pthread_cond_wait(&d->done, &d->lock);
    d->batch = (host_batch){0};
    pthread_mutex_unlock(&d->lock);
    return KVS_OK;
}

/* Deferred mode keeps the caller's copies (their block tables and payloads must stay valid until
 * they run, as for a real asynchronous device). */
static kvs_status enqueue(host_device *d, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                          int to_pages, char *err, size_t err_len) {
    if (layer >= d->n_layers) {
        say(err, err_len, "layer out of range");
        return KVS_EINVAL;
    }
    if (d->n_queued + n > d->cap_queued) {
        uint64_t cap = d->cap_queued ? d->cap_queued : 64;
        while (cap < d->n_queued + n) cap *= 2;
        queued_copy *grown = realloc(d->queue, cap * sizeof *grown);
        if (!grown) {
            say(err, err_len, "out of memory queueing copies");
            return KVS_ENOMEM;
        }
        d->queue = grown;
        d->cap_queued = cap;
    }
    for (uint64_t i = 0; i < n; i++) {
        d->queue[d->n_queued] = (queued_copy){copies[i], layer, to_pages};
        d->queue[d->n_queued++].copy.hash = NULL;
    }
    return KVS_OK;
}

/* Run the queued copies that match (loads of layers <= through, or everything), in queue order. */
static void run_queued(host_device *d, int loads_only, uint32_t through) {
    uint64_t kept = 0;
    for (uint64_t i = 0; i < d->n_queued; i++) {
        queued_copy *q = &d->queue[i];
        if (loads_only && (!q->to_pages || q->layer > through)) {
            d->queue[kept++] = *q;
            continue;
        }
        move(d, q->layer, &q->copy, 1, q->to_pages, NULL, 0);
    }
    d->n_queued = kept;
}

static kvs_status host_load(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                            char *err, size_t err_len) {
    host_device *d = state;
    if (d->deferred) return enqueue(d, layer, copies, n, 1, err, err_len);
    return move(d, layer, copies, n, 1, err, err_len);
}

static kvs_status host_save(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                            char *err, size_t err_len) {
    host_device *d = state;
    if (d->deferred) return enqueue(d, layer, copies, n, 0, err, err_len);
    return move(d, layer, copies, n, 0, err, err_len);
}

static kvs_status host_wait(void *state, uint32_t layer, char *err, size_t err_len) {
    (void)err, (void)err_len;
    host_device *d = state;
    if (d->deferred) run_queued(d, 1, layer);
    return KVS_OK;
}

static kvs_status host_sync(void *state, char *err, size_t err_len) {
    (void)err, (void)err_len;
    host_device *d = state;
    if (d->deferred) run_queued(d, 0, 0);
    return KVS_OK;
}

static const kvs_device_ops host_ops = {
    .version = KVS_DEVICE_ABI_VERSION,
    .name = "host",
    .open = host_open,
    .close = host_close,
    .register_host = host_register,
    .set_stream = host_set_stream,
    .load_layer = host_load,
    .wait_layer = host_wait,
    .save_layer = host_save,
    .sync = host_sync,
};

const kvs_device_ops *kvs_host_device(void) {
    return &host_ops;
}
