/* kvcache.c - paged KV memory, dtype conversions and the engine's own prefix cache. */
#include "kvcache.h"

#include "kernels/cpu/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

/* dtypes ---------------------------------------------------------------------------------------- */

/* The scalar conversions are the library's (kernels/cpu/dtype.h, header-only: the engine still links
 * nothing of it), so restored pages and computed ones round the same way. */

/* Decoding tables: every 16- and 8-bit pattern, filled once. */
static float f16_table[65536];
static float e4m3_table[256];
static int tables_ready;

static void build_tables(void) {
    if (tables_ready) return;
    for (uint32_t i = 0; i < 65536u; i++) f16_table[i] = kvs_f16_to_f32((uint16_t)i);
    for (uint32_t i = 0; i < 256u; i++) e4m3_table[i] = kvs_e4m3_to_f32((uint8_t)i);
    tables_ready = 1;
}

size_t kv_dtype_size(kvs_dtype dtype) {
    return kvs_dtype_bytes(dtype);
}

void kv_from_float(kvs_dtype dtype, void *dst, const float *src, size_t n) {
    switch (dtype) {
        case KVS_DTYPE_FP32: memcpy(dst, src, n * sizeof(float)); break;
        case KVS_DTYPE_FP16: {
            uint16_t *d = dst;
            for (size_t i = 0; i < n; i++) d[i] = kvs_f32_to_f16(src[i]);
            break;
        }
        case KVS_DTYPE_BF16: {
            uint16_t *d = dst;
            for (size_t i = 0; i < n; i++) d[i] = kvs_f32_to_bf16(src[i]);
            break;
        }
        case KVS_DTYPE_FP8_E4M3:
        case KVS_DTYPE_FP8_E5M2: { /* e5m2 is refused by the flag parser; never reached */
            uint8_t *d = dst;
            for (size_t i = 0; i < n; i++) d[i] = kvs_f32_to_e4m3(src[i]);
            break;
        }
    }
}

void kv_to_float(kvs_dtype dtype, float *dst, const void *src, size_t n) {
    switch (dtype) {
        case KVS_DTYPE_FP32: memcpy(dst, src, n * sizeof(float)); break;
        case KVS_DTYPE_FP16: {
            const uint16_t *s = src;
            for (size_t i = 0; i < n; i++) dst[i] = f16_table[s[i]];
            break;
        }
        case KVS_DTYPE_BF16: {
            const uint16_t *s = src;
            for (size_t i = 0; i < n; i++) dst[i] = kvs_bf16_to_f32(s[i]);
            break;
        }
        case KVS_DTYPE_FP8_E4M3:
        case KVS_DTYPE_FP8_E5M2: {
            const uint8_t *s = src;
            for (size_t i = 0; i < n; i++) dst[i] = e4m3_table[s[i]];
            break;
        }
    }
}

static const char *const layout_names[] = {"nhd", "hnd", "flashinfer", "mla", "crosslayer"};

int kv_layout_parse(const char *name, kv_layout *out) {
    for (int i = 0; i < 5; i++) {
        if (strcmp(name, layout_names[i]) == 0) {
            *out = (kv_layout)i;
            return 0;
        }
    }
    return -1;
}

const char *kv_layout_name(kv_layout layout) {
    return (unsigned)layout < 5u ? layout_names[layout] : "?";
}

int kv_dtype_parse(const char *name, kvs_dtype *out) {
    if (strcmp(name, "fp16") == 0)
        *out = KVS_DTYPE_FP16;
    else if (strcmp(name, "bf16") == 0)
        *out = KVS_DTYPE_BF16;
    else if (strcmp(name, "fp32") == 0)
        *out = KVS_DTYPE_FP32;
    else if (strcmp(name, "fp8") == 0 || strcmp(name, "fp8_e4m3") == 0)
        *out = KVS_DTYPE_FP8_E4M3;
    else
        return -1;
    return 0;
}

const char *kv_dtype_name(kvs_dtype dtype) {
    switch (dtype) {
        case KVS_DTYPE_FP16: return "fp16";
        case KVS_DTYPE_BF16: return "bf16";
        case KVS_DTYPE_FP32: return "fp32";
        case KVS_DTYPE_FP8_E4M3: return "fp8";
        case KVS_DTYPE_FP8_E5M2: return "fp8_e5m2";
    }
    return "?";
}

/* pages and block manager ------------------------------------------------------------------------ */

typedef struct block {
    uint64_t hash;   /* chain hash of every token up to the end of this block; valid iff cached */
    uint64_t parent; /* chain hash of the previous block, 0 for a request's first block */
    int32_t tokens[KV_BLOCK_TOKENS];
    uint32_t ref;
    uint8_t cached; /* in the hash table */
    uint8_t held;   /* counted against the budget: in use or cached */
    uint32_t lru_prev, lru_next;
    uint32_t bucket_next;
} block;

struct kvcache {
    kvcache_params p;
    size_t elem_size;
    uint8_t **buffers; /* one per layer, or one for the cross-layer layout */
    uint32_t n_buffers;
    kvs_layer_view *views;

    block *blocks;
    uint32_t *free_stack; /* pages not held */
    uint32_t n_free;
    uint32_t n_held;
    uint32_t lru_head, lru_tail; /* idle cached blocks; head is the least recently used */
    uint32_t n_lru;
    uint32_t *buckets;
    uint32_t bucket_mask;
    kvcache_stats stats;
    /* the layer stream cache's buffer (kvcache_set_overlay): block ids from KV_OVERLAY on */
    const struct kvcache *overlay;
    uint32_t overlay_pages, overlay_buffers;
};

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t chain_hash(uint64_t parent, const int32_t *tokens) {
    uint64_t h = mix64(parent + 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < KV_BLOCK_TOKENS; i++) h = mix64(h ^ (uint64_t)(uint32_t)tokens[i]);
    return h;
}

static void set_err(char *err, size_t len, const char *msg) {
    if (err && len) snprintf(err, len, "%s", msg);
}

kvcache *kvcache_create(const kvcache_params *params, char *err, size_t err_len) {
    const kvcache_params *p = params;
    int is_mla = p->layout == KV_LAYOUT_MLA;
    if (p->n_layers == 0 || p->n_heads == 0 || p->head_dim == 0 || p->n_blocks == 0 ||
        kv_dtype_size(p->dtype) == 0 || (is_mla && p->n_heads != 1)) {
        set_err(err, err_len, "kv cache: impossible geometry");
        return NULL;
    }
    if (p->block_budget == 0 || p->block_budget > p->n_blocks) {
        set_err(err, err_len, "kv cache: the block budget must lie in [1, blocks]");
        return NULL;
    }
    build_tables();

    kvcache *kv = calloc(1, sizeof *kv);
    if (!kv) goto fail_nomem;
    kv->p = *p;
    kv->elem_size = kv_dtype_size(p->dtype);
    const int64_t head = (int64_t)p->head_dim * (int64_t)kv->elem_size; /* bytes of one head */
    const int64_t tok = head * p->n_heads;                              /* one token, all heads */
    const int64_t blk = tok * KV_BLOCK_TOKENS;                          /* one block of K (or V) */
    const int64_t n_parts = is_mla ? 1 : 2;
    const int64_t per_layer = blk * p->n_blocks * n_parts;

    kv->n_buffers = p->layout == KV_LAYOUT_CROSSLAYER ? 1 : p->n_layers;
    kv->buffers = calloc(kv->n_buffers, sizeof *kv->buffers);
    kv->views = calloc(p->n_layers, sizeof *kv->views);
    if (!kv->buffers || !kv->views) goto fail_nomem;
    size_t buffer_bytes =
        (size_t)(p->layout == KV_LAYOUT_CROSSLAYER ? per_layer * p->n_layers : per_layer);
    for (uint32_t i = 0; i < kv->n_buffers; i++) {
        kv->buffers[i] = calloc(1, buffer_bytes);
        if (!kv->buffers[i]) goto fail_nomem;
    }

    for (uint32_t l = 0; l < p->n_layers; l++) {
        kvs_layer_view *v = &kv->views[l];
        v->struct_size = sizeof *v;
        v->device_kind = KVS_DEVICE_HOST;
        v->device_index = 0;
        v->n_blocks = p->n_blocks;
        uint8_t *base = kv->buffers[p->layout == KV_LAYOUT_CROSSLAYER ? 0 : l];
        switch (p->layout) {
            case KV_LAYOUT_NHD: /* [2, blocks, bs, heads, dim] */
                v->k_base = base;
                v->v_base = base + blk * p->n_blocks;
                v->block_stride = blk;
                v->token_stride = tok;
                v->head_stride = head;
                break;
            case KV_LAYOUT_HND: /* [2, blocks, heads, bs, dim] */
                v->k_base = base;
                v->v_base = base + blk * p->n_blocks;
                v->block_stride = blk;
                v->token_stride = head;
                v->head_stride = head * KV_BLOCK_TOKENS;
                break;
            case KV_LAYOUT_FLASHINFER: /* [blocks, 2, bs, heads, dim] */
                v->k_base = base;
                v->v_base = base + blk;
                v->block_stride = 2 * blk;
                v->token_stride = tok;
                v->head_stride = head;
                break;
            case KV_LAYOUT_MLA: /* [blocks, bs, latent] */
                v->k_base = base;
                v->v_base = NULL;
                v->block_stride = blk;
                v->token_stride = tok;
                v->head_stride = head;
                break;
            case KV_LAYOUT_CROSSLAYER: /* [blocks, layers, 2, bs, heads, dim] */
                v->k_base = base + (int64_t)l * 2 * blk;
                v->v_base = base + (int64_t)l * 2 * blk + blk;
                v->block_stride = 2 * blk * p->n_layers;
                v->token_stride = tok;
                v->head_stride = head;
                break;
        }
    }

    kv->blocks = calloc(p->n_blocks, sizeof *kv->blocks);
    kv->free_stack = calloc(p->n_blocks, sizeof *kv->free_stack);
    uint32_t n_buckets = 64;
    while (n_buckets < 2 * p->n_blocks) n_buckets *= 2;
    kv->buckets = malloc(n_buckets * sizeof *kv->buckets);
    if (!kv->blocks || !kv->free_stack || !kv->buckets) goto fail_nomem;
    kv->bucket_mask = n_buckets - 1;
    for (uint32_t i = 0; i < n_buckets; i++) kv->buckets[i] = NONE;
    /* Pop order hands out ids 0, 1, 2, ...: the stack holds them in reverse. */
    for (uint32_t i = 0; i < p->n_blocks; i++) {
        kv->free_stack[i] = p->n_blocks - 1 - i;
        kv->blocks[i].lru_prev = kv->blocks[i].lru_next = kv->blocks[i].bucket_next = NONE;
    }
    kv->n_free = p->n_blocks;
    kv->lru_head = kv->lru_tail = NONE;
    return kv;

fail_nomem:
    set_err(err, err_len, "kv cache: out of memory for the pages");
    kvcache_destroy(kv);
    return NULL;
}

void kvcache_destroy(kvcache *kv) {
    if (!kv) return;
    for (uint32_t i = 0; kv->buffers && i < kv->n_buffers; i++) free(kv->buffers[i]);
    free(kv->buffers);
    free(kv->views);
    free(kv->blocks);
    free(kv->free_stack);
    free(kv->buckets);
    free(kv);
}

const kvcache_params *kvcache_params_of(const kvcache *kv) {
    return &kv->p;
}

const kvs_layer_view *kvcache_views(const kvcache *kv) {
    return kv->views;
}

void kvcache_set_overlay(kvcache *kv, const kvcache *overlay, uint32_t pages_per_buffer,
                         uint32_t buffers) {
    kv->overlay = overlay;
    kv->overlay_pages = pages_per_buffer;
    kv->overlay_buffers = buffers ? buffers : 1;
}

uint8_t *kvcache_head_ptr(const kvcache *kv, uint32_t layer, kv_part part, uint32_t block_id,
                          uint32_t slot, uint32_t head) {
    if (block_id >= KV_OVERLAY && kv->overlay) /* layer `layer` is in buffer layer % buffers */
        return kvcache_head_ptr(
            kv->overlay, 0, part,
            block_id - KV_OVERLAY + (layer % kv->overlay_buffers) * kv->overlay_pages, slot, head);
    const kvs_layer_view *v = &kv->views[layer];
    uint8_t *base = part == KV_K ? v->k_base : v->v_base;
    return base + (int64_t)block_id * v->block_stride + (int64_t)slot * v->token_stride +
           (int64_t)head * v->head_stride;
}

void kvcache_write(const kvcache *kv, uint32_t layer, kv_part part, const uint32_t *block_table,
                   uint64_t pos, uint32_t head, const float *src) {
    uint8_t *dst = kvcache_head_ptr(kv, layer, part, block_table[pos / KV_BLOCK_TOKENS],
                                    (uint32_t)(pos % KV_BLOCK_TOKENS), head);
    kv_from_float(kv->p.dtype, dst, src, kv->p.head_dim);
}

void kvcache_read(const kvcache *kv, uint32_t layer, kv_part part, const uint32_t *block_table,
                  uint64_t pos, uint32_t head, float *dst) {
    const uint8_t *src = kvcache_head_ptr(kv, layer, part, block_table[pos / KV_BLOCK_TOKENS],
                                          (uint32_t)(pos % KV_BLOCK_TOKENS), head);
    kv_to_float(kv->p.dtype, dst, src, kv->p.head_dim);
}

static void lru_unlink(kvcache *kv, uint32_t id) {
    block *b = &kv->blocks[id];
    if (b->lru_prev != NONE)
        kv->blocks[b->lru_prev].lru_next = b->lru_next;
    else
        kv->lru_head = b->lru_next;
    if (b->lru_next != NONE)
        kv->blocks[b->lru_next].lru_prev = b->lru_prev;
    else
        kv->lru_tail = b->lru_prev;
    b->lru_prev = b->lru_next = NONE;
    kv->n_lru--;
}

static void lru_push_recent(kvcache *kv, uint32_t id) {
    block *b = &kv->blocks[id];
    b->lru_prev = kv->lru_tail;
    b->lru_next = NONE;
    if (kv->lru_tail != NONE)
        kv->blocks[kv->lru_tail].lru_next = id;
    else
        kv->lru_head = id;
    kv->lru_tail = id;
    kv->n_lru++;
}

static uint32_t table_find(const kvcache *kv, uint64_t hash, uint64_t parent,
                           const int32_t *tokens) {
    for (uint32_t id = kv->buckets[hash & kv->bucket_mask]; id != NONE;
         id = kv->blocks[id].bucket_next) {
        const block *b = &kv->blocks[id];
        if (b->hash == hash && b->parent == parent &&
            memcmp(b->tokens, tokens, sizeof b->tokens) == 0)
            return id;
    }
    return NONE;
}

static void table_insert(kvcache *kv, uint32_t id, uint64_t hash, uint64_t parent,
                         const int32_t *tokens) {
    block *b = &kv->blocks[id];
    b->hash = hash;
    b->parent = parent;
    memcpy(b->tokens, tokens, sizeof b->tokens);
    b->cached = 1;
    uint32_t *head = &kv->buckets[hash & kv->bucket_mask];
    b->bucket_next = *head;
    *head = id;
    kv->stats.cached_now++;
}

static void table_remove(kvcache *kv, uint32_t id) {
    block *b = &kv->blocks[id];
    uint32_t *link = &kv->buckets[b->hash & kv->bucket_mask];
    while (*link != id) link = &kv->blocks[*link].bucket_next;
    *link = b->bucket_next;
    b->bucket_next = NONE;
    b->cached = 0;
    kv->stats.cached_now--;
}

uint32_t kvcache_match_prefix(kvcache *kv, const int32_t *tokens, uint64_t n_tokens,
                              uint32_t *blocks_out) {
    if (n_tokens == 0) return 0;
    uint64_t max_blocks = (n_tokens - 1) / KV_BLOCK_TOKENS;
    uint64_t parent = 0;
    uint32_t n = 0;
    for (; n < max_blocks; n++) {
        const int32_t *t = tokens + (uint64_t)n * KV_BLOCK_TOKENS;
        uint64_t h = chain_hash(parent, t);
        uint32_t id = table_find(kv, h, parent, t);
        if (id == NONE) break;
        block *b = &kv->blocks[id];
        if (b->ref++ == 0) lru_unlink(kv, id);
        blocks_out[n] = id;
        parent = h;
    }
    kv->stats.hit_blocks += n;
    return n;
}

uint32_t kvcache_available(const kvcache *kv) {
    return kv->p.block_budget - kv->n_held + kv->n_lru;
}

int kvcache_alloc(kvcache *kv, uint32_t n, uint32_t *blocks_out) {
    if (n > kvcache_available(kv)) return -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id;
        if (kv->n_held < kv->p.block_budget) {
            id = kv->free_stack[--kv->n_free];
            kv->n_held++;
        } else {
            id = kv->lru_head; /* evict the least recently used idle cached block */
            lru_unlink(kv, id);
            table_remove(kv, id);
            kv->stats.evictions++;
        }
        kv->blocks[id].held = 1;
        kv->blocks[id].ref = 1;
        blocks_out[i] = id;
    }
    return 0;
}

void kvcache_release(kvcache *kv, const uint32_t *blocks, uint32_t n_blocks, const int32_t *tokens,
                     uint64_t n_valid_tokens) {
    uint64_t parent = 0;
    uint64_t n_full = n_valid_tokens / KV_BLOCK_TOKENS;
    for (uint32_t i = 0; i < n_blocks && i < n_full; i++) {
        const int32_t *t = tokens + (uint64_t)i * KV_BLOCK_TOKENS;
        uint64_t h = chain_hash(parent, t);
        block *b = &kv->blocks[blocks[i]];
        if (!b->cached && table_find(kv, h, parent, t) == NONE)
            table_insert(kv, blocks[i], h, parent, t);
        /* A block already cached under another id is a duplicate: it is simply freed below. */
        parent = h;
    }
    /* Release back to front so a request's tail blocks are evicted before its prefix. */
    for (uint32_t i = n_blocks; i-- > 0;) {
        uint32_t id = blocks[i];
        block *b = &kv->blocks[id];
        if (--b->ref > 0) continue;
        if (b->cached) {
            lru_push_recent(kv, id);
        } else {
            b->held = 0;
            kv->n_held--;
            kv->free_stack[kv->n_free++] = id;
        }
    }
}

kvcache_stats kvcache_get_stats(const kvcache *kv) {
    return kv->stats;
}
