/* calibrate.cu - kernel vs copy engines on a scratch layer (see calibrate.h). */
#include "calibrate.h"

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels_cuda.h"

namespace {

/* A pass big enough that launch and per-copy overheads weigh as they do in a real step (16 chunks
 * of 256 tokens), small enough that open stays well under a second. */
constexpr uint64_t kMaxTokens = 4096;
constexpr uint64_t kMaxPayloadBytes = 64ull << 20;
constexpr uint32_t kMaxCopies = 16;
constexpr int kTimedPasses = 5; /* after one untimed warm-up pass; the fastest is kept */

/* Everything the measurement allocates; release() frees what is set, in reverse order. */
struct scratch {
    unsigned char *pages = nullptr;     /* device: the scratch layer's blocks */
    unsigned char *payload = nullptr;   /* pinned host: K rows then V rows */
    unsigned char *desc_host = nullptr; /* pinned host: the packed descriptor block */
    unsigned char *desc_dev = nullptr;  /* device copy of it */
    uint32_t *table = nullptr;          /* every copy's block table, back to back */
    kvs_dev_copy *copies = nullptr;
    void **run_dst = nullptr;
    const void **run_src = nullptr;
    size_t *run_bytes = nullptr;
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
};

void release(scratch *s) {
    if (s->stop) cudaEventDestroy(s->stop);
    if (s->start) cudaEventDestroy(s->start);
    free(s->run_bytes);
    free(s->run_src);
    free(s->run_dst);
    free(s->copies);
    free(s->table);
    if (s->desc_dev) cudaFree(s->desc_dev);
    if (s->desc_host) cudaFreeHost(s->desc_host);
    if (s->payload) cudaFreeHost(s->payload);
    if (s->pages) cudaFree(s->pages);
}

kvs_status cuda_failed(cudaError_t rc, const char *what, char *err, size_t err_len) {
    kvs_fmt(err, err_len, "cuda device: calibration: %s: %s (%s)", what, cudaGetErrorString(rc),
            cudaGetErrorName(rc));
    (void)cudaGetLastError();
    return rc == cudaErrorMemoryAllocation ? KVS_ENOMEM : KVS_EIO;
}

/* One timed pass: the event pair brackets exactly what load_layer / save_layer would enqueue. */
struct pass {
    bool dma;
    int to_pages;
    cudaStream_t stream;
    const kvs_cuda_move *move; /* kernel */
    uint64_t desc_bytes;
    const kvs_cuda_runs *runs; /* dma */
};

cudaError_t enqueue(const pass *p, const scratch *s, uint32_t max_grid, int *use_batch) {
    if (p->dma) return kvs_cuda_issue_runs(p->runs, p->stream, use_batch);
    cudaError_t rc = cudaMemcpyAsync(s->desc_dev, s->desc_host, p->desc_bytes,
                                     cudaMemcpyHostToDevice, p->stream);
    if (rc != cudaSuccess) return rc;
    return kvs_cuda_launch_move(p->move, max_grid, p->stream);
}

kvs_status time_pass(const pass *p, const scratch *s, uint32_t max_grid, int *use_batch,
                     uint64_t bytes, double *gbps, char *err, size_t err_len) {
    float best_ms = 0;
    for (int i = 0; i <= kTimedPasses; i++) {
        cudaError_t rc = cudaEventRecord(s->start, p->stream);
        if (rc == cudaSuccess) rc = enqueue(p, s, max_grid, use_batch);
        if (rc == cudaSuccess) rc = cudaEventRecord(s->stop, p->stream);
        if (rc == cudaSuccess) rc = cudaEventSynchronize(s->stop);
        float ms = 0;
        if (rc == cudaSuccess) rc = cudaEventElapsedTime(&ms, s->start, s->stop);
        if (rc != cudaSuccess)
            return cuda_failed(rc, p->dma ? "copy-engine pass" : "kernel pass", err, err_len);
        if (i > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
    }
    *gbps = best_ms > 0 ? (double)bytes / ((double)best_ms * 1e6) : 0;
    return KVS_OK;
}

} // namespace

extern "C" kvs_status kvs_cuda_calibrate(const kvs_cuda_layer *engine, uint32_t max_tokens,
                                         uint32_t max_copies, uint32_t max_grid,
                                         cudaStream_t load_stream, cudaStream_t save_stream,
                                         int *use_batch, kvs_cuda_calibration *out, char *err,
                                         size_t err_len) {
    memset(out, 0, sizeof *out);
    const uint64_t run_bytes = kvs_cuda_run_bytes(engine);
    if (run_bytes == 0 || max_tokens == 0 || max_copies == 0) {
        kvs_fmt(err, err_len,
                "cuda device: calibration: the layout has no contiguous runs to compare");
        return KVS_EINVAL;
    }
    const uint64_t token_bytes = kvs_cuda_token_bytes(engine);
    const uint32_t bt = engine->block_tokens;
    uint64_t tokens = max_tokens < kMaxTokens ? max_tokens : kMaxTokens;
    const uint64_t fit = kMaxPayloadBytes / (engine->n_parts * token_bytes);
    if (tokens > fit) tokens = fit;
    if (tokens == 0) tokens = 1;
    uint64_t copies = max_copies < kMaxCopies ? max_copies : kMaxCopies;
    if (copies > tokens) copies = tokens;

    /* Copies of nearly equal size, each starting at a block boundary; blocks handed out from the
     * top down so no two runs are adjacent in the same order on both sides. */
    uint64_t n_blocks = 0;
    for (uint64_t c = 0; c < copies; c++) {
        const uint64_t n = tokens / copies + (c < tokens % copies ? 1 : 0);
        n_blocks += (n + bt - 1) / bt;
    }
    kvs_cuda_layer layer = *engine;
    layer.n_blocks = (uint32_t)n_blocks;
    layer.block_stride = (int64_t)(engine->n_parts * run_bytes);
    layer.token_stride = (int64_t)token_bytes;
    layer.head_stride = (int64_t)engine->head_bytes;
    layer.heads_contiguous = 1;
    layer.tokens_contiguous = 1;
    /* Offset the scratch bases so the kernel gets the copy unit the engine's pages allow. */
    const uint32_t unit = kvs_cuda_unit_bytes(kvs_cuda_layer_align_bits(engine));
    const uint64_t shift = unit == 16 ? 0 : unit;

    scratch s;
    const uint64_t page_bytes = n_blocks * (uint64_t)layer.block_stride;
    const uint64_t payload_bytes = engine->n_parts * tokens * token_bytes;
    const uint64_t desc_bytes = kvs_cuda_desc_block_bytes((uint32_t)copies, n_blocks);
    const uint64_t max_runs = engine->n_parts * n_blocks;
    cudaError_t rc = cudaMalloc(reinterpret_cast<void **>(&s.pages), page_bytes + 16);
    if (rc == cudaSuccess)
        rc = cudaMallocHost(reinterpret_cast<void **>(&s.payload), payload_bytes);
    if (rc == cudaSuccess) rc = cudaMallocHost(reinterpret_cast<void **>(&s.desc_host), desc_bytes);
    if (rc == cudaSuccess) rc = cudaMalloc(reinterpret_cast<void **>(&s.desc_dev), desc_bytes);
    if (rc == cudaSuccess) rc = cudaEventCreate(&s.start);
    if (rc == cudaSuccess) rc = cudaEventCreate(&s.stop);
    if (rc == cudaSuccess) rc = cudaMemsetAsync(s.pages, 0, page_bytes + 16, load_stream);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(load_stream);
    if (rc != cudaSuccess) {
        kvs_status st = cuda_failed(rc, "scratch buffers", err, err_len);
        release(&s);
        return st;
    }
    s.table = static_cast<uint32_t *>(malloc(n_blocks * sizeof *s.table));
    s.copies = static_cast<kvs_dev_copy *>(calloc(copies, sizeof *s.copies));
    s.run_dst = static_cast<void **>(malloc(max_runs * sizeof *s.run_dst));
    s.run_src = static_cast<const void **>(malloc(max_runs * sizeof *s.run_src));
    s.run_bytes = static_cast<size_t *>(malloc(max_runs * sizeof *s.run_bytes));
    if (!s.table || !s.copies || !s.run_dst || !s.run_src || !s.run_bytes) {
        kvs_fmt(err, err_len, "cuda device: calibration: out of host memory");
        release(&s);
        return KVS_ENOMEM;
    }
    memset(s.payload, 0x5a, payload_bytes);
    layer.part_base[0] = (uint64_t)(uintptr_t)s.pages + shift;
    layer.part_base[1] = engine->n_parts == 2 ? layer.part_base[0] + run_bytes : 0;

    uint64_t next_block = n_blocks, row = 0, table_at = 0;
    for (uint64_t c = 0; c < copies; c++) {
        const uint64_t n = tokens / copies + (c < tokens % copies ? 1 : 0);
        const uint64_t ids = (n + bt - 1) / bt;
        kvs_dev_copy *copy = &s.copies[c];
        copy->block_ids = s.table + table_at;
        copy->n_block_ids = ids;
        copy->first_token = 0;
        copy->n_tokens = (uint32_t)n;
        copy->k_payload = s.payload + row * token_bytes;
        copy->v_payload = engine->n_parts == 2 ? s.payload + (tokens + row) * token_bytes : nullptr;
        for (uint64_t i = 0; i < ids; i++) s.table[table_at + i] = (uint32_t)--next_block;
        table_at += ids;
        row += n;
    }

    /* cudaMallocHost memory is mapped and, with unified addressing, the kernel reads it at its
     * host address: no translation. */
    kvs_cuda_packed packed;
    kvs_status st = kvs_cuda_pack(&layer, s.copies, copies, nullptr, nullptr, s.desc_host,
                                  desc_bytes, &packed, err, err_len);
    if (st != KVS_OK) {
        release(&s);
        return st;
    }
    kvs_cuda_move move;
    memset(&move, 0, sizeof move);
    move.layer = layer;
    move.descs = reinterpret_cast<const kvs_cuda_copy_desc *>(s.desc_dev);
    move.ids = reinterpret_cast<const uint32_t *>(s.desc_dev + packed.ids_offset);
    move.n_copies = packed.n_copies;
    move.n_tokens = packed.n_tokens;
    move.unit_bytes = kvs_cuda_unit_bytes(kvs_cuda_layer_align_bits(&layer) | packed.align_bits);
    kvs_cuda_runs runs = {s.run_dst, s.run_src, s.run_bytes, 0, max_runs};

    for (int dir = 0; dir < 2 && st == KVS_OK; dir++) {
        const int to_pages = dir == 0;
        cudaStream_t stream = to_pages ? load_stream : save_stream;
        move.to_pages = to_pages;
        pass kernel = {false, to_pages, stream, &move, packed.bytes, nullptr};
        st = time_pass(&kernel, &s, max_grid, use_batch, payload_bytes, &out->kernel_gbps[dir], err,
                       err_len);
        if (st != KVS_OK) break;
        st = kvs_cuda_plan_runs(&layer, s.copies, copies, to_pages, &runs, err, err_len);
        if (st != KVS_OK) break;
        pass dma = {true, to_pages, stream, nullptr, 0, &runs};
        st = time_pass(&dma, &s, max_grid, use_batch, payload_bytes, &out->dma_gbps[dir], err,
                       err_len);
    }
    out->bytes = payload_bytes;
    out->tokens = (uint32_t)tokens;
    out->copies = (uint32_t)copies;
    out->runs = runs.n;
    release(&s);
    return st;
}
