/* kernels.c - host reference of the paged <-> payload data movement (see kernels.h). */
#include "kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* kvs_xxh3 on the stack (xxh3.h): the hashing variants return a value, not a status, so they must
 * not allocate. */
#include "common/copy.h"
#include "common/xxh3.h"

/* Bytes of payload hashed and then copied as one piece: large enough that the per-call cost of the
 * streaming hash vanishes, small enough that the piece is still in L1/L2 when it is copied. */
#ifndef HASH_PIECE_BYTES
#define HASH_PIECE_BYTES ((size_t)32 * 1024)
#endif

static void kernel_arg_error(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void kernel_arg_error(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || err_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

uint64_t kvs_kernel_layer_bytes(const kvs_kv_shape *shape, uint32_t n_tokens) {
    if (!shape) return 0;
    uint64_t part = (uint64_t)n_tokens * shape->n_heads * shape->head_bytes;
    return shape->has_v ? 2 * part : part;
}

/* One of the three indexed dimensions of a view, for the overlap check. */
typedef struct view_dim {
    const char *stride_name; /* "block_stride" */
    const char *plural;      /* "blocks" */
    uint64_t count;
    int64_t stride;
} view_dim;

/* Rows of two distinct (block, token, head) indices must not share a byte. Sorting the dimensions
 * by stride, each one must step over the whole extent of the ones below it; a dimension of count 1
 * is never stepped and constrains nothing. This accepts every permutation of a (possibly padded)
 * dense tensor and never a stride set that aliases; it also refuses interleavings that happen not
 * to alias, which no engine layout uses. */
static kvs_status check_overlap(const kvs_layer_view *view, const kvs_kv_shape *shape, char *err,
                                size_t err_len) {
    view_dim dims[3] = {
        {"head_stride", "heads", shape->n_heads, view->head_stride},
        {"token_stride", "tokens", shape->block_tokens, view->token_stride},
        {"block_stride", "blocks", view->n_blocks, view->block_stride},
    };
    /* Insertion sort by stride; ties keep head < token < block so the message is stable. */
    for (int i = 1; i < 3; i++) {
        view_dim d = dims[i];
        int j = i - 1;
        while (j >= 0 && dims[j].stride > d.stride) {
            dims[j + 1] = dims[j];
            j--;
        }
        dims[j + 1] = d;
    }
    const uint64_t limit = (uint64_t)INT64_MAX;
    uint64_t extent = shape->head_bytes; /* bytes spanned by the dimensions below, with the row */
    const view_dim *below = NULL;
    for (int i = 0; i < 3; i++) {
        const view_dim *d = &dims[i];
        if (d->count <= 1) continue;
        uint64_t stride = (uint64_t)d->stride;
        if (stride < extent) {
            if (below)
                kernel_arg_error(err, err_len,
                                 "layer view: %s %lld makes %s overlap %s (needs >= %llu)",
                                 d->stride_name, (long long)d->stride, d->plural, below->plural,
                                 (unsigned long long)extent);
            else
                kernel_arg_error(
                    err, err_len,
                    "layer view: %s %lld makes %s overlap each other (needs >= head_bytes "
                    "%llu)",
                    d->stride_name, (long long)d->stride, d->plural, (unsigned long long)extent);
            return KVS_EINVAL;
        }
        if ((d->count - 1) > (limit - extent) / stride) {
            kernel_arg_error(
                err, err_len, "layer view: %s %lld times %llu %s spans more than 2^63 bytes",
                d->stride_name, (long long)d->stride, (unsigned long long)d->count, d->plural);
            return KVS_EINVAL;
        }
        extent += stride * (d->count - 1);
        below = d;
    }
    return KVS_OK;
}

kvs_status kvs_kernel_check_view(const kvs_layer_view *view, const kvs_kv_shape *shape, char *err,
                                 size_t err_len) {
    if (!view || !shape) {
        kernel_arg_error(err, err_len, "layer view: %s is NULL", !view ? "view" : "shape");
        return KVS_EINVAL;
    }
    if (shape->n_heads == 0 || shape->head_bytes == 0 || shape->block_tokens == 0) {
        kernel_arg_error(err, err_len, "layer view: shape has %s 0",
                         shape->n_heads == 0      ? "n_heads"
                         : shape->head_bytes == 0 ? "head_bytes"
                                                  : "block_tokens");
        return KVS_EINVAL;
    }
    if (!view->k_base) {
        kernel_arg_error(err, err_len, "layer view: k_base is NULL");
        return KVS_EINVAL;
    }
    if (shape->has_v && !view->v_base) {
        kernel_arg_error(err, err_len, "layer view: v_base is NULL but the shape has V (not MLA)");
        return KVS_EINVAL;
    }
    if (!shape->has_v && view->v_base) {
        kernel_arg_error(err, err_len, "layer view: v_base is set but the shape has no V (MLA)");
        return KVS_EINVAL;
    }
    if (view->k_base == view->v_base) {
        kernel_arg_error(err, err_len, "layer view: k_base and v_base are the same address %p",
                         view->k_base);
        return KVS_EINVAL;
    }
    if (view->n_blocks == 0) {
        kernel_arg_error(err, err_len, "layer view: n_blocks is 0");
        return KVS_EINVAL;
    }
    const struct {
        const char *name;
        int64_t value;
    } strides[3] = {{"block_stride", view->block_stride},
                    {"token_stride", view->token_stride},
                    {"head_stride", view->head_stride}};
    for (int i = 0; i < 3; i++) {
        if (strides[i].value < 0) {
            kernel_arg_error(err, err_len, "layer view: %s %lld is negative", strides[i].name,
                             (long long)strides[i].value);
            return KVS_EINVAL;
        }
    }
    return check_overlap(view, shape, err, err_len);
}

kvs_status kvs_kernel_check_span(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                 const kvs_token_span *span, char *err, size_t err_len) {
    if (!view || !shape || !span) {
        kernel_arg_error(err, err_len, "token span: %s is NULL",
                         !view    ? "view"
                         : !shape ? "shape"
                                  : "span");
        return KVS_EINVAL;
    }
    if (shape->block_tokens == 0) {
        kernel_arg_error(err, err_len, "token span: shape has block_tokens 0");
        return KVS_EINVAL;
    }
    if (span->n_tokens == 0) {
        kernel_arg_error(err, err_len, "token span: n_tokens is 0");
        return KVS_EINVAL;
    }
    if (span->first_token > UINT64_MAX - span->n_tokens) {
        kernel_arg_error(err, err_len, "token span: first_token %llu + n_tokens %u overflows",
                         (unsigned long long)span->first_token, span->n_tokens);
        return KVS_EINVAL;
    }
    if (!span->block_ids) {
        kernel_arg_error(err, err_len, "token span: block_ids is NULL");
        return KVS_EINVAL;
    }
    uint64_t end = span->first_token + span->n_tokens;
    uint64_t first_index = span->first_token / shape->block_tokens;
    uint64_t last_index = (end - 1) / shape->block_tokens;
    if (last_index >= span->n_block_ids) {
        kernel_arg_error(err, err_len,
                         "token span: block table has %llu ids but tokens %llu..%llu need %llu "
                         "(block_tokens %u)",
                         (unsigned long long)span->n_block_ids,
                         (unsigned long long)span->first_token, (unsigned long long)(end - 1),
                         (unsigned long long)(last_index + 1), shape->block_tokens);
        return KVS_EINVAL;
    }
    for (uint64_t i = first_index; i <= last_index; i++) {
        if (span->block_ids[i] >= view->n_blocks) {
            kernel_arg_error(
                err, err_len,
                "token span: block id %u at table index %llu is out of range (the layer has "
                "%u blocks)",
                span->block_ids[i], (unsigned long long)i, view->n_blocks);
            return KVS_EINVAL;
        }
    }
    return KVS_OK;
}

/* --- data movement --------------------------------------------------------------------------- */

typedef enum direction { TO_PAYLOAD, TO_PAGES } direction;

/* The loop-invariant facts of one layer move, computed once. */
typedef struct layer_walk {
    const uint32_t *block_ids;
    uint64_t first_token;
    uint32_t n_tokens;
    uint32_t n_heads;
    uint32_t block_tokens;
    size_t head_bytes;
    size_t token_bytes; /* n_heads * head_bytes: one token of one part in the payload */
    int64_t block_stride;
    int64_t token_stride;
    int64_t head_stride;
    int heads_contiguous;  /* a token's heads are one run of token_bytes in the pages */
    int tokens_contiguous; /* ... and a block's tokens are one run as well */
    char *parts[2];        /* k_base, v_base */
    int n_parts;
} layer_walk;

static void walk_init(layer_walk *w, const kvs_layer_view *view, const kvs_kv_shape *shape,
                      const kvs_token_span *span) {
    w->block_ids = span->block_ids;
    w->first_token = span->first_token;
    w->n_tokens = span->n_tokens;
    w->n_heads = shape->n_heads;
    w->block_tokens = shape->block_tokens;
    w->head_bytes = shape->head_bytes;
    w->token_bytes = (size_t)shape->n_heads * shape->head_bytes;
    w->block_stride = view->block_stride;
    w->token_stride = view->token_stride;
    w->head_stride = view->head_stride;
    w->heads_contiguous = shape->n_heads == 1 || view->head_stride == (int64_t)shape->head_bytes;
    w->tokens_contiguous = w->heads_contiguous && (shape->block_tokens == 1 ||
                                                   view->token_stride == (int64_t)w->token_bytes);
    w->parts[0] = (char *)view->k_base;
    w->parts[1] = (char *)view->v_base;
    w->n_parts = shape->has_v ? 2 : 1;
}

/* Runs at least KVS_COPY_STREAM_MIN long are written into the pages with non-temporal stores: the
 * engine's pages are far larger than the cache, so reading each destination line before overwriting
 * it (what ordinary stores do) would add a third of the memory traffic to a restore. */

/* One run of n bytes between the pages and the payload. Loads write the pages with non-temporal
 * stores (runs long enough), and so do hashed saves, whose payload is not read again soon. With
 * `hash`, the source (the payload for a load, the pages for a save) is hashed from the registers it is
 * copied through (xxh3.h): runs arrive in payload order, so this is the hash of the payload. */
/* What a hashed move feeds: an XXH3 state, a keyed layer tag (nhpoly.h), or both (a keyed save:
 * the tag is fed by the copy, XXH3 from the source just read, still in cache). */
typedef struct hasher {
    kvs_xxh3 *xxh3;
    kvs_nhpoly *tag;
} hasher;

static inline void hasher_copy_update(hasher *h, void *dst, const void *src, size_t n, int stream) {
    if (!h->tag) {
        kvs_xxh3_copy_update(h->xxh3, dst, src, n, stream);
        return;
    }
    kvs_nhpoly_copy_update(h->tag, dst, src, n, stream);
    if (h->xxh3) kvs_xxh3_update(h->xxh3, src, n);
}

static inline void hasher_update(hasher *h, const void *src, size_t n) {
    if (h->tag) kvs_nhpoly_update(h->tag, src, n);
    if (h->xxh3) kvs_xxh3_update(h->xxh3, src, n);
}

static inline void move_bytes(direction dir, char *page, char *payload, size_t n, hasher *hash) {
    char *dst = dir == TO_PAGES ? page : payload;
    const char *src = dir == TO_PAGES ? payload : page;
    if (hash)
        hasher_copy_update(hash, dst, src, n, 1);
    else if (dir == TO_PAGES && n >= KVS_COPY_STREAM_MIN)
        kvs_copy_streaming(dst, src, n);
    else
        memcpy(dst, src, n);
}

/* Bytes at the start of the next run of the pages asked for before a save moves a run: the copy asks
 * for the lines ahead within a run (xxh3.c), but the next run is another block, somewhere else. (A
 * load reads the payload, one run after the other, and gained nothing from it.) */
#define NEXT_RUN_PREFETCH ((size_t)1024)

/* Move tokens [t, t + count) of the span (0-based within the span) of one part between the pages at
 * `base` and `payload`, which points at the payload row of token t; with `hash`, each run's source is
 * hashed in payload order (move_bytes). */
static void move_tokens(const layer_walk *w, direction dir, char *base, char *payload, uint32_t t,
                        uint32_t count, hasher *hash) {
    uint64_t token = w->first_token + t;
    const uint64_t end = token + count;
    while (token < end) {
        uint64_t table_index = token / w->block_tokens;
        uint32_t offset = (uint32_t)(token % w->block_tokens);
        uint64_t in_block = w->block_tokens - offset;
        uint32_t run = (uint32_t)(end - token < in_block ? end - token : in_block);
        char *page =
            base + (int64_t)w->block_ids[table_index] * w->block_stride + offset * w->token_stride;
        if (w->tokens_contiguous) {
            size_t n = run * w->token_bytes;
            if (dir == TO_PAYLOAD && token + run < end) { /* the next run's first lines */
                const char *next = base + (int64_t)w->block_ids[table_index + 1] * w->block_stride;
                for (size_t i = 0; i < NEXT_RUN_PREFETCH; i += 64)
                    __builtin_prefetch(next + i, 0, 3);
            }
            move_bytes(dir, page, payload, n, hash);
            payload += n;
        } else if (w->heads_contiguous) {
            for (uint32_t i = 0; i < run; i++) {
                move_bytes(dir, page, payload, w->token_bytes, hash);
                page += w->token_stride;
                payload += w->token_bytes;
            }
        } else {
            for (uint32_t i = 0; i < run; i++) {
                char *head = page;
                for (uint32_t h = 0; h < w->n_heads; h++) {
                    move_bytes(dir, head, payload, w->head_bytes, hash);
                    head += w->head_stride;
                    payload += w->head_bytes;
                }
                page += w->token_stride;
            }
        }
        token += run;
    }
}

static void move_layer_rows(const kvs_layer_view *view, const kvs_kv_shape *shape,
                            const kvs_token_span *span, direction dir, char *payload) {
    if (span->n_tokens == 0) return;
    layer_walk w;
    walk_init(&w, view, shape, span);
    size_t part_bytes = w.n_tokens * w.token_bytes;
    for (int p = 0; p < w.n_parts; p++)
        move_tokens(&w, dir, w.parts[p], payload + (size_t)p * part_bytes, 0, w.n_tokens, NULL);
    if (dir == TO_PAGES) kvs_copy_fence(); /* order the non-temporal stores before returning */
}

/* Layers whose runs in the pages are at least this long are hashed run by run as they move
 * (move_bytes); shorter runs (a head at a time) are hashed a piece of the payload at a time, just
 * before a load copies it or just after a save wrote it. */
#define HASH_RUN_MIN_BYTES ((size_t)512)

/* Move the layer and feed its payload to `state`, hashing every byte while it is in cache. */
static void move_layer_hash(const kvs_layer_view *view, const kvs_kv_shape *shape,
                            const kvs_token_span *span, direction dir, char *payload,
                            hasher *state) {
    if (span->n_tokens > 0) {
        layer_walk w;
        walk_init(&w, view, shape, span);
        int by_run = w.heads_contiguous && w.token_bytes >= HASH_RUN_MIN_BYTES;
        uint32_t piece_tokens = 1;
        if (by_run)
            piece_tokens = w.n_tokens;
        else if (w.token_bytes < HASH_PIECE_BYTES)
            piece_tokens = (uint32_t)(HASH_PIECE_BYTES / w.token_bytes);
        /* a load's piece of short runs is copied here while it is hashed and scattered from
         * here: the pages get exactly the bytes hashed, even if the payload (a tier's slab) is
         * reused meanwhile, so such a tear fails the check */
        _Alignas(64) char stage[HASH_PIECE_BYTES];
        for (int p = 0; p < w.n_parts; p++) {
            for (uint32_t t = 0; t < w.n_tokens; t += piece_tokens) {
                uint32_t count = w.n_tokens - t < piece_tokens ? w.n_tokens - t : piece_tokens;
                size_t n = count * w.token_bytes;
                char *from = payload;
                /* a token larger than a piece is hashed by its runs as they move (in payload
                 * order), each byte read once, like a layer of long runs */
                int runs = by_run || (dir == TO_PAGES && n > sizeof stage);
                if (dir == TO_PAGES && !runs) {
                    hasher_copy_update(state, stage, payload, n, 0);
                    from = stage;
                }
                move_tokens(&w, dir, w.parts[p], from, t, count, runs ? state : NULL);
                if (dir == TO_PAYLOAD && !by_run) hasher_update(state, payload, n);
                payload += n;
            }
        }
        kvs_copy_fence(); /* order the non-temporal stores before returning */
    }
}

void kvs_kernel_gather_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                             const kvs_token_span *span, void *dst) {
    move_layer_rows(view, shape, span, TO_PAYLOAD, (char *)dst);
}

void kvs_kernel_scatter_layer(const kvs_layer_view *view, const kvs_kv_shape *shape,
                              const kvs_token_span *span, const void *src) {
    /* TO_PAGES only reads the payload; the cast is for the shared walker. */
    move_layer_rows(view, shape, span, TO_PAGES, (char *)(uintptr_t)src);
}

uint64_t kvs_kernel_scatter_layer_hash(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                       const kvs_token_span *span, const void *src) {
    kvs_xxh3 x;
    kvs_xxh3_reset(&x);
    hasher h = {&x, NULL};
    move_layer_hash(view, shape, span, TO_PAGES, (char *)(uintptr_t)src, &h);
    return kvs_xxh3_digest(&x);
}

uint64_t kvs_kernel_gather_layer_hash(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                      const kvs_token_span *span, void *dst) {
    kvs_xxh3 x;
    kvs_xxh3_reset(&x);
    hasher h = {&x, NULL};
    move_layer_hash(view, shape, span, TO_PAYLOAD, (char *)dst, &h);
    return kvs_xxh3_digest(&x);
}

void kvs_kernel_scatter_layer_tag(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                  const kvs_token_span *span, const void *src, kvs_nhpoly *tag) {
    hasher h = {NULL, tag};
    move_layer_hash(view, shape, span, TO_PAGES, (char *)(uintptr_t)src, &h);
}

uint64_t kvs_kernel_gather_layer_tag(const kvs_layer_view *view, const kvs_kv_shape *shape,
                                     const kvs_token_span *span, void *dst, kvs_nhpoly *tag) {
    kvs_xxh3 x;
    kvs_xxh3_reset(&x);
    hasher h = {&x, tag};
    move_layer_hash(view, shape, span, TO_PAYLOAD, (char *)dst, &h);
    return kvs_xxh3_digest(&x);
}

void kvs_kernel_move_layer_kv(const kvs_layer_view *view, const kvs_kv_shape *shape,
                              const kvs_token_span *span, void *k_payload, void *v_payload,
                              int to_pages) {
    if (span->n_tokens == 0) return;
    layer_walk w;
    walk_init(&w, view, shape, span);
    direction dir = to_pages ? TO_PAGES : TO_PAYLOAD;
    char *payload[2] = {(char *)k_payload, (char *)v_payload};
    for (int p = 0; p < w.n_parts; p++)
        move_tokens(&w, dir, w.parts[p], payload[p], 0, w.n_tokens, NULL);
    if (dir == TO_PAGES) kvs_copy_fence();
}
