/* main.c - kvs-mini-engine: runs a multi-turn chat workload through a small transformer with a paged
 * KV cache, once with libkvstrata (loaded at run time) driving every KV-connector hook the way vLLM
 * does, once without, and compares time to first token. --verify checks that every restored prompt's
 * KV and logits equal a from-scratch computation bit for bit. See docs/mini_engine.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_plans.h"
#include "engine.h"
#include "kvcache.h"
#include "lsc.h"
#include "mode.h"
#include "model.h"
#include "options.h"
#include "profile.h"
#include "report.h"
#include "sparse_decode.h"
#include "verify.h"
#include "weights.h"
#include "workload.h"

#define PROG "kvs-mini-engine"

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

/* --weights and --text ------------------------------------------------------------------------------- */

typedef struct trained {
    weights_file wf;
    int have_weights;
    uint8_t *text;
    size_t text_len;
} trained;

/* Resolve "default", load the weights (their shape becomes o->model) and the text. 0 or -1 after
 * saying why on stderr. */
/* *path, or for "default" the shipped file `name` (0), or -1 after saying it is missing. */
static int resolve_default(const char *flag, const char **path, const char *name, char *buf,
                           size_t len) {
    if (!*path || strcmp(*path, "default") != 0) return 0;
    if ((*path = weights_default_file(name, buf, len))) return 0;
    fprintf(stderr,
            PROG ": %s default: no %s under <exe dir>/../share/kvstrata or the source tree\n", flag,
            name);
    return -1;
}

static int load_trained(options *o, trained *t) {
    char err[768], path[4096];
    const char *wp = o->weights_path;
    if (resolve_default("--weights", &wp, "mini-256.kvsw", path, sizeof path) != 0) return -1;
    if (wp) {
        if (weights_load(wp, &t->wf, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": --weights %s\n", err);
            return -1;
        }
        t->have_weights = 1;
        uint64_t seed = o->model.seed; /* with trained weights the seed draws the workload only */
        o->model = t->wf.config;
        o->model.seed = seed;
        if (!o->text_path && o->model.vocab == 256) o->text_path = "default"; /* a byte model */
    }
    const char *tp = o->text_path;
    if (tp && strcmp(tp, "none") == 0) tp = NULL;
    if (resolve_default("--text", &tp, "mini-256.sample.txt", path, sizeof path) != 0) return -1;
    if (tp && text_load(tp, o->model.vocab, &t->text, &t->text_len, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": --text %s\n", err);
        return -1;
    }
    return 0;
}

static void trained_free(trained *t) {
    if (t->have_weights) weights_free(&t->wf);
    free(t->text);
}

/* main ------------------------------------------------------------------------------------------------- */

static int main_run(options *op, trained *tr);

int main(int argc, char **argv) {
    options o;
    if (parse_options(argc, argv, &o) != 0) return 2;
    trained tr = {0};
    if (load_trained(&o, &tr) != 0) {
        trained_free(&tr);
        return 2;
    }
    int rc = main_run(&o, &tr);
    trained_free(&tr);
    return rc;
}

static int main_run(options *op, trained *tr) {
    options o = *op;
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
                          .turns = o.turns,
                          .text = tr->text,
                          .text_len = tr->text_len};
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
        uint64_t in_flight = (uint64_t)(o.batch > o.continuous ? o.batch : o.continuous);
        if (budget < max_request_blocks * in_flight + 1)
            budget = max_request_blocks * in_flight + 1; /* a group holds its pages at once */
        if (o.blocks && budget > (uint64_t)o.blocks) budget = (uint64_t)o.blocks;
    }
    uint64_t blocks = o.blocks ? (uint64_t)o.blocks : budget;
    int rc = 1;
    if (budget > blocks) {
        fprintf(stderr, PROG ": --block-budget %llu exceeds --blocks %llu\n",
                (unsigned long long)budget, (unsigned long long)blocks);
        goto out_workload;
    }
    if (budget < max_request_blocks && !o.lsc) { /* --lsc serves its own request */
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

    model *m =
        tr->have_weights ? model_create_trained(&o.model, tr->wf.floats) : model_create(&o.model);
    if (!m) {
        fprintf(stderr, PROG ": out of memory for the model\n");
        goto out_workload;
    }
    if (tr->have_weights) {
        float diff = 0.0f;
        if (weights_check(&tr->wf, m, &diff, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": --weights: %s\n", err);
            goto out_model_only;
        }
        if (!o.quiet)
            fprintf(stderr, PROG ": trained weights %s; reference logits within %.2g\n",
                    tr->wf.desc, (double)diff);
    }

    if (o.lsc) {
        rc = lsc_run(&o, m);
        goto out_model_only;
    }
    if (o.sparse_decode) {
        stage_layout_init(&run_stages, m, o.dtype, 1, err, sizeof err); /* one stage: every layer */
        rc = sparse_decode_run(&o, m, tr->text, tr->text_len);
        goto out_model_only;
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
        ref.max_kl = o.lossy_kl;
        ref.min_top1 = o.lossy_top1;
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
    for (int k = 0; k < n_modes && !failed && o.continuous; k++) /* whole workloads, in turn */
        failed = mode_continuous(&modes[k], &o, &w) != 0;
    for (int i = 0, g = 1; i < w.n_turns && !failed && !o.continuous; i += g) {
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
        } else if (refp && !reference_lossy_within(&ref)) {
            fprintf(stderr,
                    PROG ": verify FAILED: %d turns with lossy hits: mean KL %.4g nats (at most "
                         "%.4g), top-1 agreement %.3f (at least %.3f)\n",
                    ref.lossy_turns, ref.lossy_kl_sum / ref.lossy_turns, ref.max_kl,
                    (double)ref.lossy_top1 / ref.lossy_turns, ref.min_top1);
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
