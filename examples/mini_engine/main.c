/* main.c - kvs-mini-engine: runs a multi-turn chat workload through a small transformer with a paged
 * KV cache, once with libkvstrata (loaded at run time) driving every KV-connector hook the way vLLM
 * does, once without, and compares time to first token. --verify checks that every restored prompt's
 * KV and logits equal a from-scratch computation bit for bit. See docs/mini_engine.md. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvcache.h"
#include "kvstrata.h"
#include "model.h"
#include "workload.h"

#define PROG "kvs-mini-engine"
#define MAX_STEP_RETRIES 8         /* load-error recomputes per request before giving up */
#define LOOKUP_POLL_LIMIT 5000     /* "unknown yet" lookups (1 ms apart) before treating as a miss */
#define FINISHED_POLL_LIMIT 60000  /* get_finished polls (1 ms apart) for async loads/saves */

/* Flags ------------------------------------------------------------------------------------------- */

typedef struct options {
    const char *lib_path;    /* NULL: next to the executable, then the loader's search path */
    const char *config_path; /* "none": the library's built-in defaults */
    const char *trace_path;
    model_config model;
    kv_layout layout;
    kvs_dtype dtype;
    int blocks, block_budget; /* 0: sized from the workload */
    int prefill_chunk;
    int decode_tokens;
    int system_tokens, user_tokens, doc_tokens;
    int sessions, turns;
    int no_connector, verify, json, quiet;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options]\n"
            "connector:\n"
            "  --lib PATH            libkvstrata to load (default <exe dir>/../lib/libkvstrata.so.1,\n"
            "                        then libkvstrata.so from the loader's search path)\n"
            "  --config PATH         YAML configuration (default examples/configs/default.yaml;\n"
            "                        'none' for the library's built-in defaults)\n"
            "  --no-connector        run only without the library\n"
            "model:\n"
            "  --dim N (128) --layers N (4) --heads N (4) --kv-heads N (2) --ffn N (344)\n"
            "  --vocab N (2048) --seed N (42) --latent N (64, MLA latent width)\n"
            "kv cache:\n"
            "  --dtype fp16|bf16|fp32|fp8 (fp16)\n"
            "  --layout nhd|hnd|flashinfer|mla|crosslayer (nhd; mla switches to latent attention)\n"
            "  --blocks N            pages in the paged cache (default: the block budget)\n"
            "  --block-budget N      pages the engine may hold, in use or cached (default: a third of\n"
            "                        the workload's final histories, so sessions evict each other)\n"
            "  --prefill-chunk N     tokens computed per prefill step (512)\n"
            "workload:\n"
            "  --sessions N (8) --turns N (5) --system-tokens N (256) --doc-tokens N (1536)\n"
            "  --user-tokens N (mean 120) --decode-tokens N (16)\n"
            "  --trace FILE          JSONL turns instead of the generator\n"
            "output:\n"
            "  --verify              compare restored prompts with a from-scratch reference, bit for bit\n"
            "  --json                print the summary as one JSON object on the last line\n"
            "  --quiet               no per-turn lines\n");
}

static int parse_int_flag(const char *flag, const char *value, int min, int *out)
{
    char *end;
    errno = 0;
    long v = value ? strtol(value, &end, 10) : 0;
    if (!value || errno || *end || end == value || v < min || v > INT_MAX) {
        fprintf(stderr, PROG ": %s needs an integer >= %d, got '%s'\n", flag, min, value ? value : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){
        .config_path = "examples/configs/default.yaml",
        .model = {.dim = 128, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2, .ffn = 344, .vocab = 2048,
                  .latent = 64, .seed = 42},
        .layout = KV_LAYOUT_NHD,
        .dtype = KVS_DTYPE_FP16,
        .prefill_chunk = 512,
        .decode_tokens = 16,
        .system_tokens = 256,
        .user_tokens = 120,
        .doc_tokens = 1536,
        .sessions = 8,
        .turns = 5,
    };
    struct {
        const char *name;
        int *dst;
        int min;
    } ints[] = {
        {"--dim", &o->model.dim, 2},           {"--layers", &o->model.n_layers, 1},
        {"--heads", &o->model.n_heads, 1},     {"--kv-heads", &o->model.n_kv_heads, 1},
        {"--ffn", &o->model.ffn, 1},           {"--vocab", &o->model.vocab, 2},
        {"--latent", &o->model.latent, 1},     {"--blocks", &o->blocks, 1},
        {"--block-budget", &o->block_budget, 1}, {"--prefill-chunk", &o->prefill_chunk, 1},
        {"--decode-tokens", &o->decode_tokens, 1}, {"--system-tokens", &o->system_tokens, 0},
        {"--user-tokens", &o->user_tokens, 0}, {"--doc-tokens", &o->doc_tokens, 0},
        {"--sessions", &o->sessions, 1},       {"--turns", &o->turns, 1},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int matched = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            if (strcmp(a, ints[k].name) == 0) {
                if (parse_int_flag(a, v, ints[k].min, ints[k].dst) != 0)
                    return -1;
                i++;
                matched = 1;
                break;
            }
        }
        if (matched)
            continue;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--no-connector") == 0) {
            o->no_connector = 1;
        } else if (strcmp(a, "--verify") == 0) {
            o->verify = 1;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = 1;
        } else if (!v && (strcmp(a, "--lib") == 0 || strcmp(a, "--config") == 0 || strcmp(a, "--trace") == 0 ||
                          strcmp(a, "--seed") == 0 || strcmp(a, "--dtype") == 0 || strcmp(a, "--layout") == 0)) {
            fprintf(stderr, PROG ": %s needs a value\n", a);
            return -1;
        } else if (strcmp(a, "--lib") == 0) {
            o->lib_path = argv[++i];
        } else if (strcmp(a, "--config") == 0) {
            o->config_path = argv[++i];
        } else if (strcmp(a, "--trace") == 0) {
            o->trace_path = argv[++i];
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 0);
            if (errno || *end || end == v) {
                fprintf(stderr, PROG ": --seed needs an unsigned integer, got '%s'\n", v);
                return -1;
            }
            o->model.seed = s;
            i++;
        } else if (strcmp(a, "--dtype") == 0) {
            if (kv_dtype_parse(v, &o->dtype) != 0) {
                fprintf(stderr, PROG ": --dtype must be fp16, bf16, fp32 or fp8, got '%s'\n", v);
                return -1;
            }
            i++;
        } else if (strcmp(a, "--layout") == 0) {
            if (kv_layout_parse(v, &o->layout) != 0) {
                fprintf(stderr, PROG ": --layout must be nhd, hnd, flashinfer, mla or crosslayer, got '%s'\n", v);
                return -1;
            }
            i++;
        } else {
            fprintf(stderr, PROG ": unknown option '%s' (--help lists them)\n", a);
            return -1;
        }
    }
    o->model.is_mla = o->layout == KV_LAYOUT_MLA;
    if (o->verify && o->no_connector) {
        fprintf(stderr, PROG ": --verify checks restored KV and needs the connector (drop --no-connector)\n");
        return -1;
    }
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* The connector -------------------------------------------------------------------------------------- */

typedef struct connector {
    void *dl;
    const kvs_api *api;
    kvs_handle *h;
    uint8_t *meta;      /* build_meta output, grown on KVS_EOVERFLOW */
    uint64_t meta_cap;
    uint32_t *errors;   /* load_error_blocks output */
    uint64_t errors_cap;
    uint64_t events_stored, events_removed;
    char model_id[160];
} connector;

/* Print the failed hook with the library's sentence; returns -1 for the caller to pass up. */
static int hook_failed(const connector *c, const char *hook, kvs_status st)
{
    fprintf(stderr, PROG ": %s failed: %s: %s\n", hook, c->api->strerror(st), c->api->last_error(c->h));
    return -1;
}

#define HOOK(c, call, name)                                                                        \
    do {                                                                                           \
        kvs_status st_ = (call);                                                                   \
        if (st_ != KVS_OK)                                                                         \
            return hook_failed((c), (name), st_);                                                  \
    } while (0)

static void *load_library(const char *explicit_path)
{
    if (explicit_path) {
        void *dl = dlopen(explicit_path, RTLD_NOW | RTLD_LOCAL);
        if (!dl)
            fprintf(stderr, PROG ": cannot load %s: %s\n", explicit_path, dlerror());
        return dl;
    }
    char exe[PATH_MAX], first_error[1024] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            char path[PATH_MAX + 32];
            snprintf(path, sizeof path, "%s/../lib/libkvstrata.so.1", exe);
            void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (dl)
                return dl;
            snprintf(first_error, sizeof first_error, "%s", dlerror());
        }
    }
    void *dl = dlopen("libkvstrata.so", RTLD_NOW | RTLD_LOCAL);
    if (!dl)
        fprintf(stderr, PROG ": cannot load libkvstrata: %s; %s (build it, or pass --lib PATH)\n",
                first_error, dlerror());
    return dl;
}

static int connector_open(connector *c, const options *o, const model *m, const kvcache *kv)
{
    memset(c, 0, sizeof *c);
    const char *config = strcmp(o->config_path, "none") == 0 ? NULL : o->config_path;
    if (config && access(config, R_OK) != 0) {
        fprintf(stderr,
                PROG ": config file '%s' not found (%s): run from the repository root, pass --config PATH, "
                     "or --config none for the library's built-in defaults\n",
                config, strerror(errno));
        return -1;
    }
    if (!(c->dl = load_library(o->lib_path)))
        return -1;
    const kvs_api *(*get_api)(uint32_t);
    *(void **)&get_api = dlsym(c->dl, "kvs_get_api");
    if (!get_api) {
        fprintf(stderr, PROG ": the library exports no kvs_get_api: %s\n", dlerror());
        return -1;
    }
    c->api = get_api(KVS_ABI_MAJOR);
    if (!c->api) {
        fprintf(stderr, PROG ": the library does not implement ABI major %d\n", KVS_ABI_MAJOR);
        return -1;
    }
    if (c->api->struct_size < sizeof(kvs_api)) {
        fprintf(stderr, PROG ": the library's API table has %u bytes, this engine needs %zu (older library)\n",
                c->api->struct_size, sizeof(kvs_api));
        return -1;
    }
    const model_config *mc = model_config_of(m);
    /* Everything that changes the KV goes into the model id, so different weights never share keys. */
    char attention[32];
    if (mc->is_mla)
        snprintf(attention, sizeof attention, "mla%d", mc->latent);
    else
        snprintf(attention, sizeof attention, "kv%d", mc->n_kv_heads);
    snprintf(c->model_id, sizeof c->model_id, "kvs-mini-engine/d%d-l%d-h%d-%s-f%d-v%d-seed%llu", mc->dim,
             mc->n_layers, mc->n_heads, attention, mc->ffn, mc->vocab, (unsigned long long)mc->seed);
    kvs_model_desc desc = {
        .struct_size = sizeof desc,
        .model_id = c->model_id,
        .dtype = o->dtype,
        .n_layers = (uint32_t)mc->n_layers,
        .n_kv_heads = model_cache_heads(m),
        .head_dim = model_cache_width(m),
        .block_tokens = KV_BLOCK_TOKENS,
        .is_mla = (uint32_t)mc->is_mla,
        .tp_rank = 0,
        .tp_size = 1,
        .salt = NULL,
        .vocab_size = (uint32_t)mc->vocab,
    };
    kvs_open_params params = {.struct_size = sizeof params, .role = KVS_ROLE_BOTH, .config_path = config,
                              .model = &desc};
    char err[512];
    kvs_status st = c->api->open(&params, &c->h, err, sizeof err);
    if (st != KVS_OK) {
        fprintf(stderr, PROG ": open failed: %s: %s\n", c->api->strerror(st), err);
        return -1;
    }
    HOOK(c, c->api->register_kv(c->h, kvcache_views(kv), (uint32_t)mc->n_layers), "register_kv");
    c->meta_cap = 4096;
    c->meta = malloc(c->meta_cap);
    c->errors_cap = kvcache_params_of(kv)->n_blocks;
    c->errors = malloc(c->errors_cap * sizeof *c->errors);
    if (!c->meta || !c->errors) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    return 0;
}

static void connector_close(connector *c)
{
    if (c->api && c->h)
        c->api->close(c->h);
    if (c->dl)
        dlclose(c->dl);
    free(c->meta);
    free(c->errors);
    memset(c, 0, sizeof *c);
}

/* Drain the stored/removed events (vLLM forwards them to routers; here they are only counted). */
static int connector_take_events(connector *c)
{
    kvs_event ev[64];
    uint64_t n;
    do {
        HOOK(c, c->api->take_events(c->h, ev, 64, &n), "take_events");
        for (uint64_t i = 0; i < n; i++) {
            if (ev[i].kind == KVS_EVENT_STORED)
                c->events_stored++;
            else if (ev[i].kind == KVS_EVENT_REMOVED)
                c->events_removed++;
        }
    } while (n == 64);
    return 0;
}

/* 1 if req_id is in the NUL-separated list of n ids. */
static int id_listed(const char *list, uint64_t n, const char *req_id)
{
    for (uint64_t i = 0; i < n; i++) {
        if (strcmp(list, req_id) == 0)
            return 1;
        list += strlen(list) + 1;
    }
    return 0;
}

/* get_finished: whether req_id finished sending (async save) or receiving (async load). */
static int connector_poll_finished(connector *c, const char *req_id, int *sending, int *receiving)
{
    char sent[4096], recv[4096];
    uint64_t n_sent = 0, n_recv = 0;
    HOOK(c, c->api->get_finished(c->h, sent, sizeof sent, &n_sent, recv, sizeof recv, &n_recv), "get_finished");
    *sending = id_listed(sent, n_sent, req_id);
    *receiving = id_listed(recv, n_recv, req_id);
    return 0;
}

/* The engine ------------------------------------------------------------------------------------------- */

typedef struct engine {
    const options *o;
    const model *m;
    model_scratch *s;
    kvcache *kv;
    connector *conn; /* NULL without the connector */
    float *logits;
    uint32_t *table; /* the current request's block table */
    int32_t *tokens; /* the current request's tokens: prompt, then outputs */
} engine;

typedef struct turn_result {
    int session, turn;
    uint64_t prompt;
    uint64_t local_hit, ext_hit; /* tokens from the engine's prefix cache / loaded by the connector */
    uint64_t error_blocks;       /* blocks reported by load_error_blocks */
    double ttft_ms;
    int32_t first_token;
} turn_result;

typedef struct step_io {
    const char *req_id;
    uint64_t n_tokens;   /* tokens known so far */
    uint64_t n_blocks;   /* the request's whole block table */
    uint64_t n_computed; /* tokens whose KV is in the pages before this step */
    int n_scheduled;
    uint64_t first_bad;  /* out: first token of the first block whose load failed */
} step_io;

/* One engine step for one request: the connector's per-step hooks around a forward pass of
 * n_scheduled tokens. Returns 0, 1 when a load failed (the step's results are void), -1 on error. */
static int engine_step(engine *e, step_io *io)
{
    connector *c = e->conn;
    const int n_layers = model_config_of(e->m)->n_layers;
    if (c) {
        kvs_step_request r = {.req_id = io->req_id, .tokens = e->tokens, .n_tokens = io->n_tokens,
                              .block_ids = e->table, .n_block_ids = io->n_blocks,
                              .n_computed = io->n_computed, .n_scheduled = (uint64_t)io->n_scheduled};
        uint64_t len = 0;
        kvs_status st = c->api->build_meta(c->h, &r, 1, c->meta, c->meta_cap, &len);
        if (st == KVS_EOVERFLOW) {
            uint8_t *grown = realloc(c->meta, len);
            if (!grown) {
                fprintf(stderr, PROG ": out of memory for %llu bytes of step metadata\n", (unsigned long long)len);
                return -1;
            }
            c->meta = grown;
            c->meta_cap = len;
            st = c->api->build_meta(c->h, &r, 1, c->meta, c->meta_cap, &len);
        }
        if (st != KVS_OK)
            return hook_failed(c, "build_meta", st);
        HOOK(c, c->api->bind_meta(c->h, c->meta, len), "bind_meta");
        HOOK(c, c->api->start_load(c->h), "start_load");
    }
    model_embed(e->m, e->s, e->tokens + io->n_computed, io->n_scheduled);
    for (int l = 0; l < n_layers; l++) {
        if (c)
            HOOK(c, c->api->wait_layer_load(c->h, (uint32_t)l), "wait_layer_load");
        model_layer(e->m, e->s, e->kv, (uint32_t)l, e->table, io->n_computed, io->n_scheduled);
        if (c)
            HOOK(c, c->api->save_layer(c->h, (uint32_t)l), "save_layer");
    }
    if (!c)
        return 0;
    HOOK(c, c->api->wait_save(c->h), "wait_save");
    uint64_t n_bad = 0;
    HOOK(c, c->api->load_error_blocks(c->h, c->errors, c->errors_cap, &n_bad), "load_error_blocks");
    if (n_bad == 0)
        return 0;
    /* Recompute from the first failed block: everything computed after it read garbage. */
    uint64_t first = UINT64_MAX;
    for (uint64_t i = 0; i < n_bad; i++) {
        uint64_t b = 0;
        while (b < io->n_blocks && e->table[b] != c->errors[i])
            b++;
        if (b == io->n_blocks) {
            fprintf(stderr, PROG ": load_error_blocks reported block %u, which request '%s' does not hold\n",
                    c->errors[i], io->req_id);
            return -1;
        }
        if (b * KV_BLOCK_TOKENS < first)
            first = b * KV_BLOCK_TOKENS;
    }
    io->first_bad = first;
    return (int)n_bad;
}

/* Ask the connector how much of the prompt it can load beyond the n_local tokens the engine has. */
static int connector_lookup(connector *c, const char *req_id, const int32_t *tokens, uint64_t n,
                            uint64_t n_local, kvs_lookup_result *res)
{
    for (int tries = 0;; tries++) {
        memset(res, 0, sizeof *res);
        res->struct_size = sizeof *res;
        HOOK(c, c->api->lookup(c->h, req_id, tokens, n, n_local, res), "lookup");
        if (!res->unknown_yet)
            break;
        if (tries == LOOKUP_POLL_LIMIT) { /* still unknown: schedule it as a miss */
            res->n_hit_tokens = 0;
            res->load_async = 0;
            break;
        }
        sleep_ms(1); /* stands for the next scheduler step */
    }
    if (n_local + res->n_hit_tokens >= n) {
        fprintf(stderr,
                PROG ": lookup for '%s' offered %llu tokens beyond %llu of a %llu-token prompt: the last token "
                     "must be left to compute\n",
                req_id, (unsigned long long)res->n_hit_tokens, (unsigned long long)n_local,
                (unsigned long long)n);
        return -1;
    }
    return 0;
}

/* An asynchronous load happens between steps: the request waits, unscheduled, until get_finished
 * lists it as received. Returns the first failed token (or UINT64_MAX) in *first_bad. */
static int async_load(engine *e, const char *req_id, uint64_t n_prompt, uint64_t n_blocks,
                      uint64_t n_computed, uint64_t *first_bad)
{
    connector *c = e->conn;
    *first_bad = UINT64_MAX;
    for (int polls = 0; polls < FINISHED_POLL_LIMIT; polls++) {
        /* The first step carries the waiting request with nothing scheduled, so the connector can
         * issue its load; later steps only poll. */
        kvs_step_request r = {.req_id = req_id, .tokens = e->tokens, .n_tokens = n_prompt,
                              .block_ids = e->table, .n_block_ids = n_blocks, .n_computed = n_computed,
                              .n_scheduled = 0};
        uint64_t len = 0;
        HOOK(c, c->api->build_meta(c->h, &r, polls == 0, c->meta, c->meta_cap, &len), "build_meta");
        HOOK(c, c->api->bind_meta(c->h, c->meta, len), "bind_meta");
        HOOK(c, c->api->start_load(c->h), "start_load");
        HOOK(c, c->api->wait_save(c->h), "wait_save");
        uint64_t n_bad = 0;
        HOOK(c, c->api->load_error_blocks(c->h, c->errors, c->errors_cap, &n_bad), "load_error_blocks");
        for (uint64_t i = 0; i < n_bad; i++)
            for (uint64_t b = 0; b < n_blocks; b++)
                if (e->table[b] == c->errors[i] && b * KV_BLOCK_TOKENS < *first_bad)
                    *first_bad = b * KV_BLOCK_TOKENS;
        int sending, receiving;
        if (connector_poll_finished(c, req_id, &sending, &receiving) != 0)
            return -1;
        if (receiving)
            return 0;
        sleep_ms(1);
    }
    fprintf(stderr, PROG ": the asynchronous load of '%s' never finished\n", req_id);
    return -1;
}

typedef int (*prefill_done_fn)(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r);

/* Serve one turn: prefix-cache match, lookup, allocation, prefill steps, greedy decode steps, finish.
 * e->tokens holds the prompt; outputs are appended after it. on_prefill (may be NULL) runs once the
 * first token's logits exist, outside the TTFT. */
static int engine_serve(engine *e, const char *req_id, uint64_t n_prompt, int n_out, turn_result *r,
                        int32_t *outputs, prefill_done_fn on_prefill, void *ctx)
{
    connector *c = e->conn;
    const double t0 = now_ms(); /* the turn arrives */

    /* 1. Local hits: full blocks from the engine's own prefix cache. */
    uint32_t n_local_blocks = kvcache_match_prefix(e->kv, e->tokens, n_prompt, e->table);
    uint64_t n_local = (uint64_t)n_local_blocks * KV_BLOCK_TOKENS;

    /* 2. External hits from the connector. */
    kvs_lookup_result lr = {0};
    if (c && connector_lookup(c, req_id, e->tokens, n_prompt, n_local, &lr) != 0)
        return -1;
    uint64_t n_ext = lr.n_hit_tokens;

    /* 3. Pages for the whole request: the prompt and every output but the last get KV. */
    uint64_t kv_tokens = n_prompt + (uint64_t)n_out - 1;
    uint32_t n_blocks = (uint32_t)((kv_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    if (kvcache_alloc(e->kv, n_blocks - n_local_blocks, e->table + n_local_blocks) != 0) {
        fprintf(stderr, PROG ": '%s' needs %u pages but the block budget leaves %u: raise --block-budget\n",
                req_id, n_blocks - n_local_blocks, kvcache_available(e->kv));
        kvcache_release(e->kv, e->table, n_local_blocks, e->tokens, 0);
        return -1;
    }
    if (c)
        HOOK(c, c->api->on_alloc(c->h, req_id, e->table, n_blocks, n_ext), "on_alloc");

    uint64_t computed = n_local + n_ext;
    if (c && n_ext && lr.load_async) {
        uint64_t bad;
        if (async_load(e, req_id, n_prompt, n_blocks, computed, &bad) != 0)
            return -1;
        if (bad < computed)
            computed = bad < n_local ? n_local : bad;
    }

    /* 4./5. Steps until n_out tokens exist: prefill chunks, then one token per step. */
    r->prompt = n_prompt;
    r->local_hit = n_local;
    r->ext_hit = n_ext;
    r->error_blocks = 0;
    uint64_t n_known = n_prompt;
    int produced = 0, retries = 0;
    while (produced < n_out) {
        uint64_t left = n_known - computed;
        int n = left < (uint64_t)e->o->prefill_chunk ? (int)left : e->o->prefill_chunk;
        step_io io = {.req_id = req_id, .n_tokens = n_known, .n_blocks = n_blocks, .n_computed = computed,
                      .n_scheduled = n};
        int rc = engine_step(e, &io);
        if (rc < 0)
            return -1;
        if (rc > 0) {
            r->error_blocks += (uint64_t)rc;
            if (++retries > MAX_STEP_RETRIES) {
                fprintf(stderr, PROG ": '%s': loads kept failing after %d recomputes\n", req_id, retries - 1);
                return -1;
            }
            if (io.first_bad < computed)
                computed = io.first_bad;
            continue; /* discard this step: nothing it computed is used */
        }
        computed += (uint64_t)n;
        if (computed < n_known)
            continue;
        model_logits(e->m, e->s, n - 1, e->logits);
        int32_t next = model_argmax(e->logits, model_config_of(e->m)->vocab);
        if (produced == 0) {
            r->ttft_ms = now_ms() - t0;
            r->first_token = next;
            if (on_prefill && on_prefill(ctx, e, n_prompt, r) != 0)
                return -1;
        }
        outputs[produced++] = next;
        e->tokens[n_known++] = next;
    }

    /* 6. Finished: the connector may keep the pages for an async save; then they go back to the
     * engine's prefix cache. */
    if (c) {
        int keep = 0;
        HOOK(c, c->api->request_finished(c->h, req_id, &keep), "request_finished");
        for (int polls = 0; keep; polls++) {
            int sending, receiving;
            if (connector_poll_finished(c, req_id, &sending, &receiving) != 0)
                return -1;
            if (sending)
                break;
            if (polls == FINISHED_POLL_LIMIT) {
                fprintf(stderr, PROG ": the asynchronous save of '%s' never finished\n", req_id);
                return -1;
            }
            sleep_ms(1);
        }
        if (connector_take_events(c) != 0)
            return -1;
    }
    kvcache_release(e->kv, e->table, n_blocks, e->tokens, kv_tokens);
    return 0;
}

/* --verify: a reference engine with no connector and no prefix cache ------------------------------- */

typedef struct reference {
    engine e;
    uint32_t *identity; /* block table 0, 1, 2, ... */
    int turns_checked;
    int mismatches;
    const char *session;
    int turn;
} reference;

static int reference_check(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r)
{
    reference *ref = ctx;
    if (r->ext_hit == 0)
        return 0;
    engine *re = &ref->e;
    const model_config *mc = model_config_of(e->m);
    /* The whole prompt in one step: also proves the result does not depend on chunking. */
    memcpy(re->tokens, e->tokens, n_prompt * sizeof *re->tokens);
    model_embed(re->m, re->s, re->tokens, (int)n_prompt);
    for (int l = 0; l < mc->n_layers; l++)
        model_layer(re->m, re->s, re->kv, (uint32_t)l, ref->identity, 0, (int)n_prompt);
    model_logits(re->m, re->s, (int)n_prompt - 1, re->logits);
    ref->turns_checked++;

    const kvcache_params *p = kvcache_params_of(e->kv);
    const size_t head_bytes = p->head_dim * kv_dtype_size(p->dtype);
    const int parts = p->layout == KV_LAYOUT_MLA ? 1 : 2;
    for (int l = 0; l < mc->n_layers; l++) {
        for (uint64_t t = 0; t < n_prompt; t++) {
            for (int part = 0; part < parts; part++) {
                for (uint32_t h = 0; h < p->n_heads; h++) {
                    const uint32_t blk = (uint32_t)(t / KV_BLOCK_TOKENS), slot = (uint32_t)(t % KV_BLOCK_TOKENS);
                    const uint8_t *got = kvcache_head_ptr(e->kv, (uint32_t)l, (kv_part)part, e->table[blk], slot, h);
                    const uint8_t *want = kvcache_head_ptr(re->kv, (uint32_t)l, (kv_part)part, blk, slot, h);
                    if (memcmp(got, want, head_bytes) != 0) {
                        fprintf(stderr,
                                PROG ": verify: MISMATCH session %s turn %d: layer %d token %llu %s head %u "
                                     "(local hit %llu, connector hit %llu)\n",
                                ref->session, ref->turn, l, (unsigned long long)t, part == 0 ? "K" : "V", h,
                                (unsigned long long)r->local_hit, (unsigned long long)r->ext_hit);
                        ref->mismatches++;
                        return 0; /* one line per turn; keep running to count the turns */
                    }
                }
            }
        }
    }
    if (memcmp(e->logits, re->logits, (size_t)mc->vocab * sizeof(float)) != 0) {
        int i = 0;
        while (i < mc->vocab - 1 && memcmp(&e->logits[i], &re->logits[i], sizeof(float)) == 0)
            i++;
        fprintf(stderr, PROG ": verify: MISMATCH session %s turn %d: logits differ at %d (%.9g vs %.9g)\n",
                ref->session, ref->turn, i, (double)e->logits[i], (double)re->logits[i]);
        ref->mismatches++;
    }
    return 0;
}

/* One pass over the workload ------------------------------------------------------------------------ */

typedef struct sizing {
    uint64_t max_prompt, max_request, total_history;
    uint32_t blocks, budget;
} sizing;

typedef struct mode_run {
    const char *name;
    int use_connector;
    turn_result *turns;
    kvs_stats stats;
    int have_stats;
    uint64_t events_stored, events_removed;
    kvcache_stats cache;
} mode_run;

static kvcache *make_cache(const options *o, const model *m, uint32_t blocks, uint32_t budget)
{
    kvcache_params p = {.layout = o->layout, .dtype = o->dtype, .n_layers = (uint32_t)model_config_of(m)->n_layers,
                        .n_heads = model_cache_heads(m), .head_dim = model_cache_width(m),
                        .n_blocks = blocks, .block_budget = budget};
    char err[256];
    kvcache *kv = kvcache_create(&p, err, sizeof err);
    if (!kv)
        fprintf(stderr, PROG ": %s\n", err);
    return kv;
}

static int run_mode(const options *o, const model *m, const workload *w, const sizing *z, mode_run *run,
                    reference *ref)
{
    int rc = -1;
    connector conn = {0};
    engine e = {.o = o, .m = m};
    int32_t **history = calloc((size_t)w->n_sessions, sizeof *history);
    uint64_t *n_history = calloc((size_t)w->n_sessions, sizeof *n_history);
    int32_t *outputs = malloc(sizeof *outputs * (z->max_request + 1));
    e.kv = make_cache(o, m, z->blocks, z->budget);
    e.s = model_scratch_create(m, o->prefill_chunk, (int)z->max_request);
    e.logits = malloc((size_t)model_config_of(m)->vocab * sizeof *e.logits);
    e.table = calloc(z->blocks, sizeof *e.table);
    e.tokens = malloc((size_t)z->max_request * sizeof *e.tokens);
    if (!history || !n_history || !outputs || !e.kv || !e.s || !e.logits || !e.table || !e.tokens) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    for (int s = 0; s < w->n_sessions; s++) {
        history[s] = malloc((size_t)z->max_request * sizeof **history);
        if (!history[s]) {
            fprintf(stderr, PROG ": out of memory\n");
            goto out;
        }
        memcpy(history[s], w->system, (size_t)w->n_system * sizeof(int32_t));
        memcpy(history[s] + w->n_system, w->docs[s], (size_t)w->n_docs[s] * sizeof(int32_t));
        n_history[s] = (uint64_t)w->n_system + (uint64_t)w->n_docs[s];
    }
    if (run->use_connector) {
        if (connector_open(&conn, o, m, e.kv) != 0)
            goto out;
        e.conn = &conn;
    }

    for (int i = 0; i < w->n_turns; i++) {
        const workload_turn *t = &w->turns[i];
        int s = t->session;
        uint64_t n_prompt = n_history[s] + (uint64_t)t->n_user;
        memcpy(e.tokens, history[s], n_history[s] * sizeof(int32_t));
        memcpy(e.tokens + n_history[s], t->user, (size_t)t->n_user * sizeof(int32_t));
        char req_id[256];
        snprintf(req_id, sizeof req_id, "%.200s/turn%d", w->session_names[s], t->turn);
        turn_result *r = &run->turns[i];
        r->session = s;
        r->turn = t->turn;
        if (ref) {
            ref->session = w->session_names[s];
            ref->turn = t->turn;
        }
        if (engine_serve(&e, req_id, n_prompt, t->output_tokens, r, outputs, ref ? reference_check : NULL, ref) != 0)
            goto out;
        /* The session's history is now the prompt plus what was generated. */
        memcpy(history[s], e.tokens, (n_prompt + (uint64_t)t->output_tokens) * sizeof(int32_t));
        n_history[s] = n_prompt + (uint64_t)t->output_tokens;
        if (!o->quiet)
            printf("[%-12s] %-8s turn %-2d prompt %6llu  local %6llu  connector %6llu  ttft %8.2f ms%s\n",
                   run->name, w->session_names[s], t->turn, (unsigned long long)r->prompt,
                   (unsigned long long)r->local_hit, (unsigned long long)r->ext_hit, r->ttft_ms,
                   r->error_blocks ? "  (load errors: recomputed)" : "");
    }
    fflush(stdout);
    if (e.conn) {
        run->stats.struct_size = sizeof run->stats;
        kvs_status st = conn.api->stats(conn.h, &run->stats);
        if (st != KVS_OK) {
            hook_failed(&conn, "stats", st);
            goto out;
        }
        run->have_stats = 1;
        run->events_stored = conn.events_stored;
        run->events_removed = conn.events_removed;
    }
    run->cache = kvcache_get_stats(e.kv);
    rc = 0;
out:
    connector_close(&conn);
    for (int s = 0; history && s < w->n_sessions; s++)
        free(history[s]);
    free(history);
    free(n_history);
    free(outputs);
    kvcache_destroy(e.kv);
    model_scratch_free(e.s);
    free(e.logits);
    free(e.table);
    free(e.tokens);
    return rc;
}

/* Summary ----------------------------------------------------------------------------------------------- */

typedef struct ttft_summary {
    int n;
    double mean, p50, p99;
    uint64_t local_hit, ext_hit;
} ttft_summary;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double percentile(const double *v, int n, double p)
{
    int rank = (int)ceil(p / 100.0 * n);
    if (rank < 1)
        rank = 1;
    return v[rank - 1];
}

enum { GROUP_LATER, GROUP_LATER_2K, GROUP_ALL, N_GROUPS };
static const char *const group_names[N_GROUPS] = {"turns after the first", "  of them prompt >= 2048",
                                                  "all turns"};
static const char *const group_keys[N_GROUPS] = {"later_turns", "later_turns_2k", "all_turns"};

static int in_group(const turn_result *r, int group)
{
    switch (group) {
    case GROUP_LATER:
        return r->turn > 0;
    case GROUP_LATER_2K:
        return r->turn > 0 && r->prompt >= 2048;
    default:
        return 1;
    }
}

static ttft_summary summarize(const turn_result *turns, int n_turns, int group)
{
    ttft_summary s = {0};
    double *v = malloc((size_t)(n_turns > 0 ? n_turns : 1) * sizeof *v);
    if (!v)
        return s;
    double sum = 0;
    for (int i = 0; i < n_turns; i++) {
        if (!in_group(&turns[i], group))
            continue;
        v[s.n++] = turns[i].ttft_ms;
        sum += turns[i].ttft_ms;
        s.local_hit += turns[i].local_hit;
        s.ext_hit += turns[i].ext_hit;
    }
    if (s.n) {
        qsort(v, (size_t)s.n, sizeof *v, cmp_double);
        s.mean = sum / s.n;
        s.p50 = percentile(v, s.n, 50);
        s.p99 = percentile(v, s.n, 99);
    }
    free(v);
    return s;
}

static void print_summary(const options *o, const workload *w, const sizing *z, mode_run *runs, int n_runs,
                          const reference *ref)
{
    const model_config *mc = &o->model;
    printf("\nsummary: layout %s, dtype %s, model d%d l%d h%d kv%d%s, %d turns in %d sessions, "
           "%u pages (budget %u)\n",
           kv_layout_name(o->layout), kv_dtype_name(o->dtype), mc->dim, mc->n_layers, mc->n_heads,
           mc->is_mla ? 1 : mc->n_kv_heads, mc->is_mla ? " (MLA)" : "", w->n_turns, w->n_sessions, z->blocks,
           z->budget);
    printf("TTFT ms                      n   %-28s", n_runs > 1 ? "with connector" : runs[0].name);
    if (n_runs > 1)
        printf("%-28s speedup", "without connector");
    printf("\n                                 %-28s", "mean / p50 / p99");
    if (n_runs > 1)
        printf("%-28s mean / p50", "mean / p50 / p99");
    printf("\n");
    ttft_summary s[2][N_GROUPS];
    for (int g = 0; g < N_GROUPS; g++) {
        for (int k = 0; k < n_runs; k++)
            s[k][g] = summarize(runs[k].turns, w->n_turns, g);
        printf("%-25s %5d   ", group_names[g], s[0][g].n);
        for (int k = 0; k < n_runs; k++) {
            char cell[64];
            snprintf(cell, sizeof cell, "%.1f / %.1f / %.1f", s[k][g].mean, s[k][g].p50, s[k][g].p99);
            printf("%-28s", cell);
        }
        if (n_runs > 1 && s[0][g].n && s[0][g].mean > 0 && s[0][g].p50 > 0)
            printf(" %.2fx / %.2fx", s[1][g].mean / s[0][g].mean, s[1][g].p50 / s[0][g].p50);
        printf("\n");
    }
    for (int k = 0; k < n_runs; k++) {
        printf("%s: hit tokens local %llu, connector %llu; engine evictions %llu", runs[k].name,
               (unsigned long long)s[k][GROUP_ALL].local_hit, (unsigned long long)s[k][GROUP_ALL].ext_hit,
               (unsigned long long)runs[k].cache.evictions);
        if (runs[k].have_stats) {
            const kvs_stats *st = &runs[k].stats;
            printf("; connector chunks loaded %llu (%.1f MiB, %.2f GB/s), saved %llu (%.1f MiB), skipped %llu, "
                   "load errors %llu, events stored %llu removed %llu",
                   (unsigned long long)st->chunks_loaded, (double)st->bytes_loaded / 1048576.0, st->load_gbps,
                   (unsigned long long)st->chunks_saved, (double)st->bytes_saved / 1048576.0,
                   (unsigned long long)st->saves_skipped, (unsigned long long)st->load_errors,
                   (unsigned long long)runs[k].events_stored, (unsigned long long)runs[k].events_removed);
        }
        printf("\n");
    }
    if (ref)
        printf("verify: %d turns with connector hits checked bit for bit, %d mismatches\n", ref->turns_checked,
               ref->mismatches);
    if (!o->json)
        return;
    printf("{\"layout\":\"%s\",\"dtype\":\"%s\",\"turns\":%d,\"sessions\":%d,\"blocks\":%u,\"block_budget\":%u",
           kv_layout_name(o->layout), kv_dtype_name(o->dtype), w->n_turns, w->n_sessions, z->blocks, z->budget);
    for (int k = 0; k < n_runs; k++) {
        printf(",\"%s\":{", runs[k].use_connector ? "connector" : "no_connector");
        for (int g = 0; g < N_GROUPS; g++)
            printf("%s\"%s\":{\"n\":%d,\"mean_ms\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
                   "\"local_hit_tokens\":%llu,\"connector_hit_tokens\":%llu}",
                   g ? "," : "", group_keys[g], s[k][g].n, s[k][g].mean, s[k][g].p50, s[k][g].p99,
                   (unsigned long long)s[k][g].local_hit, (unsigned long long)s[k][g].ext_hit);
        if (runs[k].have_stats)
            printf(",\"chunks_loaded\":%llu,\"chunks_saved\":%llu,\"load_errors\":%llu",
                   (unsigned long long)runs[k].stats.chunks_loaded, (unsigned long long)runs[k].stats.chunks_saved,
                   (unsigned long long)runs[k].stats.load_errors);
        printf("}");
    }
    if (n_runs > 1) {
        for (int g = 0; g < N_GROUPS; g++)
            printf(",\"speedup_%s_mean\":%.3f", group_keys[g], s[0][g].mean > 0 ? s[1][g].mean / s[0][g].mean : 0.0);
    }
    if (ref)
        printf(",\"verify\":{\"turns_checked\":%d,\"mismatches\":%d}", ref->turns_checked, ref->mismatches);
    printf("}\n");
}

/* main ------------------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    options o;
    if (parse_options(argc, argv, &o) != 0)
        return 2;
    char err[512];
    if (model_config_check(&o.model, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 2;
    }

    workload w;
    workload_params wp = {.vocab = o.model.vocab, .seed = o.model.seed, .system_tokens = o.system_tokens,
                          .doc_tokens = o.doc_tokens, .user_tokens = o.user_tokens,
                          .output_tokens = o.decode_tokens, .sessions = o.sessions, .turns = o.turns};
    int wrc = o.trace_path ? workload_load_trace(o.trace_path, &wp, &w, err, sizeof err)
                           : workload_generate(&wp, &w, err, sizeof err);
    if (wrc != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 2;
    }

    /* Size the cache: the budget is a third of all sessions' final histories, so that interleaved
     * sessions push each other out, but always room for the largest request plus a little. */
    sizing z = {0};
    workload_sizes(&w, &z.max_prompt, &z.max_request, &z.total_history);
    uint64_t max_request_blocks = (z.max_request + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    uint64_t budget = o.block_budget;
    if (!budget) {
        budget = (z.total_history + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS / 3;
        if (budget < max_request_blocks + 16)
            budget = max_request_blocks + 16;
        budget = (budget + 15) / 16 * 16;
        if (o.blocks && budget > (uint64_t)o.blocks)
            budget = (uint64_t)o.blocks;
    }
    uint64_t blocks = o.blocks ? (uint64_t)o.blocks : budget;
    int rc = 1;
    if (budget > blocks) {
        fprintf(stderr, PROG ": --block-budget %llu exceeds --blocks %llu\n", (unsigned long long)budget,
                (unsigned long long)blocks);
        goto out_workload;
    }
    if (budget < max_request_blocks) {
        fprintf(stderr, PROG ": the largest request needs %llu pages but the block budget is %llu\n",
                (unsigned long long)max_request_blocks, (unsigned long long)budget);
        goto out_workload;
    }
    if (blocks > (1u << 24) || z.max_request > (1u << 24)) {
        fprintf(stderr, PROG ": workload or cache too large for a mini engine\n");
        goto out_workload;
    }
    z.blocks = (uint32_t)blocks;
    z.budget = (uint32_t)budget;

    model *m = model_create(&o.model);
    if (!m) {
        fprintf(stderr, PROG ": out of memory for the model\n");
        goto out_workload;
    }

    reference ref = {0};
    reference *refp = NULL;
    if (o.verify) {
        uint32_t ref_blocks = (uint32_t)((z.max_prompt + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
        ref.e = (engine){.o = &o, .m = m};
        ref.e.kv = make_cache(&o, m, ref_blocks, ref_blocks);
        ref.e.s = model_scratch_create(m, (int)z.max_prompt, (int)z.max_prompt);
        ref.e.logits = malloc((size_t)o.model.vocab * sizeof(float));
        ref.e.tokens = malloc((size_t)z.max_prompt * sizeof(int32_t));
        ref.identity = malloc(ref_blocks * sizeof *ref.identity);
        if (!ref.e.kv || !ref.e.s || !ref.e.logits || !ref.e.tokens || !ref.identity) {
            fprintf(stderr, PROG ": out of memory for the verify reference\n");
            goto out_model;
        }
        for (uint32_t i = 0; i < ref_blocks; i++)
            ref.identity[i] = i;
        refp = &ref;
    }

    mode_run runs[2] = {{.name = "connector", .use_connector = 1}, {.name = "no-connector", .use_connector = 0}};
    mode_run *first = o.no_connector ? &runs[1] : &runs[0];
    int n_runs = o.no_connector ? 1 : 2;
    for (int k = 0; k < n_runs; k++) {
        first[k].turns = calloc((size_t)w.n_turns, sizeof *first[k].turns);
        if (!first[k].turns) {
            fprintf(stderr, PROG ": out of memory\n");
            goto out_runs;
        }
        /* A fresh engine each time: pages, prefix cache and connector handle. */
        if (run_mode(&o, m, &w, &z, &first[k], first[k].use_connector ? refp : NULL) != 0)
            goto out_runs;
    }
    print_summary(&o, &w, &z, first, n_runs, refp);

    rc = 0;
    if (refp && ref.mismatches) {
        fprintf(stderr, PROG ": verify FAILED: %d of %d turns differ from a full recompute\n", ref.mismatches,
                ref.turns_checked);
        rc = 1;
    } else if (refp && ref.turns_checked == 0) {
        fprintf(stderr, PROG ": verify FAILED: no turn had a connector hit, so nothing restored was checked\n");
        rc = 1;
    }
out_runs:
    free(runs[0].turns);
    free(runs[1].turns);
out_model:
    if (o.verify) {
        kvcache_destroy(ref.e.kv);
        model_scratch_free(ref.e.s);
        free(ref.e.logits);
        free(ref.e.tokens);
        free(ref.identity);
    }
    model_free(m);
out_workload:
    workload_free(&w);
    return rc;
}
