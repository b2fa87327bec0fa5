/* copy_plan.c - host-side arithmetic of the CUDA device (see copy_plan.h). */
#include "copy_plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void plan_error(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void plan_error(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || err_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

void kvs_cuda_layer_from_view(const kvs_layer_view *view, const kvs_kv_shape *shape,
                              kvs_cuda_layer *out) {
    memset(out, 0, sizeof *out);
    out->part_base[0] = (uint64_t)(uintptr_t)view->k_base;
    out->part_base[1] = shape->has_v ? (uint64_t)(uintptr_t)view->v_base : 0;
    out->block_stride = view->block_stride;
    out->token_stride = view->token_stride;
    out->head_stride = view->head_stride;
    out->n_blocks = view->n_blocks;
    out->n_heads = shape->n_heads;
    out->head_bytes = shape->head_bytes;
    out->block_tokens = shape->block_tokens;
    out->n_parts = shape->has_v ? 2u : 1u;
    /* The same tests as the host walker (kernels/cpu/kernels.c), so both agree on what a run is. */
    out->heads_contiguous = shape->n_heads == 1 || view->head_stride == (int64_t)shape->head_bytes;
    const uint64_t token_bytes = (uint64_t)shape->n_heads * shape->head_bytes;
    out->tokens_contiguous = out->heads_contiguous && (shape->block_tokens == 1 ||
                                                       view->token_stride == (int64_t)token_bytes);
}

uint64_t kvs_cuda_token_bytes(const kvs_cuda_layer *layer) {
    return (uint64_t)layer->n_heads * layer->head_bytes;
}

uint64_t kvs_cuda_run_bytes(const kvs_cuda_layer *layer) {
    return layer->tokens_contiguous ? layer->block_tokens * kvs_cuda_token_bytes(layer) : 0;
}

uint64_t kvs_cuda_layer_align_bits(const kvs_cuda_layer *layer) {
    uint64_t bits = layer->part_base[0] | layer->head_bytes;
    if (layer->n_parts == 2) bits |= layer->part_base[1];
    /* A stride is only ever multiplied by an index > 0 if its dimension has more than one entry. */
    if (layer->n_blocks > 1) bits |= (uint64_t)layer->block_stride;
    if (layer->block_tokens > 1) bits |= (uint64_t)layer->token_stride;
    if (layer->n_heads > 1) bits |= (uint64_t)layer->head_stride;
    return bits;
}

uint32_t kvs_cuda_unit_bytes(uint64_t align_bits) {
    if ((align_bits & 15u) == 0) return 16;
    if ((align_bits & 7u) == 0) return 8;
    if ((align_bits & 3u) == 0) return 4;
    if ((align_bits & 1u) == 0) return 2;
    return 1;
}

uint64_t kvs_cuda_max_blocks_touched(uint32_t max_copies, uint64_t max_tokens,
                                     uint32_t block_tokens) {
    if (block_tokens == 0) return 0;
    return max_tokens / block_tokens + 2ull * max_copies;
}

kvs_status kvs_cuda_check_copies(const kvs_cuda_layer *layer, uint32_t layer_index, const char *op,
                                 const kvs_dev_copy *copies, uint64_t n, uint64_t *n_tokens,
                                 char *err, size_t err_len) {
    uint64_t total = 0;
    if (n > 0 && !copies) {
        plan_error(err, err_len, "cuda device: %s(%u): copies is NULL for %llu copies", op,
                   layer_index, (unsigned long long)n);
        return KVS_EINVAL;
    }
    for (uint64_t i = 0; i < n; i++) {
        const kvs_dev_copy *c = &copies[i];
        if (c->n_tokens == 0) continue;
        if (c->first_token > UINT64_MAX - c->n_tokens) {
            plan_error(err, err_len,
                       "cuda device: %s(%u): copy %llu: first_token %llu + n_tokens %u overflows",
                       op, layer_index, (unsigned long long)i, (unsigned long long)c->first_token,
                       c->n_tokens);
            return KVS_EINVAL;
        }
        if (!c->block_ids) {
            plan_error(err, err_len, "cuda device: %s(%u): copy %llu: block_ids is NULL", op,
                       layer_index, (unsigned long long)i);
            return KVS_EINVAL;
        }
        if (!c->k_payload || (layer->n_parts == 2 && !c->v_payload)) {
            plan_error(err, err_len, "cuda device: %s(%u): copy %llu: %s is NULL", op, layer_index,
                       (unsigned long long)i, !c->k_payload ? "k_payload" : "v_payload");
            return KVS_EINVAL;
        }
        const uint64_t first = c->first_token / layer->block_tokens;
        const uint64_t last = (c->first_token + c->n_tokens - 1) / layer->block_tokens;
        if (last >= c->n_block_ids) {
            plan_error(
                err, err_len,
                "cuda device: %s(%u): copy %llu: block table has %llu ids but tokens %llu..%llu "
                "need "
                "%llu (block_tokens %u)",
                op, layer_index, (unsigned long long)i, (unsigned long long)c->n_block_ids,
                (unsigned long long)c->first_token,
                (unsigned long long)(c->first_token + c->n_tokens - 1),
                (unsigned long long)(last + 1), layer->block_tokens);
            return KVS_EINVAL;
        }
        for (uint64_t b = first; b <= last; b++) {
            if (c->block_ids[b] >= layer->n_blocks) {
                plan_error(
                    err, err_len,
                    "cuda device: %s(%u): copy %llu: block id %u at table index %llu is out of "
                    "range "
                    "(the layer has %u blocks)",
                    op, layer_index, (unsigned long long)i, c->block_ids[b], (unsigned long long)b,
                    layer->n_blocks);
                return KVS_EINVAL;
            }
        }
        total += c->n_tokens;
    }
    if (n_tokens) *n_tokens = total;
    return KVS_OK;
}

/* The id array starts after the descriptors; 40-byte descriptors keep it 8-byte aligned. */
static uint64_t ids_offset_for(uint64_t n_copies) {
    return n_copies * sizeof(kvs_cuda_copy_desc);
}

uint64_t kvs_cuda_desc_block_bytes(uint32_t max_copies, uint64_t max_ids) {
    return ids_offset_for(max_copies) + max_ids * sizeof(uint32_t);
}

kvs_status kvs_cuda_pack(const kvs_cuda_layer *layer, const kvs_dev_copy *copies, uint64_t n,
                         kvs_cuda_translate_fn translate, void *ctx, void *block,
                         uint64_t block_bytes, kvs_cuda_packed *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    uint64_t n_copies = 0, n_ids = 0;
    for (uint64_t i = 0; i < n; i++) {
        const kvs_dev_copy *c = &copies[i];
        if (c->n_tokens == 0) continue;
        n_copies++;
        n_ids += (c->first_token + c->n_tokens - 1) / layer->block_tokens -
                 c->first_token / layer->block_tokens + 1;
    }
    const uint64_t ids_at = ids_offset_for(n_copies);
    const uint64_t bytes = ids_at + n_ids * sizeof(uint32_t);
    if (n_copies > UINT32_MAX || bytes > block_bytes) {
        plan_error(
            err, err_len,
            "cuda device: %llu copies touching %llu blocks need a %llu-byte descriptor block, over "
            "the %llu bytes sized at open",
            (unsigned long long)n_copies, (unsigned long long)n_ids, (unsigned long long)bytes,
            (unsigned long long)block_bytes);
        return KVS_EOVERFLOW;
    }
    kvs_cuda_copy_desc *descs = (kvs_cuda_copy_desc *)block;
    uint32_t *ids = (uint32_t *)(void *)((char *)block + ids_at);
    const uint64_t part_bytes_per_token = kvs_cuda_token_bytes(layer);
    uint64_t align_bits = 0, row = 0, id_at = 0;
    uint32_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        const kvs_dev_copy *c = &copies[i];
        if (c->n_tokens == 0) continue;
        const uint64_t part_bytes = c->n_tokens * part_bytes_per_token;
        kvs_cuda_copy_desc *d = &descs[k++];
        memset(d, 0, sizeof *d);
        void *payload[2] = {c->k_payload, c->v_payload};
        uint64_t device[2] = {0, 0};
        for (uint32_t p = 0; p < layer->n_parts; p++) {
            if (translate) {
                kvs_status st = translate(ctx, payload[p], part_bytes, &device[p], err, err_len);
                if (st != KVS_OK) return st;
            } else {
                device[p] = (uint64_t)(uintptr_t)payload[p];
            }
            align_bits |= device[p];
        }
        d->row_begin = row;
        d->ids_offset = id_at;
        d->k_payload = device[0];
        d->v_payload = device[1];
        d->first_in_block = (uint32_t)(c->first_token % layer->block_tokens);
        d->n_tokens = c->n_tokens;
        const uint64_t first = c->first_token / layer->block_tokens;
        const uint64_t last = (c->first_token + c->n_tokens - 1) / layer->block_tokens;
        memcpy(&ids[id_at], &c->block_ids[first], (last - first + 1) * sizeof(uint32_t));
        id_at += last - first + 1;
        row += c->n_tokens;
    }
    /* Rows start at payload + t * token_bytes: token_bytes is a multiple of head_bytes, which the
     * layer's bits already hold, so the payload bases are all that is new here. */
    out->n_copies = (uint32_t)n_copies;
    out->n_tokens = row;
    out->ids_offset = ids_at;
    out->n_ids = n_ids;
    out->bytes = bytes;
    out->align_bits = align_bits;
    return KVS_OK;
}

kvs_status kvs_cuda_plan_runs(const kvs_cuda_layer *layer, const kvs_dev_copy *copies, uint64_t n,
                              int to_pages, kvs_cuda_runs *runs, char *err, size_t err_len) {
    runs->n = 0;
    if (!layer->tokens_contiguous) {
        plan_error(err, err_len,
                   "cuda device: the layout has no contiguous page runs for the copy engines");
        return KVS_EINVAL;
    }
    const uint64_t token_bytes = kvs_cuda_token_bytes(layer);
    /* Part-major, so the K runs of copies that continue each other (a chunk split in two) meet. */
    for (uint32_t p = 0; p < layer->n_parts; p++) {
        for (uint64_t i = 0; i < n; i++) {
            const kvs_dev_copy *c = &copies[i];
            if (c->n_tokens == 0) continue;
            char *payload_base = (char *)(p == 0 ? c->k_payload : c->v_payload);
            uint64_t t = 0; /* token within the copy */
            while (t < c->n_tokens) {
                const uint64_t token = c->first_token + t;
                const uint64_t index = token / layer->block_tokens;
                const uint64_t in_block = token - index * layer->block_tokens;
                uint64_t count = layer->block_tokens - in_block;
                if (count > c->n_tokens - t) count = c->n_tokens - t;
                char *page =
                    (char *)(uintptr_t)(layer->part_base[p] +
                                        c->block_ids[index] * (uint64_t)layer->block_stride +
                                        in_block * (uint64_t)layer->token_stride);
                char *payload = payload_base + t * token_bytes;
                const size_t bytes = (size_t)(count * token_bytes);
                char *dst = to_pages ? page : payload;
                const char *src = to_pages ? payload : page;
                if (runs->n > 0 &&
                    (char *)runs->dst[runs->n - 1] + runs->bytes[runs->n - 1] == dst &&
                    (const char *)runs->src[runs->n - 1] + runs->bytes[runs->n - 1] == src) {
                    runs->bytes[runs->n - 1] +=
                        bytes; /* continues the previous run on both sides */
                } else {
                    if (runs->n == runs->cap) {
                        plan_error(
                            err, err_len,
                            "cuda device: the copies need more than the %llu contiguous runs sized "
                            "at open",
                            (unsigned long long)runs->cap);
                        return KVS_EOVERFLOW;
                    }
                    runs->dst[runs->n] = dst;
                    runs->src[runs->n] = src;
                    runs->bytes[runs->n] = bytes;
                    runs->n++;
                }
                t += count;
            }
        }
    }
    return KVS_OK;
}
