/* bench_step.c - the scheduler's cost per decode step: R running requests of L tokens each, every
 * step appending one token to each, built with build_meta (every request's whole token list and block
 * table, the path before ABI 1.10: the reference) and with build_meta_update (each request's new
 * token and, when it starts one, new block), on two scheduler handles in the same run. Nothing is
 * stored (the prompts are built once, untimed; decode chunks are not saved), so the figures are the
 * hooks' own work: argument checks, hashing and copying tokens, planning, encoding the blob. The
 * figure of each path is the median over rounds (fresh handles each) of its ns per timed step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata.h"
#include "bench_common.h"

#define BLOCK_TOKENS 16u
#define VOCAB        128256u
/* decode steps run before the timed ones: the held arrays' first growth past the prompt (a copy of
 * each, once) and the page faults of the new memory fall there */
#define WARMUP_STEPS 32u

static uint64_t next_random(uint64_t *state) { /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct options {
    uint32_t requests;
    uint32_t steps;
    uint32_t rounds;
} options;

static options parse_options(int argc, char **argv) {
    options o = {.requests = 256, .steps = 256, .rounds = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--requests") == 0 && v)
            o.requests = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(a, "--steps") == 0 && v)
            o.steps = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(a, "--rounds") == 0 && v)
            o.rounds = (uint32_t)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr,
                    "usage: %s [--requests R] [--steps N] [--rounds K]\n"
                    "  R running requests (default 256) through N decode steps (256) per round,\n"
                    "  K rounds (5) per context length (1024 and 8192 tokens); medians printed\n",
                    argv[0]);
            exit(strcmp(a, "--help") == 0 ? 0 : 2);
        }
    }
    if (!o.requests || !o.steps || !o.rounds) exit(2);
    return o;
}

/* The engine's side of one request: its tokens and block table, room for every step. */
typedef struct engine_req {
    char id[32];
    int32_t *tokens;
    uint32_t *blocks;
    uint64_t n;
} engine_req;

static void check(const kvs_api *api, kvs_handle *h, kvs_status st, const char *what) {
    if (st == KVS_OK) return;
    fprintf(stderr, "bench_step: %s: %s (%s)\n", what, api->strerror(st), api->last_error(h));
    exit(1);
}

static kvs_handle *open_scheduler(const kvs_api *api) {
    kvs_model_desc m = {.struct_size = sizeof m,
                        .model_id = "bench-step",
                        .dtype = KVS_DTYPE_BF16,
                        .n_layers = 32,
                        .n_kv_heads = 8,
                        .head_dim = 128,
                        .block_tokens = BLOCK_TOKENS,
                        .tp_size = 1,
                        .vocab_size = VOCAB};
    kvs_open_params p = {
        .struct_size = sizeof p, .role = KVS_ROLE_SCHEDULER, .config_path = NULL, .model = &m};
    kvs_handle *h = NULL;
    char err[512];
    if (api->open(&p, &h, err, sizeof err) != KVS_OK) {
        fprintf(stderr, "bench_step: open: %s\n", err);
        exit(1);
    }
    return h;
}

/* ns per step of `steps` decode steps of the requests, through build_meta (delta 0) or
 * build_meta_update (delta 1), on a fresh handle whose prompts were built first (untimed). */
static double run(const kvs_api *api, engine_req *reqs, uint32_t n_reqs, uint64_t context,
                  uint32_t steps, int delta, uint64_t *blob_bytes) {
    kvs_handle *h = open_scheduler(api);
    static uint8_t buf[64u << 20];
    kvs_step_request *full = malloc(n_reqs * sizeof *full);
    kvs_step_update *upd = malloc(n_reqs * sizeof *upd);
    if (!full || !upd) exit(1);
    uint64_t len = 0;
    for (uint32_t i = 0; i < n_reqs; i++) reqs[i].n = context;
    /* the prompts, whole, in one step */
    for (uint32_t i = 0; i < n_reqs; i++)
        upd[i] = (kvs_step_update){.struct_size = sizeof *upd,
                                   .req_id = reqs[i].id,
                                   .tokens = reqs[i].tokens,
                                   .n_tokens = context,
                                   .block_ids = reqs[i].blocks,
                                   .n_block_ids = (context + BLOCK_TOKENS - 1) / BLOCK_TOKENS,
                                   .n_scheduled = context};
    check(api, h, api->build_meta_update(h, upd, n_reqs, buf, sizeof buf, &len), "prompts");
    uint64_t t0 = 0;
    for (uint32_t s = 0; s < WARMUP_STEPS + steps; s++) {
        if (s == WARMUP_STEPS) t0 = bench_now_ns();
        for (uint32_t i = 0; i < n_reqs; i++) {
            engine_req *e = &reqs[i];
            uint64_t nb_old = (e->n + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
            uint64_t nb = (e->n + 1 + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
            if (delta)
                upd[i] = (kvs_step_update){.struct_size = sizeof *upd,
                                           .req_id = e->id,
                                           .tokens_from = e->n,
                                           .tokens = e->tokens + e->n,
                                           .n_tokens = 1,
                                           .blocks_from = nb_old,
                                           .block_ids = e->blocks + nb_old,
                                           .n_block_ids = nb - nb_old,
                                           .n_computed = e->n,
                                           .n_scheduled = 1};
            else
                full[i] = (kvs_step_request){e->id, e->tokens, e->n + 1, e->blocks, nb, e->n, 1};
            e->n++;
        }
        kvs_status st = delta ? api->build_meta_update(h, upd, n_reqs, buf, sizeof buf, &len)
                              : api->build_meta(h, full, n_reqs, buf, sizeof buf, &len);
        check(api, h, st, delta ? "build_meta_update" : "build_meta");
    }
    uint64_t ns = bench_now_ns() - t0;
    *blob_bytes = len;
    api->close(h);
    free(full);
    free(upd);
    return (double)ns / steps;
}

int main(int argc, char **argv) {
    options o = parse_options(argc, argv);
    const kvs_api *api = kvs_get_api(KVS_ABI_MAJOR);
    const uint64_t contexts[2] = {1024, 8192};
    uint64_t seed = 0x5eed;
    for (int c = 0; c < 2; c++) {
        uint64_t L = contexts[c], cap = L + WARMUP_STEPS + o.steps + 1;
        engine_req *reqs = calloc(o.requests, sizeof *reqs);
        if (!reqs) return 1;
        for (uint32_t i = 0; i < o.requests; i++) {
            snprintf(reqs[i].id, sizeof reqs[i].id, "req-%u", i);
            reqs[i].tokens = malloc(cap * sizeof *reqs[i].tokens);
            reqs[i].blocks = malloc((cap / BLOCK_TOKENS + 1) * sizeof *reqs[i].blocks);
            if (!reqs[i].tokens || !reqs[i].blocks) return 1;
            for (uint64_t t = 0; t < cap; t++)
                reqs[i].tokens[t] = (int32_t)(next_random(&seed) % VOCAB);
            for (uint64_t b = 0; b <= cap / BLOCK_TOKENS; b++)
                reqs[i].blocks[b] = (uint32_t)(i * (cap / BLOCK_TOKENS + 1) + b);
        }
        double *full = malloc(o.rounds * sizeof *full), *delta = malloc(o.rounds * sizeof *delta);
        if (!full || !delta) return 1;
        uint64_t full_bytes = 0, delta_bytes = 0;
        for (uint32_t r = 0; r < o.rounds; r++) {
            full[r] = run(api, reqs, o.requests, L, o.steps, 0, &full_bytes);
            delta[r] = run(api, reqs, o.requests, L, o.steps, 1, &delta_bytes);
        }
        double f = bench_median(full, o.rounds), d = bench_median(delta, o.rounds);
        printf("{\"bench\":\"decode_step\",\"ratio\":%.3f,\"reference\":\"build_meta with every "
               "request's whole token list and block table\",\"ns_per_step\":%.0f,"
               "\"reference_ns_per_step\":%.0f,\"requests\":%u,\"context_tokens\":%llu,"
               "\"steps\":%u,\"warmup_steps\":%u,\"iterations\":%u,\"blob_bytes\":%llu,\"reference_"
               "blob_bytes\":%llu}\n",
               d / f, d, f, o.requests, (unsigned long long)L, o.steps, WARMUP_STEPS, o.rounds,
               (unsigned long long)delta_bytes, (unsigned long long)full_bytes);
        printf("decode step, %u requests of %llu tokens: build_meta_update %.1f us, build_meta "
               "%.1f us (ratio %.3f, %.1fx faster); blob %llu bytes\n",
               o.requests, (unsigned long long)L, d / 1e3, f / 1e3, d / f, f / d,
               (unsigned long long)delta_bytes);
        for (uint32_t i = 0; i < o.requests; i++) {
            free(reqs[i].tokens);
            free(reqs[i].blocks);
        }
        free(reqs);
        free(full);
        free(delta);
    }
    return 0;
}
