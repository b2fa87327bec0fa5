/* bench_codec.c - kvs-bench-codec: the lossy codecs' throughput on the CPU (kernels/cpu/codec.h),
 * against memcpy of the same bytes measured in the same run.
 *
 * Data: one step's KV of a Llama-8B-like layer shape (8 KV heads of 128 fp16 channels), 256-token
 * chunks, `--layers` layers, Gaussian values with a few outlier channels, in buffers mapped like the
 * connector's pool. Per codec, per round:
 *   encode: raw rows -> encoded layers (what a compress tier does on a put);
 *   decode: encoded layers -> the engine's pages (NHD, blocks of 16 tokens, scattered block ids):
 *           the fused dequantise-scatter a load runs.
 * Both are reported as GB/s of raw KV bytes (what the engine holds), with the reference: memcpy of
 * the raw bytes between two buffers of the same size (one thread). Output: one JSON line per codec
 * and direction, then a line of text. */
#include <math.h>

#include "bench/bench_common.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/dtype.h"

#define HEADS   8
#define DIM     128
#define TOKENS  256
#define BLOCK_T 16

static double seconds(uint64_t ns) {
    return (double)ns / 1e9;
}

int main(int argc, char **argv) {
    uint64_t rounds = 5, layers = 64;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = bench_parse_u64("--rounds", argv[++i], 1, 1000);
        else if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc)
            layers = bench_parse_u64("--layers", argv[++i], 1, 4096);
        else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(
                help ? stdout : stderr,
                "usage: kvs-bench-codec [--rounds N (5)] [--layers N (64)]\n"
                "  the lossy codecs' encode and decode-into-pages throughput on the CPU, against\n"
                "  memcpy of the same bytes (docs/benchmarks.md)\n");
            return help ? 0 : 2;
        }
    }
    const uint32_t dtype = KVS_DTYPE_FP16;
    kvs_kv_shape shape = {
        .n_heads = HEADS, .head_bytes = DIM * 2, .block_tokens = BLOCK_T, .has_v = 1};
    uint64_t layer_raw = kvs_kernel_layer_bytes(&shape, TOKENS), raw = layer_raw * layers;
    uint8_t *rows = bench_map(raw, 1, 0, "raw rows");
    uint8_t *copy = bench_map(raw, 1, 0, "memcpy destination");
    uint8_t *pages = bench_map(raw, 1, 0, "pages");
    uint64_t state = 42;
    for (uint64_t i = 0; i < raw / 2; i++) {
        state = bench_mix64(state);
        double u = ((double)(state >> 11) + 0.5) * 0x1p-53, v = (double)(state & 0xffff) / 65536.0;
        double g = sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
        kvs_dtype_store(dtype, rows, i, (float)(i % DIM == 3 ? 8.0 + 4.0 * g : g));
    }
    /* the pages of one chunk per layer: 16 blocks in a scattered order */
    uint32_t blocks[TOKENS / BLOCK_T];
    for (uint32_t b = 0; b < TOKENS / BLOCK_T; b++) blocks[b] = (b * 7u) % (TOKENS / BLOCK_T);
    /* drop50: token dropping keeping half of each chunk, its kept tokens chosen in every layer here
     * (an object chooses them once, from its middle layer: this is the dearer case) */
    const kvs_codec codecs[] = {{KVS_CODEC_KIVI, 2, 32, 32},
                                {KVS_CODEC_KIVI, 4, 32, 32},
                                {KVS_CODEC_INT8, 8, 0, 0},
                                {KVS_CODEC_DROP, 0, TOKENS / 2, 0}};
    const char *names[] = {"kivi2", "kivi4", "int8", "drop50"};
    double *t_enc = calloc(rounds, sizeof *t_enc), *t_dec = calloc(rounds, sizeof *t_dec),
           *t_ref = calloc(rounds, sizeof *t_ref);
    for (size_t ci = 0; ci < sizeof codecs / sizeof codecs[0]; ci++) {
        const kvs_codec *c = &codecs[ci];
        char err[128];
        if (kvs_codec_check(c, &shape, dtype, err, sizeof err) != KVS_OK) {
            fprintf(stderr, "kvs-bench-codec: %s\n", err);
            return 1;
        }
        uint64_t enc_layer = kvs_codec_layer_bytes(c, &shape, dtype, TOKENS);
        uint8_t *enc = bench_map(enc_layer * layers, 1, 0, "encoded layers");
        for (uint64_t r = 0; r <= rounds; r++) { /* round 0 warms up */
            uint64_t t0 = bench_now_ns();
            for (uint64_t l = 0; l < layers; l++) {
                const uint8_t *k = rows + l * layer_raw;
                if (kvs_codec_encode_layer(c, &shape, dtype, TOKENS, k, k + layer_raw / 2,
                                           enc + l * enc_layer) != KVS_OK) {
                    fprintf(stderr, "kvs-bench-codec: %s refused the data\n", names[ci]);
                    return 1;
                }
            }
            uint64_t t1 = bench_now_ns();
            for (uint64_t l = 0; l < layers; l++) {
                uint8_t *base = pages + l * layer_raw;
                kvs_layer_view view = {.struct_size = sizeof view,
                                       .n_blocks = TOKENS / BLOCK_T,
                                       .k_base = base,
                                       .v_base = base + layer_raw / 2,
                                       .block_stride = (int64_t)BLOCK_T * HEADS * DIM * 2,
                                       .token_stride = HEADS * DIM * 2,
                                       .head_stride = DIM * 2};
                kvs_token_span span = {
                    .block_ids = blocks, .n_block_ids = TOKENS / BLOCK_T, .n_tokens = TOKENS};
                if (kvs_codec_scatter_layer(c, &view, &shape, dtype, &span, enc + l * enc_layer) !=
                    KVS_OK) {
                    fprintf(stderr, "kvs-bench-codec: out of memory decoding\n");
                    return 1;
                }
            }
            uint64_t t2 = bench_now_ns();
            if (c->kind == KVS_CODEC_DROP) { /* its work: the kept bytes copied, the rest zeroed */
                uint64_t kept = raw / 2;
                memcpy(copy, rows, kept);
                memset(copy + kept, 0, raw - kept);
            } else {
                memcpy(copy, rows, raw);
            }
            uint64_t t3 = bench_now_ns();
            if (r == 0) continue;
            t_enc[r - 1] = (double)raw / seconds(t1 - t0) / 1e9;
            t_dec[r - 1] = (double)raw / seconds(t2 - t1) / 1e9;
            t_ref[r - 1] = (double)raw / seconds(t3 - t2) / 1e9;
        }
        double enc_gbps = bench_median(t_enc, rounds), dec_gbps = bench_median(t_dec, rounds),
               ref_gbps = bench_median(t_ref, rounds);
        double rate = (double)enc_layer / (double)layer_raw;
        for (int dir = 0; dir < 2; dir++) {
            double g = dir ? dec_gbps : enc_gbps;
            printf("{\"bench\":\"codec_%s\",\"codec\":\"%s\",\"rate\":%.4f,\"raw_bytes\":%llu,"
                   "\"gbps\":%.3f,\"reference\":\"%s, one thread\","
                   "\"reference_gbps\":%.3f,\"ratio\":%.4f,\"threads\":1,\"rounds\":%llu}\n",
                   dir ? "decode_scatter" : "encode", names[ci], rate, (unsigned long long)raw, g,
                   c->kind == KVS_CODEC_DROP
                       ? "memcpy of the kept half of the raw bytes and memset of the rest"
                       : "memcpy of the raw bytes",
                   ref_gbps, g / ref_gbps, (unsigned long long)rounds);
        }
        printf("%-6s (rate %.4f): encode %.3f GB/s, decode into pages %.3f GB/s of raw KV; %s "
               "%.3f GB/s -> ratios %.3f / %.3f\n",
               names[ci], rate, enc_gbps, dec_gbps,
               c->kind == KVS_CODEC_DROP ? "memcpy half + memset half" : "memcpy", ref_gbps,
               enc_gbps / ref_gbps, dec_gbps / ref_gbps);
        munmap(enc, enc_layer * layers);
    }
    free(t_enc), free(t_dec), free(t_ref);
    return 0;
}
