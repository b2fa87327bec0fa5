/* options.h - the command line of kvs-mini-engine: every flag with its default, as a table
 * (flags.h) the usage text is printed from (docs/mini_engine.md lists them). */
#ifndef MINI_OPTIONS_H
#define MINI_OPTIONS_H

#include "abi/kvstrata.h"
#include "abi/kvstrata_lossy.h"
#include "flags.h"
#include "models/mini/kvcache.h"
#include "models/mini/model.h"

typedef struct options {
    const char *lib_path;    /* NULL: next to the executable, then the loader's search path */
    const char *config_path; /* "none": the library's built-in defaults */
    const char *trace_path;
    const char *turns_out; /* --turns-out: one JSON line per turn served, NULL: none */
    model_config model;
    const char
        *weights_path;     /* --weights: trained weights (weights.h); "default": the shipped ones */
    const char *text_path; /* --text: prompts are slices of this file's bytes */
    int layout;            /* kv_layout */
    int dtype;             /* kvs_dtype */
    int blocks, block_budget; /* 0: sized from the workload */
    int prefill_chunk;
    int decode_tokens;
    int system_tokens, user_tokens, doc_tokens;
    int sessions, turns;
    int no_connector, connector_only, verify, json, quiet;
    double lossy_kl, lossy_top1; /* --verify's bounds for lossy hits */
    int no_mask; /* --no-mask: declare no KVS_PLAN_CAP_MASK (act as a stock engine) */
} options;

/* The rows of the table, for a program that parses them with its own (kvs-mini-research). */
extern const flag options_flags[];
extern const size_t options_n_flags;

/* The defaults. */
void options_defaults(options *o);
/* After parsing (groups: flags_parse's): derived fields and the checks between flags. 0, or -1 after
 * printing why on stderr. */
int options_check(options *o, unsigned groups);
/* Defaults, argv, checks. --help prints the usage on stdout and exits 0. Returns 0, or -1 after
 * printing why on stderr. */
int parse_options(int argc, char **argv, options *o);

#endif
