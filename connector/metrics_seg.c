/* metrics_seg.c - the shared counter segment (metrics_seg.h): creating or attaching it, slots,
 * the owner's lock-free writes, folding the slots of processes gone, consistent copies. */
#include "metrics_seg.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

#define LOCK_TIMEOUT_MS 2000
#define SNAPSHOT_TRIES  1000
#define CREATE_WAIT_MS  2000

/* Words copied one relaxed atomic load or store at a time: another process may be writing them. */
static void load_words(void *dst, const void *src, size_t bytes) {
    uint64_t *d = dst;
    const uint64_t *s = src;
    for (size_t i = 0; i < bytes / 8; i++) d[i] = __atomic_load_n(&s[i], __ATOMIC_RELAXED);
}
static void store_words(void *dst, const void *src, size_t bytes) {
    uint64_t *d = dst;
    const uint64_t *s = src;
    for (size_t i = 0; i < bytes / 8; i++) __atomic_store_n(&d[i], s[i], __ATOMIC_RELAXED);
}

uint64_t kvs_mseg_start_time(int32_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    if (!p) return 0;
    /* after ") ": field 3 (state) ... field 22 (starttime) */
    unsigned long long v = 0;
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ') field++;
    if (field == 22 && sscanf(p, "%llu", &v) == 1) return (uint64_t)v;
    return 0;
}

int kvs_mseg_alive(int32_t pid, uint64_t start) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno != EPERM) return 0;
    uint64_t now = kvs_mseg_start_time(pid);
    return start == 0 || now == 0 || now == start;
}

static int lock_seg(kvs_mseg *seg) {
    struct timespec until = kvs_timespec_after_ms(CLOCK_REALTIME, LOCK_TIMEOUT_MS);
    int rc = pthread_mutex_timedlock(&seg->hdr->lock, &until);
    if (rc == EOWNERDEAD) { /* a process died holding it: the generation tells readers */
        if (seg->hdr->generation & 1)
            __atomic_add_fetch(&seg->hdr->generation, 1, __ATOMIC_RELEASE);
        pthread_mutex_consistent(&seg->hdr->lock);
        rc = 0;
    }
    if (rc != 0) return -1;
    __atomic_add_fetch(&seg->hdr->generation, 1, __ATOMIC_ACQ_REL);
    return 0;
}

static void unlock_seg(kvs_mseg *seg) {
    __atomic_add_fetch(&seg->hdr->generation, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&seg->hdr->lock);
}

static size_t seg_bytes(void) {
    return sizeof(kvs_mseg_header) + (size_t)KVS_MSEG_SLOTS * sizeof(kvs_mseg_slot);
}

static kvs_status init_header(int fd, char *err, size_t err_len, const char *name) {
    if (ftruncate(fd, (off_t)seg_bytes()) != 0)
        return kvs_fmt(err, err_len, "metrics segment %s: cannot size it: %s", name,
                       strerror(errno)),
               KVS_EIO;
    kvs_mseg_header *h = mmap(NULL, seg_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED)
        return kvs_fmt(err, err_len, "metrics segment %s: mmap: %s", name, strerror(errno)),
               KVS_EIO;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock, &a);
    pthread_mutexattr_destroy(&a);
    h->version = KVS_MSEG_VERSION;
    h->header_bytes = (uint32_t)sizeof *h;
    h->slot_bytes = (uint32_t)sizeof(kvs_mseg_slot);
    h->n_slots = KVS_MSEG_SLOTS;
    __atomic_store_n(&h->magic, KVS_MSEG_MAGIC, __ATOMIC_RELEASE); /* last: the header is ready */
    munmap(h, seg_bytes());
    return KVS_OK;
}

/* Holds an flock on fd while a creator sizes the segment, so a second opener waits for the header. */
static int flock_bounded(int fd) {
    uint64_t until = kvs_now_ns() + CREATE_WAIT_MS * 1000000ull;
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK || kvs_now_ns() > until) return -1;
        usleep(1000);
    }
    return 0;
}

kvs_status kvs_mseg_open(const char *name, int create, kvs_mseg *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "/kvstrata-%s", name);
    int fd = shm_open(out->name, create ? O_RDWR | O_CREAT : O_RDONLY, 0600);
    if (fd < 0) {
        if (errno == ENOENT)
            return kvs_fmt(err, err_len,
                           "no metrics segment %s exists yet (no process of the "
                           "instance has opened it)",
                           out->name),
                   KVS_ENOTFOUND;
        return kvs_fmt(err, err_len, "metrics segment %s: %s", out->name, strerror(errno)), KVS_EIO;
    }
    kvs_status st = KVS_OK;
    struct stat sb;
    if (create && flock_bounded(fd) != 0) {
        st = KVS_EIO;
        kvs_fmt(err, err_len, "metrics segment %s: another process holds it being created",
                out->name);
    }
    if (st == KVS_OK && fstat(fd, &sb) != 0) {
        st = KVS_EIO;
        kvs_fmt(err, err_len, "metrics segment %s: %s", out->name, strerror(errno));
    }
    if (st == KVS_OK && sb.st_size == 0 && create) {
        st = init_header(fd, err, err_len, out->name);
        if (st == KVS_OK) sb.st_size = (off_t)seg_bytes();
    }
    if (st == KVS_OK && (size_t)sb.st_size < seg_bytes()) {
        st = KVS_ECORRUPT;
        kvs_fmt(err, err_len,
                "metrics segment %s: %lld bytes, not a kvstrata metrics segment of "
                "version %u",
                out->name, (long long)sb.st_size, KVS_MSEG_VERSION);
    }
    void *map = MAP_FAILED;
    if (st == KVS_OK) {
        map =
            mmap(NULL, seg_bytes(), create ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            st = KVS_EIO;
            kvs_fmt(err, err_len, "metrics segment %s: mmap: %s", out->name, strerror(errno));
        }
    }
    if (create) flock(fd, LOCK_UN);
    close(fd);
    if (st != KVS_OK) return st;
    kvs_mseg_header *h = map;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != KVS_MSEG_MAGIC ||
        h->version != KVS_MSEG_VERSION || h->header_bytes != sizeof *h ||
        h->slot_bytes != sizeof(kvs_mseg_slot) || h->n_slots != KVS_MSEG_SLOTS) {
        munmap(map, seg_bytes());
        return kvs_fmt(err, err_len,
                       "metrics segment %s is not a kvstrata metrics segment of "
                       "version %u (another build's? remove it: rm /dev/shm%s)",
                       out->name, KVS_MSEG_VERSION, out->name),
               KVS_ECORRUPT;
    }
    out->hdr = h;
    out->slots = (kvs_mseg_slot *)((uint8_t *)map + sizeof *h);
    out->map_bytes = seg_bytes();
    out->writable = create;
    return KVS_OK;
}

void kvs_mseg_close(kvs_mseg *seg) {
    if (seg->hdr) munmap(seg->hdr, seg->map_bytes);
    seg->hdr = NULL;
    seg->slots = NULL;
}

void kvs_mseg_unlink(const char *name) {
    char path[KVS_MSEG_NAME_MAX + 16];
    snprintf(path, sizeof path, "/kvstrata-%s", name);
    shm_unlink(path);
}

static int same_identity(const kvs_mseg_values *a, const kvs_mseg_values *b) {
    if (a->kind != b->kind || a->n_tiers != b->n_tiers || strcmp(a->tenant, b->tenant) != 0)
        return 0;
    for (uint32_t t = 0; t < a->n_tiers && t < KVS_MSEG_TIERS; t++)
        if (strcmp(a->tiers[t].name, b->tiers[t].name) != 0) return 0;
    return 1;
}

/* Under the lock: slot i's counters into the retired row of its identity (or it becomes that row). */
static void fold_locked(kvs_mseg *seg, uint32_t i) {
    kvs_mseg_slot *d = &seg->slots[i];
    kvs_mseg_values v;
    load_words(&v, &d->v, sizeof v);
    for (uint32_t t = 0; t < KVS_MSEG_TIERS; t++)
        v.tiers[t].objects = v.tiers[t].bytes = v.tiers[t].capacity = 0; /* gauges leave */
    for (uint32_t r = 0; r < KVS_MSEG_SLOTS; r++) {
        kvs_mseg_slot *row = &seg->slots[r];
        if (r == i || row->state != KVS_MSEG_RETIRED || !same_identity(&row->v, &v)) continue;
        for (int k = 0; k < KVS_MC_COUNT; k++)
            __atomic_add_fetch(&row->v.c[k], v.c[k], __ATOMIC_RELAXED);
        for (uint32_t t = 0; t < v.n_tiers && t < KVS_MSEG_TIERS; t++) {
            kvs_mseg_tier *a = &row->v.tiers[t], *b = &v.tiers[t];
            __atomic_add_fetch(&a->hits, b->hits, __ATOMIC_RELAXED);
            __atomic_add_fetch(&a->hit_tokens, b->hit_tokens, __ATOMIC_RELAXED);
            __atomic_add_fetch(&a->loaded_bytes, b->loaded_bytes, __ATOMIC_RELAXED);
            __atomic_add_fetch(&a->load_ns, b->load_ns, __ATOMIC_RELAXED);
        }
        __atomic_store_n(&d->state, KVS_MSEG_FREE, __ATOMIC_RELEASE);
        return;
    }
    store_words(&d->v, &v, sizeof v);
    d->pid = 0;
    d->start = 0;
    __atomic_store_n(&d->state, KVS_MSEG_RETIRED, __ATOMIC_RELEASE);
}

static int sweep_locked(kvs_mseg *seg) {
    int n = 0;
    for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++) {
        kvs_mseg_slot *s = &seg->slots[i];
        if (s->state == KVS_MSEG_LIVE && !kvs_mseg_alive(s->pid, s->start)) {
            fold_locked(seg, i);
            n++;
        }
    }
    return n;
}

int kvs_mseg_sweep(kvs_mseg *seg) {
    if (!seg->hdr || !seg->writable || lock_seg(seg) != 0) return 0;
    int n = sweep_locked(seg);
    unlock_seg(seg);
    return n;
}

int kvs_mseg_claim(kvs_mseg *seg, const kvs_mseg_values *v) {
    if (!seg->hdr || !seg->writable || lock_seg(seg) != 0) return -1;
    int got = -1;
    for (int pass = 0; pass < 2 && got < 0; pass++) {
        if (pass == 1 && sweep_locked(seg) == 0) break;
        for (uint32_t i = 0; i < KVS_MSEG_SLOTS && got < 0; i++)
            if (seg->slots[i].state == KVS_MSEG_FREE) got = (int)i;
    }
    if (got >= 0) {
        kvs_mseg_slot *s = &seg->slots[got];
        s->pid = (int32_t)getpid();
        s->start = kvs_mseg_start_time(s->pid);
        s->seq = 0;
        store_words(&s->v, v, sizeof *v);
        __atomic_store_n(&s->state, KVS_MSEG_LIVE, __ATOMIC_RELEASE);
    } else if (!seg->hdr->full_logged) {
        seg->hdr->full_logged = 1;
        kvs_log(KVS_LOG_ERROR, KVS_LOG_ERROR,
                "metrics segment %s is full (%u slots: handles, stores and nodes of live "
                "processes, one row per identity of those gone): this one's counters are not "
                "published",
                seg->name, KVS_MSEG_SLOTS);
    }
    unlock_seg(seg);
    return got;
}

void kvs_mseg_publish(kvs_mseg *seg, int slot, const kvs_mseg_values *v) {
    if (!seg->hdr || slot < 0) return;
    kvs_mseg_slot *s = &seg->slots[slot];
    uint64_t q = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&s->seq, q + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    store_words(&s->v, v, sizeof *v);
    __atomic_store_n(&s->seq, q + 2, __ATOMIC_RELEASE);
}

void kvs_mseg_release(kvs_mseg *seg, int slot) {
    if (!seg->hdr || slot < 0 || lock_seg(seg) != 0) return; /* left LIVE: folded once we exit */
    if (seg->slots[slot].state == KVS_MSEG_LIVE) fold_locked(seg, (uint32_t)slot);
    unlock_seg(seg);
}

/* One slot's values as its owner last finished writing them (bounded tries: an owner that died
 * mid-write leaves the seq odd; that copy is then taken as it is). */
static void copy_slot(const kvs_mseg_slot *s, kvs_mseg_slot *out) {
    for (int tries = 0;; tries++) {
        uint64_t a = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
        load_words(&out->v, &s->v, sizeof out->v);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint64_t b = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
        if ((a == b && !(a & 1)) || tries >= SNAPSHOT_TRIES) break;
        sched_yield();
    }
}

int kvs_mseg_snapshot(const kvs_mseg *seg, kvs_mseg_slot *out, uint32_t *processes) {
    for (int tries = 0; tries < SNAPSHOT_TRIES; tries++) {
        uint64_t g0 = __atomic_load_n(&seg->hdr->generation, __ATOMIC_ACQUIRE);
        if (g0 & 1) {
            usleep(100);
            continue;
        }
        uint32_t n_proc = 0;
        int32_t pids[KVS_MSEG_SLOTS];
        for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++) {
            const kvs_mseg_slot *s = &seg->slots[i];
            out[i].state = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
            out[i].pid = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);
            out[i].start = __atomic_load_n(&s->start, __ATOMIC_RELAXED);
            if (out[i].state == KVS_MSEG_FREE) continue;
            copy_slot(s, &out[i]);
            if (out[i].state != KVS_MSEG_LIVE) continue;
            if (!kvs_mseg_alive(out[i].pid, out[i].start)) {
                out[i].state = KVS_MSEG_RETIRED; /* counters stay; gauges go */
                continue;
            }
            int seen = 0;
            for (uint32_t k = 0; k < n_proc && !seen; k++) seen = pids[k] == out[i].pid;
            if (!seen) pids[n_proc++] = out[i].pid;
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&seg->hdr->generation, __ATOMIC_RELAXED) == g0) {
            *processes = n_proc;
            return 0;
        }
    }
    *processes = 0;
    return -1;
}
