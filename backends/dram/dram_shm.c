/*
 * dram_shm.c - the dram tier's mapping: geometry, creating or attaching it by name, attacher
 * tracking, detaching (contract in dram_shm.h).
 */
#include "dram_shm.h"
#include "dram.h"
#include "dram_table.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errno_name.h"
#include "common/log.h"
#include "common/process.h"

static uint64_t round_up(uint64_t v, uint64_t align) {
    return (v + align - 1) / align * align;
}

/* With the lock held: is entry a still the process that attached? An attacher in another pid
 * namespace (containers sharing /dev/shm) cannot be looked up by its pid from here, so it counts as
 * alive: its memory is never unlinked under it (it stays counted until it detaches). */
static int attacher_alive(const attacher *a) {
    return kvs_process_alive(a->pid, a->start_time, a->pid_ns);
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
        dram_log(st, KVS_LOG_INFO, message);
    }
}

/* With the lock held: count this process in. KVS_OK, or KVS_EIO with the error set. */
static kvs_status add_attacher(dram_state *st) {
    shared_header *h = st->header;
    /* 0 where /proc cannot be read: the pid alone then says whether we live */
    uint64_t start = kvs_process_start_time((int32_t)getpid());
    reap_attachers(st);
    for (uint32_t i = 0; i < DRAM_MAX_ATTACHERS; i++) {
        if (h->attachers[i].pid != 0) continue;
        h->attachers[i] = (attacher){
            .pid = (int32_t)getpid(), .start_time = start, .pid_ns = kvs_process_own_pid_ns()};
        st->attach_slot = i;
        h->attach_count++;
        return KVS_OK;
    }
    dram_set_error(st, "shared memory \"%s\" has %u live attachments already, the most it tracks",
                   st->shm_path, DRAM_MAX_ATTACHERS);
    return KVS_EIO;
}

int dram_shm_valid_name(const char *name) {
    static const char allowed[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
    size_t n = strlen(name);
    return n > 0 && n <= DRAM_SHM_NAME_MAX && strspn(name, allowed) == n && strcmp(name, ".") &&
           strcmp(name, "..");
}

kvs_status dram_shm_plan(dram_state *st, uint64_t capacity_bytes, geometry *g) {
    char cap[32], obj[32], slab[32];
    if (st->max_object_bytes == 0 || st->max_object_bytes > UINT64_MAX / 2) {
        dram_set_error(st, "max_object_bytes %llu is not a usable object size",
                       (unsigned long long)st->max_object_bytes);
        return KVS_EINVAL;
    }
    if (capacity_bytes == 0) {
        dram_set_error(st, "needs a capacity (YAML key `capacity`)");
        return KVS_ECONFIG;
    }
    memset(g, 0, sizeof *g);
    /* Objects of a page or more start on pages (a device reads them in place); smaller ones (a
     * published index's entries) on cache lines, so an entry costs bytes, not a page. */
    g->slab_bytes = round_up(st->max_object_bytes,
                             st->max_object_bytes < DRAM_PAGE ? DRAM_SLAB_ALIGN_SMALL : DRAM_PAGE);
    g->n_slabs = capacity_bytes / g->slab_bytes;
    kvs_fmt_bytes(cap, sizeof cap, capacity_bytes);
    kvs_fmt_bytes(obj, sizeof obj, st->max_object_bytes);
    kvs_fmt_bytes(slab, sizeof slab, g->slab_bytes);
    if (g->n_slabs == 0) {
        dram_set_error(st, "capacity %s holds no object of %s", cap, obj);
        return KVS_ECONFIG;
    }
    if (g->n_slabs > DRAM_MAX_SLABS) {
        dram_set_error(st, "capacity %s is %llu slabs of %s; at most %u are supported", cap,
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
        dram_set_error(st, "capacity %s does not fit in an address space", cap);
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
    dram_repair_tables(st); /* on the zeroed (all free) slabs: the empty index, LRU and free list */

    pthread_mutexattr_t attr;
    int rc = pthread_mutexattr_init(&attr);
    if (rc == 0) {
        rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
        if (rc == 0) rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
        if (rc == 0) rc = pthread_mutex_init(&h->mutex, &attr);
        pthread_mutexattr_destroy(&attr);
    }
    if (rc != 0) {
        dram_set_error(st, "cannot make its process-shared lock (%s)", kvs_errno_name(rc));
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
        dram_set_error(st, "cannot size shared memory \"%s\" to %s (%s)", what, size,
                       kvs_errno_name(errno));
        goto fail;
    }
    int err = fd >= 0 ? posix_fallocate(fd, 0, (off_t)g->mapping_bytes) : 0;
    if (err != 0) {
        dram_set_error(st, "shared memory \"%s\" cannot hold %s (%s); is /dev/shm large enough?",
                       what, size, kvs_errno_name(err));
        goto fail;
    }
    int flags = fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    base = mmap(NULL, g->mapping_bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (base == MAP_FAILED) {
        dram_set_error(st, "cannot map %s of memory for %s (%s)", size, what,
                       kvs_errno_name(errno));
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
            dram_set_error(st, "cannot inspect shared memory \"%s\" (%s)", st->shm_path,
                           kvs_errno_name(errno));
            goto fail;
        }
        if (h == MAP_FAILED && (uint64_t)sb.st_size >= sizeof *h) {
            mapped = (uint64_t)sb.st_size;
            h = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (h == MAP_FAILED) {
                dram_set_error(st, "cannot map shared memory \"%s\" (%s)", st->shm_path,
                               kvs_errno_name(errno));
                rc = KVS_ENOMEM;
                goto fail;
            }
            continue;
        }
        if (kvs_now_ns() > deadline) {
            dram_set_error(st,
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
        dram_set_error(st,
                       "shared memory \"%s\" holds %llu slabs of %s (layout %u) but this tier asks "
                       "for %llu slabs of %s (layout %u); capacity and max object size must agree "
                       "in every process",
                       st->shm_path, (unsigned long long)h->geo.n_slabs, theirs, h->layout_version,
                       (unsigned long long)g->n_slabs, ours, DRAM_LAYOUT_VERSION);
        rc = KVS_ECONFIG;
        goto fail;
    }
    bind_views(st, h, g);
    rc = dram_lock(st);
    if (rc != KVS_OK) goto fail;
    if (h->dead) {
        dram_unlock(st);
        rc = KVS_EAGAIN;
        goto fail;
    }
    rc = add_attacher(st);
    dram_unlock(st);
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
        int fd = st->shm_attach_only ? -1 : shm_open(st->shm_path, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) return create_layout(st, g, fd);
        if (!st->shm_attach_only && errno != EEXIST) {
            dram_set_error(st, "cannot create shared memory \"%s\" (%s)", st->shm_path,
                           kvs_errno_name(errno));
            return KVS_EIO;
        }
        fd = shm_open(st->shm_path, O_RDWR, 0);
        if (fd < 0) {
            if (errno == ENOENT && st->shm_attach_only) {
                dram_set_error(st, "no shared memory \"%s\" to attach (shm_open: attach)",
                               st->shm_path);
                return KVS_ENOTFOUND;
            }
            if (errno == ENOENT) continue; /* its last user unlinked it in between */
            dram_set_error(st, "cannot open shared memory \"%s\" (%s)", st->shm_path,
                           kvs_errno_name(errno));
            return KVS_EIO;
        }
        kvs_status rc = attach_shared(st, g, fd);
        if (rc != KVS_EAGAIN) return rc;
    }
    dram_set_error(st, "shared memory \"%s\" kept vanishing while it was being opened",
                   st->shm_path);
    return KVS_EIO;
}

kvs_status dram_shm_map(dram_state *st, const geometry *g) {
    return st->shm_path[0] ? open_shared(st, g) : create_layout(st, g, -1);
}

void dram_shm_unmap(dram_state *st) {
    if (st->shm_path[0]) {
        /* Unlink under the lock with `dead` set, so a concurrent attacher either counted itself in
         * before us or sees `dead` and reopens by name. */
        if (dram_lock(st) == KVS_OK) {
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
            dram_unlock(st);
        }
    } else {
        pthread_mutex_destroy(&st->header->mutex);
    }
    munmap(st->header, st->mapping_bytes);
}

kvs_status kvs_dram_peek(const char *shm_name, kvs_dram_peek_info *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    char path[DRAM_SHM_NAME_MAX + 2];
    if (!shm_name || !dram_shm_valid_name(shm_name)) {
        kvs_fmt(err, err_len, "\"%s\" is not a dram tier's shm_name", shm_name ? shm_name : "");
        return KVS_EINVAL;
    }
    kvs_fmt(path, sizeof path, "/%s", shm_name);
    int fd = shm_open(path, O_RDONLY, 0);
    if (fd < 0) {
        kvs_fmt(err, err_len, "no shared memory \"%s\" (%s): no process holds the tier", path,
                kvs_errno_name(errno));
        return errno == ENOENT ? KVS_ENOTFOUND : KVS_EIO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < sizeof(shared_header)) {
        kvs_fmt(err, err_len, "shared memory \"%s\" is %lld bytes: not a dram tier", path,
                (long long)sb.st_size);
        close(fd);
        return KVS_ECORRUPT;
    }
    const shared_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (h == MAP_FAILED) {
        kvs_fmt(err, err_len, "cannot map shared memory \"%s\" (%s)", path, kvs_errno_name(errno));
        return KVS_EIO;
    }
    kvs_status st = KVS_OK;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != DRAM_MAGIC) {
        kvs_fmt(err, err_len, "shared memory \"%s\" is not a dram tier (or not initialised yet)",
                path);
        st = KVS_ECORRUPT;
    } else if (h->layout_version != DRAM_LAYOUT_VERSION) {
        kvs_fmt(err, err_len,
                "shared memory \"%s\" is a dram tier of layout %u; this build reads %u", path,
                h->layout_version, DRAM_LAYOUT_VERSION);
        out->layout_version = h->layout_version;
        st = KVS_ECORRUPT;
    } else {
        out->layout_version = h->layout_version;
        out->objects = __atomic_load_n(&h->n_objects, __ATOMIC_RELAXED);
        out->bytes = __atomic_load_n(&h->object_bytes, __ATOMIC_RELAXED);
        out->slab_bytes = h->geo.slab_bytes;
        out->slabs = h->geo.n_slabs;
        out->capacity_bytes = h->geo.slab_bytes * h->geo.n_slabs;
        for (uint32_t i = 0; i < DRAM_MAX_ATTACHERS; i++) {
            attacher a;
            memcpy(&a, &h->attachers[i], sizeof a);
            if (a.pid == 0) continue;
            out->attached++;
            out->attached_alive += (uint32_t)attacher_alive(&a);
        }
    }
    munmap((void *)(uintptr_t)h, sizeof *h);
    return st;
}
