/* options.c - kvs-mini-research's flags (research.h): the table, the defaults and the checks
 * between them and the reference engine's. */
#include <stddef.h>
#include <stdio.h>

#include "abi/kvstrata_plans.h"
#include "examples/mini_engine/engine.h"
#include "research.h"

#define X(f) offsetof(research, f)

static const flag_choice plan_modes[] = {{"token", KVS_PLAN_CAP_TOKEN},
                                         {"layer", KVS_PLAN_CAP_LAYER},
                                         {"both", KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER},
                                         {"stage", KVS_PLAN_CAP_STAGE},
                                         {NULL, 0}};
static const flag_choice sparse_layouts[] = {
    {"rows", 0}, {"swarm", 1}, {"positions", 2}, {NULL, 0}};
static const flag_choice cluster_policies[] = {{"score", 0}, {"lru", 1}, {NULL, 0}};
static const flag_choice sparse_indexes[] = {{"exact", 0}, {"medoids", 1}, {NULL, 0}};

static const flag research_flags[] = {
    {.type = FLAG_SECTION, .help = "restore plans and pipeline stages"},
    {.name = "--restore-plans",
     .type = FLAG_BOOL,
     .field = X(restore_plans),
     .arg = NULL,
     .help = "execute restore plans (needs restore.scheduler: cacheflow): token plans\n"
             "recompute the front of a restored range while the back loads, layer\n"
             "plans its lower layers while the upper ones load"},
    {.name = "--plan-modes",
     .type = FLAG_CHOICE,
     .field = X(plan_modes),
     .arg = "token|layer|both|stage",
     .help = "the plans --restore-plans accepts (both; with --stages\n"
             "also stage plans; 'stage': stage plans only)",
     .choices = plan_modes},
    {.name = "--stages",
     .type = FLAG_INT,
     .field = X(stages),
     .arg = "N",
     .help = "split the layers into N pipeline stages whose input activations are\n"
             "stored with the KV; stage plans restore each stage's layers from them\n"
             "on a thread per stage (1)",
     .min = 1},
    {.name = "--profile",
     .type = FLAG_STRING,
     .field = X(profile_path),
     .arg = "FILE",
     .help = "measure recompute and load costs, write them as a restore profile, exit"},
    {.name = "--profile-tier",
     .type = FLAG_STRING,
     .field = X(profile_tier),
     .arg = "NAME",
     .help = "tier name written into the profile (dram)"},
    {.name = "--profile-tokens",
     .type = FLAG_INT,
     .field = X(profile_tokens),
     .arg = "N",
     .help = "prompt length the profile measures (4096)",
     .min = 64},
    {.type = FLAG_SECTION, .help = "requests in flight together"},
    {.name = "--batch",
     .type = FLAG_INT,
     .field = X(batch),
     .arg = "N",
     .help = "admit up to N turns of different sessions at once and restore their\n"
             "prefixes in one step the connector plans as a batch (1)",
     .min = 1},
    {.name = "--continuous",
     .type = FLAG_INT,
     .field = X(continuous),
     .arg = "N",
     .help = "serve with up to N turns in flight, stepped together; the next turn\n"
             "arrives as soon as one finishes (off)",
     .min = 1},
    {.name = "--arrival-ms",
     .type = FLAG_INT,
     .field = X(arrival_ms),
     .arg = "T",
     .help = "with --continuous: turn i arrives T*i ms after the start instead; TTFT\n"
             "counts from then, waiting for a free slot included (0)",
     .min = 0},
    {.type = FLAG_SECTION, .help = "layer stream cache"},
    {.name = "--lsc",
     .type = FLAG_BOOL,
     .field = X(lsc),
     .arg = NULL,
     .help = "instead of the workload: one request longer than the page budget,\n"
             "the rest of its KV in stream blocks a peer_gpu tier's lender\n"
             "lends, fetched a layer at a time (the layer stream cache,\n"
             "docs/peer_gpu.md); reports the maximum context against Eq. 4-5,\n"
             "prefill and TPOT against all-local KV (with --verify: bit for bit)"},
    {.name = "--peer-blocks",
     .type = FLAG_INT,
     .field = X(peer_blocks),
     .arg = "N",
     .help = "stream blocks to ask the lender for (default: as many as help)",
     .min = 1},
    {.name = "--lsc-buffers",
     .type = FLAG_INT,
     .field = X(lsc_buffers),
     .arg = "1|2",
     .help = "layer stream buffers: 2 fetches layer i+1 while layer i runs (2)",
     .min = 1},
    {.type = FLAG_SECTION, .help = "sparse decode"},
    {.name = "--sparse-decode",
     .type = FLAG_BOOL,
     .field = X(sparse_decode),
     .arg = NULL,
     .help = "instead of the workload: one prompt of --sparse-context tokens\n"
             "prefilled and saved, then --decode-tokens steps attending per KV\n"
             "head to the sink, the recent rows and the top-k rows the connector\n"
             "selects from the tiers (docs/sparse.md); with --verify the logits\n"
             "against the same rows from the prefill's KV, bit for bit"},
    {.name = "--topk",
     .type = FLAG_INT,
     .field = X(topk),
     .arg = "K",
     .help = "rows selected per KV head and step (64)",
     .min = 1},
    {.name = "--sparse-context",
     .type = FLAG_INT,
     .field = X(sparse_context),
     .arg = "N",
     .help = "the prompt's tokens (4096)",
     .min = 64},
    {.name = "--sparse-sink",
     .type = FLAG_INT,
     .field = X(sparse_sink),
     .arg = "N",
     .help = "leading rows always attended (4)",
     .min = 0},
    {.name = "--sparse-recent",
     .type = FLAG_INT,
     .field = X(sparse_recent),
     .arg = "N",
     .help = "trailing rows always attended (64)",
     .min = 1},
    {.name = "--sparse-layout",
     .type = FLAG_CHOICE,
     .field = X(sparse_swarm),
     .arg = "rows|swarm|positions",
     .help = "rows read from their chunks; Swarm's clusters\n"
             "written into the SSD tier after --profile-steps steps; or the\n"
             "same objects of consecutive rows, no profiling (rows)",
     .choices = sparse_layouts},
    {.name = "--profile-steps",
     .type = FLAG_INT,
     .field = X(profile_steps),
     .arg = "N",
     .help = "swarm: steps of each layer profiled before clustering (16)",
     .min = 1},
    {.name = "--cluster-cache",
     .type = FLAG_INT,
     .field = X(cluster_cache),
     .arg = "N",
     .help = "swarm: rows of hot clusters kept in DRAM (0)",
     .min = 0},
    {.name = "--cluster-policy",
     .type = FLAG_CHOICE,
     .field = X(cluster_lru),
     .arg = "score|lru",
     .help = "swarm: which clusters the cache keeps (score: Eq. 6)",
     .choices = cluster_policies},
    {.name = "--sparse-adapt",
     .type = FLAG_DOUBLE,
     .field = X(sparse_adapt),
     .arg = "E",
     .help = "thresholds adapt to keep the attention reused rows lose under\n"
             "E, measured on every 8th step of a head (0: static)",
     .max = 1},
    {.name = "--sparse-index",
     .type = FLAG_CHOICE,
     .field = X(sparse_medoids),
     .arg = "exact|medoids",
     .help = "how a miss selects: the exact top-k, or (with a\n"
             "cluster layout) whole clusters by medoid score (exact)",
     .choices = sparse_indexes},
};

static void research_defaults(research *x) {
    *x = (research){.stages = 1,
                    .profile_tier = "dram",
                    .profile_tokens = 4096,
                    .batch = 1,
                    .lsc_buffers = 2,
                    .topk = 64,
                    .sparse_context = 4096,
                    .sparse_sink = 4,
                    .sparse_recent = 64,
                    .profile_steps = 16};
}

/* The modes that serve a request of their own instead of the workload, against everything else. */
static int check_own_request(const options *o, const research *x) {
    if (x->lsc_buffers > 2) {
        mini_err("--lsc-buffers is 1 or 2\n");
        return -1;
    }
    if ((x->peer_blocks || x->lsc_buffers != 2) && !x->lsc) {
        mini_err("--peer-blocks and --lsc-buffers size the layer stream cache: add --lsc\n");
        return -1;
    }
    if (x->lsc && (o->no_connector || x->restore_plans || x->stages > 1 || x->batch > 1 ||
                   x->continuous || x->profile_path || o->trace_path)) {
        mini_err("--lsc runs one long request of its own through the connector: drop "
                 "--no-connector, --restore-plans, --stages, --batch, --continuous, --profile and "
                 "--trace\n");
        return -1;
    }
    if (x->sparse_decode && (x->lsc || o->no_connector || x->restore_plans || x->stages > 1 ||
                             x->batch > 1 || x->continuous || x->profile_path || o->trace_path)) {
        mini_err("--sparse-decode runs one long request of its own through the connector: drop "
                 "--lsc, --no-connector, --restore-plans, --stages, --batch, --continuous, "
                 "--profile and --trace\n");
        return -1;
    }
    if (x->sparse_medoids && !x->sparse_swarm) {
        mini_err("--sparse-index medoids needs --sparse-layout swarm or positions\n");
        return -1;
    }
    if (x->sparse_decode &&
        (x->sparse_context > (1 << 20) || o->decode_tokens > 4096 || x->topk > x->sparse_context)) {
        mini_err("--sparse-decode: --sparse-context at most 1048576, --decode-tokens at most 4096, "
                 "--topk at most the context\n");
        return -1;
    }
    return 0;
}

/* Requests in flight together and restore plans, against each other. */
static int check_workload_modes(const options *o, research *x) {
    if (x->batch > 64 || x->continuous > 64) {
        mini_err("--batch and --continuous are at most 64\n");
        return -1;
    }
    if (x->arrival_ms && !x->continuous) {
        mini_err("--arrival-ms paces the arrivals of --continuous: add it\n");
        return -1;
    }
    if (x->continuous && x->batch > 1) {
        mini_err("--continuous and --batch are two ways of arriving: pick one\n");
        return -1;
    }
    if (x->restore_plans && x->plan_modes)
        x->restore_plans = x->plan_modes;
    else if (x->restore_plans && x->stages > 1)
        x->restore_plans |= KVS_PLAN_CAP_STAGE;
    if ((x->plan_modes & KVS_PLAN_CAP_STAGE) && x->stages < 2) {
        mini_err("--plan-modes stage needs --stages 2 or more\n");
        return -1;
    }
    if (x->plan_modes && !x->restore_plans) {
        mini_err("--plan-modes needs --restore-plans\n");
        return -1;
    }
    if (o->turns_out) {
        mini_err("--turns-out is kvs-mini-engine's alone: this program serves groups of turns\n");
        return -1;
    }
    if ((x->restore_plans || x->profile_path) && o->no_connector) {
        mini_err("--restore-plans and --profile need the connector (drop --no-connector)\n");
        return -1;
    }
    return 0;
}

int parse_research(int argc, char **argv, options *o, research *x) {
    options_defaults(o);
    research_defaults(x);
    flag_table t[2] = {{options_flags, options_n_flags, o},
                       {research_flags, sizeof research_flags / sizeof research_flags[0], x}};
    unsigned groups = 0;
    if (flags_parse(mini_prog, t, 2, argc, argv, &groups) != 0) return -1;
    if (x->restore_plans) x->restore_plans = KVS_PLAN_CAP_TOKEN | KVS_PLAN_CAP_LAYER;
    if (options_check(o, groups) != 0 || check_own_request(o, x) != 0) return -1;
    return check_workload_modes(o, x);
}
