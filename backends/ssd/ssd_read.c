/*
 * ssd_read.c - get, get_many (also in two halves: get_many_start, get_many_finish) and get_range
 * for the ssd tier: every unit of every object of one call is read once, on the copy a policy
 * chose, each path's share submitted as one batch; failed reads retry on another copy; objects
 * found by the restart scan are checked against their unit checksums once. A range read reads only
 * the 4KiB blocks of the units it covers (whole units of an object not verified yet, whose
 * checksums cover whole units) and copies the range out of them.
 */
#include "ssd_tier.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xxh3.h"
#include "ssd_place.h"

/* ---- reads ----------------------------------------------------------------------------------- */

typedef struct read_unit {
    ssd_io_request req;
    ssd_io_waiter *waiter;
    uint64_t item; /* index into the call's keys */
    uint32_t unit;
    uint32_t tried;      /* bit r: copy r was tried */
    uint32_t path;       /* copy being read */
    uint8_t *dst;        /* where the unit's data belongs */
    uint8_t *bounce;     /* aligned buffer when dst cannot take the read directly */
    uint64_t data_bytes; /* object bytes in this unit */
    uint64_t read_bytes; /* bytes read: data_bytes rounded up to 4KiB, or a range's blocks */
    uint64_t unit_off;   /* range reads: where in the unit the read starts (4KiB-aligned) */
    uint8_t *range_dst;  /* range reads: where the range's bytes of this unit go (dst is NULL) */
    uint64_t copy_from, copy_bytes; /* ... taken from the bounce at copy_from */
    int skip;                       /* range reads: a unit outside the range */
    int result;
} read_unit;

#define READ_PENDING INT_MIN

static void read_done(ssd_io_request *req, int result) {
    read_unit *ru = req->ctx;
    __atomic_store_n(&ru->result, result, __ATOMIC_RELAXED);
    ssd_io_waiter_signal(ru->waiter);
}

/* Point ru at copy `path` (a usable path holding it) and pick direct, fixed or bounce. */
static int prepare_read(ssd_tier *t, read_unit *ru, const ssd_object *e, uint32_t replica,
                        uint64_t cap_left) {
    const ssd_copy *c = &e->copies[(uint64_t)ru->unit * e->replicas + replica];
    ru->path = c->path;
    ru->tried |= 1u << replica;
    ssd_io_path *io = t->paths[c->path].io;
    uint8_t *target = ru->dst;
    if (!ru->dst || ((uintptr_t)ru->dst % SSD_BLOCK) != 0 || ru->read_bytes > cap_left) {
        if (!ru->bounce && !(ru->bounce = aligned_alloc(SSD_BLOCK, ru->read_bytes))) return -1;
        target = ru->bounce;
    }
    ssd_io_prepare(&ru->req, SSD_IO_OP_READ, SSD_IO_RESTORE, target, ru->read_bytes,
                   ssd_slot_offset(t, c->slot) + SSD_BLOCK + ru->unit_off, read_done, ru);
    __atomic_store_n(&ru->result, READ_PENDING, __ATOMIC_RELAXED);
    if (target == ru->dst) ru->req.fixed_index = ssd_io_fixed_index(io, target, ru->read_bytes);
    return 0;
}

/* Submit reads[list[0..n)) grouped by path, each path's share as one batch in list order. */
static void submit_reads(ssd_tier *t, read_unit *reads, const uint64_t *list, uint64_t n,
                         int io_class, ssd_io_request **scratch) {
    for (uint32_t p = 0; p < t->n_paths; p++) {
        uint64_t k = 0;
        for (uint64_t i = 0; i < n; i++) {
            read_unit *ru = &reads[list[i]];
            if (ru->path != p) continue;
            ru->req.io_class = (uint8_t)io_class;
            scratch[k++] = &ru->req;
        }
        if (k) ssd_io_submit(t->paths[p].io, scratch, k);
    }
}

/* Wait for every read of the call; a path that stalls past io_timeout_ms is isolated, but the call
 * still waits for its buffers back (O_DIRECT transfers cannot be abandoned). */
static void wait_reads(ssd_tier *t, ssd_io_waiter *w, read_unit *reads, uint64_t n) {
    if (ssd_io_waiter_wait(w, t->io_timeout_ms) != ETIMEDOUT) return;
    for (uint64_t i = 0; i < n; i++) {
        if (__atomic_load_n(&reads[i].result, __ATOMIC_RELAXED) == READ_PENDING &&
            reads[i].path != SSD_NO_PATH && !ssd_io_failed(t->paths[reads[i].path].io)) {
            ssd_log(t, KVS_LOG_ERROR, "path %u (%s): a read took longer than io_timeout_ms %llu",
                    reads[i].path, t->paths[reads[i].path].dir,
                    (unsigned long long)t->io_timeout_ms);
            ssd_io_fail(t->paths[reads[i].path].io, ETIMEDOUT);
        }
    }
    while (ssd_io_waiter_wait(w, t->io_timeout_ms) == ETIMEDOUT) {
    }
}

/* Room left in the caller's buffer from a whole-object read's unit on (range reads go through a
 * bounce: no limit applies). */
static uint64_t cap_left(const ssd_tier *t, const read_unit *ru, const uint64_t *caps) {
    return ru->range_dst ? UINT64_MAX : caps[ru->item] - (uint64_t)ru->unit * t->stripe_bytes;
}

/* Per item of a get_many call. */
typedef struct read_item {
    uint32_t object; /* SSD_NIL: nothing to read */
    uint64_t first_read, n_reads;
    uint64_t same_as; /* an earlier item with the same key, or UINT64_MAX */
    int failed_path;  /* a read failed on every copy: the path of the last try */
    int failed_errno;
    int corrupt;
    /* the first unit that failed its checksum, for the message */
    uint32_t corrupt_unit, corrupt_path;
    uint64_t corrupt_offset, stored_sum, computed_sum;
    int corrupt_zero; /* its data was all zero bytes: the data write never landed */
} read_item;

static int all_zero(const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* A unit's data against the checksum its header records; the first mismatch of an item is kept
 * with what was found, so the message says it. 1 when the data matches. */
static int unit_matches(read_item *it, const read_unit *ru, const uint8_t *data, uint64_t stored) {
    uint64_t computed = kvs_xxh3_64(data, ru->data_bytes);
    if (computed == stored) return 1;
    if (!it->corrupt) {
        it->corrupt = 1;
        it->corrupt_unit = ru->unit;
        it->corrupt_path = ru->path;
        it->corrupt_offset = ru->req.offset;
        it->stored_sum = stored;
        it->computed_sum = computed;
        it->corrupt_zero = all_zero(data, ru->data_bytes);
    }
    return 0;
}

/* Where a range [off, off + len) of an object meets unit u (unit_start us, data_bytes bytes): fills
 * the read's offset, size and copy; marks it skipped when they do not meet. Whole units when the
 * object is not verified yet (its checksums cover whole units). */
static void range_unit(read_unit *ru, uint64_t us, uint64_t off, uint64_t len, uint8_t *dst,
                       int whole) {
    uint64_t lo = off > us ? off : us,
             hi = off + len < us + ru->data_bytes ? off + len : us + ru->data_bytes;
    if (lo >= hi) {
        ru->skip = 1;
        ru->result = 0;
        return;
    }
    ru->unit_off = whole ? 0 : (lo - us) / SSD_BLOCK * SSD_BLOCK;
    uint64_t end =
        whole ? ssd_round_up(ru->data_bytes, SSD_BLOCK) : ssd_round_up(hi - us, SSD_BLOCK);
    ru->read_bytes = end - ru->unit_off;
    ru->dst = NULL; /* through a bounce, then the range's part copied out */
    ru->range_dst = dst + (lo - off);
    ru->copy_from = lo - us - ru->unit_off;
    ru->copy_bytes = hi - lo;
}

/* One get_many (or get, get_range) call from its start to its finish: the caller's arrays, the
 * objects it holds and the reads it issued. The waiter lives here, so the call must not move. */
struct ssd_read_call {
    ssd_read_call *next; /* the tier's calls in flight (get_many_start) */
    uint64_t ticket;
    void *const *dsts;
    const uint64_t *caps;
    uint64_t n;
    uint64_t *lens;
    kvs_status *statuses;
    int io_class;
    const uint64_t (*ranges)[2];
    read_item *items;
    uint64_t *seen_item; /* object -> first item, to merge equal keys */
    read_unit *reads;
    uint64_t total_reads;
    uint32_t *n_copies, *copy_paths, *chosen;
    uint64_t *order, *sched;
    ssd_io_request **scratch;
    ssd_io_waiter waiter;
    int waiter_ready;
    kvs_status rc; /* KVS_OK once its reads are issued */
};

static void free_call(ssd_read_call *call) {
    if (call->waiter_ready) ssd_io_waiter_destroy(&call->waiter);
    if (call->reads)
        for (uint64_t r = 0; r < call->total_reads; r++) free(call->reads[r].bounce);
    free(call->items);
    free(call->seen_item);
    free(call->reads);
    free(call->sched);
    free(call->n_copies);
    free(call->copy_paths);
    free(call->chosen);
    free(call->order);
    free(call->scratch);
    free(call);
}

static kvs_status read_finish(ssd_tier *t, ssd_read_call *call);

/* Phase 1 of read_start: find the objects and hold them (refs) so their slots cannot be reused
 * under the reads; an object asked for twice is read once (same_as). Sets each item's reads and the
 * call's total_reads; returns the most copies any held object has. Takes the tier's lock. */
static uint32_t hold_objects(ssd_tier *t, ssd_read_call *call, const kvs_key *keys,
                             uint64_t set_cap) {
    read_item *items = call->items;
    uint64_t *seen_item = call->seen_item, *lens = call->lens;
    kvs_status *statuses = call->statuses;
    const uint64_t(*ranges)[2] = call->ranges;
    uint64_t total_reads = 0;
    uint32_t max_copies = 1;
    pthread_mutex_lock(&t->mutex);
    for (uint64_t i = 0; i < call->n; i++) {
        read_item *it = &items[i];
        it->object = SSD_NIL;
        it->same_as = UINT64_MAX;
        it->failed_path = -1;
        lens[i] = 0;
        uint32_t o = ssd_find_readable(t, &keys[i]);
        if (o == SSD_NIL) {
            statuses[i] = KVS_ENOTFOUND;
            continue;
        }
        ssd_object *e = ssd_obj(t, o);
        lens[i] = e->len;
        if ((!ranges && call->caps[i] < e->len) || (ranges && call->caps[i] < ranges[i][1]) ||
            (!call->dsts[i] && e->len)) {
            statuses[i] = KVS_EOVERFLOW;
            continue;
        }
        statuses[i] = KVS_OK;
        ssd_lru_touch(t, o);
        uint64_t b = (o * 0x9E3779B97F4A7C15ull >> 7) & (set_cap - 1);
        while (seen_item[b] != UINT64_MAX && items[seen_item[b]].object != o)
            b = (b + 1) & (set_cap - 1);
        if (seen_item[b] != UINT64_MAX) {
            it->same_as = seen_item[b];
            continue;
        }
        seen_item[b] = i;
        e->refs++;
        it->object = o;
        it->first_read = total_reads;
        it->n_reads = e->len ? e->n_units : 0;
        total_reads += it->n_reads;
        if (e->replicas > max_copies) max_copies = e->replicas;
    }
    pthread_mutex_unlock(&t->mutex);
    call->total_reads = total_reads;
    return max_copies;
}

/* Phase 2 of read_start: one read per (object, unit); those with a usable copy are offered to the
 * policy (their copies' paths in copy_paths, max_copies per read), sched[] mapping its indices back
 * to reads. Returns how many were offered. */
static uint64_t plan_reads(ssd_tier *t, ssd_read_call *call, uint32_t max_copies) {
    uint64_t n_sched = 0;
    for (uint64_t i = 0; i < call->n; i++) {
        read_item *it = &call->items[i];
        if (it->object == SSD_NIL) continue;
        const ssd_object *e = ssd_obj(t, it->object); /* copies of a live object do not change */
        for (uint32_t u = 0; u < it->n_reads; u++) {
            read_unit *ru = &call->reads[it->first_read + u];
            ru->waiter = &call->waiter;
            ru->item = i;
            ru->unit = u;
            ru->path = SSD_NO_PATH;
            ru->result = -EIO; /* until it is issued: no usable copy */
            ru->dst = (uint8_t *)call->dsts[i] + (uint64_t)u * t->stripe_bytes;
            ru->data_bytes = ssd_format_unit_bytes(e->len, t->stripe_bytes, u);
            ru->read_bytes = ssd_round_up(ru->data_bytes, SSD_BLOCK);
            if (call->ranges) {
                range_unit(ru, (uint64_t)u * t->stripe_bytes, call->ranges[i][0],
                           call->ranges[i][1], call->dsts[i],
                           !__atomic_load_n(&e->verified, __ATOMIC_RELAXED));
                if (ru->skip) continue;
            }
            uint32_t k = 0;
            for (uint32_t c = 0; c < e->replicas; c++) {
                const ssd_copy *cp = &e->copies[(uint64_t)u * e->replicas + c];
                if (cp->path != SSD_NO_PATH && ssd_path_usable(t, cp->path))
                    call->copy_paths[n_sched * max_copies + k++] = cp->path;
            }
            if (k == 0) continue;
            call->n_copies[n_sched] = k;
            call->sched[n_sched++] = it->first_read + u;
        }
    }
    return n_sched;
}

/* Trust the policy as far as it is right: an order that is not a permutation becomes the plain
 * order (a path it was not offered is handled when the read is issued). */
static void check_order(uint64_t *order, uint64_t n_sched, uint64_t alloc) {
    uint8_t *seen = calloc(alloc, 1);
    int permutation = seen != NULL;
    for (uint64_t k = 0; k < n_sched && permutation; k++) {
        if (order[k] >= n_sched || seen[order[k]])
            permutation = 0;
        else
            seen[order[k]] = 1;
    }
    free(seen);
    if (!permutation)
        for (uint64_t k = 0; k < n_sched; k++) order[k] = k;
}

/* Phase 3 of read_start: prepare each offered read on the copy the policy chose (a path it was not
 * offered becomes the first copy that was), in the policy's order; the reads to issue are left in
 * order[0..n). Returns n. */
static uint64_t prepare_issue(ssd_tier *t, ssd_read_call *call, uint64_t n_sched) {
    uint64_t n_issue = 0, *order = call->order;
    for (uint64_t k = 0; k < n_sched; k++) {
        uint64_t s = order[k], r = call->sched[s];
        read_unit *ru = &call->reads[r];
        const ssd_object *e = ssd_obj(t, call->items[ru->item].object);
        uint32_t replica = SSD_NO_PATH, first_usable = SSD_NO_PATH;
        for (uint32_t c = 0; c < e->replicas && replica == SSD_NO_PATH; c++) {
            const ssd_copy *cp = &e->copies[(uint64_t)ru->unit * e->replicas + c];
            if (cp->path == SSD_NO_PATH || !ssd_path_usable(t, cp->path)) continue;
            if (first_usable == SSD_NO_PATH) first_usable = c;
            if (cp->path == call->chosen[s]) replica = c;
        }
        if (replica == SSD_NO_PATH) replica = first_usable;
        if (replica == SSD_NO_PATH)
            continue; /* its path failed since: -EIO stands, a retry may find another */
        if (prepare_read(t, ru, e, replica, cap_left(t, ru, call->caps)) != 0) {
            ru->result = -ENOMEM;
            continue;
        }
        if (ru->bounce && !ru->range_dst) atomic_fetch_add(&t->bounce_reads, 1);
        order[n_issue++] = r;
    }
    return n_issue;
}

/* The first half of a read of n objects: find and hold them, plan one read per unit and issue them.
 * ranges (NULL: whole objects) gives per item the [offset, offset + length) pair to read; dsts[i]
 * then has room for the range, and lens[i] still gets the object's length. On KVS_OK *out is the
 * call, whose reads are in flight (read_finish completes it); on a failure the call is over. */
static kvs_status read_start(ssd_tier *t, const kvs_key *keys, void *const *dsts,
                             const uint64_t *caps, uint64_t n, uint64_t *lens, kvs_status *statuses,
                             int io_class, const uint64_t (*ranges)[2], ssd_read_call **out) {
    *out = NULL;
    uint64_t set_cap = 2;
    while (set_cap < 2 * n) set_cap <<= 1;
    ssd_read_call *call = calloc(1, sizeof *call);
    read_item *items = calloc(n ? n : 1, sizeof *items);
    uint64_t *seen_item = malloc(set_cap * sizeof *seen_item);
    if (!call || !items || !seen_item) {
        free(call);
        free(items);
        free(seen_item);
        ssd_set_error(t, "out of memory for a read of %llu objects", (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) statuses[i] = KVS_ENOMEM;
        return KVS_ENOMEM;
    }
    *call = (ssd_read_call){.dsts = dsts,
                            .caps = caps,
                            .n = n,
                            .lens = lens,
                            .statuses = statuses,
                            .io_class = io_class,
                            .ranges = ranges,
                            .items = items,
                            .seen_item = seen_item,
                            .rc = KVS_ENOMEM};
    for (uint64_t b = 0; b < set_cap; b++) seen_item[b] = UINT64_MAX;
    /* 1. Find the objects and hold them. */
    uint32_t max_copies = hold_objects(t, call, keys, set_cap);

    /* 2. One read per (object, unit); the policy picks the copy and the submission order. */
    uint64_t alloc = call->total_reads ? call->total_reads : 1;
    call->reads = calloc(alloc, sizeof *call->reads);
    call->sched = calloc(alloc, sizeof *call->sched);
    call->n_copies = calloc(alloc, sizeof *call->n_copies);
    call->copy_paths = calloc(alloc * max_copies, sizeof *call->copy_paths);
    call->chosen = calloc(alloc, sizeof *call->chosen);
    call->order = calloc(alloc, sizeof *call->order);
    call->scratch = calloc(alloc, sizeof *call->scratch);
    if (!call->reads || !call->sched || !call->n_copies || !call->copy_paths || !call->chosen ||
        !call->order || !call->scratch || ssd_io_waiter_init(&call->waiter, 0) != 0) {
        read_finish(t, call); /* releases the objects; every found one reads KVS_ENOMEM */
        return KVS_ENOMEM;
    }
    call->waiter_ready = 1;
    uint64_t n_sched = plan_reads(t, call, max_copies);
    if (n_sched && t->schedule)
        t->schedule(t->host_ctx, t->n_paths, n_sched, max_copies, call->n_copies, call->copy_paths,
                    call->chosen, call->order);
    else if (n_sched)
        ssd_place_schedule(t->n_paths, n_sched, max_copies, call->n_copies, call->copy_paths,
                           call->chosen, call->order);
    check_order(call->order, n_sched, alloc);

    /* 3. Issue: each path's reads as one batch, in the policy's order. */
    uint64_t n_issue = prepare_issue(t, call, n_sched);
    call->rc = KVS_OK;
    ssd_io_waiter_add(&call->waiter, n_issue);
    submit_reads(t, call->reads, call->order, n_issue, io_class, call->scratch);
    *out = call;
    return KVS_OK;
}

/* Phase 4 of read_finish: a read that failed tries the unit's next usable copy, until none is
 * left. */
static void retry_failed_reads(ssd_tier *t, ssd_read_call *call) {
    read_unit *reads = call->reads;
    uint64_t *order = call->order, total_reads = call->total_reads;
    for (;;) {
        uint64_t n_retry = 0;
        for (uint64_t r = 0; r < total_reads; r++) {
            read_unit *ru = &reads[r];
            if (ru->result >= 0 || ru->result == -ENOMEM) continue;
            const ssd_object *e = ssd_obj(t, call->items[ru->item].object);
            uint32_t replica = SSD_NO_PATH;
            for (uint32_t c = 0; c < e->replicas && replica == SSD_NO_PATH; c++) {
                const ssd_copy *cp = &e->copies[(uint64_t)ru->unit * e->replicas + c];
                if (!(ru->tried & (1u << c)) && cp->path != SSD_NO_PATH &&
                    ssd_path_usable(t, cp->path))
                    replica = c;
            }
            if (replica == SSD_NO_PATH) continue;
            if (prepare_read(t, ru, e, replica, cap_left(t, ru, call->caps)) != 0) continue;
            order[n_retry++] = r;
        }
        if (n_retry == 0) break;
        ssd_io_waiter_add(&call->waiter, n_retry);
        submit_reads(t, reads, order, n_retry, call->io_class, call->scratch);
        wait_reads(t, &call->waiter, reads, total_reads);
    }
}

/* Phase 5 of read_finish: bounce copies, first-read verification of recovered objects, and each
 * item's first failure. */
static void complete_units(ssd_tier *t, ssd_read_call *call) {
    for (uint64_t r = 0; r < call->total_reads; r++) {
        read_unit *ru = &call->reads[r];
        read_item *it = &call->items[ru->item];
        if (ru->result < 0) {
            if (!it->failed_errno) {
                it->failed_errno = -ru->result;
                it->failed_path = ru->path == SSD_NO_PATH ? -1 : (int)ru->path;
            }
            continue;
        }
        if (ru->skip) continue;
        const ssd_object *e = ssd_obj(t, it->object);
        if (ru->range_dst) { /* an unverified object's units were read whole: check, then copy */
            if (!__atomic_load_n(&e->verified, __ATOMIC_RELAXED) &&
                !unit_matches(it, ru, ru->bounce, e->checksums[ru->unit]))
                continue;
            else
                memcpy(ru->range_dst, ru->bounce + ru->copy_from, ru->copy_bytes);
            continue;
        }
        if (ru->bounce && ru->data_bytes) memcpy(ru->dst, ru->bounce, ru->data_bytes);
        if (!__atomic_load_n(&e->verified, __ATOMIC_RELAXED))
            unit_matches(it, ru, ru->dst, e->checksums[ru->unit]);
    }
}

/* An object whose unit failed its checksum: say which unit, where, and what the data looked like,
 * and remove it. Under the tier's lock. */
static void drop_corrupt(ssd_tier *t, const read_item *it, ssd_object *e) {
    atomic_fetch_add(&t->corrupt_drops, 1);
    char key[40], what[640];
    for (int b = 0; b < 16; b++) snprintf(key + 2 * b, 3, "%02x", e->key.bytes[b]);
    if (it->corrupt_zero)
        snprintf(what, sizeof what,
                 "unit %u of %s (path %u, %s, offset %llu), found after a restart: payload "
                 "checksum mismatch, its data blocks are all zero (the header landed, the "
                 "data write did not: "
                 "a torn write); removed",
                 it->corrupt_unit, key, it->corrupt_path, t->paths[it->corrupt_path].dir,
                 (unsigned long long)it->corrupt_offset);
    else
        snprintf(what, sizeof what,
                 "unit %u of %s (path %u, %s, offset %llu), found after a restart: payload "
                 "checksum mismatch (header records %016llx, data hashes to %016llx): the "
                 "data was partly "
                 "written or changed on the device; removed",
                 it->corrupt_unit, key, it->corrupt_path, t->paths[it->corrupt_path].dir,
                 (unsigned long long)it->corrupt_offset, (unsigned long long)it->stored_sum,
                 (unsigned long long)it->computed_sum);
    ssd_set_error(t, "%s", what);
    ssd_log(t, KVS_LOG_WARN, "%s", what);
    if (e->state == OBJ_LIVE) ssd_remove_with_tombstone(t, it->object);
}

/* Each held object's status (a failed read, a checksum mismatch, or verified now), then its
 * reference released. Takes the tier's lock. */
static void release_objects(ssd_tier *t, ssd_read_call *call, kvs_status rc) {
    pthread_mutex_lock(&t->mutex);
    for (uint64_t i = 0; i < call->n; i++) {
        read_item *it = &call->items[i];
        if (it->object == SSD_NIL) continue;
        ssd_object *e = ssd_obj(t, it->object);
        if (rc != KVS_OK) {
            call->statuses[i] = KVS_ENOMEM;
        } else if (it->failed_errno) {
            call->statuses[i] = it->failed_errno == ENOMEM ? KVS_ENOMEM : KVS_EIO;
            if (it->failed_path >= 0)
                ssd_set_error(t, "reading an object failed on path %d (%s): %s", it->failed_path,
                              t->paths[it->failed_path].dir, kvs_errno_name(it->failed_errno));
            else
                ssd_set_error(t, "reading an object failed: %s", kvs_errno_name(it->failed_errno));
            if (e->state == OBJ_LIVE && !ssd_object_readable(t, e)) ssd_drop_live(t, it->object);
        } else if (it->corrupt) {
            call->statuses[i] = KVS_ECORRUPT;
            drop_corrupt(t, it, e);
        } else if (!call->ranges) { /* a range checked only some units */
            __atomic_store_n(&e->verified, 1, __ATOMIC_RELAXED);
        }
        ssd_object_unref(t, it->object);
    }
    pthread_mutex_unlock(&t->mutex);
}

/* The second half: wait for the call's reads, retry failed ones on other copies, verify, release
 * the objects, fill statuses and free the call. Returns the call's own status. */
static kvs_status read_finish(ssd_tier *t, ssd_read_call *call) {
    read_item *items = call->items;
    uint64_t n = call->n;
    void *const *dsts = call->dsts;
    uint64_t *lens = call->lens;
    kvs_status *statuses = call->statuses, rc = call->rc;
    if (rc == KVS_OK) {
        wait_reads(t, &call->waiter, call->reads, call->total_reads);
        /* 4. A read that failed tries the unit's next usable copy. */
        retry_failed_reads(t, call);
        /* 5. Bounce copies, first-read verification of recovered objects. */
        complete_units(t, call);
    }
    /* 6. Statuses, and the objects released. */
    release_objects(t, call, rc);
    /* Equal keys in one call: the first one's bytes and status. */
    for (uint64_t i = 0; i < n; i++) {
        if (items[i].same_as == UINT64_MAX) continue;
        uint64_t j = items[i].same_as;
        statuses[i] = rc == KVS_OK ? statuses[j] : KVS_ENOMEM;
        lens[i] = lens[j];
        if (statuses[i] == KVS_OK && lens[i]) memcpy(dsts[i], dsts[j], lens[i]);
    }
    free_call(call);
    return rc;
}

/* get_many, get and get_range: both halves at once. */
static kvs_status ssd_read_objects(ssd_tier *t, const kvs_key *keys, void *const *dsts,
                                   const uint64_t *caps, uint64_t n, uint64_t *lens,
                                   kvs_status *statuses, int io_class,
                                   const uint64_t (*ranges)[2]) {
    ssd_read_call *call;
    kvs_status rc = read_start(t, keys, dsts, caps, n, lens, statuses, io_class, ranges, &call);
    return rc == KVS_OK ? read_finish(t, call) : rc;
}

kvs_status ssd_get_many(void *state, const kvs_key *keys, void *const *dsts, const uint64_t *caps,
                        uint64_t n, uint64_t *lens, kvs_status *statuses) {
    ssd_tier *t = state;
    if (!t || (n && (!keys || !dsts || !caps || !lens || !statuses))) return KVS_EINVAL;
    return ssd_read_objects(t, keys, dsts, caps, n, lens, statuses, SSD_IO_RESTORE, NULL);
}

/* The calls in flight are a list under the tier's lock, so a ticket is checked before it is used:
 * an unknown or finished one is refused, never dereferenced. */
kvs_status ssd_get_many_start(void *state, const kvs_key *keys, void *const *dsts,
                              const uint64_t *caps, uint64_t n, uint64_t *lens,
                              kvs_status *statuses, uint64_t *ticket) {
    ssd_tier *t = state;
    if (!t || !ticket || (n && (!keys || !dsts || !caps || !lens || !statuses))) return KVS_EINVAL;
    ssd_read_call *call;
    kvs_status rc = read_start(t, keys, dsts, caps, n, lens, statuses, SSD_IO_RESTORE, NULL, &call);
    if (rc != KVS_OK) return rc;
    pthread_mutex_lock(&t->mutex);
    call->ticket = ++t->next_ticket;
    call->next = t->calls;
    t->calls = call;
    pthread_mutex_unlock(&t->mutex);
    *ticket = call->ticket;
    return KVS_OK;
}

/* Takes a call out of the list: the one of ticket, or with any the first one; NULL when there is
 * none. */
static ssd_read_call *take_call(ssd_tier *t, uint64_t ticket, int any) {
    pthread_mutex_lock(&t->mutex);
    ssd_read_call **at = &t->calls;
    while (*at && !any && (*at)->ticket != ticket) at = &(*at)->next;
    ssd_read_call *call = *at;
    if (call) *at = call->next;
    pthread_mutex_unlock(&t->mutex);
    return call;
}

kvs_status ssd_get_many_finish(void *state, uint64_t ticket) {
    ssd_tier *t = state;
    if (!t) return KVS_EINVAL;
    ssd_read_call *call = take_call(t, ticket, 0);
    if (!call) {
        ssd_set_error(t,
                      "get_many_finish: ticket %llu is not in flight (never started, or "
                      "finished already)",
                      (unsigned long long)ticket);
        return KVS_EINVAL;
    }
    return read_finish(t, call);
}

void ssd_finish_calls(ssd_tier *t) {
    ssd_read_call *call;
    while ((call = take_call(t, 0, 1))) read_finish(t, call);
}

kvs_status ssd_get(void *state, const kvs_key *key, void *dst, uint64_t cap, uint64_t *len) {
    ssd_tier *t = state;
    if (!t || !key || !len || (!dst && cap)) return KVS_EINVAL;
    kvs_status status = KVS_OK;
    void *dsts[1] = {dst};
    kvs_status rc = ssd_read_objects(t, key, dsts, &cap, 1, len, &status, SSD_IO_PREFETCH, NULL);
    if (rc != KVS_OK) return rc;
    if (status == KVS_ENOTFOUND)
        ssd_set_error(t, "object not stored");
    else if (status == KVS_EOVERFLOW)
        ssd_set_error(t, "object of %llu bytes does not fit a buffer of %llu bytes",
                      (unsigned long long)*len, (unsigned long long)cap);
    return status;
}

kvs_status ssd_get_range(void *state, const kvs_key *key, uint64_t offset, uint64_t len, void *dst,
                         uint64_t *got, uint64_t *object_len) {
    ssd_tier *t = state;
    if (!t || !key || !got || !object_len || (!dst && len)) return KVS_EINVAL;
    *got = 0;
    *object_len = 0;
    /* range_unit clips the range to each unit (and so to the object): the bytes copied are its overlap
     * with [0, object length) */
    uint64_t range[1][2] = {{offset, len}}, cap = len, olen = 0;
    kvs_status status = KVS_OK;
    void *dsts[1] = {dst};
    kvs_status rc = ssd_read_objects(t, key, dsts, &cap, 1, &olen, &status, SSD_IO_RESTORE, range);
    if (rc != KVS_OK) return rc;
    if (status == KVS_ENOTFOUND) ssd_set_error(t, "object not stored");
    if (status != KVS_OK) return status;
    *object_len = olen;
    *got = offset >= olen ? 0 : olen - offset < len ? olen - offset : len;
    return KVS_OK;
}
