/* bench_cuda.cu - the CUDA device module (libkvstrata-cuda.so.1) on a GPU, through its device table
 * as the connector drives it. Needs a GPU: exits 77 with the reason where none is usable.
 *
 * Model step (defaults): 32 layers, 8 KV heads of head dim 128 in bf16, vLLM FlashAttention NHD pages
 * [2, blocks, 16, 8, 128] per layer, 16 chunks of 256 tokens whose 16 blocks each sit at random
 * places among 4x as many blocks; the payload is one pinned object per chunk, layer after layer
 * (K rows then V rows), registered with register_host as the connector's pool is. One step moves
 * 16 x 32 x 1 MiB = 512 MiB.
 *
 * Results (one JSON object and one human line each), per copy method (kernel, dma):
 *   cuda_load_<m>, cuda_save_<m>  a whole step through load_layer x layers + sync (resp. save_layer),
 *       wall time, against one cudaMemcpyAsync of the same bytes between one contiguous pinned buffer
 *       and device memory: ratio = our GB/s / memcpy GB/s.
 *   cuda_overlap_<m>  a step whose engine stream runs, per layer, wait_layer(l) then a synthetic
 *       attention kernel that reads layer l's pages and stays busy --compute-us (default: as long
 *       as one layer's transfer, the hardest case): wall time against max(compute alone, transfer
 *       alone); 1.0 is perfect overlap, the target is <= 1.15.
 *   cuda_sm_cost_<m>  a fixed-work compute kernel (reads every layer's step pages, FMAs) timed with
 *       events while a load step runs beside it, against the same kernel alone: the slowdown the
 *       copies cost the engine.
 * Before measuring, one load is checked byte for byte against the payload. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "abi/kvstrata_backend.h" /* KVS_LOG_* */
#include "bench_common.h"
#include "kernels/device.h"

#ifndef KVS_BENCH_CUDA_MODULE
#define KVS_BENCH_CUDA_MODULE KVS_DEVICE_CUDA_MODULE
#endif

namespace {

struct options {
    uint32_t layers = 32;
    uint32_t chunks = 16;
    uint32_t chunk_tokens = 256;
    uint32_t heads = 8;
    uint32_t head_dim = 128;
    uint32_t block_tokens = 16;
    uint32_t spread = 4; /* the pages hold spread x the blocks the step uses */
    uint32_t iters = 10;
    uint32_t warmup = 2;
    uint32_t compute_us = 0; /* 0: one layer's measured transfer time */
    uint32_t work_passes = 4;
};

struct bench {
    options opt;
    const kvs_device_ops *ops = nullptr;
    uint64_t head_bytes = 0, token_bytes = 0, block_bytes = 0; /* block: one part (K or V) */
    uint64_t n_blocks = 0, used_blocks = 0;
    uint64_t layer_bytes = 0;            /* one layer's pages [2][n_blocks][block] */
    uint64_t chunk_layer_bytes = 0;      /* K+V of one chunk of one layer */
    uint64_t step_bytes = 0;             /* what one step moves */
    unsigned char *pages = nullptr;      /* device, layers x layer_bytes */
    unsigned char *payload = nullptr;    /* host, chunks x layers x chunk_layer_bytes */
    unsigned char *contiguous = nullptr; /* device, step_bytes: the memcpy reference */
    uint32_t *table = nullptr;           /* used_blocks ids: chunk c owns [c * per_chunk, ...) */
    uint32_t *table_dev = nullptr;       /* the same on the device, for the compute kernels */
    kvs_dev_copy *copies = nullptr;      /* layers x chunks */
    kvs_layer_view *views = nullptr;
    unsigned long long *sink = nullptr; /* device: keeps the compute kernels' reads alive */
    cudaStream_t engine = nullptr;
    int n_sms = 1;
};

void die(const char *what, cudaError_t rc) {
    fprintf(stderr, "%s: %s (%s)\n", what, cudaGetErrorString(rc), cudaGetErrorName(rc));
    exit(1);
}

#define CUDA_OR_DIE(call)                        \
    do {                                         \
        cudaError_t rc_ = (call);                \
        if (rc_ != cudaSuccess) die(#call, rc_); \
    } while (0)

void check_status(kvs_status st, const char *what, const char *err) {
    if (st == KVS_OK) return;
    fprintf(stderr, "%s failed (%d): %s\n", what, (int)st, err);
    exit(1);
}

/* --- kernels standing in for the engine ----------------------------------------------------- */

__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Attention stand-in for one layer: read the step's pages of the layer (K and V of every used
 * block), then stay busy until busy_ns have passed since the block started. */
__global__ void attention_like(const unsigned char *layer, const uint32_t *table, uint64_t used,
                               uint64_t n_blocks, uint64_t block_bytes, unsigned long long busy_ns,
                               unsigned long long *sink) {
    const unsigned long long start = now_ns();
    const uint64_t units = block_bytes / 16;
    unsigned long long acc = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < 2 * used * units;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t part = i / (used * units), rest = i % (used * units);
        const uint64_t block = table[rest / units], unit = rest % units;
        const uint4 v =
            reinterpret_cast<const uint4 *>(layer + (part * n_blocks + block) * block_bytes)[unit];
        acc += v.x ^ v.w;
    }
    while (now_ns() - start < busy_ns) {
    }
    if (acc == 0x12345) *sink = acc; /* never true in practice; the compiler cannot know */
}

/* Fixed work: read every layer's step pages `passes` times with a few FMAs per element. */
__global__ void fixed_work(const unsigned char *pages, const uint32_t *table, uint32_t layers,
                           uint64_t used, uint64_t n_blocks, uint64_t block_bytes, uint32_t passes,
                           unsigned long long *sink) {
    const uint64_t units = block_bytes / 16, per_layer = 2 * used * units;
    float acc = 0.f;
    for (uint32_t p = 0; p < passes; p++)
        for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < layers * per_layer;
             i += (uint64_t)gridDim.x * blockDim.x) {
            const uint64_t layer = i / per_layer, r = i % per_layer;
            const uint64_t part = r / (used * units), rest = r % (used * units);
            const uint64_t block = table[rest / units], unit = rest % units;
            const uint4 v = reinterpret_cast<const uint4 *>(
                pages + ((layer * 2 + part) * n_blocks + block) * block_bytes)[unit];
            float x = __uint_as_float((v.x & 0x007fffffu) | 0x3f800000u);
#pragma unroll
            for (int k = 0; k < 16; k++) acc = fmaf(acc, 0.999f, x);
        }
    if (acc == 12345.f) *sink = (unsigned long long)acc;
}

/* --- setup ---------------------------------------------------------------------------------- */

const kvs_device_ops *load_module() {
    void *so = dlopen(KVS_BENCH_CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        /* Installed layout: bin/../lib */
        char exe[4096], path[4200];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
            exe[n] = '\0';
            char *slash = strrchr(exe, '/');
            if (slash) *slash = '\0';
            snprintf(path, sizeof path, "%s/../lib/%s", exe, KVS_DEVICE_CUDA_MODULE);
            so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (!so) {
        fprintf(stderr, "cannot load the CUDA module %s: %s\n", KVS_BENCH_CUDA_MODULE, dlerror());
        exit(1);
    }
    kvs_device_entry_fn entry = nullptr;
    *reinterpret_cast<void **>(&entry) = dlsym(so, KVS_DEVICE_ENTRY_SYMBOL);
    const kvs_device_ops *ops = entry ? entry(KVS_DEVICE_ABI_VERSION) : nullptr;
    if (!ops) {
        fprintf(stderr, "%s offers no device table of version %d\n", KVS_BENCH_CUDA_MODULE,
                KVS_DEVICE_ABI_VERSION);
        exit(1);
    }
    return ops;
}

void setup(bench *b) {
    const options &o = b->opt;
    b->head_bytes = (uint64_t)o.head_dim * 2; /* bf16 */
    b->token_bytes = o.heads * b->head_bytes;
    b->block_bytes = o.block_tokens * b->token_bytes;
    const uint64_t per_chunk = o.chunk_tokens / o.block_tokens;
    b->used_blocks = per_chunk * o.chunks;
    b->n_blocks = b->used_blocks * o.spread;
    b->layer_bytes = 2 * b->n_blocks * b->block_bytes;
    b->chunk_layer_bytes = 2ull * o.chunk_tokens * b->token_bytes;
    b->step_bytes = b->chunk_layer_bytes * o.chunks * o.layers;

    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&b->pages), b->layer_bytes * o.layers));
    CUDA_OR_DIE(cudaMemset(b->pages, 0, b->layer_bytes * o.layers));
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&b->contiguous), b->step_bytes));
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&b->sink), sizeof *b->sink));
    void *map =
        mmap(nullptr, b->step_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        fprintf(stderr, "cannot map %llu bytes of payload\n", (unsigned long long)b->step_bytes);
        exit(1);
    }
    b->payload = static_cast<unsigned char *>(map);
    for (uint64_t i = 0; i < b->step_bytes; i += 8) {
        uint64_t x = bench_mix64(i);
        memcpy(b->payload + i, &x, 8);
    }

    /* A random permutation of the blocks; the step uses its first used_blocks. */
    uint32_t *perm = static_cast<uint32_t *>(malloc(b->n_blocks * sizeof *perm));
    b->table = static_cast<uint32_t *>(malloc(b->used_blocks * sizeof *b->table));
    b->copies = static_cast<kvs_dev_copy *>(calloc((size_t)o.layers * o.chunks, sizeof *b->copies));
    b->views = static_cast<kvs_layer_view *>(calloc(o.layers, sizeof *b->views));
    if (!perm || !b->table || !b->copies || !b->views) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (uint64_t i = 0; i < b->n_blocks; i++) perm[i] = (uint32_t)i;
    for (uint64_t i = b->n_blocks - 1; i > 0; i--) {
        uint64_t j = bench_mix64(i ^ 0x6b7673) % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(b->table, perm, b->used_blocks * sizeof *b->table);
    free(perm);
    CUDA_OR_DIE(
        cudaMalloc(reinterpret_cast<void **>(&b->table_dev), b->used_blocks * sizeof(uint32_t)));
    CUDA_OR_DIE(cudaMemcpy(b->table_dev, b->table, b->used_blocks * sizeof(uint32_t),
                           cudaMemcpyHostToDevice));

    for (uint32_t l = 0; l < o.layers; l++) {
        kvs_layer_view *v = &b->views[l];
        v->struct_size = sizeof *v;
        v->device_kind = KVS_DEVICE_CUDA;
        v->device_index = 0;
        v->n_blocks = (uint32_t)b->n_blocks;
        v->k_base = b->pages + l * b->layer_bytes;
        v->v_base = b->pages + l * b->layer_bytes + b->n_blocks * b->block_bytes;
        v->block_stride = (int64_t)b->block_bytes;
        v->token_stride = (int64_t)b->token_bytes;
        v->head_stride = (int64_t)b->head_bytes;
        for (uint32_t c = 0; c < o.chunks; c++) {
            kvs_dev_copy *d = &b->copies[(size_t)l * o.chunks + c];
            unsigned char *object =
                b->payload + ((uint64_t)c * o.layers + l) * b->chunk_layer_bytes;
            d->block_ids = b->table + (uint64_t)c * per_chunk;
            d->n_block_ids = per_chunk;
            d->first_token = 0;
            d->n_tokens = o.chunk_tokens;
            d->k_payload = object;
            d->v_payload = object + b->chunk_layer_bytes / 2;
        }
    }
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&b->engine, cudaStreamNonBlocking));
    CUDA_OR_DIE(cudaDeviceGetAttribute(&b->n_sms, cudaDevAttrMultiProcessorCount, 0));
}

void *open_device(bench *b, kvs_dev_copy_method method, kvs_device_info *info) {
    kvs_device_init init;
    memset(&init, 0, sizeof init);
    init.struct_size = sizeof init;
    init.views = b->views;
    init.n_layers = b->opt.layers;
    init.shape = {b->opt.heads, (uint32_t)b->head_bytes, b->opt.block_tokens, 1};
    init.max_tokens_per_layer = b->opt.chunks * b->opt.chunk_tokens;
    init.max_copies_per_layer = b->opt.chunks;
    init.method = method;
    init.log_level = KVS_LOG_INFO; /* the method and calibration line */
    void *state = nullptr;
    char err[512] = "";
    check_status(b->ops->open(&init, &state, info, err, sizeof err), "open", err);
    check_status(b->ops->register_host(state, b->payload, b->step_bytes, err, sizeof err),
                 "register_host", err);
    check_status(b->ops->set_stream(state, b->engine, err, sizeof err), "set_stream", err);
    return state;
}

/* --- one step of each kind --------------------------------------------------------------------- */

void enqueue_loads(bench *b, void *dev) {
    char err[512] = "";
    for (uint32_t l = 0; l < b->opt.layers; l++)
        check_status(b->ops->load_layer(dev, l, &b->copies[(size_t)l * b->opt.chunks],
                                        b->opt.chunks, err, sizeof err),
                     "load_layer", err);
}

void sync_device(bench *b, void *dev) {
    char err[512] = "";
    check_status(b->ops->sync(dev, err, sizeof err), "sync", err);
}

double load_step_ns(bench *b, void *dev) {
    const uint64_t t0 = bench_now_ns();
    enqueue_loads(b, dev);
    sync_device(b, dev);
    return (double)(bench_now_ns() - t0);
}

double save_step_ns(bench *b, void *dev) {
    char err[512] = "";
    const uint64_t t0 = bench_now_ns();
    for (uint32_t l = 0; l < b->opt.layers; l++)
        check_status(b->ops->save_layer(dev, l, &b->copies[(size_t)l * b->opt.chunks],
                                        b->opt.chunks, err, sizeof err),
                     "save_layer", err);
    sync_device(b, dev);
    return (double)(bench_now_ns() - t0);
}

double memcpy_ns(bench *b, cudaMemcpyKind kind) {
    const uint64_t t0 = bench_now_ns();
    if (kind == cudaMemcpyHostToDevice)
        CUDA_OR_DIE(cudaMemcpyAsync(b->contiguous, b->payload, b->step_bytes, kind, b->engine));
    else
        CUDA_OR_DIE(cudaMemcpyAsync(b->payload, b->contiguous, b->step_bytes, kind, b->engine));
    CUDA_OR_DIE(cudaStreamSynchronize(b->engine));
    return (double)(bench_now_ns() - t0);
}

void launch_attention(bench *b, uint32_t layer, unsigned long long busy_ns) {
    attention_like<<<b->n_sms, 256, 0, b->engine>>>(b->pages + layer * b->layer_bytes, b->table_dev,
                                                    b->used_blocks, b->n_blocks, b->block_bytes,
                                                    busy_ns, b->sink);
    CUDA_OR_DIE(cudaGetLastError());
}

double compute_alone_ns(bench *b, unsigned long long busy_ns) {
    const uint64_t t0 = bench_now_ns();
    for (uint32_t l = 0; l < b->opt.layers; l++) launch_attention(b, l, busy_ns);
    CUDA_OR_DIE(cudaStreamSynchronize(b->engine));
    return (double)(bench_now_ns() - t0);
}

/* start_load, then the forward pass: per layer, wait for its loads, then attention. */
double overlapped_ns(bench *b, void *dev, unsigned long long busy_ns) {
    char err[512] = "";
    const uint64_t t0 = bench_now_ns();
    enqueue_loads(b, dev);
    for (uint32_t l = 0; l < b->opt.layers; l++) {
        check_status(b->ops->wait_layer(dev, l, err, sizeof err), "wait_layer", err);
        launch_attention(b, l, busy_ns);
    }
    CUDA_OR_DIE(cudaStreamSynchronize(b->engine));
    sync_device(b, dev);
    return (double)(bench_now_ns() - t0);
}

float fixed_work_ms(bench *b, cudaEvent_t start, cudaEvent_t stop) {
    CUDA_OR_DIE(cudaEventRecord(start, b->engine));
    fixed_work<<<b->n_sms * 4, 256, 0, b->engine>>>(b->pages, b->table_dev, b->opt.layers,
                                                    b->used_blocks, b->n_blocks, b->block_bytes,
                                                    b->opt.work_passes, b->sink);
    CUDA_OR_DIE(cudaGetLastError());
    CUDA_OR_DIE(cudaEventRecord(stop, b->engine));
    CUDA_OR_DIE(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, start, stop));
    return ms;
}

/* Layer 0, chunk 0 after a load: its K and V rows are the payload's, byte for byte. */
void verify_load(bench *b, void *dev) {
    load_step_ns(b, dev);
    const uint64_t per_chunk = b->opt.chunk_tokens / b->opt.block_tokens;
    unsigned char *row = static_cast<unsigned char *>(malloc(b->block_bytes));
    for (uint64_t i = 0; i < per_chunk; i++)
        for (int part = 0; part < 2; part++) {
            const unsigned char *page =
                b->pages + ((uint64_t)part * b->n_blocks + b->table[i]) * b->block_bytes;
            CUDA_OR_DIE(cudaMemcpy(row, page, b->block_bytes, cudaMemcpyDeviceToHost));
            const unsigned char *want =
                b->payload + (uint64_t)part * b->chunk_layer_bytes / 2 + i * b->block_bytes;
            if (memcmp(row, want, b->block_bytes) != 0) {
                fprintf(stderr,
                        "load check: layer 0 chunk 0 block %llu %s differs from the payload\n",
                        (unsigned long long)i, part ? "V" : "K");
                exit(1);
            }
        }
    free(row);
}

void usage(const char *prog) {
    fprintf(
        stderr,
        "usage: %s [--layers L] [--chunks C] [--chunk-tokens T] [--heads H] [--head-dim D]\n"
        "          [--block B] [--spread S] [--iters R] [--warmup W] [--compute-us U]\n"
        "          [--work-passes P]\n"
        "  --layers       model layers (default 32)\n"
        "  --chunks       chunks per step, each its own request-sized copy (default 16)\n"
        "  --chunk-tokens tokens per chunk (default 256)\n"
        "  --heads, --head-dim  KV heads and head dim, bf16 (default 8, 128)\n"
        "  --block        tokens per page (default 16)\n"
        "  --spread       pages per layer = spread x the pages a step uses (default 4)\n"
        "  --iters        measured rounds, median reported (default 10)\n"
        "  --warmup       unmeasured rounds first (default 2)\n"
        "  --compute-us   busy time of the attention stand-in per layer (default 0: one layer's\n"
        "                 measured transfer time)\n"
        "  --work-passes  passes over the step's pages of the fixed-work kernel (default 4)\n",
        prog);
}

options parse(int argc, char **argv) {
    options o;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : nullptr;
        uint32_t *field = nullptr;
        uint64_t lo = 1, hi = 1u << 20;
        if (!strcmp(a, "--layers"))
            field = &o.layers, hi = 1024;
        else if (!strcmp(a, "--chunks"))
            field = &o.chunks, hi = 4096;
        else if (!strcmp(a, "--chunk-tokens"))
            field = &o.chunk_tokens;
        else if (!strcmp(a, "--heads"))
            field = &o.heads, hi = 1024;
        else if (!strcmp(a, "--head-dim"))
            field = &o.head_dim, lo = 8, hi = 4096;
        else if (!strcmp(a, "--block"))
            field = &o.block_tokens, hi = 1024;
        else if (!strcmp(a, "--spread"))
            field = &o.spread, hi = 64;
        else if (!strcmp(a, "--iters"))
            field = &o.iters, hi = 10000;
        else if (!strcmp(a, "--warmup"))
            field = &o.warmup, lo = 0, hi = 1000;
        else if (!strcmp(a, "--compute-us"))
            field = &o.compute_us, lo = 0, hi = 1000000;
        else if (!strcmp(a, "--work-passes"))
            field = &o.work_passes, hi = 1000;
        else {
            usage(argv[0]);
            exit(!strcmp(a, "--help") || !strcmp(a, "-h") ? 0 : 2);
        }
        *field = (uint32_t)bench_parse_u64(a, v, lo, hi);
        i++;
    }
    if (o.chunk_tokens % o.block_tokens != 0 || (o.head_dim * 2) % 16 != 0) {
        fprintf(stderr, "--chunk-tokens must be a multiple of --block, and --head-dim of 8\n");
        exit(2);
    }
    return o;
}

const char *method_name(int dma) {
    return dma ? "dma" : "kernel";
}

} // namespace

int main(int argc, char **argv) {
    bench b;
    b.opt = parse(argc, argv);
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        printf("kvs-bench-cuda: skipped: no usable CUDA device (%s)\n",
               rc != cudaSuccess ? cudaGetErrorString(rc) : "cudaGetDeviceCount found none");
        return 77;
    }
    b.ops = load_module();
    setup(&b);
    cudaDeviceProp prop;
    CUDA_OR_DIE(cudaGetDeviceProperties(&prop, 0));
    const options &o = b.opt;
    printf("# %s: %u layers x %u chunks x %u tokens, %u heads x %u bf16, block %u: %.0f MiB per "
           "step\n",
           prop.name, o.layers, o.chunks, o.chunk_tokens, o.heads, o.head_dim, o.block_tokens,
           (double)b.step_bytes / (1 << 20));

    cudaEvent_t start, stop;
    CUDA_OR_DIE(cudaEventCreate(&start));
    CUDA_OR_DIE(cudaEventCreate(&stop));
    const uint32_t rounds = o.warmup + o.iters;
    double *v[8];
    for (int i = 0; i < 8; i++) {
        v[i] = static_cast<double *>(calloc(rounds, sizeof(double)));
        if (!v[i]) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
    }
    for (int dma = 0; dma < 2; dma++) {
        kvs_device_info info;
        void *dev = open_device(&b, dma ? KVS_DEV_COPY_DMA : KVS_DEV_COPY_KERNEL, &info);
        if (info.load_uses_dma != dma) {
            fprintf(stderr, "the device did not take the %s method\n", method_name(dma));
            return 1;
        }
        verify_load(&b, dev);
        const char *m = method_name(dma);

        /* (1) transfers; rounds interleave ours and the reference so drift hits both alike */
        for (uint32_t r = 0; r < rounds; r++) {
            const double load = load_step_ns(&b, dev),
                         ref_load = memcpy_ns(&b, cudaMemcpyHostToDevice);
            const double save = save_step_ns(&b, dev),
                         ref_save = memcpy_ns(&b, cudaMemcpyDeviceToHost);
            if (r < o.warmup) continue;
            const uint32_t k = r - o.warmup;
            v[0][k] = load, v[1][k] = ref_load, v[2][k] = save, v[3][k] = ref_save;
        }
        const double load = bench_median(v[0], o.iters), ref_load = bench_median(v[1], o.iters);
        const double save = bench_median(v[2], o.iters), ref_save = bench_median(v[3], o.iters);
        const double bytes = (double)b.step_bytes;
        const struct {
            const char *dir;
            double ns, ref_ns;
        } t[2] = {{"load", load, ref_load}, {"save", save, ref_save}};
        for (int d = 0; d < 2; d++) {
            const double gbps = bytes / t[d].ns, ref = bytes / t[d].ref_ns;
            printf(
                "{\"bench\":\"cuda_%s_%s\",\"ratio\":%.3f,\"reference\":\"cudaMemcpyAsync %s of "
                "the same bytes, one contiguous pinned buffer\",\"gbps\":%.3f,\"reference_gbps\":"
                "%.3f,\"ns\":%.0f,\"reference_ns\":%.0f,\"bytes\":%.0f,\"layers\":%u,\"chunks\":%u,"
                "\"chunk_tokens\":%u,\"method\":\"%s\",\"run_bytes\":%llu,\"iterations\":%u,"
                "\"warmup\":%u}\n",
                t[d].dir, m, gbps / ref, d ? "D2H" : "H2D", gbps, ref, t[d].ns, t[d].ref_ns, bytes,
                o.layers, o.chunks, o.chunk_tokens, m, (unsigned long long)info.run_bytes, o.iters,
                o.warmup);
            printf("%s by %s: %.2f GB/s, one cudaMemcpyAsync %.2f GB/s, ratio %.3f\n", t[d].dir, m,
                   gbps, ref, gbps / ref);
        }

        /* (2) overlap */
        const unsigned long long busy_ns = o.compute_us ? (unsigned long long)o.compute_us * 1000ull
                                                        : (unsigned long long)(load / o.layers);
        for (uint32_t r = 0; r < rounds; r++) {
            const double c = compute_alone_ns(&b, busy_ns), x = load_step_ns(&b, dev);
            const double both = overlapped_ns(&b, dev, busy_ns);
            if (r < o.warmup) continue;
            v[4][r - o.warmup] = c, v[5][r - o.warmup] = x, v[6][r - o.warmup] = both;
        }
        const double c = bench_median(v[4], o.iters), x = bench_median(v[5], o.iters);
        const double both = bench_median(v[6], o.iters), ref = c > x ? c : x;
        printf(
            "{\"bench\":\"cuda_overlap_%s\",\"ratio\":%.3f,\"reference\":\"max(compute alone, "
            "transfer alone)\",\"target\":1.15,\"ns\":%.0f,\"reference_ns\":%.0f,\"compute_ns\":"
            "%.0f,\"transfer_ns\":%.0f,\"busy_ns_per_layer\":%llu,\"layers\":%u,\"method\":\"%s\","
            "\"iterations\":%u,\"warmup\":%u}\n",
            m, both / ref, both, ref, c, x, busy_ns, o.layers, m, o.iters, o.warmup);
        printf("overlap by %s: step %.2f ms, compute alone %.2f ms, transfer alone %.2f ms, ratio "
               "%.3f (target <= 1.15)\n",
               m, both / 1e6, c / 1e6, x / 1e6, both / ref);

        /* (3) SM cost: the fixed-work kernel alone, and while a load step runs beside it */
        for (uint32_t r = 0; r < rounds; r++) {
            const float alone = fixed_work_ms(&b, start, stop);
            enqueue_loads(&b, dev);
            const float beside = fixed_work_ms(&b, start, stop);
            sync_device(&b, dev);
            if (r < o.warmup) continue;
            v[7][r - o.warmup] = beside / alone;
            v[4][r - o.warmup] = alone, v[5][r - o.warmup] = beside;
        }
        const double slowdown = bench_median(v[7], o.iters);
        const double alone = bench_median(v[4], o.iters), beside = bench_median(v[5], o.iters);
        printf(
            "{\"bench\":\"cuda_sm_cost_%s\",\"ratio\":%.3f,\"reference\":\"the fixed-work kernel "
            "alone\",\"ms\":%.3f,\"reference_ms\":%.3f,\"work_passes\":%u,\"method\":\"%s\","
            "\"iterations\":%u,\"warmup\":%u}\n",
            m, slowdown, beside, alone, o.work_passes, m, o.iters, o.warmup);
        printf("SM cost of %s loads: compute kernel %.3f ms beside a load vs %.3f ms alone, "
               "slowdown %.3f\n",
               m, beside, alone, slowdown);
        b.ops->close(dev);
    }
    return 0;
}
