/* research.h - the command line kvs-mini-research adds to the reference engine's (options.h): the
 * research modes and their flags, as a table parsed with the reference engine's
 * (docs/mini_research.md lists them). */
#ifndef MINI_RESEARCH_H
#define MINI_RESEARCH_H

#include "examples/mini_engine/options.h"

typedef struct research {
    int restore_plans; /* KVS_PLAN_CAP_* bits: the restore plans the engine executes */
    int plan_modes;    /* --plan-modes; 0: token and layer */
    int stages;        /* pipeline stages (boundary activations stored with the KV); 1: none */
    const char *profile_path; /* --profile: measure, write this restore profile, exit */
    const char *profile_tier; /* the name the profile gives the tier that served the loads */
    int profile_tokens;
    int batch;          /* turns of different sessions admitted and restored together */
    int continuous;     /* 0: off; N: up to N turns in flight, the next arriving as one finishes */
    int arrival_ms;     /* --continuous: turn i arrives at i * arrival_ms (0: as soon as it can) */
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
} research;

/* The reference engine's flags and these into *o and *x, defaults first, then the checks between
 * them. --help prints the usage of both on stdout and exits 0. Returns 0, or -1 after printing why
 * on stderr. */
int parse_research(int argc, char **argv, options *o, research *x);

#endif
