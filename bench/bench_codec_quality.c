/* bench_codec_quality.c - kvs-bench-codec-quality: what each lossy codec does to the trained mini
 * model's predictions, the quality curve docs/compress.md's placement maps errors through.
 *
 * For each of --prompts prompts (slices of the held-out text sample): the model prefills the first
 * --context bytes into fp16 pages, then the last --query bytes are computed over that context as one
 * step, once over the exact pages and once after every layer of the context went through a codec
 * and back into the pages (gather, encode, decode-scatter: the connector's path for a lossy load).
 * Reported per codec: its rate, the relative reconstruction error of K and V (||x - x'|| / ||x||
 * over the context; `log_error_sd`: the standard deviation over prompts of the log of their mean K
 * and V error, how much one prompt compresses better than another), and over the query positions
 * the mean KL divergence of the next-byte
 * distribution from the exact one (nats) and how often the most likely byte is the same (top-1
 * agreement). The raw "codec" takes the same way out of the pages and back without a codec: KL 0
 * and agreement 1 there is the harness's own check. One JSON line per codec, then a table. */
#include <math.h>

#include "bench/bench_common.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/kernels.h"
#include "models/mini/kvcache.h"
#include "models/mini/model.h"
#include "models/mini/weights.h"

typedef struct run {
    const model *m;
    kvcache *kv;
    model_scratch *s;
    uint32_t *table;
    int32_t *tokens;
    float *logits; /* [query][vocab] */
} run;

/* DROP as the connector stores it: chunk by chunk (chunk tokens each, the last one shorter), each
 * chunk's kept tokens chosen once from its middle layer's keys (kvs_codec_drop_select) or, with
 * `first`, its first k_group tokens (the positional rule the key-norm rule is compared with), every
 * layer encoded with that mask and decoded into the pages; the positions left out are marked in
 * dropped[] for the query step's attention. */
static void drop_chunks(run *r, int ctx, const kvs_codec *codec, uint32_t chunk, int first,
                        uint8_t *dropped, const kvs_kv_shape *shape, uint16_t *rows, uint8_t *enc) {
    const model_config *c = model_config_of(r->m);
    const kvs_layer_view *views = kvcache_views(r->kv);
    uint8_t mask[1024];
    for (uint32_t c0 = 0; c0 < (uint32_t)ctx; c0 += chunk) {
        uint32_t n = (uint32_t)ctx - c0 < chunk ? (uint32_t)ctx - c0 : chunk;
        kvs_codec cc = *codec;
        cc.k_group = (uint16_t)((codec->k_group * n + chunk - 1) / chunk); /* a short last chunk */
        if (cc.k_group == 0) cc.k_group = 1;
        kvs_token_span span = {.block_ids = r->table,
                               .n_block_ids =
                                   (uint64_t)(ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS,
                               .first_token = c0,
                               .n_tokens = n};
        uint64_t raw = kvs_kernel_layer_bytes(shape, n);
        kvs_kernel_gather_layer(&views[c->n_layers / 2], shape, &span, rows);
        if (first) {
            memset(mask, 0, sizeof mask);
            for (uint32_t t = 0; t < cc.k_group; t++) mask[t / 8] |= (uint8_t)(1u << (t % 8));
        } else {
            kvs_codec_drop_select(shape, KVS_DTYPE_FP16, n, rows, cc.k_group, mask);
        }
        for (uint32_t t = 0; t < n; t++) dropped[c0 + t] = !(mask[t / 8] >> (t % 8) & 1);
        for (int l = 0; l < c->n_layers; l++) {
            kvs_kernel_gather_layer(&views[l], shape, &span, rows);
            if (kvs_codec_encode_layer_kept(&cc, shape, KVS_DTYPE_FP16, n, rows,
                                            (uint8_t *)rows + raw / 2, mask, enc) != KVS_OK ||
                kvs_codec_scatter_layer(&cc, &views[l], shape, KVS_DTYPE_FP16, &span, enc) !=
                    KVS_OK) {
                fprintf(stderr, "kvs-bench-codec-quality: DROP refused a chunk\n");
                exit(1);
            }
        }
    }
}

/* Prefill tokens[0..ctx) into the pages, then the query step; logits of every query position. With
 * round_trip the context's layers go out of the pages and back in between (through codec, or
 * unchanged when it is NULL: the harness's own path, which must change nothing). */
static void forward(run *r, int ctx, int query, int round_trip, const kvs_codec *codec,
                    uint8_t *dropped, uint32_t chunk, int first, double *rel_k, double *rel_v) {
    const model_config *c = model_config_of(r->m);
    model_embed(r->m, r->s, r->tokens, ctx);
    for (int l = 0; l < c->n_layers; l++)
        model_layer(r->m, r->s, r->kv, (uint32_t)l, r->table, 0, ctx);
    double nk = 0, dk = 0, nv = 0, dv = 0;
    if (round_trip) {
        const kvs_layer_view *views = kvcache_views(r->kv);
        kvs_kv_shape shape = {.n_heads = model_cache_heads(r->m),
                              .head_bytes = model_cache_width(r->m) * 2,
                              .block_tokens = KV_BLOCK_TOKENS,
                              .has_v = 1};
        kvs_token_span span = {.block_ids = r->table,
                               .n_block_ids =
                                   (uint64_t)(ctx + query + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS,
                               .n_tokens = (uint32_t)ctx};
        uint64_t raw = kvs_kernel_layer_bytes(&shape, (uint32_t)ctx);
        uint16_t *rows = malloc(raw), *back = malloc(raw), *orig = NULL;
        uint8_t *enc =
            codec ? malloc(kvs_codec_layer_bytes(codec, &shape, KVS_DTYPE_FP16, (uint32_t)ctx))
                  : NULL;
        if (!rows || !back || (codec && !enc)) {
            fprintf(stderr, "kvs-bench-codec-quality: out of memory\n");
            exit(1);
        }
        int drop = codec && codec->kind == KVS_CODEC_DROP;
        if (drop) { /* every layer's exact rows, for the error after the chunks went through */
            orig = malloc(raw * (size_t)c->n_layers);
            if (!orig) exit(1);
            for (int l = 0; l < c->n_layers; l++)
                kvs_kernel_gather_layer(&views[l], &shape, &span,
                                        (uint8_t *)orig + raw * (size_t)l);
            drop_chunks(r, ctx, codec, chunk, first, dropped, &shape, rows, enc);
        }
        for (int l = 0; l < c->n_layers; l++) {
            if (drop) { /* already through its codec: only the error is measured here */
                memcpy(rows, (uint8_t *)orig + raw * (size_t)l, raw);
            } else if (kvs_kernel_gather_layer(&views[l], &shape, &span, rows),
                       !codec) { /* raw: the same round trip through a payload, unchanged */
                kvs_kernel_scatter_layer(&views[l], &shape, &span, rows);
            } else if (kvs_codec_encode_layer(codec, &shape, KVS_DTYPE_FP16, (uint32_t)ctx, rows,
                                              (uint8_t *)rows + raw / 2, enc) != KVS_OK ||
                       kvs_codec_scatter_layer(codec, &views[l], &shape, KVS_DTYPE_FP16, &span,
                                               enc) != KVS_OK) {
                fprintf(stderr, "kvs-bench-codec-quality: the codec refused layer %d\n", l);
                exit(1);
            }
            kvs_kernel_gather_layer(&views[l], &shape, &span, back);
            for (uint64_t i = 0; i < raw / 2; i++) {
                double a = kvs_f16_to_f32(rows[i]), b = kvs_f16_to_f32(back[i]);
                int is_v = i >= raw / 4;
                *(is_v ? &nv : &nk) += (a - b) * (a - b);
                *(is_v ? &dv : &dk) += a * a;
            }
        }
        free(rows), free(back), free(enc), free(orig);
    }
    if (rel_k) *rel_k = dk > 0 ? sqrt(nk / dk) : 0;
    if (rel_v) *rel_v = dv > 0 ? sqrt(nv / dv) : 0;
    model_scratch_drop(r->s, dropped); /* the query step only: the context was computed whole */
    model_embed(r->m, r->s, r->tokens + ctx, query);
    for (int l = 0; l < c->n_layers; l++)
        model_layer(r->m, r->s, r->kv, (uint32_t)l, r->table, (uint64_t)ctx, query);
    model_scratch_drop(r->s, NULL);
    for (int q = 0; q < query; q++) model_logits(r->m, r->s, q, r->logits + (size_t)q * c->vocab);
}

/* Prompt k: a slice of the text at a seeded offset. */
static void prompt_tokens(run *r, const uint8_t *text, size_t text_len, uint64_t k, int total) {
    size_t at = (size_t)(bench_mix64(k + 1) % (text_len - (size_t)total + 1));
    for (int i = 0; i < total; i++) r->tokens[i] = text[at + (size_t)i];
}

static void softmax(const float *x, int n, double *p) {
    double mx = x[0], z = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) z += (p[i] = exp(x[i] - mx));
    for (int i = 0; i < n; i++) p[i] /= z;
}

int main(int argc, char **argv) {
    const char *wpath = KVS_SOURCE_DIR "/models/mini/train/mini-256.kvsw";
    const char *tpath = KVS_SOURCE_DIR "/models/mini/train/mini-256.sample.txt";
    uint64_t prompts = 8, ctx = 448, query = 64, chunk = 64;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--prompts") == 0 && i + 1 < argc)
            prompts = bench_parse_u64("--prompts", argv[++i], 1, 1000);
        else if (strcmp(argv[i], "--context") == 0 && i + 1 < argc)
            ctx = bench_parse_u64("--context", argv[++i], 16, 8192);
        else if (strcmp(argv[i], "--query") == 0 && i + 1 < argc)
            query = bench_parse_u64("--query", argv[++i], 1, 1024);
        else if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc)
            chunk = bench_parse_u64("--chunk", argv[++i], 8, 8192);
        else if (strcmp(argv[i], "--weights") == 0 && i + 1 < argc)
            wpath = argv[++i];
        else if (strcmp(argv[i], "--text") == 0 && i + 1 < argc)
            tpath = argv[++i];
        else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(help ? stdout : stderr,
                    "usage: kvs-bench-codec-quality [--prompts N (8)] [--context N (448)] "
                    "[--query N (64)] [--chunk N (64)] [--weights FILE] [--text FILE]\n"
                    "  what each codec does to the trained mini model's next-byte predictions: KL\n"
                    "  divergence and top-1 agreement against exact pages (docs/benchmarks.md)\n");
            return help ? 0 : 2;
        }
    }
    char err[512];
    weights_file w;
    uint8_t *text;
    size_t text_len;
    if (weights_load(wpath, &w, err, sizeof err) != 0 ||
        text_load(tpath, w.config.vocab, &text, &text_len, err, sizeof err) != 0) {
        fprintf(stderr, "kvs-bench-codec-quality: %s\n", err);
        return 1;
    }
    if (text_len < ctx + query) {
        fprintf(stderr, "kvs-bench-codec-quality: the text is shorter than one prompt\n");
        return 1;
    }
    model *m = model_create_trained(&w.config, w.floats);
    float diff = 0;
    if (!m || weights_check(&w, m, &diff, err, sizeof err) != 0) {
        fprintf(stderr, "kvs-bench-codec-quality: %s\n", m ? err : "out of memory");
        return 1;
    }
    int total = (int)(ctx + query), vocab = w.config.vocab;
    uint32_t blocks = (uint32_t)(total + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    kvcache_params kp = {.layout = KV_LAYOUT_NHD,
                         .dtype = KVS_DTYPE_FP16,
                         .n_layers = (uint32_t)w.config.n_layers,
                         .n_heads = model_cache_heads(m),
                         .head_dim = model_cache_width(m),
                         .n_blocks = blocks,
                         .block_budget = blocks};
    run r = {.m = m};
    r.kv = kvcache_create(&kp, err, sizeof err);
    r.s = model_scratch_create(m, total, total);
    r.table = calloc(blocks, sizeof *r.table);
    r.tokens = malloc((size_t)total * sizeof *r.tokens);
    r.logits = malloc((size_t)query * vocab * sizeof *r.logits);
    /* every prompt's exact logits, computed once and compared with each codec's */
    float *exact = malloc((size_t)prompts * query * vocab * sizeof *exact);
    double *p = malloc((size_t)vocab * sizeof *p), *q = malloc((size_t)vocab * sizeof *q);
    if (!r.kv || !r.s || !r.table || !r.tokens || !r.logits || !exact || !p || !q ||
        kvcache_alloc(r.kv, blocks, r.table) != 0) {
        fprintf(stderr, "kvs-bench-codec-quality: out of memory\n");
        return 1;
    }
    /* the pages of a request in a scattered order, as an engine's would be */
    for (uint32_t b = 0; b < blocks; b++) r.table[b] = (b * 5u + 3u) % blocks;
    /* keep > 0: StreamingLLM instead of a codec: the first `sinks` positions (attention sinks; 4
     * tokens in the paper) and the most recent ones up to that fraction of the context stay, the
     * middle is masked out of the query step's attention (model_scratch_drop), as an engine that
     * can mask dropped KV would. drop > 0: the stored DROP codec, chunk by chunk (--chunk tokens),
     * keeping that fraction of each chunk: its tokens of largest key norm, or (first) its first
     * ones */
    const struct {
        const char *name;
        kvs_codec c;
        int raw;
        double keep;
        uint32_t sinks;
        double drop;
        int first;
    } codecs[] = {
        {"raw", {0, 0, 0, 0}, 1, 0, 0, 0, 0},
        {"int8", {KVS_CODEC_INT8, 8, 0, 0}, 0, 0, 0, 0, 0},
        {"kivi4-g32", {KVS_CODEC_KIVI, 4, 32, 32}, 0, 0, 0, 0, 0},
        {"kivi4-g128", {KVS_CODEC_KIVI, 4, 128, 32}, 0, 0, 0, 0, 0},
        {"kivi2-g16", {KVS_CODEC_KIVI, 2, 16, 16}, 0, 0, 0, 0, 0},
        {"kivi2-g32", {KVS_CODEC_KIVI, 2, 32, 32}, 0, 0, 0, 0, 0},
        {"kivi2-g128", {KVS_CODEC_KIVI, 2, 128, 32}, 0, 0, 0, 0, 0},
        {"stream4-0.5", {0, 0, 0, 0}, 1, 0.5, 4, 0, 0},
        {"stream4-0.2", {0, 0, 0, 0}, 1, 0.2, 4, 0, 0},
        {"stream64-0.5", {0, 0, 0, 0}, 1, 0.5, 64, 0, 0},
        {"stream64-0.3", {0, 0, 0, 0}, 1, 0.3, 64, 0, 0},
        {"stream64-0.2", {0, 0, 0, 0}, 1, 0.2, 64, 0, 0},
        {"drop-0.75", {KVS_CODEC_DROP, 0, 0, 0}, 0, 0, 0, 0.75, 0},
        {"drop-0.5", {KVS_CODEC_DROP, 0, 0, 0}, 0, 0, 0, 0.5, 0},
        {"drop-0.25", {KVS_CODEC_DROP, 0, 0, 0}, 0, 0, 0, 0.25, 0},
        {"dropfirst-0.5", {KVS_CODEC_DROP, 0, 0, 0}, 0, 0, 0, 0.5, 1},
    };
    uint8_t *dropped = calloc((size_t)total, 1);
    if (!dropped) {
        fprintf(stderr, "kvs-bench-codec-quality: out of memory\n");
        return 1;
    }
    size_t n_codecs = sizeof codecs / sizeof codecs[0];
    for (uint64_t k = 0; k < prompts; k++) {
        prompt_tokens(&r, text, text_len, k, total);
        forward(&r, (int)ctx, (int)query, 0, NULL, NULL, 0, 0, NULL, NULL);
        memcpy(exact + k * query * vocab, r.logits, (size_t)query * vocab * sizeof *exact);
    }
    printf("# %s\n", w.desc);
    printf("%-13s %6s %8s %8s %10s %7s\n", "codec", "rate", "rel_K", "rel_V", "KL nats", "top-1");
    for (size_t ci = 0; ci < n_codecs; ci++) {
        kvs_kv_shape shape = {.n_heads = model_cache_heads(m),
                              .head_bytes = model_cache_width(m) * 2,
                              .block_tokens = KV_BLOCK_TOKENS,
                              .has_v = 1};
        kvs_codec cc = codecs[ci].c;
        if (codecs[ci].drop > 0) {
            uint64_t keep = (uint64_t)(codecs[ci].drop * (double)chunk + 0.5);
            cc.k_group = (uint16_t)(keep ? keep : 1);
        }
        double rate = codecs[ci].raw ? 1.0
                      : codecs[ci].drop > 0
                          ? kvs_codec_rate(&cc, &shape, KVS_DTYPE_FP16, (uint32_t)chunk)
                          : kvs_codec_rate(&cc, &shape, KVS_DTYPE_FP16, (uint32_t)ctx);
        memset(dropped, 0, (size_t)total);
        if (codecs[ci].keep > 0) {
            uint64_t kept = (uint64_t)(codecs[ci].keep * (double)ctx + 0.5),
                     sinks = codecs[ci].sinks < ctx ? codecs[ci].sinks : ctx;
            uint64_t recent = kept > sinks ? kept - sinks : 0;
            for (uint64_t t = sinks; t + recent < ctx; t++) dropped[t] = 1;
            rate = (double)(sinks + recent) / (double)ctx;
        }
        double kl = 0, agree = 0, rk = 0, rv = 0, lsum = 0, lsq = 0, npos = 0;
        for (uint64_t k = 0; k < prompts; k++) {
            prompt_tokens(&r, text, text_len, k, total);
            const float *ex = exact + k * query * vocab;
            double k_err, v_err;
            forward(&r, (int)ctx, (int)query, 1, codecs[ci].raw ? NULL : &cc,
                    codecs[ci].keep > 0 || codecs[ci].drop > 0 ? dropped : NULL, (uint32_t)chunk,
                    codecs[ci].first, &k_err, &v_err);
            rk += k_err;
            rv += v_err;
            /* how much one prompt's error differs from another's: the spread of log(error) */
            double e = (k_err + v_err) / 2;
            if (e > 0) lsum += log(e), lsq += log(e) * log(e), npos++;
            for (uint64_t j = 0; j < query; j++) {
                softmax(ex + j * vocab, vocab, p);
                softmax(r.logits + j * vocab, vocab, q);
                double d = 0;
                int a = 0, b = 0;
                for (int v = 0; v < vocab; v++) {
                    if (p[v] > 0) d += p[v] * log(p[v] / q[v]);
                    a = p[v] > p[a] ? v : a;
                    b = q[v] > q[b] ? v : b;
                }
                kl += d;
                agree += a == b;
            }
        }
        double n = (double)(prompts * query);
        double spread = npos >= 2 ? sqrt(fmax(0, (lsq - lsum * lsum / npos) / (npos - 1))) : 0;
        printf("{\"bench\":\"codec_quality\",\"codec\":\"%s\",\"rate\":%.4f,\"rel_k\":%.5f,"
               "\"rel_v\":%.5f,\"log_error_sd\":%.4f,\"kl_nats\":%.6f,\"top1\":%.4f,"
               "\"prompts\":%llu,\"context\":%llu,\"query\":%llu,\"chunk\":%llu}\n",
               codecs[ci].name, rate, rk / (double)prompts, rv / (double)prompts, spread, kl / n,
               agree / n, (unsigned long long)prompts, (unsigned long long)ctx,
               (unsigned long long)query, (unsigned long long)chunk);
        printf("%-13s %6.4f %8.5f %8.5f %10.6f %7.4f\n", codecs[ci].name, rate,
               rk / (double)prompts, rv / (double)prompts, kl / n, agree / n);
    }
    free(dropped), free(p), free(q), free(exact), free(r.logits), free(r.tokens), free(r.table);
    model_scratch_free(r.s);
    kvcache_destroy(r.kv);
    model_free(m);
    free(text);
    weights_free(&w);
    return 0;
}
