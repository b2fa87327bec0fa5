/* model.c - the transformer. Matrices are stored input-major ("transposed", w[in][out]) so a
 * matrix-vector product walks the inputs in order and adds each one into every output: the loops
 * vectorise over outputs while each output still sums its inputs in one fixed order. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct layer_weights {
    float *attn_norm; /* [dim] */
    float *ffn_norm;  /* [dim] */
    float *wq;        /* [dim][heads*hd] */
    float *wk, *wv;   /* [dim][kv_heads*hd]; GQA only */
    float *wdkv;      /* [dim][latent]; MLA only: the cached latent */
    float *wuk, *wuv; /* [latent][heads*hd]; MLA only: per-head up-projections */
    float *wo;        /* [heads*hd][dim] */
    float *w1, *w3;   /* [dim][ffn] gate and up */
    float *w2;        /* [ffn][dim] down */
} layer_weights;

struct model {
    model_config c;
    int head_dim;
    float *embed;      /* [vocab][dim] */
    float *final_norm; /* [dim] */
    float *wcls;       /* [dim][vocab] */
    layer_weights *layers;
    float *inv_freq;  /* [head_dim / 2] RoPE frequencies */
    float attn_scale; /* 1 / sqrt(head_dim) */
    float **allocs;   /* every weight array, for model_free */
    int n_allocs;
};

struct model_scratch {
    int max_step, max_context;
    int att_heads;          /* heads of the gathered context: kv_heads (GQA) or heads (MLA) */
    float *x;               /* [max_step][dim] hidden states */
    float *q;               /* [max_step][heads*hd] */
    float *xn;              /* [dim] */
    float *proj;            /* [max(heads*hd, latent, dim)] */
    float *proj2;           /* same */
    float *att;             /* [heads*hd] */
    float *hb, *hb2;        /* [ffn] */
    float *kt;              /* [att_heads][hd][max_context]: K of the context, transposed */
    float *vc;              /* [att_heads][max_context][hd]: V of the context */
    float *scores;          /* [max_context] */
    const uint8_t *dropped; /* [max_context] or NULL: positions attention leaves out */
};

/* Seeded weights ---------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1) from the top 24 bits. */
static float uniform_pm1(uint64_t *state) {
    return (float)(splitmix64(state) >> 40) * 0x1p-23f - 1.0f;
}

/* Where the weights come from: a seeded generator, or trained arrays read in model order. */
typedef struct weight_source {
    uint64_t rng;
    const float *trained; /* NULL: generated */
} weight_source;

static float *weights(model *m, weight_source *src, size_t n, float scale, float offset) {
    float *w = malloc(n * sizeof *w);
    if (!w) return NULL;
    m->allocs[m->n_allocs++] = w;
    if (src->trained) {
        memcpy(w, src->trained, n * sizeof *w);
        src->trained += n;
        return w;
    }
    for (size_t i = 0; i < n; i++) w[i] = offset + scale * uniform_pm1(&src->rng);
    return w;
}

uint64_t model_weights_floats(const model_config *c) {
    uint64_t dim = (uint64_t)c->dim, hd = dim / (uint64_t)c->n_heads;
    uint64_t qw = (uint64_t)c->n_heads * hd, kvw = (uint64_t)c->n_kv_heads * hd;
    uint64_t ffn = (uint64_t)c->ffn;
    uint64_t layer = 2 * dim + dim * qw + 2 * dim * kvw + qw * dim + 3 * dim * ffn;
    return 2 * (uint64_t)c->vocab * dim + dim + (uint64_t)c->n_layers * layer;
}

int model_config_check(const model_config *c, char *err, size_t err_len) {
    const char *msg = NULL;
    if (c->dim < 2 || c->n_layers < 1 || c->n_heads < 1 || c->ffn < 1 || c->vocab < 2)
        msg = "--dim, --layers, --heads, --ffn must be positive and --vocab at least 2";
    else if (c->dim % c->n_heads != 0)
        msg = "--dim must be a multiple of --heads";
    else if ((c->dim / c->n_heads) % 2 != 0)
        msg = "head_dim (--dim / --heads) must be even for RoPE";
    else if (!c->is_mla && (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads != 0))
        msg = "--heads must be a multiple of --kv-heads";
    else if (c->is_mla && c->latent < 1)
        msg = "--latent must be positive";
    else if ((int64_t)c->dim * c->vocab > (1 << 28) || (int64_t)c->dim * c->ffn > (1 << 28))
        msg = "model too large for a mini engine";
    if (msg) {
        snprintf(err, err_len, "%s", msg);
        return -1;
    }
    return 0;
}

static model *create(const model_config *c, const float *trained) {
    model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->c = *c;
    int dim = c->dim, hd = c->dim / c->n_heads, qw = c->n_heads * hd;
    int kvw = c->n_kv_heads * hd;
    m->head_dim = hd;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->allocs = calloc((size_t)(4 + 12 * c->n_layers), sizeof *m->allocs);
    m->inv_freq = malloc((size_t)(hd / 2) * sizeof *m->inv_freq);
    if (!m->layers || !m->allocs || !m->inv_freq) goto fail;
    for (int i = 0; i < hd / 2; i++) m->inv_freq[i] = (float)pow(10000.0, -2.0 * i / hd);
    m->attn_scale = 1.0f / sqrtf((float)hd);

    weight_source src = {.rng = c->seed ^ 0x6d696e69656e67ull /* "miniengine" */,
                         .trained = trained};
    float s_dim = 1.0f / sqrtf((float)dim);
    m->embed = weights(m, &src, (size_t)c->vocab * dim, 1.0f, 0.0f);
    m->final_norm = weights(m, &src, (size_t)dim, 0.1f, 1.0f);
    m->wcls = weights(m, &src, (size_t)dim * c->vocab, s_dim, 0.0f);
    if (!m->embed || !m->final_norm || !m->wcls) goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        layer_weights *w = &m->layers[l];
        w->attn_norm = weights(m, &src, (size_t)dim, 0.1f, 1.0f);
        w->ffn_norm = weights(m, &src, (size_t)dim, 0.1f, 1.0f);
        w->wq = weights(m, &src, (size_t)dim * qw, s_dim, 0.0f);
        if (c->is_mla) {
            float s_lat = 1.0f / sqrtf((float)c->latent);
            w->wdkv = weights(m, &src, (size_t)dim * c->latent, s_dim, 0.0f);
            w->wuk = weights(m, &src, (size_t)c->latent * qw, s_lat, 0.0f);
            w->wuv = weights(m, &src, (size_t)c->latent * qw, s_lat, 0.0f);
            if (!w->wdkv || !w->wuk || !w->wuv) goto fail;
        } else {
            w->wk = weights(m, &src, (size_t)dim * kvw, s_dim, 0.0f);
            w->wv = weights(m, &src, (size_t)dim * kvw, s_dim, 0.0f);
            if (!w->wk || !w->wv) goto fail;
        }
        w->wo = weights(m, &src, (size_t)qw * dim, 1.0f / sqrtf((float)qw), 0.0f);
        w->w1 = weights(m, &src, (size_t)dim * c->ffn, s_dim, 0.0f);
        w->w3 = weights(m, &src, (size_t)dim * c->ffn, s_dim, 0.0f);
        w->w2 = weights(m, &src, (size_t)c->ffn * dim, 1.0f / sqrtf((float)c->ffn), 0.0f);
        if (!w->attn_norm || !w->ffn_norm || !w->wq || !w->wo || !w->w1 || !w->w3 || !w->w2)
            goto fail;
    }
    return m;
fail:
    model_free(m);
    return NULL;
}

model *model_create(const model_config *c) {
    return create(c, NULL);
}

model *model_create_trained(const model_config *c, const float *trained) {
    if (c->is_mla || !trained) return NULL;
    return create(c, trained);
}

void model_free(model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_allocs; i++) free(m->allocs[i]);
    free(m->allocs);
    free(m->layers);
    free(m->inv_freq);
    free(m);
}

const model_config *model_config_of(const model *m) {
    return &m->c;
}

int model_head_dim(const model *m) {
    return m->head_dim;
}

uint32_t model_cache_heads(const model *m) {
    return m->c.is_mla ? 1u : (uint32_t)m->c.n_kv_heads;
}

uint32_t model_cache_width(const model *m) {
    return (uint32_t)(m->c.is_mla ? m->c.latent : m->head_dim);
}

/* Scratch ----------------------------------------------------------------------------------------- */

model_scratch *model_scratch_create(const model *m, int max_step_tokens, int max_context) {
    const model_config *c = &m->c;
    int hd = m->head_dim, qw = c->n_heads * hd;
    int wide = qw > c->dim ? qw : c->dim;
    if (c->is_mla && c->latent > wide) wide = c->latent;
    if (!c->is_mla && c->n_kv_heads * hd > wide) wide = c->n_kv_heads * hd;
    model_scratch *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->max_step = max_step_tokens;
    s->max_context = max_context;
    s->att_heads = c->is_mla ? c->n_heads : c->n_kv_heads;
    size_t ctx = (size_t)max_context;
    s->x = calloc((size_t)max_step_tokens * c->dim, sizeof(float));
    s->q = calloc((size_t)max_step_tokens * qw, sizeof(float));
    s->xn = calloc((size_t)c->dim, sizeof(float));
    s->proj = calloc((size_t)wide, sizeof(float));
    s->proj2 = calloc((size_t)wide, sizeof(float));
    s->att = calloc((size_t)qw, sizeof(float));
    s->hb = calloc((size_t)c->ffn, sizeof(float));
    s->hb2 = calloc((size_t)c->ffn, sizeof(float));
    s->kt = calloc((size_t)s->att_heads * hd * ctx, sizeof(float));
    s->vc = calloc((size_t)s->att_heads * hd * ctx, sizeof(float));
    s->scores = calloc(ctx, sizeof(float));
    if (!s->x || !s->q || !s->xn || !s->proj || !s->proj2 || !s->att || !s->hb || !s->hb2 ||
        !s->kt || !s->vc || !s->scores) {
        model_scratch_free(s);
        return NULL;
    }
    return s;
}

void model_scratch_free(model_scratch *s) {
    if (!s) return;
    free(s->x);
    free(s->q);
    free(s->xn);
    free(s->proj);
    free(s->proj2);
    free(s->att);
    free(s->hb);
    free(s->hb2);
    free(s->kt);
    free(s->vc);
    free(s->scores);
    free(s);
}

float *model_scratch_hidden(model_scratch *s) {
    return s->x;
}

void model_scratch_drop(model_scratch *s, const uint8_t *dropped) {
    s->dropped = dropped;
}

/* Building blocks ---------------------------------------------------------------------------------- */

/* Four floats as one value: GCC and Clang map it to one SSE/NEON register. Each lane is a plain
 * IEEE multiply and add (no fused multiply-add: -ffp-contract=off), so a lane computes exactly what
 * the scalar loop would. */
typedef float f32x4 __attribute__((vector_size(16)));

static f32x4 load4(const float *p) {
    f32x4 v;
    memcpy(&v, p, sizeof v); /* rows need not be 16-byte aligned */
    return v;
}

/* out[i] = sum over j of x[j] * w[j * stride + i], for i < n_out, j < n_in, the sum taken in order
 * j = 0, 1, ... for every output. Outputs go 32 (then 4, then 1) at a time with the partial sums
 * held in registers. */
static void matvec_strided(float *restrict out, const float *restrict x, const float *restrict w,
                           int n_in, int n_out, size_t stride) {
    int i = 0;
    for (; i + 32 <= n_out; i += 32) {
        f32x4 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
        const float *col = w + i;
        for (int j = 0; j < n_in; j++, col += stride) {
            const f32x4 xj = {x[j], x[j], x[j], x[j]};
            a0 += load4(col) * xj;
            a1 += load4(col + 4) * xj;
            a2 += load4(col + 8) * xj;
            a3 += load4(col + 12) * xj;
            a4 += load4(col + 16) * xj;
            a5 += load4(col + 20) * xj;
            a6 += load4(col + 24) * xj;
            a7 += load4(col + 28) * xj;
        }
        const f32x4 sums[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
        memcpy(out + i, sums, sizeof sums);
    }
    for (; i + 4 <= n_out; i += 4) {
        f32x4 a = {0};
        const float *col = w + i;
        for (int j = 0; j < n_in; j++, col += stride) {
            const f32x4 xj = {x[j], x[j], x[j], x[j]};
            a += load4(col) * xj;
        }
        memcpy(out + i, &a, sizeof a);
    }
    for (; i < n_out; i++) {
        float a = 0.0f;
        for (int j = 0; j < n_in; j++) a += w[(size_t)j * stride + (size_t)i] * x[j];
        out[i] = a;
    }
}

/* out[0..n_out) = x[0..n_in) . w, with w stored [n_in][n_out]. */
static void matvec(float *restrict out, const float *restrict x, const float *restrict w, int n_in,
                   int n_out) {
    matvec_strided(out, x, w, n_in, n_out, (size_t)n_out);
}

static void rmsnorm(float *out, const float *x, const float *weight, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + 1e-5f);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * weight[i];
}

/* Rotate consecutive pairs of one head by the angles of position pos. */
static void rope(const model *m, float *head, uint64_t pos) {
    for (int i = 0; i < m->head_dim / 2; i++) {
        float angle = (float)pos * m->inv_freq[i];
        float c = cosf(angle), s = sinf(angle);
        float a = head[2 * i], b = head[2 * i + 1];
        head[2 * i] = a * c - b * s;
        head[2 * i + 1] = a * s + b * c;
    }
}

void model_embed(const model *m, model_scratch *s, const int32_t *tokens, int n) {
    int dim = m->c.dim;
    for (int t = 0; t < n; t++)
        memcpy(s->x + (size_t)t * dim, m->embed + (size_t)tokens[t] * dim,
               (size_t)dim * sizeof(float));
}

/* Read the K/V of positions [0, end) of this layer from the pages into kt / vc. For MLA the cached
 * latent is up-projected per head and RoPE is applied to the resulting K, as the attention sees it. */
static void gather_context(const model *m, model_scratch *s, const kvcache *kv, uint32_t layer,
                           const uint32_t *block_table, uint64_t end) {
    const int hd = m->head_dim;
    const size_t ctx = (size_t)s->max_context;
    if (m->c.is_mla) {
        const layer_weights *w = &m->layers[layer];
        const int qw = m->c.n_heads * hd;
        for (uint64_t p = 0; p < end; p++) {
            if (s->dropped && s->dropped[p]) { /* never read (below) */
                for (int h = 0; h < m->c.n_heads; h++) {
                    for (int d = 0; d < hd; d++) s->kt[((size_t)h * hd + d) * ctx + p] = 0.0f;
                    memset(s->vc + ((size_t)h * ctx + p) * hd, 0, (size_t)hd * sizeof(float));
                }
                continue;
            }
            kvcache_read(kv, layer, KV_K, block_table, p, 0, s->proj2); /* the latent */
            matvec(s->proj, s->proj2, w->wuk, m->c.latent, qw);
            for (int h = 0; h < m->c.n_heads; h++) {
                float *k = s->proj + h * hd;
                rope(m, k, p);
                for (int d = 0; d < hd; d++) s->kt[((size_t)h * hd + d) * ctx + p] = k[d];
            }
            float *v_all = s->proj;
            matvec(v_all, s->proj2, w->wuv, m->c.latent, qw);
            for (int h = 0; h < m->c.n_heads; h++)
                memcpy(s->vc + ((size_t)h * ctx + p) * hd, v_all + h * hd,
                       (size_t)hd * sizeof(float));
        }
        return;
    }
    for (uint64_t p = 0; p < end; p++) {
        for (int g = 0; g < m->c.n_kv_heads; g++) {
            float *v = s->vc + ((size_t)g * ctx + p) * hd;
            if (s->dropped && s->dropped[p]) {
                /* never read: pages of dropped KV may hold anything, even NaN, and 0 * NaN is NaN
                 * (its score is set to -inf in attend, so its K is not used either) */
                for (int d = 0; d < hd; d++) s->kt[((size_t)g * hd + d) * ctx + p] = 0.0f;
                memset(v, 0, (size_t)hd * sizeof *v);
                continue;
            }
            kvcache_read(kv, layer, KV_K, block_table, p, (uint32_t)g, s->proj);
            for (int d = 0; d < hd; d++) s->kt[((size_t)g * hd + d) * ctx + p] = s->proj[d];
            kvcache_read(kv, layer, KV_V, block_table, p, (uint32_t)g, v);
        }
    }
}

/* Causal attention of one query head at position pos over context head g: out[hd]. The query
 * arrives already scaled by 1/sqrt(head_dim). */
static void attend(const model *m, model_scratch *s, const float *q, int g, uint64_t pos,
                   float *out) {
    const int hd = m->head_dim;
    const size_t ctx = (size_t)s->max_context;
    const size_t n = (size_t)pos + 1;
    float *sc = s->scores;
    /* scores = q . K over the context; K is stored transposed, [hd][context] */
    matvec_strided(sc, q, s->kt + (size_t)g * hd * ctx, hd, (int)n, ctx);
    if (s->dropped) /* dropped positions weigh nothing (the query's own is never dropped) */
        for (size_t p = 0; p + 1 < n; p++)
            if (s->dropped[p]) sc[p] = -INFINITY;
    /* The maximum is exact whatever the order, so four running maxima are as good as one. */
    float mx[4] = {sc[0], sc[0], sc[0], sc[0]};
    size_t p = 0;
    for (; p + 4 <= n; p += 4)
        for (int k = 0; k < 4; k++) mx[k] = sc[p + k] > mx[k] ? sc[p + k] : mx[k];
    for (; p < n; p++) mx[0] = sc[p] > mx[0] ? sc[p] : mx[0];
    const float max = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
    float sum = 0.0f;
    for (p = 0; p < n; p++) {
        sc[p] = expf(sc[p] - max);
        sum += sc[p];
    }
    /* out = exp-weights . V over the context (V is stored [context][hd]), then normalised */
    matvec_strided(out, sc, s->vc + (size_t)g * ctx * hd, (int)n, hd, (size_t)hd);
    const float inv = 1.0f / sum;
    for (int d = 0; d < hd; d++) out[d] *= inv;
}

void model_layer(const model *m, model_scratch *s, const kvcache *kv, uint32_t layer,
                 const uint32_t *block_table, uint64_t pos0, int n) {
    const model_config *c = &m->c;
    const layer_weights *w = &m->layers[layer];
    const int dim = c->dim, hd = m->head_dim, qw = c->n_heads * hd;

    /* 1. Queries, and the step's K/V (or latent) into the pages. */
    for (int t = 0; t < n; t++) {
        const uint64_t pos = pos0 + (uint64_t)t;
        float *q = s->q + (size_t)t * qw;
        /* the query (and for GQA the K and V) as a decode token's; s->xn keeps the normed input */
        model_token_qkv(m, s, layer, s->x + (size_t)t * dim, pos, q, c->is_mla ? NULL : s->proj,
                        s->proj2);
        if (c->is_mla) {
            matvec(s->proj, s->xn, w->wdkv, dim, c->latent);
            kvcache_write(kv, layer, KV_K, block_table, pos, 0, s->proj);
            continue;
        }
        for (int g = 0; g < c->n_kv_heads; g++) {
            kvcache_write(kv, layer, KV_K, block_table, pos, (uint32_t)g, s->proj + g * hd);
            kvcache_write(kv, layer, KV_V, block_table, pos, (uint32_t)g, s->proj2 + g * hd);
        }
    }

    /* 2. The whole context, read back from the pages: computed and restored pages look alike. */
    gather_context(m, s, kv, layer, block_table, pos0 + (uint64_t)n);

    /* 3. Attention, output projection and SwiGLU feed-forward, token by token. */
    const int group = c->is_mla ? 1 : c->n_heads / c->n_kv_heads;
    for (int t = 0; t < n; t++) {
        const uint64_t pos = pos0 + (uint64_t)t;
        float *x = s->x + (size_t)t * dim;
        const float *q = s->q + (size_t)t * qw;
        for (int h = 0; h < c->n_heads; h++)
            attend(m, s, q + h * hd, h / group, pos, s->att + h * hd);
        model_token_finish(m, s, layer, x, s->att);
    }
}

/* One token, GQA: the pieces of model_layer with the attention left to the caller ------------------ */

void model_token_qkv(const model *m, model_scratch *s, uint32_t layer, const float *x, uint64_t pos,
                     float *q, float *k, float *v) {
    const model_config *c = &m->c;
    const layer_weights *w = &m->layers[layer];
    const int hd = m->head_dim, qw = c->n_heads * hd;
    rmsnorm(s->xn, x, w->attn_norm, c->dim);
    matvec(q, s->xn, w->wq, c->dim, qw);
    for (int h = 0; h < c->n_heads; h++) rope(m, q + h * hd, pos);
    for (int i = 0; i < qw; i++) q[i] *= m->attn_scale;
    if (!k) return;
    matvec(k, s->xn, w->wk, c->dim, c->n_kv_heads * hd);
    matvec(v, s->xn, w->wv, c->dim, c->n_kv_heads * hd);
    for (int g = 0; g < c->n_kv_heads; g++) rope(m, k + g * hd, pos);
}

void model_token_finish(const model *m, model_scratch *s, uint32_t layer, float *x,
                        const float *att) {
    const model_config *c = &m->c;
    const layer_weights *w = &m->layers[layer];
    const int dim = c->dim, qw = c->n_heads * m->head_dim;
    matvec(s->proj, att, w->wo, qw, dim);
    for (int i = 0; i < dim; i++) x[i] += s->proj[i];
    rmsnorm(s->xn, x, w->ffn_norm, dim);
    matvec(s->hb, s->xn, w->w1, dim, c->ffn);
    matvec(s->hb2, s->xn, w->w3, dim, c->ffn);
    for (int i = 0; i < c->ffn; i++) {
        float g = s->hb[i];
        s->hb[i] = g / (1.0f + expf(-g)) * s->hb2[i];
    }
    matvec(s->proj, s->hb, w->w2, c->ffn, dim);
    for (int i = 0; i < dim; i++) x[i] += s->proj[i];
}

void model_logits_of(const model *m, model_scratch *s, const float *x, float *logits) {
    rmsnorm(s->xn, x, m->final_norm, m->c.dim);
    matvec(logits, s->xn, m->wcls, m->c.dim, m->c.vocab);
}

const float *model_embedding(const model *m, int32_t token) {
    return m->embed + (size_t)token * m->c.dim;
}

void model_logits(const model *m, model_scratch *s, int index, float *logits) {
    rmsnorm(s->xn, s->x + (size_t)index * m->c.dim, m->final_norm, m->c.dim);
    matvec(logits, s->xn, m->wcls, m->c.dim, m->c.vocab);
}

int32_t model_argmax(const float *logits, int vocab) {
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}
