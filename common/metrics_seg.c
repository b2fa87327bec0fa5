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
#include "common/process.h"

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

int kvs_mseg_test_exit_in_fold;

uint64_t kvs_mseg_start_time(int32_t pid) {
    return kvs_process_start_time(pid);
}

uint64_t kvs_mseg_own_pidns(void) {
    return kvs_process_own_pid_ns();
}

int kvs_mseg_alive(int32_t pid, uint64_t start, uint64_t pidns) {
    return kvs_process_alive(pid, start, pidns);
}

/* Under the lock: a fold its holder did not finish (it died) is undone, unless it got as far as
 * freeing the folded slot (then it is complete). */
static void recover_fold_locked(kvs_mseg *seg) {
    kvs_mseg_header *h = seg->hdr;
    if (!__atomic_load_n(&h->fold_state, __ATOMIC_ACQUIRE)) return;
    if (h->fold_src < KVS_MSEG_SLOTS && h->fold_dst < KVS_MSEG_SLOTS &&
        __atomic_load_n(&seg->slots[h->fold_src].state, __ATOMIC_ACQUIRE) != KVS_MSEG_FREE)
        store_words(&seg->slots[h->fold_dst].v, &h->fold_undo, sizeof h->fold_undo);
    __atomic_store_n(&h->fold_state, 0, __ATOMIC_RELEASE);
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
    recover_fold_locked(seg);
    return 0;
}

static void unlock_seg(kvs_mseg *seg) {
    __atomic_add_fetch(&seg->hdr->generation, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&seg->hdr->lock);
}

static size_t seg_bytes(void) {
    return sizeof(kvs_mseg_header) + (size_t)KVS_MSEG_SLOTS * sizeof(kvs_mseg_slot);
}

/* Room for every page of the segment, taken now: on tmpfs a page first written through the mapping
 * when /dev/shm is full is a SIGBUS, inside whatever engine call touched it. */
static kvs_status reserve_pages(int fd, const char *name, char *err, size_t err_len) {
    int rc = posix_fallocate(fd, 0, (off_t)seg_bytes());
    if (rc == 0) return KVS_OK;
    return kvs_fmt(err, err_len, "metrics segment %s: no room for its %zu bytes in /dev/shm: %s",
                   name, seg_bytes(), strerror(rc)),
           KVS_ENOMEM;
}

/* Sizes the segment and writes its header, magic last (the flock is held). */
static kvs_status init_header(int fd, char *err, size_t err_len, const char *name) {
    if (ftruncate(fd, (off_t)seg_bytes()) != 0)
        return kvs_fmt(err, err_len, "metrics segment %s: cannot size it: %s", name,
                       strerror(errno)),
               KVS_EIO;
    kvs_status st = reserve_pages(fd, name, err, err_len);
    if (st != KVS_OK) return st;
    kvs_mseg_header *h = mmap(NULL, seg_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED)
        return kvs_fmt(err, err_len, "metrics segment %s: mmap: %s", name, strerror(errno)),
               KVS_EIO;
    memset(h, 0, seg_bytes()); /* what a creator that died half way may have left */
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

/* The header as read(2) gives it: a page never written reads as zeros without taking room. */
static int read_header(int fd, kvs_mseg_header *h) {
    memset(h, 0, sizeof *h);
    ssize_t n = pread(fd, h, sizeof *h, 0);
    return n < 0 ? -1 : 0;
}

static int header_valid(const kvs_mseg_header *h) {
    return h->magic == KVS_MSEG_MAGIC && h->version == KVS_MSEG_VERSION &&
           h->header_bytes == sizeof *h && h->slot_bytes == sizeof(kvs_mseg_slot) &&
           h->n_slots == KVS_MSEG_SLOTS;
}

/* 1 try: *again set when the object was removed while this process waited for it. */
static kvs_status open_once(kvs_mseg *out, int create, int *again, char *err, size_t err_len) {
    *again = 0;
    int created = 0;
    int fd = -1;
    if (create) {
        fd = shm_open(out->name, O_RDWR | O_CREAT | O_EXCL, 0600);
        created = fd >= 0;
        if (fd < 0 && errno == EEXIST) fd = shm_open(out->name, O_RDWR, 0600);
        if (fd < 0 && errno == ENOENT) return *again = 1, KVS_EIO; /* removed meanwhile */
    } else {
        fd = shm_open(out->name, O_RDONLY, 0600);
    }
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
    if (st == KVS_OK && create && sb.st_nlink == 0) { /* a creator that failed removed it */
        close(fd);
        return *again = 1, KVS_EIO;
    }
    kvs_mseg_header hdr;
    if (st == KVS_OK && read_header(fd, &hdr) != 0) {
        st = KVS_EIO;
        kvs_fmt(err, err_len, "metrics segment %s: %s", out->name, strerror(errno));
    }
    /* No magic while this process holds the flock: nobody is creating it, so its creator died (or
     * found no room) before finishing, and it is created again rather than refused for good. */
    if (st == KVS_OK && create && (sb.st_size == 0 || hdr.magic == 0)) {
        st = init_header(fd, err, err_len, out->name);
        if (st == KVS_OK && read_header(fd, &hdr) != 0) st = KVS_EIO;
        if (st == KVS_OK) sb.st_size = (off_t)seg_bytes();
        if (st != KVS_OK) {              /* give the room back; a later opener tries again */
            if (ftruncate(fd, 0) != 0) { /* nothing more to give back */
            }
            if (created) shm_unlink(out->name);
        }
    } else if (st == KVS_OK && create && header_valid(&hdr) && (size_t)sb.st_size >= seg_bytes()) {
        st = reserve_pages(fd, out->name, err, err_len); /* made by a build that did not */
    }
    if (st == KVS_OK && ((size_t)sb.st_size < seg_bytes() || !header_valid(&hdr))) {
        st = KVS_ECORRUPT;
        kvs_fmt(err, err_len,
                "metrics segment %s is not a kvstrata metrics segment of "
                "version %u (another build's? remove it: rm /dev/shm%s)",
                out->name, KVS_MSEG_VERSION, out->name);
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
    out->hdr = map;
    out->slots = (kvs_mseg_slot *)((uint8_t *)map + sizeof *out->hdr);
    out->map_bytes = seg_bytes();
    out->writable = create;
    return KVS_OK;
}

kvs_status kvs_mseg_open(const char *name, int create, kvs_mseg *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "/kvstrata-%s", name);
    kvs_status st = KVS_EIO;
    int again = 1;
    for (int tries = 0; tries < 5 && again; tries++)
        st = open_once(out, create, &again, err, err_len);
    if (again)
        kvs_fmt(err, err_len, "metrics segment %s: removed and created again repeatedly",
                out->name);
    return st;
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

/* Names in the segment are compared within their fields: another process may have left them
 * without a NUL. */
static int same_name(const char *a, const char *b, size_t cap) {
    return strncmp(a, b, cap) == 0;
}

static int same_identity(const kvs_mseg_values *a, const kvs_mseg_values *b) {
    if (a->kind != b->kind || a->n_tiers != b->n_tiers ||
        !same_name(a->tenant, b->tenant, sizeof a->tenant))
        return 0;
    for (uint32_t t = 0; t < a->n_tiers && t < KVS_MSEG_TIERS; t++)
        if (!same_name(a->tiers[t].name, b->tiers[t].name, sizeof a->tiers[t].name)) return 0;
    return 1;
}

static int is_other(const kvs_mseg_values *v) {
    return same_name(v->tenant, KVS_MSEG_OTHER, sizeof v->tenant);
}

/* Rows whose counters render into the same series: the same kind and tenant. */
static int same_group(const kvs_mseg_values *a, const kvs_mseg_values *b) {
    return a->kind == b->kind && same_name(a->tenant, b->tenant, sizeof a->tenant);
}

static uint32_t n_tiers_of(const kvs_mseg_values *v) {
    return v->n_tiers < KVS_MSEG_TIERS ? v->n_tiers : KVS_MSEG_TIERS;
}

static int tier_at(const kvs_mseg_values *v, const char *name) {
    for (uint32_t t = 0; t < n_tiers_of(v); t++)
        if (same_name(v->tiers[t].name, name, sizeof v->tiers[t].name)) return (int)t;
    return -1;
}

/* 1 when src's tiers all have a place in dst merged by name: the ones dst has, and room for the
 * rest short of the last place, which is kept for the catch-all tier (add_counters_locked). */
static int fits(const kvs_mseg_values *dst, const kvs_mseg_values *src) {
    uint32_t have = n_tiers_of(dst), missing = 0;
    for (uint32_t t = 0; t < n_tiers_of(src); t++)
        if (tier_at(dst, src->tiers[t].name) < 0) missing++;
    return have + missing <= KVS_MSEG_TIERS - 1;
}

/* Under the lock: where tier `name` of another row goes in row d merged by name: its own place,
 * a new place, or, past KVS_MSEG_TIERS - 1 names, the catch-all tier KVS_MSEG_OTHER; -1 when d's
 * own tiers fill every place (its counts then stay in the row's whole counters only). */
static int place_locked(kvs_mseg_values *d, const char *name) {
    int at = tier_at(d, name);
    if (at >= 0) return at;
    uint32_t have = n_tiers_of(d);
    const char *as = name;
    if (have >= KVS_MSEG_TIERS - 1) {
        at = tier_at(d, KVS_MSEG_OTHER);
        if (at >= 0 || have == KVS_MSEG_TIERS) return at;
        as = KVS_MSEG_OTHER;
    }
    char buf[KVS_MSEG_NAME_MAX];
    memset(buf, 0, sizeof buf);
    snprintf(buf, sizeof buf, "%.*s", (int)sizeof buf - 1, as);
    store_words(d->tiers[have].name, buf, sizeof buf);
    __atomic_store_n(&d->n_tiers, have + 1, __ATOMIC_RELAXED);
    return (int)have;
}

/* Under the lock: v's counters added to row r. Rows of one identity have the same tiers in the same
 * places; merging rows of another identity (by_name) gathers tiers by name. */
static void add_counters_locked(kvs_mseg *seg, uint32_t r, const kvs_mseg_values *v, int by_name) {
    kvs_mseg_values *d = &seg->slots[r].v;
    for (int k = 0; k < KVS_MC_COUNT; k++) __atomic_add_fetch(&d->c[k], v->c[k], __ATOMIC_RELAXED);
    for (uint32_t t = 0; t < n_tiers_of(v); t++) {
        int at = by_name ? place_locked(d, v->tiers[t].name) : (int)t;
        if (at < 0) continue;
        kvs_mseg_tier *a = &d->tiers[at];
        const kvs_mseg_tier *b = &v->tiers[t];
        __atomic_add_fetch(&a->hits, b->hits, __ATOMIC_RELAXED);
        __atomic_add_fetch(&a->hit_tokens, b->hit_tokens, __ATOMIC_RELAXED);
        __atomic_add_fetch(&a->loaded_bytes, b->loaded_bytes, __ATOMIC_RELAXED);
        __atomic_add_fetch(&a->load_ns, b->load_ns, __ATOMIC_RELAXED);
    }
}

/* Under the lock: slot i's values v added to row r, journaled (recover_fold_locked), then slot i
 * freed: done once even when the process doing it dies anywhere in between. */
static void fold_into_locked(kvs_mseg *seg, uint32_t i, uint32_t r, const kvs_mseg_values *v,
                             int by_name) {
    kvs_mseg_header *h = seg->hdr;
    store_words(&h->fold_undo, &seg->slots[r].v, sizeof h->fold_undo);
    h->fold_src = i;
    h->fold_dst = r;
    __atomic_store_n(&h->fold_state, 1, __ATOMIC_RELEASE);
    add_counters_locked(seg, r, v, by_name);
    if (kvs_mseg_test_exit_in_fold) _exit(9);
    __atomic_store_n(&seg->slots[i].state, KVS_MSEG_FREE, __ATOMIC_RELEASE);
    __atomic_store_n(&h->fold_state, 0, __ATOMIC_RELEASE);
}

/* Under the lock: a retired row other than skip of the kind and tenant of v (whose tiers fit in
 * it, when need_fit), or -1. */
static int group_row_locked(kvs_mseg *seg, const kvs_mseg_values *v, uint32_t skip, int need_fit) {
    for (uint32_t r = 0; r < KVS_MSEG_SLOTS; r++) {
        kvs_mseg_slot *row = &seg->slots[r];
        if (r != skip && row->state == KVS_MSEG_RETIRED && same_group(&row->v, v) &&
            (!need_fit || fits(&row->v, v)))
            return (int)r;
    }
    return -1;
}

/* Under the lock: row i (values v) becomes a retired row as it is. */
static void retire_as_is_locked(kvs_mseg *seg, uint32_t i, const kvs_mseg_values *v) {
    kvs_mseg_slot *d = &seg->slots[i];
    store_words(&d->v, v, sizeof *v);
    d->pid = 0;
    d->start = d->pidns = d->heartbeat = 0;
    __atomic_store_n(&d->state, KVS_MSEG_RETIRED, __ATOMIC_RELEASE);
}

/* Under the lock: slot i (LIVE of a process gone or done, or RETIRED, of a named tenant) merges
 * into its kind's KVS_MSEG_OTHER row where its tiers fit, or becomes one. Rewriting the slot in
 * place is idempotent: redone after a death. */
static void to_other_locked(kvs_mseg *seg, uint32_t i, kvs_mseg_values *v) {
    memset(v->tenant, 0, sizeof v->tenant);
    snprintf(v->tenant, sizeof v->tenant, "%s", KVS_MSEG_OTHER);
    int o = group_row_locked(seg, v, i, 1);
    if (o >= 0) {
        fold_into_locked(seg, i, (uint32_t)o, v, 1);
        return;
    }
    retire_as_is_locked(seg, i, v);
}

/* Under the lock: slot i's counters into the retired row of its identity (or it becomes that row).
 * Past KVS_MSEG_RETIRED_MAX rows: into a row of its kind and tenant its tiers fit in, so no series
 * changes; failing that, a named tenant's go to its kind's KVS_MSEG_OTHER row and a tenant-less
 * row (a node's whole counters) stays a row of its own. */
static void fold_locked(kvs_mseg *seg, uint32_t i) {
    kvs_mseg_slot *d = &seg->slots[i];
    kvs_mseg_values v;
    memset(&v, 0, sizeof v);
    load_words(&v, &d->v, sizeof v);
    if (v.n_tiers > KVS_MSEG_TIERS) v.n_tiers = KVS_MSEG_TIERS;
    for (uint32_t t = 0; t < KVS_MSEG_TIERS; t++) { /* gauges leave */
        v.tiers[t].objects = v.tiers[t].bytes = v.tiers[t].capacity = 0;
        v.tiers[t].usage_known = 0;
    }
    uint32_t retired = 0;
    for (uint32_t r = 0; r < KVS_MSEG_SLOTS; r++) {
        kvs_mseg_slot *row = &seg->slots[r];
        if (r == i || row->state != KVS_MSEG_RETIRED) continue;
        retired++;
        if (!same_identity(&row->v, &v)) continue;
        fold_into_locked(seg, i, r, &v, 0);
        return;
    }
    if (retired >= KVS_MSEG_RETIRED_MAX) {
        int g = group_row_locked(seg, &v, i, 1);
        if (g >= 0) {
            fold_into_locked(seg, i, (uint32_t)g, &v, 1);
            return;
        }
        if (v.tenant[0] && !is_other(&v)) {
            to_other_locked(seg, i, &v);
            return;
        }
    }
    retire_as_is_locked(seg, i, &v);
}

uint64_t kvs_mseg_boottime_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A slot of this pid namespace: its pid is looked up. Another namespace's (its pid means nothing
 * here): its heartbeat, so the slots of a container gone (a restart gets a new namespace) leave. */
static int slot_alive(const kvs_mseg_slot *s) {
    uint64_t own = kvs_mseg_own_pidns();
    if (s->pidns && own && s->pidns != own) {
        uint64_t now = kvs_mseg_boottime_ns(), beat = s->heartbeat;
        return now == 0 || beat >= now || now - beat <= KVS_MSEG_HEARTBEAT_STALE_MS * 1000000ull;
    }
    return kvs_mseg_alive(s->pid, s->start, s->pidns);
}

static int sweep_locked(kvs_mseg *seg) {
    int n = 0;
    for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++) {
        kvs_mseg_slot *s = &seg->slots[i];
        if (s->state == KVS_MSEG_LIVE && !slot_alive(s)) {
            fold_locked(seg, i);
            n++;
        }
    }
    return n;
}

/* Under the lock, no slot free: a retired row merges into another, which frees its slot. In order
 * of preference: two rows of one kind and tenant whose tiers fit together (no series changes); a
 * named tenant's row into its kind's KVS_MSEG_OTHER row (too many tenants to keep); two rows of one
 * kind and tenant whatever their tiers (a tier with no place left counts under the catch-all tier
 * KVS_MSEG_OTHER). 0 when one was freed. */
static int free_a_retired_row_locked(kvs_mseg *seg) {
    for (int pass = 0; pass < 3; pass++)
        for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++) {
            kvs_mseg_slot *s = &seg->slots[i];
            if (s->state != KVS_MSEG_RETIRED) continue;
            kvs_mseg_values v;
            memset(&v, 0, sizeof v);
            load_words(&v, &s->v, sizeof v);
            if (v.n_tiers > KVS_MSEG_TIERS) v.n_tiers = KVS_MSEG_TIERS;
            if (pass == 1) {
                if (!v.tenant[0] || is_other(&v)) continue;
                to_other_locked(seg, i, &v);
            } else {
                int g = group_row_locked(seg, &v, i, pass == 0);
                if (g < 0) continue;
                fold_into_locked(seg, i, (uint32_t)g, &v, 1);
            }
            if (s->state == KVS_MSEG_FREE) return 0;
        }
    return -1;
}

int kvs_mseg_sweep(kvs_mseg *seg) {
    if (!seg->hdr || !seg->writable || lock_seg(seg) != 0) return 0;
    int n = sweep_locked(seg);
    unlock_seg(seg);
    return n;
}

static int find_free_locked(kvs_mseg *seg) {
    for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++)
        if (seg->slots[i].state == KVS_MSEG_FREE) return (int)i;
    return -1;
}

int kvs_mseg_claim(kvs_mseg *seg, const kvs_mseg_values *v) {
    if (!seg->hdr || !seg->writable || lock_seg(seg) != 0) return -1;
    int got = find_free_locked(seg);
    if (got < 0 && sweep_locked(seg) > 0) got = find_free_locked(seg);
    while (got < 0 && free_a_retired_row_locked(seg) == 0) got = find_free_locked(seg);
    if (got >= 0) {
        kvs_mseg_slot *s = &seg->slots[got];
        s->pid = (int32_t)getpid();
        s->start = kvs_mseg_start_time(s->pid);
        s->pidns = kvs_mseg_own_pidns(); /* now: see slot_is_mine */
        s->heartbeat = kvs_mseg_boottime_ns();
        s->seq = 0;
        store_words(&s->v, v, sizeof *v);
        __atomic_store_n(&s->state, KVS_MSEG_LIVE, __ATOMIC_RELEASE);
    } else if (!seg->hdr->full_logged) {
        seg->hdr->full_logged = 1;
        kvs_log(KVS_LOG_ERROR, KVS_LOG_ERROR,
                "metrics segment %s is full (%u slots, taken by the handles, stores and nodes of "
                "live processes): this one's counters are not published",
                seg->name, KVS_MSEG_SLOTS);
    }
    unlock_seg(seg);
    return got;
}

/* The slot is this process's: a child forked after the claim (same mapping, same index) or an
 * owner whose slot was folded (judged dead) must not write into it. The pid namespace is read at
 * each check, never kept from the open: a child forked after unshare(CLONE_NEWPID) inherits the
 * opener's memory but lives in another namespace, where its pid may equal the slot's. */
static int slot_is_mine(const kvs_mseg_slot *s) {
    return __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == KVS_MSEG_LIVE &&
           __atomic_load_n(&s->pid, __ATOMIC_RELAXED) == (int32_t)getpid() &&
           __atomic_load_n(&s->pidns, __ATOMIC_RELAXED) == kvs_mseg_own_pidns();
}

void kvs_mseg_publish(kvs_mseg *seg, int slot, const kvs_mseg_values *v) {
    if (!seg->hdr || !seg->writable || slot < 0 || slot >= (int)KVS_MSEG_SLOTS) return;
    kvs_mseg_slot *s = &seg->slots[slot];
    if (!slot_is_mine(s)) return;
    uint64_t q = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&s->seq, q + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    store_words(&s->v, v, sizeof *v);
    __atomic_store_n(&s->seq, q + 2, __ATOMIC_RELEASE);
}

void kvs_mseg_heartbeat(kvs_mseg *seg, int slot) {
    if (!seg->hdr || !seg->writable || slot < 0 || slot >= (int)KVS_MSEG_SLOTS) return;
    kvs_mseg_slot *s = &seg->slots[slot];
    if (slot_is_mine(s)) __atomic_store_n(&s->heartbeat, kvs_mseg_boottime_ns(), __ATOMIC_RELAXED);
}

void kvs_mseg_release(kvs_mseg *seg, int slot) {
    if (!seg->hdr || slot < 0 || slot >= (int)KVS_MSEG_SLOTS) return;
    if (!slot_is_mine(&seg->slots[slot])) return;
    if (lock_seg(seg) != 0) return; /* left LIVE: folded once we exit */
    if (slot_is_mine(&seg->slots[slot])) fold_locked(seg, (uint32_t)slot);
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

/* One pass over the slots; the number of live processes. */
static uint32_t copy_slots(const kvs_mseg *seg, kvs_mseg_slot *out) {
    uint32_t n_proc = 0;
    int32_t pids[KVS_MSEG_SLOTS];
    uint64_t nss[KVS_MSEG_SLOTS];
    for (uint32_t i = 0; i < KVS_MSEG_SLOTS; i++) {
        const kvs_mseg_slot *s = &seg->slots[i];
        out[i].state = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
        out[i].pid = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);
        out[i].start = __atomic_load_n(&s->start, __ATOMIC_RELAXED);
        out[i].pidns = __atomic_load_n(&s->pidns, __ATOMIC_RELAXED);
        out[i].heartbeat = __atomic_load_n(&s->heartbeat, __ATOMIC_RELAXED);
        if (out[i].state == KVS_MSEG_FREE) continue;
        copy_slot(s, &out[i]);
        if (out[i].state != KVS_MSEG_LIVE) continue;
        if (!slot_alive(&out[i])) {
            out[i].state = KVS_MSEG_RETIRED; /* counters stay; gauges go */
            continue;
        }
        int seen = 0;
        for (uint32_t k = 0; k < n_proc && !seen; k++)
            seen = pids[k] == out[i].pid && nss[k] == out[i].pidns;
        if (!seen) pids[n_proc] = out[i].pid, nss[n_proc++] = out[i].pidns;
    }
    return n_proc;
}

#define STUCK_NS 50000000ull /* a generation odd this long: its lock holder died or stopped */

int kvs_mseg_snapshot(kvs_mseg *seg, kvs_mseg_slot *out, uint32_t *processes) {
    uint64_t odd_since = 0;
    for (int tries = 0; tries < SNAPSHOT_TRIES; tries++) {
        uint64_t g0 = __atomic_load_n(&seg->hdr->generation, __ATOMIC_ACQUIRE);
        int as_is = 0;
        if (g0 & 1) {
            uint64_t now = kvs_now_ns();
            if (!odd_since) odd_since = now;
            if (now - odd_since < STUCK_NS) {
                usleep(100);
                continue;
            }
            if (seg->writable && lock_seg(seg) == 0) { /* the robust lock recovers a dead holder */
                unlock_seg(seg);
                odd_since = 0;
                continue;
            }
            as_is = 1; /* read-only: the copy as it stands, with an unfinished fold undone */
        }
        uint32_t n_proc = copy_slots(seg, out);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&seg->hdr->generation, __ATOMIC_RELAXED) != g0) continue;
        if (as_is && __atomic_load_n(&seg->hdr->fold_state, __ATOMIC_ACQUIRE)) {
            const kvs_mseg_header *h = seg->hdr;
            if (h->fold_src < KVS_MSEG_SLOTS && h->fold_dst < KVS_MSEG_SLOTS &&
                out[h->fold_src].state != KVS_MSEG_FREE)
                load_words(&out[h->fold_dst].v, &h->fold_undo, sizeof h->fold_undo);
        }
        *processes = n_proc;
        return 0;
    }
    *processes = 0;
    return -1;
}
