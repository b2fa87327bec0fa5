/*
 * ssd_write.c - put for the ssd tier: the object is copied into the write buffer with a header per
 * unit copy, placed, given slots (evicting least recently used objects when a path is full) and
 * queued on the paths' engines; it becomes visible when its last unit write completes.
 */
#include "ssd_tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/key.h"
#include "common/xxh3.h"
#include "ssd_place.h"

static int make_room(ssd_tier *t, const uint64_t *need);

/* Times one unit copy is written again elsewhere on its path after ENOSPC before its save is dropped. */
#define ENOSPC_RETRIES 2

/* ---- put ------------------------------------------------------------------------------------- */

typedef struct write_job {
    ssd_tier *tier;
    uint32_t object;
    uint32_t n_copies, remaining;
    int enospc, error;
    uint8_t *buffer;
    uint64_t buffer_bytes; /* bytes of the budget this write holds */
    uint8_t *copy_failed;  /* [n_copies] */
    uint8_t *tries;        /* [n_copies] rewrites after ENOSPC */
    ssd_io_request *reqs;  /* [n_copies] */
} write_job;

/* A buffer for an object whose write needs `need` bytes: `kept` (a buffer of the arena, taken from
 * t->spare under the lock) when there is one, else a fresh one: of the arena buffers' size when the
 * object is large (most objects of a deployment are the same, largest size) or of its own size. */
static uint8_t *take_buffer(const ssd_tier *t, uint64_t need, uint8_t *kept) {
    return kept ? kept
                : aligned_alloc(SSD_BLOCK, need <= t->spare_bytes / 2 ? need : t->spare_bytes);
}

static int in_arena(const ssd_tier *t, const uint8_t *buffer) {
    return t->arena && buffer >= t->arena && buffer < t->arena + t->arena_bytes;
}

/* With the lock held: a buffer of the arena goes back to it (a fresh one is freed with its job). */
static void keep_buffer(ssd_tier *t, write_job *job) {
    if (job->buffer && in_arena(t, job->buffer)) {
        t->spare[t->n_spare++] = job->buffer;
        job->buffer = NULL;
    }
}

static void free_write_job(write_job *job) {
    if (!job) return;
    free(job->buffer);
    free(job->copy_failed);
    free(job->tries);
    free(job->reqs);
    free(job);
}

/* With the lock held: a save put accepted could not be stored. The host counts it (a skipped save for
 * the connector); the log says so for the 1st, 2nd, 4th, 8th ... drop, so a full device cannot flood it. */
static void report_dropped(ssd_tier *t, const kvs_key *key, const write_job *job) {
    uint64_t n = atomic_fetch_add(&t->dropped_puts, 1) + 1;
    if (t->on_put_dropped) t->on_put_dropped(t->host_ctx, key, job->enospc ? KVS_ENOMEM : KVS_EIO);
    if ((n & (n - 1)) != 0) return;
    char hex[33];
    kvs_key_hex(key, hex);
    if (job->enospc)
        ssd_log(t, KVS_LOG_WARN,
                "a save of %s was dropped: the device is full (ENOSPC) and no room could be made "
                "(every object on the path is pinned or being read); %llu saves dropped so far",
                hex, (unsigned long long)n);
    else
        ssd_log(t, KVS_LOG_WARN,
                "a save of %s was dropped: its write failed (%s); %llu saves dropped so far", hex,
                kvs_errno_name(job->error), (unsigned long long)n);
}

/* With the lock held: the last unit write of job finished. */
static void finish_write(ssd_tier *t, write_job *job) {
    uint32_t o = job->object;
    ssd_object *e = ssd_obj(t, o);
    for (uint32_t i = 0; i < job->n_copies; i++)
        if (job->copy_failed[i]) ssd_slot_release(t, &e->copies[i]);
    int complete = 1;
    for (uint32_t u = 0; u < e->n_units && complete; u++) {
        int ok = 0;
        for (uint32_t r = 0; r < e->replicas; r++)
            ok |= e->copies[(uint64_t)u * e->replicas + r].path != SSD_NO_PATH;
        complete = ok;
    }
    t->buffered_bytes -= job->buffer_bytes;
    t->writes_pending--;
    pthread_cond_broadcast(&t->drained);
    if (!complete) {
        if (job->enospc) atomic_fetch_add(&t->enospc_skips, 1);
        report_dropped(t, &e->key, job);
        ssd_object_release(t, o);
        return;
    }
    uint32_t old = ssd_index_find(t, &e->key, NULL);
    if (old != SSD_NIL) {
        ssd_object *x = ssd_obj(t, old);
        if (x->seq > e->seq || ssd_object_pinned(x, kvs_clock_now_ns(t->clock))) {
            ssd_object_release(
                t,
                o); /* a newer write won, or a reader holds the stored copy: same key, same bytes */
            return;
        }
        ssd_drop_live(t, old);
    }
    ssd_install_live(t, o);
}

static void write_done(ssd_io_request *req, int result);

/* With the lock held: copy i of job met ENOSPC. The device is full: its slot is retired, and the copy
 * is written again on a backed slot of the same path, evicting to make one. 1 when resubmitted. */
static int rewrite_after_enospc(ssd_tier *t, write_job *job, uint32_t i) {
    ssd_copy *c = &ssd_obj(t, job->object)->copies[i];
    uint32_t p = c->path;
    ssd_path_full(t, p, c->slot);
    c->path = SSD_NO_PATH; /* retired: never back on the free stack */
    if (job->tries[i] >= ENOSPC_RETRIES || !ssd_path_usable(t, p)) return 0;
    job->tries[i]++;
    uint64_t need[SSD_MAX_PATHS] = {0};
    need[p] = 1;
    if (make_room(t, need) != 0) return 0;
    ssd_path *path = &t->paths[p];
    *c = (ssd_copy){p, path->free_slots[--path->n_free]};
    ssd_io_request *req = &job->reqs[i];
    struct iovec data = req->iov[1];
    uint32_t n_iov = req->n_iov;
    ssd_io_prepare(req, SSD_IO_OP_WRITE, SSD_IO_WRITE, req->iov[0].iov_base, SSD_BLOCK,
                   ssd_slot_offset(t, c->slot), write_done, job);
    req->n_iov = n_iov;
    req->iov[1] = data;
    ssd_io_submit(path->io, &req, 1);
    return 1;
}

static void write_done(ssd_io_request *req, int result) {
    write_job *job = req->ctx;
    ssd_tier *t = job->tier;
    int finished = 0;
    uint32_t i = (uint32_t)(req - job->reqs);
    pthread_mutex_lock(&t->mutex);
    if (result == -ENOSPC && rewrite_after_enospc(t, job, i)) {
        pthread_mutex_unlock(&t->mutex);
        return;
    }
    if (result < 0) {
        job->copy_failed[i] = 1;
        if (result == -ENOSPC)
            job->enospc = 1;
        else
            job->error = -result;
    } else {
        const ssd_copy *c = &ssd_obj(t, job->object)->copies[i];
        t->paths[c->path].backed[c->slot] = 1;
    }
    if (--job->remaining == 0) {
        finish_write(t, job);
        keep_buffer(t, job);
        finished = 1;
    }
    pthread_mutex_unlock(&t->mutex);
    if (finished) free_write_job(job);
}

/* With the lock held: paths for every copy of an object of n_units units, on usable paths, the
 * copies of one unit on distinct paths where there are enough. 0, or -1 when no path works. */
static int choose_paths(ssd_tier *t, uint32_t n_units, uint32_t *paths_out) {
    uint32_t R = t->replicas, n = t->n_paths, usable = 0;
    for (uint32_t p = 0; p < n; p++) usable += (uint32_t)ssd_path_usable(t, p);
    if (usable == 0) return -1;
    if (t->place)
        t->place(t->host_ctx, &t->place_pointer, n, n_units, R, paths_out);
    else
        ssd_place_stripe(&t->place_pointer, n, n_units, R, paths_out);
    for (uint32_t u = 0; u < n_units; u++) {
        uint32_t *copy = &paths_out[(uint64_t)u * R];
        for (uint32_t r = 0; r < R; r++) {
            uint32_t p = copy[r] % n;
            int clash = 0;
            for (uint32_t q = 0; q < r; q++) clash |= copy[q] == p;
            if (ssd_path_usable(t, p) && (!clash || usable <= r)) {
                copy[r] = p;
                continue;
            }
            /* the next usable path not holding this unit yet, else any usable one */
            uint32_t pick = SSD_NO_PATH;
            for (uint32_t step = 1; step <= n && pick == SSD_NO_PATH; step++) {
                uint32_t c = (p + step) % n;
                int used = 0;
                for (uint32_t q = 0; q < r; q++) used |= copy[q] == c;
                if (ssd_path_usable(t, c) && (!used || usable <= r)) pick = c;
            }
            copy[r] = pick;
        }
    }
    return 0;
}

/* With the lock held: evict least recently used objects until every path p has need[p] free
 * slots. 0, or -1 with the error set. */
static int make_room(ssd_tier *t, const uint64_t *need) {
    uint64_t now = kvs_clock_now_ns(t->clock);
    for (uint32_t p = 0; p < t->n_paths; p++) {
        uint64_t capacity = t->paths[p].n_slots - t->paths[p].retired;
        if (need[p] > capacity) {
            ssd_set_error(t, "an object needs %llu slots on path %u (%s), which has %llu%s",
                          (unsigned long long)need[p], p, t->paths[p].dir,
                          (unsigned long long)capacity,
                          t->paths[p].full ? " (the device is full)" : "");
            return -1;
        }
    }
    for (;;) {
        uint32_t short_path = SSD_NO_PATH;
        for (uint32_t p = 0; p < t->n_paths && short_path == SSD_NO_PATH; p++)
            if (t->paths[p].n_free < need[p]) short_path = p;
        if (short_path == SSD_NO_PATH) return 0;
        uint32_t victim = SSD_NIL;
        for (uint32_t o = t->lru_tail; o != SSD_NIL && victim == SSD_NIL; o = ssd_obj(t, o)->prev) {
            ssd_object *e = ssd_obj(t, o);
            if (e->refs || ssd_object_pinned(e, now)) continue;
            uint64_t n_copies = (uint64_t)e->n_units * e->replicas;
            for (uint64_t i = 0; i < n_copies && victim == SSD_NIL; i++) {
                uint32_t p = e->copies[i].path;
                if (p != SSD_NO_PATH && t->paths[p].n_free < need[p]) victim = o;
            }
        }
        if (victim == SSD_NIL) {
            ssd_set_error(t,
                          "path %u (%s) is full and every object on it is pinned, being read or "
                          "being written",
                          short_path, t->paths[short_path].dir);
            return -1;
        }
        kvs_key key = ssd_obj(t, victim)->key;
        ssd_drop_live(t, victim);
        atomic_fetch_add(&t->evictions, 1);
        /* The bytes are on disk, not at hand: the connector counts the eviction and reports it. */
        if (t->on_evict) t->on_evict(t->host_ctx, &key, NULL, 0);
    }
}

/* With the lock not held: reserve need bytes of the write budget for a put of key. 0: reserved
 * (*kept: an arena buffer taken for it, or NULL); 1: a reader holds the stored copy, nothing to
 * write; -1: the write queue is full (the error set). */
static int reserve_budget(ssd_tier *t, const kvs_key *key, uint64_t need, uint8_t **kept) {
    pthread_mutex_lock(&t->mutex);
    uint32_t existing = ssd_index_find(t, key, NULL);
    if (existing != SSD_NIL &&
        ssd_object_pinned(ssd_obj(t, existing), kvs_clock_now_ns(t->clock))) {
        ssd_lru_touch(t, existing); /* a reader holds it; equal keys carry equal bytes */
        pthread_mutex_unlock(&t->mutex);
        return 1;
    }
    if (t->buffered_bytes + need > t->write_buffer_bytes) {
        char held[32], limit[32];
        kvs_fmt_bytes(held, sizeof held, t->buffered_bytes);
        kvs_fmt_bytes(limit, sizeof limit, t->write_buffer_bytes);
        pthread_mutex_unlock(&t->mutex);
        atomic_fetch_add(&t->queue_full_skips, 1);
        ssd_set_error(t,
                      "write queue full (%s of write_buffer_bytes %s waiting for the devices); "
                      "object skipped",
                      held, limit);
        return -1;
    }
    t->buffered_bytes += need;
    t->writes_pending++;
    *kept = need > t->spare_bytes / 2 && t->n_spare ? t->spare[--t->n_spare] : NULL;
    pthread_mutex_unlock(&t->mutex);
    return 0;
}

/* A job for n_copies unit writes holding need bytes of the budget, with its buffer (*kept handed
 * to it, and cleared, when there is a job to take it). NULL when the job itself cannot be had; a
 * job whose parts could not all be had is returned for the caller to check. */
static write_job *new_write_job(ssd_tier *t, uint32_t n_copies, uint64_t need, uint8_t **kept) {
    write_job *job = calloc(1, sizeof *job);
    if (!job) return NULL;
    job->tier = t;
    job->n_copies = job->remaining = n_copies;
    job->buffer_bytes = need;
    if (!*kept) atomic_fetch_add(&t->fresh_write_buffers, 1);
    job->buffer = take_buffer(t, need, *kept);
    *kept = NULL;
    job->copy_failed = calloc(n_copies, 1);
    job->tries = calloc(n_copies, 1);
    job->reqs = calloc(n_copies, sizeof *job->reqs);
    return job;
}

/* The object into the job's buffer after its headers, each unit checksummed while it is copied
 * (one pass over the object), with non-temporal stores: the buffer is read next by the device, not
 * by this CPU. The headers and the tail of the last block are zeroed. */
static void copy_object(const ssd_tier *t, write_job *job, const void *object, uint64_t len,
                        uint32_t n_units, uint64_t header_bytes, uint64_t *checksums) {
    uint8_t *data = job->buffer + header_bytes;
    memset(job->buffer, 0, header_bytes);
    for (uint32_t u = 0; u < n_units; u++) {
        uint64_t at = (uint64_t)u * t->stripe_bytes;
        checksums[u] = kvs_xxh3_copy64(data + at, (const uint8_t *)object + at,
                                       ssd_format_unit_bytes(len, t->stripe_bytes, u), 1);
    }
    memset(data + len, 0, ssd_round_up(len, SSD_BLOCK) - len);
}

/* With the lock held: each copy of each unit of object e takes a free slot on its chosen path, and
 * its header and write request are prepared (header block, then the unit's data blocks). */
static void prepare_unit_writes(ssd_tier *t, write_job *job, ssd_object *e, const uint32_t *paths,
                                const uint64_t *checksums, uint64_t header_bytes) {
    uint32_t n_units = e->n_units, R = e->replicas;
    uint8_t *data = job->buffer + header_bytes;
    for (uint32_t u = 0; u < n_units; u++) {
        uint64_t unit_bytes = ssd_format_unit_bytes(e->len, t->stripe_bytes, u);
        for (uint32_t r = 0; r < R; r++) {
            uint32_t i = u * R + r;
            ssd_path *p = &t->paths[paths[i]];
            e->copies[i] = (ssd_copy){paths[i], p->free_slots[--p->n_free]};
            ssd_unit_header h = {.key = e->key,
                                 .object_len = e->len,
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
            ssd_io_prepare(req, SSD_IO_OP_WRITE, SSD_IO_WRITE, header, SSD_BLOCK,
                           ssd_slot_offset(t, e->copies[i].slot), write_done, job);
            if (unit_bytes) {
                req->n_iov = 2;
                req->iov[1].iov_base = data + (uint64_t)u * t->stripe_bytes;
                req->iov[1].iov_len = (size_t)ssd_round_up(unit_bytes, SSD_BLOCK);
            }
        }
    }
}

/* With the lock held: one batch per path, so a ring issues an object's units on it with one
 * system call. */
static void submit_unit_writes(ssd_tier *t, write_job *job, const uint32_t *paths,
                               ssd_io_request **batch) {
    for (uint32_t p = 0; p < t->n_paths; p++) {
        uint64_t k = 0;
        for (uint32_t i = 0; i < job->n_copies; i++)
            if (paths[i] == p) batch[k++] = &job->reqs[i];
        if (k) ssd_io_submit(t->paths[p].io, batch, k);
    }
}

/* Under the lock: choose each copy's path, make room there, take the object's record and slots,
 * and submit its unit writes. On a failure (KVS_EIO: no path works; KVS_ENOMEM: no room or no
 * record) the error is set and nothing was taken. */
static kvs_status place_and_submit(ssd_tier *t, write_job *job, const kvs_key *key, uint64_t len,
                                   uint32_t n_units, uint64_t header_bytes, uint32_t *paths,
                                   uint64_t *per_path_need, ssd_io_request **batch,
                                   const uint64_t *checksums) {
    pthread_mutex_lock(&t->mutex);
    if (choose_paths(t, n_units, paths) != 0) {
        pthread_mutex_unlock(&t->mutex);
        ssd_set_error(t, "every path has failed; nothing can be stored");
        return KVS_EIO;
    }
    for (uint32_t i = 0; i < job->n_copies; i++) per_path_need[paths[i]]++;
    if (make_room(t, per_path_need) != 0) {
        pthread_mutex_unlock(&t->mutex);
        return KVS_ENOMEM; /* make_room set the error */
    }
    /* A free slot means a free record: every record in use holds at least one slot. */
    uint32_t o = ssd_object_alloc(t, n_units, t->replicas);
    if (o == SSD_NIL) {
        pthread_mutex_unlock(&t->mutex);
        ssd_set_error(t, "out of memory for an object record");
        return KVS_ENOMEM;
    }
    ssd_object *e = ssd_obj(t, o);
    e->key = *key;
    e->len = len;
    e->seq = t->next_seq++;
    memcpy(e->checksums, checksums, (uint64_t)n_units * sizeof *checksums);
    job->object = o;
    prepare_unit_writes(t, job, e, paths, checksums, header_bytes);
    submit_unit_writes(t, job, paths, batch);
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
}

kvs_status ssd_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    ssd_tier *t = state;
    if (!t || !key || (!object && len)) return KVS_EINVAL;
    if (len > t->max_object_bytes) {
        char got[32], max[32];
        kvs_fmt_bytes(got, sizeof got, len);
        kvs_fmt_bytes(max, sizeof max, t->max_object_bytes);
        ssd_set_error(t, "object of %s is larger than the tier's max object size %s", got, max);
        return KVS_EINVAL;
    }
    uint32_t n_units = ssd_format_unit_count(len, t->stripe_bytes), R = t->replicas;
    uint32_t n_copies = n_units * R;
    uint64_t header_bytes = (uint64_t)n_copies * SSD_BLOCK,
             data_bytes = ssd_round_up(len, SSD_BLOCK);
    uint64_t need = header_bytes + data_bytes;

    uint8_t *kept = NULL;
    int reserved = reserve_budget(t, key, need, &kept);
    if (reserved != 0) return reserved > 0 ? KVS_OK : KVS_ENOMEM;

    /* Copy and checksum outside the lock. */
    write_job *job = new_write_job(t, n_copies, need, &kept);
    uint32_t *paths = malloc((uint64_t)n_copies * sizeof *paths);
    uint64_t *per_path_need = calloc(t->n_paths, sizeof *per_path_need);
    ssd_io_request **batch = malloc((uint64_t)n_copies * sizeof *batch);
    uint64_t *checksums = malloc((uint64_t)n_units * sizeof *checksums);
    kvs_status rc = KVS_ENOMEM;
    if (!job || !job->buffer || !job->copy_failed || !job->tries || !job->reqs || !paths ||
        !per_path_need || !batch || !checksums) {
        ssd_set_error(t, "out of memory for a write buffer of %llu bytes",
                      (unsigned long long)need);
        goto undo_budget;
    }
    copy_object(t, job, object, len, n_units, header_bytes, checksums);

    if ((rc = place_and_submit(t, job, key, len, n_units, header_bytes, paths, per_path_need, batch,
                               checksums)) != KVS_OK)
        goto undo_budget;
    free(paths);
    free(per_path_need);
    free(batch);
    free(checksums);
    return KVS_OK;

undo_budget:
    pthread_mutex_lock(&t->mutex);
    if (job) keep_buffer(t, job);
    if (kept) t->spare[t->n_spare++] = kept; /* no job to hand it to */
    kept = NULL;
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
