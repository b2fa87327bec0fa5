/* options.h - the command line of kvs-mini-engine: every flag with its default, parsed and checked
 * together (docs/mini_engine.md lists them). */
#ifndef MINI_OPTIONS_H
#define MINI_OPTIONS_H

#include "abi/kvstrata.h"
#include "kvcache.h"
#include "model.h"

typedef struct options {
    const char *lib_path;    /* NULL: next to the executable, then the loader's search path */
    const char *config_path; /* "none": the library's built-in defaults */
    const char *trace_path;
    model_config model;
    const char
        *weights_path;     /* --weights: trained weights (weights.h); "default": the shipped ones */
    const char *text_path; /* --text: prompts are slices of this file's bytes */
    int shape_given;       /* a model-shape flag was given */
    kv_layout layout;
    kvs_dtype dtype;
    int blocks, block_budget; /* 0: sized from the workload */
    int prefill_chunk;
    int decode_tokens;
    int system_tokens, user_tokens, doc_tokens;
    int sessions, turns;
    int no_connector, verify, json, quiet;
    double lossy_kl, lossy_top1; /* --verify's bounds for lossy hits */
    int restore_plans;           /* KVS_PLAN_CAP_* bits: the restore plans the engine executes */
    int no_mask;              /* --no-mask: declare no KVS_PLAN_CAP_MASK (act as a stock engine) */
    const char *profile_path; /* --profile: measure, write this restore profile, exit */
    const char *profile_tier; /* the name the profile gives the tier that served the loads */
    int profile_tokens;
    int plan_modes;     /* --plan-modes; 0: both */
    int batch;          /* turns of different sessions admitted and restored together */
    int continuous;     /* 0: off; N: up to N turns in flight, the next arriving as one finishes */
    int arrival_ms;     /* --continuous: turn i arrives at i * arrival_ms (0: as soon as it can) */
    int stages;         /* pipeline stages (boundary activations stored with the KV); 1: none */
    int lsc;            /* --lsc: the layer stream cache's one long request (lsc.h) instead */
    int peer_blocks;    /* --peer-blocks: stream blocks to ask the lender for (0: all useful) */
    int lsc_buffers;    /* --lsc-buffers: 1 or 2 */
    int sparse_decode;  /* --sparse-decode: one long prompt decoded sparsely (sparse_decode.h) */
    int topk;           /* --topk: rows selected per KV head and step */
    int sparse_context; /* --sparse-context: the prompt's tokens */
    int sparse_sink, sparse_recent; /* rows the engine attends itself at each end */
    int sparse_swarm; /* --sparse-layout: 0 rows, 1 swarm (clusters in the SSD tier), 2 positions */
    int profile_steps;   /* --profile-steps: steps profiled before clustering */
    int cluster_cache;   /* --cluster-cache: rows of hot clusters kept in DRAM */
    int cluster_lru;     /* --cluster-policy lru (else Eq. 6's score) */
    int sparse_medoids;  /* --sparse-index medoids (else exact) */
    double sparse_adapt; /* --sparse-adapt: target attention error (0: static tau) */
} options;

/* Fill *o from argv, defaults first. --help prints the usage on stdout and exits 0. Returns 0, or -1
 * after printing why on stderr. */
int parse_options(int argc, char **argv, options *o);

#endif
