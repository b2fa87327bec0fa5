/* store_events.c - the store's cache events: what the tier chain stored and removed, each with the
 * engine's own key where this store put it (a KV-aware router indexes by the engine's keys). The
 * names live in a fixed table indexed by the kvstrata key (a newer name takes an older one's slot:
 * its events then carry only key16); the events in a ring that drops the oldest when full. */
#include <stdlib.h>
#include <string.h>

#include "store_events.h"

typedef struct name_slot {
    kvs_key key;
    uint32_t len; /* 0: empty */
    uint8_t *bytes;
} name_slot;

typedef struct event_rec {
    kvs_store_event head;
    uint8_t *bytes; /* head.key_len bytes, owned */
} event_rec;

struct kvs_store_events {
    pthread_mutex_t lock;
    name_slot *names; /* KVS_STORE_NAME_SLOTS */
    event_rec *ring;
    uint32_t cap, head, n;
    uint64_t dropped;
};

kvs_status kvs_store_events_create(uint32_t capacity, kvs_store_events **out) {
    kvs_store_events *ev = calloc(1, sizeof *ev);
    if (ev) ev->names = calloc(KVS_STORE_NAME_SLOTS, sizeof *ev->names);
    if (ev && ev->names) ev->ring = calloc(capacity, sizeof *ev->ring);
    if (!ev || !ev->names || !ev->ring) {
        if (ev) free(ev->names);
        free(ev);
        return KVS_ENOMEM;
    }
    ev->cap = capacity;
    pthread_mutex_init(&ev->lock, NULL);
    *out = ev;
    return KVS_OK;
}

void kvs_store_events_destroy(kvs_store_events *ev) {
    if (!ev) return;
    for (uint32_t i = 0; i < KVS_STORE_NAME_SLOTS; i++) free(ev->names[i].bytes);
    for (uint32_t i = 0; i < ev->n; i++) free(ev->ring[(ev->head + i) % ev->cap].bytes);
    free(ev->names);
    free(ev->ring);
    pthread_mutex_destroy(&ev->lock);
    free(ev);
}

static name_slot *slot_of(kvs_store_events *ev, const kvs_key *key) {
    uint32_t h;
    memcpy(&h, key->bytes, sizeof h);
    return &ev->names[h % KVS_STORE_NAME_SLOTS];
}

void kvs_store_events_name(kvs_store_events *ev, const kvs_key *key, const void *bytes,
                           uint32_t len) {
    uint8_t *copy = malloc(len);
    if (!copy) return; /* the events name key16 only */
    memcpy(copy, bytes, len);
    pthread_mutex_lock(&ev->lock);
    name_slot *sl = slot_of(ev, key);
    free(sl->bytes);
    *sl = (name_slot){.key = *key, .len = len, .bytes = copy};
    pthread_mutex_unlock(&ev->lock);
}

void kvs_store_on_tier_event(void *ctx, uint8_t kind, const kvs_key *key, uint32_t tier) {
    kvs_store_events *ev = ((kvs_store *)ctx)->events;
    if (!ev) return;
    kind &= (uint8_t)~KVS_TIER_EVENT_DROPPED;
    pthread_mutex_lock(&ev->lock);
    name_slot *sl = slot_of(ev, key);
    int named = sl->len && !memcmp(&sl->key, key, sizeof *key);
    event_rec rec = {.head = {.kind = kind, .tier = (uint16_t)tier}};
    memcpy(rec.head.key16, key->bytes, sizeof rec.head.key16);
    if (named && (rec.bytes = malloc(sl->len))) {
        memcpy(rec.bytes, sl->bytes, sl->len);
        rec.head.key_len = sl->len;
    }
    /* a key removed from the last tier that held it is no longer the store's to name; a removal
     * from one tier of several cannot be told apart here, so the name stays until replaced */
    if (ev->n == ev->cap) {
        free(ev->ring[ev->head].bytes);
        ev->head = (ev->head + 1) % ev->cap;
        ev->n--;
        ev->dropped++;
    }
    ev->ring[(ev->head + ev->n++) % ev->cap] = rec;
    pthread_mutex_unlock(&ev->lock);
}

static uint64_t record_bytes(const event_rec *r) {
    return (KVS_STORE_EVENT_BYTES + r->head.key_len + 7u) & ~7ull;
}

kvs_status kvs_store_events_take(kvs_store_events *ev, void *buf, uint64_t cap, uint64_t *len,
                                 uint64_t *n) {
    uint64_t used = 0, taken = 0;
    pthread_mutex_lock(&ev->lock);
    while (taken < ev->n) {
        event_rec *r = &ev->ring[(ev->head + taken) % ev->cap];
        uint64_t need = record_bytes(r);
        if (used + need > cap) break;
        uint8_t *dst = (uint8_t *)buf + used;
        memset(dst, 0, need);
        memcpy(dst, &r->head, KVS_STORE_EVENT_BYTES);
        if (r->head.key_len) memcpy(dst + KVS_STORE_EVENT_BYTES, r->bytes, r->head.key_len);
        free(r->bytes);
        used += need;
        taken++;
    }
    int overflow = taken == 0 && ev->n > 0;
    ev->head = ev->cap ? (ev->head + (uint32_t)taken) % ev->cap : 0;
    ev->n -= (uint32_t)taken;
    pthread_mutex_unlock(&ev->lock);
    *len = used;
    *n = taken;
    return overflow ? KVS_EOVERFLOW : KVS_OK;
}

uint64_t kvs_store_events_dropped(const kvs_store_events *ev) {
    return ev ? __atomic_load_n(&ev->dropped, __ATOMIC_RELAXED) : 0;
}
