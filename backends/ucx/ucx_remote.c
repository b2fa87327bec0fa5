/*
 * ucx_remote.c - the remote tier's ops (contract in remote.h): each queues a job for the progress
 * thread (ucx_remote_progress.c) and waits on a condition variable, at most timeout_ms; a put
 * copies its object into the registered put queue and returns. Create starts the thread, destroy
 * joins it.
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/copy.h"
#include "common/log.h"
#include "ucx_remote_error.h"
#include "ucx_remote_progress.h"
#include "ucx_remote_shared.h"
#include "ucx_remote_state.h"

/* ---- the ops --------------------------------------------------------------------------------- */

/* One allocation for a job and its arrays (freed by whoever sees it last: caller or thread). */
static job *job_new(int kind, uint64_t n) {
    size_t size = sizeof(job) +
                  n * (sizeof(kvs_key) + sizeof(void *) + 1 + 1 + 1 + sizeof(uint64_t) * 3 +
                       sizeof(kvs_status)) +
                  64;
    job *j = calloc(1, size);
    if (!j) return NULL;
    uint8_t *p = (uint8_t *)(j + 1);
    j->kind = kind;
    j->n = n;
    j->keys = (kvs_key *)p;
    p += n * sizeof(kvs_key);
    j->dst_copy = (void **)p;
    p += n * sizeof(void *);
    j->lens = (uint64_t *)p;
    p += n * sizeof(uint64_t);
    j->cap = (uint64_t *)p;
    p += n * sizeof(uint64_t);
    j->off = (uint64_t *)p;
    p += n * sizeof(uint64_t);
    j->statuses = (kvs_status *)p;
    p += n * sizeof(kvs_status);
    j->present = p;
    p += n;
    j->resolved = p;
    p += n;
    j->landed = p;
    for (uint64_t i = 0; i < n; i++) j->statuses[i] = KVS_ENOTFOUND;
    return j;
}

/* Append j to the job queue and wake the thread. KVS_EIO (j not queued) once the tier is stopping. */
static kvs_status enqueue(remote *r, job *j) {
    pthread_mutex_lock(&r->mutex);
    if (r->stopping) {
        pthread_mutex_unlock(&r->mutex);
        return KVS_EIO;
    }
    if (r->tail)
        r->tail->next = j;
    else
        r->head = j;
    r->tail = j;
    if (j->kind == JOB_PUT) r->stats.puts_queued++;
    pthread_mutex_unlock(&r->mutex);
    uint64_t one = 1;
    if (write(r->doorbell, &one, sizeof one) < 0)
        (void)0; /* a full counter still wakes the thread */
    return KVS_OK;
}

/* Queue j and wait for it at most timeout_ms. KVS_OK: done (results in j; the caller frees it).
 * KVS_ETIMEDOUT: abandoned (the thread frees it). */
static kvs_status submit_for(remote *r, job *j, uint64_t timeout_ms) {
    uint64_t timeout_ns = timeout_ms * 1000000ull;
    uint64_t start = kvs_now_ns();
    /* the thread gives up a little before the caller does, so results normally arrive in time */
    uint64_t margin = timeout_ns / 10 < 20000000ull ? timeout_ns / 10 : 20000000ull;
    j->deadline_ns = start + timeout_ns - margin;
    struct timespec until = kvs_timespec_after(CLOCK_REALTIME, timeout_ns);
    if (enqueue(r, j) != KVS_OK) {
        free(j);
        return KVS_EIO;
    }
    pthread_mutex_lock(&r->mutex);
    int rc = 0;
    while (!j->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&r->cond, &r->mutex, &until);
    if (!j->done) {
        j->abandoned = 1;
        pthread_mutex_unlock(&r->mutex);
        remote_set_error(r, "no answer within %llu ms", (unsigned long long)timeout_ms);
        return KVS_ETIMEDOUT;
    }
    pthread_mutex_unlock(&r->mutex);
    return KVS_OK;
}

static kvs_status submit(remote *r, job *j) {
    return submit_for(r, j, r->opt.timeout_ms);
}

kvs_status kvs_remote_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    remote *r = state;
    *n_present = 0;
    if (n == 0) return KVS_OK;
    job *j = job_new(JOB_LOOKUP, n);
    if (!j) return KVS_ENOMEM;
    memcpy(j->keys, keys, n * sizeof *keys);
    kvs_status st = submit(r, j);
    if (st == KVS_ETIMEDOUT) return KVS_OK; /* nothing answered in time: nothing is present */
    if (st != KVS_OK) return st;
    uint64_t k = 0;
    while (k < n && j->present[k]) k++;
    *n_present = k;
    free(j);
    return KVS_OK;
}

static kvs_status get_many_from_nodes(remote *r, const kvs_key *keys, void *const *dsts,
                                      const uint64_t *caps, uint64_t n, uint64_t *lens,
                                      kvs_status *statuses);

kvs_status kvs_remote_get_many(void *state, const kvs_key *keys, void *const *dsts,
                               const uint64_t *caps, uint64_t n, uint64_t *lens,
                               kvs_status *statuses) {
    remote *r = state;
    int any_shared = 0;
    for (uint32_t i = 0; i < r->opt.n_nodes && !any_shared; i++)
        any_shared = __atomic_load_n(&r->nodes[i].shared_tier, __ATOMIC_ACQUIRE) != NULL;
    if (!any_shared) return get_many_from_nodes(r, keys, dsts, caps, n, lens, statuses);
    /* a node on this host: what its shared tier holds is copied out here, the rest asked for */
    for (uint64_t i = 0; i < n; i++) lens[i] = 0, statuses[i] = KVS_ENOTFOUND;
    if (n == 0 || remote_shared_gets(r, keys, dsts, caps, n, lens, statuses) == n) return KVS_OK;
    /* the rest as arrays of their own (one allocation) */
    size_t one = sizeof(kvs_key) + sizeof(void *) + 3 * sizeof(uint64_t) + sizeof(kvs_status);
    uint8_t *block = malloc(n * one);
    if (!block) return KVS_ENOMEM;
    kvs_key *rest_keys = (kvs_key *)(void *)block;
    void **rest_dsts = (void **)(void *)(rest_keys + n);
    uint64_t *rest_caps = (uint64_t *)(void *)(rest_dsts + n), *rest_lens = rest_caps + n,
             *at = rest_lens + n;
    kvs_status *rest_st = (kvs_status *)(void *)(at + n);
    uint64_t m = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (statuses[i] != KVS_ENOTFOUND) continue; /* answered by a shared tier */
        rest_keys[m] = keys[i], rest_dsts[m] = dsts[i], rest_caps[m] = caps[i];
        at[m++] = i;
    }
    kvs_status st = get_many_from_nodes(r, rest_keys, rest_dsts, rest_caps, m, rest_lens, rest_st);
    for (uint64_t k = 0; st == KVS_OK && k < m; k++)
        lens[at[k]] = rest_lens[k], statuses[at[k]] = rest_st[k];
    free(block);
    return st;
}

static kvs_status get_many_from_nodes(remote *r, const kvs_key *keys, void *const *dsts,
                                      const uint64_t *caps, uint64_t n, uint64_t *lens,
                                      kvs_status *statuses) {
    for (uint64_t i = 0; i < n; i++) lens[i] = 0, statuses[i] = KVS_ENOTFOUND;
    if (n == 0) return KVS_OK;
    job *j = job_new(JOB_GET, n);
    if (!j) return KVS_ENOMEM;
    memcpy(j->keys, keys, n * sizeof *keys);
    memcpy(j->cap, caps, n * sizeof *caps);
    /* the job's own copy of the pointers: an abandoned job may still read them after the caller
     * (or kvs_remote_get_many's compacted arrays) are gone */
    memcpy(j->dst_copy, dsts, n * sizeof *dsts);
    j->dsts = j->dst_copy;
    j->caps = caps;
    kvs_status st = submit(r, j);
    if (st == KVS_ETIMEDOUT) {
        for (uint64_t i = 0; i < n; i++) statuses[i] = KVS_ETIMEDOUT;
        return KVS_OK;
    }
    if (st != KVS_OK) return st;
    for (uint64_t i = 0; i < n; i++) {
        statuses[i] = j->resolved[i] ? j->statuses[i] : KVS_ENOTFOUND;
        if (statuses[i] == KVS_EINVAL || statuses[i] == KVS_EIO)
            statuses[i] = KVS_ENOTFOUND; /* a failed node: a miss */
        lens[i] = statuses[i] == KVS_OK || statuses[i] == KVS_EOVERFLOW ? j->lens[i] : 0;
    }
    free(j);
    return KVS_OK;
}

/* Room for need bytes in the put queue, contiguous (under mutex). Allocations are freed in the order
 * they were made, so the live bytes run from tail = head - used (mod len) to head. */
static int queue_take(remote *r, uint64_t need, uint64_t *off, uint64_t *span) {
    if (r->queue_used == 0) r->queue_head = 0;
    uint64_t head = r->queue_head, len = r->queue_len;
    uint64_t tail = r->queue_used == 0      ? 0
                    : head >= r->queue_used ? head - r->queue_used
                                            : head + len - r->queue_used;
    if (r->queue_used == 0 || tail < head) {
        if (len - head >= need) {
            *off = head, *span = need;
        } else if (tail >= need) {
            *off = 0,
            *span = (len - head) + need; /* the gap at the end is charged to this object */
        } else {
            return 0;
        }
    } else if (tail - head >= need) {
        *off = head, *span = need;
    } else {
        return 0;
    }
    r->queue_head = *off + need;
    r->queue_used += *span;
    return 1;
}

/* Queue the object: copied into the put queue, sent by the progress thread with the puts queued
 * around it (one request per node), so the caller never waits for a node. It waits for queue room
 * only, at most timeout_ms. */
kvs_status kvs_remote_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    remote *r = state;
    if (len == 0) return KVS_EINVAL;
    uint64_t need = (len + 63) & ~63ull;
    if (need > r->queue_len) {
        remote_set_error(
            r, "an object of %llu bytes does not fit the put queue of %llu bytes (put_queue_mb)",
            (unsigned long long)len, (unsigned long long)r->queue_len);
        return KVS_ENOMEM;
    }
    if (remote_shared_put(r, key, object, len) == KVS_OK) return KVS_OK;
    job *j = job_new(JOB_PUT, 1);
    if (!j) return KVS_ENOMEM;
    j->keys[0] = *key;
    j->len = len;
    j->detached = 1;
    j->status = KVS_OK;
    uint64_t timeout_ns = (uint64_t)r->opt.timeout_ms * 1000000ull;
    struct timespec until = kvs_timespec_after(CLOCK_REALTIME, timeout_ns);
    uint64_t off = 0;
    pthread_mutex_lock(&r->put_order);
    pthread_mutex_lock(&r->mutex);
    int rc = 0, got = 0;
    while (!r->stopping && !(got = queue_take(r, need, &off, &j->queue_span)) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&r->cond, &r->mutex, &until);
    if (!got) {
        r->stats.puts_dropped += r->opt.replicas;
        pthread_mutex_unlock(&r->mutex);
        pthread_mutex_unlock(&r->put_order);
        free(j);
        remote_set_error(r, "put dropped: the put queue (%llu bytes) stayed full for timeout_ms %u",
                         (unsigned long long)r->queue_len, r->opt.timeout_ms);
        return KVS_ETIMEDOUT;
    }
    pthread_mutex_unlock(&r->mutex);
    /* The room is ours until the job finishes. Non-temporal stores: the queue is read next by the
     * transport (or a node), not by this CPU, so its lines need not be read in before the copy. */
    kvs_copy_streaming(r->queue + off, object, len);
    kvs_copy_fence();
    j->object = r->queue + off;
    j->deadline_ns = kvs_now_ns() + timeout_ns;
    kvs_status st = enqueue(r, j);
    pthread_mutex_unlock(&r->put_order);
    if (st != KVS_OK) { /* the tier is closing: the room goes back, nothing is sent */
        pthread_mutex_lock(&r->mutex);
        r->queue_used -= j->queue_span;
        pthread_mutex_unlock(&r->mutex);
        free(j);
    }
    return st;
}

kvs_status kvs_remote_flush(void *state) {
    remote *r = state;
    if (!r) return KVS_EINVAL;
    job *j = job_new(JOB_FLUSH, 0);
    if (!j) return KVS_ENOMEM;
    /* every queued put finishes by its deadline (queued at most timeout_ms ago); a node marked down on
     * the way costs at most one more timeout */
    kvs_status st = submit_for(r, j, 2ull * r->opt.timeout_ms + 100);
    if (st != KVS_OK) return st;
    free(j);
    return KVS_OK;
}

kvs_status kvs_remote_remove(void *state, const kvs_key *key) {
    remote *r = state;
    job *j = job_new(JOB_DELETE, 1);
    if (!j) return KVS_ENOMEM;
    j->keys[0] = *key;
    j->statuses[0] = KVS_OK;
    kvs_status st = submit(r, j);
    if (st != KVS_OK) return st;
    free(j);
    return KVS_OK;
}

kvs_status kvs_remote_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    remote *r = state;
    *n_objects = *bytes = 0;
    job *j = job_new(JOB_STATS, 0);
    if (!j) return KVS_ENOMEM;
    kvs_status st = submit(r, j);
    if (st != KVS_OK) return st;
    *n_objects = j->objects;
    *bytes = j->bytes;
    free(j);
    return KVS_OK;
}

kvs_status kvs_remote_stats(void *state, kvs_remote_stats_t *out) {
    remote *r = state;
    if (!r || !out) return KVS_EINVAL;
    pthread_mutex_lock(&r->mutex);
    *out = r->stats;
    pthread_mutex_unlock(&r->mutex);
    out->n_nodes = r->opt.n_nodes;
    return KVS_OK;
}

const char *kvs_remote_last_error(void *state) {
    remote *r = state;
    return r ? r->error : "";
}

static void remote_free(remote *r) {
    remote_shared_detach_all(r); /* it counts under the mutex: before it goes */
    if (r->doorbell >= 0) close(r->doorbell);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mutex);
    if (r->nodes)
        for (uint32_t i = 0; i < r->opt.n_nodes; i++) free(r->nodes[i].batch);
    free(r->nodes);
    free(r->entries);
    free(r->reply_entries);
    free(r->sends);
    free(r->frame_buf);
    free(r->iov);
    free(r->send_headers);
    free(r->send_buf);
    free(r->bounce);
    free(r->queue);
    free(r->put_jobs);
    pthread_mutex_destroy(&r->put_order);
    kvs_remote_tenant_hasher_free(r->tenant_hasher);
    pthread_mutex_destroy(&r->tenant_hasher_mutex);
    kvs_remote_psk_clear(&r->psk);
    free(r);
}

void kvs_remote_destroy(void *state) {
    remote *r = state;
    if (!r) return;
    pthread_mutex_lock(&r->mutex);
    r->stopping = 1;
    pthread_mutex_unlock(&r->mutex);
    uint64_t one = 1;
    if (write(r->doorbell, &one, sizeof one) < 0) (void)0;
    pthread_join(r->thread, NULL);
    remote_free(r);
}

/* The bounce buffer (the largest object), the put queue (at least as large), and the per-batch
 * arrays the progress thread works in, plus its doorbell. */
static kvs_status alloc_buffers(remote *r, const kvs_backend_init *init,
                                const kvs_remote_options *o) {
    r->max_object_bytes = init->max_object_bytes;
    r->bounce_len = init->max_object_bytes ? init->max_object_bytes : BOUNCE_DEFAULT;
    if (r->bounce_len < (1u << 20)) r->bounce_len = 1u << 20;
    r->bounce = aligned_alloc(4096, (r->bounce_len + 4095) & ~4095ull);
    r->queue_len = (uint64_t)o->put_queue_mb << 20;
    if (r->queue_len < r->bounce_len)
        r->queue_len = r->bounce_len; /* room for the largest object */
    r->queue = aligned_alloc(4096, (r->queue_len + 4095) & ~4095ull);
    r->put_jobs = calloc(KVS_WIRE_MAX_KEYS, sizeof *r->put_jobs);
    r->send_buf = malloc(KVS_WIRE_MAX_MESSAGE_BYTES);
    r->entries = calloc(KVS_WIRE_MAX_KEYS, sizeof *r->entries);
    r->reply_entries = calloc(KVS_WIRE_MAX_KEYS, sizeof *r->reply_entries);
    r->sends = calloc(KVS_WIRE_MAX_KEYS, sizeof *r->sends);
    r->frame_buf = malloc(KVS_WIRE_MAX_MESSAGE_BYTES + 4);
    r->iov = calloc(KVS_WIRE_MAX_KEYS + 1, sizeof *r->iov);
    r->send_headers = calloc(KVS_WIRE_MAX_KEYS, sizeof *r->send_headers);
    r->nodes = calloc(o->n_nodes, sizeof *r->nodes);
    r->doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!r->bounce || !r->queue || !r->put_jobs || !r->send_buf || !r->entries ||
        !r->reply_entries || !r->sends || !r->send_headers || !r->frame_buf || !r->iov ||
        !r->nodes || r->doorbell < 0) {
        snprintf(r->error, sizeof r->error,
                 "remote tier \"%s\": out of memory or eventfd failed (%s)", r->name,
                 strerror(errno));
        return KVS_ENOMEM;
    }
    return KVS_OK;
}

/* Each node on the ring, down until its handshake brings it up. */
static kvs_status add_nodes(remote *r, const kvs_remote_options *o) {
    kvs_remote_ring_init(&r->ring);
    for (uint32_t i = 0; i < o->n_nodes; i++) {
        rnode *nd = &r->nodes[i];
        nd->index = i;
        kvs_chan_plain(&nd->ctl, -1);
        nd->backoff_ms = o->connect_backoff_ms;
        nd->batch = calloc(KVS_WIRE_MAX_KEYS, sizeof *nd->batch);
        if (!nd->batch || kvs_remote_ring_add(&r->ring, o->ids[i]) != KVS_OK) {
            snprintf(r->error, sizeof r->error, "remote tier \"%s\": cannot add node %s", r->name,
                     o->ids[i]);
            return KVS_ECONFIG;
        }
        kvs_remote_ring_set_down(&r->ring, o->ids[i], 1);
    }
    return KVS_OK;
}

/* Start the progress thread and wait until it says whether it started (UCX up, nodes tried);
 * one that did not is joined. */
static kvs_status start_progress(remote *r) {
    if (pthread_create(&r->thread, NULL, remote_progress_main, r) != 0) {
        snprintf(r->error, sizeof r->error, "remote tier \"%s\": cannot start the progress thread",
                 r->name);
        return KVS_EIO;
    }
    pthread_mutex_lock(&r->mutex);
    while (r->ready == 0)
        pthread_cond_wait(&r->cond, &r->mutex); /* bounded: each connect has timeout_ms */
    kvs_status st = r->ready_status;
    pthread_mutex_unlock(&r->mutex);
    if (st != KVS_OK) pthread_join(r->thread, NULL);
    return st;
}

kvs_status kvs_remote_create(const kvs_backend_init *init, const kvs_remote_options *o,
                             void **state) {
    char err[256] = "";
    *state = NULL;
    remote *r = calloc(1, sizeof *r);
    if (!r) return KVS_ENOMEM;
    r->doorbell = -1;
    pthread_mutex_init(&r->put_order, NULL);
    pthread_mutex_init(&r->tenant_hasher_mutex, NULL);
    pthread_mutex_init(&r->mutex, NULL);
    pthread_cond_init(&r->cond, NULL);
    snprintf(r->name, sizeof r->name, "%s", init->tier_name ? init->tier_name : "remote");
    r->opt = *o;
    r->host = init->host;
    kvs_status st = kvs_remote_psk_load(o->psk_file, &r->psk, err, sizeof err);
    if (st != KVS_OK) {
        snprintf(r->error, sizeof r->error, "remote tier \"%s\": %s", r->name, err);
        goto fail;
    }
    if (init->struct_size >= offsetof(kvs_backend_init, staging_len) + sizeof init->staging_len) {
        r->staging = init->staging_base;
        r->staging_len = init->staging_base ? init->staging_len : 0;
    }
    if ((st = alloc_buffers(r, init, o)) != KVS_OK) goto fail;
    if ((st = add_nodes(r, o)) != KVS_OK) goto fail;
    if ((st = start_progress(r)) != KVS_OK) goto fail;
    *state = r;
    return KVS_OK;
fail:
    if (init->error && init->error_len) snprintf(init->error, init->error_len, "%s", r->error);
    remote_free(r);
    return st;
}
