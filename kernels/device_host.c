/* device_host.c - the host device: the engine's "GPU" pages are ordinary RAM and every copy runs
 * with kernels/cpu before the call returns, on the calling thread (and, with host_threads > 1, on
 * helper threads that take a layer's copies beside it). Events and streams are no-ops, so the
 * connector's ordering logic is the same as on CUDA and simply never waits. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/workers.h"
#include "kernels/device.h"

static void host_error(char *err, size_t err_len, const char *what) {
    if (err && err_len) snprintf(err, err_len, "host device: %s", what);
}

/* Deferred mode: a queued copy, run later on the calling thread. */
typedef struct queued_copy {
    kvs_dev_copy copy;
    uint32_t layer;
    int to_pages;
} queued_copy;

typedef struct host_device {
    kvs_layer_view *views;
    uint32_t n_layers;
    kvs_kv_shape shape;
    int deferred;
    queued_copy *queue;
    uint64_t n_queued, cap_queued;
    kvs_workers *helpers; /* host_threads - 1 threads beside the caller; NULL by default */
    kvs_status failed; /* deferred: why a queued copy failed since the last sync (KVS_OK: none) */
} host_device;

static void host_close(void *state);

static kvs_status host_open(const kvs_device_init *init, void **state, kvs_device_info *info,
                            char *err, size_t err_len) {
    if (!init || !state || !init->views || init->n_layers == 0) {
        host_error(err, err_len, "no layers to open");
        return KVS_EINVAL;
    }
    host_device *d = calloc(1, sizeof *d);
    if (d) d->views = malloc(init->n_layers * sizeof *d->views);
    if (!d || !d->views) {
        free(d);
        host_error(err, err_len, "out of memory");
        return KVS_ENOMEM;
    }
    memcpy(d->views, init->views, init->n_layers * sizeof *d->views);
    d->n_layers = init->n_layers;
    d->shape = init->shape;
    d->deferred =
        init->struct_size >= offsetof(kvs_device_init, host_threads) && init->host_deferred;
    uint32_t threads =
        init->struct_size >= sizeof *init && init->host_threads > 1 ? init->host_threads : 1;
    kvs_status st =
        d->deferred || threads < 2 ? KVS_OK : kvs_workers_create(threads - 1, &d->helpers);
    if (st != KVS_OK) { /* open fails when the system refuses one */
        host_error(err, err_len,
                   st == KVS_ENOMEM ? "out of memory for the copy threads"
                                    : "cannot start the copy threads (device.host_threads)");
        host_close(d);
        return KVS_ENOMEM;
    }
    if (info) {
        memset(info, 0, sizeof *info);
        strcpy(info->name, d->deferred ? "host (deferred)" : "host");
        info->hashes_inline = !d->deferred;
        info->synchronous = !d->deferred;
        info->decodes_codecs = 1;
    }
    *state = d;
    return KVS_OK;
}

static void host_close(void *state) {
    host_device *d = state;
    if (!d) return;
    kvs_workers_destroy(d->helpers);
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

/* KVS_OK, or why a lossy copy could not be decoded (no scratch, rows out of range). */
static kvs_status move_one(const host_device *d, const kvs_layer_view *view, const kvs_dev_copy *c,
                           int to_pages) {
    kvs_token_span span = {c->block_ids, c->n_block_ids, c->first_token, c->n_tokens};
    if (c->codec) { /* decoded straight into the pages: no full-precision copy in between */
        const kvs_dev_codec *k = c->codec;
        if (!to_pages) return KVS_EINVAL;
        return kvs_codec_scatter_rows(&k->codec, view, &d->shape, k->dtype, &span, c->k_payload,
                                      k->encoded_tokens, k->first_row);
    }
    if (c->tag && whole_payload(&d->shape, c)) {
        if (to_pages) {
            kvs_kernel_scatter_layer_tag(view, &d->shape, &span, c->k_payload, c->tag);
        } else {
            uint64_t x = kvs_kernel_gather_layer_tag(view, &d->shape, &span, c->k_payload, c->tag);
            if (c->hash) *c->hash = x;
        }
    } else if (c->hash && whole_payload(&d->shape, c)) {
        *c->hash = to_pages ? kvs_kernel_scatter_layer_hash(view, &d->shape, &span, c->k_payload)
                            : kvs_kernel_gather_layer_hash(view, &d->shape, &span, c->k_payload);
    } else {
        kvs_kernel_move_layer_kv(view, &d->shape, &span, c->k_payload, c->v_payload, to_pages);
    }
    return KVS_OK;
}

/* One layer's copies, an item (a chunk) each for the helpers and the caller. */
typedef struct layer_batch {
    const host_device *d;
    const kvs_layer_view *view;
    const kvs_dev_copy *copies;
    int to_pages;
    _Atomic int failed; /* a kvs_status */
} layer_batch;

static void move_item(void *ctx, uint64_t item) {
    layer_batch *b = ctx;
    kvs_status st = move_one(b->d, b->view, &b->copies[item], b->to_pages);
    if (st != KVS_OK) atomic_store(&b->failed, (int)st);
}

static kvs_status copy_layer(host_device *d, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                             int to_pages, char *err, size_t err_len) {
    if (layer >= d->n_layers) {
        host_error(err, err_len, "layer out of range");
        return KVS_EINVAL;
    }
    const kvs_layer_view *view = &d->views[layer];
    kvs_status failed = KVS_OK;
    if (!d->helpers || n < 2) {
        for (uint64_t i = 0; i < n; i++) {
            kvs_status st = move_one(d, view, &copies[i], to_pages);
            if (st != KVS_OK) failed = st;
        }
    } else {
        layer_batch b = {d, view, copies, to_pages, 0};
        kvs_workers_submit(d->helpers, move_item, &b, n);
        kvs_workers_help(d->helpers);
        kvs_workers_wait(d->helpers);
        failed = (kvs_status)atomic_load(&b.failed);
    }
    if (failed != KVS_OK)
        host_error(err, err_len, "a lossy layer could not be decoded into the pages");
    return failed;
}

/* Deferred mode keeps the caller's copies (their block tables and payloads must stay valid until
 * they run, as for a real asynchronous device). */
static kvs_status queue_copies(host_device *d, uint32_t layer, const kvs_dev_copy *copies,
                               uint64_t n, int to_pages, char *err, size_t err_len) {
    if (layer >= d->n_layers) {
        host_error(err, err_len, "layer out of range");
        return KVS_EINVAL;
    }
    if (d->n_queued + n > d->cap_queued) {
        uint64_t cap = d->cap_queued ? d->cap_queued : 64;
        while (cap < d->n_queued + n) cap *= 2;
        queued_copy *grown = realloc(d->queue, cap * sizeof *grown);
        if (!grown) {
            host_error(err, err_len, "out of memory queueing copies");
            return KVS_ENOMEM;
        }
        d->queue = grown;
        d->cap_queued = cap;
    }
    for (uint64_t i = 0; i < n; i++) {
        d->queue[d->n_queued] = (queued_copy){copies[i], layer, to_pages};
        d->queue[d->n_queued].copy.hash = NULL;
        d->queue[d->n_queued++].copy.tag = NULL;
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
        kvs_status st = copy_layer(d, q->layer, &q->copy, 1, q->to_pages, NULL, 0);
        if (st != KVS_OK) d->failed = st;
    }
    d->n_queued = kept;
}

static kvs_status host_load(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                            char *err, size_t err_len) {
    host_device *d = state;
    if (d->deferred) return queue_copies(d, layer, copies, n, 1, err, err_len);
    return copy_layer(d, layer, copies, n, 1, err, err_len);
}

static kvs_status host_save(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n,
                            char *err, size_t err_len) {
    host_device *d = state;
    if (d->deferred) return queue_copies(d, layer, copies, n, 0, err, err_len);
    return copy_layer(d, layer, copies, n, 0, err, err_len);
}

static kvs_status host_wait(void *state, uint32_t layer, char *err, size_t err_len) {
    (void)err, (void)err_len;
    host_device *d = state;
    if (d->deferred) run_queued(d, 1, layer);
    return KVS_OK;
}

/* A queued copy that failed (a lossy layer that could not be decoded) fails the sync, as a device's
 * failed kernel would: the connector turns the step's loads into error blocks. */
static kvs_status host_sync(void *state, char *err, size_t err_len) {
    host_device *d = state;
    if (d->deferred) run_queued(d, 0, 0);
    kvs_status st = d->failed;
    d->failed = KVS_OK;
    if (st != KVS_OK) host_error(err, err_len, "a lossy layer could not be decoded into the pages");
    return st;
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
