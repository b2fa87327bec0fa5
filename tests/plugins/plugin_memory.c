/* A minimal backend plugin for the tests: a fixed number of object copies in malloc'd memory, FIFO
 * eviction, no zero-copy (so the connector's staging path is exercised). Option `slots` (default 64);
 * `write_back_on_close: "1"` passes every object down the chain when the tier is destroyed (as a tier
 * that flushes itself on close would). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_backend.h"

typedef struct entry {
    kvs_key key;
    void *object;
    uint64_t len;
    uint32_t pins;
} entry;

typedef struct mem {
    entry *slots;
    uint64_t n_slots, next;
    const kvs_backend_host *host;
    int write_back_on_close;
    char error[128];
} mem;

static entry *find(mem *m, const kvs_key *key) {
    for (uint64_t i = 0; i < m->n_slots; i++)
        if (m->slots[i].object && memcmp(&m->slots[i].key, key, sizeof *key) == 0)
            return &m->slots[i];
    return NULL;
}

static kvs_status m_create(const kvs_backend_init *init, void **state) {
    uint64_t n = 64;
    int write_back = 0;
    for (uint64_t i = 0; i < init->n_options; i++) {
        if (strcmp(init->options[i].key, "slots") == 0)
            n = strtoull(init->options[i].value, NULL, 10);
        else if (strcmp(init->options[i].key, "write_back_on_close") == 0)
            write_back = strcmp(init->options[i].value, "1") == 0;
        else {
            strncpy(init->error, "memory plugin: unknown option", init->error_len - 1);
            return KVS_EINVAL;
        }
    }
    mem *m = calloc(1, sizeof *m);
    if (!m || !(m->slots = calloc(n ? n : 1, sizeof *m->slots))) {
        free(m);
        return KVS_ENOMEM;
    }
    m->n_slots = n;
    m->host = init->host;
    m->write_back_on_close = write_back;
    *state = m;
    return KVS_OK;
}

static void m_destroy(void *state) {
    mem *m = state;
    for (uint64_t i = 0; i < m->n_slots; i++) {
        if (m->write_back_on_close && m->slots[i].object && m->host && m->host->on_evict)
            m->host->on_evict(m->host->ctx, &m->slots[i].key, m->slots[i].object, m->slots[i].len);
        free(m->slots[i].object);
    }
    free(m->slots);
    free(m);
}

static const char *m_last_error(void *state) {
    return ((mem *)state)->error;
}

static kvs_status m_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    uint64_t i = 0;
    while (i < n && find(state, &keys[i])) i++;
    *n_present = i;
    return KVS_OK;
}

static kvs_status m_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                        uint64_t *n_pinned) {
    (void)timeout_ms;
    uint64_t i = 0;
    for (entry *e; i < n && (e = find(state, &keys[i])); i++) e->pins++;
    *n_pinned = i;
    return KVS_OK;
}

static kvs_status m_unpin(void *state, const kvs_key *keys, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        entry *e = find(state, &keys[i]);
        if (e && e->pins) e->pins--;
    }
    return KVS_OK;
}

static kvs_status m_get(void *state, const kvs_key *key, void *dst, uint64_t cap, uint64_t *len) {
    entry *e = find(state, key);
    if (!e) return KVS_ENOTFOUND;
    *len = e->len;
    if (cap < e->len) return KVS_EOVERFLOW;
    memcpy(dst, e->object, e->len);
    return KVS_OK;
}

static kvs_status m_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    mem *m = state;
    if (find(m, key)) return KVS_OK;
    for (uint64_t tries = 0; tries < m->n_slots; tries++) {
        entry *e = &m->slots[m->next];
        m->next = (m->next + 1) % m->n_slots;
        if (e->object && e->pins) continue;
        if (e->object) {
            m->host->on_evict(m->host->ctx, &e->key, e->object, e->len);
            free(e->object);
        }
        e->object = malloc(len);
        if (!e->object) return KVS_ENOMEM;
        memcpy(e->object, object, len);
        e->key = *key;
        e->len = len;
        e->pins = 0;
        return KVS_OK;
    }
    strncpy(m->error, "memory plugin: every slot is pinned", sizeof m->error - 1);
    return KVS_ENOMEM;
}

static kvs_status m_remove(void *state, const kvs_key *key) {
    entry *e = find(state, key);
    if (e) {
        free(e->object);
        e->object = NULL;
    }
    return KVS_OK;
}

static kvs_status m_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    mem *m = state;
    *n_objects = *bytes = 0;
    for (uint64_t i = 0; i < m->n_slots; i++)
        if (m->slots[i].object) {
            (*n_objects)++;
            *bytes += m->slots[i].len;
        }
    return KVS_OK;
}

static const kvs_backend_ops ops = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = offsetof(kvs_backend_ops, reserve) /* a 1.0 table: still accepted */,
    .caps = 0,
    .type_name = "memory",
    .create = m_create,
    .destroy = m_destroy,
    .last_error = m_last_error,
    .contains = m_contains,
    .pin = m_pin,
    .unpin = m_unpin,
    .get = m_get,
    .get_ref = NULL,
    .put = m_put,
    .remove = m_remove,
    .usage = m_usage,
};

const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major);
const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major) {
    return abi_major == KVS_BACKEND_ABI_MAJOR ? &ops : NULL;
}
