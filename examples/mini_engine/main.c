/* main.c - kvs-mini-engine: runs a multi-turn chat workload through a small transformer with a paged
 * KV cache, once with libkvstrata (loaded at run time) driving every KV-connector hook the way vLLM
 * does, once without, and compares time to first token. --verify checks that every restored prompt's
 * KV and logits equal a from-scratch computation bit for bit. See docs/mini_engine.md.
 *
 * The reading order: model (models/mini/model.h), the paged cache (models/mini/kvcache.h), the
 * engine and its hooks (engine.c), one mode of serving (mode.c), then this file. */
#include <stdio.h>

#include "mode.h"
#include "options.h"
#include "report.h"
#include "run.h"
#include "turns_out.h"

/* Both modes run side by side, turn by turn, each with its own fresh engine: on a shared machine
 * they see the same background load, so the comparison is fair. */
static int serve_workload(const options *o, mini_run *r) {
    mode_run runs[2] = {{.name = "connector", .use_connector = 1},
                        {.name = "no-connector", .use_connector = 0}};
    mode_run *modes = o->no_connector ? &runs[1] : &runs[0];
    int n_modes = o->no_connector || o->connector_only ? 1 : 2, failed = 0;
    reference *ref = r->have_ref ? &r->ref : NULL;
    kvs_stats prev[2] = {{0}, {0}}; /* --turns-out: the counters after the previous turn */
    FILE *turns_out = NULL;
    if (o->turns_out && !(turns_out = turns_out_open(o->turns_out))) return 2;
    for (int k = 0; k < n_modes && !failed; k++)
        failed = mode_begin(&modes[k], o, r->m, &r->w, &r->z, ref, NULL) != 0;
    for (int i = 0; i < r->w.n_turns && !failed; i++)
        for (int k = 0; k < n_modes && !failed; k++) {
            failed = mode_turn(&modes[k], o, &r->w, i) != 0;
            if (!failed && turns_out)
                failed = turns_out_write(turns_out, &modes[k], &r->w, i, &prev[k]) != 0;
        }
    if (turns_out_close(turns_out, o->turns_out) != 0) failed = 1;
    for (int k = 0; k < n_modes && !failed; k++) failed = mode_collect(&modes[k]) != 0;
    int rc = 1;
    if (!failed) {
        print_summary(o, &r->w, &r->z, modes, n_modes, ref, NULL);
        rc = run_verdict(r);
    }
    for (int k = 0; k < n_modes; k++) mode_end(&modes[k], &r->w);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    mini_run r = {0};
    if (parse_options(argc, argv, &o) != 0) return 2;
    int rc = run_load_trained(&o, &r) != 0 ? 2 : 0;
    if (rc == 0) rc = run_workload(&o, &r, 1, 0);
    if (rc == 0) rc = run_model(&o, &r);
    if (rc == 0) rc = run_reference(&o, &r, 0);
    if (rc == 0) rc = serve_workload(&o, &r);
    run_free(&r);
    return rc;
}
