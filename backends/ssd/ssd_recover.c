/*
 * ssd_recover.c - the restart scan of the ssd tier (contract in ssd_recover.h).
 *
 * A header counts only if its checksum holds and its fields agree with each other and with the
 * configured stripe. An object is live when one sequence of its key has every unit; the newest
 * such sequence wins, so a torn rewrite (newer, incomplete) leaves the older complete copy live,
 * and equal keys carry equal bytes.
 */
#include "ssd_recover.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ssd_format.h"

typedef struct scan_read {
    ssd_io_request req;
    ssd_io_waiter *waiter;
    uint32_t path, slot;
} scan_read;

static void scan_done(ssd_io_request *req, int result) {
    (void)result; /* kept in req->result */
    scan_read *s = req->ctx;
    ssd_io_waiter_signal(s->waiter);
}

static int append(ssd_scan_result *out, const ssd_unit_header *h, uint32_t path, uint32_t slot) {
    if (out->n == out->cap) {
        uint64_t cap = out->cap ? out->cap * 2 : 1024;
        ssd_found_unit *u = realloc(out->units, cap * sizeof *u);
        if (!u) return ENOMEM;
        out->units = u;
        out->cap = cap;
    }
    ssd_found_unit *f = &out->units[out->n++];
    f->key = h->key;
    f->object_len = h->object_len;
    f->sequence = h->sequence;
    f->data_checksum = h->data_checksum;
    f->unit_index = h->unit_index;
    f->unit_count = h->unit_count;
    f->replica_index = h->replica_index;
    f->replica_count = h->replica_count;
    f->path = path;
    f->slot = slot;
    return 0;
}

int ssd_recover_scan(ssd_io_path *const *io, uint32_t n_paths, const uint64_t *scan_slots,
                     uint64_t slot_bytes, uint64_t stripe_bytes, uint32_t batch,
                     uint64_t timeout_ms, kvs_progress *progress, ssd_scan_result *out) {
    memset(out, 0, sizeof *out);
    if (batch == 0) batch = 1;
    uint64_t per_round = (uint64_t)batch * n_paths;
    uint8_t *buffers = aligned_alloc(SSD_BLOCK, per_round * SSD_BLOCK);
    scan_read *reads = calloc(per_round, sizeof *reads);
    uint64_t *next = calloc(n_paths, sizeof *next);
    ssd_io_request **list = calloc(batch, sizeof *list);
    ssd_io_waiter waiter;
    int rc = ENOMEM;
    if (!buffers || !reads || !next || !list || ssd_io_waiter_init(&waiter, 0) != 0) goto out_free;
    rc = 0;
    for (;;) {
        uint64_t issued = 0;
        for (uint32_t p = 0; p < n_paths; p++) {
            if (!io[p] || ssd_io_failed(io[p]) || next[p] >= scan_slots[p]) continue;
            uint64_t k = scan_slots[p] - next[p] < batch ? scan_slots[p] - next[p] : batch;
            ssd_io_waiter_add(&waiter, k);
            for (uint64_t i = 0; i < k; i++) {
                scan_read *s = &reads[issued + i];
                s->waiter = &waiter;
                s->path = p;
                s->slot = (uint32_t)(next[p] + i);
                ssd_io_prepare(&s->req, SSD_IO_OP_READ, SSD_IO_RESTORE,
                               buffers + (issued + i) * SSD_BLOCK, SSD_BLOCK,
                               SSD_BLOCK + (uint64_t)s->slot * slot_bytes, scan_done, s);
                list[i] = &s->req;
            }
            ssd_io_submit(io[p], list, k);
            next[p] += k;
            issued += k;
        }
        if (issued == 0) break;
        if (ssd_io_waiter_wait(&waiter, timeout_ms) == ETIMEDOUT) {
            for (uint32_t p = 0; p < n_paths; p++)
                if (io[p])
                    ssd_io_fail(io[p],
                                ETIMEDOUT); /* which path stalls is unknown: all of them did */
            while (ssd_io_waiter_wait(&waiter, timeout_ms) == ETIMEDOUT) {
            }
        }
        out->headers_read += issued;
        if (progress) kvs_progress_update(progress, out->headers_read);
        for (uint64_t i = 0; i < issued && rc == 0; i++) {
            ssd_unit_header h;
            if (reads[i].req.result < 0) continue;
            if (ssd_format_decode_unit(buffers + i * SSD_BLOCK, &h) != 0 ||
                h.stripe_bytes != stripe_bytes)
                continue;
            if (h.sequence > out->max_sequence) out->max_sequence = h.sequence;
            rc = append(out, &h, reads[i].path, reads[i].slot);
        }
        if (rc) break;
    }
    ssd_io_waiter_destroy(&waiter);
    /* Units on a path that failed during the scan cannot be read: leave them out. */
    uint64_t kept = 0;
    for (uint64_t i = 0; i < out->n; i++)
        if (!ssd_io_failed(io[out->units[i].path])) out->units[kept++] = out->units[i];
    out->n = kept;
out_free:
    free(buffers);
    free(reads);
    free(next);
    free(list);
    if (rc) {
        free(out->units);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

static int compare_found(const void *a, const void *b) {
    const ssd_found_unit *x = a, *y = b;
    int c = memcmp(x->key.bytes, y->key.bytes, sizeof x->key.bytes);
    if (c) return c;
    if (x->sequence != y->sequence) return x->sequence > y->sequence ? -1 : 1; /* newest first */
    if (x->unit_index != y->unit_index) return x->unit_index < y->unit_index ? -1 : 1;
    if (x->replica_index != y->replica_index) return x->replica_index < y->replica_index ? -1 : 1;
    if (x->path != y->path) return x->path < y->path ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Units [first, end) share key and sequence. Keep those that agree with the first on length and
 * counts (moving them to the front); 1 when every unit index is covered. */
static int complete_group(ssd_found_unit *u, uint64_t first, uint64_t end, uint64_t *n_kept) {
    const ssd_found_unit ref = u[first];
    uint64_t kept = first;
    uint32_t covered = 0; /* units are sorted, so coverage is a running count */
    for (uint64_t i = first; i < end; i++) {
        if (u[i].object_len != ref.object_len || u[i].unit_count != ref.unit_count ||
            u[i].replica_count != ref.replica_count)
            continue;
        if (u[i].unit_index == covered) covered++;
        u[kept++] = u[i];
    }
    *n_kept = kept - first;
    return covered == ref.unit_count;
}

void ssd_recover_select(ssd_scan_result *r,
                        void (*emit)(void *ctx, const ssd_found_unit *copies, uint64_t n),
                        void *ctx) {
    if (r->n == 0) return;
    qsort(r->units, r->n, sizeof *r->units, compare_found);
    uint64_t i = 0;
    while (i < r->n) {
        uint64_t key_end = i;
        while (key_end < r->n &&
               memcmp(r->units[key_end].key.bytes, r->units[i].key.bytes, sizeof(kvs_key)) == 0)
            key_end++;
        for (uint64_t g = i; g < key_end;) {
            uint64_t g_end = g;
            while (g_end < key_end && r->units[g_end].sequence == r->units[g].sequence) g_end++;
            uint64_t kept = 0;
            if (complete_group(r->units, g, g_end, &kept)) {
                emit(ctx, &r->units[g], kept);
                break;
            }
            g = g_end;
        }
        i = key_end;
    }
}
