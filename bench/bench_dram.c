/* bench_dram.c - save and load of whole chunks through the engine ABI with one DRAM tier on the host
 * device, against copies of the same bytes measured in the same run, with as many threads.
 *
 * Model: 8 KV heads, head dim 128, fp16, vLLM FlashAttention NHD pages [2, blocks, 16, 8, 128] per
 * layer, 256-token chunks, so one layer of one chunk is K+V = 1 MiB. The engine's block table is a
 * fixed random permutation, as a paged allocator hands out blocks.
 *
 * One load step restores every chunk of one request: lookup, on_alloc and build_meta (scheduler,
 * timed as their own figure), then bind_meta, start_load, wait_layer_load for each layer and wait_save
 * (worker, the load figure). One save step stores every chunk of one request that the tier does not
 * hold (the bench removes them from the tier between steps, untimed): lookup and build_meta
 * (scheduler), then bind_meta, save_layer for each layer and wait_save (worker, the save figure).
 *
 * Reference, with as many threads as the path uses (--threads T: the host device's
 * `device.host_threads`, the calling thread and T - 1 helpers each taking whole chunks): a copy of the same number of bytes in 1 MiB pieces (one layer of one chunk) between a buffer as
 * large as the tier's working set (huge pages, as the tier maps it) and one as large as the engine
 * pages the step touches (ordinary pages), in the connector's order: layer by layer, chunk by chunk.
 * Loads copy tier -> pages, saves pages -> tier; T threads each copy every T-th chunk of each
 * layer, as the path splits them. Each is copied twice per round, with memcpy and
 * with non-temporal stores (the path uses both kinds), and the faster is that round's reference.
 * Beside it, the same bytes copied with non-temporal stores in the 32 KiB runs the path moves (one
 * block of K or V), the pages side's blocks in a random order of their own: the cost of the layout
 * without the checksum or the connector (`ratio_to_same_runs`).
 * Rounds interleave the references, load and save so drift hits all of them alike. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_common.h"
#include "common/copy.h"
#include "connector/handle.h"
#include "connector/keys.h"
#include "connector/object.h"
#include "connector/object_mac.h"
#include "connector/tiers.h"

#define N_HEADS          8u
#define HEAD_DIM         128u
#define ELEMENT_BYTES    2u /* fp16 */
#define BLOCK_TOKENS     16u
#define CHUNK_TOKENS     256u
#define TAIL_TOKENS      16u /* the load request's last block: computed by the engine, never loaded */
#define HEAD_BYTES       (HEAD_DIM * ELEMENT_BYTES)
#define TOKEN_BYTES      ((uint64_t)N_HEADS * HEAD_BYTES)
#define BLOCK_BYTES      ((uint64_t)BLOCK_TOKENS * TOKEN_BYTES)
#define PIECE_BYTES      (2 * (uint64_t)CHUNK_TOKENS * TOKEN_BYTES) /* K+V of one layer of one chunk */
#define BLOCKS_PER_CHUNK (CHUNK_TOKENS / BLOCK_TOKENS)
#define VOCAB            128256u
#define PATTERN_SEED     0x6b7673747261ull

typedef struct options {
    uint64_t chunks;
    uint32_t layers;
    uint32_t iters;
    uint32_t warmup;
    uint32_t threads;
    int keyed; /* --integrity keyed: the tier checks tags on every load (integrity: keyed) */
} options;

typedef struct bench {
    const kvs_api *api;
    kvs_handle *h;
    options opt;
    uint32_t n_blocks;           /* blocks per layer: the chunks' blocks plus the tail block */
    uint64_t layer_tensor_bytes; /* one layer's [2, blocks, 16, 8, 128] tensor */
    uint8_t *pages;              /* every layer's tensor, one after the other */
    uint64_t pages_bytes;
    uint32_t *block_table; /* n_blocks entries */
    int32_t *tokens;       /* chunks * 256 + TAIL_TOKENS */
    kvs_key *keys;         /* keys of the request's chunks */
    uint8_t *meta;
    uint64_t meta_cap;
    uint64_t payload_bytes; /* chunks * layers * 1 MiB: what one step moves */
} bench;

typedef struct step_time {
    uint64_t sched_ns;
    uint64_t worker_ns;
} step_time;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--chunks N] [--layers L] [--iters R] [--warmup W] [--threads T]\n"
            "          [--integrity checksum|keyed]\n"
            "  --chunks  chunks restored/saved per step (default 64)\n"
            "  --layers  model layers (default 8); one layer of one chunk is 1 MiB\n"
            "  --iters   measured rounds, median reported (default 10)\n"
            "  --warmup  unmeasured rounds first (default 2)\n"
            "  --threads threads moving the copies: device.host_threads, and the reference's\n"
            "            (default 1)\n"
            "  --integrity checksum|keyed  the tier's integrity (default checksum); keyed seals\n"
            "            every save with Poly1305 tags and checks them on every load\n",
            prog);
}

static options parse_options(int argc, char **argv) {
    options o = {.chunks = 64, .layers = 8, .iters = 10, .warmup = 2, .threads = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--chunks") == 0)
            o.chunks = bench_parse_u64(a, v, 1, 1u << 16);
        else if (strcmp(a, "--layers") == 0)
            o.layers = (uint32_t)bench_parse_u64(a, v, 1, 1024);
        else if (strcmp(a, "--iters") == 0)
            o.iters = (uint32_t)bench_parse_u64(a, v, 1, 100000);
        else if (strcmp(a, "--warmup") == 0)
            o.warmup = (uint32_t)bench_parse_u64(a, v, 0, 100000);
        else if (strcmp(a, "--threads") == 0)
            o.threads = (uint32_t)bench_parse_u64(a, v, 1, 64);
        else if (strcmp(a, "--integrity") == 0 && v &&
                 (strcmp(v, "keyed") == 0 || strcmp(v, "checksum") == 0))
            o.keyed = strcmp(v, "keyed") == 0;
        else {
            usage(argv[0]);
            exit(strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 ? 0 : 2);
        }
        i++;
    }
    return o;
}

/* --- the engine's pages ------------------------------------------------------------------------- */

static uint64_t pattern_word(uint64_t word_index) {
    return bench_mix64(PATTERN_SEED ^ word_index);
}

static void fill_pages(bench *b) {
    uint64_t *w = (uint64_t *)b->pages;
    for (uint64_t i = 0; i < b->pages_bytes / 8; i++) w[i] = pattern_word(i);
}

/* Byte offset in `pages` of K (kv 0) or V (kv 1) of block `block` of layer `layer`. */
static uint64_t block_offset(const bench *b, uint32_t layer, uint32_t kv, uint32_t block) {
    return layer * b->layer_tensor_bytes + (uint64_t)kv * b->n_blocks * BLOCK_BYTES +
           block * BLOCK_BYTES;
}

/* Every block the chunks occupy: 0 everywhere (clear) or equal to the fill pattern (check). */
static void clear_chunk_blocks(bench *b) {
    for (uint32_t l = 0; l < b->opt.layers; l++)
        for (uint64_t i = 0; i < b->opt.chunks * BLOCKS_PER_CHUNK; i++)
            for (uint32_t kv = 0; kv < 2; kv++)
                memset(b->pages + block_offset(b, l, kv, b->block_table[i]), 0, BLOCK_BYTES);
}

static uint64_t count_wrong_words(const bench *b) {
    uint64_t wrong = 0;
    for (uint32_t l = 0; l < b->opt.layers; l++)
        for (uint64_t i = 0; i < b->opt.chunks * BLOCKS_PER_CHUNK; i++)
            for (uint32_t kv = 0; kv < 2; kv++) {
                uint64_t off = block_offset(b, l, kv, b->block_table[i]);
                const uint64_t *w = (const uint64_t *)(b->pages + off);
                for (uint64_t j = 0; j < BLOCK_BYTES / 8; j++)
                    wrong += w[j] != pattern_word(off / 8 + j);
            }
    return wrong;
}

/* --- one step of each kind ------------------------------------------------------------------------- */

static void build_meta(bench *b, const kvs_step_request *s, uint64_t *len) {
    kvs_status st = b->api->build_meta(b->h, s, 1, b->meta, b->meta_cap, len);
    if (st == KVS_EOVERFLOW) { /* only ever on the first step: the buffer then stays large enough */
        free(b->meta);
        b->meta_cap = *len;
        if (!(b->meta = malloc(b->meta_cap))) {
            fprintf(stderr, "out of memory for %llu bytes of metadata\n", (unsigned long long)*len);
            exit(1);
        }
        st = b->api->build_meta(b->h, s, 1, b->meta, b->meta_cap, len);
    }
    if (st != KVS_OK) bench_fail(b->api, b->h, "build_meta", st);
}

static kvs_stats get_stats(const bench *b) {
    kvs_stats s = {.struct_size = sizeof s};
    BENCH_CHECK(b->api, b->h, b->api->stats(b->h, &s));
    return s;
}

/* A step that did less than all of its work would make its figure a lie: stop instead. */
static void expect_delta(const char *what, uint64_t before, uint64_t after, uint64_t want) {
    if (after - before != want) {
        fprintf(stderr, "%s: expected %llu, got %llu\n", what, (unsigned long long)want,
                (unsigned long long)(after - before));
        exit(1);
    }
}

static step_time load_step(bench *b) {
    const kvs_api *api = b->api;
    kvs_handle *h = b->h;
    uint64_t hit = b->opt.chunks * CHUNK_TOKENS, n_tokens = hit + TAIL_TOKENS, len = 0;
    kvs_lookup_result res = {.struct_size = sizeof res};
    kvs_stats before = get_stats(b);

    uint64_t t0 = bench_now_ns();
    BENCH_CHECK(api, h, api->lookup(h, "load", b->tokens, n_tokens, 0, &res));
    if (res.n_hit_tokens != hit) {
        fprintf(stderr, "lookup offered %llu tokens, expected %llu\n",
                (unsigned long long)res.n_hit_tokens, (unsigned long long)hit);
        exit(1);
    }
    BENCH_CHECK(api, h, api->on_alloc(h, "load", b->block_table, b->n_blocks, hit));
    kvs_step_request s = {"load",      b->tokens, n_tokens,   b->block_table,
                          b->n_blocks, hit,       TAIL_TOKENS};
    build_meta(b, &s, &len);
    uint64_t t1 = bench_now_ns();
    BENCH_CHECK(api, h, api->bind_meta(h, b->meta, len));
    BENCH_CHECK(api, h, api->start_load(h));
    for (uint32_t l = 0; l < b->opt.layers; l++) BENCH_CHECK(api, h, api->wait_layer_load(h, l));
    BENCH_CHECK(api, h, api->wait_save(h));
    uint64_t t2 = bench_now_ns();

    int keep = 0;
    BENCH_CHECK(api, h, api->request_finished(h, "load", &keep));
    kvs_stats after = get_stats(b);
    expect_delta("chunks loaded in a load step", before.chunks_loaded, after.chunks_loaded,
                 b->opt.chunks);
    expect_delta("load errors in a load step", before.load_errors, after.load_errors, 0);
    expect_delta("payload bytes loaded in a load step", before.bytes_loaded, after.bytes_loaded,
                 b->payload_bytes);
    return (step_time){t1 - t0, t2 - t1};
}

static step_time save_step(bench *b) {
    const kvs_api *api = b->api;
    kvs_handle *h = b->h;
    uint64_t n_tokens = b->opt.chunks * CHUNK_TOKENS, len = 0;
    kvs_lookup_result res = {.struct_size = sizeof res};
    /* Untimed: the tier must not hold the chunks, or the save is (rightly) skipped. */
    for (uint64_t c = 0; c < b->opt.chunks; c++) kvs_tiers_remove(h->tiers, &b->keys[c]);
    kvs_stats before = get_stats(b);

    uint64_t t0 = bench_now_ns();
    BENCH_CHECK(api, h, api->lookup(h, "save", b->tokens, n_tokens, 0, &res));
    if (res.n_hit_tokens != 0) {
        fprintf(stderr, "lookup before a save offered %llu tokens, expected 0\n",
                (unsigned long long)res.n_hit_tokens);
        exit(1);
    }
    kvs_step_request s = {
        "save", b->tokens, n_tokens, b->block_table, b->opt.chunks * BLOCKS_PER_CHUNK, 0, n_tokens};
    build_meta(b, &s, &len);
    uint64_t t1 = bench_now_ns();
    BENCH_CHECK(api, h, api->bind_meta(h, b->meta, len));
    for (uint32_t l = 0; l < b->opt.layers; l++) BENCH_CHECK(api, h, api->save_layer(h, l));
    BENCH_CHECK(api, h, api->wait_save(h));
    uint64_t t2 = bench_now_ns();

    int keep = 0;
    BENCH_CHECK(api, h, api->request_finished(h, "save", &keep));
    kvs_stats after = get_stats(b);
    expect_delta("chunks saved in a save step", before.chunks_saved, after.chunks_saved,
                 b->opt.chunks);
    expect_delta("saves skipped in a save step", before.saves_skipped, after.saves_skipped, 0);
    return (step_time){t1 - t0, t2 - t1};
}

/* --- the reference ---------------------------------------------------------------------------------- */

static volatile uint8_t sink;

/* One reference copy of a step's bytes between the pages side (layer-major) and the tier side
 * (chunk-major), by opt.threads threads, thread i copying chunks i, i + T, ... of every layer. */
typedef struct copy_job {
    const bench *b;
    uint8_t *pages, *tier;
    int to_pages, streaming;
    const uint32_t *runs; /* NULL: 1 MiB pieces; else the pages side's block order (same runs) */
    uint32_t first;
} copy_job;

static void copy_piece(const copy_job *j, uint8_t *p, uint8_t *t, uint64_t n) {
    uint8_t *dst = j->to_pages ? p : t;
    const uint8_t *src = j->to_pages ? t : p;
    if (j->streaming)
        kvs_copy_streaming(dst, src, n);
    else
        memcpy(dst, src, n);
}

static void *copy_part(void *arg) {
    const copy_job *j = arg;
    uint64_t chunks = j->b->opt.chunks, layers = j->b->opt.layers;
    uint64_t blocks = chunks * BLOCKS_PER_CHUNK; /* of one part (K or V) of one layer */
    for (uint64_t l = 0; l < layers; l++)
        for (uint64_t c = j->first; c < chunks; c += j->b->opt.threads) {
            uint8_t *t = j->tier + (c * layers + l) * PIECE_BYTES;
            if (!j->runs)
                copy_piece(j, j->pages + (l * chunks + c) * PIECE_BYTES, t, PIECE_BYTES);
            else /* the piece's 32 KiB runs, K then V, from blocks in the engine's order */
                for (uint64_t kv = 0; kv < 2; kv++)
                    for (uint64_t i = 0; i < BLOCKS_PER_CHUNK; i++, t += BLOCK_BYTES) {
                        uint64_t block = j->runs[c * BLOCKS_PER_CHUNK + i];
                        copy_piece(j, j->pages + ((l * 2 + kv) * blocks + block) * BLOCK_BYTES, t,
                                   BLOCK_BYTES);
                    }
            if (j->streaming) kvs_copy_fence();
        }
    return NULL;
}

static uint64_t copy_round(const bench *b, uint8_t *pages, uint8_t *tier, int to_pages,
                           int streaming, const uint32_t *runs) {
    uint32_t T = b->opt.threads;
    copy_job jobs[64];
    pthread_t threads[64];
    jobs[0] = (copy_job){b, pages, tier, to_pages, streaming, runs, 0}; /* T >= 1 (parse_options) */
    for (uint32_t i = 1; i < T; i++)
        jobs[i] = (copy_job){b, pages, tier, to_pages, streaming, runs, i};
    uint64_t t0 = bench_now_ns();
    for (uint32_t i = 1; i < T; i++)
        if (pthread_create(&threads[i], NULL, copy_part, &jobs[i]) != 0) {
            fprintf(stderr, "cannot start the reference's copy threads\n");
            exit(1);
        }
    copy_part(&jobs[0]);
    for (uint32_t i = 1; i < T; i++) pthread_join(threads[i], NULL);
    __asm__ __volatile__("" ::: "memory");
    uint64_t t1 = bench_now_ns();
    uint64_t last = (b->opt.chunks * b->opt.layers - 1) * PIECE_BYTES;
    sink = (uint8_t)(sink ^ (to_pages ? pages : tier)[last]);
    return t1 - t0;
}

/* --- setup and report -------------------------------------------------------------------------------- */

static void open_handle(bench *b) {
    b->api = kvs_get_api(KVS_ABI_MAJOR);
    if (!b->api) {
        fprintf(stderr, "kvs_get_api(%d) returned NULL\n", KVS_ABI_MAJOR);
        exit(1);
    }
    kvs_model_desc model = {.struct_size = sizeof model,
                            .model_id = "kvs-bench/dram-8x128",
                            .dtype = KVS_DTYPE_FP16,
                            .n_layers = b->opt.layers,
                            .n_kv_heads = N_HEADS,
                            .head_dim = HEAD_DIM,
                            .block_tokens = BLOCK_TOKENS,
                            .tp_size = 1,
                            .vocab_size = VOCAB};
    /* The tier holds exactly the request's chunks and the staging pool one slab per saved chunk, so
     * nothing is evicted or skipped for lack of room. */
    uint64_t layer_bytes = 2 * (uint64_t)CHUNK_TOKENS * TOKEN_BYTES;
    uint64_t slab = (kvs_object_bytes(b->opt.layers, layer_bytes) + 4095) / 4096 * 4096;
    char yaml[2048], path[512], key[512] = "", keyed[1024] = "", err[KVS_ERROR_MAX];
    if (b->opt.keyed) { /* mkstemps makes it mode 0600, as a key file must be */
        bench_write_temp("kvs-bench-dram integrity key, 32 bytes or more\n", key, sizeof key);
        snprintf(keyed, sizeof keyed, "    integrity: keyed\n    integrity_key_file: %s\n", key);
    }
    snprintf(yaml, sizeof yaml,
             "version: 1\n"
             "chunk_tokens: %u\n"
             "lease_timeout_ms: 600000\n"
             "log_level: warn\n"
             "device:\n"
             "  host_threads: %u\n"
             "pool:\n"
             "  staging_bytes: %llu\n"
             "tiers:\n"
             "  - name: dram\n"
             "    type: dram\n"
             "    capacity: %llu\n%s",
             CHUNK_TOKENS, b->opt.threads, (unsigned long long)(slab * b->opt.chunks),
             (unsigned long long)(slab * b->opt.chunks), keyed);
    bench_write_temp(yaml, path, sizeof path);
    kvs_open_params params = {
        .struct_size = sizeof params, .role = KVS_ROLE_BOTH, .config_path = path, .model = &model};
    kvs_status st = b->api->open(&params, &b->h, err, sizeof err);
    remove(path);
    if (key[0]) remove(key);
    if (st != KVS_OK) {
        fprintf(stderr, "open failed: %s: %s\n", b->api->strerror(st), err);
        exit(1);
    }
}

static void register_pages(bench *b) {
    b->n_blocks = (uint32_t)(b->opt.chunks * BLOCKS_PER_CHUNK + 1);
    b->layer_tensor_bytes = 2 * (uint64_t)b->n_blocks * BLOCK_BYTES;
    b->pages_bytes = b->layer_tensor_bytes * b->opt.layers;
    b->pages = bench_map(b->pages_bytes, 0, 0x5a, "the engine pages");
    fill_pages(b);
    kvs_layer_view *views = calloc(b->opt.layers, sizeof *views);
    b->block_table = malloc(b->n_blocks * sizeof *b->block_table);
    if (!views || !b->block_table) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (uint32_t l = 0; l < b->opt.layers; l++) {
        uint8_t *base = b->pages + l * b->layer_tensor_bytes;
        views[l] = (kvs_layer_view){.struct_size = sizeof views[l],
                                    .device_kind = KVS_DEVICE_HOST,
                                    .n_blocks = b->n_blocks,
                                    .k_base = base,
                                    .v_base = base + (uint64_t)b->n_blocks * BLOCK_BYTES,
                                    .block_stride = (int64_t)BLOCK_BYTES,
                                    .token_stride = (int64_t)TOKEN_BYTES,
                                    .head_stride = (int64_t)HEAD_BYTES};
    }
    BENCH_CHECK(b->api, b->h, b->api->register_kv(b->h, views, b->opt.layers));
    free(views);
    /* Fisher-Yates with a fixed seed: scattered blocks, the same in every run. */
    for (uint32_t i = 0; i < b->n_blocks; i++) b->block_table[i] = i;
    for (uint32_t i = b->n_blocks - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(bench_mix64(0xb10c ^ i) % (i + 1));
        uint32_t t = b->block_table[i];
        b->block_table[i] = b->block_table[j];
        b->block_table[j] = t;
    }
}

static void make_request(bench *b) {
    uint64_t n = b->opt.chunks * CHUNK_TOKENS + TAIL_TOKENS;
    b->tokens = malloc(n * sizeof *b->tokens);
    b->keys = malloc(b->opt.chunks * sizeof *b->keys);
    b->meta_cap = 1 << 20;
    b->meta = malloc(b->meta_cap);
    if (!b->tokens || !b->keys || !b->meta) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (uint64_t i = 0; i < n; i++) b->tokens[i] = (int32_t)(bench_mix64(0x70c ^ i) % VOCAB);
    kvs_keys_chain(&b->h->fingerprint, b->tokens, b->opt.chunks, CHUNK_TOKENS, b->keys);
}

/* The reference of one direction: per round the faster of memcpy and the streaming copy; beside it
 * the streaming copy of the same 32 KiB runs the path moves (pages side scattered as the engine's
 * blocks are), without a checksum. */
typedef struct reference {
    double *best, *memcpy_ns, *stream_ns, *runs_ns;
} reference;

static void report_path(const bench *b, const char *name, const char *what, double ns,
                        const reference *r) {
    uint32_t n = b->opt.iters;
    double ref_ns = bench_median(r->best, n), bytes = (double)b->payload_bytes;
    double gbps = bytes / ns, ref_gbps = bytes / ref_ns;
    double memcpy_gbps = bytes / bench_median(r->memcpy_ns, n);
    double stream_gbps = bytes / bench_median(r->stream_ns, n);
    double runs_gbps = bytes / bench_median(r->runs_ns, n);
    printf("{\"bench\":\"%s\",\"ratio\":%.3f,\"reference\":\"the faster of memcpy and a "
           "non-temporal copy, per round\",\"threads\":%u,\"gbps\":%.3f,\"reference_gbps\":%.3f,"
           "\"memcpy_gbps\":%.3f,\"streaming_copy_gbps\":%.3f,\"same_runs_gbps\":%.3f,"
           "\"ratio_to_same_runs\":%.3f,\"ns\":%.0f,\"reference_ns\":%.0f,"
           "\"bytes\":%llu,\"piece_bytes\":%llu,\"run_bytes\":%llu,\"chunks\":%llu,"
           "\"layers\":%u,\"iterations\":%u,\"warmup\":%u,\"integrity\":\"%s\"}\n",
           name, gbps / ref_gbps, b->opt.threads, gbps, ref_gbps, memcpy_gbps, stream_gbps,
           runs_gbps, gbps / runs_gbps, ns, ref_ns, (unsigned long long)b->payload_bytes,
           (unsigned long long)PIECE_BYTES, (unsigned long long)BLOCK_BYTES,
           (unsigned long long)b->opt.chunks, b->opt.layers, b->opt.iters, b->opt.warmup,
           b->opt.keyed ? "keyed" : "checksum");
    printf("%s: %.2f GB/s, reference %.2f GB/s (memcpy %.2f, non-temporal copy %.2f), ratio %.3f "
           "(%u thread%s each; %llu chunks x %u layers x 1 MiB, median of %u); the same 32 KiB "
           "runs copied without a checksum %.2f GB/s, ratio %.3f\n",
           what, gbps, ref_gbps, memcpy_gbps, stream_gbps, gbps / ref_gbps, b->opt.threads,
           b->opt.threads == 1 ? "" : "s", (unsigned long long)b->opt.chunks, b->opt.layers,
           b->opt.iters, runs_gbps, gbps / runs_gbps);
}

static void report_sched(const bench *b, const char *name, const char *hooks, double ns,
                         double ref_ns) {
    printf(
        "{\"bench\":\"%s\",\"ratio\":%.5f,\"reference\":\"memcpy of the step's "
        "payload\",\"ns\":%.0f,"
        "\"ns_per_chunk\":%.1f,\"reference_ns\":%.0f,\"bytes\":%llu,\"chunks\":%llu,\"layers\":%u,"
        "\"iterations\":%u,\"warmup\":%u,\"hooks\":\"%s\"}\n",
        name, ns / ref_ns, ns, ns / (double)b->opt.chunks, ref_ns,
        (unsigned long long)b->payload_bytes, (unsigned long long)b->opt.chunks, b->opt.layers,
        b->opt.iters, b->opt.warmup, hooks);
    printf("%s: %.1f us per step (%.0f ns per chunk), %.4f of the memcpy time of its payload\n",
           name, ns / 1e3, ns / (double)b->opt.chunks, ns / ref_ns);
}

/* --integrity keyed: the tags alone, what bounds a keyed path on one core: sealing one object of
 * the step's geometry apart from any copy (an NHPoly1305 pass over every layer, what the copies of
 * a keyed path compute as they move the bytes), against memcpy of the same bytes. */
static void report_mac(const bench *b) {
    uint64_t layer = PIECE_BYTES, bytes = kvs_object_bytes(b->opt.layers, layer);
    uint8_t *obj = bench_map(bytes, 1, 0x33, "the tag benchmark's object");
    uint8_t *copy = bench_map(bytes, 1, 0x44, "its copy");
    kvs_key fp = {{1}}, key = {{2}};
    kvs_object_init(obj, &fp, &key, b->opt.layers, CHUNK_TOKENS, layer);
    kvs_object_mac *m = NULL;
    static const uint8_t k[32] = "kvs-bench-dram tag benchmark key";
    char err[256];
    if (kvs_object_mac_open(k, sizeof k, &m, err, sizeof err) != KVS_OK) {
        fprintf(stderr, "integrity: %s\n", err);
        exit(1);
    }
    uint32_t n = b->opt.iters;
    double *mac = calloc(2 * (size_t)n, sizeof *mac), *cp = mac + n;
    for (uint32_t i = 0; mac && i < b->opt.warmup + n; i++) {
        uint64_t t0 = bench_now_ns();
        if (kvs_object_seal_keyed(m, obj) != KVS_OK) exit(1);
        uint64_t t1 = bench_now_ns();
        memcpy(copy, obj, bytes);
        uint64_t t2 = bench_now_ns();
        if (i >= b->opt.warmup) {
            mac[i - b->opt.warmup] = (double)(t1 - t0);
            cp[i - b->opt.warmup] = (double)(t2 - t1);
        }
    }
    double payload = (double)b->opt.layers * (double)layer;
    double mac_gbps = payload / bench_median(mac, n), cp_gbps = (double)bytes / bench_median(cp, n);
    printf("{\"bench\":\"dram_tags\",\"ratio\":%.3f,\"reference\":\"memcpy of the same "
           "object, one thread\",\"gbps\":%.3f,\"reference_gbps\":%.3f,\"bytes\":%llu,"
           "\"iterations\":%u}\n",
           mac_gbps / cp_gbps, mac_gbps, cp_gbps, (unsigned long long)bytes, n);
    printf("dram tags: sealing a keyed object (NHPoly1305 over %u x 1 MiB) %.2f GB/s, memcpy %.2f "
           "GB/s, ratio %.3f (one thread)\n",
           b->opt.layers, mac_gbps, cp_gbps, mac_gbps / cp_gbps);
    free(mac);
    kvs_object_mac_close(m);
    munmap(obj, bytes);
    munmap(copy, bytes);
}

int main(int argc, char **argv) {
    bench b = {.opt = parse_options(argc, argv)};
    b.payload_bytes = b.opt.chunks * b.opt.layers * PIECE_BYTES;
    open_handle(&b);
    register_pages(&b);
    make_request(&b);

    /* Correctness once: what a save gathered, a load puts back byte for byte. */
    save_step(&b);
    clear_chunk_blocks(&b);
    load_step(&b);
    uint64_t wrong = count_wrong_words(&b);
    if (wrong) {
        fprintf(stderr, "restored pages differ from the saved pages in %llu of %llu words\n",
                (unsigned long long)wrong, (unsigned long long)(b.payload_bytes / 8));
        return 1;
    }

    uint8_t *tier = bench_map(b.payload_bytes, 1, 0x5a, "the reference's tier side");
    uint8_t *pages = bench_map(b.payload_bytes, 0, 0x5a, "the reference's pages side");
    uint32_t n = b.opt.iters;
    double *all = calloc((size_t)n * 12, sizeof *all);
    /* the reference's own scattered order of the pages side's blocks (fixed seed) */
    uint64_t n_runs = b.opt.chunks * BLOCKS_PER_CHUNK;
    uint32_t *runs = malloc(n_runs * sizeof *runs);
    if (!all || !runs) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (uint64_t i = 0; i < n_runs; i++) runs[i] = (uint32_t)i;
    for (uint64_t i = n_runs - 1; i > 0; i--) {
        uint64_t j = bench_mix64(0x5ca7 ^ i) % (i + 1);
        uint32_t t = runs[i];
        runs[i] = runs[j];
        runs[j] = t;
    }
    reference ref_load = {all, all + n, all + 2 * (size_t)n, all + 10 * (size_t)n};
    reference ref_save = {all + 3 * (size_t)n, all + 4 * (size_t)n, all + 5 * (size_t)n,
                          all + 11 * (size_t)n};
    double *load = all + 6 * (size_t)n, *save = all + 7 * (size_t)n;
    double *load_sched = all + 8 * (size_t)n, *save_sched = all + 9 * (size_t)n;
    for (uint32_t i = 0; i < b.opt.warmup + n; i++) {
        uint64_t lm = copy_round(&b, pages, tier, 1, 0, NULL);
        uint64_t ls = copy_round(&b, pages, tier, 1, 1, NULL);
        uint64_t lr = copy_round(&b, pages, tier, 1, 1, runs);
        step_time ld = load_step(&b);
        uint64_t sm = copy_round(&b, pages, tier, 0, 0, NULL);
        uint64_t ss = copy_round(&b, pages, tier, 0, 1, NULL);
        uint64_t sr = copy_round(&b, pages, tier, 0, 1, runs);
        step_time sv = save_step(&b);
        if (i < b.opt.warmup) continue;
        uint32_t k = i - b.opt.warmup;
        ref_load.runs_ns[k] = (double)lr;
        ref_save.runs_ns[k] = (double)sr;
        ref_load.memcpy_ns[k] = (double)lm;
        ref_load.stream_ns[k] = (double)ls;
        ref_load.best[k] = (double)(lm < ls ? lm : ls);
        ref_save.memcpy_ns[k] = (double)sm;
        ref_save.stream_ns[k] = (double)ss;
        ref_save.best[k] = (double)(sm < ss ? sm : ss);
        load[k] = (double)ld.worker_ns;
        load_sched[k] = (double)ld.sched_ns;
        save[k] = (double)sv.worker_ns;
        save_sched[k] = (double)sv.sched_ns;
    }
    double ref_ns = bench_median(ref_load.memcpy_ns, n);
    printf("{\"bench\":\"dram_correctness\",\"ratio\":1.000,\"reference\":\"saved "
           "bytes\",\"bytes\":%llu,"
           "\"wrong_words\":0,\"iterations\":1}\n",
           (unsigned long long)b.payload_bytes);
    printf("dram correctness: %llu bytes saved, cleared and restored, all equal\n",
           (unsigned long long)b.payload_bytes);
    report_path(&b, "dram_load", "dram load", bench_median(load, n), &ref_load);
    report_path(&b, "dram_save", "dram save", bench_median(save, n), &ref_save);
    report_sched(&b, "dram_load_scheduler", "lookup+on_alloc+build_meta",
                 bench_median(load_sched, n), ref_ns);
    report_sched(&b, "dram_save_scheduler", "lookup+build_meta", bench_median(save_sched, n),
                 ref_ns);
    if (b.opt.keyed) report_mac(&b);

    b.api->close(b.h);
    munmap(tier, b.payload_bytes);
    munmap(pages, b.payload_bytes);
    munmap(b.pages, b.pages_bytes);
    free(all);
    free(runs);
    free(b.block_table);
    free(b.tokens);
    free(b.keys);
    free(b.meta);
    return 0;
}
