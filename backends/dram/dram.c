/*
 * dram.c - the DRAM tier (contract in dram.h).
 *
 * Everything lives in one mapping - header, slab table, hash index, slab data - and refers to
 * itself by offsets and slab indices only, so the same bytes are valid at any address in any
 * process that maps them (POSIX shared memory with `shm_name`, an anonymous private mapping
 * otherwise).
 */
#include "dram.h"
#include "common/clock.h"
#include "common/errno_name.h"
#include "common/key.h"
#include "common/log.h"
#include "common/options.h"
#include "common/pace.h"
#include "common/units.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DRAM_MAGIC          0x314d41524453564bULL /* "KVSDRAM1" as little-endian bytes */
#define DRAM_LAYOUT_VERSION 4u
#define DRAM_MAX_ATTACHERS  256u
#define DRAM_PAGE           4096u
#define DRAM_NIL            UINT32_MAX
#define DRAM_MAX_SLABS      (UINT32_MAX / 4u) /* keeps 2 * n_slabs buckets and NIL inside uint32 */
#define DRAM_SHM_NAME_MAX   200
#define DRAM_ATTACH_WAIT_NS (5ull * 1000 * 1000 * 1000)

enum { SLAB_FREE = 0, SLAB_USED = 1, SLAB_RESERVED = 2 };

/* A reservation not committed within this long belongs to a process that died: its slab may be
 * reclaimed when the tier is otherwise full. */
#define DRAM_RESERVE_TIMEOUT_NS (120ull * 1000 * 1000 * 1000)

typedef struct slab_entry {
    kvs_key key;
    uint64_t len;
    uint64_t pin_deadline_ns; /* CLOCK_MONOTONIC; meaningful only while pins > 0 */
    uint32_t pins;
    uint32_t state;      /* SLAB_*; the authority when the tables are rebuilt after a crash */
    uint32_t prev, next; /* LRU neighbours while used; next links the free list while free */
} slab_entry;

/* Where everything sits in the mapping; identical in every process that shares it. */
typedef struct geometry {
    uint64_t slab_bytes, n_slabs, n_buckets;
    uint64_t slab_table_offset, bucket_offset, data_offset, mapping_bytes;
} geometry;

/* One attach of the shared tier: the process and its start time (/proc/PID/stat field 22), so a pid
 * reused by another process never passes for the attacher. pid 0: a free entry. */
typedef struct attacher {
    int32_t pid;
    uint32_t reserved;
    uint64_t
        start_time; /* clock ticks since boot; 0 when /proc could not be read (the pid alone counts) */
    uint64_t pid_ns; /* inode of its /proc/self/ns/pid; 0 when unknown */
} attacher;

typedef struct shared_header {
    uint64_t magic; /* stored last by the creator (release), read first by attachers (acquire) */
    uint32_t layout_version;
    uint32_t dead; /* set by the last destroy before it unlinks; an attacher that sees it retries */
    geometry geo;
    uint64_t n_objects, object_bytes;
    uint32_t lru_head, lru_tail; /* head = most recently used */
    uint32_t free_head;
    uint32_t attach_count;       /* live entries of attachers, after the last reap */
    uint32_t reserve_generation; /* bumped per reservation: tickets carry it */
    pthread_mutex_t mutex;       /* process-shared and robust */
    attacher attachers[DRAM_MAX_ATTACHERS];
} shared_header;

/* Process-local view of one tier. */
typedef struct dram_state {
    char tier_name[96];
    char shm_path[DRAM_SHM_NAME_MAX + 2]; /* "/<shm_name>", or "" when private */
    uint64_t max_object_bytes;
    uint64_t mapping_bytes;
    shared_header *header; /* start of the mapping */
    slab_entry *slabs;
    uint32_t *buckets; /* slab index, or DRAM_NIL for an empty bucket */
    uint8_t *data;
    void *host_ctx;
    void (*log)(void *ctx, int level, const char *message);
    void (*on_evict)(void *ctx, const kvs_key *key, const void *object, uint64_t len);
    /* read pacing (options read_bandwidth, read_latency_us): reads are served one after another at
     * this rate, so the tier stands for a slower device in benchmarks and tests */
    uint64_t pace_bytes_per_s, pace_latency_us, pace_latency_ns;
    kvs_pace pace;
    uint32_t attach_slot; /* our entry in header->attachers (shared tiers) */
    char error[512];
} dram_state;

/* ---- small helpers ------------------------------------------------------------------------- */

static void set_error(dram_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(dram_state *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_vfmt_tier(st->error, sizeof st->error, "dram", st->tier_name, fmt, ap);
    va_end(ap);
}

static void log_message(dram_state *st, int level, const char *message) {
    if (st->log) st->log(st->host_ctx, level, message);
}

static uint64_t round_up(uint64_t v, uint64_t align) {
    return (v + align - 1) / align * align;
}

static uint8_t *slab_data(const dram_state *st, uint32_t s) {
    return st->data + (uint64_t)s * st->header->geo.slab_bytes;
}

/* ---- hash index: linear probing, backward-shift deletion (no tombstones) ------------------- */

static uint32_t index_find(const dram_state *st, const kvs_key *key, uint64_t *bucket_out) {
    uint64_t mask = st->header->geo.n_buckets - 1;
    for (uint64_t b = kvs_key_hash(key) & mask;; b = (b + 1) & mask) {
        uint32_t s = st->buckets[b];
        if (s == DRAM_NIL) return DRAM_NIL;
        if (memcmp(&st->slabs[s].key, key, sizeof *key) == 0) {
            if (bucket_out) *bucket_out = b;
            return s;
        }
    }
}

static void index_insert(dram_state *st, uint32_t s) {
    uint64_t mask = st->header->geo.n_buckets - 1;
    uint64_t b = kvs_key_hash(&st->slabs[s].key) & mask;
    while (st->buckets[b] != DRAM_NIL) b = (b + 1) & mask;
    st->buckets[b] = s;
}

static void index_erase(dram_state *st, uint64_t hole) {
    uint64_t mask = st->header->geo.n_buckets - 1;
    for (uint64_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
        uint32_t s = st->buckets[j];
        if (s == DRAM_NIL) break;
        uint64_t home = kvs_key_hash(&st->slabs[s].key) & mask;
        /* Move the entry back unless its home lies cyclically in (hole, j]. */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            st->buckets[hole] = s;
            hole = j;
        }
    }
    st->buckets[hole] = DRAM_NIL;
}

/* ---- LRU list and slab lifecycle ------------------------------------------------------------ */

static void lru_unlink(dram_state *st, uint32_t s) {
    shared_header *h = st->header;
    slab_entry *e = &st->slabs[s];
    if (e->prev != DRAM_NIL)
        st->slabs[e->prev].next = e->next;
    else
        h->lru_head = e->next;
    if (e->next != DRAM_NIL)
        st->slabs[e->next].prev = e->prev;
    else
        h->lru_tail = e->prev;
    e->prev = e->next = DRAM_NIL;
}

static void lru_push_head(dram_state *st, uint32_t s) {
    shared_header *h = st->header;
    slab_entry *e = &st->slabs[s];
    e->prev = DRAM_NIL;
    e->next = h->lru_head;
    if (h->lru_head != DRAM_NIL)
        st->slabs[h->lru_head].prev = s;
    else
        h->lru_tail = s;
    h->lru_head = s;
}

static void lru_touch(dram_state *st, uint32_t s) {
    if (st->header->lru_head == s) return;
    lru_unlink(st, s);
    lru_push_head(st, s);
}

/* A slab counts as pinned iff pins > 0 and the deadline has not passed. An expired pin is cleared
 * when seen, so a process that crashed holding a pin cannot keep the object forever. */
static int slab_pinned(slab_entry *e, uint64_t now) {
    if (e->pins == 0) return 0;
    if (now < e->pin_deadline_ns) return 1;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    return 0;
}

static void free_list_push(dram_state *st, uint32_t s) {
    slab_entry *e = &st->slabs[s];
    __atomic_store_n(&e->state, (uint32_t)SLAB_FREE, __ATOMIC_RELEASE);
    e->len = 0;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    e->prev = DRAM_NIL;
    e->next = st->header->free_head;
    st->header->free_head = s;
}

static void drop_object(dram_state *st, uint32_t s, uint64_t bucket) {
    shared_header *h = st->header;
    index_erase(st, bucket);
    lru_unlink(st, s);
    h->n_objects--;
    h->object_bytes -= st->slabs[s].len;
    free_list_push(st, s);
}

/* A free slab, or the least recently used unpinned one after handing its object to on_evict. */
static uint32_t take_slab(dram_state *st, uint64_t now) {
    shared_header *h = st->header;
    for (uint32_t s = h->lru_tail; h->free_head == DRAM_NIL && s != DRAM_NIL;
         s = st->slabs[s].prev) {
        slab_entry *e = &st->slabs[s];
        if (slab_pinned(e, now)) continue;
        if (st->on_evict) st->on_evict(st->host_ctx, &e->key, slab_data(st, s), e->len);
        uint64_t bucket = 0;
        if (index_find(st, &e->key, &bucket) == s) drop_object(st, s, bucket);
        break;
    }
    if (h->free_head == DRAM_NIL) {
        /* Last resort: a reservation its process never committed. */
        for (uint64_t i = 0; i < h->geo.n_slabs; i++) {
            slab_entry *e = &st->slabs[i];
            if (e->state == SLAB_RESERVED && now > e->pin_deadline_ns) {
                free_list_push(st, (uint32_t)i);
                break;
            }
        }
    }
    uint32_t s = h->free_head;
    if (s != DRAM_NIL) h->free_head = st->slabs[s].next;
    return s;
}

/* Rebuild index, LRU, free list and counts from the slab states after a process died holding the
 * lock mid-update. LRU order is lost; the objects are kept. A slab whose bytes were being written
 * is still free (state is set after the copy); a torn replace fails the connector's checksum. */
static void repair_tables(dram_state *st) {
    shared_header *h = st->header;
    for (uint64_t b = 0; b < h->geo.n_buckets; b++) st->buckets[b] = DRAM_NIL;
    h->lru_head = h->lru_tail = h->free_head = DRAM_NIL;
    h->n_objects = h->object_bytes = 0;
    for (uint64_t i = h->geo.n_slabs; i-- > 0;) {
        uint32_t s = (uint32_t)i;
        slab_entry *e = &st->slabs[s];
        if (e->state == SLAB_USED && e->len <= h->geo.slab_bytes &&
            index_find(st, &e->key, NULL) == DRAM_NIL) {
            index_insert(st, s);
            lru_push_head(st, s);
            h->n_objects++;
            h->object_bytes += e->len;
        } else {
            free_list_push(st, s);
        }
    }
}

static kvs_status lock_tier(dram_state *st) {
    int rc = pthread_mutex_lock(&st->header->mutex);
    if (rc == 0) return KVS_OK;
    if (rc == EOWNERDEAD) {
        repair_tables(st);
        pthread_mutex_consistent(&st->header->mutex);
        char message[256];
        snprintf(message, sizeof message,
                 "dram tier \"%s\": a process died holding the tier's lock; tables rebuilt",
                 st->tier_name);
        log_message(st, KVS_LOG_WARN, message);
        return KVS_OK;
    }
    set_error(st, "its lock cannot be taken (%s)", kvs_errno_name(rc));
    return KVS_EIO;
}

static void unlock_tier(dram_state *st) {
    pthread_mutex_unlock(&st->header->mutex);
}

/* ---- create / attach / destroy -------------------------------------------------------------- */

/* A process's start time and whether it has exited (a zombie counts as gone). 0, or -1 when its
 * /proc entry cannot be read (no such process, or no /proc). */
static int process_start(pid_t pid, uint64_t *start_time, int *exited) {
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return -1;
    text[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses, so count from the last ')'. */
    char *p = strrchr(text, ')');
    if (!p || p[1] != ' ') return -1;
    p += 2;
    *exited = *p == 'Z' || *p == 'X';
    for (int field = 3; field < 22; field++) { /* field 3 is the state; 22 the start time */
        p = strchr(p, ' ');
        if (!p) return -1;
        p++;
    }
    char *end = NULL;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p) return -1;
    *start_time = v;
    return 0;
}

/* The inode naming this process's pid namespace, or 0 when /proc cannot say. */
static uint64_t own_pid_ns(void) {
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

/* With the lock held: is entry a still the process that attached? An attacher in another pid
 * namespace (containers sharing /dev/shm) cannot be looked up by its pid from here, so it counts as
 * alive: its memory is never unlinked under it (it stays counted until it detaches). */
static int attacher_alive(const attacher *a) {
    if (a->pid <= 0) return 0;
    uint64_t ns = own_pid_ns();
    if (a->pid_ns && ns && a->pid_ns != ns) return 1;
    if (kill(a->pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t start = 0;
    int exited = 0;
    if (process_start(a->pid, &start, &exited) != 0)
        return 1; /* it exists but cannot be inspected */
    return !exited && (a->start_time == 0 || start == a->start_time);
}

/* With the lock held: free the entries of attachers that died without detaching (kill -9, a crash)
 * and recount the live ones. */
static void reap_attachers(dram_state *st) {
    shared_header *h = st->header;
    uint32_t live = 0, reaped = 0;
    for (uint32_t i = 0; i < DRAM_MAX_ATTACHERS; i++) {
        attacher *a = &h->attachers[i];
        if (a->pid == 0) continue;
        if (attacher_alive(a)) {
            live++;
        } else {
            memset(a, 0, sizeof *a);
            reaped++;
        }
    }
    h->attach_count = live;
    if (reaped) {
        char message[256];
        snprintf(message, sizeof message,
                 "dram tier \"%s\": %u process(es) that attached %s died without "
                 "detaching; no longer counted",
                 st->tier_name, reaped, st->shm_path);
        log_message(st, KVS_LOG_INFO, message);
    }
}

/* With the lock held: count this process in. KVS_OK, or KVS_EIO with the error set. */
static kvs_status add_attacher(dram_state *st) {
    shared_header *h = st->header;
    uint64_t start = 0; /* 0 where /proc cannot be read: the pid alone then says whether we live */
    int exited = 0;
    if (process_start(getpid(), &start, &exited) != 0) start = 0;
    reap_attachers(st);
    for (uint32_t i = 0; i < DRAM_MAX_ATTACHERS; i++) {
        if (h->attachers[i].pid != 0) continue;
        h->attachers[i] =
            (attacher){.pid = (int32_t)getpid(), .start_time = start, .pid_ns = own_pid_ns()};
        st->attach_slot = i;
        h->attach_count++;
        return KVS_OK;
    }
    set_error(st, "shared memory \"%s\" has %u live attachments already, the most it tracks",
              st->shm_path, DRAM_MAX_ATTACHERS);
    return KVS_EIO;
}

static int valid_shm_name(const char *name) {
    static const char allowed[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
    size_t n = strlen(name);
    return n > 0 && n <= DRAM_SHM_NAME_MAX && strspn(name, allowed) == n && strcmp(name, ".") &&
           strcmp(name, "..");
}

static int parse_shm_name(const char *value, void *out, uint64_t nth, char *why, size_t why_len) {
    dram_state *st = out;
    (void)nth;
    if (!valid_shm_name(value)) {
        snprintf(why, why_len,
                 "shm_name \"%.100s\" is not a valid name (1 to %d characters of "
                 "A-Z a-z 0-9 _ . -)",
                 value, DRAM_SHM_NAME_MAX);
        return -1;
    }
    snprintf(st->shm_path, sizeof st->shm_path, "/%s", value);
    return 0;
}

/* The options, by name, and where each goes in the tier's state. */
static const kvs_option_desc OPTIONS[] = {
    {.name = "shm_name", .kind = KVS_OPTION_CUSTOM, .parse = parse_shm_name},
    {.name = "read_bandwidth",
     .kind = KVS_OPTION_RATE,
     KVS_OPTION_FIELD(dram_state, pace_bytes_per_s),
     .min = 1,
     .example = "200MiB/s"},
    {.name = "read_latency_us",
     .kind = KVS_OPTION_MICROSECONDS,
     KVS_OPTION_FIELD(dram_state, pace_latency_us),
     .max = 10000000ull},
};

static kvs_status parse_options(dram_state *st, const kvs_backend_init *init) {
    char why[400], refused[96];
    kvs_status rc =
        kvs_options_parse(OPTIONS, sizeof OPTIONS / sizeof OPTIONS[0], init->options,
                          init->n_options, st, NULL, why, sizeof why, refused, sizeof refused);
    if (rc != KVS_OK) {
        set_error(st, "%s", why);
        kvs_option_refused(init, refused, -1);
        return rc;
    }
    st->pace_latency_ns = st->pace_latency_us * 1000ull;
    return KVS_OK;
}

/* A paced tier: a read of len bytes waits its turn on the modelled device, then for its own time. */
static void pace_read(dram_state *st, uint64_t len) {
    if (st->pace_bytes_per_s || st->pace_latency_ns)
        kvs_pace_wait(&st->pace, kvs_now_ns(),
                      kvs_pace_cost_ns(len, st->pace_bytes_per_s, st->pace_latency_ns));
}

static kvs_status plan_geometry(dram_state *st, uint64_t capacity_bytes, geometry *g) {
    char cap[32], obj[32], slab[32];
    if (st->max_object_bytes == 0 || st->max_object_bytes > UINT64_MAX / 2) {
        set_error(st, "max_object_bytes %llu is not a usable object size",
                  (unsigned long long)st->max_object_bytes);
        return KVS_EINVAL;
    }
    if (capacity_bytes == 0) {
        set_error(st, "needs a capacity (YAML key `capacity`)");
        return KVS_ECONFIG;
    }
    memset(g, 0, sizeof *g);
    g->slab_bytes = round_up(st->max_object_bytes, DRAM_PAGE);
    g->n_slabs = capacity_bytes / g->slab_bytes;
    kvs_fmt_bytes(cap, sizeof cap, capacity_bytes);
    kvs_fmt_bytes(obj, sizeof obj, st->max_object_bytes);
    kvs_fmt_bytes(slab, sizeof slab, g->slab_bytes);
    if (g->n_slabs == 0) {
        set_error(st, "capacity %s holds no object of %s", cap, obj);
        return KVS_ECONFIG;
    }
    if (g->n_slabs > DRAM_MAX_SLABS) {
        set_error(st, "capacity %s is %llu slabs of %s; at most %u are supported", cap,
                  (unsigned long long)g->n_slabs, slab, DRAM_MAX_SLABS);
        return KVS_ECONFIG;
    }
    g->n_buckets = 1;
    while (g->n_buckets < 2 * g->n_slabs) g->n_buckets <<= 1;
    g->slab_table_offset = round_up(sizeof(shared_header), 64);
    g->bucket_offset = g->slab_table_offset + g->n_slabs * sizeof(slab_entry);
    g->data_offset = round_up(g->bucket_offset + g->n_buckets * sizeof(uint32_t), DRAM_PAGE);
    g->mapping_bytes = g->data_offset + g->n_slabs * g->slab_bytes;
    if (g->mapping_bytes < g->data_offset) {
        set_error(st, "capacity %s does not fit in an address space", cap);
        return KVS_ECONFIG;
    }
    return KVS_OK;
}

static void bind_views(dram_state *st, void *base, const geometry *g) {
    st->header = base;
    st->slabs = (slab_entry *)((uint8_t *)base + g->slab_table_offset);
    st->buckets = (uint32_t *)((uint8_t *)base + g->bucket_offset);
    st->data = (uint8_t *)base + g->data_offset;
    st->mapping_bytes = g->mapping_bytes;
}

/* Fill a fresh, zeroed mapping; everything but the magic. */
static kvs_status init_layout(dram_state *st, const geometry *g) {
    shared_header *h = st->header;
    h->layout_version = DRAM_LAYOUT_VERSION;
    h->geo = *g;
    repair_tables(st); /* on the zeroed (all free) slabs: the empty index, LRU and free list */

    pthread_mutexattr_t attr;
    int rc = pthread_mutexattr_init(&attr);
    if (rc == 0) {
        rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
        if (rc == 0) rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
        if (rc == 0) rc = pthread_mutex_init(&h->mutex, &attr);
        pthread_mutexattr_destroy(&attr);
    }
    if (rc != 0) {
        set_error(st, "cannot make its process-shared lock (%s)", kvs_errno_name(rc));
        return KVS_EIO;
    }
    return st->shm_path[0] ? add_attacher(st)
                           : KVS_OK; /* nobody else sees it yet: no lock needed */
}

/* First opener (or the only one, with fd < 0 for a private tier): size and reserve the shared
 * object, so a full /dev/shm fails here and not as SIGBUS inside a put; map, initialise, and
 * publish by storing the magic last. Takes ownership of fd and unlinks the name on failure. */
static kvs_status create_layout(dram_state *st, const geometry *g, int fd) {
    char size[32];
    const char *what = fd >= 0 ? st->shm_path : "(private)";
    kvs_status rc = KVS_ENOMEM;
    void *base = MAP_FAILED;
    kvs_fmt_bytes(size, sizeof size, g->mapping_bytes);
    if (fd >= 0 && ftruncate(fd, (off_t)g->mapping_bytes) != 0) {
        set_error(st, "cannot size shared memory \"%s\" to %s (%s)", what, size,
                  kvs_errno_name(errno));
        goto fail;
    }
    int err = fd >= 0 ? posix_fallocate(fd, 0, (off_t)g->mapping_bytes) : 0;
    if (err != 0) {
        set_error(st, "shared memory \"%s\" cannot hold %s (%s); is /dev/shm large enough?", what,
                  size, kvs_errno_name(err));
        goto fail;
    }
    int flags = fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    base = mmap(NULL, g->mapping_bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (base == MAP_FAILED) {
        set_error(st, "cannot map %s of memory for %s (%s)", size, what, kvs_errno_name(errno));
        goto fail;
    }
    bind_views(st, base, g);
    rc = init_layout(st, g);
    if (rc != KVS_OK) goto fail;
    __atomic_store_n(&st->header->magic, DRAM_MAGIC, __ATOMIC_RELEASE);
    if (fd >= 0) close(fd);
    return KVS_OK;

fail:
    if (base != MAP_FAILED) munmap(base, g->mapping_bytes);
    st->header = NULL;
    if (fd >= 0) {
        shm_unlink(st->shm_path);
        close(fd);
    }
    return rc;
}

/* Later opener: wait (bounded) for the creator to publish, check the geometry, count ourselves in.
 * The creator sizes the object in one ftruncate, so a non-empty object has its final size.
 * KVS_EAGAIN when its last user is unlinking it (the caller reopens by name). Takes fd. */
static kvs_status attach_shared(dram_state *st, const geometry *g, int fd) {
    uint64_t deadline = kvs_now_ns() + DRAM_ATTACH_WAIT_NS, mapped = 0;
    kvs_status rc = KVS_EIO;
    shared_header *h = MAP_FAILED;
    while (h == MAP_FAILED || __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != DRAM_MAGIC) {
        struct stat sb;
        if (h == MAP_FAILED && fstat(fd, &sb) != 0) {
            set_error(st, "cannot inspect shared memory \"%s\" (%s)", st->shm_path,
                      kvs_errno_name(errno));
            goto fail;
        }
        if (h == MAP_FAILED && (uint64_t)sb.st_size >= sizeof *h) {
            mapped = (uint64_t)sb.st_size;
            h = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (h == MAP_FAILED) {
                set_error(st, "cannot map shared memory \"%s\" (%s)", st->shm_path,
                          kvs_errno_name(errno));
                rc = KVS_ENOMEM;
                goto fail;
            }
            continue;
        }
        if (kvs_now_ns() > deadline) {
            set_error(st,
                      "shared memory \"%s\" exists but was never initialised (its creator "
                      "may have died); remove /dev/shm%s",
                      st->shm_path, st->shm_path);
            goto fail;
        }
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    if (h->layout_version != DRAM_LAYOUT_VERSION || memcmp(&h->geo, g, sizeof *g) != 0 ||
        mapped < g->mapping_bytes) {
        char theirs[32], ours[32];
        kvs_fmt_bytes(theirs, sizeof theirs, h->geo.slab_bytes);
        kvs_fmt_bytes(ours, sizeof ours, g->slab_bytes);
        set_error(st,
                  "shared memory \"%s\" holds %llu slabs of %s (layout %u) but this tier asks "
                  "for %llu slabs of %s (layout %u); capacity and max object size must agree "
                  "in every process",
                  st->shm_path, (unsigned long long)h->geo.n_slabs, theirs, h->layout_version,
                  (unsigned long long)g->n_slabs, ours, DRAM_LAYOUT_VERSION);
        rc = KVS_ECONFIG;
        goto fail;
    }
    bind_views(st, h, g);
    rc = lock_tier(st);
    if (rc != KVS_OK) goto fail;
    if (h->dead) {
        unlock_tier(st);
        rc = KVS_EAGAIN;
        goto fail;
    }
    rc = add_attacher(st);
    unlock_tier(st);
    if (rc != KVS_OK) goto fail;
    st->mapping_bytes = mapped;
    close(fd);
    return KVS_OK;

fail:
    if (h != MAP_FAILED) munmap(h, mapped);
    st->header = NULL;
    close(fd);
    return rc;
}

/* Create or attach by name. The name can disappear between our calls while its last user leaves,
 * so retry, bounded by time rather than by count. */
static kvs_status open_shared(dram_state *st, const geometry *g) {
    for (uint64_t deadline = kvs_now_ns() + DRAM_ATTACH_WAIT_NS; kvs_now_ns() < deadline;) {
        int fd = shm_open(st->shm_path, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) return create_layout(st, g, fd);
        if (errno != EEXIST) {
            set_error(st, "cannot create shared memory \"%s\" (%s)", st->shm_path,
                      kvs_errno_name(errno));
            return KVS_EIO;
        }
        fd = shm_open(st->shm_path, O_RDWR, 0);
        if (fd < 0) {
            if (errno == ENOENT) continue; /* its last user unlinked it in between */
            set_error(st, "cannot open shared memory \"%s\" (%s)", st->shm_path,
                      kvs_errno_name(errno));
            return KVS_EIO;
        }
        kvs_status rc = attach_shared(st, g, fd);
        if (rc != KVS_EAGAIN) return rc;
    }
    set_error(st, "shared memory \"%s\" kept vanishing while it was being opened", st->shm_path);
    return KVS_EIO;
}

static kvs_status dram_create(const kvs_backend_init *init, void **out) {
    if (!init || !out) return KVS_EINVAL;
    *out = NULL;
    if (init->struct_size < offsetof(kvs_backend_init, staging_base)) return KVS_EVERSION;
    dram_state *st = calloc(1, sizeof *st);
    if (!st) {
        kvs_create_error(init, "dram tier: out of memory for its state");
        return KVS_ENOMEM;
    }
    snprintf(st->tier_name, sizeof st->tier_name, "%s", init->tier_name ? init->tier_name : "dram");
    kvs_pace_init(&st->pace);
    st->max_object_bytes = init->max_object_bytes;
    const kvs_backend_host *host = init->host;
    if (host) {
        st->host_ctx = host->ctx;
        if (host->struct_size >= offsetof(kvs_backend_host, log) + sizeof host->log)
            st->log = host->log;
        if (host->struct_size >= offsetof(kvs_backend_host, on_evict) + sizeof host->on_evict)
            st->on_evict = host->on_evict;
    }
    geometry g;
    kvs_status rc = KVS_EINVAL;
    if (init->n_options && !init->options) {
        set_error(st, "n_options is %llu but options is NULL", (unsigned long long)init->n_options);
        goto fail;
    }
    rc = parse_options(st, init);
    if (rc != KVS_OK) goto fail;
    rc = plan_geometry(st, init->capacity_bytes, &g);
    if (rc == KVS_ECONFIG) kvs_option_refused(init, "capacity", -1);
    if (rc != KVS_OK) goto fail;
    rc = st->shm_path[0] ? open_shared(st, &g) : create_layout(st, &g, -1);
    if (rc == KVS_ECONFIG)
        kvs_option_refused(init, "capacity", -1); /* the shared geometry differs */
    if (rc != KVS_OK) goto fail;
    /* Large pages for the slab data where the kernel allows it; a refusal costs only speed. */
    madvise(st->data, g.n_slabs * g.slab_bytes, MADV_HUGEPAGE);
    *out = st;
    return KVS_OK;

fail:
    kvs_create_error(init, st->error);
    kvs_pace_destroy(&st->pace);
    free(st);
    return rc;
}

static void dram_destroy(void *state) {
    dram_state *st = state;
    if (!st) return;
    if (st->shm_path[0]) {
        /* Unlink under the lock with `dead` set, so a concurrent attacher either counted itself in
         * before us or sees `dead` and reopens by name. */
        if (lock_tier(st) == KVS_OK) {
            shared_header *h = st->header;
            attacher *mine = &h->attachers[st->attach_slot];
            /* A process forked from an attacher may destroy the handle it inherited: only the
             * attacher itself gives its entry back. */
            if (mine->pid == (int32_t)getpid()) memset(mine, 0, sizeof *mine);
            reap_attachers(st);
            if (h->attach_count == 0) {
                h->dead = 1;
                shm_unlink(st->shm_path);
            }
            unlock_tier(st);
        }
    } else {
        pthread_mutex_destroy(&st->header->mutex);
    }
    munmap(st->header, st->mapping_bytes);
    kvs_pace_destroy(&st->pace);
    free(st);
}

static const char *dram_last_error(void *state) {
    dram_state *st = state;
    return st ? st->error : "";
}

/* ---- operations ----------------------------------------------------------------------------- */

static kvs_status dram_contains(void *state, const kvs_key *keys, uint64_t n, uint64_t *n_present) {
    dram_state *st = state;
    if (!st || (!keys && n) || !n_present) return KVS_EINVAL;
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    uint64_t i = 0;
    while (i < n && index_find(st, &keys[i], NULL) != DRAM_NIL) i++;
    unlock_tier(st);
    *n_present = i;
    return KVS_OK;
}

static kvs_status dram_pin(void *state, const kvs_key *keys, uint64_t n, uint64_t timeout_ms,
                           uint64_t *n_pinned) {
    dram_state *st = state;
    if (!st || (!keys && n) || !n_pinned) return KVS_EINVAL;
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    uint64_t now = kvs_now_ns();
    uint64_t room_ms = (UINT64_MAX - now) / 1000000ull;
    uint64_t deadline = now + (timeout_ms < room_ms ? timeout_ms : room_ms) * 1000000ull;
    uint64_t i = 0;
    for (; i < n; i++) {
        uint32_t s = index_find(st, &keys[i], NULL);
        if (s == DRAM_NIL) break;
        slab_entry *e = &st->slabs[s];
        slab_pinned(e, now); /* clears an expired pin before this one nests on it */
        if (e->pins < UINT32_MAX) e->pins++;
        if (deadline > e->pin_deadline_ns) e->pin_deadline_ns = deadline;
    }
    unlock_tier(st);
    *n_pinned = i;
    return KVS_OK;
}

static kvs_status dram_unpin(void *state, const kvs_key *keys, uint64_t n) {
    dram_state *st = state;
    if (!st || (!keys && n)) return KVS_EINVAL;
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    uint64_t now = kvs_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        uint32_t s = index_find(st, &keys[i], NULL);
        if (s == DRAM_NIL) continue;
        slab_entry *e = &st->slabs[s];
        if (!slab_pinned(e, now)) continue; /* none held, or expired: unpinning is a no-op */
        if (--e->pins == 0) e->pin_deadline_ns = 0;
    }
    unlock_tier(st);
    return KVS_OK;
}

/* Takes the lock and finds key for a read; on KVS_OK the lock is held and *slab is set. */
static kvs_status lock_and_find(dram_state *st, const kvs_key *key, uint32_t *slab) {
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    *slab = index_find(st, key, NULL);
    if (*slab != DRAM_NIL) return KVS_OK;
    set_error(st, "object not stored");
    unlock_tier(st);
    return KVS_ENOTFOUND;
}

static kvs_status dram_get(void *state, const kvs_key *key, void *dst, uint64_t cap,
                           uint64_t *len) {
    dram_state *st = state;
    uint32_t s = DRAM_NIL;
    if (!st || !key || !len || (!dst && cap)) return KVS_EINVAL;
    kvs_status rc = lock_and_find(st, key, &s);
    if (rc != KVS_OK) return rc;
    *len = st->slabs[s].len;
    if (cap < *len) {
        set_error(st, "object of %llu bytes does not fit a buffer of %llu bytes",
                  (unsigned long long)*len, (unsigned long long)cap);
        rc = KVS_EOVERFLOW;
    } else {
        if (*len) memcpy(dst, slab_data(st, s), *len);
        lru_touch(st, s);
    }
    unlock_tier(st);
    if (rc == KVS_OK) pace_read(st, *len);
    return rc;
}

static kvs_status dram_get_range(void *state, const kvs_key *key, uint64_t offset, uint64_t len,
                                 void *dst, uint64_t *got, uint64_t *object_len) {
    dram_state *st = state;
    uint32_t s = DRAM_NIL;
    if (!st || !key || !got || !object_len || (!dst && len)) return KVS_EINVAL;
    kvs_status rc = lock_and_find(st, key, &s);
    if (rc != KVS_OK) return rc;
    *object_len = st->slabs[s].len;
    *got = offset >= *object_len ? 0 : (len < *object_len - offset ? len : *object_len - offset);
    if (*got) memcpy(dst, slab_data(st, s) + offset, *got);
    lru_touch(st, s);
    unlock_tier(st);
    pace_read(st, *got);
    return KVS_OK;
}

static kvs_status dram_get_ref(void *state, const kvs_key *key, const void **object,
                               uint64_t *len) {
    dram_state *st = state;
    uint32_t s = DRAM_NIL;
    if (!st || !key || !object || !len) return KVS_EINVAL;
    kvs_status rc = lock_and_find(st, key, &s);
    if (rc != KVS_OK) return rc;
    *object = slab_data(st, s);
    *len = st->slabs[s].len;
    lru_touch(st, s);
    unlock_tier(st);
    pace_read(st, *len);
    return KVS_OK;
}

static kvs_status dram_put(void *state, const kvs_key *key, const void *object, uint64_t len) {
    dram_state *st = state;
    if (!st || !key || (!object && len)) return KVS_EINVAL;
    if (len > st->max_object_bytes) {
        char got[32], max[32];
        kvs_fmt_bytes(got, sizeof got, len);
        kvs_fmt_bytes(max, sizeof max, st->max_object_bytes);
        set_error(st, "object of %s is larger than the tier's max object size %s", got, max);
        return KVS_EINVAL;
    }
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    shared_header *h = st->header;
    uint64_t now = kvs_now_ns();
    uint64_t bucket = 0;
    uint32_t s = index_find(st, key, &bucket);
    if (s != DRAM_NIL) {
        if (slab_pinned(&st->slabs[s], now)) {
            /* A reader may hold a reference to these bytes, and equal keys carry equal content. */
            lru_touch(st, s);
            unlock_tier(st);
            return KVS_OK;
        }
        drop_object(st, s, bucket); /* its slab is now the free-list head and is reused below */
    }
    s = take_slab(st, now);
    if (s == DRAM_NIL) {
        set_error(st, "all %llu objects are pinned; no room for another",
                  (unsigned long long)h->geo.n_slabs);
        unlock_tier(st);
        return KVS_ENOMEM;
    }
    slab_entry *e = &st->slabs[s];
    if (len) memcpy(slab_data(st, s), object, len);
    e->key = *key;
    e->len = len;
    e->pins = 0;
    e->pin_deadline_ns = 0;
    __atomic_store_n(&e->state, (uint32_t)SLAB_USED, __ATOMIC_RELEASE); /* only after the bytes */
    index_insert(st, s);
    lru_push_head(st, s);
    h->n_objects++;
    h->object_bytes += len;
    unlock_tier(st);
    return KVS_OK;
}

/* A reserved slab is out of the index, the LRU and the free list: nothing evicts or reuses it. Its
 * prev field holds the reservation's generation, so a stale or forged ticket is refused. */
static kvs_status dram_reserve(void *state, const kvs_key *key, uint64_t len, void **dst,
                               uint64_t *ticket) {
    dram_state *st = state;
    if (!st || !key || !dst || !ticket) return KVS_EINVAL;
    if (len > st->max_object_bytes) {
        set_error(st, "reservation of %llu bytes is larger than the tier's max object size %llu",
                  (unsigned long long)len, (unsigned long long)st->max_object_bytes);
        return KVS_EINVAL;
    }
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    uint64_t now = kvs_now_ns();
    uint32_t s = take_slab(st, now);
    if (s == DRAM_NIL) {
        set_error(st, "all %llu objects are pinned or reserved; no room for another",
                  (unsigned long long)st->header->geo.n_slabs);
        unlock_tier(st);
        return KVS_ENOMEM;
    }
    slab_entry *e = &st->slabs[s];
    uint32_t gen = ++st->header->reserve_generation;
    e->key = *key;
    e->len = len;
    e->pins = 0;
    e->pin_deadline_ns = now + DRAM_RESERVE_TIMEOUT_NS;
    e->prev = gen;
    e->next = DRAM_NIL;
    __atomic_store_n(&e->state, (uint32_t)SLAB_RESERVED, __ATOMIC_RELEASE);
    unlock_tier(st);
    *dst = slab_data(st, s);
    *ticket = (uint64_t)gen << 32 | s;
    return KVS_OK;
}

/* With the lock held: the reserved slab a ticket names, or DRAM_NIL. */
static uint32_t ticket_slab(dram_state *st, uint64_t ticket) {
    uint32_t s = (uint32_t)ticket;
    if (s >= st->header->geo.n_slabs) return DRAM_NIL;
    slab_entry *e = &st->slabs[s];
    if (e->state != SLAB_RESERVED || e->prev != (uint32_t)(ticket >> 32)) return DRAM_NIL;
    return s;
}

static kvs_status dram_commit(void *state, uint64_t ticket) {
    dram_state *st = state;
    if (!st) return KVS_EINVAL;
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    uint32_t s = ticket_slab(st, ticket);
    if (s == DRAM_NIL) {
        set_error(
            st, "commit: ticket %llx names no reservation (reclaimed after %llu s, or never made)",
            (unsigned long long)ticket,
            (unsigned long long)(DRAM_RESERVE_TIMEOUT_NS / 1000000000ull));
        unlock_tier(st);
        return KVS_ENOTFOUND;
    }
    shared_header *h = st->header;
    slab_entry *e = &st->slabs[s];
    uint64_t bucket = 0;
    uint32_t old = index_find(st, &e->key, &bucket);
    if (old != DRAM_NIL) {
        if (slab_pinned(&st->slabs[old], kvs_now_ns())) {
            lru_touch(st, old); /* a reader holds the stored copy; equal keys carry equal bytes */
            free_list_push(st, s);
            unlock_tier(st);
            return KVS_OK;
        }
        drop_object(st, old, bucket);
    }
    e->pins = 0;
    e->pin_deadline_ns = 0;
    __atomic_store_n(&e->state, (uint32_t)SLAB_USED, __ATOMIC_RELEASE);
    index_insert(st, s);
    lru_push_head(st, s);
    h->n_objects++;
    h->object_bytes += e->len;
    unlock_tier(st);
    return KVS_OK;
}

static kvs_status dram_abort(void *state, uint64_t ticket) {
    dram_state *st = state;
    if (!st) return KVS_EINVAL;
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    uint32_t s = ticket_slab(st, ticket);
    if (s != DRAM_NIL) free_list_push(st, s);
    unlock_tier(st);
    return KVS_OK;
}

static kvs_status dram_memory(void *state, void **base, uint64_t *len) {
    dram_state *st = state;
    if (!st || !base || !len) return KVS_EINVAL;
    *base = st->data;
    *len = st->header->geo.n_slabs * st->header->geo.slab_bytes;
    return KVS_OK;
}

static kvs_status dram_remove(void *state, const kvs_key *key) {
    dram_state *st = state;
    if (!st || !key) return KVS_EINVAL;
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    uint64_t bucket = 0;
    uint32_t s = index_find(st, key, &bucket);
    /* A removal is forced even under pins: the connector removes objects that failed
     * verification, and no reader may keep using those. Zero-copy readers verify against checksums
     * they copied, so a slab reused later fails their check instead of passing as the old
     * object. */
    if (s != DRAM_NIL) drop_object(st, s, bucket);
    unlock_tier(st);
    return KVS_OK;
}

static kvs_status dram_usage(void *state, uint64_t *n_objects, uint64_t *bytes) {
    dram_state *st = state;
    if (!st || !n_objects || !bytes) return KVS_EINVAL;
    kvs_status rc = lock_tier(st);
    if (rc != KVS_OK) return rc;
    *n_objects = st->header->n_objects;
    *bytes = st->header->object_bytes;
    unlock_tier(st);
    return KVS_OK;
}

static const kvs_backend_ops dram_ops = {
    .abi_major = KVS_BACKEND_ABI_MAJOR,
    .abi_minor = KVS_BACKEND_ABI_MINOR,
    .struct_size = sizeof(kvs_backend_ops),
    .caps = KVS_BACKEND_CAP_ZERO_COPY | KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_RESERVE |
            KVS_BACKEND_CAP_MEMORY | KVS_BACKEND_CAP_GET_RANGE,
    .type_name = "dram",
    .create = dram_create,
    .destroy = dram_destroy,
    .last_error = dram_last_error,
    .contains = dram_contains,
    .pin = dram_pin,
    .unpin = dram_unpin,
    .get = dram_get,
    .get_ref = dram_get_ref,
    .put = dram_put,
    .remove = dram_remove,
    .usage = dram_usage,
    .reserve = dram_reserve,
    .commit = dram_commit,
    .abort = dram_abort,
    .memory = dram_memory,
    .get_range = dram_get_range,
};

const kvs_backend_ops *kvs_dram_backend(void) {
    return &dram_ops;
}
