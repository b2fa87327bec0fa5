/* store_batch.c - submitted batches: each is copied (keys hashed, buffer lists copied) into a job,
 * its keys taken one at a time by whichever store thread is free (a large batch runs on all of
 * them), and completed into a ticket the caller collects by wait or drain; the event fd is
 * written at every completion. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "store_batch.h"
#include "store_events.h"
#include "store_io.h"

struct kvs_store_job {
    kvs_store_job *next;
    uint64_t ticket;
    uint32_t op, flags;
    uint64_t n;
    kvs_key *keys;
    kvs_store_iov *iov; /* copied from the caller's list (the buffers stay the caller's) */
    uint64_t *seg;
    kvs_store_result *results;
    uint64_t next_item, items_done;
    int complete, drained;
};

static void job_free(kvs_store_job *j) {
    if (!j) return;
    free(j->keys);
    free(j->iov);
    free(j->seg);
    free(j->results);
    free(j);
}

/* The buffer list of a get or put, checked and copied. */
static kvs_status copy_sg(kvs_store *s, kvs_store_job *j, const kvs_store_sg *sg) {
    if (!sg || !sg->seg || (!sg->iov && j->n && sg->seg[j->n]))
        return kvs_store_set_error(s, "submit: a get or put needs its buffers (sg)"), KVS_EINVAL;
    if (sg->seg[0] != 0) return kvs_store_set_error(s, "submit: sg.seg[0] is not 0"), KVS_EINVAL;
    for (uint64_t i = 0; i < j->n; i++)
        if (sg->seg[i + 1] < sg->seg[i])
            return kvs_store_set_error(s, "submit: sg.seg decreases at key %llu",
                                       (unsigned long long)i),
                   KVS_EINVAL;
    uint64_t n_iov = sg->seg[j->n];
    if (n_iov > (uint64_t)KVS_STORE_BATCH_MAX * 1024)
        return kvs_store_set_error(s, "submit: %llu buffers", (unsigned long long)n_iov),
               KVS_EINVAL;
    for (uint64_t i = 0; i < n_iov; i++)
        if (!sg->iov[i].base && sg->iov[i].len)
            return kvs_store_set_error(s, "submit: buffer %llu is NULL", (unsigned long long)i),
                   KVS_EINVAL;
    for (uint64_t i = 0; i < j->n; i++) {
        uint64_t total = 0;
        for (uint64_t v = sg->seg[i]; v < sg->seg[i + 1]; v++)
            if (__builtin_add_overflow(total, sg->iov[v].len, &total))
                return kvs_store_set_error(s, "submit: the buffers of key %llu add up past 2^64",
                                           (unsigned long long)i),
                       KVS_EINVAL;
    }
    j->seg = malloc((j->n + 1) * sizeof *j->seg);
    j->iov = malloc((n_iov ? n_iov : 1) * sizeof *j->iov);
    if (!j->seg || !j->iov) return kvs_store_set_error(s, "submit: out of memory"), KVS_ENOMEM;
    memcpy(j->seg, sg->seg, (j->n + 1) * sizeof *j->seg);
    if (n_iov) memcpy(j->iov, sg->iov, n_iov * sizeof *j->iov);
    return KVS_OK;
}

static kvs_status make_job(kvs_store *s, uint32_t op, const kvs_store_keys *keys,
                           const kvs_store_sg *sg, uint32_t flags, kvs_store_job **out) {
    if (op < KVS_STORE_OP_GET || op > KVS_STORE_OP_REMOVE)
        return kvs_store_set_error(s, "submit: unknown op %u", op), KVS_EINVAL;
    kvs_store_job *j = calloc(1, sizeof *j);
    if (!j) return kvs_store_set_error(s, "submit: out of memory"), KVS_ENOMEM;
    j->op = op;
    j->flags = flags;
    kvs_status st = kvs_store_derive_keys(s, keys, &j->keys);
    if (st == KVS_OK) j->n = keys->n;
    if (st == KVS_OK && (op == KVS_STORE_OP_GET || op == KVS_STORE_OP_PUT)) st = copy_sg(s, j, sg);
    if (st == KVS_OK && !(j->results = calloc(j->n ? j->n : 1, sizeof *j->results)))
        st = KVS_ENOMEM, kvs_store_set_error(s, "submit: out of memory");
    if (st != KVS_OK) {
        job_free(j);
        return st;
    }
    for (uint64_t i = 0; i < j->n; i++)
        j->results[i] = (kvs_store_result){.status = KVS_OK, .tier = KVS_STORE_NO_TIER};
    if (op == KVS_STORE_OP_PUT && s->events)
        for (uint64_t i = 0; i < j->n; i++)
            kvs_store_events_name(s->events, &j->keys[i],
                                  (const uint8_t *)keys->data + keys->offsets[i],
                                  (uint32_t)(keys->offsets[i + 1] - keys->offsets[i]));
    *out = j;
    return KVS_OK;
}

/* Under s->lock: the job is done; its ticket is announced. */
static void complete(kvs_store *s, kvs_store_job *j) {
    j->complete = 1;
    s->in_flight--;
    pthread_cond_broadcast(&s->done);
    uint64_t one = 1;
    if (write(s->event_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        kvs_log(s->cfg->log_level, KVS_LOG_WARN, "store: writing the event fd failed: errno %d",
                errno);
}

/* Items [i, i + n) of a job (n > 1 only for gets: keys read together). */
static void run_items(kvs_store *s, kvs_store_job *j, uint64_t i, uint32_t n, uint8_t *scratch) {
    if (j->op == KVS_STORE_OP_GET) {
        kvs_store_get_batch(s, j->keys + i, j->iov, j->seg + i, n, scratch, s->slot_bytes,
                            j->results + i);
        return;
    }
    kvs_store_result *r = &j->results[i];
    const kvs_store_iov *iov = j->iov ? j->iov + j->seg[i] : NULL;
    uint64_t n_iov = j->seg ? j->seg[i + 1] - j->seg[i] : 0;
    switch (j->op) {
        case KVS_STORE_OP_PUT:
            kvs_store_put_one(s, &j->keys[i], iov, n_iov, j->flags, scratch, r);
            break;
        case KVS_STORE_OP_EXISTS: kvs_store_exists_one(s, &j->keys[i], r); break;
        default: kvs_store_remove_one(s, &j->keys[i], r); break;
    }
}

typedef struct thread_arg {
    kvs_store *s;
    uint32_t index;
} thread_arg;

/* Under s->lock: the oldest job with a key not taken yet. */
static kvs_store_job *next_job(kvs_store *s) {
    for (kvs_store_job *j = s->jobs; j; j = j->next)
        if (!j->complete && j->next_item < j->n) return j;
    return NULL;
}

static void *store_thread(void *arg) {
    kvs_store *s = ((thread_arg *)arg)->s;
    uint8_t *scratch = s->scratch[((thread_arg *)arg)->index];
    free(arg);
    pthread_mutex_lock(&s->lock);
    for (;;) {
        kvs_store_job *j = next_job(s);
        if (!j) {
            if (s->closing) break;
            pthread_cond_wait(&s->work, &s->lock);
            continue;
        }
        uint64_t i = j->next_item, left = j->n - i;
        uint32_t n = j->op == KVS_STORE_OP_GET && left > 1
                         ? (uint32_t)(left < s->read_depth ? left : s->read_depth)
                         : 1;
        j->next_item += n;
        pthread_mutex_unlock(&s->lock);
        run_items(s, j, i, n, scratch);
        pthread_mutex_lock(&s->lock);
        if ((j->items_done += n) == j->n) complete(s, j);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* How many keys of a get batch one thread reads at once: several where a tier reads batches into
 * the store's buffers (each key then needs a slot), bounded by KVS_STORE_READ_BYTES a thread. */
static uint32_t read_depth(const kvs_store *s) {
    int batches = 0;
    for (uint32_t t = 0; t < s->n_tiers; t++)
        batches |= !kvs_tiers_zero_copy(s->chain, t) && kvs_tiers_can_get_many(s->chain, t);
    uint64_t fit = KVS_STORE_READ_BYTES / s->slot_bytes;
    return !batches || fit < 2          ? 1
           : fit < KVS_STORE_READ_DEPTH ? (uint32_t)fit
                                        : KVS_STORE_READ_DEPTH;
}

kvs_status kvs_store_threads_start(kvs_store *s, uint32_t n_threads, char *err, size_t err_len) {
    s->slot_bytes = (s->max_object + 4095) / 4096 * 4096;
    s->read_depth = read_depth(s);
    s->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->event_fd < 0)
        return kvs_fmt(err, err_len, "store: eventfd failed (errno %d)", errno), KVS_EIO;
    for (uint32_t i = 0; i < n_threads; i++) {
        thread_arg *a = malloc(sizeof *a);
        /* page-aligned, so a tier that reads with O_DIRECT reads straight into it */
        s->scratch[i] = aligned_alloc(4096, s->slot_bytes * s->read_depth);
        if (!a || !s->scratch[i]) {
            free(a);
            return kvs_fmt(err, err_len,
                           "store: out of memory for %u threads' buffers of %llu "
                           "bytes",
                           n_threads, (unsigned long long)s->max_object),
                   KVS_ENOMEM;
        }
        *a = (thread_arg){.s = s, .index = i};
        if (pthread_create(&s->threads[i], NULL, store_thread, a) != 0) {
            free(a);
            return kvs_fmt(err, err_len, "store: creating thread %u failed", i), KVS_EIO;
        }
        s->n_threads = i + 1;
    }
    return KVS_OK;
}

void kvs_store_threads_stop(kvs_store *s) {
    pthread_mutex_lock(&s->lock);
    s->closing = 1;
    while (s->in_flight && s->n_threads) pthread_cond_wait(&s->done, &s->lock);
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->lock);
    for (uint32_t i = 0; i < s->n_threads; i++) pthread_join(s->threads[i], NULL);
    for (uint32_t i = 0; i < KVS_STORE_MAX_THREADS; i++) free(s->scratch[i]);
    while (s->jobs) {
        kvs_store_job *j = s->jobs;
        s->jobs = j->next;
        job_free(j);
    }
    if (s->event_fd >= 0) close(s->event_fd);
}

kvs_status kvs_store_submit(kvs_store *s, uint32_t op, const kvs_store_keys *keys,
                            const kvs_store_sg *sg, uint32_t flags, uint64_t *ticket) {
    if (!ticket) return kvs_store_set_error(s, "submit: ticket is NULL"), KVS_EINVAL;
    kvs_store_job *j = NULL;
    kvs_status st = make_job(s, op, keys, sg, flags, &j);
    if (st != KVS_OK) return st;
    pthread_mutex_lock(&s->lock);
    if (s->closing) {
        pthread_mutex_unlock(&s->lock);
        job_free(j);
        return kvs_store_set_error(s, "submit: the store is closing"), KVS_ESTATE;
    }
    j->ticket = *ticket = ++s->next_ticket;
    if (s->jobs_tail)
        s->jobs_tail->next = j;
    else
        s->jobs = j;
    s->jobs_tail = j;
    s->in_flight++;
    if (j->n == 0)
        complete(s, j);
    else
        pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->lock);
    return KVS_OK;
}

/* Under s->lock: unlink a job. */
static void unlink_job(kvs_store *s, kvs_store_job *j) {
    kvs_store_job **p = &s->jobs, *prev = NULL;
    while (*p && *p != j) prev = *p, p = &(*p)->next;
    if (!*p) return;
    *p = j->next;
    if (s->jobs_tail == j) s->jobs_tail = prev;
}

static kvs_store_job *find_job(kvs_store *s, uint64_t ticket) {
    for (kvs_store_job *j = s->jobs; j; j = j->next)
        if (j->ticket == ticket) return j;
    return NULL;
}

kvs_status kvs_store_wait(kvs_store *s, uint64_t ticket, uint64_t timeout_ms,
                          kvs_store_result *results, uint64_t cap, uint64_t *n_failed) {
    struct timespec deadline = kvs_timespec_after_ms(CLOCK_MONOTONIC, timeout_ms);
    pthread_mutex_lock(&s->lock);
    kvs_store_job *j = find_job(s, ticket);
    while (j && !j->complete && timeout_ms) {
        int rc = timeout_ms == UINT64_MAX ? pthread_cond_wait(&s->done, &s->lock)
                                          : pthread_cond_timedwait(&s->done, &s->lock, &deadline);
        j = find_job(s, ticket); /* another waiter may have collected it */
        if (rc == ETIMEDOUT) break;
    }
    if (!j || !j->complete) {
        pthread_mutex_unlock(&s->lock);
        if (!j)
            return kvs_store_set_error(s, "wait: no ticket %llu (collected already?)",
                                       (unsigned long long)ticket),
                   KVS_ENOTFOUND;
        return KVS_ETIMEDOUT;
    }
    unlink_job(s, j);
    pthread_mutex_unlock(&s->lock);
    uint64_t failed = 0;
    for (uint64_t i = 0; i < j->n; i++) failed += j->results[i].status != KVS_OK;
    if (results) memcpy(results, j->results, (cap < j->n ? cap : j->n) * sizeof *results);
    if (n_failed) *n_failed = failed;
    job_free(j);
    return KVS_OK;
}

kvs_status kvs_store_drain(kvs_store *s, uint64_t *tickets, uint64_t cap, uint64_t *n) {
    if (!n || (cap && !tickets)) return kvs_store_set_error(s, "drain: NULL output"), KVS_EINVAL;
    uint64_t one;
    while (read(s->event_fd, &one, sizeof one) > 0) {
    }
    uint64_t take = 0;
    int more = 0;
    pthread_mutex_lock(&s->lock);
    for (kvs_store_job *j = s->jobs; j; j = j->next) {
        if (!j->complete || j->drained) continue;
        if (take == cap) {
            more = 1;
            break;
        }
        j->drained = 1;
        tickets[take++] = j->ticket;
    }
    pthread_mutex_unlock(&s->lock);
    one = 1;
    /* tickets left for the next call: the fd stays readable */
    if (more && write(s->event_fd, &one, sizeof one) < 0)
        kvs_log(s->cfg->log_level, KVS_LOG_WARN, "store: writing the event fd failed: errno %d",
                errno);
    *n = take;
    return KVS_OK;
}
