/* options.c - the command line of kvs-mini-engine (options.h): the flag table, the defaults and the
 * checks between flags. */
#include "options.h"

#include <stddef.h>
#include <stdio.h>

#include "engine.h"

#define SHAPE 1 /* a group: the flags that set the model's shape */
#define O(f)  offsetof(options, f)

static const flag_choice dtypes[] = {{"fp16", KVS_DTYPE_FP16},         {"bf16", KVS_DTYPE_BF16},
                                     {"fp32", KVS_DTYPE_FP32},         {"fp8", KVS_DTYPE_FP8_E4M3},
                                     {"fp8_e4m3", KVS_DTYPE_FP8_E4M3}, {NULL, 0}};
static const flag_choice layouts[] = {{"nhd", KV_LAYOUT_NHD},
                                      {"hnd", KV_LAYOUT_HND},
                                      {"flashinfer", KV_LAYOUT_FLASHINFER},
                                      {"mla", KV_LAYOUT_MLA},
                                      {"crosslayer", KV_LAYOUT_CROSSLAYER},
                                      {NULL, 0}};

const flag options_flags[] = {
    {.type = FLAG_SECTION, .help = "connector"},
    {.name = "--lib",
     .type = FLAG_STRING,
     .field = O(lib_path),
     .arg = "PATH",
     .help = "libkvstrata to load (default <exe dir>/../lib/libkvstrata.so.1,\n"
             "then libkvstrata.so from the loader's search path)"},
    {.name = "--config",
     .type = FLAG_STRING,
     .field = O(config_path),
     .arg = "PATH",
     .help = "YAML configuration (default examples/configs/default.yaml;\n"
             "'none' for the library's built-in defaults)"},
    {.name = "--no-connector",
     .type = FLAG_BOOL,
     .field = O(no_connector),
     .arg = NULL,
     .help = "run only without the library"},
    {.name = "--connector-only",
     .type = FLAG_BOOL,
     .field = O(connector_only),
     .arg = NULL,
     .help = "run only with the library (no pass without it to compare with)"},
    {.type = FLAG_SECTION, .help = "model"},
    {.name = "--dim",
     .type = FLAG_INT,
     .field = O(model.dim),
     .arg = "N",
     .help = "model width (128)",
     .min = 2,
     .group = SHAPE},
    {.name = "--layers",
     .type = FLAG_INT,
     .field = O(model.n_layers),
     .arg = "N",
     .help = "layers (3)",
     .min = 1,
     .group = SHAPE},
    {.name = "--heads",
     .type = FLAG_INT,
     .field = O(model.n_heads),
     .arg = "N",
     .help = "query heads (4)",
     .min = 1,
     .group = SHAPE},
    {.name = "--kv-heads",
     .type = FLAG_INT,
     .field = O(model.n_kv_heads),
     .arg = "N",
     .help = "K/V heads (2)",
     .min = 1,
     .group = SHAPE},
    {.name = "--ffn",
     .type = FLAG_INT,
     .field = O(model.ffn),
     .arg = "N",
     .help = "feed-forward width (256)",
     .min = 1,
     .group = SHAPE},
    {.name = "--vocab",
     .type = FLAG_INT,
     .field = O(model.vocab),
     .arg = "N",
     .help = "vocabulary (2048)",
     .min = 2,
     .group = SHAPE},
    {.name = "--seed",
     .type = FLAG_U64,
     .field = O(model.seed),
     .arg = "N",
     .help = "seeds the weights and the workload (42)"},
    {.name = "--latent",
     .type = FLAG_INT,
     .field = O(model.latent),
     .arg = "N",
     .help = "MLA latent width (64)",
     .min = 1},
    {.name = "--weights",
     .type = FLAG_STRING,
     .field = O(weights_path),
     .arg = "FILE|default",
     .help = "trained weights instead of seeded ones (the shape is the file's);\n"
             "'default': the byte-level model shipped with the build, the one\n"
             "for quality runs (models/mini/train/README.md)"},
    {.name = "--text",
     .type = FLAG_STRING,
     .field = O(text_path),
     .arg = "FILE|default|none",
     .help = "prompts are slices of this text instead of random\n"
             "tokens; 'default' (implied by --weights of a byte model): the held-out\n"
             "sample shipped beside the weights; 'none': random tokens"},
    {.type = FLAG_SECTION, .help = "kv cache"},
    {.name = "--dtype",
     .type = FLAG_CHOICE,
     .field = O(dtype),
     .arg = "fp16|bf16|fp32|fp8",
     .help = "element type (fp16)",
     .choices = dtypes},
    {.name = "--layout",
     .type = FLAG_CHOICE,
     .field = O(layout),
     .arg = "nhd|hnd|flashinfer|mla|crosslayer",
     .help = "page layout (nhd; mla switches to latent attention)",
     .choices = layouts},
    {.name = "--blocks",
     .type = FLAG_INT,
     .field = O(blocks),
     .arg = "N",
     .help = "pages in the paged cache (default: the block budget)",
     .min = 1},
    {.name = "--block-budget",
     .type = FLAG_INT,
     .field = O(block_budget),
     .arg = "N",
     .help = "pages the engine may hold, in use or cached (default: a third of\n"
             "the workload's final histories, so sessions evict each other)",
     .min = 1},
    {.name = "--prefill-chunk",
     .type = FLAG_INT,
     .field = O(prefill_chunk),
     .arg = "N",
     .help = "tokens computed per prefill step (512)",
     .min = 1},
    {.type = FLAG_SECTION, .help = "workload"},
    {.name = "--sessions",
     .type = FLAG_INT,
     .field = O(sessions),
     .arg = "N",
     .help = "chat sessions (8)",
     .min = 1},
    {.name = "--turns",
     .type = FLAG_INT,
     .field = O(turns),
     .arg = "N",
     .help = "turns per session (5)",
     .min = 1},
    {.name = "--system-tokens",
     .type = FLAG_INT,
     .field = O(system_tokens),
     .arg = "N",
     .help = "shared system prompt (256)",
     .min = 0},
    {.name = "--doc-tokens",
     .type = FLAG_INT,
     .field = O(doc_tokens),
     .arg = "N",
     .help = "per-session document (1536)",
     .min = 0},
    {.name = "--user-tokens",
     .type = FLAG_INT,
     .field = O(user_tokens),
     .arg = "N",
     .help = "new user tokens per turn (mean 120)",
     .min = 0},
    {.name = "--decode-tokens",
     .type = FLAG_INT,
     .field = O(decode_tokens),
     .arg = "N",
     .help = "tokens generated per turn (16)",
     .min = 1},
    {.name = "--trace",
     .type = FLAG_STRING,
     .field = O(trace_path),
     .arg = "FILE",
     .help = "JSONL turns instead of the generator"},
    {.type = FLAG_SECTION, .help = "output"},
    {.name = "--verify",
     .type = FLAG_BOOL,
     .field = O(verify),
     .arg = NULL,
     .help = "compare restored prompts with a from-scratch reference, bit for bit\n"
             "(lossy hits, from a compress tier: by prediction, within bounds)"},
    {.name = "--lossy-kl",
     .type = FLAG_DOUBLE,
     .field = O(lossy_kl),
     .arg = "X",
     .help = "--verify fails when lossy hits' mean KL divergence of the next\n"
             "token exceeds X nats (0.1)"},
    {.name = "--lossy-top1",
     .type = FLAG_DOUBLE,
     .field = O(lossy_top1),
     .arg = "X",
     .help = "... or their top-1 agreement falls below X (0.8)",
     .max = 1},
    {.name = "--no-mask",
     .type = FLAG_BOOL,
     .field = O(no_mask),
     .arg = NULL,
     .help = "act as an engine that cannot mask dropped tokens: hits end\n"
             "before chunks a compress tier stored with tokens dropped"},
    {.name = "--json",
     .type = FLAG_BOOL,
     .field = O(json),
     .arg = NULL,
     .help = "print the summary as one JSON object on the last line"},
    {.name = "--turns-out",
     .type = FLAG_STRING,
     .field = O(turns_out),
     .arg = "FILE",
     .help = "write one JSON line per turn served to FILE as it ends: mode,\n"
             "session, turn, prompt, hits, TTFT and chunks loaded per tier"},
    {.name = "--quiet",
     .type = FLAG_BOOL,
     .field = O(quiet),
     .arg = NULL,
     .help = "no per-turn lines"},
};
const size_t options_n_flags = sizeof options_flags / sizeof options_flags[0];

void options_defaults(options *o) {
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
    };
}

int options_check(options *o, unsigned groups) {
    o->model.is_mla = o->layout == KV_LAYOUT_MLA;
    if (o->weights_path && ((groups & SHAPE) || o->model.is_mla)) {
        mini_err("--weights fixes the model (a GQA model of the file's shape): drop --dim, "
                 "--layers, --heads, --kv-heads, --ffn, --vocab and --layout mla\n");
        return -1;
    }
    if (o->connector_only && o->no_connector) {
        mini_err("--connector-only and --no-connector leave nothing to run: give one of them\n");
        return -1;
    }
    if (o->verify && o->no_connector) {
        mini_err("--verify checks restored KV and needs the connector (drop --no-connector)\n");
        return -1;
    }
    return 0;
}

int parse_options(int argc, char **argv, options *o) {
    options_defaults(o);
    flag_table t = {options_flags, options_n_flags, o};
    unsigned groups = 0;
    if (flags_parse(mini_prog, &t, 1, argc, argv, &groups) != 0) return -1;
    return options_check(o, groups);
}
