/* weights.c - reading and checking a KVSW file (weights.h). */
#include "weights.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvcache.h"

#define HEADER_BYTES   48u
#define MAX_PROMPT     4096u
#define MAX_DESC       65536u
#define MAX_FILE_BYTES (1ull << 31)

static int fail(char *err, size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
    return -1;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) {
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

int weights_parse(const void *bytes, size_t len, weights_file *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    const uint8_t *p = bytes;
    if (!host_is_little_endian()) return fail(err, err_len, "weights files are little-endian");
    if (len < HEADER_BYTES + 8) return fail(err, err_len, "%zu bytes: too short for a header", len);
    if (memcmp(p, "KVSWGT01", 8) != 0) return fail(err, err_len, "not a KVSW weights file");
    uint32_t f[10];
    for (int i = 0; i < 10; i++) f[i] = le32(p + 8 + 4 * i);
    if (f[0] != 1) return fail(err, err_len, "format version %u (this engine reads 1)", f[0]);
    if (f[9] != 0) return fail(err, err_len, "a reserved header field is %u, not 0", f[9]);
    uint64_t sum = le64(p + len - 8);
    if (fnv1a64(p, len - 8) != sum) return fail(err, err_len, "checksum mismatch: file damaged");
    model_config c = {.dim = (int)f[1],
                      .n_layers = (int)f[2],
                      .n_heads = (int)f[3],
                      .n_kv_heads = (int)f[4],
                      .ffn = (int)f[5],
                      .vocab = (int)f[6]};
    uint32_t prompt_len = f[7], desc_len = f[8];
    if (f[1] > 8192 || f[2] > 256 || f[3] > 1024 || f[4] > 1024 || f[5] > 65536 ||
        f[6] > (1u << 20))
        return fail(err, err_len,
                    "shape out of range (dim %u layers %u heads %u kv %u ffn %u "
                    "vocab %u)",
                    f[1], f[2], f[3], f[4], f[5], f[6]);
    char why[256];
    if (model_config_check(&c, why, sizeof why) != 0)
        return fail(err, err_len, "its shape is refused: %s", why);
    if (prompt_len == 0 || prompt_len > MAX_PROMPT || desc_len > MAX_DESC)
        return fail(err, err_len, "a reference prompt of %u tokens or a description of %u bytes",
                    prompt_len, desc_len);
    uint64_t floats = model_weights_floats(&c);
    uint64_t want =
        HEADER_BYTES + (uint64_t)desc_len + floats * 4 + prompt_len + (uint64_t)c.vocab * 4 + 8;
    if (want != len)
        return fail(err, err_len, "%zu bytes where its shape needs %llu", len,
                    (unsigned long long)want);
    if (len > MAX_FILE_BYTES) return fail(err, err_len, "larger than 2 GiB");
    /* floats copied into an aligned block: the file's offsets need not be 4-byte aligned */
    size_t body = (size_t)(floats + (uint64_t)c.vocab) * 4;
    uint8_t *mem = malloc(body + prompt_len + desc_len + 1);
    if (!mem) return fail(err, err_len, "no memory for %zu bytes of weights", body);
    const uint8_t *q = p + HEADER_BYTES;
    char *desc = (char *)mem + body + prompt_len;
    memcpy(desc, q, desc_len);
    desc[desc_len] = 0;
    q += desc_len;
    memcpy(mem, q, (size_t)floats * 4);
    q += floats * 4;
    memcpy(mem + body, q, prompt_len);
    q += prompt_len;
    memcpy(mem + floats * 4, q, (size_t)c.vocab * 4);
    const float *w = (const float *)(void *)mem;
    for (uint64_t i = 0; i < floats + (uint64_t)c.vocab; i++) {
        float x = w[i];
        if (x != x || x > 1e30f || x < -1e30f) {
            free(mem);
            return fail(err, err_len, "weight %llu is not a finite number", (unsigned long long)i);
        }
    }
    for (uint32_t i = 0; i < prompt_len; i++) {
        if (mem[body + i] >= (uint32_t)c.vocab) {
            free(mem);
            return fail(err, err_len, "reference prompt token %u outside the vocabulary", i);
        }
    }
    c.weights_id = sum ? sum : 1;
    out->config = c;
    out->floats = w;
    out->ref_logits = w + floats;
    out->prompt = mem + body;
    out->prompt_len = prompt_len;
    out->desc = desc;
    out->mem = mem;
    out->mem_len = body + prompt_len + desc_len + 1;
    return 0;
}

/* The whole of path, at most max bytes, into *buf (malloc'd; the caller frees it). */
static int read_whole(const char *path, size_t max, uint8_t **buf, size_t *len, char *err,
                      size_t err_len) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, err_len, "cannot open %s: %s", path, strerror(errno));
    uint8_t *b = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            uint8_t *nb = cap > max ? NULL : realloc(b, ncap);
            if (!nb) {
                fclose(f);
                free(b);
                return cap > max ? fail(err, err_len, "%s: larger than %zu MiB", path, max >> 20)
                                 : fail(err, err_len, "%s: no memory to read it", path);
            }
            b = nb;
            cap = ncap;
        }
        size_t k = fread(b + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    int bad = ferror(f), e = errno;
    fclose(f);
    if (bad || n > max) {
        free(b);
        return bad ? fail(err, err_len, "cannot read %s: %s", path, strerror(e))
                   : fail(err, err_len, "%s: larger than %zu MiB", path, max >> 20);
    }
    *buf = b;
    *len = n;
    return 0;
}

int weights_load(const char *path, weights_file *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    uint8_t *buf;
    size_t len;
    if (read_whole(path, (size_t)MAX_FILE_BYTES, &buf, &len, err, err_len) != 0) return -1;
    char why[384];
    int rc = weights_parse(buf, len, out, why, sizeof why);
    free(buf);
    if (rc != 0) return fail(err, err_len, "%s: %s", path, why);
    return 0;
}

void weights_free(weights_file *w) {
    free(w->mem);
    memset(w, 0, sizeof *w);
}

const char *weights_default_file(const char *name, char *buf, size_t len) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, len, "%s/../share/kvstrata/%s", exe, name);
            if (access(buf, R_OK) == 0) return buf;
        }
    }
#ifdef MINI_MODEL_DIR
    snprintf(buf, len, "%s/train/%s", MINI_MODEL_DIR, name);
    if (access(buf, R_OK) == 0) return buf;
#endif
    return NULL;
}

int weights_prompt_logits(const model *m, const int32_t *tokens, int n, int first, float *out,
                          char *err, size_t err_len) {
    const model_config *c = model_config_of(m);
    if (n <= 0 || first < 0 || first >= n) {
        fail(err, err_len, "no positions to compute (%d tokens, from %d)", n, first);
        return -1;
    }
    uint32_t blocks = ((uint32_t)n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    kvcache_params kp = {.layout = KV_LAYOUT_NHD,
                         .dtype = KVS_DTYPE_FP32,
                         .n_layers = (uint32_t)c->n_layers,
                         .n_heads = model_cache_heads(m),
                         .head_dim = model_cache_width(m),
                         .n_blocks = blocks,
                         .block_budget = blocks};
    char why[256] = "";
    kvcache *kv = kvcache_create(&kp, why, sizeof why);
    model_scratch *s = model_scratch_create(m, n, n);
    uint32_t *table = calloc(blocks, sizeof *table);
    int rc = -1;
    if (!kv || !s || !table || kvcache_alloc(kv, blocks, table) != 0) {
        fail(err, err_len, "no memory to run a prompt of %d tokens %s", n, why);
        goto out;
    }
    model_embed(m, s, tokens, n);
    for (uint32_t l = 0; l < (uint32_t)c->n_layers; l++) model_layer(m, s, kv, l, table, 0, n);
    for (int i = first; i < n; i++)
        model_logits(m, s, i, out + (size_t)(i - first) * (size_t)c->vocab);
    rc = 0;
out:
    free(table);
    model_scratch_free(s);
    kvcache_destroy(kv);
    return rc;
}

int weights_check(const weights_file *w, const model *m, float *max_diff, char *err,
                  size_t err_len) {
    const model_config *c = model_config_of(m);
    uint32_t n = w->prompt_len;
    int32_t *tokens = malloc(n * sizeof *tokens);
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    int rc = -1;
    if (!tokens || !logits) {
        fail(err, err_len, "no memory to run the reference prompt");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) tokens[i] = w->prompt[i];
    if (weights_prompt_logits(m, tokens, (int)n, (int)n - 1, logits, err, err_len) != 0) goto out;
    float worst = 0.0f, scale = 1.0f;
    for (int i = 0; i < c->vocab; i++) {
        float d = logits[i] - w->ref_logits[i], r = w->ref_logits[i];
        if (d < 0) d = -d;
        if (r < 0) r = -r;
        if (d > worst || d != d) worst = d != d ? 1e30f : d;
        if (r > scale) scale = r;
    }
    *max_diff = worst;
    if (worst > 1e-3f * scale) {
        fail(err, err_len,
             "this engine computes other logits than the trainer for the file's reference prompt "
             "(largest difference %g, allowed %g): not the model it was trained as",
             (double)worst, (double)(1e-3f * scale));
        goto out;
    }
    rc = 0;
out:
    free(logits);
    free(tokens);
    return rc;
}

int text_load(const char *path, int vocab, uint8_t **text, size_t *len, char *err, size_t err_len) {
    *text = NULL;
    *len = 0;
    if (vocab < 256)
        return fail(err, err_len, "byte tokens need a vocabulary of 256 (have %d)", vocab);
    uint8_t *buf;
    size_t n;
    if (read_whole(path, (size_t)64 << 20, &buf, &n, err, err_len) != 0) return -1;
    if (n == 0) {
        free(buf);
        return fail(err, err_len, "%s is empty", path);
    }
    *text = buf;
    *len = n;
    return 0;
}
