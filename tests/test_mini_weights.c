/* test_mini_weights.c - the mini engine's trained weights (models/mini/weights.h): the shipped
 * checkpoint loads, computes the trainer's logits and predicts held-out text far better than seeded
 * weights of its shape; damaged or inconsistent files are refused with a sentence, never used. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/mini/kvcache.h"
#include "models/mini/model.h"
#include "models/mini/weights.h"

#define TRAIN_DIR KVS_SOURCE_DIR "/models/mini/train/"

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Write a valid checksum after editing a file's bytes. */
static void reseal(uint8_t *b, size_t len) {
    uint64_t h = fnv1a64(b, len - 8);
    for (int i = 0; i < 8; i++) b[len - 8 + (size_t)i] = (uint8_t)(h >> (8 * i));
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The bytes text[0..n) as a request of m: fp32 pages, a scratch, its tokens. */
typedef struct prompt {
    kvcache *kv;
    model_scratch *s;
    uint32_t *table;
    int32_t *tokens;
} prompt;

static prompt prompt_open(const model *m, const uint8_t *text, int n) {
    const model_config *c = model_config_of(m);
    uint32_t blocks = (uint32_t)(n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    kvcache_params kp = {.layout = KV_LAYOUT_NHD,
                         .dtype = KVS_DTYPE_FP32,
                         .n_layers = (uint32_t)c->n_layers,
                         .n_heads = model_cache_heads(m),
                         .head_dim = model_cache_width(m),
                         .n_blocks = blocks,
                         .block_budget = blocks};
    char err[256];
    prompt p = {.kv = kvcache_create(&kp, err, sizeof err),
                .s = model_scratch_create(m, n, n),
                .table = calloc(blocks, sizeof(uint32_t)),
                .tokens = malloc((size_t)n * sizeof(int32_t))};
    ck_assert_msg(p.kv != NULL, "%s", err);
    ck_assert(p.s && p.table && p.tokens && kvcache_alloc(p.kv, blocks, p.table) == 0);
    for (int i = 0; i < n; i++) p.tokens[i] = text[i];
    return p;
}

/* Run tokens [from, from + n) as one step through every layer. */
static void prompt_step(const model *m, prompt *p, int from, int n) {
    model_embed(m, p->s, p->tokens + from, n);
    for (int l = 0; l < model_config_of(m)->n_layers; l++)
        model_layer(m, p->s, p->kv, (uint32_t)l, p->table, (uint64_t)from, n);
}

static void prompt_close(prompt *p) {
    free(p->tokens), free(p->table);
    model_scratch_free(p->s);
    kvcache_destroy(p->kv);
}

/* Mean cross-entropy (nats per byte) of m predicting text[1..n) from text[0..n-1). */
static double cross_entropy(const model *m, const uint8_t *text, int n) {
    const model_config *c = model_config_of(m);
    prompt pr = prompt_open(m, text, n);
    model_scratch *s = pr.s;
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    prompt_step(m, &pr, 0, n);
    double total = 0;
    for (int i = 0; i + 1 < n; i++) {
        model_logits(m, s, i, logits);
        double mx = logits[0];
        for (int v = 1; v < c->vocab; v++) mx = logits[v] > mx ? logits[v] : mx;
        double z = exp(logits[0] - mx); /* >= 1 term of value 1: log(z) >= 0 */
        for (int v = 1; v < c->vocab; v++) z += exp(logits[v] - mx);
        total += log(z) + mx - logits[text[i + 1]];
    }
    free(logits);
    prompt_close(&pr);
    return total / (n - 1);
}

START_TEST(the_shipped_checkpoint_is_the_trained_model) {
    weights_file w;
    char err[512];
    ck_assert_msg(weights_load(TRAIN_DIR "mini-256.kvsw", &w, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(w.config.vocab, 256);
    /* the engine's model id names trained weights by their file's checksum (the last 8 bytes) */
    size_t flen;
    uint8_t *fbytes = slurp(TRAIN_DIR "mini-256.kvsw", &flen);
    uint64_t sum = 0;
    for (int i = 7; i >= 0; i--) sum = sum << 8 | fbytes[flen - 8 + (size_t)i];
    ck_assert_uint_eq(w.config.weights_id, sum);
    free(fbytes);
    ck_assert_ptr_nonnull(strstr(w.desc, "val_loss_nats"));
    model *m = model_create_trained(&w.config, w.floats);
    ck_assert_ptr_nonnull(m);
    float diff = -1;
    ck_assert_msg(weights_check(&w, m, &diff, err, sizeof err) == 0, "%s", err);
    ck_assert(diff >= 0 && diff < 1e-2f);

    /* held-out text: the trained model predicts it; seeded weights of the same shape do not */
    size_t len;
    uint8_t *text = slurp(TRAIN_DIR "mini-256.sample.txt", &len);
    ck_assert_uint_ge(len, 4096 + 256);
    double trained_ce = cross_entropy(m, text + 4096, 256);
    model_config seeded = w.config;
    seeded.seed = 42;
    seeded.weights_id = 0;
    model *r = model_create(&seeded);
    ck_assert_ptr_nonnull(r);
    double seeded_ce = cross_entropy(r, text + 4096, 256);
    ck_assert_msg(trained_ce < 2.5 && seeded_ce > 4.0 && trained_ce < seeded_ce - 2.0,
                  "cross-entropy trained %.3f, seeded %.3f nats per byte", trained_ce, seeded_ce);
    model_free(r);
    free(text);
    model_free(m);
    weights_free(&w);
}
END_TEST

/* A weight changed after training (checksum made valid again) is caught by the reference logits. */
START_TEST(a_model_that_is_not_the_trained_one_fails_the_reference_check) {
    size_t len;
    uint8_t *b = slurp(TRAIN_DIR "mini-256.kvsw", &len);
    weights_file w;
    char err[512];
    ck_assert_int_eq(weights_parse(b, len, &w, err, sizeof err), 0);
    /* the final norm's gains a little off: the logits grow by a tenth */
    float *f = (float *)(void *)w.mem;
    uint64_t at = (uint64_t)w.config.vocab * (uint64_t)w.config.dim; /* after the embeddings */
    for (int i = 0; i < w.config.dim; i++) f[at + (uint64_t)i] *= 1.1f;
    model *m = model_create_trained(&w.config, w.floats);
    float diff = 0;
    ck_assert_int_eq(weights_check(&w, m, &diff, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "other logits than the trainer"));
    ck_assert(diff > 0);
    model_free(m);
    weights_free(&w);
    free(b);
}
END_TEST

static void refused(uint8_t *b, size_t len, const char *why) {
    weights_file w;
    char err[512] = "";
    ck_assert_int_eq(weights_parse(b, len, &w, err, sizeof err), -1);
    ck_assert_msg(strstr(err, why) != NULL, "'%s' does not say '%s'", err, why);
    ck_assert_ptr_null(w.mem);
}

START_TEST(damaged_or_inconsistent_files_are_refused) {
    size_t len;
    uint8_t *orig = slurp(TRAIN_DIR "mini-256.kvsw", &len);
    uint8_t *b = malloc(len);

    memcpy(b, orig, len); /* a flipped bit anywhere */
    b[len / 2] ^= 0x10;
    refused(b, len, "checksum mismatch");

    memcpy(b, orig, len); /* truncated, resealed */
    reseal(b, len - 4096);
    refused(b, len - 4096, "where its shape needs");
    refused(b, 20, "too short");

    memcpy(b, orig, len);
    b[0] = 'X';
    refused(b, len, "not a KVSW weights file");

    memcpy(b, orig, len); /* a newer format version */
    put32(b + 8, 2);
    reseal(b, len);
    refused(b, len, "format version 2");

    memcpy(b, orig, len); /* a shape the engine refuses: heads not dividing dim */
    put32(b + 8 + 4 * 3, 3);
    reseal(b, len);
    refused(b, len, "shape is refused");

    memcpy(b, orig, len); /* an absurd shape: refused before any size is computed */
    put32(b + 8 + 4 * 1, 0xffffffffu);
    reseal(b, len);
    refused(b, len, "out of range");

    memcpy(b, orig, len); /* the reserved field set */
    put32(b + 44, 1);
    reseal(b, len);
    refused(b, len, "reserved");

    memcpy(b, orig, len); /* kv heads that do not divide the query heads */
    put32(b + 24, 3);
    reseal(b, len);
    refused(b, len, "shape is refused");

    memcpy(b, orig, len); /* no reference prompt, or one too long */
    put32(b + 36, 0);
    reseal(b, len);
    refused(b, len, "reference prompt");
    memcpy(b, orig, len);
    put32(b + 36, 5000);
    reseal(b, len);
    refused(b, len, "reference prompt");

    memcpy(b, orig, len); /* a description over 64 KiB */
    put32(b + 40, 70000);
    reseal(b, len);
    refused(b, len, "description");

    memcpy(b, orig, len); /* a layer more than the bytes hold */
    put32(b + 8 + 4 * 2, 5);
    reseal(b, len);
    refused(b, len, "where its shape needs");

    weights_file w; /* a NaN where a weight should be */
    char err[256];
    ck_assert_int_eq(weights_parse(orig, len, &w, err, sizeof err), 0);
    size_t first_float = 48 + strlen(w.desc);
    weights_free(&w);
    memcpy(b, orig, len);
    const float nan = NAN, inf = -INFINITY;
    memcpy(b + first_float + 4 * 100, &nan, 4);
    reseal(b, len);
    refused(b, len, "not a finite number");
    memcpy(b, orig, len);
    memcpy(b + first_float + 4 * 200, &inf, 4);
    reseal(b, len);
    refused(b, len, "not a finite number");

    ck_assert_int_eq(weights_load("/nonexistent/w.kvsw", &w, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "cannot open"));
    free(b);
    free(orig);
}
END_TEST

/* Logits of the last of `query` tokens computed over `ctx` earlier ones, with `dropped` masking
 * positions out of the query step's attention (the context itself is computed whole). */
static void query_logits(const model *m, const uint8_t *text, int ctx, int query,
                         const uint8_t *dropped, int poison, float *logits) {
    const model_config *c = model_config_of(m);
    prompt pr = prompt_open(m, text, ctx + query);
    prompt_step(m, &pr, 0, ctx);
    if (poison) /* masked pages holding NaN and infinities, as never-loaded pages might */
        for (int l = 0; l < c->n_layers; l++)
            for (int p = 0; p < ctx; p++)
                for (uint32_t g = 0; dropped && dropped[p] && g < model_cache_heads(m); g++)
                    for (int kvp = 0; kvp < 2; kvp++) {
                        float *x = (float *)(void *)kvcache_head_ptr(
                            pr.kv, (uint32_t)l, (kv_part)kvp, pr.table[p / KV_BLOCK_TOKENS],
                            (uint32_t)(p % KV_BLOCK_TOKENS), g);
                        for (uint32_t d = 0; d < model_cache_width(m); d++)
                            x[d] = d % 2 ? NAN : INFINITY;
                    }
    model_scratch_drop(pr.s, dropped);
    prompt_step(m, &pr, ctx, query);
    model_logits(m, pr.s, query - 1, logits);
    prompt_close(&pr);
}

/* The engine can mask dropped KV (StreamingLLM): masked positions have no influence at all, an
 * empty mask changes no bit, and a real one changes the prediction. */
START_TEST(masked_positions_have_no_influence) {
    weights_file w;
    char err[512];
    ck_assert_int_eq(weights_load(TRAIN_DIR "mini-256.kvsw", &w, err, sizeof err), 0);
    model *m = model_create_trained(&w.config, w.floats);
    size_t len;
    uint8_t *text = slurp(TRAIN_DIR "mini-256.sample.txt", &len);
    enum { CTX = 96, QUERY = 16 };
    uint8_t a[CTX + QUERY], b[CTX + QUERY], none[CTX + QUERY], mask[CTX + QUERY];
    memcpy(a, text + 1000, sizeof a);
    memcpy(b, text + 9000, sizeof b);
    memcpy(b + CTX, a + CTX, QUERY); /* the same query after another context */
    memset(none, 0, sizeof none);
    memset(mask, 0, sizeof mask);
    for (int p = 4; p < CTX; p++) mask[p] = 1; /* keep the first 4 (sinks) and the query */
    memcpy(b, a, 4);
    size_t vb = (size_t)w.config.vocab * sizeof(float);
    float *la = malloc(vb), *lb = malloc(vb), *l0 = malloc(vb), *ln = malloc(vb);
    query_logits(m, a, CTX, QUERY, mask, 0, la);
    query_logits(m, b, CTX, QUERY, mask, 0, lb);
    ck_assert_mem_eq(la, lb, vb); /* what was masked never reached the query */
    query_logits(m, a, CTX, QUERY, mask, 1, lb);
    ck_assert_mem_eq(la, lb, vb); /* nor NaN or infinities in masked pages */
    query_logits(m, a, CTX, QUERY, NULL, 0, l0);
    query_logits(m, a, CTX, QUERY, none, 0, ln);
    ck_assert_mem_eq(l0, ln, vb); /* an empty mask is no mask */
    ck_assert(memcmp(l0, la, vb) != 0);
    query_logits(m, b, CTX, QUERY, NULL, 0, lb);
    ck_assert(memcmp(l0, lb, vb) != 0); /* unmasked, the context matters */
    free(la), free(lb), free(l0), free(ln), free(text);
    model_free(m);
    weights_free(&w);
}
END_TEST

START_TEST(text_needs_byte_tokens_and_bytes) {
    uint8_t *t;
    size_t n;
    char err[256];
    ck_assert_int_eq(text_load(TRAIN_DIR "mini-256.sample.txt", 256, &t, &n, err, sizeof err), 0);
    ck_assert_uint_eq(n, 131072);
    free(t);
    ck_assert_int_eq(text_load(TRAIN_DIR "mini-256.sample.txt", 128, &t, &n, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "vocabulary of 256"));
    ck_assert_int_eq(text_load("/dev/null", 256, &t, &n, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "empty"));
    ck_assert_int_eq(text_load("/tmp", 256, &t, &n, err, sizeof err), -1); /* a read error */
    ck_assert_ptr_nonnull(strstr(err, "cannot read"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("mini_weights");
    TCase *tc = tcase_create("weights");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, the_shipped_checkpoint_is_the_trained_model);
    tcase_add_test(tc, a_model_that_is_not_the_trained_one_fails_the_reference_check);
    tcase_add_test(tc, damaged_or_inconsistent_files_are_refused);
    tcase_add_test(tc, text_needs_byte_tokens_and_bytes);
    tcase_add_test(tc, masked_positions_have_no_influence);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
