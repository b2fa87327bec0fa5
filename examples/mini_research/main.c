/* main.c - kvs-mini-research: the reference engine (examples/mini_engine) with its research modes,
 * every flag of kvs-mini-engine plus these: restore plans and pipeline stages (plans.h), requests in
 * flight together (batch.h, serve.h), restore profiles (profile.h), the layer stream cache (lsc.h)
 * and sparse decode (sparse_decode.h). See docs/mini_research.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/kvstrata_plans.h"
#include "examples/mini_engine/run.h"
#include "lsc.h"
#include "profile.h"
#include "research.h"
#include "serve.h"
#include "sparse_decode.h"

/* --profile: measure this engine's restores and write them as a restore profile. */
static int run_profile(const options *o, const research *x, const model *m) {
    uint64_t tokens = (uint64_t)x->profile_tokens;
    uint32_t blocks = (uint32_t)((tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS) * 2 + 1;
    engine e = {.m = m, .prefill_chunk = o->prefill_chunk};
    connector conn;
    memset(&conn, 0, sizeof conn);
    int rc = -1;
    e.kv = make_cache(o, m, 0, blocks, blocks);
    e.s = model_scratch_create(m, o->prefill_chunk, (int)tokens + 1);
    e.logits = malloc((size_t)model_config_of(m)->vocab * sizeof *e.logits);
    e.table = calloc(blocks, sizeof *e.table);
    e.tokens = malloc(((size_t)tokens + 1) * sizeof *e.tokens);
    if (!e.kv || !e.s || !e.logits || !e.table || !e.tokens)
        mini_err("out of memory\n");
    else if (connector_open(&conn, o->lib_path, o->config_path, (kvs_dtype)o->dtype, m, e.kv, 0,
                            NULL) == 0) {
        e.conn = &conn;
        rc = profile_run(&e, tokens, x->profile_tier, x->profile_path);
    }
    connector_close(&conn);
    kvcache_destroy(e.kv);
    model_scratch_free(e.s);
    free(e.logits);
    free(e.table);
    free(e.tokens);
    return rc;
}

/* The workload's turns through both modes side by side (as kvs-mini-engine serves them), a turn, a
 * --batch group or (--continuous) a whole workload at a time. */
static int serve_workload(const options *o, const research *x, stage_layout *sl, mini_run *r) {
    mode_run runs[2] = {{.name = "connector", .use_connector = 1},
                        {.name = "no-connector", .use_connector = 0}};
    research_mode rms[2];
    mode_run *modes = o->no_connector ? &runs[1] : &runs[0];
    research_mode *rm = o->no_connector ? &rms[1] : &rms[0];
    int n_modes = o->no_connector || o->connector_only ? 1 : 2, failed = 0;
    reference *ref = r->have_ref ? &r->ref : NULL;
    for (int k = 0; k < n_modes && !failed; k++)
        failed = serve_begin(&modes[k], &rm[k], o, x, sl, r->m, &r->w, &r->z, ref) != 0;
    for (int k = 0; k < n_modes && !failed && x->continuous; k++) /* whole workloads, in turn */
        failed = serve_continuous(&modes[k], o, x, &r->w) != 0;
    for (int i = 0, g = 1; i < r->w.n_turns && !failed && !x->continuous; i += g) {
        g = group_size(x, &r->w, i);
        for (int k = 0; k < n_modes && !failed; k++)
            failed = (x->batch > 1 ? serve_group(&modes[k], o, &r->w, i, g)
                                   : serve_turn(&modes[k], o, &r->w, i)) != 0;
    }
    for (int k = 0; k < n_modes && !failed; k++) failed = mode_collect(&modes[k]) != 0;
    int rc = 1;
    if (!failed) {
        print_summary(o, &r->w, &r->z, modes, n_modes, ref, &serve_report);
        rc = run_verdict(r);
    }
    for (int k = 0; k < n_modes; k++) serve_end(&modes[k], &r->w);
    return rc;
}

/* The research mode the flags ask for, once the model exists. */
static int run_mode(const options *o, const research *x, stage_layout *sl, mini_run *r) {
    char err[512];
    if (x->lsc) return lsc_run(o, x, r->m);
    if (x->sparse_decode) return sparse_decode_run(o, x, r->m, r->text, r->text_len);
    if (x->profile_path) return run_profile(o, x, r->m) == 0 ? 0 : 1;
    if (stage_layout_init(sl, r->m, (kvs_dtype)o->dtype, x->stages, err, sizeof err) != 0) {
        mini_err("%s\n", err);
        return 1;
    }
    for (int st = 1; st < sl->n_stages; st++)
        if (!(sl->scratch[st] =
                  model_scratch_create(r->m, o->prefill_chunk, (int)r->z.max_request))) {
            mini_err("out of memory for the stage threads\n");
            return 1;
        }
    if (run_reference(o, r, stage_cache_layers(sl)) != 0) return 1;
    return serve_workload(o, x, sl, r);
}

int main(int argc, char **argv) {
    options o;
    research x;
    mini_run r = {0};
    stage_layout sl = {0};
    mini_prog = "kvs-mini-research";
    if (parse_research(argc, argv, &o, &x) != 0) return 2;
    int in_flight = x.batch > x.continuous ? x.batch : x.continuous;
    int rc = run_load_trained(&o, &r) != 0 ? 2 : 0;
    if (rc == 0) rc = run_workload(&o, &r, in_flight, x.lsc);
    if (rc == 0) rc = run_model(&o, &r);
    if (rc == 0) rc = run_mode(&o, &x, &sl, &r);
    for (int st = 1; st < (int)KVS_MAX_STAGES; st++) model_scratch_free(sl.scratch[st]);
    run_free(&r);
    return rc;
}
