/*
 * ssd_io.c - one path's I/O engine (contract in ssd_io.h).
 *
 * The io_uring engine is one thread per path that owns its ring (SINGLE_ISSUER, DEFER_TASKRUN
 * where the kernel has them; no SQPOLL, which steals a core on small hosts). It sleeps in
 * io_uring_enter; submitters wake it through an eventfd that the ring itself reads, so a new
 * request and a completion wake it the same way and nothing polls. Each loop turns every queued
 * request that may start into an SQE and issues them with one io_uring_enter.
 *
 * The pread engine is a few threads per path popping the same queues; it exists for kernels or
 * sandboxes without io_uring and as the reference the uring engine is tested against.
 *
 * The paced model: a completion is handed back no earlier than the path's virtual clock, which
 * advances by bytes/sim_bandwidth + 1/sim_iops per I/O, so files on one disk act as separate devices
 * of that speed.
 */
#include "ssd_io.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#ifdef KVS_HAVE_URING
#include <liburing.h>
#endif

#include "abi/kvstrata_backend.h"
#include "common/clock.h"
#include "common/errno_name.h"
#include "common/pace.h"

#define MAX_PREAD_THREADS 64
#define MAX_RETRIES       8            /* EAGAIN/EINTR resubmissions of one request */
#define FIXED_CHUNK_BYTES (1ull << 30) /* io_uring caps one registered buffer at 1GiB */
#define MAX_FIXED_CHUNKS  1024
#define START_TIMEOUT_MS  10000

struct ssd_io_path {
    ssd_io_config cfg;
    pthread_mutex_t mutex;
    pthread_cond_t work;    /* pread workers wait here for requests */
    pthread_cond_t started; /* the uring thread reports its setup here */
    ssd_io_request *head[SSD_IO_CLASSES], *tail[SSD_IO_CLASSES];
    uint64_t queued;
    uint32_t inflight, writes_inflight;
    int stop;
    kvs_pace pace; /* the paced model (sim_bandwidth, sim_iops) */
    atomic_int failed;
    atomic_int armed;
    atomic_uint_fast64_t completed; /* successful I/Os since armed, for eio_after */
    atomic_uint_fast64_t n_reads, n_writes;
    int use_uring;
    int uring_error;
    uint32_t n_threads;
    pthread_t threads[MAX_PREAD_THREADS];
#ifdef KVS_HAVE_URING
    struct io_uring ring;
    int doorbell_fd;
    uint64_t doorbell_value;
    int sleeping;    /* under mutex: the ring thread is (about to be) blocked in io_uring_enter */
    int start_state; /* under mutex: 0 starting, 1 running, -errno failed */
#endif
    uint32_t n_fixed;
};

static void log_path(ssd_io_path *p, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void log_path(ssd_io_path *p, int level, const char *fmt, ...) {
    if (!p->cfg.log) return;
    char body[320], message[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    snprintf(message, sizeof message, "ssd tier \"%s\": path %u (%s): %s", p->cfg.tier_name,
             p->cfg.index, p->cfg.dir, body);
    p->cfg.log(p->cfg.ctx, level, message);
}

/* ---- waiter ---------------------------------------------------------------------------------- */

int ssd_io_waiter_init(ssd_io_waiter *w, uint64_t n) {
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc) return rc;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&w->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (rc) return rc;
    rc = pthread_mutex_init(&w->mutex, NULL);
    if (rc) {
        pthread_cond_destroy(&w->cond);
        return rc;
    }
    w->remaining = n;
    return 0;
}

void ssd_io_waiter_add(ssd_io_waiter *w, uint64_t n) {
    pthread_mutex_lock(&w->mutex);
    w->remaining += n;
    pthread_mutex_unlock(&w->mutex);
}

void ssd_io_waiter_signal(ssd_io_waiter *w) {
    pthread_mutex_lock(&w->mutex);
    if (w->remaining > 0 && --w->remaining == 0) pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mutex);
}

int ssd_io_waiter_wait(ssd_io_waiter *w, uint64_t timeout_ms) {
    struct timespec deadline = kvs_timespec_after_ms(CLOCK_MONOTONIC, timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&w->mutex);
    while (w->remaining > 0 && rc == 0) rc = pthread_cond_timedwait(&w->cond, &w->mutex, &deadline);
    rc = w->remaining > 0 ? ETIMEDOUT : 0;
    pthread_mutex_unlock(&w->mutex);
    return rc;
}

void ssd_io_waiter_destroy(ssd_io_waiter *w) {
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->mutex);
}

/* ---- queues ---------------------------------------------------------------------------------- */

void ssd_io_prepare(ssd_io_request *req, int op, int io_class, void *buf, uint64_t len,
                    uint64_t offset, ssd_io_done_fn done, void *ctx) {
    memset(req, 0, sizeof *req);
    req->op = (uint8_t)op;
    req->io_class = (uint8_t)io_class;
    req->n_iov = 1;
    req->iov[0].iov_base = buf;
    req->iov[0].iov_len = (size_t)len;
    req->offset = offset;
    req->fixed_index = -1;
    req->done = done;
    req->ctx = ctx;
}

static uint64_t request_bytes(const ssd_io_request *r) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < r->n_iov; i++) n += r->iov[i].iov_len;
    return n;
}

/* The part of r not moved yet, as at most two iovecs. */
static uint32_t remaining_iov(const ssd_io_request *r, struct iovec *out) {
    uint64_t skip = r->moved;
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n_iov; i++) {
        if (skip >= r->iov[i].iov_len) {
            skip -= r->iov[i].iov_len;
            continue;
        }
        out[n].iov_base = (uint8_t *)r->iov[i].iov_base + skip;
        out[n].iov_len = r->iov[i].iov_len - (size_t)skip;
        skip = 0;
        n++;
    }
    return n;
}

static void push_back(ssd_io_path *p, ssd_io_request *r) {
    unsigned c = r->io_class < SSD_IO_CLASSES ? r->io_class : SSD_IO_WRITE;
    r->next = NULL;
    if (p->tail[c])
        p->tail[c]->next = r;
    else
        p->head[c] = r;
    p->tail[c] = r;
    p->queued++;
}

/* With the mutex held: the next request allowed to start, by class, or NULL. */
static ssd_io_request *pop_next(ssd_io_path *p, uint32_t max_inflight) {
    if (p->inflight >= max_inflight) return NULL;
    for (unsigned c = 0; c < SSD_IO_CLASSES; c++) {
        ssd_io_request *r = p->head[c];
        if (!r) continue;
        if (r->op == SSD_IO_OP_WRITE && p->writes_inflight >= p->cfg.write_inflight) continue;
        p->head[c] = r->next;
        if (!p->head[c]) p->tail[c] = NULL;
        r->next = NULL;
        p->queued--;
        p->inflight++;
        if (r->op == SSD_IO_OP_WRITE) p->writes_inflight++;
        return r;
    }
    return NULL;
}

/* ---- faults and completion ------------------------------------------------------------------- */

int ssd_io_failed(const ssd_io_path *p) {
    return atomic_load(&p->failed);
}

void ssd_io_fail(ssd_io_path *p, int err) {
    if (atomic_exchange(&p->failed, 1)) return;
    pthread_mutex_lock(&p->mutex);
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mutex);
    if (p->cfg.on_failed) p->cfg.on_failed(p->cfg.ctx, p->cfg.index, err);
}

void ssd_io_arm_faults(ssd_io_path *p) {
    atomic_store(&p->completed, 0);
    atomic_store(&p->armed, 1);
}

/* 0 to issue r, or the -errno it completes with at once (a failed path or an injected fault). */
static int fault_check(ssd_io_path *p, const ssd_io_request *r) {
    if (atomic_load(&p->failed)) return -EIO;
    if (r->op == SSD_IO_OP_WRITE && p->cfg.device_bytes >= 0 &&
        r->offset + request_bytes(r) > (uint64_t)p->cfg.device_bytes)
        return -ENOSPC;
    if (!atomic_load(&p->armed)) return 0;
    if (p->cfg.eio && atomic_load(&p->completed) >= p->cfg.eio_after) {
        atomic_fetch_add(&p->cfg.counters->path_errors, 1);
        ssd_io_fail(p, EIO);
        return -EIO;
    }
    if (r->op == SSD_IO_OP_WRITE) {
        atomic_int_fast64_t *budget = &p->cfg.counters->enospc_budget;
        int_fast64_t left = atomic_load(budget);
        while (left > 0 && !atomic_compare_exchange_weak(budget, &left, left - 1)) {
        }
        if (left == 0) return -ENOSPC;
    }
    return 0;
}

/* Hand r back: count it, fail the path on a device error, hold it to the paced clock, call done.
 * No lock is held. r is not touched after done. */
static void complete(ssd_io_path *p, ssd_io_request *r, int result) {
    uint64_t bytes = request_bytes(r);
    if (result >= 0) {
        ssd_io_counters *c = p->cfg.counters;
        if (r->op == SSD_IO_OP_READ) {
            atomic_fetch_add(&c->reads, 1);
            atomic_fetch_add(&c->read_bytes, bytes);
            atomic_fetch_add(&p->n_reads, 1);
        } else {
            atomic_fetch_add(&c->writes, 1);
            atomic_fetch_add(&c->written_bytes, bytes);
            atomic_fetch_add(&p->n_writes, 1);
        }
        if (atomic_load(&p->armed)) atomic_fetch_add(&p->completed, 1);
        if (p->cfg.sim_bandwidth || p->cfg.sim_iops)
            kvs_pace_wait(&p->pace, r->start_ns,
                          kvs_pace_cost_ns(bytes, p->cfg.sim_bandwidth,
                                           p->cfg.sim_iops ? 1000000000ull / p->cfg.sim_iops : 0));
    } else if (result != -ENOSPC && !atomic_load(&p->failed)) {
        atomic_fetch_add(&p->cfg.counters->path_errors, 1);
        log_path(p, KVS_LOG_ERROR, "%s at offset %llu (%s); the path is isolated",
                 r->op == SSD_IO_OP_READ ? "read failed" : "write failed",
                 (unsigned long long)r->offset, kvs_errno_name(-result));
        ssd_io_fail(p, -result);
    }
    pthread_mutex_lock(&p->mutex);
    p->inflight--;
    if (r->op == SSD_IO_OP_WRITE) p->writes_inflight--;
    if (!p->use_uring) pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mutex);
    r->result = result;
    r->done(r, result >= 0 ? (int)(bytes > INT_MAX ? INT_MAX : bytes) : result);
}

/* A transfer result: 1 when r is finished (result set), 0 when its remainder must be issued again. */
static int account(ssd_io_request *r, int64_t res) {
    if (res == -EINTR || res == -EAGAIN) {
        if (++r->retries <= MAX_RETRIES) return 0;
        r->result = (int)res;
        return 1;
    }
    if (res < 0) {
        r->result = (int)res;
        return 1;
    }
    if (res == 0) { /* past the end of the file: the data file is shorter than its geometry */
        r->result = -EIO;
        return 1;
    }
    r->moved += (uint64_t)res;
    if (r->moved >= request_bytes(r)) {
        r->result = 0;
        return 1;
    }
    return 0;
}

/* ---- pread engine ---------------------------------------------------------------------------- */

static int64_t transfer_once(ssd_io_path *p, ssd_io_request *r) {
    struct iovec iov[2];
    uint32_t n = remaining_iov(r, iov);
    off_t off = (off_t)(r->offset + r->moved);
    ssize_t got;
    atomic_fetch_add(&p->cfg.counters->submits, 1);
    if (r->op == SSD_IO_OP_READ)
        got = n == 1 ? pread(p->cfg.fd, iov[0].iov_base, iov[0].iov_len, off)
                     : preadv(p->cfg.fd, iov, (int)n, off);
    else
        got = n == 1 ? pwrite(p->cfg.fd, iov[0].iov_base, iov[0].iov_len, off)
                     : pwritev(p->cfg.fd, iov, (int)n, off);
    return got < 0 ? -(int64_t)errno : (int64_t)got;
}

static void *pread_main(void *arg) {
    ssd_io_path *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mutex);
        ssd_io_request *r = NULL;
        while (!(r = pop_next(p, UINT32_MAX)) && !(p->stop && p->queued == 0))
            pthread_cond_wait(&p->work, &p->mutex);
        pthread_mutex_unlock(&p->mutex);
        if (!r) break;
        r->start_ns = kvs_now_ns();
        int fault = fault_check(p, r);
        if (fault) {
            complete(p, r, fault);
            continue;
        }
        while (!account(r, transfer_once(p, r))) {
        }
        complete(p, r, r->result);
    }
    return NULL;
}

static int start_pread(ssd_io_path *p) {
    uint32_t n = p->cfg.pread_threads ? p->cfg.pread_threads : 1;
    if (n > MAX_PREAD_THREADS) n = MAX_PREAD_THREADS;
    for (uint32_t i = 0; i < n; i++) {
        int rc = pthread_create(&p->threads[i], NULL, pread_main, p);
        if (rc) return rc;
        p->n_threads++;
    }
    return 0;
}

/* ---- io_uring engine ------------------------------------------------------------------------- */

#ifdef KVS_HAVE_URING

/* Ring setup inside the ring's own thread (SINGLE_ISSUER binds the ring to it). */
static int ring_setup(ssd_io_path *p) {
    struct io_uring_params params;
    memset(&params, 0, sizeof params);
    params.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    params.cq_entries = 2 * p->cfg.queue_depth;
    int rc = io_uring_queue_init_params(p->cfg.queue_depth, &p->ring, &params);
    if (rc == -EINVAL) { /* a kernel before 6.1 */
        memset(&params, 0, sizeof params);
        params.flags = IORING_SETUP_CQSIZE;
        params.cq_entries = 2 * p->cfg.queue_depth;
        rc = io_uring_queue_init_params(p->cfg.queue_depth, &p->ring, &params);
    }
    if (rc < 0) return rc;
    p->doorbell_fd = eventfd(0, EFD_CLOEXEC);
    if (p->doorbell_fd < 0) {
        rc = -errno;
        io_uring_queue_exit(&p->ring);
        return rc;
    }
    if (p->cfg.staging_base && p->cfg.staging_len) {
        uint64_t n = (p->cfg.staging_len + FIXED_CHUNK_BYTES - 1) / FIXED_CHUNK_BYTES;
        struct iovec *iov = n <= MAX_FIXED_CHUNKS ? calloc(n, sizeof *iov) : NULL;
        int reg = -ENOMEM;
        if (iov) {
            for (uint64_t i = 0; i < n; i++) {
                uint64_t off = i * FIXED_CHUNK_BYTES, left = p->cfg.staging_len - off;
                iov[i].iov_base = (uint8_t *)p->cfg.staging_base + off;
                iov[i].iov_len = (size_t)(left < FIXED_CHUNK_BYTES ? left : FIXED_CHUNK_BYTES);
            }
            reg = io_uring_register_buffers(&p->ring, iov, (unsigned)n);
            free(iov);
        }
        if (reg == 0)
            p->n_fixed = (uint32_t)n;
        else if (p->cfg.index == 0) /* once per tier: every path would say the same */
            log_path(p, KVS_LOG_INFO,
                     "the staging pool cannot be registered with io_uring (%s); reads into it "
                     "are plain reads",
                     kvs_errno_name(-reg));
    }
    return 0;
}

static void ring_prep(ssd_io_path *p, struct io_uring_sqe *sqe, ssd_io_request *r) {
    struct iovec iov[2];
    uint32_t n = remaining_iov(r, iov);
    uint64_t off = r->offset + r->moved;
    if (r->op == SSD_IO_OP_READ) {
        if (n == 1 && r->fixed_index >= 0 && (uint32_t)r->fixed_index < p->n_fixed) {
            io_uring_prep_read_fixed(sqe, p->cfg.fd, iov[0].iov_base, (unsigned)iov[0].iov_len, off,
                                     r->fixed_index);
            if (r->moved == 0) atomic_fetch_add(&p->cfg.counters->fixed_reads, 1);
        } else if (n == 1) {
            io_uring_prep_read(sqe, p->cfg.fd, iov[0].iov_base, (unsigned)iov[0].iov_len, off);
        } else {
            /* the iovec array is copied by the kernel at submission (IORING_FEAT_SUBMIT_STABLE) */
            r->iov_scratch[0] = iov[0];
            r->iov_scratch[1] = iov[1];
            io_uring_prep_readv(sqe, p->cfg.fd, r->iov_scratch, n, off);
        }
    } else {
        r->iov_scratch[0] = iov[0];
        r->iov_scratch[1] = iov[1];
        io_uring_prep_writev(sqe, p->cfg.fd, r->iov_scratch, n, off);
    }
    io_uring_sqe_set_data(sqe, r);
}

/* An SQE; the ring never holds more than queue_depth (in flight plus the doorbell), but a submit
 * that failed with EAGAIN leaves entries behind, so make room by submitting them. */
static struct io_uring_sqe *next_sqe(ssd_io_path *p) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&p->ring);
    if (!sqe) {
        io_uring_submit(&p->ring);
        sqe = io_uring_get_sqe(&p->ring);
    }
    return sqe;
}

/* Take up to queue_depth - 1 queued requests, in order, into *popped. 1 when the engine stops
 * (stop asked, nothing queued or in flight). From here a submitter rings the doorbell, so nothing
 * queued after this goes unseen. */
static int ring_take_queued(ssd_io_path *p, ssd_io_request **popped) {
    ssd_io_request **tail = popped, *r;
    pthread_mutex_lock(&p->mutex);
    if (p->stop && p->queued == 0 && p->inflight == 0) {
        pthread_mutex_unlock(&p->mutex);
        return 1;
    }
    while ((r = pop_next(p, p->cfg.queue_depth - 1))) {
        *tail = r;
        tail = &r->next;
    }
    p->sleeping = 1;
    pthread_mutex_unlock(&p->mutex);
    return 0;
}

/* An SQE for each request, *again (remainders and retries) first, then popped; a request the
 * fault injection or a full ring refuses completes with that error. 1 when none was refused (the
 * submit may wait for a completion). */
static int ring_issue(ssd_io_path *p, ssd_io_request **again, ssd_io_request *popped) {
    ssd_io_request *refused = NULL, *r;
    struct io_uring_sqe *sqe = NULL;
    unsigned issued = 0;
    while ((r = *again) || (r = popped)) {
        if (r == *again)
            *again = r->next;
        else
            popped = r->next;
        int fault = r->moved == 0 && r->retries == 0 ? fault_check(p, r) : 0;
        if (!fault && !(sqe = next_sqe(p))) fault = -EBUSY;
        if (fault) {
            r->result = fault;
            r->next = refused;
            refused = r;
            continue;
        }
        if (r->moved == 0 && r->retries == 0) r->start_ns = kvs_now_ns();
        ring_prep(p, sqe, r);
        issued++;
    }
    if (issued) atomic_fetch_add(&p->cfg.counters->submits, 1);
    int wait = refused == NULL;
    while ((r = refused)) {
        refused = r->next;
        complete(p, r, r->result);
    }
    return wait;
}

/* Submit (and with wait, wait for one completion); a ring that fails isolates the path, one short
 * of memory backs off. */
static void ring_submit(ssd_io_path *p, int wait) {
    int rc;
    do {
        rc = wait ? io_uring_submit_and_wait(&p->ring, 1) : io_uring_submit(&p->ring);
    } while (rc == -EINTR);
    if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && !atomic_load(&p->failed)) {
        log_path(p, KVS_LOG_ERROR, "io_uring_enter failed (%s); the path is isolated",
                 kvs_errno_name(-rc));
        atomic_fetch_add(&p->cfg.counters->path_errors, 1);
        ssd_io_fail(p, -rc);
    } else if (rc == -EAGAIN || rc == -EBUSY) {
        kvs_sleep_until_ns(kvs_now_ns() +
                           1000000ull); /* the kernel is short of memory: back off, do not spin */
    }
    pthread_mutex_lock(&p->mutex);
    p->sleeping = 0;
    pthread_mutex_unlock(&p->mutex);
}

/* The completions: finished requests complete in order, short ones go on *again; the doorbell's
 * sets *arm_doorbell. */
static void ring_reap(ssd_io_path *p, ssd_io_request **again, int *arm_doorbell) {
    ssd_io_request *finished = NULL, **last = &finished, *r;
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&p->ring, head, cqe) {
        seen++;
        r = io_uring_cqe_get_data(cqe);
        if (!r) { /* the doorbell: new requests are queued, or close is waiting */
            *arm_doorbell = 1;
            continue;
        }
        if (account(r, cqe->res)) {
            r->next = NULL;
            *last = r;
            last = &r->next;
        } else {
            r->next = *again;
            *again = r;
        }
    }
    io_uring_cq_advance(&p->ring, seen);
    while ((r = finished)) {
        finished = r->next;
        complete(p, r, r->result);
    }
}

static void *ring_main(void *arg) {
    ssd_io_path *p = arg;
    int rc = ring_setup(p);
    pthread_mutex_lock(&p->mutex);
    p->start_state = rc < 0 ? rc : 1;
    pthread_cond_broadcast(&p->started);
    pthread_mutex_unlock(&p->mutex);
    if (rc < 0) return NULL;

    int arm_doorbell = 1;
    ssd_io_request *again = NULL; /* remainders of short transfers and retries, issued first */
    for (;;) {
        ssd_io_request *popped = NULL;
        struct io_uring_sqe *sqe;
        if (arm_doorbell && (sqe = next_sqe(p))) {
            io_uring_prep_read(sqe, p->doorbell_fd, &p->doorbell_value, sizeof p->doorbell_value,
                               0);
            io_uring_sqe_set_data(sqe, NULL);
            arm_doorbell = 0;
        }
        if (ring_take_queued(p, &popped)) break;
        ring_submit(p, ring_issue(p, &again, popped));
        ring_reap(p, &again, &arm_doorbell);
    }
    close(p->doorbell_fd);
    io_uring_queue_exit(&p->ring);
    return NULL;
}

/* With the mutex held: wake the ring thread if it sleeps (or is about to) in io_uring_enter. */
static void ring_doorbell(ssd_io_path *p) {
    if (!p->sleeping) return;
    uint64_t one = 1;
    p->sleeping = 0;
    if (write(p->doorbell_fd, &one, sizeof one) < 0) {
        /* only a counter at its maximum refuses, and then the ring is awake already */
    }
}

static int start_uring(ssd_io_path *p) {
    p->start_state = 0;
    int rc = pthread_create(&p->threads[0], NULL, ring_main, p);
    if (rc) return -rc;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += START_TIMEOUT_MS / 1000;
    pthread_mutex_lock(&p->mutex);
    while (p->start_state == 0 && rc == 0)
        rc = pthread_cond_timedwait(&p->started, &p->mutex, &deadline);
    int state = p->start_state;
    pthread_mutex_unlock(&p->mutex);
    if (state == 1) {
        p->n_threads = 1;
        return 0;
    }
    pthread_join(p->threads[0], NULL); /* setup failed: the thread returned already */
    return state < 0 ? state : -ETIMEDOUT;
}

#endif /* KVS_HAVE_URING */

/* ---- open / submit / close ------------------------------------------------------------------- */

int ssd_io_open(const ssd_io_config *cfg, ssd_io_path **out, char *err, uint64_t err_len) {
    *out = NULL;
    ssd_io_path *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, (size_t)err_len, "out of memory for the I/O engine of %s", cfg->dir);
        return ENOMEM;
    }
    p->cfg = *cfg;
    if (p->cfg.queue_depth < 2) p->cfg.queue_depth = 2;
    if (p->cfg.write_inflight == 0) p->cfg.write_inflight = 1;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->mutex, NULL);
    kvs_pace_init(&p->pace);
    pthread_cond_init(&p->work, &attr);
    pthread_condattr_destroy(&attr);
    pthread_cond_init(&p->started, NULL);
    if (cfg->engine == SSD_ENGINE_URING) {
#ifdef KVS_HAVE_URING
        int started = start_uring(p);
        if (started == 0)
            p->use_uring = 1;
        else
            p->uring_error = -started;
#else
        p->uring_error = ENOSYS;
#endif
    }
    if (!p->use_uring) {
        int rc = start_pread(p);
        if (rc) {
            snprintf(err, (size_t)err_len, "cannot start I/O threads for %s (%s)", cfg->dir,
                     kvs_errno_name(rc));
            ssd_io_close(p);
            return rc;
        }
    }
    *out = p;
    return 0;
}

void ssd_io_submit(ssd_io_path *p, ssd_io_request *const *reqs, uint64_t n) {
    if (n == 0) return;
    pthread_mutex_lock(&p->mutex);
    for (uint64_t i = 0; i < n; i++) {
        reqs[i]->moved = 0;
        reqs[i]->retries = 0;
        reqs[i]->result = 0;
        push_back(p, reqs[i]);
    }
#ifdef KVS_HAVE_URING
    if (p->use_uring) {
        ring_doorbell(p);
        pthread_mutex_unlock(&p->mutex);
        return;
    }
#endif
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mutex);
}

void ssd_io_stop(ssd_io_path *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mutex);
    p->stop = 1;
#ifdef KVS_HAVE_URING
    if (p->use_uring) ring_doorbell(p);
#endif
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mutex);
    for (uint32_t i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    p->n_threads = 0;
}

void ssd_io_close(ssd_io_path *p) {
    if (!p) return;
    ssd_io_stop(p);
    pthread_cond_destroy(&p->started);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mutex);
    kvs_pace_destroy(&p->pace);
    free(p);
}

int ssd_io_uses_uring(const ssd_io_path *p) {
    return p->use_uring;
}
int ssd_io_uring_error(const ssd_io_path *p) {
    return p->uring_error;
}
int ssd_io_has_fixed(const ssd_io_path *p) {
    return p->n_fixed > 0;
}

int ssd_io_fixed_index(const ssd_io_path *p, const void *buf, uint64_t len) {
    if (!p->n_fixed || !p->cfg.staging_base) return -1;
    uintptr_t base = (uintptr_t)p->cfg.staging_base, b = (uintptr_t)buf;
    if (b < base || b - base > p->cfg.staging_len || len > p->cfg.staging_len - (b - base))
        return -1;
    uint64_t off = b - base;
    uint64_t chunk = off / FIXED_CHUNK_BYTES;
    if (chunk >= p->n_fixed || (off + len - 1) / FIXED_CHUNK_BYTES != chunk || len == 0) return -1;
    return (int)chunk;
}

void ssd_io_path_counts(const ssd_io_path *p, uint64_t *reads, uint64_t *writes) {
    *reads = atomic_load(&p->n_reads);
    *writes = atomic_load(&p->n_writes);
}

typedef struct sync_call {
    ssd_io_request req;
    ssd_io_waiter waiter;
    int result;
} sync_call;

static void sync_done(ssd_io_request *req, int result) {
    sync_call *c = req->ctx;
    c->result = result;
    ssd_io_waiter_signal(&c->waiter);
}

int64_t ssd_io_sync(ssd_io_path *p, int op, void *buf, uint64_t len, uint64_t offset,
                    uint64_t timeout_ms) {
    sync_call c;
    int rc = ssd_io_waiter_init(&c.waiter, 1);
    if (rc) return -rc;
    ssd_io_prepare(&c.req, op, SSD_IO_RESTORE, buf, len, offset, sync_done, &c);
    ssd_io_request *r = &c.req;
    ssd_io_submit(p, &r, 1);
    if (ssd_io_waiter_wait(&c.waiter, timeout_ms) == ETIMEDOUT) {
        log_path(p, KVS_LOG_ERROR, "an I/O took longer than %llu ms; the path is isolated",
                 (unsigned long long)timeout_ms);
        ssd_io_fail(p, ETIMEDOUT);
        while (ssd_io_waiter_wait(&c.waiter, timeout_ms) == ETIMEDOUT) {
        }
    }
    ssd_io_waiter_destroy(&c.waiter);
    return c.result;
}
