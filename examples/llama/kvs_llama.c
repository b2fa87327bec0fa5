/* kvs_llama.c - kvs-llama: kvstrata as llama.cpp's prompt cache, over llama.h and the store API
 * (abi/kvstrata_store.h). Multi-turn sessions share a system prompt; each turn is a new request:
 *
 *   before it   the longest stored prefix at a chunk boundary is looked up (one chained key per
 *               boundary), its sequence state put back with llama_state_seq_set_data_ext, the
 *               positions past the boundary removed, and only the rest of the prompt computed;
 *   after it    the sequence's state up to its last full chunk is taken (copied to a scratch
 *               sequence, cut at the boundary) and put, unless that key is stored; so is the
 *               state at the system prompt's last boundary, the first time a session crosses it.
 *
 * Tokens are bytes (the mini model's GGUF). The store's namespace carries a hash of the GGUF file,
 * the chunk size and the state format, so another model's states are never found. Each value is
 * the state followed by a probe: the logits the saving process computed for the next token on the
 * state it saved, from which --verify checks that a restored state computes the same logits bit for
 * bit, and against a full recompute within llama.cpp's batching tolerance.
 *
 * Exit status: 0 done (and verified with --verify), 1 a verification failed, 2 could not run. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <ggml-backend.h>
#include <llama.h>

#include <kvstrata/kvstrata_store.h>

#define PROG "kvs-llama"

#ifndef KVS_LLAMA_BACKEND_DIR
#define KVS_LLAMA_BACKEND_DIR ""
#endif
#ifndef KVS_LLAMA_TEXT
#define KVS_LLAMA_TEXT ""
#endif
#ifndef KVS_LLAMA_RELEASE
#define KVS_LLAMA_RELEASE "unknown"
#endif

/* The probe after each state: its own magic, so a value that is not ours is a miss. */
static const char probe_magic[16] = "kvs-llama-probe1";
typedef struct probe_trailer {
    uint64_t state_len;
    uint32_t token, vocab;
    char magic[16];
} probe_trailer;

typedef struct options {
    const char *gguf, *config, *text, *backend_dir, *tenant, *linger_file;
    int sessions, session_base, turns, system, doc, user, gen, chunk, threads, max_context;
    unsigned seed;
    int verify, probe, no_store, json, quiet, store_truncated;
    double tolerance;
} options;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: " PROG " --gguf FILE [options]\n"
        "  --config YAML     kvstrata tiers (docs/configuration.md; default one 1 GiB DRAM tier)\n"
        "  --no-store        llama.cpp alone: every turn computes its whole prompt\n"
        "  --sessions N      sessions (default 2), numbered from --session-base (default 0)\n"
        "  --turns N         user turns per session (default 3)\n"
        "  --system N        tokens of the shared system prompt (default 300)\n"
        "  --doc N           tokens of each session's document (default 400)\n"
        "  --user N          tokens of each user turn (default 48)\n"
        "  --gen N           tokens the model generates per turn, greedy (default 4)\n"
        "  --chunk N         tokens per chunk: states are stored at multiples of N (default 64)\n"
        "  --max-context N   the context and the largest state stored (default: what the session\n"
        "                    shape needs); processes sharing a DRAM tier pass the same N\n"
        "  --seed N          which documents and user turns (default 1)\n"
        "  --verify          check every restored state: bit for bit against the saver's logits,\n"
        "                    and against a full recompute within --tolerance (default 1e-4,\n"
        "                    relative to the largest |logit|)\n"
        "  --probe           store each state with its probe (the saver's logits for the next "
        "token),\n"
        "                    which --verify compares bit for bit; --verify implies it\n"
        "  --json            one JSON line per turn (llama_turn) and one summary line\n"
        "  --threads N       llama.cpp's threads (default 1)\n"
        "  --text FILE       bytes the prompts are taken from (default the mini model's sample)\n"
        "  --tenant NAME     the store's tenant (default none)\n"
        "  --linger-until FILE  after the run keep the store open until FILE exists (at most\n"
        "                    120 s), so a shared DRAM tier outlives this process for another\n"
        "  --test-store-truncated  store states cut short (a test: llama.cpp must refuse them)\n"
        "  --backend-dir DIR where llama.cpp's backend modules are (default: the build's)\n"
        "  --quiet           only the summary\n");
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
    *o = (options){.sessions = 2,
                   .turns = 3,
                   .system = 300,
                   .doc = 400,
                   .user = 48,
                   .gen = 4,
                   .chunk = 64,
                   .threads = 1,
                   .seed = 1,
                   .tolerance = 1e-4,
                   .text = KVS_LLAMA_TEXT,
                   .backend_dir = KVS_LLAMA_BACKEND_DIR};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, seed = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--verify")) {
            o->verify = o->probe = 1;
            continue;
        } else if (!strcmp(a, "--probe")) {
            o->probe = 1;
            continue;
        } else if (!strcmp(a, "--no-store")) {
            o->no_store = 1;
            continue;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        } else if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        } else if (!strcmp(a, "--test-store-truncated")) {
            o->store_truncated = 1;
            continue;
        } else if (!v) {
            bad = 1;
        } else if (!strcmp(a, "--gguf")) {
            o->gguf = v;
        } else if (!strcmp(a, "--config")) {
            o->config = v;
        } else if (!strcmp(a, "--text")) {
            o->text = v;
        } else if (!strcmp(a, "--tenant")) {
            o->tenant = v;
        } else if (!strcmp(a, "--linger-until")) {
            o->linger_file = v;
        } else if (!strcmp(a, "--backend-dir")) {
            o->backend_dir = v;
        } else if (!strcmp(a, "--sessions")) {
            bad = parse_int(v, 1, 100000, &o->sessions);
        } else if (!strcmp(a, "--session-base")) {
            bad = parse_int(v, 0, 1 << 30, &o->session_base);
        } else if (!strcmp(a, "--turns")) {
            bad = parse_int(v, 1, 1000, &o->turns);
        } else if (!strcmp(a, "--system")) {
            bad = parse_int(v, 0, 1 << 20, &o->system);
        } else if (!strcmp(a, "--doc")) {
            bad = parse_int(v, 0, 1 << 20, &o->doc);
        } else if (!strcmp(a, "--user")) {
            bad = parse_int(v, 1, 1 << 20, &o->user);
        } else if (!strcmp(a, "--gen")) {
            bad = parse_int(v, 1, 4096, &o->gen);
        } else if (!strcmp(a, "--max-context")) {
            bad = parse_int(v, 1, 1 << 20, &o->max_context);
        } else if (!strcmp(a, "--chunk")) {
            bad = parse_int(v, 1, 1 << 20, &o->chunk);
        } else if (!strcmp(a, "--threads")) {
            bad = parse_int(v, 1, 256, &o->threads);
        } else if (!strcmp(a, "--seed")) {
            bad = parse_int(v, 0, 1 << 30, &seed);
            o->seed = (unsigned)seed;
        } else if (!strcmp(a, "--tolerance")) {
            char *end;
            o->tolerance = strtod(v, &end);
            bad = *end || end == v || !(o->tolerance >= 0);
        } else {
            fprintf(stderr, PROG ": unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, PROG ": %s needs a valid value\n", a);
            return -1;
        }
        i++;
    }
    if (!o->gguf) {
        fprintf(stderr, PROG ": --gguf FILE is needed\n");
        usage(stderr);
        return -1;
    }
    return 0;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

/* A 128-bit hash of our own (two 64-bit lanes of multiply-xorshift over 8-byte words): the chunk
 * chain and the GGUF's fingerprint. Not cryptographic; a collision needs an accident of 2^-64. */
typedef struct h128 {
    uint64_t a, b;
} h128;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    x ^= x >> 33;
    return x;
}

static void h128_update(h128 *h, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        uint64_t w = 0;
        size_t n = len < 8 ? len : 8;
        memcpy(&w, p, n);
        w ^= (uint64_t)n << 59; /* a short tail differs from the same bytes zero-padded */
        h->a = mix64(h->a ^ w) + 0x9e3779b97f4a7c15ull;
        h->b = mix64(h->b + w * 0xc2b2ae3d27d4eb4full) ^ h->a;
        p += n;
        len -= n;
    }
}

static h128 h128_seed(uint64_t s) {
    return (h128){.a = mix64(s ^ 0x243f6a8885a308d3ull), .b = mix64(s ^ 0x13198a2e03707344ull)};
}

/* The GGUF's fingerprint: its bytes' hash and length. 0, or -1 when it cannot be read. */
static int file_hash(const char *path, h128 *out, uint64_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static uint8_t buf[1 << 20];
    h128 h = h128_seed(0x6767756621ull);
    uint64_t total = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        h128_update(&h, buf, n);
        total += n;
    }
    int bad = ferror(f);
    fclose(f);
    *out = h;
    *len = total;
    return bad ? -1 : 0;
}

/* Key of the state of the first k chunks: the chained hash up to chunk k and k * chunk. */
enum { KEY_BYTES = 20 };
static void chunk_key(const h128 *chain, uint32_t tokens, uint8_t key[KEY_BYTES]) {
    memcpy(key, &chain->a, 8);
    memcpy(key + 8, &chain->b, 8);
    memcpy(key + 16, &tokens, 4);
}

/* chain[k - 1] for k = 1..n_chunks over tokens[0 .. n_chunks * chunk). */
static void chain_hashes(const int32_t *tokens, int n_chunks, int chunk, h128 *chain) {
    h128 h = h128_seed(0x6b76732d6c6c616dull);
    for (int k = 0; k < n_chunks; k++) {
        h128_update(&h, tokens + (size_t)k * (size_t)chunk, (size_t)chunk * sizeof *tokens);
        h.a = mix64(h.a ^ (uint64_t)(k + 1));
        chain[k] = h;
    }
}

/* Everything a run holds. */
typedef struct run {
    options o;
    struct llama_model *model;
    struct llama_context *ctx, *vctx; /* vctx: --verify's context */
    llama_memory_t mem, vmem;
    int vocab, n_ctx;
    const kvs_store_api *S;
    kvs_store *store;
    uint64_t max_value;
    uint8_t *buf;     /* one value: state + probe */
    float *first;     /* the turn's first-token logits */
    int32_t *history; /* the session's tokens */
    h128 *chain;
    const uint8_t *text;
    size_t text_len;
    /* totals */
    int turns_done, turns_restored, restored_tokens, computed_tokens, refused, store_failures;
    int saves, saves_skipped, verified, no_probe, bitwise_equal, bitwise_differ, full_ok, full_bad;
    double max_rel_restored, max_rel_fresh, ttft_later_ms, save_ms, turn_ms;
    int later_turns, store_stuck;
    char err[512];
} run;

static int decode(struct llama_context *ctx, const int32_t *tokens, int n, int pos0,
                  llama_seq_id seq, int want_last, char *err, size_t err_len) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    b.n_tokens = n;
    for (int i = 0; i < n; i++) {
        b.token[i] = tokens[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = seq;
        b.logits[i] = want_last && i == n - 1;
    }
    int32_t r = llama_decode(ctx, b);
    llama_batch_free(b);
    if (r != 0) snprintf(err, err_len, "llama_decode of %d tokens at %d returned %d", n, pos0, r);
    return r == 0 ? 0 : -1;
}

static int argmax(const float *l, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

/* Largest |a - b| relative to the largest |a|. */
static double rel_diff(const float *a, const float *b, int n) {
    double m = 0, top = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= m)) m = e;
        if (fabs((double)a[i]) > top) top = fabs((double)a[i]);
    }
    return top > 0 ? m / top : m;
}

/* One batch of one key; returns the key's status (and its result). */
static kvs_status store_one(run *r, uint32_t op, const uint8_t *key, void *buf, uint64_t len,
                            kvs_store_result *res) {
    uint64_t off[2] = {0, KEY_BYTES}, seg[2] = {0, 1}, ticket = 0;
    kvs_store_keys keys = {.data = key, .offsets = off, .n = 1};
    kvs_store_iov iov = {.base = buf, .len = len};
    kvs_store_sg sg = {.iov = &iov, .seg = seg};
    kvs_status st = r->S->submit(r->store, op, &keys, buf ? &sg : NULL, 0, &ticket);
    if (st != KVS_OK) return st;
    /* a tier across the network answers within its own timeout; this bounds the rest */
    st = r->S->wait(r->store, ticket, 60000, res, 1, NULL);
    if (st != KVS_OK) {
        /* the batch may still use buf: the store is not used again, buf not touched until close
         * (which waits for the batches in flight); every later turn computes its whole prompt */
        fprintf(stderr, PROG ": a store batch did not complete (status %d): the store is off\n",
                (int)st);
        r->store_stuck = 1;
        return st;
    }
    return (kvs_status)res->status;
}

/* The value's trailer, or NULL when the value is not a state and probe of this model. */
static const probe_trailer *value_trailer(const run *r, uint64_t len) {
    static probe_trailer t;
    if (len < sizeof t) return NULL;
    memcpy(&t, r->buf + len - sizeof t, sizeof t);
    uint64_t probe_bytes = (uint64_t)t.vocab * sizeof(float), body = len - sizeof t;
    /* the lengths are compared without a sum that could wrap: a value is untrusted bytes */
    if (memcmp(t.magic, probe_magic, sizeof t.magic) ||
        (t.vocab != 0 && t.vocab != (uint32_t)r->vocab) || body < probe_bytes || t.state_len == 0 ||
        t.state_len != body - probe_bytes)
        return NULL;
    return &t;
}

typedef struct turn_stats {
    int restored;
    const probe_trailer *trailer;
    uint64_t value_len;
} turn_stats;

/* Look up the longest stored prefix of prompt[0..n) (at most n - 1 tokens: the last one is
 * computed for its logits), restore it into sequence 0. Returns the tokens restored. */
static int restore(run *r, const int32_t *prompt, int n, turn_stats *ts) {
    int C = r->o.chunk, K = (n - 1) / C;
    ts->trailer = NULL;
    if (K <= 0 || !r->store || r->store_stuck) return 0;
    chain_hashes(prompt, K, C, r->chain);
    uint8_t *kb = malloc((size_t)K * KEY_BYTES);
    uint64_t *off = malloc((size_t)(K + 1) * sizeof *off);
    uint8_t *states = malloc((size_t)K);
    int restored = 0;
    if (!kb || !off || !states) goto done;
    off[0] = 0;
    for (int k = 0; k < K; k++) {
        chunk_key(&r->chain[k], (uint32_t)((k + 1) * C), kb + (size_t)k * KEY_BYTES);
        off[k + 1] = off[k] + KEY_BYTES;
    }
    kvs_store_keys keys = {.data = kb, .offsets = off, .n = (uint64_t)K};
    uint64_t lead = 0;
    /* only some boundaries hold a state (a turn saves its last one): ask for every key */
    if (r->S->exists(r->store, &keys, KVS_STORE_ALL, 0, states, &lead) != KVS_OK) {
        r->store_failures++;
        goto done;
    }
    for (int k = K; k >= 1 && !restored; k--) {
        if (states[k - 1] != KVS_STORE_PRESENT) continue;
        kvs_store_result res = {0};
        kvs_status st = store_one(r, KVS_STORE_OP_GET, kb + (size_t)(k - 1) * KEY_BYTES, r->buf,
                                  r->max_value, &res);
        if (st != KVS_OK) { /* a miss, a damaged object (removed by the store), a failed tier */
            if (st != KVS_ENOTFOUND) r->store_failures++;
            if (r->store_stuck) break;
            continue;
        }
        const probe_trailer *t = value_trailer(r, res.bytes);
        size_t got = t ? llama_state_seq_set_data_ext(r->ctx, r->buf, t->state_len, 0, 0) : 0;
        if (!t || got != t->state_len || llama_memory_seq_pos_min(r->mem, 0) != 0 ||
            llama_memory_seq_pos_max(r->mem, 0) != k * C - 1) {
            /* not a state of this model, or llama.cpp refused it (another layout, a truncated
             * state): recompute, and drop it so that a later turn saves a good one there */
            r->refused++;
            llama_memory_seq_rm(r->mem, 0, -1, -1);
            kvs_store_result gone = {0};
            (void)store_one(r, KVS_STORE_OP_REMOVE, kb + (size_t)(k - 1) * KEY_BYTES, NULL, 0,
                            &gone);
            continue;
        }
        llama_memory_seq_rm(r->mem, 0, k * C, -1);
        restored = k * C;
        ts->trailer = t;
        ts->value_len = res.bytes;
    }
done:
    free(kb);
    free(off);
    free(states);
    return restored;
}

/* Save sequence 0's state over positions [0, B) under its chain key, unless stored. 1 saved, 0
 * skipped, -1 failed (a sentence in r->err). */
static int save_state(run *r, const int32_t *tokens, int B) {
    int C = r->o.chunk;
    chain_hashes(tokens, B / C, C, r->chain);
    uint8_t key[KEY_BYTES];
    chunk_key(&r->chain[B / C - 1], (uint32_t)B, key);
    uint64_t off[2] = {0, KEY_BYTES}, lead = 0;
    kvs_store_keys keys = {.data = key, .offsets = off, .n = 1};
    if (r->S->exists(r->store, &keys, 0, 0, NULL, &lead) == KVS_OK && lead == 1) return 0;
    /* the scratch sequence shares sequence 0's cells; cut at B it is the state to store */
    llama_memory_seq_rm(r->mem, 1, -1, -1);
    llama_memory_seq_cp(r->mem, 0, 1, -1, -1);
    if (!llama_memory_seq_rm(r->mem, 1, B, -1)) {
        snprintf(r->err, sizeof r->err, "llama.cpp could not cut the scratch sequence at %d", B);
        return -1;
    }
    size_t size = llama_state_seq_get_size_ext(r->ctx, 1, 0);
    uint64_t probe_bytes = r->o.probe ? (uint64_t)r->vocab * sizeof(float) : 0;
    if (size == 0 || size + probe_bytes + sizeof(probe_trailer) > r->max_value) {
        snprintf(r->err, sizeof r->err, "a state of %zu bytes does not fit the store's %llu", size,
                 (unsigned long long)r->max_value);
        llama_memory_seq_rm(r->mem, 1, -1, -1);
        return -1;
    }
    size_t wrote = llama_state_seq_get_data_ext(r->ctx, r->buf, size, 1, 0);
    if (wrote != size) {
        snprintf(r->err, sizeof r->err, "llama.cpp wrote %zu of the state's %zu bytes", wrote,
                 size);
        llama_memory_seq_rm(r->mem, 1, -1, -1);
        return -1;
    }
    if (probe_bytes) {
        /* The probe: the next token's logits on the state just taken, what a restore must give
         * bit for bit. Sequence 0 past B goes first (the next turn restores from the store
         * anyway), so the probe lands in cell B over B cells, the layout of a restore into an
         * empty context. */
        llama_memory_seq_rm(r->mem, 0, B, -1);
        int rc = decode(r->ctx, tokens + B, 1, B, 1, 1, r->err, sizeof r->err);
        const float *l = rc == 0 ? llama_get_logits_ith(r->ctx, -1) : NULL;
        if (!l) {
            if (rc == 0) snprintf(r->err, sizeof r->err, "no probe logits for the state at %d", B);
            llama_memory_seq_rm(r->mem, 1, -1, -1);
            return -1;
        }
        memcpy(r->buf + size, l, probe_bytes);
    }
    llama_memory_seq_rm(r->mem, 1, -1, -1);
    probe_trailer t = {.state_len = size,
                       .token = (uint32_t)tokens[B],
                       .vocab = probe_bytes ? (uint32_t)r->vocab : 0};
    uint64_t len = size + probe_bytes;
    if (r->o.store_truncated) { /* a test of llama.cpp's refusal: the state cut in half */
        memmove(r->buf + size / 2, r->buf + size, probe_bytes);
        t.state_len = size / 2;
        len = t.state_len + probe_bytes;
    }
    memcpy(t.magic, probe_magic, sizeof t.magic);
    memcpy(r->buf + len, &t, sizeof t);
    len += sizeof t;
    kvs_store_result res = {0};
    kvs_status st = store_one(r, KVS_STORE_OP_PUT, key, r->buf, len, &res);
    if (st != KVS_OK) {
        snprintf(r->err, sizeof r->err, "put of the state at %d: status %d: %s", B, (int)st,
                 r->S->last_error(r->store));
        r->store_failures++;
        return -1;
    }
    return (res.flags & KVS_STORE_SKIPPED) ? 0 : 1;
}

/* --verify of a restored turn: (1) the stored state in a fresh context computes the saver's probe
 * logits bit for bit (same layout: B cells, then one token at B); (2) the whole prompt computed
 * from scratch gives the turn's first-token logits within the tolerance. */
static int verify_turn(run *r, const int32_t *prompt, int n, const turn_stats *ts) {
    const probe_trailer *t = ts->trailer;
    int bad = 0, B = ts->restored;
    if (t && t->vocab == 0) {
        r->no_probe++;
    } else if (t) {
        /* the value is still in r->buf: the probe follows the state */
        llama_memory_clear(r->vmem, true);
        int32_t tok = (int32_t)t->token;
        if (llama_state_seq_set_data_ext(r->vctx, r->buf, t->state_len, 0, 0) == 0 ||
            decode(r->vctx, &tok, 1, B, 0, 1, r->err, sizeof r->err) != 0)
            return -1;
        const float *got = llama_get_logits_ith(r->vctx, -1);
        if (!got) return -1;
        if (!memcmp(got, r->buf + t->state_len, (size_t)r->vocab * sizeof(float))) {
            r->bitwise_equal++;
        } else {
            r->bitwise_differ++;
            bad = 1;
            fprintf(stderr, PROG ": the state at %d computes other probe logits than its saver's\n",
                    B);
        }
    }
    llama_memory_clear(r->vmem, true);
    if (decode(r->vctx, prompt, n, 0, 0, 1, r->err, sizeof r->err) != 0) return -1;
    const float *full = llama_get_logits_ith(r->vctx, -1);
    if (!full) return -1;
    double rel = rel_diff(full, r->first, r->vocab);
    if (B > 0 && rel > r->max_rel_restored) r->max_rel_restored = rel;
    if (B == 0 && rel > r->max_rel_fresh) r->max_rel_fresh = rel;
    if (rel <= r->o.tolerance && argmax(full, r->vocab) == argmax(r->first, r->vocab)) {
        r->full_ok++;
    } else {
        r->full_bad++;
        bad = 1;
        fprintf(stderr, PROG ": a turn restored at %d is %.3g from a full recompute\n", B, rel);
    }
    r->verified++;
    return bad;
}

/* A run of bytes of the text for (seed, session, part): the prompts' content. */
static void take_text(const run *r, uint64_t which, int n, int32_t *out) {
    if (n <= 0) return;
    uint64_t span = r->text_len > (size_t)n ? r->text_len - (size_t)n : 1;
    size_t at = (size_t)(mix64(which) % span);
    for (int i = 0; i < n; i++) out[i] = r->text[(at + (size_t)i) % r->text_len];
}

static int run_sessions(run *r) {
    const options *o = &r->o;
    int status = 0;
    for (int si = 0; si < o->sessions; si++) {
        uint64_t s = (uint64_t)(o->session_base + si);
        uint64_t base = ((uint64_t)o->seed << 40) ^ (s << 12);
        int n_hist = 0;
        for (int i = 0; i < o->system; i++) r->history[n_hist++] = r->text[i % r->text_len];
        take_text(r, base ^ 0xd0c, o->doc, r->history + n_hist);
        n_hist += o->doc;
        int sys_saved = 0, Bs = (o->system / o->chunk) * o->chunk;
        for (int turn = 0; turn < o->turns; turn++) {
            double t0 = now_ms();
            take_text(r, base ^ (uint64_t)(turn + 1), o->user, r->history + n_hist);
            int n = n_hist + o->user;
            turn_stats ts = {0};
            llama_memory_seq_rm(r->mem, -1, -1, -1);
            ts.restored = restore(r, r->history, n, &ts);
            int from = ts.restored;
            if (decode(r->ctx, r->history + from, n - from, from, 0, 1, r->err, sizeof r->err))
                return 2;
            const float *l = llama_get_logits_ith(r->ctx, -1);
            if (!l) return 2;
            memcpy(r->first, l, (size_t)r->vocab * sizeof *l);
            double ttft = now_ms() - t0;
            int tok = argmax(l, r->vocab);
            for (int g = 0; g < o->gen; g++) {
                r->history[n + g] = tok;
                if (g + 1 < o->gen) {
                    if (decode(r->ctx, &tok, 1, n + g, 0, 1, r->err, sizeof r->err)) return 2;
                    tok = argmax(llama_get_logits_ith(r->ctx, -1), r->vocab);
                }
            }
            n_hist = n + o->gen;
            double t_gen = now_ms(), gen_ms = t_gen - t0;
            /* before the save, which reuses the value's buffer; not part of the turn's times */
            int vbad = 0;
            if (o->verify && (vbad = verify_turn(r, r->history, n, &ts)) < 0) {
                fprintf(stderr, PROG ": verify: %s\n", r->err);
                return 2;
            }
            if (vbad) status = 1;
            t_gen = now_ms();
            int saved = 0;
            if (r->store && !r->store_stuck) {
                int in_kv = n_hist - 1; /* the last generated token was never decoded */
                int B = (in_kv / o->chunk) * o->chunk;
                int rc = B > 0 ? save_state(r, r->history, B) : 0;
                if (rc < 0) fprintf(stderr, PROG ": %s\n", r->err);
                saved += rc > 0;
                r->saves_skipped += rc == 0 && B > 0;
                if (!sys_saved && !r->store_stuck && Bs > 0 && Bs != B && in_kv >= Bs) {
                    rc = save_state(r, r->history, Bs);
                    if (rc < 0) fprintf(stderr, PROG ": %s\n", r->err);
                    saved += rc > 0;
                }
                sys_saved = 1;
            }
            double save_ms = now_ms() - t_gen, turn_ms = gen_ms + save_ms;
            r->saves += saved;
            r->turns_done++;
            r->turns_restored += ts.restored > 0;
            r->restored_tokens += ts.restored;
            r->computed_tokens += n - ts.restored;
            r->save_ms += save_ms;
            r->turn_ms += turn_ms;
            if (turn > 0) r->ttft_later_ms += ttft, r->later_turns++;
            if (o->json)
                printf("{\"type\":\"llama_turn\",\"session\":%llu,\"turn\":%d,\"prompt\":%d,"
                       "\"restored\":%d,\"computed\":%d,\"ttft_ms\":%.3f,\"save_ms\":%.3f,"
                       "\"turn_ms\":%.3f,\"saves\":%d}\n",
                       (unsigned long long)s, turn, n, ts.restored, n - ts.restored, ttft, save_ms,
                       turn_ms, saved);
            else if (!o->quiet)
                printf("session %llu turn %d: prompt %d, restored %d, computed %d, TTFT %.2f ms, "
                       "save %.2f ms (%.1f%% of the turn)%s\n",
                       (unsigned long long)s, turn, n, ts.restored, n - ts.restored, ttft, save_ms,
                       turn_ms > 0 ? 100 * save_ms / turn_ms : 0.0,
                       o->verify ? (vbad ? ", verify FAILED" : ", verified") : "");
            fflush(stdout); /* another process may be waiting on the line */
        }
    }
    return status;
}

static int load_text(run *r) {
    FILE *f = fopen(r->o.text, "rb");
    if (!f) {
        snprintf(r->err, sizeof r->err, "cannot open the text %s", r->o.text);
        return -1;
    }
    static uint8_t text[1 << 20];
    r->text_len = fread(text, 1, sizeof text, f);
    fclose(f);
    r->text = text;
    if (r->text_len == 0) snprintf(r->err, sizeof r->err, "the text %s is empty", r->o.text);
    return r->text_len ? 0 : -1;
}

static struct llama_context *make_context(run *r, int n_seq) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)r->n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)r->n_ctx;
    cp.n_seq_max = (uint32_t)n_seq;
    cp.kv_unified = true; /* the scratch sequence shares the main one's cells */
    cp.n_threads = cp.n_threads_batch = r->o.threads;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    return llama_init_from_model(r->model, cp);
}

/* Bytes of the state of n tokens: measured at two lengths (the state is linear in its cells). */
static int state_bytes_per_token(run *r, uint64_t *base, uint64_t *per) {
    int32_t t[2] = {'a', 'b'};
    if (decode(r->ctx, t, 1, 0, 0, 0, r->err, sizeof r->err)) return -1;
    size_t s1 = llama_state_seq_get_size_ext(r->ctx, 0, 0);
    if (decode(r->ctx, t + 1, 1, 1, 0, 0, r->err, sizeof r->err)) return -1;
    size_t s2 = llama_state_seq_get_size_ext(r->ctx, 0, 0);
    llama_memory_clear(r->mem, true);
    if (s2 <= s1) {
        snprintf(r->err, sizeof r->err, "llama.cpp's state sizes %zu, %zu", s1, s2);
        return -1;
    }
    *per = s2 - s1;
    *base = s1 - *per;
    return 0;
}

static int open_store(run *r) {
    const kvs_api *api = kvs_get_api(KVS_ABI_MAJOR);
    if (!api || api->struct_size < offsetof(kvs_api, store_api) + sizeof api->store_api ||
        !(r->S = api->store_api(KVS_STORE_ABI_MAJOR))) {
        snprintf(r->err, sizeof r->err, "this libkvstrata has no store API");
        return -1;
    }
    h128 fh;
    uint64_t flen;
    if (file_hash(r->o.gguf, &fh, &flen) != 0) {
        snprintf(r->err, sizeof r->err, "cannot read %s", r->o.gguf);
        return -1;
    }
    /* what a state means: this GGUF's bytes, the chunk size, llama.cpp and its state format, the
     * KV cache's type and layout (f32, V transposed without flash attention) */
    char ns[512];
    int ns_len =
        snprintf(ns, sizeof ns,
                 "kvs-llama/1 gguf=%016llx%016llx:%llu chunk=%d llama.cpp=%s state=%d "
                 "kv=f32 fa=off",
                 (unsigned long long)fh.a, (unsigned long long)fh.b, (unsigned long long)flen,
                 r->o.chunk, KVS_LLAMA_RELEASE, LLAMA_STATE_SEQ_VERSION);
    uint64_t base, per;
    if (state_bytes_per_token(r, &base, &per) != 0) return -1;
    r->max_value = base + per * (uint64_t)r->n_ctx + (uint64_t)r->vocab * sizeof(float) +
                   sizeof(probe_trailer);
    kvs_store_open_params p = {.struct_size = sizeof p,
                               .config_path = r->o.config,
                               .namespace_bytes = ns,
                               .namespace_len = (uint64_t)ns_len,
                               .tenant = r->o.tenant,
                               .max_value_bytes = r->max_value};
    char err[512] = "";
    if (r->S->open(&p, &r->store, err, sizeof err) != KVS_OK) {
        snprintf(r->err, sizeof r->err, "store: %s", err);
        r->store = NULL;
        return -1;
    }
    if (!r->o.quiet && !r->o.json)
        printf(PROG ": store on %s; namespace \"%s\"; values up to %llu bytes (%llu per token)\n",
               r->o.config ? r->o.config : "one 1 GiB DRAM tier", ns,
               (unsigned long long)r->max_value, (unsigned long long)per);
    return 0;
}

static void linger(const options *o) {
    printf(PROG ": lingering until %s exists\n", o->linger_file);
    fflush(stdout);
    struct stat st;
    for (int i = 0; i < 2400 && stat(o->linger_file, &st) != 0; i++) {
        struct timespec d = {0, 50 * 1000 * 1000};
        nanosleep(&d, NULL);
    }
}

int main(int argc, char **argv) {
    run r = {0};
    int parsed = parse_args(argc, argv, &r.o);
    if (parsed != 0) return parsed > 0 ? 0 : 2;
    const options *o = &r.o;
    int status = 2, backend = 0;
    if (load_text(&r) != 0) goto fail;

    llama_log_set(quiet_log, NULL);
    if (o->backend_dir[0]) ggml_backend_load_all_from_path(o->backend_dir);
    llama_backend_init();
    backend = 1;
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    if (!(r.model = llama_model_load_from_file(o->gguf, mp))) {
        snprintf(r.err, sizeof r.err, "llama.cpp could not load %s", o->gguf);
        goto fail;
    }
    r.vocab = llama_vocab_n_tokens(llama_model_get_vocab(r.model));
    if (r.vocab != 256) {
        snprintf(r.err, sizeof r.err, "%s has %d tokens; prompts here are bytes (256)", o->gguf,
                 r.vocab);
        goto fail;
    }
    int longest = o->system + o->doc + o->turns * (o->user + o->gen);
    if (o->max_context && o->max_context < longest + 1) {
        snprintf(r.err, sizeof r.err, "--max-context %d is shorter than the sessions (%d tokens)",
                 o->max_context, longest + 1);
        goto fail;
    }
    /* the context, and with it the store's object size: a shared DRAM tier needs the same in
     * every process, so --max-context fixes it whatever the session shape */
    r.n_ctx = o->max_context ? (o->max_context + 255) / 256 * 256 : (longest + 1 + 255) / 256 * 256;
    r.history = malloc((size_t)(longest + 1) * sizeof *r.history);
    r.chain = malloc((size_t)(longest / o->chunk + 1) * sizeof *r.chain);
    r.first = malloc((size_t)r.vocab * sizeof *r.first);
    if (!r.history || !r.chain || !r.first) {
        snprintf(r.err, sizeof r.err, "no memory");
        goto fail;
    }
    if (!(r.ctx = make_context(&r, 2)) || (o->verify && !(r.vctx = make_context(&r, 1)))) {
        snprintf(r.err, sizeof r.err, "llama.cpp could not make a context of %d tokens", r.n_ctx);
        goto fail;
    }
    r.mem = llama_get_memory(r.ctx);
    if (r.vctx) r.vmem = llama_get_memory(r.vctx);
    if (!o->no_store) {
        if (open_store(&r) != 0) goto fail;
        if (!(r.buf = malloc(r.max_value))) {
            snprintf(r.err, sizeof r.err, "no memory for a value of %llu bytes",
                     (unsigned long long)r.max_value);
            goto fail;
        }
    }
    status = run_sessions(&r);
    if (status == 2) goto fail;

    kvs_store_stats ss = {.struct_size = sizeof ss};
    if (r.store) r.S->stats(r.store, &ss);
    double later = r.later_turns ? r.ttft_later_ms / r.later_turns : 0;
    double save_frac = r.turn_ms > 0 ? r.save_ms / r.turn_ms : 0;
    if (o->json)
        printf("{\"type\":\"llama_run\",\"store\":%s,\"turns\":%d,\"turns_restored\":%d,"
               "\"restored_tokens\":%d,\"computed_tokens\":%d,\"ttft_later_ms\":%.3f,"
               "\"save_fraction\":%.5f,\"saves\":%d,\"refused\":%d,\"corrupt\":%llu}\n",
               r.store ? "true" : "false", r.turns_done, r.turns_restored, r.restored_tokens,
               r.computed_tokens, later, save_frac, r.saves, r.refused,
               (unsigned long long)ss.corrupt);
    printf(PROG ": %d turns, %d restored; tokens restored %d, computed %d; mean TTFT of later "
                "turns %.2f ms; saves %d (%d skipped as stored), %.1f%% of turn time\n",
           r.turns_done, r.turns_restored, r.restored_tokens, r.computed_tokens, later, r.saves,
           r.saves_skipped, 100 * save_frac);
    if (r.store)
        printf(PROG ": store: %llu gets (%llu hits), %llu corrupt, %d refused by llama.cpp, %d "
                    "store failures\n",
               (unsigned long long)ss.gets, (unsigned long long)ss.get_hits,
               (unsigned long long)ss.corrupt, r.refused, r.store_failures);
    if (o->verify)
        printf(PROG ": verify: %d turns; %d restored states bit for bit, %d differ, %d stored "
                    "without a probe; full recompute %d within %.3g, %d not (largest relative "
                    "difference: restored %.3g, not restored %.3g): %s\n",
               r.verified, r.bitwise_equal, r.bitwise_differ, r.no_probe, r.full_ok, o->tolerance,
               r.full_bad, r.max_rel_restored, r.max_rel_fresh, status == 0 ? "ok" : "FAILED");
    if (o->linger_file) linger(o);
    goto out;
fail:
    fprintf(stderr, PROG ": %s\n", r.err);
out:
    if (r.store) r.S->close(r.store);
    free(r.buf);
    free(r.first);
    free(r.history);
    free(r.chain);
    if (r.vctx) llama_free(r.vctx);
    if (r.ctx) llama_free(r.ctx);
    if (r.model) llama_model_free(r.model);
    if (backend) llama_backend_free();
    return status;
}
