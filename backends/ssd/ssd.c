/*
 * ssd.c - the SSD tier's ops table, create (options, geometry, data files, engines, the restart
 * scan), destroy and statistics. Contract in ssd.h; format, crash model and options in
 * docs/ssd.md; the other modules are listed in ssd_tier.h.
 */
#include "ssd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/options.h"
#include "ssd_recover.h"
#include "ssd_tier.h"

/* After a crash the dead process's data files stay locked for a moment (its ring drains). */
#define LOCK_WAIT_NS (2ull * 1000 * 1000 * 1000)

static const char *ssd_last_error(void *state) {
    ssd_tier *t = state;
    return t ? t->error : "";
}

kvs_status kvs_ssd_set_clock(void *state, const kvs_clock *clock) {
    ssd_tier *t = state;
    if (!t) return KVS_EINVAL;
    pthread_mutex_lock(&t->mutex);
    t->clock = clock;
    pthread_mutex_unlock(&t->mutex);
    return KVS_OK;
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
    out->fresh_write_buffers = atomic_load(&t->fresh_write_buffers);
    out->evictions = atomic_load(&t->evictions);
    out->corrupt_drops = atomic_load(&t->corrupt_drops);
    out->recovered = t->recovered;
    out->fallbacks = t->fallbacks;
    out->n_paths = t->n_paths;
    pthread_mutex_lock(&t->mutex);
    out->writes_pending = t->writes_pending;
    out->buffered_bytes = t->buffered_bytes;
    for (uint32_t p = 0; p < t->n_paths; p++) {
        int failed = !ssd_path_usable(t, p);
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
    struct timespec deadline = kvs_timespec_after_ms(CLOCK_MONOTONIC, timeout_ms);
    pthread_mutex_lock(&t->mutex);
    int rc = 0;
    while (t->writes_pending > 0 && rc == 0)
        rc = pthread_cond_timedwait(&t->drained, &t->mutex, &deadline);
    uint64_t left = t->writes_pending;
    pthread_mutex_unlock(&t->mutex);
    if (left == 0) return KVS_OK;
    ssd_set_error(t, "%llu writes still pending after %llu ms", (unsigned long long)left,
                  (unsigned long long)timeout_ms);
    return KVS_ETIMEDOUT;
}

/* ---- create / destroy ------------------------------------------------------------------------ */

/* Each path must exist, be a directory and be listed once; a refusal names path[i]. A path that
 * cannot be written (EACCES, EROFS: the device, not the file, is at fault) is not refused: it is taken
 * out of service and the others serve. */
static kvs_status check_directories(ssd_tier *t, const ssd_options *opt, char *refused,
                                    size_t refused_len) {
    struct stat seen[SSD_MAX_PATHS];
    for (uint32_t i = 0; i < opt->n_paths; i++) {
        const char *dir = opt->paths[i];
        struct stat st;
        snprintf(refused, refused_len, "path[%u]", i);
        if (stat(dir, &st) != 0) {
            ssd_set_error(t, "path \"%.300s\" cannot be used (%s)", dir, kvs_errno_name(errno));
            return KVS_ECONFIG;
        }
        if (!S_ISDIR(st.st_mode)) {
            ssd_set_error(t, "path \"%.300s\" is not a directory", dir);
            return KVS_ECONFIG;
        }
        if (access(dir, W_OK | X_OK) != 0)
            snprintf(t->paths[i].isolated_why, sizeof t->paths[i].isolated_why,
                     "the directory is not writable (%s)", kvs_errno_name(errno));
        for (uint32_t j = 0; j < i; j++) {
            if (seen[j].st_dev == st.st_dev && seen[j].st_ino == st.st_ino) {
                ssd_set_error(t, "paths \"%.200s\" and \"%.200s\" are the same directory",
                              opt->paths[j], dir);
                return KVS_ECONFIG;
            }
        }
        seen[i] = st;
    }
    refused[0] = '\0';
    return KVS_OK;
}

/* Open, lock and size one path's data file. *preallocated: the device holds every byte of it.
 * model_device: a modelled small device (fault_inject device_bytes), so the file stays sparse.
 * KVS_ECONFIG (the error set) when another tier or process has the file; KVS_EIO with
 * p->isolated_why set when the device refuses it (ENOSPC, EIO, EACCES, EROFS, ...). */
static kvs_status open_data_file(ssd_tier *t, uint32_t i, int model_device, int *preallocated) {
    ssd_path *p = &t->paths[i];
    char name[SSD_TIER_NAME_KEPT + 16], file[4200];
    ssd_format_data_file(t->tier_name, name, sizeof name);
    snprintf(file, sizeof file, "%s/%s", p->dir, name);
    p->fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
    if (p->fd < 0 && errno == EINVAL) {
        p->fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (p->fd >= 0)
            ssd_log(t, KVS_LOG_INFO,
                    "%s does not support O_DIRECT; path %u goes through the page cache", p->dir, i);
    }
    if (p->fd < 0) {
        snprintf(p->isolated_why, sizeof p->isolated_why, "its data file cannot be opened (%s)",
                 kvs_errno_name(errno));
        return KVS_EIO;
    }
    /* After a crash the kernel may hold the dead process's file for a moment while its ring's
     * requests drain, so a busy lock is retried for a while before it counts as in use. */
    uint64_t give_up = kvs_now_ns() + LOCK_WAIT_NS;
    while (flock(p->fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        if (err != EWOULDBLOCK || kvs_now_ns() > give_up) {
            ssd_set_error(t,
                          "%s is in use by another tier or process (%s): one process owns an ssd "
                          "tier's files; several processes (an engine's scheduler and workers, "
                          "engines on one host) share it through a kvstrata-node (docs/vllm.md, "
                          "\"Tiers in vLLM's processes\")",
                          file, kvs_errno_name(err));
            return KVS_ECONFIG;
        }
        struct timespec pause = {.tv_nsec = 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    uint64_t want = SSD_BLOCK + p->n_slots * t->slot_bytes;
    struct stat st;
    if (fstat(p->fd, &st) == 0 && (uint64_t)st.st_size > want &&
        ftruncate(p->fd, (off_t)want) != 0) {
        snprintf(p->isolated_why, sizeof p->isolated_why,
                 "its data file cannot be shrunk to %llu bytes (%s)", (unsigned long long)want,
                 kvs_errno_name(errno));
        return KVS_EIO;
    }
    *preallocated = !model_device && fallocate(p->fd, 0, 0, (off_t)want) == 0;
    if (!*preallocated) {
        int err = model_device ? ENOSPC : errno;
        if (ftruncate(p->fd, (off_t)want) != 0) {
            snprintf(p->isolated_why, sizeof p->isolated_why,
                     "its data file cannot be sized to %llu bytes (%s)", (unsigned long long)want,
                     kvs_errno_name(errno));
            return KVS_EIO;
        }
        if (err != EOPNOTSUPP) {
            char size[32];
            kvs_fmt_bytes(size, sizeof size, want);
            ssd_log(t, KVS_LOG_WARN,
                    "cannot preallocate %s of %s (%s); if the device fills, this path's capacity "
                    "is lowered to what it holds",
                    file, size, kvs_errno_name(err));
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
    /* Larger than this configuration's objects (max_object_bytes shrank), or not written by us. */
    if (first->object_len > t->max_object_bytes || first->replica_count > SSD_MAX_REPLICAS) return;
    uint32_t o = ssd_object_alloc(t, first->unit_count, first->replica_count);
    if (o == SSD_NIL) {
        rc->out_of_memory = 1;
        return;
    }
    ssd_object *e = ssd_obj(t, o);
    e->key = first->key;
    e->len = first->object_len;
    e->seq = first->sequence;
    e->verified = 0;
    for (uint64_t i = 0; i < n; i++) {
        const ssd_found_unit *f = &copies[i];
        ssd_copy *c = &e->copies[(uint64_t)f->unit_index * e->replicas + f->replica_index];
        if (c->path != SSD_NO_PATH || rc->used[f->path][f->slot]) continue;
        *c = (ssd_copy){f->path, f->slot};
        rc->used[f->path][f->slot] = 1;
        e->checksums[f->unit_index] = f->data_checksum;
    }
    ssd_install_live(t, o);
    t->recovered++;
}

/* Path i cannot serve from the start (what, err: why): it keeps no engine and no file, so it is
 * never usable and placement, reads and eviction pass it by as they pass an isolated path by. */
static void take_out_of_service(ssd_tier *t, uint32_t i, const char *what, int err) {
    ssd_path *p = &t->paths[i];
    snprintf(p->isolated_why, sizeof p->isolated_why, "%s (%s)", what, kvs_errno_name(err));
    ssd_io_close(p->io); /* nothing is queued: create waited for each I/O it issued */
    p->io = NULL;
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
}

/* Path i's superblock: read it; a matching one gives the slots to scan, any other is rewritten
 * for this geometry (dropping what the path held). A path whose superblock cannot be read or
 * written goes out of service and is not scanned (*io stays NULL, *scan_slots 0). */
static void settle_superblock(ssd_tier *t, uint32_t i, uint8_t *block, ssd_io_path **io,
                              uint64_t *scan_slots) {
    ssd_path *p = &t->paths[i];
    int64_t got = ssd_io_sync(p->io, SSD_IO_OP_READ, block, SSD_BLOCK, 0, t->io_timeout_ms);
    if (got < 0) { /* the engine isolated the path */
        take_out_of_service(t, i, "its superblock cannot be read", (int)-got);
        return;
    }
    *io = p->io;
    ssd_superblock sb;
    int valid = ssd_format_decode_superblock(block, &sb) == 0;
    if (valid && sb.stripe_bytes == t->stripe_bytes && sb.slot_bytes == t->slot_bytes) {
        *scan_slots = sb.n_slots < p->n_slots ? sb.n_slots : p->n_slots;
        if (sb.n_slots == p->n_slots) return;
    } else if (valid) {
        char was[32], now[32];
        kvs_fmt_bytes(was, sizeof was, sb.stripe_bytes);
        kvs_fmt_bytes(now, sizeof now, t->stripe_bytes);
        ssd_log(t, KVS_LOG_WARN,
                "path %u (%s) was written with stripe %s, now %s: its objects are dropped", i,
                p->dir, was, now);
    }
    memset(block, 0, SSD_BLOCK);
    memset(&sb, 0, sizeof sb);
    sb.stripe_bytes = t->stripe_bytes;
    sb.slot_bytes = t->slot_bytes;
    sb.n_slots = p->n_slots;
    snprintf(sb.tier_name, sizeof sb.tier_name, "%s", t->tier_name);
    ssd_format_encode_superblock(&sb, block);
    int64_t wrote = ssd_io_sync(p->io, SSD_IO_OP_WRITE, block, SSD_BLOCK, 0, t->io_timeout_ms);
    if (wrote < 0) {
        /* Without a valid superblock the next start could not tell this file's slots apart,
         * so nothing may be written there: the path is out of service, the others serve. */
        take_out_of_service(t, i, "its superblock cannot be written", (int)-wrote);
        *io = NULL;
        *scan_slots = 0;
    }
}

/* Each path's free-slot stack from the slots no recovered object uses, and the next sequence
 * number: past every recovered one and no earlier than now. */
static void rebuild_free_slots(ssd_tier *t, uint8_t *const *used, const ssd_scan_result *found) {
    for (uint32_t i = 0; i < t->n_paths; i++) {
        ssd_path *p = &t->paths[i];
        p->n_free = 0;
        for (uint64_t s = p->n_slots;
             s-- > 0;) /* low slots on top: the file fills from its start */
            if (!used[i][s]) p->free_slots[p->n_free++] = (uint32_t)s;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t wall = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    t->next_seq = found->max_sequence + 1 > wall ? found->max_sequence + 1 : wall;
    t->headers_scanned = found->headers_read;
}

/* The restart scan's progress lines (common/progress.h) go to the tier's log, one log line each:
 * an engine's stderr is a log, so nothing is redrawn in place. */
static ssize_t progress_to_log(void *cookie, const char *buf, size_t size) {
    ssd_tier *t = cookie;
    size_t at = 0;
    while (at < size) {
        size_t end = at;
        while (end < size && buf[end] != '\n') end++;
        if (end > at) ssd_log(t, KVS_LOG_INFO, "%.*s", (int)(end - at), buf + at);
        at = end + 1;
    }
    return (ssize_t)size;
}

/* A scan of a large tier takes a while: after 2 s a line says how far it is, then one every 5 s
 * (headers per second, eta) and one when it is done. NULL when no log can take them. */
static FILE *begin_scan_progress(ssd_tier *t, kvs_progress *p, const uint64_t *scan_slots) {
    if (!t->log) return NULL;
    FILE *f = fopencookie(t, "w", (cookie_io_functions_t){.write = progress_to_log});
    if (!f) return NULL; /* no memory for it: the scan runs without progress lines */
    uint64_t total = 0;
    for (uint32_t i = 0; i < t->n_paths; i++) total += scan_slots[i];
    char what[64];
    snprintf(what, sizeof what, "rebuilding the index from %u paths", t->n_paths);
    kvs_progress_begin(p, f, KVS_PROGRESS_LINES, what, "unit headers", total, 2000, 5000);
    return f;
}

/* Read or write each path's superblock, scan the slots of those that match, rebuild the index and
 * the free-slot stacks. */
static kvs_status recover(ssd_tier *t) {
    uint64_t scan_slots[SSD_MAX_PATHS] = {0};
    ssd_io_path *io[SSD_MAX_PATHS] = {NULL};
    uint8_t *block = aligned_alloc(SSD_BLOCK, SSD_BLOCK);
    if (!block) {
        ssd_set_error(t, "out of memory for the superblock");
        return KVS_ENOMEM;
    }
    for (uint32_t i = 0; i < t->n_paths; i++)
        if (t->paths[i].io) /* else out of service already */
            settle_superblock(t, i, block, &io[i], &scan_slots[i]);
    free(block);

    kvs_progress progress;
    FILE *progress_out = begin_scan_progress(t, &progress, scan_slots);
    ssd_scan_result found;
    if (ssd_recover_scan(io, t->n_paths, scan_slots, t->slot_bytes, t->stripe_bytes,
                         t->queue_depth - 1, t->io_timeout_ms, progress_out ? &progress : NULL,
                         &found) != 0) {
        if (progress_out) fclose(progress_out);
        ssd_set_error(t, "out of memory for the restart scan");
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
    if (rc == KVS_OK)
        rebuild_free_slots(t, ctx.used, &found);
    else
        ssd_set_error(t, "out of memory while rebuilding the index");
    if (ctx.used)
        for (uint32_t i = 0; i < t->n_paths; i++) free(ctx.used[i]);
    free(ctx.used);
    free(found.units);
    if (progress_out) {
        char note[64];
        snprintf(note, sizeof note, "%llu objects recovered", (unsigned long long)t->recovered);
        kvs_progress_end(&progress, note);
        fclose(progress_out);
    }
    return rc;
}

static void ssd_destroy(void *state);

/* Which slots of path i the device holds blocks for: all of a preallocated file, else the slots the
 * file holds data for (SEEK_DATA / SEEK_HOLE), so a sparse file on a small device starts with what it
 * already has. */
static void find_backed_slots(ssd_tier *t, uint32_t i, int preallocated) {
    ssd_path *p = &t->paths[i];
    if (p->fd < 0) return; /* out of service */
    if (preallocated) {
        memset(p->backed, 1, p->n_slots);
        return;
    }
    off_t end = (off_t)(SSD_BLOCK + p->n_slots * t->slot_bytes);
    for (off_t at = SSD_BLOCK; at < end;) {
        off_t data = lseek(p->fd, at, SEEK_DATA);
        if (data < 0) return;
        off_t hole = lseek(p->fd, data, SEEK_HOLE);
        if (hole < 0) hole = end;
        uint64_t first = ((uint64_t)data - SSD_BLOCK + t->slot_bytes - 1) / t->slot_bytes;
        for (uint64_t s = first;
             s < p->n_slots && ssd_slot_offset(t, (uint32_t)s) + t->slot_bytes <= (uint64_t)hole;
             s++)
            p->backed[s] = 1;
        at = hole;
    }
}

/* After the superblocks: log each path that is out of service (tier, path, errno); with none left
 * the tier cannot open (KVS_EIO, every reason in the error). */
static kvs_status report_unusable_paths(ssd_tier *t, uint32_t usable) {
    char reasons[400] = "";
    size_t at = 0;
    for (uint32_t i = 0; i < t->n_paths; i++) {
        const ssd_path *p = &t->paths[i];
        const char *why = p->isolated_why[0] ? p->isolated_why : "it failed while the tier opened";
        if (ssd_path_usable(t, i)) continue;
        if (usable)
            ssd_log(t, KVS_LOG_ERROR,
                    "path %u (%.300s) is out of service from the start: %s; %u of %u paths serve",
                    i, p->dir, why, usable, t->n_paths);
        if (at < sizeof reasons) {
            int n = snprintf(reasons + at, sizeof reasons - at, "%spath %u (%.200s): %s",
                             at ? "; " : "", i, p->dir, why);
            at += n > 0 ? (size_t)n : 0;
        }
    }
    if (usable) return KVS_OK;
    ssd_set_error(t, "no path can be used: %s", reasons);
    return KVS_EIO;
}

static kvs_status plan_geometry(ssd_tier *t, const kvs_backend_init *init, const ssd_options *opt,
                                char *refused, size_t refused_len) {
    char cap[32], obj[32], slot[32];
    if (init->max_object_bytes == 0 || init->max_object_bytes > (1ull << 50)) {
        ssd_set_error(t, "max_object_bytes %llu is not a usable object size",
                      (unsigned long long)init->max_object_bytes);
        return KVS_EINVAL;
    }
    snprintf(refused, refused_len, "capacity");
    if (init->capacity_bytes == 0) {
        ssd_set_error(t, "needs a capacity (YAML key `capacity`, the total over all paths)");
        return KVS_ECONFIG;
    }
    t->max_object_bytes = init->max_object_bytes;
    uint64_t object_rounded = ssd_round_up(init->max_object_bytes, SSD_BLOCK);
    t->stripe_bytes = opt->stripe_bytes < object_rounded ? opt->stripe_bytes : object_rounded;
    t->slot_bytes = SSD_BLOCK + t->stripe_bytes;
    uint64_t per_path = init->capacity_bytes / opt->n_paths;
    uint64_t n_slots = per_path > SSD_BLOCK ? (per_path - SSD_BLOCK) / t->slot_bytes : 0;
    uint32_t units = ssd_format_unit_count(init->max_object_bytes, t->stripe_bytes);
    kvs_fmt_bytes(cap, sizeof cap, init->capacity_bytes);
    kvs_fmt_bytes(obj, sizeof obj, init->max_object_bytes);
    kvs_fmt_bytes(slot, sizeof slot, t->slot_bytes);
    if (n_slots < units) {
        ssd_set_error(t,
                      "capacity %s over %u paths gives %llu slots of %s per path; an object of up "
                      "to %s needs %u",
                      cap, opt->n_paths, (unsigned long long)n_slots, slot, obj, units);
        return KVS_ECONFIG;
    }
    if (n_slots >= UINT32_MAX || n_slots * opt->n_paths >= UINT32_MAX) {
        ssd_set_error(t, "capacity %s is %llu slots of %s per path; raise stripe_bytes", cap,
                      (unsigned long long)n_slots, slot);
        return KVS_ECONFIG;
    }
    uint64_t need = (uint64_t)units * opt->replicas * SSD_BLOCK + object_rounded;
    if (opt->write_buffer_bytes < need) {
        snprintf(refused, refused_len, "write_buffer_bytes");
        char have[32], want[32];
        kvs_fmt_bytes(have, sizeof have, opt->write_buffer_bytes);
        kvs_fmt_bytes(want, sizeof want, need);
        ssd_set_error(t, "write_buffer_bytes %s cannot hold one object of up to %s (needs %s)",
                      have, obj, want);
        return KVS_ECONFIG;
    }
    t->spare_bytes = need;
    t->max_spare =
        (uint32_t)(opt->write_buffer_bytes / need < 1024 ? opt->write_buffer_bytes / need : 1024);
    for (uint32_t i = 0; i < opt->n_paths; i++) t->paths[i].n_slots = n_slots;
    t->n_object_slots = (uint32_t)(n_slots * opt->n_paths);
    refused[0] = '\0';
    return KVS_OK;
}

/* The write arena (ssd_tier.h): write_buffer_bytes in buffers for objects of max_object_bytes,
 * mapped in large pages where the kernel gives them and faulted in now, like a device's pinned pool:
 * the first puts after create copy at the same rate as later ones. */
static int map_write_arena(ssd_tier *t) {
    t->arena_bytes = (uint64_t)t->max_spare * t->spare_bytes;
    void *m =
        mmap(NULL, t->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        char want[32];
        kvs_fmt_bytes(want, sizeof want, t->arena_bytes);
        ssd_set_error(t, "cannot map the write buffer of %s (write_buffer_bytes): %s", want,
                      strerror(errno));
        t->arena_bytes = 0;
        return -1;
    }
    madvise(m, t->arena_bytes, MADV_HUGEPAGE);
    t->arena = m;
    for (uint64_t at = 0; at < t->arena_bytes; at += SSD_BLOCK) t->arena[at] = 0;
    for (uint32_t i = 0; i < t->max_spare; i++)
        t->spare[i] = t->arena + (uint64_t)(t->max_spare - 1 - i) * t->spare_bytes;
    t->n_spare = t->max_spare;
    return 0;
}

/* The state's locks, its empty lists, and what the host hands the tier (its hooks, the staging
 * pool), each hook taken only where the host's struct is new enough to have it. */
static void init_state(ssd_tier *t, const kvs_backend_init *init) {
    pthread_mutex_init(&t->error_mutex, NULL);
    pthread_mutex_init(&t->mutex, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&t->drained, &attr);
    pthread_condattr_destroy(&attr);
    for (uint32_t i = 0; i < SSD_MAX_PATHS; i++) t->paths[i].fd = -1;
    t->lru_head = t->lru_tail = t->free_head = SSD_NIL;
    atomic_store(&t->io.enospc_budget, -1);
    snprintf(t->tier_name, sizeof t->tier_name, "%s", init->tier_name ? init->tier_name : "ssd");
    const kvs_backend_host *host = init->host;
    if (host) {
        t->host_ctx = host->ctx;
        if (host->struct_size >= offsetof(kvs_backend_host, log) + sizeof host->log)
            t->log = host->log;
        if (host->struct_size >= offsetof(kvs_backend_host, on_evict) + sizeof host->on_evict)
            t->on_evict = host->on_evict;
        if (host->struct_size >= offsetof(kvs_backend_host, place) + sizeof host->place)
            t->place = host->place;
        if (host->struct_size >= offsetof(kvs_backend_host, schedule) + sizeof host->schedule)
            t->schedule = host->schedule;
        if (host->struct_size >=
            offsetof(kvs_backend_host, on_put_dropped) + sizeof host->on_put_dropped)
            t->on_put_dropped = host->on_put_dropped;
    }
    if (init->struct_size >= offsetof(kvs_backend_init, staging_len) + sizeof init->staging_len) {
        t->staging_base = init->staging_base;
        t->staging_len = init->staging_len;
    }
}

/* Parse the options, plan the geometry, check the directories, and keep what the tier runs with.
 * On KVS_ECONFIG, refused names the option at fault. */
static kvs_status apply_options(ssd_tier *t, const kvs_backend_init *init, ssd_options *opt,
                                char *refused, size_t refused_len) {
    char why[400];
    kvs_status rc;
    if (init->n_options && !init->options) {
        ssd_set_error(t, "n_options is %llu but options is NULL",
                      (unsigned long long)init->n_options);
        return KVS_EINVAL;
    }
    if ((rc = ssd_options_parse(init->options, init->n_options, opt, why, sizeof why, refused,
                                refused_len)) != KVS_OK) {
        ssd_set_error(t, "%s", why);
        return rc;
    }
    if ((rc = plan_geometry(t, init, opt, refused, refused_len)) != KVS_OK) return rc;
    if ((rc = check_directories(t, opt, refused, refused_len)) != KVS_OK) return rc;
    t->n_paths = opt->n_paths;
    t->replicas = opt->replicas;
    t->queue_depth = opt->queue_depth;
    t->io_timeout_ms = opt->io_timeout_ms;
    t->write_buffer_bytes = opt->write_buffer_bytes;
    if (opt->enospc_after >= 0) atomic_store(&t->io.enospc_budget, opt->enospc_after);
    return KVS_OK;
}

/* The index (records in chunks, hash buckets), the zero block and the write arena. */
static kvs_status alloc_index(ssd_tier *t) {
    t->max_chunks = (t->n_object_slots + SSD_CHUNK_RECORDS - 1) / SSD_CHUNK_RECORDS;
    t->chunks = calloc(t->max_chunks, sizeof *t->chunks);
    t->n_buckets = 1;
    while (t->n_buckets < 2ull * t->n_object_slots) t->n_buckets <<= 1;
    t->buckets = malloc(t->n_buckets * sizeof *t->buckets);
    t->zero_block = aligned_alloc(SSD_BLOCK, SSD_BLOCK);
    t->spare = calloc(t->max_spare ? t->max_spare : 1, sizeof *t->spare);
    if (!t->chunks || !t->buckets || !t->zero_block || !t->spare) {
        ssd_set_error(t, "out of memory for the index of %u slots", t->n_object_slots);
        return KVS_ENOMEM;
    }
    if (map_write_arena(t) != 0) return KVS_ENOMEM;
    memset(t->zero_block, 0, SSD_BLOCK);
    for (uint64_t b = 0; b < t->n_buckets; b++) t->buckets[b] = SSD_NIL;
    return KVS_OK;
}

/* Start path i's I/O engine on its open file; one that cannot start takes the path out of
 * service (-1). */
static int start_engine(ssd_tier *t, const ssd_options *opt, uint32_t i, int64_t device_bytes) {
    ssd_path *p = &t->paths[i];
    char why[400];
    ssd_io_config cfg = {.tier_name = t->tier_name,
                         .dir = p->dir,
                         .index = i,
                         .fd = p->fd,
                         .engine = opt->engine,
                         .queue_depth = opt->queue_depth,
                         .write_inflight = opt->write_inflight,
                         .pread_threads = opt->pread_threads,
                         .sim_bandwidth = opt->sim_bandwidth,
                         .sim_iops = opt->sim_iops,
                         .staging_base = t->staging_base,
                         .staging_len = t->staging_len,
                         .eio = opt->eio_path == (int32_t)i,
                         .eio_after = opt->eio_after,
                         .device_bytes = device_bytes,
                         .counters = &t->io,
                         .ctx = t,
                         .log = t->log,
                         .on_failed = ssd_on_path_failed};
    if (ssd_io_open(&cfg, &p->io, why, sizeof why) != 0) {
        snprintf(p->isolated_why, sizeof p->isolated_why, "its I/O engine cannot start: %s", why);
        close(p->fd);
        p->fd = -1;
        return -1;
    }
    return 0;
}

/* Each path's slot table, data file and I/O engine. A path whose directory or file the device
 * refuses, or whose engine cannot start, is out of service and the others serve; only a
 * configuration error (KVS_ECONFIG, refused names the path) or no memory fails the tier. */
static kvs_status open_paths(ssd_tier *t, const ssd_options *opt, int *preallocated, char *refused,
                             size_t refused_len) {
    int uring_error = 0;
    uint32_t on_pread = 0;
    for (uint32_t i = 0; i < t->n_paths; i++) {
        ssd_path *p = &t->paths[i];
        if (!(p->free_slots = malloc(p->n_slots * sizeof *p->free_slots)) ||
            !(p->backed = calloc(p->n_slots, 1))) {
            ssd_set_error(t, "out of memory for the slot table of %s", opt->paths[i]);
            return KVS_ENOMEM;
        }
        snprintf(p->dir, sizeof p->dir, "%s", opt->paths[i]);
        int64_t device_bytes =
            opt->device_path < 0 || opt->device_path == (int32_t)i ? opt->device_bytes : -1;
        if (p->isolated_why[0]) continue; /* not writable: out of service from the start */
        kvs_status rc = open_data_file(t, i, device_bytes >= 0, &preallocated[i]);
        if (rc == KVS_ECONFIG) {
            snprintf(refused, refused_len, "path[%u]", i);
            return rc;
        }
        if (rc != KVS_OK) { /* the device refuses the file: the other paths serve */
            if (p->fd >= 0) close(p->fd);
            p->fd = -1;
            continue;
        }
        if (start_engine(t, opt, i, device_bytes) != 0) continue;
        if (opt->engine == SSD_ENGINE_URING && !ssd_io_uses_uring(p->io)) {
            uring_error = ssd_io_uring_error(p->io);
            on_pread++;
        }
    }
    t->fallbacks = on_pread;
    if (on_pread)
        ssd_log(t, KVS_LOG_INFO, "io_uring is unavailable (%s%s); %u paths use the pread engine",
                kvs_errno_name(uring_error),
                uring_error == ENOSYS ? ", or a build without liburing" : "", on_pread);
    return KVS_OK;
}

/* One line says what the tier runs on, so a slow fallback is never silent. */
static void log_opened(ssd_tier *t, const ssd_options *opt, uint32_t usable,
                       uint32_t first_usable) {
    char stripe[32], cap[32];
    kvs_fmt_bytes(stripe, sizeof stripe, t->stripe_bytes);
    kvs_fmt_bytes(cap, sizeof cap, (uint64_t)t->n_object_slots * t->stripe_bytes);
    const ssd_io_path *io = t->paths[first_usable].io;
    int uring = ssd_io_uses_uring(io), fixed = ssd_io_has_fixed(io);
    ssd_log(t, KVS_LOG_INFO,
            "%u of %u paths usable, %s of data in %llu slots of %s, %u replica(s), %s%s, %s; %llu "
            "objects recovered "
            "from %llu unit headers",
            usable, t->n_paths, cap, (unsigned long long)t->n_object_slots, stripe, t->replicas,
            uring ? "io_uring" : "pread engine",
            uring ? (fixed ? " with the staging pool registered" : "") : "",
            opt->sim_bandwidth || opt->sim_iops ? "paced" : "not paced",
            (unsigned long long)t->recovered, (unsigned long long)t->headers_scanned);
}

static kvs_status ssd_create(const kvs_backend_init *init, void **out) {
    if (!init || !out) return KVS_EINVAL;
    *out = NULL;
    if (init->struct_size < offsetof(kvs_backend_init, staging_base)) return KVS_EVERSION;
    ssd_tier *t = calloc(1, sizeof *t);
    if (!t) {
        kvs_create_error(init, "ssd tier: out of memory for its state");
        return KVS_ENOMEM;
    }
    init_state(t, init);

    ssd_options opt;
    char refused[80] = "";
    int preallocated[SSD_MAX_PATHS] = {0};
    kvs_status rc;
    if ((rc = apply_options(t, init, &opt, refused, sizeof refused)) != KVS_OK) goto fail;
    if ((rc = alloc_index(t)) != KVS_OK) goto fail;
    if ((rc = open_paths(t, &opt, preallocated, refused, sizeof refused)) != KVS_OK) goto fail;

    if ((rc = recover(t)) != KVS_OK) goto fail;
    for (uint32_t i = 0; i < t->n_paths; i++) find_backed_slots(t, i, preallocated[i]);
    uint32_t usable = 0, first_usable = 0;
    for (uint32_t i = t->n_paths; i-- > 0;) {
        if (!ssd_path_usable(t, i)) continue;
        usable++;
        first_usable = i;
    }
    if ((rc = report_unusable_paths(t, usable)) != KVS_OK) goto fail;
    for (uint32_t i = 0; i < t->n_paths; i++)
        if (t->paths[i].io) ssd_io_arm_faults(t->paths[i].io);
    log_opened(t, &opt, usable, first_usable);
    *out = t;
    return KVS_OK;

fail:
    kvs_create_error(init, t->error);
    if (rc == KVS_ECONFIG) kvs_option_refused(init, refused, -1);
    ssd_destroy(t);
    return rc;
}

static void ssd_destroy(void *state) {
    ssd_tier *t = state;
    if (!t) return;
    ssd_finish_calls(t); /* their reads need the engines */
    /* Stopping an engine lets its queued and in-flight requests finish first, so every write job
     * and tombstone completes (and takes the lock) before anything below is freed. All stop before
     * any is freed: a completion on one path looks at the others. */
    for (uint32_t i = 0; i < SSD_MAX_PATHS; i++) ssd_io_stop(t->paths[i].io);
    for (uint32_t i = 0; i < SSD_MAX_PATHS; i++) {
        ssd_io_close(t->paths[i].io);
        t->paths[i].io = NULL;
        free(t->paths[i].free_slots);
        free(t->paths[i].backed);
        if (t->paths[i].fd < 0) continue;
        fdatasync(t->paths[i].fd); /* best effort: a clean shutdown survives a power cut */
        close(t->paths[i].fd);
    }
    for (uint32_t c = 0; c < t->n_chunks; c++) {
        for (uint32_t i = 0; i < SSD_CHUNK_RECORDS; i++) {
            free(t->chunks[c][i].copies);
            free(t->chunks[c][i].checksums);
        }
        free(t->chunks[c]);
    }
    free(t->chunks);
    if (t->arena) munmap(t->arena, t->arena_bytes);
    free(t->spare);
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
    .caps = KVS_BACKEND_CAP_THREAD_SAFE | KVS_BACKEND_CAP_GET_MANY | KVS_BACKEND_CAP_GET_RANGE |
            KVS_BACKEND_CAP_GET_MANY_ASYNC | KVS_BACKEND_CAP_STRIPED,
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
    .get_range = ssd_get_range,
    .get_many_start = ssd_get_many_start,
    .get_many_finish = ssd_get_many_finish,
};

const kvs_backend_ops *kvs_ssd_backend(void) {
    return &ssd_ops;
}
