/* empty_tier.c - the tier that stands in for one that could not open (contract in empty_tier.h). */
#include "empty_tier.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/options.h"

typedef struct empty_tier {
    char error[512]; /* the same sentence for every refusal: nothing here changes after create */
    _Atomic uint64_t refused_puts;
} empty_tier;

static kvs_status empty_create(const kvs_backend_init *init, void **out) {
    if (!init || !out) return KVS_EINVAL;
    *out = NULL;
    const char *type = "", *reason = "";
    for (uint64_t i = 0; init->options && i < init->n_options; i++) {
        if (strcmp(init->options[i].key, "type") == 0) type = init->options[i].value;
        if (strcmp(init->options[i].key, "reason") == 0) reason = init->options[i].value;
    }
    empty_tier *t = calloc(1, sizeof *t);
    if (!t) {
        kvs_create_error(init, "empty tier: out of memory for its state");
        return KVS_ENOMEM;
    }
    snprintf(t->error, sizeof t->error,
             "%s tier \"%s\" holds nothing and stores nothing: it could not open (%.300s)", type,
             init->tier_name ? init->tier_name : "", reason);
    *out = t;
    return KVS_OK;
}

static void empty_destroy(void *state) {
    free(state);
}

static const char *empty_last_error(void *state) {
    const empty_tier *t = state;
    return t ? t->error : "";
}

static kvs_status empty_contains(void *state, const kvs_key *keys, uint64_t n,
                                 uint64_t *n_present) {
    (void)state;
    (void)keys;
    (void)n;
    if (!n_present) return KVS_EINVAL;
    *n_present = 0;
    return KVS_OK;
}

static kvs_status empty_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                            uint64_t *n_pinned) {
    (void)state;
    (void)keys;
    (void)n;
    (void)timeout_ms;
    if (!n_pinned) return KVS_EINVAL;
    *n_pinned = 0;
    return KVS_OK;
}

static kvs_status empty_unpin(void *state, const kvs_key *keys, uint64_t n) {
    (void)state;
    (void)keys;
    (void)n;
    return KVS_OK;
}

static kvs_status empty_get(void *state, const kvs_key *key, void *dst, uint64_t cap,
                            uint64_t *len) {
    (void)state;
    (void)key;
    (void)dst;
    (void)cap;
    if (len) *len = 0;
    return KVS_ENOTFOUND;
}

static kvs_status empty_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    empty_tier *t = state;
    (void)key;
    (void)object;
    (void)len;
    if (t) atomic_fetch_add(&t->refused_puts, 1);
    return KVS_EIO;
}

static kvs_status empty_remove(void *state, const kvs_key *key) {
    (void)state;
    (void)key;
    return KVS_OK;
}

static kvs_status empty_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    (void)state;
    if (!n_objects || !bytes) return KVS_EINVAL;
    *n_objects = *bytes = 0;
    return KVS_OK;
}

static const kvs_backend_ops empty_ops = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = KVS_BACKEND_CAP_THREAD_SAFE,
    .type_name = "empty",
    .create = empty_create,
    .destroy = empty_destroy,
    .last_error = empty_last_error,
    .contains = empty_contains,
    .pin = empty_pin,
    .unpin = empty_unpin,
    .get = empty_get,
    .put = empty_put,
    .remove = empty_remove,
    .usage = empty_usage,
};

const kvs_backend_ops *kvs_empty_tier_backend(void) {
    return &empty_ops;
}

uint64_t kvs_empty_tier_refused_puts(void *state) {
    empty_tier *t = state;
    return t ? atomic_load(&t->refused_puts) : 0;
}
