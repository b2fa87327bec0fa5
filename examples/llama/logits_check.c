/* logits_check.c - do llama.cpp and the mini engine compute the same model? The mini engine's
 * trained weights (KVSW) and their GGUF conversion (tools/gguf/kvsw_to_gguf.py) are run over the
 * same byte tokens, and the logits of every position are compared:
 *
 *   whole    the prompt as one llama_decode batch;
 *   decode   a prefix as one batch, then one token per llama_decode (llama.cpp's KV cache path);
 *   restore  the prefix's sequence state taken out with llama_state_seq_get_data, the memory
 *            cleared, the state put back with llama_state_seq_set_data, then one token per call.
 *
 * Exit status: 0 when every pass is within the tolerance, 1 when one is not, 2 when something could
 * not be run (a file, the model, a decode). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ggml-backend.h>
#include <llama.h>

#include "models/mini/model.h"
#include "models/mini/weights.h"

#ifndef KVS_LLAMA_BACKEND_DIR
#define KVS_LLAMA_BACKEND_DIR ""
#endif

typedef struct options {
    const char *gguf, *weights, *text;
    int tokens, offset, prefix, threads, verbose;
    double tolerance;
    float rope_freq_base;
    enum ggml_type kv_type;
    enum llama_flash_attn_type flash;
    const char *backend_dir;
} options;

typedef struct diff {
    double max_abs;   /* largest |llama - mini| over every logit compared */
    double max_logit; /* largest |mini| over the same */
    int worst_pos;    /* position of max_abs */
    int argmax_agree; /* positions whose largest logit is the same token */
    int positions;
} diff;

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvs-llama-logits-check --gguf FILE [options]\n"
            "  --weights FILE    KVSW weights the GGUF was made from (default: the trained ones)\n"
            "  --text FILE       prompt bytes (default: the trained model's text sample)\n"
            "  --tokens N        prompt length in tokens (default 128)\n"
            "  --offset N        first byte of the text used (default 0)\n"
            "  --prefix N        tokens of the first batch of the decode passes (default N/2)\n"
            "  --kv f32|f16      llama.cpp's KV cache type (default f32)\n"
            "  --flash-attn on|off|auto  llama.cpp's flash attention (default off)\n"
            "  --tolerance X     largest |difference| allowed, relative to the largest |logit|\n"
            "                    (default 1e-4; an f16 KV cache or flash attention needs 1e-3)\n"
            "  --threads N       llama.cpp's threads (default 1: the model is too small to share)\n"
            "  --rope-freq-base X  override the GGUF's RoPE base in llama.cpp (a wrong model,\n"
            "                    to see the check fail)\n"
            "  --backend-dir DIR where llama.cpp's backend modules are (default: the build's)\n"
            "  --verbose         llama.cpp's log and every position's figures\n");
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.tokens = 128,
                   .prefix = -1,
                   .threads = 1,
                   .tolerance = 1e-4,
                   .kv_type = GGML_TYPE_F32,
                   .flash = LLAMA_FLASH_ATTN_TYPE_DISABLED,
                   .backend_dir = KVS_LLAMA_BACKEND_DIR};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--verbose")) {
            o->verbose = 1;
            continue;
        } else if (!v) {
            bad = 1;
        } else if (!strcmp(a, "--gguf")) {
            o->gguf = v;
        } else if (!strcmp(a, "--weights")) {
            o->weights = v;
        } else if (!strcmp(a, "--text")) {
            o->text = v;
        } else if (!strcmp(a, "--backend-dir")) {
            o->backend_dir = v;
        } else if (!strcmp(a, "--tokens")) {
            bad = parse_int(v, 2, 4096, &o->tokens);
        } else if (!strcmp(a, "--offset")) {
            bad = parse_int(v, 0, 1 << 30, &o->offset);
        } else if (!strcmp(a, "--prefix")) {
            bad = parse_int(v, 1, 4095, &o->prefix);
        } else if (!strcmp(a, "--threads")) {
            bad = parse_int(v, 1, 256, &o->threads);
        } else if (!strcmp(a, "--kv")) {
            if (!strcmp(v, "f32"))
                o->kv_type = GGML_TYPE_F32;
            else if (!strcmp(v, "f16"))
                o->kv_type = GGML_TYPE_F16;
            else
                bad = 1;
        } else if (!strcmp(a, "--flash-attn")) {
            if (!strcmp(v, "on"))
                o->flash = LLAMA_FLASH_ATTN_TYPE_ENABLED;
            else if (!strcmp(v, "off"))
                o->flash = LLAMA_FLASH_ATTN_TYPE_DISABLED;
            else if (!strcmp(v, "auto"))
                o->flash = LLAMA_FLASH_ATTN_TYPE_AUTO;
            else
                bad = 1;
        } else if (!strcmp(a, "--tolerance")) {
            char *end;
            o->tolerance = strtod(v, &end);
            bad = *end || end == v || !(o->tolerance >= 0);
        } else if (!strcmp(a, "--rope-freq-base")) {
            char *end;
            o->rope_freq_base = strtof(v, &end);
            bad = *end || end == v || !(o->rope_freq_base > 0);
        } else {
            fprintf(stderr, "kvs-llama-logits-check: unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "kvs-llama-logits-check: %s needs a valid value\n", a);
            return -1;
        }
        i++;
    }
    if (!o->gguf) {
        fprintf(stderr, "kvs-llama-logits-check: --gguf FILE is needed\n");
        usage(stderr);
        return -1;
    }
    if (o->prefix < 0) o->prefix = o->tokens / 2;
    if (o->prefix >= o->tokens) {
        fprintf(stderr, "kvs-llama-logits-check: --prefix must be below --tokens\n");
        return -1;
    }
    return 0;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

/* The mini engine's logits for every position of tokens[0..n): n x vocab floats, or NULL. */
static float *mini_logits(const model *m, const int32_t *tokens, int n, char *err, size_t err_len) {
    float *out = malloc((size_t)n * (size_t)model_config_of(m)->vocab * sizeof *out);
    if (!out) snprintf(err, err_len, "no memory for the mini engine's %d tokens", n);
    if (out && weights_prompt_logits(m, tokens, n, 0, out, err, err_len) != 0) {
        free(out);
        out = NULL;
    }
    return out;
}

/* Decode tokens[from..to) of sequence 0 at their positions, `step` at a time, copying the logits of
 * every position into out (row = position). 0, or -1 with a sentence. */
static int llama_run(struct llama_context *ctx, const int32_t *tokens, int from, int to, int step,
                     int vocab, float *out, char *err, size_t err_len) {
    struct llama_batch b = llama_batch_init(step, 0, 1);
    int rc = 0;
    for (int p = from; p < to && rc == 0; p += step) {
        int n = to - p < step ? to - p : step;
        b.n_tokens = n;
        for (int i = 0; i < n; i++) {
            b.token[i] = tokens[p + i];
            b.pos[i] = p + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        int32_t r = llama_decode(ctx, b);
        if (r != 0) {
            snprintf(err, err_len, "llama_decode of positions %d..%d returned %d", p, p + n - 1,
                     (int)r);
            rc = -1;
            break;
        }
        for (int i = 0; i < n; i++) {
            const float *l = llama_get_logits_ith(ctx, i);
            if (!l) {
                snprintf(err, err_len, "no logits for position %d", p + i);
                rc = -1;
                break;
            }
            memcpy(out + (size_t)(p + i) * (size_t)vocab, l, (size_t)vocab * sizeof *l);
        }
    }
    llama_batch_free(b);
    return rc;
}

static diff compare(const float *mini, const float *other, int n, int vocab, int verbose,
                    const char *pass) {
    diff d = {.worst_pos = -1, .positions = n};
    for (int p = 0; p < n; p++) {
        const float *a = mini + (size_t)p * (size_t)vocab, *b = other + (size_t)p * (size_t)vocab;
        double pos_max = 0;
        for (int v = 0; v < vocab; v++) {
            double e = fabs((double)b[v] - (double)a[v]);
            if (!(e <= pos_max)) pos_max = e; /* a NaN is the largest difference */
            if (fabs((double)a[v]) > d.max_logit) d.max_logit = fabs((double)a[v]);
        }
        if (!(pos_max <= d.max_abs)) d.max_abs = pos_max, d.worst_pos = p;
        if (model_argmax(a, vocab) == model_argmax(b, vocab)) d.argmax_agree++;
        if (verbose) printf("  %s pos %3d: max |diff| %.3g\n", pass, p, pos_max);
    }
    return d;
}

static int report(const char *pass, const diff *d, double tolerance) {
    double rel = d->max_logit > 0 ? d->max_abs / d->max_logit : d->max_abs;
    int ok = rel <= tolerance;
    printf("%-8s max |diff| %.3g (position %d), %.3g of the largest |logit| %.3g; "
           "argmax agrees at %d/%d positions: %s\n",
           pass, d->max_abs, d->worst_pos, rel, d->max_logit, d->argmax_agree, d->positions,
           ok ? "ok" : "MISMATCH");
    return ok;
}

int main(int argc, char **argv) {
    options o;
    int parsed = parse_args(argc, argv, &o);
    if (parsed != 0) return parsed > 0 ? 0 : 2;
    char err[512], buf[4096];
    int status = 2;
    weights_file w = {0};
    model *m = NULL;
    uint8_t *text = NULL;
    size_t text_len = 0;
    int32_t *tokens = NULL;
    float *ref = NULL, *got = NULL;
    uint8_t *state = NULL;
    struct llama_model *lm = NULL;
    struct llama_context *ctx = NULL;
    int backend = 0;

    const char *wpath =
        o.weights ? o.weights : weights_default_file("mini-256.kvsw", buf, sizeof buf);
    if (!wpath || weights_load(wpath, &w, err, sizeof err) != 0) {
        fprintf(stderr, "kvs-llama-logits-check: weights: %s\n", wpath ? err : "none found");
        goto out;
    }
    const int vocab = w.config.vocab, n = o.tokens;
    m = model_create_trained(&w.config, w.floats);
    char tbuf[4096];
    const char *tpath =
        o.text ? o.text : weights_default_file("mini-256.sample.txt", tbuf, sizeof tbuf);
    if (!m || !tpath || text_load(tpath, vocab, &text, &text_len, err, sizeof err) != 0) {
        fprintf(stderr, "kvs-llama-logits-check: %s\n",
                !m      ? "no memory for the model"
                : tpath ? err
                        : "no text sample found");
        goto out;
    }
    if ((size_t)o.offset + (size_t)n > text_len) {
        fprintf(stderr, "kvs-llama-logits-check: the text has %zu bytes, fewer than %d + %d\n",
                text_len, o.offset, n);
        goto out;
    }
    tokens = malloc((size_t)n * sizeof *tokens);
    got = malloc((size_t)n * (size_t)vocab * sizeof *got);
    if (!tokens || !got) goto out;
    for (int i = 0; i < n; i++) tokens[i] = text[o.offset + i];
    if (!(ref = mini_logits(m, tokens, n, err, sizeof err))) {
        fprintf(stderr, "kvs-llama-logits-check: %s\n", err);
        goto out;
    }

    llama_log_set(o.verbose ? NULL : quiet_log, NULL);
    /* A llama.cpp built with dynamically loaded backends (the prebuilt one) has no CPU backend
     * until its module is loaded; one with the CPU backend linked in finds nothing more here. */
    if (o.backend_dir[0]) ggml_backend_load_all_from_path(o.backend_dir);
    llama_backend_init();
    backend = 1;
    if (ggml_backend_dev_count() == 0) {
        fprintf(stderr, "kvs-llama-logits-check: llama.cpp has no backend (--backend-dir %s)\n",
                o.backend_dir[0] ? o.backend_dir : "unset");
        goto out;
    }
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    if (!(lm = llama_model_load_from_file(o.gguf, mp))) {
        fprintf(stderr, "kvs-llama-logits-check: llama.cpp could not load %s\n", o.gguf);
        goto out;
    }
    const struct llama_vocab *lv = llama_model_get_vocab(lm);
    if (llama_vocab_n_tokens(lv) != vocab || llama_model_n_embd(lm) != w.config.dim ||
        llama_model_n_layer(lm) != w.config.n_layers) {
        fprintf(stderr,
                "kvs-llama-logits-check: %s has vocab %d, width %d, %d layers; the weights %d, %d, "
                "%d\n",
                o.gguf, llama_vocab_n_tokens(lv), llama_model_n_embd(lm), llama_model_n_layer(lm),
                vocab, w.config.dim, w.config.n_layers);
        goto out;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n;
    cp.n_batch = cp.n_ubatch = (uint32_t)n;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = o.threads;
    cp.type_k = cp.type_v = o.kv_type;
    cp.flash_attn_type = o.flash;
    cp.no_perf = true;
    cp.rope_freq_base = o.rope_freq_base; /* 0: the model's */
    if (!(ctx = llama_init_from_model(lm, cp))) {
        fprintf(stderr, "kvs-llama-logits-check: llama.cpp could not make a context\n");
        goto out;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    printf("%d tokens from byte %d of %s; llama.cpp: KV %s, flash attention %s, %d threads\n", n,
           o.offset, tpath, o.kv_type == GGML_TYPE_F32 ? "f32" : "f16",
           llama_flash_attn_type_name(o.flash), o.threads);

    int ok = 1;
    /* whole: the prompt in one batch */
    if (llama_run(ctx, tokens, 0, n, n, vocab, got, err, sizeof err) != 0) goto fail;
    diff d = compare(ref, got, n, vocab, o.verbose, "whole");
    ok &= report("whole", &d, o.tolerance);

    /* decode: a prefix batch, then one token at a time over the cache */
    llama_memory_clear(mem, true);
    if (llama_run(ctx, tokens, 0, o.prefix, o.prefix, vocab, got, err, sizeof err) != 0 ||
        llama_run(ctx, tokens, o.prefix, n, 1, vocab, got, err, sizeof err) != 0)
        goto fail;
    d = compare(ref, got, n, vocab, o.verbose, "decode");
    ok &= report("decode", &d, o.tolerance);

    /* restore: the prefix's state out of sequence 0, the memory emptied, the state back in */
    llama_memory_clear(mem, true);
    if (llama_run(ctx, tokens, 0, o.prefix, o.prefix, vocab, got, err, sizeof err) != 0) goto fail;
    size_t size = llama_state_seq_get_size(ctx, 0);
    if (!(state = malloc(size ? size : 1))) goto out;
    size_t wrote = llama_state_seq_get_data(ctx, state, size, 0);
    llama_memory_clear(mem, true);
    if (llama_memory_seq_pos_max(mem, 0) != -1) {
        snprintf(err, sizeof err, "sequence 0 is not empty after llama_memory_clear");
        goto fail;
    }
    size_t read = llama_state_seq_set_data(ctx, state, wrote, 0);
    if (wrote == 0 || read != wrote || llama_memory_seq_pos_max(mem, 0) != o.prefix - 1) {
        snprintf(err, sizeof err,
                 "state of sequence 0: %zu bytes taken, %zu put back, last position %d (want %d)",
                 wrote, read, (int)llama_memory_seq_pos_max(mem, 0), o.prefix - 1);
        goto fail;
    }
    /* positions before the prefix's end keep the logits of the pass that made the state */
    if (llama_run(ctx, tokens, o.prefix, n, 1, vocab, got, err, sizeof err) != 0) goto fail;
    d = compare(ref, got, n, vocab, o.verbose, "restore");
    ok &= report("restore", &d, o.tolerance);
    printf("state of %d tokens: %zu bytes\n", o.prefix, wrote);
    status = ok ? 0 : 1;
    goto out;
fail:
    fprintf(stderr, "kvs-llama-logits-check: %s\n", err);
out:
    free(state);
    if (ctx) llama_free(ctx);
    if (lm) llama_model_free(lm);
    if (backend) llama_backend_free();
    free(ref);
    free(got);
    free(tokens);
    free(text);
    model_free(m);
    weights_free(&w);
    return status;
}
