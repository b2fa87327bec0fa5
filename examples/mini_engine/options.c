/* options.c - the command line of kvs-mini-engine (options.h): the usage text, and each flag parsed
 * and checked against the others. */
#include "options.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_plans.h"

#define PROG "kvs-mini-engine"

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
        "  --lsc                 instead of the workload: one request longer than the page "
        "budget,\n"
        "                        the rest of its KV in stream blocks a peer_gpu tier's lender\n"
        "                        lends, fetched a layer at a time (the layer stream cache,\n"
        "                        docs/peer_gpu.md); reports the maximum context against Eq. 4-5,\n"
        "                        prefill and TPOT against all-local KV (with --verify: bit for "
        "bit)\n"
        "  --peer-blocks N       stream blocks to ask the lender for (default: as many as help)\n"
        "  --lsc-buffers 1|2     layer stream buffers: 2 fetches layer i+1 while layer i runs (2)\n"
        "  --sparse-decode       instead of the workload: one prompt of --sparse-context tokens\n"
        "                        prefilled and saved, then --decode-tokens steps attending per KV\n"
        "                        head to the sink, the recent rows and the top-k rows the "
        "connector\n"
        "                        selects from the tiers (docs/sparse.md); with --verify the "
        "logits\n"
        "                        against the same rows from the prefill's KV, bit for bit\n"
        "  --topk K              rows selected per KV head and step (64)\n"
        "  --sparse-context N    the prompt's tokens (4096)\n"
        "  --sparse-sink N       leading rows always attended (4)\n"
        "  --sparse-recent N     trailing rows always attended (64)\n"
        "  --sparse-layout rows|swarm|positions  rows read from their chunks; Swarm's clusters\n"
        "                        written into the SSD tier after --profile-steps steps; or the\n"
        "                        same objects of consecutive rows, no profiling (rows)\n"
        "  --profile-steps N     swarm: steps of each layer profiled before clustering (16)\n"
        "  --cluster-cache N     swarm: rows of hot clusters kept in DRAM (0)\n"
        "  --cluster-policy score|lru  swarm: which clusters the cache keeps (score: Eq. 6)\n"
        "  --sparse-adapt E      thresholds adapt to keep the attention reused rows lose under\n"
        "                        E, measured on every 8th step of a head (0: static)\n"
        "  --sparse-index exact|medoids  how a miss selects: the exact top-k, or (with a\n"
        "                        cluster layout) whole clusters by medoid score (exact)\n"
        "  --profile FILE        measure recompute and load costs, write them as a restore "
        "profile, exit\n"
        "  --profile-tier NAME   tier name written into the profile (dram)\n"
        "  --profile-tokens N    prompt length the profile measures (4096)\n"
        "  --batch N             admit up to N turns of different sessions at once and restore "
        "their\n"
        "                        prefixes in one step the connector plans as a batch (1)\n"
        "  --continuous N        serve with up to N turns in flight, stepped together; the next "
        "turn\n"
        "                        arrives as soon as one finishes (off)\n"
        "  --arrival-ms T        with --continuous: turn i arrives T*i ms after the start instead; "
        "TTFT\n"
        "                        counts from then, waiting for a free slot included (0)\n"
        "model:\n"
        "  --dim N (128) --layers N (3) --heads N (4) --kv-heads N (2) --ffn N (256)\n"
        "  --vocab N (2048) --seed N (42) --latent N (64, MLA latent width)\n"
        "  --weights FILE|default  trained weights instead of seeded ones (the shape is the "
        "file's);\n"
        "                        'default': the byte-level model shipped with the build, the one\n"
        "                        for quality runs (examples/mini_engine/train/README.md)\n"
        "  --text FILE|default|none  prompts are slices of this text instead of random tokens;\n"
        "                        'default' (implied by --weights of a byte model): the held-out\n"
        "                        sample shipped beside the weights; 'none': random tokens\n"
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
        "                        (lossy hits, from a compress tier: by prediction, within bounds)\n"
        "  --lossy-kl X          --verify fails when lossy hits' mean KL divergence of the next\n"
        "                        token exceeds X nats (0.1)\n"
        "  --lossy-top1 X        ... or their top-1 agreement falls below X (0.8)\n"
        "  --no-mask             act as an engine that cannot mask dropped tokens: hits end\n"
        "                        before chunks a compress tier stored with tokens dropped\n"
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

int parse_options(int argc, char **argv, options *o) {
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
        .lossy_kl = 0.1,
        .lossy_top1 = 0.8,
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
        .lsc_buffers = 2,
        .topk = 64,
        .sparse_context = 4096,
        .sparse_sink = 4,
        .sparse_recent = 64,
        .profile_steps = 16,
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
        {"--continuous", &o->continuous, 1},
        {"--arrival-ms", &o->arrival_ms, 0},
        {"--stages", &o->stages, 1},
        {"--peer-blocks", &o->peer_blocks, 1},
        {"--lsc-buffers", &o->lsc_buffers, 1},
        {"--topk", &o->topk, 1},
        {"--sparse-context", &o->sparse_context, 64},
        {"--sparse-sink", &o->sparse_sink, 0},
        {"--sparse-recent", &o->sparse_recent, 1},
        {"--profile-steps", &o->profile_steps, 1},
        {"--cluster-cache", &o->cluster_cache, 0},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int matched = 0;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
            if (strcmp(a, ints[k].name) == 0) {
                if (parse_int_flag(a, v, ints[k].min, ints[k].dst) != 0) return -1;
                if (ints[k].dst == &o->model.dim || ints[k].dst == &o->model.n_layers ||
                    ints[k].dst == &o->model.n_heads || ints[k].dst == &o->model.n_kv_heads ||
                    ints[k].dst == &o->model.ffn || ints[k].dst == &o->model.vocab)
                    o->shape_given = 1;
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
        } else if (strcmp(a, "--lsc") == 0) {
            o->lsc = 1;
        } else if (strcmp(a, "--sparse-decode") == 0) {
            o->sparse_decode = 1;
        } else if (strcmp(a, "--sparse-layout") == 0 || strcmp(a, "--cluster-policy") == 0 ||
                   strcmp(a, "--sparse-index") == 0) {
            int layout = strcmp(a, "--sparse-layout") == 0;
            int index = strcmp(a, "--sparse-index") == 0;
            if (index) {
                if (!v || (strcmp(v, "exact") != 0 && strcmp(v, "medoids") != 0)) {
                    fprintf(stderr, PROG ": --sparse-index is exact or medoids\n");
                    return -1;
                }
                o->sparse_medoids = strcmp(v, "medoids") == 0;
                i++;
                continue;
            }
            const char *names[2][3] = {{"score", "lru", NULL}, {"rows", "swarm", "positions"}};
            int pick = -1;
            for (int k = 0; v && k < 3; k++)
                if (names[layout][k] && strcmp(v, names[layout][k]) == 0) pick = k;
            if (pick < 0) {
                fprintf(stderr, PROG ": %s is %s\n", a,
                        layout ? "rows, swarm or positions" : "score or lru");
                return -1;
            }
            *(layout ? &o->sparse_swarm : &o->cluster_lru) = pick;
            i++;
        } else if (strcmp(a, "--no-mask") == 0) {
            o->no_mask = 1;
        } else if (strcmp(a, "--restore-plans") == 0) {
            if (!o->restore_plans) o->restore_plans = KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER;
        } else if (!v && (strcmp(a, "--profile") == 0 || strcmp(a, "--profile-tier") == 0 ||
                          strcmp(a, "--plan-modes") == 0 || strcmp(a, "--lib") == 0 ||
                          strcmp(a, "--config") == 0 || strcmp(a, "--trace") == 0 ||
                          strcmp(a, "--seed") == 0 || strcmp(a, "--dtype") == 0 ||
                          strcmp(a, "--layout") == 0 || strcmp(a, "--weights") == 0 ||
                          strcmp(a, "--text") == 0 || strcmp(a, "--lossy-kl") == 0 ||
                          strcmp(a, "--lossy-top1") == 0 || strcmp(a, "--sparse-adapt") == 0)) {
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
        } else if (strcmp(a, "--weights") == 0) {
            o->weights_path = argv[++i];
        } else if (strcmp(a, "--text") == 0) {
            o->text_path = argv[++i];
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
        } else if (strcmp(a, "--sparse-adapt") == 0) {
            char *end;
            errno = 0;
            double x = strtod(v, &end);
            if (errno || *end || end == v || !(x >= 0) || x > 1) {
                fprintf(stderr, PROG ": --sparse-adapt needs a number in [0, 1], got '%s'\n", v);
                return -1;
            }
            o->sparse_adapt = x;
            i++;
        } else if (strcmp(a, "--lossy-kl") == 0 || strcmp(a, "--lossy-top1") == 0) {
            char *end;
            errno = 0;
            double x = strtod(v, &end);
            int kl = strcmp(a, "--lossy-kl") == 0;
            if (errno || *end || end == v || !(x >= 0) || (!kl && x > 1)) {
                fprintf(stderr, PROG ": %s needs a number %s, got '%s'\n", a,
                        kl ? ">= 0" : "in [0, 1]", v);
                return -1;
            }
            *(kl ? &o->lossy_kl : &o->lossy_top1) = x;
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
    if (o->weights_path && (o->shape_given || o->model.is_mla)) {
        fprintf(stderr, PROG ": --weights fixes the model (a GQA model of the file's shape): drop "
                             "--dim, --layers, --heads, --kv-heads, --ffn, --vocab and "
                             "--layout mla\n");
        return -1;
    }
    if (o->lsc_buffers > 2) {
        fprintf(stderr, PROG ": --lsc-buffers is 1 or 2\n");
        return -1;
    }
    if ((o->peer_blocks || o->lsc_buffers != 2) && !o->lsc) {
        fprintf(stderr, PROG ": --peer-blocks and --lsc-buffers size the layer stream cache: add "
                             "--lsc\n");
        return -1;
    }
    if (o->lsc && (o->no_connector || o->restore_plans || o->stages > 1 || o->batch > 1 ||
                   o->continuous || o->profile_path || o->trace_path)) {
        fprintf(stderr, PROG ": --lsc runs one long request of its own through the connector: "
                             "drop --no-connector, --restore-plans, --stages, --batch, "
                             "--continuous, --profile and --trace\n");
        return -1;
    }
    if (o->sparse_decode && (o->lsc || o->no_connector || o->restore_plans || o->stages > 1 ||
                             o->batch > 1 || o->continuous || o->profile_path || o->trace_path)) {
        fprintf(stderr, PROG ": --sparse-decode runs one long request of its own through the "
                             "connector: drop --lsc, --no-connector, --restore-plans, --stages, "
                             "--batch, --continuous, --profile and --trace\n");
        return -1;
    }
    if (o->sparse_medoids && !o->sparse_swarm) {
        fprintf(stderr, PROG ": --sparse-index medoids needs --sparse-layout swarm or positions\n");
        return -1;
    }
    if (o->sparse_decode &&
        (o->sparse_context > (1 << 20) || o->decode_tokens > 4096 || o->topk > o->sparse_context)) {
        fprintf(stderr, PROG ": --sparse-decode: --sparse-context at most 1048576, "
                             "--decode-tokens at most 4096, --topk at most the context\n");
        return -1;
    }
    if (o->batch > 64 || o->continuous > 64) {
        fprintf(stderr, PROG ": --batch and --continuous are at most 64\n");
        return -1;
    }
    if (o->arrival_ms && !o->continuous) {
        fprintf(stderr, PROG ": --arrival-ms paces the arrivals of --continuous: add it\n");
        return -1;
    }
    if (o->continuous && o->batch > 1) {
        fprintf(stderr, PROG ": --continuous and --batch are two ways of arriving: pick one\n");
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
