/*
 * ssd_inspect.c - reading an ssd tier's data files without the tier (contract in ssd_inspect.h).
 *
 * The files are read with plain pread through the page cache: an inspection is one pass, and the
 * tier's engines (io_uring, O_DIRECT, its lock) are what a running tier needs, not a reader. The
 * selection of live objects is the restart scan's own (ssd_recover_select), so what is listed is
 * what a restart would serve. A repair runs in rounds: dropping the newest copy of a key can let an
 * older complete one become live again (the tier's tombstones do the same), so the files are
 * checked again until a round finds nothing to drop.
 *
 * With replicas the tier reads another copy of a unit when one fails to read, but drops the whole
 * object when the copy it read fails its checksum. So a repair drops an object only when some unit
 * has no good copy left, and retires a bad copy of a unit that has a good one by zeroing that copy's
 * header alone: the restart scan then finds the object complete from the good copies, and the tier
 * never reads the bad one.
 */
#include "ssd_inspect.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/errno_name.h"
#include "common/key.h"
#include "common/log.h"
#include "common/xxh3.h"
#include "ssd_format.h"
#include "ssd_options.h"
#include "ssd_recover.h"

#define MAX_REPAIR_ROUNDS 4
/* Sequence numbers below this (2017-07-14 in ns) were not seeded from the wall clock. */
#define PLAUSIBLE_WALL_NS 1500000000000000000ull

typedef struct zero_action {
    uint32_t file;
    uint64_t offset;
    /* A bad copy retired alone (its object kept): a failed write leaves it as it was and is said
     * in its damage (damage: r->damage index, -1 none), not a failure of the repair. */
    int copy;
    int64_t damage;
    uint64_t object; /* the pass's object ordinal, so an object's dropped count is undone once */
} zero_action;

typedef struct run {
    const kvs_ssd_inspect_options *opt;
    kvs_ssd_inspect_report *rep;
    int fd[KVS_SSD_INSPECT_MAX_FILES];
    char base[KVS_SSD_INSPECT_MAX_FILES][256]; /* the file's name: files of one tier share it */
    uint8_t file_reported[KVS_SSD_INSPECT_MAX_FILES]; /* its file-level damage was reported */
    uint8_t extend[KVS_SSD_INSPECT_MAX_FILES];        /* a repair restores its size */
    dev_t dev[KVS_SSD_INSPECT_MAX_FILES];             /* each file's identity, so one reached */
    ino_t ino[KVS_SSD_INSPECT_MAX_FILES];             /* twice is read once */
    int copy_write_failed;                            /* a retired copy could not be written */
    uint64_t objects_seen;                            /* this pass's object ordinal */
    int mode, emit, report;
    zero_action *zeros;
    size_t n_zeros, cap_zeros;
    kvs_ssd_inspect_damage *damage; /* this pass's, reported once the repair (if any) is done */
    size_t n_damage, cap_damage;
    uint8_t *block; /* SSD_BLOCK */
    uint8_t *unit;  /* one unit's data */
    uint64_t unit_cap;
    uint8_t *object; /* a whole object, for the KV checks */
    uint64_t object_cap;
    uint64_t checked_objects;
    kvs_status status;
    char *err;
    size_t err_len;
} run;

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fail(run *r, kvs_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(run *r, kvs_status status, const char *fmt, ...) {
    if (r->status != KVS_OK) return; /* the first failure is the one to tell */
    r->status = status;
    va_list ap;
    va_start(ap, fmt);
    if (r->err && r->err_len) vsnprintf(r->err, r->err_len, fmt, ap);
    va_end(ap);
}

/* Record a damage (reported after the pass). key NULL: not an object's. */
static kvs_ssd_inspect_damage *add_damage(run *r, uint32_t file, uint64_t offset,
                                          const kvs_key *key) {
    if (!r->report) return NULL;
    if (r->n_damage == r->cap_damage) {
        size_t cap = r->cap_damage ? 2 * r->cap_damage : 64;
        kvs_ssd_inspect_damage *d = realloc(r->damage, cap * sizeof *d);
        if (!d) {
            fail(r, KVS_ENOMEM, "out of memory for the list of damage");
            return NULL;
        }
        r->damage = d;
        r->cap_damage = cap;
    }
    kvs_ssd_inspect_damage *d = &r->damage[r->n_damage++];
    memset(d, 0, sizeof *d);
    d->file = file;
    d->offset = offset;
    if (key) {
        d->has_key = 1;
        d->key = *key;
    }
    return d;
}

static void add_zero(run *r, uint32_t file, uint64_t offset, int copy, int64_t damage) {
    if (r->mode != KVS_SSD_INSPECT_REPAIR) return;
    if (r->n_zeros == r->cap_zeros) {
        size_t cap = r->cap_zeros ? 2 * r->cap_zeros : 64;
        zero_action *z = realloc(r->zeros, cap * sizeof *z);
        if (!z) {
            fail(r, KVS_ENOMEM, "out of memory for the list of repairs");
            return;
        }
        r->zeros = z;
        r->cap_zeros = cap;
    }
    r->zeros[r->n_zeros++] = (zero_action){file, offset, copy, damage, r->objects_seen};
}

/* Read exactly len bytes at off: 0, or the errno (ENODATA for a short read: past the file's end). */
static int read_at(int fd, void *buf, uint64_t len, uint64_t off) {
    uint64_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        if (n == 0) return ENODATA;
        got += (uint64_t)n;
    }
    return 0;
}

static int all_zero(const uint8_t *p, uint64_t len) {
    for (uint64_t i = 0; i < len; i++)
        if (p[i]) return 0;
    return 1;
}

/* ---- locks: the tier holds LOCK_EX on each data file while it runs (ssd.c) ------------------- */

/* The process holding a flock on the file of st, from /proc/locks; 0 when it does not say. */
static int lock_holder(const struct stat *st) {
    FILE *f = fopen("/proc/locks", "r");
    if (!f) return 0;
    char line[256];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char type[16];
        int pid;
        unsigned maj, min;
        unsigned long ino;
        if (sscanf(line, "%*s %15s %*s %*s %d %x:%x:%lu", type, &pid, &maj, &min, &ino) == 5 &&
            !strcmp(type, "FLOCK") && ino == st->st_ino && maj == major(st->st_dev) &&
            min == minor(st->st_dev))
            found = pid;
    }
    fclose(f);
    return found;
}

/* ---- finding the files ----------------------------------------------------------------------- */

static int compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void add_file(run *r, const char *path, const char *name) {
    kvs_ssd_inspect_report *rep = r->rep;
    if (rep->n_files == KVS_SSD_INSPECT_MAX_FILES) {
        fail(r, KVS_EINVAL, "more than %u data files: inspect fewer paths at once",
             KVS_SSD_INSPECT_MAX_FILES);
        return;
    }
    uint32_t i = rep->n_files++;
    kvs_ssd_inspect_file *f = &rep->files[i];
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(r->base[i], sizeof r->base[i], "%s", name);
    int writable = r->mode == KVS_SSD_INSPECT_REPAIR;
    r->fd[i] = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (r->fd[i] < 0) {
        fail(r, KVS_EIO, "cannot open %s: %s", path, kvs_errno_name(errno));
        return;
    }
    struct stat st;
    if (fstat(r->fd[i], &st) != 0) {
        fail(r, KVS_EIO, "cannot stat %s: %s", path, kvs_errno_name(errno));
        return;
    }
    /* The same file reached twice (a link, or a directory and its data file): read once. Before the
     * lock, which a repair would otherwise find held by its own first open. */
    for (uint32_t j = 0; j < i; j++)
        if (r->dev[j] == st.st_dev && r->ino[j] == st.st_ino) {
            close(r->fd[i]);
            r->fd[i] = -1;
            memset(f, 0, sizeof *f);
            rep->n_files--;
            return;
        }
    r->dev[i] = st.st_dev;
    r->ino[i] = st.st_ino;
    /* A repair keeps the tier's lock until it is done, so no tier opens the files under it; a
     * listing only looks (a shared lock taken and let go at once) to say the tier is running. */
    if (flock(r->fd[i], (writable ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) {
        if (!writable) flock(r->fd[i], LOCK_UN);
    } else if (errno == EWOULDBLOCK) {
        f->in_use = 1;
        f->in_use_pid = lock_holder(&st);
        rep->in_use = 1;
    }
}

static void find_in_directory(run *r, const char *dir) {
    if (r->opt->tier) {
        char name[SSD_TIER_NAME_KEPT + 16], path[1200];
        ssd_format_data_file(r->opt->tier, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (access(path, F_OK) != 0) {
            fail(r, KVS_ENOTFOUND, "%s has no data file of tier \"%s\" (%s)", dir, r->opt->tier,
                 name);
            return;
        }
        add_file(r, path, name);
        return;
    }
    DIR *d = opendir(dir);
    if (!d) {
        fail(r, KVS_EIO, "cannot read the directory %s: %s", dir, kvs_errno_name(errno));
        return;
    }
    char *names[KVS_SSD_INSPECT_MAX_FILES + 1] = {NULL};
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n <= KVS_SSD_INSPECT_MAX_FILES) {
        size_t len = strlen(e->d_name);
        if (len > 14 && !strncmp(e->d_name, "kvstrata-", 9) &&
            !strcmp(e->d_name + len - 5, ".data") && (names[n] = strdup(e->d_name)))
            n++;
    }
    closedir(d);
    if (n == 0) fail(r, KVS_ENOTFOUND, "%s holds no ssd tier data file (kvstrata-*.data)", dir);
    qsort(names, n, sizeof *names, compare_names);
    for (size_t i = 0; i < n; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (r->status == KVS_OK) add_file(r, path, names[i]);
        free(names[i]);
    }
}

static void find_files(run *r, const char *const *paths, uint32_t n_paths) {
    for (uint32_t p = 0; p < n_paths && r->status == KVS_OK; p++) {
        struct stat st;
        if (stat(paths[p], &st) != 0) {
            fail(r, KVS_ENOTFOUND, "%s: %s", paths[p], kvs_errno_name(errno));
        } else if (S_ISDIR(st.st_mode)) {
            find_in_directory(r, paths[p]);
        } else {
            /* Grouped by the name of the file itself: a link's own name says nothing of its tier. */
            char *real = realpath(paths[p], NULL);
            const char *name = real ? real : paths[p], *slash = strrchr(name, '/');
            add_file(r, paths[p], slash ? slash + 1 : name);
            free(real);
        }
    }
}

/* ---- one pass over a tier's files ------------------------------------------------------------ */

static int append_unit(ssd_scan_result *res, const ssd_unit_header *h, uint32_t file,
                       uint64_t slot) {
    if (res->n == res->cap) {
        uint64_t cap = res->cap ? res->cap * 2 : 1024;
        ssd_found_unit *u = realloc(res->units, cap * sizeof *u);
        if (!u) return -1;
        res->units = u;
        res->cap = cap;
    }
    res->units[res->n++] = (ssd_found_unit){.key = h->key,
                                            .object_len = h->object_len,
                                            .sequence = h->sequence,
                                            .data_checksum = h->data_checksum,
                                            .unit_index = h->unit_index,
                                            .unit_count = h->unit_count,
                                            .replica_index = h->replica_index,
                                            .replica_count = h->replica_count,
                                            .path = file,
                                            .slot = (uint32_t)slot};
    if (h->sequence > res->max_sequence) res->max_sequence = h->sequence;
    return 0;
}

/* The superblock and the size of file i: 0 when its slots can be scanned. */
static int settle_file(run *r, uint32_t i, ssd_superblock *sb) {
    kvs_ssd_inspect_file *f = &r->rep->files[i];
    struct stat st;
    if (fstat(r->fd[i], &st) != 0) {
        fail(r, KVS_EIO, "cannot stat %s: %s", f->path, kvs_errno_name(errno));
        return -1;
    }
    f->file_bytes = (uint64_t)st.st_size;
    f->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    f->note[0] = '\0';
    int rc = read_at(r->fd[i], r->block, SSD_BLOCK, 0);
    if (rc != 0 || ssd_format_decode_superblock(r->block, sb) != 0 || sb->stripe_bytes == 0 ||
        sb->slot_bytes != SSD_BLOCK + sb->stripe_bytes) {
        f->superblock_ok = 0;
        if (rc != 0 && rc != ENODATA)
            snprintf(f->note, sizeof f->note, "its superblock cannot be read (%s)",
                     kvs_errno_name(rc));
        else
            snprintf(f->note, sizeof f->note,
                     "no valid superblock: the tier writes a new one when it opens and the "
                     "objects of this path are lost");
        if (!r->file_reported[i]) {
            kvs_ssd_inspect_damage *d = add_damage(r, i, 0, NULL);
            if (d) snprintf(d->what, sizeof d->what, "%s", f->note);
            r->rep->damaged++;
            r->file_reported[i] = 1;
        }
        return -1;
    }
    f->superblock_ok = 1;
    snprintf(f->tier, sizeof f->tier, "%s", sb->tier_name);
    f->stripe_bytes = sb->stripe_bytes;
    f->slot_bytes = sb->slot_bytes;
    f->n_slots = sb->n_slots;
    f->capacity = sb->n_slots * sb->stripe_bytes;
    uint64_t want = SSD_BLOCK + sb->n_slots * sb->slot_bytes;
    if (f->file_bytes < want) {
        uint64_t whole =
            f->file_bytes > SSD_BLOCK ? (f->file_bytes - SSD_BLOCK) / sb->slot_bytes : 0;
        snprintf(f->note, sizeof f->note,
                 "truncated: %llu bytes, its superblock describes %llu; slots from %llu on are "
                 "cut off",
                 (unsigned long long)f->file_bytes, (unsigned long long)want,
                 (unsigned long long)whole);
        if (!r->file_reported[i]) {
            kvs_ssd_inspect_damage *d = add_damage(r, i, f->file_bytes, NULL);
            if (d) {
                snprintf(d->what, sizeof d->what, "%s", f->note);
                d->dropped = r->mode == KVS_SSD_INSPECT_REPAIR;
            }
            r->rep->damaged++;
            if (r->mode == KVS_SSD_INSPECT_REPAIR) r->rep->dropped++;
            r->file_reported[i] = 1;
        }
        r->extend[i] = 1;
    }
    return 0;
}

/* Read file i's unit headers into res. */
static void scan_headers(run *r, uint32_t i, const ssd_superblock *sb, ssd_scan_result *res) {
    kvs_ssd_inspect_file *f = &r->rep->files[i];
    for (uint64_t s = 0; s < sb->n_slots && r->status == KVS_OK; s++) {
        uint64_t off = SSD_BLOCK + s * sb->slot_bytes;
        if (off + SSD_BLOCK > f->file_bytes) break; /* truncated: said once for the file */
        int rc = read_at(r->fd[i], r->block, SSD_BLOCK, off);
        r->rep->headers_read++;
        if (rc != 0) {
            kvs_ssd_inspect_damage *d = add_damage(r, i, off, NULL);
            if (d)
                snprintf(d->what, sizeof d->what, "slot %llu: its unit header cannot be read (%s)",
                         (unsigned long long)s, kvs_errno_name(rc));
            r->rep->damaged++;
            continue;
        }
        ssd_unit_header h;
        if (ssd_format_decode_unit(r->block, &h) == 0 && h.stripe_bytes == sb->stripe_bytes) {
            if (append_unit(res, &h, i, s) != 0) fail(r, KVS_ENOMEM, "out of memory for the scan");
        } else if (ssd_format_has_unit_magic(r->block)) {
            /* A unit header that no longer holds: the tier skips it, so the object it belonged to
             * is incomplete and not served; the slot is reused. */
            kvs_ssd_inspect_damage *d = add_damage(r, i, off, NULL);
            if (d) {
                snprintf(d->what, sizeof d->what,
                         "slot %llu: a unit header whose checksum or fields do not hold (its "
                         "object is incomplete and not served)",
                         (unsigned long long)s);
                d->dropped = r->mode == KVS_SSD_INSPECT_REPAIR;
            }
            r->rep->damaged++;
            if (r->mode == KVS_SSD_INSPECT_REPAIR) r->rep->dropped++;
            add_zero(r, i, off, 0, -1);
        } else if (!all_zero(r->block, SSD_BLOCK)) {
            r->rep->stray_units++; /* not a header of this geometry: left over, reused */
        }
    }
}

typedef struct copy_ref {
    int64_t at; /* index into the emitted copies, -1: missing */
    int bad;
    int64_t damage; /* r->damage index of what was found wrong with it, -1 none */
} copy_ref;

static int grow(run *r, uint8_t **buf, uint64_t *cap, uint64_t want) {
    if (*cap >= want) return 0;
    uint8_t *b = realloc(*buf, want ? want : 1);
    if (!b) {
        fail(r, KVS_ENOMEM, "out of memory for %llu bytes", (unsigned long long)want);
        return -1;
    }
    *buf = b;
    *cap = want;
    return 0;
}

typedef struct live_list {
    struct {
        uint64_t at, n; /* copies res.units[at, at + n) */
    } * items;
    uint64_t n, cap, units;
    const ssd_found_unit *base;
    int out_of_memory;
} live_list;

static void collect_live(void *ctx, const ssd_found_unit *copies, uint64_t n) {
    live_list *l = ctx;
    if (l->n == l->cap) {
        uint64_t cap = l->cap ? 2 * l->cap : 1024;
        void *p = realloc(l->items, cap * sizeof *l->items);
        if (!p) {
            l->out_of_memory = 1;
            return;
        }
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n].at = (uint64_t)(copies - l->base);
    l->items[l->n++].n = n;
}

/* Unit copy c of an object in file fi at slot: still the header the scan read? A running tier can
 * rewrite a slot between the scan and the data read; such a slot is not damage. */
static int header_still(run *r, const ssd_found_unit *c, uint64_t off) {
    ssd_unit_header h;
    return read_at(r->fd[c->path], r->block, SSD_BLOCK, off) == 0 &&
           ssd_format_decode_unit(r->block, &h) == 0 &&
           !memcmp(h.key.bytes, c->key.bytes, sizeof h.key.bytes) && h.sequence == c->sequence &&
           h.unit_index == c->unit_index && h.replica_index == c->replica_index;
}

/* Append text to damage d's sentence (when it fits). */
static void damage_note(run *r, int64_t d, const char *text) {
    if (d < 0 || (size_t)d >= r->n_damage) return;
    char *what = r->damage[d].what;
    size_t len = strlen(what);
    snprintf(what + len, sizeof r->damage[d].what - len, "%s", text);
}

/* Every copy of every unit of o (data against its checksum when verifying), then the whole object
 * by the caller's check. Returns 1 when the tier cannot serve o (a unit without a good copy, or an
 * object the caller's check refuses); o->damaged is set when anything is wrong, a lost object or
 * a bad copy whose unit has a good one (marked object_kept in its damage). */
static int check_copies(run *r, const ssd_found_unit *copies, copy_ref *table,
                        kvs_ssd_inspect_object *o, uint64_t stripe) {
    char hex[33];
    kvs_key_hex(&o->key, hex);
    int verify = r->mode == KVS_SSD_INSPECT_VERIFY || r->mode == KVS_SSD_INSPECT_REPAIR;
    int all_units = 1, lost = 0, unit_damage = 0;
    for (uint32_t u = 0; u < o->units && r->status == KVS_OK; u++) {
        uint64_t bytes = ssd_format_unit_bytes(o->len, stripe, u);
        int unit_good = 0, unit_bad = 0;
        for (uint32_t k = 0; k < o->replicas; k++) {
            copy_ref *ref = &table[(uint64_t)u * o->replicas + k];
            if (ref->at < 0) continue;
            const ssd_found_unit *c = &copies[ref->at];
            kvs_ssd_inspect_file *f = &r->rep->files[c->path];
            uint64_t off = SSD_BLOCK + (uint64_t)c->slot * f->slot_bytes;
            if (off + SSD_BLOCK + bytes > f->file_bytes) {
                ref->bad = 1;
                kvs_ssd_inspect_damage *d = add_damage(r, c->path, off, &o->key);
                if (d) {
                    ref->damage = (int64_t)(r->n_damage - 1);
                    snprintf(d->what, sizeof d->what,
                             "unit %u (copy %u) of %s: cut off, its data ends at %llu and the "
                             "file at %llu (truncated)",
                             u, k, hex, (unsigned long long)(off + SSD_BLOCK + bytes),
                             (unsigned long long)f->file_bytes);
                }
                continue;
            }
            if (!verify) {
                unit_good = 1;
                continue;
            }
            if (grow(r, &r->unit, &r->unit_cap, bytes) != 0) return 0;
            int rc = read_at(r->fd[c->path], r->unit, bytes, off + SSD_BLOCK);
            r->rep->checked_bytes += bytes;
            if (rc == 0 && XXH3_64bits(r->unit, bytes) == c->data_checksum) {
                if (!unit_good && o->kv && o->len <= r->object_cap)
                    memcpy(r->object + (uint64_t)u * stripe, r->unit, bytes);
                unit_good = 1;
                continue;
            }
            if (r->rep->in_use && !header_still(r, c, off)) continue;
            ref->bad = 1;
            kvs_ssd_inspect_damage *d = add_damage(r, c->path, off, &o->key);
            if (!d) continue;
            ref->damage = (int64_t)(r->n_damage - 1);
            if (rc != 0)
                snprintf(d->what, sizeof d->what,
                         "unit %u (copy %u) of %s: its data cannot be read (%s)", u, k, hex,
                         kvs_errno_name(rc));
            else if (all_zero(r->unit, bytes) && bytes)
                snprintf(d->what, sizeof d->what,
                         "unit %u (copy %u) of %s: payload checksum mismatch, its data is all "
                         "zero (the header landed, the data did not: a torn write)",
                         u, k, hex);
            else
                snprintf(d->what, sizeof d->what,
                         "unit %u (copy %u) of %s: payload checksum mismatch (header records "
                         "%016llx, data hashes to %016llx)",
                         u, k, hex, (unsigned long long)c->data_checksum,
                         (unsigned long long)XXH3_64bits(r->unit, bytes));
        }
        for (uint32_t k = 0; k < o->replicas; k++)
            unit_bad |= table[(uint64_t)u * o->replicas + k].bad;
        unit_damage |= unit_bad;
        if (!unit_good) all_units = 0;
        if (unit_bad && !unit_good) lost = 1;
    }
    if (verify && all_units && o->kv && o->len <= r->object_cap && r->opt->content &&
        r->opt->content->check) {
        char what[300] = "";
        if (r->opt->content->check(r->opt->content->ctx, r->object, o->len, what, sizeof what)) {
            unit_damage = 1;
            lost = 1;
            kvs_ssd_inspect_damage *d = add_damage(r, o->file, o->offset, &o->key);
            if (d) snprintf(d->what, sizeof d->what, "%s: %s", hex, what);
        }
    }
    /* Not lost: each bad copy's unit has a good one, so the object is whole and only it is bad. */
    for (uint64_t i = 0; !lost && i < (uint64_t)o->units * o->replicas; i++) {
        if (!table[i].bad || table[i].damage < 0) continue;
        r->damage[table[i].damage].object_kept = 1;
        damage_note(r, table[i].damage,
                    "; another copy of this unit is good: the object is kept, and a repair "
                    "retires this copy alone");
    }
    o->damaged = unit_damage;
    return lost;
}

/* What object o is, by the caller's describe over its first bytes, read from a copy of unit 0
 * whose data is in the file. */
static void describe_object(run *r, const ssd_found_unit *copies, const copy_ref *table,
                            kvs_ssd_inspect_object *o, uint64_t stripe) {
    const kvs_ssd_inspect_content *content = r->opt->content;
    if (!content || !content->describe || !content->head_bytes) return;
    uint64_t want = content->head_bytes;
    if (want > o->len) want = o->len;
    if (want > stripe) want = stripe; /* unit 0's data */
    if (grow(r, &r->unit, &r->unit_cap, want) != 0) return;
    for (uint32_t k = 0; k < o->replicas; k++) {
        if (table[k].at < 0) continue;
        const ssd_found_unit *c = &copies[table[k].at];
        const kvs_ssd_inspect_file *f = &r->rep->files[c->path];
        uint64_t off = SSD_BLOCK + (uint64_t)c->slot * f->slot_bytes + SSD_BLOCK;
        if (read_at(r->fd[c->path], r->unit, want, off) != 0) continue;
        o->kv = content->describe(content->ctx, r->unit, want, o->len, o) == 1;
        return;
    }
}

/* One live object of the restart scan's selection: copies[0..n) of one key and sequence. */
static void on_live(run *r, live_list *ec, const ssd_found_unit *copies, uint64_t n) {
    const ssd_found_unit *first = &copies[0];
    if (first->replica_count > SSD_MAX_REPLICAS) return; /* not written by this tier: stray */
    kvs_ssd_inspect_object o = {.key = first->key,
                                .len = first->object_len,
                                .sequence = first->sequence,
                                .units = first->unit_count,
                                .replicas = first->replica_count,
                                .file = first->path};
    uint64_t n_refs = (uint64_t)o.units * o.replicas;
    copy_ref *table = malloc(n_refs * sizeof *table);
    if (!table) {
        fail(r, KVS_ENOMEM, "out of memory for an object of %u units", o.units);
        return;
    }
    for (uint64_t i = 0; i < n_refs; i++) table[i] = (copy_ref){-1, 0, -1};
    for (uint64_t i = 0; i < n; i++) { /* the first copy of a unit and replica wins, as at open */
        copy_ref *ref =
            &table[(uint64_t)copies[i].unit_index * o.replicas + copies[i].replica_index];
        if (ref->at < 0) {
            ref->at = (int64_t)i;
            ec->units++;
        }
    }
    o.offset = SSD_BLOCK + (uint64_t)first->slot * r->rep->files[first->path].slot_bytes;
    if (o.sequence >= PLAUSIBLE_WALL_NS && o.sequence < realtime_ns() + 86400ull * 1000000000ull)
        o.written_after_ns = o.sequence;
    uint64_t stripe = r->rep->files[first->path].stripe_bytes;
    if (r->mode != KVS_SSD_INSPECT_QUICK) describe_object(r, copies, table, &o, stripe);
    if (o.kv && r->mode != KVS_SSD_INSPECT_LIST && r->mode != KVS_SSD_INSPECT_QUICK)
        grow(r, &r->object, &r->object_cap, o.len);
    r->objects_seen++;
    int lost = check_copies(r, copies, table, &o, stripe);
    if (o.damaged) {
        r->rep->damaged++;
        if (r->mode == KVS_SSD_INSPECT_REPAIR && lost) {
            for (uint32_t k = 0; k < o.replicas; k++) /* unit 0 of every copy, as the tier does */
                if (table[k].at >= 0)
                    add_zero(r, copies[table[k].at].path,
                             SSD_BLOCK + (uint64_t)copies[table[k].at].slot *
                                             r->rep->files[copies[table[k].at].path].slot_bytes,
                             0, -1);
            o.dropped = 1;
            r->rep->dropped++;
            for (size_t d = 0; d < r->n_damage; d++)
                if (r->damage[d].has_key && !memcmp(&r->damage[d].key, &o.key, sizeof o.key))
                    r->damage[d].dropped = 1;
        } else if (r->mode == KVS_SSD_INSPECT_REPAIR) {
            /* Each unit has a good copy: retire the bad copies alone, keep the object. */
            for (uint64_t i = 0; i < n_refs; i++) {
                if (!table[i].bad) continue;
                const ssd_found_unit *c = &copies[table[i].at];
                add_zero(r, c->path,
                         SSD_BLOCK + (uint64_t)c->slot * r->rep->files[c->path].slot_bytes, 1,
                         table[i].damage);
                if (table[i].damage >= 0) r->damage[table[i].damage].dropped = 1;
            }
            r->rep->dropped++;
        }
    }
    r->rep->objects++;
    r->rep->bytes += o.len;
    uint64_t seen_files = 0; /* objects per file: those with a copy of some unit there */
    for (uint64_t i = 0; i < n_refs; i++) {
        if (table[i].at < 0) continue;
        const ssd_found_unit *c = &copies[table[i].at];
        kvs_ssd_inspect_file *f = &r->rep->files[c->path];
        f->units++;
        f->bytes += ssd_format_unit_bytes(o.len, stripe, (uint32_t)(i / o.replicas));
        if (!(seen_files >> c->path & 1)) f->objects++;
        seen_files |= 1ull << c->path;
    }
    free(table);
    if (r->mode == KVS_SSD_INSPECT_VERIFY || r->mode == KVS_SSD_INSPECT_REPAIR) {
        r->checked_objects++;
        if (r->opt->progress) kvs_progress_update(r->opt->progress, r->checked_objects);
    }
    if (r->emit && r->opt->on_object) r->opt->on_object(r->opt->ctx, &o);
}

/* Scan the files group[0..n) of one tier in r->mode. */
static void pass(run *r, const uint32_t *group, uint32_t n) {
    ssd_scan_result res = {0};
    r->n_damage = 0;
    r->n_zeros = 0;
    for (uint32_t g = 0; g < n && r->status == KVS_OK; g++) {
        uint32_t i = group[g];
        kvs_ssd_inspect_file *f = &r->rep->files[i];
        f->units = f->bytes = f->objects = 0;
        ssd_superblock sb;
        if (settle_file(r, i, &sb) != 0) continue;
        r->rep->capacity += f->capacity;
        scan_headers(r, i, &sb, &res);
    }
    /* The selection first, so a verify's progress knows how many objects there are. */
    live_list live = {.base = res.units};
    if (r->status == KVS_OK) ssd_recover_select(&res, collect_live, &live);
    if (live.out_of_memory) fail(r, KVS_ENOMEM, "out of memory for the list of objects");
    int verify = r->mode == KVS_SSD_INSPECT_VERIFY || r->mode == KVS_SSD_INSPECT_REPAIR;
    if (verify && r->opt->progress) r->opt->progress->total += live.n;
    for (uint64_t i = 0; i < live.n && r->status == KVS_OK; i++)
        on_live(r, &live, res.units + live.items[i].at, live.items[i].n);
    r->rep->stray_units += res.n - live.units;
    free(live.items);
    free(res.units);
}

/* A repair's writes: a zero block over each header to drop, and truncated files to their size. */
static void apply_repairs(run *r, const uint32_t *group, uint32_t n) {
    uint8_t zero[SSD_BLOCK];
    memset(zero, 0, sizeof zero);
    uint8_t written[KVS_SSD_INSPECT_MAX_FILES] = {0};
    uint64_t undone = UINT64_MAX; /* the last object whose dropped count was taken back */
    for (size_t z = 0; z < r->n_zeros && r->status == KVS_OK; z++) {
        const zero_action *a = &r->zeros[z];
        ssize_t w = pwrite(r->fd[a->file], zero, sizeof zero, (off_t)a->offset);
        int err = w < 0 ? errno : 0;
        written[a->file] = 1;
        if (w == (ssize_t)sizeof zero) continue;
        const char *why = w < 0 ? kvs_errno_name(err) : "short write";
        if (!a->copy) {
            fail(r, KVS_EIO, "cannot write %s at offset %llu: %s", r->rep->files[a->file].path,
                 (unsigned long long)a->offset, why);
            continue;
        }
        /* The object stays served from its good copies either way; this copy stays as it was. */
        r->copy_write_failed = 1;
        if (a->damage >= 0 && (size_t)a->damage < r->n_damage) {
            char note[160];
            snprintf(note, sizeof note, "; retiring this copy failed (%s): it is left as it was",
                     why);
            r->damage[a->damage].dropped = 0;
            damage_note(r, a->damage, note);
        }
        if (undone != a->object && r->rep->dropped) {
            r->rep->dropped--;
            undone = a->object;
        }
    }
    for (uint32_t g = 0; g < n && r->status == KVS_OK; g++) {
        uint32_t i = group[g];
        const kvs_ssd_inspect_file *f = &r->rep->files[i];
        if (r->extend[i] && f->superblock_ok) {
            /* what the tier does at open; done here so a later check finds the file whole */
            if (ftruncate(r->fd[i], (off_t)(SSD_BLOCK + f->n_slots * f->slot_bytes)) != 0)
                fail(r, KVS_EIO, "cannot restore the size of %s: %s", f->path,
                     kvs_errno_name(errno));
            r->extend[i] = 0;
            written[i] = 1;
        }
        if (written[i] && fdatasync(r->fd[i]) != 0)
            fail(r, KVS_EIO, "cannot sync %s: %s", f->path, kvs_errno_name(errno));
    }
}

static void report_damage(run *r) {
    if (r->opt->on_damage)
        for (size_t d = 0; d < r->n_damage; d++) r->opt->on_damage(r->opt->ctx, &r->damage[d]);
    r->n_damage = 0;
}

static void inspect_group(run *r, const uint32_t *group, uint32_t n) {
    r->copy_write_failed = 0;
    if (r->mode != KVS_SSD_INSPECT_REPAIR) {
        r->emit = 1;
        r->report = r->mode != KVS_SSD_INSPECT_QUICK;
        pass(r, group, n);
        if (r->status == KVS_OK) report_damage(r);
        return;
    }
    /* Count objects, bytes and capacity once: from the last pass, after the repairs. */
    kvs_ssd_inspect_report *rep = r->rep;
    for (int round = 0; round < MAX_REPAIR_ROUNDS && r->status == KVS_OK; round++) {
        uint64_t objects = rep->objects, bytes = rep->bytes, capacity = rep->capacity,
                 stray = rep->stray_units;
        r->emit = 0;
        r->report = 1;
        pass(r, group, n);
        rep->objects = objects;
        rep->bytes = bytes;
        rep->capacity = capacity;
        rep->stray_units = stray;
        int extend = 0;
        for (uint32_t g = 0; g < n; g++) extend |= r->extend[group[g]];
        if (r->status != KVS_OK) return;
        if (r->n_zeros == 0 && !extend) {
            report_damage(r);
            break;
        }
        apply_repairs(r, group, n);
        report_damage(r);
        /* A copy that cannot be written would be found and tried again each round. */
        if (r->copy_write_failed) break;
    }
    if (r->status != KVS_OK) return;
    r->mode = KVS_SSD_INSPECT_LIST; /* what is left, listed */
    r->emit = 1;
    r->report = 0;
    pass(r, group, n);
    r->mode = KVS_SSD_INSPECT_REPAIR;
}

void kvs_ssd_data_file_name(const char *tier, char *out, size_t len) {
    ssd_format_data_file(tier, out, len);
}

kvs_status kvs_ssd_inspect_run(const char *const *paths, uint32_t n_paths,
                               const kvs_ssd_inspect_options *opt, kvs_ssd_inspect_report *out,
                               char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!out || !opt || (n_paths && !paths)) return KVS_EINVAL;
    memset(out, 0, sizeof *out);
    run r = {.opt = opt, .rep = out, .mode = opt->mode, .err = err, .err_len = err_len};
    for (uint32_t i = 0; i < KVS_SSD_INSPECT_MAX_FILES; i++) r.fd[i] = -1;
    if (n_paths == 0) fail(&r, KVS_EINVAL, "no path to inspect");
    r.block = malloc(SSD_BLOCK);
    if (!r.block) fail(&r, KVS_ENOMEM, "out of memory");
    if (r.status == KVS_OK) find_files(&r, paths, n_paths);
    if (r.status == KVS_OK && r.mode == KVS_SSD_INSPECT_REPAIR && out->in_use) {
        for (uint32_t i = 0; i < out->n_files; i++) {
            const kvs_ssd_inspect_file *f = &out->files[i];
            if (!f->in_use) continue;
            char pid[64] = "";
            if (f->in_use_pid) snprintf(pid, sizeof pid, " (process %d)", f->in_use_pid);
            fail(&r, KVS_ESTATE,
                 "%s is in use: a running tier%s holds its lock. --repair changes the files and "
                 "needs the tier closed: stop the process that has it open, then run it again "
                 "(--verify works while the tier runs)",
                 f->path, pid);
            break;
        }
    }
    uint8_t done[KVS_SSD_INSPECT_MAX_FILES] = {0};
    for (uint32_t i = 0; i < out->n_files && r.status == KVS_OK; i++) {
        if (done[i]) continue;
        uint32_t group[KVS_SSD_INSPECT_MAX_FILES], n = 0;
        for (uint32_t j = i; j < out->n_files; j++)
            if (!done[j] && !strcmp(r.base[i], r.base[j])) {
                group[n++] = j;
                done[j] = 1;
            }
        inspect_group(&r, group, n);
    }
    for (uint32_t i = 0; i < KVS_SSD_INSPECT_MAX_FILES; i++)
        if (r.fd[i] >= 0) close(r.fd[i]); /* and with it a repair's locks */
    free(r.block);
    free(r.unit);
    free(r.object);
    free(r.zeros);
    free(r.damage);
    return r.status;
}

kvs_status kvs_ssd_inspect_summary_of(const char *const *paths, uint32_t n_paths,
                                      kvs_ssd_inspect_summary *out, char *err, size_t err_len) {
    if (!out) return KVS_EINVAL;
    memset(out, 0, sizeof *out);
    kvs_ssd_inspect_report *rep = malloc(sizeof *rep);
    if (!rep) {
        if (err && err_len) snprintf(err, err_len, "out of memory");
        return KVS_ENOMEM;
    }
    kvs_ssd_inspect_options opt = {.mode = KVS_SSD_INSPECT_QUICK};
    kvs_status rc = kvs_ssd_inspect_run(paths, n_paths, &opt, rep, err, err_len);
    out->objects = rep->objects;
    out->bytes = rep->bytes;
    out->capacity = rep->capacity;
    out->damaged = rep->damaged;
    out->paths = rep->n_files;
    free(rep);
    return rc;
}
