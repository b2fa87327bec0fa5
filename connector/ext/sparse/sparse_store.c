/* sparse_store.c - the rows of a request's chunks for sparse decode (sparse_store.h). */
#include "sparse_store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xxh3.h"
#include "connector/object.h"
#include "kernels/cpu/dtype.h"
#include "schedulers/qsac/topk.h"

struct kvs_sparse_store {
    kvs_kv_shape shape;
    uint32_t dtype, n_layers, chunk_tokens, max_chunks, head_dim;
    uint64_t layer_bytes, max_rows;
    uint32_t end_rows;  /* one past the last row of the highest chunk added */
    float *keys;        /* [layer][head][max_rows][head_dim] */
    uint64_t *row_hash; /* [layer][head][max_rows] */
    uint8_t *present;   /* [max_chunks] */
    float *scores;      /* [max_rows]: select's scratch */
    uint32_t *picked;   /* [max_rows]: select's scratch */
    kvs_sparse_selector selector;
    void *selector_ctx;
    uint64_t scored, by_selector, audits;
    double audit_error;
};

void kvs_sparse_store_set_selector(kvs_sparse_store *s, kvs_sparse_selector fn, void *ctx) {
    s->selector = fn;
    s->selector_ctx = ctx;
}

void kvs_sparse_store_counts(const kvs_sparse_store *s, uint64_t *scored, uint64_t *by_selector,
                             uint64_t *audits, double *audit_error) {
    *scored = s->scored;
    *by_selector = s->by_selector;
    *audits = s->audits;
    *audit_error = s->audit_error;
}

/* The scores of (layer, head)'s stored rows [0, end) for the query group q (m heads) into
 * s->scores: a missing chunk's rows are NaN, unscored. Returns the rows scored. */
static uint64_t score_pool(kvs_sparse_store *s, uint32_t layer, uint32_t head, const float *q,
                           uint32_t m, uint32_t end) {
    uint32_t n_keys, d = s->head_dim;
    uint64_t scored = 0;
    const float *keys = kvs_sparse_store_keys(s, layer, head, &n_keys);
    for (uint32_t first = 0; first < end; first += s->chunk_tokens) {
        uint32_t rows = end - first < s->chunk_tokens ? end - first : s->chunk_tokens;
        if (s->present[first / s->chunk_tokens]) {
            kvs_topk_scores(q, m, keys + (uint64_t)first * d, d, rows, d, s->scores + first);
            scored += rows;
        } else {
            for (uint32_t r = first; r < first + rows; r++) s->scores[r] = NAN;
        }
    }
    return scored;
}

/* An audited hit's attention error: its cached rows against the exact top-k of this query. */
static double audit_hit(kvs_sparse_store *s, uint32_t layer, uint32_t head,
                        const kvs_sparse_head *h, const float *q, uint32_t end, uint32_t sink,
                        uint32_t k) {
    s->scored += score_pool(s, layer, head, q, h->qsac.m, end);
    uint32_t n = kvs_topk_exact(s->scores, end, sink, 0, k, s->picked);
    if (n == UINT32_MAX) return 1.0;            /* no memory to tell: the worst */
    uint32_t *cached = s->picked + n, held = 0; /* room: picked holds max_rows */
    for (uint32_t i = 0; i < h->slots && n + held < s->max_rows; i++)
        if (h->slot_rows[i] != KVS_QSAC_EMPTY && h->slot_rows[i] < end)
            cached[held++] = h->slot_rows[i];
    return kvs_qsac_attention_error(s->scores, end, h->scale, cached, held, s->picked, n);
}

kvs_status kvs_sparse_store_create(const kvs_kv_shape *shape, uint32_t dtype, uint32_t n_layers,
                                   uint32_t chunk_tokens, uint32_t max_chunks,
                                   kvs_sparse_store **out) {
    *out = NULL;
    uint32_t elem = kvs_dtype_bytes(dtype);
    if (!shape || !shape->n_heads || !shape->head_bytes || !shape->has_v || !elem || !n_layers ||
        !chunk_tokens || !max_chunks || shape->head_bytes % elem)
        return KVS_EINVAL;
    uint64_t max_rows = (uint64_t)max_chunks * chunk_tokens;
    if (max_rows > UINT32_MAX / 2) return KVS_EINVAL;
    uint64_t head_dim = shape->head_bytes / elem;
    uint64_t planes = (uint64_t)n_layers * shape->n_heads;
    if (planes > UINT64_MAX / max_rows) return KVS_EINVAL;
    uint64_t rows_all = planes * max_rows;
    kvs_sparse_store *s = calloc(1, sizeof *s);
    if (!s) return KVS_ENOMEM;
    *s = (kvs_sparse_store){.shape = *shape,
                            .dtype = dtype,
                            .n_layers = n_layers,
                            .chunk_tokens = chunk_tokens,
                            .max_chunks = max_chunks,
                            .head_dim = (uint32_t)head_dim,
                            .layer_bytes = kvs_kernel_layer_bytes(shape, chunk_tokens),
                            .max_rows = max_rows};
    if (rows_all > SIZE_MAX / sizeof(float) / head_dim ||
        !(s->keys = calloc(rows_all * head_dim, sizeof *s->keys)) ||
        !(s->row_hash = calloc(rows_all, sizeof *s->row_hash)) ||
        !(s->present = calloc(max_chunks, 1)) || !(s->scores = malloc(max_rows * sizeof(float))) ||
        !(s->picked = malloc(max_rows * sizeof(uint32_t)))) {
        kvs_sparse_store_destroy(s);
        return KVS_ENOMEM;
    }
    *out = s;
    return KVS_OK;
}

void kvs_sparse_store_destroy(kvs_sparse_store *s) {
    if (!s) return;
    free(s->keys);
    free(s->row_hash);
    free(s->present);
    free(s->scores);
    free(s->picked);
    free(s);
}

/* (layer, head)'s first row */
static uint64_t plane(const kvs_sparse_store *s, uint32_t layer, uint32_t head) {
    return ((uint64_t)layer * s->shape.n_heads + head) * s->max_rows;
}

static uint64_t row_hash(const kvs_sparse_store *s, const void *k, const void *v) {
    kvs_xxh3 st;
    kvs_xxh3_reset(&st);
    kvs_xxh3_update(&st, k, s->shape.head_bytes);
    kvs_xxh3_update(&st, v, s->shape.head_bytes);
    return kvs_xxh3_digest(&st);
}

void kvs_sparse_row_offsets(const kvs_sparse_store *s, uint32_t layer, uint32_t head, uint32_t row,
                            uint64_t *k_offset, uint64_t *v_offset) {
    uint64_t t = row % s->chunk_tokens, hb = s->shape.head_bytes, heads = s->shape.n_heads;
    uint64_t base = kvs_object_payload_offset(s->n_layers) + (uint64_t)layer * s->layer_bytes;
    *k_offset = base + (t * heads + head) * hb;
    *v_offset = *k_offset + (uint64_t)s->chunk_tokens * heads * hb;
}

kvs_status kvs_sparse_store_add(kvs_sparse_store *s, uint32_t chunk, const void *object,
                                uint64_t len, const kvs_key *fingerprint, const kvs_key *key,
                                char *err, size_t err_len) {
    if (chunk >= s->max_chunks || !object) return KVS_EINVAL;
    kvs_status st = kvs_object_check_header(object, len, fingerprint, key, s->n_layers,
                                            s->chunk_tokens, s->layer_bytes, err, err_len);
    if (st != KVS_OK) return st;
    const uint64_t *hashes = kvs_object_layer_hashes((void *)object);
    for (uint32_t l = 0; l < s->n_layers; l++)
        if (kvs_xxh3_64(kvs_object_layer((void *)object, l), s->layer_bytes) != hashes[l]) {
            snprintf(err, err_len, "chunk %u: layer %u does not match its checksum", chunk, l);
            return KVS_ECORRUPT;
        }
    const uint8_t *base = object;
    for (uint32_t l = 0; l < s->n_layers; l++)
        for (uint32_t h = 0; h < s->shape.n_heads; h++)
            for (uint32_t t = 0; t < s->chunk_tokens; t++) {
                uint32_t row = chunk * s->chunk_tokens + t;
                uint64_t ko, vo;
                kvs_sparse_row_offsets(s, l, h, row, &ko, &vo);
                float *key_out = s->keys + (plane(s, l, h) + row) * s->head_dim;
                for (uint32_t i = 0; i < s->head_dim; i++)
                    key_out[i] = kvs_dtype_load(s->dtype, base + ko, i);
                s->row_hash[plane(s, l, h) + row] = row_hash(s, base + ko, base + vo);
            }
    s->present[chunk] = 1;
    if ((chunk + 1) * s->chunk_tokens > s->end_rows) s->end_rows = (chunk + 1) * s->chunk_tokens;
    return KVS_OK;
}

int kvs_sparse_store_has_row(const kvs_sparse_store *s, uint32_t row) {
    return row < s->max_rows && s->present[row / s->chunk_tokens];
}

kvs_status kvs_sparse_row_check(const kvs_sparse_store *s, uint32_t layer, uint32_t head,
                                uint32_t row, const void *k, const void *v) {
    if (layer >= s->n_layers || head >= s->shape.n_heads || !kvs_sparse_store_has_row(s, row))
        return KVS_ECORRUPT;
    return row_hash(s, k, v) == s->row_hash[plane(s, layer, head) + row] ? KVS_OK : KVS_ECORRUPT;
}

const float *kvs_sparse_store_keys(const kvs_sparse_store *s, uint32_t layer, uint32_t head,
                                   uint32_t *n_rows) {
    *n_rows = s->end_rows;
    return s->keys + plane(s, layer, head) * s->head_dim;
}

kvs_status kvs_sparse_store_select(kvs_sparse_store *s, uint32_t layer, const float *q,
                                   kvs_sparse_head *heads, uint32_t n_rows, uint32_t sink,
                                   uint32_t recent, uint32_t topk, uint8_t *hit,
                                   uint32_t *fetch_rows, uint32_t *fetch_slots, uint32_t *n_fetch) {
    if (layer >= s->n_layers || !q || !heads || !hit || !fetch_rows || !fetch_slots || !n_fetch)
        return KVS_EINVAL;
    const uint32_t d = s->head_dim;
    /* every head checked before any is stepped: a refusal changes nothing */
    for (uint32_t g = 0; g < s->shape.n_heads; g++)
        if (heads[g].qsac.d != d || !heads[g].qsac.m || !heads[g].qsac.label ||
            !heads[g].slot_rows || !heads[g].slots || heads[g].slots != heads[0].slots)
            return KVS_EINVAL;
    /* the pool: [sink, n_rows - recent), and only rows that are stored */
    uint32_t end = kvs_topk_pool_end(n_rows, recent);
    if (end > s->end_rows) end = s->end_rows;
    uint64_t q_at = 0;
    kvs_status rc = KVS_OK;
    for (uint32_t g = 0; g < s->shape.n_heads; g++) {
        kvs_sparse_head *head = &heads[g];
        uint32_t m = head->qsac.m;
        const float *qg = q + q_at;
        q_at += (uint64_t)m * d;
        n_fetch[g] = 0;
        uint32_t sel_end = end > sink ? end : sink;
        if (head->sel_end > sel_end) head->qsac.valid = 0; /* the pool shrank under its rows */
        double sim = 1.0;
        int labelled = head->qsac.valid;
        hit[g] = (uint8_t)kvs_qsac_step(&head->qsac, qg, NULL, &sim);
        if (head->adapt && head->audit_every && ++head->audit_n >= head->audit_every) {
            head->audit_n = 0;
            uint32_t k = topk < head->slots ? topk : head->slots;
            double err = hit[g] ? audit_hit(s, layer, g, head, qg, end, sink, k) : 0.0;
            s->audits++;
            s->audit_error += err;
            head->qsac.tau =
                kvs_qsac_adapt_observe(head->adapt, head->qsac.tau, labelled ? sim : 1.0, err);
        }
        if (hit[g]) continue;
        uint32_t k = topk < head->slots ? topk : head->slots;
        uint64_t scored = 0;
        uint32_t n = s->selector ? s->selector(s->selector_ctx, layer, g, qg, m, sink, end, k,
                                               s->picked, &scored)
                                 : UINT32_MAX;
        if (n != UINT32_MAX && n <= k) {
            s->by_selector++;
        } else {
            scored = score_pool(s, layer, g, qg, m, end);
            n = kvs_topk_exact(s->scores, end, sink, 0, k, s->picked);
        }
        s->scored += scored;
        uint32_t kept = 0; /* a chunk never added has no rows to take */
        for (uint32_t i = 0; n != UINT32_MAX && i < n; i++)
            if (kvs_sparse_store_has_row(s, s->picked[i])) s->picked[kept++] = s->picked[i];
        uint32_t got = n == UINT32_MAX
                           ? UINT32_MAX
                           : kvs_qsac_delta(head->slot_rows, head->slots, s->picked, kept,
                                            fetch_rows + (uint64_t)g * head->slots,
                                            fetch_slots + (uint64_t)g * head->slots);
        if (got == UINT32_MAX) {
            /* out of memory: the head's slots were not changed, but its label was: no hit may
             * reuse them, and the other heads go on */
            head->qsac.valid = 0;
            rc = KVS_ENOMEM;
            continue;
        }
        n_fetch[g] = got;
        head->sel_end = sel_end;
        /* a short selection (a pool of fewer than k stored rows) is not reused: the next step
         * selects again, as the pool grows */
        if (kept < k) head->qsac.valid = 0;
    }
    return rc;
}
