/*
 * ssd_io.h - one path's I/O engine for the ssd tier: a queue per priority class, and either one
 * io_uring ring driven by its own thread or a small pread/pwrite thread pool, plus the paced
 * device model (sim_bandwidth, sim_iops) and fault injection for tests.
 *
 * Requests are caller-owned and must stay valid until their done callback ran. done runs on an
 * engine thread with no engine lock held; it may submit more requests and take the tier's lock.
 * Lock order: the tier's lock, then a path's queue lock; never the other way round.
 */
#ifndef KVS_SSD_IO_H
#define KVS_SSD_IO_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>

/* Priority classes, served in this order; writes also obey write_inflight. */
enum { SSD_IO_RESTORE = 0, SSD_IO_PREFETCH = 1, SSD_IO_WRITE = 2, SSD_IO_CLASSES = 3 };
enum { SSD_IO_OP_READ = 0, SSD_IO_OP_WRITE = 1 };
enum { SSD_ENGINE_URING = 0, SSD_ENGINE_PREAD = 1 };

typedef struct ssd_io_request ssd_io_request;
/* result: bytes moved (all of them) or -errno. */
typedef void (*ssd_io_done_fn)(ssd_io_request *req, int result);

struct ssd_io_request {
    /* set by the submitter */
    uint8_t op;       /* SSD_IO_OP_* */
    uint8_t io_class; /* SSD_IO_* */
    uint32_t n_iov;   /* 1 or 2; every base, length and offset 4KiB aligned (O_DIRECT) */
    struct iovec iov[2];
    uint64_t offset;
    int fixed_index; /* registered staging chunk for a single-iovec read, or -1 */
    ssd_io_done_fn done;
    void *ctx;
    /* engine-owned while queued or in flight */
    ssd_io_request *next;
    uint64_t moved;    /* bytes done so far (short transfers continue) */
    uint64_t start_ns; /* when it was issued, for the paced model */
    uint32_t retries;
    int result;
    struct iovec iov_scratch[2]; /* the remainder handed to readv/writev */
};

/* Completion counter for a batch of requests, waited on with a timeout. */
typedef struct ssd_io_waiter {
    pthread_mutex_t mutex;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    uint64_t remaining;
} ssd_io_waiter;

int ssd_io_waiter_init(ssd_io_waiter *w, uint64_t n); /* 0 or an errno */
void ssd_io_waiter_add(ssd_io_waiter *w, uint64_t n); /* n more to wait for */
void ssd_io_waiter_signal(ssd_io_waiter *w);          /* one of them finished */
/* 0 once all finished, ETIMEDOUT after timeout_ms. */
int ssd_io_waiter_wait(ssd_io_waiter *w, uint64_t timeout_ms);
void ssd_io_waiter_destroy(ssd_io_waiter *w);

/* Counters shared by all paths of a tier (relaxed atomics). */
typedef struct ssd_io_counters {
    atomic_uint_fast64_t reads, writes, read_bytes, written_bytes, submits, fixed_reads,
        path_errors;
    atomic_int_fast64_t
        enospc_budget; /* fault injection: unit writes left before ENOSPC; -1 = off */
} ssd_io_counters;

typedef struct ssd_io_config {
    const char *tier_name; /* for messages */
    const char *dir;       /* the path, for messages */
    uint32_t index;        /* the path's position in the tier */
    int fd;     /* the data file, O_DIRECT where possible; the engine does not close it */
    int engine; /* SSD_ENGINE_* wanted; uring may fall back to pread */
    uint32_t queue_depth;
    uint32_t write_inflight;
    uint32_t pread_threads;
    uint64_t sim_bandwidth; /* bytes/s; 0 = off */
    uint64_t sim_iops;      /* 0 = off */
    void *staging_base;     /* registered as fixed buffers in 1GiB chunks when possible */
    uint64_t staging_len;
    int eio;            /* fault injection: this path fails ... */
    uint64_t eio_after; /* ... after this many I/Os completed once armed */
    int64_t
        device_bytes; /* a modelled small device: writes past this byte fail with ENOSPC, from the
                           * start (the superblock too); -1 = off */
    ssd_io_counters *counters;
    void *ctx; /* for log and on_failed */
    void (*log)(void *ctx, int level, const char *message);
    /* Called once, on an engine thread with no engine lock held, when the path is isolated. */
    void (*on_failed)(void *ctx, uint32_t index, int err);
} ssd_io_config;

typedef struct ssd_io_path ssd_io_path;

/* Start the engine of one path. *out is NULL and err holds a sentence on failure. A uring engine
 * that cannot start (ENOSYS, EPERM, io_uring_disabled, a build without liburing) falls back to
 * pread and says so at INFO through cfg->log. */
int ssd_io_open(const ssd_io_config *cfg, ssd_io_path **out, char *err, uint64_t err_len);
/* Let the queued and in-flight requests complete, then end the threads. Later submits are not
 * allowed. Idempotent; NULL is a no-op. */
void ssd_io_stop(ssd_io_path *p);
/* Stop, then free. NULL is a no-op. */
void ssd_io_close(ssd_io_path *p);

/* Queue n requests as one batch: an io_uring engine issues a batch that fits its ring with one
 * system call. Requests of a failed path complete at once with -EIO. */
void ssd_io_submit(ssd_io_path *p, ssd_io_request *const *reqs, uint64_t n);

/* Fault injection counts from here (create arms it once the tier is built). */
void ssd_io_arm_faults(ssd_io_path *p);
/* Isolate the path (later requests fail with -EIO); calls on_failed once. */
void ssd_io_fail(ssd_io_path *p, int err);
int ssd_io_failed(const ssd_io_path *p);
/* 1 when the path runs on io_uring. */
int ssd_io_uses_uring(const ssd_io_path *p);
/* Why io_uring was wanted but not used (an errno; ENOSYS for a build without liburing), else 0. */
int ssd_io_uring_error(const ssd_io_path *p);
/* 1 when the staging pool is registered with this path's ring. */
int ssd_io_has_fixed(const ssd_io_path *p);
/* The registered chunk holding [buf, buf + len), or -1. */
int ssd_io_fixed_index(const ssd_io_path *p, const void *buf, uint64_t len);
/* Per-path completed reads and writes. */
void ssd_io_path_counts(const ssd_io_path *p, uint64_t *reads, uint64_t *writes);

/* Fill req for one aligned transfer. */
void ssd_io_prepare(ssd_io_request *req, int op, int io_class, void *buf, uint64_t len,
                    uint64_t offset, ssd_io_done_fn done, void *ctx);

/* Read or write one aligned buffer and wait for it, at most timeout_ms (the path is isolated on
 * timeout). Returns bytes or -errno. For create-time metadata I/O. */
int64_t ssd_io_sync(ssd_io_path *p, int op, void *buf, uint64_t len, uint64_t offset,
                    uint64_t timeout_ms);

#endif /* KVS_SSD_IO_H */
