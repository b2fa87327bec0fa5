/* device_host.c - the host device: the engine's "GPU" pages are ordinary RAM and every copy runs on
 * the calling thread with kernels/cpu before the call returns. Events and streams are no-ops, so
 * the connector's ordering logic is the same as on CUDA and simply never waits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

static void say(char *err, size_t err_len, const char *what) {
    if (err && err_len) snprintf(err, err_len, "host device: %s", what);
}

typedef struct host_device {
    kvs_layer_view *views;
    uint32_t n_layers;
    kvs_kv_shape shape;
} host_device;

static kvs_status host_open(const kvs_device_init *init, void **state, kvs_device_info *info, char *err,
                            size_t err_len) {
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
    if (info) {
        memset(info, 0, sizeof *info);
        strcpy(info->name, "host");
        info->hashes_inline = 1;
        info->synchronous = 1;
    }
    *state = d;
    return KVS_OK;
}

static void host_close(void *state) {
    host_device *d = state;
    if (!d) return;
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

static kvs_status move(host_device *d, uint32_t layer, const kvs_dev_copy *copies, uint64_t n, int to_pages,
                       char *err, size_t err_len) {
    if (layer >= d->n_layers) {
        say(err, err_len, "layer out of range");
        return KVS_EINVAL;
    }
    const kvs_layer_view *view = &d->views[layer];
    for (uint64_t i = 0; i < n; i++) {
        const kvs_dev_copy *c = &copies[i];
        kvs_token_span span = {c->block_ids, c->n_block_ids, c->first_token, c->n_tokens};
        if (c->hash && whole_payload(&d->shape, c)) {
            *c->hash = to_pages ? kvs_kernel_scatter_layer_hash(view, &d->shape, &span, c->k_payload)
                                : kvs_kernel_gather_layer_hash(view, &d->shape, &span, c->k_payload);
        } else {
            kvs_kernel_move_layer_kv(view, &d->shape, &span, c->k_payload, c->v_payload, to_pages);
        }
    }
    return KVS_OK;
}

static kvs_status host_load(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n, char *err,
                            size_t err_len) {
    return move(state, layer, copies, n, 1, err, err_len);
}

static kvs_status host_save(void *state, uint32_t layer, const kvs_dev_copy *copies, uint64_t n, char *err,
                            size_t err_len) {
    return move(state, layer, copies, n, 0, err, err_len);
}

static kvs_status host_wait(void *state, uint32_t layer, char *err, size_t err_len) {
    (void)state, (void)layer, (void)err, (void)err_len;
    return KVS_OK;
}

static kvs_status host_sync(void *state, char *err, size_t err_len) {
    (void)state, (void)err, (void)err_len;
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

const kvs_device_ops *kvs_host_device(void) { return &host_ops; }
