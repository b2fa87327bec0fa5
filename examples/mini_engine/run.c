/* run.c - the phases of a run of the workload (run.h). */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* *path, or for "default" the shipped file `name` (0), or -1 after saying it is missing. */
static int resolve_default(const char *flag_name, const char **path, const char *name, char *buf,
                           size_t len) {
    if (!*path || strcmp(*path, "default") != 0) return 0;
    if ((*path = weights_default_file(name, buf, len))) return 0;
    mini_err("%s default: no %s under <exe dir>/../share/kvstrata or the source tree\n", flag_name,
             name);
    return -1;
}

int run_load_trained(options *o, mini_run *r) {
    char err[768], path[4096];
    const char *wp = o->weights_path;
    if (resolve_default("--weights", &wp, "mini-256.kvsw", path, sizeof path) != 0) return -1;
    if (wp) {
        if (weights_load(wp, &r->wf, err, sizeof err) != 0) {
            mini_err("--weights %s\n", err);
            return -1;
        }
        r->have_weights = 1;
        uint64_t seed = o->model.seed; /* with trained weights the seed draws the workload only */
        o->model = r->wf.config;
        o->model.seed = seed;
        if (!o->text_path && o->model.vocab == 256) o->text_path = "default"; /* a byte model */
    }
    const char *tp = o->text_path;
    if (tp && strcmp(tp, "none") == 0) tp = NULL;
    if (resolve_default("--text", &tp, "mini-256.sample.txt", path, sizeof path) != 0) return -1;
    if (tp && text_load(tp, o->model.vocab, &r->text, &r->text_len, err, sizeof err) != 0) {
        mini_err("--text %s\n", err);
        return -1;
    }
    return 0;
}

/* The paged cache's pages and budget for the workload (see run_workload). */
static int size_cache(const options *o, mini_run *r, int in_flight, int own_request) {
    sizing *z = &r->z;
    workload_sizes(&r->w, &z->max_prompt, &z->max_request, &z->total_history);
    uint64_t max_request_blocks = (z->max_request + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    uint64_t budget = (uint64_t)o->block_budget;
    if (!budget) {
        budget = (z->total_history + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS / 3;
        if (budget < max_request_blocks * (uint64_t)in_flight + 1)
            budget = max_request_blocks * (uint64_t)in_flight + 1; /* a group holds its pages */
        if (o->blocks && budget > (uint64_t)o->blocks) budget = (uint64_t)o->blocks;
    }
    uint64_t blocks = o->blocks ? (uint64_t)o->blocks : budget;
    if (budget > blocks) {
        mini_err("--block-budget %llu exceeds --blocks %llu\n", (unsigned long long)budget,
                 (unsigned long long)blocks);
        return -1;
    }
    if (budget < max_request_blocks && !own_request) {
        mini_err("the largest request needs %llu pages but the block budget is %llu\n",
                 (unsigned long long)max_request_blocks, (unsigned long long)budget);
        return -1;
    }
    if (blocks > (1u << 24) || z->max_request > (1u << 24)) {
        mini_err("workload or cache too large for a mini engine\n");
        return -1;
    }
    z->blocks = (uint32_t)blocks;
    z->budget = (uint32_t)budget;
    return 0;
}

int run_workload(const options *o, mini_run *r, int in_flight, int own_request) {
    char err[512];
    if (model_config_check(&o->model, err, sizeof err) != 0) {
        mini_err("%s\n", err);
        return 2;
    }
    workload_params wp = {.vocab = o->model.vocab,
                          .seed = o->model.seed,
                          .system_tokens = o->system_tokens,
                          .doc_tokens = o->doc_tokens,
                          .user_tokens = o->user_tokens,
                          .output_tokens = o->decode_tokens,
                          .sessions = o->sessions,
                          .turns = o->turns,
                          .text = r->text,
                          .text_len = r->text_len};
    int wrc = o->trace_path ? workload_load_trace(o->trace_path, &wp, &r->w, err, sizeof err)
                            : workload_generate(&wp, &r->w, err, sizeof err);
    if (wrc != 0) {
        mini_err("%s\n", err);
        return 2;
    }
    r->have_workload = 1;
    return size_cache(o, r, in_flight, own_request) == 0 ? 0 : 1;
}

int run_model(const options *o, mini_run *r) {
    char err[512];
    r->m =
        r->have_weights ? model_create_trained(&o->model, r->wf.floats) : model_create(&o->model);
    if (!r->m) {
        mini_err("out of memory for the model\n");
        return 1;
    }
    if (r->have_weights) {
        float diff = 0.0f;
        if (weights_check(&r->wf, r->m, &diff, err, sizeof err) != 0) {
            mini_err("--weights: %s\n", err);
            return 1;
        }
        if (!o->quiet)
            mini_err("trained weights %s; reference logits within %.2g\n", r->wf.desc,
                     (double)diff);
    }
    return 0;
}

int run_reference(const options *o, mini_run *r, uint32_t cache_layers) {
    if (!o->verify) return 0;
    const sizing *z = &r->z;
    reference *ref = &r->ref;
    uint32_t ref_blocks = (uint32_t)((z->max_prompt + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
    r->have_ref = 1;
    ref->e = (engine){.m = r->m, .prefill_chunk = (int)z->max_prompt};
    ref->e.kv = make_cache(o, r->m, cache_layers, ref_blocks, ref_blocks);
    ref->e.s = model_scratch_create(r->m, (int)z->max_prompt, (int)z->max_prompt);
    ref->e.logits = malloc((size_t)o->model.vocab * sizeof(float));
    ref->e.tokens = malloc((size_t)z->max_prompt * sizeof(int32_t));
    ref->identity = malloc(ref_blocks * sizeof *ref->identity);
    if (!ref->e.kv || !ref->e.s || !ref->e.logits || !ref->e.tokens || !ref->identity) {
        mini_err("out of memory for the verify reference\n");
        return 1;
    }
    for (uint32_t i = 0; i < ref_blocks; i++) ref->identity[i] = i;
    ref->max_kl = o->lossy_kl;
    ref->min_top1 = o->lossy_top1;
    return 0;
}

int run_verdict(const mini_run *r) {
    const reference *ref = &r->ref;
    if (!r->have_ref) return 0;
    if (ref->mismatches) {
        mini_err("verify FAILED: %d of %d turns differ from a full recompute\n", ref->mismatches,
                 ref->turns_checked);
        return 1;
    }
    if (!reference_lossy_within(ref)) {
        mini_err("verify FAILED: %d turns with lossy hits: mean KL %.4g nats (at most %.4g), top-1 "
                 "agreement %.3f (at least %.3f)\n",
                 ref->lossy_turns, ref->lossy_kl_sum / ref->lossy_turns, ref->max_kl,
                 (double)ref->lossy_top1 / ref->lossy_turns, ref->min_top1);
        return 1;
    }
    if (ref->turns_checked == 0) {
        mini_err("verify FAILED: no turn had a connector hit, so nothing restored was checked\n");
        return 1;
    }
    return 0;
}

void run_free(mini_run *r) {
    if (r->have_ref) {
        kvcache_destroy(r->ref.e.kv);
        model_scratch_free(r->ref.e.s);
        free(r->ref.e.logits);
        free(r->ref.e.tokens);
        free(r->ref.identity);
    }
    model_free(r->m);
    if (r->have_workload) workload_free(&r->w);
    if (r->have_weights) weights_free(&r->wf);
    free(r->text);
    memset(r, 0, sizeof *r);
}
