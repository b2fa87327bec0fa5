/* main.c - kvs-mini-engine: runs a multi-turn chat workload through a small transformer with a paged
 * KV cache, once with libkvstrata (loaded at run time) driving every KV-connector hook the way vLLM
 * does, once without, and compares time to first token. --verify checks that every restored prompt's
 * KV and logits equal a from-scratch computation bit for bit. See docs/mini_engine.md. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "kvcache.h"
#include "model.h"
#include "profile.h"
#include "workload.h"

#define PROG "kvs-mini-engine"

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
    int restore_plans;        /* KVS_PLAN_CAP_* bits: the restore plans the engine executes */
    const char *profile_path; /* --profile: measure, write this restore profile, exit */
    const char *profile_tier; /* the name the profile gives the tier that served the loads */
    int profile_tokens;
    int plan_modes; /* --plan-modes; 0: both */
    int batch;      /* turns of different sessions admitted and restored together */
    int stages;     /* pipeline stages (boundary activations stored with the KV); 1: none */
} options;

/* --stages: the layout every engine of the run shares (set once the model exists), with the stage
 * threads' activations. */
static stage_layout run_stages;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: " PROG " [options]\n"
        "connector:\n"
        "  --lib PATH            libkvstrata to load (default <exe dir>/../lib/libkvstrata.so.1,\n"
        "                        then libkvstrata.so from the loader's search path)\n"
        "  --config PATH         YAML configuration (default examples/configs/default.yaml;\n"
        "                        'none' for the library's built-in defaults)\n"
        "  --no-connector        run only without the library\n"
        "  --restore-plans       execute restore plans (needs restore.scheduler: cacheflow): token "
        "plans\n"
        "                        recompute the front of a restored range while the back loads, "
        "layer\n"
        "                        plans its lower layers while the upper ones load\n"
        "  --plan-modes token|layer|both|stage  the plans --restore-plans accepts (both; with "
        "--stages\n"
        "                        also stage plans; 'stage': stage plans only)\n"
        "  --stages N            split the layers into N pipeline stages whose input activations "
        "are\n"
        "                        stored with the KV; stage plans restore each stage's layers from "
        "them\n"
        "                        on a thread per stage (1)\n"
        "  --profile FILE        measure recompute and load costs, write them as a restore "
        "profile, exit\n"
        "  --profile-tier NAME   tier name written into the profile (dram)\n"
        "  --profile-tokens N    prompt length the profile measures (4096)\n"
        "  --batch N             admit up to N turns of different sessions at once and restore "
        "their\n"
        "                        prefixes in one step the connector plans as a batch (1)\n"
        "model:\n"
        "  --dim N (128) --layers N (3) --heads N (4) --kv-heads N (2) --ffn N (256)\n"
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
        "  --verify              compare restored prompts with a from-scratch reference, bit for "
        "bit\n"
        "  --json                print the summary as one JSON object on the last line\n"
        "  --quiet               no per-turn lines\n");
}

static int parse_int_flag(const char *flag, const char *value, int min, int *out) {
    char *end;
    errno = 0;
    long v = value ? strtol(value, &end, 10) : 0;
    if (!value || errno || *end || end == value || v < min || v > INT_MAX) {
        fprintf(stderr, PROG ": %s needs an integer >= %d, got '%s'\n", flag, min,
                value ? value : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_options(int argc, char **argv, options *o) {
    *o = (options){
        .config_path = "examples/configs/default.yaml",
        .model = {.dim = 128,
                  .n_layers = 3,
                  .n_heads = 4,
                  .n_kv_heads = 2,
                  .ffn = 256,
                  .vocab = 2048,
                  .latent = 64,
                  .seed = 42},
        .layout = KV_LAYOUT_NHD,
        .dtype = KVS_DTYPE_FP16,
        .prefill_chunk = 512,
        .decode_tokens = 16,
        .system_tokens = 256,
        .user_tokens = 120,
        .doc_tokens = 1536,
        .sessions = 8,
        .turns = 5,
        .profile_tier = "dram",
        .profile_tokens = 4096,
        .batch = 1,
        .stages = 1,
    };
    struct {
        const char *name;
        int *dst;
        int min;
    } ints[] = {
        {"--dim", &o->model.dim, 2},
        {"--layers", &o->model.n_layers, 1},
        {"--heads", &o->model.n_heads, 1},
        {"--kv-heads", &o->model.n_kv_heads, 1},
        {"--ffn", &o->model.ffn, 1},
        {"--vocab", &o->model.vocab, 2},
        {"--latent", &o->model.latent, 1},
        {"--blocks", &o->blocks, 1},
        {"--block-budget", &o->block_budget, 1},
        {"--prefill-chunk", &o->prefill_chunk, 1},
        {"--decode-tokens", &o->decode_tokens, 1},
        {"--system-tokens", &o->system_tokens, 0},
        {"--user-tokens", &o->user_tokens, 0},
        {"--doc-tokens", &o->doc_tokens, 0},
        {"--sessions", &o->sessions, 1},
        {"--turns", &o->turns, 1},
        {"--profile-tokens", &o->profile_tokens, 64},
        {"--batch", &o->batch, 1},
        {"--stages", &o->stages, 1},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int matched = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            if (strcmp(a, ints[k].name) == 0) {
                if (parse_int_flag(a, v, ints[k].min, ints[k].dst) != 0) return -1;
                i++;
                matched = 1;
                break;
            }
        }
        if (matched) continue;
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
        } else if (strcmp(a, "--restore-plans") == 0) {
            if (!o->restore_plans) o->restore_plans = KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER;
        } else if (!v && (strcmp(a, "--profile") == 0 || strcmp(a, "--profile-tier") == 0 ||
                          strcmp(a, "--plan-modes") == 0 || strcmp(a, "--lib") == 0 ||
                          strcmp(a, "--config") == 0 || strcmp(a, "--trace") == 0 ||
                          strcmp(a, "--seed") == 0 || strcmp(a, "--dtype") == 0 ||
                          strcmp(a, "--layout") == 0)) {
            fprintf(stderr, PROG ": %s needs a value\n", a);
            return -1;
        } else if (strcmp(a, "--plan-modes") == 0) {
            i++;
            if (strcmp(v, "token") == 0)
                o->plan_modes = KVS_PLAN_CAP_TOKEN;
            else if (strcmp(v, "layer") == 0)
                o->plan_modes = KVS_PLAN_CAP_LAYER;
            else if (strcmp(v, "both") == 0)
                o->plan_modes = KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER;
            else if (strcmp(v, "stage") == 0)
                o->plan_modes = KVS_PLAN_CAP_STAGE;
            else {
                fprintf(stderr,
                        PROG ": --plan-modes must be token, layer, both or stage, got '%s'\n", v);
                return -1;
            }
        } else if (strcmp(a, "--profile") == 0) {
            o->profile_path = argv[++i];
        } else if (strcmp(a, "--profile-tier") == 0) {
            o->profile_tier = argv[++i];
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
                fprintf(stderr,
                        PROG
                        ": --layout must be nhd, hnd, flashinfer, mla or crosslayer, got '%s'\n",
                        v);
                return -1;
            }
            i++;
        } else {
            fprintf(stderr, PROG ": unknown option '%s' (--help lists them)\n", a);
            return -1;
        }
    }
    o->model.is_mla = o->layout == KV_LAYOUT_MLA;
    if (o->batch > 64) {
        fprintf(stderr, PROG ": --batch is at most 64\n");
        return -1;
    }
    if (o->restore_plans && o->plan_modes)
        o->restore_plans = o->plan_modes;
    else if (o->restore_plans && o->stages > 1)
        o->restore_plans |= KVS_PLAN_CAP_STAGE;
    if ((o->plan_modes & KVS_PLAN_CAP_STAGE) && o->stages < 2) {
        fprintf(stderr, PROG ": --plan-modes stage needs --stages 2 or more\n");
        return -1;
    }
    if (o->plan_modes && !o->restore_plans) {
        fprintf(stderr, PROG ": --plan-modes needs --restore-plans\n");
        return -1;
    }
    if ((o->restore_plans || o->profile_path) && o->no_connector) {
        fprintf(stderr,
                PROG ": --restore-plans and --profile need the connector (drop --no-connector)\n");
        return -1;
    }
    if (o->verify && o->no_connector) {
        fprintf(stderr, PROG
                ": --verify checks restored KV and needs the connector (drop --no-connector)\n");
        return -1;
    }
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
    double check_ms; /* time spent checking, kept out of the TTFT of requests served after it */
} reference;

static int reference_check_timed(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r);

static int reference_check(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r) {
    reference *ref = ctx;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = reference_check_timed(ctx, e, n_prompt, r);
    clock_gettime(CLOCK_MONOTONIC, &b);
    ref->check_ms += (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
    return rc;
}

static int reference_check_timed(void *ctx, engine *e, uint64_t n_prompt, const turn_result *r) {
    reference *ref = ctx;
    if (r->ext_hit == 0) return 0;
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
                    const uint32_t blk = (uint32_t)(t / KV_BLOCK_TOKENS),
                                   slot = (uint32_t)(t % KV_BLOCK_TOKENS);
                    const uint8_t *got =
                        kvcache_head_ptr(e->kv, (uint32_t)l, (kv_part)part, e->table[blk], slot, h);
                    const uint8_t *want =
                        kvcache_head_ptr(re->kv, (uint32_t)l, (kv_part)part, blk, slot, h);
                    if (memcmp(got, want, head_bytes) != 0) {
                        fprintf(
                            stderr,
                            PROG
                            ": verify: MISMATCH session %s turn %d: layer %d token %llu %s head %u "
                            "(local hit %llu, connector hit %llu)\n",
                            ref->session, ref->turn, l, (unsigned long long)t,
                            part == 0 ? "K" : "V", h, (unsigned long long)r->local_hit,
                            (unsigned long long)r->ext_hit);
                        ref->mismatches++;
                        return 0; /* one line per turn; keep running to count the turns */
                    }
                }
            }
        }
    }
    if (memcmp(e->logits, re->logits, (size_t)mc->vocab * sizeof(float)) != 0) {
        int i = 0;
        while (i < mc->vocab - 1 && memcmp(&e->logits[i], &re->logits[i], sizeof(float)) == 0) i++;
        fprintf(stderr,
                PROG ": verify: MISMATCH session %s turn %d: logits differ at %d (%.9g vs %.9g)\n",
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

/* One way of serving the workload (with or without the connector), with its own engine state. */
typedef struct mode_run {
    const char *name;
    int use_connector;
    turn_result *turns;
    kvs_stats stats;
    int have_stats;
    uint64_t events_stored, events_removed;
    kvcache_stats cache;
    /* state while running */
    engine e;
    engine *more; /* --batch: engines 1..batch-1, sharing e's model, scratch, cache and connector */
    int n_more;
    connector conn;
    reference *ref;
    int32_t **history; /* per session: every token so far */
    uint64_t *n_history;
} mode_run;

static kvcache *make_cache(const options *o, const model *m, uint32_t blocks, uint32_t budget) {
    kvcache_params p = {.layout = o->layout,
                        .dtype = o->dtype,
                        .n_layers = stage_cache_layers(&run_stages),
                        .n_heads = model_cache_heads(m),
                        .head_dim = model_cache_width(m),
                        .n_blocks = blocks,
                        .block_budget = budget};
    char err[256];
    kvcache *kv = kvcache_create(&p, err, sizeof err);
    if (!kv) fprintf(stderr, PROG ": %s\n", err);
    return kv;
}

/* A fresh engine: pages, prefix cache, sessions and (with the connector) a new handle. */
static int mode_begin(mode_run *run, const options *o, const model *m, const workload *w,
                      const sizing *z, reference *ref) {
    engine *e = &run->e;
    *e = (engine){.m = m, .prefill_chunk = o->prefill_chunk, .stages = &run_stages};
    run->ref = run->use_connector ? ref : NULL;
    run->turns = calloc((size_t)w->n_turns, sizeof *run->turns);
    run->history = calloc((size_t)w->n_sessions, sizeof *run->history);
    run->n_history = calloc((size_t)w->n_sessions, sizeof *run->n_history);
    e->kv = make_cache(o, m, z->blocks, z->budget);
    e->s = model_scratch_create(m, o->prefill_chunk, (int)z->max_request);
    e->logits = malloc((size_t)model_config_of(m)->vocab * sizeof *e->logits);
    e->table = calloc(z->blocks, sizeof *e->table);
    e->tokens = malloc((size_t)z->max_request * sizeof *e->tokens);
    if (!run->turns || !run->history || !run->n_history || !e->kv || !e->s || !e->logits ||
        !e->table || !e->tokens) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    for (int s = 0; s < w->n_sessions; s++) {
        int32_t *h = malloc((size_t)z->max_request * sizeof *h);
        if (!h) {
            fprintf(stderr, PROG ": out of memory\n");
            return -1;
        }
        run->history[s] = h;
        memcpy(h, w->system, (size_t)w->n_system * sizeof(int32_t));
        if (w->n_docs[s])
            memcpy(h + w->n_system, w->docs[s], (size_t)w->n_docs[s] * sizeof(int32_t));
        run->n_history[s] = (uint64_t)w->n_system + (uint64_t)w->n_docs[s];
    }
    if (run->use_connector) {
        if (connector_open(&run->conn, o->lib_path, o->config_path, o->dtype, m, e->kv,
                           o->restore_plans, &run_stages) != 0)
            return -1;
        e->conn = &run->conn;
    }
    if (o->batch > 1) {
        run->more = calloc((size_t)o->batch - 1, sizeof *run->more);
        if (!run->more) {
            fprintf(stderr, PROG ": out of memory\n");
            return -1;
        }
        run->n_more = o->batch - 1;
        for (int k = 0; k < run->n_more; k++) {
            engine *x = &run->more[k];
            *x = (engine){.m = m,
                          .s = e->s,
                          .kv = e->kv,
                          .conn = e->conn,
                          .prefill_chunk = e->prefill_chunk,
                          .stages = e->stages};
            x->logits = malloc((size_t)model_config_of(m)->vocab * sizeof *x->logits);
            x->table = calloc(z->blocks, sizeof *x->table);
            x->tokens = malloc((size_t)z->max_request * sizeof *x->tokens);
            if (!x->logits || !x->table || !x->tokens) {
                fprintf(stderr, PROG ": out of memory\n");
                return -1;
            }
        }
    }
    return 0;
}

static void print_turn(const mode_run *run, const options *o, const workload *w,
                       const turn_result *r) {
    if (o->quiet) return;
    printf("[%-12s] %-8s turn %-2d prompt %6llu  local %6llu  connector %6llu  ttft %8.2f ms%s\n",
           run->name, w->session_names[r->session], r->turn, (unsigned long long)r->prompt,
           (unsigned long long)r->local_hit, (unsigned long long)r->ext_hit, r->ttft_ms,
           r->error_blocks ? "  (load errors: recomputed)" : "");
    fflush(stdout);
}

/* Serve turn i of the workload: the prompt is the session's history plus the new user tokens. */
static int mode_turn(mode_run *run, const options *o, const workload *w, int i) {
    engine *e = &run->e;
    const workload_turn *t = &w->turns[i];
    const int s = t->session;
    const uint64_t n_prompt = run->n_history[s] + (uint64_t)t->n_user;
    memcpy(e->tokens, run->history[s], run->n_history[s] * sizeof(int32_t));
    memcpy(e->tokens + run->n_history[s], t->user, (size_t)t->n_user * sizeof(int32_t));
    char req_id[256];
    snprintf(req_id, sizeof req_id, "%.200s/turn%d", w->session_names[s], t->turn);
    turn_result *r = &run->turns[i];
    r->session = s;
    r->turn = t->turn;
    if (run->ref) {
        run->ref->session = w->session_names[s];
        run->ref->turn = t->turn;
    }
    if (engine_serve(e, req_id, n_prompt, t->output_tokens, r, run->ref ? reference_check : NULL,
                     run->ref) != 0)
        return -1;
    /* The session's history is now the prompt plus what was generated. */
    run->n_history[s] = n_prompt + (uint64_t)t->output_tokens;
    memcpy(run->history[s], e->tokens, run->n_history[s] * sizeof(int32_t));
    print_turn(run, o, w, r);
    return 0;
}

/* --batch: serve turns [i, i + n) (different sessions) together: admit each, restore their
 * prefixes in one step planned as a batch, then run each. TTFT counts from the group's arrival. */
static int mode_group(mode_run *run, const options *o, const workload *w, int i, int n) {
    engine *es[64];
    admitted as[64];
    char ids[64][256];
    const double t0 = engine_now_ms();
    for (int j = 0; j < n; j++) {
        engine *e = j == 0 ? &run->e : &run->more[j - 1];
        const workload_turn *t = &w->turns[i + j];
        const int s = t->session;
        const uint64_t n_prompt = run->n_history[s] + (uint64_t)t->n_user;
        memcpy(e->tokens, run->history[s], run->n_history[s] * sizeof(int32_t));
        memcpy(e->tokens + run->n_history[s], t->user, (size_t)t->n_user * sizeof(int32_t));
        snprintf(ids[j], sizeof ids[j], "%.200s/turn%d", w->session_names[s], t->turn);
        es[j] = e;
        if (engine_admit(e, ids[j], n_prompt, t->output_tokens, t0, &as[j]) != 0) return -1;
    }
    if (run->e.conn && engine_restore_batch(es, as, n) != 0) return -1;
    for (int j = 0; j < n; j++) {
        const workload_turn *t = &w->turns[i + j];
        const int s = t->session;
        turn_result *r = &run->turns[i + j];
        r->session = s;
        r->turn = t->turn;
        if (run->ref) {
            run->ref->session = w->session_names[s];
            run->ref->turn = t->turn;
        }
        double checking = run->ref ? run->ref->check_ms : 0;
        if (engine_run(es[j], &as[j], r, run->ref ? reference_check : NULL, run->ref) != 0)
            return -1;
        /* --verify's reference runs inside the group: it is no one's waiting time */
        if (run->ref)
            for (int k = j + 1; k < n; k++) as[k].t0 += run->ref->check_ms - checking;
        run->n_history[s] = as[j].n_prompt + (uint64_t)t->output_tokens;
        memcpy(run->history[s], es[j]->tokens, run->n_history[s] * sizeof(int32_t));
        print_turn(run, o, w, r);
    }
    return 0;
}

/* How many turns from i on form the next group: at most --batch, all of different sessions. */
static int group_size(const options *o, const workload *w, int i) {
    int n = 1;
    while (n < o->batch && n < 64 && i + n < w->n_turns) {
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= w->turns[i + j].session == w->turns[i + n].session;
        if (dup) break;
        n++;
    }
    return n;
}

/* Collect the counters. */
static int mode_collect(mode_run *run) {
    if (run->e.conn) {
        if (connector_stats(&run->conn, &run->stats) != 0) return -1;
        run->have_stats = 1;
        run->events_stored = run->conn.events_stored;
        run->events_removed = run->conn.events_removed;
    }
    if (run->e.kv) run->cache = kvcache_get_stats(run->e.kv);
    return 0;
}

static void mode_end(mode_run *run, const workload *w) {
    connector_close(&run->conn);
    for (int s = 0; run->history && s < w->n_sessions; s++) free(run->history[s]);
    free(run->history);
    free(run->n_history);
    for (int k = 0; k < run->n_more; k++) {
        free(run->more[k].logits);
        free(run->more[k].table);
        free(run->more[k].tokens);
    }
    free(run->more);
    run->more = NULL;
    run->n_more = 0;
    kvcache_destroy(run->e.kv);
    model_scratch_free(run->e.s);
    free(run->e.logits);
    free(run->e.table);
    free(run->e.tokens);
    free(run->turns);
    run->history = NULL;
    run->n_history = NULL;
    run->turns = NULL;
    memset(&run->e, 0, sizeof run->e);
}

/* Summary ----------------------------------------------------------------------------------------------- */

typedef struct ttft_summary {
    int n;
    double mean, p50, p99;
    uint64_t local_hit, ext_hit;
} ttft_summary;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double percentile(const double *v, int n, double p) {
    int rank = (int)ceil(p / 100.0 * n);
    if (rank < 1) rank = 1;
    return v[rank - 1];
}

enum { GROUP_LATER, GROUP_LATER_2K, GROUP_ALL, N_GROUPS };
static const char *const group_names[N_GROUPS] = {"turns after the first",
                                                  "  of them prompt >= 2048", "all turns"};
static const char *const group_keys[N_GROUPS] = {"later_turns", "later_turns_2k", "all_turns"};

static int in_group(const turn_result *r, int group) {
    switch (group) {
        case GROUP_LATER: return r->turn > 0;
        case GROUP_LATER_2K: return r->turn > 0 && r->prompt >= 2048;
        default: return 1;
    }
}

static ttft_summary summarize(const turn_result *turns, int n_turns, int group) {
    ttft_summary s = {0};
    double *v = malloc((size_t)(n_turns > 0 ? n_turns : 1) * sizeof *v);
    if (!v) return s;
    double sum = 0;
    for (int i = 0; i < n_turns; i++) {
        if (!in_group(&turns[i], group)) continue;
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

static void print_json(const options *o, const workload *w, const sizing *z, const mode_run *runs,
                       int n_runs, const reference *ref, ttft_summary s[2][N_GROUPS]);

static void print_summary(const options *o, const workload *w, const sizing *z, mode_run *runs,
                          int n_runs, const reference *ref) {
    const model_config *mc = &o->model;
    printf("\nsummary: layout %s, dtype %s, model d%d l%d h%d kv%d%s, %d turns in %d sessions, "
           "%u pages (budget %u)\n",
           kv_layout_name(o->layout), kv_dtype_name(o->dtype), mc->dim, mc->n_layers, mc->n_heads,
           mc->is_mla ? 1 : mc->n_kv_heads, mc->is_mla ? " (MLA)" : "", w->n_turns, w->n_sessions,
           z->blocks, z->budget);
    printf("TTFT ms                      n   %-28s", n_runs > 1 ? "with connector" : runs[0].name);
    if (n_runs > 1) printf("%-28s speedup", "without connector");
    printf("\n                                 %-28s", "mean / p50 / p99");
    if (n_runs > 1) printf("%-28s mean / p50", "mean / p50 / p99");
    printf("\n");
    ttft_summary s[2][N_GROUPS];
    for (int g = 0; g < N_GROUPS; g++) {
        for (int k = 0; k < n_runs; k++) s[k][g] = summarize(runs[k].turns, w->n_turns, g);
        printf("%-25s %5d   ", group_names[g], s[0][g].n);
        for (int k = 0; k < n_runs; k++) {
            char cell[64];
            snprintf(cell, sizeof cell, "%.1f / %.1f / %.1f", s[k][g].mean, s[k][g].p50,
                     s[k][g].p99);
            printf("%-28s", cell);
        }
        if (n_runs > 1 && s[0][g].n && s[0][g].mean > 0 && s[0][g].p50 > 0)
            printf(" %.2fx / %.2fx", s[1][g].mean / s[0][g].mean, s[1][g].p50 / s[0][g].p50);
        printf("\n");
    }
    for (int k = 0; k < n_runs; k++) {
        printf("%s: hit tokens local %llu, connector %llu; engine evictions %llu", runs[k].name,
               (unsigned long long)s[k][GROUP_ALL].local_hit,
               (unsigned long long)s[k][GROUP_ALL].ext_hit,
               (unsigned long long)runs[k].cache.evictions);
        if (runs[k].have_stats) {
            const kvs_stats *st = &runs[k].stats;
            printf("; connector chunks loaded %llu (%.1f MiB, %.2f GB/s), saved %llu (%.1f MiB), "
                   "skipped %llu, "
                   "load errors %llu, events stored %llu removed %llu",
                   (unsigned long long)st->chunks_loaded, (double)st->bytes_loaded / 1048576.0,
                   st->load_gbps, (unsigned long long)st->chunks_saved,
                   (double)st->bytes_saved / 1048576.0, (unsigned long long)st->saves_skipped,
                   (unsigned long long)st->load_errors, (unsigned long long)runs[k].events_stored,
                   (unsigned long long)runs[k].events_removed);
            printf("; loaded per tier [");
            for (uint32_t t = 0; t < st->n_tiers && t < KVS_STATS_MAX_TIERS; t++)
                printf("%s%llu", t ? ", " : "", (unsigned long long)st->tier_chunks_loaded[t]);
            printf("]");
            if (runs[k].conn.plans)
                printf("; restore plans followed: token %llu, layer %llu, stage %llu, recompute "
                       "%llu (%llu tokens "
                       "recomputed)",
                       (unsigned long long)runs[k].conn.plans_token,
                       (unsigned long long)runs[k].conn.plans_layer,
                       (unsigned long long)runs[k].conn.plans_stage,
                       (unsigned long long)runs[k].conn.plans_recompute,
                       (unsigned long long)runs[k].conn.plan_recomputed_tokens);
            if (runs[k].conn.plans && o->stages > 1)
                printf("; stages restored from their boundary %llu",
                       (unsigned long long)runs[k].conn.stage_boundary_restores);
        }
        printf("\n");
    }
    if (ref)
        printf("verify: %d turns with connector hits checked bit for bit, %d mismatches\n",
               ref->turns_checked, ref->mismatches);
    if (o->json) print_json(o, w, z, runs, n_runs, ref, s);
    fflush(stdout);
}

static void print_json(const options *o, const workload *w, const sizing *z, const mode_run *runs,
                       int n_runs, const reference *ref, ttft_summary s[2][N_GROUPS]) {
    printf("{\"layout\":\"%s\",\"dtype\":\"%s\",\"turns\":%d,\"sessions\":%d,\"blocks\":%u,\"block_"
           "budget\":%u",
           kv_layout_name(o->layout), kv_dtype_name(o->dtype), w->n_turns, w->n_sessions, z->blocks,
           z->budget);
    for (int k = 0; k < n_runs; k++) {
        printf(",\"%s\":{", runs[k].use_connector ? "connector" : "no_connector");
        for (int g = 0; g < N_GROUPS; g++)
            printf("%s\"%s\":{\"n\":%d,\"mean_ms\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
                   "\"local_hit_tokens\":%llu,\"connector_hit_tokens\":%llu}",
                   g ? "," : "", group_keys[g], s[k][g].n, s[k][g].mean, s[k][g].p50, s[k][g].p99,
                   (unsigned long long)s[k][g].local_hit, (unsigned long long)s[k][g].ext_hit);
        if (runs[k].have_stats)
            printf(",\"chunks_loaded\":%llu,\"chunks_saved\":%llu,\"load_errors\":%llu",
                   (unsigned long long)runs[k].stats.chunks_loaded,
                   (unsigned long long)runs[k].stats.chunks_saved,
                   (unsigned long long)runs[k].stats.load_errors);
        if (runs[k].have_stats) {
            printf(",\"tier_chunks_loaded\":[");
            for (uint32_t t = 0; t < runs[k].stats.n_tiers && t < KVS_STATS_MAX_TIERS; t++)
                printf("%s%llu", t ? "," : "",
                       (unsigned long long)runs[k].stats.tier_chunks_loaded[t]);
            printf("]");
            if (runs[k].conn.plans)
                printf(",\"plans_token\":%llu,\"plans_layer\":%llu,\"plans_stage\":%llu,\"plans_"
                       "recompute\":%llu,"
                       "\"plan_recomputed_tokens\":%llu,\"stage_boundary_restores\":%llu",
                       (unsigned long long)runs[k].conn.plans_token,
                       (unsigned long long)runs[k].conn.plans_layer,
                       (unsigned long long)runs[k].conn.plans_stage,
                       (unsigned long long)runs[k].conn.plans_recompute,
                       (unsigned long long)runs[k].conn.plan_recomputed_tokens,
                       (unsigned long long)runs[k].conn.stage_boundary_restores);
        }
        printf("}");
    }
    if (n_runs > 1) {
        for (int g = 0; g < N_GROUPS; g++)
            printf(",\"speedup_%s_mean\":%.3f", group_keys[g],
                   s[0][g].mean > 0 ? s[1][g].mean / s[0][g].mean : 0.0);
    }
    if (ref)
        printf(",\"verify\":{\"turns_checked\":%d,\"mismatches\":%d}", ref->turns_checked,
               ref->mismatches);
    printf("}\n");
}

/* --profile ------------------------------------------------------------------------------------------ */

static int run_profile(const options *o, const model *m) {
    uint64_t tokens = (uint64_t)o->profile_tokens;
    uint32_t blocks = (uint32_t)((tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS) * 2 + 1;
    engine e = {.m = m, .prefill_chunk = o->prefill_chunk};
    connector conn;
    memset(&conn, 0, sizeof conn);
    int rc = -1;
    e.kv = make_cache(o, m, blocks, blocks);
    e.s = model_scratch_create(m, o->prefill_chunk, (int)tokens + 1);
    e.logits = malloc((size_t)model_config_of(m)->vocab * sizeof *e.logits);
    e.table = calloc(blocks, sizeof *e.table);
    e.tokens = malloc(((size_t)tokens + 1) * sizeof *e.tokens);
    if (!e.kv || !e.s || !e.logits || !e.table || !e.tokens)
        fprintf(stderr, PROG ": out of memory\n");
    else if (connector_open(&conn, o->lib_path, o->config_path, o->dtype, m, e.kv, 0, NULL) == 0) {
        e.conn = &conn;
        rc = profile_run(&e, tokens, o->profile_tier, o->profile_path);
    }
    connector_close(&conn);
    kvcache_destroy(e.kv);
    model_scratch_free(e.s);
    free(e.logits);
    free(e.table);
    free(e.tokens);
    return rc;
}

/* main ------------------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    options o;
    if (parse_options(argc, argv, &o) != 0) return 2;
    char err[512];
    if (model_config_check(&o.model, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 2;
    }

    workload w;
    workload_params wp = {.vocab = o.model.vocab,
                          .seed = o.model.seed,
                          .system_tokens = o.system_tokens,
                          .doc_tokens = o.doc_tokens,
                          .user_tokens = o.user_tokens,
                          .output_tokens = o.decode_tokens,
                          .sessions = o.sessions,
                          .turns = o.turns};
    int wrc = o.trace_path ? workload_load_trace(o.trace_path, &wp, &w, err, sizeof err)
                           : workload_generate(&wp, &w, err, sizeof err);
    if (wrc != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 2;
    }

    /* Size the cache: the budget is a third of all sessions' final histories, so that interleaved
     * sessions push each other out, but never less than the largest request. */
    sizing z = {0};
    workload_sizes(&w, &z.max_prompt, &z.max_request, &z.total_history);
    uint64_t max_request_blocks = (z.max_request + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    uint64_t budget = o.block_budget;
    if (!budget) {
        budget = (z.total_history + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS / 3;
        if (budget < max_request_blocks * (uint64_t)o.batch + 1)
            budget =
                max_request_blocks * (uint64_t)o.batch + 1; /* a group holds its pages at once */
        if (o.blocks && budget > (uint64_t)o.blocks) budget = (uint64_t)o.blocks;
    }
    uint64_t blocks = o.blocks ? (uint64_t)o.blocks : budget;
    int rc = 1;
    if (budget > blocks) {
        fprintf(stderr, PROG ": --block-budget %llu exceeds --blocks %llu\n",
                (unsigned long long)budget, (unsigned long long)blocks);
        goto out_workload;
    }
    if (budget < max_request_blocks) {
        fprintf(stderr,
                PROG ": the largest request needs %llu pages but the block budget is %llu\n",
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

    if (o.profile_path) {
        stage_layout_init(&run_stages, m, o.dtype, 1, err,
                          sizeof err); /* profiles measure the model's layers */
        rc = run_profile(&o, m) == 0 ? 0 : 1;
        goto out_model_only;
    }
    if (stage_layout_init(&run_stages, m, o.dtype, o.stages, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        goto out_model_only;
    }
    for (int st = 1; st < run_stages.n_stages; st++)
        if (!(run_stages.scratch[st] =
                  model_scratch_create(m, o.prefill_chunk, (int)z.max_request))) {
            fprintf(stderr, PROG ": out of memory for the stage threads\n");
            goto out_model_only;
        }

    reference ref = {0};
    reference *refp = NULL;
    if (o.verify) {
        uint32_t ref_blocks = (uint32_t)((z.max_prompt + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
        ref.e = (engine){.m = m, .prefill_chunk = (int)z.max_prompt};
        ref.e.kv = make_cache(&o, m, ref_blocks, ref_blocks);
        ref.e.s = model_scratch_create(m, (int)z.max_prompt, (int)z.max_prompt);
        ref.e.logits = malloc((size_t)o.model.vocab * sizeof(float));
        ref.e.tokens = malloc((size_t)z.max_prompt * sizeof(int32_t));
        ref.identity = malloc(ref_blocks * sizeof *ref.identity);
        if (!ref.e.kv || !ref.e.s || !ref.e.logits || !ref.e.tokens || !ref.identity) {
            fprintf(stderr, PROG ": out of memory for the verify reference\n");
            goto out_model;
        }
        for (uint32_t i = 0; i < ref_blocks; i++) ref.identity[i] = i;
        refp = &ref;
    }

    /* Both modes run side by side, turn by turn, each with its own fresh engine: on a shared machine
     * they see the same background load, so the comparison is fair. */
    mode_run runs[2] = {{.name = "connector", .use_connector = 1},
                        {.name = "no-connector", .use_connector = 0}};
    mode_run *modes = o.no_connector ? &runs[1] : &runs[0];
    int n_modes = o.no_connector ? 1 : 2;
    int failed = 0;
    for (int k = 0; k < n_modes && !failed; k++)
        failed = mode_begin(&modes[k], &o, m, &w, &z, refp) != 0;
    for (int i = 0, g = 1; i < w.n_turns && !failed; i += g) {
        g = group_size(&o, &w, i);
        for (int k = 0; k < n_modes && !failed; k++)
            failed = (o.batch > 1 ? mode_group(&modes[k], &o, &w, i, g)
                                  : mode_turn(&modes[k], &o, &w, i)) != 0;
    }
    for (int k = 0; k < n_modes && !failed; k++) failed = mode_collect(&modes[k]) != 0;
    if (!failed) {
        print_summary(&o, &w, &z, modes, n_modes, refp);
        rc = 0;
        if (refp && ref.mismatches) {
            fprintf(stderr, PROG ": verify FAILED: %d of %d turns differ from a full recompute\n",
                    ref.mismatches, ref.turns_checked);
            rc = 1;
        } else if (refp && ref.turns_checked == 0) {
            fprintf(
                stderr, PROG
                ": verify FAILED: no turn had a connector hit, so nothing restored was checked\n");
            rc = 1;
        }
    }
    for (int k = 0; k < n_modes; k++) mode_end(&modes[k], &w);
out_model:
    if (o.verify) {
        kvcache_destroy(ref.e.kv);
        model_scratch_free(ref.e.s);
        free(ref.e.logits);
        free(ref.e.tokens);
        free(ref.identity);
    }
out_model_only:
    for (int st = 1; st < (int)KVS_MAX_STAGES; st++) model_scratch_free(run_stages.scratch[st]);
    model_free(m);
out_workload:
    workload_free(&w);
    return rc;
}
