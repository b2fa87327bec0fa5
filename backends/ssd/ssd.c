/*
 * ssd.c - the SSD tier (contract in ssd.h; format, crash model and options in docs/ssd.md).
 *
 * One lock guards the index, the LRU, the slot stacks and the write-buffer budget; I/O runs on the
 * per-path engines (ssd_io.c) and no op waits for I/O with the lock held. An object moves
 * WRITING -> LIVE (in the index) -> DROPPED (out of the index, its slots still held by reads or
 * tombstone writes in flight) -> FREE. Slots go back to their path only when nothing can still
 * touch them, so a slot is never rewritten under a read.
 */
#include "ssd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "ssd_format.h"
#include "ssd_io.h"
#include "ssd_options.h"
#include "ssd_place.h"
#include "ssd_recover.h"

#define NIL UINT32_MAX
#define NO_PATH UINT32_MAX
#define LOCK_WAIT_NS (2ull * 1000 * 1000 * 1000)

enum { OBJ_FREE = 0, OBJ_WRITING, OBJ_LIVE, OBJ_DROPPED };

typedef struct ssd_copy {
    uint32_t path, slot; /* path NO_PATH: this copy is missing */
} ssd_copy;

typedef struct ssd_object {
    kvs_key key;
    uint64_t len, seq;
    uint64_t pin_deadline_ns; /* CLOCK_MONOTONIC; meaningful while pins > 0 */
    uint32_t pins;
    uint32_t refs; /* reads and tombstone writes in flight: the slots stay taken until 0 */
    uint32_t n_units, replicas;
    uint32_t prev, next; /* LRU while live, free list while free */
    uint8_t state;
    uint8_t verified; /* 0 for a recovered object until one read matched its data checksums */
    ssd_copy *copies;   /* [n_units * replicas] */
    uint64_t *checksums; /* [n_units] XXH3-64 of each unit's data */
} ssd_object;

typedef struct ssd_path {
    char dir[4096];
    int fd;
    ssd_io_path *io;
    uint64_t n_slots;
    uint32_t *free_slots; /* stack */
    uint64_t n_free;
    uint64_t units; /* unit copies of live objects */
} ssd_path;

typedef struct ssd_tier {
    char tier_name[96];
    uint64_t stripe_bytes, slot_bytes, max_object_bytes, io_timeout_ms;
    uint32_t replicas, n_paths, queue_depth;
    ssd_path paths[SSD_MAX_PATHS];

    pthread_mutex_t mutex;
    pthread_cond_t drained; /* writes_pending dropped (CLOCK_MONOTONIC) */
    ssd_object *objects;
    uint32_t n_object_slots, free_head;
    uint32_t *buckets;
    uint64_t n_buckets;
    uint32_t lru_head, lru_tail; /* head = most recently used */
    uint64_t live_objects, live_bytes;
    uint64_t next_seq, place_pointer;
    uint64_t write_buffer_bytes, buffered_bytes, writes_pending;

    ssd_io_counters io;
    atomic_uint_fast64_t evictions, enospc_skips, queue_full_skips, corrupt_drops, bounce_reads;
    uint64_t recovered, fallbacks;

    void *host_ctx;
    void (*log)(void *ctx, int level, const char *message);
    void (*place)(void *ctx, uint64_t *pointer, uint32_t n_paths, uint32_t n_units, uint32_t replicas,
                  uint32_t *paths_out);
    void (*schedule)(void *ctx, uint32_t n_paths, uint64_t n, uint32_t max_copies, const uint32_t *n_copies,
                     const uint32_t *paths, uint32_t *chosen, uint64_t *order);
    void *staging_base;
    uint64_t staging_len;
    uint8_t *zero_block; /* a tombstone: an all-zero unit header */

    pthread_mutex_t error_mutex;
    char error[512];
} ssd_tier;

/* ---- small helpers --------------------------------------------------------------------------- */

static void set_error(ssd_tier *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(ssd_tier *t, const char *fmt, ...) {
    char body[420];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&t->error_mutex);
    snprintf(t->error, sizeof t->error, "ssd tier \"%s\": %s", t->tier_name, body);
    pthread_mutex_unlock(&t->error_mutex);
}

static void log_message(ssd_tier *t, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void log_message(ssd_tier *t, int level, const char *fmt, ...) {
    if (!t->log) return;
    char body[400], message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    snprintf(message, sizeof message, "ssd tier \"%s\": %s", t->tier_name, body);
    t->log(t->host_ctx, level, message);
}

static const char *errno_name(int err) {
    const char *name = strerrorname_np(err);
    return name ? name : "unknown error";
}

static void format_bytes(uint64_t v, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned u = 0;
    uint64_t scale = 1;
    while (u + 1 < sizeof units / sizeof units[0] && v / scale >= 1024) {
        scale *= 1024;
        u++;
    }
    if (v % scale == 0) snprintf(buf, len, "%llu%s", (unsigned long long)(v / scale), units[u]);
    else snprintf(buf, len, "%.1f%s", (double)v / (double)scale, units[u]);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t hash_key(const kvs_key *key) {
    uint64_t a, b;
    memcpy(&a, key->bytes, 8);
    memcpy(&b, key->bytes + 8, 8);
    uint64_t h = a ^ (b * 0x9E3779B97F4A7C15ull);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

static uint64_t slot_offset(const ssd_tier *t, uint32_t slot) { return SSD_BLOCK + (uint64_t)slot * t->slot_bytes; }

static int path_usable(const ssd_tier *t, uint32_t p) {
    return p < t->n_paths && t->paths[p].io && !ssd_io_failed(t->paths[p].io);
}

/* ---- index (linear probing, backward-shift deletion), LRU, object lifecycle ------------------ */

static uint32_t index_find(const ssd_tier *t, const kvs_key *key, uint64_t *bucket_out) {
    uint64_t mask = t->n_buckets - 1;
    for (uint64_t b = hash_key(key) & mask;; b = (b + 1) & mask) {
        uint32_t o = t->buckets[b];
        if (o == NIL) return NIL;
        if (memcmp(&t->objects[o].key, key, sizeof *key) == 0) {
            if (bucket_out) *bucket_out = b;
            return o;
        }
    }
}

static void index_insert(ssd_tier *t, uint32_t o) {
    uint64_t mask = t->n_buckets - 1;
    uint64_t b = hash_key(&t->objects[o].key) & mask;
    while (t->buckets[b] != NIL) b = (b + 1) & mask;
    t->buckets[b] = o;
}

static void index_erase(ssd_tier *t, uint64_t hole) {
    uint64_t mask = t->n_buckets - 1;
    for (uint64_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
        uint32_t o = t->buckets[j];
        if (o == NIL) break;
        uint64_t home = hash_key(&t->objects[o].key) & mask;
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->buckets[hole] = o;
            hole = j;
        }
    }
    t->buckets[hole] = NIL;
}

static void lru_unlink(ssd_tier *t, uint32_t o) {
    ssd_object *e = &t->objects[o];
    if (e->prev != NIL) t->objects[e->prev].next = e->next;
    else t->lru_head = e->next;
    if (e->next != NIL) t->objects[e->next].prev = e->prev;
    else t->lru_tail = e->prev;
    e->prev = e->next = NIL;
}

static void lru_push_head(ssd_tier *t, uint32_t o) {
    ssd_object *e = &t->objects[o];
    e->prev = NIL;
    e->next = t->lru_head;
    if (t->lru_head != NIL) t->objects[t->lru_head].prev = o;
    else t->lru_tail = o;
    t->lru_head = o;
}

static void lru_touch(ssd_tier *t, uint32_t o) {
    if (t->lru_head == o) return;
    lru_unlink(t, o);
    lru_push_head(t, o);
}

static int object_pinned(ssd_object *e, uint64_t now) {
    if (e->pins == 0) return 0;
    if (now < e->pin_deadline_ns) return 1;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    return 0;
}

/* A record with room for n_units * replicas copies, or NIL. */
static uint32_t object_alloc(ssd_tier *t, uint32_t n_units, uint32_t replicas) {
    uint32_t o = t->free_head;
    if (o == NIL) return NIL;
    ssd_object *e = &t->objects[o];
    uint64_t n_copies = (uint64_t)n_units * replicas;
    e->copies = malloc(n_copies * sizeof *e->copies);
    e->checksums = malloc((uint64_t)n_units * sizeof *e->checksums);
    if (!e->copies || !e->checksums) {
        free(e->copies);
        free(e->checksums);
        e->copies = NULL;
        e->checksums = NULL;
        return NIL;
    }
    t->free_head = e->next;
    for (uint64_t i = 0; i < n_copies; i++) e->copies[i] = (ssd_copy){NO_PATH, 0};
    e->n_units = n_units;
    e->replicas = replicas;
    e->pins = e->refs = 0;
    e->pin_deadline_ns = 0;
    e->prev = e->next = NIL;
    e->verified = 1;
    e->state = OBJ_WRITING;
    return o;
}

static void slot_release(ssd_tier *t, ssd_copy *c) {
    if (c->path == NO_PATH) return;
    ssd_path *p = &t->paths[c->path];
    p->free_slots[p->n_free++] = c->slot;
    c->path = NO_PATH;
}

/* Give every slot of the record back and put it on the free list. */
static void object_release(ssd_tier *t, uint32_t o) {
    ssd_object *e = &t->objects[o];
    uint64_t n_copies = (uint64_t)e->n_units * e->replicas;
    for (uint64_t i = 0; i < n_copies; i++) slot_release(t, &e->copies[i]);
    free(e->copies);
    free(e->checksums);
    e->copies = NULL;
    e->checksums = NULL;
    e->state = OBJ_FREE;
    e->next = t->free_head;
    t->free_head = o;
}

/* Take a live object out of the index and the LRU; its slots follow once nothing uses them. */
static void drop_live(ssd_tier *t, uint32_t o) {
    ssd_object *e = &t->objects[o];
    uint64_t bucket = 0;
    if (index_find(t, &e->key, &bucket) == o) index_erase(t, bucket);
    lru_unlink(t, o);
    t->live_objects--;
    t->live_bytes -= e->len;
    uint64_t n_copies = (uint64_t)e->n_units * e->replicas;
    for (uint64_t i = 0; i < n_copies; i++)
        if (e->copies[i].path != NO_PATH) t->paths[e->copies[i].path].units--;
    e->pins = 0;
    e->state = OBJ_DROPPED;
    if (e->refs == 0) object_release(t, o);
}

static void object_unref(ssd_tier *t, uint32_t o) {
    ssd_object *e = &t->objects[o];
    if (e->refs > 0) e->refs--;
    if (e->refs == 0 && e->state == OBJ_DROPPED) object_release(t, o);
}

static void install_live(ssd_tier *t, uint32_t o) {
    ssd_object *e = &t->objects[o];
    e->state = OBJ_LIVE;
    index_insert(t, o);
    lru_push_head(t, o);
    t->live_objects++;
    t->live_bytes += e->len;
    uint64_t n_copies = (uint64_t)e->n_units * e->replicas;
    for (uint64_t i = 0; i < n_copies; i++)
        if (e->copies[i].path != NO_PATH) t->paths[e->copies[i].path].units++;
}

/* Every unit has a copy on a path that works. */
static int object_readable(const ssd_tier *t, const ssd_object *e) {
    for (uint32_t u = 0; u < e->n_units; u++) {
        int ok = 0;
        for (uint32_t r = 0; r < e->replicas && !ok; r++) {
            const ssd_copy *c = &e->copies[(uint64_t)u * e->replicas + r];
            ok = c->path != NO_PATH && path_usable(t, c->path);
        }
        if (!ok) return 0;
    }
    return 1;
}

/* With the lock held: the live, readable object of key, or NIL (an unreadable one is dropped). */
static uint32_t find_readable(ssd_tier *t, const kvs_key *key) {
    uint32_t o = index_find(t, key, NULL);
    if (o == NIL) return NIL;
    if (object_readable(t, &t->objects[o])) return o;
    drop_live(t, o);
    return NIL;
}

/* ---- tombstones ------------------------------------------------------------------------------ */

typedef struct tombstone_job {
    ssd_io_request req;
    ssd_tier *tier;
    uint32_t object;
} tombstone_job;

static void tombstone_done(ssd_io_request *req, int result) {
    (void)result; /* a lost tombstone only lets the object be found again, unverified, after a restart */
    tombstone_job *job = req->ctx;
    ssd_tier *t = job->tier;
    pthread_mutex_lock(&t->mutex);
    object_unref(t, job->object);
    pthread_mutex_unlock(&t->mutex);
    free(job);
}

/* With the lock held: overwrite the header of unit 0 of every copy, then drop the object, so it
 * does not come back after a restart. The slots stay taken until the tombstones landed. */
static void remove_with_tombstone(ssd_tier *t, uint32_t o) {
    ssd_object *e = &t->objects[o];
    for (uint32_t r = 0; r < e->replicas; r++) {
        ssd_copy *c = &e->copies[r];
        if (c->path == NO_PATH || !path_usable(t, c->path)) continue;
        tombstone_job *job = malloc(sizeof *job);
        if (!job) continue; /* the object is dropped anyway; only a restart could find it again */
        job->tier = t;
        job->object = o;
        ssd_io_prepare(&job->req, SSD_IO_OP_WRITE, SSD_IO_WRITE, t->zero_block, SSD_BLOCK, slot_offset(t, c->slot),
                       tombstone_done, job);
        e->refs++;
        ssd_io_request *req = &job->req;
        ssd_io_submit(t->paths[c->path].io, &req, 1);
    }
    drop_live(t, o);
}

/* ---- path failure ---------------------------------------------------------------------------- */

static void on_path_failed(void *ctx, uint32_t index, int err) {
    ssd_tier *t = ctx;
    uint64_t lost = 0;
    pthread_mutex_lock(&t->mutex);
    for (uint32_t o = t->lru_head; o != NIL;) {
        uint32_t next = t->objects[o].next;
        if (!object_readable(t, &t->objects[o])) {
            drop_live(t, o);
            lost++;
        }
        o = next;
    }
    pthread_mutex_unlock(&t->mutex);
    log_message(t, KVS_LOG_ERROR, "path %u (%s) is isolated after %s; %llu objects without another copy are now misses",
                index, t->paths[index].dir, errno_name(err), (unsigned long long)lost);
}

/* ---- put ------------------------------------------------------------------------------------- */

typedef struct write_job {
    ssd_tier *tier;
    uint32_t object;
    uint32_t n_copies, remaining;
    int enospc, error;
    uint8_t *buffer;
    uint64_t buffer_bytes;
    uint8_t *copy_failed;   /* [n_copies] */
    ssd_io_request *reqs;   /* [n_copies] */
} write_job;

static void free_write_job(write_job *job) {
    if (!job) return;
    free(job->buffer);
    free(job->copy_failed);
    free(job->reqs);
    free(job);
}

/* With the lock held: the last unit write of job finished. */
static void finish_write(ssd_tier *t, write_job *job) {
    uint32_t o = job->object;
    ssd_object *e = &t->objects[o];
    for (uint32_t i = 0; i < job->n_copies; i++)
        if (job->copy_failed[i]) slot_release(t, &e->copies[i]);
    int complete = 1;
    for (uint32_t u = 0; u < e->n_units && complete; u++) {
        int ok = 0;
        for (uint32_t r = 0; r < e->replicas; r++) ok |= e->copies[(uint64_t)u * e->replicas + r].path != NO_PATH;
        complete = ok;
    }
    t->buffered_bytes -= job->buffer_bytes;
    t->writes_pending--;
    pthread_cond_broadcast(&t->drained);
    if (!complete) {
        if (job->enospc) atomic_fetch_add(&t->enospc_skips, 1);
        object_release(t, o);
        return;
    }
    uint32_t old = index_find(t, &e->key, NULL);
    if (old != NIL) {
        ssd_object *x = &t->objects[old];
        if (x->seq > e->seq || object_pinned(x, now_ns())) {
            object_release(t, o); /* a newer write won, or a reader holds the stored copy: same key, same bytes */
            return;
        }
        drop_live(t, old);
    }
    install_live(t, o);
}

static void write_done(ssd_io_request *req, int result) {
    write_job *job = req->ctx;
    ssd_tier *t = job->tier;
    int finished = 0;
    pthread_mutex_lock(&t->mutex);
    if (result < 0) {
        job->copy_failed[req - job->reqs] = 1;
        if (result == -ENOSPC) job->enospc = 1;
        else job->error = -result;
    }
    if (--job->remaining == 0) {
        finish_write(t, job);
        finished = 1;
    }
    pthread_mutex_unlock(&t->mutex);
    if (finished) free_write_job(job);
}

/* With the lock held: paths for every copy of an object of n_units units, on usable paths, the
 * copies of one unit on distinct paths where there are enough. 0, or -1 when no path works. */
static int choose_paths(ssd_tier *t, uint32_t n_units, uint32_t *paths_out) {
    uint32_t R = t->replicas, n = t->n_paths, usable = 0;
    for (uint32_t p = 0; p < n; p++) usable += (uint32_t)path_usable(t, p);
    if (usable == 0) return -1;
    if (t->place) t->place(t->host_ctx, &t->place_pointer, n, n_units, R, paths_out);
    else ssd_place_stripe(&t->place_pointer, n, n_units, R, paths_out);
    for (uint32_t u = 0; u < n_units; u++) {
        uint32_t *copy = &paths_out[(uint64_t)u * R];
        for (uint32_t r = 0; r < R; r++) {
            uint32_t p = copy[r] % n;
            int clash = 0;
            for (uint32_t q = 0; q < r; q++) clash |= copy[q] == p;
            if (path_usable(t, p) && (!clash || usable <= r)) {
                copy[r] = p;
                continue;
            }
            /* the next usable path not holding this unit yet, else any usable one */
            uint32_t pick = NO_PATH;
            for (uint32_t step = 1; step <= n && pick == NO_PATH; step++) {
                uint32_t c = (p + step) % n;
                int used = 0;
                for (uint32_t q = 0; q < r; q++) used |= copy[q] == c;
                if (path_usable(t, c) && (!used || usable <= r)) pick = c;
            }
            copy[r] = pick;
        }
    }
    return 0;
}

/* With the lock held: evict least recently used objects until every path p has need[p] free
 * slots. 0, or -1 with the error set. */
static int make_room(ssd_tier *t, const uint64_t *need) {
    uint64_t now = now_ns();
    for (uint32_t p = 0; p < t->n_paths; p++) {
        if (need[p] > t->paths[p].n_slots) {
            set_error(t, "an object needs %llu slots on path %u (%s), which has %llu", (unsigned long long)need[p], p,
                      t->paths[p].dir, (unsigned long long)t->paths[p].n_slots);
            return -1;
        }
    }
    for (;;) {
        uint32_t short_path = NO_PATH;
        for (uint32_t p = 0; p < t->n_paths && short_path == NO_PATH; p++)
            if (t->paths[p].n_free < need[p]) short_path = p;
        if (short_path == NO_PATH) return 0;
        uint32_t victim = NIL;
        for (uint32_t o = t->lru_tail; o != NIL && victim == NIL; o = t->objects[o].prev) {
            ssd_object *e = &t->objects[o];
            if (e->refs || object_pinned(e, now)) continue;
            uint64_t n_copies = (uint64_t)e->n_units * e->replicas;
            for (uint64_t i = 0; i < n_copies && victim == NIL; i++) {
                uint32_t p = e->copies[i].path;
                if (p != NO_PATH && t->paths[p].n_free < need[p]) victim = o;
            }
        }
        if (victim == NIL) {
            set_error(t, "path %u (%s) is full and every object on it is pinned, being read or being written",
                      short_path, t->paths[short_path].dir);
            return -1;
        }
        drop_live(t, victim);
        atomic_fetch_add(&t->evictions, 1);
    }
}

static kvs_status ssd_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    ssd_tier *t = state;
    if (!t || !key || (!object && len)) return KVS_EINVAL;
    if (len > t->max_object_bytes) {
        char got[32], max[32];
        format_bytes(len, got, sizeof got);
        format_bytes(t->max_object_bytes, max, sizeof max);
        set_error(t, "object of %s is larger than the tier's max object size %s", got, max);
        return KVS_EINVAL;
    }
    uint32_t n_units = ssd_format_unit_count(len, t->stripe_bytes), R = t->replicas;
    uint32_t n_copies = n_units * R;
    uint64_t header_bytes = (uint64_t)n_copies * SSD_BLOCK, data_bytes = ssd_round_up(len, SSD_BLOCK);
    uint64_t need = header_bytes + data_bytes;

    pthread_mutex_lock(&t->mutex);
    uint32_t existing = index_find(t, key, NULL);
    if (existing != NIL && object_pinned(&t->objects[existing], now_ns())) {
        lru_touch(t, existing); /* a reader holds it; equal keys carry equal bytes */
        pthread_mutex_unlock(&t->mutex);
        return KVS_OK;
    }
    if (t->buffered_bytes + need > t->write_buffer_bytes) {
        char held[32], limit[32];
        format_bytes(t->buffered_bytes, held, sizeof held);
        format_bytes(t->write_buffer_bytes, limit, sizeof limit);
        pthread_mutex_unlock(&t->mutex);
        atomic_fetch_add(&t->queue_full_skips, 1);
        set_error(t, "write queue full (%s of write_buffer_bytes %s waiting for the devices); object skipped", held,
                  limit);
        return KVS_ENOMEM;
    }
    t->buffered_bytes += need;
    t->writes_pending++;
    pthread_mutex_unlock(&t->mutex);

    /* Copy and checksum outside the lock. */
    write_job *job = calloc(1, sizeof *job);
    uint32_t *paths = malloc((uint64_t)n_copies * sizeof *paths);
    uint64_t *per_path_need = calloc(t->n_paths, sizeof *per_path_need);
    ssd_io_request **batch = malloc((uint64_t)n_copies * sizeof *batch);
    uint64_t *checksums = malloc((uint64_t)n_units * sizeof *checksums);
    if (job) {
        job->tier = t;
        job->n_copies = job->remaining = n_copies;
        job->buffer_bytes = need;
        job->buffer = aligned_alloc(SSD_BLOCK, need);
        job->copy_failed = calloc(n_copies, 1);
        job->reqs = calloc(n_copies, sizeof *job->reqs);
    }
    kvs_status rc = KVS_ENOMEM;
    if (!job || !job->buffer || !job->copy_failed || !job->reqs || !paths || !per_path_need || !batch || !checksums) {
        set_error(t, "out of memory for a write buffer of %llu bytes", (unsigned long long)need);
        goto undo_budget;
    }
    uint8_t *data = job->buffer + header_bytes;
    memset(job->buffer, 0, header_bytes);
    if (len) memcpy(data, object, len);
    memset(data + len, 0, data_bytes - len);
    for (uint32_t u = 0; u < n_units; u++)
        checksums[u] = XXH3_64bits(data + (uint64_t)u * t->stripe_bytes, ssd_format_unit_bytes(len, t->stripe_bytes, u));

    pthread_mutex_lock(&t->mutex);
    if (choose_paths(t, n_units, paths) != 0) {
        pthread_mutex_unlock(&t->mutex);
        set_error(t, "every path has failed; nothing can be stored");
        rc = KVS_EIO;
        goto undo_budget;
    }
    for (uint32_t i = 0; i < n_copies; i++) per_path_need[paths[i]]++;
    if (make_room(t, per_path_need) != 0) {
        pthread_mutex_unlock(&t->mutex);
        goto undo_budget; /* make_room set the error */
    }
    /* A free slot means a free record: every record in use holds at least one slot. */
    uint32_t o = object_alloc(t, n_units, R);
    if (o == NIL) {
        pthread_mutex_unlock(&t->mutex);
        set_error(t, "out of memory for an object record");
        goto undo_budget;
    }
    ssd_object *e = &t->objects[o];
    e->key = *key;
    e->len = len;
    e->seq = t->next_seq++;
    memcpy(e->checksums, checksums, (uint64_t)n_units * sizeof *checksums);
    job->object = o;
    for (uint32_t u = 0; u < n_units; u++) {
        uint64_t unit_bytes = ssd_format_unit_bytes(len, t->stripe_bytes, u);
        for (uint32_t r = 0; r < R; r++) {
            uint32_t i = u * R + r;
            ssd_path *p = &t->paths[paths[i]];
            e->copies[i] = (ssd_copy){paths[i], p->free_slots[--p->n_free]};
            ssd_unit_header h = {.key = *key,
                                 .object_len = len,
                                 .sequence = e->seq,
                                 .unit_index = u,
                                 .unit_count = n_units,
                                 .replica_index = r,
                                 .replica_count = R,
                                 .stripe_bytes = t->stripe_bytes,
                                 .data_bytes = (uint32_t)unit_bytes,
                                 .data_checksum = checksums[u]};
            uint8_t *header = job->buffer + (uint64_t)i * SSD_BLOCK;
            ssd_format_encode_unit(&h, header);
            ssd_io_request *req = &job->reqs[i];
            ssd_io_prepare(req, SSD_IO_OP_WRITE, SSD_IO_WRITE, header, SSD_BLOCK, slot_offset(t, e->copies[i].slot),
                           write_done, job);
            if (unit_bytes) {
                req->n_iov = 2;
                req->iov[1].iov_base = data + (uint64_t)u * t->stripe_bytes;
                req->iov[1].iov_len = (size_t)ssd_round_up(unit_bytes, SSD_BLOCK);
            }
        }
    }
    /* One batch per path, so a ring issues an object's units on it with one system call. */
    for (uint32_t p = 0; p < t->n_paths; p++) {
        uint64_t k = 0;
        for (uint32_t i = 0; i < n_copies; i++)
            if (paths[i] == p) batch[k++] = &job->reqs[i];
        if (k) ssd_io_submit(t->paths[p].io, batch, k);
    }
    pthread_mutex_unlock(&t->mutex);
    free(paths);
    free(per_path_need);
    free(batch);
    free(checksums);
    return KVS_OK;

undo_budget:
    pthread_mutex_lock(&t->mutex);
    t->buffered_bytes -= need;
    t->writes_pending--;
    pthread_cond_broadcast(&t->drained);
    pthread_mutex_unlock(&t->mutex);
    free_write_job(job);
    free(paths);
    free(per_path_need);
    free(batch);
    free(checksums);
    return rc;
}

/* ---- reads ----------------------------------------------------------------------------------- */

typedef struct read_unit {
    ssd_io_request req;
    ssd_io_waiter *waiter;
    uint64_t item;       /* index into the call's keys */
    uint32_t unit;
    uint32_t tried;      /* bit r: copy r was tried */
    uint32_t path;       /* copy being read */
    uint8_t *dst;        /* where the unit's data belongs */
    uint8_t *bounce;     /* aligned buffer when dst cannot take the read directly */
    uint64_t data_bytes; /* object bytes in this unit */
    uint64_t read_bytes; /* data_bytes rounded up to 4KiB */
    int result;
} read_unit;

#define READ_PENDING INT_MIN

static void read_done(ssd_io_request *req, int result) {
    read_unit *ru = req->ctx;
    __atomic_store_n(&ru->result, result, __ATOMIC_RELAXED);
    ssd_io_waiter_signal(ru->waiter);
}

/* Point ru at copy `path` (a usable path holding it) and pick direct, fixed or bounce. */
static int prepare_read(ssd_tier *t, read_unit *ru, const ssd_object *e, uint32_t replica, uint64_t cap_left) {
    const ssd_copy *c = &e->copies[(uint64_t)ru->unit * e->replicas + replica];
    ru->path = c->path;
    ru->tried |= 1u << replica;
    ssd_io_path *io = t->paths[c->path].io;
    uint8_t *target = ru->dst;
    if (((uintptr_t)ru->dst % SSD_BLOCK) != 0 || ru->read_bytes > cap_left) {
        if (!ru->bounce && !(ru->bounce = aligned_alloc(SSD_BLOCK, ru->read_bytes))) return -1;
        target = ru->bounce;
    }
    ssd_io_prepare(&ru->req, SSD_IO_OP_READ, SSD_IO_RESTORE, target, ru->read_bytes,
                   slot_offset(t, c->slot) + SSD_BLOCK, read_done, ru);
    __atomic_store_n(&ru->result, READ_PENDING, __ATOMIC_RELAXED);
    if (target == ru->dst) ru->req.fixed_index = ssd_io_fixed_index(io, target, ru->read_bytes);
    return 0;
}

/* Submit reads[list[0..n)) grouped by path, each path's share as one batch in list order. */
static void submit_reads(ssd_tier *t, read_unit *reads, const uint64_t *list, uint64_t n, int io_class,
                         ssd_io_request **scratch) {
    for (uint32_t p = 0; p < t->n_paths; p++) {
        uint64_t k = 0;
        for (uint64_t i = 0; i < n; i++) {
            read_unit *ru = &reads[list[i]];
            if (ru->path != p) continue;
            ru->req.io_class = (uint8_t)io_class;
            scratch[k++] = &ru->req;
        }
        if (k) ssd_io_submit(t->paths[p].io, scratch, k);
    }
}

/* Wait for every read of the call; a path that stalls past io_timeout_ms is isolated, but the call
 * still waits for its buffers back (O_DIRECT transfers cannot be abandoned). */
static void wait_reads(ssd_tier *t, ssd_io_waiter *w, read_unit *reads, uint64_t n) {
    if (ssd_io_waiter_wait(w, t->io_timeout_ms) != ETIMEDOUT) return;
    for (uint64_t i = 0; i < n; i++) {
        if (__atomic_load_n(&reads[i].result, __ATOMIC_RELAXED) == READ_PENDING && reads[i].path != NO_PATH &&
            !ssd_io_failed(t->paths[reads[i].path].io)) {
            log_message(t, KVS_LOG_ERROR, "path %u (%s): a read took longer than io_timeout_ms %llu", reads[i].path,
                        t->paths[reads[i].path].dir, (unsigned long long)t->io_timeout_ms);
            ssd_io_fail(t->paths[reads[i].path].io, ETIMEDOUT);
        }
    }
    while (ssd_io_waiter_wait(w, t->io_timeout_ms) == ETIMEDOUT) {
    }
}

/* Per item of a get_many call. */
typedef struct read_item {
    uint32_t object; /* NIL: nothing to read */
    uint64_t first_read, n_reads;
    uint64_t same_as; /* an earlier item with the same key, or UINT64_MAX */
    int failed_path; /* a read failed on every copy: the path of the last try */
    int failed_errno;
    int corrupt;
} read_item;

static kvs_status get_many_class(ssd_tier *t, const kvs_key *keys, void *const *dsts, const uint64_t *caps, uint64_t n,
                                 uint64_t *lens, kvs_status *statuses, int io_class) {
    read_item *items = calloc(n ? n : 1, sizeof *items);
    uint64_t set_cap = 2;
    while (set_cap < 2 * n) set_cap <<= 1;
    uint64_t *seen_item = malloc(set_cap * sizeof *seen_item); /* object -> first item, to merge equal keys */
    read_unit *reads = NULL;
    uint32_t *n_copies = NULL, *copy_paths = NULL, *chosen = NULL;
    uint64_t *order = NULL;
    ssd_io_request **scratch = NULL;
    ssd_io_waiter waiter;
    int waiter_ready = 0;
    kvs_status rc = KVS_ENOMEM;
    if (!items || !seen_item) goto fail;
    for (uint64_t b = 0; b < set_cap; b++) seen_item[b] = UINT64_MAX;

    /* 1. Find the objects and hold them (refs) so their slots cannot be reused under the reads. */
    uint64_t total_reads = 0;
    uint32_t max_copies = 1;
    pthread_mutex_lock(&t->mutex);
    for (uint64_t i = 0; i < n; i++) {
        read_item *it = &items[i];
        it->object = NIL;
        it->same_as = UINT64_MAX;
        it->failed_path = -1;
        lens[i] = 0;
        uint32_t o = find_readable(t, &keys[i]);
        if (o == NIL) {
            statuses[i] = KVS_ENOTFOUND;
            continue;
        }
        ssd_object *e = &t->objects[o];
        lens[i] = e->len;
        if (caps[i] < e->len || (!dsts[i] && e->len)) {
            statuses[i] = KVS_EOVERFLOW;
            continue;
        }
        statuses[i] = KVS_OK;
        lru_touch(t, o);
        uint64_t b = (o * 0x9E3779B97F4A7C15ull >> 7) & (set_cap - 1);
        while (seen_item[b] != UINT64_MAX && items[seen_item[b]].object != o) b = (b + 1) & (set_cap - 1);
        if (seen_item[b] != UINT64_MAX) {
            it->same_as = seen_item[b];
            continue;
        }
        seen_item[b] = i;
        e->refs++;
        it->object = o;
        it->first_read = total_reads;
        it->n_reads = e->len ? e->n_units : 0;
        total_reads += it->n_reads;
        if (e->replicas > max_copies) max_copies = e->replicas;
    }
    pthread_mutex_unlock(&t->mutex);

    /* 2. One read per (object, unit), each with its usable copies; a policy picks copy and order. */
    reads = calloc(total_reads ? total_reads : 1, sizeof *reads);
    n_copies = calloc(total_reads ? total_reads : 1, sizeof *n_copies);
    copy_paths = calloc(total_reads * max_copies + 1, sizeof *copy_paths);
    chosen = calloc(total_reads ? total_reads : 1, sizeof *chosen);
    order = calloc(total_reads ? total_reads : 1, sizeof *order);
    scratch = calloc(total_reads ? total_reads : 1, sizeof *scratch);
    if (!reads || !n_copies || !copy_paths || !chosen || !order || !scratch || ssd_io_waiter_init(&waiter, 0) != 0)
        goto release;
    waiter_ready = 1;
    for (uint64_t i = 0; i < n; i++) {
        read_item *it = &items[i];
        if (it->object == NIL) continue;
        const ssd_object *e = &t->objects[it->object]; /* copies of a live object do not change */
        for (uint32_t u = 0; u < it->n_reads; u++) {
            uint64_t r = it->first_read + u;
            read_unit *ru = &reads[r];
            ru->waiter = &waiter;
            ru->item = i;
            ru->unit = u;
            ru->path = NO_PATH;
            ru->dst = (uint8_t *)dsts[i] + (uint64_t)u * t->stripe_bytes;
            ru->data_bytes = ssd_format_unit_bytes(e->len, t->stripe_bytes, u);
            ru->read_bytes = ssd_round_up(ru->data_bytes, SSD_BLOCK);
            for (uint32_t c = 0; c < e->replicas; c++) {
                const ssd_copy *cp = &e->copies[(uint64_t)u * e->replicas + c];
                if (cp->path != NO_PATH && path_usable(t, cp->path)) copy_paths[r * max_copies + n_copies[r]++] = cp->path;
            }
            if (n_copies[r] == 0) copy_paths[r * max_copies] = 0; /* reported below, never read */
        }
    }
    if (t->schedule) t->schedule(t->host_ctx, t->n_paths, total_reads, max_copies, n_copies, copy_paths, chosen, order);
    else ssd_place_schedule(t->n_paths, total_reads, max_copies, n_copies, copy_paths, chosen, order);
    /* Trust the policy only as far as it is right: a copy it did not offer, or an order that is not a
     * permutation, falls back to the plain choice. */
    {
        uint8_t *seen = calloc(total_reads ? total_reads : 1, 1);
        int permutation = seen != NULL;
        for (uint64_t k = 0; k < total_reads && permutation; k++) {
            if (order[k] >= total_reads || seen[order[k]]) permutation = 0;
            else seen[order[k]] = 1;
        }
        free(seen);
        if (!permutation)
            for (uint64_t k = 0; k < total_reads; k++) order[k] = k;
    }

    /* 3. Issue: each path's reads as one batch, in the policy's order. */
    uint64_t n_issue = 0;
    for (uint64_t k = 0; k < total_reads; k++) {
        read_unit *ru = &reads[order[k]];
        read_item *it = &items[ru->item];
        const ssd_object *e = &t->objects[it->object];
        uint64_t r = order[k];
        uint32_t replica = NO_PATH;
        for (uint32_t c = 0; c < e->replicas && replica == NO_PATH; c++) {
            const ssd_copy *cp = &e->copies[(uint64_t)ru->unit * e->replicas + c];
            if (cp->path == chosen[r] && n_copies[r] && path_usable(t, cp->path)) replica = c;
        }
        for (uint32_t c = 0; c < e->replicas && replica == NO_PATH && n_copies[r]; c++) {
            const ssd_copy *cp = &e->copies[(uint64_t)ru->unit * e->replicas + c];
            if (cp->path != NO_PATH && path_usable(t, cp->path)) replica = c;
        }
        if (replica == NO_PATH) {
            ru->result = -EIO;
            continue;
        }
        if (prepare_read(t, ru, e, replica, caps[ru->item] - (uint64_t)ru->unit * t->stripe_bytes) != 0) {
            ru->result = -ENOMEM;
            continue;
        }
        if (ru->bounce) atomic_fetch_add(&t->bounce_reads, 1);
        order[n_issue++] = r;
    }
    ssd_io_waiter_add(&waiter, n_issue);
    submit_reads(t, reads, order, n_issue, io_class, scratch);
    wait_reads(t, &waiter, reads, total_reads);

    /* 4. A read that failed tries the unit's next usable copy, until none is left. */
    for (;;) {
        uint64_t n_retry = 0;
        for (uint64_t r = 0; r < total_reads; r++) {
            read_unit *ru = &reads[r];
            if (ru->result >= 0 || ru->result == -ENOMEM) continue;
            const ssd_object *e = &t->objects[items[ru->item].object];
            uint32_t replica = NO_PATH;
            for (uint32_t c = 0; c < e->replicas && replica == NO_PATH; c++) {
                const ssd_copy *cp = &e->copies[(uint64_t)ru->unit * e->replicas + c];
                if (!(ru->tried & (1u << c)) && cp->path != NO_PATH && path_usable(t, cp->path)) replica = c;
            }
            if (replica == NO_PATH) continue;
            if (prepare_read(t, ru, e, replica, caps[ru->item] - (uint64_t)ru->unit * t->stripe_bytes) != 0) continue;
            order[n_retry++] = r;
        }
        if (n_retry == 0) break;
        ssd_io_waiter_add(&waiter, n_retry);
        submit_reads(t, reads, order, n_retry, io_class, scratch);
        wait_reads(t, &waiter, reads, total_reads);
    }

    /* 5. Bounce copies, first-read verification of recovered objects, statuses. */
    for (uint64_t r = 0; r < total_reads; r++) {
        read_unit *ru = &reads[r];
        read_item *it = &items[ru->item];
        if (ru->result < 0) {
            if (!it->failed_errno) {
                it->failed_errno = -ru->result;
                it->failed_path = ru->path == NO_PATH ? -1 : (int)ru->path;
            }
            continue;
        }
        if (ru->bounce && ru->data_bytes) memcpy(ru->dst, ru->bounce, ru->data_bytes);
        const ssd_object *e = &t->objects[it->object];
        if (!__atomic_load_n(&e->verified, __ATOMIC_RELAXED) &&
            XXH3_64bits(ru->dst, ru->data_bytes) != e->checksums[ru->unit])
            it->corrupt = 1;
    }
    rc = KVS_OK;

release:
    pthread_mutex_lock(&t->mutex);
    for (uint64_t i = 0; i < n; i++) {
        read_item *it = &items[i];
        if (it->object == NIL) continue;
        ssd_object *e = &t->objects[it->object];
        if (rc != KVS_OK) {
            statuses[i] = KVS_ENOMEM;
        } else if (it->failed_errno) {
            statuses[i] = it->failed_errno == ENOMEM ? KVS_ENOMEM : KVS_EIO;
            if (it->failed_path >= 0)
                set_error(t, "reading an object failed on path %d (%s): %s", it->failed_path,
                          t->paths[it->failed_path].dir, errno_name(it->failed_errno));
            else
                set_error(t, "reading an object failed: %s", errno_name(it->failed_errno));
            if (e->state == OBJ_LIVE && !object_readable(t, e)) drop_live(t, it->object);
        } else if (it->corrupt) {
            statuses[i] = KVS_ECORRUPT;
            atomic_fetch_add(&t->corrupt_drops, 1);
            set_error(t, "an object found after a restart failed its unit checksum (a torn write); removed");
            if (e->state == OBJ_LIVE) remove_with_tombstone(t, it->object);
        } else {
            __atomic_store_n(&e->verified, 1, __ATOMIC_RELAXED);
        }
        object_unref(t, it->object);
    }
    pthread_mutex_unlock(&t->mutex);
    /* Equal keys in one call: the first one's bytes and status. */
    for (uint64_t i = 0; i < n; i++) {
        if (items[i].same_as == UINT64_MAX) continue;
        uint64_t j = items[i].same_as;
        statuses[i] = rc == KVS_OK ? statuses[j] : KVS_ENOMEM;
        lens[i] = lens[j];
        if (statuses[i] == KVS_OK && lens[i]) memcpy(dsts[i], dsts[j], lens[i]);
    }
    if (waiter_ready) ssd_io_waiter_destroy(&waiter);
    if (reads)
        for (uint64_t r = 0; r < total_reads; r++) free(reads[r].bounce);
    free(items);
    free(seen_item);
    free(reads);
    free(n_copies);
    free(copy_paths);
    free(chosen);
    free(order);
    free(scratch);
    return rc;

fail:
    free(items);
    free(seen_item);
    set_error(t, "out of memory for a read of %llu objects", (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) statuses[i] = KVS_ENOMEM;
    return KVS_ENOMEM;
}

static kvs_status ssd_get_many(void *state, const kvs_key *keys, void *const *dsts, const uint64_t *caps, uint64_t n,
                               uint64_t *lens, kvs_status *statuses) {
    ssd_tier *t = state;
    if (!t || (n && (!keys || !dsts || !caps || !lens || !statuses))) return KVS_EINVAL;
    return get_many_class(t, keys, dsts, caps, n, lens, statuses, SSD_IO_RESTORE);
}

static kvs_status ssd_get(void *state, const kvs_key *key, void *dst, uint64_t cap, uint64_t *len) {
    ssd_tier *t = state;
    if (!t || !key || !len || (!dst && cap)) return KVS_EINVAL;
    kvs_status status = KVS_OK;
    void *dsts[1] = {dst};
    kvs_status rc = get_many_class(t, key, dsts, &cap, 1, len, &status, SSD_IO_PREFETCH);
    if (rc != KVS_OK) return rc;
    if (status == KVS_ENOTFOUND) set_error(t, "object not stored");
    else if (status == KVS_EOVERFLOW)
        set_error(t, "object of %llu bytes does not fit a buffer of %llu bytes", (unsigned long long)*len,
                  (unsigned long long)cap);
    return status;
}

/* ---- lookups, pins, removal, usage ----------------------------------------------------------- */

static kvs_status ssd_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    ssd_tier *t = state;
    if (!t || (!keys && n) || !n_present) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    uint64_t i = 0;
    while (i < n && find_readable(t, &keys[i]) != NIL) i++;
    pthread_mutex_unlock(&t->mutex);
    *n_present = i;
    return KVS_OK;
}

static kvs_status ssd_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms, uint64_t *n_pinned) {
    ssd_tier *t = state;
    if (!t || (!keys && n) || !n_pinned) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    uint64_t now = now_ns();
    uint64_t room_ms = (UINT64_MAX - now) / 1000000ull;
    uint64_t deadline = now + (timeout_ms < room_ms ? timeout_ms : room_ms) * 1000000ull;
    uint64_t i = 0;
    for (; i < n; i++) {
        uint32_t o = find_readable(t, &keys[i]);
        if (o == NIL) break;
        ssd_object *e = &t->objects[o];
        object_pinned(e, now);
        if (e->pins < UINT32_MAX) e->pins++;
        if (deadline > e->pin_deadline_ns) e->pin_deadline_ns = deadline;
    }
    pthread_mutex_unlock(&t->mutex);
    *n_pinned = i;
    return KVS_OK;
}

static kvs_status ssd_unpin(void *state, const kvs_key *keys, uint64_t n) {
    ssd_tier *t = state;
    if (!t || (!keys && n)) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    uint64_t now = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        uint32_t o = index_find(t, &keys[i], NULL);
        if (o == NIL) continue;
        ssd_object *e = &t->objects[o];
        if (!object_pinned(e, now)) continue;
        if (--e->pins == 0) e->pin_deadline_ns = 0;
    }
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
}

static kvs_status ssd_remove(void *state, const kvs_key *key) {
    ssd_tier *t = state;
    if (!t || !key) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    uint32_t o = index_find(t, key, NULL);
    if (o != NIL) remove_with_tombstone(t, o);
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
}

static kvs_status ssd_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    ssd_tier *t = state;
    if (!t || !n_objects || !bytes) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    *n_objects = t->live_objects;
    *bytes = t->live_bytes;
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
}

static const char *ssd_last_error(void *state) {
    ssd_tier *t = state;
    return t ? t->error : "";
}

kvs_status kvs_ssd_stats(void *state, kvs_ssd_stats_t *out) {
    ssd_tier *t = state;
    if (!t || !out) return KVS_EINVAL;
    memset(out, 0, sizeof *out);
    out->reads = atomic_load(&t->io.reads);
    out->writes = atomic_load(&t->io.writes);
    out->read_bytes = atomic_load(&t->io.read_bytes);
    out->written_bytes = atomic_load(&t->io.written_bytes);
    out->submits = atomic_load(&t->io.submits);
    out->fixed_reads = atomic_load(&t->io.fixed_reads);
    out->path_errors = atomic_load(&t->io.path_errors);
    out->bounce_reads = atomic_load(&t->bounce_reads);
    out->enospc_skips = atomic_load(&t->enospc_skips);
    out->queue_full_skips = atomic_load(&t->queue_full_skips);
    out->evictions = atomic_load(&t->evictions);
    out->corrupt_drops = atomic_load(&t->corrupt_drops);
    out->recovered = t->recovered;
    out->fallbacks = t->fallbacks;
    out->n_paths = t->n_paths;
    pthread_mutex_lock(&t->mutex);
    out->writes_pending = t->writes_pending;
    out->buffered_bytes = t->buffered_bytes;
    for (uint32_t p = 0; p < t->n_paths; p++) {
        int failed = !path_usable(t, p);
        out->failed_paths += (uint32_t)failed;
        if (p >= KVS_SSD_STATS_MAX_PATHS) continue;
        kvs_ssd_path_stats *ps = &out->paths[p];
        ps->units = t->paths[p].units;
        ps->failed = (uint32_t)failed;
        if (t->paths[p].io) {
            ssd_io_path_counts(t->paths[p].io, &ps->reads, &ps->writes);
            ps->uring = (uint32_t)ssd_io_uses_uring(t->paths[p].io);
        }
    }
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
}

kvs_status kvs_ssd_flush(void *state, uint64_t timeout_ms) {
    ssd_tier *t = state;
    if (!t) return KVS_EINVAL;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    uint64_t ns = (uint64_t)deadline.tv_nsec + (timeout_ms % 1000) * 1000000ull;
    deadline.tv_sec += (time_t)(timeout_ms / 1000 + ns / 1000000000ull);
    deadline.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&t->mutex);
    int rc = 0;
    while (t->writes_pending > 0 && rc == 0) rc = pthread_cond_timedwait(&t->drained, &t->mutex, &deadline);
    uint64_t left = t->writes_pending;
    pthread_mutex_unlock(&t->mutex);
    if (left == 0) return KVS_OK;
    set_error(t, "%llu writes still pending after %llu ms", (unsigned long long)left, (unsigned long long)timeout_ms);
    return KVS_ETIMEDOUT;
}

/* ---- create / destroy ------------------------------------------------------------------------ */

static void write_init_error(const kvs_backend_init *init, const char *message) {
    if (init->error && init->error_len > 0) snprintf(init->error, (size_t)init->error_len, "%s", message);
}

/* Tier names become part of a file name: keep [A-Za-z0-9_.-], replace the rest. */
static void file_name_of(const char *tier, char *out, size_t len) {
    size_t n = 0;
    for (const char *c = tier; *c && n + 1 < len; c++) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
                 *c == '-' || (*c == '.' && n > 0);
        out[n++] = ok ? *c : '_';
    }
    out[n] = '\0';
}

static kvs_status check_directories(ssd_tier *t, const ssd_options *opt) {
    struct stat seen[SSD_MAX_PATHS];
    for (uint32_t i = 0; i < opt->n_paths; i++) {
        const char *dir = opt->paths[i];
        struct stat st;
        if (stat(dir, &st) != 0) {
            set_error(t, "path \"%.300s\" cannot be used (%s)", dir, errno_name(errno));
            return KVS_ECONFIG;
        }
        if (!S_ISDIR(st.st_mode)) {
            set_error(t, "path \"%.300s\" is not a directory", dir);
            return KVS_ECONFIG;
        }
        if (access(dir, W_OK | X_OK) != 0) {
            set_error(t, "path \"%.300s\" is not writable (%s)", dir, errno_name(errno));
            return KVS_ECONFIG;
        }
        for (uint32_t j = 0; j < i; j++) {
            if (seen[j].st_dev == st.st_dev && seen[j].st_ino == st.st_ino) {
                set_error(t, "paths \"%.200s\" and \"%.200s\" are the same directory", opt->paths[j], dir);
                return KVS_ECONFIG;
            }
        }
        seen[i] = st;
    }
    return KVS_OK;
}

/* Open, lock and size one path's data file. */
static kvs_status open_data_file(ssd_tier *t, uint32_t i, const char *dir) {
    ssd_path *p = &t->paths[i];
    char base[96], file[4200];
    file_name_of(t->tier_name, base, sizeof base);
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    snprintf(file, sizeof file, "%s/kvstrata-%s.data", dir, base);
    p->fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
    if (p->fd < 0 && errno == EINVAL) {
        p->fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (p->fd >= 0)
            log_message(t, KVS_LOG_INFO, "%s does not support O_DIRECT; path %u goes through the page cache", dir, i);
    }
    if (p->fd < 0) {
        int err = errno;
        set_error(t, "cannot open %s (%s)", file, errno_name(err));
        return err == EACCES || err == EROFS || err == EPERM ? KVS_ECONFIG : KVS_EIO;
    }
    /* After a crash the kernel may hold the dead process's file for a moment while its ring's
     * requests drain, so a busy lock is retried for a while before it counts as in use. */
    uint64_t give_up = now_ns() + LOCK_WAIT_NS;
    while (flock(p->fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        if (err != EWOULDBLOCK || now_ns() > give_up) {
            set_error(t, "%s is in use by another tier or process (%s)", file, errno_name(err));
            return KVS_ECONFIG;
        }
        struct timespec pause = {.tv_nsec = 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    uint64_t want = SSD_BLOCK + p->n_slots * t->slot_bytes;
    struct stat st;
    if (fstat(p->fd, &st) == 0 && (uint64_t)st.st_size > want && ftruncate(p->fd, (off_t)want) != 0) {
        set_error(t, "cannot shrink %s to %llu bytes (%s)", file, (unsigned long long)want, errno_name(errno));
        return KVS_EIO;
    }
    if (fallocate(p->fd, 0, 0, (off_t)want) != 0) {
        int err = errno;
        if (ftruncate(p->fd, (off_t)want) != 0) {
            set_error(t, "cannot size %s to %llu bytes (%s)", file, (unsigned long long)want, errno_name(errno));
            return KVS_EIO;
        }
        if (err != EOPNOTSUPP) {
            char size[32];
            format_bytes(want, size, sizeof size);
            log_message(t, KVS_LOG_WARN, "cannot preallocate %s of %s (%s); writes are skipped when the device fills",
                        file, size, errno_name(err));
        }
    }
    return KVS_OK;
}

typedef struct recover_ctx {
    ssd_tier *tier;
    uint8_t **used; /* per path, one byte per slot */
    int out_of_memory;
} recover_ctx;

static void adopt_recovered(void *ctx, const ssd_found_unit *copies, uint64_t n) {
    recover_ctx *rc = ctx;
    ssd_tier *t = rc->tier;
    const ssd_found_unit *first = &copies[0];
    uint32_t o = object_alloc(t, first->unit_count, first->replica_count);
    if (o == NIL) {
        rc->out_of_memory = 1;
        return;
    }
    ssd_object *e = &t->objects[o];
    e->key = first->key;
    e->len = first->object_len;
    e->seq = first->sequence;
    e->verified = 0;
    for (uint64_t i = 0; i < n; i++) {
        const ssd_found_unit *f = &copies[i];
        ssd_copy *c = &e->copies[(uint64_t)f->unit_index * e->replicas + f->replica_index];
        if (c->path != NO_PATH || rc->used[f->path][f->slot]) continue;
        *c = (ssd_copy){f->path, f->slot};
        rc->used[f->path][f->slot] = 1;
        e->checksums[f->unit_index] = f->data_checksum;
    }
    install_live(t, o);
    t->recovered++;
}

/* Read or write each path's superblock, scan the slots of those that match, rebuild the index and
 * the free-slot stacks. */
static kvs_status recover(ssd_tier *t) {
    uint64_t scan_slots[SSD_MAX_PATHS] = {0};
    ssd_io_path *io[SSD_MAX_PATHS] = {NULL};
    uint8_t *block = aligned_alloc(SSD_BLOCK, SSD_BLOCK);
    if (!block) {
        set_error(t, "out of memory for the superblock");
        return KVS_ENOMEM;
    }
    for (uint32_t i = 0; i < t->n_paths; i++) {
        ssd_path *p = &t->paths[i];
        io[i] = p->io;
        int64_t got = ssd_io_sync(p->io, SSD_IO_OP_READ, block, SSD_BLOCK, 0, t->io_timeout_ms);
        if (got < 0) continue; /* the engine isolated the path */
        ssd_superblock sb;
        int valid = ssd_format_decode_superblock(block, &sb) == 0;
        if (valid && sb.stripe_bytes == t->stripe_bytes && sb.slot_bytes == t->slot_bytes) {
            scan_slots[i] = sb.n_slots < p->n_slots ? sb.n_slots : p->n_slots;
            if (sb.n_slots == p->n_slots) continue;
        } else if (valid) {
            char was[32], now[32];
            format_bytes(sb.stripe_bytes, was, sizeof was);
            format_bytes(t->stripe_bytes, now, sizeof now);
            log_message(t, KVS_LOG_WARN, "path %u (%s) was written with stripe %s, now %s: its objects are dropped", i,
                        p->dir, was, now);
        }
        memset(block, 0, SSD_BLOCK);
        memset(&sb, 0, sizeof sb);
        sb.stripe_bytes = t->stripe_bytes;
        sb.slot_bytes = t->slot_bytes;
        sb.n_slots = p->n_slots;
        snprintf(sb.tier_name, sizeof sb.tier_name, "%s", t->tier_name);
        ssd_format_encode_superblock(&sb, block);
        ssd_io_sync(p->io, SSD_IO_OP_WRITE, block, SSD_BLOCK, 0, t->io_timeout_ms);
    }
    free(block);

    ssd_scan_result found;
    if (ssd_recover_scan(io, t->n_paths, scan_slots, t->slot_bytes, t->stripe_bytes, t->queue_depth - 1,
                         t->io_timeout_ms, &found) != 0) {
        set_error(t, "out of memory for the restart scan");
        return KVS_ENOMEM;
    }
    recover_ctx ctx = {.tier = t, .used = calloc(t->n_paths, sizeof(uint8_t *))};
    kvs_status rc = ctx.used ? KVS_OK : KVS_ENOMEM;
    for (uint32_t i = 0; i < t->n_paths && rc == KVS_OK; i++)
        if (!(ctx.used[i] = calloc(t->paths[i].n_slots, 1))) rc = KVS_ENOMEM;
    if (rc == KVS_OK) {
        ssd_recover_select(&found, adopt_recovered, &ctx);
        if (ctx.out_of_memory) rc = KVS_ENOMEM;
    }
    if (rc == KVS_OK) {
        for (uint32_t i = 0; i < t->n_paths; i++) {
            ssd_path *p = &t->paths[i];
            p->n_free = 0;
            for (uint64_t s = p->n_slots; s-- > 0;) /* low slots on top: the file fills from its start */
                if (!ctx.used[i][s]) p->free_slots[p->n_free++] = (uint32_t)s;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t wall = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        t->next_seq = found.max_sequence + 1 > wall ? found.max_sequence + 1 : wall;
        if (t->recovered)
            log_message(t, KVS_LOG_INFO, "recovered %llu objects from %llu unit headers", (unsigned long long)t->recovered,
                        (unsigned long long)found.headers_read);
    } else {
        set_error(t, "out of memory while rebuilding the index");
    }
    if (ctx.used)
        for (uint32_t i = 0; i < t->n_paths; i++) free(ctx.used[i]);
    free(ctx.used);
    free(found.units);
    return rc;
}

static void ssd_destroy(void *state);

static kvs_status plan_geometry(ssd_tier *t, const kvs_backend_init *init, const ssd_options *opt) {
    char cap[32], obj[32], slot[32];
    if (init->max_object_bytes == 0 || init->max_object_bytes > (1ull << 50)) {
        set_error(t, "max_object_bytes %llu is not a usable object size", (unsigned long long)init->max_object_bytes);
        return KVS_EINVAL;
    }
    if (init->capacity_bytes == 0) {
        set_error(t, "needs a capacity (YAML key `capacity`, the total over all paths)");
        return KVS_ECONFIG;
    }
    t->max_object_bytes = init->max_object_bytes;
    uint64_t object_rounded = ssd_round_up(init->max_object_bytes, SSD_BLOCK);
    t->stripe_bytes = opt->stripe_bytes < object_rounded ? opt->stripe_bytes : object_rounded;
    t->slot_bytes = SSD_BLOCK + t->stripe_bytes;
    uint64_t per_path = init->capacity_bytes / opt->n_paths;
    uint64_t n_slots = per_path > SSD_BLOCK ? (per_path - SSD_BLOCK) / t->slot_bytes : 0;
    uint32_t units = ssd_format_unit_count(init->max_object_bytes, t->stripe_bytes);
    format_bytes(init->capacity_bytes, cap, sizeof cap);
    format_bytes(init->max_object_bytes, obj, sizeof obj);
    format_bytes(t->slot_bytes, slot, sizeof slot);
    if (n_slots < units) {
        set_error(t, "capacity %s over %u paths gives %llu slots of %s per path; an object of up to %s needs %u", cap,
                  opt->n_paths, (unsigned long long)n_slots, slot, obj, units);
        return KVS_ECONFIG;
    }
    if (n_slots >= UINT32_MAX || n_slots * opt->n_paths >= UINT32_MAX) {
        set_error(t, "capacity %s is %llu slots of %s per path; raise stripe_bytes", cap, (unsigned long long)n_slots,
                  slot);
        return KVS_ECONFIG;
    }
    uint64_t need = (uint64_t)units * opt->replicas * SSD_BLOCK + object_rounded;
    if (opt->write_buffer_bytes < need) {
        char have[32], want[32];
        format_bytes(opt->write_buffer_bytes, have, sizeof have);
        format_bytes(need, want, sizeof want);
        set_error(t, "write_buffer_bytes %s cannot hold one object of up to %s (needs %s)", have, obj, want);
        return KVS_ECONFIG;
    }
    for (uint32_t i = 0; i < opt->n_paths; i++) t->paths[i].n_slots = n_slots;
    t->n_object_slots = (uint32_t)(n_slots * opt->n_paths);
    return KVS_OK;
}

static kvs_status ssd_create(const kvs_backend_init *init, void **out) {
    if (!init || !out) return KVS_EINVAL;
    *out = NULL;
    if (init->struct_size < offsetof(kvs_backend_init, staging_base)) return KVS_EVERSION;
    ssd_tier *t = calloc(1, sizeof *t);
    if (!t) {
        write_init_error(init, "ssd tier: out of memory for its state");
        return KVS_ENOMEM;
    }
    pthread_mutex_init(&t->error_mutex, NULL);
    pthread_mutex_init(&t->mutex, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&t->drained, &attr);
    pthread_condattr_destroy(&attr);
    for (uint32_t i = 0; i < SSD_MAX_PATHS; i++) t->paths[i].fd = -1;
    t->lru_head = t->lru_tail = t->free_head = NIL;
    atomic_store(&t->io.enospc_budget, -1);
    snprintf(t->tier_name, sizeof t->tier_name, "%s", init->tier_name ? init->tier_name : "ssd");
    const kvs_backend_host *host = init->host;
    if (host) {
        t->host_ctx = host->ctx;
        if (host->struct_size >= offsetof(kvs_backend_host, log) + sizeof host->log) t->log = host->log;
        if (host->struct_size >= offsetof(kvs_backend_host, place) + sizeof host->place) t->place = host->place;
        if (host->struct_size >= offsetof(kvs_backend_host, schedule) + sizeof host->schedule)
            t->schedule = host->schedule;
    }
    if (init->struct_size >= offsetof(kvs_backend_init, staging_len) + sizeof init->staging_len) {
        t->staging_base = init->staging_base;
        t->staging_len = init->staging_len;
    }

    ssd_options opt;
    char why[400];
    kvs_status rc = KVS_EINVAL;
    if (init->n_options && !init->options) {
        set_error(t, "n_options is %llu but options is NULL", (unsigned long long)init->n_options);
        goto fail;
    }
    if ((rc = ssd_options_parse(init->options, init->n_options, &opt, why, sizeof why)) != KVS_OK) {
        set_error(t, "%s", why);
        goto fail;
    }
    if ((rc = plan_geometry(t, init, &opt)) != KVS_OK) goto fail;
    if ((rc = check_directories(t, &opt)) != KVS_OK) goto fail;
    t->n_paths = opt.n_paths;
    t->replicas = opt.replicas;
    t->queue_depth = opt.queue_depth;
    t->io_timeout_ms = opt.io_timeout_ms;
    t->write_buffer_bytes = opt.write_buffer_bytes;
    if (opt.enospc_after >= 0) atomic_store(&t->io.enospc_budget, opt.enospc_after);

    rc = KVS_ENOMEM;
    t->objects = calloc(t->n_object_slots, sizeof *t->objects);
    t->n_buckets = 1;
    while (t->n_buckets < 2ull * t->n_object_slots) t->n_buckets <<= 1;
    t->buckets = malloc(t->n_buckets * sizeof *t->buckets);
    t->zero_block = aligned_alloc(SSD_BLOCK, SSD_BLOCK);
    if (!t->objects || !t->buckets || !t->zero_block) {
        set_error(t, "out of memory for the index of %u slots", t->n_object_slots);
        goto fail;
    }
    memset(t->zero_block, 0, SSD_BLOCK);
    for (uint64_t b = 0; b < t->n_buckets; b++) t->buckets[b] = NIL;
    for (uint32_t o = t->n_object_slots; o-- > 0;) {
        t->objects[o].next = t->free_head;
        t->free_head = o;
    }

    int uring_error = 0;
    uint32_t on_pread = 0;
    for (uint32_t i = 0; i < t->n_paths; i++) {
        ssd_path *p = &t->paths[i];
        if (!(p->free_slots = malloc(p->n_slots * sizeof *p->free_slots))) {
            set_error(t, "out of memory for the slot table of %s", opt.paths[i]);
            rc = KVS_ENOMEM;
            goto fail;
        }
        if ((rc = open_data_file(t, i, opt.paths[i])) != KVS_OK) goto fail;
        ssd_io_config cfg = {.tier_name = t->tier_name,
                             .dir = p->dir,
                             .index = i,
                             .fd = p->fd,
                             .engine = opt.engine,
                             .queue_depth = opt.queue_depth,
                             .write_inflight = opt.write_inflight,
                             .pread_threads = opt.pread_threads,
                             .sim_bandwidth = opt.sim_bandwidth,
                             .sim_iops = opt.sim_iops,
                             .staging_base = t->staging_base,
                             .staging_len = t->staging_len,
                             .eio = opt.eio_path == (int32_t)i,
                             .eio_after = opt.eio_after,
                             .counters = &t->io,
                             .ctx = t,
                             .log = t->log,
                             .on_failed = on_path_failed};
        if (ssd_io_open(&cfg, &p->io, why, sizeof why) != 0) {
            set_error(t, "%s", why);
            rc = KVS_EIO;
            goto fail;
        }
        if (opt.engine == SSD_ENGINE_URING && !ssd_io_uses_uring(p->io)) {
            uring_error = ssd_io_uring_error(p->io);
            on_pread++;
        }
    }
    t->fallbacks = on_pread;
    if (on_pread)
        log_message(t, KVS_LOG_INFO, "io_uring is unavailable (%s%s); %u paths use the pread engine",
                    errno_name(uring_error), uring_error == ENOSYS ? ", or a build without liburing" : "", on_pread);

    if ((rc = recover(t)) != KVS_OK) goto fail;
    uint32_t usable = 0;
    for (uint32_t i = 0; i < t->n_paths; i++) usable += (uint32_t)path_usable(t, i);
    if (usable == 0) {
        set_error(t, "every path failed while the tier was opened (see the log)");
        rc = KVS_EIO;
        goto fail;
    }
    for (uint32_t i = 0; i < t->n_paths; i++) ssd_io_arm_faults(t->paths[i].io);
    *out = t;
    return KVS_OK;

fail:
    write_init_error(init, t->error);
    ssd_destroy(t);
    return rc;
}

static void ssd_destroy(void *state) {
    ssd_tier *t = state;
    if (!t) return;
    /* Closing an engine lets its queued and in-flight requests finish first, so every write job
     * and tombstone completes (and takes the lock) before anything below is freed. */
    for (uint32_t i = 0; i < SSD_MAX_PATHS; i++) {
        ssd_io_close(t->paths[i].io);
        t->paths[i].io = NULL;
    }
    for (uint32_t i = 0; i < SSD_MAX_PATHS; i++) {
        if (t->paths[i].fd < 0) continue;
        fdatasync(t->paths[i].fd); /* best effort: a clean shutdown survives a power cut */
        close(t->paths[i].fd);
        free(t->paths[i].free_slots);
    }
    for (uint32_t i = 0; i < SSD_MAX_PATHS; i++)
        if (t->paths[i].fd < 0) free(t->paths[i].free_slots);
    if (t->objects)
        for (uint32_t o = 0; o < t->n_object_slots; o++) {
            free(t->objects[o].copies);
            free(t->objects[o].checksums);
        }
    free(t->objects);
    free(t->buckets);
    free(t->zero_block);
    pthread_cond_destroy(&t->drained);
    pthread_mutex_destroy(&t->mutex);
    pthread_mutex_destroy(&t->error_mutex);
    free(t);
}

static const kvs_backend_ops ssd_ops = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_GET_MANY,
    .type_name = "ssd",
    .create = ssd_create,
    .destroy = ssd_destroy,
    .last_error = ssd_last_error,
    .contains = ssd_contains,
    .pin = ssd_pin,
    .unpin = ssd_unpin,
    .get = ssd_get,
    .put = ssd_put,
    .remove = ssd_remove,
    .usage = ssd_usage,
    .get_many = ssd_get_many,
};

const kvs_backend_ops *kvs_ssd_backend(void) { return &ssd_ops; }
