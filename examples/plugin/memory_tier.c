/* memory_tier.c - an example tier backend in its own shared object (docs/plugins.md): objects kept
 * in malloc'd memory within the tier's `capacity` in bytes, the least recently used unpinned one
 * evicted first. Built as build/lib/libkvs-example-memory.so; examples/configs/plugin-example.yaml
 * names it. Not thread-safe: the connector calls it from one thread at a time (caps 0). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvstrata/kvstrata_backend.h>

#define DEFAULT_CAPACITY_BYTES (256ull << 20) /* when the YAML gives the tier no capacity */

typedef struct object {
    kvs_key key;
    void *bytes;
    uint64_t len;
    uint32_t pins;
    uint64_t last_use; /* tier clock: a counter bumped by every get and put */
} object;

typedef struct memory_tier {
    object *objects; /* n_objects used of cap_objects */
    uint64_t n_objects, cap_objects;
    uint64_t bytes, capacity_bytes;
    uint64_t clock;
    const kvs_backend_host *host;
    char error[256];
} memory_tier;

static object *find(memory_tier *m, const kvs_key *key) {
    for (uint64_t i = 0; i < m->n_objects; i++)
        if (memcmp(&m->objects[i].key, key, sizeof *key) == 0) return &m->objects[i];
    return NULL;
}

/* Drop objects[i]: its bytes are freed and the last object takes its place. */
static void drop(memory_tier *m, object *o) {
    m->bytes -= o->len;
    free(o->bytes);
    *o = m->objects[--m->n_objects];
}

static kvs_status create(const kvs_backend_init *init, void **state) {
    if (init->n_options > 0) { /* this backend takes no options: name the first one as refused */
        snprintf(init->error, init->error_len,
                 "memory tier \"%s\": unknown option '%s' (it takes none)", init->tier_name,
                 init->options[0].key);
        if (KVS_HAS_FIELD(init, kvs_backend_init, error_option) && init->error_option)
            snprintf(init->error_option, init->error_option_len, "%s", init->options[0].key);
        return KVS_ECONFIG;
    }
    memory_tier *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(init->error, init->error_len, "memory tier \"%s\": out of memory",
                 init->tier_name);
        return KVS_ENOMEM;
    }
    m->capacity_bytes = init->capacity_bytes ? init->capacity_bytes : DEFAULT_CAPACITY_BYTES;
    m->host = init->host;
    *state = m;
    return KVS_OK;
}

static void destroy(void *state) {
    memory_tier *m = state;
    for (uint64_t i = 0; i < m->n_objects; i++) free(m->objects[i].bytes);
    free(m->objects);
    free(m);
}

static const char *last_error(void *state) {
    return ((memory_tier *)state)->error;
}

static kvs_status contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    uint64_t i = 0;
    while (i < n && find(state, &keys[i])) i++;
    *n_present = i;
    return KVS_OK;
}

/* Pins are never dropped by time here: the connector unpins what it pinned before it closes. */
static kvs_status pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                      uint64_t *n_pinned) {
    (void)timeout_ms;
    uint64_t i = 0;
    for (object *o; i < n && (o = find(state, &keys[i])); i++) o->pins++;
    *n_pinned = i;
    return KVS_OK;
}

static kvs_status unpin(void *state, const kvs_key *keys, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        object *o = find(state, &keys[i]);
        if (o && o->pins) o->pins--;
    }
    return KVS_OK;
}

static kvs_status get(void *state, const kvs_key *key, void *dst, uint64_t cap, uint64_t *len) {
    memory_tier *m = state;
    object *o = find(m, key);
    if (!o) return KVS_ENOTFOUND;
    *len = o->len;
    if (cap < o->len) return KVS_EOVERFLOW;
    memcpy(dst, o->bytes, o->len);
    o->last_use = ++m->clock;
    return KVS_OK;
}

/* Make room for len more bytes by evicting least recently used unpinned objects; each is handed to
 * the connector (on_evict) before its bytes are freed, so it can move down the chain. */
static kvs_status make_room(memory_tier *m, uint64_t len) {
    while (m->bytes + len > m->capacity_bytes) {
        object *victim = NULL;
        for (uint64_t i = 0; i < m->n_objects; i++)
            if (!m->objects[i].pins && (!victim || m->objects[i].last_use < victim->last_use))
                victim = &m->objects[i];
        if (!victim) {
            snprintf(m->error, sizeof m->error,
                     "memory tier: no room for %llu bytes: every object is pinned",
                     (unsigned long long)len);
            return KVS_ENOMEM;
        }
        m->host->on_evict(m->host->ctx, &victim->key, victim->bytes, victim->len);
        drop(m, victim);
    }
    return KVS_OK;
}

static kvs_status put(void *state, const kvs_key *key, const void *bytes, uint64_t len) {
    memory_tier *m = state;
    if (len > m->capacity_bytes) {
        snprintf(m->error, sizeof m->error,
                 "memory tier: an object of %llu bytes exceeds the capacity of %llu",
                 (unsigned long long)len, (unsigned long long)m->capacity_bytes);
        return KVS_ENOMEM;
    }
    object *old = find(m, key);
    if (old && old->pins) return KVS_OK; /* equal keys hold equal bytes: keep the pinned copy */
    if (old) drop(m, old);
    kvs_status st = make_room(m, len);
    if (st != KVS_OK) return st;
    if (m->n_objects == m->cap_objects) {
        uint64_t cap = m->cap_objects ? 2 * m->cap_objects : 64;
        object *grown = realloc(m->objects, cap * sizeof *grown);
        if (!grown) goto out_of_memory;
        m->objects = grown;
        m->cap_objects = cap;
    }
    void *copy = malloc(len);
    if (!copy) goto out_of_memory;
    memcpy(copy, bytes, len);
    m->objects[m->n_objects++] =
        (object){.key = *key, .bytes = copy, .len = len, .last_use = ++m->clock};
    m->bytes += len;
    return KVS_OK;
out_of_memory:
    snprintf(m->error, sizeof m->error, "memory tier: out of memory for %llu bytes",
             (unsigned long long)len);
    return KVS_ENOMEM;
}

static kvs_status remove_object(void *state, const kvs_key *key) {
    memory_tier *m = state;
    object *o = find(m, key);
    if (o) drop(m, o);
    return KVS_OK;
}

static kvs_status usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    memory_tier *m = state;
    *n_objects = m->n_objects;
    *bytes = m->bytes;
    return KVS_OK;
}

/* The table: every operation of ABI 1.0; the optional ones of later minor versions are left out
 * (NULL, and caps announces none of them). */
static const kvs_backend_ops ops = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = 0,
    .type_name = "example-memory",
    .create = create,
    .destroy = destroy,
    .last_error = last_error,
    .contains = contains,
    .pin = pin,
    .unpin = unpin,
    .get = get,
    .put = put,
    .remove = remove_object,
    .usage = usage,
};

/* The one symbol the connector looks up: the table for the backend ABI major it speaks. */
const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major);
const kvs_backend_ops *kvs_backend_entry(uint32_t abi_major) {
    return abi_major == KVS_BACKEND_ABI_MAJOR ? &ops : NULL;
}
