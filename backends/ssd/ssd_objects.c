/*
 * ssd_objects.c - the ssd tier's index, LRU and object lifecycle, pins, removal with tombstones,
 * and what happens to objects when a path fails (contracts in ssd_tier.h).
 */
#include "ssd_tier.h"

#include "common/key.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers --------------------------------------------------------------------------- */

void ssd_set_error(ssd_tier *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&t->error_mutex);
    kvs_vfmt_tier(t->error, sizeof t->error, "ssd", t->tier_name, fmt, ap);
    pthread_mutex_unlock(&t->error_mutex);
    va_end(ap);
}

void ssd_log(ssd_tier *t, int level, const char *fmt, ...) {
    if (!t->log) return;
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    kvs_vfmt_tier(message, sizeof message, "ssd", t->tier_name, fmt, ap);
    va_end(ap);
    t->log(t->host_ctx, level, message);
}

/* ---- index (linear probing, backward-shift deletion), LRU, object lifecycle ------------------ */

uint32_t ssd_index_find(const ssd_tier *t, const kvs_key *key, uint64_t *bucket_out) {
    uint64_t mask = t->n_buckets - 1;
    for (uint64_t b = kvs_key_hash(key) & mask;; b = (b + 1) & mask) {
        uint32_t o = t->buckets[b];
        if (o == SSD_NIL) return SSD_NIL;
        if (memcmp(&ssd_obj(t, o)->key, key, sizeof *key) == 0) {
            if (bucket_out) *bucket_out = b;
            return o;
        }
    }
}

/* Record o into the first empty bucket of its probe run. */
static void index_add_record(ssd_tier *t, uint32_t o) {
    uint64_t mask = t->n_buckets - 1;
    uint64_t b = kvs_key_hash(&ssd_obj(t, o)->key) & mask;
    while (t->buckets[b] != SSD_NIL) b = (b + 1) & mask;
    t->buckets[b] = o;
}

/* Empty bucket `hole`, moving later records of its probe run back so lookups still find them. */
static void index_shift_into_hole(ssd_tier *t, uint64_t hole) {
    uint64_t mask = t->n_buckets - 1;
    for (uint64_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
        uint32_t o = t->buckets[j];
        if (o == SSD_NIL) break;
        uint64_t home = kvs_key_hash(&ssd_obj(t, o)->key) & mask;
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->buckets[hole] = o;
            hole = j;
        }
    }
    t->buckets[hole] = SSD_NIL;
}

static void lru_take_out(ssd_tier *t, uint32_t o) {
    ssd_object *e = ssd_obj(t, o);
    if (e->prev != SSD_NIL)
        ssd_obj(t, e->prev)->next = e->next;
    else
        t->lru_head = e->next;
    if (e->next != SSD_NIL)
        ssd_obj(t, e->next)->prev = e->prev;
    else
        t->lru_tail = e->prev;
    e->prev = e->next = SSD_NIL;
}

static void lru_put_first(ssd_tier *t, uint32_t o) {
    ssd_object *e = ssd_obj(t, o);
    e->prev = SSD_NIL;
    e->next = t->lru_head;
    if (t->lru_head != SSD_NIL)
        ssd_obj(t, t->lru_head)->prev = o;
    else
        t->lru_tail = o;
    t->lru_head = o;
}

void ssd_lru_touch(ssd_tier *t, uint32_t o) {
    if (t->lru_head == o) return;
    lru_take_out(t, o);
    lru_put_first(t, o);
}

int ssd_object_pinned(ssd_object *e, uint64_t now) {
    if (e->pins == 0) return 0;
    if (now < e->pin_deadline_ns) return 1;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    return 0;
}

/* A record with room for n_units * replicas copies, or SSD_NIL. */
/* Another chunk of records on the free list; 0, or -1 when out of memory or at the limit. */
static int grow_records(ssd_tier *t) {
    if (t->n_chunks == t->max_chunks) return -1;
    ssd_object *chunk = calloc(SSD_CHUNK_RECORDS, sizeof *chunk);
    if (!chunk) return -1;
    uint32_t first = t->n_chunks * SSD_CHUNK_RECORDS;
    t->chunks[t->n_chunks++] = chunk;
    for (uint32_t i = SSD_CHUNK_RECORDS; i-- > 0;) {
        chunk[i].next = t->free_head;
        t->free_head = first + i;
    }
    return 0;
}

uint32_t ssd_object_alloc(ssd_tier *t, uint32_t n_units, uint32_t replicas) {
    if (t->free_head == SSD_NIL && grow_records(t) != 0) return SSD_NIL;
    uint32_t o = t->free_head;
    ssd_object *e = ssd_obj(t, o);
    uint64_t n_copies = (uint64_t)n_units * replicas;
    e->copies = malloc(n_copies * sizeof *e->copies);
    e->checksums = malloc((uint64_t)n_units * sizeof *e->checksums);
    if (!e->copies || !e->checksums) {
        free(e->copies);
        free(e->checksums);
        e->copies = NULL;
        e->checksums = NULL;
        return SSD_NIL;
    }
    t->free_head = e->next;
    for (uint64_t i = 0; i < n_copies; i++) e->copies[i] = (ssd_copy){SSD_NO_PATH, 0};
    e->n_units = n_units;
    e->replicas = replicas;
    e->pins = e->refs = 0;
    e->pin_deadline_ns = 0;
    e->prev = e->next = SSD_NIL;
    e->verified = 1;
    e->state = OBJ_WRITING;
    return o;
}

void ssd_slot_release(ssd_tier *t, ssd_copy *c) {
    if (c->path == SSD_NO_PATH) return;
    ssd_path *p = &t->paths[c->path];
    if (p->full && !p->backed[c->slot])
        p->retired++; /* writing it would only meet ENOSPC again */
    else
        p->free_slots[p->n_free++] = c->slot;
    c->path = SSD_NO_PATH;
}

void ssd_path_full(ssd_tier *t, uint32_t index, uint32_t slot) {
    ssd_path *p = &t->paths[index];
    p->backed[slot] = 0;
    p->retired++;
    if (p->full) return;
    p->full = 1;
    uint64_t kept = 0;
    for (uint64_t i = 0; i < p->n_free; i++) {
        if (p->backed[p->free_slots[i]])
            p->free_slots[kept++] = p->free_slots[i];
        else
            p->retired++;
    }
    p->n_free = kept;
    char size[32];
    kvs_fmt_bytes(size, sizeof size, (p->n_slots - p->retired) * t->stripe_bytes);
    ssd_log(t, KVS_LOG_WARN,
            "path %u (%s) is full: a write met ENOSPC; its capacity is lowered from %llu slots to "
            "the %llu (%s of "
            "data) the device holds, and room is made by evicting",
            index, p->dir, (unsigned long long)p->n_slots,
            (unsigned long long)(p->n_slots - p->retired), size);
}

/* Give every slot of the record back and put it on the free list. */
void ssd_object_release(ssd_tier *t, uint32_t o) {
    ssd_object *e = ssd_obj(t, o);
    uint64_t n_copies = (uint64_t)e->n_units * e->replicas;
    for (uint64_t i = 0; i < n_copies; i++) ssd_slot_release(t, &e->copies[i]);
    free(e->copies);
    free(e->checksums);
    e->copies = NULL;
    e->checksums = NULL;
    e->state = OBJ_FREE;
    e->next = t->free_head;
    t->free_head = o;
}

/* Take a live object out of the index and the LRU; its slots follow once nothing uses them. */
void ssd_drop_live(ssd_tier *t, uint32_t o) {
    ssd_object *e = ssd_obj(t, o);
    uint64_t bucket = 0;
    if (ssd_index_find(t, &e->key, &bucket) == o) index_shift_into_hole(t, bucket);
    lru_take_out(t, o);
    t->live_objects--;
    t->live_bytes -= e->len;
    uint64_t n_copies = (uint64_t)e->n_units * e->replicas;
    for (uint64_t i = 0; i < n_copies; i++)
        if (e->copies[i].path != SSD_NO_PATH) t->paths[e->copies[i].path].units--;
    e->pins = 0;
    e->state = OBJ_DROPPED;
    if (e->refs == 0) ssd_object_release(t, o);
}

void ssd_object_unref(ssd_tier *t, uint32_t o) {
    ssd_object *e = ssd_obj(t, o);
    if (e->refs > 0) e->refs--;
    if (e->refs == 0 && e->state == OBJ_DROPPED) ssd_object_release(t, o);
}

void ssd_install_live(ssd_tier *t, uint32_t o) {
    ssd_object *e = ssd_obj(t, o);
    e->state = OBJ_LIVE;
    index_add_record(t, o);
    lru_put_first(t, o);
    t->live_objects++;
    t->live_bytes += e->len;
    uint64_t n_copies = (uint64_t)e->n_units * e->replicas;
    for (uint64_t i = 0; i < n_copies; i++)
        if (e->copies[i].path != SSD_NO_PATH) t->paths[e->copies[i].path].units++;
}

/* Every unit has a copy on a path that works. */
int ssd_object_readable(const ssd_tier *t, const ssd_object *e) {
    for (uint32_t u = 0; u < e->n_units; u++) {
        int ok = 0;
        for (uint32_t r = 0; r < e->replicas && !ok; r++) {
            const ssd_copy *c = &e->copies[(uint64_t)u * e->replicas + r];
            ok = c->path != SSD_NO_PATH && ssd_path_usable(t, c->path);
        }
        if (!ok) return 0;
    }
    return 1;
}

/* With the lock held: the live, readable object of key, or SSD_NIL (an unreadable one is dropped). */
uint32_t ssd_find_readable(ssd_tier *t, const kvs_key *key) {
    uint32_t o = ssd_index_find(t, key, NULL);
    if (o == SSD_NIL) return SSD_NIL;
    if (ssd_object_readable(t, ssd_obj(t, o))) return o;
    ssd_drop_live(t, o);
    return SSD_NIL;
}

/* ---- tombstones ------------------------------------------------------------------------------ */

typedef struct tombstone_job {
    ssd_io_request req;
    ssd_tier *tier;
    uint32_t object;
} tombstone_job;

static void tombstone_done(ssd_io_request *req, int result) {
    (void)
        result; /* a lost tombstone only lets the object be found again, unverified, after a restart */
    tombstone_job *job = req->ctx;
    ssd_tier *t = job->tier;
    pthread_mutex_lock(&t->mutex);
    ssd_object_unref(t, job->object);
    pthread_mutex_unlock(&t->mutex);
    free(job);
}

/* With the lock held: overwrite the header of unit 0 of every copy, then drop the object, so it
 * does not come back after a restart. The slots stay taken until the tombstones landed. */
void ssd_remove_with_tombstone(ssd_tier *t, uint32_t o) {
    ssd_object *e = ssd_obj(t, o);
    for (uint32_t r = 0; r < e->replicas; r++) {
        ssd_copy *c = &e->copies[r];
        if (c->path == SSD_NO_PATH || !ssd_path_usable(t, c->path)) continue;
        tombstone_job *job = malloc(sizeof *job);
        if (!job) continue; /* the object is dropped anyway; only a restart could find it again */
        job->tier = t;
        job->object = o;
        ssd_io_prepare(&job->req, SSD_IO_OP_WRITE, SSD_IO_WRITE, t->zero_block, SSD_BLOCK,
                       ssd_slot_offset(t, c->slot), tombstone_done, job);
        e->refs++;
        ssd_io_request *req = &job->req;
        ssd_io_submit(t->paths[c->path].io, &req, 1);
    }
    ssd_drop_live(t, o);
}

/* ---- path failure ---------------------------------------------------------------------------- */

void ssd_on_path_failed(void *ctx, uint32_t index, int err) {
    ssd_tier *t = ctx;
    uint64_t lost = 0;
    pthread_mutex_lock(&t->mutex);
    for (uint32_t o = t->lru_head; o != SSD_NIL;) {
        uint32_t next = ssd_obj(t, o)->next;
        if (!ssd_object_readable(t, ssd_obj(t, o))) {
            ssd_drop_live(t, o);
            lost++;
        }
        o = next;
    }
    pthread_mutex_unlock(&t->mutex);
    ssd_log(t, KVS_LOG_ERROR,
            "path %u (%s) is isolated after %s; %llu objects without another copy are now misses",
            index, t->paths[index].dir, kvs_errno_name(err), (unsigned long long)lost);
}

/* ---- lookups, pins, removal, usage ----------------------------------------------------------- */
kvs_status ssd_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    ssd_tier *t = state;
    if (!t || (!keys && n) || !n_present) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    uint64_t i = 0;
    while (i < n && ssd_find_readable(t, &keys[i]) != SSD_NIL) i++;
    pthread_mutex_unlock(&t->mutex);
    *n_present = i;
    return KVS_OK;
}

kvs_status ssd_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                   uint64_t *n_pinned) {
    ssd_tier *t = state;
    if (!t || (!keys && n) || !n_pinned) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    uint64_t now = kvs_clock_now_ns(t->clock);
    uint64_t room_ms = (UINT64_MAX - now) / 1000000ull;
    uint64_t deadline = now + (timeout_ms < room_ms ? timeout_ms : room_ms) * 1000000ull;
    uint64_t i = 0;
    for (; i < n; i++) {
        uint32_t o = ssd_find_readable(t, &keys[i]);
        if (o == SSD_NIL) break;
        ssd_object *e = ssd_obj(t, o);
        ssd_object_pinned(e, now);
        if (e->pins < UINT32_MAX) e->pins++;
        if (deadline > e->pin_deadline_ns) e->pin_deadline_ns = deadline;
    }
    pthread_mutex_unlock(&t->mutex);
    *n_pinned = i;
    return KVS_OK;
}

kvs_status ssd_unpin(void *state, const kvs_key *keys, uint64_t n) {
    ssd_tier *t = state;
    if (!t || (!keys && n)) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    uint64_t now = kvs_clock_now_ns(t->clock);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t o = ssd_index_find(t, &keys[i], NULL);
        if (o == SSD_NIL) continue;
        ssd_object *e = ssd_obj(t, o);
        if (!ssd_object_pinned(e, now)) continue;
        if (--e->pins == 0) e->pin_deadline_ns = 0;
    }
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
}

kvs_status ssd_remove(void *state, const kvs_key *key) {
    ssd_tier *t = state;
    if (!t || !key) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    uint32_t o = ssd_index_find(t, key, NULL);
    if (o != SSD_NIL) ssd_remove_with_tombstone(t, o);
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
}

kvs_status ssd_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    ssd_tier *t = state;
    if (!t || !n_objects || !bytes) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    *n_objects = t->live_objects;
    *bytes = t->live_bytes;
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
}
